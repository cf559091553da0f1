"""Witness suites: families of Min-IP sequences with a certified minimum kernel rank.

numpy only: the codes, designs, families and certificates come from the public API of
:mod:`minip_learn.theory` (see the theory page, :ref:`theory-witness`).
"""

import itertools
import math

import numpy as np
from sklearn.utils import Bunch, check_random_state

from .. import compact
from .._progress import stages
from .._validation import check_int, distinct_tokens
from ..compact import CompactFamily
from ..theory import (
    block_designs,
    certify,
    complement_closed_code,
    describe_blocks,
    design_rank,
    exact_family,
    exact_family_size,
    exact_seq_len,
    greedy_constant_weight_code,
    hadamard_code,
    hadamard_orders,
    product_code,
    product_code_bound,
    witness_denominators,
    witness_family,
)
from ..theory.design import LADDER_GAPS
from ._minip import check_query, last_slots, seed_param

__all__ = ["make_witness_suite"]

CONSTRUCTIONS = ("auto", "hadamard", "hadamard-half", "product", "greedy", "small", "exact")

#: certified rank targeted by ``construction="small"`` (the paper's witness suite: r >= 8)
SMALL_TARGET = 8

_DESCR = """\
Min-IP witness suite ({construction})
------------------------------------
{n_sequences} sequences of length {seq_len} over {n_tokens} distinct {n_bits}-bit tokens.
Code: {code}; {n_queries} queries x_i with keys k_i = ~x_i (overlap 0) and overlap
distance d_ij = |x_i| - <x_i, x_j> >= {min_distance} to the other keys. For each query:
S1 = (x_i, t, ..., t) for t = k_i, every ladder token and every other key, and
S3 = (x_i, a, b, ..., b) for every ladder step and, for every other key k_j, from the
ladder token w_(i,t) to k_j (ladder gap: {ladder_gap}; longest ladder {ladder_steps} steps).
R4 (theory page) bounds alpha(x_i, k_j)/alpha(x_i, k_i) by a product of 1/((N-2)(g-1)) along
each chain, and R5 turns the approximate identity into a rank bound:
every nonnegative kernel head that solves all sequences has rank >= {certified_min_rank}
(recomputed from the sequences by minip_learn.theory.certify; the design predicts
{design_bound}). Rank {constructive_rank} (one feature per token, R3 of the theory page) solves it.{query_text}
"""

_FINAL_QUERY_TEXT = """
Final-query form: in every sequence the query x_i is the last token and the sequence's
single target is that of x_i; the certificate uses only these final positions."""

_EVERY_ORDER_TEXT = """
Every order: each sequence's keys (the tokens before the query) are listed in every
distinct order, so the certificate (certify(..., positional=True)) also binds
position-dependent feature maps, values and readouts."""

ORDERS = ("fixed", "all")


class _Design:
    """A code with its designed denominators; prefixes of it are candidate families."""

    def __init__(self, name, code_desc, words, seq_len, ladder_gap):
        self.name = name
        self.code_desc = code_desc
        self.words = words
        self.ladder_gap = ladder_gap
        self.K, self.steps, self.dist = witness_denominators(words, seq_len, ladder_gap=ladder_gap)

    def size(self, n):
        return int(n * (2 * n - 1) + 2 * self.steps[:n, :n].max(axis=1, initial=0).sum())

    def rank(self, n):
        return design_rank(self.K[:n, :n])

    def largest_fitting(self, max_sequences):
        lo, hi = 0, len(self.words)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.size(mid) <= max_sequences:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _with_gaps(name, code_desc, words, seq_len, ladder_gap):
    gaps = LADDER_GAPS if ladder_gap == "auto" else (ladder_gap,)
    out = []
    for g in gaps:
        try:
            out.append(_Design(name, code_desc, words, seq_len, g))
        except ValueError:
            pass
    return out


def _hadamard_designs(n_bits, seq_len, ladder_gap, half, rng):
    orders = [h for h in hadamard_orders(n_bits) if h >= 8]
    if not orders:
        return []
    h = orders[-1]
    words = hadamard_code(h, half=half)
    words = np.concatenate([words, np.zeros((len(words), n_bits - h), dtype=np.uint8)], axis=1)
    if rng is not None:
        words = words[rng.permutation(len(words))]
    desc = describe_blocks([(h, half)], n_bits)
    return _with_gaps("hadamard-half" if half else "hadamard", desc, words, seq_len, ladder_gap)


