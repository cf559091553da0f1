"""Independent check of a rank certificate against a family (numpy and fractions only).

:func:`verify_certificate` re-derives a :class:`~minip_learn.theory.Certificate` from
the family and the mathematics alone. It shares no code with
:func:`~minip_learn.theory.certify`: it reads the tokens, the chosen (query, key)
pairs, the chain trees, the claimed ratio bounds and the claimed rank, and checks

1. every other designated key ``k_j`` is in the tree of ``x_i`` and the product of the
   step denominators along its chain is at least the claimed ``K_ij``; the claimed
   overlap distance ``<x_i, k_j> - <x_i, k_i>`` is the true one;
2. every step ``a -> b`` of those chains climbs the overlap with ``x = x_i`` by
   ``g = <x,b> - <x,a> >= 2``, and the family holds the three multisets
   ``{x, a^(N-1)}``, ``{x, b^(N-1)}`` and ``{x, a, b^(N-2)}`` (see :ref:`theory-r4`),
   so ``alpha(x, b) < alpha(x, a) / ((N-2)(g-1))``;
3. the claimed rank is at most what :ref:`theory-r5` gives from the claimed ``K_ij``:
   ``floor(n^2 / (n + sum 1/K_ij^2)) + 1``, or ``n`` when every row (or every column)
   of ``1/K`` sums to at most 1, computed with :class:`fractions.Fraction`.

With ``query="last"`` (final-query Min-IP, the certificate's own mode by default) the
three multisets of every step must each occur as a sequence whose final token is ``x``.
A ``positional`` certificate (position-dependent maps) also needs S3 in every order of
its keys: ``(b, ..., b, a, b, ..., b, x)`` with ``a`` at each of the first ``N - 1``
positions, each read as an exact sequence of ``X`` (an array).

Only the steps on the chains between designated keys are checked (the rest of a tree
bears on no bound), and the family is read once, in slices, against the multisets those
steps need: memory is that of the certificate plus one slice.
"""

import math
from fractions import Fraction

import numpy as np

from ..compact import is_compact

__all__ = ["verify_certificate"]


class _Failure(Exception):
    pass


def _fail(message):
    raise _Failure(message)


#: sequences read from the family at a time (the check streams over the family)
CHUNK = 1 << 17


def _is_binary(X):
    """Whether every entry is 0 or 1, read in slices of :data:`CHUNK` sequences."""
    for a in range(0, len(X), CHUNK):
        part = X[a:a + CHUNK]
        if part.dtype != bool and ((part != 0) & (part != 1)).any():
            return False
    return True


def _multiset_codes(ids, counts, T, N, last=None):
    """One integer per multiset given as (id, count) slots: ``(codes, ok)``.

    Equal ids in a row are merged; ``ok`` is False for rows of more than three distinct
    tokens (no wanted multiset has more). The code lists the three ids in increasing
    order (``T`` for none) and the first two counts (the third is ``N`` minus them),
    then, when ``last`` (one id per row) is given, the id of the final token; Python
    integers when it would not fit in int64.
    """
    ids = np.where(counts > 0, ids, T).astype(np.int64)
    counts = np.where(ids < T, counts, 0).astype(np.int64)
    k = ids.shape[1]
    for _ in range(2):                       # sort, merge neighbours, sort again
        order = np.argsort(ids, axis=1, kind="stable")
        ids = np.take_along_axis(ids, order, axis=1)
        counts = np.take_along_axis(counts, order, axis=1)
        for j in range(1, k):
            same = (ids[:, j] == ids[:, j - 1]) & (ids[:, j] < T)
            counts[same, j] += counts[same, j - 1]
            counts[same, j - 1] = 0
            ids[same, j - 1] = T
    ok = (ids < T).sum(axis=1) <= 3
    if k < 3:
        ids = np.concatenate([ids, np.full((len(ids), 3 - k), T)], axis=1)
        counts = np.concatenate([counts, np.zeros((len(ids), 3 - k), dtype=np.int64)], axis=1)
    ids, counts = ids[:, :3], counts[:, :3]
    fin = None if last is None else np.asarray(last, dtype=np.int64)
    if float(T + 1) ** (3 if fin is None else 4) * float(N + 1) ** 2 < 2.0 ** 62:
        codes = ((ids[:, 0] * (T + 1) + ids[:, 1]) * (T + 1) + ids[:, 2]) * (N + 1)
        codes = (codes + counts[:, 0]) * (N + 1) + counts[:, 1]
        return (codes if fin is None else codes * (T + 1) + fin), ok
    codes = [(((a * (T + 1) + b) * (T + 1) + c) * (N + 1) + d) * (N + 1) + e
             for a, b, c, d, e in zip(*(col.tolist() for col in (*ids.T, *counts[:, :2].T)))]
    if fin is not None:
        codes = [code * (T + 1) + f for code, f in zip(codes, fin.tolist())]
    return codes, ok


