"""The arithmetic of normalised kernel attention, written once, under its documented names.

The functions live in :mod:`minip_learn.nn.ops`, one module per attention form, which
also writes out their shape conventions (any leading dimensions); this module gives
them their documented names: every public name of ``ops`` but the quadratic
references, the spec and the masks the mixers read. A single head
(:class:`~minip_learn.nn.KernelAttentionHead`) calls them on ``(batch, seq_len, .)``
tensors; the fused forward of :class:`~minip_learn.nn.HeadEnsemble` calls the same
functions on ``(members, batch, seq_len, .)`` tensors after computing every member's
token maps at once.

The formulas are those of the modules of :mod:`minip_learn.nn.ops`: normalised kernel
attention over whole sequences (explicit kernel or sketch) in
:mod:`minip_learn.nn.ops.kernel`, the causal forms in :mod:`minip_learn.nn.ops.chunk`
(:func:`causal_attend`, blocks of :data:`CAUSAL_CHUNK` positions) and
:mod:`minip_learn.nn.ops.recurrent` (:func:`recurrent_attend`, one token at a time),
dense softmax attention in :mod:`minip_learn.nn.ops.softmax`. Causal softmax:
``softmax_weights(..., causal=True)`` and ``softmax_attend(..., causal=True)``.

**Token multiplicities.** A sequence may be given in multiset form: its distinct tokens
(slots) and how often each occurs (``counts``, shape ``(..., N)``, 0 for a padding slot
that stands for nothing). Normalised kernel attention and softmax attention without
positional maps see a sequence only through that multiset: the output at a token is

    u_i = sum_j c_j alpha_ij v_j / sum_j c_j alpha_ij

over the slots ``j`` (softmax: ``log c_j`` added to the scores), which is what the
materialised sequence, each token repeated ``c_j`` times, gives at every position of
that token. Every function that sums over keys takes an optional ``counts``; None means
one occurrence per position and leaves the arithmetic exactly as without it.

Causal attention has no multiset form (a multiset has no order). No scikit-learn in
this layer.

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

from . import ops
from .ops import *  # noqa: F403  (the documented names: ``__all__`` below)

#: The names of :mod:`minip_learn.nn.ops` that only it gives: the quadratic references,
#: the spec and the masks the mixers read.
_OPS_ONLY = ("AttentionSpec", "causal_part", "decayed_mask", "decayed_scores", "naive")

__all__ = [name for name in ops.__all__ if name not in _OPS_ONLY]
