"""Tests of minip_learn.datasets.make_witness_suite.

The advertised certified ranks are checked against :func:`r5_rank_of_design`, the R4/R5
bound of the theory page recomputed here from the sequences alone (numpy and exact
fractions, no code of :mod:`minip_learn.theory`).
"""

import math
from fractions import Fraction

import numpy as np
import pytest

from minip_learn.constructions import exact_kernel_realization
from minip_learn.datasets import make_witness_suite, minip_targets
from minip_learn.theory import certify, verify_certificate


def r5_rank_of_design(X, queries):
    """The R5 rank bound of ``queries`` with keys ``~x``, from the R4 triples in ``X``.

    Every sequence is read as a multiset of tokens (heads are permutation-equivariant).
    For a query ``x`` the nodes are the tokens ``t`` with ``S1 = {x, t^(N-1)}`` in ``X``;
    an edge ``y -> z`` with overlap gap ``g = <x, z> - <x, y> >= 2`` exists when
    ``S3 = {x, y, z^(N-2)}`` is in ``X`` too (``S2`` is ``z``'s node), and bounds
    ``alpha(x, z) / alpha(x, y) < 1 / ((N-2)(g-1))``; bounds multiply along chains. With
    ``eps_ij`` the best chain bound from ``~x_i`` to ``~x_j`` in ``x_i``'s graph, every
    nonnegative kernel head solving ``X`` has ``r > n^2 / (n + sum_{i != j} eps_ij^2)``,
    and ``r >= n`` when every row (or every column) of ``eps`` sums to at most 1.

    Returns
    -------
    rank : int or None
        The smallest integer rank allowed, None when a pair is unconstrained.
    """
    n_seq, N, m = X.shape
    tokens, ids = np.unique(X.reshape(-1, m), axis=0, return_inverse=True)
    family = {tuple(sorted(row)) for row in ids.reshape(n_seq, N).tolist()}
    overlap = (tokens.astype(np.int64) @ tokens.T.astype(np.int64)).tolist()
    index = {t.tobytes(): i for i, t in enumerate(tokens)}
    queries = np.asarray(queries, dtype=np.uint8)
    q = [index[x.tobytes()] for x in queries]
    k = [index[(1 - x).tobytes()] for x in queries]

    def holds(*multiset):
        return tuple(sorted(multiset)) in family

    n = len(q)
    eps = [[Fraction(1)] * n for _ in range(n)]
    for a, x in enumerate(q):
        ov = overlap[x]
        nodes = sorted((t for t in range(len(tokens)) if holds(x, *[t] * (N - 1))),
                       key=lambda t: ov[t])
        best = {k[a]: 1}    # the largest product of denominators from ~x_a to a node
        for z in nodes:     # overlap increases along every edge: a topological order
            for y in nodes:
                g = ov[z] - ov[y]
                if g >= 2 and y in best and holds(x, y, *[z] * (N - 2)):
                    best[z] = max(best.get(z, 0), best[y] * (N - 2) * (g - 1))
        for b in range(n):
            if b != a:
                if k[b] not in best:
                    return None
                eps[a][b] = Fraction(1, best[k[b]])
    off = [(a, b) for a in range(n) for b in range(n) if a != b]
    rank = math.floor(Fraction(n * n) / (n + sum(eps[a][b] ** 2 for a, b in off))) + 1
    rows = all(sum(eps[a][b] for b in range(n) if b != a) <= 1 for a in range(n))
    cols = all(sum(eps[a][b] for a in range(n) if a != b) <= 1 for b in range(n))
    return max(rank, n) if rows or cols else rank


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
    # R6: 46 words, eps = 1/5, 46/(1 + 45/25) = 16.43; 46 * (1 + 2*45) = 4,186 sequences
    assert r6.certified_min_rank == 17
    assert math.floor(Fraction(46) / (1 + Fraction(45) * Fraction(1, 5) ** 2)) + 1 == 17
    assert r5_rank_of_design(r6.X, r6.queries) == 17
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
def test_advertised_bound_is_the_r5_bound_of_the_sequences(kwargs):
    s = make_witness_suite(**kwargs)
    assert len(s.X) <= kwargs.get("max_sequences", 5000)
    # the design's queries constrain each other pairwise: their R5 bound, recomputed
    # from the sequences, is what certify finds
    assert s.certified_min_rank == r5_rank_of_design(s.X, s.queries)
    assert verify_certificate(s.certificate, s.X)
    # R3 with one feature per distinct token of X solves it: the bound cannot exceed
    # that, and the constructive rank is exactly that count (no token the family lacks)
    n_tokens = len(np.unique(s.X.reshape(-1, s.X.shape[2]), axis=0))
    assert s.certified_min_rank <= n_tokens == s.constructive_rank == len(s.tokens)
    assert s.design_bound <= s.certified_min_rank
    if "pad" in s.params["code"] or "/2" in s.params["code"] or s.construction == "greedy":
        assert s.design_bound == s.certified_min_rank   # exact designs
    np.testing.assert_array_equal(s.y, minip_targets(s.X))
    assert s.certified_min_rank > 1


def test_small_suite_is_near_the_paper_scale():
    s = make_witness_suite(24, 3, construction="small")
    # the fewest Hadamard-24 queries reaching 8: 10/(1 + 9/25) = 7.35, 9/(1 + 8/25) = 6.82
    assert s.certified_min_rank == 8
    assert 150 <= len(s.X) <= 1300
    assert s.params["n_queries"] == 10


def test_dropping_an_s3_sequence_lowers_the_claim():
    s = make_witness_suite(24, 3, construction="small")
    x0, k0 = s.queries[0], s.designated_keys[0]
    is_s3 = np.array([
        (q[0] == x0).all() and (q[1] == k0).all() and not (q[2] == k0).all() for q in s.X
    ])
    assert is_s3.sum() == 9                 # (x_0, k_0, k_j) for the 9 other keys
    X = np.delete(s.X, np.flatnonzero(is_s3)[0], axis=0)
    assert r5_rank_of_design(X, s.queries) is None     # one pair is left unconstrained
    assert certify(X) < s.certified_min_rank == 8


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
    assert a.certified_min_rank == r5_rank_of_design(a.X, a.queries) == 18


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