def _product_designs(n_bits, seq_len, ladder_gap, max_sequences):
    """Best multi-block product codes (any full/half mix), cut to the queries that fit.

    A product code is kept whole when its family fits ``max_sequences``; otherwise its
    first ``n`` words (``2 n^2`` sequences about fill the budget) are a candidate. Each
    code is scored by ``n / (1 + S)`` with ``S`` the R5 row sum of the whole code (a
    prefix's rows have a subset of those pairs); the two best are built.
    """
    n_fit = int(np.sqrt(max_sequences / 2)) + 1
    scored = []
    seen = set()
    for combo in block_designs(n_bits, max_blocks=4):
        orders = tuple(h for h, _ in combo)
        if len(orders) < 2 or orders in seen:
            continue
        seen.add(orders)
        for halves in itertools.product((False, True), repeat=len(orders)):
            blocks = tuple(zip(orders, halves))
            n = int(np.prod([(h - 1) if half else (2 * h - 2) for h, half in blocks]))
            if n > 8 * n_fit:
                continue
            for g in (LADDER_GAPS if ladder_gap == "auto" else (ladder_gap,)):
                try:
                    r = product_code_bound(blocks, seq_len, ladder_gap=g, n_bits=n_bits)
                except ValueError:
                    continue
                n_used = min(n, n_fit)
                score = n_used / (1 + (n / r["frobenius_value"] - 1)) if n_used < n else r["rank"]
                scored.append((score, -min(r["n_sequences"], 2 * n_fit ** 2), g is None,
                               blocks, n_used))
    out = []
    for _, _, _, blocks, n_used in sorted(scored, key=lambda c: c[:3], reverse=True)[:2]:
        words = product_code(blocks, n_bits=n_bits)[:n_used]
        out += _with_gaps("product", describe_blocks(blocks, n_bits), words, seq_len, ladder_gap)
    return out


def _greedy_designs(n_bits, seq_len, ladder_gap, max_sequences, random_state):
    w = n_bits // 2
    out = []
    for D in range(2, w + 1):
        words = greedy_constant_weight_code(
            n_bits, w, D, max_words=max(2, int(np.sqrt(max_sequences / 2)) + 1),
            random_state=random_state,
        )
        if len(words) >= 2:
            out += _with_gaps("greedy", f"greedy constant-weight (w={w}, d>={D})", words,
                              seq_len, ladder_gap)
    return out


