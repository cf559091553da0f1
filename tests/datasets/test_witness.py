"""Tests of minip_learn.datasets.make_witness_suite."""

import numpy as np
import pytest

from minip_learn.constructions import exact_kernel_realization
from minip_learn.datasets import make_witness_suite, minip_targets
from minip_learn.theory import certify


@pytest.fixture(scope="module")
def r6():
    return make_witness_suite(24, 3)


def test_r6_suite_matches_theory(r6):
    assert r6.construction == "hadamard"
    assert r6.X.shape == (4186, 3, 24) and r6.X.dtype == np.uint8
    assert len(np.unique(r6.X, axis=0)) == 4186
    np.testing.assert_array_equal(r6.y, minip_targets(r6.X))
    assert r6.tokens.shape == (46, 24)
    assert set(r6.tokens.sum(1).tolist()) == {12}
    G = r6.tokens.astype(int) @ r6.tokens.T.astype(int)
    off = G[~np.eye(46, dtype=bool)]
    assert set(off.tolist()) == {0, 6}
    assert ((G == 0).sum(1) == 1).all()   # exactly one complement each
    assert r6.certified_min_rank >= 17 and r6.certified_min_rank == 17
    assert r6.constructive_rank == 46
    assert r6.certificate.certified_min_rank == r6.certified_min_rank
    assert r6.design_bound <= r6.certified_min_rank
    assert "4186 sequences" in r6.DESCR


def test_r6_sequences_are_the_theory_family(r6):
    keys = r6.designated_keys
    x0, k0 = r6.queries[0], keys[0]
    first = r6.X[: 2 * 46 - 1]
    assert (first[:, 0] == x0).all()
    np.testing.assert_array_equal(first[0], [x0, k0, k0])
    # the key equal to x_0 itself is among the keys: (x0, x0, x0) and (x0, k0, x0), as
    # multisets (a token in two roles is stored once, with its multiplicity)
    assert any((s == x0).all() for s in first)
    assert any(sorted(map(tuple, s.tolist())) == sorted(map(tuple, [x0, k0, x0]))
               for s in first)


def test_exact_kernel_realization_solves_suites_at_constructive_rank(r6):
    for suite in (r6, make_witness_suite(24, 3, construction="small"),
                  make_witness_suite(17, 4, construction="product", max_sequences=5000)):
        est = exact_kernel_realization(tokens=suite.tokens, seq_len=suite.X.shape[1])
        assert est.rank == suite.constructive_rank
        assert est.score(suite.X, suite.y) == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_bits=24, construction="small"),
        dict(n_bits=16, seq_len=4),
        dict(n_bits=17, seq_len=4, construction="product"),
        dict(n_bits=33, construction="hadamard-half"),
        dict(n_bits=20, construction="hadamard", ladder_gap=None, max_sequences=2000),
        dict(n_bits=12, construction="greedy"),
        dict(n_bits=32, seq_len=3, max_sequences=2500),
        dict(n_bits=24, seq_len=5, n_queries=12),
    ],
)
def test_certify_recomputes_advertised_bound(kwargs):
    s = make_witness_suite(**kwargs)
    assert len(s.X) <= kwargs.get("max_sequences", 5000)
    assert certify(s.X) == s.certified_min_rank
    assert s.design_bound <= s.certified_min_rank <= s.constructive_rank
    if "pad" in s.params["code"] or "/2" in s.params["code"] or s.construction == "greedy":
        assert s.design_bound == s.certified_min_rank   # exact designs
    np.testing.assert_array_equal(s.y, minip_targets(s.X))
    assert s.certified_min_rank > 1


def test_small_suite_is_near_the_paper_scale():
    s = make_witness_suite(24, 3, construction="small")
    assert s.certified_min_rank == 8
    assert 150 <= len(s.X) <= 1300
    assert s.params["n_queries"] == 10


def test_dropping_an_s3_sequence_lowers_the_claim():
    s = make_witness_suite(24, 3, construction="small")
    x0, k0 = s.queries[0], s.designated_keys[0]
    is_s3 = np.array([
        (q[0] == x0).all() and (q[1] == k0).all() and not (q[2] == k0).all() for q in s.X
    ])
    assert is_s3.sum() == 9
    X = np.delete(s.X, np.flatnonzero(is_s3)[0], axis=0)
    assert certify(X) < s.certified_min_rank


def test_chain_suite_uses_a_ladder():
    s = make_witness_suite(33, 3, construction="hadamard-half")
    assert s.params["ladder_gap"] is not None and s.params["ladder_steps"] >= 1
    cert = s.certificate
    assert max(len(c) for c in cert.chains.values()) >= 3
    single = make_witness_suite(33, 3, construction="hadamard-half", ladder_gap=None)
    assert s.certified_min_rank > single.certified_min_rank


def test_auto_respects_max_sequences_and_random_state():
    a = make_witness_suite(32, 3, max_sequences=1000, random_state=0)
    b = make_witness_suite(32, 3, max_sequences=1000, random_state=0)
    assert len(a.X) <= 1000
    np.testing.assert_array_equal(a.X, b.X)
    assert certify(a.X) == a.certified_min_rank


def test_length2_and_random_data_certify_to_one():
    s = make_witness_suite(24, 3, construction="small")
    assert certify(s.X[:, :2]) == 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(n_bits=4), "n_bits"),
        (dict(seq_len=2), "seq_len"),
        (dict(construction="nope"), "construction"),
        (dict(max_sequences=2), "max_sequences"),
        (dict(n_queries=1), "n_queries"),
        (dict(ladder_gap=1), "ladder_gap"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_witness_suite(**kwargs)
