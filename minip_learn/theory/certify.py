"""Certified minimum rank of a family of Min-IP sequences (numpy only).

:func:`certify` reads a family of sequences and proves, from the sequences alone, a
lower bound on the rank of every nonnegative kernel head that solves the whole family
(see the theory page, :ref:`theory-r4` and :ref:`theory-r5`):

1. **Constraints (R4).** For a query token ``x`` and keys ``y, z`` with
   ``g = <x,z> - <x,y> >= 2`` the family constrains ``alpha(x,z) / alpha(x,y) <
   1/((N-2)(g-1))`` iff it contains, up to the order of the tokens (heads are
   permutation-equivariant: a query output depends only on the query token and the
   multiset of the sequence), the three multisets
   ``S1 = {x, y^(N-1)}``, ``S2 = {x, z^(N-1)}`` and ``S3 = {x, y, z^(N-2)}``.
   Tokens may coincide with ``x`` (``y = x`` or ``z = x``); the derivation does not
   need them distinct. Only exactly these multiplicities are used (conservative).
   With ``positional=True`` (final-query families held as arrays) a triple counts
   only when S3 occurs in every order of its keys: the constraint then binds the
   final query's kernel summed over the key positions, a nonnegative kernel of the
   same rank, so the certificate covers position-dependent maps too.
2. **Chains.** For each query the constraints form a DAG (overlap with ``x`` strictly
   increases along an edge); ratio bounds multiply along paths, and the best bound
   from a key to another is the path with the largest product of denominators.
3. **Selection.** A *candidate* is a pair (query ``x``, designated key ``s``); two
   candidates are compatible when each one's key is reachable from the other's in
   the other's DAG. A certificate is a set of mutually compatible candidates (a
   clique). Several searches are run -- greedy by degree, greedy in order of reach,
   greedy on one candidate per query, and an exhaustive branch and bound where the
   candidate set is small -- each followed by dropping rows while that improves the
   bound, and the best certificate wins.
4. **Rank (R5).** The per-pair bound ``r > n^2 / (n + sum eps_ij^2)`` (and ``r >= n``
   under diagonal dominance): :func:`~minip_learn.theory.bounds.rank_from_denominators`
   for the certificate, :func:`~minip_learn.theory.bounds.rank_from_sums` for every
   estimate and search bound.

Every ratio bound is ``1/K`` with an integer ``K`` (products of ``(N-2)(g-1)``): the
certified integer is computed in exact rational arithmetic, and the floats that steer
the searches are decided near an integer from these exact values
(:func:`~minip_learn.theory.bounds.resolve_near_integer`). A certificate can be written to
JSON (:meth:`Certificate.to_json`) and checked by
:func:`~minip_learn.theory.verify_certificate`, which shares no code with this module.
"""

import itertools
import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .._memory import trim_heap
from .._validation import check_sequences
from ..compact import is_compact, smallest_int_dtype
from ._constraints import (
    Reach,
    constraints,
    constraints_reference,
    fill_from,
    isin,
    reach,
    reach_reference,
)
from ._selection import prune_rows, reciprocals
from .bounds import integer_above, rank_from_denominators, rank_from_sums, resolve_near_integer

__all__ = ["Certificate", "ChainTrees", "certify", "family_constraints"]

#: candidate sets up to this size are searched exhaustively (branch and bound)
EXACT_MAX_CANDIDATES = 64
#: node budget of the exhaustive search (beyond it the best clique found is kept)
EXACT_MAX_NODES = 20000
#: largest candidate graph held as a dense matrix; larger graphs keep, per query, the
#: candidates of highest degree
MAX_DENSE_CANDIDATES = 8000

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
    """Why a family of sequences forces a kernel rank (output of :func:`certify`).

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
        try:
            return cls.from_json(text)
        except ValueError as exc:
            raise ValueError(f"certificate file {name}: {exc}") from None


def _overlap_gaps(ov, qi, ki, m):
    """``D[i, j] = <x_i, k_j> - <x_i, k_i>`` (int16 for up to 32,767 bits), computed a
    block of rows at a time."""
    n = len(qi)
    D = np.empty((n, n), dtype=smallest_int_dtype(max(m, 2**8), -max(m, 2**8)))
    own = ov(qi, ki)
    step = max(1, GRAPH_CHUNK // max(n, 1))
    for a in range(0, n, step):
        q = qi[a:a + step]
        D[a:a + step] = (ov(np.repeat(q, n), np.tile(ki, len(q))).reshape(len(q), n)
                         - own[a:a + step, None])
    return D


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
#: longest ``reason`` read (characters)
MAX_REASON_LENGTH = 1000
#: characters of an ``n x n`` field scanned at a time by the fast reader
ROW_SCAN_CHUNK = 1 << 24


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


def _document(text):
    """The JSON object of a certificate text, its ``format``, ``version`` and field
    names checked (see :meth:`Certificate.from_json`)."""
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
        if len(text) < 4096 and text.lstrip()[:1] not in ("{", "["):
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


class _PairRows:
    """``parents`` as the fast reader gives it: row offsets and (child, parent) pairs."""

    def __init__(self, offsets, pairs):
        self.offsets, self.pairs = offsets, pairs


def _chain_trees(doc, n, T):
    """``parents``: ``n`` lists of ``[child, parent]`` token-index pairs, a child at most
    once in a row, as :class:`ChainTrees` (each row sorted by child)."""
    value = doc["parents"]
    must = f"a token index from 0 to {T - 1}"
    if isinstance(value, _PairRows):                    # read by the fast reader
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
    n_constraints = _integer(doc, "n_constraints", 0, MAX_COUNT)
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
    K = _as_int64_if_fits(K) if K.dtype == object else K
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
#: the characters of a list of integers: 1 digit, 2 minus, 3 bracket, 4 comma, 5 space
_ROW_CHARS = np.zeros(256, dtype=np.uint8)
_ROW_CHARS[np.frombuffer(b"0123456789", dtype=np.uint8)] = 1
_ROW_CHARS[ord("-")] = 2
_ROW_CHARS[[ord("["), ord("]")]] = 3
_ROW_CHARS[ord(",")] = 4
_ROW_CHARS[[ord(" "), ord("\t"), ord("\n"), ord("\r")]] = 5
_BRACKETS_AS_SPACES = bytes.maketrans(b"[]", b"  ")


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
    seen = [0]

    def pairs_hook(pairs):
        obj = {}
        for key, value in pairs:
            if key in obj:
                raise _FormatError(f"certificate is not valid JSON for this format: the "
                                   f"key {_one_line(repr(key), 40)} appears twice in an "
                                   "object.")
            if type(value) is str and value in placeholders:
                seen[0] += 1
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
    return doc, seen[0]


def _loads(text):
    """The JSON value of a certificate text, read strictly (:func:`_strict_json`).

    Values of the ``n x n`` fields longer than :data:`LARGE_JSON_VALUE` characters are
    read by numpy (``eps_denominators`` and ``overlap_gaps`` as int64 arrays, ``parents``
    as :class:`_PairRows`) when :func:`_parse_rows` finds them to be exactly nested
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
            value = _parse_rows(text[m.end():end], pairs=m.group(1) == "parents")
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


