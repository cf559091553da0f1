"""Training: skorch's loop over a stack of members, with per-member callbacks.

One pipeline trains every head of the library: a single ``fit`` is a stack of one
member, :func:`~minip_learn.model_selection.fit_ensemble` a stack of many (seeds x
ranks x restarts). :func:`train_members` initialises the members as single fits do,
trains them with :class:`MinIPNet` (whole-batch iteration, a seeded shuffle) on the sum
of their losses (:class:`MemberLoss`), stops each member on its own
(:class:`StopWhenSolved`), splits shared features of ``table`` heads
(:class:`SplitSharedFeatures`), returns freed memory to the OS on CPU when the heap
holds much of it (:class:`TrimMemory`), and unpacks every member into an ordinary
fitted net. Sequences in multiset form train through the same pipeline:
``train_members(..., counts=counts)`` with the tokens of their slots as ``X``; the
modules get ``forward(x, counts=counts)`` (skorch passes a dict input as keyword
arguments) and every slot's loss is weighted by its multiplicity. Final-query targets
(one per sequence, ``train_members(..., query="last")``) train through it too: the loss
(:class:`LastPositionLoss`) and the errors (:func:`last_position_error`) read the last
position of every sequence only.

Layer: imports torch, skorch, numpy, :mod:`sklearn.utils` and
:mod:`minip_learn.nn`, :mod:`minip_learn.metrics`; the estimators build on it.
"""

from ._callbacks import (  # noqa: F401  (the helpers: importable here, not exported)
    TRIM_EVERY,
    TRIM_MIN_FREE,
    MemberLog,
    ProgressBar,
    SplitSharedFeatures,
    StopWhenSolved,
    TrimMemory,
    absolute_error,
    member_max_errors,
)
from ._members import CPU_PADDING_TOKENS, build_net, train_members  # noqa: F401
from ._net import (  # noqa: F401  (the helpers: importable here, not exported)
    BatchIterator,
    LastPositionLoss,
    MemberLoss,
    MinIPHistory,
    MinIPNet,
    TrainLoss,
    compact_input,
    is_periodic_epoch,
    last_position_error,
    module_forward,
)

__all__ = [
    "LastPositionLoss",
    "MemberLoss",
    "MinIPNet",
    "StopWhenSolved",
    "build_net",
    "train_members",
]
