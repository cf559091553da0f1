"""The committed full-task grid (``docs/_static/full-task``) checks out file by file.

Every certificate in the folder verifies against the whole task at its size, every
overlap kernel solves the task by an exact check written here from the theory page's
formula (nothing of the library's overlap-kernel code), every flip cycle verifies, the
bounds are ordered and never decrease where the argument says they cannot, and the
growth table is the least-squares slope of the summary's own columns.
"""

import csv
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from minip_learn.theory import verify_flip_cycle, verify_full_task_certificate

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "_static" / "full-task"
#: certificates up to this size are committed (larger ones are rebuilt by the recipe)
COMMITTED_CERTIFICATES = list(range(2, 21)) + [27]


def _summary():
    with (FOLDER / "summary.csv").open(newline="") as f:
        return {int(row["n_bits"]): row for row in csv.DictReader(f)}


def test_the_grid_reaches_32_bits_with_ordered_bounds():
    rows = _summary()
    assert sorted(rows) == list(range(2, 33))
    lower = [int(rows[m]["lower_bound"]) for m in sorted(rows)]
    upper = [int(rows[m]["smallest_solving_rank"]) for m in sorted(rows)]
    assert all(lo <= up for lo, up in zip(lower, upper))
    # a certificate of m bits padded with a zero bit is one of m + 1 bits
    assert all(a <= b for a, b in zip(lower, lower[1:]))
    exact = [m for m in sorted(rows) if rows[m]["exact"] == "True"]
    assert exact == [2, 3, 4, 5]
    assert [int(rows[m]["lower_bound"]) for m in exact] == [1, 1, 2, 3]
    for m in rows:   # R3's head is the ceiling
        assert int(rows[m]["ceiling_rank"]) == 2 ** m and upper[m - 2] < 2 ** m


@pytest.mark.parametrize("m", COMMITTED_CERTIFICATES)
def test_each_committed_certificate_verifies_on_the_whole_task(m):
    row = _summary()[m]
    path = FOLDER / row["certificate"]
    assert path.is_file(), path
    assert verify_full_task_certificate(path, m)
    cert = json.loads(path.read_text())
    assert cert["certified_min_rank"] == int(row["certified_min_rank"])
    assert int(row["lower_bound"]) >= cert["certified_min_rank"]


@pytest.mark.parametrize("m", range(5, 33))
def test_each_flip_cycle_verifies(m):
    row = _summary()[m]
    data = json.loads((FOLDER / f"m{m}" / "flip_cycle.json").read_text())
    cycle = {k: np.array([[int(c) for c in word] for word in data[k]])
             for k in ("queries", "lo", "hi")}
    assert len(cycle["queries"]) % 2 == 1 and data["n_bits"] == m
    assert verify_flip_cycle(cycle)
    assert row["flip_cycle_verified"] == "True"
    assert int(row["lower_bound"]) >= 3


def _excess(weights, w, a, c):
    """E(w, a, c) of the theory page: F_w(k) = sum_j d_j C(w - k, j)."""
    def f(k):
        return sum(d * math.comb(w - k, j) for j, d in enumerate(weights))
    return (f(w) * (w - a) + f(c) * (c - a)) / (f(w) + f(a) + f(c))


@pytest.mark.parametrize("m", range(2, 33))
def test_each_overlap_kernel_solves_the_task_exactly(m):
    row = _summary()[m]
    data = json.loads((FOLDER / f"m{m}" / "overlap_kernel.json").read_text())
    weights = [[Fraction(d) for d in ws] for ws in data["weights"]]
    D = data["degree"]
    assert len(weights) == m + 1 and all(len(ws) == D + 1 for ws in weights)
    assert all(d >= 0 for ws in weights for d in ws) and all(ws[0] > 0 for ws in weights)
    worst = max(_excess(weights[w], w, a, c)
                for w in range(m + 1) for a in range(w + 1) for c in range(a, w + 1))
    assert worst < 1 and worst == Fraction(data["max_excess"])
    assert Fraction(data["bias"]) == -worst / 2
    rank = sum(math.comb(m, j) for j in range(D + 1))
    assert data["rank"] == rank == int(row["overlap_rank"])
    assert int(row["smallest_solving_rank"]) <= rank


def test_a_wrong_overlap_kernel_fails_the_check():
    """The reference can fail: the kernel of m = 9 with its top weights at w = 9 set
    to zero leaves a case at excess 1 or more."""
    data = json.loads((FOLDER / "m9" / "overlap_kernel.json").read_text())
    ws = [Fraction(d) for d in data["weights"][9]]
    ws = [ws[0]] + [Fraction(0)] * (len(ws) - 1)
    assert max(_excess(ws, 9, a, c) for a in range(10) for c in range(a, 10)) >= 1


def test_growth_is_the_least_squares_slope_of_the_summary():
    rows = _summary()
    ms = np.array([m for m in sorted(rows) if m >= 9], dtype=float)
    with (FOLDER / "growth.csv").open(newline="") as f:
        growth = {row["bound"]: row for row in csv.DictReader(f)}
    for bound, column in (("lower", "lower_bound"), ("upper", "smallest_solving_rank")):
        y = np.log2([float(rows[int(m)][column]) for m in ms])
        x = ms - ms.mean()
        slope = (x * (y - y.mean())).sum() / (x * x).sum()
        assert int(growth[bound]["n_sizes"]) == len(ms)
        assert float(growth[bound]["slope"]) == pytest.approx(slope, abs=5e-5)
        assert float(growth[bound]["ci_low"]) < slope < float(growth[bound]["ci_high"])
