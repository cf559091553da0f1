"""Binary codes behind the witness families (:ref:`theory-r6`), numpy only.

A witness family needs queries ``x_i`` whose complements ``k_i = ~x_i`` overlap them
in 0 while overlapping every other query in ``d_ij = |x_i| - <x_i, x_j>``: a
constant-weight code with large pairwise distance. Three sources:

* :func:`hadamard_code` -- rows of a normalised Hadamard matrix (Paley for
  ``q + 1`` with ``q`` prime ``= 3 mod 4``, Sylvester doubling otherwise), all-ones row
  dropped, optionally with negations: weight ``h/2``, pairwise overlap ``h/4``.
* :func:`product_code` -- concatenations of Hadamard code words, one per block: more
  words at smaller distance.
* :func:`greedy_constant_weight_code` -- greedy constant-weight codes for any size.
"""

import itertools

import numpy as np
from sklearn.utils import check_random_state

from .._validation import check_int

__all__ = []  # public home: the package minip_learn.theory


def _is_prime(q):
    if q < 2:
        return False
    return all(q % p for p in range(2, int(q ** 0.5) + 1))


def _paley(q):
    chi = np.zeros(q, dtype=np.int64)
    for a in range(1, q):
        chi[(a * a) % q] = 1
    chi = np.where(chi == 1, 1, -1)
    chi[0] = 0
    Q = np.array([[chi[(j - i) % q] for j in range(q)] for i in range(q)])
    S = np.zeros((q + 1, q + 1), dtype=np.int64)
    S[0, 1:] = 1
    S[1:, 0] = -1
    S[1:, 1:] = Q
    return np.eye(q + 1, dtype=np.int64) + S