def _scan_numbers(text):
    """A piece of a JSON list of integers as ``(symbols, integers)``: the symbols keep
    ``[``, ``]`` and ``,`` and write each integer as ``n`` (whitespace dropped); None
    when the piece holds anything else, an integer JSON does not allow (a leading zero,
    a lone ``-``) or one of 19 digits or more."""
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        return None
    c = np.frombuffer(raw, dtype=np.uint8)
    kind = _ROW_CHARS[c]
    if not kind.all():
        return None
    digit = kind == 1
    first = digit.copy()                    # the first digit of each integer
    first[1:] &= ~digit[:-1]
    last = digit.copy()                     # and its last
    last[:-1] &= ~digit[1:]
    starts, ends = np.flatnonzero(first), np.flatnonzero(last)
    if ((ends - starts >= 18) | ((c[starts] == 48) & (ends > starts))).any():
        return None                         # 19 digits or more, or a leading zero
    minus = np.flatnonzero(kind == 2)
    if len(minus) and not (np.isin(minus + 1, starts).all()
                           and (minus == 0).sum() + (kind[minus[minus > 0] - 1] > 2).sum()
                           == len(minus)):
        return None                         # a minus not right before an integer
    keep = (kind == 3) | (kind == 4) | first
    symbols = c[keep]
    symbols[first[keep]] = ord("n")
    values = np.zeros(0, dtype=np.int64)
    if len(starts):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                values = np.fromstring(raw.translate(_BRACKETS_AS_SPACES), dtype=np.int64,
                                       sep=",")
            except (ValueError, DeprecationWarning):
                return None
        if len(values) != len(starts):
            return None
    return symbols.tobytes(), values


