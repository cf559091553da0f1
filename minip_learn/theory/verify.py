"""Independent check of a rank certificate against a family (numpy and fractions only).

:func:`verify_certificate` re-derives a :class:`~minip_learn.theory.Certificate` from
the family and the mathematics alone. It shares no code with
:func:`~minip_learn.theory.certify` (only the reading of a JSON text or file, which
checks the format field by field): it checks every field's type, shape and range,
then reads the tokens, the chosen (query, key) pairs, the chain trees, the claimed
ratio bounds and the claimed rank, and checks

1. every other designated key ``k_j`` is in the tree of ``x_i`` and the product of the
   step denominators along its chain is at least the claimed ``K_ij``; the claimed
   overlap distance ``<x_i, k_j> - <x_i, k_i>`` is the true one;
2. every step ``a -> b`` of those chains climbs the overlap with ``x = x_i`` by
   ``g = <x,b> - <x,a> >= 2``, and the family holds the three multisets
   ``{x, a^(N-1)}``, ``{x, b^(N-1)}`` and ``{x, a, b^(N-2)}`` (see :ref:`theory-r4`),
   so ``alpha(x, b) < alpha(x, a) / ((N-2)(g-1))``;
3. the claimed rank is what :ref:`theory-r5` gives from the claimed ``K_ij``:
   ``floor(n^2 / (n + sum 1/K_ij^2)) + 1``, or ``n`` when every row (or every column)
   of ``1/K`` sums to at most 1, computed with :class:`fractions.Fraction`;
4. every other figure the certificate states is the one recomputed: the Frobenius
   value ``n^2 / (n + sum 1/K_ij^2)``, the diagonal dominance, the number of R4
   triples the family holds (``n_constraints``, counted here from the sequences),
   the one-line ``reason``, and (without pairs) the rank 1 and ``strategy="none"``;
   the certificate's tokens cover every token of the family.

With ``query="last"`` (final-query Min-IP, the certificate's own mode by default) the
three multisets of every step must each occur as a sequence whose final token is ``x``.
A ``positional`` certificate (position-dependent maps) also needs S3 in every order of
its keys: ``(b, ..., b, a, b, ..., b, x)`` with ``a`` at each of the first ``N - 1``
positions, each read as an exact sequence of ``X`` (an array).

Only the steps on the chains between designated keys are checked (the rest of a tree
bears on no bound), and the family is read once, in slices, against the multisets those
steps need and the triples it holds: memory is that of the certificate, one slice and
the family's triples (one integer each).
"""

import math
import numbers
import os
from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from .._progress import stages
from .._validation import check_sequences
from ..compact import is_compact
from ._docs import verify_doc
from ._task_sets import AllSequences

__all__ = []  # public home: the package minip_learn.theory


class _Failure(Exception):
    pass


def _fail(message):
    raise _Failure(message)


#: sequences read from the family at a time (the check streams over the family)
CHUNK = 1 << 17


