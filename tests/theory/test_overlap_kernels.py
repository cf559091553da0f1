"""Overlap kernels (minip_learn.theory.overlap_kernels): a nonnegative kernel head of rank
``sum_(j <= D) C(m, j)`` that solves the full length-3 task.

Every reference here is written in the test and shares no code with the module: the
forward pass of a normalized kernel head from explicit features, the kernel
``F_w(k) = sum_j d_j(w) C(w - k, j)`` from the binomial formula, and an exact
:class:`~fractions.Fraction` check of the excess ``E(w, a, c) < 1``.
"""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minip_learn.theory import overlap_kernel, overlap_kernel_features, overlap_kernel_predict

#: d*(w) for w = 1..32, from an independent floating-point linear program
PROTOTYPE_DEGREES = [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5,
                     6, 6, 6, 6, 7, 7, 7, 7, 8, 8]


# --------------------------------------------------------------------------- references
def all_tokens(m):
    return np.array(list(itertools.product([0, 1], repeat=m)), dtype=np.int64)


def all_sequences(m):
    """Every ordered length-3 sequence of m-bit tokens, as token indices and tokens."""
    T = all_tokens(m)
    idx = np.array(list(itertools.product(range(len(T)), repeat=3)))
    return T, idx


def minip_targets_ref(X):
    G = np.einsum("sik,sjk->sij", X, X)
    return G.min(axis=2)


def head_outputs_ref(Q, K, T, idx, bias):
    """The normalized kernel head on the sequences ``T[idx]``: ``alpha = phi_Q phi_K^T``,
    ``u_i = sum_j alpha_ij v(x_j) / sum_j alpha_ij`` with ``v(t) = t``, and the readout
    ``p_i = <x_i, u_i> + bias``."""
    A = Q @ K.T
    alpha = A[idx[:, :, None], idx[:, None, :]]                    # (S, 3, 3)
    V = T[idx].astype(float)                                       # (S, 3, m)
    u = np.einsum("sij,sjk->sik", alpha, V) / alpha.sum(axis=2, keepdims=True)
    return np.einsum("sik,sik->si", V, u) + bias


def F_ref(d, w, k):
    """``F_w(k) = sum_j d_j C(w - k, j)`` (exact when ``d`` holds Fractions)."""
    return sum(dj * math.comb(w - k, j) for j, dj in enumerate(d))


def exact_excess_ref(d, w, F=F_ref):
    """``max E(w, a, c)`` over ``a <= c <= w`` in Fractions, straight from the definition:
    the weighted mean of the overlaps ``{w, a, c}`` minus the target ``min = a``."""
    worst = Fraction(0)
    for a in range(w + 1):
        for c in range(a, w + 1):
            ov = (w, a, c)
            wts = [F(d, w, k) for k in ov]
            mean = sum(f * k for f, k in zip(wts, ov)) / sum(wts)
            worst = max(worst, mean - min(ov))
    return worst


def check_exact_ref(weights, m, F=F_ref):
    """The proof for n_bits ``m``: weights nonnegative, ``d_0 > 0``, and the largest
    excess over every ``w <= m`` is below 1. Returns that largest excess."""
    worst = Fraction(0)
    for w in range(m + 1):
        d = [Fraction(v) for v in weights[w]]
        assert all(v >= 0 for v in d) and d[0] > 0
        worst = max(worst, exact_excess_ref(d, w, F))
    assert worst < 1, f"E_max = {worst} >= 1"
    return worst


def features_ref(kernel, T):
    """phi_Q and phi_K built one subset at a time (by size, then lexicographic)."""
    m, D = kernel.n_bits, kernel.degree
    subsets = [S for j in range(D + 1) for S in itertools.combinations(range(m), j)]
    Q = np.zeros((len(T), len(subsets)))
    K = np.zeros((len(T), len(subsets)))
    for r, x in enumerate(T):
        ones = {i for i in range(m) if x[i]}
        for s, S in enumerate(subsets):
            if set(S) <= ones:
                Q[r, s] = float(kernel.weights[len(ones)][len(S)])
            if not set(S) & ones:
                K[r, s] = 1.0
    return Q, K


@pytest.fixture(scope="module")
def head32():
    return overlap_kernel(32)


