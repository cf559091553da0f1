"""The R4 constraints of a family and their best chains, as flat integer arrays.

Two implementations of the same two steps, kept side by side so that the fast one can
be checked against the plain one:

* :func:`constraints` / :func:`constraints_reference` -- the gap-domination triples
  ``(x, y, z, K)`` a family contains (see :ref:`theory-r4`);
* :func:`reach` / :func:`reach_reference` -- for every query ``x`` and source key
  ``s``, the best chained denominator to every key ``t`` reachable in the constraint
  DAG of ``x``, with the predecessor of ``t`` on that best chain.

The fast versions pack tokens into 64-bit words, group sequences by multiset with
sorting, and run the chain dynamic programme level by level (overlap with the query
strictly increases along an edge, so there are at most ``n_bits + 1`` levels) over all
queries at once. Both versions return identical arrays (ties: the predecessor with the
smaller overlap with the query, then the smaller token index).
"""

from collections import Counter

import numpy as np

from ..bits import overlap_words, pack_tokens
from ..compact import is_compact, smallest_int_dtype, token_ids

__all__ = ["Constraints", "Reach", "constraints", "constraints_reference", "every_order_triples",
           "isin", "reach", "reach_reference", "with_singles"]


class Constraints:
    """Tokens of a family and its R4 triples (arrays sorted by ``(x, y, z)``).

    Token indices are held in the smallest dtype that fits (int16 below 32,768 tokens)
    and the gaps in the smallest one that holds ``n_bits``; the denominators ``K`` are
    computed from the gaps when asked for (``K=None``), as :func:`step_denominators`.
    ``n_triples`` is the number of triples, kept by :meth:`release`.
    """

    def __init__(self, tokens, seq_len, x, y, z, K, gap):
        self.tokens = tokens
        self.seq_len = seq_len
        self.x, self.y, self.z, self._K, self.gap = x, y, z, K, gap
        self.n_triples = len(x)
        self.words = pack_tokens(tokens)

    @property
    def K(self):
        """One step's denominators ``(N-2)(gap-1)``."""
        if self._K is None:
            return step_denominators(self.seq_len, self.gap)
        return self._K

    def __len__(self):
        return len(self.x)

    def overlap(self, a, b):
        """``<tokens[a], tokens[b]>`` for index arrays ``a``, ``b``."""
        return overlap_words(self.words, a, b)

    def release(self):
        """Drop the triples, keeping the tokens and :meth:`overlap` (frees memory once
        the chains are computed)."""
        e = np.zeros(0, dtype=np.int64)
        self.x = self.y = self.z = self._K = self.gap = e


def token_index_dtype(n_tokens):
    """The dtype of token indices (and -1): int16 below 32,768 tokens, else int32/int64."""
    return smallest_int_dtype(max(int(n_tokens) - 1, 2**8), -1)


def step_denominators(N, gap):
    """``(N-2)(gap-1)`` as int32 when every value fits (int64 otherwise)."""
    K = (N - 2) * (np.asarray(gap).astype(np.int64) - 1)
    if not K.size or K.max() < 2**31:
        K = K.astype(np.int32)
    return K


class Reach:
    """Best chains: rows ``(x, s, t)`` sorted, with denominator ``K`` and predecessor.

    ``singles``: the columns ``(x, s, t)`` of the rows :func:`reach` left out with
    ``drop_single`` (each a source whose one key ``t`` is one step away), which
    :func:`with_singles` puts back; None when none was left out.
    """

    def __init__(self, x, s, t, K, pred, singles=None):
        self.x, self.s, self.t, self.K, self.pred = x, s, t, K, pred
        self.singles = singles

    @property
    def dropped(self):
        """The number of rows left out (see :func:`reach`'s ``drop_single``)."""
        return 0 if self.singles is None else len(self.singles[0])

    def __len__(self):
        return len(self.x)


def _empty(tokens, N):
    e = np.zeros(0, dtype=np.int64)
    return Constraints(tokens, N, e, e, e, e, e)


