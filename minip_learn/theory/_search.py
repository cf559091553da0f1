"""The search for a certificate's (query, key) pairs (numpy and fractions only).

A *candidate* is a pair (query ``x``, designated key ``s``) of the best chains
(:func:`~minip_learn.theory._constraints.reach`). Two candidates are compatible when
each one's key is reachable from the other's in the other's constraint DAG; a set of
mutually compatible candidates (a clique of the candidate graph, :class:`_Graph`) is
what a certificate lists. :func:`search` runs the searches of :data:`SEARCHES` on the
graph -- greedy by degree, greedy in order of reach, greedy on one candidate per query,
and an exhaustive branch and bound where the candidates that could do better are few
-- and keeps the set that certifies the largest rank (:class:`Found`), with what the
certificate is built from (:class:`Selection`).

A search is one entry of :data:`SEARCHES`: the name a certificate records and a
function ``run(view, best)`` that returns a :class:`Found` (or None) from the graph as
the searches read it (:class:`_Candidates`) and the best set found before it.
"""

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from .._memory import trim_heap
from ..compact import smallest_int_dtype
from ._constraints import Reach, fill_from, isin, with_singles
from ._selection import prune_rows
from .bounds import integer_above, rank_from_denominators, rank_from_sums, resolve_near_integer

__all__ = ["SEARCHES", "Found", "Search", "Selection", "search"]

#: candidate sets up to this size are searched exhaustively (branch and bound)
EXACT_MAX_CANDIDATES = 64
#: node budget of the exhaustive search (beyond it the best clique found is kept)
EXACT_MAX_NODES = 20000
#: largest candidate graph held as a dense matrix; larger graphs keep, per query, the
#: candidates of highest degree
MAX_DENSE_CANDIDATES = 8000


@dataclass(frozen=True)
class Found:
    """A set of mutually compatible candidates and the rank it certifies.

    Attributes
    ----------
    members : tuple of int
        Candidate indices of the graph searched.
    rank : int
        The R5 rank of their denominators (1 below two members).
    exhaustive : bool
        Whether no set of the candidates searched certifies more (only a search that
        tried them all can say so).
    strategy : str
        The name of the search that found the set (set by :func:`_select`).
    """

    members: tuple
    rank: int
    exhaustive: bool = False
    strategy: str = "none"


@dataclass(frozen=True)
class Search:
    """One search of :data:`SEARCHES`.

    Attributes
    ----------
    name : str
        What a certificate records as its ``strategy`` (one of
        :data:`~minip_learn.theory.certificate.STRATEGIES`).
    run : callable
        ``run(view, best)``: a :class:`Found` set of the candidates of ``view`` (a
        :class:`_Candidates`), or None; ``best`` is the best :class:`Found` of the
        searches before it (None for the first).
    """

    name: str
    run: Callable


