"""The final-query form on the distinct tokens: maps once per distinct token, the
kernel (or the scores) between them, and every sequence's weights gathered from it.

Maps that read the token alone (and, for positional maps, its position) take as many
values as there are distinct tokens (or (token, position) pairs), often far fewer than
the positions of a batch. :func:`distinct_token_index` finds them, through one integer code
per 0/1 token; :func:`token_scores` gives the kernel between the distinct query tokens
and the distinct keys (its logarithm for log-features, an exact ``logsumexp`` over the
features); :func:`gathered_last_attend` reads every sequence's row of it at its keys and
sums the values. Equal to :func:`~minip_learn.nn.ops.last.last_attend` (and to the last
position of softmax and of unnormalised linear attention) up to rounding, gradients
included; the reference is :func:`~minip_learn.nn.ops.naive.kernel_attention`.
"""

from dataclasses import dataclass

import torch

from .masks import causal_part
from .spec import guard_denominator

__all__ = []  # public home: the package minip_learn.nn.ops

#: the widest 0/1 token that one ``int64`` code holds
MAX_CODE_BITS = 62
#: the largest fraction of the positions that a batch's runs may number for
#: :func:`token_runs` to give them (beyond it the per-position form is as cheap)
MAX_RUN_FRACTION = 0.5
#: distinct values per position up to which the values are summed through a dense
#: (sequences x distinct values) matrix of weights
DENSE_VALUES = 8
#: terms ``Uq Uk r`` up to which :func:`token_scores` takes the exact ``logsumexp``
#: of log-features directly: no test of the shifted product, so no host sync
EXACT_LOG_TERMS = 2**21


def distinct_token_index(x):
    """The distinct 0/1 tokens of ``x`` and the index of every token among them.

    Parameters
    ----------
    x : Tensor of shape (..., n_bits)
        Tokens; the form applies to 0/1 entries and ``n_bits <=`` :data:`MAX_CODE_BITS`.

    Returns
    -------
    (tokens, index) or None
        ``tokens`` of shape (U, n_bits), in the dtype of ``x``, sorted by their code
        ``sum_b x_b 2^b``, and ``index`` of shape ``x.shape[:-1]`` (int64) with
        ``tokens[index] == x``; None when ``x`` has an entry other than 0 and 1, more
        than :data:`MAX_CODE_BITS` bits or no token, or is on the meta device.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.tokens import distinct_token_index
    >>> x = torch.tensor([[[1., 0.], [0., 1.], [1., 0.]]])
    >>> tokens, index = distinct_token_index(x)
    >>> tokens.tolist(), index.tolist()
    ([[1.0, 0.0], [0.0, 1.0]], [[0, 1, 0]])
    """
    m = x.shape[-1]
    if (m > MAX_CODE_BITS or x.numel() == 0 or x.is_meta  # shapes alone: no values
            or not bool(((x == 0) | (x == 1)).all())):
        return None
    bits = torch.arange(m, device=x.device)
    codes = (x.to(torch.int64) << bits).sum(-1)
    uniq, index = torch.unique(codes, return_inverse=True)
    tokens = ((uniq[:, None] >> bits) & 1).to(x.dtype)
    return tokens, index


@dataclass(frozen=True)
class TokenRuns:
    """The runs of equal tokens of a batch (:func:`token_runs`), aligned on the right.

    Attributes
    ----------
    index : Tensor of shape (n, R), int64
        The token of every run (an index among the distinct tokens).
    lengths : Tensor of shape (n, R), int64
        Its length; the runs before a sequence's first are empty (length 0, the
        sequence's first token).
    pairs : Tensor of shape (n, R), int64
        The index of every run's (token, length) pair among the distinct pairs.
    pair_index, pair_lengths : Tensor of shape (P,), int64
        The token and the length of every distinct pair.
    suffix : Tensor of shape (n, R), int64
        The index of every nonempty run's suffix (the run's pair and those of the runs
        after it in its sequence) among the distinct suffixes of the batch's nonempty
        runs, ``S`` (one past the last) for an empty run: two runs with the same suffix
        read the same decayed writes out of the last state.
    suffix_rows : Tensor of shape (S,), int64
        For every distinct suffix, a run that has it (a flat index ``s R + k``).
    """

    index: torch.Tensor
    lengths: torch.Tensor
    pairs: torch.Tensor
    pair_index: torch.Tensor
    pair_lengths: torch.Tensor
    suffix: torch.Tensor
    suffix_rows: torch.Tensor


