"""A rank certificate and its JSON: what :func:`~minip_learn.theory.certify` proves.

* :class:`Certificate` -- the (query, key) pairs, their ratio bounds, chains and rank;
  :meth:`~Certificate.to_json`, :meth:`~Certificate.from_json` and
  :meth:`~Certificate.from_file` write and read it;
* :class:`ChainTrees` -- the chain trees of its rows, held as three arrays.

The JSON text is read strictly: every field is checked for its JSON type, range and
size before any arithmetic, and a malformed one is named in a one-line ``ValueError``.
The fields that grow as ``n^2`` are written row by row, and read by numpy when they are
long (:data:`LARGE_JSON_VALUE`, :mod:`~minip_learn.theory._json_rows`). The claims are
checked against a family by :func:`~minip_learn.theory.verify_certificate`, not here.
"""

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ._json_rows import ROW_SCAN_CHUNK, PairRows, parse_rows
from ._selection import reciprocals

__all__ = []  # public home: the package minip_learn.theory

#: what a certificate is about: every position, or the final position only
QUERY_MODES = ("all", "last")

JSON_FORMAT = "minip-learn certificate"
JSON_VERSION = 1


class ChainTree(Mapping):
    """One row's chain tree: token index -> its predecessor (sorted arrays)."""

    def __init__(self, child, parent):
        self.child, self.parent = child, parent

    def _find(self, t):
        pos = int(np.searchsorted(self.child, t))
        if pos < len(self.child) and self.child[pos] == t:
            return pos
        return -1

    def __getitem__(self, t):
        pos = self._find(t)
        if pos < 0:
            raise KeyError(t)
        return int(self.parent[pos])

    def __contains__(self, t):
        return self._find(t) >= 0

    def __iter__(self):
        return iter(self.child.tolist())

    def __len__(self):
        return len(self.child)


class ChainTrees(Sequence):
    """The chain trees of a certificate's rows, held as arrays.

    ``trees[i]`` is a read-only mapping (token index -> predecessor) like a dict;
    the trees of all rows share three arrays (``offsets``, ``child``, ``parent``), so
    a certificate of thousands of rows with a tree of thousands of tokens each stays
    small. Compares equal to a list of dicts with the same contents.
    """

    def __init__(self, offsets, child, parent):
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.child, self.parent = np.asarray(child), np.asarray(parent)

    @classmethod
    def from_dicts(cls, trees):
        """From one mapping per row (sorted by token here)."""
        items = [sorted((int(c), int(p)) for c, p in tree.items()) for tree in trees]
        sizes = [len(t) for t in items]
        flat = np.array([cp for t in items for cp in t], dtype=np.int64).reshape(-1, 2)
        return cls(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]), flat[:, 0],
                   flat[:, 1])

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        a, b = self.offsets[i], self.offsets[i + 1]
        return ChainTree(self.child[a:b], self.parent[a:b])

    def __eq__(self, other):
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(dict(a) == dict(b) for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self):
        return f"ChainTrees(n_rows={len(self)}, n_entries={len(self.child)})"


