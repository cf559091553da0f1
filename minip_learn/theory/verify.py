"""Independent check of a rank certificate against a family (numpy and fractions only).

:func:`verify_certificate` re-derives a :class:`~minip_learn.theory.Certificate` from
the family and the mathematics alone. It shares no code with
:func:`~minip_learn.theory.certify`: it reads the tokens, the chosen (query, key)
pairs, the chain trees, the claimed ratio bounds and the claimed rank, and checks

1. every step ``a -> b`` of the chain tree of query ``x`` climbs the overlap by
   ``g = <x,b> - <x,a> >= 2``, and the family holds the three multisets
   ``{x, a^(N-1)}``, ``{x, b^(N-1)}`` and ``{x, a, b^(N-2)}`` (see :ref:`theory-r4`),
   so ``alpha(x, b) < alpha(x, a) / ((N-2)(g-1))``;
2. every other designated key ``k_j`` is in the tree of ``x_i`` and the product of the
   step denominators along its chain is at least the claimed ``K_ij``; the claimed
   overlap distance ``<x_i, k_j> - <x_i, k_i>`` is the true one;
3. the claimed rank is at most what :ref:`theory-r5` gives from the claimed ``K_ij``:
   ``floor(n^2 / (n + sum 1/K_ij^2)) + 1``, or ``n`` when every row (or every column)
   of ``1/K`` sums to at most 1, computed with :class:`fractions.Fraction`.
"""

import math
from collections import Counter
from fractions import Fraction

import numpy as np

__all__ = ["verify_certificate"]


class _Failure(Exception):
    pass


def _fail(message):
    raise _Failure(message)


def _sequence_codes(X, tokens):
    """Sorted codes of the family's multisets, over the certificate's token list."""
    n, N, m = X.shape
    T = len(tokens)
    lookup = {bytes(t): i for i, t in enumerate(np.packbits(tokens, axis=1))}
    packed = np.packbits(X.reshape(-1, m), axis=1)
    width = -(-packed.shape[1] // 8) * 8
    words = np.zeros((len(packed), width), dtype=np.uint8)
    words[:, : packed.shape[1]] = packed
    words = words.view(">u8")
    order = np.lexsort(words.T[::-1])
    first = np.ones(len(order), dtype=bool)
    first[1:] = (words[order[1:]] != words[order[:-1]]).any(axis=1)
    group = np.empty(len(order), dtype=np.int64)
    group[order] = np.cumsum(first) - 1
    uniq = packed[order[first]]
    ids_of_uniq = np.array([lookup.get(bytes(u), -1) for u in uniq], dtype=np.int64)
    ids = ids_of_uniq[group].reshape(n, N)
    ids = np.sort(ids[(ids >= 0).all(axis=1)], axis=1)
    code = np.zeros(len(ids), dtype=object if float(T) ** N >= 2.0 ** 62 else np.int64)
    for k in range(N):
        code = code * T + ids[:, k]
    return set(code.tolist()) if code.dtype == object else np.unique(code), T


def verify_certificate(certificate, X, *, raise_on_failure=True):
    """Check a rank certificate against a family, independently of :func:`certify`.

    Parameters
    ----------
    certificate : Certificate or str
        A :class:`~minip_learn.theory.Certificate` or its JSON text
        (:meth:`~minip_learn.theory.Certificate.to_json`).
    X : array-like of shape (n_samples, seq_len, n_bits)
        The family, 0/1 values.
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
    X = np.asarray(X)
    if X.ndim != 3:
        raise ValueError(f"X must have shape (n_samples, seq_len, n_bits); got {X.shape}.")
    if not np.isin(X, (0, 1)).all():
        raise ValueError("X must hold 0/1 values only.")
    X = X.astype(np.uint8)
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
    present, T = _sequence_codes(X, tokens.astype(np.uint8))

    def has_all(rows):
        """Whether each multiset (a row of token ids) is in the family."""
        rows = np.sort(np.asarray(rows, dtype=np.int64), axis=1)
        if isinstance(present, set):
            codes = [0] * len(rows)
            for col in rows.T.tolist():
                codes = [a * T + b for a, b in zip(codes, col)]
            return np.array([code in present for code in codes], dtype=bool)
        codes = np.zeros(len(rows), dtype=np.int64)
        for col in rows.T:
            codes = codes * T + col
        pos = np.minimum(np.searchsorted(present, codes), len(present) - 1)
        return present[pos] == codes

    K_claim = c.eps_denominators
    D_claim = np.asarray(c.overlap_gaps)
    for i in range(n):
        x = tokens[q[i]]
        ov = tokens @ x
        steps = sorted(c.parents[i].items(), key=lambda cp: ov[cp[0]])
        ch = np.array([int(a) for a, _ in steps], dtype=np.int64)
        pa = np.array([int(b) for _, b in steps], dtype=np.int64)
        gaps = ov[ch] - ov[pa] if len(ch) else np.zeros(0, dtype=np.int64)
        col = np.full(len(ch), q[i], dtype=np.int64)[:, None]
        ok = {
            "S1": has_all(np.hstack([col] + [pa[:, None]] * (N - 1))),
            "S2": has_all(np.hstack([col] + [ch[:, None]] * (N - 1))),
            "S3": has_all(np.hstack([col, pa[:, None]] + [ch[:, None]] * (N - 2))),
        } if len(ch) else {}
        prod = {k[i]: 1}
        for s_, (child, parent, g) in enumerate(zip(ch.tolist(), pa.tolist(), gaps.tolist())):
            if parent not in prod:
                _fail(f"row {i}: chain step {parent} -> {child} does not start from the "
                      f"tree of key {k[i]}")
            if g < 2:
                _fail(f"row {i}: chain step {parent} -> {child} has overlap gap {g} < 2")
            for name in ("S1", "S2", "S3"):
                if not ok[name][s_]:
                    _fail(f"row {i}: sequence {name} for query {q[i]}, keys {parent} -> "
                          f"{child} is missing from X")
            prod[child] = prod[parent] * (N - 2) * (g - 1)
        for j in range(n):
            if j == i:
                continue
            if k[j] == k[i] or k[j] not in prod:
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
    counts = Counter(int(K_claim[i][j]) for i in range(n) for j in range(n) if i != j)
    S = sum((Fraction(cnt, v * v) for v, cnt in counts.items()), Fraction(0))
    rows = max(sum(Fraction(1, int(K_claim[i][j])) for j in range(n) if j != i)
               for i in range(n))
    cols = max(sum(Fraction(1, int(K_claim[i][j])) for i in range(n) if i != j)
               for j in range(n))
    proved = n if rows <= 1 or cols <= 1 else min(n, math.floor(Fraction(n * n) / (n + S)) + 1)
    if claim > proved:
        _fail(f"claimed rank {claim} exceeds the {proved} that R5 gives from the ratio bounds")
