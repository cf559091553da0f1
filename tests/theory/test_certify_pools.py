"""``certify`` on a family is at least what it certifies on the sub-families of its token
pools (the sequences whose tokens all lie in a pool), and its certificate verifies
against the whole family.

A certificate of a sub-family holds for the whole family (its triples are some of the
family's), so a family that adds tokens to a pool can never need a smaller rank; the
search finds the optimum only on small candidate sets, so ``certify`` searches the
constant-weight pools (one Hamming weight, or two weights ``w`` and ``m - w``) of every
family as well. The weight classes are recomputed here from the tokens, not read from
``certify``'s own list.
"""

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from strategies import pool_families

from minip_learn.compact import CompactFamily, is_compact
from minip_learn.theory import certify, full_task_tokens, verify_certificate
from minip_learn.theory._search import EXACT_MAX_CANDIDATES

SETTINGS = dict(deadline=None, derandomize=True)

#: a family of ``T`` tokens has at most ``T^2`` candidates (query, key); up to
#: ``EXACT_MAX_CANDIDATES`` (64) of them the exhaustive search takes them all
MAX_EXACT_TOKENS = math.isqrt(EXACT_MAX_CANDIDATES)


def every_triple_family(pool, N):
    """``(x, a^(N-1))`` and ``(x, a, b^(N-2))`` for every ``x, a, b`` of ``pool``: every
    R4 triple over the pool, in multiset form."""
    T = len(pool)
    x, a, b = (g.reshape(-1) for g in np.meshgrid(*[np.arange(T)] * 3, indexing="ij"))
    ids = np.stack([x, a, b], axis=1)
    counts = np.broadcast_to(np.array([1, 1, N - 2]), ids.shape)
    return CompactFamily.from_slots(pool, ids, counts)       # a == b: (x, a^(N-1))


def restricted(X, pool):
    """The sequences of ``X`` whose tokens all lie in ``pool`` (rows of tokens); None
    when there are none."""
    words = {bytes(t) for t in np.asarray(pool, dtype=np.uint8)}
    if is_compact(X):
        inside = np.array([bytes(t) in words for t in X.tokens] + [True])
        keep = inside[X.token_ids].all(axis=1)          # padding (-1) reads the True
    else:
        n, N, m = X.shape
        flat = [bytes(t) in words for t in X.reshape(-1, m).astype(np.uint8)]
        keep = np.array(flat).reshape(n, N).all(axis=1)
    return X[keep] if keep.any() else None