def _finish(tokens, N, triples, s1=None):
    """Keep triples ``(x, y, z)`` with S1(x, y), S1(x, z) present and gap >= 2, once each.

    ``s1=None``: the triples are already restricted to present S1 multisets.
    """
    if not len(triples):
        return _empty(tokens, N)
    T = np.int64(len(tokens))
    x, y, z = (c.astype(np.int64) for c in triples.T)
    if s1 is not None:
        s1 = np.unique(s1)
        has = (isin(x * T + y, s1)) & (isin(x * T + z, s1))
        x, y, z = x[has], y[has], z[has]
    overlaps = _Overlaps(tokens)
    gap = overlaps(x, z) - overlaps(x, y)
    ok = gap >= 2
    x, y, z = x[ok], y[ok], z[ok]
    if float(T) ** 3 < 2.0 ** 62:
        return _from_codes(tokens, N, [(x * T + y) * T + z], overlaps)
    _, first = np.unique(np.stack([x, y, z], axis=1), axis=0, return_index=True)
    return _constraints_of(tokens, N, x[first], y[first], z[first], overlaps)


class _Overlaps:
    """``<tokens[a], tokens[b]>`` for index arrays: a table of every pair when it is
    small (int8/int16), packed words and popcounts otherwise."""

    MAX_TABLE = 1 << 27

    def __init__(self, tokens):
        T, m = tokens.shape
        self.n_bits = m
        if T * T <= self.MAX_TABLE:
            t = tokens.astype(np.float32)
            self.table = np.rint(t @ t.T).astype(np.int8 if m < 128 else np.int16)
        else:
            self.table, self.words = None, pack_tokens(tokens)

    def __call__(self, a, b):
        if self.table is not None:
            return self.table[a, b].astype(np.int64)
        return overlap_words(self.words, a, b)

    def gaps(self, x, y, z):
        """``<x, z> - <x, y>`` in the smallest dtype holding ``+-n_bits`` (in slices)."""
        m = self.n_bits
        out = np.empty(len(x), dtype=smallest_int_dtype(m, -m))
        for a in range(0, len(x), SLOT_CHUNK):
            sl = slice(a, a + SLOT_CHUNK)
            out[sl] = self(x[sl], z[sl]) - self(x[sl], y[sl])
        return out


def _constraints_of(tokens, N, x, y, z, overlaps):
    """Constraints from sorted, distinct triples of gap >= 2 (indices in small dtypes);
    ``overlaps`` is the tokens' :class:`_Overlaps`. The denominators are not stored:
    :attr:`Constraints.K` derives them from the gaps."""
    idx = token_index_dtype(len(tokens))
    x, y, z = (a.astype(idx, copy=False) for a in (x, y, z))
    return Constraints(tokens, N, x, y, z, None, overlaps.gaps(x, y, z))


def fill_from(parts, dtype=None):
    """``np.concatenate(parts)``, emptying the list part by part as it is copied: the
    output's pages are touched as they are written, so the peak is about one copy."""
    out = np.empty(sum(len(p) for p in parts), dtype=dtype or parts[0].dtype)
    pos = 0
    parts.reverse()
    while parts:
        p = parts.pop()
        out[pos:pos + len(p)] = p
        pos += len(p)
        del p
    return out


def _from_codes(tokens, N, parts, overlaps):
    """Constraints from lists of triple codes ``(x T + y) T + z`` (sorted, deduplicated
    and decoded here in slices: one array of codes at a time)."""
    T = np.int64(len(tokens))
    if not parts:
        return _empty(tokens, N)
    codes = fill_from(parts, np.int64)
    codes.sort()
    keep = np.ones(len(codes), dtype=bool)
    if len(codes):
        keep[1:] = codes[1:] != codes[:-1]
    idx = token_index_dtype(T)
    n = int(np.count_nonzero(keep))
    x, y, z = (np.empty(n, dtype=idx) for _ in range(3))
    b = 0
    for a in range(0, len(codes), SLOT_CHUNK):   # decoded in slices: small temporaries
        c = codes[a:a + SLOT_CHUNK][keep[a:a + SLOT_CHUNK]]
        sl = slice(b, b + len(c))
        x[sl], rest = np.divmod(c, T * T)
        y[sl], z[sl] = np.divmod(rest, T)
        b += len(c)
    del codes, keep
    return _constraints_of(tokens, N, x, y, z, overlaps)


