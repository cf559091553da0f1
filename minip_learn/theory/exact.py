"""Exact minimum rank at longer sequences (R9 on the theory page), numpy only.

Take a constant-weight code ``C`` of weight ``m/2`` and minimum Hamming distance
``>= 4`` that is closed under complement. The key of a query ``x`` is its complement
``~x``, itself a code word, and every key gap ``D(x, y) = <x, ~y> - <x, ~x> = <x, ~y>``
of distinct words is ``>= 2``. The R4 sequences of every ordered pair, at a length
``N`` with ``sum_{y != x} 1/(D(x, y) - 1) <= N - 2`` for every ``x``, make the scaled
kernel matrix strictly diagonally dominant, so every nonnegative kernel head that
solves them has rank ``>= |C|``; one feature per token (R3) solves them, so the
minimum rank of the family is exactly ``|C|``.

* :func:`complement_closed_code` -- such codes: the lexicographic greedy by complement
  pairs, a Graham-Sloane residue class, or the largest of these.
* :func:`exact_seq_len` -- the smallest such ``N``, in exact arithmetic.
* :func:`exact_family` -- the family in multiset form (``token_ids``, ``counts``) over
  the words, ready for :class:`minip_learn.compact.CompactFamily`.
"""

from fractions import Fraction
from math import comb

import numpy as np

from .._validation import check_binary, check_int
from ..bits import overlap_words, pack_tokens
from ..compact import smallest_int_dtype

__all__ = []  # public home: the package minip_learn.theory

_METHODS = ("best", "greedy", "graham-sloane")

#: overlap entries computed at once when scanning all pairs of a code
_BLOCK_ENTRIES = 1 << 21


def _check_n_bits(n_bits):
    m = check_int(n_bits, "n_bits", min_value=4)
    if m % 2:
        raise ValueError(f"n_bits must be even (the words have weight n_bits/2); got {m}.")
    return m


def _lex_words(m, w):
    """All words of ``m`` bits and weight ``w`` as int64, ascending.

    Bit ``m - i`` of the integer is position ``i`` (1-based), so ascending integers are
    the lexicographic order of ``(x_1, ..., x_m)`` with ``0 < 1``.
    """
    rows = {0: np.zeros(1, dtype=np.int64)}
    for n in range(m):                          # append bit n as the most significant
        new = {}
        for k in range(max(0, w - (m - n - 1)), min(n + 1, w) + 1):
            parts = [rows[k]] if k in rows else []
            if k - 1 in rows:
                parts.append(rows[k - 1] | np.int64(1 << n))
            new[k] = np.concatenate(parts)
        rows = new
    return rows[w]


def _ints_to_bits(ints, m):
    shifts = np.arange(m - 1, -1, -1, dtype=np.int64)
    return ((np.asarray(ints, dtype=np.int64)[:, None] >> shifts) & 1).astype(np.uint8)


class _PairGreedy:
    """Complement pairs taken from ``cands`` (all weight-m/2 words, ascending).

    Complement reverses the order, so the rank of ``~x`` is ``n - 1 - rank(x)``. Taking
    a pair blocks both words and all words at distance 2 from them (one bit of the
    support swapped with one bit outside it); a word is admissible exactly when it is
    not blocked, and then so is its complement.
    """

    def __init__(self, cands, m):
        self.cands = cands
        self.bits = np.left_shift(np.int64(1), np.arange(m, dtype=np.int64))
        self.blocked = np.zeros(len(cands), dtype=bool)
        self.ranks = []

    def take(self, r):
        n, x = len(self.cands), self.cands[r]
        inside = (x & self.bits) != 0
        swaps = (self.bits[inside][:, None] | self.bits[~inside][None, :]).ravel()
        near = np.searchsorted(self.cands, x ^ swaps)
        self.blocked[near] = True
        self.blocked[n - 1 - near] = True
        self.blocked[[r, n - 1 - r]] = True
        self.ranks.extend((r, n - 1 - r))

    def scan(self, chunk=1 << 14):
        """Take every admissible word in ascending order (the first half suffices:
        a word of the second half is taken, or blocked, with its complement)."""
        half = len(self.cands) // 2
        for start in range(0, half, chunk):
            free = np.flatnonzero(~self.blocked[start:min(start + chunk, half)])
            for r in (free + start).tolist():
                if not self.blocked[r]:
                    self.take(r)


def _greedy_code(cands, m):
    greedy = _PairGreedy(cands, m)
    greedy.scan()
    return greedy.ranks


