"""Witness designs: the certified bound of a family computed from its parameters.

A *witness design* (THEORY R6) takes queries ``x_1..x_n`` from a constant-weight code,
keys ``k_i = ~x_i`` (overlap 0 with ``x_i``; ``d_ij = |x_i| - <x_i, x_j>`` with the
other queries), and for each query the sequences

* ``S1(x_i, t) = (x_i, t, ..., t)`` for ``t`` = ``k_i``, every ladder token and every
  other key ``k_j``;
* ``S3(x_i, a, b) = (x_i, a, b, ..., b)`` for each ladder step and, for every
  ``j != i``, from the ladder token ``w_{i,t_ij}`` (``w_{i,0} = k_i``) to ``k_j``.

The ladder ``w_{i,t} = k_i`` plus the first ``t * gap`` one-bits of ``x_i`` climbs the
overlap with ``x_i`` in steps of ``gap`` (THEORY R4 chains: a gap of about 4-5 per step
decays fastest), so the pair ``(i, j)`` gets the ratio bound ``1/K_ij`` with

    ``K_ij = ((N-2)(gap-1))^t * (N-2)(d_ij - t*gap - 1)``

for the best ``t`` (:func:`chain_denominator`). The rank then follows from the same
R5 function :func:`~minip_learn.theory.certify` applies, so the bound computed here
equals what ``certify`` recomputes from the materialised family whenever no query
token doubles as a key or ladder token (``exact`` designs: padding bits or half
codes); otherwise ``certify`` may find extra chains and the design bound is a lower
bound of it. :func:`bound_table` tabulates the best design bound over sizes without
materialising the (huge) families.
"""

import itertools
import math
from fractions import Fraction

import numpy as np

from .._validation import check_int
from .bounds import _rank_from_denominators, _rank_from_sums
from .certify import _inv, _prune
from .codes import hadamard_orders

__all__ = [
    "bound_table",
    "chain_denominator",
    "product_code_bound",
    "witness_bound",
    "witness_denominators",
]

#: ladder gaps tried when a design chooses its own (None = a single step)
LADDER_GAPS = (None, 2, 3, 4, 5, 6, 7, 8)


