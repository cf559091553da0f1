"""The scaling recipe: the rank sandwich across n_bits."""

import json
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import torch

from minip_learn.constructions import factorized_kernel_head
from minip_learn.datasets import make_witness_suite, minip_targets
from minip_learn.estimators import load_estimator
from minip_learn.experiments import (
    growth_fit,
    run_experiment,
    scaling_checks,
    scaling_experiment,
)
from minip_learn.experiments.scaling import SUMMARY_COLUMNS
from minip_learn.metrics import verify_solver
from minip_learn.plotting import plot_rank_sandwich

TINY = dict(sizes=(8, 12), seeds=(0, 1), softmax_seeds=(0, 1),
            kernel={"max_epochs": 800}, softmax={"max_epochs": 300},
            construction={"steps": 100, "nmf_iter": 50}, design_bits=(8, 16, 24))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    first = scaling_experiment(out=out, progress=False, **TINY)
    second = scaling_experiment(out=out, progress=False, **TINY)
    return out, first, second


def _design_rank_by_hand(X, queries, keys):
    """The R5 integer of a witness design, recomputed from the sequences.

    Every ordered pair ``(x_i, k_j)`` must have its three R4 multisets
    ``{x_i, k_i^(N-1)}``, ``{x_i, k_j^(N-1)}``, ``{x_i, k_i, k_j^(N-2)}`` in ``X`` with gap
    ``g = <x_i, k_j> - <x_i, k_i> >= 2``; then ``eps_ij = 1/((N-2)(g-1))`` and the rank is
    ``n`` when every row of ``eps`` sums to at most 1 (each entry of ``B`` is strictly
    below its ``eps``, so ``B`` is strictly diagonally dominant), otherwise the smallest
    integer above ``n^2 / (n + sum eps_ij^2)`` (THEORY.md R4, R5).
    """
    n, N = len(queries), X.shape[1]
    word = [bytes(t) for t in np.asarray(queries, dtype=np.uint8)]
    key = [bytes(t) for t in np.asarray(keys, dtype=np.uint8)]
    present = {frozenset(Counter(bytes(t) for t in seq).items()) for seq in X}

    def holds(*parts):
        counts = Counter()
        for token, c in parts:
            counts[token] += c
        return frozenset(counts.items()) in present

    Q, K = np.asarray(queries, dtype=np.int64), np.asarray(keys, dtype=np.int64)
    eps = [[Fraction(0)] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            g = int(Q[i] @ K[j] - Q[i] @ K[i])
            assert g >= 2 and holds((word[i], 1), (key[i], N - 1))
            assert holds((word[i], 1), (key[j], N - 1))
            assert holds((word[i], 1), (key[i], 1), (key[j], N - 2))
            eps[i][j] = Fraction(1, (N - 2) * (g - 1))
    if max(sum(row) for row in eps) <= 1:
        return n
    value = Fraction(n * n) / (n + sum(e * e for row in eps for e in row))
    return min(n, math.floor(value) + 1)


def test_summary_columns_and_values(tiny_run):
    _, res, _ = tiny_run
    s = res.summary
    assert set(SUMMARY_COLUMNS) <= set(s.columns)
    assert s["n_bits"].tolist() == [8, 12]
    # the default suites are greedy constant-weight codes with complement keys: m = 8,
    # 2 queries (11110000, 10001110) whose cross gap is 3, eps = 1/2; m = 12, 4 queries
    # of weight 6 overlapping pairwise in 2, gap 4, eps = 1/3. Every row of eps sums to
    # at most 1, so R5 gives r >= n: 2 and 4. R3 needs one feature per distinct token
    # (queries and keys): 4 and 8. Recomputed from the sequences below.
    assert s["certified_min_rank"].tolist() == [2, 4]
    assert s["constructive_rank"].tolist() == [4, 8]
    assert (s["softmax_score_dim"] == s["n_bits"]).all()
    for _, row in s.iterrows():
        assert row["certified_min_rank"] <= row["smallest_solving_rank"] <= row["constructive_rank"]
        assert row["upper_route"] in ("training (table)", "construction")
        # suite_params rebuild the suite
        suite = make_witness_suite(**json.loads(row["suite_params"]))
        assert len(suite.X) == row["n_sequences"]
        assert row["certified_min_rank"] == _design_rank_by_hand(
            suite.X, suite.queries, suite.designated_keys)
        m = suite.X.shape[2]
        assert row["constructive_rank"] == len(np.unique(suite.X.reshape(-1, m), axis=0))
    assert set(res.results["model"]) == {"kernel", "construction", "softmax"}
    assert set(res.checks) == {"none_solved_below_bound", "sandwich_ordered",
                               "softmax_solved_every_seed"}
    assert res.checks["none_solved_below_bound"] and res.checks["sandwich_ordered"]
    # the control fit one rank below the bound was trained and failed
    k = res.results[res.results["model"] == "kernel"]
    for m, bound in zip(s["n_bits"], s["certified_min_rank"]):
        below = k[(k["n_bits"] == m) & (k["rank"] == bound - 1)]
        assert len(below) == 2 and not below["solved"].any()
    # ... while the same training (the recipe's kernel settings, seeds and batched sweep)
    # solves each suite at its constructive rank: the failures are the bound's
    from minip_learn import KernelAttentionRegressor
    from minip_learn.experiments import scaling
    from minip_learn.model_selection import rank_sweep

    kernel = {**scaling.SETTINGS["quick"]["kernel"], **TINY["kernel"]}
    for _, row in s.iterrows():
        suite = make_witness_suite(**json.loads(row["suite_params"]))
        above = rank_sweep(KernelAttentionRegressor(**kernel), suite.X, suite.y,
                           ranks=[int(row["constructive_rank"])], seeds=list(TINY["seeds"]),
                           param_grid={"feature_map": ["table"]}, ensemble=True,
                           progress=False).results
        assert len(above) == 2 and above["solved"].all()
    assert list(res.growth["quantity"])[-1] == "design bound (calculation)"


def test_outputs_written(tiny_run):
    out, res, _ = tiny_run
    for name in ("results.csv", "summary.csv", "summary.md", "growth.csv", "design.csv",
                 "rank_sandwich.png"):
        assert (out / name).exists(), name
    written = pd.read_csv(out / "summary.csv")
    upper = res.summary["smallest_solving_rank"].tolist()
    assert written["smallest_solving_rank"].tolist() == upper
    text = (out / "summary.md").read_text()
    assert "95% CI" in text or "fewer than 3" in text


def test_saved_solvers_verify_in_float64(tiny_run):
    out, res, _ = tiny_run
    for _, row in res.summary.iterrows():
        path = out / row["solver"]
        assert path.name == (f"m{row['n_bits']}-rank{row['smallest_solving_rank']}"
                             ".safetensors")
        est = load_estimator(path)
        assert est.rank == row["smallest_solving_rank"]
        suite = make_witness_suite(**json.loads(row["suite_params"]))
        p = est.predict(suite.X)
        assert p.dtype == np.float64
        assert np.abs(p - suite.y).max() < 0.5
        assert verify_solver(est, suite.X, suite.y) == row["solver_max_error"]


def test_rerun_refits_nothing(tiny_run):
    _, first, second = tiny_run
    assert first.n_computed > 0
    assert second.n_computed == 0
    assert second.n_resumed == first.n_computed + first.n_resumed
    cols = ["certified_min_rank", "smallest_solving_rank", "failed_rank_below",
            "construction_rank", "softmax_solved"]
    pd.testing.assert_frame_equal(first.summary[cols], second.summary[cols])
    assert len(second.results) == len(first.results)


def _tables(upper=5, solved_below=False, softmax_ok=True):
    summary = pd.DataFrame({"n_bits": [8, 12], "certified_min_rank": [2, 4],
                            "smallest_solving_rank": [2, upper],
                            "constructive_rank": [4, 8]})
    results = pd.DataFrame({
        "model": ["kernel", "kernel", "construction", "softmax", "softmax"],
        "n_bits": [8, 12, 12, 8, 12],
        "rank": [1, 3, 8, None, None],
        "solved": [False, solved_below, True, True, softmax_ok],
    })
    return summary, results


@pytest.mark.parametrize("kwargs, failing", [
    ({}, None),
    ({"solved_below": True}, "none_solved_below_bound"),
    ({"upper": 9}, "sandwich_ordered"),
    ({"upper": 3}, "sandwich_ordered"),
    ({"upper": None}, "sandwich_ordered"),
    ({"softmax_ok": False}, "softmax_solved_every_seed"),
])
def test_checks_logic(kwargs, failing):
    summary, results = _tables(**kwargs)
    checks = scaling_checks(summary, results)
    assert {k for k, ok in checks.items() if not ok} == ({failing} if failing else set())


def test_checks_a_construction_below_the_bound_is_a_bug():
    summary, results = _tables(upper=5)
    results.loc[len(results)] = ["construction", 12, 2, True]
    assert not scaling_checks(summary, results)["none_solved_below_bound"]


def test_factorized_head_exact_on_small_suite():
    suite = make_witness_suite(12, max_sequences=20000)
    est = factorized_kernel_head(suite.X, suite.y, suite.constructive_rank, random_state=0)
    head = est.net_.module_
    assert est.rank == suite.constructive_rank and head.nonnegative
    # built without training, evaluated in float64
    assert est.n_epochs_ == 0 and est.dtype == "float64"
    assert all(p.dtype == torch.float64 for p in head.parameters())
    # exact check by hand from the two tables: alpha = P Q^T on the tokens
    P, Q = (np.exp(table.detach().numpy()) for table in head.token_tables())
    vocab = est.feature_kwargs["vocabulary"]
    idx = np.array([[np.flatnonzero((vocab == t).all(1))[0] for t in seq] for seq in suite.X])
    A = (P @ Q.T)[idx[:, :, None], idx[:, None, :]]
    G = suite.X.astype(float) @ suite.X.transpose(0, 2, 1).astype(float)
    _, b = head.readout.coefficients(torch.zeros(suite.X.shape[2], dtype=torch.float64))
    b = b.item()
    p = (A * G).sum(-1) / A.sum(-1) + b
    np.testing.assert_allclose(p, est.predict(suite.X), atol=1e-9)
    assert np.abs(p - minip_targets(suite.X)).max() < 0.5
    assert est.solved_ and verify_solver(est, suite.X, suite.y) < 0.5


@pytest.mark.parametrize("offset", [-1, 0], ids=["below-bound", "at-bound"])
def test_factorized_head_solves_only_at_or_above_the_bound(offset):
    """The same refinement (seed, steps) fails one rank below the certified rank 4 and
    solves at it: a failure below the bound is the bound's, not the refinement's."""
    suite = make_witness_suite(12, max_sequences=20000)
    assert suite.certified_min_rank == 4
    est = factorized_kernel_head(suite.X, suite.y, suite.certified_min_rank + offset,
                                 random_state=0, steps=200)
    solves = offset >= 0
    assert est.solved_ == solves
    assert (verify_solver(est, suite.X, suite.y) < 0.5) == solves


def test_factorized_head_bad_input():
    suite = make_witness_suite(12, max_sequences=20000)
    with pytest.raises(ValueError, match="rank"):
        factorized_kernel_head(suite.X, suite.y, 0)
    with pytest.raises(ValueError, match="shape"):
        factorized_kernel_head(suite.X[0], suite.y[0], 2)


def test_growth_fit_against_hand_computation():
    m = [8, 12, 16, 20]
    r = [2, 4, 8, 12]
    fit = growth_fit(m, r)
    # by hand: x mean 14, Sxx = 36 + 4 + 4 + 36 = 80; z = log2 r
    z = [1.0, 2.0, 3.0, math.log2(12)]
    zbar = sum(z) / 4
    slope = sum((x - 14) * (zi - zbar) for x, zi in zip(m, z)) / 80
    resid = [zi - (zbar + slope * (x - 14)) for x, zi in zip(m, z)]
    se = math.sqrt(sum(e * e for e in resid) / 2 / 80)
    t975_2 = 4.302652729911275  # t quantile, 2 degrees of freedom
    assert fit.n == 4
    assert fit.slope == pytest.approx(slope, rel=1e-12)
    assert fit.stderr == pytest.approx(se, rel=1e-12)
    assert fit.ci_low == pytest.approx(slope - t975_2 * se, rel=1e-9)
    assert fit.ci_high == pytest.approx(slope + t975_2 * se, rel=1e-9)


def test_growth_fit_edge_cases():
    fit = growth_fit([8, 16, 24], [2, None, 8])
    assert fit.n == 2 and fit.slope == pytest.approx(0.125) and math.isnan(fit.ci_low)
    assert math.isnan(growth_fit([8], [2]).slope)
    with pytest.raises(ValueError, match="differ in length"):
        growth_fit([8, 16], [2])
    with pytest.raises(ValueError, match="positive"):
        growth_fit([8, 16, 24], [0, 2, 4])


def test_plot_rank_sandwich_labels_the_design_as_a_calculation():
    import matplotlib.pyplot as plt

    summary, _ = _tables(upper=5)
    summary["softmax_score_dim"] = summary["n_bits"]
    design = pd.DataFrame({"n_bits": [8, 64, 128], "certified_min_rank": [2, 2802, 1608712]})
    ax = plot_rank_sandwich(summary, design=design)
    labels = [line.get_label() for line in ax.get_lines()]
    dashed = [line for line in ax.get_lines() if "calculation" in line.get_label()]
    assert len(dashed) == 1 and dashed[0].get_linestyle() == "--"
    assert max(dashed[0].get_xdata()) == 128
    assert any("softmax" in lab for lab in labels)
    assert ax.get_yscale() == "log"
    plt.close(ax.figure)


def test_redraw_reads_the_exact_summary_beside_the_folder(tmp_path):
    import matplotlib.pyplot as plt

    from minip_learn.experiments.scaling import redraw_rank_sandwich

    out = tmp_path / "scaling"
    out.mkdir()
    summary, _ = _tables(upper=5)
    summary.to_csv(out / "summary.csv", index=False)
    pd.DataFrame({"n_bits": [8, 64], "certified_min_rank": [2, 3048]}).to_csv(
        out / "design.csv", index=False)
    drawn = []
    original = plt.Figure.savefig

    def savefig(fig, path, **kwargs):
        drawn.append([ln.get_label() for ln in fig.axes[0].get_lines()])
        return original(fig, path, **kwargs)

    exact_label = "exact minimum rank, long sequences (R9)"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Figure, "savefig", savefig)
        # no exact recipe output beside the folder: no exact curve
        assert redraw_rank_sandwich(out) == out / "rank_sandwich.png"
        (tmp_path / "exact").mkdir()
        pd.DataFrame({"n_bits": [8, 12], "certified_min_rank": [14, 80],
                      "exact": [True, True]}).to_csv(tmp_path / "exact" / "summary.csv",
                                                     index=False)
        redraw_rank_sandwich(out)
        redraw_rank_sandwich(out, exact=False)
    assert [exact_label in labels for labels in drawn] == [False, True, False]
    assert (out / "rank_sandwich.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="exact: no file"):
        redraw_rank_sandwich(out, exact=tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="exact must be"):
        scaling_experiment(exact=3, progress=False)


def test_unknown_setting():
    with pytest.raises(TypeError, match="unexpected setting"):
        scaling_experiment(sizez=(8,), progress=False)


def test_two_feature_maps_in_memory():
    # a construction without refinement fails below the constructive rank, so the
    # training route (both maps side by side) searches below it and wins
    res = scaling_experiment(sizes=(8,), feature_maps=("table", "exp"), seeds=(0,),
                             softmax_seeds=(0,), kernel={"max_epochs": 300},
                             softmax={"max_epochs": 300},
                             construction={"steps": 0, "nmf_iter": 1}, design_bits=(8,),
                             progress=False, figures=False)
    row = res.summary.iloc[0]
    assert {"training_rank_table", "training_rank_exp"} <= set(res.summary.columns)
    # the m = 8 default suite has 4 distinct tokens (2 queries, their 2 complements)
    assert row["construction_rank"] == row["constructive_rank"] == 4
    assert row["training_rank"] == min(row["training_rank_table"], row["training_rank_exp"])
    assert row["smallest_solving_rank"] == row["training_rank"] < 4
    assert row["upper_route"].startswith("training")
    assert row["failed_rank_below"] == row["training_failed_below"] < row["training_rank"]
    k = res.results[res.results["model"] == "kernel"]
    assert set(k["feature_map"]) == {"table", "exp"}
    assert (k["rank"] < row["construction_rank"]).all()
    assert res.files == {} and row["solver"] is None


def test_training_searches_below_the_construction(tiny_run):
    _, res, _ = tiny_run
    k = res.results[res.results["model"] == "kernel"]
    for _, row in res.summary.iterrows():
        ranks = k.loc[k["n_bits"] == row["n_bits"], "rank"]
        assert (ranks < row["construction_rank"]).all()
        if row["construction_rank"] == row["certified_min_rank"]:
            # nothing to search below the bound: the control alone, and no training rank
            assert set(ranks) == {row["certified_min_rank"] - 1}
            assert pd.isna(row["training_rank"])


def test_run_experiment_and_command_line(tmp_path, monkeypatch, capsys):
    from minip_learn.cli import main
    from minip_learn.experiments import EXPERIMENTS, SETTINGS
    from minip_learn.experiments import scaling as scaling_module

    assert "scaling" in EXPERIMENTS and SETTINGS["scaling"] is scaling_module.SETTINGS
    tiny = dict(sizes=(8,), seeds=(0,), softmax_seeds=(0,), kernel={"max_epochs": 200},
                softmax={"max_epochs": 200}, design_bits=(8, 16), progress=False,
                figures=False)
    res = run_experiment("scaling", **tiny)
    assert res.checks == {"none_solved_below_bound": True, "sandwich_ordered": True,
                          "softmax_solved_every_seed": True}
    # the command line: the --quick grid made tiny; exit status from the checks
    quick = {**scaling_module.SETTINGS["quick"],
             **{k: v for k, v in tiny.items() if k not in ("progress", "figures")}}
    monkeypatch.setitem(scaling_module.SETTINGS, "quick", quick)
    argv = ["reproduce", "scaling", "--quick", "--out", str(tmp_path), "--n-jobs", "1",
            "--no-progress"]
    assert main(argv) == 0
    for name in ("summary.csv", "summary.md", "growth.csv", "design.csv",
                 "rank_sandwich.png"):
        assert (tmp_path / "scaling" / name).exists(), name
    assert "all expected behaviours observed" in capsys.readouterr().out
    # a check that fails gives exit status 1
    monkeypatch.setitem(quick, "softmax", {"max_epochs": 1, "n_init": 1})
    assert main(argv[:4] + [str(tmp_path / "short")] + argv[5:]) == 1
    # --ranks does not apply: a clear error before any fit
    assert main(argv + ["--ranks", "4"]) == 2
    assert "--ranks does not apply to scaling" in capsys.readouterr().err
