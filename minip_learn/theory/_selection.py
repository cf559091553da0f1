"""Rows of a certificate: the pruning shared by certify and the designs (numpy only).

* :func:`reciprocal` and :func:`reciprocals` -- ``1/K`` as floats for integer
  denominators of any size.
* :func:`prune_rows` -- the rows of a denominator matrix kept after dropping rows (and
  their columns) while that raises the R5 bound (:ref:`theory-r5`); the rank of each
  candidate set is :func:`~minip_learn.theory.bounds.rank_from_sums`.
"""

import functools

import numpy as np

from .bounds import denominator_sums, rank_from_sums

__all__ = ["IMPROVEMENT", "prune_rows", "reciprocal", "reciprocals"]

#: a dropped row must raise ``n^2 / (n + sum eps_ij^2)`` by more than this factor, so
#: that rounding never decides a drop
IMPROVEMENT = 1 + 1e-12


def reciprocal(k):
    """``1/k`` as a float, 0.0 beyond the float range (never raises on huge ints)."""
    k = int(k)
    return 0.0 if k.bit_length() > 1000 else 1.0 / k


def reciprocals(K):
    """``1/K`` elementwise as a float array (:func:`reciprocal` for huge integers)."""
    K = np.asarray(K)
    if K.dtype == object:
        try:
            K = K.astype(np.int64)
        except OverflowError:
            return np.array([reciprocal(k) for k in K.ravel()],
                            dtype=np.float64).reshape(K.shape)
    return 1.0 / K.astype(np.float64)


def prune_rows(K):
    """Drop rows/columns while that improves the bound; returns the kept indices.

    Rows are dropped greedily, each time the one whose removal gives the largest
    ``n^2 / (n + sum eps_ij^2)``, while that value grows; the kept set is the largest
    one of highest certified rank along the way (row dominance counts for the whole
    matrix only).

    Parameters
    ----------
    K : array-like of shape (n, n)
        Integer denominators ``>= 1`` off the diagonal (``eps_ij = 1/K_ij``).

    Returns
    -------
    keep : list of int
        Indices of the kept rows, increasing.
    """
    K = np.asarray(K)
    n = len(K)
    if n <= 2:
        return list(range(n))
    E = reciprocals(K)
    np.fill_diagonal(E, 0.0)
    E2 = E * E
    rows, cols = E2.sum(axis=1), E2.sum(axis=0)
    alive = np.ones(n, dtype=bool)
    S = float(E2.sum())

    def rank(m, S, max_row_sum=None):
        kept = alive.copy()
        exact = functools.cache(lambda: denominator_sums(K[np.ix_(kept, kept)]))
        return rank_from_sums(m, S, max_row_sum, exact_sum_sq=lambda: exact()[0],
                              exact_max_row_sum=lambda: exact()[1])[0]

    best = (rank(n, S, E.sum(axis=1).max()), n)
    dropped = []
    m = n
    while m > 2:
        drop = S - rows - cols
        values = np.where(alive, (m - 1) ** 2 / (m - 1 + drop), -np.inf)
        i = int(np.argmax(values))
        if not values[i] > m * m / (m + S) * IMPROVEMENT:
            break
        alive[i] = False
        dropped.append(i)
        S = float(drop[i])
        rows -= E2[:, i]
        cols -= E2[i, :]
        m -= 1
        est = rank(m, S)
        if est > best[0]:
            best = (est, m)
    keep_n = best[1]
    gone = set(dropped[: n - keep_n])
    return [i for i in range(n) if i not in gone]