def _merged(ids, counts, T):
    """Each row's multiset as three (id, count) slots: ``(ids, counts, ok)``.

    Equal ids in a row are merged and the slots sorted by id (``T`` for none, count 0);
    ``ok`` is False for rows of more than three distinct tokens (no multiset a check
    needs has more).
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
    return ids[:, :3], counts[:, :3], ok


def _multiset_codes(ids, counts, T, N, last=None):
    """One integer per multiset given as (id, count) slots: ``(codes, ok)``.

    The slots are merged (:func:`_merged`); ``ok`` is False for rows of more than three
    distinct tokens. The code lists the three ids in increasing order (``T`` for none)
    and the first two counts (the third is ``N`` minus them), then, when ``last`` (one
    id per row) is given, the id of the final token; Python integers when it would not
    fit in int64.
    """
    ids, counts, ok = _merged(ids, counts, T)
    return _slot_codes(ids, counts, T, N, last), ok


def _slot_codes(ids, counts, T, N, last=None):
    """The codes of :func:`_multiset_codes` from merged slots."""
    fin = None if last is None else np.asarray(last, dtype=np.int64)
    if float(T + 1) ** (3 if fin is None else 4) * float(N + 1) ** 2 < 2.0 ** 62:
        codes = ((ids[:, 0] * (T + 1) + ids[:, 1]) * (T + 1) + ids[:, 2]) * (N + 1)
        codes = (codes + counts[:, 0]) * (N + 1) + counts[:, 1]
        return codes if fin is None else codes * (T + 1) + fin
    codes = [(((a * (T + 1) + b) * (T + 1) + c) * (N + 1) + d) * (N + 1) + e
             for a, b, c, d, e in zip(*(col.tolist() for col in (*ids.T, *counts[:, :2].T)))]
    if fin is not None:
        codes = [code * (T + 1) + f for code, f in zip(codes, fin.tolist())]
    return codes


def _token_text(bits):
    return "".join("1" if b else "0" for b in np.asarray(bits).tolist())


def _family_slots(X, lookup, m):
    """Yield ``(ids, counts, final, unknown)`` of the family's sequences over the
    certificate's tokens, in slices: ``final`` the id of each sequence's final token,
    ``counts`` empty for an array (every position once, ``ids`` then the sequences);
    a sequence holding a token the certificate does not list is left out, and
    ``unknown`` is the first such token (a string of 0/1) or None."""
    if is_compact(X):                               # read its arrays, slice by slice
        packed = np.packbits(np.asarray(X.tokens, dtype=np.uint8), axis=1)
        remap = np.array([lookup.get(bytes(t), -1) for t in packed] + [-1], dtype=np.int64)
        for a in range(0, len(X.token_ids), CHUNK):
            ids = np.asarray(X.token_ids[a:a + CHUNK], dtype=np.int64)
            counts = np.asarray(X.counts[a:a + CHUNK], dtype=np.int64)
            mapped = remap[ids]                     # padding (-1) reads the last entry
            known = ((mapped >= 0) | (counts == 0)).all(axis=1)
            unknown = None
            if not known.all():
                miss = ids[(mapped < 0) & (counts > 0)][0]
                unknown = _token_text(X.tokens[miss])
            # materialised, slot after slot: the final token is the last slot counted
            k = counts.shape[1]
            final_slot = k - 1 - np.argmax(counts[:, ::-1] > 0, axis=1)
            final = mapped[np.arange(len(ids)), final_slot]
            yield np.where(counts > 0, mapped, 0)[known], counts[known], final[known], unknown
        return
    n, N, _ = X.shape
    for a in range(0, n, CHUNK):
        part = np.packbits(X[a:a + CHUNK].reshape(-1, m).astype(np.uint8, copy=False), axis=1)
        part = np.ascontiguousarray(part).view(f"V{part.shape[1]}").reshape(-1)
        uniq, inv = np.unique(part, return_inverse=True)
        ids_of_uniq = np.array([lookup.get(u.tobytes(), -1) for u in uniq], dtype=np.int64)
        unknown = None
        if (ids_of_uniq < 0).any():
            u = uniq[int(np.argmax(ids_of_uniq < 0))]
            unknown = _token_text(np.unpackbits(np.frombuffer(u.tobytes(), np.uint8))[:m])
        ids = ids_of_uniq[inv.reshape(-1)].reshape(-1, N)
        ids = ids[(ids >= 0).all(axis=1)]
        yield ids, np.ones((0, N), dtype=np.int64), ids[:, -1], unknown


#: slot roles ``(x, y)`` of ``S1 = {x, y^(N-1)}`` and ``(x, y, z)`` of
#: ``S3 = {x, y, z^(N-2)}`` over three merged slots (``y`` or ``z`` may be ``x``)
_S1_ROLES = [(p, q) for p in range(3) for q in range(3)]
_S3_ROLES = [(p, q, r) for p in range(3) for q in range(3) for r in range(3) if q != r]


def _roles(ids, counts, fin, N, roles, sizes):
    """Rows and slot roles whose merged multiset is exactly the role pattern (slot
    ``roles[j]`` taking ``sizes[j]`` copies), with the query (first role) the final
    token when ``fin`` is given: ``(rows, tokens per role)``."""
    base = N + 1
    narrow = float(base) ** 3 < 2.0 ** 62
    sig = counts[:, 0] + base * (counts[:, 1] + base * counts[:, 2]) if narrow else None
    rows, picked, hits = [], [[] for _ in sizes], {}
    for role in roles:
        need = [0, 0, 0]
        for slot, size in zip(role, sizes):
            need[slot] += size
        key = tuple(need)
        if key not in hits:                 # rows of this multiplicity pattern
            hits[key] = np.flatnonzero(
                sig == need[0] + base * (need[1] + base * need[2]) if narrow
                else (counts == np.array(need)).all(axis=1))
        hit = hits[key]
        if fin is not None:
            hit = hit[ids[hit, role[0]] == fin[hit]]
        rows.append(hit)
        for j, slot in enumerate(role):
            picked[j].append(ids[hit, slot])
    return np.concatenate(rows), [np.concatenate(p) for p in picked]


class _Triples:
    """The R4 triples ``(x, y, z)`` of a family, gathered slice by slice: the S1 pairs
    ``{x, y^(N-1)}`` present, and the S3 multisets ``{x, y, z^(N-2)}`` of gap
    ``<x,z> - <x,y> >= 2`` (with, for ``positional``, the position of ``y`` among the
    keys of each sequence); :meth:`count` keeps those whose two S1 are present (and
    whose S3 occurs in every order)."""

    #: triples are held as one code ``(x T + y) T + z`` each below this, as rows beyond
    CODE_LIMIT = 2.0 ** 62

    def __init__(self, tokens, N, final_query, positional):
        self.tok = np.asarray(tokens, dtype=np.uint8)
        self.T, self.N = len(tokens), N
        self.final_query, self.positional = final_query, positional
        self.wide = float(self.T) ** 3 >= self.CODE_LIMIT
        self.s1, self.s3 = [], []

    def add(self, ids, counts, fin, seqs):
        T, N = self.T, self.N
        fin = fin if self.final_query else None
        _, (x, y) = _roles(ids, counts, fin, N, _S1_ROLES, (1, N - 1))
        self.s1.append(_distinct(x * T + y))
        rows, (x, y, z) = _roles(ids, counts, fin, N, _S3_ROLES, (1, 1, N - 2))
        keep = np.zeros(len(x), dtype=bool)
        step = max(1, (1 << 24) // self.tok.shape[1])     # overlaps a few rows at a time
        for a in range(0, len(x), step):
            tx = self.tok[x[a:a + step]]
            gap = (tx & self.tok[z[a:a + step]]).sum(axis=1, dtype=np.int64) \
                - (tx & self.tok[y[a:a + step]]).sum(axis=1, dtype=np.int64)
            keep[a:a + step] = gap >= 2
        rows, x, y, z = rows[keep], x[keep], y[keep], z[keep]
        cols = [x, y, z]
        if self.positional:                 # where y stands among the N - 1 keys
            cols.append(np.argmax(seqs[rows, :N - 1] == y[:, None], axis=1))
        self.s3.append(_distinct_rows(np.stack(cols, axis=1)) if self.wide or self.positional
                       else _distinct((x * T + y) * T + z))

    def count(self):
        """The number of distinct triples whose two S1 are present (and, ``positional``,
        whose S3 occurs in every order). The codes of the gathered triples are copied
        into one array part by part, filtered in place and sorted in place: memory about
        one int64 per gathered triple."""
        T = self.T
        s1 = _distinct(np.concatenate(self.s1)) if self.s1 else np.zeros(0, np.int64)
        self.s1 = []
        if T * T <= 1 << 26:                # membership by a table of every pair
            table = np.zeros(T * T, dtype=bool)
            table[s1] = True

            def has(x, y, z):
                return table[x * T + y] & table[x * T + z]
        else:
            def has(x, y, z):
                return _isin(x * T + y, s1) & _isin(x * T + z, s1)

        if self.wide or self.positional:
            rows = (_distinct_rows(np.concatenate(self.s3)) if self.s3
                    else np.zeros((0, 3), dtype=np.int64))
            if self.positional:             # every one of the N - 1 positions of y
                xyz = rows[:, :3]
                start = np.ones(len(xyz), dtype=bool)
                start[1:] = (xyz[1:] != xyz[:-1]).any(axis=1)
                runs = np.diff(np.append(np.flatnonzero(start), len(xyz)))
                rows = xyz[start][runs == self.N - 1]
            return int(np.count_nonzero(has(rows[:, 0], rows[:, 1], rows[:, 2])))
        codes = np.empty(sum(len(part) for part in self.s3), dtype=np.int64)
        kept = 0
        self.s3.reverse()
        while self.s3:                      # each slice's codes: filtered, then freed
            part = self.s3.pop()
            x, rest = np.divmod(part, T * T)
            part = part[has(x, *np.divmod(rest, T))]
            codes[kept:kept + len(part)] = part
            kept += len(part)
        codes = codes[:kept]
        codes.sort()
        return int(np.count_nonzero(codes[1:] != codes[:-1])) + 1 if kept else 0


def _distinct_rows(a):
    """The distinct rows of a 2-d integer array, sorted."""
    if not len(a):
        return a
    order = np.lexsort(a.T[::-1])
    a = a[order]
    keep = np.ones(len(a), dtype=bool)
    keep[1:] = (a[1:] != a[:-1]).any(axis=1)
    return a[keep]


def _isin(values, sorted_unique):
    """Whether each of ``values`` is in the sorted, duplicate-free ``sorted_unique``."""
    if not len(sorted_unique):
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_unique, values), len(sorted_unique) - 1)
    return sorted_unique[pos] == values


def _scan_family(X, tokens, want, final_query=False, count=False, positional=False):
    """One pass over the family: which of the sorted, distinct multiset codes ``want``
    (an int64 array, or a list of Python integers) it holds (``final_query``: codes that
    also name the final token, see :func:`_multiset_codes`), the first of its tokens
    the certificate does not list (or None) and, with ``count``, its number of R4
    triples (:class:`_Triples`).

    The family is read in slices of :data:`CHUNK` sequences: each slice's tokens are
    looked up in the certificate's token list, its multisets merged once, encoded and
    matched against the wanted ones, and its triples gathered; memory stays that of one
    slice, the wanted codes and the triples.
    """
    N, m = X.shape[1], X.shape[2]
    T = len(tokens)
    lookup = {bytes(t): i for i, t in enumerate(np.packbits(tokens, axis=1))}
    exact = not isinstance(want, np.ndarray)
    index = {code: i for i, code in enumerate(want)} if exact else None
    found = np.zeros(len(want), dtype=bool)
    triples = _Triples(tokens, N, final_query, positional) if count and N >= 3 else None
    unknown = None
    for ids, counts, final, missing in _family_slots(X, lookup, m):
        unknown = unknown or missing
        seqs = ids if not counts.size else None
        if not counts.size:                         # materialised: every position once
            counts = np.ones(ids.shape, dtype=np.int64)
        slots, slot_counts, ok = _merged(ids, counts, T)
        if len(want):
            codes = _slot_codes(slots, slot_counts, T, N, final if final_query else None)
            if exact:
                found[[index[c] for c, good in zip(codes, ok) if good and c in index]] = True
            else:
                codes = codes[ok]
                pos = np.minimum(np.searchsorted(want, codes), len(want) - 1)
                found[pos[want[pos] == codes]] = True
        if triples is not None:
            triples.add(slots[ok], slot_counts[ok], final[ok],
                        None if seqs is None else seqs[ok])
    return found, unknown, (triples.count() if triples is not None else 0)


@verify_doc
def verify_certificate(certificate, X, *, query=None, raise_on_failure=True, progress=False):
    """Check a rank certificate against a family, independently of :func:`certify`.

    The certificate is read strictly (every field's JSON type, range and size, see
    :meth:`~minip_learn.theory.Certificate.from_json`), its fields are checked again
    here, and then every claim it makes is recomputed from the family: the chains and
    ratio bounds, the rank they give, and each stated figure (``frobenius_value``,
    ``diagonally_dominant``, ``n_constraints``, ``reason``). The certificate is
    accepted only when all of them are what it states.

    Parameters
    ----------
    certificate : Certificate, str, bytes or os.PathLike
        A :class:`~minip_learn.theory.Certificate`; its JSON text
        (:meth:`~minip_learn.theory.Certificate.to_json`) as a str, or as bytes
        (UTF-8); or the path of a JSON file (``os.PathLike``, e.g.
        :class:`pathlib.Path`; a name ending in ``.gz`` is read as gzip, see
        :meth:`~minip_learn.theory.Certificate.from_file`). A str is always JSON
        text, never a file name.
    X : array-like of shape (n_samples, seq_len, n_bits) or CompactFamily
        The family: 0/1 values (what :func:`~minip_learn.theory.certify` accepts), or
        the same family in multiset form (read slice by slice, never materialised).
    query : {"all", "last"} or None, default=None
        ``"last"``: final-query Min-IP, every sequence a chain step uses must have its
        query as final token (for a CompactFamily: the token of its last real slot,
        the final position of the materialised sequence). ``"all"``: any position.
        None: the certificate's own ``query``; a value that differs from it is a
        ``ValueError``.
    %(raise_on_failure)s
    progress : bool, default=False
        Show a progress bar (:mod:`tqdm`, on standard error) naming each stage as it
        runs: ``read`` (the certificate and the family's values), ``check`` (the two
        fit each other, then the chains, the rank and the pass over the family).

    %(valid)s

    Raises
    ------
    ValueError
        With ``raise_on_failure=True``, on the first failed check (missing sequence,
        wrong overlap, a ratio bound the chain does not give, a rank other than the
        one the bounds give, a stated figure that is not the recomputed one), with a
        message starting ``"certificate rejected"``; and always (whatever
        ``raise_on_failure``) when the certificate is not one (a malformed field, an
        unknown version: the message names the field), the family is not a 0/1 family,
        the two do not fit each other (shapes), or ``query`` is not the certificate's.
    TypeError
        If ``certificate`` is none of the types above.
    OSError
        If a certificate path cannot be opened.

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
    with stages("verify", ("read", "check"), progress) as bar:
        bar.start("read")
        c = _fields(_read(certificate))
        if not is_compact(X) and not isinstance(X, AllSequences):   # (validated when made)
            X, _ = check_sequences(X, binary=True)
        bar.start("check")
        return _verify(c, X, query, raise_on_failure)


