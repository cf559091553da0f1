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

Only the steps on the chains between designated keys are checked (the rest of a tree
bears on no bound), and the family is read once, in slices, against the multisets those
steps need: memory is that of the certificate plus one slice.
"""

import math
from array import array
from collections import Counter
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


def _multiset_codes(ids, counts, T, N):
    """One integer per multiset given as (id, count) slots: ``(codes, ok)``.

    Equal ids in a row are merged; ``ok`` is False for rows of more than three distinct
    tokens (no wanted multiset has more). The code lists the three ids in increasing
    order (``T`` for none) and the first two counts (the third is ``N`` minus them);
    Python integers when it would not fit in int64.
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
    if float(T + 1) ** 3 * float(N + 1) ** 2 < 2.0 ** 62:
        codes = ((ids[:, 0] * (T + 1) + ids[:, 1]) * (T + 1) + ids[:, 2]) * (N + 1)
        return (codes + counts[:, 0]) * (N + 1) + counts[:, 1], ok
    codes = [(((a * (T + 1) + b) * (T + 1) + c) * (N + 1) + d) * (N + 1) + e
             for a, b, c, d, e in zip(*(col.tolist() for col in (*ids.T, *counts[:, :2].T)))]
    return codes, ok


def _family_slots(X, lookup, m):
    """Yield (ids, counts) of the family's sequences over the certificate's tokens, in
    slices; a sequence holding a token the certificate does not know is left out."""
    if is_compact(X):                               # read its arrays, slice by slice
        packed = np.packbits(np.asarray(X.tokens, dtype=np.uint8), axis=1)
        remap = np.array([lookup.get(bytes(t), -1) for t in packed] + [-1], dtype=np.int64)
        for a in range(0, len(X.token_ids), CHUNK):
            ids = np.asarray(X.token_ids[a:a + CHUNK], dtype=np.int64)
            counts = np.asarray(X.counts[a:a + CHUNK], dtype=np.int64)
            mapped = remap[ids]                     # padding (-1) reads the last entry
            known = ((mapped >= 0) | (counts == 0)).all(axis=1)
            yield np.where(counts > 0, mapped, 0)[known], counts[known]
        return
    n, N, _ = X.shape
    for a in range(0, n, CHUNK):
        part = np.packbits(X[a:a + CHUNK].reshape(-1, m).astype(np.uint8, copy=False), axis=1)
        part = np.ascontiguousarray(part).view(f"V{part.shape[1]}").reshape(-1)
        uniq, inv = np.unique(part, return_inverse=True)
        ids_of_uniq = np.array([lookup.get(u.tobytes(), -1) for u in uniq], dtype=np.int64)
        ids = ids_of_uniq[inv.reshape(-1)].reshape(-1, N)
        yield ids[(ids >= 0).all(axis=1)], np.ones((0, N), dtype=np.int64)


def _found_multisets(X, tokens, wanted_ids, wanted_counts):
    """Which of the wanted multisets (rows of (id, count) slots) the family holds.

    One pass over the family in slices of :data:`CHUNK` sequences: each slice's tokens
    are looked up in the certificate's token list, its multisets encoded over it and
    matched against the wanted ones; memory stays that of one slice plus the wanted.
    """
    N, m = X.shape[1], X.shape[2]
    T = len(tokens)
    lookup = {bytes(t): i for i, t in enumerate(np.packbits(tokens, axis=1))}
    want, _ = _multiset_codes(wanted_ids, wanted_counts, T, N)
    exact = not isinstance(want, np.ndarray)
    if exact:
        uniq_want = sorted(set(want))
        index = {code: i for i, code in enumerate(uniq_want)}
        back = np.array([index[code] for code in want], dtype=np.int64)
    else:
        uniq_want, back = np.unique(want, return_inverse=True)
    found = np.zeros(len(uniq_want), dtype=bool)
    for ids, counts in (_family_slots(X, lookup, m) if len(uniq_want) else ()):
        if not counts.size:                         # materialised: every position once
            counts = np.ones(ids.shape, dtype=np.int64)
        codes, ok = _multiset_codes(ids, counts, T, N)
        if exact:
            found[[index[c] for c, good in zip(codes, ok) if good and c in index]] = True
            continue
        codes = codes[ok]
        pos = np.minimum(np.searchsorted(uniq_want, codes), len(uniq_want) - 1)
        found[pos[uniq_want[pos] == codes]] = True
    return found[back]