def make_witness_suite(
    n_bits=24,
    seq_len=None,
    *,
    construction="auto",
    max_sequences=5000,
    n_queries=None,
    ladder_gap="auto",
    query="all",
    orders="fixed",
    random_state=None,
    progress=False,
):
    """Load a witness suite: Min-IP sequences that force a large kernel rank (:ref:`theory-r6`).

    Queries ``x_i`` come from a constant-weight code, keys are their complements
    ``k_i = ~x_i``; for every query the suite holds the gap-domination triples of
    :ref:`theory-r4` (``S1 = (x_i, t, ..., t)``, ``S3 = (x_i, a, b, ..., b)``) from ``k_i`` to
    every other key, directly or through a ladder of intermediate tokens. Every
    nonnegative kernel head that solves all sequences has rank at least
    ``certified_min_rank`` (recomputed from the sequences by
    :func:`minip_learn.theory.certify`), while the exact kernel realisation of R3 with
    one feature per token (``constructive_rank``) solves them all.

    At ``n_bits=24, seq_len=3`` the default is the family of :ref:`theory-r6`: 46 words of
    weight 12 from the Paley Hadamard matrix of order 24, ``(x_i, k_i, k_i)`` and for
    every other key ``(x_i, k_j, k_j), (x_i, k_i, k_j)``: 4,186 sequences, certified
    rank 17, constructive rank 46.

    Parameters
    ----------
    n_bits : int, default=24
        Bits per token ``m`` (``>= 8``).
    seq_len : int or None, default=None
        Sequence length ``N >= 3`` (longer sequences shrink ``eps`` as ``1/(N-2)``).
        None means 3, or for ``construction="exact"`` the smallest length at which the
        family's minimum rank is exact (:func:`~minip_learn.theory.exact_seq_len`).
    construction : {"auto", "hadamard", "hadamard-half", "product", "greedy", \
"small"}, default="auto"
        * ``"hadamard"``: the Hadamard code of the largest constructible order
          ``h <= n_bits`` (Paley for ``q + 1``, ``q = 3 mod 4`` prime; Sylvester
          otherwise) with negations, zero-padded to ``n_bits``;
        * ``"hadamard-half"``: the same without negations (no query is another's key);
        * ``"product"``: the best product of several Hadamard codes whose family fits
          ``max_sequences`` (more words at smaller distance);
        * ``"greedy"``: greedy constant-weight codes (any size);
        * ``"small"``: a Hadamard prefix with the fewest queries reaching a certified
          rank of 8, the bound of the paper's 1,272-sequence witness suite (190
          sequences at m = 24);
        * ``"auto"``: the candidate with the highest certified bound whose family has at
          most ``max_sequences`` sequences (ties: the smaller family);
        * ``"exact"``: the family of :ref:`theory-r9` on a complement-closed
          constant-weight code of weight ``n_bits/2`` and distance ``>= 4``
          (:func:`~minip_learn.theory.complement_closed_code`; ``n_bits`` even): the
          R4 sequences of every ordered pair of words, single steps. At
          ``seq_len >= exact_seq_len`` the certificate is diagonally dominant, the
          certified rank equals the number of words (one feature per token solves
          it), and ``exact_min_rank`` reports it. The code is cut to its first
          complement pairs to fit ``max_sequences`` (or to ``n_queries`` words).
    max_sequences : int, default=5000
        Largest family allowed; codes are cut to their first queries to fit.
    n_queries : int, default=None
        Use exactly the first ``n_queries`` words of the code (None: as many as fit).
    ladder_gap : "auto", None or int, default="auto"
        Overlap gap of the ladder steps (``>= 2``); None uses single steps only;
        ``"auto"`` picks the best (ties: the smaller family).
    query : {"all", "last"}, default="all"
        ``"last"``: final-query Min-IP. Every sequence ``(x_i, a, b, ..., b)`` is
        rewritten with its query ``x_i`` (the design's, whatever the order of the
        slots) last: ``(a, b, ..., b, x_i)``; ``y`` is the target of that final token
        only, and the certificate is computed with ``certify(..., query="last")``.
        As in the full form, ``X`` is materialised only when it fits
        :data:`~minip_learn.compact.MATERIALIZE_MAX_BYTES`; a larger family is
        certified in multiset form (``X`` None; ``y`` is always given). For
        ``construction="exact"`` the sequences that the multiset form shares between
        two queries are listed once per query (``n (2n - 1)`` sequences,
        :func:`~minip_learn.theory.exact_family` with ``unique=False``), and
        ``max_sequences`` bounds that number.
    orders : {"fixed", "all"}, default="fixed"
        With ``query="last"``: ``"all"`` lists every sequence's keys (its first
        ``N - 1`` tokens) in every distinct order -- an S3 ``(a, b, ..., b, x_i)`` as
        the ``N - 1`` sequences with ``a`` at each key position -- and certifies with
        ``certify(..., query="last", positional=True)``: the bound then holds for
        position-dependent maps too (:ref:`theory-positional`). On a family in one
        fixed order such maps can exploit the order (the smaller key always first).
        ``max_sequences`` bounds the family before the orders are listed; ``X`` has
        about ``N - 1`` times as many sequences and is always materialised (a
        ``ValueError`` when it would take more than
        :data:`~minip_learn.compact.MATERIALIZE_MAX_BYTES`).
    random_state : int, RandomState instance or None, default=None
        None gives the canonical family (the first words, sequences in construction
        order). Otherwise the code words are shuffled before the first ones are taken
        and the sequences are returned in random order.
    progress : bool, default=False
        Show a :mod:`tqdm` bar naming each stage (design, family, certify) as it runs:
        large families (the exact ``m = 16`` family, millions of sequences) take
        seconds to minutes.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        ``family``: the sequences in multiset form
        (:class:`~minip_learn.compact.CompactFamily`), with its arrays ``tokens``
        (the distinct tokens, ``np.unique`` order), ``token_ids`` (n_sequences, k;
        -1 padding) and ``counts`` (n_sequences, k), and ``slot_targets`` (n_sequences,
        k) the exact target of every slot; ``X`` (n_sequences, seq_len, n_bits) uint8
        and ``y`` its exact targets, materialised only when ``X`` takes at most
        :data:`~minip_learn.compact.MATERIALIZE_MAX_BYTES` (256 MiB), None otherwise
        (``family.iter_sequences()`` yields ``X`` in slices); ``queries`` and ``designated_keys`` (their complements;
        ``keys`` would shadow ``dict.keys``); ``certified_min_rank`` (from
        :func:`~minip_learn.theory.certify`); ``design_bound`` (predicted from the
        design, never above ``certified_min_rank``); ``constructive_rank`` (number of
        distinct tokens); ``certificate``; ``construction`` (the one used);
        ``params`` (the arguments, and ``code`` and ``ladder_steps`` saying what was
        built: ``make_witness_suite(**params)`` without those two rebuilds the family);
        ``exact_min_rank`` (the minimum rank when the certified rank equals the
        constructive rank, else None); ``query``; ``orders``; ``DESCR``. With ``query="last"``:
        ``X`` (n_sequences, seq_len, n_bits) with every query last (None above the
        limit), ``y`` (n_sequences,) the target of the final token, and ``family`` the
        same sequences in multiset form with the query in the last real slot (so that
        ``family.to_sequences()`` is ``X``); ``params`` then holds ``query``. With
        ``orders="all"``: ``X`` and ``y`` list every order, ``family`` row ``i`` is the
        multiset of ``X[i]`` (its ``to_sequences()`` in one order), ``orders`` and
        ``params["orders"]`` say so, and the certificate is positional.

    Raises
    ------
    ValueError
        On invalid arguments, or when no construction fits ``max_sequences``, or
        with ``orders="all"`` when ``X`` would be larger than
        :data:`~minip_learn.compact.MATERIALIZE_MAX_BYTES`.

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> suite = make_witness_suite()
    >>> suite.X.shape, suite.certified_min_rank, suite.constructive_rank
    ((4186, 3, 24), 17, 46)
    >>> small = make_witness_suite(construction="small")
    >>> len(small.X), small.certified_min_rank
    (190, 8)
    >>> last = make_witness_suite(query="last")
    >>> last.X.shape, last.y.shape, last.certified_min_rank
    ((4186, 3, 24), (4186,), 17)
    """
    n_bits, seq_len, max_sequences, n_queries, ladder_gap, rng = _check_suite_params(
        n_bits, seq_len, construction, max_sequences, n_queries, ladder_gap, random_state)
    query = check_query(query)
    orders = _check_orders(orders, query)
    with stages("witness suite", ("design", "family", "certify"), progress) as bar:
        if construction == "exact":
            return _exact_suite(n_bits, seq_len, max_sequences, n_queries, rng, random_state,
                                query, orders, bar)
        bar.start("design")
        seq_len = 3 if seq_len is None else seq_len
        # the candidate designs are not kept: the other codes' matrices can be large
        design_bound, d, n = _choose_design(
            _candidate_designs(n_bits, seq_len, construction, max_sequences, ladder_gap, rng),
            construction, n_bits, seq_len, max_sequences, n_queries)
        words = d.words[:n]
        steps = d.steps[:n, :n]
        if orders == "all":
            _check_materializable(d.size(n), seq_len, n_bits)
        bar.start("family")
        family = witness_family(words, seq_len, ladder_gap=d.ladder_gap, steps=steps,
                                compact=True)
        family = _query_last(family) if query == "last" else family
        family, X = _ordered(family, orders, rng)
        bar.start("certify")
        rank, cert = certify(family if X is None else X, query=query,
                             positional=orders == "all", return_certificate=True,
                             progress=progress)
    params = dict(
        n_bits=n_bits, seq_len=seq_len, construction=construction, code=d.code_desc,
        n_queries=int(n), ladder_gap=d.ladder_gap,
        ladder_steps=int(steps.max(initial=0)), max_sequences=max_sequences,
        random_state=seed_param(random_state),
    )
    _mode_params(params, query, orders)
    off = ~np.eye(n, dtype=bool)
    min_distance = int(d.dist[:n, :n][off].min()) if n > 1 else 0
    return _suite_bunch(family, d.name, d.code_desc, min_distance, words, rank, cert,
                        design_bound, params, query, X)


