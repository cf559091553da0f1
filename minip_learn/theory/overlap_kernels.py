"""Overlap kernels: nonnegative kernel heads of polynomial rank for the full task.

An upper bound on ``r*(m)``, the smallest rank of a normalized nonnegative kernel head
that solves every length-3 sequence of ``m``-bit tokens (:ref:`theory-r3` gives
``2^m``; :ref:`theory-r4` says a solving kernel must decay with the overlap).

**The construction.** For a query ``x`` of weight ``w = |x|`` the kernel depends only on
the overlap ``k = <x, t>``:

    ``alpha(x, t) = F_w(k) = sum_(j <= D) d_j(w) C(w - k, j)``,  ``d_j(w) >= 0``,
    ``d_0(w) > 0``,

so ``F_w > 0`` and ``F_w`` does not increase with ``k``. The value map is ``v(t) = t``
and the readout ``rho_x(u) = <x, u> + b`` with one global bias ``b``.

**The lemma.** At a query ``x`` of the multiset ``{x, y, z}`` whose other tokens overlap
``x`` in ``a <= c`` (both in ``0..w``), the output is the ``F_w``-weighted mean of the
overlaps ``{w, a, c}`` plus ``b``: it depends on ``(|x|, a, c)`` only, and every pair
``a <= c <= w`` occurs (``y`` made of ``a`` bits of ``x``; ``y = x`` gives ``w``). The
target is ``a``, so the output exceeds it by the weighted mean excess

    ``E(w, a, c) = (F_w(w) (w - a) + F_w(c) (c - a)) / (F_w(w) + F_w(a) + F_w(c))``

plus ``b``. With ``b = -E_max / 2`` every error is at most ``E_max / 2``, so the head
solves the full task iff ``E_max < 1``, where ``E_max`` is the largest ``E(w, a, c)``
over ``w <= m`` and ``a <= c <= w``. For each ``w``, ``E < 1`` is the linear condition
``F_w(w) (w - a - 1) - F_w(a) + F_w(c) (c - a - 1) < 0`` on the ``d_j(w)``.

**The proof for a given m** is finite and exact: :func:`overlap_kernel` finds the
weights ``d_j(w)`` with a linear program (:func:`scipy.optimize.linprog`, HiGHS; a
Dinkelbach iteration lowers ``E_max(w)``), rounds them to rationals and checks
``E(w, a, c) < 1`` for every ``w <= m`` and ``a <= c <= w`` in exact integer arithmetic.
The rounded weights are the exact proof; they are close to the lowest ``E_max(w)`` the
degree allows, and span many orders of magnitude (``F_w(0) / F_w(w)`` reaches about
``1e15`` at ``w = 32``), which float64 evaluates accurately since every sum in the head
has positive terms only. ``d*(w)``, the smallest ``D`` that works at weight ``w``, grows
like ``w / 4`` (``0, 1, 1, 1, 1, 2, 2, 2, 2, 3, ...`` for ``w = 1, 2, ...``; 8 at
``w = 32``, 16 at ``w = 64``); the head takes ``D(m) = max_(w <= m) d*(w)``.

**The rank.** The kernel factorises with *nonnegative* features indexed by the subsets
``S`` of the ``m`` bit positions with ``|S| <= D``:

    ``phi_Q(x)_S = d_|S|(|x|) [S subset of x]``,      ``phi_K(t)_S = [S disjoint from t]``,

since ``<phi_Q(x), phi_K(t)> = sum_j d_j(w) #{S : |S| = j, S subset of x minus t}`` and
``|x minus t| = w - k``. Its rank is ``R(m, D) = sum_(j <= D) C(m, j)``: 46 at ``m = 9``
(against ``2^9 = 512`` for R3) and 15,033,173 at ``m = 32`` (against ``2^32``). With
``D / m`` about ``1/4`` (measured to ``m = 64``), ``log2 R(m, D)`` grows like
``m H(D / m)`` with ``H`` the binary entropy: about ``H(1/4) = 0.81`` bits per bit
(``log2 R / m = 0.77`` at ``m = 64``), against R3's 1 and the exponential lower bounds of
R5-R6.

:func:`overlap_kernel` returns the head, :func:`overlap_kernel_features` its feature
maps on tokens and :func:`overlap_kernel_predict` its outputs on sequences.
"""