@dataclass
class Certificate:
    """Why a family of sequences forces a kernel rank (output of :func:`~minip_learn.theory.certify`).

    Attributes
    ----------
    certified_min_rank : int
        Every nonnegative kernel head that solves the family has rank at least this.
    seq_len, n_bits : int
        Shape of the family's sequences.
    tokens : ndarray of shape (n_tokens, n_bits)
        Distinct tokens of the family; chains index into it.
    queries, keys : ndarray of shape (n, n_bits)
        The chosen queries ``x_i`` and their designated keys ``k_i``.
    query_index, key_index : ndarray of shape (n,)
        Their rows in ``tokens``.
    eps : ndarray of shape (n, n)
        ``eps[i, j]`` bounds ``alpha(x_i, k_j) / alpha(x_i, k_i)`` strictly from above
        (``1/K``, rounded to float; the diagonal is 1, the normalised diagonal itself).
    eps_denominators : ndarray of shape (n, n), dtype int64 or object
        The exact integers ``K[i, j]`` with ``eps[i, j] = 1/K[i, j]`` (diagonal 1):
        int64 when they fit, Python integers (dtype object) otherwise.
    overlap_gaps : ndarray of shape (n, n)
        ``D[i, j] = <x_i, k_j> - <x_i, k_i>`` (diagonal 0): the overlap distance each
        chain climbs.
    parents : ChainTrees
        ``parents[i]`` maps a token index to its predecessor on the best chain from
        ``k_i`` in the constraint DAG of ``x_i`` (a tree rooted at ``k_i``); a
        sequence of read-only mappings held as arrays (a list of dicts is accepted).
    frobenius_value : Fraction
        ``n^2 / (n + sum_{i != j} eps_ij^2)``; the rank is strictly above it.
    diagonally_dominant : bool
        Whether every row (or column) of ``eps`` sums to at most 1 off the diagonal,
        which gives rank ``n`` directly.
    n_constraints : int
        Number of ``(x, y, z)`` gap constraints found in the family.
    reason : str
        One line saying where the bound comes from.
    strategy : str
        The search that found the winning set of (query, key) pairs.
    exhaustive : bool
        Whether the exhaustive search ran to completion (the bound is then the best
        that any set of pairs gives with these chains).
    query : {"all", "last"}
        The sequences the bound is about: ``"all"``, heads checked at every position;
        ``"last"``, final-query Min-IP, only at each sequence's final token (every
        sequence a chain step uses has the query last).
    positional : bool
        Whether the bound also holds for position-dependent maps (final-query heads
        whose feature and value maps depend on the token's position): every S3 a chain
        step uses is in the family in every order of its keys, so the constraints hold
        for the kernel summed over key positions (see :ref:`theory-positional`).

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> cert = make_witness_suite(construction="small").certificate
    >>> cert.certified_min_rank, len(cert.queries), cert.seq_len, cert.n_bits
    (8, 10, 3, 24)
    """

    certified_min_rank: int
    seq_len: int
    n_bits: int
    tokens: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    query_index: np.ndarray
    key_index: np.ndarray
    eps: np.ndarray
    eps_denominators: np.ndarray
    overlap_gaps: np.ndarray
    parents: Sequence = field(repr=False)
    frobenius_value: Fraction
    diagonally_dominant: bool
    n_constraints: int
    reason: str
    strategy: str = "none"
    exhaustive: bool = False
    query: str = "all"
    positional: bool = False

    def __int__(self):
        return int(self.certified_min_rank)

    def __repr__(self):
        return (
            f"Certificate(certified_min_rank={self.certified_min_rank}, "
            f"n_queries={len(self.queries)}, seq_len={self.seq_len}, "
            f"n_bits={self.n_bits}, n_constraints={self.n_constraints}"
            + (f", query={self.query!r}" if self.query != "all" else "")
            + (", positional=True)" if self.positional else ")")
        )

    def chain(self, i, j):
        """Token indices of the best chain from ``k_i`` to ``k_j`` for query ``x_i``."""
        root, node = int(self.key_index[i]), int(self.key_index[j])
        path = [node]
        while path[-1] != root:
            path.append(self.parents[i][path[-1]])
        return tuple(reversed(path))

    @property
    def chains(self):
        """``chains[(i, j)]``: :meth:`chain` for every ordered pair ``i != j``."""
        n = len(self.queries)
        return {(i, j): self.chain(i, j) for i in range(n) for j in range(n) if i != j}

    def summary(self):
        """A few lines explaining the certificate."""
        n = len(self.queries)
        lines = [
            f"certified minimum rank: {self.certified_min_rank}",
            f"reason: {self.reason}",
        ]
        if self.query == "last":
            lines.append("final-query Min-IP: every sequence used has its query last")
        if self.positional:
            lines.append("position-dependent maps covered: every S3 used occurs in every "
                         "order of its keys")
        if n >= 2:
            off = ~np.eye(n, dtype=bool)
            depth = [self._depths(i) for i in range(n)]
            lengths = [depth[i][int(self.key_index[j])] for i in range(n) for j in range(n)
                       if i != j]
            lines += [
                f"{n} queries with designated keys; every ordered pair constrained "
                f"(search: {self.strategy}{', exhaustive' if self.exhaustive else ''})",
                f"eps_ij in [{self.eps[off].min():.3g}, {self.eps[off].max():.3g}], "
                f"overlap gaps D_ij in [{self.overlap_gaps[off].min()}, "
                f"{self.overlap_gaps[off].max()}], chain lengths "
                f"{min(lengths)}..{max(lengths)}",
                f"n^2/(n + sum eps_ij^2) = {float(self.frobenius_value):.4f}"
                + ("; diagonally dominant (rank n)" if self.diagonally_dominant else ""),
            ]
        return "\n".join(lines)

    def _depths(self, i):
        par, depth = self.parents[i], {int(self.key_index[i]): 0}

        def d(t):
            if t not in depth:
                depth[t] = d(par[t]) + 1
            return depth[t]

        for t in par:
            d(t)
        return depth

    # ------------------------------------------------------------------ JSON
    def to_json(self, *, indent=None):
        """The certificate as a JSON string, readable by :meth:`from_json`.

        Tokens are written as strings of ``0``/``1``; integers (denominators) are
        exact; the Frobenius value is a fraction ``"p/q"``.

        Parameters
        ----------
        indent : int, default=None
            Passed to :func:`json.dumps`.

        Returns
        -------
        text : str

        Examples
        --------
        >>> from minip_learn.datasets import make_witness_suite
        >>> from minip_learn.theory import Certificate
        >>> cert = make_witness_suite(construction="small").certificate
        >>> Certificate.from_json(cert.to_json()).certified_min_rank
        8
        """
        doc = dict(
            format=JSON_FORMAT, version=JSON_VERSION,
            certified_min_rank=int(self.certified_min_rank), seq_len=int(self.seq_len),
            n_bits=int(self.n_bits),
            tokens=["".join("1" if b else "0" for b in t) for t in self.tokens.tolist()],
            query_index=[int(i) for i in self.query_index],
            key_index=[int(i) for i in self.key_index],
            eps_denominators=_LARGE["eps_denominators"], overlap_gaps=_LARGE["overlap_gaps"],
            parents=_LARGE["parents"],
            frobenius_value=f"{self.frobenius_value.numerator}/{self.frobenius_value.denominator}",
            diagonally_dominant=bool(self.diagonally_dominant),
            n_constraints=int(self.n_constraints), reason=self.reason,
            strategy=self.strategy, exhaustive=bool(self.exhaustive), query=self.query,
            positional=bool(self.positional),
        )
        return _dumps(doc, self, indent)

    @classmethod
    def from_json(cls, text):
        """Read a certificate written by :meth:`to_json`, checking its format strictly.

        Every field is checked for its JSON type, its range and its size before any
        arithmetic: ``format`` must be
        ``"minip-learn certificate"`` and ``version`` one of :data:`JSON_VERSIONS`;
        integers must be JSON integers (not strings, floats or booleans); token indices
        must index ``tokens``, denominators be at least 1 and at most what a chain of
        the certificate's shape gives, overlap gaps lie in ``[-n_bits, n_bits]``;
        unknown fields, duplicate keys, ``NaN``/``Infinity`` and nesting deeper than
        :data:`MAX_JSON_DEPTH` are refused. Reading says nothing about the claims:
        :func:`~minip_learn.theory.verify_certificate` checks them against a family.

        Parameters
        ----------
        text : str or bytes
            The JSON text (bytes: UTF-8).

        Returns
        -------
        certificate : Certificate

        Raises
        ------
        ValueError
            If the text is not JSON or not a certificate of a version this release
            reads; the one-line message names the missing, unknown or malformed field.
        TypeError
            If ``text`` is neither a str nor bytes.

        Examples
        --------
        >>> from minip_learn.theory import Certificate
        >>> Certificate.from_json('{"format": "minip-learn certificate", "version": 7}')
        Traceback (most recent call last):
        ...
        ValueError: certificate field 'version' is 7; this release reads version 1.
        """
        try:
            return cls(**_certificate_fields(_document(text)))
        except _FormatError as exc:
            raise ValueError(str(exc)) from None

    @classmethod
    def from_file(cls, path):
        """Read a certificate from a JSON file (:meth:`from_json`).

        Parameters
        ----------
        path : str or os.PathLike
            The file; a name ending in ``.gz`` is read as gzip-compressed JSON.

        Returns
        -------
        certificate : Certificate

        Raises
        ------
        ValueError
            If the file is not complete gzip data (for ``.gz``), not UTF-8 text or
            not a certificate (:meth:`from_json`); the message names the file.
        OSError
            If the file cannot be opened (e.g. :class:`FileNotFoundError`).
        TypeError
            If ``path`` is not a path.

        Examples
        --------
        >>> import pathlib, tempfile
        >>> from minip_learn.datasets import make_witness_suite
        >>> from minip_learn.theory import Certificate
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "certificate.json"
        >>> _ = path.write_text(make_witness_suite(construction="small").certificate.to_json())
        >>> Certificate.from_file(path).certified_min_rank
        8
        """
        import gzip
        import io
        import os
        import zlib

        name = os.fsdecode(os.fspath(path))
        with open(path, "rb") as raw:
            try:
                if name.endswith(".gz"):
                    with gzip.GzipFile(fileobj=raw) as fh:
                        text = io.TextIOWrapper(fh, encoding="utf-8", newline="").read()
                else:
                    text = io.TextIOWrapper(raw, encoding="utf-8", newline="").read()
            except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise ValueError(f"certificate file {name} is not complete gzip data "
                                 f"({_one_line(exc, 120)}).") from None
            except UnicodeDecodeError as exc:
                raise ValueError(f"certificate file {name} is not UTF-8 text "
                                 f"({_one_line(exc, 120)}).") from None
        if not text.strip():
            raise ValueError(f"certificate file {name} is empty.")
        try:
            return cls(**_certificate_fields(_document(text, from_path=True)))
        except _FormatError as exc:
            raise ValueError(f"certificate file {name}: {exc}") from None



