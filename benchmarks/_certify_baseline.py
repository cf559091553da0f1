"""Certified minimum rank of a family of Min-IP sequences (THEORY R4 + R5, numpy only).

:func:`certify` reads a family of sequences and proves, from the sequences alone, a
lower bound on the rank of every nonnegative kernel head that solves the whole family:

1. **Constraints (R4).** For a query token ``x`` and keys ``y, z`` with
   ``g = <x,z> - <x,y> >= 2`` the family constrains ``alpha(x,z) / alpha(x,y) <
   1/((N-2)(g-1))`` iff it contains, up to the order of the tokens (heads are
   permutation-equivariant: a query output depends only on the query token and the
   multiset of the sequence), the three multisets
   ``S1 = {x, y^(N-1)}``, ``S2 = {x, z^(N-1)}`` and ``S3 = {x, y, z^(N-2)}``.
   Tokens may coincide with ``x`` (``y = x`` or ``z = x``); the derivation does not
   need them distinct. Only exactly these multiplicities are used (conservative).
2. **Chains.** For each query the constraints form a DAG (overlap with ``x`` strictly
   increases along an edge); ratio bounds multiply along paths, and the best bound
   from a key to another is the path with the largest product of denominators.
3. **Selection.** Pairs ``(x_i, k_i)`` are chosen greedily so that every ordered pair
   ``(i, j)``, ``i != j``, is constrained (``k_j`` reachable from ``k_i`` in the DAG of
   ``x_i``); rows are then dropped while that improves the bound.
4. **Rank (R5).** The per-pair bound ``r > n^2 / (n + sum eps_ij^2)`` (and ``r >= n``
   under diagonal dominance) in exact rational arithmetic.

Every ratio bound is ``1/K`` with an integer ``K`` (products of ``(N-2)(g-1)``), so no
floating-point rounding enters the certified integer.
"""

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from minip_learn._validation import check_sequences
from minip_learn.theory.bounds import rank_from_denominators

__all__ = ["Certificate", "certify", "family_constraints"]


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
    eps_denominators : ndarray of shape (n, n), dtype object
        The exact integers ``K[i, j]`` with ``eps[i, j] = 1/K[i, j]`` (diagonal 1).
    overlap_gaps : ndarray of shape (n, n)
        ``D[i, j] = <x_i, k_j> - <x_i, k_i>`` (diagonal 0): the overlap distance each
        chain climbs.
    chains : dict
        ``chains[(i, j)]`` is the tuple of token indices of the best chain from
        ``k_i`` to ``k_j`` in the constraint DAG of ``x_i``.
    frobenius_value : Fraction
        ``n^2 / (n + sum_{i != j} eps_ij^2)``; the rank is strictly above it.
    diagonally_dominant : bool
        Whether every row (or column) of ``eps`` sums to at most 1 off the diagonal,
        which gives rank ``n`` directly.
    n_constraints : int
        Number of ``(x, y, z)`` gap constraints found in the family.
    reason : str
        One line saying where the bound comes from.

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
    chains: dict = field(repr=False)
    frobenius_value: Fraction
    diagonally_dominant: bool
    n_constraints: int
    reason: str

    def __int__(self):
        return int(self.certified_min_rank)

    def __repr__(self):
        return (
            f"Certificate(certified_min_rank={self.certified_min_rank}, "
            f"n_queries={len(self.queries)}, seq_len={self.seq_len}, "
            f"n_bits={self.n_bits}, n_constraints={self.n_constraints})"
        )

    def summary(self):
        """A few lines explaining the certificate."""
        n = len(self.queries)
        lines = [
            f"certified minimum rank: {self.certified_min_rank}",
            f"reason: {self.reason}",
        ]
        if n >= 2:
            off = ~np.eye(n, dtype=bool)
            lengths = [len(c) - 1 for c in self.chains.values()]
            lines += [
                f"{n} queries with designated keys; every ordered pair constrained",
                f"eps_ij in [{self.eps[off].min():.3g}, {self.eps[off].max():.3g}], "
                f"overlap gaps D_ij in [{self.overlap_gaps[off].min()}, "
                f"{self.overlap_gaps[off].max()}], chain lengths "
                f"{min(lengths)}..{max(lengths)}",
                f"n^2/(n + sum eps_ij^2) = {float(self.frobenius_value):.4f}"
                + ("; diagonally dominant (rank n)" if self.diagonally_dominant else ""),
            ]
        return "\n".join(lines)


