"""The exact recipe: exact minimum rank of the R9 families, length curves, transition."""

import json

import numpy as np
import pandas as pd
import pytest

from minip_learn.cli import build_parser, main
from minip_learn.compact import CompactFamily, load_family
from minip_learn.constructions import exact_kernel_realization
from minip_learn.datasets import make_witness_suite, minip_targets
from minip_learn.estimators import load_estimator
from minip_learn.experiments import EXPERIMENTS, SETTINGS, exact, exact_experiment
from minip_learn.metrics import verify_solver
from minip_learn.theory import complement_closed_code, exact_family, exact_seq_len

COLUMNS = ["n_bits", "code", "seq_len", "n_queries", "n_sequences", "certified_min_rank",
           "constructive_rank", "exact", "suite_params", "certificate", "family",
           "certify_time", "verify_time", "peak_memory", "build_peak_memory",
           "solver_max_error", "solver_sequences", "solver", "error"]

# 400 epochs: enough for the transition's heads above the exact rank 14 to solve
TINY = dict(sizes=(8,), length={"exact": {"n_bits": 8, "construction": "exact"}},
            transition_bits=8, seeds=(0,), kernel={"max_epochs": 400}, progress=False,
            n_jobs=1)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("exact")
    first = exact_experiment(out=out, **TINY)
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "m8").iterdir()}
    second = exact_experiment(out=out, **TINY)
    return out, first, second, stamps


def test_registered():
    assert "exact" in EXPERIMENTS and SETTINGS["exact"] is exact.SETTINGS
    full = SETTINGS["exact"]["full"]
    assert full["sizes"] == (8, 12, 16, 20)
    assert exact._suite(full, 20) == {"construction": "exact", "max_sequences": 10**8}
    assert exact._suite(full, 16) == full["suite"]
    assert build_parser().parse_args(["reproduce", "exact", "--quick"]).experiment == "exact"


def test_summary_columns_and_values(tiny_run):
    out, res, _, _ = tiny_run
    written = pd.read_csv(out / "summary.csv")
    assert list(written.columns) == COLUMNS
    assert list(res.summary.columns) == COLUMNS
    row = written.iloc[0]
    assert (row.n_bits, row.seq_len, row.n_queries, row.n_sequences) == (8, 15, 14, 280)
    assert row.certified_min_rank == row.constructive_rank == 14 and row.exact
    assert row.certificate == "m8/certificate.json.gz" and row.family == "m8/family.npz"
    assert row.peak_memory > 0 and row.certify_time >= 0 and row.verify_time >= 0
    assert row.build_peak_memory > 0 and row.solver_sequences == 280
    assert pd.isna(row.error)
    assert all(res.checks.values()), res.checks
    for name in ("summary.md", "length.csv", "results.csv", "transition.csv", "growth.csv",
                 "exact.png", "provenance.json"):
        assert (out / name).is_file(), name


def test_suite_params_rebuild_the_family(tiny_run):
    out, res, _, _ = tiny_run
    row = res.summary.iloc[0]
    rebuilt = make_witness_suite(**json.loads(row.suite_params)).family
    stored = load_family(out / row.family)
    assert isinstance(stored, CompactFamily)
    np.testing.assert_array_equal(rebuilt.tokens, stored.tokens)
    np.testing.assert_array_equal(rebuilt.token_ids, stored.token_ids)
    np.testing.assert_array_equal(rebuilt.counts, stored.counts)


def test_certificate_verifies_with_the_cli(tiny_run, capsys):
    out, res, _, _ = tiny_run
    row = res.summary.iloc[0]
    assert main(["verify", str(out / row.family), str(out / row.certificate)]) == 0
    assert "rank >= 14" in capsys.readouterr().out


def test_length_curves_never_fall_and_meet(tiny_run):
    out, res, _, _ = tiny_run
    length = pd.read_csv(out / "length.csv")
    assert list(length.columns) == ["family", "n_bits", "seq_len", "certified_min_rank",
                                    "constructive_rank"]
    assert set(length["family"]) == {"hadamard", "exact"}
    for _, g in length.groupby("family"):
        g = g.sort_values("seq_len")
        assert g["seq_len"].tolist() == list(range(3, 3 + len(g)))
        assert (np.diff(g["certified_min_rank"]) >= 0).all()
        assert g["certified_min_rank"].iloc[-1] == g["constructive_rank"].iloc[-1]
        assert (g["certified_min_rank"].iloc[:-1] < g["constructive_rank"].iloc[:-1]).all()
    h = length[length["family"] == "hadamard"]
    assert h["certified_min_rank"].iloc[0] == 17 and (h["constructive_rank"] == 46).all()


