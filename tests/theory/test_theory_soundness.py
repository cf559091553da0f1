"""Randomised soundness checks of :func:`minip_learn.theory.certify` (R4-R5 of the theory page).

A certified minimum rank must be a true lower bound for *every* nonnegative kernel
head that solves the family. Three independent checks:

* an independent verifier re-derives every claimed ratio bound of a certificate from
  the family itself (S1, S2, S3 multisets with the exact multiplicities, gap >= 2,
  ``K = (N-2)(g-1)`` per step, chains for the same query, increasing overlap) and
  recomputes the R5 integer in exact arithmetic, on adversarial families: random
  subsets of witness suites, shuffled positions, duplicated sequences, S3 sequences
  rewritten with the wrong multiplicities, random noise sequences;
* explicit nonnegative kernel heads of known rank ``r`` (one kernel row per "centre"
  token, softmax-like readout) and the family of every candidate sequence they solve:
  certify must never exceed ``r``, and every ratio bound of the certificate must hold
  for that head;
* random approximate identities ``B`` (unit diagonal, ``0 <= B_ij < eps_ij``): the R5
  integer never exceeds ``rank(B)``.
"""

import functools
import itertools
import math
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minip_learn.datasets import make_witness_suite
from minip_learn.theory import approximate_identity_rank_bound, certify, hadamard_code

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


# --------------------------------------------------------------------------- verifier
def _multisets(X):
    """Set of sequence multisets, each a sorted tuple of token byte strings."""
    return {tuple(sorted(bytes(t) for t in np.asarray(s, dtype=np.uint8))) for s in X}


def _ms(*parts):
    out = []
    for tok, mult in parts:
        out += [bytes(np.asarray(tok, dtype=np.uint8))] * mult
    return tuple(sorted(out))


def _step_denominator(present, N, x, y, z):
    """``K`` of one R4 step ``alpha(x,z) < alpha(x,y)/K``, re-derived from scratch."""
    x, y, z = (np.asarray(t, dtype=np.int64) for t in (x, y, z))
    g = int(x @ z) - int(x @ y)
    assert g >= 2, f"step with gap {g} < 2"
    assert _ms((x, 1), (y, N - 1)) in present, "S1 missing"
    assert _ms((x, 1), (z, N - 1)) in present, "S2 missing"
    assert _ms((x, 1), (y, 1), (z, N - 2)) in present, "S3 missing"
    return (N - 2) * (g - 1)


def verify_certificate(X, rank, cert):
    """Re-derive ``cert`` from ``X`` alone; return the R5 integer it proves."""
    X = np.asarray(X, dtype=np.uint8)
    N = X.shape[1]
    n = len(cert.queries)
    if rank == 1:
        return 1
    assert n >= 2 and rank <= n
    present = _multisets(X)
    # every token of the certificate occurs in the family
    toks = {bytes(t) for t in X.reshape(-1, X.shape[2])}
    Q = [bytes(q) for q in cert.queries]
    Kk = [bytes(k) for k in cert.keys]
    assert set(Q) <= toks and set(Kk) <= toks
    assert len(set(Q)) == n, "queries must be distinct"
    assert len(set(Kk)) == n, "designated keys must be distinct"
    T = cert.tokens
    den = np.ones((n, n), dtype=object)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            chain = cert.chains[(i, j)]
            assert np.array_equal(T[chain[0]], cert.keys[i])
            assert np.array_equal(T[chain[-1]], cert.keys[j])
            K = 1
            for a, b in zip(chain[:-1], chain[1:]):
                K *= _step_denominator(present, N, cert.queries[i], T[a], T[b])
            assert K == cert.eps_denominators[i, j], (i, j, K, cert.eps_denominators[i, j])
            den[i, j] = K
    # R5 in exact arithmetic: r > n^2/(n + sum eps^2), or r = n by strict dominance
    off = [(i, j) for i in range(n) for j in range(n) if i != j]
    S = sum((Fraction(1, int(den[i, j]) ** 2) for i, j in off), Fraction(0))
    proved = math.floor(Fraction(n * n) / (n + S)) + 1
    rows = max(sum(Fraction(1, int(den[i, j])) for j in range(n) if j != i) for i in range(n))
    cols = max(sum(Fraction(1, int(den[i, j])) for i in range(n) if i != j) for j in range(n))
    if rows <= 1 or cols <= 1:
        proved = n
    return min(proved, n)