def token_runs(index, *, max_fraction=MAX_RUN_FRACTION):
    """The runs of equal tokens of every sequence: the token and the length of each.

    A recurrence whose maps read the token alone applies the same step to every token
    of a run, so that a run of ``L`` equal tokens is one step with maps that depend on
    the token and on ``L`` (a power of the token's transition, a geometric sum of its
    writes). Every sequence's runs are aligned on the right, its last run in the last
    column, and the columns before its first run are empty runs (length 0, the
    sequence's first token): a step that leaves the state as it is.

    Parameters
    ----------
    index : Tensor of shape (n, N), int64
        The index of every token among the distinct tokens
        (:func:`distinct_token_index`).
    max_fraction : float, default=:data:`MAX_RUN_FRACTION`
        The runs are given only when the sequence with the most of them has at most
        ``max_fraction N``.

    Returns
    -------
    TokenRuns or None
        None when the most runs of a sequence, ``R``, exceed ``max_fraction N`` or
        ``index`` is empty.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.tokens import token_runs
    >>> runs = token_runs(torch.tensor([[0, 0, 0, 1, 1, 2], [3, 3, 3, 3, 3, 1]]))
    >>> runs.index.tolist(), runs.lengths.tolist()
    ([[0, 1, 2], [3, 3, 1]], [[3, 2, 1], [0, 5, 1]])
    >>> runs.pair_index[runs.pairs].equal(runs.index)
    True
    >>> runs.suffix.tolist()  # the last runs' pairs differ; every suffix is distinct
    [[4, 3, 1], [5, 2, 0]]
    """
    n, N = index.shape
    if index.numel() == 0:
        return None
    starts = torch.ones_like(index, dtype=torch.bool)
    starts[:, 1:] = index[:, 1:] != index[:, :-1]
    run_id = starts.cumsum(1)  # 1 .. runs of the sequence
    runs = run_id[:, -1:]
    R = int(runs.max())
    if R > max_fraction * N:
        return None
    slot = run_id - 1 + (R - runs)  # right-aligned
    run_index = index[:, :1].expand(n, R).clone().scatter_(1, slot, index)
    lengths = torch.zeros_like(run_index).scatter_add_(1, slot, torch.ones_like(index))
    codes, pairs = torch.unique(run_index * (N + 1) + lengths, return_inverse=True)
    suffix, suffix_rows = _distinct_suffixes(pairs, len(codes))
    keep = lengths.reshape(-1).index_select(0, suffix_rows) > 0  # nonempty runs' suffixes
    renumber = torch.where(keep, keep.cumsum(0) - 1, keep.sum())
    suffix, suffix_rows = renumber[suffix], suffix_rows[keep]
    return TokenRuns(run_index, lengths, pairs, codes // (N + 1), codes % (N + 1), suffix,
                     suffix_rows)


def _distinct_suffixes(pairs, n_pairs):
    """The index of every run's suffix of pairs among the distinct ones (numbered
    column after column from the last) and a run (flat index) of each."""
    n, R = pairs.shape
    suffix = torch.empty_like(pairs)
    later = torch.zeros_like(pairs[:, 0])  # the suffix after the column, as its id
    seq = torch.arange(n, device=pairs.device)
    rows, offset = [], 0
    for k in range(R - 1, -1, -1):
        ids, later = torch.unique(later * n_pairs + pairs[:, k], return_inverse=True)
        suffix[:, k] = later + offset
        first = torch.full_like(ids, n).scatter_reduce_(0, later, seq, "amin")
        rows.append(first * R + k)
        offset += len(ids)
    return suffix, torch.cat(rows)


def later_runs_sum(values):
    """The sum over the later runs, ``out[..., k, :] = sum_{k' > k} values[..., k', :]``,
    for ``values`` of shape (..., R, c): one product with the strictly upper
    triangular ``R x R`` matrix of ones."""
    R = values.shape[-2]
    ones = torch.ones(R, R, dtype=values.dtype, device=values.device)
    return causal_part(ones, strict=True).transpose(0, 1) @ values


