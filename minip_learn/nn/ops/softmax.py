"""Dense softmax attention: the weights, and the fused kernel over blocks of queries.

``u_i = sum_j softmax_j(scale q_i^T k_j + log c_j) v_j``, optionally causal (query
``i`` sees the keys ``j <= i``). The quadratic reference is
:func:`minip_learn.nn.ops.naive.softmax_attention`.
"""

import math

import torch

from .masks import causal_mask

__all__ = []  # public home: the package minip_learn.nn.ops


def softmax_weights(scores, counts=None, *, causal=False):
    """Softmax attention weights ``softmax_j(s_ij + log c_j)`` of shape (..., N, N).

    Parameters
    ----------
    scores : Tensor of shape (..., N, N)
        Attention logits (already divided by the temperature).
    counts : Tensor of shape (..., N), default=None
        Multiplicity of every key slot: ``log c_j`` joins the scores, so a slot counts
        as ``c_j`` equal keys and a padding slot (``c_j = 0``, ``log 0 = -inf``) gets
        weight 0. None: one per position.
    causal : bool, default=False
        Query ``i`` sees the keys ``j <= i`` only (the scores above the diagonal are
        ``-inf``).

    Returns
    -------
    Tensor of shape (..., N, N)
        The attention weights: every row sums to 1.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import ops
    >>> ops.softmax_weights(torch.zeros(1, 2, 2), torch.tensor([[3.0, 1.0]]))[0, 0]
    tensor([0.7500, 0.2500])
    >>> ops.softmax_weights(torch.zeros(1, 2, 2), causal=True)[0]
    tensor([[1.0000, 0.0000],
            [0.5000, 0.5000]])
    """
    if counts is not None:
        scores = scores + torch.log(counts).unsqueeze(-2)
    if causal:
        keep = causal_mask(scores.shape[-2], scores.shape[-1], device=scores.device)
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1)


def softmax_attend(q, k, v, *, scale, block_rows, counts=None, causal=False):
    """Softmax attention ``u_i = sum_j softmax_j(scale q_i^T k_j + log c_j) v_j`` through
    :func:`torch.nn.functional.scaled_dot_product_attention`, ``block_rows`` queries
    per call.

    On CPU the fused kernel streams over the keys with a running maximum and never
    forms the score matrix. It needs ``(batch, heads, N, width)`` inputs and one width
    for queries, keys and values: zero columns pad them to it (they add nothing to the
    scores) and the padded output columns are dropped.

    Parameters
    ----------
    q, k : Tensor of shape (..., N, d_s)
    v : Tensor of shape (..., N, d)
    scale : float
        Factor of the scores (``1 / temperature``).
    block_rows : int
        Most queries per call (bounds the memory of backends that form the scores).
    counts : Tensor of shape (..., N), default=None
        Multiplicity of every key slot, added to the scores as ``log c_j`` (an additive
        attention mask); None: one per position (no mask).
    causal : bool, default=False
        Query ``i`` attends to the keys ``j <= i`` only: a block of queries sees the
        keys up to its last query, through ``is_causal`` when the block is the whole
        sequence and a boolean mask otherwise. Not with ``counts`` (a multiset has no
        order).

    Returns
    -------
    Tensor of shape (..., N, d)
        Attended values, computed a block of queries at a time.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import ops
    >>> q = k = torch.zeros(1, 2, 3)
    >>> v = torch.tensor([[[0.0], [4.0]]])
    >>> ops.softmax_attend(q, k, v, scale=1.0, block_rows=2,
    ...                          counts=torch.tensor([[3.0, 1.0]]))[0, :, 0]  # (3*0 + 4) / 4
    tensor([1., 1.])
    >>> ops.softmax_attend(q, k, v, scale=1.0, block_rows=1, causal=True)[0, :, 0]
    tensor([0., 2.])
    """
    if causal and counts is not None:
        raise ValueError("causal softmax attention takes no counts: a sequence in "
                         "multiset form has no order.")
    lead, n, d = q.shape[:-2], q.shape[-2], v.shape[-1]
    width = max(q.shape[-1], d)
    q, k, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])).reshape(-1, 1, n, width)
               for t in (q, k, v))
    mask = (None if counts is None else
            torch.log(counts.to(q.dtype)).expand(*lead, n).reshape(-1, 1, 1, n))
    rows = min(n, max(1, int(block_rows)))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    blocks = []
    for start in range(0, n, rows):
        qb = q[:, :, start:start + rows]
        if not causal:
            blocks.append(sdpa(qb, k, v, attn_mask=mask, scale=scale))
        elif rows == n:
            blocks.append(sdpa(qb, k, v, is_causal=True, scale=scale))
        else:  # the keys up to the block's last query, masked above the diagonal
            end = start + qb.shape[-2]
            keep = causal_mask(qb.shape[-2], end, start=start, device=q.device)
            blocks.append(sdpa(qb, k[:, :, :end], v[:, :, :end], attn_mask=keep,
                               scale=scale))
    u = torch.cat(blocks, dim=-2)
    return u[..., :d].reshape(*lead, n, d)
