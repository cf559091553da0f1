"""Progress bars name each stage of a long step, and say nothing when switched off."""

import pytest

from minip_learn._progress import Stages, stages
from minip_learn.datasets import make_witness_suite


def test_stages_name_each_stage_on_stderr(capsys):
    with stages("certify", ["constraints", "search"], True) as bar:
        bar.start("constraints")
        bar.start("search")
    err = capsys.readouterr().err
    assert "certify" in err and "[constraints]" in err and "[search]" in err
    assert bar.done == 2


def test_stages_off_print_nothing(capsys):
    with Stages("certify", ["a"], enabled=False) as bar:
        bar.start("a")
    assert capsys.readouterr() == ("", "")
    assert bar.done == 1


def test_an_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="unknown stage 'b'"):
        with Stages("x", ["a"], enabled=False) as bar:
            bar.start("b")


def test_a_failing_stage_is_not_counted_done():
    with pytest.raises(RuntimeError):
        with Stages("x", ["a", "b"], enabled=False) as bar:
            bar.start("a")
            raise RuntimeError
    assert bar.done == 0


def test_witness_suite_shows_its_build_stages(capsys):
    make_witness_suite(construction="small", progress=True)
    err = capsys.readouterr().err
    for stage in ("witness suite", "[design]", "[family]", "[certify]"):
        assert stage in err
    make_witness_suite(construction="small")
    assert capsys.readouterr().err == ""


def test_exact_suite_shows_its_build_stages(capsys):
    make_witness_suite(n_bits=8, construction="exact", progress=True)
    err = capsys.readouterr().err
    assert "[design]" in err and "[certify]" in err
