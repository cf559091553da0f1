"""Certified minimum rank of a family of Min-IP sequences (numpy only).

:func:`certify` reads a family of sequences and proves, from the sequences alone, a
lower bound on the rank of every nonnegative kernel head that solves the whole family
(see the theory page, :ref:`theory-r4` and :ref:`theory-r5`). It runs four stages
(:data:`STAGES`), each once, in order:

1. **constraints** (R4, :func:`~minip_learn.theory._constraints.constraints`). For a
   query token ``x`` and keys ``y, z`` with ``g = <x,z> - <x,y> >= 2`` the family
   constrains ``alpha(x,z) / alpha(x,y) < 1/((N-2)(g-1))`` iff it contains, up to the
   order of the tokens (heads are permutation-equivariant: a query output depends only
   on the query token and the multiset of the sequence), the three multisets
   ``S1 = {x, y^(N-1)}``, ``S2 = {x, z^(N-1)}`` and ``S3 = {x, y, z^(N-2)}``.
   Tokens may coincide with ``x`` (``y = x`` or ``z = x``); the derivation does not
   need them distinct. Only exactly these multiplicities are used (conservative).
   With ``positional=True`` (final-query families held as arrays) a triple counts
   only when S3 occurs in every order of its keys: the constraint then binds the
   final query's kernel summed over the key positions, a nonnegative kernel of the
   same rank, so the certificate covers position-dependent maps too.
2. **reach** (:func:`~minip_learn.theory._constraints.reach`). For each query the
   constraints form a DAG (overlap with ``x`` strictly increases along an edge);
   ratio bounds multiply along paths, and the best bound from a key to another is the
   path with the largest product of denominators.
3. **search** (:func:`~minip_learn.theory._search.search`). A *candidate* is a pair
   (query ``x``, designated key ``s``); two candidates are compatible when each one's
   key is reachable from the other's in the other's DAG. A certificate is a set of
   mutually compatible candidates (a clique). The searches of
   :data:`~minip_learn.theory._search.SEARCHES` are run -- greedy by degree, greedy in
   order of reach, greedy on one candidate per query (each followed by dropping rows
   while that improves the bound), and an exhaustive branch and bound where the
   candidate set is small -- and the best set wins. The same searches then run on the
   family's *token pools* (:func:`~minip_learn.theory._pools.weight_pools`: the tokens
   of one Hamming weight, and of two weights ``w`` and ``n_bits - w``): a pool's
   sub-family (the sequences whose tokens all lie in it) holds exactly the triples
   whose three tokens do, so its set is a set of the whole family, and it wins when it
   certifies more. A pool is searched only when it is a proper part of the family and
   holds enough queries that reach enough keys to beat the best set found.
4. **bound** (R5). The per-pair bound ``r > n^2 / (n + sum eps_ij^2)`` (and ``r >= n``
   under diagonal dominance): :func:`~minip_learn.theory.bounds.rank_from_denominators`
   for the certificate, :func:`~minip_learn.theory.bounds.rank_from_sums` for every
   estimate and search bound; then the :class:`~minip_learn.theory.Certificate`.

Every ratio bound is ``1/K`` with an integer ``K`` (products of ``(N-2)(g-1)``): the
certified integer is computed in exact rational arithmetic, and the floats that steer
the searches are decided near an integer from these exact values
(:func:`~minip_learn.theory.bounds.resolve_near_integer`). A certificate can be written to
JSON (:meth:`Certificate.to_json`) and checked by
:func:`~minip_learn.theory.verify_certificate`, which shares no code with this module.
"""

import hashlib
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from .._memory import trim_heap
from .._progress import stages
from .._validation import check_sequences
from ..compact import is_compact
from ._constraints import (
    Constraints,
    constraints,
    constraints_reference,
    reach,
    reach_reference,
)
from ._pools import weight_pools
from ._search import search
from ._selection import reciprocals
from .bounds import rank_from_denominators
from .certificate import (
    JSON_VERSIONS,  # noqa: F401  (the versions read, documented here)
    QUERY_MODES,
    Certificate,
    ChainTrees,
    int64_if_fits,
)

__all__ = []  # public home: the package minip_learn.theory