# --------------------------------------------------------------------------- (a)
@pytest.mark.parametrize("m", [2, 3, 4, 5])
def test_the_head_from_its_features_solves_every_ordered_sequence(m):
    head = overlap_kernel(m)
    T, idx = all_sequences(m)
    Q, K = overlap_kernel_features(head, T)
    p = head_outputs_ref(Q, K, T, idx, float(head.bias))
    t = minip_targets_ref(T[idx])
    err = np.abs(p - t).max()
    assert err < 0.5
    assert err == pytest.approx(head.max_error, abs=1e-12)
    assert np.allclose(overlap_kernel_predict(head, T[idx]), p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("m", [2, 3, 4])
def test_every_ordered_sequence_solved_in_exact_arithmetic(m):
    """The lemma itself: from the tokens (not the reduction to (w, a, c)), exactly."""
    head = overlap_kernel(m)
    T, idx = all_sequences(m)
    G = (T @ T.T).tolist()
    w = T.sum(1).tolist()
    worst = Fraction(0)
    for seq in idx.tolist():
        for i in seq:
            ov = [G[i][j] for j in seq]
            wts = [F_ref(head.weights[w[i]], w[i], k) for k in ov]
            p = sum(f * k for f, k in zip(wts, ov)) / sum(wts) + head.bias
            worst = max(worst, abs(p - min(ov)))
    assert worst < Fraction(1, 2)
    assert worst == head.max_excess / 2


# --------------------------------------------------------------------------- (b)
@pytest.mark.parametrize("m", [1, 3, 6, 9])
def test_features_factorise_the_kernel_and_are_nonnegative(m):
    head = overlap_kernel(m)
    T = all_tokens(m)
    Q, K = overlap_kernel_features(head, T)
    assert Q.shape == K.shape == (2 ** m, head.rank)
    assert Q.dtype == K.dtype == np.float64
    assert (Q >= 0).all() and (K >= 0).all()
    G = T @ T.T
    w = T.sum(1)
    table = np.zeros((m + 1, m + 1))                    # table[w, k] = F_w(k)
    for wq in range(m + 1):
        for k in range(wq + 1):
            table[wq, k] = float(F_ref(head.weights[wq], wq, k))
    F = table[w[:, None], G]
    assert np.allclose(Q @ K.T, F, rtol=1e-12, atol=0)
    assert (F > 0).all()


@pytest.mark.parametrize("m", [4, 5])
def test_features_match_a_subset_by_subset_construction(m):
    head = overlap_kernel(m, degree=2)
    T = all_tokens(m)
    Q, K = overlap_kernel_features(head, T)
    Qr, Kr = features_ref(head, T)
    assert np.array_equal(Q, Qr) and np.array_equal(K, Kr)


def test_too_many_feature_entries_are_refused(head32):
    with pytest.raises(ValueError, match="tokens.*exceed"):
        overlap_kernel_features(head32, np.zeros((4, 32), dtype=np.uint8))


# --------------------------------------------------------------------------- (c)
def test_rank_degree_and_ceiling():
    # rank < 2^m for every m >= 1 (D(m) < m); D(m) = max of the prototype's d*(w)
    for m in range(1, 33):
        head = overlap_kernel(m)
        assert head.degree == max(PROTOTYPE_DEGREES[:m])
        assert head.degrees == [0] + PROTOTYPE_DEGREES[:m]
        assert head.rank == sum(math.comb(m, j) for j in range(head.degree + 1))
        assert isinstance(head.rank, int) and head.ceiling_rank == 2 ** m
        assert head.rank < 2 ** m
        assert len(head.weights) == m + 1
        assert all(len(d) == head.degree + 1 for d in head.weights)
        assert head.bias == -head.max_excess / 2 and head.max_error < 0.5
    assert overlap_kernel(9).rank == 46
    assert overlap_kernel(32).rank == 15_033_173


def test_a_larger_degree_keeps_the_rank_formula_and_lowers_the_error():
    low, high = overlap_kernel(9), overlap_kernel(9, degree=4)
    assert high.rank == sum(math.comb(9, j) for j in range(5))
    assert high.max_excess < low.max_excess
    check_exact_ref(high.weights, 9)


# --------------------------------------------------------------------------- (d)
@pytest.mark.parametrize("m", range(2, 13))
def test_exact_recheck_of_the_proof(m):
    head = overlap_kernel(m)
    assert all(isinstance(v, Fraction) for d in head.weights for v in d)
    assert check_exact_ref(head.weights, m) == head.max_excess


# --------------------------------------------------------------------------- (e)
def test_random_sequences_at_32_bits(head32):
    rng = np.random.default_rng(0)
    # uniform bits would put nearly every weight near 16: mix in per-token densities
    density = rng.uniform(0, 1, size=(20_000, 3, 1))
    X = (rng.uniform(size=(20_000, 3, 32)) < density).astype(np.uint8)
    p = overlap_kernel_predict(head32, X)
    assert p.shape == (20_000, 3) and p.dtype == np.float64
    err = np.abs(p - minip_targets_ref(X.astype(np.int64)))
    assert err.max() < 0.5


def test_every_overlap_pattern_at_32_bits(head32):
    """x = the first w bits, y the first a bits, z the first c bits: every (w, a, c)."""
    m = 32
    rows = [(w, a, c) for w in range(m + 1) for a in range(w + 1) for c in range(a, w + 1)]
    X = np.zeros((len(rows), 3, m), dtype=np.uint8)
    for s, (w, a, c) in enumerate(rows):
        X[s, 0, :w] = 1
        X[s, 1, :a] = 1
        X[s, 2, :c] = 1
    p = overlap_kernel_predict(head32, X)[:, 0]
    err = np.abs(p - np.array([a for _, a, _ in rows]))
    assert err.max() < 0.5
    assert err.max() == pytest.approx(head32.max_error, abs=1e-9)


# --------------------------------------------------------------------------- (f)
def test_a_degree_one_too_small_raises():
    for m in (2, 9, 14, 32):
        D = overlap_kernel(m).degree
        with pytest.raises(ValueError, match=r"degree=.* not feasible at weight w="):
            overlap_kernel(m, degree=D - 1)


def test_the_exact_checker_catches_a_broken_weight():
    head = overlap_kernel(9)
    broken = [list(d) for d in head.weights]
    broken[9][0] *= 10 ** 20         # the query's own weight dominates: E(9, 0, 0) ~ 9
    with pytest.raises(AssertionError, match="E_max"):
        check_exact_ref(broken, 9)
    flat = [list(d) for d in head.weights]
    flat[9] = [Fraction(1)] + [Fraction(0)] * head.degree        # a constant kernel
    with pytest.raises(AssertionError, match="E_max"):
        check_exact_ref(flat, 9)


def test_the_exact_checker_catches_a_wrong_formula():
    head = overlap_kernel(9)

    def increasing(d, w, k):          # C(k, j) for C(w - k, j): the kernel grows with k
        return sum(dj * math.comb(k, j) for j, dj in enumerate(d))

    with pytest.raises(AssertionError, match="E_max"):
        check_exact_ref(head.weights, 9, F=increasing)


def test_a_wrong_bias_fails_the_forward_pass():
    head = overlap_kernel(4)
    T, idx = all_sequences(4)
    t = minip_targets_ref(T[idx])
    bad = dict(head, bias=-head.bias)
    from sklearn.utils import Bunch

    p = overlap_kernel_predict(Bunch(**bad), T[idx])
    assert np.abs(p - t).max() > 0.5


# --------------------------------------------------------------------------- (g)
def test_bad_input_names_the_parameter():
    head = overlap_kernel(3)
    with pytest.raises(ValueError, match="n_bits"):
        overlap_kernel(0)
    with pytest.raises(ValueError, match="n_bits"):
        overlap_kernel(2.5)
    with pytest.raises(ValueError, match="degree"):
        overlap_kernel(3, degree=-1)
    with pytest.raises(ValueError, match="tokens"):
        overlap_kernel_features(head, np.zeros(3))
    with pytest.raises(ValueError, match="tokens"):
        overlap_kernel_features(head, np.zeros((2, 4)))
    with pytest.raises(ValueError, match="tokens"):
        overlap_kernel_features(head, np.zeros((2, 1, 3)))
    with pytest.raises(ValueError, match="tokens"):
        overlap_kernel_features(head, np.full((2, 3), 2))
    with pytest.raises(ValueError, match="X"):
        overlap_kernel_predict(head, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="X"):
        overlap_kernel_predict(head, np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="kernel"):
        overlap_kernel_predict({"n_bits": 3}, np.zeros((2, 3, 3)))


# --------------------------------------------------------------------------- properties
@pytest.fixture(scope="module")
def head20():
    return overlap_kernel(20)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_excess_below_one_at_random_overlaps(head20, data):
    w = data.draw(st.integers(0, 20), label="w")
    a = data.draw(st.integers(0, w), label="a")
    c = data.draw(st.integers(a, w), label="c")
    d = head20.weights[w]
    Fw, Fa, Fc = (F_ref(d, w, k) for k in (w, a, c))
    E = (Fw * (w - a) + Fc * (c - a)) / (Fw + Fa + Fc)
    assert 0 <= E <= head20.max_excess < 1


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 7), n=st.integers(1, 4), N=st.integers(1, 5), seed=st.integers(0, 2 ** 16))
def test_predict_is_the_feature_head_at_any_length(m, n, N, seed):
    head = overlap_kernel(m)
    X = np.random.default_rng(seed).integers(0, 2, size=(n, N, m))
    Q, K = overlap_kernel_features(head, X.reshape(-1, m))
    idx = np.arange(n * N).reshape(n, N)
    A = Q @ K.T
    alpha = A[idx[:, :, None], idx[:, None, :]]
    G = np.einsum("sik,sjk->sij", X, X)
    ref = (alpha * G).sum(2) / alpha.sum(2) + float(head.bias)
    assert np.allclose(overlap_kernel_predict(head, X), ref, rtol=1e-12, atol=1e-12)
    if N <= 3:
        assert np.abs(ref - G.min(2)).max() < 0.5
