"""Closed-form statements of :ref:`theory-r4`, :ref:`theory-r5` and :ref:`theory-r8` (numpy only).

Every bound here is computed in exact rational arithmetic (:class:`fractions.Fraction`)
wherever an integer is certified, so that rounding can never claim one unit of rank
more than the mathematics proves. Floats given by the user are converted exactly (a
binary float is a rational number), which is conservative for the bounds below.

* :func:`gap_domination_ratio` -- R4, ``eps(N, g) = 1 / ((N-2)(g-1))``.
* :func:`gap_mixture_weight` -- R4, the weight of S2's output in S3's output.
* :func:`approximate_identity_rank_bound` -- R5, scalar or per-pair ``eps``.
* :func:`transcript_lower_bound` and :func:`channel_capacity_bits` -- R8.
"""

import math
import numbers
from fractions import Fraction

import numpy as np

from .._validation import check_int

__all__ = [
    "approximate_identity_rank_bound",
    "channel_capacity_bits",
    "gap_domination_ratio",
    "gap_denominator",
    "gap_mixture_weight",
    "transcript_lower_bound",
]


def _check_seq_len_gap(seq_len, gap):
    seq_len = check_int(seq_len, "seq_len")
    gap = check_int(gap, "gap")
    if seq_len < 3:
        raise ValueError(
            f"gap domination (R4 of the theory page) needs seq_len >= 3 (a query and two competing "
            f"keys); got seq_len={seq_len}."
        )
    if gap < 2:
        raise ValueError(
            f"gap domination (R4 of the theory page) needs a gap <x,z> - <x,y> >= 2 between the two "
            f"candidate overlaps; got gap={gap}."
        )
    return seq_len, gap


def gap_denominator(seq_len, gap):
    """Integer ``K(N, g) = (N-2)(g-1)`` with ``eps(N, g) = 1/K`` (:ref:`theory-r4`).

    Chains multiply these integers, so every ratio bound the library certifies is
    ``1/K`` for an integer ``K`` and all arithmetic on it is exact.

    Parameters
    ----------
    seq_len : int
        Sequence length ``N >= 3``.
    gap : int
        Overlap gap ``g = <x,z> - <x,y> >= 2``.

    Returns
    -------
    K : int

    Examples
    --------
    >>> from minip_learn.theory import gap_denominator
    >>> gap_denominator(3, 6), gap_denominator(5, 2)
    (5, 3)
    """
    seq_len, gap = _check_seq_len_gap(seq_len, gap)
    return (seq_len - 2) * (gap - 1)


def gap_domination_ratio(seq_len, gap, *, exact=False):
    """Largest kernel ratio ``alpha(x,z)/alpha(x,y)`` allowed by gap domination (R4).

    **Statement.** Let a nonnegative kernel head (any feature maps, value map and
    affine readout ``rho_x``) solve, with error strictly below 1/2 at the query, the
    three length-``N`` sequences ``S1 = (x, y, ..., y)``, ``S2 = (x, z, ..., z)`` and
    ``S3 = (x, y, z, ..., z)`` (``N-2`` copies of ``z``), where
    ``<x, z> - <x, y> = g >= 2``. Then

        ``alpha(x, z) / alpha(x, y) < eps(N, g) = 1 / ((N-2)(g-1))``.

    *Proof sketch.* S3's output at the query is the convex combination
    ``(1-mu) O1 + mu O2`` of S1's and S2's outputs with ``mu`` given by
    :func:`gap_mixture_weight`. Since ``O1 > t - 1/2`` and ``O2 > t + g - 1/2``
    (``t = <x, y>``), S3's error is above ``mu g - 1/2``, so ``mu < 1/g``.
    ``mu`` is monotone in ``alpha(x, x)``; its infimum over ``alpha(x,x) >= 0`` is
    ``(N-2) a_z / (a_y + (N-2) a_z)`` (the other end, ``(N-2)/(N-1) >= 1/2``, is
    excluded by ``mu < 1/g <= 1/2``), and ``(N-2) a_z / (a_y + (N-2) a_z) < 1/g``
    rearranges to the claim (it also forces ``a_y > 0``). The bound is tight: ratios
    below ``eps`` are realisable.

    Parameters
    ----------
    seq_len : int
        Sequence length ``N >= 3``.
    gap : int
        Overlap gap ``g >= 2``.
    exact : bool, default=False
        Return a :class:`fractions.Fraction` instead of a float.

    Returns
    -------
    eps : float or Fraction

    Raises
    ------
    ValueError
        If ``seq_len < 3`` or ``gap < 2``.

    Examples
    --------
    >>> from minip_learn.theory import gap_domination_ratio
    >>> gap_domination_ratio(3, 6)
    0.2
    >>> gap_domination_ratio(4, 3, exact=True)
    Fraction(1, 4)
    """
    K = gap_denominator(seq_len, gap)
    return Fraction(1, K) if exact else 1.0 / K


