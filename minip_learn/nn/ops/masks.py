"""Causal masks and decays, written once for every attention form and mixer.

Position ``i`` of a causal form sees the keys ``j <= i``. With a scalar decay
``gamma`` in ``(0, 1]`` (RetNet) the kernel of the pair is multiplied by
``gamma^(i-j)``, computed from the offsets ``i - j >= 0`` only (never from
``gamma^-j``, which overflows on long sequences). With per-feature decays (gated mixers)
the factor of feature ``n`` is ``exp(L[i, n] - L[j, n])`` for the cumulative log-decays
``L`` (:func:`decayed_scores`). Nothing else in :mod:`minip_learn` builds a triangular
mask of its own (a test greps the source for it).

Examples
--------
>>> from minip_learn.nn.ops import masks
>>> masks.causal_mask(3, 3).int()
tensor([[1, 0, 0],
        [1, 1, 0],
        [1, 1, 1]], dtype=torch.int32)
"""

import math

import torch

__all__ = []  # public home: the package minip_learn.nn.ops

#: Most elements of one (query block x keys x features) decay tensor of
#: :func:`decayed_scores`: longer sequences are taken a block of queries at a time.
DECAY_BLOCK_ELEMENTS = 2**22


def log_decay(decay):
    """``log gamma`` of a decay factor ``gamma`` in ``(0, 1]``, or 0.0 for None (no decay).

    Parameters
    ----------
    decay : float in (0, 1] or None

    Returns
    -------
    float

    Raises
    ------
    ValueError
        When ``decay`` lies outside ``(0, 1]``.

    Examples
    --------
    >>> from minip_learn.nn.ops.masks import log_decay
    >>> log_decay(None), log_decay(1.0)
    (0.0, 0.0)
    """
    if decay is None:
        return 0.0
    gamma = float(decay)
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"decay must be in (0, 1]; got {decay!r}.")
    return math.log(gamma)


def offsets(n_q, n_k, q0=0, k0=0, device=None):
    """Relative offsets ``i - j`` of queries ``q0 .. q0+n_q-1`` and keys
    ``k0 .. k0+n_k-1``, shape (n_q, n_k).

    Examples
    --------
    >>> from minip_learn.nn.ops.masks import offsets
    >>> offsets(2, 3, q0=1)
    tensor([[ 1,  0, -1],
            [ 2,  1,  0]])
    """
    i = torch.arange(q0, q0 + n_q, device=device)
    j = torch.arange(k0, k0 + n_k, device=device)
    return i[:, None] - j[None, :]


