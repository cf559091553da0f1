"""The full length-3 Min-IP task and its certified minimum rank (numpy only).

The *full task* over ``m``-bit tokens is every sequence of three tokens of
``{0,1}^m``, the zero token and repeated tokens included: ``2^(3m)`` ordered sequences.
A normalised kernel head without positional maps sees a sequence only through its
multiset of tokens (its output at a token is a weighted mean over the tokens present,
each weighted by its multiplicity), so it solves every ordered sequence exactly when it
solves every multiset of three tokens at each of its tokens. :func:`full_task_family`
lists those multisets once each (``query="all"``), or each query token with each
multiset of the other two, the query last (``query="last"``).

``r*(m)``, the smallest rank of a nonnegative kernel head (any feature maps, values and
affine readout) that solves the full task, is bounded from below by certificates
(:ref:`theory-r5`). :func:`certify_full_task` certifies the full task at least as high
as every sub-family it names (*pools*: constant-weight layers, codes, witness designs,
product designs and an exhaustive search over (query, key) pairs), because a
certificate of a sub-family holds for the whole task: it is lifted to the task's tokens
and checked against the whole family by :func:`~minip_learn.theory.verify_certificate`.
"""

import dataclasses
import itertools
import math
import time

import numpy as np
from sklearn.utils import Bunch

from .._validation import check_int, distinct_tokens
from ..bits import pack_tokens
from ..compact import CompactFamily
from ._docs import verify_doc
from ._full_task_search import best_pairs
from ._pools import weight_pools
from ._task_sets import AllSequences, full_task_triples
from .certify import certify
from .codes import greedy_constant_weight_code, hadamard_code, hadamard_orders, product_code
from .design import LADDER_GAPS, block_designs, witness_family
from .exact import complement_closed_code
from .verify import verify_certificate

__all__ = []  # public home: the package minip_learn.theory

#: the most bits of :func:`full_task_tokens` (2^16 tokens)
FULL_TASK_MAX_BITS = 16

#: the most bits of a task :func:`certify_full_task` lists: above, its pools are capped
#: in size and its certificate is checked against every sequence without listing them
#: (:func:`verify_full_task_certificate`)
FULL_TASK_LISTED_BITS = 8

#: the most sequences of a pool :func:`full_task_pools` certifies above
#: :data:`FULL_TASK_LISTED_BITS` (a larger one is skipped)
POOL_MAX_SEQUENCES = 200000

#: a witness design may hold this many times ``max_sequences`` (its family is sparse:
#: each query meets few keys, and certifying 1.6 million of its sequences takes seconds)
DESIGN_FACTOR = 10

#: the most bits of a task :func:`certify_full_task` certifies (tokens held as 64-bit
#: words)
CERTIFY_MAX_BITS = 64

#: the largest full-task family :func:`full_task_family` builds (m = 8 with
#: ``query="last"``: 8,421,376 sequences)
FULL_TASK_MAX_SEQUENCES = 1 << 25

QUERY_MODES = ("all", "last")


def full_task_tokens(n_bits):
    """Every ``n_bits``-bit token, in lexicographic (``np.unique``) order.

    Examples
    --------
    >>> from minip_learn.theory import full_task_tokens
    >>> full_task_tokens(2).tolist()
    [[0, 0], [0, 1], [1, 0], [1, 1]]
    """
    m = _check_bits(n_bits)
    ints = np.arange(1 << m, dtype=np.int64)
    return ((ints[:, None] >> np.arange(m - 1, -1, -1)) & 1).astype(np.uint8)


def _check_bits(n_bits):
    m = check_int(n_bits, "n_bits", min_value=1)
    if m > FULL_TASK_MAX_BITS:
        raise ValueError(f"n_bits must be <= {FULL_TASK_MAX_BITS}; got {m}.")
    return m


def _check_task_bits(n_bits):
    """``n_bits`` of a task that is counted or certified, not listed (at most 64)."""
    m = check_int(n_bits, "n_bits", min_value=1)
    if m > CERTIFY_MAX_BITS:
        raise ValueError(f"n_bits must be <= {CERTIFY_MAX_BITS}; got {m}.")
    return m


