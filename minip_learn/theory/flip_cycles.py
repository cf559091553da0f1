"""Odd flip cycles: no nonnegative kernel head of rank 2 solves a family (numpy only).

R5 bounds the rank through the trace of a matrix of ratio bounds; at length 3 and few
bits its bounds stop at 2. A second argument, specific to rank 2, uses only the *order*
of kernel values that R4 forces (:ref:`theory-rank-two`):

*Lemma A (R4, strict).* If a head solves ``(x, y, y)``, ``(x, z, z)`` and ``(x, y, z)``
at the query ``x`` with ``<x, z> - <x, y> = g >= 2`` (``z = x`` allowed), then
``alpha(x, z) < alpha(x, y)``. For ``g = 2``, with ``H_t = alpha(x, t) P_t``, the three
solved inequalities add up to ``2 (alpha(x, y) - alpha(x, z)) > 0``; for larger ``g``
R4 gives the ratio ``< 1/(g - 1) <= 1``.

*Lemma B (two prototypes).* A nonnegative matrix of rank at most 2 is
``alpha(x, t) = <u_x, p_t>`` with ``u_x, p_t`` in the closed positive quadrant (its
rows lie in a two-dimensional space whose nonnegative part is a cone spanned by two
nonnegative rows). Let ``theta_x`` be the angle of ``u_x``.

*The flip graph.* A vertex ``v = (x, lo, hi)`` is a query with two keys that Lemma A
orders, ``alpha(x, hi) < alpha(x, lo)``: ``<u_x, p_lo - p_hi> > 0``. A query ``x'``
*flips* ``v`` when Lemma A orders the same two keys the other way at ``x'``. Two
vertices are joined when each one's query flips the other. For a vertex with a
neighbour, ``p_lo - p_hi`` has one positive and one negative coordinate, so
``<(cos t, sin t), p_lo - p_hi>`` is strictly monotone on ``[0, pi/2]`` and every
neighbour's angle lies strictly on the other side of its zero from ``theta_x``: each
vertex is a strict local minimum or a strict local maximum of the angle over its
neighbours, and two joined vertices cannot be of the same kind. The flip graph of a
head of rank 2 is therefore bipartite, and **an odd cycle in it proves rank >= 3**.

On the full task over ``m >= 5`` bits the five pairs of bits ``{1,2}, {3,4}, {5,1},
{2,3}, {4,5}`` (consecutive ones disjoint, a 5-cycle of the Kneser graph) give one:
vertex ``i`` is ``(e_i, ~e_i, e_i)`` (overlaps 0 and 2), and the queries of both
neighbours see ``~e_i`` at 2 and ``e_i`` at 0. At ``m = 4`` the flip graph of the full
task is bipartite (three disjoint edges), as it must be since ``r*(4) = 2``.
"""

import numpy as np
from sklearn.utils import Bunch

from .._validation import check_int, check_sequences
from ..compact import is_compact
from ._docs import verify_doc

__all__ = []  # public home: the package minip_learn.theory

#: the five pairs of bit positions of the 5-cycle (consecutive ones disjoint)
_PAIRS = ((0, 1), (2, 3), (4, 0), (1, 2), (3, 4))


def flip_cycle(n_bits):
    """An odd flip cycle of the full length-3 task over ``n_bits >= 5`` bits: a proof
    that no nonnegative kernel head of rank 2 solves it.

    Parameters
    ----------
    n_bits : int
        Bits per token, at least 5 (at ``m <= 4`` the flip graph of the full task is
        bipartite and ``r*(m) <= 2``).

    Returns
    -------
    cycle : :class:`~sklearn.utils.Bunch`
        ``queries``, ``lo``, ``hi`` (arrays of shape ``(5, n_bits)``, uint8): vertex
        ``i`` is ``(queries[i], lo[i], hi[i])``, joined to vertices ``i - 1`` and
        ``i + 1`` (cyclically); ``n_bits``; ``rank`` (3, the rank it proves); and
        ``sequences`` (shape ``(45, 3, n_bits)``): the multisets of Lemma A it uses,
        the query first.

    Examples
    --------
    >>> from minip_learn.theory import flip_cycle, verify_flip_cycle
    >>> cycle = flip_cycle(5)
    >>> len(cycle.queries), cycle.rank, len(cycle.sequences)
    (5, 3, 45)
    >>> verify_flip_cycle(cycle)
    True
    """
    m = check_int(n_bits, "n_bits", min_value=1)
    if m < 5:
        raise ValueError(f"n_bits must be >= 5 for a flip cycle of the full task (at "
                         f"n_bits <= 4 its flip graph is bipartite); got {m}.")
    queries = np.zeros((5, m), dtype=np.uint8)
    for i, pair in enumerate(_PAIRS):
        queries[i, list(pair)] = 1
    cycle = Bunch(queries=queries, lo=1 - queries, hi=queries.copy(), n_bits=m, rank=3)
    cycle.sequences = np.array(sorted(set(_sequences(cycle))), dtype=np.uint8)
    return cycle


