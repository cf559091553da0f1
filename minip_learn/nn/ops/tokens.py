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

import torch

from .spec import guard_denominator

__all__ = []  # public home: the package minip_learn.nn.ops

#: the widest 0/1 token that one ``int64`` code holds
MAX_CODE_BITS = 62
#: distinct values per position up to which the values are summed through a dense
#: (sequences x distinct values) matrix of weights
DENSE_VALUES = 8


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
    ``logsumexp`` over the features instead (``Uq Uk r`` terms).
    """
    if not log_domain:
        if mask is not None:
            fq = fq * mask
        return fq @ fk.transpose(-2, -1)
    if mask is not None:
        fq = fq + torch.log(mask.to(fq.dtype))
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