def _task_tokens(n_bits, tokens):
    """``(tokens, full)``: the task's distinct tokens in ``np.unique`` order and
    whether they are every token of their length."""
    if tokens is None:
        if n_bits is None:
            raise ValueError("give n_bits (every token) or a token set `tokens`.")
        return full_task_tokens(n_bits), True
    arr = np.asarray(tokens)
    if arr.ndim != 2 or not arr.size:
        raise ValueError(f"tokens must be a non-empty 2-D array (n_tokens, n_bits); got "
                         f"shape {arr.shape}.")
    if not np.isin(arr, (0, 1)).all():
        raise ValueError("tokens must hold 0/1 values.")
    arr = distinct_tokens(arr.astype(np.uint8))
    if n_bits is not None and check_int(n_bits, "n_bits", min_value=1) != arr.shape[1]:
        raise ValueError(f"tokens have {arr.shape[1]} bits but n_bits={n_bits}.")
    return arr, len(arr) == 1 << arr.shape[1]


def _check_query(query):
    if not isinstance(query, str) or query not in QUERY_MODES:
        raise ValueError(f"query must be one of {list(QUERY_MODES)}; got {query!r}.")
    return query


def full_task_size(n_bits=None, *, query="all", n_tokens=None):
    """Number of sequences of :func:`full_task_family`.

    Parameters
    ----------
    n_bits : int, default=None
        Bits per token (``2^n_bits`` tokens).
    query : {"all", "last"}, default="all"
        ``"all"``: every multiset of three tokens, ``C(T + 2, 3)``; ``"last"``: every
        query token with every multiset of two keys, ``T * C(T + 1, 2)``.
    n_tokens : int, default=None
        ``T`` for a token set of another size (instead of ``n_bits``).

    Examples
    --------
    >>> from minip_learn.theory import full_task_size
    >>> [full_task_size(m) for m in (2, 3, 4)], full_task_size(8, query="last")
    ([20, 120, 816], 8421376)
    """
    query = _check_query(query)
    if n_tokens is None:
        T = 1 << _check_task_bits(n_bits)
    else:
        T = check_int(n_tokens, "n_tokens", min_value=1)
    return math.comb(T + 2, 3) if query == "all" else T * math.comb(T + 1, 2)


def _ids_counts(cols):
    """Merged slots of rows whose three token ids ``cols`` are non-decreasing."""
    a, b, c = cols
    n = len(a)
    ids = np.full((n, 3), -1, dtype=np.int64)
    cnt = np.zeros((n, 3), dtype=np.int64)
    ab, bc = a == b, b == c
    ids[:, 0], cnt[:, 0] = a, 1 + ab + (ab & bc)
    second = np.where(ab, c, b)
    ids[:, 1] = np.where(ab & bc, -1, second)
    cnt[:, 1] = np.where(ab & bc, 0, np.where(~ab & bc, 2, 1))
    ids[:, 2] = np.where(ab | bc, -1, c)
    cnt[:, 2] = np.where(ab | bc, 0, 1)
    return ids, cnt


def _query_last_rows(T, pairs):
    """Slots of ``(y, z, x)`` for every query ``x`` and key multiset ``y <= z``, the
    query's slot last (counts merged)."""
    P = len(pairs)
    x = np.repeat(np.arange(T, dtype=np.int64), P)
    y = np.tile(pairs[:, 0], T)
    z = np.tile(pairs[:, 1], T)
    n_x = 1 + (y == x) + (z == x)
    # the keys other than the query, merged: (first, its count, second)
    first = np.where(y == x, z, y)
    first = np.where(n_x == 3, -1, first)
    second = np.where((y != x) & (z != x) & (y != z), z, -1)
    c_first = np.where(first < 0, 0, np.where((y == z) & (y != x), 2, 1))
    ids = np.stack([first, second, x], axis=1)
    cnt = np.stack([c_first, np.where(second < 0, 0, 1), n_x], axis=1)
    order = np.argsort(ids < 0, axis=1, kind="stable")        # padding last
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(cnt, order, axis=1)


