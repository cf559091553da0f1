"""Witness suites in every order of their keys (orders="all"): the final-query family with
each sequence's keys listed in every distinct order, certified for position-dependent
maps; and a position-dependent head that exploits the fixed order."""

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from minip_learn.datasets import make_witness_suite, minip_targets
from minip_learn.theory import certify


def _suite_pair(**kw):
    return (make_witness_suite(**kw, query="last"),
            make_witness_suite(**kw, query="last", orders="all"))


@pytest.fixture(scope="module")
def small():
    return _suite_pair(n_bits=24, seq_len=3, construction="small")


@pytest.fixture(scope="module")
def exact8():
    return _suite_pair(n_bits=8, construction="exact")


@pytest.fixture(scope="module")
def r6():
    return _suite_pair(n_bits=24, seq_len=3)


def _rows(X):
    """Each sequence as a tuple of its tokens' bytes."""
    return [tuple(t.tobytes() for t in seq) for seq in X]


def _every_order_by_brute_force(X):
    """All sequences with the keys of a row of ``X`` in any order (itertools), the
    final token last: a list with one entry per (row, distinct order)."""
    out = []
    for row in _rows(X):
        out += [perm + (row[-1],) for perm in sorted(set(itertools.permutations(row[:-1])))]
    return out


def _n_orders(X):
    """Number of distinct orders of each row's keys (multinomial coefficients)."""
    N = X.shape[1]
    return [math.factorial(N - 1) // math.prod(math.factorial(c) for c in
                                               Counter(row[:-1]).values())
            for row in _rows(X)]


# --------------------------------------------------------------------------- the family
@pytest.mark.parametrize("which, n_fixed, n_all, rank", [("small", 190, 280, 8),
                                                         ("r6", 4186, 6256, 17),
                                                         ("exact8", 378, 2744, 14)])
def test_every_order_suite(small, r6, exact8, which, n_fixed, n_all, rank):
    fixed, every = {"small": small, "r6": r6, "exact8": exact8}[which]
    N, m = fixed.params["seq_len"], fixed.params["n_bits"]
    assert fixed.X.shape == (n_fixed, N, m)
    assert every.X.shape == (n_all, N, m) and every.X.dtype == np.uint8
    assert every.y.shape == (n_all,) and len(every.family) == n_all
    # targets of the final token
    np.testing.assert_array_equal(every.y, minip_targets(every.X, query="last"))
    # every row ends with a query of the design, and the rows are distinct
    queries = {q.tobytes() for q in every.queries}
    assert all(x.tobytes() in queries for x in every.X[:, -1])
    rows = _rows(every.X)
    assert len(set(rows)) == n_all
    # family row i is the multiset of X[i], with the same final token
    seqs = every.family.to_sequences()
    assert seqs.shape == every.X.shape
    assert all(Counter(a) == Counter(b) for a, b in zip(rows, _rows(seqs)))
    np.testing.assert_array_equal(seqs[:, -1], every.X[:, -1])
    # as many sequences as distinct orders of the fixed family's keys
    assert sum(_n_orders(fixed.X)) == n_all
    # the fixed-order rows are among them
    assert set(_rows(fixed.X)) <= set(rows)
    assert every.certified_min_rank == fixed.certified_min_rank == rank
    assert every.certificate.positional and not fixed.certificate.positional
    assert every.orders == "all" and fixed.orders == "fixed"
    assert every.params["orders"] == "all" and "orders" not in fixed.params


def test_exact_m8_counts_every_order_of_each_s3(exact8):
    fixed, every = exact8
    N = fixed.params["seq_len"]
    assert N == 15                          # R9 at m = 8: 14 words, N = 15 (THEORY.md)
    per_row = Counter(_n_orders(fixed.X))
    # the 14 S1 (k_x, ..., k_x, x), the 14 * 13 = 182 S2 (k_y, ..., k_y, x) and the 182 S3
    # S1 (t, ..., t, x): one order; S3 (a, b, ..., b, x): N - 1 = 14 orders
    assert per_row == {1: 14 + 182, 14: 182}
    assert len(every.X) == 14 + 182 + 182 * 14 == 2744


@pytest.mark.parametrize("kw", [dict(n_bits=24, seq_len=3, construction="small"),
                                dict(n_bits=24, seq_len=4, construction="small"),
                                dict(n_bits=8, seq_len=4, construction="exact")])
def test_every_order_is_the_brute_force_set(kw):
    fixed, every = _suite_pair(**kw)
    expected = _every_order_by_brute_force(fixed.X)
    assert len(expected) == len(set(expected)) == len(every.X)
    assert set(expected) == set(_rows(every.X))


