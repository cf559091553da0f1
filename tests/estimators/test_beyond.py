"""Variants outside the theorem: signed feature maps with a guarded
normalisation, several heads and layers, MLP readouts, the argmax classifier, the
``theorem_applies`` flag used by the sweep's certified-bound check, and the R8 capacity
calculator."""

import math

import numpy as np
import pytest
import torch
from sklearn.base import clone

from minip_learn import (
    KernelAttentionClassifier,
    KernelAttentionRegressor,
    SoftmaxAttentionRegressor,
)
from minip_learn.datasets import make_minip, make_witness_suite
from minip_learn.model_selection._execution import _fit_and_score, _Plan
from minip_learn.nn import (
    KernelAttentionHead,
    KernelAttentionModel,
    MLPReadout,
    SoftmaxAttentionHead,
    available_feature_maps,
    make_feature_map,
)
from minip_learn.theory import (
    channel_capacity_bits,
    model_channel_capacity,
    transcript_check,
    transcript_lower_bound,
)

SIGNED = ["identity", "rff", "taylor"]


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _tokens(n, n_bits, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n, n_bits), generator=g).float()


# -- signed feature maps -------------------------------------------------------------
def test_signed_maps_are_registered_with_flags():
    signed = set(available_feature_maps(nonnegative=False))
    assert set(SIGNED) <= signed
    assert not set(SIGNED) & set(available_feature_maps(nonnegative=True))


@pytest.mark.parametrize("name, rank", [("identity", 5), ("rff", 7), ("taylor", 3),
                                        ("taylor", 6), ("taylor", 10)])
def test_feature_size_is_the_reported_rank(name, rank):
    torch.manual_seed(0)
    phi = make_feature_map(name, 8, rank)
    out = phi(torch.rand(2, 3, 8))
    assert out.shape == (2, 3, rank) == (2, 3, phi.rank)
    head = KernelAttentionHead(8, rank, feature_map=name)
    assert head.features(torch.rand(2, 3, 8))[0].shape[-1] == head.rank == rank


def test_taylor_kernel_is_second_order_exp_and_positive():
    torch.manual_seed(0)
    phi_q, phi_k = make_feature_map("taylor", 6, 10), make_feature_map("taylor", 6, 10)
    x, z = torch.randn(5, 6), torch.randn(7, 6)
    t = phi_q.encoder(x) @ phi_k.encoder(z).T
    kernel = phi_q(x) @ phi_k(z).T
    torch.testing.assert_close(kernel, 1 + t + t * t / 2)
    assert phi_q.proj_dim == 3 and kernel.min() >= 0.5 - 1e-6
    # signed features, positive kernel: the theorem applies to a taylor head
    head = KernelAttentionHead(6, 6, feature_map="taylor")
    assert head.nonnegative and head.theorem_applies
    assert (head.features(torch.randn(4, 6))[0] < 0).any()


def test_taylor_features_are_rank_nested():
    # proj_dim p's features are a prefix of proj_dim p+1's when z_{p+1} = 0 (what a
    # rank-masked HeadEnsemble computes with zero-padded projections)
    small, large = make_feature_map("taylor", 4, 6), make_feature_map("taylor", 4, 10)
    z = torch.randn(5, 2)
    padded = large.activation(torch.cat([z, torch.zeros(5, 1)], dim=-1))
    assert torch.equal(padded[:, :6], small.activation(z))
    assert not padded[:, 6:].any()


@pytest.mark.parametrize("rank, kwargs", [(1, {}), (4, {}), (8, {}), (6, {"proj_dim": 3})])
def test_taylor_rejects_inconsistent_rank(rank, kwargs):
    with pytest.raises(ValueError, match="taylor"):
        make_feature_map("taylor", 6, rank, **kwargs)


@pytest.mark.parametrize("name", ["identity", "rff"])
def test_signed_maps_give_negative_kernel_entries(name):
    torch.manual_seed(0)
    head = KernelAttentionHead(10, 4, feature_map=name)
    tokens = _tokens(40, 10)
    assert (head.kernel(tokens, tokens) < 0).any()
    assert head.nonnegative is False and head.theorem_applies is False