def full_task_family(n_bits=None, *, tokens=None, query="all"):
    """Every length-3 sequence over a token set, in multiset form.

    Parameters
    ----------
    n_bits : int, default=None
        Bits per token: the token set is every ``n_bits``-bit token, the zero token
        included.
    tokens : array-like of shape (n_tokens, n_bits), default=None
        Another token set (duplicates are merged): the full task over it.
    query : {"all", "last"}, default="all"
        ``"all"``: each multiset of three tokens once (``C(T + 2, 3)`` sequences),
        every position a query; a head without positional maps solves every ordered
        sequence exactly when it solves these. ``"last"``: each query token with each
        multiset of the other two (``T * C(T + 1, 2)`` sequences), the query's slot last
        (so the final position of every materialised sequence is its query).

    Returns
    -------
    family : CompactFamily
        Tokens in ``np.unique`` order; rows ordered by their sorted token ids
        (``"all"``), or by query, then key ids (``"last"``).

    Raises
    ------
    ValueError
        When the family would hold more than :data:`FULL_TASK_MAX_SEQUENCES` sequences.

    Examples
    --------
    >>> from minip_learn.theory import full_task_family
    >>> fam = full_task_family(2)
    >>> len(fam), fam.to_sequences()[1].tolist()
    (20, [[0, 0], [0, 0], [0, 1]])
    >>> len(full_task_family(2, query="last"))
    40
    """
    query = _check_query(query)
    toks, _ = _task_tokens(n_bits, tokens)
    T = len(toks)
    size = full_task_size(query=query, n_tokens=T)
    if size > FULL_TASK_MAX_SEQUENCES:
        raise ValueError(f"the full task over {T} tokens has {size:,} sequences "
                         f"(query={query!r}), above FULL_TASK_MAX_SEQUENCES = "
                         f"{FULL_TASK_MAX_SEQUENCES:,}.")
    b, c = np.triu_indices(T)                      # pairs b <= c, sorted by b then c
    pairs = np.stack([b, c], axis=1).astype(np.int64)
    if query == "last":
        ids, cnt = _query_last_rows(T, pairs)
    else:
        starts = np.concatenate([[0], np.cumsum(T - np.arange(T))])
        a = np.repeat(np.arange(T, dtype=np.int64), T * (T + 1) // 2 - starts[:-1])
        rest = np.concatenate([pairs[starts[i]:] for i in range(T)])
        ids, cnt = _ids_counts((a, rest[:, 0], rest[:, 1]))
    used = int((ids >= 0).sum(axis=1).max())
    return CompactFamily(toks, ids[:, :used], cnt[:, :used])


def full_task_constraint_count(n_bits=None, *, tokens=None):
    """Number of R4 constraints (``x, y, z`` with ``<x, z> - <x, y> >= 2``) of the full
    task: every such triple of tokens is one, since the task holds every multiset.

    This is the ``n_constraints`` a certificate of the full task states. Over every
    ``m``-bit token it is counted in closed form: a query of weight ``w`` meets
    ``C(w, i) 2^(m - w)`` tokens at overlap ``i``, so the count is
    ``sum_w C(m, w) 4^(m - w) sum_(j - i >= 2) C(w, i) C(w, j)`` (any ``m`` up to
    64, a Python integer); over a token set ``tokens`` the triples are counted from
    the tokens' overlaps.

    Examples
    --------
    >>> from minip_learn.theory import full_task_constraint_count
    >>> [full_task_constraint_count(m) for m in (1, 2, 3)]
    [0, 1, 19]
    >>> full_task_constraint_count(32) > 2**63
    True
    """
    if tokens is None:
        if n_bits is None:
            raise ValueError("give n_bits (every token) or a token set `tokens`.")
        m = _check_task_bits(n_bits)
        total = 0
        for w in range(2, m + 1):
            c = [math.comb(w, i) for i in range(w + 1)]
            above = list(itertools.accumulate(reversed(c)))[::-1]      # sum_(j >= i) C(w, j)
            pairs = sum(c[i] * above[i + 2] for i in range(w - 1))
            total += math.comb(m, w) * 4 ** (m - w) * pairs
        return total
    toks, _ = _task_tokens(n_bits, tokens)
    m = toks.shape[1]
    T = toks.astype(np.int64)
    total = 0
    for start in range(0, len(T), 4096):
        G = T[start:start + 4096] @ T.T
        hist = np.stack([np.bincount(row, minlength=m + 1) for row in G])
        above = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]        # tokens at >= level
        total += int((hist[:, :-2] * above[:, 2:]).sum())
    return total