def weight_classes(tokens):
    """``(name, tokens)`` of the constant-weight classes of ``tokens`` and of their
    complementary pairs (weights ``w`` and ``m - w``), of two tokens or more."""
    m = tokens.shape[1]
    weight = tokens.sum(axis=1)
    out = [(f"weight-{w}", tokens[weight == w]) for w in np.unique(weight)]
    out += [(f"weights-{w}+{m - w}", tokens[(weight == w) | (weight == m - w)])
            for w in range(1, (m + 1) // 2)]
    return [(name, pool) for name, pool in out if len(pool) >= 2]


def family_tokens(X):
    return X.tokens if is_compact(X) else np.unique(X.reshape(-1, X.shape[2]), axis=0)


# ------------------------------------------------------------------------ the m = 6 case
M6 = full_task_tokens(6)


@pytest.mark.parametrize("N", [5, 6])
def test_all_64_tokens_certify_at_least_the_weight_3_layer(N):
    """The 20 tokens of weight 3 certify 4; the family over all 64 tokens holds every
    one of their sequences, and its own search finds a set certifying 3 only."""
    whole = every_triple_family(M6, N)
    layer = every_triple_family(M6[M6.sum(axis=1) == 3], N)
    assert certify(layer) == 4
    rank, cert = certify(whole, return_certificate=True)
    assert rank >= 4
    assert cert.certified_min_rank == rank
    assert np.array_equal(cert.tokens, whole.tokens)      # stated on the whole family
    assert verify_certificate(cert, whole)
    # found in a pool: not the optimum over every candidate of the whole family
    assert not cert.exhaustive


#: eight tokens of other weights that, beside the weight-3 layer, led the search of the
#: whole family to a set certifying 2 (the layer alone certifies 4)
EXTRA = ["000010", "001111", "101111", "110000", "110011", "110101", "111100", "111101"]


def _layer_and_extra():
    """The 20 tokens of weight 3 and those of :data:`EXTRA`, in ``np.unique`` order."""
    extra = np.array([[int(c) for c in word] for word in EXTRA], dtype=np.uint8)
    return np.unique(np.concatenate([M6[M6.sum(axis=1) == 3], extra]), axis=0)


def every_order_family(pool, N):
    """``(b, .., a, .., b, x)`` for every ``x, a, b`` of ``pool``, ``a`` at each of the
    first ``N - 1`` positions: every R4 triple over the pool with the query last, its
    keys in every order (so it binds position-dependent maps too)."""
    T = len(pool)
    x, a, b = (g.reshape(-1) for g in np.meshgrid(*[np.arange(T)] * 3, indexing="ij"))
    rows = []
    for p in range(N - 1):
        ids = np.repeat(b[:, None], N, axis=1)
        ids[:, p], ids[:, -1] = a, x
        rows.append(ids)
    return pool[np.unique(np.concatenate(rows), axis=0)]


@pytest.mark.parametrize("query, positional", [("all", False), ("last", False),
                                               ("last", True)])
def test_the_weight_3_layer_bounds_every_query_mode(query, positional):
    X = every_order_family(_layer_and_extra(), 5)
    layer = restricted(X, M6[M6.sum(axis=1) == 3])
    assert certify(layer, query=query, positional=positional) == 4
    rank, cert = certify(X, query=query, positional=positional, return_certificate=True)
    assert rank >= 4
    assert (cert.query, cert.positional) == (query, positional)
    assert verify_certificate(cert, X)


# --------------------------------------------------------------------------- properties
@st.composite
def thinned_token_sets(draw, n_bits=6, max_dropped=30):
    """Every ``n_bits``-bit token but a drawn list of them (shrinks to every token)."""
    tokens = full_task_tokens(n_bits)
    dropped = draw(st.lists(st.integers(0, len(tokens) - 1), max_size=max_dropped,
                            unique=True))
    return np.delete(tokens, dropped, axis=0)


@settings(max_examples=8, **SETTINGS)
@given(tokens=thinned_token_sets(), N=st.sampled_from([4, 5, 6]))
def test_a_family_certifies_at_least_each_of_its_weight_classes(tokens, N):
    X = every_triple_family(tokens, N)
    rank, cert = certify(X, return_certificate=True)
    assert verify_certificate(cert, X)
    for name, pool in weight_classes(tokens):
        sub = restricted(X, pool)
        if sub is None or len(pool) == len(tokens):
            continue
        sub_rank = certify(sub)
        event(f"{name} certifies {'less' if sub_rank < rank else 'as much'}")
        assert rank >= sub_rank, name


@pytest.mark.parametrize("query, positional", [("all", False), ("last", False),
                                               ("last", True)])
@settings(max_examples=40, **SETTINGS)
@given(data=st.data())
def test_any_pool_where_the_search_is_exhaustive(query, positional, data):
    """At most 8 tokens: at most 64 candidates, which the exhaustive search takes
    whole, so it finds the optimum and no pool of the tokens certifies more."""
    X = data.draw(pool_families(n_bits=(4, 5, 6), n_tokens=(3, MAX_EXACT_TOKENS),
                                query="first" if query == "all" else "last"))
    tokens = family_tokens(X)
    assert len(tokens) ** 2 <= EXACT_MAX_CANDIDATES
    keep = data.draw(st.lists(st.booleans(), min_size=len(tokens), max_size=len(tokens)))
    sub = restricted(X, tokens[np.array(keep, dtype=bool)])
    rank, cert = certify(X, query=query, positional=positional, return_certificate=True)
    assert cert.exhaustive
    if sub is not None:
        sub_rank = certify(sub, query=query, positional=positional)
        event(f"pool certifies {'less' if sub_rank < rank else 'as much'}")
        assert rank >= sub_rank


def test_a_compact_family_and_its_sequences_certify_the_same_through_a_pool():
    """The weight-3 layer with the eight tokens of :data:`EXTRA`, every R4 triple over
    them at N = 5, as a CompactFamily and materialised: the pool's bound and one
    certificate."""
    X = every_triple_family(_layer_and_extra(), 5)
    compact = certify(X, return_certificate=True)
    array = certify(X.to_sequences(), return_certificate=True)
    assert compact[0] >= 4
    assert compact[1].to_json() == array[1].to_json()
    assert verify_certificate(compact[1], X)
