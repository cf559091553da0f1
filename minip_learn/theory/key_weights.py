"""Grouped key weights: nonnegative kernel heads of small rank for the full task.

A *key-weight group* is a set of query tokens that share one nonnegative weight per key
token, ``alpha(x, t) = c_g(t)`` for every query ``x`` of group ``g``. With the value map
``v(t) = t`` and the readout ``rho_x(u) = <x, u> + b`` of :ref:`theory-r3`, the output at
a query ``x`` of the multiset ``{x, y, z}`` is the ``c_g``-weighted mean of the overlaps
``<x, t>`` plus ``b``. It exceeds the target ``min <x, t>`` by the weighted mean *excess*
``E = sum_t c_g(t) (<x, t> - min) / sum_t c_g(t)``, so with ``b = -E_max / 2`` every error
is at most ``E_max / 2``: the head solves the task when ``E_max < 1``. For a group,
``E < 1`` on every multiset is the linear condition

    ``sum_(t in {x, y, z}) c_g(t) (<x, t> - min - 1) < 0``      for every member ``x``,

(multiplicities counted), so whether a set of queries can share one weight vector is a
linear program (:func:`group_key_weights`). :func:`grouped_key_weights` puts the queries
into groups greedily, each query into the first group whose program stays feasible. The
kernel ``[alpha(x, t)]`` has one distinct row per group: its rank is at most the number
of groups, which makes it an upper bound on ``r*(m)``.

At ``m = 2, 3`` one group (weights decreasing with ``|t|``) solves the whole task, and
two groups do at ``m = 4``; the linear programs run in :mod:`scipy.optimize`.
"""

import numpy as np
from sklearn.utils import Bunch

from .._validation import check_int, distinct_tokens

__all__ = []  # public home: the package minip_learn.theory

#: the feasibility margin a group's program must exceed (its weights sum to 1)
MARGIN = 1e-7


def _excess_terms(G, x, c):
    """``sum_t c(t) (<x, t> - min - 1)`` over every multiset ``{x, y, z}``: a (T, T)
    matrix over ``(y, z)``, and the weighted excess ``E`` on the same grid."""
    o = G[x].astype(float)
    omin = np.minimum.outer(o, o)
    cx = c[x]
    num = cx * (o[x] - omin) + c[:, None] * (o[:, None] - omin) + c[None, :] * (o[None, :] - omin)
    den = cx + c[:, None] + c[None, :]
    return num - den, num, den


def key_weight_excess(tokens, query_group, key_weights):
    """Largest weighted excess ``E`` over every query and multiset of the full task.

    Parameters
    ----------
    tokens : ndarray of shape (n_tokens, n_bits)
        The task's tokens (every multiset of three of them is a sequence).
    query_group : ndarray of shape (n_tokens,)
        The group of each token as a query.
    key_weights : ndarray of shape (n_groups, n_tokens)
        Nonnegative weights ``c_g(t)``.

    Returns
    -------
    excess : float
        ``max E``; the head of :func:`grouped_key_weights` solves the task with error
        ``excess / 2`` when it is below 1 (``inf`` when a multiset has no weight).

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.theory import full_task_tokens, key_weight_excess
    >>> T = full_task_tokens(2)
    >>> uniform = np.ones((1, 4))        # one group, every key weighted alike
    >>> key_weight_excess(T, np.zeros(4, dtype=int), uniform)   # (11, 11, 00): 4/3
    1.3333333333333333
    """
    T = np.asarray(tokens, dtype=np.int64)
    G = T @ T.T
    worst = 0.0
    for x in range(len(T)):
        _, num, den = _excess_terms(G, x, np.asarray(key_weights[query_group[x]], float))
        if (den <= 0).any():
            return float("inf")
        worst = max(worst, float((num / den).max()))
    return worst


def _keeps(tokens, x, c, margin):
    """Whether weights ``c`` keep the excess of query ``x`` below 1 on every multiset
    with half the group's ``margin`` (the standard of :func:`group_key_weights`)."""
    T = np.asarray(tokens, dtype=np.int64)
    return bool(_excess_terms(T @ T.T, x, c)[0].max() <= -margin / 2)


def _rows_of(G, x, pairs):
    """LP rows (token ids, coefficients) of the multisets ``{x, y, z}`` for ``pairs``."""
    o = G[x]
    ids = np.column_stack([np.full(len(pairs), x), pairs])
    ov = o[ids]
    coef = ov - ov.min(axis=1, keepdims=True) - 1.0
    return ids, coef