def lift_certificate(certificate, tokens, *, n_constraints):
    """A certificate of a sub-family restated on a larger family's tokens.

    Every sequence a certificate's chains use is in any family that contains the
    sub-family, so its bound holds there; only the token table (and the indices into
    it) and the stated number of constraints change.

    Parameters
    ----------
    certificate : Certificate
        From :func:`~minip_learn.theory.certify` on the sub-family.
    tokens : ndarray of shape (n_tokens, n_bits)
        The larger family's distinct tokens (``np.unique`` order), a superset.
    n_constraints : int
        The larger family's number of R4 constraints.

    Returns
    -------
    certificate : Certificate

    Examples
    --------
    >>> from minip_learn.theory import certify, full_task_family, verify_certificate
    >>> from minip_learn.theory import full_task_constraint_count, full_task_tokens
    >>> from minip_learn.theory.full_task import lift_certificate
    >>> T = full_task_tokens(4)
    >>> _, cert = certify(full_task_family(tokens=T[T.sum(1) == 2]), return_certificate=True)
    >>> lifted = lift_certificate(cert, T, n_constraints=full_task_constraint_count(4))
    >>> verify_certificate(lifted, full_task_family(4)), lifted.certified_min_rank
    (True, 2)
    """
    words = pack_tokens(tokens)[:, 0] if tokens.shape[1] <= 64 else None
    if words is None:
        raise ValueError("lift_certificate takes tokens of at most 64 bits.")
    order = np.argsort(words)
    sub = pack_tokens(certificate.tokens)[:, 0]
    pos = np.searchsorted(words[order], sub)
    if (pos >= len(words)).any() or (words[order][np.minimum(pos, len(words) - 1)] != sub).any():
        raise ValueError("the certificate's tokens are not all among `tokens`.")
    where = order[pos].astype(np.int64)
    trees = [{int(where[c]): int(where[p]) for c, p in tree.items()}
             for tree in certificate.parents]
    if hasattr(type(certificate.parents), "from_dicts"):     # the certificate's own form
        trees = type(certificate.parents).from_dicts(trees)
    return dataclasses.replace(
        certificate, tokens=np.asarray(tokens, dtype=np.uint8).copy(),
        query_index=where[np.asarray(certificate.query_index, dtype=np.int64)],
        key_index=where[np.asarray(certificate.key_index, dtype=np.int64)],
        parents=trees, n_constraints=int(n_constraints))


def pad_certificate(certificate, n_bits):
    """A certificate of ``m``-bit sequences restated on ``n_bits >= m`` bits.

    Every token gets ``n_bits - m`` zero bits: overlaps, chains and ratio bounds are
    unchanged, and each sequence a chain uses becomes a sequence of the larger task.
    So ``r*(m)`` never decreases with ``m``. The padded certificate states no count
    of constraints of its own (``n_constraints`` is kept); set it for the family it is
    checked against, e.g. with ``dataclasses.replace``.

    Examples
    --------
    >>> from minip_learn.theory import certify_full_task, verify_full_task_certificate
    >>> from minip_learn.theory import full_task_constraint_count, pad_certificate
    >>> import dataclasses
    >>> cert = pad_certificate(certify_full_task(4).certificate, 20)
    >>> cert = dataclasses.replace(cert, n_constraints=full_task_constraint_count(20))
    >>> cert.n_bits, verify_full_task_certificate(cert, 20)
    (20, True)
    """
    m = int(certificate.n_bits)
    n = check_int(n_bits, "n_bits", min_value=m)
    extra = n - m

    def pad(a):
        a = np.asarray(a, dtype=np.uint8)
        return np.concatenate([a, np.zeros((len(a), extra), dtype=np.uint8)], axis=1)

    return dataclasses.replace(certificate, n_bits=n, tokens=pad(certificate.tokens),
                               queries=pad(certificate.queries),
                               keys=pad(certificate.keys))