def _verify(c, X, query, raise_on_failure):
    """:func:`verify_certificate` of the checked fields ``c`` and a validated ``X``."""
    mode = c.query
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
    if c.positional and (query != "last" or is_compact(X)):
        raise ValueError('a positional certificate is checked on final-query sequences '
                         'held as an array (query="last", X not a CompactFamily).')
    try:
        counted = _check(c, X, query == "last")
        if c.positional and len(c.q):
            _check_orders(c, X)
        _check_count(c, *counted)
    except _Failure as exc:
        if raise_on_failure:
            raise ValueError(f"certificate rejected: {exc}") from None
        return False
    return True


# --------------------------------------------------------------------------- the fields
def _read(certificate):
    """A :class:`Certificate` from what :func:`verify_certificate` accepts."""
    from .certificate import Certificate

    if isinstance(certificate, Certificate):
        return certificate
    if isinstance(certificate, (str, bytes, bytearray)):
        return Certificate.from_json(certificate)
    if isinstance(certificate, os.PathLike):
        return Certificate.from_file(certificate)
    raise TypeError("certificate must be a Certificate, its JSON text (str or bytes) or "
                    f"the path of a JSON file (os.PathLike); got {type(certificate).__name__}.")


class _Fields:
    """A certificate's fields, checked (:func:`_fields`)."""


