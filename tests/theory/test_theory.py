"""Tests of minip_learn.theory: exact constructions (R1-R3), bounds (R4, R5, R8), certify."""

import itertools
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from minip_learn.constructions import exact_kernel_realization, rank_one_head, softmax_construction
from minip_learn.datasets import make_minip, minip_targets
from minip_learn.metrics import max_abs_error, solved
from minip_learn.theory import (
    Certificate,
    approximate_identity_rank_bound,
    bound_table,
    certify,
    chain_denominator,
    channel_capacity_bits,
    design_rank,
    gap_domination_ratio,
    gap_mixture_weight,
    greedy_constant_weight_code,
    hadamard_code,
    hadamard_matrix,
    hadamard_orders,
    product_code,
    product_code_bound,
    transcript_lower_bound,
    witness_bound,
    witness_denominators,
    witness_family,
)
from minip_learn.theory.bounds import (
    denominator_sums,
    gap_denominator,
    integer_above,
    rank_from_denominators,
    rank_from_sums,
    resolve_near_integer,
)


def all_sequences(n_bits, seq_len):
    tokens = np.array(list(itertools.product((0, 1), repeat=n_bits)), dtype=np.uint8)
    idx = np.array(list(itertools.product(range(len(tokens)), repeat=seq_len)))
    return tokens[idx]


# --------------------------------------------------------------------------- R1-R3
@pytest.mark.parametrize("n_bits", [1, 2, 3, 4])
@pytest.mark.parametrize("seq_len", [1, 2])
def test_r1_rank_one_head_solves_every_short_sequence(n_bits, seq_len):
    X = all_sequences(n_bits, seq_len)
    est = rank_one_head(n_bits)
    assert est.net_.module_.rank == 1
    pred = est.predict(X)
    assert max_abs_error(minip_targets(X), pred) < 1e-9
    assert est.score(X, minip_targets(X)) == 1.0


@pytest.mark.parametrize("n_bits", [1, 2, 3, 4])
def test_r2_softmax_construction_solves_every_length3_sequence(n_bits):
    X = all_sequences(n_bits, 3)
    y = minip_targets(X)
    est = softmax_construction(n_bits)
    err = max_abs_error(y, est.predict(X))
    assert err <= 2 / (np.e * 2.0) + 1e-12 and err < 0.5
    assert solved(y, est.predict(X)) == 1.0


def test_r2_default_beta_scales_with_length():
    X = all_sequences(3, 5)
    y = minip_targets(X)
    assert softmax_construction(3, seq_len=5).score(X, y) == 1.0


@pytest.mark.parametrize("n_bits,seq_len", [(3, 1), (3, 2), (3, 3), (3, 4), (4, 1), (4, 2), (4, 3)])
def test_r3_exact_kernel_realization_equals_softmax(n_bits, seq_len):
    X = all_sequences(n_bits, seq_len)
    y = minip_targets(X)
    kern = exact_kernel_realization(n_bits, seq_len=max(seq_len, 3))
    soft = softmax_construction(n_bits, seq_len=max(seq_len, 3))
    assert kern.net_.module_.rank == 2 ** n_bits
    assert kern.net_.module_.nonnegative
    np.testing.assert_allclose(kern.predict(X), soft.predict(X), rtol=0, atol=1e-9)
    assert kern.score(X, y) == 1.0


def test_r3_on_a_token_set():
    X, y = make_minip(60, seq_len=3, n_bits=10, random_state=0)
    est = exact_kernel_realization(tokens=X)
    assert est.rank == len(np.unique(X.reshape(-1, 10), axis=0))
    assert est.score(X, y) == 1.0
    with pytest.raises(ValueError, match="n_bits"):
        exact_kernel_realization()
    with pytest.raises(ValueError, match="too many"):
        exact_kernel_realization(20)


def test_construction_arguments_are_validated():
    with pytest.raises(ValueError):
        rank_one_head(0)
    with pytest.raises(ValueError, match="beta"):
        softmax_construction(4, beta=-1.0)


# --------------------------------------------------------------------------- R4
def _outputs(N, a, P):
    """Query outputs of S1, S2, S3 by brute force from kernel values a and scalars P."""
    ax, ay, az = a
    Px, Py, Pz = P
    o1 = (ax * Px + (N - 1) * ay * Py) / (ax + (N - 1) * ay)
    o2 = (ax * Px + (N - 1) * az * Pz) / (ax + (N - 1) * az)
    o3 = (ax * Px + ay * Py + (N - 2) * az * Pz) / (ax + ay + (N - 2) * az)
    return o1, o2, o3


