"""The full-task recipe on a tiny grid: bounds, solvers on every sequence, resuming."""

import json

import numpy as np
import pandas as pd

from minip_learn import KernelAttentionRegressor
from minip_learn.cli import build_parser
from minip_learn.constructions import rank_one_head
from minip_learn.datasets import make_full_task
from minip_learn.estimators import load_estimator
from minip_learn.experiments import EXPERIMENTS, SETTINGS, full_task, full_task_experiment
from minip_learn.experiments._full_task_solvers import key_weight_head, verify_ordered
from minip_learn.model_selection import rank_sweep
from minip_learn.theory import (
    full_task_tokens,
    grouped_key_weights,
    verify_certificate,
    verify_full_task_certificate,
)

# 400 epochs: enough for the recipe's training to solve m = 4 at one feature per token
TINY = dict(sizes=(2, 3, 4), kernel={"max_epochs": 400}, seeds=(0,), progress=False,
            figures=False)


def test_recipe_bounds_r_star_and_resumes(tmp_path):
    res = full_task_experiment(out=tmp_path, **TINY)
    s = res.summary
    assert s[["n_bits", "certified_min_rank", "smallest_solving_rank"]].values.tolist() == [
        [2, 1, 1], [3, 1, 1], [4, 2, 2]]
    assert s["exact"].all() and all(res.checks.values()), res.checks
    assert (s["n_ordered_sequences"] == [64, 512, 4096]).all()
    for _, row in s.iterrows():
        est = load_estimator(tmp_path / row["solver"])
        assert est.rank == row["smallest_solving_rank"]
        assert verify_ordered(est, full_task_tokens(row["n_bits"])) < 0.5
        cert = json.loads((tmp_path / row["certificate"]).read_text())
        assert cert["certified_min_rank"] == row["certified_min_rank"]
    # m = 4: a trained fit below the certified rank was tried and failed
    fits = res.results
    assert (fits["rank"] < 2).any() and not fits.loc[fits["rank"] < 2, "solved"].any()
    # ... while the same training (the recipe's kernel settings, seeds and batched sweep)
    # solves it at 2^4 = 16, one feature per token: the failure is the bound's
    kernel = {**full_task.SETTINGS["quick"]["kernel"], **TINY["kernel"]}
    task = make_full_task(4)
    control = rank_sweep(KernelAttentionRegressor(**kernel), task.family, task.slot_targets,
                         ranks=[16], seeds=list(TINY["seeds"]), ensemble=True,
                         progress=False).results
    assert len(control) == len(TINY["seeds"]) and control["solved"].all()
    assert {"summary.csv", "summary.md", "pools.csv", "candidates.csv",
            "provenance.json"} <= {p.name for p in tmp_path.iterdir()}
    again = full_task_experiment(out=tmp_path, **TINY)
    pd.testing.assert_frame_equal(again.summary, pd.read_csv(tmp_path / "summary.csv"),
                                  check_dtype=False)
    assert again.provenance["fits_computed"] == 0


def test_recipe_is_registered_with_a_quick_and_a_full_grid():
    assert "full_task" in EXPERIMENTS and SETTINGS["full_task"] is full_task.SETTINGS
    assert SETTINGS["full_task"]["quick"]["sizes"] == (2, 3, 4, 5, 9, 12, 16)
    assert SETTINGS["full_task"]["full"]["sizes"] == tuple(range(2, 33))
    args = build_parser().parse_args(["reproduce", "full-task", "--quick"])
    assert args.experiment == "full-task" and args.quick


def test_every_ordered_sequence_tells_a_solver_from_a_failure():
    tokens = full_task_tokens(3)
    assert verify_ordered(key_weight_head(grouped_key_weights(3)), tokens,
                          chunk=100) < 0.5
    # uniform attention (R1) fails length 3
    assert verify_ordered(rank_one_head(3), tokens) >= 0.5
    assert np.isfinite(verify_ordered(rank_one_head(3), tokens))