@dataclass(frozen=True)
class Selection:
    """The best set of candidates of :func:`search`, with its graph and chains.

    Attributes
    ----------
    graph : _Graph
        The candidate graph the set was found in.
    found : Found
        The set; ``found.exhaustive`` is that of the last graph searched.
    chains : Reach
        The rows of the chains of every candidate searched.
    """

    graph: "_Graph"
    found: Found
    chains: Reach

    def pairs(self):
        """Token indices ``(queries, keys)`` of the set's members."""
        c = np.asarray(self.found.members, dtype=np.int64)
        return self.graph.x[c], self.graph.s[c]

    def denominators(self):
        """The ``n x n`` ratio denominators of the set (diagonal 1)."""
        return self.graph.denominators(self.found.members)

    def overlap_gaps(self, overlap, m):
        """``D[i, j] = <x_i, k_j> - <x_i, k_i>`` (int16 for up to 32,767 bits), a block
        of rows at a time; ``overlap(a, b)`` is ``<tokens[a], tokens[b]>``."""
        qi, ki = self.pairs()
        n = len(qi)
        D = np.empty((n, n), dtype=smallest_int_dtype(max(m, 2**8), -max(m, 2**8)))
        own = overlap(qi, ki)
        step = max(1, GRAPH_CHUNK // max(n, 1))
        for a in range(0, n, step):
            q = qi[a:a + step]
            D[a:a + step] = (overlap(np.repeat(q, n), np.tile(ki, len(q))).reshape(len(q), n)
                             - own[a:a + step, None])
        return D

    def chain_trees(self):
        """The chain tree of every member as ``(offsets, child, parent)``: the rows of
        its candidate in the chains (a run of them), member by member."""
        qi, ki = self.pairs()
        R, T = self.chains, self.graph.n_tokens
        codes, count = _candidate_runs(R, T)    # the rows of a candidate are one run
        pos = np.searchsorted(codes, qi * T + ki)
        lo = (np.cumsum(count) - count)[pos]
        hi = lo + count[pos]
        del codes, count, pos
        return (np.concatenate([[0], np.cumsum(hi - lo)]),
                np.concatenate([R.t[a:b] for a, b in zip(lo, hi)]),
                np.concatenate([R.pred[a:b] for a, b in zip(lo, hi)]))


# --------------------------------------------------------------------------- the graph
def _candidate_runs(R, T):
    """Candidates of the rows of ``R`` (sorted by (x, s, t)): the code ``x * T + s`` of
    each run of equal (x, s) and its length (the number of keys it reaches)."""
    codes, firsts, prev = [], [], None
    for a in range(0, len(R), GRAPH_CHUNK):     # in slices: no code per row at once
        vcode = R.x[a:a + GRAPH_CHUNK].astype(np.int64) * T + R.s[a:a + GRAPH_CHUNK]
        new = np.ones(len(vcode), dtype=bool)
        new[1:] = vcode[1:] != vcode[:-1]
        if prev is not None:
            new[0] = vcode[0] != prev
        prev = vcode[-1]
        first = np.flatnonzero(new)
        codes.append(vcode[first])
        firsts.append(first + a)
    if not codes:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = np.concatenate(firsts)
    return np.concatenate(codes), np.diff(np.append(first, len(R)))


#: rows of the chains (or half-edges) handled at a time when the candidate graph is built
GRAPH_CHUNK = 1 << 22


def _restrict(cons, R, *, primary=False, min_reach=0):
    """The rows of ``R`` of the candidates that may take part in the search.

    ``primary``: one candidate per query (largest reach, then the key of least
    overlap with the query, then the smaller key). ``min_reach``: the candidates that
    reach at least that many keys -- a set of ``k`` mutually compatible candidates has
    distinct keys, each reaching the ``k - 1`` others, so a set certifying more than
    ``r`` needs candidates reaching ``>= r`` keys.
    """
    T = np.int64(len(cons.tokens))
    codes, count = _candidate_runs(R, T)
    x, s = codes // T, codes % T
    if primary:
        order = np.lexsort((s, cons.overlap(x, s), -count, x))
        first = np.ones(len(order), dtype=bool)
        first[1:] = x[order][1:] != x[order][:-1]
        sel = np.zeros(len(codes), dtype=bool)
        sel[order[first]] = True
    else:
        sel = count >= min_reach
    if sel.all():
        return R
    rows = np.repeat(sel, count)
    return Reach(*(a[rows] for a in (R.x, R.s, R.t, R.K, R.pred)))


def _slices(n):
    return (slice(a, a + GRAPH_CHUNK) for a in range(0, n, GRAPH_CHUNK))


class _Graph:
    """Candidates (query, key) and their compatibility, from the best chains.

    Built from the rows of ``R`` slice by slice; the half-edges are held as one
    int64 code ``u V + w`` each (sorted) with their denominators.
    """

    def __init__(self, cons, R):
        T = self.n_tokens = np.int64(len(cons.tokens))
        # the rows of R are sorted by (x, s, t): a candidate is a run of equal (x, s)
        codes, count = _candidate_runs(R, T)
        self.x, self.s = codes // T, codes % T
        del codes
        self.reach_size = count
        self.overlap = cons.overlap(self.x, self.s)
        V = self.V = len(self.x)
        Vi = np.int64(V)
        # half-edges u -> w: w's key is reachable from u's key in u's DAG; with small
        # denominators a half-edge and its K are packed in one int64 (sorted in place)
        by_src = np.argsort(self.s, kind="stable")
        src = self.s[by_src]
        start = np.cumsum(count) - count    # the first row of every candidate
        packed = (R.K.dtype != object and float(V) * V < 2**31
                  and (not len(R.K) or int(R.K.max()) < 2**31))
        halves, Ks = [], []
        for sl in _slices(len(R)):
            t = R.t[sl]
            lo = np.searchsorted(src, t, side="left")
            cnt = np.searchsorted(src, t, side="right") - lo
            rows = np.flatnonzero(cnt)      # rows that reach some candidate's key
            lo, cnt = lo[rows], cnt[rows]
            rep = np.repeat(np.arange(len(rows)), cnt)
            offs = np.cumsum(cnt) - cnt
            w = by_src[lo[rep] + (np.arange(len(rep)) - offs[rep])]
            u = (np.searchsorted(start, rows + sl.start, side="right") - 1)[rep]
            K = R.K[sl][rows][rep]
            del t, lo, cnt, rows, rep, offs
            other = self.x[u] != self.x[w]
            half = u[other] * Vi + w[other]
            if packed:
                halves.append((half << 32) | K[other].astype(np.int64))
            else:
                halves.append(half)
                Ks.append(K[other])
        del by_src, src, start
        if not halves:
            half, K = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=R.K.dtype)
        elif packed:
            half = fill_from(halves)
            half.sort()
            K = np.empty(len(half), dtype=R.K.dtype)
            for sl in _slices(len(half)):
                K[sl] = half[sl] & 0xFFFFFFFF
            np.right_shift(half, 32, out=half)
        else:
            half, K = fill_from(halves), fill_from(Ks)
            order = np.argsort(half, kind="stable")
            half, K = half[order], K[order]
            del order
        both = np.empty(len(half), dtype=bool)
        for sl in _slices(len(half)):       # keep the pairs compatible both ways
            h = half[sl]
            both[sl] = isin((h % Vi) * Vi + h // Vi, half)
        if not both.all():
            half, K = half[both], K[both]
        del both
        self.half, self.K = half, K
        self.degree = np.zeros(V, dtype=np.int64)
        for sl in _slices(len(half)):
            self.degree += np.bincount(half[sl] // Vi, minlength=V)
        # priority: larger reach, then lower overlap with the query, then indices
        self.priority = np.lexsort((self.s, self.x, self.overlap, -self.reach_size))

    def denominators(self, clique):
        """The ``n x n`` denominators of a clique (diagonal 1), a block of rows at a time."""
        c = np.asarray(clique, dtype=np.int64)
        n = len(c)
        K = np.ones((n, n), dtype=self.K.dtype)
        if n < 2 or not len(self.half):
            return K
        step = max(1, GRAPH_CHUNK // n)
        for a in range(0, n, step):
            pos = np.searchsorted(self.half, c[a:a + step, None] * np.int64(self.V) + c)
            pos[pos >= len(self.half)] = 0
            block = self.K[pos]
            i = np.arange(len(block))
            block[i, a + i] = 1             # the diagonal
            K[a:a + step] = block
        return K

    def rank(self, clique):
        """The R5 rank of a clique's denominators (1 below two members)."""
        return rank_from_denominators(self.denominators(clique))[0] if len(clique) > 1 else 1

    def dense(self, keep):
        """The compatibility of the candidates ``keep`` as a boolean matrix."""
        idx = np.full(self.V, -1, dtype=np.int64)
        idx[keep] = np.arange(len(keep))
        A = np.zeros((len(keep), len(keep)), dtype=bool)
        for sl in _slices(len(self.half)):
            h = self.half[sl]
            u, w = idx[h // self.V], idx[h % self.V]
            ok = (u >= 0) & (w >= 0)
            A[u[ok], w[ok]] = True
        return A


def _greedy_degree(A, priority_rank, allowed=None):
    V = len(A)
    P = np.ones(V, dtype=bool) if allowed is None else allowed.copy()
    deg = A[:, P].sum(axis=1).astype(np.int64)
    chosen = []
    while P.any():
        score = np.where(P, deg * (V + 1) - priority_rank, np.iinfo(np.int64).min)
        v = int(np.argmax(score))
        chosen.append(v)
        newP = P & A[v]
        removed = P & ~newP
        deg -= A[:, removed].sum(axis=1)
        P = newP
    return chosen


def _greedy_order(A, order):
    ok = np.ones(len(A), dtype=bool)
    chosen = []
    for v in order:
        if ok[v]:
            chosen.append(int(v))
            ok &= A[v]
    return chosen



# ------------------------------------------------------------------ the exhaustive search
def _exact_sum(values):
    """Exact sum of Fractions, over their least common denominator."""
    values = list(values)
    if not values:
        return Fraction(0)
    L = math.lcm(*(v.denominator for v in values))
    return Fraction(sum(v.numerator * (L // v.denominator) for v in values), L)


def _clique_sum_sq(C, Kinv):
    """Exact ``sum eps_uv^2`` over the ordered pairs of the clique ``C``."""
    return _exact_sum(Kinv[u][v] ** 2 for u in C for v in C if u != v)


def _clique_max_row_sum(C, Kinv):
    return max((_exact_sum(Kinv[u][v] for v in C if v != u) for u in C), default=Fraction(0))


def _clique_max_col_sum(C, Kinv):
    return max((_exact_sum(Kinv[u][v] for u in C if u != v) for v in C), default=Fraction(0))


def _exact_rank(C, Kinv):
    return rank_from_sums(len(C), _clique_sum_sq(C, Kinv), _clique_max_row_sum(C, Kinv),
                          _clique_max_col_sum(C, Kinv))[0]


def _upper_bound(n, S, n_max, e_min, exact_sum_sq, exact_e_min, largest_dominant):
    """Largest rank any clique of ``n..n_max`` members could certify.

    Every pair added to a clique of ``n`` members (sum of squared bounds ``S``) adds
    at least ``e_min^2``, so a clique of ``k`` members has ``S_k >= S + (k(k-1) -
    n(n-1)) e_min^2``; ``k^2 / (k + S_k)`` grows with ``k`` (``S >= n(n-1) e_min^2``),
    so the Frobenius bound is largest at ``n_max``. Dominance can give ``k`` only while
    ``(k-1) e_min <= 1``, i.e. up to ``largest_dominant = integer_above(1 / e_min)``.
    ``exact_sum_sq()`` and ``exact_e_min`` are ``S`` and ``e_min`` as Fractions.
    """
    added = n_max * (n_max - 1) - n * (n - 1)
    best = max(n, rank_from_sums(
        n_max, S + added * e_min * e_min, (n_max - 1) * e_min,
        exact_sum_sq=lambda: exact_sum_sq() + added * exact_e_min ** 2,
        exact_max_row_sum=lambda: (n_max - 1) * exact_e_min,
    )[0])
    if best < n_max and largest_dominant >= n:   # n_max members are not dominant
        best = max(best, min(largest_dominant, n_max))
    return best


def _root_bound(A, Kinv):
    """Largest rank any clique of ``A`` could certify, from per-member bounds.

    In a clique of ``k`` members, member ``u`` has ``k - 1`` partners ``w``; its pairs
    add at least the ``k - 1`` smallest ``e_uw^2 + e_wu^2`` over its neighbours to
    ``2 S``, so ``S`` is at least half the sum of the ``k`` smallest such member
    totals. Dominance (rank ``k``) needs ``k`` members whose ``k - 1`` smallest row
    (or column) entries sum to at most 1. Floats, decided near an integer from the
    same sums in exact arithmetic.
    """
    V = len(A)
    E = np.zeros((V, V))
    for u, row in Kinv.items():
        for w, e in row.items():
            E[u, w] = float(e)
    inf = np.inf
    pair = np.where(A, E * E + E.T * E.T, inf)
    pair_sums = np.cumsum(np.sort(pair, axis=1), axis=1)   # [u, k-2]: k-1 smallest
    sums = {"row": np.cumsum(np.sort(np.where(A, E, inf), axis=1), axis=1),
            "col": np.cumsum(np.sort(np.where(A, E.T, inf), axis=1), axis=1)}
    exact_sums = _MemberSums(A, Kinv)
    best = 1 if V else 0
    for k in range(2, V + 1):
        h = np.sort(pair_sums[:, k - 2])[:k]
        if not np.isfinite(h[-1]):
            break                            # fewer than k members of degree >= k - 1
        if any(
            sum(resolve_near_integer(v, lambda u=u, kind=kind, k=k: exact_sums.prefix(kind, u, k))
                <= 1 for u, v in enumerate(sums[kind][:, k - 2])) >= k
            for kind in ("row", "col")
        ):
            best = max(best, k)
            continue
        best = max(best, rank_from_sums(
            k, h.sum() / 2, exact_sum_sq=lambda k=k: exact_sums.pair_bound(k))[0])
    return best


class _MemberSums:
    """Exact sums of the ``k - 1`` smallest bounds of each member, computed on demand."""

    def __init__(self, A, Kinv):
        self.A, self.Kinv = A, Kinv
        self.cache = {}

    def prefixes(self, kind, u):
        """Running sums of the sorted ``row``, ``col`` or ``pair`` bounds of ``u``."""
        key = (kind, u)
        if key not in self.cache:
            Kinv = self.Kinv
            nb = np.flatnonzero(self.A[u]).tolist()
            if kind == "row":
                vals = [Kinv[u][w] for w in nb]
            elif kind == "col":
                vals = [Kinv[w][u] for w in nb]
            else:
                vals = [Kinv[u][w] ** 2 + Kinv[w][u] ** 2 for w in nb]
            self.cache[key] = list(itertools.accumulate(sorted(vals)))
        return self.cache[key]

    def prefix(self, kind, u, k):
        """Sum of the ``k - 1`` smallest bounds of ``u`` (None: fewer neighbours)."""
        run = self.prefixes(kind, u)
        return run[k - 2] if len(run) >= k - 1 else None

    def pair_bound(self, k):
        """Half the sum of the ``k`` smallest member totals: the lower bound on ``S``."""
        totals = sorted(t for t in (self.prefix("pair", u, k) for u in range(len(self.A)))
                        if t is not None)
        return sum(totals[:k], Fraction(0)) / 2


def _clique_cover_bound(P, nbr):
    """An upper bound on the largest clique inside the bit set ``P``.

    Greedy colouring: each colour class is a set of mutually incompatible members, so
    a clique takes at most one member of each class.
    """
    colours = 0
    while P:
        colours += 1
        Q = P
        while Q:
            v = Q.bit_length() - 1
            P &= ~(1 << v)
            Q &= ~(1 << v) & ~nbr[v]
    return colours


def _exact_clique_search(A, Kinv, start_rank, max_nodes):
    """Branch and bound over all cliques of ``A``.

    ``Kinv[u][w]`` is ``Fraction(1, K_uw)``. The sums of a clique are kept exactly, as
    integers over a common denominator ``L``; the search is steered by their floats,
    decided in exact arithmetic near an integer, and every improvement is confirmed
    in exact arithmetic. Returns ``(rank, clique or None, complete)``: the clique is
    the best one certifying more than ``start_rank``, None when there is none.
    """
    bnb = _BranchAndBound(A, Kinv, start_rank, max_nodes)
    bnb.visit([], (1 << len(A)) - 1, 0, [], [])
    return bnb.best_rank, bnb.best_clique, bnb.nodes < max_nodes


class _BranchAndBound:
    """The state of :func:`_exact_clique_search`: the best clique so far and the nodes
    visited."""

    def __init__(self, A, Kinv, start_rank, max_nodes):
        V = len(A)
        self.Kinv, self.max_nodes = Kinv, max_nodes
        self.nbr = [sum(1 << int(w) for w in np.flatnonzero(A[u])) for u in range(V)]
        self.e_min_exact = min((e for u in Kinv for e in Kinv[u].values()),
                               default=Fraction(0))
        e_min = self.e_min = float(self.e_min_exact)
        # the largest clique size that dominance alone could certify: (k-1) e_min <= 1
        self.largest_dominant = (integer_above(1 / e_min, lambda: 1 / self.e_min_exact)
                                 if e_min else V)
        L = self.L = math.lcm(*(e.denominator for u in Kinv for e in Kinv[u].values()))
        self.L2 = L * L
        self.Ki = {u: {w: e.numerator * (L // e.denominator) for w, e in Kinv[u].items()}
                   for u in Kinv}               # Kinv[u][w] == Ki[u][w] / L
        self.best_rank, self.best_clique, self.nodes = start_rank, None, 0

    def visit(self, C, P, S_i, rows_i, cols_i):
        """Search the cliques that extend ``C`` by members of the bit set ``P``.

        ``S_i``, ``rows_i``, ``cols_i``: the sum of squared bounds, the row and the
        column sums of ``C``, exactly, times ``L^2``, ``L`` and ``L``.
        """
        self.nodes += 1
        n, L = len(C), self.L
        S = S_i / self.L2

        def exact_sum_sq():
            return Fraction(S_i, self.L2)

        if n > max(1, self.best_rank):          # a clique certifies at most its size
            est = rank_from_sums(
                n, S, max(rows_i) / L, max(cols_i) / L, exact_sum_sq=exact_sum_sq,
                exact_max_row_sum=lambda: Fraction(max(rows_i), L),
                exact_max_col_sum=lambda: Fraction(max(cols_i), L),
            )[0]
            if est > self.best_rank:
                r = _exact_rank(C, self.Kinv)
                if r > self.best_rank:
                    self.best_rank, self.best_clique = r, list(C)
        while P:
            if self.nodes >= self.max_nodes:
                return
            n_max = n + _clique_cover_bound(P, self.nbr)
            if n_max <= self.best_rank or _upper_bound(
                    n, S, n_max, self.e_min, exact_sum_sq, self.e_min_exact,
                    self.largest_dominant) <= self.best_rank:
                return
            v = P.bit_length() - 1
            P &= ~(1 << v)
            self.visit(C + [v], P & self.nbr[v], *self._extended(C, v, S_i, rows_i, cols_i))

    def _extended(self, C, v, S_i, rows_i, cols_i):
        """The exact sums of ``C + [v]`` from those of ``C``."""
        new_S = S_i
        new_rows, new_cols = list(rows_i) + [0], list(cols_i) + [0]
        for k, u in enumerate(C):
            a, b = self.Ki[u][v], self.Ki[v][u]
            new_S += a * a + b * b
            new_rows[k] += a
            new_cols[k] += b
            new_rows[-1] += b
            new_cols[-1] += a
        return new_S, new_rows, new_cols


# --------------------------------------------------------------------------- the searches
@dataclass(frozen=True)
class _Candidates:
    """The candidate graph as the searches read it (:meth:`of`).

    Attributes
    ----------
    graph : _Graph
    keep : ndarray of int
        Graph indices of the candidates searched: all of them, or on graphs of more than
        :data:`MAX_DENSE_CANDIDATES` the candidates of highest degree of each query.
        The searches index these (``A``'s rows), :meth:`found` maps back.
    A : ndarray of bool, shape (len(keep), len(keep))
        ``A[u, w]``: ``u`` and ``w`` are compatible.
    priority : ndarray of int
        The candidates in priority order (larger reach, then lower overlap with the
        query, then indices).
    priority_rank : ndarray of int
        The place of each candidate in that order.
    primary : ndarray of bool
        The first candidate of each query in that order.
    """

    graph: "_Graph"
    keep: np.ndarray
    A: np.ndarray
    priority: np.ndarray
    priority_rank: np.ndarray
    primary: np.ndarray

    @classmethod
    def of(cls, G):
        """The view of the graph ``G``."""
        keep = _kept(G)
        priority = np.argsort(np.argsort(G.priority)[keep], kind="stable")
        priority_rank = np.empty(len(keep), dtype=np.int64)
        priority_rank[priority] = np.arange(len(keep))
        xs = G.x[keep]
        primary = np.zeros(len(keep), dtype=bool)
        seen = set()
        for v in priority:
            if xs[v] not in seen:
                seen.add(xs[v])
                primary[v] = True
        return cls(G, keep, G.dense(keep), priority, priority_rank, primary)

    def found(self, chosen):
        """The :class:`Found` set of the candidates ``chosen`` (rows of ``A``), its rows
        dropped while that raises the bound (:func:`~._selection.prune_rows`)."""
        clique = [int(self.keep[v]) for v in chosen]
        kept = prune_rows(self.graph.denominators(clique))
        clique = [clique[i] for i in kept]
        return Found(tuple(clique), self.graph.rank(clique))

    def ratio_bounds(self, rows):
        """``Kinv[u][w] = Fraction(1, K)`` between the compatible candidates ``rows``
        (indices of ``A``), indexed ``0 .. len(rows) - 1``."""
        sub = self.A[np.ix_(rows, rows)]
        Kinv = {}
        for u in range(len(rows)):
            nb = np.flatnonzero(sub[u])
            K = self.graph.denominators([int(self.keep[rows[u]])]
                                        + [int(self.keep[rows[w]]) for w in nb])[0, 1:]
            Kinv[u] = {int(w): Fraction(1, int(k)) for w, k in zip(nb, K)}
        return sub, Kinv


def _kept(G):
    """Graph indices of the candidates a dense view holds: all of them, or per query its
    candidates of highest degree (:data:`MAX_DENSE_CANDIDATES` in all)."""
    V = G.V
    if V <= MAX_DENSE_CANDIDATES:
        return np.arange(V)
    order = np.lexsort((G.priority.argsort(), -G.degree, G.x))
    per_q = max(1, MAX_DENSE_CANDIDATES // max(1, len(np.unique(G.x))))
    rank_in_q = np.zeros(V, dtype=np.int64)
    xs = G.x[order]
    starts = np.r_[0, np.flatnonzero(xs[1:] != xs[:-1]) + 1]
    for a, b in zip(starts, np.r_[starts[1:], V]):
        rank_in_q[order[a:b]] = np.arange(b - a)
    return np.sort(np.flatnonzero(rank_in_q < per_q))


def _by_degree(view, best):
    """Take the candidate of largest degree among those compatible with every one taken
    (ties: priority order), until none is left."""
    return view.found(_greedy_degree(view.A, view.priority_rank))


def _in_order_of_reach(view, best):
    """Take the candidates in priority order, each compatible with every one taken."""
    return view.found(_greedy_order(view.A, view.priority))


def _by_degree_one_key_per_query(view, best):
    """:func:`_by_degree` over the first candidate of each query."""
    return view.found(_greedy_degree(view.A, view.priority_rank, view.primary))


def _exhaustive(view, best):
    """Branch and bound over the candidates that could beat ``best``.

    A set certifying more than ``best.rank`` has more than ``best.rank`` members, each
    compatible with all the others: only the core of degree ``>= best.rank`` can hold
    it. Where that core has at most :data:`EXACT_MAX_CANDIDATES` candidates, a better
    set is searched for (within :data:`EXACT_MAX_NODES` nodes); ``best`` is returned
    marked exhaustive when no set can beat it.
    """
    core = _core(view.A, best.rank)
    if not len(core):
        return replace(best, exhaustive=True)
    if len(core) > EXACT_MAX_CANDIDATES:
        return None
    sub, Kinv = view.ratio_bounds(core)
    if _root_bound(sub, Kinv) <= best.rank:
        return replace(best, exhaustive=True)           # nothing can do better
    rank, clique, complete = _exact_clique_search(sub, Kinv, best.rank, EXACT_MAX_NODES)
    if clique is None:
        return replace(best, exhaustive=True) if complete else None
    return Found(tuple(int(view.keep[core[v]]) for v in clique), rank, exhaustive=complete)


def _core(A, k):
    """Indices of the candidates of ``A`` with at least ``k`` compatible candidates
    among themselves (the ``k``-core)."""
    core = np.ones(len(A), dtype=bool)
    while True:
        shrunk = core & (A[:, core].sum(axis=1) >= k)
        if (shrunk == core).all():
            return np.flatnonzero(core)
        core = shrunk


#: the searches :func:`_select` runs, in order; the exhaustive one comes last, to beat
#: (or to prove best) the set the others found
SEARCHES = (
    Search("greedy by degree", _by_degree),
    Search("greedy in order of reach", _in_order_of_reach),
    Search("greedy by degree, one key per query", _by_degree_one_key_per_query),
    Search("exhaustive search", _exhaustive),
)


def _select(G):
    """The best :class:`Found` set of the graph ``G`` over :data:`SEARCHES`.

    A set replaces the best one when it certifies more (ties: the earlier search); a
    set of the same rank marked exhaustive only tells that the best one cannot be
    beaten.
    """
    view = _Candidates.of(G)
    best = None
    for entry in SEARCHES:
        found = entry.run(view, best)
        if found is None or (best is not None and found.rank < best.rank):
            continue
        if best is None or found.rank > best.rank:
            best = replace(found, strategy=entry.name)
        elif found.exhaustive:
            best = replace(best, exhaustive=True)
    return best


def search(cons, chains):
    """The best set of candidates of the chains of ``cons``: a :class:`Selection`, or
    None when no two candidates are compatible.

    A first search on one candidate per query gives a rank ``r0``; the full search then
    runs on the candidates that could take part in a set certifying more than ``r0``
    (those reaching ``>= r0`` keys), which keeps the graph small on families where
    many tokens reach only a few keys. The better of the two sets wins (ties: the
    second, which holds every set that could beat the first).

    ``chains`` may lack the rows of sources reaching a single key whose query has a
    source reaching more (``reach(cons, drop_single=True)``): the first search never
    takes them, and the second only when ``r0 < 2``, which puts them back first
    (:func:`~._constraints.with_singles`). ``cons`` may be released: only its tokens
    and overlaps are read.
    """
    if not len(chains):
        return None
    best, exhaustive = None, True
    for primary in (True, False):
        floor = best.found.rank if best else 0
        if not primary and floor < 2 and chains.dropped:   # they can matter only now
            chains = with_singles(chains, cons)
        G = _Graph(cons, _restrict(cons, chains, primary=primary, min_reach=floor))
        trim_heap()                         # the graph's temporaries, back to the OS
        if G.V < 2 or not len(G.half):
            continue
        found = _select(G)
        exhaustive = found.exhaustive
        if best is None or found.rank >= best.found.rank:
            best = Selection(G, found, chains)
    if best is None:
        return None
    return replace(best, found=replace(best.found, exhaustive=exhaustive), chains=chains)
