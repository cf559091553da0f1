"""Final-query Min-IP in the data layer: targets of the last token only, random
sequences, witness suites with every query moved last, the metrics on (n,) targets and
the solving predicate they share."""

import math
from fractions import Fraction

import numpy as np
import pytest

import minip_learn.compact
from minip_learn.compact import MATERIALIZE_MAX_BYTES, CompactFamily
from minip_learn.datasets import make_minip, make_witness_suite, minip_targets
from minip_learn.metrics import (
    get_scorers,
    max_abs_error,
    sequence_exact_match,
    solved,
    solves,
    token_accuracy,
    within_tolerance,
)
from minip_learn.theory import verify_certificate


def brute_force_last(X):
    X = np.asarray(X, dtype=np.int64)
    return np.array([min(int(s[-1] @ t) for t in s) for s in X])


@pytest.mark.parametrize("N, m", [(1, 5), (2, 3), (3, 8), (6, 4)])
def test_last_targets_match_brute_force(N, m):
    rng = np.random.RandomState(N * 10 + m)
    X = rng.randint(0, 2, size=(40, N, m))
    y = minip_targets(X, query="last")
    assert y.shape == (40,) and y.dtype == np.int64
    np.testing.assert_array_equal(y, brute_force_last(X))
    np.testing.assert_array_equal(y, minip_targets(X)[:, -1])


def test_last_targets_of_a_compact_family_are_those_of_its_final_token():
    rng = np.random.RandomState(0)
    X = rng.randint(0, 2, size=(30, 5, 4))
    fam = CompactFamily.from_sequences(X)
    # from_sequences orders slots by first occurrence: the final token may sit in an
    # earlier slot, so compare with the materialised order of the family
    np.testing.assert_array_equal(minip_targets(fam, query="last"),
                                  brute_force_last(fam.to_sequences()))


def test_make_minip_last():
    X, y = make_minip(50, seq_len=4, n_bits=8, query="last", random_state=0)
    assert X.shape == (50, 4, 8) and y.shape == (50,)
    np.testing.assert_array_equal(y, brute_force_last(X))
    # same draws as the full form: the final column of its targets
    X_all, y_all = make_minip(50, seq_len=4, n_bits=8, random_state=0)
    np.testing.assert_array_equal(X, X_all)
    np.testing.assert_array_equal(y, y_all[:, -1])
    data = make_minip(20, seq_len=4, n_bits=8, min_gap=2, query="last", random_state=1,
                      return_X_y=False)
    assert data.query == "last" and data.params["query"] == "last"
    assert data.y.shape == data.gaps.shape == (20,)
    assert (data.gaps >= 2).all()
    assert make_minip(5, n_bits=6, random_state=0, return_X_y=False).params["query"] == "all"


def _suite_pair(**kw):
    return make_witness_suite(**kw), make_witness_suite(**kw, query="last")


@pytest.mark.parametrize("kw, rank", [
    (dict(), 17),                                               # R6: 4,186 sequences
    (dict(construction="small", random_state=0), 8),
    (dict(n_bits=8, construction="exact"), 14),                 # R9: |C| = 14
])
def test_witness_suite_query_last(kw, rank):
    full, last = _suite_pair(**kw)
    assert last.query == "last" and full.query == "all"
    assert last.params["query"] == "last" and "query" not in full.params
    n = len(last.family)
    assert last.X.shape == (n, last.params["seq_len"], last.params["n_bits"])
    assert last.X.dtype == np.uint8 and last.y.shape == (n,)
    np.testing.assert_array_equal(last.y, minip_targets(last.X, query="last"))
    np.testing.assert_array_equal(last.family.to_sequences(), last.X)
    # every sequence ends with a query of the design
    queries = {q.tobytes() for q in last.queries}
    assert all(x.tobytes() in queries for x in last.X[:, -1])
    assert last.certified_min_rank == full.certified_min_rank == rank
    assert last.certificate.query == "last" and full.certificate.query == "all"
    assert "Final-query form" in last.DESCR and "Final-query" not in full.DESCR