import functools
import itertools
import math
from fractions import Fraction

import numpy as np
from sklearn.utils import Bunch

from .._validation import check_int, check_sequences

__all__ = []  # public home: the package minip_learn.theory

#: a degree counts as feasible at a weight when the linear program reaches
#: ``E_max <= 1 - FEASIBILITY_MARGIN`` (the exact check then confirms ``E_max < 1``)
FEASIBILITY_MARGIN = 1e-6

#: the most entries :func:`overlap_kernel_features` returns (``rank * n_tokens``)
MAX_FEATURE_ENTRIES = 50_000_000

#: Dinkelbach iterations per weight and degree, and the relative improvement of the
#: margin ``1 - E`` below which the iteration stops
_MAX_ITER = 30
_REL_TOL = 1e-3


def _basis(w, D):
    """``B[k, j] = C(w - k, j) / C(w, j)`` for ``k = 0..w`` and ``j = 0..min(D, w)``:
    the coefficients of ``e_j = d_j C(w, j)`` in ``F_w(k)`` (all in ``[0, 1]``)."""
    J = range(min(D, w) + 1)
    return np.array([[math.comb(w - k, j) / math.comb(w, j) for j in J]
                     for k in range(w + 1)])


def _excess_rows(w, D):
    """Numerators and denominators of ``E(w, a, c)`` as linear forms in ``e``: two
    arrays of shape ``(n_pairs, min(D, w) + 1)`` over the pairs ``a <= c <= w``."""
    B = _basis(w, D)
    a, c = np.triu_indices(w + 1)
    num = B[w][None, :] * (w - a)[:, None] + B[c] * (c - a)[:, None]
    den = B[w][None, :] + B[a] + B[c]
    return num, den


@functools.cache
def _optimise(w, D):
    """Weights ``e`` (``d_j = e_j / C(w, j)``, ``e_0 = 1``) that make ``max E(w, a, c)``
    small, and that maximum, in floating point.

    A Dinkelbach iteration for the largest of the ratios ``num / den``: at ``lambda_k
    = E_max(e_k)`` the program minimises ``max_i (num_i - lambda_k den_i)(e) / den_i(e_k)``
    in the variables ``y = e / e_k`` (rows and columns scaled by the current point, so
    the program is well conditioned whatever the spread of ``F_w``), with ``sum y``
    fixed; ``y = 1`` is feasible with value 0, so ``E_max`` never increases.
    """
    from scipy.optimize import linprog

    num, den = _excess_rows(w, D)
    n = num.shape[1]
    e = np.array([math.comb(w, j) * 2.0 ** j for j in range(n)])   # d_j = 2^j to start
    e /= e[0]
    lam = float(((num @ e) / (den @ e)).max())
    if n == 1:
        return lam, e
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    A_eq = np.ones((1, n + 1))
    A_eq[0, -1] = 0.0
    for _ in range(_MAX_ITER):
        scale = np.maximum(e, 1e-12 * e.max())
        G = (num - lam * den) * scale[None, :] / (den @ e)[:, None]
        res = linprog(cost, A_ub=np.hstack([G, -np.ones((len(G), 1))]),
                      b_ub=np.zeros(len(G)), A_eq=A_eq, b_eq=[float(n)],
                      bounds=[(0, None)] * n + [(None, None)], method="highs")
        if res.status != 0:
            break
        trial = np.maximum(res.x[:-1], 0.0) * scale
        if trial[0] <= 0:
            break
        trial /= trial[0]
        new = float(((num @ trial) / (den @ trial)).max())
        if not new < lam:
            break
        gain = lam - new
        e, lam = trial, new
        if gain <= _REL_TOL * abs(1.0 - lam) or gain <= 1e-12:
            break
    return lam, e


