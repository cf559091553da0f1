"""Positional certificates: a final-query triple counts only when its S3 occurs in the
family in every order of its keys, so the bound also holds for position-dependent maps
(found by certify(..., positional=True), checked by verify_certificate)."""

import json

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from strategies import nested_families, pool_families, row_subsets

from minip_learn.datasets import make_witness_suite
from minip_learn.theory import (
    Certificate,
    _constraints,
    certify,
    family_constraints,
    verify_certificate,
)
from minip_learn.theory.certify import _certify

SETTINGS = dict(deadline=None, derandomize=True)


@pytest.fixture(scope="module")
def small_all():
    return make_witness_suite(24, 3, construction="small", query="last", orders="all")


@pytest.fixture(scope="module")
def small_fixed():
    return make_witness_suite(24, 3, construction="small", query="last")


@pytest.fixture(scope="module")
def exact8_all():
    return make_witness_suite(8, construction="exact", query="last", orders="all")


@pytest.fixture(scope="module")
def exact8_fixed():
    return make_witness_suite(8, construction="exact", query="last")


@pytest.fixture(scope="module")
def r6_all():
    return make_witness_suite(24, 3, query="last", orders="all")


# --------------------------------------------------------------------------- families
def _tokens(rng, T, m):
    """``T`` distinct random tokens of ``m`` bits."""
    codes = rng.choice(2 ** m, size=T, replace=False)
    return ((codes[:, None] >> np.arange(m)[None, :]) & 1).astype(np.uint8)


def _arrangement(y, z, p, N, x):
    """S3 of query ``x`` with ``y`` at key position ``p`` (token indices)."""
    return (z,) * p + (y,) + (z,) * (N - 2 - p) + (x,)


def _random_final_query_family(seed, T, m, N, n_triples=6):
    """A final-query family over ``T`` random tokens: for some triples ``(x; y, z)``
    (gap >= 2 preferred) each S1 and each S3 arrangement is present or not at random
    (some triples complete in every order, some in a few, some without an S1), plus a
    few random sequences. Returns the sequences as an (n, N, m) uint8 array."""
    rng = np.random.RandomState(seed)
    tok = _tokens(rng, T, m)
    ov = tok.astype(np.int64) @ tok.T
    far = [(x, y, z) for x in range(T) for y in range(T) for z in range(T)
           if y != z and ov[x, z] - ov[x, y] >= 2]
    cands = far or [(x, y, z) for x in range(T) for y in range(T) for z in range(T) if y != z]
    rows = set()
    for t in rng.randint(len(cands), size=n_triples):
        x, y, z = cands[t]
        for key in (y, z):
            if rng.random_sample() < 0.85:
                rows.add((key,) * (N - 1) + (x,))
        full = rng.random_sample() < 0.5
        for p in range(N - 1):
            if full or rng.random_sample() < 0.6:
                rows.add(_arrangement(y, z, p, N, x))
    for _ in range(rng.randint(0, 4)):
        rows.add(tuple(rng.randint(T, size=N).tolist()))
    rows = sorted(rows)
    return tok[np.array(rows, dtype=np.int64)]


def _assert_same_constraints(X):
    fast = _constraints.constraints(X, "last", True)
    ref = _constraints.constraints_reference(X, "last", True)
    for k in "xyzK":
        np.testing.assert_array_equal(getattr(fast, k), getattr(ref, k))
    np.testing.assert_array_equal(fast.tokens, ref.tokens)
    return len(fast)


# --------------------------------------------------------------------------- fast == reference
def test_fast_and_reference_agree_on_the_suites(small_all, small_fixed, exact8_all, exact8_fixed):
    sizes = {}
    for name, s in [("small_all", small_all), ("small_fixed", small_fixed),
                    ("exact_all", exact8_all), ("exact_fixed", exact8_fixed)]:
        sizes[name] = _assert_same_constraints(s.X)
    # every order: the positional triples are all the final-query ones; fixed: none.
    # They are the designed (x_i, k_i, k_j), j != i: 10 * 9 = 90 for the 10 queries of
    # "small", 14 * 13 = 182 for the 14 words of the m = 8 exact code (its S3 {y, x^(N-1)}
    # is listed with y last, as the S2 of query y, so (x, y, x) is no triple here)
    assert sizes["small_all"] == len(_constraints.constraints(small_all.X, "last")) == 90
    assert sizes["exact_all"] == len(_constraints.constraints(exact8_all.X, "last")) == 182
    assert sizes["small_fixed"] == sizes["exact_fixed"] == 0
    assert (_certify(small_all.X, query="last", positional=True).to_json()
            == _certify(small_all.X, query="last", positional=True, reference=True).to_json())


