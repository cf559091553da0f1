"""minip_learn: the expressivity gap between kernel (linear) and softmax attention.

Layers, from the bottom: :mod:`minip_learn.datasets` (numpy), :mod:`minip_learn.nn`
(torch modules), :mod:`minip_learn.training` (the skorch training pipeline of member
stacks), :mod:`minip_learn.estimators` (scikit-learn estimators),
:mod:`minip_learn.model_selection` (ensembles, sweeps, splitters), with
:mod:`minip_learn.metrics` beside them.

The estimators below are imported on first use, so that the numpy layers
(:mod:`minip_learn.theory`, :mod:`minip_learn.datasets`, :mod:`minip_learn.compact`) and
the command line start without importing torch or scikit-learn.
"""

import importlib

__version__ = "0.1.0"

# public name -> the submodule that defines it (imported on first access, PEP 562)
_LAZY = {
    "KernelAttentionClassifier": "estimators",
    "KernelAttentionRegressor": "estimators",
    "SequenceMixerRegressor": "estimators",
    "SoftmaxAttentionRegressor": "estimators",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