# ------------------------------------------------------------------ large JSON fields
#: placeholders of the fields that grow as n^2 (written and read without Python lists)
_LARGE = {key: f"\x00{key}\x00" for key in ("eps_denominators", "overlap_gaps", "parents")}
#: values longer than this (characters) are read by numpy; shorter ones by json
LARGE_JSON_VALUE = 1 << 20


def _dumps(doc, cert, indent):
    """``json.dumps`` of a certificate's document; the ``n x n`` fields are written
    row by row (the same text ``json.dumps`` gives their nested lists)."""
    rows = {
        "eps_denominators": lambda: ([int(k) for k in row] for row in cert.eps_denominators),
        "overlap_gaps": lambda: (np.asarray(row, dtype=np.int64).tolist()
                                 for row in cert.overlap_gaps),
        "parents": lambda: (_sorted_pairs(par) for par in cert.parents),
    }
    if indent is not None:
        return json.dumps({k: list(rows[k]()) if k in _LARGE else v for k, v in doc.items()},
                          indent=indent)
    text = json.dumps(doc)
    for key, placeholder in _LARGE.items():
        head, tail = text.split(json.dumps(placeholder))
        text = "".join([head, "[", ", ".join(json.dumps(r) for r in rows[key]()), "]", tail])
    return text


