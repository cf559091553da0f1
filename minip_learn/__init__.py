"""minip_learn: the expressivity gap between kernel (linear) and softmax attention.

Layers, from the bottom: :mod:`minip_learn.datasets` (numpy), :mod:`minip_learn.nn`
(torch modules), :mod:`minip_learn.training` (the skorch training pipeline of member
stacks), :mod:`minip_learn.estimators` (scikit-learn estimators),
:mod:`minip_learn.model_selection` (ensembles, sweeps, splitters), with
:mod:`minip_learn.metrics` beside them.
"""

from .estimators import (
    KernelAttentionClassifier,
    KernelAttentionRegressor,
    SequenceMixerRegressor,
    SoftmaxAttentionRegressor,
)

__version__ = "0.1.0"

__all__ = [
    "KernelAttentionClassifier",
    "KernelAttentionRegressor",
    "SequenceMixerRegressor",
    "SoftmaxAttentionRegressor",
    "__version__",
]