def _excess_of_json(path):
    """The largest excess E(w, a, c) of an overlap kernel's JSON file, recomputed here in
    exact fractions from the definition (weights d_j(w): F_w(k) = sum_j d_j C(w - k, j))."""
    from fractions import Fraction
    from math import comb

    doc = json.loads(path.read_text())
    worst = Fraction(0)
    for w, ds in enumerate(doc["weights"]):
        d = [Fraction(x) for x in ds]
        F = [sum(dj * comb(w - k, j) for j, dj in enumerate(d)) for k in range(w + 1)]
        assert min(F) > 0
        for a in range(w + 1):
            for c in range(a, w + 1):
                worst = max(worst, (F[w] * (w - a) + F[c] * (c - a)) / (F[w] + F[a] + F[c]))
    assert Fraction(doc["max_excess"]) == worst
    return doc, worst


def test_recipe_above_the_listed_sizes(tmp_path):
    """m = 9: the certificate checked without listing the task, the overlap kernel's
    exact weights written as fractions and rechecked here from the definition; m = 4:
    the same kernel checked on every ordered sequence."""
    res = full_task_experiment(out=tmp_path, sizes=(4, 9), progress=False, figures=False,
                               sample_size=2000, kernel={"max_epochs": 50}, seeds=(0,))
    s = res.summary.set_index("n_bits")
    assert all(res.checks.values()), res.checks
    row = s.loc[9]
    assert row["certified_min_rank"] >= 3 and row["certificate_verified"]
    assert verify_full_task_certificate(tmp_path / row["certificate"], 9)
    assert row["smallest_solving_rank"] == row["overlap_rank"] == 46
    assert row["upper_method"] == "overlap kernel (degree 2)"
    doc, worst = _excess_of_json(tmp_path / row["solver"])
    assert doc["rank"] == 46 and worst < 1 and row["solver_max_error"] == float(worst / 2)
    assert row["overlap_check"] == "2,000 random sequences" and row["overlap_check_error"] < 0.5
    assert row["n_ordered_sequences"] == 2 ** 27
    assert s.loc[4, "overlap_check"].startswith("every ordered sequence")
    assert s.loc[4, "overlap_rank"] == 5 and s.loc[4, "overlap_check_error"] < 0.5
    cert4 = tmp_path / s.loc[4, "certificate"]
    assert verify_certificate(cert4, make_full_task(4).family)
    assert "Growth per bit of token" in res.markdown


def test_a_flip_cycle_raises_the_lower_bound_from_five_bits(tmp_path):
    """m = 5: the R5 certificate gives 2, the odd flip cycle 3, which meets the rank-3
    head: r*(5) = 3. The cycle file reads back and verifies."""
    from types import SimpleNamespace

    from minip_learn.experiments._full_task_report import flip_cycle_record
    from minip_learn.theory import verify_flip_cycle

    recipe = SimpleNamespace(out=tmp_path)
    row = flip_cycle_record(recipe, dict(n_bits=5, certified_min_rank=2,
                                         smallest_solving_rank=3))
    assert row["lower_bound"] == 3 and row["exact"] and row["flip_cycle_verified"]
    doc = json.loads((tmp_path / row["flip_cycle"]).read_text())
    cycle = {k: np.array([[int(c) for c in t] for t in doc[k]]) for k in ("queries", "lo", "hi")}
    assert doc["n_bits"] == 5 and verify_flip_cycle(cycle, make_full_task(5).family)
    small = flip_cycle_record(recipe, dict(n_bits=4, certified_min_rank=2,
                                           smallest_solving_rank=2))
    assert small["lower_bound"] == 2 and small["flip_cycle"] is None
    big = flip_cycle_record(recipe, dict(n_bits=9, certified_min_rank=3,
                                         smallest_solving_rank=46))
    assert big["lower_bound"] == 3 and not big["exact"]