def sorted_unique(a):
    """``np.unique`` of a 1-d integer array, by sorting (no hash table)."""
    a = np.sort(a)
    if len(a):
        a = a[np.append(True, a[1:] != a[:-1])]
    return a


class _Membership:
    """``codes in sorted_unique`` for codes below ``T^2``: a boolean table of every code
    when it is small, binary search otherwise."""

    MAX_TABLE = 1 << 28

    def __init__(self, sorted_unique, T):
        self.values = sorted_unique
        self.table = None
        if float(T) * float(T) <= self.MAX_TABLE:
            self.table = np.zeros(int(T) * int(T), dtype=bool)
            self.table[sorted_unique] = True

    def __call__(self, codes):
        if self.table is not None:
            return self.table[codes]
        return isin(codes, self.values)


def isin(values, sorted_unique):
    """Whether each of ``values`` occurs in the sorted, duplicate-free ``sorted_unique``."""
    if not len(sorted_unique):
        return np.zeros(len(values), dtype=bool)
    pos = np.searchsorted(sorted_unique, values)
    pos[pos == len(sorted_unique)] = 0
    return sorted_unique[pos] == values


def constraints(X, query="all", positional=False):
    """R4 triples of a validated binary family (vectorised).

    Parameters
    ----------
    X : ndarray of shape (n_samples, seq_len, n_bits), 0/1 values, or CompactFamily
    query : {"all", "last"}
        ``"last"``: only the triples whose query is the final token of S1, S2 and S3
        (final-query Min-IP; for a CompactFamily the token of the last real slot).
    positional : bool
        Only the triples whose S3 occurs in every order of its keys (``query="last"``,
        ``X`` an array): the constraints that hold for position-dependent maps
        (:func:`every_order_triples`).

    Returns
    -------
    Constraints
    """
    if positional:
        return _keep_triples(constraints(X, query), every_order_triples(X))
    if is_compact(X):
        def chunks():
            for a in range(0, len(X.token_ids), SLOT_CHUNK):
                ids, cnt = X.token_ids[a:a + SLOT_CHUNK], X.counts[a:a + SLOT_CHUNK]
                u, c = _three_slots(ids, cnt)
                yield (u, c) if query == "all" else (u, c, _last_of_slots(ids))

        return _slot_constraints(X.tokens, X.seq_len, chunks)
    n, N, m = X.shape
    tokens, ids = token_ids(X)
    if N < 3:
        return _empty(tokens, N)
    last = None if query == "all" else ids[:, -1].astype(np.int64)
    # each sequence's distinct tokens and their multiplicities (run lengths of the
    # sorted ids); sequences of more than three distinct tokens constrain nothing
    srt = np.sort(ids, axis=1)
    del ids
    start = np.ones(srt.shape, dtype=bool)
    start[:, 1:] = srt[:, 1:] != srt[:, :-1]
    keep = start.sum(axis=1) <= 3
    srt, start = srt[keep], start[keep]
    if last is not None:
        last = last[keep]
    slot = np.cumsum(start, axis=1, dtype=np.int8) - 1
    rows = np.broadcast_to(np.arange(len(srt))[:, None], slot.shape)
    u = np.full((len(srt), 3), -1, dtype=np.int64)
    c = np.zeros((len(srt), 3), dtype=np.int64)
    u[rows, slot] = srt
    np.add.at(c, (rows, slot), 1)
    return _slot_constraints(tokens, N, lambda: iter([(u, c) if last is None else (u, c, last)]))


