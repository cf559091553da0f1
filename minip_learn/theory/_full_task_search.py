"""Exhaustive search for the best R5 certificate of the full length-3 task (numpy only).

A certificate of a family of length-3 sequences is a set of (query, designated key)
pairs, every ordered pair of them linked by a chain of R4 constraints (see the theory
page, :ref:`theory-r4` and :ref:`theory-r5`). On the full task over a token set ``S``
(every multiset of three tokens of ``S``) a constraint exists for every query ``x`` and
keys ``y, z`` of ``S`` with ``<x, z> - <x, y> = g >= 2`` (denominator ``g - 1``), so the
best chain of query ``x`` from overlap ``a`` to overlap ``b`` depends only on the overlap
levels ``{<x, t> : t in S}`` between them (:func:`chain_products`).

On the full token set a pair ``(x, k)`` is dominated by ``(x', ~x')`` with ``x' = x``
minus the bits of ``k``: its row's overlap gaps are no smaller and its key is a superset
of ``k`` (no smaller gaps in the other rows), and chains only improve with the gap. So
:func:`best_pairs` searches the ``2^m`` pairs ``(x, ~x)`` with ``|x \\ x'| >= 2`` both
ways, up to the bit permutations (the member of least weight is fixed); on a proper
subset of tokens it searches every pair ``(x, k)`` of tokens of ``S``. The search is a
branch and bound over cliques of mutually constrained pairs that maximises the R5 rank,
pruned by clique size and by the Frobenius bound of the best extensions.
"""

import math

import numpy as np

from .bounds import rank_from_denominators

__all__ = ["best_pairs", "chain_products"]


def chain_products(levels, start):
    """Best chain denominators of one query from overlap ``start`` (N = 3).

    Parameters
    ----------
    levels : array-like of int
        The overlap levels present (``<x, t>`` for the tokens ``t`` of the set).
    start : int
        The overlap of the designated key.

    Returns
    -------
    best : dict
        ``best[b]`` is the largest product of ``g - 1`` over chains of steps ``g >= 2``
        from ``start`` to ``b`` through present levels (absent: ``b`` is not reached).

    Examples
    --------
    >>> from minip_learn.theory._full_task_search import chain_products
    >>> chain_products(range(9), 0)[8]      # two steps of gap 4: 3 * 3
    9
    """
    present = sorted({int(v) for v in levels if int(v) >= start})
    best = {int(start): 1}
    for b in present:
        if b == start:
            continue
        cands = [best[a] * (b - a - 1) for a in present if a <= b - 2 and a in best]
        if cands:
            best[b] = max(cands)
    return best


class _Candidates:
    """The pairs ``(query, key)`` and their ratio denominators ``K[i, j]`` (0: the
    pair ``(i, j)`` is not constrained)."""

    def __init__(self, tokens, pairs):
        T = tokens.astype(np.int64)
        G = T @ T.T
        self.pairs = pairs
        q, k = pairs[:, 0], pairs[:, 1]
        n = len(pairs)
        K = np.zeros((n, n), dtype=np.int64)
        for i in range(n):
            start = int(G[q[i], k[i]])
            chains = chain_products(G[q[i]], start)
            chains[start] = 0                     # the key's own level: no constraint
            K[i] = [chains.get(int(G[q[i], k[j]]), 0) for j in range(n)]
        K[k[:, None] == k[None, :]] = 0           # a key is never reached from itself
        np.fill_diagonal(K, 1)
        self.K = K
        self.adj = (K > 0) & (K.T > 0)
        np.fill_diagonal(self.adj, False)
        with np.errstate(divide="ignore"):
            self.eps2 = np.where(K > 0, 1.0 / K.astype(float) ** 2, np.inf)
        np.fill_diagonal(self.eps2, 0.0)


def _float_rank(n, S, dominant):
    """The R5 rank of a clique of ``n`` pairs from floats (a search estimate)."""
    if n <= 1:
        return 1
    if dominant:
        return n
    return math.floor(n * n / (n + S) + 1e-9) + 1


