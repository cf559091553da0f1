"""The maps recipe: a leaderboard of feature maps (tiny settings)."""

import numpy as np
import pytest

from minip_learn.cli import build_parser
from minip_learn.experiments import (
    EXPERIMENTS,
    SETTINGS,
    maps_experiment,
    run_experiment,
)
from minip_learn.experiments.maps import _map_ranks

TINY = dict(ranks=(2, 16), kernel={"max_epochs": 5}, ood_kernel={"max_epochs": 5},
            ood={"n_bits": 8, "n_tokens": 128, "n_train": 32, "n_test": 16,
                 "random_state": 0},
            ood_rank=4, progress=False, n_jobs=1)


def test_maps_leaderboard_rows_files_and_flags(tmp_path):
    res = maps_experiment(maps=["table", "rff", "taylor"], out=tmp_path, **TINY)
    s = res.summary.set_index("feature_map")
    assert list(s.index) == ["table", "rff", "taylor"]
    assert {"theorem_applies", "smallest_solving_rank", "kernel_min", "ood_exact_match",
            "fit_time"} <= set(s.columns)
    # declared nonnegative; signed, flagged from its kernel; signed features, positive kernel
    assert s.loc["table", "theorem_applies"] and s.loc["taylor", "theorem_applies"]
    fits = res.results[res.results["feature_map"] == "rff"]
    assert fits["theorem_applies"].astype(bool).tolist() == (fits["kernel_min"] >= 0).tolist()
    assert s.loc["rff", "kernel_min"] < 0 and not s.loc["rff", "theorem_applies"]
    assert s.loc["taylor", "kernel_min"] >= 0.5 - 1e-9  # 1 + t + t^2/2 >= 1/2
    # table rejects unseen tokens: no OOD score; the others are scored
    assert np.isnan(s.loc["table", "ood_exact_match"])
    assert 0 <= s.loc["rff", "ood_exact_match"] <= 1
    # taylor's ranks are of the form 1 + p + p(p+1)/2
    assert s.loc["taylor", "ranks"] == "3 21"
    assert res.checks == {"no_covered_map_solved_below_bound": True}
    assert len(res.results) == 6 and "kernel_min" in res.results
    for name in ("summary.csv", "summary.md", "table.csv", "leaderboard.png"):
        assert (tmp_path / name).exists(), name


def test_maps_registered_everywhere():
    assert "maps" in EXPERIMENTS and set(SETTINGS["maps"]) == {"quick", "full"}
    assert build_parser().parse_args(["reproduce", "maps", "--quick"]).experiment == "maps"
    res = run_experiment("maps", maps=["elu+1"], figures=False, **TINY)
    assert res.summary["feature_map"].tolist() == ["elu+1"]


def test_maps_unknown_map_fails_before_any_fit(tmp_path):
    with pytest.raises(ValueError, match="valid names"):
        maps_experiment(maps=["nope"], out=tmp_path, **TINY)
    assert not any((tmp_path / "runs").iterdir())


def test_map_ranks_are_valid_for_the_map():
    assert _map_ranks("elu+1", 24, (2, 16)) == [2, 16]
    assert _map_ranks("dpfp", 24, (3, 8)) == [4, 8]  # 2 * proj_dim