def _short(value):
    text = " ".join(repr(value).split())
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({type(value).__name__})"


def _field_error(name, must, value, where=""):
    return ValueError(f"certificate field {name!r}{where} must be {must}; got {_short(value)}.")


def _int_value(name, value, lo, hi=None):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise _field_error(name, "an integer", value)
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise _field_error(name, f"an integer from {lo}" + (f" to {hi}" if hi is not None
                                                            else " up"), value)
    return value


def _bool_value(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise _field_error(name, "True or False", value)
    return bool(value)


def _array(name, value):
    try:
        return np.asarray(value)
    except (ValueError, TypeError):         # ragged, or not array-like
        raise _field_error(name, "an array", value) from None


def _int_array(name, value, ndim, lo=None, hi=None):
    """An integer array (int64, or Python integers as dtype object past int64)."""
    a = _array(name, value)
    if a.ndim != ndim:
        raise ValueError(f"certificate field {name!r} must be a {ndim}-d integer array; got "
                         f"shape {a.shape}.")
    if a.dtype == object:
        bad = [v for v in a.ravel().tolist()
               if isinstance(v, bool) or not isinstance(v, (int, np.integer))]
        if bad:
            raise _field_error(name, "integers", bad[0], " entry")
        if all(-2**63 < int(v) < 2**63 for v in a.ravel().tolist()):
            a = a.astype(np.int64)
    elif a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and not a.size):
        raise ValueError(f"certificate field {name!r} must hold integers; got dtype {a.dtype}.")
    else:
        a = a.astype(np.int64)
    if a.size and lo is not None:
        low = min(a.ravel().tolist()) if a.dtype == object else int(a.min())
        high = max(a.ravel().tolist()) if a.dtype == object else int(a.max())
        if low < lo or (hi is not None and high > hi):
            raise _field_error(name, f"integers from {lo}" + (f" to {hi}" if hi is not None
                                                              else " up"),
                               low if low < lo else high, " entry")
    return a