def _check_suite_params(n_bits, seq_len, construction, max_sequences, n_queries, ladder_gap,
                        random_state):
    """Validated arguments of :func:`make_witness_suite`, and its random state (or None)."""
    n_bits = check_int(n_bits, "n_bits", min_value=8)
    seq_len = check_int(seq_len, "seq_len", min_value=3, allow_none=True)
    if not isinstance(construction, str) or construction not in CONSTRUCTIONS:
        raise ValueError(f"construction must be one of {list(CONSTRUCTIONS)}; got {construction!r}.")
    max_sequences = check_int(max_sequences, "max_sequences", min_value=1)
    n_queries = check_int(n_queries, "n_queries", min_value=2, allow_none=True)
    if not (ladder_gap is None or ladder_gap == "auto"):
        ladder_gap = check_int(ladder_gap, "ladder_gap", min_value=2)
    rng = None if random_state is None else check_random_state(random_state)
    return n_bits, seq_len, max_sequences, n_queries, ladder_gap, rng


def _candidate_designs(n_bits, seq_len, construction, max_sequences, ladder_gap, rng):
    """The designs ``construction`` draws from (each with every ladder gap tried)."""
    designs = []
    if construction in ("auto", "hadamard", "small"):
        designs += _hadamard_designs(n_bits, seq_len, ladder_gap, False, rng)
    if construction in ("auto", "hadamard-half"):
        designs += _hadamard_designs(n_bits, seq_len, ladder_gap, True, rng)
    if construction in ("auto", "product"):
        designs += _product_designs(n_bits, seq_len, ladder_gap, max_sequences)
    if construction == "greedy" or (construction == "auto" and n_bits <= 14):
        seed = 0 if rng is None else rng
        designs += _greedy_designs(n_bits, seq_len, ladder_gap, max_sequences,
                                   None if n_bits <= 14 and rng is None else seed)
    if not designs:
        raise ValueError(
            f"no {construction!r} witness design exists for n_bits={n_bits}, "
            f"seq_len={seq_len} (queries need overlap distance >= 2)."
        )
    return designs