def every_order_triples(X):
    """Codes ``(x T + y) T + z`` (sorted) of the final-query S3 triples whose keys occur
    in every order: for each arrangement of ``{y, z^(N-2)}`` over the first ``N - 1``
    positions (``y`` at any of them) ``X`` holds that sequence with ``x`` last.

    Rows whose first ``N - 1`` tokens hold exactly two distinct tokens, one of them
    once, record ``(x, y, z, position of y)`` (at ``N = 3`` both tokens are once: both
    readings); a triple is complete when all ``N - 1`` positions are recorded.
    ``T`` is the number of distinct tokens (``np.unique`` order, as :func:`constraints`).
    """
    n, N, m = X.shape
    tokens, ids = token_ids(X)
    T = np.int64(len(tokens))
    if N < 3:
        return np.zeros(0, dtype=np.int64)
    x = ids[:, -1].astype(np.int64)
    keys = ids[:, :-1].astype(np.int64)
    first = keys[:, 0]
    other = np.where(keys != first[:, None], keys, -1).max(axis=1)     # -1: one token
    two = (other >= 0) & ((keys == first[:, None]) | (keys == other[:, None])).all(axis=1)
    records = []
    for single, rest in ((first, other), (other, first)):
        at = keys == single[:, None]
        once = two & (at.sum(axis=1) == 1)
        records.append(np.stack([x, single, rest, np.argmax(at, axis=1)], axis=1)[once])
    records = np.unique(np.concatenate(records), axis=0)       # sorted (x, y, z, position)
    start = np.ones(len(records), dtype=bool)
    start[1:] = (records[1:, :3] != records[:-1, :3]).any(axis=1)
    runs = np.diff(np.append(np.flatnonzero(start), len(records)))
    return _triple_codes(T, *records[start][runs == N - 1, :3].T)


def _triple_codes(T, x, y, z):
    """``(x T + y) T + z`` as int64, or as Python integers (object) past int64."""
    x, y, z = (np.asarray(a, dtype=np.int64) for a in (x, y, z))
    if float(T) ** 3 < 2.0 ** 62:
        return (x * T + y) * T + z
    return np.array([(a * int(T) + b) * int(T) + c
                     for a, b, c in zip(x.tolist(), y.tolist(), z.tolist())], dtype=object)


def _keep_triples(cons, codes):
    """``cons`` restricted to the triples whose code (:func:`_triple_codes`) is in the
    sorted ``codes``."""
    code = _triple_codes(len(cons.tokens), cons.x, cons.y, cons.z)
    if code.dtype != object:
        keep = isin(code, codes)
    else:
        wanted = set(codes.tolist())
        keep = np.array([c in wanted for c in code.tolist()], dtype=bool)
    K = None if cons._K is None else cons._K[keep]
    return Constraints(cons.tokens, cons.seq_len, cons.x[keep], cons.y[keep], cons.z[keep],
                       K, cons.gap[keep])


def _last_of_slots(ids):
    """Id of the final token of compact rows (their last real slot), for the rows
    :func:`_three_slots` keeps."""
    real = ids >= 0
    last = ids[np.arange(len(ids)), real.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1)]
    return last[real.sum(axis=1) <= 3].astype(np.int64)


def _three_slots(ids, counts):
    """Rows of at most three distinct tokens as (n, 3) int64 ids (-1 padding) and counts."""
    real = ids >= 0
    keep = real.sum(axis=1) <= 3
    ids, counts, real = ids[keep], counts[keep], real[keep]
    if ids.shape[1] > 3 or (~real[:, :-1] & real[:, 1:]).any():
        order = np.argsort(~real, axis=1, kind="stable")[:, :3]   # real slots first
        ids = np.take_along_axis(ids, order, axis=1)
        counts = np.take_along_axis(counts, order, axis=1)
    u = np.full((len(ids), 3), -1, dtype=np.int64)
    c = np.zeros((len(ids), 3), dtype=np.int64)
    u[:, :ids.shape[1]] = ids[:, :3]
    c[:, :ids.shape[1]] = counts[:, :3]
    return u, c


#: sequences matched against the R4 multisets at a time
SLOT_CHUNK = 1 << 22


