"""Tests of the ``minip-learn`` command line and the reproduction recipes (tiny grids)."""


import pandas as pd
import pytest

from minip_learn import experiments
from minip_learn.cli import build_parser, main


@pytest.fixture
def tiny_settings(monkeypatch):
    """Replace the --quick grids by tiny ones on the small witness suite (seconds)."""
    witness = dict(experiments.SETTINGS["witness"]["quick"])
    witness.update(suite=dict(n_bits=24, seq_len=3, construction="small"), ranks=(2, 4),
                   seeds=(0,), softmax_seeds=(0, 1),
                   kernel=dict(feature_map="table", max_epochs=8, stop_tolerance=0.5),
                   softmax=dict(max_epochs=8, stop_tolerance=0.5))
    length = dict(experiments.SETTINGS["length"]["quick"])
    length.update(ranks=(1, 2), seeds=(0,),
                  kernel=dict(feature_map="table", max_epochs=8, stop_tolerance=0.5))
    monkeypatch.setitem(experiments.SETTINGS["witness"], "quick", witness)
    monkeypatch.setitem(experiments.SETTINGS["length"], "quick", length)


def test_reproduce_witness_quick_writes_tables_and_figures(tiny_settings, tmp_path, capsys):
    status = main(["reproduce", "witness", "--quick", "--out", str(tmp_path), "--n-jobs", "1",
                   "--no-progress"])
    out = capsys.readouterr().out
    assert status in (0, 1)
    d = tmp_path / "witness"
    for name in ("results.csv", "summary.csv", "summary.md", "phase_transition.png",
                 "kernel_heatmap.png"):
        assert (d / name).exists(), name
        assert str(d / name) in out
    assert "| model | feature map | rank | solved |" in out
    assert "certified minimum rank **8**" in out
    results = pd.read_csv(d / "results.csv")
    assert len(results) == 2 + 2 and results["fit_id"].is_unique
    assert sorted(results["model"].unique()) == ["kernel", "softmax"]
    k = results[results["model"] == "kernel"]
    assert not k.loc[k["rank"] < 8, "solved"].any()
    summary = pd.read_csv(d / "summary.csv")
    assert len(summary) == 3 and (summary["certified_min_rank"] == 8).all()
    # rerun: everything is resumed from the run folders, nothing recomputed
    status2 = main(["reproduce", "witness", "--quick", "--out", str(tmp_path), "--n-jobs", "1",
                    "--no-progress"])
    assert status2 == status
    again = pd.read_csv(d / "results.csv")
    pd.testing.assert_series_equal(again["finished_at"], results["finished_at"])


def test_reproduce_all_with_overrides(tiny_settings, tmp_path, capsys):
    status = main(["reproduce", "all", "--quick", "--out", str(tmp_path), "--n-jobs", "1",
                   "--ranks", "1", "--max-epochs", "3", "--no-progress"])
    out = capsys.readouterr().out
    assert status in (0, 1)
    assert (tmp_path / "summary.md").exists() and (tmp_path / "length/length_transition.png").exists()
    lengths = pd.read_csv(tmp_path / "length" / "results.csv")
    assert sorted(lengths["seq_len"].unique()) == [1, 2, 3]
    assert (lengths["rank"] == 1).all() and (lengths["n_epochs"] <= 3).all()
    assert "Length transition" in out and "Combined summary" in out


def test_cuda_request_fails_at_once(monkeypatch, tmp_path, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    status = main(["reproduce", "witness", "--quick", "--out", str(tmp_path),
                   "--devices", "cuda:0,cuda:1", "--no-progress"])
    assert status == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_parser():
    args = build_parser().parse_args(["reproduce", "length", "--devices", "cuda:0,cuda:1",
                                      "--ranks", "1,2,4"])
    assert args.devices == ["cuda:0", "cuda:1"] and args.ranks == (1, 2, 4)
    assert not args.quick and str(args.out) == "minip-results"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["reproduce", "nope"])
    with pytest.raises(TypeError, match="unexpected setting"):
        experiments.witness_experiment(nope=1)


def test_python_dash_m_help(capsys):
    import minip_learn.__main__ as dunder_main

    assert dunder_main.main is main  # python -m minip_learn runs the CLI
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "witness" in out