def gap_mixture_weight(seq_len, a_x, a_y, a_z):
    """Weight ``mu`` of S2's output in S3's output (:ref:`theory-r4`).

    With ``a_t = alpha(x, t)`` the query output of ``S3 = (x, y, z, ..., z)`` is
    ``(1 - mu) * out(S1) + mu * out(S2)`` where

        ``mu = (N-2)(a_x + (N-1) a_z) / ((N-1)(a_x + a_y + (N-2) a_z))``.

    Parameters
    ----------
    seq_len : int
        ``N >= 3``.
    a_x, a_y, a_z : float or ndarray
        Nonnegative kernel values of the query with itself, with ``y`` and with ``z``
        (arrays broadcast).

    Returns
    -------
    mu : float or ndarray

    Examples
    --------
    >>> from minip_learn.theory import gap_mixture_weight
    >>> float(gap_mixture_weight(3, 0.0, 1.0, 1.0))
    0.5
    """
    seq_len = check_int(seq_len, "seq_len", min_value=3)
    N = seq_len
    a_x, a_y, a_z = (np.asarray(a, dtype=np.float64) for a in (a_x, a_y, a_z))
    if (a_x < 0).any() or (a_y < 0).any() or (a_z < 0).any():
        raise ValueError("kernel values a_x, a_y, a_z must be nonnegative.")
    mu = (N - 2) * (a_x + (N - 1) * a_z) / ((N - 1) * (a_x + a_y + (N - 2) * a_z))
    return mu if mu.ndim else float(mu)


# ---------------------------------------------------------------------------------
# R5: approximate identity => rank
# ---------------------------------------------------------------------------------
def _as_fraction(value, name):
    if isinstance(value, Fraction):
        f = value
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        f = Fraction(int(value))
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite; got {value}.")
        f = Fraction(float(value))
    else:
        raise ValueError(f"{name} must be a real number; got {value!r}.")
    if f < 0:
        raise ValueError(f"{name} must be >= 0; got {value}.")
    return f


def _rank_from_sums(n, sum_sq, max_row_sum, max_col_sum=None):
    """Certified minimum rank from exact summary statistics of an eps matrix.

    ``B`` is ``n x n`` with unit diagonal and ``0 <= B_ij < eps_ij`` off the diagonal.
    ``sum_sq = sum_{i != j} eps_ij^2``; ``max_row_sum``/``max_col_sum`` are the largest
    off-diagonal row/column sums of ``eps``. Returns ``(rank, frobenius_value,
    diagonally_dominant)``: ``rank(B) >= tr(B)^2/||B||_F^2 > n^2/(n + sum_sq)``
    (Schur + Cauchy-Schwarz; strict because every off-diagonal entry is strictly below
    its bound), and ``rank(B) = n`` when a row (or column) sum of ``eps`` is at most 1
    in every row (column), by strict diagonal dominance.
    """
    if n <= 1:
        return max(n, 1), Fraction(max(n, 1)), True
    value = Fraction(n * n) / (n + sum_sq)
    rank = min(n, math.floor(value) + 1)
    dominant = max_row_sum <= 1 or (max_col_sum is not None and max_col_sum <= 1)
    if dominant:
        rank = n
    return rank, value, dominant