def _role_codes(N, roles):
    """Signature ``c0 + c1 B + c2 B^2`` (``B = N + 1``) of each slot-role assignment."""
    base = N + 1
    out = []
    for assignment in roles:
        req = [0, 0, 0]
        for slot, count in assignment:
            req[slot] += count
        out.append(req[0] + req[1] * base + req[2] * base * base)
    return out


def _slot_constraints(tokens, N, chunks):
    """R4 triples from sequences given as three (id, count) slots each.

    ``chunks()`` yields ``(u, c)``: (n, 3) int64 ids (-1 padding) and counts, slice by
    slice, or ``(u, c, last)`` with the id of each sequence's final token: then only
    the roles whose query is that token count (final-query Min-IP). Two passes: the S1
    multisets ``{x, y^(N-1)}`` first, then the triples ``{x, y, z^(N-2)}`` whose two S1
    are present, kept as one int64 code each when the tokens allow (memory: one code
    per triple). ``y`` or ``z`` may equal ``x``.
    """
    if N < 3:
        return _empty(tokens, N)
    T = np.int64(len(tokens))
    base = N + 1
    s1_roles = [(p, q) for p in range(3) for q in range(3)]
    s1_codes = _role_codes(N, [((p, 1), (q, N - 1)) for p, q in s1_roles])
    s3_roles = [(p, q, r) for p in range(3) for q in range(3) for r in range(3) if r != q]
    s3_codes = _role_codes(N, [((p, 1), (q, 1), (r, N - 2)) for p, q, r in s3_roles])
    s1 = [np.zeros(0, dtype=np.int64)]
    for u, c, *last in chunks():
        sig = c[:, 0] + c[:, 1] * base + c[:, 2] * (base * base)
        for (p, q), code in zip(s1_roles, s1_codes):
            ok = np.flatnonzero(sig == code)
            if last:
                ok = ok[u[ok, p] == last[0][ok]]
            if len(ok):
                s1.append(sorted_unique(u[ok, p] * T + u[ok, q]))
    s1 = _Membership(sorted_unique(np.concatenate(s1)), T)
    by_code = float(T) ** 3 < 2.0 ** 62
    overlaps = _Overlaps(tokens)
    parts = []
    for u, c, *last in chunks():
        sig = c[:, 0] + c[:, 1] * base + c[:, 2] * (base * base)
        for (p, q, r), code in zip(s3_roles, s3_codes):
            ok = np.flatnonzero(sig == code)
            if last:
                ok = ok[u[ok, p] == last[0][ok]]
            if not len(ok):
                continue
            x, y, z = u[ok, p], u[ok, q], u[ok, r]
            has = s1(x * T + y) & s1(x * T + z)
            x, y, z = x[has], y[has], z[has]
            far = overlaps(x, z) - overlaps(x, y) >= 2
            x, y, z = x[far], y[far], z[far]
            parts.append((x * T + y) * T + z if by_code else np.stack([x, y, z], axis=1))
    del s1
    if by_code:
        return _from_codes(tokens, N, parts, overlaps)
    return _finish(tokens, N, np.concatenate(parts) if parts else np.zeros((0, 3), np.int64))