def _closed_classes(m, modulus):
    """Residues ``a`` mod ``modulus`` whose class is closed under complement: the
    complement of a word of residue ``a`` has residue ``m(m+1)/2 - a``."""
    total = (m // 2) * (m + 1)
    return [a for a in range(modulus) if (2 * a - total) % modulus == 0]


def _graham_sloane_code(cands, m, modulus, extend):
    """Ranks of the largest complement-closed residue class (ties: smallest residue),
    optionally extended by the greedy; None when no class is closed."""
    classes = _closed_classes(m, modulus)
    if not classes:
        return None
    residue = np.zeros(len(cands), dtype=np.int64)
    for i in range(1, m + 1):
        residue += i * ((cands >> (m - i)) & 1)
    residue %= modulus
    sizes = np.bincount(residue, minlength=modulus)
    a = max(classes, key=lambda c: (sizes[c], -c))
    ranks = np.flatnonzero(residue == a)
    greedy = _PairGreedy(cands, m)
    for r in ranks[ranks < len(cands) // 2].tolist():   # x before ~x
        greedy.take(r)
    if extend:
        greedy.scan()
    return greedy.ranks


def complement_closed_code(n_bits, *, method="best", extend=True, modulus=None,
                           max_candidates=1 << 25):
    """A constant-weight code of weight ``n_bits/2``, distance ``>= 4``, closed under
    complement (R9).

    Two distinct words overlap in at most ``n_bits/2 - 2`` (Hamming distance ``>= 4``)
    and the complement ``~x`` of every word ``x`` is a word, so every key gap of R9 is
    ``>= 2``.

    Words of weight ``m/2`` (``m = n_bits``) are scanned in **lexicographic order of
    the bit tuple** ``(x_1, ..., x_m)`` with ``0 < 1``, i.e. by increasing integer
    ``sum_i x_i 2^(m-i)``: ``0...01...1`` first. (The reverse order and the order with
    the bits reversed give codes equal up to complement or mirror image, hence the
    same sizes.)

    Parameters
    ----------
    n_bits : int
        Word length ``m``: even, ``>= 4``.
    method : {"best", "greedy", "graham-sloane"}, default="best"
        * ``"greedy"``: take a word together with its complement when both are at
          distance ``>= 4`` from every word taken so far, scanning in the order above.
          Sizes 14, 68, 870, 6,938 at ``m`` = 8, 12, 16, 20.
        * ``"graham-sloane"``: a residue class of ``sum_i i x_i`` (positions
          ``i = 1..m``) modulo ``modulus >= m``: a swap of two bits changes the sum by
          ``0 < |j - i| < modulus``, so a class has distance ``>= 4`` (Graham and
          Sloane). The complement of residue ``a`` has residue ``m(m+1)/2 - a``; the
          largest class closed under complement is used. For ``modulus = m + 1`` (odd)
          that is the class 0: sizes 8, 72, 758, 8,796 at ``m`` = 8, 12, 16, 20
          (14, 72, 758, 8,798 extended). For ``modulus = m`` with ``4 | m``, the class
          ``m/4``: 10, 80, 810, 9,252 (14, 80, 822, 9,252 extended). With ``extend``,
          the class is then extended by the greedy.
        * ``"best"``: the largest of the greedy code and the Graham-Sloane codes for
          ``modulus`` ``m + 1`` and ``m`` (the first of these on a tie): 14, 80, 870,
          9,252 words at ``m`` = 8, 12, 16, 20. (The optimum of the unrestricted
          problem at ``m = 12`` is A(12, 4, 6) = 132.)
    extend : bool, default=True
        Extend the Graham-Sloane class by the greedy (ignored by ``"greedy"``).
    modulus : int, default=None
        Modulus of ``"graham-sloane"`` (``>= n_bits``); None means ``n_bits + 1``.
        Ignored by the other methods.
    max_candidates : int, default=2**25
        Refuse ``n_bits`` with more than this many words of weight ``n_bits/2``
        (``C(26, 13)`` = 10,400,600 fits; ``C(28, 14)`` = 40,116,600 does not).

    Returns
    -------
    words : ndarray of shape (n_words, n_bits), dtype uint8
        Rows in pairs: each word is immediately followed by its complement, so any
        prefix of even length is again closed under complement. Deterministic.

    Raises
    ------
    ValueError
        For odd or too small ``n_bits``, an unknown ``method``, a ``modulus`` below
        ``n_bits`` or without a class closed under complement, or more than
        ``max_candidates`` candidate words.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.theory import complement_closed_code
    >>> W = complement_closed_code(8, method="greedy")
    >>> W.shape
    (14, 8)
    >>> W[0].tolist(), W[1].tolist()
    ([0, 0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0])
    >>> G = W.astype(int) @ W.T.astype(int)
    >>> int(G[~np.eye(len(W), dtype=bool)].max())     # <= n_bits/2 - 2
    2
    >>> len(complement_closed_code(12))                 # Graham-Sloane modulo 12
    80
    """
    m = _check_n_bits(n_bits)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}.")
    q = m + 1 if modulus is None else check_int(modulus, "modulus", min_value=m)
    if method == "graham-sloane" and not _closed_classes(m, q):
        raise ValueError(f"modulus={q} has no residue class closed under complement at "
                         f"n_bits={m} (2a = {(m // 2) * (m + 1)} mod {q} has no solution).")
    max_candidates = check_int(max_candidates, "max_candidates", min_value=1)
    if comb(m, m // 2) > max_candidates:
        raise ValueError(
            f"n_bits={m} has {comb(m, m // 2)} candidate words of weight {m // 2}, more "
            f"than max_candidates={max_candidates}."
        )
    cands = _lex_words(m, m // 2)
    if method == "graham-sloane":
        ranks = _graham_sloane_code(cands, m, q, bool(extend))
    else:
        ranks = _greedy_code(cands, m)
        for q in ((m + 1, m) if method == "best" else ()):
            other = _graham_sloane_code(cands, m, q, bool(extend))
            if other is not None and len(other) > len(ranks):
                ranks = other
    return _ints_to_bits(cands[np.asarray(ranks, dtype=np.int64)], m)


def _code_overlaps(words):
    """Validate a complement-closed code; return (weight, overlap histogram, complement).

    ``hist[i, o]`` counts the words ``j`` (``i`` included) with ``<x_i, x_j> = o``;
    ``comp[i]`` is the row of ``~x_i``.
    """
    W = np.asarray(words)
    if W.ndim != 2 or W.shape[0] < 2:
        raise ValueError(f"words must be a 2-D array of at least 2 words; got shape "
                         f"{W.shape}.")
    if W.dtype.kind not in "biuf":
        raise ValueError(f"words must hold 0/1 numbers; got dtype {W.dtype}.")
    check_binary(W, name="words")
    n, m = W.shape
    if m < 4 or m % 2:
        raise ValueError(f"words must have an even number >= 4 of bits; got {m}.")
    W = W.astype(np.uint8)
    w = m // 2
    weights = W.sum(axis=1, dtype=np.int64)
    if (weights != w).any():
        i = int(np.flatnonzero(weights != w)[0])
        raise ValueError(f"words must all have weight n_bits/2 = {w}; word {i} has "
                         f"weight {int(weights[i])}.")
    packed = pack_tokens(W)
    hist = np.zeros((n, w + 1), dtype=np.int64)
    comp = np.zeros(n, dtype=np.int64)
    step = max(1, _BLOCK_ENTRIES // n)
    every = np.arange(n)[None, :]
    for a in range(0, n, step):
        rows = np.arange(a, min(a + step, n))
        ov = overlap_words(packed, rows[:, None], every)
        flat = (ov + (w + 1) * np.arange(len(rows))[:, None]).ravel()
        hist[rows] = np.bincount(flat, minlength=len(rows) * (w + 1)).reshape(-1, w + 1)
        comp[rows] = np.argmin(ov, axis=1)
    _check_histogram(packed, hist, w)
    return w, hist, comp


def _check_histogram(packed, hist, w):
    def partner(i, overlap):
        ov = overlap_words(packed, i, np.arange(len(packed)))
        ov[i] = -1
        return int(np.flatnonzero(ov == overlap)[0])

    if (hist[:, w] > 1).any():
        i = int(np.flatnonzero(hist[:, w] > 1)[0])
        raise ValueError(f"words holds a word twice: words {i} and {partner(i, w)} are "
                         "equal.")
    if (hist[:, w - 1] > 0).any():
        i = int(np.flatnonzero(hist[:, w - 1] > 0)[0])
        raise ValueError(
            f"words must have minimum distance >= 4: words {i} and {partner(i, w - 1)} "
            f"are at Hamming distance 2 (overlap {w - 1} > n_bits/2 - 2 = {w - 2})."
        )
    if (hist[:, 0] != 1).any():
        i = int(np.flatnonzero(hist[:, 0] != 1)[0])
        raise ValueError(f"words must be closed under complement: the complement of "
                         f"word {i} is not in words.")


def exact_seq_len(words, *, return_row_sums=False):
    """The smallest length ``N`` at which R9 gives minimum rank exactly ``|C|``.

    The smallest ``N >= 3`` with ``sum_{y != x} 1/(D(x, y) - 1) <= N - 2`` for every
    word ``x``, where ``D(x, y) = <x, ~y> - <x, ~x> = n_bits/2 - <x, y>`` is the key
    gap (``>= 2`` for distinct words of such a code; ``n_bits/2`` for ``y = ~x``). Then
    the scaled kernel matrix of every head solving :func:`exact_family` has rows
    summing to less than 1 off the diagonal: strictly diagonally dominant, rank
    ``|C|``. Computed exactly: the overlaps of every pair (packed words, popcount) are
    counted per row, and the few distinct count vectors summed as fractions.

    Parameters
    ----------
    words : array-like of shape (n_words, n_bits)
        A code as :func:`complement_closed_code` returns (any row order).
    return_row_sums : bool, default=False
        Also return every word's sum.

    Returns
    -------
    seq_len : int
        ``max(3, ceil(max_x row_sum(x)) + 2)``.
    row_sums : ndarray of shape (n_words,), dtype object
        Only with ``return_row_sums``: ``sum_{y != x} 1/(D(x, y) - 1)`` per word, as
        :class:`fractions.Fraction`.

    Raises
    ------
    ValueError
        Naming the problem unless ``words`` is a 0/1 code of an even number ``>= 4`` of
        bits, all of weight ``n_bits/2``, without repeated words, of minimum distance
        ``>= 4``, with the complement of every word present.

    Examples
    --------
    >>> from minip_learn.theory import complement_closed_code, exact_seq_len
    >>> W = complement_closed_code(8, method="greedy")
    >>> exact_seq_len(W)
    15
    >>> N, sums = exact_seq_len(W, return_row_sums=True)
    >>> max(sums)
    Fraction(37, 3)
    """
    w, hist, _ = _code_overlaps(words)
    uniq, inv = np.unique(hist[:, :w - 1], axis=0, return_inverse=True)
    # overlap o < w - 1 is a gap D = w - o, weighing 1 / (w - o - 1)
    sums = [sum((Fraction(int(c), w - 1 - o) for o, c in enumerate(row)), Fraction(0))
            for row in uniq]
    top = max(sums)
    seq_len = max(3, -(-top.numerator // top.denominator) + 2)
    if not return_row_sums:
        return seq_len
    row_sums = np.empty(len(sums), dtype=object)
    row_sums[:] = sums
    return seq_len, row_sums[np.asarray(inv).reshape(-1)]


def exact_family_size(n_words, *, unique=True):
    """The number of sequences of :func:`exact_family` for a code of ``n_words`` words.

    Parameters
    ----------
    n_words : int
        Size of the code (even, ``>= 2``).
    unique : bool, default=True
        As in :func:`exact_family`.

    Returns
    -------
    n_sequences : int
        ``n_words * (3 n_words - 2) / 2`` with ``unique`` (each multiset once), else
        ``n_words * (2 n_words - 1)``.

    Examples
    --------
    >>> from minip_learn.theory import exact_family_size
    >>> exact_family_size(14), exact_family_size(6938)
    (280, 72196828)
    """
    n = check_int(n_words, "n_words", min_value=2)
    return n * (3 * n - 2) // 2 if unique else n * (2 * n - 1)


def exact_family(words, seq_len, *, unique=True):
    """The R9 family of a complement-closed code, in multiset form over its words.

    For every word ``x`` with key ``k_x = ~x`` and every other word ``y``, the R4
    sequences ``S1 = {x, k_x^(N-1)}``, ``S2 = {x, k_y^(N-1)}`` and
    ``S3 = {x, k_x, k_y^(N-2)}``. Min-IP, its targets and every head of the library see
    a sequence only as a multiset of tokens with a target at every token, so equal
    multisets are one sequence, and with ``unique`` each is listed once:

    * ``y = ~x``: ``S2 = {x^N}`` is a single slot of count ``N``, and
      ``S3 = {x^(N-1), k_x}`` is ``S1`` of the query ``k_x``: left out.
    * otherwise ``S3`` of ``(x, y)`` equals ``S3`` of ``(k_x, y)``: listed once, under
      the query of the two with the smaller row index.

    That is ``n (3n - 2) / 2`` sequences for ``n`` words (:func:`exact_family_size`);
    72,196,828 for the greedy code at ``n_bits = 20``. With ``N >= exact_seq_len(words)``
    the minimum rank of a nonnegative kernel head solving the family is exactly ``n``
    (R9): the certified bound and the constructive rank (one feature per word) meet.

    Parameters
    ----------
    words : array-like of shape (n_words, n_bits)
        A code as :func:`complement_closed_code` returns (validated as in
        :func:`exact_seq_len`).
    seq_len : int
        Sequence length ``N >= 3``.
    unique : bool, default=True
        List each multiset once (above). False lists, for every query ``x``, ``S1`` and
        ``S2``, ``S3`` of every ``y != x``: ``n (2n - 1)`` rows, each query's R4
        sequences complete (``S3`` of ``y = ~x`` as ``{x^(N-1), k_x}``), some multisets
        twice.

    Returns
    -------
    token_ids : ndarray of shape (n_sequences, 3)
        Rows of ``words``, ``-1`` for padding. Slot 0 is the query ``x`` (count 1;
        ``N`` in ``{x^N}``, ``N - 1`` in ``{x^(N-1), k_x}``); slot 1 holds ``k_x`` in
        ``S1`` and ``S3`` and ``k_y`` in ``S2``; slot 2 holds ``k_y`` in ``S3``.
    counts : ndarray of shape (n_sequences, 3)
        Multiplicities, 0 at padding; every row sums to ``N``.

    Notes
    -----
    Rows are grouped by query ``x`` in row order of ``words``: ``S1``, then ``S2`` for
    ``y`` in row order, then ``S3`` for ``y`` in row order. ``token_ids`` and
    ``counts`` each have the smallest signed integer dtype that holds their values
    (``int16`` for the 6,938 words and ``N = 1972`` at ``n_bits = 20``: 826 MiB for
    both arrays, built in a few seconds, one vectorised step per query).

    Examples
    --------
    >>> from minip_learn.compact import CompactFamily
    >>> from minip_learn.theory import complement_closed_code, exact_family, exact_seq_len
    >>> W = complement_closed_code(8, method="greedy")
    >>> ids, counts = exact_family(W, exact_seq_len(W))
    >>> ids.shape, ids.dtype.name
    ((280, 3), 'int8')
    >>> ids[:3].tolist(), counts[:3].tolist()
    ([[0, 1, -1], [0, -1, -1], [0, 3, -1]], [[1, 14, 0], [15, 0, 0], [1, 14, 0]])
    >>> CompactFamily(W, ids, counts).shape
    (280, 15, 8)
    """
    _, _, comp = _code_overlaps(words)
    N = check_int(seq_len, "seq_len", min_value=3)
    unique = bool(unique)
    n = len(comp)
    if unique:
        per = n + np.where(np.arange(n) < comp, n - 2, 0)
    else:
        per = np.full(n, 2 * n - 1, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(per)])
    ids = np.full((int(start[-1]), 3), -1, dtype=smallest_int_dtype(n - 1, -1))
    counts = np.zeros(ids.shape, dtype=smallest_int_dtype(N, 0))
    for x in range(n):
        _fill_query(ids[start[x]:start[x + 1]], counts[start[x]:start[x + 1]], x, comp,
                    N, unique)
    return ids, counts


def _fill_query(ids, counts, x, comp, N, unique):
    """The rows of query ``x`` (views): S1, S2 for every ``y != x``, then S3 for every
    ``y != x`` (with ``unique``: for ``y`` other than ``~x``, and only when ``x`` comes
    before ``~x``)."""
    n, kx = len(comp), comp[x]
    others = np.concatenate([np.arange(x), np.arange(x + 1, n)])
    at_kx = int(np.flatnonzero(others == kx)[0])
    ids[0], counts[0] = (x, kx, -1), (1, N - 1, 0)
    ids[1:n, 0], ids[1:n, 1] = x, comp[others]
    counts[1:n, 0], counts[1:n, 1] = 1, N - 1
    ids[1 + at_kx], counts[1 + at_kx] = (x, -1, -1), (N, 0, 0)   # {x^N}
    if len(ids) == n:
        return
    third = np.delete(others, at_kx) if unique else others
    ids[n:, 0], ids[n:, 1], ids[n:, 2] = x, kx, comp[third]
    counts[n:] = (1, 1, N - 2)
    if not unique:                                                  # {x^(N-1), k_x}
        ids[n + at_kx], counts[n + at_kx] = (x, kx, -1), (N - 1, 1, 0)