@settings(max_examples=40, **SETTINGS)
@given(X=pool_families(query="last"))
def test_fast_and_reference_agree_on_random_families(X):
    # final-query triples over 3 to 6 tokens of 4 to 6 bits, N = 3 to 5, their S3 in
    # every order of the keys or in some
    n_positional = _assert_same_constraints(X)
    n_last = len(_constraints.constraints(X, "last"))
    event("some triples complete in every order, some not" if 0 < n_positional < n_last
          else f"{n_positional} of {n_last} triples complete in every order")


def test_random_families_hold_complete_and_incomplete_triples():
    # the generator above exercises both outcomes: triples in every order and not
    n_pos = n_last = 0
    for seed in range(30):
        X = _random_final_query_family(seed, 3 + seed % 4, 4 + seed % 3, 3 + seed % 3)
        n_pos += _assert_same_constraints(X)
        n_last += len(_constraints.constraints(X, "last"))
    assert 0 < n_pos < n_last


# --------------------------------------------------------------------------- brute force
def _brute_force_edges(X, positional):
    """``{x: sorted [(y, z, K)]}`` by plain loops over every candidate triple and every
    arrangement of its S3 (token indices in np.unique order)."""
    n, N, m = X.shape
    tokens = np.unique(X.reshape(-1, m), axis=0)
    index = {t.tobytes(): i for i, t in enumerate(tokens)}
    rows = {tuple(index[t.tobytes()] for t in seq) for seq in X}
    T = len(tokens)
    ov = tokens.astype(np.int64) @ tokens.T.astype(np.int64)
    edges = {}
    for x in range(T):
        for y in range(T):
            for z in range(T):
                if y == z:
                    continue
                g = int(ov[x, z] - ov[x, y])
                if g < 2:
                    continue
                s1 = (y,) * (N - 1) + (x,)
                s2 = (z,) * (N - 1) + (x,)
                if s1 not in rows or s2 not in rows:
                    continue
                arrangements = [_arrangement(y, z, p, N, x) for p in range(N - 1)]
                present = [a in rows for a in arrangements]
                if all(present) if positional else any(present):
                    edges.setdefault(x, []).append((y, z, (N - 2) * (g - 1)))
    return {x: sorted(e) for x, e in edges.items()}


def _edges(X, positional):
    _, edges, _ = family_constraints(X, query="last", positional=positional)
    return {x: sorted(e) for x, e in edges.items()}


def test_family_constraints_by_hand():
    # x = 1111 0000, y = 0000 1111 (<x,y> = 0), z = 1100 1100 (<x,z> = 2), w = 1110 0000
    x = [1, 1, 1, 1, 0, 0, 0, 0]
    y = [0, 0, 0, 0, 1, 1, 1, 1]
    z = [1, 1, 0, 0, 1, 1, 0, 0]
    w = [1, 1, 1, 0, 0, 0, 0, 0]
    seqs = [[y, y, y, x], [z, z, z, x], [w, w, w, x],
            # (x; y, z): every order of {y, z, z}
            [y, z, z, x], [z, y, z, x], [z, z, y, x],
            # (x; y, w): two of three orders
            [y, w, w, x], [w, w, y, x]]
    X = np.array(seqs, dtype=np.uint8)
    assert X.shape == (8, 4, 8)          # N = 4: K = (N-2)(g-1) = 2 (g = 2), 4 (g = 3)
    tokens = np.unique(X.reshape(-1, 8), axis=0)
    iy, iz, iw, ix = (int(np.flatnonzero((tokens == t).all(axis=1))[0]) for t in (y, z, w, x))
    assert _edges(X, True) == _brute_force_edges(X, True) == {ix: [(iy, iz, 2)]}
    expected = sorted([(iy, iz, 2), (iy, iw, 4)])
    assert _edges(X, False) == _brute_force_edges(X, False) == {ix: expected}
    # the missing order completes (x; y, w)
    X2 = np.concatenate([X, np.array([[w, y, w, x]], dtype=np.uint8)])
    assert _edges(X2, True) == {ix: expected}
    # the query not last: nothing for x
    assert _edges(X[:, ::-1], True) == {}


@pytest.mark.parametrize("seed, T, m, N", [(0, 4, 5, 3), (1, 5, 5, 4), (2, 4, 4, 3),
                                           (3, 5, 6, 4), (4, 4, 5, 5)])