def _triples(cycle):
    """The ``(x, y, z)`` of every use of Lemma A: each vertex at its own query
    (``y = lo``, ``z = hi``), and each vertex at both neighbours' queries (reversed)."""
    q, lo, hi = (np.asarray(cycle[k]) for k in ("queries", "lo", "hi"))
    n = len(q)
    for i in range(n):
        yield q[i], lo[i], hi[i]
        for j in ((i - 1) % n, (i + 1) % n):
            yield q[j], hi[i], lo[i]


def _sequences(cycle):
    """The three multisets of each use of Lemma A, the query first, as tuples."""
    for x, y, z in _triples(cycle):
        for a, b in ((y, y), (z, z), (y, z)):
            a, b = sorted((tuple(int(v) for v in a), tuple(int(v) for v in b)))
            yield (tuple(int(v) for v in x), a, b)


@verify_doc
def verify_flip_cycle(cycle, X=None, *, raise_on_failure=True):
    """Check an odd flip cycle, independently of how it was found.

    Checks that the cycle is odd (at least 3 vertices), that every vertex's two keys
    are ordered by Lemma A at its query (``<x, hi> - <x, lo> >= 2``), that the queries
    of both neighbours of each vertex order them the other way (by at least 2), and
    that the family holds the three multisets of every such use. Then no nonnegative
    kernel head of rank 2 solves the family (module docstring).

    Parameters
    ----------
    cycle : :class:`~sklearn.utils.Bunch` or dict
        With ``queries``, ``lo``, ``hi`` (0/1 arrays of equal shape ``(n, n_bits)``).
    X : array-like of shape (n_samples, 3, n_bits) or CompactFamily, default=None
        The family; None: the full task over ``n_bits`` bits, which holds every
        multiset of three tokens.
    %(raise_on_failure)s

    %(valid)s

    Examples
    --------
    >>> from minip_learn.datasets import make_full_task
    >>> from minip_learn.theory import flip_cycle, verify_flip_cycle
    >>> cycle = flip_cycle(5)
    >>> verify_flip_cycle(cycle), verify_flip_cycle(cycle, make_full_task(5).X)
    (True, True)
    >>> short = {k: cycle[k][:4] for k in ("queries", "lo", "hi")}   # an even cycle
    >>> verify_flip_cycle(short, raise_on_failure=False)
    False
    """
    try:
        q, lo, hi = (np.asarray(cycle[k]) for k in ("queries", "lo", "hi"))
    except (KeyError, TypeError):
        raise ValueError("cycle must hold 'queries', 'lo' and 'hi' arrays.") from None
    if not (q.ndim == 2 and q.shape == lo.shape == hi.shape
            and np.isin(np.concatenate([q, lo, hi]), (0, 1)).all()):
        raise ValueError("cycle's 'queries', 'lo' and 'hi' must be 0/1 arrays of one "
                         "shape (n, n_bits).")
    q, lo, hi = (a.astype(np.int64) for a in (q, lo, hi))
    n = len(q)
    problem = None
    if n < 3 or n % 2 == 0:
        problem = f"a cycle of {n} vertices is not odd (or shorter than 3)"
    for i in range(n if problem is None else 0):
        if q[i] @ hi[i] - q[i] @ lo[i] < 2:
            problem = f"vertex {i}: its query does not order its keys by a gap >= 2"
            break
        for j in ((i - 1) % n, (i + 1) % n):
            if q[j] @ lo[i] - q[j] @ hi[i] < 2:
                problem = f"vertex {i}: the query of vertex {j} does not flip it"
                break
        if problem:
            break
    if problem is None and X is not None:
        problem = _missing(cycle, X, q.shape[1])
    if problem is not None:
        if raise_on_failure:
            raise ValueError(f"flip cycle rejected: {problem}.")
        return False
    return True


def _missing(cycle, X, m):
    """The first multiset of the cycle that the family ``X`` lacks, or None."""
    if is_compact(X):
        X = X.to_sequences()
    X, _ = check_sequences(X, binary=True)
    if X.shape[1:] != (3, m):
        raise ValueError(f"X must hold sequences of length 3 over {m} bits; got shape "
                         f"{X.shape}.")
    present = {tuple(sorted(tuple(int(v) for v in t) for t in seq)) for seq in X}
    for x, a, b in _sequences(cycle):
        if tuple(sorted((x, a, b))) not in present:
            return f"the family lacks the multiset {[x, a, b]}"
    return None
