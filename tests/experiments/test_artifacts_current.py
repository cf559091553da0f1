"""The committed quick artifacts are current: each quick recipe whose tables are under
``docs/_static`` is run again, fresh, and its outcome columns must equal the committed
ones. A change that moves an outcome (a fit that solves or stops solving, a smallest
solving rank, a certified bound) fails here until the artifact is regenerated with
``minip-learn reproduce docs-artifacts --only NAME``.

The outcome columns are the ones the docs draw conclusions from; timings and continuous
figures (losses, epochs, exact-match) may move with floating-point rounding and are not
compared.
"""

import os
from pathlib import Path

import pandas as pd
import pytest

from minip_learn.experiments import DOCS_ARTIFACTS, run_experiment

ROOT = Path(__file__).resolve().parents[2]

#: per quick artifact: its table, the columns that name a row, the outcome columns
OUTCOMES = {
    "witness-quick": ("summary.csv", ["model", "feature_map", "rank"],
                      ["n_fits", "n_solved", "certified_min_rank"]),
    "ood": ("table.csv", ["n_bits", "model", "feature map", "rank"], ["test solved"]),
    "beyond": ("table.csv", ["variant", "rank"], ["theorem applies", "solved"]),
    "maps": ("table.csv", ["feature map"],
             ["theorem applies", "smallest solving rank", "ranks tried"]),
    "scaling-quick": ("summary.csv", ["n_bits"],
                      ["n_sequences", "n_tokens", "certified_min_rank",
                       "smallest_solving_rank", "constructive_rank", "softmax_solved"]),
}


def test_every_quick_artifact_is_checked():
    quick = {name for name, spec in DOCS_ARTIFACTS.items() if spec["quick"]}
    assert quick == set(OUTCOMES)


def _outcomes(path, keys, columns):
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    return table[keys + columns].sort_values(keys).reset_index(drop=True)


#: the quick artifacts rerun by default; the others (the ood grid: about 2 minutes on
#: two idle cores, as long as the four others together) when the environment sets
#: MINIP_CHECK_ALL_ARTIFACTS=1, so that the test suite stays within CI's time
ALWAYS = ("witness-quick", "beyond", "maps", "scaling-quick")


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_quick_artifact_outcomes_are_current(name, tmp_path):
    if name not in ALWAYS and os.environ.get("MINIP_CHECK_ALL_ARTIFACTS") != "1":
        pytest.skip(f"{name}: set MINIP_CHECK_ALL_ARTIFACTS=1 to rerun it")
    spec = DOCS_ARTIFACTS[name]
    table, keys, columns = OUTCOMES[name]
    # as minip-learn reproduce docs-artifacts runs it
    stacked = {"ensemble": spec["ensemble"]} if "ensemble" in spec else {}
    run_experiment(spec["experiment"], quick=True, out=tmp_path, progress=False,
                   n_jobs=2, **stacked)
    committed = _outcomes(ROOT / "docs" / "_static" / spec["folder"] / table, keys, columns)
    rerun = _outcomes(tmp_path / table, keys, columns)
    pd.testing.assert_frame_equal(rerun, committed, obj=f"{name}: {table}")