def _family_slots(X, lookup, m):
    """Yield (ids, counts, final) of the family's sequences over the certificate's
    tokens, in slices (``final``: the id of each sequence's final token); a sequence
    holding a token the certificate does not know is left out."""
    if is_compact(X):                               # read its arrays, slice by slice
        packed = np.packbits(np.asarray(X.tokens, dtype=np.uint8), axis=1)
        remap = np.array([lookup.get(bytes(t), -1) for t in packed] + [-1], dtype=np.int64)
        for a in range(0, len(X.token_ids), CHUNK):
            ids = np.asarray(X.token_ids[a:a + CHUNK], dtype=np.int64)
            counts = np.asarray(X.counts[a:a + CHUNK], dtype=np.int64)
            mapped = remap[ids]                     # padding (-1) reads the last entry
            known = ((mapped >= 0) | (counts == 0)).all(axis=1)
            # materialised, slot after slot: the final token is the last slot counted
            k = counts.shape[1]
            final_slot = k - 1 - np.argmax(counts[:, ::-1] > 0, axis=1)
            final = mapped[np.arange(len(ids)), final_slot]
            yield np.where(counts > 0, mapped, 0)[known], counts[known], final[known]
        return
    n, N, _ = X.shape
    for a in range(0, n, CHUNK):
        part = np.packbits(X[a:a + CHUNK].reshape(-1, m).astype(np.uint8, copy=False), axis=1)
        part = np.ascontiguousarray(part).view(f"V{part.shape[1]}").reshape(-1)
        uniq, inv = np.unique(part, return_inverse=True)
        ids_of_uniq = np.array([lookup.get(u.tobytes(), -1) for u in uniq], dtype=np.int64)
        ids = ids_of_uniq[inv.reshape(-1)].reshape(-1, N)
        ids = ids[(ids >= 0).all(axis=1)]
        yield ids, np.ones((0, N), dtype=np.int64), ids[:, -1]


def _found_codes(X, tokens, want, final_query=False):
    """Which of the sorted, distinct multiset codes ``want`` (an int64 array, or a list
    of Python integers) the family holds (``final_query``: codes that also name the
    final token, see :func:`_multiset_codes`).

    One pass over the family in slices of :data:`CHUNK` sequences: each slice's tokens
    are looked up in the certificate's token list, its multisets encoded over it and
    matched against the wanted ones; memory stays that of one slice plus the wanted.
    """
    N, m = X.shape[1], X.shape[2]
    T = len(tokens)
    lookup = {bytes(t): i for i, t in enumerate(np.packbits(tokens, axis=1))}
    exact = not isinstance(want, np.ndarray)
    index = {code: i for i, code in enumerate(want)} if exact else None
    found = np.zeros(len(want), dtype=bool)
    for ids, counts, final in (_family_slots(X, lookup, m) if len(want) else ()):
        if not counts.size:                         # materialised: every position once
            counts = np.ones(ids.shape, dtype=np.int64)
        codes, ok = _multiset_codes(ids, counts, T, N, final if final_query else None)
        if exact:
            found[[index[c] for c, good in zip(codes, ok) if good and c in index]] = True
            continue
        codes = codes[ok]
        pos = np.minimum(np.searchsorted(want, codes), len(want) - 1)
        found[pos[want[pos] == codes]] = True
    return found


