"""Torch modules: feature maps, the attention arithmetic
(:mod:`minip_learn.nn.attention`), attention heads and sequence mixers (the package
:mod:`minip_learn.nn.mixers`, one module per mixer family). Feature maps and mixers are
selected by name through one registry class (``minip_learn.nn._registry.Registry``).
No scikit-learn here."""

from . import (
    attention,
    literature_maps,  # noqa: F401  (registers hedgehog, dpfp, rebased, t2r)
)
from ._registry import init_arguments
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
from .final_query import last_kwargs, last_output, takes_last
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
from .splitting import (
    minip_partners,
    reset_optimizer_entries,
    split_shared_features,
    splittable_tables,
)

__all__ = [
    "last_kwargs",
    "last_output",
    "takes_last",
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
    "attention",
    "available_feature_maps",
    "available_mixers",
    "check_feature_map_output",
    "check_mixer_output",
    "feature_map_table",
    "get_feature_map",
    "get_mixer",
    "init_arguments",
    "make_feature_map",
    "make_mixer",
    "minip_partners",
    "mixer_table",
    "register_feature_map",
    "register_mixer",
    "reset_optimizer_entries",
    "split_shared_features",
    "splittable_tables",
    "unregister_feature_map",
    "unregister_mixer",
]
