"""0/1 tokens packed into 64-bit words, for exact overlaps by popcount (numpy only).

A token of ``m`` bits is stored as ``ceil(m / 64)`` big-endian ``uint64`` words
(:func:`pack_tokens`; bit 0 of the token is the most significant bit of word 0, and the
last word is padded with zeros). The overlap ``<x, y>`` of two tokens is then the
popcount of their bitwise and, summed over the words (:func:`overlap_words`), exact at
any ``m``. :func:`unique_rows` and :func:`unpack_tokens` find the distinct tokens of
many sequences on their packed form and turn them back into 0/1 rows.
"""

import numpy as np

__all__ = ["index_dtype", "overlap_words", "pack_tokens", "unique_rows", "unpack_tokens"]


def pack_tokens(tokens):
    """Binary tokens ``(T, m)`` as big-endian 64-bit words ``(T, ceil(m / 64))``.

    Parameters
    ----------
    tokens : array-like of shape (T, m)
        0/1 tokens.

    Returns
    -------
    words : ndarray of shape (T, max(1, ceil(m / 64))), dtype uint64
        Bit ``j`` of a token is bit ``63 - j % 64`` of its word ``j // 64``.

    Examples
    --------
    >>> from minip_learn.bits import pack_tokens
    >>> pack_tokens([[1, 0, 1], [0, 0, 1]]).tolist() == [[5 << 61], [1 << 61]]
    True
    """
    tokens = np.asarray(tokens, dtype=np.uint8)
    T, m = tokens.shape
    n_words = max(1, -(-m // 64))
    packed = np.packbits(tokens, axis=1)
    if packed.shape[1] != 8 * n_words:
        padded = np.zeros((T, 8 * n_words), dtype=np.uint8)
        padded[:, : packed.shape[1]] = packed
        packed = padded
    return packed.view(">u8").astype(np.uint64)


def overlap_words(words, a, b):
    """The overlaps ``<tokens[a], tokens[b]>`` of packed tokens, exactly.

    Parameters
    ----------
    words : ndarray of shape (T, n_words), dtype uint64
        Packed tokens (:func:`pack_tokens`).
    a, b : int or array of int
        Token indices, broadcast against each other.

    Returns
    -------
    overlaps : int64 or ndarray of int64
        The popcount of ``words[a] & words[b]``, summed over the words.

    Examples
    --------
    >>> from minip_learn.bits import overlap_words, pack_tokens
    >>> words = pack_tokens([[1, 1, 0], [0, 1, 1], [1, 1, 1]])
    >>> overlap_words(words, [0, 0, 1], [1, 2, 2]).tolist()
    [1, 2, 2]
    """
    return np.bitwise_count(words[a] & words[b]).sum(axis=-1, dtype=np.int64)


def index_dtype(n):
    """int32 when indices below ``n`` fit in it, else int64.

    Parameters
    ----------
    n : int
        The number of items indexed.

    Returns
    -------
    dtype : type
        ``numpy.int32`` or ``numpy.int64``.

    Examples
    --------
    >>> from minip_learn.bits import index_dtype
    >>> index_dtype(1000).__name__, index_dtype(2**31).__name__
    ('int32', 'int64')
    """
    return np.int32 if int(n) < 2**31 else np.int64


def unique_rows(words):
    """``np.unique(axis=0)`` of packed word rows, sorted one column at a time.

    Parameters
    ----------
    words : ndarray of shape (n, n_words), dtype uint64
        Packed tokens (:func:`pack_tokens`).

    Returns
    -------
    uniq : ndarray of shape (n_unique, n_words)
        The distinct rows in ascending order (which is the order of ``np.unique`` on
        the 0/1 tokens).
    inverse : ndarray of shape (n,)
        The index in ``uniq`` of every row (:func:`index_dtype` of ``n_unique``).

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.bits import unique_rows
    >>> uniq, inverse = unique_rows(np.array([[3, 1], [2, 0], [3, 1]], dtype=np.uint64))
    >>> uniq.tolist(), inverse.tolist()
    ([[2, 0], [3, 1]], [1, 0, 1])
    """
    if words.shape[1] == 1:
        uniq, inv = np.unique(words[:, 0], return_inverse=True)
        return uniq[:, None], inv.reshape(-1)
    if not len(words):
        return words, np.zeros(0, dtype=np.int64)
    order = np.lexsort(words.T[::-1])
    new = np.zeros(len(order), dtype=bool)
    new[0] = True
    for c in range(words.shape[1]):         # one column at a time
        col = words[order, c]
        new[1:] |= col[1:] != col[:-1]
        del col
    first = order[new]
    inv = np.empty(len(order), dtype=index_dtype(len(first)))
    inv[order] = np.cumsum(new, dtype=inv.dtype) - 1
    return words[first], inv


def unpack_tokens(words, m):
    """Packed tokens (:func:`pack_tokens`) back as 0/1 rows of ``m`` bits.

    Parameters
    ----------
    words : ndarray of shape (T, n_words), dtype uint64
        Packed tokens.
    m : int
        Bits per token.

    Returns
    -------
    tokens : ndarray of shape (T, m), dtype uint8

    Examples
    --------
    >>> from minip_learn.bits import pack_tokens, unpack_tokens
    >>> unpack_tokens(pack_tokens([[1, 0, 1], [0, 1, 1]]), 3).tolist()
    [[1, 0, 1], [0, 1, 1]]
    """
    bits = np.unpackbits(words.astype(">u8").view(np.uint8).reshape(len(words), -1), axis=1)
    return np.ascontiguousarray(bits[:, :m])