def _feasible(w, D):
    """Whether degree ``D`` reaches ``E_max(w) <= 1 - FEASIBILITY_MARGIN``."""
    return _optimise(w, D)[0] <= 1.0 - FEASIBILITY_MARGIN


@functools.cache
def _min_degree(w):
    """``d*(w)``: the smallest degree feasible at weight ``w`` (feasibility does not
    decrease with the degree: the extra weights may be 0)."""
    D = _min_degree(w - 1) if w > 1 else 0
    if _feasible(w, D):
        while D > 0 and _feasible(w, D - 1):
            D -= 1
        return D
    while not _feasible(w, D):
        D += 1
        if D > w:                                        # pragma: no cover - never seen
            raise RuntimeError(f"no degree <= {w} is feasible at weight {w}.")
    return D


def _exact_max_excess(w, d):
    """``max E(w, a, c)`` over ``a <= c <= w`` for rational weights ``d``, exactly.

    Returns ``(numerator, denominator)`` of the largest ratio as integers (``d`` is
    scaled to integers first; the ratio does not depend on the scale)."""
    lcm = 1
    for v in d:
        lcm = lcm * v.denominator // math.gcd(lcm, v.denominator)
    di = [int(v * lcm) for v in d]
    F = [sum(dj * math.comb(w - k, j) for j, dj in enumerate(di)) for k in range(w + 1)]
    Fw = F[w]
    best_num, best_den = 0, 1
    for a in range(w + 1):
        for c in range(a, w + 1):
            num = Fw * (w - a) + F[c] * (c - a)
            den = Fw + F[a] + F[c]
            if num * best_den > best_num * den:
                best_num, best_den = num, den
    return best_num, best_den


@functools.cache
def _exact_weights(w, D):
    """Rational weights ``d_0..d_D(w)`` (``d_0 = 1``) with exact ``E_max(w) < 1``, and
    ``E_max(w)`` as a :class:`~fractions.Fraction`."""
    if w == 0:
        return (Fraction(1),) + (Fraction(0),) * D, Fraction(0)
    _, e = _optimise(w, D)
    d = [max(float(v), 0.0) / math.comb(w, j) for j, v in enumerate(e)]
    d = [v / d[0] for v in d]
    tries = ([Fraction(f"{v:.8g}") for v in d],          # 8 significant digits
             [Fraction(v) for v in d])                    # the floats themselves
    for cand in tries:
        cand = cand + [Fraction(0)] * (D + 1 - len(cand))
        if cand[0] <= 0:
            continue
        num, den = _exact_max_excess(w, cand)
        if num < den:
            return tuple(cand), Fraction(num, den)
    raise RuntimeError(                                   # pragma: no cover - never seen
        f"the weights of degree {D} at weight {w} fail the exact check E < 1.")


