"""Witness designs: the certified bound of a family computed from its parameters.

A *witness design* (see the theory page, :ref:`theory-witness`) takes queries ``x_1..x_n`` from a constant-weight code,
keys ``k_i = ~x_i`` (overlap 0 with ``x_i``; ``d_ij = |x_i| - <x_i, x_j>`` with the
other queries), and for each query the sequences

* ``S1(x_i, t) = (x_i, t, ..., t)`` for ``t`` = ``k_i``, every ladder token and every
  other key ``k_j``;
* ``S3(x_i, a, b) = (x_i, a, b, ..., b)`` for each ladder step and, for every
  ``j != i``, from the ladder token ``w_{i,t_ij}`` (``w_{i,0} = k_i``) to ``k_j``.

The ladder ``w_{i,t} = k_i`` plus the first ``t * gap`` one-bits of ``x_i`` climbs the
overlap with ``x_i`` in steps of ``gap`` (chains of :ref:`theory-r4`: a gap of about 4-5 per
step decays fastest), so the pair ``(i, j)`` gets the ratio bound ``1/K_ij`` with

    ``K_ij = ((N-2)(gap-1))^t * (N-2)(d_ij - t*gap - 1)``

for the best ``t`` (:func:`chain_denominator`). The rank then follows from the same
R5 function :func:`~minip_learn.theory.certify` applies (:func:`design_rank`), so the
bound computed here equals what ``certify`` recomputes from the materialised family
(:func:`witness_family`) whenever no query token doubles as a key or ladder token
(``exact`` designs: padding bits or half codes); otherwise ``certify`` may find extra
chains and the design bound is a lower bound of it. :func:`bound_table` tabulates the
best design bound over sizes, including products whose number of blocks grows with
``n_bits`` (:ref:`theory-exponential`), and recomputes the bound with ``certify`` from
the families that fit a budget.
"""

import functools
import itertools
import math
from fractions import Fraction

import numpy as np

from .._validation import check_int, distinct_tokens
from ..compact import CompactFamily
from ._selection import prune_rows, reciprocal
from .bounds import rank_from_denominators, rank_from_sums, resolve_near_integer
from .certify import certify
from .codes import hadamard_orders, product_code

__all__ = []  # public home: the package minip_learn.theory

#: ladder gaps tried when a design chooses its own (None = a single step)
LADDER_GAPS = (None, 2, 3, 4, 5, 6, 7, 8)


def chain_denominator(distance, seq_len, *, ladder_gap=None, max_steps=None):
    """Best chained ratio bound ``1/K`` over an overlap distance (:ref:`theory-r4`).

    Parameters
    ----------
    distance : int
        Overlap distance ``d = <x, k_j> - <x, k_i>`` to climb.
    seq_len : int
        ``N >= 3``.
    ladder_gap : int or None, default=None
        Gap of each ladder step (``>= 2``); None means a single step of gap ``d``.
    max_steps : int or None, default=None
        Most ladder steps before the last one (None: as many as fit).

    Returns
    -------
    K : int
        The integer with ``alpha(x, k_j) / alpha(x, k_i) < 1/K``; 0 when ``d < 2``
        (the pair is not constrained).
    steps : int
        Ladder steps ``t`` used before the final step.

    Examples
    --------
    >>> from minip_learn.theory import chain_denominator
    >>> chain_denominator(6, 3)
    (5, 0)
    >>> chain_denominator(16, 3, ladder_gap=4)   # 4 steps of gap 4: 3**4
    (81, 3)
    """
    d = int(distance)
    N = check_int(seq_len, "seq_len", min_value=3)
    if d < 2:
        return 0, 0
    if ladder_gap is None or max_steps == 0:
        return (N - 2) * (d - 1), 0
    g = check_int(ladder_gap, "ladder_gap", min_value=2)
    step = (N - 2) * (g - 1)
    best, best_t = 0, 0
    t = 0
    while d - t * g >= 2 and (max_steps is None or t <= max_steps):
        K = step ** t * (N - 2) * (d - t * g - 1)
        if K > best:
            best, best_t = K, t
        t += 1
    return best, best_t