def _sums_from_denominators(K):
    """Exact ``(sum_sq, max_row_sum, max_col_sum)`` of ``eps = 1/K`` (diagonal ignored).

    ``K`` is an integer (object or int64) matrix; entries ``<= 0`` are not allowed off
    the diagonal.
    """
    K = np.asarray(K)
    n = K.shape[0]
    off = ~np.eye(n, dtype=bool)
    vals = K[off]
    if vals.dtype == object:
        try:
            vals, K = vals.astype(np.int64), K.astype(np.int64)
        except OverflowError:
            pass
    if len(vals) and (vals < 1).any():
        i, j = (int(v) for v in np.argwhere(off & (K < 1))[0])
        raise ValueError(f"eps denominators must be integers >= 1; got {K[i, j]} at ({i}, {j}).")
    uniq, counts = np.unique(vals, return_counts=True)
    sum_sq = sum((Fraction(int(c), int(k) ** 2) for k, c in zip(uniq, counts)), Fraction(0))

    def _max_sum(M):
        # per-row counts of each distinct value; distinct count rows summed exactly
        if not len(uniq):
            return Fraction(0)
        idx = np.searchsorted(uniq, M[off].astype(uniq.dtype)).reshape(n, n - 1)
        counts = np.zeros((n, len(uniq)), dtype=np.int64)
        np.add.at(counts, (np.repeat(np.arange(n), n - 1), idx.ravel()), 1)
        inv = [Fraction(1, int(k)) for k in uniq]
        return max(sum((int(c) * f for c, f in zip(row, inv) if c), Fraction(0))
                   for row in np.unique(counts, axis=0))

    return sum_sq, _max_sum(K), _max_sum(K.T)


def _rank_from_denominators(K):
    """Certified rank of an ``n x n`` integer denominator matrix (``eps_ij = 1/K_ij``)."""
    n = len(K)
    if n <= 1:
        return _rank_from_sums(n, Fraction(0), Fraction(0))
    return _rank_from_sums(n, *_sums_from_denominators(K))


def approximate_identity_rank_bound(n, eps, *, return_value=False):
    """Certified minimum rank of a nonnegative kernel that is an approximate identity (R5).

    **Statement.** Let ``B`` be an ``n x n`` matrix with unit diagonal and
    ``0 <= B_ij < eps`` off the diagonal (``B_ij = alpha(x_i, k_j) / alpha(x_i, k_i)``
    for queries ``x_i`` and keys ``k_j`` of a rank-``r`` kernel head, so
    ``rank(B) <= r``). By Schur's inequality and Cauchy-Schwarz,
    ``rank(B) >= tr(B)^2 / ||B||_F^2``, hence

        ``r > n / (1 + (n-1) eps^2)``,  and ``r >= n`` when ``(n-1) eps <= 1``

    (strict diagonal dominance). With a bound ``eps_ij`` per pair the same argument
    gives ``r > n^2 / (n + sum_{i != j} eps_ij^2)``, and ``r >= n`` when every row (or
    every column) satisfies ``sum_{j != i} eps_ij <= 1``.

    Parameters
    ----------
    n : int
        Number of queries (and keys), ``n >= 1``.
    eps : float, Fraction or array-like of shape (n, n)
        A common bound on the off-diagonal entries, or one bound per pair (the diagonal
        is ignored). Floats are used exactly as the binary numbers they are.
    return_value : bool, default=False
        Also return the exact real bound ``n^2 / (n + sum eps_ij^2)`` (a Fraction).

    Returns
    -------
    rank : int
        The smallest integer rank consistent with the statement: the certified minimum
        rank.
    value : Fraction
        Only with ``return_value=True``.

    Raises
    ------
    ValueError
        On ``n < 1``, a negative or non-finite ``eps``, or a matrix of the wrong shape.

    Examples
    --------
    The R6 family (:ref:`theory-r6`): 46 queries, ``eps = 1/5`` gives ``r > 16.4``:

    >>> from fractions import Fraction
    >>> from minip_learn.theory import approximate_identity_rank_bound
    >>> approximate_identity_rank_bound(46, Fraction(1, 5))
    17
    >>> approximate_identity_rank_bound(6, Fraction(1, 5))   # (n-1) eps <= 1: rank n
    6
    >>> approximate_identity_rank_bound(6, 0.2)   # the float 0.2 is a bit above 1/5
    5
    >>> import numpy as np
    >>> approximate_identity_rank_bound(3, np.full((3, 3), 0.5))
    3
    """
    n = check_int(n, "n", min_value=1)
    if np.ndim(eps) == 0:
        e = _as_fraction(eps, "eps")
        if n == 1:
            rank, value = 1, Fraction(1)
        else:
            rank, value, _ = _rank_from_sums(n, n * (n - 1) * e * e, (n - 1) * e, (n - 1) * e)
    else:
        E = np.asarray(eps, dtype=object)
        if E.shape != (n, n):
            raise ValueError(f"eps must be a scalar or have shape ({n}, {n}); got {E.shape}.")
        F = [[_as_fraction(E[i, j], "eps") if i != j else Fraction(0) for j in range(n)]
             for i in range(n)]
        sum_sq = sum((F[i][j] ** 2 for i in range(n) for j in range(n)), Fraction(0))
        row = max(sum(F[i], Fraction(0)) for i in range(n))
        col = max(sum((F[i][j] for i in range(n)), Fraction(0)) for j in range(n))
        rank, value, _ = _rank_from_sums(n, sum_sq, row, col)
    return (rank, value) if return_value else rank


