"""Torch modules: feature maps (one registry) and attention heads. No scikit-learn here."""

from .feature_maps import (
    FeatureMap,
    available_feature_maps,
    get_feature_map,
    make_feature_map,
    register_feature_map,
)
from .heads import AffineReadout, KernelAttentionHead, SoftmaxAttentionHead, ValueMap
from .models import KernelAttentionModel, MLPReadout
from .ensemble import HeadEnsemble

__all__ = [
    "AffineReadout",
    "FeatureMap",
    "HeadEnsemble",
    "KernelAttentionHead",
    "KernelAttentionModel",
    "MLPReadout",
    "SoftmaxAttentionHead",
    "ValueMap",
    "available_feature_maps",
    "get_feature_map",
    "make_feature_map",
    "register_feature_map",
]