def _fields(c):
    """The fields of a certificate, each checked for its type, shape and range before
    any arithmetic (ValueError naming the field otherwise)."""
    f = _Fields()
    f.claim = _int_value("certified_min_rank", c.certified_min_rank, 1)
    f.seq_len = _int_value("seq_len", c.seq_len, 1, 2**31 - 1)
    f.n_bits = m = _int_value("n_bits", c.n_bits, 1, 2**31 - 1)
    tokens = _array("tokens", c.tokens)
    if tokens.ndim != 2 or tokens.shape[1] != m or tokens.dtype.kind not in "biu" \
            or (tokens.size and (tokens.max() > 1 or tokens.min() < 0)):
        raise ValueError(f"certificate field 'tokens' must be a (n_tokens, n_bits={m}) "
                         f"array of 0/1 integers; got shape {tokens.shape}, dtype "
                         f"{tokens.dtype}.")
    f.tokens = tokens.astype(np.int64)
    T = len(tokens)
    if T > 1:
        packed = np.packbits(tokens.astype(np.uint8), axis=1)
        rows = np.ascontiguousarray(packed).view(f"V{packed.shape[1]}").ravel()
        if len(np.unique(rows)) != T:
            raise ValueError("certificate field 'tokens' must hold distinct tokens; one is "
                             "listed twice.")
    f.q = _int_array("query_index", c.query_index, 1, 0, T - 1)
    f.k = _int_array("key_index", c.key_index, 1, 0, T - 1)
    n = len(f.q)
    if len(f.k) != n:
        raise ValueError(f"certificate fields 'query_index' and 'key_index' must have the "
                         f"same length; got {n} and {len(f.k)}.")
    f.K = _int_array("eps_denominators", c.eps_denominators, 2)
    f.D = _int_array("overlap_gaps", c.overlap_gaps, 2, -m, m)
    for name, M, diagonal in (("eps_denominators", f.K, 1), ("overlap_gaps", f.D, 0)):
        if M.shape != (n, n):
            raise ValueError(f"certificate field {name!r} must be {n} x {n} (one row and "
                             f"column per (query, key) pair); got shape {M.shape}.")
        if n and (np.diagonal(M) != diagonal).any():
            raise ValueError(f"certificate field {name!r} must be {diagonal} on the "
                             "diagonal.")
    if n > 1:
        off = f.K[~np.eye(n, dtype=bool)]
        if (min(off.tolist()) if off.dtype == object else int(off.min())) < 1:
            raise ValueError("certificate field 'eps_denominators' must hold integers >= 1.")
    parents = c.parents
    try:
        rows = None if isinstance(parents, (str, bytes, Mapping)) else \
            [parents[i] for i in range(len(parents))]
    except (TypeError, IndexError, KeyError):
        rows = None
    if rows is None or len(rows) != n:
        raise ValueError(f"certificate field 'parents' must be a sequence of {n} chain "
                         f"trees (one per (query, key) pair); got {_short(parents)}.")
    f.trees = [_tree_arrays(tree, i, T) for i, tree in enumerate(rows)]
    value = c.frobenius_value
    if isinstance(value, bool) or not isinstance(value, numbers.Rational):
        raise _field_error("frobenius_value", "a Fraction", value)
    f.frobenius_value = Fraction(value)
    f.dominant = _bool_value("diagonally_dominant", c.diagonally_dominant)
    f.n_constraints = _int_value("n_constraints", c.n_constraints, 0)
    for name in ("reason", "strategy"):
        if not isinstance(getattr(c, name), str):
            raise _field_error(name, "a str", getattr(c, name))
    f.reason, f.strategy = c.reason, c.strategy
    f.exhaustive = _bool_value("exhaustive", c.exhaustive)
    f.query = getattr(c, "query", "all")
    if not isinstance(f.query, str) or f.query not in ("all", "last"):
        raise _field_error("query", "'all' or 'last'", f.query)
    f.positional = _bool_value("positional", getattr(c, "positional", False))
    if f.positional and f.query != "last":
        raise ValueError("certificate field 'positional' is True, which needs query 'last' "
                         f"(position-dependent maps are bounded through the final query); "
                         f"got query {f.query!r}.")
    return f


