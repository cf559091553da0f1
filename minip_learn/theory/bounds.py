"""Closed-form statements of :ref:`theory-r4`, :ref:`theory-r5` and :ref:`theory-r8` (numpy only).

An integer bound is the smallest integer strictly greater than a real number
(:func:`integer_above`), and every comparison of a real number with an integer is
decided by one rule (:func:`resolve_near_integer`): exact numbers
(:class:`fractions.Fraction`, integers) as they are; a float as it is when it lies
further than ``INTEGER_TOLERANCE`` (relative) from every integer; otherwise by the
exact rational value, computed from the exact ratio bounds where they are known
(every ``eps = 1/K`` of the library has an integer ``K``). Rounding can therefore
never claim one unit of rank more than the mathematics proves. Floats given by the
user are read exactly (a binary float is a rational number), which is conservative for
the bounds below.

* :func:`gap_domination_ratio` -- R4, ``eps(N, g) = 1 / ((N-2)(g-1))``.
* :func:`gap_mixture_weight` -- R4, the weight of S2's output in S3's output.
* :func:`approximate_identity_rank_bound` -- R5, scalar or per-pair ``eps``.
* :func:`rank_from_sums` and :func:`rank_from_denominators` -- R5, the rank every
  certificate and design computes, from summary statistics or integer denominators
  (:func:`denominator_sums`).
* :func:`transcript_lower_bound` and :func:`channel_capacity_bits` -- R8.
"""

import math
import numbers
from fractions import Fraction

import numpy as np

from .._validation import check_int

__all__ = []  # public home: the package minip_learn.theory


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


#: relative distance to the nearest integer within which a float is decided exactly
#: (:func:`resolve_near_integer`)
INTEGER_TOLERANCE = 1e-9


def resolve_near_integer(value, exact=None):
    """``value`` as a number whose comparison with any integer is decided correctly.

    This is the one rule by which the library decides a real number against an
    integer (``floor``, ``<= 1``): a :class:`fractions.Fraction` or an integer is
    exact and is returned as it is; a float further than
    ``INTEGER_TOLERANCE * max(1, |value|)`` from the nearest integer is returned as it
    is (the rounding error of the float computations here is orders of magnitude
    smaller, so the float lies on the same side of every integer as the real number it
    approximates); a float within that distance cannot tell, and the exact rational
    number decides: ``exact()`` where the caller can compute it from the exact ratio
    bounds, otherwise the float itself read as the binary rational it is.

    Parameters
    ----------
    value : float, int or Fraction
        The real number, possibly computed in floating point.
    exact : callable or None, default=None
        Called without arguments only when ``value`` is a float near an integer;
        returns the exact value (a Fraction or an integer).

    Returns
    -------
    value : float, int or Fraction
        ``value`` itself, or the exact value as a Fraction.

    Examples
    --------
    >>> from fractions import Fraction
    >>> from minip_learn.theory.bounds import resolve_near_integer
    >>> resolve_near_integer(2.5)
    2.5
    >>> resolve_near_integer(14.999999999999998, exact=lambda: Fraction(15))
    Fraction(15, 1)
    """
    if not isinstance(value, float):
        if isinstance(value, (Fraction, int, numbers.Integral)):
            return value
        value = float(value)
    if not math.isfinite(value):
        return value
    if abs(value - round(value)) > INTEGER_TOLERANCE * max(1.0, abs(value)):
        return value
    return Fraction(value) if exact is None else Fraction(exact())


def integer_above(value, exact=None):
    """Smallest integer strictly greater than a real number: ``floor(value) + 1``.

    A strict bound ``r > value`` on an integer ``r`` certifies exactly this integer.
    The floor is taken on :func:`resolve_near_integer` of ``value``, so a float
    within ``INTEGER_TOLERANCE`` of an integer is decided in exact arithmetic.

    Parameters
    ----------
    value : float, int or Fraction
        The real number.
    exact : callable or None, default=None
        Returns the exact value of ``value`` (see :func:`resolve_near_integer`).

    Returns
    -------
    k : int

    Examples
    --------
    >>> from fractions import Fraction
    >>> from minip_learn.theory.bounds import integer_above
    >>> integer_above(Fraction(46 * 25, 70)), integer_above(3), integer_above(2.9999)
    (17, 4, 3)

    R5 at ``n = 36``, ``eps = 1/5``: the quotient is 15 exactly, a little less in floats.

    >>> q = 36 * 36 / (36 + 36 * 35 * (1 / 5) ** 2)
    >>> q
    14.999999999999998
    >>> integer_above(q, exact=lambda: Fraction(36 * 36) / (36 + Fraction(36 * 35, 25)))
    16
    """
    return math.floor(resolve_near_integer(value, exact)) + 1