def verify_certificate(certificate, X, *, query=None, raise_on_failure=True):
    """Check a rank certificate against a family, independently of :func:`certify`.

    Parameters
    ----------
    certificate : Certificate or str
        A :class:`~minip_learn.theory.Certificate` or its JSON text
        (:meth:`~minip_learn.theory.Certificate.to_json`).
    X : array-like of shape (n_samples, seq_len, n_bits) or CompactFamily
        The family, 0/1 values, or the same family in multiset form (read slice by
        slice, never materialised).
    query : {"all", "last"} or None, default=None
        ``"last"``: final-query Min-IP, every sequence a chain step uses must have its
        query as final token (for a CompactFamily: the token of its last real slot,
        the final position of the materialised sequence). ``"all"``: any position.
        None: the certificate's own ``query``; a value that differs from it is a
        ``ValueError``.
    raise_on_failure : bool, default=True
        Raise a :class:`ValueError` naming the first failed check; otherwise return
        False.

    Returns
    -------
    valid : bool
        True when every check passes.

    Raises
    ------
    ValueError
        With ``raise_on_failure=True``, on the first failed check (missing sequence,
        wrong overlap, a ratio bound the chain does not give, an inflated rank), and
        always when the certificate and the family do not fit each other (shapes),
        or ``query`` is not the certificate's.

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.theory import certify, verify_certificate
    >>> suite = make_witness_suite(construction="small")
    >>> rank, cert = certify(suite.X, return_certificate=True)
    >>> verify_certificate(cert, suite.X)
    True
    >>> cert.certified_min_rank = rank + 1
    >>> verify_certificate(cert, suite.X, raise_on_failure=False)
    False
    """
    if isinstance(certificate, str):
        from .certify import Certificate

        certificate = Certificate.from_json(certificate)
    if not is_compact(X):              # a CompactFamily was validated when it was made
        X = np.asarray(X)
        if X.ndim != 3:
            raise ValueError(f"X must have shape (n_samples, seq_len, n_bits); got {X.shape}.")
        if not _is_binary(X):
            raise ValueError("X must hold 0/1 values only.")
    c = certificate
    mode = getattr(c, "query", "all")
    if query is None:
        query = mode
    if not isinstance(query, str) or query not in ("all", "last"):
        raise ValueError(f"query must be one of ['all', 'last'] or None; got {query!r}.")
    if query != mode:
        raise ValueError(f"the certificate is for query={mode!r}; got query={query!r}.")
    if X.shape[1:] != (c.seq_len, c.n_bits):
        raise ValueError(
            f"the certificate is for sequences of length {c.seq_len} over {c.n_bits} bits; "
            f"X has shape {X.shape}."
        )
    positional = bool(getattr(c, "positional", False))
    if positional and (query != "last" or is_compact(X)):
        raise ValueError('a positional certificate is checked on final-query sequences '
                         'held as an array (query="last", X not a CompactFamily).')
    try:
        _check(c, X, query == "last")
        if positional:
            _check_orders(c, X)
    except _Failure as exc:
        if raise_on_failure:
            raise ValueError(f"certificate rejected: {exc}") from None
        return False
    return True


def _distinct(a):
    """The distinct values of a 1-d integer array, sorted (by sorting: no hash table)."""
    a = np.sort(np.asarray(a).ravel())
    return a[np.append(True, a[1:] != a[:-1])] if len(a) else a


def _tree_arrays(tree):
    """A row's chain tree as sorted arrays (child, parent): from a mapping or from the
    arrays a certificate holds."""
    if hasattr(tree, "child") and hasattr(tree, "parent"):
        child = np.asarray(tree.child, dtype=np.int64)
        parent = np.asarray(tree.parent, dtype=np.int64)
    else:
        items = sorted((int(a), int(b)) for a, b in tree.items())
        child = np.array([a for a, _ in items], dtype=np.int64)
        parent = np.array([b for _, b in items], dtype=np.int64)
    order = np.argsort(child, kind="stable")
    return child[order], parent[order]