def test_guard_keeps_outputs_finite_when_the_denominator_vanishes():
    head = KernelAttentionHead(2, 1, feature_map="identity", value_dim=2)
    with torch.no_grad():
        q, k = head.query_features.encoder, head.key_features.encoder
        q.weight.zero_()
        q.bias.fill_(1.0)                                   # phi_Q = 1
        k.weight.copy_(torch.tensor([[1.0, -1.0]]))         # phi_K(e1) = 1, phi_K(e2) = -1
        k.bias.zero_()
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]],             # den = 1 - 1 = 0 exactly
                      [[1.0, 0.0], [1.0, 0.0]]])            # den = 2
    den = (head.features(x)[0] * head.features(x)[1].sum(-2, keepdim=True)).sum(-1)
    assert den[0].abs().max() == 0
    out = head(x)
    assert torch.isfinite(out).all()
    assert torch.isfinite(head.attention_weights(x)).all()
    eps = head.denominator_eps
    guarded = head._guard(torch.tensor([-2.0, -1e-6, 0.0, 1e-6, 3.0]))
    torch.testing.assert_close(guarded, torch.tensor([-2.0, -eps, eps, eps, 3.0]))


@pytest.mark.parametrize("name", ["elu+1", "exp", "favor+"])
@pytest.mark.parametrize("seq_len", [3, 40])   # explicit-kernel and sketch forms
def test_nonnegative_path_is_unchanged(name, seq_len, monkeypatch):
    torch.manual_seed(0)
    head = KernelAttentionHead(6, 4, feature_map=name)
    x = _tokens(5 * seq_len, 6).reshape(5, seq_len, 6)
    out = head(x)
    # the guard is the old floor, bit for bit, for a nonnegative kernel ...
    den = torch.rand(7, 1) * torch.tensor([0.0, 1.0, 1e-40, 2.0, 0.0, 3.0, 1e-3])[:, None]
    assert torch.equal(head._guard(den), head._floor(den))
    monkeypatch.setattr(head, "_guard", head._floor)
    assert torch.equal(head(x), out)
    # ... whatever its eps
    monkeypatch.undo()
    head.denominator_eps = 1e6
    assert torch.equal(head(x), out)
    # and the output is the normalised kernel attention of the sketch (docs/theory.rst)
    phi_q, phi_k = head.features(x)
    v = head.value(x)
    S, s = phi_k.transpose(-2, -1) @ v, phi_k.sum(-2)
    den = (phi_q * s.unsqueeze(-2)).sum(-1, keepdim=True)
    sketch = head.readout(x, (phi_q @ S) / den.clamp_min(torch.finfo(den.dtype).tiny))
    torch.testing.assert_close(out, sketch)


# -- several heads and layers, MLP readout -------------------------------------------
def _load_head_into_model(head, model):
    state = {(k if k.startswith("readout.") else f"layers.0.0.{k}"): v
             for k, v in head.state_dict().items()}
    model.load_state_dict(state, strict=True)


@pytest.mark.parametrize("name", ["elu+1", "exp", "identity", "taylor"])
def test_one_head_one_layer_model_is_the_single_head(name):
    torch.manual_seed(0)
    head = KernelAttentionHead(5, 6, feature_map=name)
    model = KernelAttentionModel(5, 6, feature_map=name)
    _load_head_into_model(head, model)
    x = _tokens(21, 5).reshape(7, 3, 5)
    assert torch.equal(model(x), head(x))
    assert model.theorem_applies == head.theorem_applies


def test_model_shapes_and_theorem_flag():
    torch.manual_seed(0)
    x = torch.rand(4, 3, 6)
    for kwargs in [dict(n_heads=3), dict(n_layers=2), dict(readout="mlp"),
                   dict(n_heads=2, n_layers=3, readout="mlp")]:
        model = KernelAttentionModel(6, 2, **kwargs)
        assert model(x).shape == (4, 3)
        assert model.nonnegative and not model.theorem_applies
    logits = KernelAttentionModel(6, 2, n_outputs=7)
    assert logits(x).shape == (4, 3, 7) and not logits.theorem_applies
    assert MLPReadout(6, 4, n_outputs=7)(x, torch.rand(4, 3, 4)).shape == (4, 3, 7)
    assert not KernelAttentionModel(6, 2, feature_map="identity").theorem_applies
    with pytest.raises(ValueError, match="n_layers=1"):
        KernelAttentionModel(6, 2, n_layers=2, feature_map="table",
                             feature_kwargs={"vocabulary": np.eye(6)})
    with pytest.raises(ValueError, match="readout"):
        KernelAttentionModel(6, 2, readout="relu")