def gather_rows(table, index):
    """``table[index]``: the rows of ``table`` (U, ...) at ``index`` (any shape, int64),
    of shape ``index.shape + table.shape[1:]`` (through ``index_select``, whose backward
    costs a fraction of advanced indexing's)."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


def token_scores(fq, fk, *, log_domain, mask=None):
    """The kernel between query and key (log-)features, one row per query.

    Parameters
    ----------
    fq : Tensor of shape (..., Uq, r)
    fk : Tensor of shape (..., Uk, r)
        Features, or log-features when ``log_domain``.
    log_domain : bool
        Whether ``fq`` and ``fk`` are log-features.
    mask : Tensor of shape (r,), default=None
        Rank mask (1 = feature in use): a feature where it is 0 adds nothing.

    Returns
    -------
    Tensor of shape (..., Uq, Uk)
        ``alpha = <phi_Q, phi_K>``, or ``log alpha = logsumexp_k (lq_k + lk_k)`` when
        ``log_domain``.

    Notes
    -----
    Log-features: one matrix product of the features shifted by their row maxima,
    ``log alpha = a + b + log <exp(lq - a), exp(lk - b)>`` (``a``, ``b``: the
    maximum of the query's and of the key's log-features), whose entries lie in
    ``(0, r]``. When one of them falls below the smallest normal float (the maxima of
    the two sides in different features, far apart), every entry is the exact
    ``logsumexp`` over the features instead (``Uq Uk r`` terms). Up to
    :data:`EXACT_LOG_TERMS` terms the exact ``logsumexp`` is taken at once: the test of
    the product reads a value on the host (a device sync), which costs more than so
    few terms.
    """
    if not log_domain:
        if mask is not None:
            fq = fq * mask
        return fq @ fk.transpose(-2, -1)
    if mask is not None:
        fq = fq + torch.log(mask.to(fq.dtype))
    batch = fq.shape[:-2].numel() if fq.dim() > 2 else 1
    if batch * fq.shape[-2] * fk.shape[-2] * fq.shape[-1] <= EXACT_LOG_TERMS:
        return torch.logsumexp(fq[..., :, None, :] + fk[..., None, :, :], dim=-1)
    a = fq.amax(-1, keepdim=True).detach()
    b = fk.amax(-1, keepdim=True).detach()
    dots = torch.exp(fq - a) @ torch.exp(fk - b).transpose(-2, -1)
    if bool((dots >= torch.finfo(dots.dtype).tiny).all()):
        return torch.log(dots) + a + b.transpose(-2, -1)
    return torch.logsumexp(fq[..., :, None, :] + fk[..., None, :, :], dim=-1)


def gathered_last_attend(scores, query, keys, v, *, normalise, value_index=None,
                         key_log_weight=None, nonnegative=True, eps=1e-3):
    """The attended value at the last position of every sequence, from the scores
    between distinct tokens.

    Sequence ``s`` weighs its key ``j`` by ``w_sj = scores[query_s, keys_sj]`` and sums
    the values ``v[value_index_sj]``: ``u_s = sum_j w_sj v_sj / sum_j w_sj`` for a
    normalised kernel (``"kernel"``), ``sum_j softmax_j(scores[...]) v_sj`` for log
    kernels and softmax scores (``"softmax"``), ``sum_j w_sj v_sj`` unnormalised
    (``"none"``).

    Parameters
    ----------
    scores : Tensor of shape (Uq, Uk)
        Kernel values (``"kernel"``, ``"none"``), or log-kernel values or logits
        (``"softmax"``), between the distinct query tokens and the distinct keys
        (:func:`token_scores`).
    query : Tensor of shape (n,), int64
        The row of every sequence's last query.
    keys : Tensor of shape (n, N), int64
        The column of every key.
    v : Tensor of shape (Uv, d)
        The values of the distinct tokens.
    normalise : {"kernel", "softmax", "none"}
    value_index : Tensor of shape (n, N), int64, default=None
        The value of every key (None: ``keys``).
    key_log_weight : Tensor of shape (N,), default=None
        Log-weight of every key position (RetNet's decay ``(N-1-j) log gamma``), added
        to the log-scores or multiplied into the kernel as its exponential.
    nonnegative : bool, default=True
        For ``"kernel"``: the guard of the denominator
        (:func:`~minip_learn.nn.ops.spec.guard_denominator`).
    eps : float, default=1e-3
        As in :func:`~minip_learn.nn.ops.spec.guard_denominator`.

    Returns
    -------
    Tensor of shape (n, d)

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn.ops import last_attend
    >>> from minip_learn.nn.ops.tokens import gathered_last_attend, token_scores
    >>> table = torch.rand(4, 3, dtype=torch.float64)  # features of 4 distinct tokens
    >>> v = torch.rand(4, 2, dtype=torch.float64)
    >>> keys = torch.randint(0, 4, (5, 6))  # 5 sequences of 6 tokens
    >>> u = gathered_last_attend(token_scores(table, table, log_domain=False), keys[:, -1],
    ...                          keys, v, normalise="kernel")
    >>> torch.allclose(u, last_attend(table[keys], table[keys], v[keys], nonnegative=True))
    True
    """
    n, N = keys.shape
    Uk = scores.shape[-1]
    flat = (query[:, None] * Uk + keys).reshape(-1)
    # index_select: its backward (index_add) costs a fraction of advanced indexing's
    w = scores.reshape(-1).index_select(0, flat).view(n, N)
    if normalise == "softmax":
        if key_log_weight is not None:
            w = w + key_log_weight
        w = torch.softmax(w, dim=-1)
    else:
        if key_log_weight is not None:
            w = w * torch.exp(key_log_weight)
        if normalise == "kernel":
            w = w / guard_denominator(w.sum(-1, keepdim=True), nonnegative=nonnegative,
                                      eps=eps)
        elif normalise != "none":
            raise ValueError(f"normalise must be 'kernel', 'softmax' or 'none'; got "
                             f"{normalise!r}.")
    return _weighted_values(w, keys if value_index is None else value_index, v)


def _weighted_values(w, index, v):
    """``sum_j w_sj v[index_sj]``: the weights summed per distinct value first (a dense
    (n, Uv) matrix) when there are at most ``DENSE_VALUES`` times as many distinct values
    as positions, else the values gathered per position (whose backward adds ``n N``
    rows of ``d`` into ``Uv``, several times the cost of the dense product)."""
    n, N = w.shape
    Uv = v.shape[0]
    if Uv <= DENSE_VALUES * N:
        dense = w.new_zeros(n, Uv).scatter_add(1, index, w)
        return dense @ v
    vg = v.index_select(0, index.reshape(-1)).view(n, N, -1)
    return torch.bmm(w[:, None, :], vg)[:, 0]