def _choose_design(designs, construction, n_bits, seq_len, max_sequences, n_queries):
    """The design and number of queries of the suite, with its design bound.

    Returns ``(design_bound, design, n)``: for ``"small"`` the fewest queries reaching
    ``SMALL_TARGET``, otherwise the highest design bound that fits ``max_sequences``
    (ties: the smaller family, then ladders before single steps).
    """
    candidates = []
    for d in designs:
        n_max = len(d.words)
        if n_queries is not None:
            if n_queries > n_max:
                continue
            ns = [n_queries]
        elif construction == "small":
            ns = [n for n in range(2, n_max + 1) if d.rank(n) >= SMALL_TARGET][:1] or [n_max]
        else:
            ns = [d.largest_fitting(max_sequences)]
        for n in ns:
            if n < 2 or d.size(n) > max_sequences:
                continue
            candidates.append((d.rank(n), -d.size(n), d.ladder_gap is None, d, n))
    if not candidates:
        raise ValueError(
            f"no {construction!r} witness suite with n_bits={n_bits}, seq_len={seq_len}"
            + (f", n_queries={n_queries}" if n_queries is not None else "")
            + f" fits max_sequences={max_sequences}; raise max_sequences or lower n_queries."
        )
    if construction == "small":
        candidates.sort(key=lambda c: (c[0] < SMALL_TARGET, c[1] * -1, -c[0]))
        design_bound, _, _, d, n = candidates[0]
    else:
        design_bound, _, _, d, n = max(candidates, key=lambda c: c[:3])
    return design_bound, d, n


def _check_materializable(n_sequences, seq_len, n_bits):
    """The ``ValueError`` of an every-order family too large to materialise."""
    nbytes = int(n_sequences) * int(seq_len) * int(n_bits)
    limit = compact.MATERIALIZE_MAX_BYTES    # read at call time: a user may set it
    if nbytes > limit:
        raise ValueError(
            f'orders="all" families are materialised, and this one would take {nbytes} '
            f"bytes ({n_sequences} sequences of length {seq_len} over {n_bits} bits), more "
            f"than MATERIALIZE_MAX_BYTES={limit}; lower max_sequences, "
            'n_queries or seq_len, or use orders="fixed" (kept in multiset form).')


def _check_orders(orders, query):
    if not isinstance(orders, str) or orders not in ORDERS:
        raise ValueError(f"orders must be one of {list(ORDERS)}; got {orders!r}.")
    if orders == "all" and query != "last":
        raise ValueError('orders="all" needs query="last": the keys are the tokens before '
                         f"the final query; got query={query!r}.")
    return orders