def _sorted_pairs(tree):
    """A chain tree as its sorted ``[child, parent]`` pairs."""
    if isinstance(tree, ChainTree):
        return np.stack([tree.child, tree.parent], axis=1).astype(np.int64).tolist()
    return sorted([int(c), int(p)] for c, p in tree.items())


# ------------------------------------------------------------------ reading, strictly
#: the versions :meth:`Certificate.from_json` reads
JSON_VERSIONS = (1,)
#: fields every certificate holds
REQUIRED_FIELDS = (
    "format", "version", "certified_min_rank", "seq_len", "n_bits", "tokens",
    "query_index", "key_index", "eps_denominators", "overlap_gaps", "parents",
    "frobenius_value", "diagonally_dominant", "n_constraints", "reason",
)
#: fields a certificate may lack (written before they existed), with their values then
OPTIONAL_FIELDS = {"strategy": "none", "exhaustive": False, "query": "all",
                   "positional": False}
#: the searches a certificate may name; ``"none"`` when it lists no (query, key) pair
STRATEGIES = ("none", "greedy by degree", "greedy in order of reach",
              "greedy by degree, one key per query", "exhaustive search")
#: deepest nesting read (a certificate nests 4 deep: object, parents, row, pair)
MAX_JSON_DEPTH = 8
#: largest ``seq_len`` and ``n_bits`` read
MAX_DIMENSION = 2**31 - 1
#: largest ``certified_min_rank`` and ``n_constraints`` read
MAX_COUNT = 2**63 - 1
#: largest ``n_constraints`` read (the full task at m = 64 states about 2^197)
MAX_CONSTRAINTS = 2**256
#: longest ``reason`` read (characters)
MAX_REASON_LENGTH = 1000


class _FormatError(ValueError):
    """A certificate text that is not one (its message is final)."""


