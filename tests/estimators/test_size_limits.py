"""Sizes whose training would not fit in memory are refused at fit, before any tensor is
allocated: a ValueError naming the parameter and the bytes, for any Python int."""

import re

import pytest
import torch
from sklearn.base import clone

from minip_learn import (
    KernelAttentionClassifier,
    KernelAttentionRegressor,
    SequenceMixerRegressor,
    SoftmaxAttentionRegressor,
)
from minip_learn.datasets import make_minip
from minip_learn.estimators import _base
from minip_learn.model_selection import fit_ensemble
from minip_learn.nn import KernelAttentionHead, SoftmaxAttentionHead, make_mixer

#: every estimator and every size parameter (with what makes the size matter)
SIZES = [
    (KernelAttentionRegressor, "rank", {}),
    (KernelAttentionRegressor, "rank", {"feature_map": "table"}),
    (KernelAttentionRegressor, "value_dim", {}),
    (KernelAttentionRegressor, "feature_width", {"feature_depth": 1}),
    (KernelAttentionRegressor, "readout_width", {"readout": "mlp"}),
    (KernelAttentionClassifier, "rank", {}),
    (KernelAttentionClassifier, "value_dim", {}),
    (KernelAttentionClassifier, "feature_width", {"feature_depth": 1}),
    (KernelAttentionClassifier, "readout_width", {"readout": "mlp"}),
    (SoftmaxAttentionRegressor, "score_dim", {}),
    (SoftmaxAttentionRegressor, "value_dim", {}),
    (SequenceMixerRegressor, "state_size", {}),
    (SequenceMixerRegressor, "state_size", {"mixer": "mamba"}),
    (SequenceMixerRegressor, "state_size", {"mixer": "softmax"}),
]

_REFUSAL = (r"{name}={value} needs about [0-9.e+]+ GB of memory to train \(.*parameters "
            r"with their gradients and optimizer state.*\); this machine has [0-9.]+ [MG]B "
            r"available\.")


@pytest.fixture(scope="module")
def data():
    return make_minip(8, seq_len=2, n_bits=4, random_state=0)


@pytest.mark.parametrize("value", [10**9, 10**30])
@pytest.mark.parametrize("cls, name, extra", SIZES,
                         ids=[f"{c.__name__}-{n}-{'-'.join(map(str, e.values())) or 'default'}"
                              for c, n, e in SIZES])
def test_a_size_that_cannot_fit_is_a_value_error_at_fit(cls, name, extra, value, data):
    X, y = data
    est = cls(**{name: value}, max_epochs=1, **extra)  # __init__ stores, never checks
    assert getattr(clone(est), name) == value
    with pytest.raises(ValueError, match=_REFUSAL.format(name=name, value=value)):
        est.fit(X, y)
    assert not hasattr(est, "net_")


def test_the_need_is_the_parameters_with_their_training_state(data):
    X, y = data
    with pytest.raises(ValueError) as info:
        KernelAttentionRegressor(rank=10**9, max_epochs=1).fit(X, y)
    message = str(info.value)
    # two maps of Linear(4, rank): 10 * 10**9 parameters, 4 float32 values each (the
    # parameter, its gradient, Adam's two moments) = 160 GB, plus the features
    assert re.search(r"10,000,000,\d{3} parameters", message)
    assert float(re.search(r"about ([0-9.]+) GB", message).group(1)) >= 160
    with pytest.raises(ValueError, match=r"float64"):
        SoftmaxAttentionRegressor(score_dim=10**9, dtype="float64", optimizer="sgd",
                                  max_epochs=1).fit(X, y)


def _count(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("size", [16, 300, 5000])
def test_counted_parameters_are_those_of_the_built_head(size, data, monkeypatch):
    X, y = data
    monkeypatch.setattr(_base, "_available_memory", lambda device: 0)
    cases = [
        (KernelAttentionRegressor(rank=size, max_epochs=1),
         KernelAttentionHead(4, size)),
        (KernelAttentionRegressor(rank=size, feature_map="table", max_epochs=1),
         None),
        (SoftmaxAttentionRegressor(score_dim=size, max_epochs=1),
         SoftmaxAttentionHead(4, score_dim=size)),
        (SequenceMixerRegressor("gla", state_size=size, max_epochs=1),
         make_mixer("gla", 4, size)),
    ]
    for est, head in cases:
        with pytest.raises(ValueError, match="this machine has 0.0 MB available") as info:
            est.fit(X, y)
        counted = int(re.search(r"([0-9,]+) parameters", str(info.value)).group(1)
                      .replace(",", ""))
        if head is None:  # the table: one row per distinct training token, per map
            n_tokens = len({tuple(t) for t in X.reshape(-1, 4)})
            assert counted >= 2 * n_tokens * size
        else:
            assert counted == _count(head)


def test_sizes_that_fit_train_and_unknown_memory_has_a_fixed_cap(data, monkeypatch):
    X, y = data
    assert KernelAttentionRegressor(rank=300, max_epochs=1).fit(X, y).net_ is not None
    monkeypatch.setattr(_base, "_available_memory", lambda device: None)
    assert SoftmaxAttentionRegressor(score_dim=300, max_epochs=1).fit(X, y).net_ is not None
    with pytest.raises(ValueError, match=r"^rank=100000000000 needs about .*; the free memory "
                                         r"of this machine cannot be told, and a fit may "
                                         r"take at most 1099.5 GB\.$"):
        KernelAttentionRegressor(rank=10**11, max_epochs=1).fit(X, y)


@pytest.mark.parametrize("rank", [10**9, 10**30])
def test_a_stack_of_members_is_refused_as_a_whole(rank, data):
    X, y = data
    est = KernelAttentionRegressor(max_epochs=1, n_init=2)
    with pytest.raises(ValueError, match=rf"^rank={rank} needs .*for a stack of 4 heads\)"):
        fit_ensemble(est, X, y, params=[{"rank": 2, "random_state": 0},
                                        {"rank": rank, "random_state": 1}])
    mixer = SequenceMixerRegressor(state_size=rank, max_epochs=1)
    with pytest.raises(ValueError, match=rf"^state_size={rank} needs .*stack of 2 heads"):
        fit_ensemble(mixer, X, y, params=[{"random_state": 0}, {"random_state": 1}])


def test_the_check_draws_no_random_numbers(data):
    X, y = data
    state = torch.get_rng_state()
    with pytest.raises(ValueError):
        KernelAttentionRegressor(rank=10**9, max_epochs=1).fit(X, y)
    assert torch.equal(state, torch.get_rng_state())
    a = KernelAttentionRegressor(rank=3, max_epochs=2, random_state=0).fit(X, y)
    b = KernelAttentionRegressor(rank=3, max_epochs=2, random_state=0).fit(X, y)
    assert (a.predict(X) == b.predict(X)).all()
