"""Torch modules: feature maps, the attention arithmetic (the package
:mod:`minip_learn.nn.ops`), attention heads and sequence mixers (the package
:mod:`minip_learn.nn.mixers`, one module per mixer family). Feature maps and mixers are
selected by name through one registry class (``minip_learn.nn._registry.Registry``).
No scikit-learn here.

This package is the public home of what its modules (``heads``, ``models``,
``feature_maps``, ...) define: import from ``minip_learn.nn``; the modules export
nothing of their own but the built-in maps of :mod:`minip_learn.nn.literature_maps`.
"""

import importlib
import warnings

from . import literature_maps  # noqa: F401  (registers hedgehog, dpfp, rebased, t2r)
from ._registry import init_arguments  # noqa: F401  (importable, not exported: save_estimator reads it)
from .ensemble import HeadEnsemble
from .feature_maps import (
    FeatureMap,
    UserFeatureMap,
    available_feature_maps,
    check_feature_map_output,
    feature_map_table,
    get_feature_map,
    make_feature_map,
    register_feature_map,
    unregister_feature_map,
)
from .final_query import last_kwargs, last_output, takes_last  # noqa: F401  (not exported)
from .heads import AffineReadout, KernelAttentionHead, SoftmaxAttentionHead, ValueMap
from .mixers import (
    Mixer,
    UserMixer,
    available_mixers,
    check_mixer_output,
    get_mixer,
    make_mixer,
    mixer_table,
    register_mixer,
    unregister_mixer,
)
from .models import KernelAttentionModel, MLPReadout
from .splitting import (  # noqa: F401  (importable here, not exported)
    minip_partners,
    reset_optimizer_entries,
    split_shared_features,
    splittable_tables,
)

__all__ = [
    "AffineReadout",
    "FeatureMap",
    "HeadEnsemble",
    "KernelAttentionHead",
    "KernelAttentionModel",
    "MLPReadout",
    "Mixer",
    "SoftmaxAttentionHead",
    "UserFeatureMap",
    "UserMixer",
    "ValueMap",
    "available_feature_maps",
    "available_mixers",
    "check_feature_map_output",
    "check_mixer_output",
    "feature_map_table",
    "get_feature_map",
    "get_mixer",
    "make_feature_map",
    "make_mixer",
    "mixer_table",
    "register_feature_map",
    "register_mixer",
    "unregister_feature_map",
    "unregister_mixer",
]


def __getattr__(name):
    # the deprecated module minip_learn.nn.attention, imported on first access
    if name == "attention":
        warnings.warn("minip_learn.nn.attention is deprecated; its functions are in "
                      "minip_learn.nn.ops.", FutureWarning, stacklevel=2)
        return importlib.import_module(f"{__name__}.attention")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