def test_every_order_n4_sizes():
    fixed, every = _suite_pair(n_bits=24, seq_len=4, construction="small")
    # at N = 4, eps = 1/(2*5): a row of n queries sums to (n - 1)/10 < 1, so n queries
    # certify n and "small" takes 8; 8 * (1 + 2*7) = 120 sequences, of which the 8 * 7
    # S3 come in N - 1 = 3 orders: 64 + 56 * 3 = 232
    assert (len(fixed.X), len(every.X)) == (120, 232)
    assert every.certified_min_rank == 8
    fixed, every = _suite_pair(n_bits=8, seq_len=4, construction="exact")
    # 14 words, n(2n - 1) = 378 rows with the query last; the 182 S3 in 3 orders
    assert (len(fixed.X), len(every.X)) == (378, 14 + 182 + 182 * 3)


# --------------------------------------------------------------------------- rebuild
@pytest.mark.parametrize("kw", [dict(n_bits=24, seq_len=3, construction="small"),
                                dict(n_bits=8, construction="exact")])
def test_random_state_rebuilds_the_family(kw):
    suite = make_witness_suite(**kw, query="last", orders="all", random_state=3)
    assert suite.orders == "all" and suite.params["orders"] == "all"
    assert suite.params["query"] == "last" and suite.params["random_state"] == 3
    params = {k: v for k, v in suite.params.items() if k not in ("code", "ladder_steps")}
    again = make_witness_suite(**params)
    np.testing.assert_array_equal(again.X, suite.X)
    np.testing.assert_array_equal(again.y, suite.y)
    assert again.certified_min_rank == suite.certified_min_rank
    assert again.certificate.positional
    np.testing.assert_array_equal(suite.y, minip_targets(suite.X, query="last"))
    # the same number of sequences as the canonical family, shuffled
    canonical = make_witness_suite(**kw, query="last", orders="all")
    assert len(suite.X) == len(canonical.X)
    assert suite.certified_min_rank == canonical.certified_min_rank


def test_descr_mentions_every_order(small):
    fixed, every = small
    assert "Every order" in every.DESCR and "Every order" not in fixed.DESCR
    assert "Final-query form" in every.DESCR
    assert "280 sequences" in every.DESCR


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("query", ["all", None])
def test_every_order_needs_query_last(query):
    kw = {} if query is None else dict(query=query)
    with pytest.raises(ValueError, match='orders="all" needs query="last"'):
        make_witness_suite(24, 3, construction="small", orders="all", **kw)


@pytest.mark.parametrize("bad", ["some", "", None, 1])
def test_bad_orders(bad):
    with pytest.raises(ValueError, match="orders must be one of"):
        make_witness_suite(24, 3, construction="small", query="last", orders=bad)


# --------------------------------------------------------------------------- a positional head
def _positional_head(X, key_weights):
    """A normalised nonnegative kernel head read at the final token, rank 1
    (``phi_Q = phi_K = 1``) with position-dependent weights: attention ``w_j`` on
    position ``j`` (the query's own position included), value ``v(t) = t``, readout
    ``<x, u>`` with ``x`` the final token."""
    X = X.astype(np.float64)
    w = np.asarray(key_weights, dtype=np.float64)
    u = np.einsum("j,njm->nm", w, X) / w.sum()
    return np.einsum("nm,nm->n", X[:, -1], u)


def test_position_dependent_head_exploits_the_fixed_order(exact8):
    fixed, every = exact8
    N = fixed.params["seq_len"]
    w = np.ones(N)
    w[0] = 1e6                      # dominant weight on the first key position
    # rank 1 solves the fixed-order family: its smaller key always comes first
    err = np.abs(_positional_head(fixed.X, w) - fixed.y)
    assert err.max() < 1e-3 < 0.5
    # ... which the positionless certificate forbids for positionless heads (14 > 1),
    # while the positional certificate of the fixed order allows it
    assert certify(fixed.X, query="last") == 14
    assert certify(fixed.X, query="last", positional=True) == 1
    # the same head with uniform weights (positionless) fails on the fixed order
    assert np.abs(_positional_head(fixed.X, np.ones(N)) - fixed.y).max() >= 0.5
    # every order: the larger key is first in some sequence, and the head fails there,
    # as the positional certificate (14 > 1) says it must
    err = np.abs(_positional_head(every.X, w) - every.y)
    assert err.max() >= 0.5
    assert certify(every.X, query="last", positional=True) == 14
    # it fails exactly on the S3 orders with the larger key first: 182 * 13 sequences,
    # each off by the gap (>= 2)
    assert int((err >= 0.5).sum()) == 182 * 13
    assert err.max() > 1.9