def _upper(C, P, cands, S):
    """An upper bound of the rank of every clique ``C' ⊇ C`` inside ``C ∪ P``."""
    n = len(C)
    if not P:
        return 0
    eps = np.sqrt(cands.eps2[np.ix_(C, C)])
    dom = (eps.sum(1) <= 1 + 1e-12).all() or (eps.sum(0) <= 1 + 1e-12).all()
    if dom:
        return n + len(P)
    add = np.sort(cands.eps2[np.ix_(P, C)].sum(1) + cands.eps2[np.ix_(C, P)].sum(0))
    best, total = 0, S
    for a, s in enumerate(add, start=1):
        total += s
        best = max(best, _float_rank(n + a, total, False))
    return best


def _search(cands, roots, max_nodes):
    """Branch and bound from each root (a clique containing it, over the allowed
    candidates of the root); returns ``(best clique, its rank, exhaustive)``."""
    best, best_rank, nodes = [], 1, 0
    exhaustive = True

    def rank_of(C):
        return rank_from_denominators(cands.K[np.ix_(C, C)])[0] if len(C) > 1 else 1

    def rec(C, P, S):
        nonlocal best, best_rank, nodes, exhaustive
        nodes += 1
        if nodes > max_nodes:
            exhaustive = False
            return
        eps = np.sqrt(cands.eps2[np.ix_(C, C)])
        dom = (eps.sum(1) <= 1 + 1e-12).all() or (eps.sum(0) <= 1 + 1e-12).all()
        if _float_rank(len(C), S, dom) >= best_rank and len(C) > 1:
            r = rank_of(C)
            if r > best_rank:
                best, best_rank = list(C), r
        if len(C) + len(P) <= best_rank or _upper(C, P, cands, S) <= best_rank:
            return
        for idx, v in enumerate(P):
            rest = [u for u in P[idx + 1:] if cands.adj[v, u]]
            s = S + cands.eps2[v, C].sum() + cands.eps2[C, v].sum()
            rec(C + [v], rest, s)
            if nodes > max_nodes:
                return

    for root, allowed in roots:
        rec([root], [u for u in allowed if cands.adj[root, u]], 0.0)
    return best, best_rank, exhaustive


def best_pairs(tokens, *, full=False, max_nodes=200000):
    """The best set of mutually constrained (query, key) pairs of the full task over
    ``tokens`` (N = 3), by branch and bound.

    Parameters
    ----------
    tokens : ndarray of shape (n_tokens, n_bits)
        The token set (distinct 0/1 rows).
    full : bool, default=False
        ``tokens`` is every ``m``-bit token: search the pairs ``(x, ~x)`` up to bit
        permutations (exact by the dominance argument of this module); otherwise every
        pair ``(x, k)`` of tokens.
    max_nodes : int, default=200000
        Node budget; beyond it the best set found is returned, not proved best.

    Returns
    -------
    queries, keys : ndarray of shape (n, n_bits)
        The pairs (empty when no two pairs constrain each other).
    rank : int
        Their R5 rank (1 with no pairs).
    exhaustive : bool
        Whether the search finished within ``max_nodes``: the rank is then the largest
        any certificate of this family can state.
    """
    tokens = np.asarray(tokens, dtype=np.uint8)
    T, m = tokens.shape
    if full:
        pairs = np.stack([np.arange(T), T - 1 - np.arange(T)], axis=1)   # ~x: reversed
        cands = _Candidates(tokens, pairs)
        weight = tokens.sum(1)
        roots = []
        for w in range(m + 1):
            root = int(np.flatnonzero(weight == w)[-1])      # 1^w 0^(m-w): the largest
            allowed = [u for u in range(T) if weight[u] >= w and u != root]
            roots.append((root, allowed))
    else:
        grid = np.stack(np.meshgrid(np.arange(T), np.arange(T), indexing="ij"), -1)
        pairs = grid.reshape(-1, 2)
        cands = _Candidates(tokens, pairs)
        n = len(pairs)
        roots = [(v, list(range(v + 1, n))) for v in range(n)]
    clique, rank, exhaustive = _search(cands, roots, max_nodes)
    if len(clique) < 2:
        empty = np.zeros((0, m), dtype=np.uint8)
        return empty, empty, 1, exhaustive
    sel = cands.pairs[clique]
    return tokens[sel[:, 0]], tokens[sel[:, 1]], int(rank), exhaustive