def constraints_reference(X, query="all", positional=False):
    """R4 triples of a validated binary family (plain Python over multisets).

    ``X`` is an array of sequences or a CompactFamily; ``query="last"`` keeps the
    triples whose query is the final token of its three sequences; ``positional``
    (an array ``X``, ``query="last"``) those whose S3 ``(..., y, ..., x)`` is in ``X``
    with ``y`` at each of the first ``N - 1`` positions and ``z`` at the others.

    Written from the definition of :ref:`theory-r4` alone, sharing no helper with
    :func:`constraints`: a triple ``(x, y, z)``, ``y != z``, is kept when the family
    holds the multisets ``S1 = {x, y^(N-1)}``, ``S2 = {x, z^(N-1)}`` and
    ``S3 = {x, y, z^(N-2)}`` (with ``x`` final in each for ``query="last"``) and the gap
    ``<x, z> - <x, y>`` is at least 2; its denominator is ``K = (N-2)(gap-1)``. The
    arrays are int64, sorted by ``(x, y, z)``, each triple once.
    """
    from ..compact import CompactFamily

    # each sequence: (its multiset as sorted (token, count) pairs, its final token or
    # None when any token may query)
    if isinstance(X, CompactFamily):
        tokens, N = X.tokens, X.seq_len
        rows = None
        sequences = []
        for ids, cnt in zip(X.token_ids.tolist(), X.counts.tolist()):
            ms = Counter()
            for i, c in zip(ids, cnt):
                if i >= 0:
                    ms[i] += c
            sequences.append((ms, [i for i in ids if i >= 0][-1]))
    else:
        n, N, m = X.shape
        tokens, inv = np.unique(X.reshape(-1, m).astype(np.uint8), axis=0,
                                return_inverse=True)
        rows = [tuple(r) for r in np.asarray(inv).reshape(n, N).tolist()]
        sequences = [(Counter(r), r[-1]) for r in rows]
    last_only = query == "last"
    present = {(tuple(sorted(ms.items())), final if last_only else None)
               for ms, final in sequences}

    def holds(x, counts):
        """Whether the family holds the multiset ``counts`` (with ``x`` final)."""
        ms = Counter()
        for t, c in counts:
            ms[t] += c
        return (tuple(sorted(ms.items())), x if last_only else None) in present

    words = tokens.astype(np.int64)
    gram = words @ words.T                  # gram[a, b] = <tokens[a], tokens[b]>

    def dot(a, b):
        return int(gram[a, b])

    row_set = set(rows) if positional else None
    found = set()
    if N >= 3:
        for items, final in present:
            ms = [t for t, _ in items]
            for x in ms:
                if last_only and x != final:
                    continue
                for y in ms:
                    for z in ms:
                        if (y == z or (x, y, z) in found
                                or not holds(x, [(x, 1), (y, 1), (z, N - 2)])
                                or not holds(x, [(x, 1), (y, N - 1)])
                                or not holds(x, [(x, 1), (z, N - 1)])
                                or dot(x, z) - dot(x, y) < 2):
                            continue
                        if positional and not all(
                                (z,) * p + (y,) + (z,) * (N - 2 - p) + (x,) in row_set
                                for p in range(N - 1)):
                            continue
                        found.add((x, y, z))
    triples = sorted(found)
    x, y, z = (np.array([t[k] for t in triples], dtype=np.int64) for k in range(3))
    gap = np.array([dot(a, c) - dot(a, b) for a, b, c in triples], dtype=np.int64)
    K = np.array([(N - 2) * (g - 1) for g in gap.tolist()], dtype=np.int64)
    return Constraints(tokens, N, x, y, z, K, gap)


def _int64_safe(cons):
    """Whether every chained product fits in int64.

    A chain climbs the overlap with its query, so the gaps of its steps sum to at most
    the query's weight ``w``; each step contributes ``(N-2)(g-1) <= (N-2) 2^(g/2)`` and
    there are at most ``w/2`` steps.
    """
    if not len(cons):
        return True
    w = int(cons.tokens[sorted_unique(cons.x)].sum(axis=1).max())
    N = cons.seq_len
    return (w / 2) * (1 + np.log2(max(N - 2, 1))) < 62


#: constraints whose chains are computed at a time (whole queries: a query's chains
#: depend on its own constraints only)
REACH_BLOCK = 1 << 22