def test_solver_loads_and_solves(tiny_run):
    out, res, _, _ = tiny_run
    row = res.summary.iloc[0]
    assert row.solver == "solvers/m8-rank14.safetensors"
    est = load_estimator(out / row.solver)
    family = load_family(out / row.family)
    X = family.to_sequences()
    assert est.rank == 14
    assert verify_solver(est, family, family.targets()) == row.solver_max_error < 0.5
    assert verify_solver(est, X, minip_targets(X)) < 0.5


def test_transition(tiny_run):
    out, res, _, _ = tiny_run
    table = pd.read_csv(out / "transition.csv")
    assert list(table.columns) == ["rank", "seeds", "n_solved", "solved_fraction",
                                   "best_max_error"]
    assert table["rank"].tolist() == [7, 13, 14, 28, 30]
    k = res.results
    assert not k.loc[k["rank"] < 14, "solved"].any()
    assert res.checks["none_solved_below_bound"]
    # the same training solves above the exact rank (r + 16 and 2r): the failures below
    # it are the bound's, not the trainer's
    assert k.loc[k["rank"] >= 28, "solved"].all()
    assert table.set_index("rank").loc[[28, 30], "n_solved"].tolist() == [1, 1]


def test_resume_skips_done_sizes(tiny_run):
    out, first, second, stamps = tiny_run
    assert {p.name: p.stat().st_mtime_ns for p in (out / "m8").iterdir()} == stamps
    assert second.provenance["fits_computed"] == 0
    pd.testing.assert_frame_equal(first.summary.drop(columns="error"),
                                  second.summary.drop(columns="error"), check_dtype=False)


def test_out_of_memory_is_a_row(monkeypatch):
    def fail(n_bits, suite, folder):
        raise MemoryError("cannot allocate")

    monkeypatch.setattr(exact, "in_fresh_process", fail)
    hadamard = {"n_bits": 24, "construction": "hadamard", "ladder_gap": None,
                "n_queries": 4}
    res = exact_experiment(**{**TINY, "kernel": {"max_epochs": 1}, "figures": False,
                              "length": {**TINY["length"], "hadamard": hadamard}})
    row = res.summary.iloc[0]
    assert row.n_bits == 8 and row.error == "MemoryError: cannot allocate"
    assert not res.checks["every_size_measured"]
    assert "cannot allocate" in res.markdown


def _sample(words, N, n):
    """``n`` sequences of the exact family of ``words`` at length ``N`` (every kind)."""
    ids, counts = exact_family(words, N)
    rows = np.random.default_rng(0).choice(len(ids), n, replace=False)
    return CompactFamily(words, ids[rows], counts[rows]).to_sequences()


def test_realization_solves_the_m16_exact_family():
    words = complement_closed_code(16)
    N = exact_seq_len(words)
    assert (len(words), N) == (870, 352)
    X = _sample(words, N, 24)
    est = exact_kernel_realization(tokens=words, seq_len=N)
    assert est.rank == 870
    assert verify_solver(est, X, minip_targets(X)) < 1e-6


def test_realization_at_large_beta():
    # beta * overlap far above 1e4: the off-diagonal log value scales with beta
    words = complement_closed_code(16)[:40]
    X = _sample(words, 3, 300)
    est = exact_kernel_realization(tokens=words, beta=3000.0)
    assert verify_solver(est, X, minip_targets(X)) < 1e-6


def test_size_suite_and_a_sampled_solver_check(tmp_path, monkeypatch):
    """A size's own suite arguments are in its suite_params (which rebuild it); a family
    above verify_max_sequences has its R3 head checked on a sample of solver_sample."""
    from types import SimpleNamespace

    from minip_learn.experiments import _exact_sizes

    monkeypatch.setattr(exact, "in_fresh_process", _exact_sizes.measure_in_process)
    cfg = {**SETTINGS["exact"]["quick"], "size_suite": {12: {"n_queries": 20}},
           "verify_max_sequences": 300, "solver_sample": 200}
    recipe = SimpleNamespace(cfg=cfg, out=tmp_path)
    row = exact._measure_size(recipe, 12)
    assert (row["n_queries"], row["n_sequences"], row["solver_sequences"]) == (20, 580, 200)
    assert row["solver_max_error"] < 0.5 and row["certified_min_rank"] == 20
    params = json.loads(row["suite_params"])
    assert params["n_queries"] == 20 and params["max_sequences"] == 10**8
    rebuilt = make_witness_suite(**params).family
    np.testing.assert_array_equal(rebuilt.token_ids,
                                  load_family(tmp_path / row["family"]).token_ids)
    pd.DataFrame([row], columns=COLUMNS).to_csv(tmp_path / "summary.csv", index=False)
    assert 12 in exact._done_rows(recipe)
    recipe.cfg = {**cfg, "size_suite": {12: {"n_queries": 16}}}
    assert 12 not in exact._done_rows(recipe)               # other settings: measured again