def _mode_params(params, query, orders):
    """Record the non-default ``query`` and ``orders`` in ``params``."""
    if query == "last":
        params["query"] = query
    if orders == "all":
        params["orders"] = orders


def _ordered(family, orders, rng):
    """``(family, X)``: the final-query family in every order of its keys
    (``orders="all"``: ``X`` materialised, ``family`` row ``i`` the multiset of
    ``X[i]``), or unchanged with ``X = None``; shuffled when ``rng`` is given."""
    X = None
    if orders == "all":
        fixed = family.to_sequences()
        rows = _key_orders(fixed)          # a ValueError when they would not fit
        X = fixed[rows[:, 0, None], rows[:, 1:]]
        family = family[rows[:, 0]]
    if rng is not None:
        perm = rng.permutation(len(family))
        family = family[perm]
        X = None if X is None else X[perm]
    return family, X


def _key_orders(X):
    """Every distinct order of each sequence's keys (its first ``N - 1`` tokens), the
    final token kept last: rows ``(i, p_1, ..., p_N)`` mean ``X[i, [p_1 .. p_N]]``.

    The sequences are grouped by the pattern of their keys (for each key position, the
    first position holding the same token), and each pattern's distinct orders are
    listed once; a ``ValueError`` names the size when they would not fit in memory.
    """
    n, N, m = X.shape
    keys = np.packbits(X[:, :-1], axis=2).reshape(n, N - 1, -1)
    same = (keys[:, :, None, :] == keys[:, None, :, :]).all(axis=3)
    patterns, inverse = np.unique(np.argmax(same, axis=2), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    sizes = [math.factorial(N - 1) // math.prod(math.factorial(c) for c in
                                                np.unique(p, return_counts=True)[1])
             for p in patterns]
    _check_materializable(sum(int(s) * int(np.count_nonzero(inverse == k))
                              for k, s in enumerate(sizes)), N, m)
    out = []
    for k, pattern in enumerate(patterns):
        rows = np.flatnonzero(inverse == k)
        perms = np.array(_distinct_orders(pattern.tolist()), dtype=np.int64)
        idx = np.broadcast_to(perms[None], (len(rows), *perms.shape)).reshape(-1, N - 1)
        src = np.repeat(rows, len(perms))
        out.append(np.column_stack([src, idx, np.full(len(src), N - 1)]))
    out = np.concatenate(out)
    return out[np.lexsort(out[:, ::-1].T)]


def _distinct_orders(values):
    """The distinct permutations of ``values`` (a list with repeats) in lexicographic
    order (the next-permutation step: no repeated order is listed)."""
    a = sorted(values)
    out = [list(a)]
    while True:
        i = len(a) - 2
        while i >= 0 and a[i] >= a[i + 1]:
            i -= 1
        if i < 0:
            return out
        j = len(a) - 1
        while a[j] <= a[i]:
            j -= 1
        a[i], a[j] = a[j], a[i]
        a[i + 1:] = reversed(a[i + 1:])
        out.append(list(a))


def _query_last(family):
    """The family with each row's query (slot 0, the design's query) moved to the last
    real slot: materialised, every sequence ends with its query."""
    ids, cnt = family.token_ids, family.counts
    k = ids.shape[1]
    r = (ids >= 0).sum(axis=1, keepdims=True)          # real slots, padding after them
    j = np.arange(k)[None, :]
    src = np.where(j < r - 1, j + 1, np.where(j == r - 1, 0, j))
    return CompactFamily(family.tokens, np.take_along_axis(ids, src, axis=1),
                         np.take_along_axis(cnt, src, axis=1))