@verify_doc
def verify_full_task_certificate(certificate, n_bits, *, raise_on_failure=True):
    """Check a certificate against the full length-3 task over ``n_bits`` bits, any
    size, without listing the task.

    The task holds every sequence of three ``n_bits``-bit tokens, so every sequence a
    chain step needs is a member; what is checked is everything else
    :func:`~minip_learn.theory.verify_certificate` checks (the fields, the chains and
    their overlap gaps, the ratio bounds, the rank R5 gives, every stated figure), with
    ``n_constraints`` against a closed form of the task's R4 triples (computed here,
    independently of :func:`~minip_learn.theory.full_task_constraint_count`).
    The certificate's token table lists the tokens it uses (at 32 bits the task has
    2^32). Up to :data:`~minip_learn.theory.full_task.FULL_TASK_LISTED_BITS` the same certificate can also be checked
    against the listed family with ``verify_certificate(cert, full_task_family(m))``
    when its table lists every token.

    Parameters
    ----------
    certificate : Certificate, str, bytes or os.PathLike
        As for :func:`~minip_learn.theory.verify_certificate`.
    n_bits : int
        Bits per token of the task (at most 64).
    %(raise_on_failure)s

    %(valid)s

    Examples
    --------
    >>> from minip_learn.theory import certify_full_task, verify_full_task_certificate
    >>> res = certify_full_task(12, search_nodes=20000)
    >>> res.certified_min_rank, verify_full_task_certificate(res.certificate, 12)
    (4, True)
    """
    m = check_int(n_bits, "n_bits", min_value=1)
    if m > CERTIFY_MAX_BITS:
        raise ValueError(f"n_bits must be an integer from 1 to {CERTIFY_MAX_BITS}; got {m}.")
    task = AllSequences(m, 3, full_task_triples(m))
    return verify_certificate(certificate, task, query="all",
                              raise_on_failure=raise_on_failure)


# ----------------------------------------------------------------------------- pools
def _with_keys(words):
    """Code words together with their complements (the keys of the witness designs)."""
    return np.concatenate([words, 1 - words]).astype(np.uint8)


def _code_pools(m, distances=(2, 3)):
    """Named codes over ``m`` bits: (name, words); greedy constant-weight codes of the
    minimum ``distances``."""
    codes = []
    for h in hadamard_orders(m):
        pad = np.zeros((2 * h - 2, m - h), dtype=np.uint8)
        codes.append((f"hadamard-{h}", np.concatenate([hadamard_code(h), pad], axis=1)))
    for w in range(2, m - 1):
        for d in distances:
            if d <= w:
                words = greedy_constant_weight_code(m, w, d)
                if len(words) >= 2:
                    codes.append((f"greedy-w{w}-d{d}", words))
    if m % 2 == 0 and 4 <= m <= 16:     # beyond, a greedy pass over C(m, m/2) words
        codes.append(("complement-closed", complement_closed_code(m)))
    for blocks in block_designs(m):
        words = product_code(blocks, n_bits=m)
        codes.append(("product-" + "+".join(f"{h}{'h' if half else ''}"
                                            for h, half in blocks), words))
    return codes


def _listed(n_bits, tokens):
    """Whether the task is listed (a token set, or at most FULL_TASK_LISTED_BITS bits)."""
    return tokens is not None or (n_bits is not None
                                  and _check_task_bits(n_bits) <= FULL_TASK_LISTED_BITS)