def rank_from_sums(n, sum_sq, max_row_sum=None, max_col_sum=None, *, exact_sum_sq=None,
                   exact_max_row_sum=None, exact_max_col_sum=None):
    """Certified minimum rank from the summary statistics of an eps matrix (:ref:`theory-r5`).

    ``B`` is ``n x n`` with unit diagonal and ``0 <= B_ij < eps_ij`` off the diagonal.
    ``rank(B) >= tr(B)^2 / ||B||_F^2 > n^2 / (n + sum_sq)`` (Schur and Cauchy-Schwarz;
    strict because every off-diagonal entry is strictly below its bound), so the rank
    is at least ``integer_above(n^2 / (n + sum_sq))``, capped at ``n``; and
    ``rank(B) = n`` when every row (or every column) of ``eps`` sums to at most 1 off
    the diagonal (strict diagonal dominance). Every comparison with an integer goes
    through :func:`resolve_near_integer`.

    Parameters
    ----------
    n : int
        Size of ``B``.
    sum_sq : float or Fraction
        ``sum_{i != j} eps_ij^2``.
    max_row_sum, max_col_sum : float, Fraction or None, default=None
        Largest off-diagonal row and column sums of ``eps``; None skips that
        dominance test.
    exact_sum_sq, exact_max_row_sum, exact_max_col_sum : callable or None, default=None
        Return the statistic exactly (a Fraction), for float statistics; each is
        called only when a decision that uses it lies near an integer. Default: the
        statistic as given, read as an exact rational.

    Returns
    -------
    rank : int
        The certified minimum rank.
    value : float or Fraction
        ``n^2 / (n + sum_sq)`` (a Fraction when ``sum_sq`` is exact; 1 for ``n <= 1``).
    dominant : bool
        Whether the dominance test gave rank ``n``.

    Examples
    --------
    The R6 family (:ref:`theory-r6`): 46 queries, every ``eps_ij = 1/5``:

    >>> from fractions import Fraction
    >>> from minip_learn.theory.bounds import rank_from_sums
    >>> rank_from_sums(46, 46 * 45 * Fraction(1, 25), Fraction(45, 5))
    (17, Fraction(115, 7), False)
    >>> rank_from_sums(6, 6 * 5 * Fraction(1, 25), Fraction(1))[0]   # row sums 1: rank n
    6
    >>> rank_from_sums(4, 4 * 3 * (1 / 3) ** 2, 3 * (1 / 3))   # floats: eps_ij = 1/3
    (4, 3.0, True)
    """
    if n <= 1:
        return max(n, 1), Fraction(max(n, 1)), True
    if isinstance(sum_sq, float) or not isinstance(sum_sq, (Fraction, numbers.Integral)):
        value = n * n / (n + sum_sq)
    else:
        value = Fraction(n * n) / (n + sum_sq)
    for s, f in ((max_row_sum, exact_max_row_sum), (max_col_sum, exact_max_col_sum)):
        if s is not None and resolve_near_integer(s, f or (lambda s=s: Fraction(s))) <= 1:
            return n, value, True
    exact = exact_sum_sq or (lambda: Fraction(sum_sq))
    rank = integer_above(value, lambda: Fraction(n * n) / (n + exact()))
    return min(n, rank), value, False


def denominator_sums(K):
    """Exact ``(sum_sq, max_row_sum, max_col_sum)`` of ``eps = 1/K`` (diagonal ignored).

    Parameters
    ----------
    K : array-like of shape (n, n)
        Integer denominators (object or integer dtype), ``>= 1`` off the diagonal.

    Returns
    -------
    sum_sq, max_row_sum, max_col_sum : Fraction
        The statistics :func:`rank_from_sums` takes.

    Raises
    ------
    ValueError
        If an off-diagonal denominator is below 1.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.theory.bounds import denominator_sums
    >>> denominator_sums(np.array([[1, 2, 4], [2, 1, 2], [4, 4, 1]]))
    (Fraction(15, 16), Fraction(1, 1), Fraction(3, 4))
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

    def max_sum(M):
        # per-row counts of each distinct value; distinct count rows summed exactly
        if not len(uniq):
            return Fraction(0)
        idx = np.searchsorted(uniq, M[off].astype(uniq.dtype)).reshape(n, n - 1)
        counts = np.zeros((n, len(uniq)), dtype=np.int64)
        np.add.at(counts, (np.repeat(np.arange(n), n - 1), idx.ravel()), 1)
        inv = [Fraction(1, int(k)) for k in uniq]
        return max(sum((int(c) * f for c, f in zip(row, inv) if c), Fraction(0))
                   for row in np.unique(counts, axis=0))

    return sum_sq, max_sum(K), max_sum(K.T)


def rank_from_denominators(K):
    """Certified minimum rank of an integer denominator matrix (``eps_ij = 1/K_ij``).

    :func:`rank_from_sums` on the exact :func:`denominator_sums` of ``K``.

    Parameters
    ----------
    K : array-like of shape (n, n)
        Integer denominators, ``>= 1`` off the diagonal (the diagonal is ignored).

    Returns
    -------
    rank : int
    value : Fraction
        ``n^2 / (n + sum_{i != j} 1/K_ij^2)``.
    dominant : bool

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.theory.bounds import rank_from_denominators
    >>> rank_from_denominators(np.full((46, 46), 5))[0]
    17
    >>> rank_from_denominators(np.full((4, 4), 3))   # rows sum to exactly 1
    (4, Fraction(3, 1), True)
    """
    n = len(K)
    if n <= 1:
        return rank_from_sums(n, Fraction(0), Fraction(0))
    return rank_from_sums(n, *denominator_sums(K))


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
            rank, value, _ = rank_from_sums(n, n * (n - 1) * e * e, (n - 1) * e, (n - 1) * e)
    else:
        E = np.asarray(eps, dtype=object)
        if E.shape != (n, n):
            raise ValueError(f"eps must be a scalar or have shape ({n}, {n}); got {E.shape}.")
        F = [[_as_fraction(E[i, j], "eps") if i != j else Fraction(0) for j in range(n)]
             for i in range(n)]
        sum_sq = sum((F[i][j] ** 2 for i in range(n) for j in range(n)), Fraction(0))
        row = max(sum(F[i], Fraction(0)) for i in range(n))
        col = max(sum((F[i][j] for i in range(n)), Fraction(0)) for j in range(n))
        rank, value, _ = rank_from_sums(n, sum_sq, row, col)
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