def _tree_arrays(tree, i, T):
    """Row ``i``'s chain tree as sorted arrays (child, parent) of token indices: from a
    mapping or from the arrays a certificate holds."""
    if hasattr(tree, "child") and hasattr(tree, "parent"):
        child = _int_array("parents", tree.child, 1, 0, T - 1)
        parent = _int_array("parents", tree.parent, 1, 0, T - 1)
        if len(child) != len(parent):
            raise ValueError(f"certificate field 'parents' row {i} must pair every child "
                             "with a parent.")
    elif isinstance(tree, Mapping):
        items = list(tree.items())
        child = _int_array("parents", [a for a, _ in items], 1, 0, T - 1)
        parent = _int_array("parents", [b for _, b in items], 1, 0, T - 1)
    else:
        raise ValueError(f"certificate field 'parents' row {i} must be a chain tree (a "
                         f"mapping child -> parent); got {_short(tree)}.")
    child, parent = child.reshape(-1), parent.reshape(-1)
    order = np.argsort(child, kind="stable")
    child, parent = child[order], parent[order]
    if (child[1:] == child[:-1]).any():
        raise ValueError(f"certificate field 'parents' row {i} gives a token two parents.")
    return child, parent


def _distinct(a):
    """The distinct values of a 1-d integer array, sorted (by sorting: no hash table)."""
    a = np.sort(np.asarray(a).ravel())
    return a[np.append(True, a[1:] != a[:-1])] if len(a) else a


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
    and ``(a, b)`` the steps used; ``tree`` is the row's (child, parent) arrays, sorted.
    """
    child, parent = tree
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


def _reason(c, n, dominant, value):
    """The one line a certificate of these figures states as its reason."""
    if n:
        return (f"{n} mutually constrained (query, key) pairs; R5 per-pair bound "
                + ("(diagonal dominance)" if dominant else f"r > {float(value):.4f}"))
    if c.seq_len < 3:
        return (f"seq_len={c.seq_len} <= 2: gap domination needs three tokens (R1: rank 1 "
                "solves it)")
    if not c.n_constraints:
        return ("the family contains no (S1, S2, S3) triple with gap >= 2"
                + (" and the query last" if c.query == "last" else "")
                + (" in every order of its keys" if c.positional else ""))
    return "no two (query, key) pairs constrain each other"


def _check_statement(c, n, dominant, value):
    """The figures stated besides the rank are the recomputed ones."""
    if c.frobenius_value != value:
        _fail(f"stated frobenius_value {c.frobenius_value} is not the "
              f"n^2/(n + sum eps_ij^2) = {value} of the ratio bounds")
    if c.dominant != dominant:
        _fail(f"stated diagonally_dominant={c.dominant}, but the ratio bounds give "
              f"{dominant}")
    if not n and (c.strategy != "none" or not c.exhaustive):
        _fail(f"a certificate without (query, key) pairs states strategy 'none' and "
              f"exhaustive=True; got strategy {c.strategy!r}, exhaustive={c.exhaustive}")
    if n and c.strategy == "none":
        _fail(f"strategy 'none' states that no search found pairs; the certificate "
              f"lists {n}")
    expected = _reason(c, n, dominant, value)
    if c.reason != expected:
        _fail(f"stated reason {_short(c.reason).rsplit(' (', 1)[0]} is not {expected!r}")


def _check_count(c, unknown, n_triples):
    """The family's tokens are all listed; the stated number of triples is true."""
    if unknown is not None:
        _fail(f"token {unknown} of X is not among the certificate's tokens")
    if c.n_constraints != n_triples:
        _fail(f"stated n_constraints={c.n_constraints}, but X holds {n_triples} gap "
              f"constraints (R4 triples)")