def _construct(order):
    if order == 1:
        return np.ones((1, 1), dtype=np.int64)
    if order == 2 or (order & (order - 1)) == 0:
        H = _construct(order // 2)
        return np.block([[H, H], [H, -H]])
    if order % 4 == 0 and _is_prime(order - 1) and (order - 1) % 4 == 3:
        return _paley(order - 1)
    if order % 8 == 0 and _constructible(order // 2):
        H = _construct(order // 2)
        return np.block([[H, H], [H, -H]])
    return None


def _constructible(order):
    if order in (1, 2) or (order > 0 and (order & (order - 1)) == 0):
        return True
    if order % 4:
        return False
    if _is_prime(order - 1) and (order - 1) % 4 == 3:
        return True
    return order % 8 == 0 and _constructible(order // 2)


def hadamard_orders(max_order, *, min_order=4):
    """Hadamard orders this module constructs, from ``min_order`` to ``max_order``.

    Examples
    --------
    >>> from minip_learn.theory import hadamard_orders
    >>> hadamard_orders(64)
    [4, 8, 12, 16, 20, 24, 32, 40, 44, 48, 60, 64]
    """
    return [h for h in range(max(min_order, 1), max_order + 1) if _constructible(h)]


def hadamard_matrix(order):
    """A normalised Hadamard matrix (first row and column all ones).

    Powers of two use Sylvester's construction, ``q + 1`` with ``q`` prime and
    ``q = 3 mod 4`` Paley's (type I), and ``2h`` Sylvester doubling of a constructible
    ``h``.

    Parameters
    ----------
    order : int
        1, 2, or a constructible multiple of 4 (see :func:`hadamard_orders`).

    Returns
    -------
    H : ndarray of shape (order, order), dtype int64, entries +-1
        ``H @ H.T == order * I``.

    Raises
    ------
    ValueError
        If the order is not constructible here.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.theory import hadamard_matrix
    >>> H = hadamard_matrix(24)
    >>> bool((H @ H.T == 24 * np.eye(24)).all()), bool((H[0] == 1).all())
    (True, True)
    """
    order = check_int(order, "order", min_value=1)
    if not _constructible(order):
        raise ValueError(
            f"no Hadamard matrix of order {order} is constructed here; available orders "
            f"up to {max(order, 8)}: {hadamard_orders(max(order, 8), min_order=1)}."
        )
    H = _construct(order)
    H = H * H[0][None, :]          # first row -> all ones
    H = H * H[:, 0][:, None]       # first column -> all ones
    assert (H @ H.T == order * np.eye(order, dtype=np.int64)).all()
    return H


def hadamard_code(order, *, half=False):
    """Constant-weight code from a Hadamard matrix (:ref:`theory-r6`).

    Drops the all-ones row of the normalised matrix and maps the other rows (and,
    unless ``half``, their negations) to ``{0,1}`` by ``(1 + h)/2``.

    Parameters
    ----------
    order : int
        Hadamard order ``h`` (a multiple of 4, see :func:`hadamard_orders`).
    half : bool, default=False
        Keep only the ``h - 1`` rows (no negations): then no word is the complement of
        another.

    Returns
    -------
    words : ndarray of shape (2h - 2, h) or (h - 1, h), dtype uint8
        Weight ``h/2``; two words overlap in ``h/4``, complements in 0. Rows come first,
        then negations in the same order.

    Examples
    --------
    >>> from minip_learn.theory import hadamard_code
    >>> W = hadamard_code(24)
    >>> W.shape, set(W.sum(1).tolist())
    ((46, 24), {12})
    >>> G = W.astype(int) @ W.T.astype(int)
    >>> sorted(set(G[0].tolist()))
    [0, 6, 12]
    """
    order = check_int(order, "order", min_value=4)
    if order % 4:
        raise ValueError(f"a Hadamard code needs an order divisible by 4; got {order}.")
    H = hadamard_matrix(order)[1:]
    rows = H if half else np.concatenate([H, -H])
    return ((1 + rows) // 2).astype(np.uint8)


def product_code(blocks, *, n_bits=None):
    """Concatenations of Hadamard code words, one word per block.

    Parameters
    ----------
    blocks : sequence of (order, half) pairs
        One Hadamard code per block (see :func:`hadamard_code`).
    n_bits : int, default=None
        Pad with zero bits up to this length (default: the sum of the orders).

    Returns
    -------
    words : ndarray of shape (prod n_b, n_bits), dtype uint8
        Weight ``sum h_b / 2``; ``|x_i \\ x_j|`` is the sum over the blocks where the
        words differ of ``h_b/4`` (or ``h_b/2`` for complements).

    Examples
    --------
    >>> from minip_learn.theory import product_code
    >>> product_code([(8, True), (8, True)], n_bits=17).shape
    (49, 17)
    """
    codes = [hadamard_code(h, half=bool(half)) for h, half in blocks]
    total = sum(c.shape[1] for c in codes)
    n_bits = total if n_bits is None else check_int(n_bits, "n_bits", min_value=1)
    if n_bits < total:
        raise ValueError(f"blocks need {total} bits but n_bits={n_bits}.")
    words = np.array(
        [np.concatenate(parts) for parts in itertools.product(*codes)], dtype=np.uint8
    )
    return np.concatenate(
        [words, np.zeros((len(words), n_bits - total), dtype=np.uint8)], axis=1
    )


def greedy_constant_weight_code(
    n_bits, weight, min_difference, *, max_words=None, max_candidates=20000,
    random_state=None,
):
    """Greedy constant-weight code with ``|x_i \\ x_j| >= min_difference``.

    Candidates of weight ``weight`` are scanned in lexicographic order (when there are
    at most ``max_candidates`` of them and ``random_state`` is None) or drawn at random,
    and kept when they differ from every kept word in at least ``min_difference``
    positions of their support; a candidate whose complement is already kept is
    skipped (so no word is another's key).

    Parameters
    ----------
    n_bits : int
        Word length ``m``.
    weight : int
        Common weight ``w`` (``1 <= w < m``).
    min_difference : int
        Lower bound ``D >= 1`` on ``w - <x_i, x_j>``.
    max_words : int, default=None
        Stop after this many words.
    max_candidates : int, default=20000
        Candidates examined.
    random_state : int, RandomState instance or None, default=None
        None scans lexicographically when possible (deterministic); otherwise random
        candidates.

    Returns
    -------
    words : ndarray of shape (n_words, n_bits), dtype uint8

    Examples
    --------
    >>> from minip_learn.theory import greedy_constant_weight_code
    >>> W = greedy_constant_weight_code(10, 5, 3)
    >>> len(W), int((W.astype(int) @ W.T.astype(int))[~__import__('numpy').eye(len(W), dtype=bool)].max())
    (6, 2)
    """
    from math import comb

    m = check_int(n_bits, "n_bits", min_value=2)
    w = check_int(weight, "weight", min_value=1)
    D = check_int(min_difference, "min_difference", min_value=1)
    if w >= m:
        raise ValueError(f"weight must be < n_bits={m}; got {w}.")
    if D > w:
        raise ValueError(f"min_difference={D} cannot exceed weight={w}.")
    max_words = check_int(max_words, "max_words", min_value=1, allow_none=True)
    max_candidates = check_int(max_candidates, "max_candidates", min_value=1)
    if random_state is None and comb(m, w) <= max_candidates:
        cands = (
            np.isin(np.arange(m), c).astype(np.uint8)
            for c in itertools.combinations(range(m), w)
        )
    else:
        rng = check_random_state(random_state)

        def _draw():
            for _ in range(max_candidates):
                v = np.zeros(m, dtype=np.uint8)
                v[rng.choice(m, w, replace=False)] = 1
                yield v

        cands = _draw()
    kept = np.zeros((0, m), dtype=np.int64)
    for v in cands:
        vi = v.astype(np.int64)
        if len(kept):
            ov = kept @ vi
            if (w - ov < D).any():
                continue
            if (kept @ (1 - vi) == w).any() and 2 * w == m:
                continue
        kept = np.vstack([kept, vi])
        if max_words is not None and len(kept) >= max_words:
            break
    return kept.astype(np.uint8)
