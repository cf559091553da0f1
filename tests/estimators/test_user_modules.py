"""A user's module (a feature map of the kernel estimators, a mixer) is built and
checked once at fit without touching the caller's torch random state."""

import pytest
import torch
from torch import nn

from minip_learn import KernelAttentionRegressor, SequenceMixerRegressor
from minip_learn.datasets import make_minip


class LinearMap(nn.Module):
    """A user's feature map: ``W x + b`` (random initial weights)."""

    def __init__(self, n_bits, rank):
        super().__init__()
        self.linear = nn.Linear(n_bits, rank)

    def forward(self, x):
        return self.linear(x)


class WrongShapeMap(LinearMap):
    def forward(self, x):
        return self.linear(x)[..., :-1]


class RunningMean(nn.Module):
    """A user's mixer: a causal running mean of a learned token map."""

    def __init__(self, n_bits, state_size):
        super().__init__()
        self.key = nn.Linear(n_bits, state_size)
        self.out = nn.Linear(n_bits + state_size, 1)

    def forward(self, x):
        steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]
        return self.out(torch.cat([x, self.key(x).cumsum(1) / steps], -1)).squeeze(-1)


class PerToken(RunningMean):
    """Wrong: outputs of shape (batch, N, 1)."""

    def forward(self, x):
        return super().forward(x)[..., None]


class _Trained(Exception):
    """Raised in place of training: fit stops right after the module's check."""


@pytest.fixture(scope="module")
def data():
    return make_minip(24, seq_len=3, n_bits=5, random_state=0)


@pytest.mark.parametrize("est", [
    KernelAttentionRegressor(rank=3, feature_map=LinearMap, max_epochs=1),
    SequenceMixerRegressor(RunningMean, state_size=3, max_epochs=1),
], ids=["feature map", "mixer"])
def test_the_check_of_a_user_module_leaves_the_rng_alone(est, data, monkeypatch):
    def train(*args, **kwargs):
        raise _Trained

    monkeypatch.setattr(est, "_train", train)
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    with pytest.raises(_Trained):
        est.fit(*data)
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("est, match", [
    (KernelAttentionRegressor(rank=3, feature_map=WrongShapeMap, max_epochs=1),
     "feature_map=.*WrongShapeMap"),
    (SequenceMixerRegressor(PerToken, state_size=3, max_epochs=1), "mixer=.*PerToken"),
], ids=["feature map", "mixer"])
def test_a_refused_user_module_leaves_the_rng_alone(est, match, data):
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    with pytest.raises(ValueError, match=match):
        est.fit(*data)
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("est, match", [
    (KernelAttentionRegressor(rank=3, feature_map=lambda n_bits: LinearMap(n_bits, 3)),
     r"^feature_map=.* could not be built as feature_map\(n_bits=5, rank=3, "
     r"\*\*feature_kwargs\): TypeError"),
    (SequenceMixerRegressor(lambda n_bits: RunningMean(n_bits, 3), state_size=3),
     r"^mixer=.* could not be built as mixer\(n_bits=5, state_size=3, "
     r"\*\*mixer_kwargs\): TypeError"),
], ids=["feature map", "mixer"])
def test_a_module_that_cannot_be_built_is_named(est, match, data):
    with pytest.raises(ValueError, match=match):
        est.fit(*data)
