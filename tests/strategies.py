"""Hypothesis strategies shared by the property tests.

Every strategy draws a *structure* (a pool of tokens, the R4 triples of a family, the
rows kept from a suite, the words and shared rows of a kernel head, a constraint graph)
rather than a seed, so that hypothesis can shrink a failing example to a small family:
few tokens, few triples, few rows dropped or added.

The tests import this module as ``strategies``: ``tests/`` has no ``__init__.py``, and
pytest's default ``prepend`` import mode puts the folder of ``tests/conftest.py`` on
``sys.path`` for every test below it (as it does for each test file's own folder).
"""

from fractions import Fraction

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


# --------------------------------------------------------------------------- tokens
def as_bits(codes, n_bits):
    """``(len(codes), n_bits)`` uint8 rows: the binary digits of the integers ``codes``
    (least significant bit first)."""
    codes = np.asarray(codes, dtype=np.int64).reshape(-1)
    return ((codes[:, None] >> np.arange(n_bits)[None, :]) & 1).astype(np.uint8)


def token_pools(n_bits, *, min_size=1, max_size=8):
    """Distinct tokens of ``n_bits`` bits, as an ``(n, n_bits)`` uint8 array.

    Drawn as distinct integers (their binary digits), so a pool shrinks towards fewer
    tokens with fewer one-bits.
    """
    max_size = min(max_size, 2 ** n_bits)
    return st.lists(st.integers(0, 2 ** n_bits - 1), min_size=min_size, max_size=max_size,
                    unique=True).map(lambda codes: as_bits(codes, n_bits))


@st.composite
def binary_sequences(draw, max_samples=3, max_len=6, max_bits=8, *, n_bits=None):
    """``(X, perm)``: a batch ``X`` of binary sequences, shape ``(n, seq_len, n_bits)``
    (uint8, every entry drawn), and a permutation ``perm`` of its positions.
    ``n_bits`` fixes the token width (else drawn from ``1..max_bits``)."""
    n = draw(st.integers(1, max_samples))
    seq_len = draw(st.integers(1, max_len))
    if n_bits is None:
        n_bits = draw(st.integers(1, max_bits))
    X = draw(hnp.arrays(np.uint8, (n, seq_len, n_bits), elements=st.integers(0, 1)))
    perm = draw(st.permutations(range(seq_len)))
    return X, np.asarray(perm, dtype=int)