def _solve(n_tokens, ids, coef):
    """Maximise the margin ``s``: ``sum c(t) coef + s <= 0``, ``c >= 0``, ``sum c = 1``."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    r = len(ids)
    rows = np.repeat(np.arange(r), ids.shape[1] + 1)
    cols = np.column_stack([ids, np.full(r, n_tokens)]).ravel()
    vals = np.column_stack([coef, np.ones(r)]).ravel()
    A = csr_matrix((vals, (rows, cols)), shape=(r, n_tokens + 1))     # repeats summed
    cost = np.zeros(n_tokens + 1)
    cost[-1] = -1.0
    eq = np.ones((1, n_tokens + 1))
    eq[0, -1] = 0.0
    res = linprog(cost, A_ub=A, b_ub=np.zeros(r), A_eq=eq, b_eq=[1.0],
                  bounds=[(0, None)] * n_tokens + [(None, 1.0)], method="highs")
    if res.status != 0:
        return None, -np.inf
    return np.maximum(res.x[:-1], 0.0), float(-res.fun)


def group_key_weights(tokens, members, *, max_rounds=30, batch=64):
    """One weight vector shared by the query tokens ``members``, or None.

    The linear program of this module's docstring, solved with constraint generation:
    it starts from the multisets ``{x, x, x}``, ``{x, x, t}`` and ``{x, t, t}`` of every
    member ``x`` and adds, per round and member, the ``batch`` multisets that the
    current weights violate most, until none is violated.

    Parameters
    ----------
    tokens : ndarray of shape (n_tokens, n_bits)
    members : sequence of int
        Rows of ``tokens``: the group's queries.
    max_rounds : int, default=30
        Rounds of constraint generation before giving up (None is returned).
    batch : int, default=64
        Multisets added per member and round.

    Returns
    -------
    weights : ndarray of shape (n_tokens,) or None
        Weights summing to 1 under which every member's weighted excess is below 1 on
        every multiset (None: the program is infeasible, or did not settle).
    margin : float
        The program's margin (``-inf`` when infeasible).
    """
    T = np.asarray(tokens, dtype=np.int64)
    G = T @ T.T
    n = len(T)
    ids, coef = [], []
    for x in members:
        base = np.column_stack([np.r_[x, np.full(n, x), np.arange(n)],
                                np.r_[x, np.arange(n), np.arange(n)]])
        a, b = _rows_of(G, x, base)
        ids.append(a)
        coef.append(b)
    for _ in range(max_rounds):
        c, s = _solve(n, np.concatenate(ids), np.concatenate(coef))
        if c is None or s <= MARGIN:
            return None, s
        # every multiset must keep at least half the program's margin
        worst, lower = -np.inf, np.tril(np.full((n, n), np.inf), -1)
        for x in members:
            terms = _excess_terms(G, x, c)[0] + s / 2 - lower       # pairs y <= z only
            worst = max(worst, float(terms.max()))
            k = min(batch, n * n)
            top = np.argpartition(terms.ravel(), -k)[-k:]
            top = top[terms.ravel()[top] > 0]
            if len(top):
                a, b = _rows_of(G, x, np.column_stack(np.unravel_index(top, (n, n))))
                ids.append(a)
                coef.append(b)
        if worst <= 0:
            return c, s
    return None, s


def grouped_key_weights(n_bits=None, *, tokens=None, order="weight", max_groups=None,
                        progress=False):
    """Group the query tokens of the full task greedily by shared key weights.

    Parameters
    ----------
    n_bits : int, default=None
        Bits per token (every token).
    tokens : array-like of shape (n_tokens, n_bits), default=None
        Another token set.
    order : {"weight", "index"}, default="weight"
        The order queries are placed in: by decreasing weight (ties by index), or by
        index.
    max_groups : int, default=None
        Stop (return None) once more groups than this would be needed.
    progress : bool, default=False
        Show a :mod:`tqdm` bar over the queries.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch` or None
        ``tokens``; ``query_group`` (n_tokens,); ``key_weights`` (n_groups, n_tokens);
        ``rank`` (the number of groups); ``excess`` (:func:`key_weight_excess`, below
        1); ``bias`` (``-excess / 2``, the readout bias); ``max_error``
        (``excess / 2``, computed in float64 from the weights). None when
        ``max_groups`` is exceeded.

    Examples
    --------
    >>> from minip_learn.theory import grouped_key_weights
    >>> res = grouped_key_weights(3)
    >>> res.rank, res.max_error < 0.5
    (1, True)
    """
    from tqdm.auto import tqdm

    if tokens is None:
        from .full_task import full_task_tokens

        toks = full_task_tokens(n_bits)
    else:
        toks = distinct_tokens(np.asarray(tokens, dtype=np.uint8))
    if max_groups is not None:
        max_groups = check_int(max_groups, "max_groups", min_value=1)
    if order not in ("weight", "index"):
        raise ValueError(f"order must be 'weight' or 'index'; got {order!r}.")
    weight = toks.sum(1)
    queue = sorted(range(len(toks)), key=lambda x: (-int(weight[x]), x)) \
        if order == "weight" else list(range(len(toks)))
    # two queries with at least 2 bits each outside the other never share a group: each
    # forces its own token's weight below the other's (R4 with N = 3)
    T = toks.astype(np.int64)
    outside = T.sum(1)[:, None] - T @ T.T                      # |x \ u|
    conflict = (outside >= 2) & (outside.T >= 2)
    groups, weights, margins = [], [], []
    for x in tqdm(queue, desc="key-weight groups", disable=not progress):
        for g, members in enumerate(groups):
            if conflict[x, members].any():
                continue
            if _keeps(toks, x, weights[g], margins[g]):   # the group's weights serve x
                members.append(x)
                break
            c, s = group_key_weights(toks, members + [x])
            if c is not None:
                members.append(x)
                weights[g], margins[g] = c, s
                break
        else:
            if max_groups is not None and len(groups) >= max_groups:
                return None
            c, s = group_key_weights(toks, [x])
            groups.append([x])
            weights.append(c)
            margins.append(s)
    query_group = np.empty(len(toks), dtype=np.int64)
    for g, members in enumerate(groups):
        query_group[members] = g
    W = np.array(weights)
    excess = key_weight_excess(toks, query_group, W)
    return Bunch(tokens=toks, query_group=query_group, key_weights=W, rank=len(groups),
                 excess=excess, bias=-excess / 2, max_error=excess / 2)
