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

__all__ = ["Constraints", "Reach", "constraints", "constraints_reference", "isin", "reach",
           "reach_reference"]


class Constraints:
    """Tokens of a family and its R4 triples (arrays sorted by ``(x, y, z)``)."""

    def __init__(self, tokens, seq_len, x, y, z, K, gap):
        self.tokens = tokens
        self.seq_len = seq_len
        self.x, self.y, self.z, self.K, self.gap = x, y, z, K, gap
        self.words = pack_tokens(tokens)

    def __len__(self):
        return len(self.x)

    def overlap(self, a, b):
        """``<tokens[a], tokens[b]>`` for index arrays ``a``, ``b``."""
        return overlap_words(self.words, a, b)


class Reach:
    """Best chains: rows ``(x, s, t)`` sorted, with denominator ``K`` and predecessor."""

    def __init__(self, x, s, t, K, pred):
        self.x, self.s, self.t, self.K, self.pred = x, s, t, K, pred

    def __len__(self):
        return len(self.x)


def pack_tokens(tokens):
    """Binary tokens ``(T, m)`` as big-endian 64-bit words ``(T, ceil(m / 64))``."""
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
    """Popcount of ``words[a] & words[b]`` summed over words (int64)."""
    return np.bitwise_count(words[a] & words[b]).sum(axis=-1, dtype=np.int64)


def _unique_rows(words):
    """``np.unique(axis=0)`` of packed word rows: (unique rows, inverse)."""
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


def _unpack(words, m):
    bits = np.unpackbits(words.astype(">u8").view(np.uint8).reshape(len(words), -1), axis=1)
    return np.ascontiguousarray(bits[:, :m])