def reach(cons, *, drop_single=False):
    """Best chains of every (query, source) in the constraint DAGs (vectorised).

    The queries are taken in blocks of about :data:`REACH_BLOCK` constraints, so that
    the temporaries of the dynamic programme stay those of one block; the blocks'
    rows are copied into the result column by column, each block freed as it goes.

    ``drop_single``: leave out the rows of a source that reaches a single key when
    another source of the same query reaches more (the search takes such a source
    only into a set of at most two); ``Reach.singles`` keeps their ``(x, s, t)`` for
    :func:`with_singles`, and ``Reach.dropped`` counts them.
    """
    if not _int64_safe(cons):
        return reach_reference(cons)
    E = len(cons)
    blocks, a = [], 0
    while a < E:
        b = min(E, a + REACH_BLOCK)
        if b < E:
            b = int(np.searchsorted(cons.x, cons.x[b], side="left"))
            if b <= a:                      # one query with more constraints than a block
                b = int(np.searchsorted(cons.x, cons.x[a], side="right"))
        blocks.append((a, b))
        a = b
    parts, singles = [], []
    for a, b in blocks or [(0, 0)]:
        cols = _reach_block(cons, a, b)
        if drop_single:
            cols, left_out = _drop_single(cols, np.int64(len(cons.tokens)))
            singles.append(left_out)
        parts.append(cols)
    if len({p[3].dtype for p in parts}) > 1:          # products as int64 in every block
        for p in parts:
            p[3] = p[3].astype(np.int64)
    cols = []
    for c in range(5):                      # one column at a time, freeing the parts
        col = [p[c] for p in parts]
        for p in parts:
            p[c] = None
        cols.append(col[0] if len(col) == 1 else fill_from(col))
    if singles:
        singles = tuple(fill_from(list(col)) for col in zip(*singles))
    return Reach(*cols, singles=singles or None)


def with_singles(R, cons):
    """``R`` with the rows :func:`reach` left out with ``drop_single`` put back: the
    rows ``reach(cons)`` gives. ``cons`` may be released (its overlaps are read)."""
    if not R.dropped:
        return R
    x, s, t = R.singles
    K = step_denominators(cons.seq_len, cons.overlap(x, t) - cons.overlap(x, s))
    cols = [np.concatenate(pair) for pair in
            zip((R.x, R.s, R.t, R.K, R.pred), (x, s, t, K, s))]
    T = np.int64(len(cons.tokens))
    if float(T) ** 3 < 2.0 ** 62:           # rows are unique per (x, s, t)
        order = np.argsort((cols[0].astype(np.int64) * T + cols[1]) * T + cols[2])
    else:
        order = np.lexsort((cols[2], cols[1], cols[0]))
    return Reach(*(c[order] for c in cols))


def _drop_single(cols, T):
    """The rows of ``cols`` (one block, sorted) without the sources reaching one key
    whose query has a source reaching more; and the columns ``(x, s, t)`` of the rows
    left out."""
    x, s = cols[0], cols[1]
    code = x.astype(np.int64) * T + s
    new = np.ones(len(code), dtype=bool)
    new[1:] = code[1:] != code[:-1]
    first = np.flatnonzero(new)
    count = np.diff(np.append(first, len(code)))
    qx = x[first]
    qnew = np.ones(len(qx), dtype=bool)
    qnew[1:] = qx[1:] != qx[:-1]
    qid = np.cumsum(qnew) - 1
    best = np.maximum.reduceat(count, np.flatnonzero(qnew)) if len(qx) else count
    drop = (count == 1) & (best[qid] >= 2)
    if not drop.any():
        return cols, tuple(c[:0] for c in cols[:3])
    keep = ~np.repeat(drop, count)
    return [c[keep] for c in cols], tuple(c[~keep] for c in cols[:3])