def _parse_rows(value, *, pairs):
    """A JSON list of rows of integers (``pairs``: rows of ``[child, parent]`` pairs)
    read with numpy: an (n, k) int64 array, or :class:`_PairRows`; None if the text is
    anything else (empty rows included), or holds an integer of 19 digits or more.

    The text is scanned in pieces of about :data:`ROW_SCAN_CHUNK` characters cut at
    commas; its structure is checked exactly on the symbols :func:`_scan_numbers` gives.
    """
    symbols, numbers = [], []
    a, end = 0, len(value)
    while a < end:
        b = end if end - a <= ROW_SCAN_CHUNK else value.find(",", a + ROW_SCAN_CHUNK)
        b = end if b < 0 else b
        part = _scan_numbers(value[a:b])
        if part is None:
            return None
        symbols.append(part[0])
        numbers.append(part[1])
        if b < end:
            symbols.append(b",")
        a = b + 1
    S = b"".join(symbols)
    values = np.concatenate(numbers)
    if pairs:
        S = S.replace(b"[n,n]", b"p")
        if b"n" in S or not (S.startswith(b"[[") and S.endswith(b"]]")):
            return None
        sizes = []
        for row in S[2:-2].split(b"],["):
            k = (len(row) + 1) // 2
            if not k or row != b"p" + b",p" * (k - 1):
                return None
            sizes.append(k)
        if 2 * sum(sizes) != len(values):
            return None
        return _PairRows(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]),
                         values.reshape(-1, 2))
    width = S.count(b"n", 0, max(S.find(b"]"), 0))
    if not width or len(values) % width:
        return None
    row = b"[" + b"n," * (width - 1) + b"n]"
    if S != b"[" + b",".join([row] * (len(values) // width)) + b"]":
        return None
    return values.reshape(-1, width)


def _as_int64_if_fits(K):
    """An object array of integers as int64 when every entry fits, else unchanged."""
    if all(int(k).bit_length() < 63 for k in K.ravel()):
        return K.astype(np.int64)
    return K


def _check_query(query):
    if not isinstance(query, str) or query not in QUERY_MODES:
        raise ValueError(f"query must be one of {list(QUERY_MODES)}; got {query!r}.")
    return query


def _check_positional(positional, query, X):
    """The ``ValueError`` of a ``positional`` certificate that cannot be had."""
    if not isinstance(positional, (bool, np.bool_)):
        raise ValueError(f"positional must be True or False; got {positional!r}.")
    if positional and query != "last":
        raise ValueError('positional=True needs query="last": position-dependent maps are '
                         "bounded through the final query's kernel summed over key "
                         f"positions; got query={query!r}.")
    if positional and is_compact(X):
        raise ValueError("positional=True needs the sequences' order: pass X as an array "
                         "(a CompactFamily holds multisets only).")


def _trivial(tokens, N, reason, n_constraints=0, query="all", positional=False):
    m = tokens.shape[1]
    empty = np.zeros((0, m), dtype=np.uint8)
    return Certificate(
        certified_min_rank=1, seq_len=N, n_bits=m, tokens=tokens,
        queries=empty, keys=empty,
        query_index=np.zeros(0, dtype=np.int64), key_index=np.zeros(0, dtype=np.int64),
        eps=np.zeros((0, 0)), eps_denominators=np.zeros((0, 0), dtype=np.int64),
        overlap_gaps=np.zeros((0, 0), dtype=np.int64), parents=ChainTrees([0], [], []),
        frobenius_value=Fraction(1), diagonally_dominant=True,
        n_constraints=n_constraints, reason=reason, exhaustive=True, query=query,
        positional=positional,
    )


def family_constraints(X, *, query="all", positional=False):
    """All gap-domination constraints (see :ref:`theory-r4`) a family contains.

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits)
        Binary sequences, ``seq_len >= 3`` (shorter families contain none).
    query : {"all", "last"}, default="all"
        ``"last"``: final-query Min-IP, only the constraints whose query token is the
        final token of each of S1, S2 and S3 (the only output a final-query head is
        held to).
    positional : bool, default=False
        Only the constraints whose S3 occurs in every order of its keys (with
        ``query="last"``; ``X`` an array): those that also bind position-dependent
        maps (:ref:`theory-positional`).

    Returns
    -------
    tokens : ndarray of shape (n_tokens, n_bits)
        Distinct tokens (``np.unique`` order).
    edges : dict
        ``edges[x]`` is a list of ``(y, z, K)``: token indices such that the family
        holds S1, S2 and S3 for query ``x`` and keys ``y, z`` with gap ``g >= 2``, so
        ``alpha(x, z) < alpha(x, y) / K`` with ``K = (N-2)(g-1)``.
    overlap : callable
        ``overlap(a, b)`` is ``<tokens[a], tokens[b]>``.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.theory import family_constraints
    >>> x, y, z = [1, 1, 1, 0], [0, 0, 0, 1], [1, 1, 0, 1]
    >>> X = np.array([[x, y, y], [x, z, z], [x, y, z]])
    >>> tokens, edges, overlap = family_constraints(X)
    >>> [(overlap(q, a), overlap(q, b), K) for q in edges for a, b, K in edges[q]]
    [(0, 2, 1)]
    """
    query = _check_query(query)
    if not is_compact(X):
        X, _ = check_sequences(X, binary=True)
    _check_positional(positional, query, X)
    cons = constraints(X, query, positional)
    edges = {}
    for x, y, z, K in zip(cons.x.tolist(), cons.y.tolist(), cons.z.tolist(), cons.K.tolist()):
        edges.setdefault(x, []).append((y, z, K))
    T = cons.tokens.astype(np.int64)

    def overlap(a, b):
        return int(T[a] @ T[b])

    return cons.tokens, edges, overlap


# --------------------------------------------------------------------------- candidates
def _candidate_runs(R, T):
    """Candidates of the rows of ``R`` (sorted by (x, s, t)): the code ``x * T + s`` of
    each run of equal (x, s) and its length (the number of keys it reaches)."""
    codes, firsts, prev = [], [], None
    for a in range(0, len(R), GRAPH_CHUNK):     # in slices: no code per row at once
        vcode = R.x[a:a + GRAPH_CHUNK].astype(np.int64) * T + R.s[a:a + GRAPH_CHUNK]
        new = np.ones(len(vcode), dtype=bool)
        new[1:] = vcode[1:] != vcode[:-1]
        if prev is not None:
            new[0] = vcode[0] != prev
        prev = vcode[-1]
        first = np.flatnonzero(new)
        codes.append(vcode[first])
        firsts.append(first + a)
    if not codes:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = np.concatenate(firsts)
    return np.concatenate(codes), np.diff(np.append(first, len(R)))


#: rows of the chains (or half-edges) handled at a time when the candidate graph is built
GRAPH_CHUNK = 1 << 22


def _restrict(cons, R, *, primary=False, min_reach=0):
    """The rows of ``R`` of the candidates that may take part in the search.

    ``primary``: one candidate per query (largest reach, then the key of least
    overlap with the query, then the smaller key). ``min_reach``: the candidates that
    reach at least that many keys -- a set of ``k`` mutually compatible candidates has
    distinct keys, each reaching the ``k - 1`` others, so a set certifying more than
    ``r`` needs candidates reaching ``>= r`` keys.
    """
    T = np.int64(len(cons.tokens))
    codes, count = _candidate_runs(R, T)
    x, s = codes // T, codes % T
    if primary:
        order = np.lexsort((s, cons.overlap(x, s), -count, x))
        first = np.ones(len(order), dtype=bool)
        first[1:] = x[order][1:] != x[order][:-1]
        sel = np.zeros(len(codes), dtype=bool)
        sel[order[first]] = True
    else:
        sel = count >= min_reach
    if sel.all():
        return R
    rows = np.repeat(sel, count)
    return Reach(*(a[rows] for a in (R.x, R.s, R.t, R.K, R.pred)))


def _slices(n):
    return (slice(a, a + GRAPH_CHUNK) for a in range(0, n, GRAPH_CHUNK))


class _Graph:
    """Candidates (query, key) and their compatibility, from the best chains.

    Built from the rows of ``R`` slice by slice; the half-edges are held as one
    int64 code ``u V + w`` each (sorted) with their denominators.
    """

    def __init__(self, cons, R):
        T = np.int64(len(cons.tokens))
        # the rows of R are sorted by (x, s, t): a candidate is a run of equal (x, s)
        codes, count = _candidate_runs(R, T)
        self.x, self.s = codes // T, codes % T
        del codes
        self.reach_size = count
        self.overlap = cons.overlap(self.x, self.s)
        V = self.V = len(self.x)
        Vi = np.int64(V)
        # half-edges u -> w: w's key is reachable from u's key in u's DAG; with small
        # denominators a half-edge and its K are packed in one int64 (sorted in place)
        by_src = np.argsort(self.s, kind="stable")
        src = self.s[by_src]
        start = np.cumsum(count) - count    # the first row of every candidate
        packed = (R.K.dtype != object and float(V) * V < 2**31
                  and (not len(R.K) or int(R.K.max()) < 2**31))
        halves, Ks = [], []
        for sl in _slices(len(R)):
            t = R.t[sl]
            lo = np.searchsorted(src, t, side="left")
            cnt = np.searchsorted(src, t, side="right") - lo
            rows = np.flatnonzero(cnt)      # rows that reach some candidate's key
            lo, cnt = lo[rows], cnt[rows]
            rep = np.repeat(np.arange(len(rows)), cnt)
            offs = np.cumsum(cnt) - cnt
            w = by_src[lo[rep] + (np.arange(len(rep)) - offs[rep])]
            u = (np.searchsorted(start, rows + sl.start, side="right") - 1)[rep]
            K = R.K[sl][rows][rep]
            del t, lo, cnt, rows, rep, offs
            other = self.x[u] != self.x[w]
            half = u[other] * Vi + w[other]
            if packed:
                halves.append((half << 32) | K[other].astype(np.int64))
            else:
                halves.append(half)
                Ks.append(K[other])
        del by_src, src, start
        if not halves:
            half, K = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=R.K.dtype)
        elif packed:
            half = fill_from(halves)
            half.sort()
            K = np.empty(len(half), dtype=R.K.dtype)
            for sl in _slices(len(half)):
                K[sl] = half[sl] & 0xFFFFFFFF
            np.right_shift(half, 32, out=half)
        else:
            half, K = fill_from(halves), fill_from(Ks)
            order = np.argsort(half, kind="stable")
            half, K = half[order], K[order]
            del order
        both = np.empty(len(half), dtype=bool)
        for sl in _slices(len(half)):       # keep the pairs compatible both ways
            h = half[sl]
            both[sl] = isin((h % Vi) * Vi + h // Vi, half)
        if not both.all():
            half, K = half[both], K[both]
        del both
        self.half, self.K = half, K
        self.degree = np.zeros(V, dtype=np.int64)
        for sl in _slices(len(half)):
            self.degree += np.bincount(half[sl] // Vi, minlength=V)
        # priority: larger reach, then lower overlap with the query, then indices
        self.priority = np.lexsort((self.s, self.x, self.overlap, -self.reach_size))

    def denominators(self, clique):
        """The ``n x n`` denominators of a clique (diagonal 1), a block of rows at a time."""
        c = np.asarray(clique, dtype=np.int64)
        n = len(c)
        K = np.ones((n, n), dtype=self.K.dtype)
        if n < 2 or not len(self.half):
            return K
        step = max(1, GRAPH_CHUNK // n)
        for a in range(0, n, step):
            pos = np.searchsorted(self.half, c[a:a + step, None] * np.int64(self.V) + c)
            pos[pos >= len(self.half)] = 0
            block = self.K[pos]
            i = np.arange(len(block))
            block[i, a + i] = 1             # the diagonal
            K[a:a + step] = block
        return K

    def dense(self, keep):
        idx = np.full(self.V, -1, dtype=np.int64)
        idx[keep] = np.arange(len(keep))
        A = np.zeros((len(keep), len(keep)), dtype=bool)
        for sl in _slices(len(self.half)):
            h = self.half[sl]
            u, w = idx[h // self.V], idx[h % self.V]
            ok = (u >= 0) & (w >= 0)
            A[u[ok], w[ok]] = True
        return A


def _greedy_degree(A, priority_rank, allowed=None):
    V = len(A)
    P = np.ones(V, dtype=bool) if allowed is None else allowed.copy()
    deg = A[:, P].sum(axis=1).astype(np.int64)
    chosen = []
    while P.any():
        score = np.where(P, deg * (V + 1) - priority_rank, np.iinfo(np.int64).min)
        v = int(np.argmax(score))
        chosen.append(v)
        newP = P & A[v]
        removed = P & ~newP
        deg -= A[:, removed].sum(axis=1)
        P = newP
    return chosen


def _greedy_order(A, order):
    ok = np.ones(len(A), dtype=bool)
    chosen = []
    for v in order:
        if ok[v]:
            chosen.append(int(v))
            ok &= A[v]
    return chosen


def _exact_sum(values):
    """Exact sum of Fractions, over their least common denominator."""
    values = list(values)
    if not values:
        return Fraction(0)
    L = math.lcm(*(v.denominator for v in values))
    return Fraction(sum(v.numerator * (L // v.denominator) for v in values), L)


def _clique_sum_sq(C, Kinv):
    """Exact ``sum eps_uv^2`` over the ordered pairs of the clique ``C``."""
    return _exact_sum(Kinv[u][v] ** 2 for u in C for v in C if u != v)


def _clique_max_row_sum(C, Kinv):
    return max((_exact_sum(Kinv[u][v] for v in C if v != u) for u in C), default=Fraction(0))


def _clique_max_col_sum(C, Kinv):
    return max((_exact_sum(Kinv[u][v] for u in C if u != v) for v in C), default=Fraction(0))


def _exact_rank(C, Kinv):
    return rank_from_sums(len(C), _clique_sum_sq(C, Kinv), _clique_max_row_sum(C, Kinv),
                          _clique_max_col_sum(C, Kinv))[0]


def _upper_bound(n, S, n_max, e_min, exact_sum_sq, exact_e_min, largest_dominant):
    """Largest rank any clique of ``n..n_max`` members could certify.

    Every pair added to a clique of ``n`` members (sum of squared bounds ``S``) adds
    at least ``e_min^2``, so a clique of ``k`` members has ``S_k >= S + (k(k-1) -
    n(n-1)) e_min^2``; ``k^2 / (k + S_k)`` grows with ``k`` (``S >= n(n-1) e_min^2``),
    so the Frobenius bound is largest at ``n_max``. Dominance can give ``k`` only while
    ``(k-1) e_min <= 1``, i.e. up to ``largest_dominant = integer_above(1 / e_min)``.
    ``exact_sum_sq()`` and ``exact_e_min`` are ``S`` and ``e_min`` as Fractions.
    """
    added = n_max * (n_max - 1) - n * (n - 1)
    best = max(n, rank_from_sums(
        n_max, S + added * e_min * e_min, (n_max - 1) * e_min,
        exact_sum_sq=lambda: exact_sum_sq() + added * exact_e_min ** 2,
        exact_max_row_sum=lambda: (n_max - 1) * exact_e_min,
    )[0])
    if best < n_max and largest_dominant >= n:   # n_max members are not dominant
        best = max(best, min(largest_dominant, n_max))
    return best


def _root_bound(A, Kinv):
    """Largest rank any clique of ``A`` could certify, from per-member bounds.

    In a clique of ``k`` members, member ``u`` has ``k - 1`` partners ``w``; its pairs
    add at least the ``k - 1`` smallest ``e_uw^2 + e_wu^2`` over its neighbours to
    ``2 S``, so ``S`` is at least half the sum of the ``k`` smallest such member
    totals. Dominance (rank ``k``) needs ``k`` members whose ``k - 1`` smallest row
    (or column) entries sum to at most 1. Floats, decided near an integer from the
    same sums in exact arithmetic.
    """
    V = len(A)
    E = np.zeros((V, V))
    for u, row in Kinv.items():
        for w, e in row.items():
            E[u, w] = float(e)
    inf = np.inf
    pair = np.where(A, E * E + E.T * E.T, inf)
    pair_sums = np.cumsum(np.sort(pair, axis=1), axis=1)   # [u, k-2]: k-1 smallest
    sums = {"row": np.cumsum(np.sort(np.where(A, E, inf), axis=1), axis=1),
            "col": np.cumsum(np.sort(np.where(A, E.T, inf), axis=1), axis=1)}
    exact_sums = _MemberSums(A, Kinv)
    best = 1 if V else 0
    for k in range(2, V + 1):
        h = np.sort(pair_sums[:, k - 2])[:k]
        if not np.isfinite(h[-1]):
            break                            # fewer than k members of degree >= k - 1
        if any(
            sum(resolve_near_integer(v, lambda u=u, kind=kind, k=k: exact_sums.prefix(kind, u, k))
                <= 1 for u, v in enumerate(sums[kind][:, k - 2])) >= k
            for kind in ("row", "col")
        ):
            best = max(best, k)
            continue
        best = max(best, rank_from_sums(
            k, h.sum() / 2, exact_sum_sq=lambda k=k: exact_sums.pair_bound(k))[0])
    return best


class _MemberSums:
    """Exact sums of the ``k - 1`` smallest bounds of each member, computed on demand."""

    def __init__(self, A, Kinv):
        self.A, self.Kinv = A, Kinv
        self.cache = {}

    def prefixes(self, kind, u):
        """Running sums of the sorted ``row``, ``col`` or ``pair`` bounds of ``u``."""
        key = (kind, u)
        if key not in self.cache:
            Kinv = self.Kinv
            nb = np.flatnonzero(self.A[u]).tolist()
            if kind == "row":
                vals = [Kinv[u][w] for w in nb]
            elif kind == "col":
                vals = [Kinv[w][u] for w in nb]
            else:
                vals = [Kinv[u][w] ** 2 + Kinv[w][u] ** 2 for w in nb]
            self.cache[key] = list(itertools.accumulate(sorted(vals)))
        return self.cache[key]

    def prefix(self, kind, u, k):
        """Sum of the ``k - 1`` smallest bounds of ``u`` (None: fewer neighbours)."""
        run = self.prefixes(kind, u)
        return run[k - 2] if len(run) >= k - 1 else None

    def pair_bound(self, k):
        """Half the sum of the ``k`` smallest member totals: the lower bound on ``S``."""
        totals = sorted(t for t in (self.prefix("pair", u, k) for u in range(len(self.A)))
                        if t is not None)
        return sum(totals[:k], Fraction(0)) / 2


def _clique_cover_bound(P, nbr):
    """An upper bound on the largest clique inside the bit set ``P``.

    Greedy colouring: each colour class is a set of mutually incompatible members, so
    a clique takes at most one member of each class.
    """
    colours = 0
    while P:
        colours += 1
        Q = P
        while Q:
            v = Q.bit_length() - 1
            P &= ~(1 << v)
            Q &= ~(1 << v) & ~nbr[v]
    return colours


def _exact_clique_search(A, Kinv, start_rank, max_nodes):
    """Branch and bound over all cliques of ``A``.

    ``Kinv[u][w]`` is ``Fraction(1, K_uw)``. The sums of a clique are kept exactly, as
    integers over a common denominator ``L``; the search is steered by their floats,
    decided in exact arithmetic near an integer, and every improvement is confirmed
    in exact arithmetic. Returns ``(rank, clique or None, complete)``.
    """
    V = len(A)
    nbr = [sum(1 << int(w) for w in np.flatnonzero(A[u])) for u in range(V)]
    e_min_exact = min((e for u in Kinv for e in Kinv[u].values()), default=Fraction(0))
    e_min = float(e_min_exact)
    # the largest clique size that dominance alone could certify: (k-1) e_min <= 1
    largest_dominant = integer_above(1 / e_min, lambda: 1 / e_min_exact) if e_min else V
    L = math.lcm(*(e.denominator for u in Kinv for e in Kinv[u].values()))
    L2 = L * L
    Ki = {u: {w: e.numerator * (L // e.denominator) for w, e in Kinv[u].items()}
          for u in Kinv}                 # Kinv[u][w] == Ki[u][w] / L
    best = [start_rank, None]
    nodes = [0]

    def rec(C, P, S_i, rows_i, cols_i):
        # S_i, rows_i, cols_i: sum of squared bounds, row and column sums of the clique,
        # exactly, times L^2, L and L
        nodes[0] += 1
        n = len(C)
        S = S_i / L2

        def exact_sum_sq():
            return Fraction(S_i, L2)

        if n > max(1, best[0]):                # a clique certifies at most its size
            est = rank_from_sums(
                n, S, max(rows_i) / L, max(cols_i) / L, exact_sum_sq=exact_sum_sq,
                exact_max_row_sum=lambda: Fraction(max(rows_i), L),
                exact_max_col_sum=lambda: Fraction(max(cols_i), L),
            )[0]
            if est > best[0]:
                r = _exact_rank(C, Kinv)
                if r > best[0]:
                    best[0], best[1] = r, list(C)
        while P:
            if nodes[0] >= max_nodes:
                return
            n_max = n + _clique_cover_bound(P, nbr)
            if n_max <= best[0] or _upper_bound(n, S, n_max, e_min, exact_sum_sq,
                                                e_min_exact, largest_dominant) <= best[0]:
                return
            v = P.bit_length() - 1
            P &= ~(1 << v)
            new_S = S_i
            new_rows, new_cols = list(rows_i) + [0], list(cols_i) + [0]
            for k, u in enumerate(C):
                a, b = Ki[u][v], Ki[v][u]
                new_S += a * a + b * b
                new_rows[k] += a
                new_cols[k] += b
                new_rows[-1] += b
                new_cols[-1] += a
            rec(C + [v], P & nbr[v], new_S, new_rows, new_cols)

    rec([], (1 << V) - 1, 0, [], [])
    return best[0], best[1], nodes[0] < max_nodes


def _select(G):
    """Run every search; returns (clique in graph indices, strategy, exhaustive)."""
    V = G.V
    if V > MAX_DENSE_CANDIDATES:
        # keep, per query, its candidates of highest degree
        order = np.lexsort((G.priority.argsort(), -G.degree, G.x))
        per_q = max(1, MAX_DENSE_CANDIDATES // max(1, len(np.unique(G.x))))
        rank_in_q = np.zeros(V, dtype=np.int64)
        xs = G.x[order]
        starts = np.r_[0, np.flatnonzero(xs[1:] != xs[:-1]) + 1]
        for a, b in zip(starts, np.r_[starts[1:], V]):
            rank_in_q[order[a:b]] = np.arange(b - a)
        keep = np.sort(np.flatnonzero(rank_in_q < per_q))
    else:
        keep = np.arange(V)
    A = G.dense(keep)
    prio_rank = np.empty(len(keep), dtype=np.int64)
    sub_priority = np.argsort(np.argsort(G.priority)[keep], kind="stable")
    prio_rank[sub_priority] = np.arange(len(keep))
    # one candidate per query: the first in priority order
    xs = G.x[keep]
    primary = np.zeros(len(keep), dtype=bool)
    seen = set()
    for v in sub_priority:
        if xs[v] not in seen:
            seen.add(xs[v])
            primary[v] = True
    found = [
        ("greedy by degree", _greedy_degree(A, prio_rank)),
        ("greedy in order of reach", _greedy_order(A, sub_priority)),
        ("greedy by degree, one key per query", _greedy_degree(A, prio_rank, primary)),
    ]
    results = []
    for name, clique in found:
        clique = [int(keep[v]) for v in clique]
        K = G.denominators(clique)
        kept = prune_rows(K)
        clique = [clique[i] for i in kept]
        rank = rank_from_denominators(G.denominators(clique))[0] if len(clique) > 1 else 1
        results.append((rank, name, clique))
    best_rank = max(r[0] for r in results)
    # a set certifying more than best_rank has more than best_rank members, each
    # compatible with all the others: only the core of degree >= best_rank can hold it
    core = np.ones(len(keep), dtype=bool)
    while True:
        shrunk = core & (A[:, core].sum(axis=1) >= best_rank)
        if (shrunk == core).all():
            break
        core = shrunk
    idx = np.flatnonzero(core)
    exhaustive = len(idx) == 0
    if 0 < len(idx) <= EXACT_MAX_CANDIDATES:
        sub = A[np.ix_(idx, idx)]
        Kinv = {}
        for u in range(len(idx)):
            nb = np.flatnonzero(sub[u])
            K = G.denominators([int(keep[idx[u]])] + [int(keep[idx[w]]) for w in nb])[0, 1:]
            Kinv[u] = {int(w): Fraction(1, int(k)) for w, k in zip(nb, K)}
        if _root_bound(sub, Kinv) <= best_rank:
            rank, clique, exhaustive = best_rank, None, True   # nothing can do better
        else:
            rank, clique, exhaustive = _exact_clique_search(sub, Kinv, best_rank,
                                                            EXACT_MAX_NODES)
        if clique is not None:
            results.append((rank, "exhaustive search", [int(keep[idx[v]]) for v in clique]))
    rank, name, clique = max(results, key=lambda r: r[0])
    return clique, name, exhaustive


def _search(cons, R, full_reach=None):
    """The best set of candidates: ``(G, clique, strategy, exhaustive, R)``.

    A first search on one candidate per query gives a rank ``r0``; the full search then
    runs on the candidates that could take part in a set certifying more than ``r0``
    (those reaching ``>= r0`` keys), which keeps the graph small on families where
    many tokens reach only a few keys. The better of the two sets wins.

    ``R`` may lack the rows of sources reaching a single key whose query has a source
    reaching more (``reach(cons, drop_single=True)``): the first search never takes
    them, and the second only when ``r0 < 2``, in which case ``full_reach()`` computes
    the chains again in full. The returned ``R`` holds the rows of every candidate
    searched.
    """
    found = []
    r0, exhaustive = 0, True
    for primary in (True, False):
        if not primary and r0 < 2 and R.dropped:   # the rows left out can matter only now
            R = full_reach()
        restricted = _restrict(cons, R, primary=primary, min_reach=r0)
        G = _Graph(cons, restricted)
        del restricted
        trim_heap()                         # the graph's temporaries, back to the OS
        if G.V < 2 or not len(G.half):
            continue
        clique, strategy, exhaustive = _select(G)
        r = rank_from_denominators(G.denominators(clique))[0] if len(clique) > 1 else 1
        found.append((r, len(found), G, clique, strategy))
        r0 = max(r0, r)
    if not found:
        return None, [], "none", True, R
    # the second search holds every set that could beat the first: it decides whether
    # the result is the best any set gives
    _, _, G, clique, strategy = max(found, key=lambda f: (f[0], f[1]))
    return G, clique, strategy, exhaustive, R


# --------------------------------------------------------------------------- certify
def certify(X, *, query="all", positional=False, return_certificate=False):
    """Certified minimum kernel rank of a family of sequences.

    The certificate is recomputed from the sequences themselves; nothing about how the
    family was built is trusted (see the theory page, :ref:`theory-r4` and
    :ref:`theory-r5`). The claim holds for *every* nonnegative kernel head (any feature
    maps and value map, an affine readout that may depend on the query): a head of
    smaller rank cannot solve every sequence of ``X`` with error below 1/2, so a
    trained model that does is a bug.

    Adding sequences never lowers the result where the search is exhaustive (small
    candidate sets); on larger families several searches are run and the best
    certificate found is returned.

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits) or CompactFamily
        Binary token sequences (one common length), or the same family in multiset
        form (:class:`~minip_learn.compact.CompactFamily`): the certificate depends
        only on each sequence's multiset, and the compact form is never materialised.
    query : {"all", "last"}, default="all"
        ``"all"``: heads held to every position. ``"last"``: final-query Min-IP (e.g.
        causal heads read at the last token), only the constraints whose query is
        the final token of each sequence they use (for a CompactFamily, the token of
        the last real slot, the final position of its materialised sequences); the
        certificate records it.
    positional : bool, default=False
        Certify for position-dependent maps too (``query="last"``, ``X`` an array):
        a triple counts only when its S3 occurs in the family in every order of its
        keys (``y`` at each of the first ``N - 1`` positions); the bound then holds for
        nonnegative kernel heads whose feature maps, value map and readout depend on
        the position (:ref:`theory-positional`). On a family that holds every order,
        as ``make_witness_suite(..., query="last", orders="all")``, it equals the
        positionless certificate; on a family in one fixed order it is trivial.
    return_certificate : bool, default=False
        Also return the :class:`Certificate` (queries, keys, eps matrix, chains...),
        which :func:`~minip_learn.theory.verify_certificate` checks independently.

    Returns
    -------
    rank : int
        The certified minimum rank (1 when the family forces nothing, e.g. for
        ``seq_len <= 2`` or without the R4 triples).
    certificate : Certificate
        Only with ``return_certificate=True``.

    See Also
    --------
    minip_learn.datasets.make_witness_suite : families built to make this large.
    minip_learn.theory.verify_certificate : the independent check.

    Examples
    --------
    >>> from minip_learn.datasets import make_minip, make_witness_suite
    >>> from minip_learn.theory import certify
    >>> certify(make_minip(50, seq_len=3, n_bits=8, random_state=0)[0])
    1
    >>> suite = make_witness_suite(24, 3, construction="small")
    >>> rank, cert = certify(suite.X, return_certificate=True)
    >>> rank, len(cert.queries)
    (8, 10)
    >>> certify(make_witness_suite(24, 3, construction="small", query="last").X,
    ...         query="last")
    8
    """
    query = _check_query(query)
    if not is_compact(X):
        X, _ = check_sequences(X, binary=True)
    _check_positional(positional, query, X)
    cert = _certify(X, query=query, positional=bool(positional))
    return (cert.certified_min_rank, cert) if return_certificate else cert.certified_min_rank


def _certify(X, *, reference=False, query="all", positional=False):
    """Certificate of a validated binary family (``reference``: plain-Python chains)."""
    if not is_compact(X) and X.dtype != np.uint8:
        X = X.astype(np.uint8)
    N = X.shape[1]
    if reference:
        cons = constraints_reference(X, query, positional)
    else:
        cons = constraints(X, query, positional)
    tokens = cons.tokens
    if N < 3:
        return _trivial(tokens, N, f"seq_len={N} <= 2: gap domination needs three tokens "
                                   "(R1: rank 1 solves it)", query=query,
                        positional=positional)
    n_constraints = len(cons)
    if not n_constraints:
        return _trivial(tokens, N, "the family contains no (S1, S2, S3) triple with gap >= 2"
                        + (" and the query last" if query == "last" else "")
                        + (" in every order of its keys" if positional else ""),
                        query=query, positional=positional)
    R = reach_reference(cons) if reference else reach(cons, drop_single=True)
    cons.release()                          # the chains hold what the search needs
    trim_heap()
    G, clique, strategy, exhaustive, R = _search(
        cons, R, lambda: reach(constraints(X, query, positional)))
    n = len(clique)
    if n < 2:
        return _trivial(tokens, N, "no two (query, key) pairs constrain each other",
                        n_constraints, query=query, positional=positional)
    K = G.denominators(clique)
    rank, value, dominant = rank_from_denominators(K)
    c = np.asarray(clique)
    qi, ki = G.x[c], G.s[c]
    D = _overlap_gaps(cons.overlap, qi, ki, X.shape[2])
    T = np.int64(len(tokens))
    codes, count = _candidate_runs(R, T)    # the rows of a candidate are one run
    pos = np.searchsorted(codes, qi * T + ki)
    lo = (np.cumsum(count) - count)[pos]
    hi = lo + count[pos]
    del codes, count, pos
    parents = ChainTrees(np.concatenate([[0], np.cumsum(hi - lo)]),
                         np.concatenate([R.t[a:b] for a, b in zip(lo, hi)]),
                         np.concatenate([R.pred[a:b] for a, b in zip(lo, hi)]))
    Kobj = K.astype(np.int64) if K.dtype != object else _as_int64_if_fits(K)
    eps = reciprocals(K)
    np.fill_diagonal(eps, 1.0)
    return Certificate(
        certified_min_rank=int(rank), seq_len=N, n_bits=X.shape[2], tokens=tokens,
        queries=tokens[qi], keys=tokens[ki], query_index=qi, key_index=ki,
        eps=eps, eps_denominators=Kobj, overlap_gaps=D, parents=parents,
        frobenius_value=value, diagonally_dominant=bool(dominant),
        n_constraints=n_constraints,
        reason=(
            f"{n} mutually constrained (query, key) pairs; R5 per-pair bound "
            + ("(diagonal dominance)" if dominant else f"r > {float(value):.4f}")
        ),
        strategy=strategy, exhaustive=bool(exhaustive), query=query,
        positional=positional,
    )