def _weight_layers(m, max_sequences):
    """The weight pools of every ``m``-bit token, built only where their full task has
    at most ``max_sequences`` sequences: (name, tokens)."""
    def layer(w):
        idx = np.array(list(itertools.combinations(range(m), w)), dtype=np.int64)
        out = np.zeros((len(idx), m), dtype=np.uint8)
        out[np.arange(len(idx))[:, None], idx] = 1
        return out

    def small(n):
        return full_task_size(n_tokens=n) <= max_sequences

    for w in range(1, m):
        if small(math.comb(m, w)):
            yield f"weight-{w}", layer(w)
    for w in range(1, (m + 1) // 2):
        if small(math.comb(m, w) + math.comb(m, m - w)):
            yield f"weights-{w}+{m - w}", np.concatenate([layer(w), layer(m - w)])


def full_task_pools(n_bits, *, search_nodes=200000, tokens=None, max_sequences=None):
    """The named sub-families :func:`certify_full_task` certifies.

    Parameters
    ----------
    n_bits : int
        Bits per token.
    search_nodes : int, default=200000
        Node budget of the exhaustive search (pool ``"search"``).
    tokens : array-like of shape (n_tokens, n_bits), default=None
        The task's token set (None: every token); token pools are cut to it, and a
        design family is kept only when all its tokens are in it.
    max_sequences : int, default=None
        Skip a token pool whose family has more sequences (a design family: more than
        :data:`DESIGN_FACTOR` times as many). None: no cap on a listed task
        (a token set, or at most :data:`FULL_TASK_LISTED_BITS` bits),
        :data:`POOL_MAX_SEQUENCES` above, where the exhaustive ``"search"`` pool is
        not run (its candidates are the ``2^m`` pairs ``(x, ~x)``) and the greedy
        codes are those of distance 3.

    Yields
    ------
    name : str
        ``"weight-w"`` (the tokens of weight ``w``), ``"weights-w+v"`` (two weights
        ``w + v = m``; these two kinds are the pools :func:`~minip_learn.theory.certify`
        also tries on every family), ``"<code>+keys"`` (a code of
        :mod:`~minip_learn.theory.codes` with the complements of its words),
        ``"design-<code>-<gap>"`` (the witness family of
        :func:`~minip_learn.theory.witness_family` on the code, ladder gap ``gap`` or
        ``single`` steps), ``"search"`` (the pairs of the exhaustive search, with the
        tokens of their chains).
    family : CompactFamily
        The pool's sub-family of the task: the full task over the pool's tokens, or
        the design's own family.
    info : dict
        ``n_tokens`` and, for ``"search"``, ``search_rank`` and ``exhaustive``.

    Examples
    --------
    >>> from minip_learn.theory.full_task import full_task_pools
    >>> [name for name, _, _ in full_task_pools(4)][:4]
    ['weight-1', 'weight-2', 'weight-3', 'weights-1+3']
    >>> [name for name, _, _ in full_task_pools(16, search_nodes=1000)][:3]
    ['weight-1', 'weight-15', 'weights-1+15']
    """
    listed = _listed(n_bits, tokens)
    if listed:
        toks, full = _task_tokens(n_bits, tokens)
        m = toks.shape[1]
        key = {bytes(t): True for t in np.packbits(toks, axis=1)}
        named = [(name, toks[mask]) for name, mask in weight_pools(toks)]
    else:
        m, full = _check_task_bits(n_bits), True
        max_sequences = POOL_MAX_SEQUENCES if max_sequences is None else max_sequences
        named = list(_weight_layers(m, max_sequences))

    def inside(words):
        if not listed:
            return np.ones(len(words), dtype=bool)
        return np.array([bytes(t) in key for t in np.packbits(words, axis=1)], dtype=bool)

    def small(n_sequences):
        return max_sequences is None or n_sequences <= max_sequences

    codes = _code_pools(m, (2, 3) if listed else (3,))
    named += [(f"{name}+keys", _with_keys(words)) for name, words in codes]
    for name, words in named:
        pool = distinct_tokens(words[inside(words)]) if len(words) else words
        if len(pool) >= 2 and small(full_task_size(n_tokens=len(pool))):
            yield name, full_task_family(tokens=pool), dict(n_tokens=len(pool))
    seen = set()
    for name, words in codes:
        if not small(len(words) ** 2 // DESIGN_FACTOR):    # a design holds n^2 or more
            continue
        for gap in LADDER_GAPS:
            try:
                fam = witness_family(words, 3, ladder_gap=gap, compact=True)
            except ValueError:
                continue
            digest = (fam.tokens.tobytes(), fam.token_ids.tobytes(), fam.counts.tobytes())
            if digest in seen or not small(len(fam) // DESIGN_FACTOR):  # (or a gap longer
                # than every distance: the same family again)
                continue
            seen.add(digest)
            if inside(fam.tokens).all():
                yield (f"design-{name}-{gap or 'single'}", fam,
                       dict(n_tokens=len(fam.tokens)))
    if listed:
        yield _search_pool(toks, full, search_nodes)


def _search_pool(toks, full, search_nodes):
    """The exhaustive search's pairs as a family: for each ordered pair, the S1 and S3
    of every step of its best chain through the task's tokens (N = 3)."""
    queries, keys, rank, exhaustive = best_pairs(toks, full=full, max_nodes=search_nodes)
    info = dict(search_rank=rank, exhaustive=exhaustive)
    if not len(queries):
        fam = full_task_family(tokens=toks[:1])
        return "search", fam, dict(info, n_tokens=1)
    G = toks.astype(np.int64)
    rows = []
    for x, k in zip(queries, keys):
        ov = G @ x.astype(np.int64)
        by_level = {int(o): toks[int(np.flatnonzero(ov == o)[0])] for o in np.unique(ov)}
        start = int(x.astype(np.int64) @ k)
        for k2 in keys:
            level = int(x.astype(np.int64) @ k2)
            path = _best_path(sorted(by_level), start, level)
            if path is None:
                continue
            steps = [k] + [by_level[o] for o in path[1:-1]] + [k2]
            for a, b in itertools.pairwise(steps):
                rows += [(x, b, b), (x, a, b)]
            rows.append((x, k, k))
    X = np.array(rows, dtype=np.uint8)
    fam = CompactFamily.from_sequences(np.unique(X, axis=0))
    return "search", fam, dict(info, n_tokens=len(fam.tokens))


def _best_path(levels, start, end):
    """Levels of the best chain (largest product of ``g - 1``) from ``start`` to
    ``end``, both included; None when there is none."""
    best = {start: (1, [start])}
    for b in levels:
        if b <= start or b > end:
            continue
        cands = [(best[a][0] * (b - a - 1), best[a][1] + [b]) for a in best if a <= b - 2]
        if cands:
            best[b] = max(cands, key=lambda t: t[0])
    return best[end][1] if end in best and end != start else None


def _certify_pool(name, family, info):
    t0 = time.perf_counter()
    rank, cert = certify(family, return_certificate=True)
    row = dict(pool=name, n_tokens=int(info["n_tokens"]), n_sequences=len(family),
               certified_min_rank=int(rank), exhaustive=bool(cert.exhaustive),
               seconds=round(time.perf_counter() - t0, 3))
    if "search_rank" in info:
        row.update(search_rank=int(info["search_rank"]),
                   search_exhaustive=bool(info["exhaustive"]))
    return row, cert


def certify_full_task(n_bits=None, *, tokens=None, pools="auto", search_nodes=200000,
                      max_sequences=None, verify=True, progress=False):
    """Certified minimum rank of the full length-3 task, over named sub-families.

    A certificate of a sub-family holds for every family that contains it. Each named
    pool of :func:`full_task_pools` (and the task itself when ``pools`` includes
    ``"task"``) is certified with :func:`~minip_learn.theory.certify`; the best
    certificate (ties: the first) is lifted to the task's tokens
    (:func:`lift_certificate`) and checked against the whole task family with
    :func:`~minip_learn.theory.verify_certificate`. Adding tokens adds sequences, so
    it never lowers what a pool certifies; with the ``"search"`` pool exhaustive, the
    result is the largest rank any R4/R5 certificate of the task can state.

    Above :data:`FULL_TASK_LISTED_BITS` bits (up to 64) the task is not listed: the
    pools are capped at ``max_sequences`` sequences, the certificate keeps the
    tokens it uses (``n_constraints`` from the closed form of
    :func:`full_task_constraint_count`), and it is checked against every sequence of
    the task by :func:`verify_full_task_certificate`.

    Parameters
    ----------
    n_bits : int, default=None
        Bits per token (every token, the zero token included).
    tokens : array-like of shape (n_tokens, n_bits), default=None
        Another token set: the full task over it.
    pools : "auto" or list of str, default="auto"
        ``"auto"``: the task itself (when it has at most 10^6 sequences) and every
        pool; or a list of pool names (``"task"`` for the task itself).
    search_nodes : int, default=200000
        Node budget of the exhaustive search of the ``"search"`` pool.
    max_sequences : int, default=None
        Cap on a pool's sequences, as in :func:`full_task_pools`.
    verify : bool, default=True
        Check the returned certificate against the full task (one pass over its
        family when listed, :func:`verify_full_task_certificate` above
        :data:`FULL_TASK_LISTED_BITS` bits; a failure raises).
    progress : bool, default=False
        Show a :mod:`tqdm` bar over the pools.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``certified_min_rank``; ``certificate`` (on the task's tokens); ``pool`` (the
        name of the pool it comes from); ``pools`` (one dict per pool tried:
        ``pool``, ``n_tokens``, ``n_sequences``, ``certified_min_rank``,
        ``exhaustive`` (certify's own search), ``seconds``, and for ``"search"``
        ``search_rank`` and ``search_exhaustive``); ``verified``; ``n_bits``,
        ``n_tokens``, ``n_sequences`` (multisets of the task), ``n_constraints``;
        ``reach`` (one line: the pools and the search's reach).

    Examples
    --------
    >>> from minip_learn.theory import certify_full_task
    >>> res = certify_full_task(4)
    >>> res.certified_min_rank, res.verified, res.pools[-1]["search_exhaustive"]
    (2, True, True)
    """
    from tqdm.auto import tqdm

    listed = _listed(n_bits, tokens)
    if listed:
        toks, full = _task_tokens(n_bits, tokens)
        m, n_tokens = toks.shape[1], len(toks)
    else:
        toks, full, m = None, True, _check_task_bits(n_bits)
        n_tokens = 1 << m
    size = full_task_size(query="all", n_tokens=n_tokens)
    names = None if isinstance(pools, str) and pools == "auto" else set(pools)
    candidates = []
    if listed and ((names is None and size <= 10**6) or (names is not None and "task" in names)):
        candidates.append(("task", full_task_family(tokens=toks), dict(n_tokens=len(toks))))
    rows, best = [], None
    generated = itertools.chain(candidates, full_task_pools(
        m, search_nodes=search_nodes, tokens=toks if listed else None,
        max_sequences=max_sequences))
    for name, fam, info in tqdm(generated, desc=f"pools m={m}", disable=not progress):
        if names is not None and name not in names:
            continue
        row, cert = _certify_pool(name, fam, info)
        rows.append(row)
        if best is None or row["certified_min_rank"] > best[0]["certified_min_rank"]:
            best = (row, cert)
    if best is None:
        raise ValueError(f"no pool of {sorted(names)} exists for this task.")
    row, cert = best
    if not listed:                        # the certificate keeps its own tokens
        n_constraints = full_task_constraint_count(m)
        cert = dataclasses.replace(cert, n_constraints=n_constraints)
        verified = bool(verify_full_task_certificate(cert, m)) if verify else False
    else:
        n_constraints = full_task_constraint_count(tokens=toks)
        if len(cert.queries) == 0:        # rank 1: no pair; the task's own certificate
            cert = certify(full_task_family(tokens=toks), return_certificate=True)[1]
        elif row["pool"] != "task":
            cert = lift_certificate(cert, toks, n_constraints=n_constraints)
        verified = bool(verify_certificate(cert, full_task_family(tokens=toks))) if verify \
            else False
    search = [r for r in rows if r["pool"] == "search"]
    reach = (f"{len(rows)} pools (largest {max(r['n_tokens'] for r in rows)} tokens, "
             f"{max(r['n_sequences'] for r in rows):,} sequences)")
    if not listed:
        reach += (f"; pools of at most {max_sequences or POOL_MAX_SEQUENCES:,} sequences; "
                  "the task is not listed")
    if search:
        s = search[0]
        reach += ("; search over " + ("(x, ~x) pairs up to bit permutations" if full
                                      else "every (query, key) pair")
                  + (": exhaustive" if s["search_exhaustive"] else
                     f": stopped at {search_nodes} nodes"))
    return Bunch(certified_min_rank=int(cert.certified_min_rank), certificate=cert,
                 pool=row["pool"], pools=rows, verified=verified, n_bits=m,
                 n_tokens=n_tokens, n_sequences=size, n_constraints=n_constraints,
                 reach=reach)
