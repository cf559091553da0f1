"""A user's feature map (``feature_map=`` a module class or factory) and the theorem
flag measured from the fitted kernel (``kernel_min_``)."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from torch import nn

from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_minip
from minip_learn.model_selection import fit_ensemble
from minip_learn.nn import (
    FeatureMap,
    KernelAttentionHead,
    UserFeatureMap,
    get_feature_map,
    make_feature_map,
)


class SquaredLinear(nn.Module):
    """A nonnegative map that declares nothing: ``(W x + b)^2``."""

    def __init__(self, n_bits, rank, *, scale=1.0):
        super().__init__()
        self.linear = nn.Linear(n_bits, rank)
        self.scale = scale

    def forward(self, x):
        return self.scale * self.linear(x).square()


class SignedLinear(nn.Module):
    """A signed map: ``W x`` with no bias."""

    def __init__(self, n_bits, rank):
        super().__init__()
        self.linear = nn.Linear(n_bits, rank, bias=False)

    def forward(self, x):
        return self.linear(x)


class WrongShape(SignedLinear):
    def forward(self, x):
        return self.linear(x)[..., :-1]


class ReturnsNaN(SignedLinear):
    def forward(self, x):
        return self.linear(x) * float("nan")


class ReturnsArray(SignedLinear):
    def forward(self, x):
        return self.linear(x).detach().numpy()


def squared_linear_factory(n_bits, rank):
    return SquaredLinear(n_bits, rank, scale=0.5)


class OwnFeatureMap(FeatureMap):
    """An unregistered FeatureMap subclass: its declarations are used."""

    def activation(self, z):
        return torch.sigmoid(z)


@pytest.fixture(scope="module")
def data():
    return make_minip(48, seq_len=3, n_bits=5, random_state=0)


def _fit(data, **params):
    params = {"rank": 4, "max_epochs": 30, "random_state": 0, **params}
    return KernelAttentionRegressor(**params).fit(*data)


def test_registry_resolves_user_maps():
    assert get_feature_map(SquaredLinear) is UserFeatureMap
    assert get_feature_map(squared_linear_factory) is UserFeatureMap
    assert get_feature_map(OwnFeatureMap) is OwnFeatureMap
    phi = make_feature_map(SquaredLinear, 5, 3, scale=2.0)
    assert isinstance(phi, UserFeatureMap) and phi.module.scale == 2.0
    assert phi(torch.ones(2, 4, 5)).shape == (2, 4, 3)
    # undeclared: signed guard, no fused form, not rank-maskable
    assert (phi.nonnegative, phi.kernel_nonnegative, phi.fused_form,
            phi.rank_maskable) == (False, False, None, False)
    with pytest.raises(ValueError, match="valid names"):
        get_feature_map(3)
    with pytest.raises(ValueError, match="valid names"):
        get_feature_map("no-such-map")


def test_feature_maps_and_mixers_share_one_registry_class():
    from minip_learn.nn import (
        Mixer,
        UserMixer,
        available_feature_maps,
        register_feature_map,
        unregister_feature_map,
    )
    from minip_learn.nn.feature_maps import FEATURE_MAPS, feature_map_name
    from minip_learn.nn.mixers import MIXERS

    assert type(FEATURE_MAPS) is type(MIXERS)
    assert (FEATURE_MAPS.base, FEATURE_MAPS.user) == (FeatureMap, UserFeatureMap)
    assert (MIXERS.base, MIXERS.user) == (Mixer, UserMixer)
    with pytest.raises(ValueError, match="feature map 'relu' is already registered"):
        register_feature_map("relu")(OwnFeatureMap)
    with pytest.raises(ValueError, match=r"Unknown feature_map 'no-such-map'; valid names "
                                         r"are \[.*'relu'.*\], or pass a FeatureMap subclass"):
        get_feature_map("no-such-map")
    own = register_feature_map("test-own")(type("Own", (OwnFeatureMap,), {}))
    assert "test-own" in available_feature_maps(nonnegative=True)
    assert feature_map_name(own) == "test-own" and feature_map_name("relu") == "relu"
    assert feature_map_name(SquaredLinear).endswith("SquaredLinear")
    assert unregister_feature_map("test-own") is own
    assert "test-own" not in available_feature_maps()


@pytest.mark.parametrize("feature_map", [SquaredLinear, squared_linear_factory])
def test_user_map_fits_and_is_flagged_from_data(data, feature_map):
    est = _fit(data, feature_map=feature_map)
    head = est.net_.module_
    assert isinstance(head.query_features, UserFeatureMap)
    assert not head.nonnegative  # declares nothing
    # squares are nonnegative, so every kernel value is: the theorem applies
    assert est.kernel_min_ >= 0
    assert est.theorem_applies_
    assert est.predict(data[0]).shape == data[1].shape


def test_feature_kwargs_reach_the_user_map(data):
    est = _fit(data, feature_map=SquaredLinear, feature_kwargs={"scale": 3.0})
    assert est.net_.module_.query_features.module.scale == 3.0


def test_signed_user_map_is_outside_the_theorem(data):
    est = _fit(data, feature_map=SignedLinear)
    assert est.kernel_min_ < 0
    assert not est.theorem_applies_


def test_theorem_flag_follows_the_measured_kernel(data):
    # a signed map whose fitted kernel happens to be nonnegative on the tokens is inside
    est = _fit(data, feature_map="identity", max_epochs=1)
    head = est.net_.module_
    with torch.no_grad():
        for phi in (head.query_features, head.key_features):
            phi.encoder.weight.abs_()
            phi.encoder.bias.abs_()
    est.kernel_min_ = est._kernel_min(np.asarray(data[0]))
    assert est.kernel_min_ >= 0 and est.theorem_applies_
    with torch.no_grad():
        head.key_features.encoder.weight.neg_()
        head.key_features.encoder.bias.neg_()
    est.kernel_min_ = est._kernel_min(np.asarray(data[0]))
    assert est.kernel_min_ < 0 and not est.theorem_applies_


def test_declared_maps_keep_the_flag(data):
    # taylor: signed features, a provably positive kernel (declared)
    est = _fit(data, feature_map="taylor", rank=6)
    assert est.theorem_applies_ and est.kernel_min_ > 0
    # outside the model of the theorem whatever the kernel
    assert not _fit(data, n_heads=2).theorem_applies_
    assert not _fit(data, readout="mlp").theorem_applies_


def test_kernel_min_exact_and_sampled():
    head = KernelAttentionHead(3, 2, feature_map="identity").double()
    tokens = np.array([[a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)])
    x = torch.as_tensor(tokens, dtype=torch.float64)
    with torch.no_grad():
        full = head.query_features(x) @ head.key_features(x).T
    assert head.kernel_min(tokens) == pytest.approx(float(full.min()))
    # repeated tokens count once; the sample is seeded and never below the minimum
    assert head.kernel_min(np.repeat(tokens, 3, axis=0)) == head.kernel_min(tokens)
    sampled = head.kernel_min(tokens, max_pairs=10, random_state=1)
    assert sampled >= float(full.min()) - 1e-12
    assert sampled == head.kernel_min(tokens, max_pairs=10, random_state=1)
    assert np.isnan(head.kernel_min(np.zeros((0, 3))))


def test_kernel_min_of_log_domain_maps_is_the_kernel():
    head = KernelAttentionHead(3, 4, feature_map="exp").double()
    tokens = np.eye(3)
    x = torch.as_tensor(tokens)
    with torch.no_grad():
        full = head.query_features(x) @ head.key_features(x).T
    assert head.kernel_min(tokens) == pytest.approx(float(full.min()))


@pytest.mark.parametrize("bad, match", [
    (WrongShape, r"shape \(n_tokens, rank\) = \(\d+, 4\); got shape \(\d+, 3\)"),
    (ReturnsNaN, "NaN features"),
    (ReturnsArray, "must return a torch.Tensor"),
    (lambda n_bits, rank: (lambda x: x), "must build a torch.nn.Module"),
    (lambda n_bits: nn.Linear(n_bits, 2), "could not be built"),
])
def test_bad_user_map_is_a_clear_error_at_fit(data, bad, match):
    est = KernelAttentionRegressor(rank=4, feature_map=bad, max_epochs=2)
    with pytest.raises(ValueError, match=match) as info:
        est.fit(*data)
    assert "feature_map=" in str(info.value)
    assert not hasattr(est, "net_")


def test_user_map_estimator_clones_pickles_and_grid_searches(data):
    est = KernelAttentionRegressor(rank=2, feature_map=SquaredLinear, max_epochs=20,
                                   random_state=0)
    assert clone(est).get_params()["feature_map"] is SquaredLinear
    est.fit(*data)
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(again.predict(data[0]), est.predict(data[0]))
    assert again.kernel_min_ == est.kernel_min_
    search = GridSearchCV(clone(est), {"rank": [1, 2]}, cv=2).fit(*data)
    assert search.best_params_["rank"] in (1, 2)


def test_unregistered_feature_map_subclass_keeps_its_declarations(data):
    est = _fit(data, feature_map=OwnFeatureMap)
    assert est.net_.module_.nonnegative and est.theorem_applies_


def test_user_map_members_train_one_rank_at_a_time_like_separate_fits(data):
    est = KernelAttentionRegressor(feature_map=SquaredLinear, max_epochs=20)
    res = fit_ensemble(est, *data, params=[{"rank": 2, "random_state": 0},
                                          {"rank": 4, "random_state": 0}])
    alone = est.set_params(rank=4, random_state=0).fit(*data)
    np.testing.assert_allclose(res.estimators[1].predict(data[0]), alone.predict(data[0]),
                               rtol=1e-5, atol=1e-5)
    assert res.estimators[1].kernel_min_ == pytest.approx(alone.kernel_min_, rel=1e-5)