def witness_denominators(words, seq_len, *, ladder_gap=None):
    """Designed ratio bounds of a witness family built on ``words``.

    Parameters
    ----------
    words : array-like of shape (n, n_bits)
        Queries (binary); keys are their complements.
    seq_len : int
        ``N >= 3``.
    ladder_gap : int or None, default=None
        Ladder step (None: single steps only).

    Returns
    -------
    K : ndarray of shape (n, n), dtype object
        ``K[i, j]`` (diagonal 1).
    steps : ndarray of shape (n, n), dtype int64
        Ladder steps ``t_ij`` before the last step to ``k_j``.
    distance : ndarray of shape (n, n), dtype int64
        ``d_ij = |x_i| - <x_i, x_j>``.

    Raises
    ------
    ValueError
        If two queries are closer than distance 2 (their pair is unconstrained).

    Examples
    --------
    >>> from minip_learn.theory import hadamard_code, witness_denominators
    >>> K, steps, dist = witness_denominators(hadamard_code(8), seq_len=5)
    >>> int(K[0, 1]), int(dist[0, 1])  # eps = 1/((N-2)(g-1)) = 1/3 at distance 2
    (3, 2)
    """
    W = np.asarray(words).astype(np.float64)
    n = len(W)
    G = np.rint(W @ W.T).astype(np.int64)   # exact: entries are at most n_bits
    dist = G.diagonal()[:, None] - G
    del G
    off = ~np.eye(n, dtype=bool)
    # distances are small integers: their distinct values by counting, not sorting
    lo = int(dist.min()) if n else 0
    present = np.bincount((dist - lo).ravel()) > 0
    values = np.flatnonzero(present) + lo
    inverse = (np.cumsum(present) - 1)[dist - lo]
    table = [chain_denominator(int(d), seq_len, ladder_gap=ladder_gap) for d in values]
    Ks = np.array([k for k, _ in table], dtype=object)
    ts = np.array([t for _, t in table], dtype=np.int64)
    K = Ks[inverse]
    steps = np.where(off, ts[inverse], 0)
    K[~off] = 1
    bad = off & np.array([k == 0 for k in Ks], dtype=bool)[inverse]
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(
            f"queries {i} and {j} differ in only {int(dist[i, j])} position(s) of the "
            "support: a witness pair needs overlap distance >= 2."
        )
    return K, steps, dist


def _family_size(n, ladder_lengths):
    return int(n * (2 * n - 1) + 2 * int(np.sum(ladder_lengths)))


def design_rank(K):
    """Certified rank from designed denominators, as :func:`certify` selects rows.

    Rows are dropped while that improves the R5 value (:ref:`theory-r5`), exactly
    the pruning :func:`~minip_learn.theory.certify` applies to the pairs it selects.

    Parameters
    ----------
    K : array-like of shape (n, n)
        Integer denominators ``K[i, j] >= 1`` (``eps_ij = 1/K[i, j]``; the diagonal is
        ignored).

    Returns
    -------
    rank : int

    Examples
    --------
    >>> from minip_learn.theory import design_rank, hadamard_code, witness_denominators
    >>> K, _, _ = witness_denominators(hadamard_code(24), 3)
    >>> design_rank(K)
    17
    """
    K = np.asarray(K, dtype=object)
    n = len(K)
    if n < 2:
        return 1
    keep = prune_rows(K)
    return int(rank_from_denominators(K[np.ix_(keep, keep)])[0])


def witness_bound(words, seq_len, *, ladder_gap=None):
    """Certified minimum rank of the witness family on ``words`` (from its design).

    Applies to the designed ratio bounds (:func:`witness_denominators`) exactly the
    pruning and R5 computation of :func:`~minip_learn.theory.certify`
    (:func:`design_rank`).

    Parameters
    ----------
    words : array-like of shape (n, n_bits)
        Queries; keys are their complements.
    seq_len : int
        ``N >= 3``.
    ladder_gap : int or None, default=None
        Ladder step; None uses single steps.

    Returns
    -------
    rank : int
    n_sequences : int
        Size of the materialised family.

    Examples
    --------
    >>> from minip_learn.theory import hadamard_code, witness_bound
    >>> witness_bound(hadamard_code(24), 3)     # the R6 family
    (17, 4186)
    """
    K, steps, _ = witness_denominators(words, seq_len, ladder_gap=ladder_gap)
    n = len(K)
    return design_rank(K), _family_size(n, steps.max(axis=1) if n else 0)