@pytest.mark.parametrize("N", [3, 4, 6])
def test_r4_mixture_weight_matches_brute_force(N):
    rng = np.random.RandomState(N)
    a = rng.exponential(size=(3, 500))
    P = rng.normal(size=(3, 500))
    o1, o2, o3 = _outputs(N, a, P)
    mu = gap_mixture_weight(N, *a)
    np.testing.assert_allclose(o3, (1 - mu) * o1 + mu * o2, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("N", [3, 4, 5])
@pytest.mark.parametrize("g", [2, 3, 6])
def test_r4_gap_domination_holds_and_is_tight(N, g):
    eps = gap_domination_ratio(N, g)
    assert eps == 1 / ((N - 2) * (g - 1))
    rng = np.random.RandomState(10 * N + g)
    t, n = 3.0, 200000
    a = np.exp(rng.uniform(-6, 3, size=(3, n)))
    P = np.stack([rng.uniform(-3, 12, n), t + rng.uniform(-0.5, 0.5, n),
                  t + g + rng.uniform(-0.5, 0.5, n)])
    o1, o2, o3 = _outputs(N, a, P)
    ok = (abs(o1 - t) < 0.5) & (abs(o2 - t - g) < 0.5) & (abs(o3 - t) < 0.5)
    assert ok.sum() > 0
    assert (a[2, ok] / a[1, ok] < eps).all()
    # tightness: ratio just below eps is solvable, at eps it is not
    for ratio, ok in ((eps * 0.999, True), (eps, False)):
        a = (0.0, 1.0, ratio)
        P = (0.0, t - 0.5 + 1e-6, t + g - 0.5 + 1e-6)
        o1, o2, o3 = _outputs(N, a, P)
        assert abs(o1 - t) < 0.5 and abs(o2 - t - g) < 0.5
        assert (abs(o3 - t) < 0.5) is ok


def test_r4_arguments():
    with pytest.raises(ValueError, match="seq_len >= 3"):
        gap_domination_ratio(2, 4)
    with pytest.raises(ValueError, match="gap"):
        gap_domination_ratio(3, 1)
    assert gap_domination_ratio(4, 3, exact=True) == Fraction(1, 4)


def test_chain_denominator():
    # one step at N = 3: K = (N-2)(d-1), so 5 at d = 6 and 11 at d = 12; d < 2: none.
    # A ladder of t steps of gap 4 (K = 3 each) and a last step of d - 4t: 15, 3*11,
    # 9*7, 27*3 = 81 for t = 0..3 at d = 16, the best at t = 3
    assert chain_denominator(6, 3) == (5, 0)
    assert chain_denominator(1, 3) == (0, 0)
    assert chain_denominator(16, 3, ladder_gap=4) == (81, 3)
    assert chain_denominator(12, 3, ladder_gap=4, max_steps=0) == (11, 0)


# --------------------------------------------------------------------------- R5
def test_r5_scalar_bound_values():
    # r > n/(1 + (n-1) eps^2): 46/(1 + 45/25) = 16.43 and 23/(1 + 22/25) = 12.23 (R6)
    assert approximate_identity_rank_bound(46, Fraction(1, 5)) == 17
    assert approximate_identity_rank_bound(23, Fraction(1, 5)) == 13
    assert approximate_identity_rank_bound(1, 0.5) == 1
    r, v = approximate_identity_rank_bound(46, Fraction(1, 5), return_value=True)
    assert v == Fraction(46 * 25, 25 + 45) and r == 17
    with pytest.raises(ValueError):
        approximate_identity_rank_bound(0, 0.1)
    with pytest.raises(ValueError):
        approximate_identity_rank_bound(3, -0.1)
    with pytest.raises(ValueError, match="shape"):
        approximate_identity_rank_bound(3, np.zeros((2, 2)))


@pytest.mark.parametrize("seed", range(6))
def test_r5_bound_never_exceeds_true_rank(seed):
    rng = np.random.RandomState(seed)
    n = rng.randint(4, 30)
    for r in (1, 2, n // 3 + 1, n // 2 + 1):
        # a rank-r nonnegative kernel matrix, strongly diagonal when possible
        P = rng.exponential(size=(n, r)) ** 3
        Q = P + 0.01 * rng.exponential(size=(n, r))
        A = P @ Q.T
        B = A / np.diag(A)[:, None]
        true_rank = np.linalg.matrix_rank(B)
        off = ~np.eye(n, dtype=bool)
        eps = B * (1 + 1e-9) + 1e-300
        assert approximate_identity_rank_bound(n, eps) <= true_rank <= r
        assert approximate_identity_rank_bound(n, float(eps[off].max())) <= true_rank


def test_r5_unit_diagonal_small_offdiagonal_is_full_rank():
    rng = np.random.RandomState(0)
    n = 12
    B = np.eye(n) + rng.uniform(0, 1 / (n - 1), size=(n, n)) * ~np.eye(n, dtype=bool)
    assert np.linalg.matrix_rank(B) == n
    assert approximate_identity_rank_bound(n, Fraction(1, n - 1)) == n


def _smallest_integer_above(q):
    """The definition itself: the least integer r with r > q (q a Fraction)."""
    r = math.floor(q) - 1
    while not r > q:
        r += 1
    return r


def _exact_r5(E):
    """R5 from a Fraction matrix, straight from the statement (diagonal ignored)."""
    n = len(E)
    off = [(i, j) for i in range(n) for j in range(n) if i != j]
    if n <= 1:
        return 1
    rows = [sum((E[i][j] for j in range(n) if j != i), Fraction(0)) for i in range(n)]
    cols = [sum((E[i][j] for i in range(n) if i != j), Fraction(0)) for j in range(n)]
    if max(rows) <= 1 or max(cols) <= 1:
        return n
    S = sum((E[i][j] ** 2 for i, j in off), Fraction(0))
    return min(n, _smallest_integer_above(Fraction(n * n) / (n + S)))


def _small_denominator_matrices():
    """Every 2 x 2 matrix with denominators 1..12 and every 3 x 3 one with 1, 2, 3."""
    for a, b in itertools.product(range(1, 13), repeat=2):
        yield np.array([[1, a], [b, 1]])
    for vals in itertools.product((1, 2, 3), repeat=6):
        K = np.ones((3, 3), dtype=np.int64)
        K[~np.eye(3, dtype=bool)] = vals
        yield K


def test_integer_above_is_the_smallest_integer_strictly_above():
    for q in {Fraction(a, b) for a in range(-20, 60) for b in range(1, 13)}:
        assert integer_above(q) == _smallest_integer_above(q)
        # a float of q decides like q once the exact value is supplied
        assert integer_above(float(q), lambda q=q: q) == _smallest_integer_above(q)
    assert integer_above(3) == 4 and integer_above(Fraction(3)) == 4


@pytest.mark.parametrize("k", [1, 2, 3, 17, 46, 1000, 123456])
@pytest.mark.parametrize("offset", [-1e-12, -1e-13, 0.0, 1e-13, 1e-12])
def test_floats_within_1e_12_of_an_integer_are_decided_exactly(k, offset):
    v = k * (1 + offset)
    assert resolve_near_integer(v, lambda: Fraction(k)) == k
    assert integer_above(v, lambda: Fraction(k)) == k + 1
    below = Fraction(k) - Fraction(1, 10**15)
    assert integer_above(v, lambda: below) == k
    assert integer_above(v, lambda: Fraction(k) + Fraction(1, 10**15)) == k + 1


def test_floats_far_from_an_integer_decide_alone():
    def never():
        raise AssertionError("the exact value is not needed here")

    for v in (2.5, 2.999, 3.001, 1e-6, -0.5, 46.0 * 25 / 70):
        assert integer_above(v, never) == math.floor(v) + 1
        assert resolve_near_integer(v, never) == v
    assert resolve_near_integer(float("inf"), never) == float("inf")


def test_r5_rank_functions_agree_with_exact_arithmetic_exhaustively():
    for K in _small_denominator_matrices():
        n = len(K)
        E = [[Fraction(1, int(k)) for k in row] for row in K]
        expected = _exact_r5(E)
        rank, value, dominant = rank_from_denominators(K)
        assert rank == expected and isinstance(value, Fraction)
        exact = denominator_sums(K)
        assert exact == (
            sum((E[i][j] ** 2 for i in range(n) for j in range(n) if i != j), Fraction(0)),
            max(sum((E[i][j] for j in range(n) if j != i), Fraction(0)) for i in range(n)),
            max(sum((E[i][j] for i in range(n) if i != j), Fraction(0)) for j in range(n)),
        )
        # the float statistics, decided near an integer from the exact ones
        F = 1.0 / K
        np.fill_diagonal(F, 0.0)
        assert rank_from_sums(
            n, float((F * F).sum()), float(F.sum(1).max()), float(F.sum(0).max()),
            exact_sum_sq=lambda x=exact: x[0], exact_max_row_sum=lambda x=exact: x[1],
            exact_max_col_sum=lambda x=exact: x[2],
        )[0] == expected
        assert approximate_identity_rank_bound(n, np.array(E, dtype=object)) == expected


def test_r5_quotients_that_are_exact_integers():
    # n = 10, eps = 1/3: n^2 / (n + 90/9) = 5 exactly and no dominance, so r >= 6
    S = 90 * Fraction(1, 9)
    assert rank_from_sums(10, S, Fraction(3), Fraction(3)) == (6, Fraction(5), False)
    assert approximate_identity_rank_bound(10, Fraction(1, 3)) == 6
    assert rank_from_denominators(np.full((10, 10), 3))[0] == 6
    # n = 36, eps = 1/5: the quotient is 15 exactly, 14.999... in floats (alone: 15)
    S = 36 * 35 * Fraction(1, 25)
    assert Fraction(36 * 36) / (36 + S) == 15
    s_float = 36 * 35 * (1 / 5) ** 2
    assert 36 * 36 / (36 + s_float) < 15
    assert rank_from_sums(36, s_float, 7.0, exact_sum_sq=lambda: S)[0] == 16
    assert approximate_identity_rank_bound(36, Fraction(1, 5)) == 16
    # without exact values the float statistic is read as the binary number it is
    assert rank_from_sums(36, s_float, 7.0)[0] == 15
    # every uniform eps = 1/K up to n = 40: integer quotients included
    hits = 0
    for n in range(2, 41):
        for K in range(1, 13):
            e = Fraction(1, K)
            q = Fraction(n * n) / (n + n * (n - 1) * e * e)
            hits += q.denominator == 1 and (n - 1) * e > 1
            expected = n if (n - 1) * e <= 1 else min(n, _smallest_integer_above(q))
            assert approximate_identity_rank_bound(n, e) == expected
            assert rank_from_denominators(np.full((n, n), K))[0] == expected
            f = 1.0 / K
            assert rank_from_sums(
                n, n * (n - 1) * f * f, (n - 1) * f,
                exact_sum_sq=lambda n=n, e=e: n * (n - 1) * e * e,
                exact_max_row_sum=lambda n=n, e=e: (n - 1) * e,
            )[0] == expected
    assert hits >= 5


def test_design_rank_counts_an_integer_quotient_as_exceeded():
    # pruning keeps 5 of these 10 queries, whose quotient n^2 / (n + S) is exactly 3:
    # the design bound is 4, what certify recomputes from the family
    words = greedy_constant_weight_code(12, 6, 2, max_words=60, random_state=0)[:10]
    K, _, _ = witness_denominators(words, 3)
    assert design_rank(K) == 4
    assert certify(witness_family(words, 3)) == 4


# --------------------------------------------------------------------------- R8
def test_r8_transcript_and_capacity():
    # q log2(s + 1) = 4 log2 16 = 16 bits; heads x layers x rank x bits = 2*3*4*8 = 192
    assert transcript_lower_bound(4, 15) == 16.0
    assert transcript_lower_bound(0, 3) == 0.0
    assert channel_capacity_bits(2, 3, 4, 8) == 192
    with pytest.raises(ValueError):
        channel_capacity_bits(0, 1, 1, 1)
    with pytest.raises(ValueError):
        transcript_lower_bound(-1, 2)


# --------------------------------------------------------------------------- codes
@pytest.mark.parametrize("order", [o for o in hadamard_orders(64)])
def test_hadamard_matrices(order):
    H = hadamard_matrix(order)
    assert (H @ H.T == order * np.eye(order)).all()
    W = hadamard_code(order).astype(int)
    assert len(W) == 2 * order - 2 and set(W.sum(1)) == {order // 2}
    G = W @ W.T
    assert set(G[~np.eye(len(W), dtype=bool)]) == {0, order // 4}


def test_hadamard_bad_order():
    with pytest.raises(ValueError, match="Hadamard"):
        hadamard_matrix(28)


# --------------------------------------------------------------------------- certify
def test_certify_r6_recomputes_17():
    W = hadamard_code(24)
    keys = 1 - W
    seqs = []
    for i, x in enumerate(W):
        seqs.append([x, keys[i], keys[i]])
        for j in range(len(W)):
            if j != i:
                seqs += [[x, keys[j], keys[j]], [x, keys[i], keys[j]]]
    X = np.array(seqs, dtype=np.uint8)
    assert X.shape == (4186, 3, 24)
    r, cert = certify(X, return_certificate=True)
    assert r == 17 and int(cert) == 17 and isinstance(cert, Certificate)
    assert len(cert.queries) == 46
    off = ~np.eye(46, dtype=bool)
    assert cert.eps[off].max() == pytest.approx(0.2)
    assert (cert.overlap_gaps[off] >= 6).all()
    assert "17" in cert.summary()
    # permuting positions inside sequences changes nothing (heads are equivariant)
    rng = np.random.RandomState(0)
    Xp = np.stack([s[rng.permutation(3)] for s in X])
    assert certify(Xp) == 17
    # without the sequences whose key is x_i itself, (x_i, x_i, x_i) and (x_i, k_i, x_i)
    # for each of the 46 queries, a query and its complement are unconstrained: at most
    # one of each of the 23 pairs, 23/(1 + 22/25) = 12.23, so 13
    drop = np.array([(s[1] == s[0]).all() or (s[2] == s[0]).all() for s in X])
    assert drop.sum() == 2 * 46
    assert certify(X[~drop]) == 13


def test_certify_is_1_without_constraints():
    X, _ = make_minip(300, seq_len=3, n_bits=8, random_state=0)
    assert certify(X) == 1
    X, _ = make_minip(100, seq_len=4, n_bits=12, min_gap=2, random_state=1)
    assert certify(X) == 1
    # length <= 2 families never constrain anything
    W = hadamard_code(8)
    X2 = np.array([[x, 1 - y] for x in W for y in W], dtype=np.uint8)
    r, cert = certify(X2, return_certificate=True)
    assert r == 1 and "seq_len=2" in cert.reason
    assert certify(X2[:, :1]) == 1


def test_certify_single_triple_and_chain():
    x = [1, 1, 1, 1, 1, 1, 0, 0]
    y0 = [0, 0, 0, 0, 0, 0, 1, 1]
    y1 = [1, 1, 1, 0, 0, 0, 1, 1]
    y2 = [1, 1, 1, 1, 1, 1, 1, 1]
    X = np.array([[x, y0, y0], [x, y1, y1], [x, y2, y2], [x, y0, y1], [x, y1, y2]])
    from minip_learn.theory import family_constraints

    tokens, edges, overlap = family_constraints(X)
    # <x, y0>, <x, y1>, <x, y2> = 0, 3, 6: S3 only for (y0, y1) and (y1, y2), gap 3 each
    assert sum(len(e) for e in edges.values()) == 2
    # one query: rank 1 whatever the chains
    assert certify(X) == 1


def test_certify_validates_input():
    with pytest.raises(ValueError):
        certify(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="0/1"):
        certify(np.full((2, 3, 4), 2))


def test_certify_never_exceeds_a_solvable_rank():
    # the R3 head of rank |T| solves any family, so certify can never claim more
    from minip_learn.datasets import make_witness_suite

    s = make_witness_suite(16, 3)
    assert s.certified_min_rank <= s.constructive_rank
    assert exact_kernel_realization(tokens=s.tokens).score(s.X, s.y) == 1.0


# --------------------------------------------------------------------------- table
def test_bound_table_grows_exponentially():
    t = bound_table(max_blocks=4, as_frame=True)
    assert set(t.columns) >= {"n_bits", "seq_len", "certified_min_rank", "construction"}
    assert len(t) == 8 * 4                  # n_bits 8, 16, ..., 64 by seq_len 3..6
    for N in range(3, 7):
        ranks = t[t.seq_len == N].sort_values("n_bits").certified_min_rank.to_numpy()
        assert (np.diff(ranks) >= 0).all()
    r3 = t[t.seq_len == 3].set_index("n_bits").certified_min_rank
    assert r3[24] >= 17 and r3[64] >= 1000
    # roughly exponential: every 16 bits multiply the bound by more than 2.5
    assert r3[64] > 2.5 * r3[48] and r3[48] > 2.5 * r3[32]
    d = bound_table(n_bits=[24], seq_len=[3], as_frame=False)
    # H12 x H12: 22^2 = 484 queries; a query's other keys lie at distance 3 (40 of them),
    # 6 (2 + 20*20 = 402), 9 (40) and 12 (1), with best chains (ladder gap 5) K = 2, 5,
    # 4*3 = 12 and 4*6 = 24: 484/(1 + 40/4 + 402/25 + 40/144 + 1/576) = 17.69, so 18
    assert d["construction"] == ["H12 x H12"] and d["ladder_gap"] == [5]
    assert d["certified_min_rank"] == [18] == [_independent_product_bound([12, 12], 3, 5)]


@pytest.mark.parametrize(
    "blocks,n_bits,N,gap",
    [
        ([(8, True), (8, True)], 16, 3, None),
        ([(8, True), (8, False)], 17, 4, None),
        ([(12, True)], 12, 3, None),
        ([(16, True)], 17, 3, 4),
        ([(32, True)], 33, 3, 4),
        ([(8, False), (8, True)], 16, 5, 2),
    ],
)
def test_analytic_bound_equals_certify_on_materialised_family(blocks, n_bits, N, gap):
    from minip_learn.theory import witness_family

    an = product_code_bound(blocks, N, ladder_gap=gap, n_bits=n_bits)
    assert an["exact"]
    words = product_code(blocks, n_bits=n_bits)
    rank, size = witness_bound(words, N, ladder_gap=gap)
    assert rank == an["rank"] and size == an["n_sequences"]
    X = witness_family(words, N, ladder_gap=gap)
    assert len(X) == size
    assert certify(X) == an["rank"]


@pytest.mark.parametrize("rank, solves", [(7, False), (20, True)])
def test_training_solves_only_at_or_above_the_certified_bound(rank, solves):
    """One rank below the certified 8 the table head never solves the small suite; the
    same training (map, lr, seed, epochs) at its constructive rank 20 (one feature per
    token) solves it, so the failure is the bound's, not the trainer's."""
    from minip_learn import KernelAttentionRegressor
    from minip_learn.datasets import make_witness_suite

    s = make_witness_suite(24, 3, construction="small")
    # the fewest Hadamard-24 queries reaching 8: n/(1 + (n-1)/25) is 7.35 at n = 10 and
    # 6.82 at n = 9; 10 queries of 1 + 2*9 sequences each
    assert len(s.X) == 190 and s.certified_min_rank == 8
    assert s.constructive_rank == 20
    est = KernelAttentionRegressor(rank=rank, feature_map="table", max_epochs=400, lr=0.05,
                                   stop_tolerance=0.5, random_state=0).fit(s.X, s.y)
    assert est.solved_ == solves
    assert solved(s.y, est.predict(s.X)) == float(solves)


# --------------------------------------------------------------------------- review regressions
@pytest.mark.parametrize("N", [3, 4, 5])
def test_r4_holds_when_the_far_key_is_the_query_itself(N):
    # z = x: S2 = (x, ..., x), S3 = (x, y, x, ..., x); the bound reads
    # alpha(x, x) / alpha(x, y) < 1/((N-2)(g-1)) with g = |x| - <x, y>
    x = np.array([1, 1, 1, 1, 0, 0], dtype=np.uint8)
    y = np.array([1, 0, 0, 0, 1, 1], dtype=np.uint8)
    g = int(x @ x) - int(x @ y)
    X = np.array([[x] + [y] * (N - 1), [x] * N, [x, y] + [x] * (N - 2)])
    from minip_learn.theory import family_constraints

    tokens, edges, overlap = family_constraints(X[:, ::-1])
    (q,) = edges
    assert (tokens[q] == x).all()
    ((a, b, K),) = edges[q]
    assert (tokens[a] == y).all() and (tokens[b] == x).all() and K == (N - 2) * (g - 1)
    # brute force: every solving configuration obeys the bound (a_z = a_x here)
    rng = np.random.RandomState(N)
    n, t = 200000, int(x @ y)
    ax, ay = np.exp(rng.uniform(-6, 3, size=(2, n)))
    Px, Py = t + g + rng.uniform(-0.5, 0.5, n), t + rng.uniform(-0.5, 0.5, n)
    o1, o2, o3 = _outputs(N, (ax, ay, ax), (Px, Py, Px))
    ok = (abs(o1 - t) < 0.5) & (abs(o2 - t - g) < 0.5) & (abs(o3 - t) < 0.5)
    assert ok.sum() > 0
    assert (ax[ok] / ay[ok] < 1 / K).all()


def test_r5_dominance_rule_is_strict_enough():
    # row sums of the bounds exactly 1: still full rank, because every entry is
    # strictly below its bound
    for n in (2, 3, 5):
        eps = Fraction(1, n - 1)
        assert approximate_identity_rank_bound(n, eps) == n
        B = np.full((n, n), float(eps) * (1 - 1e-9))
        np.fill_diagonal(B, 1.0)
        assert np.linalg.matrix_rank(B) == n
    # the Frobenius value n^2/(n + sum eps^2) is never counted as reached: r > value
    h = Fraction(1, 2)
    E = np.array([[0, 1, h, h], [1, 0, h, h], [h, h, 0, 0], [h, h, 0, 0]], dtype=object)
    r, v = approximate_identity_rank_bound(4, E, return_value=True)
    assert v == 2 and r == 3


@pytest.mark.parametrize(
    "blocks,n_bits,N,gap",
    [
        ([(8, False)], 8, 3, None),
        ([(8, False)], 8, 5, 2),
        ([(12, False)], 12, 4, 3),
        ([(16, False)], 16, 3, 4),
    ],
)
def test_non_exact_designs_certify_at_least_the_analytic_bound(blocks, n_bits, N, gap):
    # without padding every key is another query: certify may find more, never less
    from minip_learn.theory import witness_family

    an = product_code_bound(blocks, N, ladder_gap=gap, n_bits=n_bits)
    assert not an["exact"]
    words = product_code(blocks, n_bits=n_bits)
    X = witness_family(words, N, ladder_gap=gap)
    assert X.shape[1:] == (N, n_bits) and len(X) == an["n_sequences"]
    assert certify(X) >= an["rank"]


def _independent_product_bound(block_orders, N, gap):
    """R5 integer of the full-Hadamard product design, recomputed from scratch."""
    hist = {0: 1}
    for h in block_orders:
        new = {}
        for d, c in hist.items():
            for e, k in ((0, 1), (h // 4, 2 * h - 4), (h // 2, 1)):
                new[d + e] = new.get(d + e, 0) + c * k
        hist = new
    hist[0] -= 1
    n = int(np.prod([2 * h - 2 for h in block_orders]))

    def K(d):
        best, t = 0, 0
        while d - t * gap >= 2:
            best = max(best, ((N - 2) * (gap - 1)) ** t * (N - 2) * (d - t * gap - 1))
            t += 1
        return best

    assert all(K(d) >= 1 for d, c in hist.items() if c)   # every pair constrained
    S = sum(Fraction(c, K(d) ** 2) for d, c in hist.items() if c)
    R = sum(Fraction(c, K(d)) for d, c in hist.items() if c)
    return n if R <= 1 else min(n, int(Fraction(n) / (1 + S)) + 1)


def test_bound_table_headline_is_recomputed_independently():
    t = bound_table(n_bits=[64], seq_len=[3], as_frame=False)
    assert t["certified_min_rank"] == [3048]
    assert t["construction"] == [" x ".join(["H8"] * 8)] and t["ladder_gap"] == [4]
    assert sum(int(b[1:]) for b in t["construction"][0].split(" x ")) == 64   # no padding
    assert _independent_product_bound([8] * 8, 3, 4) == 3048
    assert _independent_product_bound([16] * 4, 3, 4) == 2802
    assert _independent_product_bound([12, 12], 3, 10**6) == 18


# --------------------------------------------------------------------------- argument contracts
# R4, R5 and R8 name the offending argument in every validation message, accept the
# boundary values their statements allow, and return the documented types.
@pytest.mark.parametrize("func", [gap_domination_ratio, gap_denominator])
def test_r4_arguments_are_named_in_messages(func):
    with pytest.raises(ValueError, match=r"^seq_len must be an integer; got 3\.0 \(float\)\.$"):
        func(3.0, 4)
    with pytest.raises(ValueError, match=r"^gap must be an integer; got 4\.0 \(float\)\.$"):
        func(3, 4.0)


def test_r4_exact_ratio_is_a_fraction():
    # eps(N, g) = 1 / ((N-2)(g-1)): 1/3 at N = 5, g = 2, a number no float equals
    eps = gap_domination_ratio(5, 2, exact=True)
    assert type(eps) is Fraction and eps == Fraction(1, (5 - 2) * (2 - 1))
    assert type(gap_domination_ratio(5, 2)) is float


def test_r4_mixture_weight_contract():
    def mu(N, ax, ay, az):   # mu = (N-2)(a_x + (N-1) a_z) / ((N-1)(a_x + a_y + (N-2) a_z))
        return Fraction((N - 2) * (ax + (N - 1) * az), (N - 1) * (ax + ay + (N - 2) * az))

    # zero kernel values are allowed (nonnegative), one at a time; scalars give floats
    for a in ((0, 1, 1), (1, 0, 1), (1, 1, 0), (0, 0, 1)):
        w = gap_mixture_weight(4, *a)
        assert type(w) is float and w == float(mu(4, *a))
    # kernel values are float64: large Python integers do not overflow (N-1) a_z in int64
    big = 2**62
    assert gap_mixture_weight(4, 0, big, big) == pytest.approx(float(mu(4, 0, big, big)),
                                                               rel=1e-15)
    arr = gap_mixture_weight(3, [Fraction(0)], [Fraction(1)], [Fraction(1)])
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float64 and arr.tolist() == [0.5]
    msg = r"^kernel values a_x, a_y, a_z must be nonnegative\.$"
    for a in ((-0.5, 1, 1), (1, -0.5, 1), (1, 1, -0.5)):
        with pytest.raises(ValueError, match=msg):
            gap_mixture_weight(3, *a)
    with pytest.raises(ValueError, match=r"^seq_len must be >= 3; got 2\.$"):
        gap_mixture_weight(2, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^seq_len must be an integer; got 3\.0 \(float\)\.$"):
        gap_mixture_weight(3.0, 1.0, 1.0, 1.0)


def test_r5_eps_validation_messages():
    with pytest.raises(ValueError, match=r"^n must be an integer; got 2\.0 \(float\)\.$"):
        approximate_identity_rank_bound(2.0, 0.1)
    with pytest.raises(ValueError, match=r"^eps must be a real number; got True\.$"):
        approximate_identity_rank_bound(3, True)
    with pytest.raises(ValueError, match=r"^eps must be a real number; got '0\.1'\.$"):
        approximate_identity_rank_bound(3, "0.1")
    with pytest.raises(ValueError, match=r"^eps must be finite; got inf\.$"):
        approximate_identity_rank_bound(3, math.inf)
    with pytest.raises(ValueError, match=r"^eps must be >= 0; got -0\.5\.$"):
        approximate_identity_rank_bound(3, -0.5)
    with pytest.raises(ValueError, match=r"^eps must be >= 0; got -1\.$"):
        approximate_identity_rank_bound(2, [[0, -1], [0, 0]])


def test_r5_integer_eps_is_read_exactly():
    # value = n^2 / (n + sum_{i != j} eps_ij^2), exact for integers beyond 2**53
    e = 2**53 + 1
    assert approximate_identity_rank_bound(2, e, return_value=True) == (
        1, Fraction(2 * 2, 2 + 2 * 1 * e * e))
    assert approximate_identity_rank_bound(2, [[0, e], [0.5, 0]], return_value=True) == (
        1, Fraction(2 * 2) / (2 + e * e + Fraction(1, 4)))
    # n = 1: B = (1), rank 1 and value n^2 / n = 1
    assert approximate_identity_rank_bound(1, 0.5, return_value=True) == (1, Fraction(1))


def test_r8_arguments_and_boundaries():
    # q log2(s + 1): s = 0 is one possible value, no information
    assert transcript_lower_bound(3, 0) == 0.0
    assert channel_capacity_bits(1, 1, 1, 1) == 1
    for bad, name in (((1.5, 2), "n_answers"), ((2, 1.5), "alphabet_size")):
        with pytest.raises(ValueError, match=rf"^{name} must be an integer; got 1\.5 \(float\)\.$"):
            transcript_lower_bound(*bad)
    with pytest.raises(ValueError, match=r"^alphabet_size must be >= 0; got -1\.$"):
        transcript_lower_bound(2, -1)
    names = ("n_heads", "n_layers", "rank", "bits_of_precision")
    for k, name in enumerate(names):
        args = [1, 1, 1, 1]
        args[k] = 0
        with pytest.raises(ValueError, match=rf"^{name} must be >= 1; got 0\.$"):
            channel_capacity_bits(*args)
        args[k] = 2.0
        with pytest.raises(ValueError, match=rf"^{name} must be an integer; got 2\.0 \(float\)\.$"):
            channel_capacity_bits(*args)


def test_r5_per_pair_dominance_by_rows_or_by_columns():
    # rows of eps sum to exactly 1 off the diagonal, the first column to 5/4:
    # strict dominance of B's rows gives rank n; the trace bound alone would give
    # integer_above(9 / (3 + 13/8)) = integer_above(72/37) = 2
    h, q = Fraction(1, 2), Fraction(1, 4)
    eps = [[0, h, h], [h, 0, h], [3 * q, q, 0]]
    sum_sq = sum(e * e for row in eps for e in row)
    assert sum_sq == Fraction(13, 8)
    assert math.floor(Fraction(9) / (3 + sum_sq)) + 1 == 2
    eps_t = [list(col) for col in zip(*eps)]
    for E in (eps, eps_t, np.array(eps, dtype=object)):
        assert approximate_identity_rank_bound(3, E, return_value=True) == (
            3, Fraction(9) / (3 + sum_sq))


def test_resolve_near_integer_reads_numbers_by_kind():
    def never():
        raise AssertionError("the exact value is not needed here")

    # integers of any kind are exact and returned as they are
    three = np.int64(3)
    assert resolve_near_integer(three, never) is three
    # other real numbers are read as floats; near an integer, exactly
    assert resolve_near_integer(np.float32(2.5), never) == 2.5
    assert resolve_near_integer(np.float32(3.0)) == Fraction(3)
    # without an exact value the float itself is the binary rational it is
    v = 1 + 2.0**-40
    r = resolve_near_integer(v)
    assert type(r) is Fraction and r == Fraction(2**40 + 1, 2**40)
    r = resolve_near_integer(15.0, lambda: 15)
    assert type(r) is Fraction and r == 15
    assert math.isnan(resolve_near_integer(math.nan, never))
    assert resolve_near_integer(-math.inf, never) == -math.inf


def test_resolve_near_integer_tolerance_is_relative_above_one():
    # within INTEGER_TOLERANCE * max(1, |v|) of an integer: decided exactly
    def never():
        raise AssertionError("the exact value is not needed here")

    assert resolve_near_integer(1.5e-9, never) == 1.5e-9          # 1.5e-9 > 1e-9 * 1
    assert resolve_near_integer(0.5e-9, lambda: 0) == 0            # 0.5e-9 <= 1e-9
    assert resolve_near_integer(1e-9, lambda: 0) == 0              # at the tolerance: within
    assert resolve_near_integer(1e6 + 2e-3, never) == 1e6 + 2e-3   # 2e-3 > 1e-9 * 1e6
    assert resolve_near_integer(1e6 + 5e-4, lambda: 10**6) == 10**6
    assert resolve_near_integer(-1e6 - 5e-4, lambda: -(10**6)) == -(10**6)
    assert integer_above(1e6 + 5e-4, lambda: Fraction(10**6)) == 10**6 + 1
    assert integer_above(1e6 + 2e-3, never) == 10**6 + 1


def test_rank_from_sums_contract():
    # n <= 1: rank 1, value 1, whatever the statistics
    assert rank_from_sums(0, 0) == (1, Fraction(1), True)
    assert rank_from_sums(1, Fraction(5), Fraction(3)) == (1, Fraction(1), True)
    # integers are exact: n^2 / (n + S) = 16 / 16 = 1, so the rank is 2
    r, v, d = rank_from_sums(4, 12)
    assert (r, v, d) == (2, Fraction(1), False) and type(v) is Fraction
    r, v, d = rank_from_sums(4, 1.5)
    assert (r, v, d) == (3, 16 / 5.5, False) and type(v) is float
    # dominance by columns alone, or by rows alone; a sum above 1 does not dominate
    assert rank_from_sums(4, 1.5, None, Fraction(1)) == (4, 16 / 5.5, True)
    assert rank_from_sums(4, 1.5, 2, 1) == (4, 16 / 5.5, True)
    assert rank_from_sums(4, 1.5, 1, 2) == (4, 16 / 5.5, True)
    assert rank_from_sums(4, 1.5, 2, 2) == (3, 16 / 5.5, False)
    # float sums next to 1 are decided by the exact sums when given, else as read
    up = 1 + 2.0**-52
    for kw in ("exact_max_row_sum", "exact_max_col_sum"):
        sums = (up, None) if kw == "exact_max_row_sum" else (None, up)
        assert rank_from_sums(4, 1.5, *sums, **{kw: lambda: Fraction(1)})[2] is True
        assert rank_from_sums(4, 1.5, *sums, **{kw: lambda: Fraction(1, 10**20) + 1})[2] is False
        assert rank_from_sums(4, 1.5, *sums) == (3, 16 / 5.5, False)
    # the rank never exceeds n
    assert rank_from_sums(3, Fraction(0)) == (3, Fraction(3), False)
    # other real number types are computed with as they are
    assert rank_from_sums(4, Decimal("1.5")) == (3, Decimal(16) / Decimal("5.5"), False)


def test_denominator_sums_exact_beyond_int64_and_edge_shapes():
    def stats(K):   # sum_{i != j} 1/K_ij^2, largest row and column sums of 1/K_ij
        n = len(K)
        E = [[Fraction(1, K[i][j]) for j in range(n)] for i in range(n)]
        off = [(i, j) for i in range(n) for j in range(n) if i != j]
        return (sum(E[i][j] ** 2 for i, j in off),
                max(sum(E[i][j] for j in range(n) if j != i) for i in range(n)),
                max(sum(E[i][j] for i in range(n) if i != j) for j in range(n)))

    K = [[1, 2**70, 2], [3, 1, 5], [4, 7, 1]]
    got = denominator_sums(np.array(K, dtype=object))
    assert got == stats(K) and all(type(x) is Fraction for x in got)
    K = [[1, 2, 6], [3, 1, 5], [4, 2, 1]]
    assert denominator_sums(np.array(K, dtype=object)) == stats(K) == denominator_sums(K)
    K = [[1, 2**60 + 3, 2], [3, 1, 7], [2**60 + 1, 7, 1]]   # int64, not float64
    assert denominator_sums(np.array(K, dtype=object)) == stats(K)
    for K in (np.array([[7]]), np.zeros((0, 0), dtype=np.int64)):
        got = denominator_sums(K)
        assert got == (0, 0, 0) and all(type(x) is Fraction for x in got)
    msg = r"^eps denominators must be integers >= 1; got 0 at \(1, 0\)\.$"
    for bad in ([[1, 1, 3], [0, 1, -1], [1, 1, 1]], [[1, 2**70, 1], [0, 1, -1], [1, 1, 1]]):
        for dtype in (None, object):
            if dtype is None and bad[0][1] > 2**62:
                continue
            with pytest.raises(ValueError, match=msg):
                denominator_sums(np.array(bad, dtype=dtype))
    with pytest.raises(ValueError, match=r"^eps denominators must be integers >= 1; got 0\.5 at"):
        denominator_sums(np.array([[1, 0.5], [2, 1]]))
    # rank_from_denominators: n <= 1 is rank 1; otherwise R5 on the exact sums
    for K in (np.ones((1, 1), dtype=np.int64), np.zeros((0, 0), dtype=np.int64)):
        assert rank_from_denominators(K) == (1, Fraction(1), True)
    K = [[1, 2], [3, 1]]
    S = Fraction(1, 4) + Fraction(1, 9)
    assert rank_from_denominators(np.array(K)) == (2, Fraction(4) / (2 + S), True)
    K = [[1, 2**70, 2], [3, 1, 5], [4, 7, 1]]
    S, row, col = stats(K)
    assert row <= 1
    assert rank_from_denominators(np.array(K, dtype=object)) == (3, Fraction(9) / (3 + S), True)
