"""Families of Min-IP sequences in multiset ("compact") form (numpy only).

Min-IP targets, normalised kernel heads and softmax heads without positional maps see
a sequence only through its *multiset* of tokens: the target of a token is its least
overlap with the tokens present, and a head's output at a token is a weighted mean over
the distinct tokens, each weighted by how often it occurs. A witness family of length
``N`` holds two or three distinct tokens per sequence, so it is stored as

* ``tokens`` (T, n_bits): the distinct tokens, 0/1;
* ``token_ids`` (n_sequences, k): indices into ``tokens``, ``-1`` for padding;
* ``counts`` (n_sequences, k): multiplicities, 0 exactly at padding; every row sums to
  the same sequence length ``N``.

:class:`CompactFamily` holds the three arrays, validates them once, and materialises
``(n, N, n_bits)`` sequences only on request (:meth:`CompactFamily.to_sequences`, or in
slices with :meth:`CompactFamily.iter_sequences`). The order of the slots is the order
of the tokens in a materialised sequence (slot 0 first, each repeated ``count`` times).
Every per-token result on a compact family (targets, predictions) has shape
``(n_sequences, k)``, aligned with ``token_ids``, and holds 0 at padding.

:meth:`CompactFamily.save` writes a family to an ``.npz`` file and :func:`load_family`
reads it back (or an ``.npy`` array of sequences). Family files are untrusted input:
the loader checks every declared size against the file and :data:`MAX_FAMILY_BYTES`
before it allocates, never unpickles, and refuses anything but a valid family with a
:class:`ValueError` naming the file. Sequence lengths are at most :data:`MAX_SEQ_LEN`.
"""

import functools
import numbers
from pathlib import Path

import numpy as np

from . import bits
from ._deprecation import moved_names
from ._io import read_family_file
from ._validation import (  # noqa: F401  (MAX_SEQ_LEN: importable here)
    MAX_SEQ_LEN,
    check_binary,
    check_family,
    check_int,
    check_sequences,
    distinct_tokens,
)

#: The limits and format markers (``MAX_FAMILY_BYTES``, ``MAX_SEQ_LEN``, ``NPZ_FORMAT``,
#: ``NPZ_VERSION``, ``MATERIALIZE_MAX_BYTES``) and the helpers ``merge_slots``,
#: ``token_ids`` and ``smallest_int_dtype`` are importable from here without being
#: exported.
__all__ = ["CompactFamily", "is_compact", "load_family"]

#: names of :mod:`minip_learn.bits` still importable from here, with a FutureWarning
_MOVED_TO_BITS = ("index_dtype", "overlap_words", "pack_tokens")


__getattr__ = moved_names(__name__, _MOVED_TO_BITS, bits)

#: the witness suites materialise ``X`` only when it takes at most this many bytes
MATERIALIZE_MAX_BYTES = 1 << 28

#: file format marker of :meth:`CompactFamily.save` (the ``format`` array of the file)
NPZ_FORMAT = "minip-learn compact family"

#: version of the compact file format (the ``version`` array of the file; a file
#: without one is version 1)
NPZ_VERSION = 1

#: the most bytes of array data a family file may declare (8 GiB; all arrays of the
#: file together, as stored, before any conversion). :func:`load_family` refuses a
#: larger file before it allocates anything; raise it to read a larger family.
MAX_FAMILY_BYTES = 1 << 33


#: sequences per slice of :meth:`CompactFamily.targets`
TARGET_CHUNK = 1 << 22


def smallest_int_dtype(max_value, min_value=0):
    """The smallest signed integer dtype holding ``min_value..max_value``."""
    for dt in (np.int8, np.int16, np.int32, np.int64):
        info = np.iinfo(dt)
        if info.min <= min_value and max_value <= info.max:
            return np.dtype(dt)
    raise ValueError(f"values up to {max_value} do not fit a 64-bit integer.")


def _integer_array(a, name, ndim):
    arr = np.asarray(a)
    if arr.dtype == bool or arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and arr.size and np.isfinite(arr).all() \
                and (arr == np.round(arr)).all() and (np.abs(arr) <= 2.0**53).all():
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integers; got dtype {arr.dtype}.")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D; got shape {arr.shape}.")
    return arr