def test_witness_suite_moves_the_designs_query_last():
    # R6: the same sequences as the full form, query (slot 0, first there) now last
    full, last = _suite_pair()
    np.testing.assert_array_equal(last.X[:, -1], full.X[:, 0])
    np.testing.assert_array_equal(np.sort(last.X, axis=1), np.sort(full.X, axis=1))
    # (x, k, x): the multiset form merges the query's two copies into slot 0, so the
    # full form reads (x, x, k); the final-query form is (k, x, x), not slot order
    twice = (full.X[:, 0] == full.X[:, 1]).all(axis=1) & \
        (full.X[:, 1] != full.X[:, 2]).any(axis=1)
    assert twice.sum() == 46                # one (x_i, k_i, x_i) for each of the 46 queries
    np.testing.assert_array_equal(last.X[twice], full.X[twice][:, [2, 0, 1]])


def test_exact_suite_query_last_lists_every_querys_sequences():
    full, last = _suite_pair(n_bits=8, construction="exact")
    n = last.params["n_queries"]
    assert n == full.params["n_queries"] == 14          # the m = 8 code (R9)
    assert len(last.X) == n * (2 * n - 1) > len(full.family)
    assert last.certified_min_rank == last.exact_min_rank == 14
    # m = 12 at N = 53: 80 words, certified 80 in both forms; n(2n - 1) = 80 * 159 rows
    big = make_witness_suite(12, 53, construction="exact", max_sequences=13000, query="last")
    assert big.X.shape == (80 * 159, 53, 12) and big.certified_min_rank == 80


def test_exact_suite_query_last_fits_max_sequences():
    last = make_witness_suite(8, construction="exact", max_sequences=300, query="last")
    n = last.params["n_queries"]
    # whole complement pairs: 12 * 23 = 276 <= 300 < 14 * 27 = 378
    assert len(last.X) == n * (2 * n - 1) <= 300 and n == 12
    with pytest.raises(ValueError, match="10 words need 190"):
        make_witness_suite(8, construction="exact", n_queries=10, max_sequences=100,
                           query="last")


def test_query_last_keeps_a_family_too_large_to_materialise_in_multiset_form(monkeypatch):
    small = make_witness_suite(8, construction="exact", query="last")
    monkeypatch.setattr(minip_learn.compact, "MATERIALIZE_MAX_BYTES", small.X.nbytes - 1)
    compact = make_witness_suite(8, construction="exact", query="last")
    assert compact.X is None and compact.query == "last"
    # the same sequences, targets and certificate, the family kept as multisets
    np.testing.assert_array_equal(compact.family.to_sequences(), small.X)
    np.testing.assert_array_equal(compact.y, small.y)
    np.testing.assert_array_equal(minip_targets(compact.family, query="last"), small.y)
    assert compact.certified_min_rank == compact.exact_min_rank == 14
    assert compact.certificate.query == "last"
    assert verify_certificate(compact.certificate, compact.family)
    assert verify_certificate(compact.certificate, small.X)


def test_exact_final_query_family_at_m16_is_certified_in_multiset_form():
    # the m = 16 code of R9: 870 words, N = 352 (THEORY.md); n(2n - 1) = 870 * 1739 =
    # 1,512,930 sequences of length 352 (8.5 GB as an array): exact rank 870
    last = make_witness_suite(16, construction="exact", max_sequences=2_000_000,
                              query="last")
    assert last.X is None
    assert (len(last.family), last.family.seq_len) == (870 * 1739, 352)
    assert last.family.materialized_nbytes > MATERIALIZE_MAX_BYTES
    assert last.y.shape == (870 * 1739,)
    assert last.certified_min_rank == last.exact_min_rank == last.constructive_rank == 870
    assert verify_certificate(last.certificate, last.family)
    rows = np.random.RandomState(0).choice(len(last.family), 200, replace=False)
    np.testing.assert_array_equal(last.y[rows], brute_force_last(last.family.to_sequences(rows)))