def _trivial(X, reason, n_constraints=0):
    m = X.shape[2]
    empty = np.zeros((0, m), dtype=np.uint8)
    return Certificate(
        certified_min_rank=1, seq_len=X.shape[1], n_bits=m,
        tokens=np.unique(X.reshape(-1, m).astype(np.uint8), axis=0),
        queries=empty, keys=empty,
        query_index=np.zeros(0, dtype=np.int64), key_index=np.zeros(0, dtype=np.int64),
        eps=np.zeros((0, 0)), eps_denominators=np.zeros((0, 0), dtype=object),
        overlap_gaps=np.zeros((0, 0), dtype=np.int64), chains={},
        frobenius_value=Fraction(1), diagonally_dominant=True,
        n_constraints=n_constraints, reason=reason,
    )


def family_constraints(X):
    """All gap-domination constraints (THEORY R4) a family of sequences contains.

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits)
        Binary sequences, ``seq_len >= 3`` (shorter families contain none).

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
    X, _ = check_sequences(X, binary=True)
    n_seq, N, m = X.shape
    tokens, inv = np.unique(
        X.reshape(-1, m).astype(np.uint8), axis=0, return_inverse=True
    )
    if N < 3:
        return tokens, {}, _overlap_fn(tokens)
    ids = np.asarray(inv).reshape(n_seq, N)
    srt = np.sort(ids, axis=1)
    n_distinct = 1 + (np.diff(srt, axis=1) != 0).sum(axis=1)
    multisets = np.unique(srt[n_distinct <= 3], axis=0)
    overlap = _overlap_fn(tokens)

    s1 = set()
    s3 = {}
    for row in multisets:
        c = Counter(row.tolist())
        D = list(c)
        for x in D:
            for y in D:
                need = {x: 1}
                need[y] = need.get(y, 0) + N - 1
                if need == c:
                    s1.add((x, y))
                for z in D:
                    if y == z:
                        continue
                    need = {x: 1}
                    need[y] = need.get(y, 0) + 1
                    need[z] = need.get(z, 0) + N - 2
                    if need != c:
                        continue
                    g = overlap(x, z) - overlap(x, y)
                    if g >= 2:
                        s3[(x, y, z)] = g
    edges = {}
    for (x, y, z), g in s3.items():
        if (x, y) in s1 and (x, z) in s1:
            edges.setdefault(x, []).append((y, z, (N - 2) * (g - 1)))
    for x in edges:
        edges[x].sort()
    return tokens, edges, overlap


def _overlap_fn(tokens):
    T = tokens.astype(np.int64)
    cache = {}

    def overlap(a, b):
        key = (a, b) if a <= b else (b, a)
        v = cache.get(key)
        if v is None:
            v = cache[key] = int(T[a] @ T[b])
        return v

    return overlap


def _best_chains(x, edge_list, overlap):
    """For every source key of query ``x``: best product of denominators to each node."""
    out = {}
    for y, z, K in edge_list:
        out.setdefault(y, []).append((z, K))
    nodes = sorted({y for y, _, _ in edge_list} | {z for _, z, _ in edge_list},
                   key=lambda t: (overlap(x, t), t))
    order = {t: i for i, t in enumerate(nodes)}
    result = {}
    for src in out:
        best = {src: 1}
        pred = {}
        for t in nodes[order[src]:]:
            if t not in best:
                continue
            for z, K in out.get(t, ()):
                cand = best[t] * K
                if cand > best.get(z, 0):
                    best[z] = cand
                    pred[z] = t
        del best[src]
        result[src] = (best, pred)
    return result


def _chain(pred, src, dst):
    path = [dst]
    while path[-1] != src:
        path.append(pred[path[-1]])
    return tuple(reversed(path))


def _select_pairs(reach, overlap):
    """Greedy clique of mutually constrained (query, key) pairs."""
    primary, secondary = [], []
    for x, by_src in reach.items():
        ranked = sorted(by_src, key=lambda s: (-len(by_src[s][0]), overlap(x, s), s))
        for rank, s in enumerate(ranked):
            (primary if rank == 0 else secondary).append((x, s))

    def key(pair):
        x, s = pair
        return (-len(reach[x][s][0]), overlap(x, s), x, s)

    chosen = []
    for x, s in sorted(primary, key=key) + sorted(secondary, key=key):
        if any(x == a for a, _ in chosen):
            continue
        best = reach[x][s][0]
        if all(b in best and s in reach[a][b][0] for a, b in chosen):
            chosen.append((x, s))
    return chosen


def _inv(k):
    """``1/k`` as a float, 0.0 beyond the float range (never raises on huge ints)."""
    k = int(k)
    return 0.0 if k.bit_length() > 1000 else 1.0 / k


def _prune(K):
    """Drop rows/columns while the Frobenius value improves; best exact rank wins.

    Returns the kept indices.
    """
    idx = list(range(len(K)))
    best_rank = rank_from_denominators(K)[0]
    best_idx = list(idx)
    Kf = np.array([[_inv(k) for k in row] for row in K]) if len(K) else np.zeros((0, 0))
    E2 = Kf ** 2
    np.fill_diagonal(E2, 0.0)
    while len(idx) > 2:
        sub = E2[np.ix_(idx, idx)]
        n = len(idx)
        S = sub.sum()
        value = n * n / (n + S)
        drop = S - sub.sum(axis=0) - sub.sum(axis=1)
        values = (n - 1) ** 2 / (n - 1 + drop)
        i = int(np.argmax(values))
        if not values[i] > value * (1 + 1e-12):
            break
        del idx[i]
        rank = rank_from_denominators(K[np.ix_(idx, idx)])[0]
        if rank > best_rank:
            best_rank, best_idx = rank, list(idx)
    return best_idx


def certify(X, *, return_certificate=False):
    """Certified minimum kernel rank of a family of sequences (THEORY R4-R5).

    The certificate is recomputed from the sequences themselves; nothing about how the
    family was built is trusted. The claim holds for *every* nonnegative kernel head
    (any feature maps, value map and affine readout): a head of smaller rank cannot
    solve every sequence of ``X`` with error below 1/2, so a trained model that does
    is a bug.

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits)
        Binary token sequences (one common length).
    return_certificate : bool, default=False
        Also return the :class:`Certificate` (queries, keys, eps matrix, chains...).

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
    """
    X, _ = check_sequences(X, binary=True)
    N = X.shape[1]
    if N < 3:
        cert = _trivial(X, f"seq_len={N} <= 2: gap domination needs three tokens (R1: rank 1 solves it)")
        return (1, cert) if return_certificate else 1
    tokens, edges, overlap = family_constraints(X)
    n_constraints = sum(len(v) for v in edges.values())
    if not edges:
        cert = _trivial(X, "the family contains no (S1, S2, S3) triple with gap >= 2")
        return (1, cert) if return_certificate else 1
    reach = {x: _best_chains(x, e, overlap) for x, e in edges.items()}
    chosen = _select_pairs(reach, overlap)
    n = len(chosen)
    K = np.ones((n, n), dtype=object)
    for i, (x, s) in enumerate(chosen):
        best = reach[x][s][0]
        for j, (_, t) in enumerate(chosen):
            if i != j:
                K[i, j] = best[t]
    keep = _prune(K) if n > 2 else list(range(n))
    chosen = [chosen[i] for i in keep]
    K = K[np.ix_(keep, keep)]
    n = len(chosen)
    rank, value, dominant = rank_from_denominators(K)
    if n < 2:
        cert = _trivial(X, "no two (query, key) pairs constrain each other", n_constraints)
        return (1, cert) if return_certificate else 1
    qi = np.array([x for x, _ in chosen])
    ki = np.array([s for _, s in chosen])
    D = np.array([[overlap(x, t) - overlap(x, s) for _, t in chosen] for x, s in chosen])
    chains = {
        (i, j): _chain(reach[x][s][1], s, t)
        for i, (x, s) in enumerate(chosen)
        for j, (_, t) in enumerate(chosen)
        if i != j
    }
    eps = np.array([[_inv(k) for k in row] for row in K])
    np.fill_diagonal(eps, 1.0)
    cert = Certificate(
        certified_min_rank=int(rank), seq_len=N, n_bits=X.shape[2], tokens=tokens,
        queries=tokens[qi], keys=tokens[ki], query_index=qi, key_index=ki,
        eps=eps, eps_denominators=K, overlap_gaps=D, chains=chains,
        frobenius_value=value, diagonally_dominant=bool(dominant),
        n_constraints=n_constraints,
        reason=(
            f"{n} mutually constrained (query, key) pairs; R5 per-pair bound "
            + ("(diagonal dominance)" if dominant else f"r > {float(value):.4f}")
        ),
    )
    return (int(rank), cert) if return_certificate else int(rank)