class CompactFamily:
    """A family of Min-IP sequences stored as multisets of tokens.

    Parameters
    ----------
    tokens : array-like of shape (n_tokens, n_bits)
        Distinct 0/1 tokens.
    token_ids : array-like of shape (n_sequences, k)
        Row indices into ``tokens``, ``-1`` for padding; a token appears at most once
        per sequence (its multiplicity is in ``counts``).
    counts : array-like of shape (n_sequences, k)
        Multiplicities: ``>= 1`` where ``token_ids >= 0``, 0 at padding; every row sums
        to the same sequence length, at most :data:`MAX_SEQ_LEN`.

    Raises
    ------
    ValueError
        Naming the problem: tokens not 2-D 0/1 or repeated, ids out of range,
        negative counts, counts that do not sum to the same length, a length (or a
        count, or a number of slots) above :data:`MAX_SEQ_LEN`, padding with a count,
        a token twice in a sequence, mismatched shapes.

    Attributes
    ----------
    tokens, token_ids, counts : ndarray
        The validated arrays (ids and counts in the smallest integer dtypes).
    shape : tuple
        ``(n_sequences, seq_len, n_bits)``: the shape of the materialised family, so
        that scikit-learn's splitters and ``GridSearchCV`` index it like an array.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.compact import CompactFamily
    >>> fam = CompactFamily([[1, 1, 0], [0, 0, 1]], [[0, 1], [1, -1]], [[1, 2], [3, 0]])
    >>> fam.shape
    (2, 3, 3)
    >>> fam.to_sequences()[0].tolist()
    [[1, 1, 0], [0, 0, 1], [0, 0, 1]]
    >>> fam[[1]].token_ids.tolist()
    [[1, -1]]
    """

    ndim = 3

    def __init__(self, tokens, token_ids, counts):
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be a non-empty 2-D array (n_tokens, n_bits); "
                             f"got shape {tokens.shape}.")
        if tokens.dtype.kind not in "biuf":
            raise ValueError(f"tokens must hold 0/1 numbers; got dtype {tokens.dtype}.")
        check_binary(tokens, name="tokens")
        tokens = tokens.astype(np.uint8)
        if len(distinct_tokens(tokens)) != len(tokens):
            raise ValueError("tokens holds a token twice; the tokens of a compact family "
                             "must be distinct.")
        ids = _integer_array(token_ids, "token_ids", 2)
        cnt = _integer_array(counts, "counts", 2)
        if ids.shape != cnt.shape:
            raise ValueError(f"token_ids {ids.shape} and counts {cnt.shape} must have the "
                             "same shape.")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"a compact family needs >= 1 sequence and >= 1 slot; "
                             f"got token_ids of shape {ids.shape}.")
        self.tokens = tokens
        self.token_ids, self.counts, self._seq_len = self._check_rows(ids, cnt, len(tokens))

    @staticmethod
    def _check_rows(ids, cnt, T):
        lo, hi = int(ids.min()), int(ids.max())
        if lo < -1 or hi >= T:
            bad = lo if lo < -1 else hi
            raise ValueError(f"token_ids holds {bad}, outside -1..{T - 1} (-1 is padding; "
                             f"there are {T} tokens).")
        if int(cnt.min()) < 0:
            r = int(np.argwhere(cnt < 0)[0, 0])
            raise ValueError(f"counts holds a negative multiplicity (sequence {r}).")
        # every count and the number of slots at most MAX_SEQ_LEN: the row sums below
        # stay under 2**40 and cannot wrap around in int64
        if int(cnt.max()) > MAX_SEQ_LEN:
            r = int(np.argwhere(cnt > MAX_SEQ_LEN)[0, 0])
            raise ValueError(f"counts holds {int(cnt.max())} (sequence {r}), above the "
                             f"longest sequence length MAX_SEQ_LEN = {MAX_SEQ_LEN}.")
        if ids.shape[1] > MAX_SEQ_LEN:
            raise ValueError(f"token_ids has {ids.shape[1]} slots per sequence, more than "
                             f"the longest sequence length MAX_SEQ_LEN = {MAX_SEQ_LEN}.")
        pad = ids < 0
        if (cnt[pad] != 0).any() or (cnt[~pad] < 1).any():
            r = int(np.argwhere((pad & (cnt != 0)) | (~pad & (cnt < 1)))[0, 0])
            raise ValueError(f"sequence {r}: counts must be 0 exactly at padding "
                             "(token_ids == -1) and >= 1 elsewhere.")
        k = ids.shape[1]
        for a in range(k):
            for b in range(a + 1, k):
                same = (ids[:, a] == ids[:, b]) & ~pad[:, a]
                if same.any():
                    r = int(np.flatnonzero(same)[0])
                    raise ValueError(f"sequence {r} lists token {int(ids[r, a])} twice in "
                                     "token_ids; merge its counts.")
        lengths = cnt.sum(axis=1, dtype=np.int64)
        N = int(lengths[0])
        if (lengths != N).any():
            r = int(np.flatnonzero(lengths != N)[0])
            raise ValueError(f"counts must sum to the same sequence length in every row; "
                             f"row 0 sums to {N}, row {r} to {int(lengths[r])}.")
        if N < 1:
            raise ValueError("every sequence needs at least one token (counts sum to 0).")
        if N > MAX_SEQ_LEN:
            raise ValueError(f"counts sum to the sequence length {N}, above the longest "
                             f"sequence length MAX_SEQ_LEN = {MAX_SEQ_LEN}.")
        ids = ids.astype(smallest_int_dtype(T - 1, -1), copy=False)
        cnt = cnt.astype(smallest_int_dtype(N), copy=False)
        return ids, cnt, N

    @classmethod
    def _trusted(cls, tokens, token_ids, counts, seq_len):
        """A family from arrays already validated (subsets of a validated family)."""
        fam = cls.__new__(cls)
        fam.tokens, fam.token_ids, fam.counts, fam._seq_len = tokens, token_ids, counts, seq_len
        return fam

    @classmethod
    def from_slots(cls, tokens, token_ids, counts):
        """A family whose sequences may list a token in several slots: the counts of
        equal ids in a row are merged into the first of them (later slots become
        padding, moved to the end)."""
        ids, cnt = merge_slots(token_ids, counts)
        return cls(tokens, ids, cnt)

    @classmethod
    def from_sequences(cls, X):
        """The compact form of materialised sequences ``X`` (n, N, n_bits).

        Tokens are the distinct rows of ``X`` (``np.unique`` order); each sequence's
        slots list its distinct tokens in order of first occurrence.
        """
        X, _ = check_sequences(X, binary=True)
        n, N, m = X.shape
        tokens, ids = token_ids(X.astype(np.uint8, copy=False))
        ids = ids.astype(np.int64)
        # stable sort by id, run-length count, then restore order of first occurrence
        order = np.argsort(ids, axis=1, kind="stable")
        srt = np.take_along_axis(ids, order, axis=1)
        new = np.ones((n, N), dtype=bool)
        new[:, 1:] = srt[:, 1:] != srt[:, :-1]
        k = int(new.sum(axis=1).max())
        slot = np.cumsum(new, axis=1) - 1
        rows = np.broadcast_to(np.arange(n)[:, None], (n, N))
        out_ids = np.full((n, k), -1, dtype=np.int64)
        out_cnt = np.zeros((n, k), dtype=np.int64)
        first = np.full((n, k), N, dtype=np.int64)
        out_ids[rows, slot] = srt
        np.add.at(out_cnt, (rows, slot), 1)
        np.minimum.at(first, (rows, slot), order)
        by_first = np.argsort(first, axis=1, kind="stable")
        return cls(tokens, np.take_along_axis(out_ids, by_first, axis=1),
                   np.take_along_axis(out_cnt, by_first, axis=1))

    # -- shape ------------------------------------------------------------------------
    @property
    def n_sequences(self):
        return len(self.token_ids)

    @property
    def seq_len(self):
        return self._seq_len

    @property
    def n_bits(self):
        return self.tokens.shape[1]

    @property
    def shape(self):
        return (self.n_sequences, self._seq_len, self.n_bits)

    @property
    def n_slots(self):
        """Slots per sequence ``k`` (the most distinct tokens of a sequence)."""
        return self.token_ids.shape[1]

    @property
    def padding(self):
        """Boolean mask (n_sequences, k) of the padding slots."""
        return self.token_ids < 0

    @property
    def materialized_nbytes(self):
        """Bytes of the materialised ``uint8`` sequences."""
        n, N, m = self.shape
        return n * N * m

    def __len__(self):
        return self.n_sequences

    def __repr__(self):
        n, N, m = self.shape
        return (f"CompactFamily(n_sequences={n}, seq_len={N}, n_bits={m}, "
                f"n_tokens={len(self.tokens)}, n_slots={self.n_slots})")

    def __getitem__(self, key):
        """Sequences selected by an int, slice, index or mask array (``fam[idx, ...]``
        as well: scikit-learn indexes arrays that way)."""
        if isinstance(key, tuple):
            if len(key) == 2 and key[1] is Ellipsis:
                key = key[0]
            else:
                raise IndexError("a CompactFamily is indexed by sequences only.")
        if isinstance(key, numbers.Integral):
            key = [int(key)]
        ids, cnt = self.token_ids[key], self.counts[key]
        if ids.ndim != 2:
            raise IndexError(f"cannot index a CompactFamily with {key!r}.")
        return CompactFamily._trusted(self.tokens, ids, cnt, self._seq_len)

    def __eq__(self, other):
        if not isinstance(other, CompactFamily):
            return NotImplemented
        return (self.shape == other.shape and np.array_equal(self.tokens, other.tokens)
                and np.array_equal(self.token_ids, other.token_ids)
                and np.array_equal(self.counts, other.counts))

    __hash__ = None

    # -- views ------------------------------------------------------------------------
    def slot_tokens(self, rows=slice(None)):
        """Tokens of the slots (n, k, n_bits) uint8; padding repeats slot 0's token.

        With :attr:`counts` (0 at padding) this is what the torch heads read: a padding
        slot adds nothing to any attention sum, and its own output and target are those
        of slot 0's token in the same sequence.
        """
        ids = self.token_ids[rows].astype(np.int64)
        ids = np.where(ids < 0, ids[:, :1], ids)
        return self.tokens[ids]

    def to_sequences(self, rows=slice(None)):
        """Materialised sequences (n, N, n_bits) uint8 of the selected ``rows``."""
        ids = self.token_ids[rows].astype(np.int64)
        cnt = self.counts[rows].astype(np.int64)
        n, k = ids.shape
        flat = np.repeat(ids.ravel(), cnt.ravel())
        return self.tokens[flat].reshape(n, self._seq_len, self.n_bits)

    def expand(self, values, rows=slice(None)):
        """Per-slot ``values`` (n, k) spread to the positions (n, N) of the sequences."""
        values = np.asarray(values)
        cnt = self.counts[rows].astype(np.int64)
        return np.repeat(values.reshape(-1), cnt.ravel()).reshape(len(cnt), self._seq_len)

    def iter_sequences(self, chunk_size=None):
        """Yield the materialised sequences in slices of ``chunk_size`` sequences
        (default: slices of about 64 MiB)."""
        if chunk_size is None:
            chunk_size = max(1, (1 << 26) // max(1, self._seq_len * self.n_bits))
        chunk_size = check_int(chunk_size, "chunk_size", min_value=1)
        for a in range(0, self.n_sequences, chunk_size):
            yield self.to_sequences(slice(a, a + chunk_size))

    def targets(self, rows=slice(None)):
        """Exact Min-IP targets per slot (n, k); 0 at padding.

        A slot's target is its token's least overlap with the tokens present in its
        sequence (itself included), computed with popcounts on packed tokens, in slices
        of :data:`TARGET_CHUNK` sequences. The dtype is the smallest signed integer
        holding ``0..n_bits``.
        """
        ids_all = self.token_ids[rows]
        words = bits.pack_tokens(self.tokens)
        n, k = ids_all.shape
        out = np.zeros((n, k), dtype=smallest_int_dtype(self.n_bits))
        for start in range(0, n, TARGET_CHUNK):
            ids = ids_all[start:start + TARGET_CHUNK].astype(np.int64)
            for a in range(k):
                real_a = ids[:, a] >= 0
                best = np.full(len(ids), np.iinfo(np.int64).max)
                for b in range(k):
                    ok = real_a & (ids[:, b] >= 0)
                    ov = bits.overlap_words(words, np.maximum(ids[:, a], 0),
                                            np.maximum(ids[:, b], 0))
                    best = np.where(ok, np.minimum(best, ov), best)
                out[start:start + len(ids), a] = np.where(real_a, best, 0)
        return out

    # -- files ------------------------------------------------------------------------
    def save(self, path):
        """Write the family to ``path`` (``.npz``), readable by :func:`load_family`.

        The file is a compressed ``.npz`` archive holding the arrays ``format``
        (:data:`NPZ_FORMAT`), ``version`` (:data:`NPZ_VERSION`), ``tokens``,
        ``token_ids`` and ``counts``, and nothing else.
        """
        path = Path(path)
        with open(path, "wb") as fh:
            np.savez_compressed(fh, format=np.array(NPZ_FORMAT),
                                version=np.array(NPZ_VERSION, dtype=np.int64),
                                tokens=self.tokens, token_ids=self.token_ids,
                                counts=self.counts)
        return path


def merge_slots(token_ids, counts):
    """Merge repeated ids within each row of ``(n, k)`` ids and counts.

    The count of a repeated id is added to its first slot and the later slot becomes
    padding (-1, count 0); padding is then moved to the end of each row (stable), and
    columns that are padding in every row are dropped.
    """
    ids = np.array(token_ids, dtype=np.int64)
    cnt = np.array(counts, dtype=np.int64)
    k = ids.shape[1]
    for b in range(1, k):
        for a in range(b):
            same = (ids[:, b] == ids[:, a]) & (ids[:, a] >= 0)
            cnt[same, a] += cnt[same, b]
            cnt[same, b] = 0
            ids[same, b] = -1
    order = np.argsort(ids < 0, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=1)
    cnt = np.take_along_axis(cnt, order, axis=1)
    used = max(1, int((ids >= 0).sum(axis=1).max(initial=1)))
    return ids[:, :used], cnt[:, :used]


def is_compact(X):
    """Whether ``X`` is a :class:`CompactFamily`.

    Parameters
    ----------
    X : object
        A training or prediction input.

    Returns
    -------
    bool
        True for a family in multiset form, False for anything else (arrays of
        sequences included).

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.compact import CompactFamily, is_compact
    >>> X = np.array([[[0, 1], [1, 1]], [[1, 0], [1, 0]]])
    >>> is_compact(CompactFamily.from_sequences(X)), is_compact(X)
    (True, False)
    """
    return isinstance(X, CompactFamily)


def load_family(path):
    """A family from a file: a compact ``.npz`` or an ``.npy`` array of sequences.

    Every size is checked against the file before anything is allocated, and nothing
    is unpickled. The rules:

    * ``.npy`` (any name; recognised by its first bytes): format version 1.0 or 2.0, a
      header of at most 10,000 bytes, a 3-D array ``(n_samples, seq_len, n_bits)``
      with no zero dimension, ``seq_len <= MAX_SEQ_LEN``, a bool or integer dtype
      (not float, complex, object, string or structured) holding only 0 and 1, and a
      body of exactly the declared size (no bytes after it), at most
      :data:`MAX_FAMILY_BYTES`.
    * ``.npz`` (a zip archive, as :meth:`CompactFamily.save` writes it): the members
      ``format.npy``, ``tokens.npy``, ``token_ids.npy`` and ``counts.npy``, optionally
      ``version.npy``, and no other member (nor one twice); stored or deflated, not
      encrypted; declared sizes that deflate can produce from the compressed sizes
      and that add up to at most :data:`MAX_FAMILY_BYTES`. Each member is an ``.npy``
      of exactly its declared size: ``format`` a 0-d string equal to
      :data:`NPZ_FORMAT`; ``version`` a 0-d integer equal to :data:`NPZ_VERSION`
      (absent: version 1); ``tokens`` 2-D bool or integer; ``token_ids`` and
      ``counts`` 2-D integer. The arrays must make a valid :class:`CompactFamily`
      (0/1 distinct tokens, ids in range, counts summing to one length
      ``<= MAX_SEQ_LEN`` in every row).

    Parameters
    ----------
    path : str or path-like
        The file. It is only read.

    Returns
    -------
    family : ndarray of shape (n_samples, seq_len, n_bits) or CompactFamily
        The array of an ``.npy`` file (its dtype, in native byte order), or the
        :class:`CompactFamily` of an ``.npz`` file.

    Raises
    ------
    ValueError
        One line, ``"<path>: <problem>"``, for a file that cannot be read, is neither
        format, breaks a rule above, or is corrupt or cut short.

    Examples
    --------
    >>> import numpy as np, tempfile, pathlib
    >>> from minip_learn.compact import CompactFamily, load_family
    >>> fam = CompactFamily([[1, 1, 0], [0, 0, 1]], [[0, 1], [1, -1]], [[1, 2], [3, 0]])
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = fam.save(pathlib.Path(tmp) / "family.npz")
    ...     load_family(path) == fam
    True
    """
    return read_family_file(
        path, max_bytes=MAX_FAMILY_BYTES, max_seq_len=MAX_SEQ_LEN, npz_format=NPZ_FORMAT,
        npz_version=NPZ_VERSION, make_family=CompactFamily,
        check_array=functools.partial(check_family, name="the array", integer=True))


def token_ids(X):
    """Distinct tokens (``np.unique(axis=0)`` order) and the id of every position of
    validated binary sequences ``X`` (n, N, m)."""
    n, N, m = X.shape
    flat = X.reshape(-1, m)
    words = np.empty((len(flat), max(1, -(-m // 64))), dtype=np.uint64)
    step = 1 << 20                          # packed in slices: no full-size temporaries
    for a in range(0, len(flat), step):
        words[a:a + step] = bits.pack_tokens(flat[a:a + step])
    uniq, inv = bits.unique_rows(words)
    del words
    return bits.unpack_tokens(uniq, m), inv.reshape(n, N)