# ---------------------------------------------------------------------------------
# R8: transcript bound
# ---------------------------------------------------------------------------------
def transcript_lower_bound(n_answers, alphabet_size):
    """Bits a deterministic sketch model must communicate across tokens (:ref:`theory-r8`).

    **Statement.** For deterministic multi-head, multi-layer sketch models whose
    cross-token channels carry symbols from a finite alphabet, computing ``q``
    independent answers, each one of ``s + 1`` possible values, requires a transcript
    of at least ``q * log2(s + 1)`` bits.

    Parameters
    ----------
    n_answers : int
        Number ``q >= 0`` of independent answers.
    alphabet_size : int
        ``s >= 0``; every answer takes one of ``s + 1`` values (for Min-IP over
        ``m``-bit tokens, ``s = m``: targets ``0..m``).

    Returns
    -------
    bits : float

    Examples
    --------
    >>> from minip_learn.theory import transcript_lower_bound
    >>> transcript_lower_bound(4, 15)
    16.0
    """
    q = check_int(n_answers, "n_answers", min_value=0)
    s = check_int(alphabet_size, "alphabet_size", min_value=0)
    return float(q * math.log2(s + 1))


def channel_capacity_bits(n_heads, n_layers, rank, bits_of_precision):
    """Channel capacity ``heads x layers x rank x bits`` of a sketch model (:ref:`theory-r8`).

    Each head of each layer sends a rank-``r`` sketch, i.e. ``r`` numbers of
    ``bits_of_precision`` bits, across tokens; compare with
    :func:`transcript_lower_bound` -- a model whose capacity is below the transcript
    bound cannot compute the answers exactly.

    Parameters
    ----------
    n_heads, n_layers, rank, bits_of_precision : int
        All ``>= 1``.

    Returns
    -------
    bits : int

    Examples
    --------
    >>> from minip_learn.theory import channel_capacity_bits, transcript_lower_bound
    >>> channel_capacity_bits(2, 1, 4, 16)
    128
    >>> channel_capacity_bits(1, 1, 1, 8) >= transcript_lower_bound(4, 15)
    False
    """
    n_heads = check_int(n_heads, "n_heads", min_value=1)
    n_layers = check_int(n_layers, "n_layers", min_value=1)
    rank = check_int(rank, "rank", min_value=1)
    bits = check_int(bits_of_precision, "bits_of_precision", min_value=1)
    return n_heads * n_layers * rank * bits