# -- estimators ------------------------------------------------------------------------
def test_regressor_module_class_and_theorem_attribute():
    X, y = make_minip(40, seq_len=2, n_bits=5, random_state=0)
    default = KernelAttentionRegressor(rank=2, max_epochs=3, random_state=0).fit(X, y)
    assert type(default.net_.module_) is KernelAttentionHead and default.theorem_applies_
    for kwargs in [dict(n_heads=2), dict(n_layers=2), dict(readout="mlp")]:
        est = KernelAttentionRegressor(rank=2, max_epochs=3, random_state=0, **kwargs)
        est.fit(X, y)
        assert type(est.net_.module_) is KernelAttentionModel
        assert est.theorem_applies_ is False
        assert est.predict(X).shape == y.shape
    signed = KernelAttentionRegressor(rank=2, feature_map="identity", max_epochs=3,
                                      random_state=0).fit(X, y)
    assert signed.theorem_applies_ is False and np.isfinite(signed.predict(X)).all()
    taylor = KernelAttentionRegressor(rank=3, feature_map="taylor", max_epochs=3,
                                      random_state=0).fit(X, y)
    assert taylor.theorem_applies_ is True
    assert not hasattr(KernelAttentionRegressor(), "theorem_applies_")


def test_clone_get_params_roundtrip():
    params = dict(rank=3, n_heads=2, n_layers=3, readout="mlp", readout_width=16,
                  feature_map="rff")
    for cls in (KernelAttentionRegressor, KernelAttentionClassifier):
        est = cls(**params)
        cloned = clone(est)
        assert cloned.get_params() == est.get_params()
        assert {k: cloned.get_params()[k] for k in params} == params
    defaults = KernelAttentionRegressor().get_params()
    assert (defaults["n_heads"], defaults["n_layers"], defaults["readout"]) == (1, 1, "affine")


@pytest.mark.parametrize("cls", [KernelAttentionRegressor, KernelAttentionClassifier])
@pytest.mark.parametrize("kwargs, match", [
    (dict(n_heads=0), "n_heads"),
    (dict(n_heads=1.5), "n_heads"),
    (dict(n_layers=0), "n_layers"),
    (dict(readout="relu"), "readout"),
    (dict(readout="mlp", readout_width=0), "readout_width"),
    (dict(feature_map="table", n_layers=2), "n_layers=1"),
    (dict(feature_map="taylor", rank=8), "taylor"),
])
def test_bad_params_raise_value_error(cls, kwargs, match):
    X, y = make_minip(10, seq_len=2, n_bits=4, random_state=0)
    est = cls(**{"rank": 2, "max_epochs": 1, **kwargs})
    with pytest.raises(ValueError, match=match):
        est.fit(X, y)
    assert not hasattr(est, "net_")


def test_classifier_fit_predict_score():
    X, y = make_minip(64, seq_len=2, n_bits=6, random_state=0)
    clf = KernelAttentionClassifier(rank=2, random_state=0).fit(X, y)
    np.testing.assert_array_equal(clf.classes_, np.arange(7))   # 0..n_bits
    pred = clf.predict(X)
    assert pred.shape == y.shape and pred.dtype.kind == "i"
    assert clf.solved_ and clf.train_max_error_ == 0 and clf.score(X, y) == 1.0
    assert clf.theorem_applies_ is False
    assert clf.net_.module_.n_outputs == 7
    # one wrong position in a sequence makes the whole sequence wrong
    y_bad = y.copy()
    y_bad[0, 1] = (y_bad[0, 1] + 1) % 7
    assert clf.score(X, y_bad) == pytest.approx(1 - 1 / len(X))
    with pytest.raises(ValueError, match="label type"):
        clf.fit(X, y + 0.5)


def test_classifier_generic_labels():
    X, y = make_minip(30, seq_len=2, n_bits=4, random_state=0)
    labels = np.array(list("abcde"))[y]
    clf = KernelAttentionClassifier(rank=2, max_epochs=5, random_state=0).fit(X, labels)
    np.testing.assert_array_equal(clf.classes_, np.unique(labels))
    assert set(np.unique(clf.predict(X))) <= set(clf.classes_)


def test_pickle_roundtrip_of_the_variants():
    import pickle

    X, y = make_minip(20, seq_len=3, n_bits=4, random_state=0)
    for est in [KernelAttentionRegressor(rank=2, n_heads=2, n_layers=2, readout="mlp",
                                         feature_map="rff", max_epochs=3, random_state=0),
                KernelAttentionClassifier(rank=3, feature_map="taylor", max_epochs=3,
                                          random_state=0)]:
        est.fit(X, y)
        loaded = pickle.loads(pickle.dumps(est))
        np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
        assert loaded.theorem_applies_ == est.theorem_applies_