def chain_denominator(distance, seq_len, *, ladder_gap=None, max_steps=None):
    """Best chained ratio bound ``1/K`` over an overlap distance (THEORY R4 chains).

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
    W = np.asarray(words).astype(np.int64)
    n = len(W)
    G = W @ W.T
    dist = G.diagonal()[:, None] - G
    K = np.ones((n, n), dtype=object)
    steps = np.zeros((n, n), dtype=np.int64)
    cache = {}
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            d = int(dist[i, j])
            if d not in cache:
                cache[d] = chain_denominator(d, seq_len, ladder_gap=ladder_gap)
            K[i, j], steps[i, j] = cache[d]
            if K[i, j] == 0:
                raise ValueError(
                    f"queries {i} and {j} differ in only {d} position(s) of the support: "
                    "a witness pair needs overlap distance >= 2."
                )
    return K, steps, dist


def _family_size(n, ladder_lengths):
    return int(n * (2 * n - 1) + 2 * int(np.sum(ladder_lengths)))


def witness_bound(words, seq_len, *, ladder_gap=None):
    """Certified minimum rank of the witness family on ``words`` (from its design).

    Applies to the designed ratio bounds (:func:`witness_denominators`) exactly the
    selection and R5 computation of :func:`~minip_learn.theory.certify`.

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
    >>> witness_bound(hadamard_code(24), 3)     # THEORY R6
    (17, 4186)
    """
    K, steps, _ = witness_denominators(words, seq_len, ladder_gap=ladder_gap)
    n = len(K)
    keep = _prune(K) if n > 2 else list(range(n))
    rank = _rank_from_denominators(K[np.ix_(keep, keep)])[0] if n > 1 else 1
    return int(rank), _family_size(n, steps.max(axis=1) if n else 0)


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


def _histogram_sums(hist, seq_len, ladder_gap, exact):
    num = Fraction if exact else float
    sum_sq, row, steps = num(0), num(0), 0
    for d, c in hist.items():
        K, t = chain_denominator(d, seq_len, ladder_gap=ladder_gap)
        if K == 0:
            return None
        if exact:
            sum_sq += Fraction(c, K * K)
            row += Fraction(c, K)
        else:
            sum_sq += c * _inv(K) ** 2
            row += c * _inv(K)
        steps = max(steps, t)
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
    rank, value, _ = _rank_from_sums(n, n * sum_sq, row, row)
    exact = n_bits > total or any(half for _, half in blocks)
    return dict(
        rank=int(rank), n_queries=n, n_sequences=int(n * (2 * n - 1 + 2 * steps)),
        ladder_steps=steps, exact=exact, frobenius_value=float(value),
    )


def _block_multisets(n_bits, max_blocks):
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

    for combo in rec(0, n_bits, max_blocks):
        if not combo:
            continue
        variants = [tuple((h, False) for h in combo)]
        if sum(combo) == n_bits:   # no padding bit: one half block makes it exact
            for h in sorted(set(combo)):
                i = combo.index(h)
                variants.append(tuple((g, k == i) for k, g in enumerate(combo)))
        yield from variants


def _best_design(n_bits, seq_len, max_blocks, max_sequences, exact_only):
    scored = []
    for blocks in _block_multisets(n_bits, max_blocks):
        n = math.prod((h - 1) if half else (2 * h - 2) for h, half in blocks)
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
            if max_sequences is not None and size > max_sequences:
                continue
            est = n if row <= 1 else min(n, math.floor(n / (1 + sum_sq)) + 1)
            scored.append((est, -size, blocks, gap))
    if not scored:
        return None
    top = max(s[0] for s in scored)
    best = None
    for est, neg_size, blocks, gap in scored:
        if est < top - 1:
            continue
        r = product_code_bound(blocks, seq_len, ladder_gap=gap, n_bits=n_bits)
        key = (r["rank"], -r["n_sequences"], -len(blocks))
        if best is None or key > best[0]:
            best = (key, blocks, gap, r)
    _, blocks, gap, r = best
    return dict(r, blocks=blocks, ladder_gap=gap)


def _describe(blocks, n_bits):
    parts = [f"H{h}{'/2' if half else ''}" for h, half in blocks]
    pad = n_bits - sum(h for h, _ in blocks)
    return " x ".join(parts) + (f" + {pad} pad" if pad else "")


def bound_table(
    n_bits=range(8, 65, 8), seq_len=range(3, 7), *, max_blocks=4, max_sequences=None,
    exact_only=False, as_frame=True,
):
    """Best certified minimum rank of the witness designs, over sizes (THEORY R6).

    For each ``(n_bits, seq_len)`` the designs on products of Hadamard codes (one to
    ``max_blocks`` blocks of constructible orders ``>= 8``, padded to ``n_bits``) with
    every ladder gap in ``LADDER_GAPS`` are evaluated analytically
    (:func:`product_code_bound`: the same R4 chain denominators and R5 rank function
    that :func:`~minip_learn.theory.certify` applies, computed from one row's distance
    histogram), and the best is reported. The families themselves (``n_sequences``)
    are not materialised. The bound grows exponentially with ``n_bits``: the theorem's
    ``2^Omega(m)``.

    Parameters
    ----------
    n_bits : iterable of int, default=range(8, 65, 8)
    seq_len : iterable of int, default=range(3, 7)
        Values ``>= 3``.
    max_blocks : int, default=4
        Most Hadamard blocks in a product code.
    max_sequences : int, default=None
        Only designs whose family has at most this many sequences.
    exact_only : bool, default=False
        Only designs whose bound ``certify`` recomputes exactly (no query token is
        also a key); otherwise a design without padding may be reported, whose family
        certifies *at least* the value shown.
    as_frame : bool, default=True
        Return a :class:`pandas.DataFrame`; otherwise a dict of lists.

    Returns
    -------
    table : DataFrame or dict
        Columns ``n_bits, seq_len, certified_min_rank, construction, n_queries,
        ladder_gap, ladder_steps, n_sequences, exact``.

    Examples
    --------
    >>> from minip_learn.theory import bound_table
    >>> t = bound_table(n_bits=[16, 24, 32], seq_len=[3], as_frame=False)
    >>> t["certified_min_rank"]
    [8, 18, 53]
    """
    rows = {k: [] for k in (
        "n_bits", "seq_len", "certified_min_rank", "construction", "n_queries",
        "ladder_gap", "ladder_steps", "n_sequences", "exact",
    )}
    max_blocks = check_int(max_blocks, "max_blocks", min_value=1)
    max_sequences = check_int(max_sequences, "max_sequences", min_value=1, allow_none=True)
    for m, N in itertools.product(list(n_bits), list(seq_len)):
        m = check_int(m, "n_bits", min_value=1)
        N = check_int(N, "seq_len", min_value=3)
        best = _best_design(m, N, max_blocks, max_sequences, exact_only)
        rows["n_bits"].append(m)
        rows["seq_len"].append(N)
        if best is None:
            for k, v in (("certified_min_rank", 1), ("construction", "none"),
                         ("n_queries", 0), ("ladder_gap", None), ("ladder_steps", 0),
                         ("n_sequences", 0), ("exact", True)):
                rows[k].append(v)
            continue
        rows["certified_min_rank"].append(best["rank"])
        rows["construction"].append(_describe(best["blocks"], m))
        rows["n_queries"].append(best["n_queries"])
        rows["ladder_gap"].append(best["ladder_gap"])
        rows["ladder_steps"].append(best["ladder_steps"])
        rows["n_sequences"].append(best["n_sequences"])
        rows["exact"].append(best["exact"])
    if as_frame:
        import pandas as pd

        return pd.DataFrame(rows)
    return rows