def verify_certificate(certificate, X, *, raise_on_failure=True):
    """Check a rank certificate against a family, independently of :func:`certify`.

    Parameters
    ----------
    certificate : Certificate or str
        A :class:`~minip_learn.theory.Certificate` or its JSON text
        (:meth:`~minip_learn.theory.Certificate.to_json`).
    X : array-like of shape (n_samples, seq_len, n_bits) or CompactFamily
        The family, 0/1 values, or the same family in multiset form (read slice by
        slice, never materialised).
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
        always when the certificate and the family do not fit each other (shapes).

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
    if X.shape[1:] != (c.seq_len, c.n_bits):
        raise ValueError(
            f"the certificate is for sequences of length {c.seq_len} over {c.n_bits} bits; "
            f"X has shape {X.shape}."
        )
    try:
        _check(c, X)
    except _Failure as exc:
        if raise_on_failure:
            raise ValueError(f"certificate rejected: {exc}") from None
        return False
    return True


def _check(c, X):
    claim = int(c.certified_min_rank)
    if claim <= 1:
        if claim < 1:
            _fail(f"claimed rank {claim} < 1")
        return
    N = int(c.seq_len)
    tokens = np.asarray(c.tokens, dtype=np.int64)
    q = [int(i) for i in c.query_index]
    k = [int(i) for i in c.key_index]
    n = len(q)
    if n < 2 or len(k) != n:
        _fail(f"rank {claim} claimed from {n} (query, key) pairs")
    K_claim = c.eps_denominators
    D_claim = np.asarray(c.overlap_gaps)
    # the steps the chains use: (row i, parent, child), each checked once
    steps = (array("q"), array("q"), array("q"))
    for i in range(n):
        x = tokens[q[i]]
        ov = tokens @ x
        parents = c.parents[i]
        prod = {k[i]: 1}

        def climb(t, i=i, ov=ov, parents=parents, prod=prod):
            # walk up from t to a token whose product is known; the overlap with x
            # drops by >= 2 at every step, so the walk ends
            path = []
            while t not in prod:
                if t not in parents:
                    return None
                a = int(parents[t])
                g = int(ov[t] - ov[a])
                if g < 2:
                    _fail(f"row {i}: chain step {a} -> {t} has overlap gap {g} < 2")
                path.append((a, t, g))
                t = a
            for a, b, g in reversed(path):
                prod[b] = prod[a] * (N - 2) * (g - 1)
                for col, v in zip(steps, (i, a, b)):
                    col.append(v)
            return prod[t]

        for j in range(n):
            if j == i:
                continue
            if k[j] == k[i] or climb(k[j]) is None:
                _fail(f"pair ({i}, {j}): key {k[j]} is not reached from key {k[i]} "
                      f"for query {q[i]}")
            Kij = int(K_claim[i][j])
            if Kij < 1 or Kij > prod[k[j]]:
                _fail(f"pair ({i}, {j}): claimed ratio bound 1/{Kij} does not follow from "
                      f"the chain (which gives 1/{prod[k[j]]})")
            true_gap = int(ov[k[j]] - ov[k[i]])
            if int(D_claim[i][j]) != true_gap:
                _fail(f"pair ({i}, {j}): claimed overlap distance {int(D_claim[i][j])}, "
                      f"true distance {true_gap}")
    Kint = [[int(K_claim[i][j]) for j in range(n)] for i in range(n)]

    def exact_sum(values, power=1):
        # sum of 1/v^power, exactly: one Fraction per distinct denominator
        return sum((Fraction(cnt, v ** power) for v, cnt in Counter(values).items()),
                   Fraction(0))

    S = exact_sum([Kint[i][j] for i in range(n) for j in range(n) if i != j], 2)
    rows = max(exact_sum([Kint[i][j] for j in range(n) if j != i]) for i in range(n))
    cols = max(exact_sum([Kint[i][j] for i in range(n) if i != j]) for j in range(n))
    proved = n if rows <= 1 or cols <= 1 else min(n, math.floor(Fraction(n * n) / (n + S)) + 1)
    if claim > proved:
        _fail(f"claimed rank {claim} exceeds the {proved} that R5 gives from the ratio bounds")
    # last, the one pass over the family: every sequence the chains use is present
    si, sa, sb = (np.frombuffer(col, dtype=np.int64) for col in steps)
    # S1, S2, S3 of every step as (id, count) slots: {x, a^(N-1)}, {x, b^(N-1)},
    # {x, a, b^(N-2)}
    x = np.asarray(q, dtype=np.int64)[si]
    wanted_ids = np.stack([np.stack([x, sa, sa], 1), np.stack([x, sb, sb], 1),
                           np.stack([x, sa, sb], 1)], axis=1).reshape(-1, 3)
    wanted_counts = np.tile(np.array([[1, N - 1, 0], [1, N - 1, 0], [1, 1, N - 2]]),
                            (len(si), 1))
    found = _found_multisets(X, tokens.astype(np.uint8), wanted_ids, wanted_counts)
    if not found.all():
        first = int(np.argmin(found))
        i, a, b = (int(col[first // 3]) for col in (si, sa, sb))
        name = ("S1", "S2", "S3")[first % 3]
        _fail(f"row {i}: sequence {name} for query {q[i]}, keys {a} -> {b} is missing from X")
