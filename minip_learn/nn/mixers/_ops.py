"""The arithmetic the parallel forms of the mixers share: causal scores with per-feature
decays (:func:`decayed_scores`) and the causal mask (:func:`tril_mask`)."""

import math

import torch

__all__ = ["DECAY_BLOCK_ELEMENTS", "decayed_scores", "tril_mask"]

#: Most elements of one (query block x keys x features) decay tensor of
#: :func:`decayed_scores`: longer sequences are taken a block of queries at a time.
DECAY_BLOCK_ELEMENTS = 2**22


def decayed_scores(q, k, log_cum):
    """Causal scores with per-feature decays, ``A[t, j] = sum_n q[t, n] k[j, n]
    exp(L[t, n] - L[j, n])`` for ``j <= t`` and 0 for ``j > t``.

    ``L`` is the cumulative sum of the log-decays (``L_t = sum_{l <= t} log alpha_l``,
    every ``log alpha <= 0``), so ``exp(L_t - L_j)`` is the product of the decays of
    the tokens ``j + 1 .. t``: every exponent is ``<= 0`` where it is kept, and the
    others are set to ``-inf`` before the exponential (no overflow, and no NaN in the
    gradients). Queries are taken in blocks so that the ``(block, N, r)`` decay tensor
    stays below :data:`DECAY_BLOCK_ELEMENTS` elements.

    Parameters
    ----------
    q, k, log_cum : Tensor of shape (..., N, r)

    Returns
    -------
    Tensor of shape (..., N, N)

    Examples
    --------
    >>> import math, torch
    >>> from minip_learn.nn.mixers import decayed_scores
    >>> ones = torch.ones(1, 3, 1)
    >>> log_cum = torch.log(torch.tensor([0.5, 0.5, 0.5])).cumsum(0).reshape(1, 3, 1)
    >>> decayed_scores(ones, ones, log_cum)[0]
    tensor([[1.0000, 0.0000, 0.0000],
            [0.5000, 1.0000, 0.0000],
            [0.2500, 0.5000, 1.0000]])
    """
    n = q.shape[-2]
    rows_per_block = max(1, DECAY_BLOCK_ELEMENTS // max(1, k[..., 0].numel() * q.shape[-1]))
    positions = torch.arange(n, device=q.device)
    blocks = []
    for start in range(0, n, rows_per_block):
        stop = min(n, start + rows_per_block)
        diff = log_cum[..., start:stop, None, :] - log_cum[..., None, :, :]  # (.., B, N, r)
        future = positions[None, :] > positions[start:stop, None]  # (B, N)
        diff = diff.masked_fill(future[..., None], -math.inf)
        blocks.append((q[..., start:stop, None, :] * k[..., None, :, :]
                       * torch.exp(diff)).sum(-1))
    return torch.cat(blocks, -2)


def tril_mask(n, device):
    """Boolean ``(n, n)`` mask, True where query ``t`` sees key ``j`` (``j <= t``).

    Examples
    --------
    >>> from minip_learn.nn.mixers._ops import tril_mask
    >>> tril_mask(2, "cpu")
    tensor([[ True, False],
            [ True,  True]])
    """
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()