def test_family_constraints_brute_force_on_pool_families(seed, T, m, N):
    """Random parts of every sequence over a few tokens (with their query last)."""
    rng = np.random.RandomState(seed)
    tok = _tokens(rng, T, m)
    # all S1 present, S3 arrangements kept at random: some triples complete, some not
    rows = [(a,) * (N - 1) + (x,) for x in range(T) for a in range(T)]
    rows += [_arrangement(a, b, p, N, x) for x in range(T) for a in range(T)
             for b in range(T) if a != b for p in range(N - 1) if rng.random_sample() < 0.7]
    X = tok[np.array(rows)]
    pos, last = _brute_force_edges(X, True), _brute_force_edges(X, False)
    assert _edges(X, True) == pos
    assert _edges(X, False) == last
    n_pos, n_last = (sum(len(e) for e in d.values()) for d in (pos, last))
    assert n_pos <= n_last and n_last > 0


def test_pool_families_hit_both_outcomes():
    counts = []
    for seed, T, m, N in [(0, 4, 5, 3), (1, 5, 5, 4), (3, 5, 6, 4)]:
        rng = np.random.RandomState(seed)
        tok = _tokens(rng, T, m)
        rows = [(a,) * (N - 1) + (x,) for x in range(T) for a in range(T)]
        rows += [_arrangement(a, b, p, N, x) for x in range(T) for a in range(T)
                 for b in range(T) if a != b for p in range(N - 1) if rng.random_sample() < 0.7]
        X = tok[np.array(rows)]
        counts.append((sum(len(e) for e in _edges(X, True).values()),
                       sum(len(e) for e in _edges(X, False).values())))
    assert any(0 < a < b for a, b in counts)


# --------------------------------------------------------------------------- monotone
@settings(max_examples=25, **SETTINGS)
@given(families=nested_families([4, 5, 6], [3, 4, 5], query="last", max_tokens=6))
def test_superset_never_certifies_less(families):
    # the bigger family: more triples and sequences, and every row again with its keys
    # reordered (it may hold X's missing orders)
    X, bigger = families
    a = certify(X, query="last", positional=True)
    b = certify(bigger, query="last", positional=True)
    event(f"positional certified ranks {a} <= {b}")
    assert b >= a
    assert a <= certify(X, query="last") and b <= certify(bigger, query="last")


@settings(max_examples=12, **SETTINGS)
@given(which=st.sampled_from(["small", "exact8"]), data=st.data())
def test_nested_parts_of_every_order_suites_are_monotone(small_all, exact8_all, which, data):
    """Nested parts of an every-order suite (the rows of some queries, less some single
    rows: some orders missing): the bigger part certifies at least as much, and never
    more than the positionless bound."""
    suite = small_all if which == "small" else exact8_all
    full = suite.certified_min_rank
    _, query = np.unique(suite.X[:, -1], axis=0, return_inverse=True)
    groups = query.reshape(-1)
    n = len(suite.X)
    keep_big = data.draw(row_subsets(n, groups), label="big part")
    # the small part: the big one less a few rows, and often less whole queries too
    keep_small = keep_big.copy()
    keep_small[data.draw(st.lists(st.integers(0, n - 1), max_size=8), label="rows out")] = False
    if data.draw(st.booleans(), label="queries out too"):
        keep_small &= ~data.draw(row_subsets(n, groups), label="queries out")
    if not keep_small.any():
        event("the small part is empty")
        return
    small, big = suite.X[keep_small], suite.X[keep_big]
    r_small = certify(small, query="last", positional=True)
    r_big = certify(big, query="last", positional=True)
    event(f"positional certified ranks {r_small} <= {r_big} of {full}")
    assert 1 <= r_small <= r_big <= full
    assert r_small <= certify(small, query="last") and r_big <= certify(big, query="last")


# --------------------------------------------------------------------------- suites
@pytest.mark.parametrize("name, rank, n", [("exact8", 14, 2744), ("small", 8, 280),
                                           ("r6", 17, 6256)])
def test_every_order_suites_certify_as_positionless(exact8_all, small_all, r6_all, name, rank, n):
    suite = {"exact8": exact8_all, "small": small_all, "r6": r6_all}[name]
    assert len(suite.X) == n
    r_pos, cert = certify(suite.X, query="last", positional=True, return_certificate=True)
    assert r_pos == certify(suite.X, query="last") == rank == suite.certified_min_rank
    assert cert.positional and cert.query == "last"
    assert suite.certificate.positional
    assert verify_certificate(cert, suite.X)
    assert verify_certificate(suite.certificate, suite.X, query="last")