def _lookup(child, parent, t):
    """Parents of the tokens ``t`` in a tree (-1 where ``t`` is not in it)."""
    pos = np.minimum(np.searchsorted(child, t), max(len(child) - 1, 0))
    found = (child[pos] == t) if len(child) else np.zeros(len(t), dtype=bool)
    return np.where(found, parent[pos] if len(child) else -1, -1)


def _row_chains(i, root, keys, tree, ov, N):
    """Products of the step denominators from ``root`` to every token on the chains to
    ``keys`` in row ``i``: ``(prod, missing, (a, b))``.

    Walks up from the keys to the root, every step ``a -> b`` checked to climb the
    overlap with the query by ``g >= 2`` (so the walk ends); ``prod`` is an array over
    the tokens (int64, or Python integers when the products could leave int64),
    ``missing`` the first token whose chain leaves the tree (then ``prod`` is None),
    and ``(a, b)`` the steps used.
    """
    child, parent = _tree_arrays(tree)
    seen = np.zeros(0, dtype=np.int64)
    frontier = _distinct(keys)
    a_steps, b_steps = [], []
    while True:
        frontier = frontier[(frontier != root) & ~np.isin(frontier, seen)]
        if not len(frontier):
            break
        up = _lookup(child, parent, frontier)
        if (up < 0).any():
            return None, int(frontier[np.argmax(up < 0)]), None
        g = ov[frontier] - ov[up]
        if (g < 2).any():
            j = int(np.argmax(g < 2))
            _fail(f"row {i}: chain step {int(up[j])} -> {int(frontier[j])} has overlap gap "
                  f"{int(g[j])} < 2")
        a_steps.append(up)
        b_steps.append(frontier)
        seen = np.union1d(seen, frontier)
        frontier = _distinct(up)
    a = np.concatenate(a_steps) if a_steps else np.zeros(0, dtype=np.int64)
    b = np.concatenate(b_steps) if b_steps else np.zeros(0, dtype=np.int64)
    factor = (N - 2) * (ov[b] - ov[a] - 1)
    # every step climbs the overlap by >= 2: at most ov.max() / 2 of them on a chain
    safe = len(b) == 0 or (ov.max() / 2) * math.log2(max(int(factor.max()), 2)) < 62
    prod = np.zeros(len(ov), dtype=np.int64 if safe else object)
    prod[root] = 1
    if not safe:
        factor = factor.astype(object)
    for level in _distinct(ov[b]):          # parents before children
        sel = ov[b] == level
        prod[b[sel]] = prod[a[sel]] * factor[sel]
    return prod, None, (a, b)


def _check(c, X, final_query):
    claim = int(c.certified_min_rank)
    if claim <= 1:
        if claim < 1:
            _fail(f"claimed rank {claim} < 1")
        return
    N = int(c.seq_len)
    tokens = np.asarray(c.tokens, dtype=np.int64)
    q = np.asarray(c.query_index, dtype=np.int64)
    k = np.asarray(c.key_index, dtype=np.int64)
    n = len(q)
    if n < 2 or len(k) != n:
        _fail(f"rank {claim} claimed from {n} (query, key) pairs")
    K_claim = np.asarray(c.eps_denominators)
    D_claim = np.asarray(c.overlap_gaps)
    steps = ([], [], [])
    for i in range(n):
        ov = tokens @ tokens[q[i]]
        others = np.delete(np.arange(n), i)
        if (k[others] == k[i]).any():
            j = int(others[np.argmax(k[others] == k[i])])
            _fail(f"pair ({i}, {j}): key {int(k[j])} is not reached from key {int(k[i])} "
                  f"for query {int(q[i])}")
        prod, missing, used = _row_chains(i, int(k[i]), k[others], c.parents[i], ov, N)
        if prod is None:
            j = int(others[np.argmax(k[others] == missing)]) if (k[others] == missing).any() \
                else int(others[0])
            _fail(f"pair ({i}, {j}): key {int(k[j])} is not reached from key {int(k[i])} "
                  f"for query {int(q[i])}")
        _check_row_claims(i, others, k, prod, ov, K_claim, D_claim)
        steps[0].append(np.full(len(used[0]), i, dtype=np.int64))
        steps[1].append(used[0])
        steps[2].append(used[1])
    proved = _proved_rank(K_claim, n)
    if claim > proved:
        _fail(f"claimed rank {claim} exceeds the {proved} that R5 gives from the ratio bounds")
    # last, the one pass over the family: every sequence the chains use is present
    si, sa, sb = (np.concatenate(col) for col in steps)
    _check_family(X, tokens, q, si, sa, sb, N, final_query)