def overlap_kernel(n_bits, *, degree=None):
    """An overlap kernel head of rank ``sum_(j <= D) C(n_bits, j)`` that solves the full
    length-3 task, with its exact proof.

    The construction and the proof are in this module's docstring: per query weight
    ``w`` a kernel ``F_w(<x, t>)``, the rational weights ``d_j(w)`` found by a linear
    program and the excess ``E(w, a, c) < 1`` checked exactly for every ``w <= n_bits``
    and ``a <= c <= w``.

    Parameters
    ----------
    n_bits : int
        Bits per token (``m >= 1``).
    degree : int, default=None
        The degree ``D`` (features are the subsets of at most ``D`` positions). None:
        the smallest degree feasible at every weight ``w <= n_bits``. A degree that is
        not feasible at some weight (its linear program does not reach
        ``E_max(w) <= 1 - 1e-6``) raises a :class:`ValueError` naming that weight.

    Returns
    -------
    kernel : :class:`~sklearn.utils.Bunch`
        ``n_bits``; ``degree`` (``D``); ``rank`` (``sum_(j <= D) C(n_bits, j)``, a
        Python int); ``weights`` (for ``w = 0..n_bits`` a tuple of
        :class:`~fractions.Fraction` ``d_0(w)..d_D(w)``, ``d_0(w) = 1``, ``d_j(w) = 0``
        for ``j > w``); ``max_excess`` (the exact ``E_max``, a Fraction below 1);
        ``bias`` (``-max_excess / 2``, the readout bias); ``max_error`` (the largest
        ``|p - t|`` over the task, ``max_excess / 2`` as a float); ``ceiling_rank``
        (``2**n_bits``, R3's rank); ``degrees`` (``d*(w)`` for ``w = 0..n_bits``, the
        smallest degree feasible at each weight).

    Examples
    --------
    >>> from minip_learn.theory import overlap_kernel
    >>> head = overlap_kernel(9)
    >>> head.degree, head.rank, head.ceiling_rank
    (2, 46, 512)
    >>> head.max_excess < 1, head.max_error < 0.5
    (True, True)
    >>> overlap_kernel(32).rank
    15033173
    >>> overlap_kernel(9, degree=1)
    Traceback (most recent call last):
    ...
    ValueError: degree=1 is not feasible at weight w=6 ...
    """
    m = check_int(n_bits, "n_bits", min_value=1)
    if degree is not None:
        degree = check_int(degree, "degree", min_value=0)
    degrees = [0] + [_min_degree(w) for w in range(1, m + 1)]
    if degree is None:
        D = max(degrees)
    else:
        D = degree
        for w, dw in enumerate(degrees):
            if dw > D:
                raise ValueError(
                    f"degree={D} is not feasible at weight w={w} (of n_bits={m}): the "
                    f"excess E_max(w) < 1 needs degree >= {dw} there.")
    weights, max_excess = [], Fraction(0)
    for w in range(m + 1):
        d, excess = _exact_weights(w, min(D, w))
        weights.append(d + (Fraction(0),) * (D - min(D, w)))
        max_excess = max(max_excess, excess)
    rank = sum(math.comb(m, j) for j in range(D + 1))
    return Bunch(n_bits=m, degree=D, rank=rank, weights=weights,
                 max_excess=max_excess, bias=-max_excess / 2,
                 max_error=float(max_excess / 2), ceiling_rank=2 ** m, degrees=degrees)


def _check_kernel(kernel):
    keys = ("n_bits", "degree", "rank", "weights", "bias")
    if not all(k in kernel for k in keys):
        raise ValueError(
            f"kernel must be the result of overlap_kernel (with keys {', '.join(keys)}); "
            f"got {type(kernel).__name__}.")
    return kernel