def _check(c, X, final_query):
    """Every check but the orders of a positional certificate and the count of triples:
    returns ``(unknown, n_triples)`` of the pass over the family (:func:`_check_count`)."""
    claim, N, tokens, q, k = c.claim, c.seq_len, c.tokens, c.q, c.k
    n = len(q)
    if n == 0:                              # no pair: rank 1, forced by nothing
        if claim != 1:
            _fail(f"rank {claim} claimed from no (query, key) pair")
        _check_statement(c, 0, True, Fraction(1))
        if isinstance(X, AllSequences):
            return None, X.n_triples
        _, unknown, n_triples = _scan_family(
            X, tokens.astype(np.uint8), np.zeros(0, dtype=np.int64), final_query,
            count=True, positional=c.positional)
        return unknown, n_triples
    if n == 1:
        _fail(f"rank {claim} claimed from 1 (query, key) pair (a certificate lists none "
              "or at least two)")
    K_claim, D_claim = c.K, c.D
    steps = ([], [], [])
    for i in range(n):
        ov = tokens @ tokens[q[i]]
        others = np.delete(np.arange(n), i)
        if (k[others] == k[i]).any():
            j = int(others[np.argmax(k[others] == k[i])])
            _fail(f"pair ({i}, {j}): key {int(k[j])} is not reached from key {int(k[i])} "
                  f"for query {int(q[i])}")
        prod, missing, used = _row_chains(i, int(k[i]), k[others], c.trees[i], ov, N)
        if prod is None:
            j = int(others[np.argmax(k[others] == missing)]) if (k[others] == missing).any() \
                else int(others[0])
            _fail(f"pair ({i}, {j}): key {int(k[j])} is not reached from key {int(k[i])} "
                  f"for query {int(q[i])}")
        _check_row_claims(i, others, k, prod, ov, K_claim, D_claim)
        steps[0].append(np.full(len(used[0]), i, dtype=np.int64))
        steps[1].append(used[0])
        steps[2].append(used[1])
    proved, value, dominant = _proved_rank(K_claim, n)
    if claim > proved:
        _fail(f"claimed rank {claim} exceeds the {proved} that R5 gives from the ratio bounds")
    if claim < proved:
        _fail(f"claimed rank {claim} is not the {proved} that R5 gives from the ratio bounds")
    _check_statement(c, n, dominant, value)
    # last, the one pass over the family: every sequence the chains use is present, and
    # the family's triples are counted
    si, sa, sb = (np.concatenate(col) for col in steps)
    return _check_family(X, tokens, q, si, sa, sb, N, final_query, positional=c.positional)