def causal_mask(n_q, n_k, *, start=0, device=None):
    """Boolean mask ``(n_q, n_k)``: True where query ``start + a`` may see key ``b``
    (``b <= start + a``).

    Examples
    --------
    >>> from minip_learn.nn.ops.masks import causal_mask
    >>> causal_mask(2, 3, start=1).int()
    tensor([[1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    return offsets(n_q, n_k, start, 0, device) >= 0


def causal_part(scores, *, strict=False):
    """``scores`` (..., N, N) with the entries of later keys set to 0: ``j <= i`` kept
    (``strict``: ``j < i``), the lower triangle of every matrix.

    Parameters
    ----------
    scores : Tensor of shape (..., N, N)
    strict : bool, default=False
        Whether the diagonal is set to 0 too (a key strictly before the query).

    Returns
    -------
    Tensor of shape (..., N, N)
        ``scores`` with the entries of later keys set to 0.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.masks import causal_part
    >>> causal_part(torch.ones(2, 2), strict=True)
    tensor([[0., 0.],
            [1., 0.]])
    """
    return torch.tril(scores, -1 if strict else 0)


def decayed_mask(n, log_gamma, *, log=False, dtype=None, device=None):
    """The causal decayed mask of one block of ``n`` positions: ``gamma^(i-j)`` for
    ``j <= i`` and 0 above the diagonal (``log``: ``(i-j) log gamma`` and ``-inf``).

    Parameters
    ----------
    n : int
    log_gamma : float
        ``log gamma <= 0`` (:func:`log_decay`); 0.0 is the plain causal mask.
    log : bool, default=False
    dtype, device : optional

    Returns
    -------
    Tensor of shape (n, n)
        The mask ``gamma^(i-j)``, or its logarithm when ``log``.

    Examples
    --------
    >>> import math
    >>> from minip_learn.nn.ops.masks import decayed_mask
    >>> decayed_mask(3, math.log(0.5))
    tensor([[1.0000, 0.0000, 0.0000],
            [0.5000, 1.0000, 0.0000],
            [0.2500, 0.5000, 1.0000]])
    """
    d = offsets(n, n, device=device)
    keep = d >= 0  # causal_mask(n, n), from the offsets the decay needs too
    expo = d.clamp_min(0).to(dtype) * log_gamma  # never a positive exponent
    if log:
        return torch.where(keep, expo, torch.full_like(expo, -math.inf))
    return torch.where(keep, torch.exp(expo), torch.zeros_like(expo))


def position_decay(n, log_gamma, start, dtype, device, *, log=False, reverse=False):
    """``gamma^(start + t)`` (``log``: ``(start + t) log gamma``) for ``t = 0 .. n-1``, or
    for ``t = n-1 .. 0`` when ``reverse``: shape (n, 1). Callers keep every exponent
    nonnegative.

    Examples
    --------
    >>> import math, torch
    >>> from minip_learn.nn.ops.masks import position_decay
    >>> position_decay(3, math.log(0.5), 1, torch.float32, None, reverse=True)[:, 0]
    tensor([0.1250, 0.2500, 0.5000])
    """
    t = torch.arange(n, device=device, dtype=dtype)
    if reverse:
        t = (n - 1) - t
    expo = (t + start) * log_gamma
    return (expo if log else torch.exp(expo)).unsqueeze(-1)


def decayed_scores(q, k, log_cum, *, block_elements=None):
    """Causal scores with per-feature decays, ``A[t, j] = sum_n q[t, n] k[j, n]
    exp(L[t, n] - L[j, n])`` for ``j <= t`` and 0 for ``j > t``.

    ``L`` is the cumulative sum of the log-decays (``L_t = sum_{l <= t} log alpha_l``,
    every ``log alpha <= 0``), so ``exp(L_t - L_j)`` is the product of the decays of
    the tokens ``j + 1 .. t``: every exponent is ``<= 0`` where it is kept, and the
    others are set to ``-inf`` before the exponential (no overflow, and no NaN in the
    gradients). Queries are taken in blocks so that the ``(block, N, r)`` decay tensor
    stays below ``block_elements`` elements.

    Parameters
    ----------
    q, k, log_cum : Tensor of shape (..., N, r)
    block_elements : int, default=None
        Most elements of one decay tensor; None means :data:`DECAY_BLOCK_ELEMENTS`.

    Returns
    -------
    Tensor of shape (..., N, N)
        The decayed scores ``A``.

    Examples
    --------
    >>> import math, torch
    >>> from minip_learn.nn.ops.masks import decayed_scores
    >>> ones = torch.ones(1, 3, 1)
    >>> log_cum = torch.log(torch.tensor([0.5, 0.5, 0.5])).cumsum(0).reshape(1, 3, 1)
    >>> decayed_scores(ones, ones, log_cum)[0]
    tensor([[1.0000, 0.0000, 0.0000],
            [0.5000, 1.0000, 0.0000],
            [0.2500, 0.5000, 1.0000]])
    """
    n = q.shape[-2]
    elements = DECAY_BLOCK_ELEMENTS if block_elements is None else int(block_elements)
    rows_per_block = max(1, elements // max(1, k[..., 0].numel() * q.shape[-1]))
    blocks = []
    for start in range(0, n, rows_per_block):
        stop = min(n, start + rows_per_block)
        diff = log_cum[..., start:stop, None, :] - log_cum[..., None, :, :]  # (.., B, N, r)
        future = ~causal_mask(stop - start, n, start=start, device=q.device)  # (B, N)
        diff = diff.masked_fill(future[..., None], -math.inf)
        blocks.append((q[..., start:stop, None, :] * k[..., None, :, :]
                       * torch.exp(diff)).sum(-1))
    return torch.cat(blocks, -2)