def _one_line(obj, limit=60):
    """``str(obj)`` on one line, at most ``limit`` characters."""
    text = " ".join(str(obj).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _show(value):
    """A short one-line rendering of a JSON value and its type, for messages."""
    if type(value) is int and abs(value) >= 10**30:
        text = f"an integer of {len(str(abs(value)))} digits"
    else:
        text = _one_line(repr(value), 40)
    return f"{text} ({type(value).__name__})"


def _bad(name, must, value, where=""):
    return _FormatError(f"certificate field {name!r}{where} must be {must}; "
                        f"got {_show(value)}.")


def _document(text, *, from_path=False):
    """The JSON object of a certificate text, its ``format``, ``version`` and field
    names checked (see :meth:`Certificate.from_json`); ``from_path``: the text of a
    file (no hint that a str is read as JSON text)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _FormatError(f"certificate is not UTF-8 text "
                               f"({_one_line(exc, 120)}).") from None
    elif not isinstance(text, str):
        raise TypeError(f"a certificate is read from its JSON text (str or bytes); got "
                        f"{type(text).__name__}.")
    try:
        doc = _loads(text)
    except _FormatError as exc:
        if not from_path and len(text) < 4096 and text.lstrip()[:1] not in ("{", "["):
            raise _FormatError(f"{str(exc).rstrip('.')} (a str or bytes is read as JSON "
                               "text; pass a path such as pathlib.Path to read a file).") from None
        raise
    if not isinstance(doc, dict):
        raise _FormatError(f"not a certificate: expected a JSON object with "
                           f"format={JSON_FORMAT!r}; got {_show(doc)}.")
    if "format" not in doc:
        raise _FormatError(f"not a certificate: the JSON object lacks the field 'format' "
                           f"(expected {JSON_FORMAT!r}).")
    if doc["format"] != JSON_FORMAT or type(doc["format"]) is not str:
        raise _FormatError(f"not a certificate: field 'format' must be {JSON_FORMAT!r}; "
                           f"got {_show(doc['format'])}.")
    versions = " or ".join(str(v) for v in JSON_VERSIONS)
    if "version" not in doc:
        raise _FormatError(f"certificate lacks the field 'version' (this release reads "
                           f"version {versions}).")
    version = doc["version"]
    if type(version) is not int:
        raise _bad("version", f"an integer (this release reads version {versions})", version)
    if version not in JSON_VERSIONS:
        shown = f"{version}" if abs(version) < 10**30 else _show(version)
        raise _FormatError(f"certificate field 'version' is {shown}; this release reads "
                           f"version {versions}.")
    unknown = [k for k in doc if k not in REQUIRED_FIELDS and k not in OPTIONAL_FIELDS]
    if unknown:
        names = ", ".join(_one_line(repr(k), 40) for k in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise _FormatError(f"certificate has the unknown field {names}{more} (version "
                           f"{version} holds {', '.join(REQUIRED_FIELDS)}, "
                           f"{', '.join(OPTIONAL_FIELDS)}).")
    for key in REQUIRED_FIELDS:
        if key not in doc:
            raise _FormatError(f"certificate lacks the field {key!r}.")
    return doc


def _integer(doc, name, lo, hi):
    value = doc[name]
    if type(value) is not int:
        raise _bad(name, "an integer", value)
    if not lo <= value <= hi:
        raise _bad(name, f"from {lo} to {hi}", value)
    return value


def _flag(doc, name):
    value = doc.get(name, OPTIONAL_FIELDS.get(name))
    if type(value) is not bool:
        raise _bad(name, "true or false", value)
    return value


def _choice(doc, name, choices):
    value = doc.get(name, OPTIONAL_FIELDS.get(name))
    if type(value) is not str or value not in choices:
        raise _bad(name, "one of " + ", ".join(repr(c) for c in choices), value)
    return value


def _token_table(doc, m):
    """``tokens``: distinct strings of ``m`` characters 0/1, as a (T, m) uint8 array."""
    toks = doc["tokens"]
    must = f"a list of distinct strings of n_bits={m} characters 0/1"
    if type(toks) is not list:
        raise _bad("tokens", must, toks)
    for i, t in enumerate(toks):
        if type(t) is not str or len(t) != m:
            raise _bad("tokens", must, t, f" entry {i}")
    try:
        flat = np.frombuffer("".join(toks).encode("ascii"), dtype=np.uint8)
    except UnicodeEncodeError:
        flat = None
    if flat is None or (flat - np.uint8(48) > 1).any():
        i = next(i for i, t in enumerate(toks) if set(t) - {"0", "1"})
        raise _bad("tokens", must, toks[i], f" entry {i}")
    tokens = (flat - np.uint8(48)).reshape(len(toks), m)
    if len(toks) > 1:
        packed = np.packbits(tokens, axis=1)
        rows = np.ascontiguousarray(packed).view(f"V{packed.shape[1]}").ravel()
        order = np.argsort(rows, kind="stable")
        same = np.flatnonzero(rows[order][1:] == rows[order][:-1])
        if len(same):
            i, j = sorted(order[same[0]:same[0] + 2].tolist())
            raise _FormatError(f"certificate field 'tokens' must list distinct tokens; "
                               f"entries {i} and {j} are both {toks[i]!r}.")
    return tokens


def _index_list(doc, name, T):
    """A list of token indices ``0 .. T-1`` as int64."""
    value = doc[name]
    if type(value) is not list:
        raise _bad(name, "a list of token indices", value)
    for i, v in enumerate(value):
        if type(v) is not int or not 0 <= v < T:
            raise _bad(name, f"a token index from 0 to {T - 1} (there are {T} tokens)", v,
                       f" entry {i}")
    return np.array(value, dtype=np.int64)


def _square(doc, name, n, lo, hi, diagonal):
    """An ``n x n`` integer field (rows of JSON integers, or the fast reader's int64
    array) with entries in ``[lo, hi]`` off the diagonal and ``diagonal`` on it; int64,
    or Python integers (dtype object) where they do not fit."""
    value = doc[name]
    if isinstance(value, np.ndarray):                     # read by the fast reader
        if value.shape != (n, n):
            raise _FormatError(f"certificate field {name!r} must be {n} rows of {n} integers "
                               f"(one per (query, key) pair); got {value.shape[0]} rows of "
                               f"{value.shape[1]}.")
        M = value
        off = ~np.eye(n, dtype=bool)
        small = M[off]
        bad = (small < lo) | (small > hi) if hi is not None and hi < 2**63 else small < lo
        if bad.any():
            i, j = np.argwhere(off)[int(np.argmax(bad))]
            raise _out_of_range(name, lo, hi, int(M[i, j]), i, j)
    else:
        if type(value) is not list:
            raise _bad(name, f"a list of {n} rows of {n} integers", value)
        for i, row in enumerate(value):
            if type(row) is not list:
                raise _bad(name, f"a list of {n} integers", row, f" row {i}")
        sizes = sorted({len(row) for row in value})
        if len(value) != n or sizes not in ([n], []):
            got = (f" of {sizes[0]}" if len(sizes) == 1 else
                   f" of {sizes[0]} to {sizes[-1]}" if sizes else "")
            raise _FormatError(f"certificate field {name!r} must be {n} rows of {n} integers "
                               f"(one per (query, key) pair); got {len(value)} rows{got}.")
        for i, row in enumerate(value):
            for j, v in enumerate(row):
                if type(v) is not int:
                    raise _bad(name, "an integer", v, f" entry [{i}][{j}]")
                if i != j and (v < lo or (hi is not None and v > hi)):
                    raise _out_of_range(name, lo, hi, v, i, j)
        flat = [v for row in value for v in row]
        fits = not flat or (-2**63 < min(flat) and max(flat) < 2**63)
        M = np.array(flat, dtype=np.int64 if fits else object).reshape(n, n)
    diag = np.diagonal(M)
    if n and (diag != diagonal).any():
        i = int(np.argmax(diag != diagonal))
        raise _bad(name, f"{diagonal} on the diagonal", int(diag[i]), f" entry [{i}][{i}]")
    return M


def _out_of_range(name, lo, hi, value, i, j):
    why = (" (the largest ratio denominator a chain of this seq_len and n_bits gives)"
           if name == "eps_denominators" else " (overlap gaps lie within +-n_bits)")
    return _FormatError(f"certificate field {name!r} entry [{i}][{j}] must be from {lo} to "
                        f"{hi}{why}; got {_show(value)}." if hi is not None else
                        f"certificate field {name!r} entry [{i}][{j}] must be at least {lo}; "
                        f"got {_show(value)}.")


def _chain_trees(doc, n, T):
    """``parents``: ``n`` lists of ``[child, parent]`` token-index pairs, a child at most
    once in a row, as :class:`ChainTrees` (each row sorted by child)."""
    value = doc["parents"]
    must = f"a token index from 0 to {T - 1}"
    if isinstance(value, PairRows):                    # read by the fast reader
        offsets, pairs = value.offsets, value.pairs
        if len(offsets) - 1 != n:
            raise _FormatError(f"certificate field 'parents' must be {n} rows (one per "
                               f"(query, key) pair); got {len(offsets) - 1}.")
        bad = (pairs < 0) | (pairs >= T)
        if bad.any():
            e, s = np.argwhere(bad)[0]
            i = int(np.searchsorted(offsets, e, side="right")) - 1
            raise _bad("parents", must, int(pairs[e, s]), f" row {i} pair {e - offsets[i]}")
    else:
        if type(value) is not list:
            raise _bad("parents", f"a list of {n} rows (one per (query, key) pair)", value)
        if len(value) != n:
            raise _FormatError(f"certificate field 'parents' must be {n} rows (one per "
                               f"(query, key) pair); got {len(value)}.")
        flat, sizes = [], []
        for i, row in enumerate(value):
            if type(row) is not list:
                raise _bad("parents", "a list of [child, parent] pairs", row, f" row {i}")
            for e, pair in enumerate(row):
                if type(pair) is not list or len(pair) != 2:
                    raise _bad("parents", "a [child, parent] pair", pair, f" row {i} pair {e}")
                for v in pair:
                    if type(v) is not int or not 0 <= v < T:
                        raise _bad("parents", must, v, f" row {i} pair {e}")
                flat += pair
            sizes.append(len(row))
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        pairs = np.array(flat, dtype=np.int64).reshape(-1, 2)
    child, parent = pairs[:, 0], pairs[:, 1]
    start = np.zeros(len(child), dtype=bool)            # the first pair of each row
    start[offsets[:-1][offsets[:-1] < len(child)]] = True
    if not (start[1:] | (child[1:] > child[:-1])).all():   # not as written: sorted here
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
        order = np.lexsort((child, rows))
        child, parent = child[order], parent[order]
    twice = np.flatnonzero(~start[1:] & (child[1:] == child[:-1]))
    if len(twice):
        i = int(np.searchsorted(offsets, twice[0] + 1, side="right")) - 1
        t = int(child[twice[0]])
        raise _FormatError(f"certificate field 'parents' row {i} gives token {t} two "
                           "parents; a chain tree gives each token one.")
    return ChainTrees(offsets, child, parent)


def _fraction(doc):
    """``frobenius_value``: ``"p/q"`` in lowest terms, ``p >= 0``, ``q >= 1``."""
    value = doc["frobenius_value"]
    must = 'a fraction "p/q" of integers p >= 0, q >= 1 in lowest terms'
    m = re.fullmatch(r"(0|[1-9][0-9]*)/([1-9][0-9]*)", value) if type(value) is str else None
    if m is None:
        raise _bad("frobenius_value", must, value)
    try:
        p, q = int(m.group(1)), int(m.group(2))
    except ValueError:                      # beyond Python's integer-string limit
        raise _bad("frobenius_value", must, value) from None
    if math.gcd(p, q) != 1:
        raise _bad("frobenius_value", must, value)
    return Fraction(p, q)


def _chain_limit(N, m):
    """The largest denominator a chain of ``seq_len=N`` over ``m`` bits can give: at
    most ``m // 2`` steps (each climbs the overlap by >= 2), each ``(N-2)(g-1) <=
    (N-2)(m-1)``; None when it exceeds every integer JSON is read with (4,300 digits)."""
    base, steps = max(N - 2, 0) * max(m - 1, 0), m // 2
    if base > 1 and steps * (base.bit_length() - 1) > 15000:
        return None
    return base ** steps


def _certificate_fields(doc):
    """The :class:`Certificate` arguments of a checked document (:func:`_document`)."""
    N = _integer(doc, "seq_len", 1, MAX_DIMENSION)
    m = _integer(doc, "n_bits", 1, MAX_DIMENSION)
    tokens = _token_table(doc, m)
    T = len(tokens)
    qi, ki = _index_list(doc, "query_index", T), _index_list(doc, "key_index", T)
    n = len(qi)
    if len(ki) != n:
        raise _FormatError(f"certificate fields 'query_index' and 'key_index' must have "
                           f"the same length (one entry per pair); got {n} and {len(ki)}.")
    rank = _integer(doc, "certified_min_rank", 1, MAX_COUNT)
    K = _square(doc, "eps_denominators", n, 1, _chain_limit(N, m), 1)
    D = _square(doc, "overlap_gaps", n, -m, m, 0)
    parents = _chain_trees(doc, n, T)
    value = _fraction(doc)
    dominant = _flag(doc, "diagonally_dominant")
    n_constraints = _integer(doc, "n_constraints", 0, MAX_CONSTRAINTS)
    reason = doc["reason"]
    if (type(reason) is not str or len(reason) > MAX_REASON_LENGTH
            or len(reason.splitlines()) > 1):
        raise _bad("reason", f"one line of text (at most {MAX_REASON_LENGTH} characters)",
                   reason)
    strategy = _choice(doc, "strategy", STRATEGIES)
    exhaustive = _flag(doc, "exhaustive")
    query = _choice(doc, "query", QUERY_MODES)
    positional = _flag(doc, "positional")
    if positional and query != "last":
        raise _FormatError("certificate field 'positional' is true, which needs query "
                           f"'last' (position-dependent maps are bounded through the "
                           f"final query); got query {query!r}.")
    K = int64_if_fits(K) if K.dtype == object else K
    eps = reciprocals(K).reshape(n, n)
    if n:
        np.fill_diagonal(eps, 1.0)
    return dict(
        certified_min_rank=rank, seq_len=N, n_bits=m, tokens=tokens,
        queries=tokens[qi], keys=tokens[ki], query_index=qi, key_index=ki, eps=eps,
        eps_denominators=K, overlap_gaps=D, parents=parents, frobenius_value=value,
        diagonally_dominant=dominant, n_constraints=n_constraints, reason=reason,
        strategy=strategy, exhaustive=exhaustive, query=query, positional=positional,
    )


#: a JSON string literal
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
#: the key of an ``n x n`` field followed by a list
_LARGE_KEY = re.compile(r'"(eps_denominators|overlap_gaps|parents)"[ \t\n\r]*:[ \t\n\r]*(?=\[)')
#: the first character that cannot be in a list of integers
_NOT_ROWS = re.compile(r"[^\[\]0-9, \t\n\r-]")


def _check_depth(text):
    """Refuse JSON nested deeper than :data:`MAX_JSON_DEPTH` (strings skipped)."""
    if '"' in text:
        text = _JSON_STRING.sub('""', text)
    depth = 0
    for a in range(0, len(text), ROW_SCAN_CHUNK):
        c = np.frombuffer(text[a:a + ROW_SCAN_CHUNK].encode("utf-8", "surrogatepass"),
                          dtype=np.uint8)
        step = ((c == 91) | (c == 123)).astype(np.int8) - ((c == 93) | (c == 125))
        run = np.cumsum(step, dtype=np.int64) + depth
        if len(run):
            if run.max() > MAX_JSON_DEPTH:
                raise _FormatError(f"certificate is nested deeper than {MAX_JSON_DEPTH} "
                                   "levels (its JSON nests 4).")
            depth = int(run[-1])


def _strict_json(text):
    """``json.loads`` refusing duplicate keys, ``NaN``/``Infinity`` and deep nesting;
    also the number of object values that are placeholders of :data:`_LARGE`."""
    _check_depth(text)
    placeholders = set(_LARGE.values())
    seen = 0

    def pairs_hook(pairs):
        nonlocal seen
        obj = {}
        for key, value in pairs:
            if key in obj:
                raise _FormatError(f"certificate is not valid JSON for this format: the "
                                   f"key {_one_line(repr(key), 40)} appears twice in an "
                                   "object.")
            if type(value) is str and value in placeholders:
                seen += 1
            obj[key] = value
        return obj

    def constant(name):
        raise _FormatError(f"certificate is not valid JSON: {name} is not a number JSON "
                           "allows.")

    try:
        doc = json.loads(text, object_pairs_hook=pairs_hook, parse_constant=constant)
    except _FormatError:
        raise
    except ValueError as exc:               # JSONDecodeError, or an integer too long
        raise _FormatError(f"certificate is not valid JSON: {_one_line(exc, 120)}.") from None
    return doc, seen


def _loads(text):
    """The JSON value of a certificate text, read strictly (:func:`_strict_json`).

    Values of the ``n x n`` fields longer than :data:`LARGE_JSON_VALUE` characters are
    read by numpy (``eps_denominators`` and ``overlap_gaps`` as int64 arrays, ``parents``
    as :class:`~minip_learn.theory._json_rows.PairRows`) when
    :func:`~minip_learn.theory._json_rows.parse_rows` finds them to be exactly nested
    lists of integers of at most 18 digits and they are values of the top-level object;
    anything else goes through ``json``, which then decides.
    """
    arrays, pieces, pos, n_read = {}, [], 0, 0
    if len(text) >= LARGE_JSON_VALUE:
        for m in _LARGE_KEY.finditer(text):
            if m.start() < pos:
                continue
            stop = _NOT_ROWS.search(text, m.end())
            end = text.rfind("]", m.end(), stop.start() if stop else len(text)) + 1
            if end - m.end() < LARGE_JSON_VALUE:
                continue
            value = parse_rows(text[m.end():end], pairs=m.group(1) == "parents")
            if value is None:
                continue
            arrays.setdefault(m.group(1), []).append(value)
            pieces += [text[pos:m.end()], json.dumps(_LARGE[m.group(1)])]
            pos, n_read = end, n_read + 1
    if not pieces:
        return _strict_json(text)[0]
    try:
        doc, seen = _strict_json("".join(pieces) + text[pos:])
    except _FormatError:                    # json's own message, about the text itself
        return _strict_json(text)[0]
    top = isinstance(doc, dict) and all(
        len(values) == 1 and doc.get(key) == _LARGE[key] for key, values in arrays.items())
    if not top or seen != n_read:           # not (only) top-level values: json decides
        return _strict_json(text)[0]
    doc.update({key: values[0] for key, values in arrays.items()})
    return doc


def int64_if_fits(K):
    """An object array of integers as int64 when every entry fits, else unchanged."""
    if all(int(k).bit_length() < 63 for k in K.ravel()):
        return K.astype(np.int64)
    return K