def overlap_kernel_features(kernel, tokens):
    """The nonnegative feature maps ``phi_Q`` and ``phi_K`` of an overlap kernel.

    Feature ``S`` (a subset of the bit positions with ``|S| <= D``) is
    ``phi_Q(x)_S = d_|S|(|x|) [S subset of x]`` and ``phi_K(t)_S = [S disjoint from
    t]``, so that ``phi_Q(x) . phi_K(t) = F_|x|(<x, t>)``. The subsets are ordered by
    size, then lexicographically (:func:`itertools.combinations` of ``range(n_bits)``):
    the empty set first, then ``{0}, {1}, ..., {0, 1}, {0, 2}, ...``.

    Parameters
    ----------
    kernel : :class:`~sklearn.utils.Bunch`
        A head from :func:`overlap_kernel`.
    tokens : array-like of shape (n_tokens, n_bits)
        0/1 tokens.

    Returns
    -------
    query_features, key_features : ndarray of shape (n_tokens, rank), float64
        ``phi_Q`` and ``phi_K`` of every token (both nonnegative).

    Raises
    ------
    ValueError
        When ``tokens`` is not an ``(n_tokens, n_bits)`` 0/1 array, or when the two
        arrays would hold more than 5e7 entries each (``rank * n_tokens``).

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.theory import overlap_kernel, overlap_kernel_features
    >>> head = overlap_kernel(3)
    >>> T = np.array([[1, 1, 0], [0, 1, 1]])
    >>> Q, K = overlap_kernel_features(head, T)
    >>> Q.shape, bool((Q >= 0).all() and (K >= 0).all())
    ((2, 4), True)
    >>> K                       # the sets {}, {0}, {1}, {2} disjoint from each token
    array([[1., 0., 0., 1.],
           [1., 1., 0., 0.]])
    """
    kernel = _check_kernel(kernel)
    m, D = kernel.n_bits, kernel.degree
    X3, _ = check_sequences(tokens, name="tokens", allow_2d=True, binary=True)
    if X3.shape[1] != 1 or np.ndim(tokens) != 2:
        raise ValueError(f"tokens must be a 2-d array (n_tokens, n_bits); got shape "
                         f"{np.shape(tokens)}.")
    T = X3[:, 0, :].astype(bool)
    if T.shape[1] != m:
        raise ValueError(f"tokens must have n_bits={m} columns (the kernel's); got "
                         f"{T.shape[1]}.")
    n = len(T)
    if kernel.rank * n > MAX_FEATURE_ENTRIES:
        raise ValueError(
            f"tokens: {n} tokens x rank {kernel.rank} = {kernel.rank * n} entries exceed "
            f"the limit of {MAX_FEATURE_ENTRIES:.0e} per feature array; use "
            "overlap_kernel_predict, which needs no features.")
    w = T.sum(axis=1)
    d = np.array([[float(v) for v in row] for row in kernel.weights])   # (m + 1, D + 1)
    Q = np.empty((n, kernel.rank))
    K = np.empty((n, kernel.rank))
    start = 0
    for j in range(D + 1):
        S = np.array(list(itertools.combinations(range(m), j)), dtype=np.int64)
        S = S.reshape(len(S), j)
        inside = np.ones((n, len(S)), dtype=bool)
        outside = np.ones((n, len(S)), dtype=bool)
        for p in range(j):
            inside &= T[:, S[:, p]]
            outside &= ~T[:, S[:, p]]
        Q[:, start:start + len(S)] = inside * d[w, j][:, None]
        K[:, start:start + len(S)] = outside
        start += len(S)
    return Q, K


def _kernel_table(kernel):
    """``F[w, k] = F_w(k)`` in float64 for ``k <= w <= n_bits`` (0 above the diagonal)."""
    m = kernel.n_bits
    F = np.zeros((m + 1, m + 1))
    for w in range(m + 1):
        d = kernel.weights[w]
        for k in range(w + 1):
            F[w, k] = float(sum(dj * math.comb(w - k, j) for j, dj in enumerate(d)))
    return F


def overlap_kernel_predict(kernel, X):
    """Outputs of an overlap kernel head on token sequences, at every position.

    Computed from the closed form ``alpha(x, t) = F_|x|(<x, t>)`` (not from the features,
    so any ``n_bits`` works): ``p_i = sum_j alpha_ij <x_i, x_j> / sum_j alpha_ij + b``.

    Parameters
    ----------
    kernel : :class:`~sklearn.utils.Bunch`
        A head from :func:`overlap_kernel`.
    X : array-like of shape (n_samples, seq_len, n_bits)
        0/1 token sequences (any length; the head solves length 3 and below).

    Returns
    -------
    outputs : ndarray of shape (n_samples, seq_len), float64

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.theory import overlap_kernel, overlap_kernel_predict
    >>> head = overlap_kernel(4)
    >>> X = np.array([[[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]]])
    >>> p = overlap_kernel_predict(head, X)
    >>> np.round(p).astype(int)        # the targets min_j <x_i, x_j>
    array([[0, 0, 0]])
    >>> bool(np.abs(p - [[0, 0, 0]]).max() < 0.5)
    True
    """
    kernel = _check_kernel(kernel)
    X3, _ = check_sequences(X, name="X", binary=True)
    if X3.shape[2] != kernel.n_bits:
        raise ValueError(f"X must have n_bits={kernel.n_bits} (the kernel's); got "
                         f"{X3.shape[2]}.")
    Xi = X3.astype(np.int64)
    G = np.einsum("sik,sjk->sij", Xi, Xi)                       # overlaps <x_i, x_j>
    w = np.einsum("sii->si", G)
    alpha = _kernel_table(kernel)[w[:, :, None], G]
    out = (alpha * G).sum(axis=2) / alpha.sum(axis=2)
    return out + float(kernel.bias)