def _check_orders(c, X):
    """Every S3 step ``(x; a, b)`` of the certificate's chains is in ``X`` in every order:
    the exact sequence ``b^p a b^(N-2-p) x`` for ``p = 0 .. N-2``, read as rows of
    token ids (one pass over ``X`` in slices)."""
    N, m = int(c.seq_len), int(c.n_bits)
    tokens = np.asarray(c.tokens, dtype=np.int64)
    q = np.asarray(c.query_index, dtype=np.int64)
    k = np.asarray(c.key_index, dtype=np.int64)
    wanted = set()
    for i in range(len(q)):
        ov = tokens @ tokens[q[i]]
        others = np.delete(np.arange(len(q)), i)
        _, _, (a, b) = _row_chains(i, int(k[i]), k[others], c.parents[i], ov, N)
        for x_a, x_b in zip(a.tolist(), b.tolist()):
            for p in range(N - 1):
                wanted.add(tuple([x_b] * p + [x_a] + [x_b] * (N - 2 - p) + [int(q[i])]))
    lookup = {bytes(t): i for i, t in enumerate(np.packbits(c.tokens.astype(np.uint8), axis=1))}
    for ids, _, _ in _family_slots(X, lookup, m):
        wanted.difference_update(map(tuple, ids.tolist()))
        if not wanted:
            return
    if wanted:
        seq = min(wanted)
        _fail(f"sequence {list(seq)} (token ids; S3 of query {seq[-1]} in one order of its "
              "keys) is missing from X: the certificate claims every order for "
              "position-dependent maps")


def _check_row_claims(i, others, k, prod, ov, K_claim, D_claim):
    """Row ``i``'s claimed bounds follow from its chains; its overlap gaps are true."""
    claimed = np.asarray(K_claim[i])[others]
    got = prod[k[others]]
    if claimed.dtype != object and got.dtype != object:
        bad = (claimed < 1) | (claimed > got)
    else:
        bad = np.array([int(c) < 1 or int(c) > int(g) for c, g in zip(claimed, got)],
                       dtype=bool)
    if bad.any():
        t = int(np.argmax(bad))
        _fail(f"pair ({i}, {int(others[t])}): claimed ratio bound 1/{int(claimed[t])} does "
              f"not follow from the chain (which gives 1/{int(got[t])})")
    true_gap = ov[k[others]] - ov[k[i]]
    bad = np.asarray(D_claim[i])[others].astype(np.int64) != true_gap
    if bad.any():
        j = int(others[np.argmax(bad)])
        _fail(f"pair ({i}, {j}): claimed overlap distance {int(D_claim[i][j])}, "
              f"true distance {int(ov[k[j]] - ov[k[i]])}")


