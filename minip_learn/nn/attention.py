"""Deprecated: the attention arithmetic is :mod:`minip_learn.nn.ops`.

Every name this module gave (``attend``, ``causal_attend``, ``softmax_attend``, ...) is
still importable from it for this release, with a :class:`FutureWarning` naming its
home in :mod:`minip_learn.nn.ops`; the module exports nothing.
"""

from .._deprecation import moved_names
from . import ops

#: The names this module gave, each the object of the same name in ``ops``.
_MOVED = (
    "CAUSAL_CHUNK", "affine_readout", "attend", "attention_features", "causal_attend",
    "causal_head_output", "causal_mask", "distinct_token_index", "explicit_kernel",
    "gathered_last_attend", "guard_denominator", "head_output", "is_short",
    "kernel_from_log", "kernel_readout", "kernel_values", "last_attend",
    "last_head_output", "log_decay", "log_kernel", "pair_readout", "pairwise_dots",
    "recurrent_attend", "recurrent_state", "recurrent_step", "sketch", "softmax_attend",
    "softmax_weights", "token_scores", "weight_keys",
)

__all__ = []


__getattr__ = moved_names(__name__, _MOVED, ops)