def sylvester_code(order):
    """The ``2 * order - 2`` words of the Hadamard code of a Sylvester order (a power of
    two >= 4): the rows of ``H``, the Kronecker power of ``[[1, 1], [1, -1]]``, but the
    all-ones one, and their negations, as ``(1 + h) / 2``. Weight ``order / 2``; two words overlap in
    ``order / 4``, complements in 0. Word ``i + order - 1`` is the complement of word
    ``i``."""
    H = np.array([[1]])
    while len(H) < order:
        H = np.block([[H, H], [H, -H]])
    assert len(H) == order, "a Sylvester order is a power of two"
    rows = np.concatenate([H[1:], -H[1:]])
    return ((1 + rows) // 2).astype(np.uint8)


# --------------------------------------------------------------------------- subsets
@st.composite
def row_prefixes(draw, n_rows, max_toggles=8):
    """A boolean mask over ``n_rows`` rows: the first ``k`` of them (``k`` drawn), with a
    few rows toggled. Shrinks towards fewer rows (a smaller ``k``, no toggles)."""
    keep = np.arange(n_rows) < draw(st.integers(0, n_rows))
    if n_rows:
        toggled = draw(st.lists(st.integers(0, n_rows - 1), max_size=max_toggles, unique=True))
        keep[toggled] = ~keep[toggled]
    return keep


@st.composite
def row_subsets(draw, n_rows, groups=None, max_dropped=8):
    """A boolean mask over ``n_rows`` rows: :func:`row_prefixes` of the rows, or with
    ``groups`` (a label per row, e.g. the query) of the groups (in ``np.unique`` order),
    less a few single rows.

    Shrinks towards keeping fewer rows: the smallest sub-family that still fails.
    """
    if groups is None:
        keep = draw(row_prefixes(n_rows))
    else:
        labels = np.unique(groups)
        keep = np.isin(groups, labels[draw(row_prefixes(len(labels)))])
    if n_rows:
        keep[draw(st.lists(st.integers(0, n_rows - 1), max_size=max_dropped))] = False
    return keep


@st.composite
def row_orders(draw, n_rows):
    """An order of ``n_rows`` rows: reversed or not, rotated, a few rows moved first."""
    order = np.arange(n_rows)
    if n_rows == 0:
        return order
    if draw(st.booleans()):
        order = order[::-1]
    order = np.roll(order, draw(st.integers(0, n_rows - 1)))
    first = draw(st.lists(st.integers(0, n_rows - 1), max_size=4, unique=True))
    return np.concatenate([order[first], np.delete(order, first)]) if first else order


@st.composite
def position_orders(draw, n_rows, seq_len):
    """``(n_rows, seq_len)`` permutations of positions: one drawn for every row, then a
    few rows permuted again on their own."""
    common = np.asarray(draw(st.permutations(range(seq_len))), dtype=np.int64)
    perms = np.tile(common, (n_rows, 1))
    if n_rows:
        own = draw(st.dictionaries(st.integers(0, n_rows - 1),
                                   st.permutations(range(seq_len)), max_size=6))
        for row, p in own.items():
            perms[row] = common[list(p)]
    return perms


@st.composite
def damaged_families(draw, bases, max_duplicates=10, max_noise=20):
    """A family drawn from ``bases`` (a strategy of ``(n, N, m)`` binary arrays), damaged
    the ways a stranger's file could be: rows dropped (whole queries and single rows,
    :func:`row_subsets`), some ``S3 = (x, a, b, ..., b)`` rewritten as
    ``(x, a, a, b, ..., b)`` (N >= 4), rows duplicated, sequences over its tokens added,
    positions and rows reordered."""
    base = draw(bases)
    n, N, m = base.shape
    _, query = np.unique(base[:, 0], axis=0, return_inverse=True)
    X = base[draw(row_subsets(n, query.reshape(-1)))]
    if not len(X):
        X = base[:3]
    X = X.copy()
    s3 = np.flatnonzero(~(X[:, 1] == X[:, 2]).all(1) & (X[:, 2] == X[:, -1]).all(1))
    if N >= 4 and len(s3):
        if draw(st.sampled_from([False, False, False, True])):
            rewrite = s3                                # every S3
        else:
            rewrite = draw(st.lists(st.sampled_from(s3), max_size=10, unique=True))
        X[rewrite, 2] = X[rewrite, 1]
    duplicates = draw(st.lists(st.integers(0, len(X) - 1), max_size=max_duplicates))
    tokens = np.unique(X.reshape(-1, m), axis=0)
    noise = draw(st.lists(st.lists(st.integers(0, len(tokens) - 1), min_size=N, max_size=N),
                          max_size=max_noise))
    X = np.concatenate([X, X[duplicates], tokens[np.array(noise, dtype=np.int64)
                                                 .reshape(-1, N)]])
    X = np.take_along_axis(X, draw(position_orders(len(X), N))[:, :, None], axis=1)
    return X[draw(row_orders(len(X)))]


# --------------------------------------------------------------------------- R4 triples
def _triples(tokens, min_gap=2):
    """``(every, far, mutual)``: the triples ``(x, y, z)`` of token indices with
    ``y != z``; those whose gap ``<x, z> - <x, y>`` is at least ``min_gap`` (they can
    constrain a head, R4); and the far triples with a query ``u`` for which
    ``(u; z, y)`` is far too (then ``x`` and ``u`` bound each other, R5), as
    ``(x, y, z, u)``."""
    T = len(tokens)
    ov = tokens.astype(np.int64) @ tokens.T.astype(np.int64)
    x, y, z = np.meshgrid(*[np.arange(T)] * 3, indexing="ij")
    x, y, z = (a[y != z] for a in (x, y, z))
    gap = ov[x, z] - ov[x, y]
    every = list(zip(x.tolist(), y.tolist(), z.tolist()))
    far = [t for t, g in zip(every, gap) if g >= min_gap]
    back = (ov[:, y] - ov[:, z] >= min_gap) & (gap >= min_gap)[None, :]   # back[u, t]
    mutual = [(*every[t], u) for u, t in zip(*np.nonzero(back))]
    return every, far, mutual


_PRESENT = st.sampled_from([True, True, True, False])   # mostly there; shrinks to there


@st.composite
def triple_families(draw, tokens, seq_len, *, query="first", min_triples=0, max_triples=6,
                    max_noise=4):
    """Token-index sequences ``(n, seq_len)`` over ``tokens`` holding R4 triples.

    Each triple ``(x; y, z)`` is drawn among those of gap ``<x, z> - <x, y> >= 2`` when
    there are any, often with a mirror triple ``(u; z, y)`` of another query (then ``x``
    and ``u`` bound each other, R5). For each, the family holds, each present or not
    (mostly present), ``S1 = (x, y^(N-1))`` and ``S2 = (x, z^(N-1))``, and
    ``S3 = (x, y, z^(N-2))`` in some arrangements of its keys (``y`` at key position
    ``p``: one drawn position for ``query="first"``; for ``"last"``, every position, or
    every position but a drawn non-empty set of them); plus a few sequences over one to three of the tokens.
    ``query="first"`` puts ``x`` first, ``"last"`` last. ``min_triples..max_triples``
    triples (a mirror counts with its triple). Rows are distinct, sorted.
    """
    N = seq_len
    T = len(tokens)
    every, far, mutual = _triples(tokens)
    rows = set()

    def seq(x, keys):
        return (x, *keys) if query == "first" else (*keys, x)

    triples = []
    for _ in range(draw(st.integers(min_triples, max_triples))):
        if mutual and draw(st.booleans()):
            x, y, z, u = draw(st.sampled_from(mutual))
            triples += [(x, y, z), (u, z, y)]
        else:
            triples.append(draw(st.sampled_from(far or every or [(0, 0, 0)])))
    for x, y, z in triples:
        for key in (y, z):
            if draw(_PRESENT):
                rows.add(seq(x, (key,) * (N - 1)))
        if query == "first":
            positions = [draw(st.integers(0, N - 2))]
        elif draw(st.booleans()):
            # some orders missing: the triple holds for position-free heads only
            positions = set(range(N - 1)) - draw(st.sets(st.integers(0, N - 2), min_size=1))
        else:
            positions = range(N - 1)
        for p in positions:
            rows.add(seq(x, (z,) * p + (y,) + (z,) * (N - 2 - p)))
    for _ in range(draw(st.integers(0, max_noise))):
        few = draw(st.lists(st.integers(0, T - 1), min_size=1, max_size=3, unique=True))
        rows.add(tuple(draw(st.lists(st.sampled_from(few), min_size=N, max_size=N))))
    if not rows:
        rows.add((0,) * N)
    return np.array(sorted(rows), dtype=np.int64).reshape(-1, N)


@st.composite
def pool_families(draw, n_bits=(4, 5, 6), n_tokens=(3, 6), seq_lens=(3, 4, 5), *,
                  query="first", max_triples=6):
    """A binary family ``(n, N, m)`` of :func:`triple_families` over a pool of
    ``n_tokens[0]..n_tokens[1]`` distinct tokens of ``m`` bits (``m`` drawn from
    ``n_bits``, ``N`` from ``seq_lens``)."""
    m = draw(st.sampled_from(n_bits))
    N = draw(st.sampled_from(seq_lens))
    pool = draw(token_pools(m, min_size=n_tokens[0], max_size=n_tokens[1]))
    return pool[draw(triple_families(pool, N, query=query, min_triples=1,
                                     max_triples=max_triples))]


@st.composite
def nested_families(draw, n_bits, seq_lens, *, query="first", max_tokens=8, max_triples=8):
    """``(sub, sup)``: a family of :func:`triple_families` over a drawn pool of tokens of
    ``n_bits`` bits (an int, or a list to draw from), ``seq_len`` drawn from ``seq_lens``,
    and a superset of it (more triples and sequences over the same pool), as binary
    arrays.

    ``query="first"``: every position of ``sup`` reordered (the multisets are kept);
    ``"last"``: ``sup`` also holds a copy of its rows with the first ``N - 1`` positions
    reordered (the final query kept).
    """
    N = draw(st.sampled_from(seq_lens))
    if not isinstance(n_bits, int):
        n_bits = draw(st.sampled_from(n_bits))
    pool = draw(token_pools(n_bits, min_size=3, max_size=max_tokens))
    sub = draw(triple_families(pool, N, query=query, max_triples=max_triples))
    extra = draw(triple_families(pool, N, query=query, max_triples=max_triples))
    sup = np.concatenate([sub, extra])
    if query == "first":
        sup = np.take_along_axis(sup, draw(position_orders(len(sup), N)), axis=1)
    else:
        prefix = np.take_along_axis(sup[:, :-1], draw(position_orders(len(sup), N - 1)),
                                    axis=1)
        sup = np.concatenate([sup, np.concatenate([prefix, sup[:, -1:]], axis=1)])
    sup = sup[draw(row_orders(len(sup)))]
    return pool[sub], pool[sup]


@st.composite
def sub_families(draw, build, *, query_position=0):
    """A part of the family ``build()`` (a cached builder of an ``(n, N, m)`` array):
    :func:`row_subsets` grouped by the query (the token at ``query_position``)."""
    X = build()
    _, query = np.unique(X[:, query_position], axis=0, return_inverse=True)
    return X[draw(row_subsets(len(X), query.reshape(-1)))]


# --------------------------------------------------------------------------- kernel heads
@st.composite
def shared_row_heads(draw, orders=(8, 16), max_pairs=5):
    """A family and the kernel head of (R3) on a sub-pool of its tokens, near the
    boundary of the certified rank.

    The sub-pool ``P`` is a set of complement pairs of a Sylvester Hadamard code (so each
    word's key ``~x`` is in ``P``), with one padding bit (0). Every token ``t`` of the
    family uses the kernel row of a token ``c(t)`` of ``P``,
    ``alpha(t, z) = exp(-beta <c(t), z>)``: ``c(x) = x`` on ``P`` (the exact head of R3)
    but for a few words merged into another's row; a few *twins* (a word of ``P`` with
    the padding bit set, its row) and a few other code words (a drawn row) join them.
    The head's rank is the number of distinct rows ``c(t)``.

    Candidate sequences: for every query ``q`` (a word ``x`` of ``P``, or a twin of
    ``x``) and every other word ``y`` of ``P``, but a drawn set of pairs left out, the R4
    sequences ``(q, k_x^(N-1))``, ``(q, k_y^(N-1))``, ``(q, k_x, k_y^(N-2))`` with
    ``k_x = ~x``; a few sequences over every token; every sequence in one drawn order of
    positions. The test keeps those the head solves.

    Returns a dict: ``tokens`` ``(T, order + 1)`` uint8 (``P`` first, its words in pairs
    ``2a, 2a + 1``), ``n_pool`` (``|P|``), ``centre`` (``c`` as indices into ``tokens``),
    ``beta`` (from half to four times the ``2(N-1)/e`` of R2), ``seq_len``, ``rows``
    (candidate token-index sequences).
    """
    order = draw(st.sampled_from(orders))
    W = sylvester_code(order)
    h = order - 1                               # word i + h is the complement of word i
    n_pairs = draw(st.integers(1, min(max_pairs, h)))
    pairs = draw(st.lists(st.integers(0, h - 1), min_size=n_pairs, max_size=n_pairs,
                          unique=True))
    words = [w for a in pairs for w in (a, a + h)]
    n_pool = len(words)
    key = np.arange(n_pool) ^ 1                 # pool index of ~x
    others = [w for w in range(len(W)) if w not in words]
    extra = draw(st.lists(st.sampled_from(others), max_size=2, unique=True))
    twins = draw(st.lists(st.integers(0, n_pool - 1), max_size=3, unique=True))
    pad = np.zeros((len(W), 1), dtype=np.uint8)
    tokens = np.concatenate([
        np.concatenate([W, pad], axis=1)[words + extra],
        np.concatenate([W[words][twins], np.ones((len(twins), 1), dtype=np.uint8)], axis=1),
    ]) if twins else np.concatenate([W, pad], axis=1)[words + extra]
    T = len(tokens)
    merged = draw(st.dictionaries(st.integers(0, n_pool - 1), st.integers(0, n_pool - 1),
                                  max_size=2))
    centre = np.concatenate([
        [merged.get(i, i) for i in range(n_pool)],
        [draw(st.integers(0, n_pool - 1)) for _ in extra],
        twins,
    ]).astype(np.int64)
    N = draw(st.integers(3, n_pool + 3))
    # R2: beta > 2(N-1)/e makes an own row exact; below it, some sequences fail
    beta = 2 * (N - 1) / np.e * draw(st.floats(0.5, 4.0))
    left_out = draw(st.sets(st.tuples(st.integers(0, T - 1), st.integers(0, n_pool - 1)),
                            max_size=4))
    queries = [(i, i) for i in range(n_pool)]
    queries += [(n_pool + len(extra) + t, w) for t, w in enumerate(twins)]
    rows = []
    for q, w in queries:                        # query token q, its word w in P
        for j in range(n_pool):
            if j == w or (q, j) in left_out:
                continue
            rows += [(q,) + (key[w],) * (N - 1), (q,) + (key[j],) * (N - 1),
                     (q, key[w]) + (key[j],) * (N - 2)]
    rows += draw(st.lists(st.lists(st.integers(0, T - 1), min_size=N, max_size=N),
                          max_size=3))
    perm = np.asarray(draw(st.permutations(range(N))), dtype=np.int64)
    rows = np.unique(np.array(rows, dtype=np.int64).reshape(-1, N), axis=0)[:, perm]
    return dict(tokens=tokens, n_pool=n_pool, centre=centre, beta=beta, seq_len=N,
                rows=rows)


# --------------------------------------------------------------------------- R5
@st.composite
def constraint_graphs(draw, denominators, max_vertices=9):
    """``(A, Kinv)``: a symmetric constraint graph on 2..``max_vertices`` queries (the
    complete graph but a drawn set of edges) and an exact ratio bound ``1/K`` on each
    directed edge, ``K`` drawn from ``denominators``."""
    V = draw(st.integers(2, max_vertices))
    A = ~np.eye(V, dtype=bool)
    for u, w in draw(st.sets(st.tuples(st.integers(0, V - 1), st.integers(0, V - 1)),
                             max_size=V * (V - 1) // 2)):
        A[u, w] = A[w, u] = False
    K = draw(hnp.arrays(np.int64, (V, V), elements=st.sampled_from(denominators)))
    Kinv = {u: {int(w): Fraction(1, int(K[u, w])) for w in np.flatnonzero(A[u])}
            for u in range(V)}
    return A, Kinv


@st.composite
def approximate_identities(draw, max_n=10, max_entry=4, max_denominator=12):
    """``(B, eps, r)``: the table of a nonnegative kernel of rank at most ``r`` between
    ``n`` queries and their keys, rescaled to a unit diagonal, and the tightest bounds
    above it on a grid of step ``1/D``, all exact (Fractions).

    ``B_ij = <u_i, v_j> / <u_i, v_i>`` for integer feature tables ``U, V >= 0`` of shape
    ``(n, r)`` (entries ``0..max_entry``, plus 1 at feature ``i mod r`` of query and key
    ``i``, so that ``<u_i, v_i> > 0``), so ``rank(B) <= r``; ``eps_ij = (floor(D B_ij) + 1) / D`` with ``D`` drawn from
    ``1..max_denominator``, so that ``B_ij < eps_ij <= B_ij + 1/D``. Shrinks towards
    small tables of small integers.
    """
    n = draw(st.integers(1, max_n))
    r = draw(st.integers(1, n))
    U = draw(hnp.arrays(np.int64, (n, r), elements=st.integers(0, max_entry)))
    V = draw(hnp.arrays(np.int64, (n, r), elements=st.integers(0, max_entry)))
    U[np.arange(n), np.arange(n) % r] += 1         # feature i mod r: alpha(x_i, k_i) > 0
    V[np.arange(n), np.arange(n) % r] += 1
    G = U @ V.T
    D = draw(st.integers(1, max_denominator))
    B = np.array([[Fraction(int(g), int(row[i])) for g in row] for i, row in enumerate(G)],
                 dtype=object).reshape(len(G), len(G))
    eps = np.array([[Fraction(int(b * D) + 1, D) for b in row] for row in B],
                   dtype=object).reshape(B.shape)
    return B, eps, r