def _reach_block(cons, a, b):
    """Columns (x, s, t, K, pred) of the chains of the constraints ``a:b`` (whole
    queries), sorted by (x, s, t)."""
    T = np.int64(len(cons.tokens))
    idx = token_index_dtype(T)
    ex, ey, ez, eg = (v[a:b] for v in (cons.x, cons.y, cons.z, cons.gap))
    eK = step_denominators(cons.seq_len, eg) if cons._K is None else cons._K[a:b]
    ex, ey, eg = ex.astype(np.int64), ey.astype(np.int64), eg.astype(np.int64)
    ecode = ex * T + ey                     # sorted (edges are sorted by x, y, z)
    src_code = sorted_unique(ecode)
    sx, ss = src_code // T, src_code % T
    del src_code
    levels = {}

    def push(x, s, t, K, pred, level):
        # token indices are held in the smallest dtype that fits: the pending rows of
        # all levels are the largest arrays of the programme
        if not len(level):
            return
        x, s, t, pred = (a.astype(idx, copy=False) for a in (x, s, t, pred))
        for L in np.flatnonzero(np.bincount(level - level.min())) + level.min():
            sel = level == L
            levels.setdefault(int(L), []).append((x[sel], s[sel], t[sel], K[sel], pred[sel]))

    push(sx, ss, ss, np.ones(len(sx), dtype=np.int64), np.full(len(sx), -1, dtype=np.int64),
         cons.overlap(sx, ss))
    out = []
    while levels:
        L = min(levels)
        x, s, t, K, pred = (np.concatenate(a) for a in zip(*levels.pop(L)))
        ov_pred = np.where(pred >= 0, cons.overlap(x, np.maximum(pred, 0)), -1)
        group = (x * T + s) * T + t
        order = np.lexsort((pred, ov_pred, -K, group))
        group = group[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = group[1:] != group[:-1]
        sel = order[first]
        del order, group, first, ov_pred
        x, s, t, K, pred = x[sel], s[sel], t[sel], K[sel], pred[sel]
        keep = pred >= 0                    # the roots (s itself) are not rows
        out.append([a[keep] for a in (x, s, t, K, pred)])
        lo = np.searchsorted(ecode, x * T + t, side="left")
        hi = np.searchsorted(ecode, x * T + t, side="right")
        cnt = hi - lo
        if not cnt.sum():
            continue
        rep = np.repeat(np.arange(len(x)), cnt)
        offs = np.cumsum(cnt) - cnt
        e = lo[rep] + (np.arange(len(rep)) - offs[rep])
        push(x[rep], s[rep], ez[e], K[rep] * eK[e], t[rep], L + eg[e])
    cols = []
    for c in range(5):                      # one column at a time, freeing the parts
        parts = [o[c] for o in out]
        for o in out:
            o[c] = None
        cols.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
        del parts
    del out
    x, s, t = cols[0], cols[1], cols[2]
    if float(T) ** 3 < 2.0 ** 62:           # rows are unique per (x, s, t)
        order = np.argsort((x * T + s) * T + t)
    else:
        order = np.lexsort((t, s, x))
    del x, s, t
    for c in range(5):
        cols[c] = cols[c][order]
    if cols[3].dtype == np.int64 and (not len(cols[3]) or cols[3].max() < 2**31):
        cols[3] = cols[3].astype(np.int32)  # every block the same dtype: see reach
    return cols


def reach_reference(cons):
    """Best chains of every (query, source) in the constraint DAGs (plain Python)."""
    T = cons.tokens.astype(np.int64)

    def ov(a, b):
        return int(T[a] @ T[b])

    by_x = {}
    for x, y, z, K in zip(cons.x.tolist(), cons.y.tolist(), cons.z.tolist(), cons.K.tolist()):
        by_x.setdefault(x, {}).setdefault(y, []).append((z, K))
    rows = []
    for x, out in by_x.items():
        nodes = sorted({y for y in out} | {z for e in out.values() for z, _ in e},
                       key=lambda t: (ov(x, t), t))
        for src in out:
            best, pred = {src: 1}, {}
            for node in nodes:
                if node not in best:
                    continue
                for z, K in out.get(node, ()):
                    cand = best[node] * K
                    if cand > best.get(z, 0):
                        best[z], pred[z] = cand, node
            rows += [(x, src, t, best[t], pred[t]) for t in pred]
    rows.sort(key=lambda r: r[:3])
    cols = list(zip(*rows)) if rows else [()] * 5
    K = np.array(cols[3], dtype=object)
    if all(int(k).bit_length() < 63 for k in cols[3]):
        K = K.astype(np.int64)
    return Reach(*(np.array(c, dtype=np.int64) for c in cols[:3]), K,
                 np.array(cols[4], dtype=np.int64))