def _proved_rank(K_claim, n):
    """What R5 gives from the claimed denominators: ``floor(n^2 / (n + S)) + 1``, or
    ``n`` when every row (or every column) of ``1/K`` sums to at most 1 (exact)."""
    off = ~np.eye(n, dtype=bool)
    if K_claim.dtype == object:
        vals = K_claim[off]
        uniq = sorted(set(int(v) for v in vals))
        index = {v: t for t, v in enumerate(uniq)}
        idx = np.array([index[int(v)] for v in vals], dtype=np.int64)
    else:
        uniq_arr, idx = np.unique(K_claim[off].astype(np.int64), return_inverse=True)
        uniq = [int(v) for v in uniq_arr]
    if uniq and uniq[0] < 1:
        _fail(f"a claimed ratio bound 1/{uniq[0]} is not a positive integer denominator")
    idx = idx.reshape(n, n - 1)
    inv = [Fraction(1, v) for v in uniq]
    S = sum((Fraction(int(cnt), v * v) for v, cnt in zip(uniq, np.bincount(idx.ravel(),
                                                                           minlength=len(uniq)))),
            Fraction(0))

    def largest_sum(index_rows):
        counts = np.zeros((n, len(uniq)), dtype=np.int64)
        np.add.at(counts, (np.repeat(np.arange(n), n - 1), index_rows.ravel()), 1)
        return max(sum((int(cnt) * f for cnt, f in zip(row, inv) if cnt), Fraction(0))
                   for row in np.unique(counts, axis=0))

    col_idx = np.empty((n, n), dtype=np.int64)
    col_idx[off] = idx.ravel()
    col_idx = col_idx.T[off.T].reshape(n, n - 1)
    rows_max, cols_max = largest_sum(idx), largest_sum(col_idx)
    if rows_max <= 1 or cols_max <= 1:
        return n
    return min(n, math.floor(Fraction(n * n) / (n + S)) + 1)


#: chain steps whose multisets are encoded at a time
STEP_CHUNK = 1 << 22


def _check_family(X, tokens, q, si, sa, sb, N, final_query=False):
    """Every S1, S2, S3 of the chain steps ``(row, a, b)`` is in the family:
    ``{x, a^(N-1)}``, ``{x, b^(N-1)}`` and ``{x, a, b^(N-2)}`` with ``x`` the row's
    query (``final_query``: as a sequence whose final token is ``x``), encoded slice by
    slice and looked up in one pass over the family."""
    T = len(tokens)
    patterns = (np.array([1, N - 1, 0]), np.array([1, N - 1, 0]), np.array([1, 1, N - 2]))

    def codes_of(kind, lo, hi):
        x, a, b = q[si[lo:hi]], sa[lo:hi], sb[lo:hi]
        ids = (np.stack([x, a, a], 1), np.stack([x, b, b], 1), np.stack([x, a, b], 1))[kind]
        counts = np.broadcast_to(patterns[kind], ids.shape)
        return _multiset_codes(ids, counts, T, N, x if final_query else None)[0]

    parts = []
    for lo in range(0, len(si), STEP_CHUNK):
        for kind in range(3):
            c = codes_of(kind, lo, lo + STEP_CHUNK)
            parts.append(sorted(set(c)) if isinstance(c, list) else _distinct(c))
    if any(isinstance(c, list) for c in parts):
        want = sorted(set().union(*(set(np.asarray(c).tolist()) if not isinstance(c, list)
                                    else set(c) for c in parts)))
    else:
        want = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        parts.clear()
        want.sort()
        want = want[np.append(True, want[1:] != want[:-1])] if len(want) else want
    found = _found_codes(X, tokens.astype(np.uint8), want, final_query)
    if found.all():
        return
    for lo in range(0, len(si), STEP_CHUNK):      # name the first step that misses one
        for kind in range(3):
            c = codes_of(kind, lo, lo + STEP_CHUNK)
            if isinstance(want, list):
                pos = np.array([want.index(v) for v in c], dtype=np.int64)
            else:
                pos = np.searchsorted(want, c)
            miss = ~found[pos]
            if miss.any():
                t = lo + int(np.argmax(miss))
                _fail(f"row {int(si[t])}: sequence {('S1', 'S2', 'S3')[kind]} for query "
                      f"{int(q[si[t]])}, keys {int(sa[t])} -> {int(sb[t])} is missing from X"
                      + (" (with the query last)" if final_query else ""))