#: the stages of :func:`certify`, in the order they run (``progress=True`` names them)
STAGES = ("constraints", "reach", "search", "bound")


def certify(X, *, query="all", positional=False, return_certificate=False,
            progress=False):
    """Certified minimum kernel rank of a family of sequences.

    The certificate is recomputed from the sequences themselves; nothing about how the
    family was built is trusted (see the theory page, :ref:`theory-r4` and
    :ref:`theory-r5`). The claim holds for *every* nonnegative kernel head (any feature
    maps and value map, an affine readout that may depend on the query): a head of
    smaller rank cannot solve every sequence of ``X`` with error below 1/2, so a
    trained model that does is a bug.

    Adding sequences never lowers the result where the search is exhaustive (small
    candidate sets); on larger families several searches are run and the best
    certificate found is returned. Adding tokens never lowers it below what the
    family's token pools certify: the sub-family of the tokens of one Hamming weight,
    and of two weights ``w`` and ``n_bits - w``, are searched too, and a certificate
    found there is returned as one of the whole family (it verifies against ``X``).

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
    progress : bool, default=False
        Show a progress bar (:mod:`tqdm`, on standard error) naming each stage as it
        runs: ``constraints``, ``reach``, ``search``, ``bound`` (:data:`STAGES`).

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
    cert = _certify(X, query=query, positional=bool(positional), progress=progress)
    return (cert.certified_min_rank, cert) if return_certificate else cert.certified_min_rank


def _certify(X, *, reference=False, query="all", positional=False, progress=False):
    """Certificate of a validated binary family, stage by stage (:data:`STAGES`);
    ``reference``: the plain-Python constraints and chains."""
    with stages("certify", STAGES, progress) as bar:
        bar.start("constraints")
        cons = _find_constraints(X, query, positional, reference)
        pools = _token_pools(cons)
        bar.start("reach")
        chains = _find_chains(cons, reference, release=not pools)
        bar.start("search")
        selection = _search_pools(cons, chains, pools, reference)
        bar.start("bound")
        bound = _bound(selection)
        return _certificate(cons, selection, bound, query=query, positional=positional)


def _find_constraints(X, query, positional, reference):
    """The R4 triples of ``X`` (:class:`~._constraints.Constraints`)."""
    if not is_compact(X) and X.dtype != np.uint8:
        X = X.astype(np.uint8)
    if reference:
        return constraints_reference(X, query, positional)
    return constraints(X, query, positional)


def _find_chains(cons, reference, release=True):
    """The best chains of ``cons`` (:class:`~._constraints.Reach`); the triples are
    released then (the chains hold what the search needs), unless ``release=False``
    (the pools still read them)."""
    chains = reach_reference(cons) if reference else reach(cons, drop_single=True)
    if release:
        cons.release()
        trim_heap()
    return chains


def _token_pools(cons):
    """The pools of :func:`~._pools.weight_pools` that may name a proper sub-family of
    ``cons``: each as ``(name, in_pool)``, a boolean per token, keeping a token of the
    triples out (else the pool's triples are all of them)."""
    if len(cons) < 2:                       # a sub-family holds at most one triple
        return []
    used = np.zeros(len(cons.tokens), dtype=bool)
    for column in (cons.x, cons.y, cons.z):
        used[column] = True
    return [(name, mask) for name, mask in weight_pools(cons.tokens)
            if (used & ~mask).any() and (used & mask).sum() >= 2]


def _search_pools(cons, chains, pools, reference):
    """The best :class:`~._search.Selection` of the family and of its pools.

    A pool's sub-family (the sequences whose tokens all lie in the pool) holds exactly
    the triples of ``cons`` whose three tokens lie in it, so its selection is made
    from those triples, on the family's token indices: it is a selection of the whole
    family, whose chains are those of a sub-family. A pool is searched only when it
    could certify more than the best so far (:func:`_pool_limit`) and its triples
    differ from those of every pool searched before; a selection from a pool
    replaces the best one only when it certifies more, and is then not exhaustive
    (the whole family holds sets the pool's search did not see). ``cons`` is released
    at the end.
    """
    best = search(cons, chains)
    seen = set()
    for _, in_pool in pools:
        floor = best.found.rank if best is not None else 1
        keep = in_pool[cons.x] & in_pool[cons.y] & in_pool[cons.z]
        digest = hashlib.blake2b(np.packbits(keep).tobytes(), digest_size=16).digest()
        if digest in seen or _pool_limit(cons, keep, floor) <= floor:
            continue
        seen.add(digest)
        sub = _sub_constraints(cons, keep)
        found = search(sub, _find_chains(sub, reference))
        if found is not None and found.found.rank > floor:
            best = replace(found, found=replace(found.found, exhaustive=False))
    if pools:
        cons.release()
        trim_heap()
    return best


def _pool_limit(cons, keep, floor):
    """An upper limit on the rank the triples ``keep`` of ``cons`` can certify, cheap
    beside the search: a set of more than ``floor`` (query, key) pairs has distinct
    queries, each reaching the more than ``floor - 1`` keys of the others, so each
    query keeps triples to at least ``floor`` distinct keys ``z``; the rank is at most
    the number of pairs (R5)."""
    if not keep.any():
        return 1
    T = np.int64(len(cons.tokens))
    reached = np.unique(cons.x[keep].astype(np.int64) * T + cons.z[keep])
    per_query = np.bincount(reached // T, minlength=int(T))
    return max(1, int((per_query >= floor).sum()))


def _sub_constraints(cons, keep):
    """The triples ``keep`` of ``cons`` (on the same tokens)."""
    K = None if cons._K is None else cons._K[keep]
    return Constraints(cons.tokens, cons.seq_len, cons.x[keep], cons.y[keep],
                       cons.z[keep], K, cons.gap[keep])


@dataclass(frozen=True)
class _Bound:
    """The R5 bound of a selection's pairs (:func:`_bound`)."""

    denominators: np.ndarray
    rank: int
    value: Fraction
    dominant: bool


def _bound(selection):
    """The R5 bound of the pairs of ``selection``; None below two pairs."""
    if selection is None or len(selection.found.members) < 2:
        return None
    K = selection.denominators()
    rank, value, dominant = rank_from_denominators(K)
    return _Bound(K, int(rank), value, bool(dominant))


def _certificate(cons, selection, bound, *, query, positional):
    """The :class:`Certificate` of the stages' results."""
    tokens, N = cons.tokens, cons.seq_len
    if bound is None:
        return _trivial(tokens, N, _no_pairs_reason(cons, query, positional),
                        cons.n_triples, query=query, positional=positional)
    qi, ki = selection.pairs()
    K, n = bound.denominators, len(qi)
    eps = reciprocals(K)
    np.fill_diagonal(eps, 1.0)
    return Certificate(
        certified_min_rank=bound.rank, seq_len=N, n_bits=tokens.shape[1], tokens=tokens,
        queries=tokens[qi], keys=tokens[ki], query_index=qi, key_index=ki, eps=eps,
        eps_denominators=K.astype(np.int64) if K.dtype != object else int64_if_fits(K),
        overlap_gaps=selection.overlap_gaps(cons.overlap, tokens.shape[1]),
        parents=ChainTrees(*selection.chain_trees()), frobenius_value=bound.value,
        diagonally_dominant=bound.dominant, n_constraints=cons.n_triples,
        reason=(
            f"{n} mutually constrained (query, key) pairs; R5 per-pair bound "
            + ("(diagonal dominance)" if bound.dominant else f"r > {float(bound.value):.4f}")
        ),
        strategy=selection.found.strategy, exhaustive=bool(selection.found.exhaustive),
        query=query, positional=positional,
    )


def _no_pairs_reason(cons, query, positional):
    """Why a family certifies rank 1 only."""
    if cons.seq_len < 3:
        return (f"seq_len={cons.seq_len} <= 2: gap domination needs three tokens "
                "(R1: rank 1 solves it)")
    if not cons.n_triples:
        return ("the family contains no (S1, S2, S3) triple with gap >= 2"
                + (" and the query last" if query == "last" else "")
                + (" in every order of its keys" if positional else ""))
    return "no two (query, key) pairs constrain each other"


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
