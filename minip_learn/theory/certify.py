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
        """Read a certificate written by :meth:`to_json`.

        Parameters
        ----------
        text : str
            The JSON text.

        Returns
        -------
        certificate : Certificate

        Raises
        ------
        ValueError
            If the text is not JSON or not a certificate (the message names the
            missing or malformed field).
        """
        try:
            doc = _loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"certificate is not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != JSON_FORMAT:
            raise ValueError(f"not a certificate: expected a JSON object with "
                             f"format={JSON_FORMAT!r}.")
        try:
            m = int(doc["n_bits"])
            toks = doc["tokens"]
            if any(len(t) != m or set(t) - {"0", "1"} for t in toks):
                raise ValueError(f"every token must be a string of {m} characters 0/1")
            tokens = np.array([[c == "1" for c in t] for t in toks],
                              dtype=np.uint8).reshape(len(toks), m)
            qi = np.array(doc["query_index"], dtype=np.int64)
            ki = np.array(doc["key_index"], dtype=np.int64)
            n = len(qi)
            K = np.ones((n, n), dtype=object)
            if isinstance(doc["eps_denominators"], np.ndarray):   # read by numpy
                K = K.astype(np.int64)
                K[:len(doc["eps_denominators"])] = doc["eps_denominators"]
            else:
                for i, row in enumerate(doc["eps_denominators"]):
                    K[i, :] = [int(k) for k in row]
            K = _as_int64_if_fits(K)
            eps = reciprocals(K).reshape(n, n)
            if n:
                np.fill_diagonal(eps, 1.0)
            num, den = str(doc["frobenius_value"]).split("/")
            cert = cls(
                certified_min_rank=int(doc["certified_min_rank"]),
                seq_len=int(doc["seq_len"]), n_bits=m, tokens=tokens,
                queries=tokens[qi], keys=tokens[ki], query_index=qi, key_index=ki,
                eps=eps, eps_denominators=K,
                overlap_gaps=np.array(doc["overlap_gaps"], dtype=np.int64).reshape(n, n),
                parents=doc["parents"] if isinstance(doc["parents"], ChainTrees) else
                ChainTrees.from_dicts({int(c): int(p) for c, p in par} for par in doc["parents"]),
                frobenius_value=Fraction(int(num), int(den)),
                diagonally_dominant=bool(doc["diagonally_dominant"]),
                n_constraints=int(doc["n_constraints"]), reason=str(doc["reason"]),
                strategy=str(doc.get("strategy", "none")),
                exhaustive=bool(doc.get("exhaustive", False)),
                query=_check_query(doc.get("query", "all")),
                positional=bool(doc.get("positional", False)),
            )
        except KeyError as exc:
            raise ValueError(f"certificate lacks the field {exc.args[0]!r}.") from None
        except (TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"malformed certificate: {exc}") from None
        return cert


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


def _loads(text):
    """``json.loads`` of a certificate; the values of the ``n x n`` fields longer than
    :data:`LARGE_JSON_VALUE` are read row by row by numpy (``eps_denominators`` and
    ``overlap_gaps`` as int64 arrays, ``parents`` as :class:`ChainTrees`), and fall back
    to ``json`` whenever they are not plain nested lists of int64 integers."""
    if not isinstance(text, str) or len(text) < LARGE_JSON_VALUE:
        return json.loads(text)
    pieces, arrays, pos = [], {}, 0
    for m in re.finditer(r'"(eps_denominators|overlap_gaps|parents)"\s*:\s*(?=\[)', text):
        stop = re.compile(r"[^\[\]0-9,\s-]").search(text, m.end())
        end = text.rfind("]", m.end(), stop.start() if stop else len(text)) + 1
        if end - m.end() < LARGE_JSON_VALUE:
            continue
        value = _parse_rows(text[m.end():end], pairs=m.group(1) == "parents")
        if value is not None:
            arrays[m.group(1)] = value
            pieces += [text[pos:m.end()], "null"]
            pos = end
    doc = json.loads("".join(pieces) + text[pos:] if pieces else text)
    if isinstance(doc, dict):
        doc.update(arrays)
    return doc


def _int_row(text):
    """The integers of ``text`` (separated by commas, brackets ignored) as int64, or
    None when it holds anything else or an integer beyond int64."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            row = np.fromstring(text.replace("[", " ").replace("]", " "), dtype=np.int64,
                                sep=",")
        except (ValueError, DeprecationWarning):
            return None
    info = np.iinfo(np.int64)
    if not text.strip() or (row == info.max).any() or (row == info.min).any():
        return None
    return row


def _parse_rows(value, *, pairs):
    """A JSON list of rows of integers (``pairs``: rows of ``[child, parent]`` pairs)
    read with numpy: an (n, k) int64 array, or :class:`ChainTrees`; None if the text
    is anything else."""
    value = value.strip()
    if value[:1] != "[" or value[-1:] != "]" or re.search(r"\[\s*\]", value):
        return None
    close = "]]" if pairs else "]"
    pieces = value[1:-1].split(close)
    if pieces[-1].strip():
        return None
    rows = []
    for k, piece in enumerate(pieces[:-1]):
        piece = piece.strip()
        if k:
            if piece[:1] != ",":
                return None
            piece = piece[1:].lstrip()
        body = piece[len(close):]
        if piece[:len(close)] != "[" * len(close) or (not pairs and "[" in body):
            return None
        row = _int_row(body)
        if row is None:
            return None
        if pairs:
            if len(row) != 2 * (body.count("[") + 1) or body.count("[") != body.count("]"):
                return None
            row = row.reshape(-1, 2)
        rows.append(row)
    if pairs:
        trees = []
        for row in rows:
            row = row[np.lexsort((row[:, 1], row[:, 0]))]
            if (np.diff(row[:, 0]) <= 0).any():     # a repeated child: the general reader
                return None
            trees.append(row)
        sizes = [len(r) for r in trees]
        flat = np.concatenate(trees) if trees else np.zeros((0, 2), dtype=np.int64)
        return ChainTrees(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]),
                          flat[:, 0], flat[:, 1])
    if len({len(r) for r in rows}) > 1:
        return None
    return np.array(rows, dtype=np.int64).reshape(len(rows), -1)


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
