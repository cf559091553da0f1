"""The arithmetic of normalised kernel attention, written once.

The functions live in :mod:`minip_learn.nn.ops`, one module per attention form (the
quadratic references in :mod:`minip_learn.nn.ops.naive`, the kernel arithmetic, the
fused CPU autograd of token pairs, the chunked and recurrent causal forms, softmax,
the masks); this module gives them their documented names.

Every function works on tensors with arbitrary leading dimensions: the last two are
(token position, feature) for features, values and readout coefficients, and (query,
key) for kernel matrices. A single head (:class:`~minip_learn.nn.KernelAttentionHead`)
calls them on ``(batch, seq_len, .)`` tensors; the fused forward of
:class:`~minip_learn.nn.HeadEnsemble` calls the same functions on
``(members, batch, seq_len, .)`` tensors after computing every member's token maps at
once.

With query features ``phi_Q``, key features ``phi_K``, values ``v`` and the affine
readout ``rho_x(u) = <w(x), u> + b(x)``, a head computes (see :ref:`theory-r1`)

    u_i = sum_j alpha_ij v_j / guard(sum_j alpha_ij),   alpha_ij = <phi_Q(x_i), phi_K(x_j)>,
    y_i = <w(x_i), u_i> + b(x_i),

either through the explicit ``N x N`` kernel (short sequences, :func:`is_short`) or
through the fixed-size sketch ``S = sum_j phi_K(x_j) v_j^T``, ``s = sum_j phi_K(x_j)``
(:func:`sketch`). Dense softmax attention (:func:`softmax_weights`,
:func:`softmax_attend`) is written here too.

**Token multiplicities.** A sequence may be given in multiset form: its distinct tokens
(slots) and how often each occurs (``counts``, shape ``(..., N)``, 0 for a padding slot
that stands for nothing). Normalised kernel attention and softmax attention without
positional maps see a sequence only through that multiset: the output at a token is

    u_i = sum_j c_j alpha_ij v_j / sum_j c_j alpha_ij

over the slots ``j`` (softmax: ``log c_j`` added to the scores), which is what the
materialised sequence, each token repeated ``c_j`` times, gives at every position of
that token. Every function that sums over keys takes an optional ``counts``; None means
one occurrence per position and leaves the arithmetic exactly as without it.

**Causal attention.** :func:`causal_attend` lets position ``i`` attend to the keys
``j <= i`` only, optionally with RetNet's decay, ``alpha_ij = gamma^(i-j)
<phi_Q(x_i), phi_K(x_j)>`` (position-dependent maps ``gamma^i phi(x)`` and
``gamma^-j phi(x)``, computed from the offsets ``i - j``): the masked explicit kernel
within blocks of :data:`CAUSAL_CHUNK` positions and the prefix sketch carried from
block to block. :func:`recurrent_attend` is the same attention as a recurrent network
over the positions, ``S_i = gamma S_{i-1} + phi_K(x_i) v_i^T``, ``s_i = gamma s_{i-1} +
phi_K(x_i)``. Both are held to the quadratic reference
:func:`minip_learn.nn.ops.naive.kernel_attention`. Causal softmax:
``softmax_weights(..., causal=True)`` and ``softmax_attend(..., causal=True)``.
Causal attention has no multiset form (a multiset has no order).
No scikit-learn in this layer.

Examples
--------
>>> import torch
>>> from minip_learn.nn import attention
>>> phi_q, phi_k = attention.attention_features(
...     torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), log_domain=True)
>>> v = torch.arange(6.0).reshape(1, 3, 2).expand(2, 3, 2)
>>> attention.attend(phi_q, phi_k, v, nonnegative=True)[0, 0]  # uniform weights
tensor([2., 3.])
"""

from .ops import (  # noqa: F401  (the public names, re-exported)
    CAUSAL_CHUNK,
    affine_readout,
    attend,
    attention_features,
    causal_attend,
    causal_head_output,
    causal_mask,
    explicit_kernel,
    guard_denominator,
    head_output,
    is_short,
    kernel_from_log,
    kernel_readout,
    kernel_values,
    log_decay,
    log_kernel,
    pair_readout,
    pairwise_dots,
    recurrent_attend,
    recurrent_state,
    recurrent_step,
    sketch,
    softmax_attend,
    softmax_weights,
    weight_keys,
)

__all__ = [
    "CAUSAL_CHUNK",
    "affine_readout",
    "attend",
    "attention_features",
    "causal_attend",
    "causal_mask",
    "causal_head_output",
    "explicit_kernel",
    "guard_denominator",
    "head_output",
    "is_short",
    "kernel_from_log",
    "kernel_readout",
    "kernel_values",
    "log_decay",
    "log_kernel",
    "pair_readout",
    "pairwise_dots",
    "recurrent_attend",
    "recurrent_state",
    "recurrent_step",
    "sketch",
    "softmax_attend",
    "softmax_weights",
    "weight_keys",
]