def token_ids(X):
    """Distinct tokens (``np.unique(axis=0)`` order) and the id of every position."""
    n, N, m = X.shape
    flat = X.reshape(-1, m)
    words = np.empty((len(flat), max(1, -(-m // 64))), dtype=np.uint64)
    step = 1 << 20                          # packed in slices: no full-size temporaries
    for a in range(0, len(flat), step):
        words[a:a + step] = pack_tokens(flat[a:a + step])
    uniq, inv = _unique_rows(words)
    del words
    return _unpack(uniq, m), inv.reshape(n, N)


def _empty(tokens, N):
    e = np.zeros(0, dtype=np.int64)
    return Constraints(tokens, N, e, e, e, e, e)


def _finish(tokens, N, triples, s1=None):
    """Keep triples ``(x, y, z)`` with S1(x, y), S1(x, z) present and gap >= 2.

    ``s1=None``: the triples are already restricted to present S1 multisets.
    """
    if not len(triples):
        return _empty(tokens, N)
    T = len(tokens)
    x, y, z = triples.T
    if s1 is not None:
        s1 = np.unique(s1)
        has = (isin(x * T + y, s1)) & (isin(x * T + z, s1))
        x, y, z = x[has], y[has], z[has]
    words = pack_tokens(tokens)
    gap = overlap_words(words, x, z) - overlap_words(words, x, y)
    ok = gap >= 2
    x, y, z, gap = x[ok], y[ok], z[ok], gap[ok]
    if float(T) ** 3 < 2.0 ** 62:           # triples are unique: one key sorts them
        order = np.argsort((x * T + y) * T + z)
    else:
        order = np.lexsort((z, y, x))
    x, y, z, gap = x[order], y[order], z[order], gap[order]
    return Constraints(tokens, N, x, y, z, (N - 2) * (gap - 1), gap)


def isin(values, sorted_unique):
    """Whether each of ``values`` occurs in the sorted, duplicate-free ``sorted_unique``."""
    if not len(sorted_unique):
        return np.zeros(len(values), dtype=bool)
    pos = np.searchsorted(sorted_unique, values)
    pos[pos == len(sorted_unique)] = 0
    return sorted_unique[pos] == values


def constraints(X):
    """R4 triples of a validated binary family ``X`` (vectorised).

    Parameters
    ----------
    X : ndarray of shape (n_samples, seq_len, n_bits), 0/1 values

    Returns
    -------
    Constraints
    """
    n, N, m = X.shape
    tokens, ids = token_ids(X)
    if N < 3:
        return _empty(tokens, N)
    T = np.int64(len(tokens))
    srt = np.sort(ids, axis=1)
    del ids
    start = np.ones(srt.shape, dtype=bool)
    start[:, 1:] = srt[:, 1:] != srt[:, :-1]
    n_distinct = start.sum(axis=1)
    keep = n_distinct <= 3
    srt, start = srt[keep], start[keep]
    # one row per multiset
    if float(T) ** N < 2.0 ** 62:
        code = np.zeros(len(srt), dtype=np.int64)
        for k in range(N):
            code = code * T + srt[:, k]
        _, first = np.unique(code, return_index=True)
    else:
        _, first = np.unique(srt, axis=0, return_index=True)
    srt, start = srt[first], start[first]
    slot = np.cumsum(start, axis=1, dtype=np.int8) - 1
    del start
    rows = np.arange(len(srt))[:, None]
    u = np.full((len(srt), 3), -1, dtype=np.int64)
    u[np.broadcast_to(rows, slot.shape), slot] = srt
    del srt, rows
    base = N + 1
    sig = sum((slot == k).sum(axis=1) * base ** k for k in range(3))
    del slot
    by_sig = {}

    def match(req):
        # rows whose (count of slot 0, 1, 2) equals req; a slot counted 0 is empty
        code = int(sum(int(r) * base ** k for k, r in enumerate(req)))
        if code not in by_sig:
            by_sig[code] = np.flatnonzero(sig == code)
        return by_sig[code]

    s1 = []
    for p in range(3):
        for q in range(3):
            req = np.zeros(3, dtype=np.int64)
            req[p] += 1
            req[q] += N - 1
            ok = match(req)
            s1.append(u[ok, p] * T + u[ok, q])
    s1 = np.sort(np.concatenate(s1))
    s1 = s1[np.append(True, s1[1:] != s1[:-1])] if len(s1) else s1
    triples = []
    for p in range(3):
        for q in range(3):
            for r in range(3):
                if r == q:
                    continue
                req = np.zeros(3, dtype=np.int64)
                req[p] += 1
                req[q] += 1
                req[r] += N - 2
                ok = match(req)
                x, y, z = u[ok, p], u[ok, q], u[ok, r]
                # only triples whose S1(x, y) and S1(x, z) are present are kept
                has = isin(x * T + y, s1) & isin(x * T + z, s1)
                triples.append(np.stack([x[has], y[has], z[has]], axis=1))
    del u
    by_sig.clear()
    return _finish(tokens, N, np.concatenate(triples))


def constraints_reference(X):
    """R4 triples of a validated binary family ``X`` (plain Python over multisets)."""
    n, N, m = X.shape
    tokens, inv = np.unique(X.reshape(-1, m).astype(np.uint8), axis=0, return_inverse=True)
    if N < 3:
        return _empty(tokens, N)
    ids = np.asarray(inv).reshape(n, N)
    T = len(tokens)
    s1, triples = [], []
    for ms in {tuple(sorted(row)) for row in ids.tolist()}:
        c = Counter(ms)
        if len(c) > 3:
            continue
        for x in c:
            for y in c:
                need = Counter({x: 1})
                need[y] += N - 1
                if need == c:
                    s1.append(x * T + y)
                for z in c:
                    if z == y:
                        continue
                    need = Counter({x: 1})
                    need[y] += 1
                    need[z] += N - 2
                    if need == c:
                        triples.append((x, y, z))
    triples = np.array(triples, dtype=np.int64).reshape(-1, 3)
    return _finish(tokens, N, triples, np.array(s1, dtype=np.int64))


def _int64_safe(cons):
    """Whether every chained product fits in int64.

    A chain climbs the overlap with its query, so the gaps of its steps sum to at most
    the query's weight ``w``; each step contributes ``(N-2)(g-1) <= (N-2) 2^(g/2)`` and
    there are at most ``w/2`` steps.
    """
    if not len(cons):
        return True
    w = int(cons.tokens[np.unique(cons.x)].sum(axis=1).max())
    N = cons.seq_len
    return (w / 2) * (1 + np.log2(max(N - 2, 1))) < 62


def reach(cons):
    """Best chains of every (query, source) in the constraint DAGs (vectorised)."""
    if not _int64_safe(cons):
        return reach_reference(cons)
    T = np.int64(len(cons.tokens))
    idx = index_dtype(T)
    ex, ey, ez, eK, eg = cons.x, cons.y, cons.z, cons.K, cons.gap
    ecode = ex * T + ey                     # sorted (edges are sorted by x, y, z)
    src_code = np.unique(ecode)
    sx, ss = src_code // T, src_code % T
    levels = {}

    def push(x, s, t, K, pred, level):
        # token indices are held in the smallest dtype that fits: the pending rows of
        # all levels are the largest arrays of the programme
        x, s, t, pred = (a.astype(idx, copy=False) for a in (x, s, t, pred))
        for L in np.unique(level):
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
    return Reach(*cols)


def index_dtype(n):
    """int32 when indices below ``n`` fit in it, else int64."""
    return np.int32 if int(n) < 2**31 else np.int64


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