def test_every_order_refuses_a_family_too_large_to_materialise():
    nbytes = 4186 * 3000 * 24
    assert nbytes > MATERIALIZE_MAX_BYTES
    with pytest.raises(ValueError, match=f'orders="all" families .* would take {nbytes} bytes'):
        make_witness_suite(24, 3000, construction="hadamard", query="last", orders="all")
    with pytest.raises(ValueError, match="MATERIALIZE_MAX_BYTES"):
        make_witness_suite(16, construction="exact", max_sequences=10**7, query="last",
                           orders="all")


@pytest.mark.parametrize("call", [
    lambda q: minip_targets(np.ones((2, 3, 4)), query=q),
    lambda q: make_minip(5, n_bits=4, query=q),
    lambda q: make_witness_suite(construction="small", query=q),
])
@pytest.mark.parametrize("bad", ["first", None, "LAST", 1])
def test_bad_query(call, bad):
    with pytest.raises(ValueError, match="query"):
        call(bad)


def test_metrics_on_one_target_per_sequence():
    y = np.array([2, 0, 1, 3])
    p = np.array([2.4, 0.6, 1.0, np.nan])
    assert token_accuracy(y, p) == sequence_exact_match(y, p) == 0.5
    assert max_abs_error(y, p) == np.inf and solved(y, p) == 0.0
    q = np.array([2.49, -0.2, 1.0, 2.6])
    assert sequence_exact_match(y, q) == 1.0 and solved(y, q) == 1.0
    assert max_abs_error(y, q) == pytest.approx(0.49)
    # a (n,) target against per-position predictions is a shape error, not a broadcast
    with pytest.raises(ValueError, match="different shapes"):
        sequence_exact_match(y, np.zeros((4, 3)))
    assert set(get_scorers()) >= {"exact_match", "solved"}


#: errors around the threshold, signed zeros, extremes and the non-finite values
EDGE_ERRORS = [
    0.5, 0.4999999, 0.5000001, math.nextafter(0.5, 0.0), math.nextafter(0.5, 1.0),
    0.0, -0.0, -0.4999999, -0.5, -1.0, 1.0, 5e-324, 1e-300, 1e308, -1e308,
    float(np.float32(0.5)), float(np.nextafter(np.float32(0.5), np.float32(0))),
    math.nan, -math.nan, math.inf, -math.inf,
]


def solves_reference(error):
    """An error solves when it is a real number below one half (exact rationals)."""
    try:
        return Fraction(error) < Fraction(1, 2)
    except (ValueError, OverflowError):  # nan, inf and -inf have no rational value
        return False


@pytest.mark.parametrize("error", EDGE_ERRORS, ids=repr)
def test_solves_matches_the_reference(error):
    got = solves(error)
    assert type(got) is bool
    assert got == solves_reference(error)
    # numpy scalars and a 0-d array decide the same
    assert solves(np.float64(error)) == solves(np.asarray(error)) == got


def test_solves_on_the_threshold_and_the_non_finite():
    assert solves(0.4999999) and solves(-0.0) and solves(0) and solves(np.float32(0.25))
    assert not any(solves(e) for e in (0.5, 1, math.nan, math.inf, -math.inf))


def test_within_tolerance_is_solves_elementwise():
    errors = np.array(EDGE_ERRORS).reshape(3, 7)
    got = within_tolerance(errors)
    assert got.dtype == bool and got.shape == (3, 7)
    assert got.tolist() == [[solves_reference(e) for e in row] for row in errors.tolist()]
    assert within_tolerance([]).shape == (0,)


def test_metrics_decide_correct_positions_by_the_predicate():
    y = np.zeros((2, 3))
    p = np.array([[0.5, math.nextafter(0.5, 0.0), -0.4999999],
                  [math.nan, math.inf, 0.0]])
    assert token_accuracy(y, p) == 3 / 6
    assert sequence_exact_match(y, p) == 0.0
    assert solved(y[:1], p[:1]) == 0.0 and solved(y[:1, 1:], p[:1, 1:]) == 1.0
