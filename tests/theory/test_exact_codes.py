"""R9: complement-closed codes, the exact length and the exact-rank family, each checked
against a brute-force construction over all pairs."""

import itertools
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from minip_learn.compact import CompactFamily
from minip_learn.theory import (
    certify,
    complement_closed_code,
    exact_family,
    exact_family_size,
    exact_seq_len,
)

GREEDY = {8: (14, 15), 12: (68, 47), 16: (870, 352)}   # m: (|C|, N) of THEORY.md R9


def brute_greedy(m):
    """The lexicographic greedy by complement pairs, from its definition."""
    w, kept = m // 2, []
    for x in itertools.product([0, 1], repeat=m):     # lexicographic, 0 < 1
        if sum(x) != w:
            continue
        cx = tuple(1 - b for b in x)
        far = all(sum(a != b for a, b in zip(v, k)) >= 4 for v in (x, cx) for k in kept)
        if far:
            kept += [x, cx]
    return np.array(kept, dtype=np.uint8)


def brute_row_sums(W):
    W = W.astype(int)
    return [sum(Fraction(1, int(x @ (1 - y)) - 1) for j, y in enumerate(W) if j != i)
            for i, x in enumerate(W)]


def lex_words(m):
    """Every word of weight m/2, in lexicographic order of the bit tuple (0 < 1)."""
    return np.array([x for x in itertools.product([0, 1], repeat=m) if sum(x) == m // 2],
                    dtype=np.int64)


def pair_greedy(cands, start=()):
    """The words of ``start`` (each followed by its complement), then every candidate,
    in order, taken with its complement when both overlap every word taken so far in
    at most m/2 - 2 (Hamming distance >= 4). Numpy form of :func:`brute_greedy`."""
    m = cands.shape[1]
    kept = np.zeros((len(cands), m), dtype=np.int64)
    n = 0
    for x in list(start) + list(cands):
        ov = kept[:n] @ x                   # <k, ~x> = m/2 - <k, x> for every kept k
        if n and (ov.max() > m // 2 - 2 or ov.min() < 2):
            continue
        kept[n], kept[n + 1] = x, 1 - x
        n += 2
    return kept[:n]


def graham_sloane(m, q, extend):
    """The largest residue class of ``sum_i i x_i`` mod ``q`` that is closed under
    complement (the complement of residue a has residue m(m+1)/2 - a; ties: the
    smaller residue), extended by the pair greedy; None when no class is closed."""
    cands = lex_words(m)
    residue = cands @ np.arange(1, m + 1) % q
    closed = [a for a in range(q) if (2 * a - m * (m + 1) // 2) % q == 0]
    if not closed:
        return None
    a = max(closed, key=lambda c: ((residue == c).sum(), -c))
    cls = cands[residue == a]
    half = [x for x in cls if tuple(x) < tuple(1 - x)]             # x before ~x
    return pair_greedy(cands if extend else cands[:0], half)


def exact_length(W):
    """The smallest N >= 3 with sum_{y != x} 1/(D(x, y) - 1) <= N - 2 for every x,
    D(x, y) = <x, ~y> (R9), from the overlap histogram of each row."""
    W = W.astype(np.int64)
    D = W @ (1 - W).T
    sums = [sum(Fraction(int(c), d - 1) for d, c in enumerate(np.bincount(row)) if c and d)
            for row in D]
    return max(3, 2 + math.ceil(max(sums)))


def brute_family(W, N, unique=True):
    """Every R4 sequence of every ordered pair, as a list of token-id multisets."""
    n = len(W)
    key = {tuple(v): i for i, v in enumerate(W)}
    k = [key[tuple(1 - v)] for v in W]
    out = []
    for x in range(n):
        out.append(Counter({x: 1, k[x]: N - 1}))
        for y in range(n):
            if y != x:
                out.append(Counter({x: 1}) + Counter({k[y]: N - 1}))
        for y in range(n):
            if y != x:
                out.append(Counter({x: 1}) + Counter({k[x]: 1}) + Counter({k[y]: N - 2}))
    if unique:
        seen, kept = set(), []
        for c in out:
            f = frozenset(c.items())
            if f not in seen:
                seen.add(f)
                kept.append(c)
        out = kept
    return out


def as_multisets(ids, counts):
    return [Counter({int(i): int(c) for i, c in zip(r, q) if i >= 0})
            for r, q in zip(ids, counts)]


def check_code(W):
    n, m = W.shape
    w = m // 2
    assert W.dtype == np.uint8 and set(np.unique(W).tolist()) <= {0, 1}
    assert (W.sum(axis=1) == w).all()
    assert (W[1::2] == 1 - W[0::2]).all()                 # x, then ~x
    G = W.astype(int) @ W.T.astype(int)
    off = ~np.eye(n, dtype=bool)
    assert G[off].max() <= w - 2                           # distance >= 4, no repeats
    assert len({tuple(r) for r in W}) == n


@pytest.mark.parametrize("m", [8, 12])
def test_greedy_is_the_lexicographic_greedy(m):
    W = complement_closed_code(m, method="greedy")
    assert np.array_equal(W, brute_greedy(m))
    check_code(W)


@pytest.mark.parametrize("m", [8, 12])
@pytest.mark.parametrize("method,extend,extra", [("graham-sloane", True, 1),
                                                 ("graham-sloane", False, 1),
                                                 ("graham-sloane", False, 0),
                                                 ("graham-sloane", True, 5),
                                                 ("best", True, None)])
def test_every_code_is_complement_closed_with_distance_4(m, method, extend, extra):
    modulus = None if extra is None else m + extra
    check_code(complement_closed_code(m, method=method, extend=extend, modulus=modulus))


@pytest.mark.parametrize("m,q,a", [(8, 9, 0), (12, 13, 0), (8, 8, 2), (12, 12, 3)])
def test_graham_sloane_class_by_brute_force(m, q, a):
    W = complement_closed_code(m, method="graham-sloane", modulus=q, extend=False)
    pos = np.arange(1, m + 1)
    want = {x for x in itertools.product([0, 1], repeat=m)
            if sum(x) == m // 2 and int(pos @ np.array(x)) % q == a}
    assert {tuple(r.tolist()) for r in W} == want


@pytest.mark.parametrize("m", sorted(GREEDY))
def test_greedy_sizes_and_lengths_of_theory(m):
    W = complement_closed_code(m, method="greedy")
    assert (len(W), exact_seq_len(W)) == GREEDY[m]
    # the numbers of THEORY.md, recomputed by scanning every word of weight m/2
    B = pair_greedy(lex_words(m))
    assert (len(B), exact_length(B)) == GREEDY[m]


def test_sizes_of_every_method():
    got = {m: [len(complement_closed_code(m, method=me)) for me in ("greedy", "graham-sloane")]
           + [len(complement_closed_code(m, method="graham-sloane", modulus=m)),
              len(complement_closed_code(m))]
           for m in (4, 8, 12, 16)}
    # m = 4: two words of weight 2 at distance 4 are complements, so 2; m = 8: 14 is the
    # optimum A(8, 4, 4) (the weight-4 words of the extended Hamming [8, 4, 4] code, a
    # Steiner system S(3, 4, 8)), reached by every method; the others by the brute-force
    # scans below
    assert got == {4: [2, 2, 2, 2], 8: [14, 14, 14, 14], 12: [68, 72, 80, 80],
                   16: [870, 758, 822, 870]}
    for m, sizes in got.items():
        codes = [pair_greedy(lex_words(m)), graham_sloane(m, m + 1, True),
                 graham_sloane(m, m, True)]
        assert sizes == [len(c) for c in codes] + [max(len(c) for c in codes)]
    assert np.array_equal(complement_closed_code(16),
                          complement_closed_code(16, method="greedy"))   # ties: greedy


def test_even_prefix_stays_a_code():
    W = complement_closed_code(12)
    for p in (2, 10, 40):
        check_code(W[:p])
        assert exact_seq_len(W[:p]) >= 3


@pytest.mark.parametrize("m,method", [(8, "greedy"), (12, "greedy"), (12, "best")])
def test_exact_seq_len_against_brute_force(m, method):
    W = complement_closed_code(m, method=method)
    N, sums = exact_seq_len(W, return_row_sums=True)
    assert list(sums) == brute_row_sums(W)
    assert all(s <= N - 2 for s in sums)                   # the condition holds at N
    assert N == 3 or max(sums) > N - 3                     # and fails at N - 1
    perm = np.random.RandomState(0).permutation(len(W))
    assert exact_seq_len(W[perm]) == N                     # row order is irrelevant


def test_exact_seq_len_single_pair():
    W = np.array([[1, 1, 0, 0], [0, 0, 1, 1]])
    N, sums = exact_seq_len(W, return_row_sums=True)
    assert N == 3 and list(sums) == [Fraction(1), Fraction(1)]


@pytest.mark.parametrize("unique", [True, False])
@pytest.mark.parametrize("N", [3, 4, 15])
def test_exact_family_against_brute_force(unique, N):
    W = complement_closed_code(8, method="greedy")
    ids, counts = exact_family(W, N, unique=unique)
    n = len(W)
    assert ids.shape == counts.shape == (exact_family_size(n, unique=unique), 3)
    assert ids.dtype == counts.dtype == np.int8
    assert (counts.sum(axis=1) == N).all()
    assert ((ids < 0) == (counts == 0)).all()
    got, want = as_multisets(ids, counts), brute_family(W, N, unique=unique)
    assert Counter(frozenset(c.items()) for c in got) == \
        Counter(frozenset(c.items()) for c in want)
    if unique:
        assert len({frozenset(c.items()) for c in got}) == len(got) == n * (3 * n - 2) // 2
    assert (np.diff(ids[:, 0].astype(int)) >= 0).all()     # grouped by query
    lead = {1, N} if unique else {1, N, N - 1}             # {x^N}, and {x^(N-1), ~x}
    assert set(counts[:, 0].tolist()) <= lead


def test_exact_family_rows_of_one_query():
    W = complement_closed_code(8, method="greedy")
    n, N = len(W), 15
    ids, counts = exact_family(W, N)
    rows = ids[ids[:, 0] == 0], counts[ids[:, 0] == 0]
    # n pairs {0, k^(N-1)} and the n - 2 S3 {0, 1, k^(N-2)} shared with its complement 1,
    # listed under 0, which comes first
    assert len(rows[0]) == n + n - 2
    assert rows[0][0].tolist() == [0, 1, -1] and rows[1][0].tolist() == [1, N - 1, 0]
    assert rows[0][1].tolist() == [0, -1, -1] and rows[1][1].tolist() == [N, 0, 0]
    assert (rows[0][n:, :2] == [0, 1]).all() and (rows[1][n:] == [1, 1, N - 2]).all()
    assert len(ids[ids[:, 0] == 1]) == n                    # S1 and S2 only
    fam = CompactFamily(W, ids, counts)
    assert fam.shape == (len(ids), N, 8)


def test_certified_rank_is_the_code_size_at_the_exact_length():
    W = complement_closed_code(8, method="greedy")
    N = exact_seq_len(W)
    assert certify(CompactFamily(W, *exact_family(W, N))) == len(W)   # R9: exact


def test_exact_family_dtypes_grow():
    W = complement_closed_code(12, method="greedy")
    ids, counts = exact_family(W, 200)
    assert ids.dtype == np.int8 and counts.dtype == np.int16
    assert len(ids) == exact_family_size(68) == 68 * 202 // 2   # n(3n - 2)/2, n = 68


def test_exact_family_size_formula():
    # distinct multisets of n words: the n^2 pairs {x, k^(N-1)} (S1 and S2 of every
    # query), and per complement pair {x, ~x} the S3 {x, ~x, k^(N-2)}, shared by both
    # queries, for the n - 2 keys k other than x and ~x (k = x or ~x gives an S2):
    # n^2 + (n/2)(n - 2) = n(3n - 2)/2, and 6938 * 20812 / 2 = 72,196,828. Per query,
    # not shared: 1 + 2(n - 1) = 2n - 1 rows.
    assert exact_family_size(6938) == 72_196_828
    assert exact_family_size(6938) == 6938 * (3 * 6938 - 2) // 2
    assert exact_family_size(6938, unique=False) == 6938 * (2 * 6938 - 1)
    with pytest.raises(ValueError, match="n_words"):
        exact_family_size(1)


@pytest.mark.parametrize("kw,match", [
    (dict(n_bits=7), "n_bits must be even"),
    (dict(n_bits=2), "n_bits must be >= 4"),
    (dict(n_bits=8.0), "n_bits must be an integer"),
    (dict(n_bits=8, method="random"), "method must be one of"),
    (dict(n_bits=6, method="graham-sloane", modulus=6), "modulus=6 has no residue class"),
    (dict(n_bits=8, method="graham-sloane", modulus=7), "modulus must be >= 8"),
    (dict(n_bits=28), "max_candidates"),
])
def test_code_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        complement_closed_code(**kw)


def _bad_codes():
    W = complement_closed_code(8, method="greedy")
    near = W[:2].copy()
    near = np.vstack([near, near[0], 1 - near[0]])
    near[2, [3, 4]] = near[2, [4, 3]]                      # one swap: distance 2
    near[3] = 1 - near[2]
    uneven = W.copy()
    uneven[0, 0] = 1 - uneven[0, 0]
    return [
        (W[:-1], "complement of word 12 is not in words"),
        (near, "words 0 and 2 are at Hamming distance 2"),
        (uneven, "weight n_bits/2 = 4; word 0 has weight"),
        (np.vstack([W, W[:2]]), "words holds a word twice"),
        (W[:, :7], "even number >= 4 of bits"),
        (W * 2, "only 0/1"),
        (W[0], "2-D array"),
        (W.astype(str), "0/1 numbers"),
    ]


@pytest.mark.parametrize("words,match", _bad_codes())
def test_bad_words_name_the_problem(words, match):
    with pytest.raises(ValueError, match=match):
        exact_seq_len(words)
    with pytest.raises(ValueError, match=match):
        exact_family(words, 5)


def test_exact_family_bad_length():
    W = complement_closed_code(8)
    with pytest.raises(ValueError, match="seq_len must be >= 3"):
        exact_family(W, 2)