def test_fixed_order_suites_certify_nothing_positional(exact8_fixed, small_fixed):
    # R9 at m = 8: the 14 code words; "small": 10 Hadamard-24 queries, 10/(1 + 9/25) = 7.35
    for suite, rank in ((exact8_fixed, 14), (small_fixed, 8)):
        assert certify(suite.X, query="last") == rank
        r, cert = certify(suite.X, query="last", positional=True, return_certificate=True)
        assert r == 1 and cert.positional and cert.n_constraints == 0
        assert "every order" in cert.reason
        assert verify_certificate(cert, suite.X)
        # the positionless certificate is not positional
        assert not suite.certificate.positional


def test_positional_matches_every_order_even_in_random_order():
    suite = make_witness_suite(24, 3, construction="small", query="last", orders="all",
                               random_state=5)
    assert certify(suite.X, query="last", positional=True) == 8
    rng = np.random.RandomState(0)
    assert certify(suite.X[rng.permutation(len(suite.X))], query="last", positional=True) == 8


# --------------------------------------------------------------------------- verify
def _used_s3(cert):
    """``(x, a, b)`` token indices of a chain step the certificate uses."""
    for (i, _), path in sorted(cert.chains.items()):
        if len(path) >= 2:
            return int(cert.query_index[i]), int(path[0]), int(path[1])
    raise AssertionError("no chain step")


def _without(X, tokens, seq):
    """``X`` without the rows equal to the sequence of token indices ``seq``."""
    target = tokens[list(seq)]
    hit = (X == target[None]).all(axis=(1, 2))
    assert hit.sum() == 1
    return X[~hit]


@pytest.mark.parametrize("which", ["small", "exact8"])
def test_verify_rejects_a_missing_order(small_all, exact8_all, which):
    suite = small_all if which == "small" else exact8_all
    cert = suite.certificate
    N = cert.seq_len
    x, a, b = _used_s3(cert)
    for p in (0, N - 2):
        X = _without(suite.X, cert.tokens, _arrangement(a, b, p, N, x))
        with pytest.raises(ValueError, match="every order"):
            verify_certificate(cert, X)
        assert not verify_certificate(cert, X, raise_on_failure=False)
        # the multisets are all still there: a positionless certificate is fine
        rank, plain = certify(X, query="last", return_certificate=True)
        assert not plain.positional and verify_certificate(plain, X)
        # and positional certify no longer counts that triple
        assert len(_constraints.constraints(X, "last", True)) \
            == len(_constraints.constraints(suite.X, "last", True)) - 1


def test_verify_positional_needs_an_array_and_query_last(small_all):
    cert = small_all.certificate
    with pytest.raises(ValueError, match="positional certificate"):
        verify_certificate(cert, small_all.family)
    with pytest.raises(ValueError, match="certificate is for query='last'"):
        verify_certificate(cert, small_all.X, query="all")
    assert verify_certificate(cert, small_all.X, query="last")


def test_json_round_trip_keeps_positional(small_all, small_fixed):
    cert = small_all.certificate
    back = Certificate.from_json(cert.to_json())
    assert back.positional is True and back.query == "last"
    assert back.certified_min_rank == 8 and verify_certificate(back, small_all.X)
    assert verify_certificate(cert.to_json(), small_all.X)
    assert "positional=True" in repr(cert) and "positional" in repr(back)
    assert "position-dependent" in cert.summary()
    # a positional certificate read back still refuses a fixed-order family
    assert not verify_certificate(back, small_fixed.X, raise_on_failure=False)
    # without the field (certificates written before): positionless
    doc = json.loads(cert.to_json())
    del doc["positional"]
    old = Certificate.from_json(json.dumps(doc))
    assert old.positional is False and "positional" not in repr(old)
    assert "position-dependent" not in old.summary()
    assert "positional" not in repr(small_fixed.certificate)


# --------------------------------------------------------------------------- errors
def test_positional_needs_query_last(small_all):
    with pytest.raises(ValueError, match='query="last"'):
        certify(small_all.X, positional=True)
    with pytest.raises(ValueError, match='query="last"'):
        certify(small_all.X, query="all", positional=True)
    with pytest.raises(ValueError, match='query="last"'):
        family_constraints(small_all.X, positional=True)


def test_positional_needs_an_array(small_fixed):
    with pytest.raises(ValueError, match="CompactFamily"):
        certify(small_fixed.family, query="last", positional=True)
    with pytest.raises(ValueError, match="CompactFamily"):
        family_constraints(small_fixed.family, query="last", positional=True)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_positional_must_be_a_bool(small_fixed, bad):
    with pytest.raises(ValueError, match="positional must be True or False"):
        certify(small_fixed.X, query="last", positional=bad)