# -- the sweep's certified-bound check ------------------------------------------------
def _always_solved(estimator, X, y):
    return 1.0  # a deliberately broken metric: every fit "solves"


@pytest.mark.parametrize("params, raises", [
    ({}, True),                                     # one nonnegative head: covered
    ({"n_heads": 2}, False),                        # outside the theorem
    ({"readout": "mlp"}, False),
    ({"feature_map": "identity"}, False),
    ({"feature_map": "taylor", "rank": 3}, True),   # signed features, positive kernel
])
def test_sweep_check_fires_only_when_the_theorem_applies(params, raises):
    X, y = make_minip(12, seq_len=2, n_bits=4, random_state=0)
    est = KernelAttentionRegressor(rank=2, max_epochs=2)
    plan = _Plan(est, X, y, None, {"solved": _always_solved}, 1, 8, False)
    if raises:
        with pytest.raises(RuntimeError, match="certified minimum"):
            _fit_and_score(plan, params, 0, "k")
    else:
        row, _ = _fit_and_score(plan, params, 0, "k")
        assert row["solved"] and row["below_certified_bound"]
        assert row["theorem_applies"] is False


def test_sweep_check_covers_the_classifier_as_outside():
    X, y = make_minip(12, seq_len=2, n_bits=4, random_state=0)
    est = KernelAttentionClassifier(rank=2, max_epochs=2)
    plan = _Plan(est, X, y, None, {"solved": _always_solved}, 1, 8, False)
    row, _ = _fit_and_score(plan, {}, 0, "k")
    assert row["theorem_applies"] is False


@pytest.mark.parametrize("est", [KernelAttentionRegressor(rank=2, n_heads=2),
                                 KernelAttentionRegressor(rank=2, readout="mlp"),
                                 KernelAttentionClassifier(rank=2)])
def test_fit_ensemble_rejects_the_variants(est):
    from minip_learn.model_selection import fit_ensemble

    X, y = make_minip(12, seq_len=2, n_bits=4, random_state=0)
    with pytest.raises(ValueError, match="one by one"):
        fit_ensemble(est.set_params(max_epochs=2), X, y, ranks=[2, 3], seeds=[0])


# -- R8 capacity -----------------------------------------------------------------------
def test_model_channel_capacity():
    assert model_channel_capacity(KernelAttentionHead(6, 5)) == 5 * 24
    model = KernelAttentionModel(6, 4, n_heads=2, n_layers=3)
    assert model_channel_capacity(model) == channel_capacity_bits(2, 3, 4, 24) == 576
    assert model_channel_capacity(model.double()) == 2 * 3 * 4 * 53
    assert model_channel_capacity(model, bits_of_precision=8) == 192
    assert model_channel_capacity(model, bits_of_precision=8, count="sketch") == 2 * 3 * 4 * 7 * 8
    with pytest.raises(ValueError, match="count"):
        model_channel_capacity(model, count="values")
    X, y = make_minip(10, seq_len=2, n_bits=4, random_state=0)
    est = KernelAttentionRegressor(rank=3, n_heads=2, max_epochs=1, dtype="float64",
                                   random_state=0).fit(X, y)
    assert model_channel_capacity(est) == 2 * 3 * 53
    with pytest.raises(ValueError, match="not fitted"):
        model_channel_capacity(KernelAttentionRegressor())
    with pytest.raises(ValueError, match="sketch"):
        model_channel_capacity(SoftmaxAttentionHead(4))
    soft = SoftmaxAttentionRegressor(max_epochs=1, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="sketch"):
        model_channel_capacity(soft)


def test_transcript_check_on_the_witness_suite():
    suite = make_witness_suite(24, 3, construction="small")
    check = transcript_check(KernelAttentionHead(24, 2), suite)
    required = transcript_lower_bound(3, 24)
    assert check.required_bits == required == pytest.approx(3 * math.log2(25))
    assert check.capacity_bits == 48 and check.sufficient
    assert check.numbers_per_head == 2
    assert transcript_check(KernelAttentionHead(24, 2), suite, count="sketch").capacity_bits \
        == 2 * 25 * 24
    assert check.ratio == pytest.approx(48 / required)
    one_bit = transcript_check(KernelAttentionHead(24, 2), suite.X, bits_of_precision=1)
    assert one_bit.capacity_bits == 2 and not one_bit.sufficient
    assert transcript_check(KernelAttentionModel(24, 2), suite, n_answers=0).ratio == math.inf