def witness_family(words, seq_len, *, ladder_gap=None, steps=None, compact=False):
    """The sequences of the witness family on ``words`` (:ref:`theory-witness`).

    For each query ``x_i`` (key ``k_i = ~x_i``, ladder ``w_(i,t)`` = ``k_i`` plus the
    first ``t * ladder_gap`` one-bits of ``x_i``, ``w_(i,0) = k_i``), in this order:
    ``S1(x_i, k_i)``; for every ``j != i``, ``S1(x_i, k_j)`` and
    ``S3(x_i, w_(i,t_ij), k_j)``; then for every ladder step ``t``, ``S1(x_i, w_(i,t))``
    and ``S3(x_i, w_(i,t-1), w_(i,t))``; where ``S1(x, a) = (x, a, ..., a)`` and
    ``S3(x, a, b) = (x, a, b, ..., b)``. Built in multiset form with array operations
    (no loop over sequences); a token that occurs in several roles of a sequence (a
    key equal to the query, say) has its multiplicities merged.

    Parameters
    ----------
    words : array-like of shape (n, n_bits)
        Queries (binary).
    seq_len : int
        ``N >= 3``.
    ladder_gap : int or None, default=None
        Ladder step (None: single steps).
    steps : array-like of shape (n, n), default=None
        Ladder steps ``t_ij`` before the last step to ``k_j``; default: those of
        :func:`witness_denominators`.
    compact : bool, default=False
        Return the :class:`~minip_learn.compact.CompactFamily` (tokens in
        ``np.unique`` order) instead of the materialised sequences.

    Returns
    -------
    X : ndarray of shape (n_sequences, seq_len, n_bits), dtype uint8, or CompactFamily

    Examples
    --------
    >>> from minip_learn.theory import certify, hadamard_code, witness_family
    >>> X = witness_family(hadamard_code(24), 3)
    >>> X.shape, certify(X)
    ((4186, 3, 24), 17)
    >>> witness_family(hadamard_code(24), 40, compact=True)
    CompactFamily(n_sequences=4186, seq_len=40, n_bits=24, n_tokens=46, n_slots=3)
    """
    W = np.asarray(words).astype(np.uint8)
    N = check_int(seq_len, "seq_len", min_value=3)
    n, m = W.shape
    if steps is None:
        _, steps, _ = witness_denominators(W, N, ladder_gap=ladder_gap)
    steps = np.asarray(steps, dtype=np.int64)
    s_i = steps.max(axis=1, initial=0) if n else np.zeros(0, dtype=np.int64)
    L = int(s_i.max(initial=0))
    # ladder[i, t]: k_i plus the first t * gap one-bits of x_i (t = 0: the key k_i)
    ladder = np.repeat((1 - W)[:, None, :], L + 1, axis=1)
    if L:
        rank_of_one = np.cumsum(W, axis=1) * W          # 1-based position among ones
        for t in range(1, L + 1):
            ladder[:, t][(rank_of_one >= 1) & (rank_of_one <= t * ladder_gap)] = 1
    # token rows: the queries, then ladder[i, t] at n + i * (L + 1) + t
    tokens, inv = distinct_tokens(np.concatenate([W, ladder.reshape(-1, m)]),
                                  return_inverse=True)
    query = inv[:n]
    rung = inv[n:].reshape(n, L + 1)
    ii, jj = np.nonzero(~np.eye(n, dtype=bool))
    qi = np.repeat(np.arange(n), s_i)
    t = np.arange(len(qi)) - np.repeat(np.cumsum(s_i) - s_i, s_i) + 1
    # rows (query, a, b) with counts (1, 1, N-2); S1 rows have a == b: (1, N-1) merged
    parts = [
        (np.arange(n), rung[:, 0], rung[:, 0], 0),
        (ii, rung[jj, 0], rung[jj, 0], 1 + 2 * (jj - (jj > ii))),
        (ii, rung[ii, steps[ii, jj]], rung[jj, 0], 2 + 2 * (jj - (jj > ii))),
        (qi, rung[qi, t], rung[qi, t], 2 * (n - 1) + 1 + 2 * (t - 1)),
        (qi, rung[qi, t - 1], rung[qi, t], 2 * (n - 1) + 2 + 2 * (t - 1)),
    ]
    per_query = 1 + 2 * (n - 1) + 2 * s_i
    start = np.cumsum(per_query) - per_query
    ids = np.empty((int(per_query.sum()), 3), dtype=np.int64)
    for i, a, b, offset in parts:
        ids[start[i] + offset] = np.stack([query[i], a, b], axis=1)
    # keep the tokens that occur: query i climbs its ladder only to its own s_i <= L
    used = np.unique(ids)
    if len(used) < len(tokens):
        remap = np.full(len(tokens), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        tokens, ids = tokens[used], remap[ids]
    counts = np.broadcast_to(np.array([1, 1, N - 2]), ids.shape)
    family = CompactFamily.from_slots(tokens, ids, counts)
    return family if compact else family.to_sequences()


# ---------------------------------------------------------------------------------
# product codes, analytically
# ---------------------------------------------------------------------------------
def _product_histogram(blocks):
    """Per-row histogram ``{d: count}`` of ``d_ij`` for a product of Hadamard codes."""
    hist = {0: 1}
    for h, half in blocks:
        opts = {0: 1, h // 4: (h - 2) if half else (2 * h - 4)}
        if not half:
            opts[h // 2] = opts.get(h // 2, 0) + 1
        new = {}
        for d1, c1 in hist.items():
            for d2, c2 in opts.items():
                new[d1 + d2] = new.get(d1 + d2, 0) + c1 * c2
        hist = new
    hist[0] -= 1
    return {d: c for d, c in hist.items() if c}


@functools.lru_cache(maxsize=65536)
def _chain_K(d, seq_len, ladder_gap):
    K, t = chain_denominator(d, seq_len, ladder_gap=ladder_gap)
    return K, t, reciprocal(K) if K else 0.0


def _histogram_sums(hist, seq_len, ladder_gap, exact):
    num = Fraction if exact else float
    sum_sq, row, steps = num(0), num(0), 0
    for d, c in hist.items():
        K, t, inv = _chain_K(d, seq_len, ladder_gap)
        if K == 0:
            return None
        if exact:
            sum_sq += Fraction(c, K * K)
            row += Fraction(c, K)
        else:
            sum_sq += c * inv * inv
            row += c * inv
        if t > steps:
            steps = t
    return sum_sq, row, steps


def product_code_bound(blocks, seq_len, *, ladder_gap=None, n_bits=None):
    """Certified rank of the witness family on a product code, without building it.

    Every row of a product of Hadamard codes has the same multiset of distances
    ``d_ij``, so the R5 sums follow from one row's histogram; dropping rows never
    helps then, and the result equals :func:`witness_bound` on the materialised code.

    Parameters
    ----------
    blocks : sequence of (order, half) pairs
        See :func:`~minip_learn.theory.product_code`.
    seq_len : int
        ``N >= 3``.
    ladder_gap : int or None, default=None
    n_bits : int, default=None
        Token length (default: the sum of the orders); padding bits make the design
        exact.

    Returns
    -------
    result : dict
        ``rank``, ``n_queries``, ``n_sequences``, ``ladder_steps``, ``exact`` (whether
        ``certify`` on the family returns exactly ``rank``; otherwise it returns at
        least ``rank``) and ``frobenius_value`` (float).

    Examples
    --------
    >>> from minip_learn.theory import product_code_bound
    >>> product_code_bound([(24, False)], 3)["rank"]
    17
    >>> r = product_code_bound([(32, False), (32, False)], 3, ladder_gap=4)
    >>> r["rank"], r["n_queries"]
    (1269, 3844)
    """
    blocks = [(check_int(h, "order", min_value=4), bool(half)) for h, half in blocks]
    if not blocks:
        raise ValueError("blocks must hold at least one (order, half) pair.")
    N = check_int(seq_len, "seq_len", min_value=3)
    total = sum(h for h, _ in blocks)
    n_bits = total if n_bits is None else check_int(n_bits, "n_bits", min_value=total)
    n = math.prod((h - 1) if half else (2 * h - 2) for h, half in blocks)
    hist = _product_histogram(blocks)
    sums = _histogram_sums(hist, N, ladder_gap, exact=True)
    if sums is None:
        raise ValueError(
            f"blocks {blocks} give queries at overlap distance < 2: some pairs are "
            "unconstrained; use Hadamard orders >= 8."
        )
    sum_sq, row, steps = sums
    rank, value, _ = rank_from_sums(n, n * sum_sq, row, row)
    exact = n_bits > total or any(half for _, half in blocks)
    return dict(
        rank=int(rank), n_queries=n, n_sequences=int(n * (2 * n - 1 + 2 * steps)),
        ladder_steps=steps, exact=exact, frobenius_value=float(value),
    )


def block_designs(n_bits, *, max_blocks=4):
    """Products of Hadamard codes that fit ``n_bits`` (candidate witness designs).

    Every multiset of one to ``max_blocks`` constructible orders ``>= 8`` whose sum is
    at most ``n_bits``, and, for every order ``b``, the product of ``n_bits // b``
    blocks of order ``b`` whatever ``max_blocks`` is: the designs whose number of
    blocks grows with ``n_bits`` (:ref:`theory-exponential`). A design without
    padding bits also comes with one half block (no query is another's key: an
    exact design).

    Parameters
    ----------
    n_bits : int
    max_blocks : int, default=4
        Most blocks of the mixed products.

    Returns
    -------
    designs : list of tuple of (order, half)

    Examples
    --------
    >>> from minip_learn.theory import block_designs, describe_blocks
    >>> designs = block_designs(16)
    >>> designs[:3]
    [((8, False),), ((8, False), (8, False)), ((8, True), (8, False))]
    >>> for b in block_designs(64, max_blocks=1)[:5]:
    ...     print(describe_blocks(b, 64))
    H8 + 56 pad
    H8 x H8 x H8 x H8 x H8 x H8 x H8 x H8
    H8/2 x H8 x H8 x H8 x H8 x H8 x H8 x H8
    H12 + 52 pad
    H12 x H12 x H12 x H12 x H12 + 4 pad
    """
    n_bits = check_int(n_bits, "n_bits", min_value=1)
    max_blocks = check_int(max_blocks, "max_blocks", min_value=1)
    orders = [h for h in hadamard_orders(n_bits) if h >= 8]

    def rec(start, remaining, depth):
        yield ()
        if depth == 0:
            return
        for k in range(start, len(orders)):
            h = orders[k]
            if h > remaining:
                break
            for rest in rec(k, remaining - h, depth - 1):
                yield (h,) + rest

    combos = {c for c in rec(0, n_bits, max_blocks) if c}
    combos |= {(h,) * (n_bits // h) for h in orders}
    out = []
    for combo in sorted(combos):
        out.append(tuple((h, False) for h in combo))
        if sum(combo) == n_bits:   # no padding bit: one half block makes it exact
            for h in sorted(set(combo)):
                i = combo.index(h)
                out.append(tuple((g, k == i) for k, g in enumerate(combo)))
    return out


def _n_queries(blocks):
    return math.prod((h - 1) if half else (2 * h - 2) for h, half in blocks)


def _best_design(n_bits, seq_len, max_blocks, exact_only):
    scored = []
    for blocks in block_designs(n_bits, max_blocks=max_blocks):
        n = _n_queries(blocks)
        exact = n_bits > sum(h for h, _ in blocks) or any(half for _, half in blocks)
        if exact_only and not exact:
            continue
        hist = _product_histogram(blocks)
        for gap in LADDER_GAPS:
            sums = _histogram_sums(hist, seq_len, gap, exact=False)
            if sums is None:
                continue
            sum_sq, row, steps = sums
            size = n * (2 * n - 1 + 2 * steps)
            dominant = resolve_near_integer(
                row, lambda h=hist, g=gap: _histogram_sums(h, seq_len, g, exact=True)[1]) <= 1
            log_est = math.log(n) if dominant else math.log(n) - math.log1p(sum_sq)
            scored.append((log_est, -size, blocks, gap))
    if not scored:
        return None
    top = max(s[0] for s in scored)
    best = None
    for log_est, _neg_size, blocks, gap in scored:
        if log_est < top - 0.01:
            continue
        r = product_code_bound(blocks, seq_len, ladder_gap=gap, n_bits=n_bits)
        key = (r["rank"], -r["n_sequences"], -len(blocks))
        if best is None or key > best[0]:
            best = (key, blocks, gap, r)
    _, blocks, gap, r = best
    return dict(r, blocks=blocks, ladder_gap=gap)


def describe_blocks(blocks, n_bits):
    """Short name of a product design, e.g. ``"H16 x H16/2 + 1 pad"``.

    Parameters
    ----------
    blocks : sequence of (order, half)
    n_bits : int
        Token length (bits beyond the blocks are padding).

    Returns
    -------
    name : str

    Examples
    --------
    >>> from minip_learn.theory import describe_blocks
    >>> describe_blocks([(16, False), (16, True)], 33)
    'H16 x H16/2 + 1 pad'
    """
    parts = [f"H{h}{'/2' if half else ''}" for h, half in blocks]
    pad = n_bits - sum(h for h, _ in blocks)
    return " x ".join(parts) + (f" + {pad} pad" if pad else "")


COLUMNS = ("n_bits", "seq_len", "certified_min_rank", "bits_per_bit", "construction",
           "n_queries", "ladder_gap", "ladder_steps", "n_sequences", "exact", "materialised")


def bound_table(
    n_bits=range(8, 65, 8), seq_len=range(3, 7), *, max_blocks=4, max_sequences=20000,
    exact_only=False, as_frame=True,
):
    """Best certified minimum rank of the witness designs, over sizes.

    For each ``(n_bits, seq_len)`` the designs on products of Hadamard codes
    (:func:`block_designs`: mixed products of up to ``max_blocks`` blocks, and
    products of ``n_bits // b`` blocks of one order ``b``, padded to ``n_bits``) with
    every ladder gap in ``LADDER_GAPS`` are evaluated analytically
    (:func:`product_code_bound`: the R4 chain denominators and R5 rank function that
    :func:`~minip_learn.theory.certify` applies, computed from one row's distance
    histogram; see :ref:`theory-exponential`), and the best is reported with the
    size of its family. Where that family has at most ``max_sequences`` sequences
    it is built (:func:`witness_family`) and ``certify`` recomputes the bound from
    the sequences: column ``materialised``; elsewhere the row is a calculation and
    ``materialised`` is missing.

    Parameters
    ----------
    n_bits : iterable of int, default=range(8, 65, 8)
    seq_len : iterable of int, default=range(3, 7)
        Values ``>= 3``.
    max_blocks : int, default=4
        Most blocks in a mixed product code.
    max_sequences : int or None, default=20000
        Largest family built and certified for the ``materialised`` column (None or 0:
        none).
    exact_only : bool, default=False
        Only designs whose bound ``certify`` recomputes exactly (no query token is
        also a key); otherwise a design without padding may be reported, whose family
        certifies *at least* the value shown.
    as_frame : bool, default=True
        Return a :class:`pandas.DataFrame`; otherwise a dict of lists.

    Returns
    -------
    table : DataFrame or dict
        Columns ``n_bits, seq_len, certified_min_rank`` (the design bound),
        ``bits_per_bit`` (``log2(certified_min_rank) / n_bits``), ``construction,
        n_queries, ladder_gap, ladder_steps, n_sequences`` (size of the family),
        ``exact`` and ``materialised`` (the bound ``certify`` recomputed from the
        built family, or None).

    Examples
    --------
    >>> from minip_learn.theory import bound_table
    >>> t = bound_table(n_bits=[16, 24, 32], seq_len=[3], as_frame=False)
    >>> t["certified_min_rank"], t["materialised"]
    ([8, 18, 53], [8, None, None])
    """
    rows = {k: [] for k in COLUMNS}
    max_blocks = check_int(max_blocks, "max_blocks", min_value=1)
    max_sequences = check_int(max_sequences, "max_sequences", min_value=0, allow_none=True)
    for m, N in itertools.product(list(n_bits), list(seq_len)):
        m = check_int(m, "n_bits", min_value=1)
        N = check_int(N, "seq_len", min_value=3)
        best = _best_design(m, N, max_blocks, exact_only)
        if best is None:
            best = dict(rank=1, blocks=(), n_queries=0, ladder_gap=None, ladder_steps=0,
                        n_sequences=0, exact=True)
        materialised = None
        if best["blocks"] and max_sequences and best["n_sequences"] <= max_sequences:
            words = product_code(best["blocks"], n_bits=m)
            materialised = certify(witness_family(words, N, ladder_gap=best["ladder_gap"]))
        row = dict(
            n_bits=m, seq_len=N, certified_min_rank=best["rank"],
            bits_per_bit=math.log2(best["rank"]) / m,
            construction=describe_blocks(best["blocks"], m) if best["blocks"] else "none",
            n_queries=best["n_queries"], ladder_gap=best["ladder_gap"],
            ladder_steps=best["ladder_steps"], n_sequences=best["n_sequences"],
            exact=best["exact"], materialised=materialised,
        )
        for k in COLUMNS:
            rows[k].append(row[k])
    if as_frame:
        import pandas as pd

        return pd.DataFrame(rows)
    return rows