# --------------------------------------------------------------------------- adversarial families
@functools.cache
def _base(which):
    if which == "h12-N3":
        return make_witness_suite(12, 3, construction="hadamard").X
    if which == "h12-N4":
        return make_witness_suite(12, 4, construction="hadamard").X
    if which == "h8-N5":
        return make_witness_suite(8, 5, construction="hadamard").X
    if which == "h16half-ladder":
        return make_witness_suite(17, 3, construction="hadamard-half", ladder_gap=3).X
    if which == "product-N4":
        return make_witness_suite(17, 4, construction="product", n_queries=20).X
    raise KeyError(which)


BASES = ["h12-N3", "h12-N4", "h8-N5", "h16half-ladder", "product-N4"]


def _mutate(X, rng, keep, shuffle, duplicate, bad_multiplicity, noise):
    X = X[rng.rand(len(X)) < keep]
    if len(X) == 0:
        X = _base("h12-N3")[:3]
    N = X.shape[1]
    if bad_multiplicity and N >= 4:
        # rewrite some S3 = (x, a, b, ..., b) as (x, a, a, b, ..., b): not an S3 any more
        X = X.copy()
        for s in X:
            if rng.rand() < 0.5 and not np.array_equal(s[1], s[2]) and np.array_equal(s[2], s[-1]):
                s[2] = s[1]
    if duplicate:
        X = np.concatenate([X, X[rng.randint(len(X), size=len(X) // 3 + 1)]])
    if noise:
        toks = np.unique(X.reshape(-1, X.shape[2]), axis=0)
        extra = toks[rng.randint(len(toks), size=(noise, N))]
        X = np.concatenate([X, extra])
    if shuffle:
        X = np.stack([s[rng.permutation(N)] for s in X])
        X = X[rng.permutation(len(X))]
    return X


@settings(max_examples=25, **SETTINGS)
@given(
    which=st.sampled_from(BASES),
    seed=st.integers(0, 2**31 - 1),
    keep=st.sampled_from([0.3, 0.7, 0.9, 0.97, 1.0]),
    shuffle=st.booleans(),
    duplicate=st.booleans(),
    bad_multiplicity=st.booleans(),
    noise=st.sampled_from([0, 5, 50]),
)
def test_every_certificate_is_rederived_from_the_family(
    which, seed, keep, shuffle, duplicate, bad_multiplicity, noise
):
    rng = np.random.RandomState(seed)
    X = _mutate(_base(which), rng, keep, shuffle, duplicate, bad_multiplicity, noise)
    rank, cert = certify(X, return_certificate=True)
    assert 1 <= rank <= len(np.unique(X.reshape(-1, X.shape[2]), axis=0))
    assert rank <= verify_certificate(X, rank, cert)
    assert rank == cert.certified_min_rank


def _rewrite(X, what):
    X = X.copy()
    if what == "S3":    # every S3 = (x, a, b, b) becomes (x, a, a, b)
        rows = ~(X[:, 1] == X[:, 2]).all(1)
        X[rows, 2] = X[rows, 1]
    else:               # every S1 = (x, t, t, t) becomes (x, x, t, t)
        rows = (X[:, 1] == X[:, 2]).all(1) & (X[:, 2] == X[:, 3]).all(1)
        X[rows, 1] = X[rows, 0]
    return X


def test_wrong_multiplicities_certify_nothing():
    # exact design (a padding bit: no key is a query): with the multiplicities of
    # S3 (or of S1) wrong, no R4 triple is left whatever token is read as the query
    X = make_witness_suite(13, 4, construction="hadamard").X
    assert certify(X) > 1
    for what in ("S3", "S1"):
        assert certify(_rewrite(X, what)) == 1


def test_wrong_multiplicities_can_be_valid_triples_for_another_query():
    # without padding every key is also a query: (x, a, a, b) is S3 = (b, x, a, a) for
    # query b when (b, x, x, x) and (b, a, a, a) are present -- a legitimate reading,
    # and whatever certify claims must be re-derivable from the family
    X = _rewrite(_base("h12-N4"), "S3")
    rank, cert = certify(X, return_certificate=True)
    assert rank <= verify_certificate(X, rank, cert)


# --------------------------------------------------------------------------- explicit heads
def _solved(idx, A, OV, margin=1e-9):
    """Sequences (token ids) solved at every position by the head with kernel ``A`` and
    scalars ``P_{x,t} = <x, t>`` (values ``v(t) = t``, readout ``<x, u>``)."""
    W = A[idx[:, :, None], idx[:, None, :]]
    V = OV[idx[:, :, None], idx[:, None, :]]
    err = np.abs((W * V).sum(-1) / W.sum(-1) - V.min(-1))
    return (err < 0.5 - margin).all(-1)


@functools.cache
def _pool(n_tokens, N):
    ids = []
    for x, y, z in itertools.product(range(n_tokens), repeat=3):
        for a in range(N):
            ids.append([x] + [y] * a + [z] * (N - 1 - a))
    return np.array(ids)


@settings(max_examples=30, **SETTINGS)
@given(
    seed=st.integers(0, 2**31 - 1),
    N=st.sampled_from([3, 3, 4, 5]),
    order=st.sampled_from([8, 12]),
    beta=st.floats(1.0, 8.0),
    r_frac=st.floats(0.0, 1.0),
)
def test_certify_never_exceeds_the_rank_of_a_solving_head(seed, N, order, beta, r_frac):
    rng = np.random.RandomState(seed)
    T = hadamard_code(order)
    T = T[rng.permutation(len(T))][: rng.randint(6, min(len(T), 14) + 1)]
    n_tok = len(T)
    OV = T.astype(np.int64) @ T.T.astype(np.int64)
    # a nonnegative kernel of rank <= r: every query uses the exp(-beta <c, z>) row of
    # one of r centre tokens c (exact softmax for the centres themselves)
    r = 1 + int(r_frac * (n_tok - 1))
    centres = rng.choice(n_tok, r, replace=False)
    assign = np.array([x if x in centres else centres[rng.randint(r)] for x in range(n_tok)])
    A = np.exp(-beta * OV[assign].astype(float))
    assert np.linalg.matrix_rank(A) <= r
    idx = _pool(n_tok, N)
    idx = idx[rng.rand(len(idx)) < rng.uniform(0.4, 1.0)]
    idx = idx[_solved(idx, A, OV)]
    if len(idx) == 0:
        return
    idx = np.stack([s[rng.permutation(N)] for s in idx])
    X = T[idx]
    rank, cert = certify(X, return_certificate=True)
    assert rank <= r
    assert rank <= n_tok
    if rank > 1:
        # every ratio bound of the certificate holds for this solving head
        pos = {bytes(t): k for k, t in enumerate(T)}
        qi = [pos[bytes(q)] for q in cert.queries]
        ki = [pos[bytes(k)] for k in cert.keys]
        Bm = A[np.ix_(qi, ki)] / A[qi, ki][:, None]
        off = ~np.eye(len(qi), dtype=bool)
        bound = np.array([[1.0 / float(k) for k in row] for row in cert.eps_denominators])
        assert (Bm[off] < bound[off] * (1 + 1e-9)).all()


# --------------------------------------------------------------------------- R5 alone
@settings(max_examples=60, **SETTINGS)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(2, 12),
    max_den=st.integers(1, 12),
    closeness=st.sampled_from([0.5, 0.9, 0.999]),
)
def test_r5_integer_never_exceeds_rank_of_an_approximate_identity(seed, n, max_den, closeness):
    rng = np.random.RandomState(seed)
    K = rng.randint(1, max_den + 1, size=(n, n))
    eps = np.array([[Fraction(1, int(k)) for k in row] for row in K], dtype=object)
    # B_ij in [0, eps_ij): near the bound to stress the Frobenius and dominance rules
    U = closeness + (1 - closeness) * rng.rand(n, n) * 0.999
    B = U / K
    np.fill_diagonal(B, 1.0)
    assert (B[~np.eye(n, dtype=bool)] < (1.0 / K)[~np.eye(n, dtype=bool)]).all()
    bound = approximate_identity_rank_bound(n, eps)
    assert bound <= np.linalg.matrix_rank(B, tol=1e-12)
