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
This package is the public home of the attention arithmetic: its ``__all__`` lists
the forms a head or mixer calls (``minip_learn.nn.attention``, which gave them other
paths, is deprecated); its modules export nothing of their own but :mod:`.naive`, the
references, and the helpers the forms share (``guard_denominator``, ``pairwise_dots``,
``is_short``, ...) stay importable from it without being exported. No scikit-learn in
this layer.

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

from . import naive  # noqa: F401  (the references: ops.naive)
from .chunk import CAUSAL_CHUNK, causal_attend, causal_head_output
from .kernel import (  # noqa: F401  (helpers importable here, not exported)
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
from .masks import causal_mask, causal_part, decayed_mask, decayed_scores, log_decay  # noqa: F401
from .pair import pair_readout, pairwise_dots  # noqa: F401
from .recurrent import recurrent_attend, recurrent_state, recurrent_step
from .softmax import softmax_attend, softmax_weights
from .spec import AttentionSpec, guard_denominator  # noqa: F401
from .tokens import (  # noqa: F401
    TokenRuns,
    distinct_token_index,
    gather_rows,
    gathered_last_attend,
    later_runs_sum,
    token_runs,
    token_scores,
)

__all__ = [
    "CAUSAL_CHUNK",
    "AttentionSpec",
    "attend",
    "attention_features",
    "causal_attend",
    "causal_head_output",
    "causal_mask",
    "decayed_mask",
    "explicit_kernel",
    "head_output",
    "kernel_readout",
    "last_attend",
    "last_head_output",
    "recurrent_attend",
    "recurrent_state",
    "recurrent_step",
    "sketch",
    "softmax_attend",
    "softmax_weights",
]