def _check_orders(c, X):
    """Every S3 step ``(x; a, b)`` of the certificate's chains is in ``X`` in every order:
    the exact sequence ``b^p a b^(N-2-p) x`` for ``p = 0 .. N-2``, read as rows of
    token ids (one pass over ``X`` in slices)."""
    N, m, tokens, q, k = c.seq_len, c.n_bits, c.tokens, c.q, c.k
    wanted = set()
    for i in range(len(q)):
        ov = tokens @ tokens[q[i]]
        others = np.delete(np.arange(len(q)), i)
        _, _, (a, b) = _row_chains(i, int(k[i]), k[others], c.trees[i], ov, N)
        for x_a, x_b in zip(a.tolist(), b.tolist()):
            for p in range(N - 1):
                wanted.add(tuple([x_b] * p + [x_a] + [x_b] * (N - 2 - p) + [int(q[i])]))
    lookup = {bytes(t): i for i, t in enumerate(np.packbits(tokens.astype(np.uint8), axis=1))}
    for ids, _, _, _ in _family_slots(X, lookup, m):
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
    """What R5 gives from the claimed denominators: ``(rank, value, dominant)``, the
    rank ``floor(n^2 / (n + S)) + 1`` capped at ``n``, or ``n`` when every row (or every
    column) of ``1/K`` sums to at most 1 (``dominant``), with ``value = n^2 / (n + S)``
    (exact)."""
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
    value = Fraction(n * n) / (n + S)
    if rows_max <= 1 or cols_max <= 1:
        return n, value, True
    return min(n, math.floor(value) + 1), value, False


#: chain steps whose multisets are encoded at a time
STEP_CHUNK = 1 << 22


def _check_family(X, tokens, q, si, sa, sb, N, final_query=False, positional=False):
    """Every S1, S2, S3 of the chain steps ``(row, a, b)`` is in the family:
    ``{x, a^(N-1)}``, ``{x, b^(N-1)}`` and ``{x, a, b^(N-2)}`` with ``x`` the row's
    query (``final_query``: as a sequence whose final token is ``x``), encoded slice by
    slice and looked up in one pass over the family (:func:`_scan_family`), which also
    counts its triples: returns ``(unknown, n_triples)`` of that pass."""
    if isinstance(X, AllSequences):         # every sequence of the task is a member
        return None, X.n_triples
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
    found, unknown, n_triples = _scan_family(X, tokens.astype(np.uint8), want, final_query,
                                             count=True, positional=positional)
    if found.all():
        return unknown, n_triples
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
