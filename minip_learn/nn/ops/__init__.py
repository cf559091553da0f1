"""Attention as operators: one module per form, each held to a quadratic reference.

============  ======================================================================
module        holds
============  ======================================================================
``naive``     the quadratic references, loops over queries and keys (float64-exact)
``spec``      :class:`AttentionSpec` (the options of a form) and the denominator guard
``masks``     causal masks, decays and per-feature decayed scores, written once
``kernel``    normalised kernel attention over whole sequences: explicit kernel or
              sketch, features, readout
``pair``      the fused CPU autograd of token pairs (:func:`pairwise_dots`,
              :func:`pair_readout`), which the estimators' fits run
``chunk``     causal kernel attention in chunks, with the prefix state as
              :class:`~minip_learn.nn.ops.chunk.PrefixSketch` /
              :class:`~minip_learn.nn.ops.chunk.LogPrefixSketch`
``recurrent`` causal kernel attention one token at a time
``last``      the final-query form: the last position's query over every key
``tokens``    the final-query form on the distinct tokens: the kernel between them,
              gathered per sequence; the runs of equal tokens of every sequence
``softmax``   dense softmax attention, explicit and over blocks of queries
============  ======================================================================

Every function works on tensors with arbitrary leading dimensions: the last two are
(token position, feature) for features, values and readout coefficients, and (query,
key) for kernel matrices. A new form is one module here and one test in
``tests/nn/test_ops.py`` that holds it to its reference in :mod:`.naive`.
:mod:`minip_learn.nn.attention` re-exports the public functions under their
documented names. No scikit-learn in this layer.

Examples
--------
>>> import torch
>>> _ = torch.manual_seed(0)
>>> from minip_learn.nn import ops
>>> phi = torch.rand(2, 5, 3, dtype=torch.float64)
>>> v = torch.rand(2, 5, 4, dtype=torch.float64)
>>> fast = ops.causal_attend(phi, phi, v, nonnegative=True, decay=0.9, chunk_size=2)
>>> ref = ops.naive.kernel_attention(phi, phi, v, nonnegative=True, causal=True, decay=0.9)
>>> torch.allclose(fast, ref)
True
"""

from . import naive
from .chunk import CAUSAL_CHUNK, causal_attend, causal_head_output
from .kernel import (
    affine_readout,
    attend,
    attention_features,
    explicit_kernel,
    head_output,
    is_short,
    kernel_from_log,
    kernel_readout,
    kernel_values,
    log_kernel,
    sketch,
    weight_keys,
)
from .last import last_attend, last_head_output
from .masks import causal_mask, causal_part, decayed_mask, decayed_scores, log_decay
from .pair import pair_readout, pairwise_dots
from .recurrent import recurrent_attend, recurrent_state, recurrent_step
from .softmax import softmax_attend, softmax_weights
from .spec import AttentionSpec, guard_denominator
from .tokens import (
    TokenRuns,
    distinct_token_index,
    gathered_last_attend,
    later_runs_sum,
    token_runs,
    token_scores,
)

__all__ = [
    "CAUSAL_CHUNK",
    "AttentionSpec",
    "TokenRuns",
    "affine_readout",
    "attend",
    "attention_features",
    "causal_attend",
    "causal_head_output",
    "causal_mask",
    "causal_part",
    "decayed_mask",
    "decayed_scores",
    "distinct_token_index",
    "explicit_kernel",
    "gathered_last_attend",
    "guard_denominator",
    "head_output",
    "is_short",
    "kernel_from_log",
    "kernel_readout",
    "kernel_values",
    "last_attend",
    "last_head_output",
    "later_runs_sum",
    "log_decay",
    "log_kernel",
    "naive",
    "pair_readout",
    "pairwise_dots",
    "recurrent_attend",
    "recurrent_state",
    "recurrent_step",
    "sketch",
    "softmax_attend",
    "softmax_weights",
    "token_runs",
    "token_scores",
    "weight_keys",
]
