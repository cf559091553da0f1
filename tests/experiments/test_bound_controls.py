"""Positive controls of the recipes' bound checks: the quick tests of the ``beyond`` and
``maps`` recipes train a few epochs, so their "no covered fit solved below the bound"
holds whatever the training does. Here every fit is reported solved (the sweep's score
patched, the training untouched): the recipe must refuse a covered fit below the
certified rank as a bug, and record the fits at or above it and those outside the
theorem."""

import pytest

import minip_learn.model_selection._execution as execution
from minip_learn.experiments import beyond_experiment, maps_experiment


@pytest.fixture
def every_fit_solves(monkeypatch):
    scores = execution._scores

    def solved(plan, est):
        values, _, seconds = scores(plan, est)
        return values, True, seconds

    monkeypatch.setattr(execution, "_scores", solved)


def test_beyond_refuses_a_covered_fit_below_the_bound(every_fit_solves):
    base = {"feature_map": "table", "max_epochs": 2}
    with pytest.raises(RuntimeError, match="certified minimum rank is 8"):
        beyond_experiment(ranks=(2,), variants=[("baseline", "regressor", {})], base=base,
                          progress=False, figures=False, n_jobs=1)
    # at the bound, and outside the theorem (two heads), a solve is recorded
    res = beyond_experiment(ranks=(8,), variants=[("baseline", "regressor", {}),
                                                  ("2 heads", "regressor", {"n_heads": 2})],
                            base=base, progress=False, figures=False, n_jobs=1)
    assert res.results["solved"].astype(bool).all()
    res = beyond_experiment(ranks=(2,), variants=[("2 heads", "regressor", {"n_heads": 2})],
                            base=base, progress=False, figures=False, n_jobs=1)
    assert res.results["solved"].astype(bool).all()


def test_maps_refuses_a_covered_fit_below_the_bound(every_fit_solves):
    tiny = dict(kernel={"max_epochs": 2}, ood_kernel={"max_epochs": 2},
                ood={"n_bits": 8, "n_tokens": 128, "n_train": 32, "n_test": 16,
                     "random_state": 0},
                ood_rank=4, progress=False, figures=False, n_jobs=1)
    with pytest.raises(RuntimeError, match="certified minimum rank is 8"):
        maps_experiment(maps=["elu+1"], ranks=(2,), **tiny)
    res = maps_experiment(maps=["elu+1"], ranks=(8,), **tiny)
    assert res.summary.set_index("feature_map").loc["elu+1", "smallest_solving_rank"] == 8