def _suite_bunch(family, name, code_desc, min_distance, words, rank, cert, design_bound,
                 params, query="all", X=None):
    """The :class:`~sklearn.utils.Bunch` returned by :func:`make_witness_suite`
    (``X``: the sequences when they are not ``family.to_sequences()``)."""
    tokens = family.tokens   # the distinct tokens, np.unique order
    n = len(words)
    orders = params.get("orders", "fixed")
    if X is None and family.materialized_nbytes <= compact.MATERIALIZE_MAX_BYTES:
        X = family.to_sequences()
    slot_targets = family.targets()
    if query == "last":
        y = slot_targets[np.arange(len(family)), last_slots(family.token_ids)]
    else:
        y = None if X is None else family.expand(slot_targets)
    return Bunch(
        X=X,
        y=y,
        family=family,
        token_ids=family.token_ids,
        counts=family.counts,
        slot_targets=slot_targets,
        tokens=tokens,
        queries=words.copy(),
        designated_keys=(1 - words).astype(np.uint8),
        certified_min_rank=int(rank),
        design_bound=int(design_bound),
        constructive_rank=int(len(tokens)),
        exact_min_rank=int(rank) if rank == len(tokens) else None,
        certificate=cert,
        construction=name,
        query=query,
        orders=orders,
        params=params,
        DESCR=_DESCR.format(
            construction=name, n_sequences=len(family), seq_len=params["seq_len"],
            n_tokens=len(tokens), n_bits=params["n_bits"], code=code_desc, n_queries=n,
            min_distance=min_distance,
            ladder_gap=params["ladder_gap"], ladder_steps=params["ladder_steps"],
            certified_min_rank=int(rank), design_bound=int(design_bound),
            constructive_rank=len(tokens),
            query_text=(_FINAL_QUERY_TEXT if query == "last" else "")
            + (_EVERY_ORDER_TEXT if orders == "all" else ""),
        ),
    )


def _exact_suite(n_bits, seq_len, max_sequences, n_queries, rng, random_state, query, orders,
                 bar):
    """The witness suite of ``construction="exact"`` (:ref:`theory-r9`); with
    ``query="last"`` every query's R4 sequences are listed (``unique=False``), each
    with its query last. ``bar``: the :class:`~minip_learn._progress.Stages` of the
    build."""
    bar.start("design")
    if n_bits % 2:
        raise ValueError(f'construction="exact" needs an even n_bits (words of weight '
                         f"n_bits/2 with their complements); got n_bits={n_bits}.")
    code = complement_closed_code(n_bits)
    if rng is not None:            # shuffle whole complement pairs: prefixes stay closed
        pairs = rng.permutation(len(code) // 2)
        code = code[np.stack([2 * pairs, 2 * pairs + 1], axis=1).ravel()]
    unique = query == "all"    # final-query: a shared multiset serves one query only
    if n_queries is None:
        n = len(code)
        while n > 2 and exact_family_size(n, unique=unique) > max_sequences:
            n -= 2
    else:
        if n_queries % 2 or n_queries > len(code):
            raise ValueError(f'construction="exact" takes an even n_queries of at most '
                             f"{len(code)} (words come in complement pairs); got {n_queries}.")
        n = n_queries
    size = exact_family_size(n, unique=unique)
    if size > max_sequences:
        raise ValueError(f'no "exact" witness suite with n_bits={n_bits} fits '
                         f"max_sequences={max_sequences}: {n} words need "
                         f"{size} sequences.")
    words = code[:n]
    exact_len = exact_seq_len(words)
    N = exact_len if seq_len is None else seq_len
    if orders == "all":
        _check_materializable(size, N, n_bits)
    bar.start("family")
    tokens, inv = distinct_tokens(words, return_inverse=True)     # np.unique order
    ids, counts = exact_family(words, N, unique=unique)
    ids = np.where(ids >= 0, inv.astype(ids.dtype)[np.maximum(ids, 0)], -1).astype(ids.dtype)
    family = CompactFamily(tokens, ids, counts)
    family = _query_last(family) if query == "last" else family
    family, X = _ordered(family, orders, rng)
    bar.start("certify")
    rank, cert = certify(family if X is None else X, query=query,
                         positional=orders == "all", return_certificate=True,
                         progress=bar.enabled)
    # the design: strictly diagonally dominant from exact_seq_len on, else R5 on the
    # single-step denominators (N-2)(D-1)
    design_bound = n if N >= exact_len else design_rank(witness_denominators(words, N)[0])
    params = dict(
        n_bits=n_bits, seq_len=N, construction="exact",
        code=f"complement-closed constant-weight (w={n_bits // 2}, d>=4), {len(code)} words",
        n_queries=int(n), ladder_gap=None, ladder_steps=0, max_sequences=max_sequences,
        random_state=seed_param(random_state),
    )
    _mode_params(params, query, orders)
    return _suite_bunch(family, "exact", params["code"], 2, words, rank, cert, design_bound,
                        params, query, X)
