"""Torch modules: feature maps (one registry), the attention arithmetic
(:mod:`minip_learn.nn.attention`) and attention heads. No scikit-learn here."""

from . import (
    attention,
    literature_maps,  # noqa: F401  (registers hedgehog, dpfp, rebased, t2r)
)
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
)
from .heads import AffineReadout, KernelAttentionHead, SoftmaxAttentionHead, ValueMap
from .models import KernelAttentionModel, MLPReadout
from .splitting import (
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
    "SoftmaxAttentionHead",
    "UserFeatureMap",
    "ValueMap",
    "attention",
    "available_feature_maps",
    "check_feature_map_output",
    "feature_map_table",
    "get_feature_map",
    "make_feature_map",
    "minip_partners",
    "register_feature_map",
    "reset_optimizer_entries",
    "split_shared_features",
    "splittable_tables",
]
