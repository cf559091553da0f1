"""The estimators with causal heads and positional maps: fit/predict, theorem flags,
stacking, refusal of multiset (compact) input, bad options, clone and pickle."""

import pickle
import re

import numpy as np
import pytest
from sklearn.base import clone

from minip_learn import (
    KernelAttentionClassifier,
    KernelAttentionRegressor,
    SequenceMixerRegressor,
    SoftmaxAttentionRegressor,
)
from minip_learn.compact import CompactFamily
from minip_learn.datasets import make_minip
from minip_learn.model_selection import fit_ensemble

FAST = dict(max_epochs=20, random_state=0)
OPTIONS = {
    "causal": dict(causal=True),
    "decay": dict(causal=True, positional="decay", decay=0.9),
    "learned": dict(positional="learned"),
    "causal learned table": dict(causal=True, positional="learned", feature_map="table"),
}


@pytest.fixture(scope="module")
def data():
    return make_minip(30, seq_len=3, n_bits=5, random_state=0)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_fit_predict_and_theorem_flags(name, data):
    X, y = data
    est = KernelAttentionRegressor(rank=3, **OPTIONS[name], **FAST).fit(X, y)
    pred = est.predict(X)
    assert pred.shape == y.shape and np.isfinite(pred).all()
    module = est.net_.module_
    assert module.causal == OPTIONS[name].get("causal", False)
    assert module.positional == OPTIONS[name].get("positional")
    positional = "positional" in OPTIONS[name]
    # every-position targets: a causal head is covered only on final-query targets
    causal = OPTIONS[name].get("causal", False)
    assert est.theorem_applies_ is (not positional and not causal)
    if causal and not positional:
        last = KernelAttentionRegressor(rank=3, **OPTIONS[name], **FAST).fit(X, y[:, -1])
        assert last.query_ == "last" and last.theorem_applies_ is True
    assert est.theorem_ == ("positional" if positional else "no" if causal else "yes")
    loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.predict(X), pred)


def test_causal_predictions_ignore_later_tokens(data):
    X, y = data
    est = KernelAttentionRegressor(rank=3, **OPTIONS["decay"], **FAST).fit(X, y)
    later = X.copy()
    later[:, 2] = 1 - later[:, 2]
    np.testing.assert_allclose(est.predict(later)[:, :2], est.predict(X)[:, :2], rtol=1e-12)
    assert not np.allclose(est.predict(later)[:, 2], est.predict(X)[:, 2])


def test_learned_positions_refuse_longer_sequences(data):
    X, y = data
    est = KernelAttentionRegressor(rank=2, positional="learned", **FAST).fit(X, y)
    assert est.net_.module_.max_len == 3
    longer, _ = make_minip(4, seq_len=4, n_bits=5, random_state=1)
    with pytest.raises(ValueError, match="seq_len=4.*max_len=3"):
        est.predict(longer)
    assert est.predict(X[:, :2]).shape == (30, 2)


def test_classifier_softmax_and_model_take_the_options(data):
    X, y = data
    clf = KernelAttentionClassifier(rank=2, causal=True, **FAST).fit(X, y)
    assert clf.net_.module_.causal and clf.predict(X).shape == y.shape
    soft = SoftmaxAttentionRegressor(causal=True, **FAST).fit(X, y)
    assert soft.net_.module_.causal and soft.predict(X).shape == y.shape
    model = KernelAttentionRegressor(rank=2, n_heads=2, **OPTIONS["decay"], **FAST).fit(X, y)
    assert model.net_.module_.positional == "decay" and model.theorem_ == "no"


def test_fit_ensemble_stacks_causal_heads(data):
    X, y = data
    est = KernelAttentionRegressor(**OPTIONS["decay"], **FAST)
    res = fit_ensemble(est, X, y, params=[{"rank": 1, "random_state": 0},
                                          {"rank": 3, "random_state": 0}])
    assert res.path == "generic"
    single = clone(est).set_params(rank=3).fit(X, y)
    np.testing.assert_allclose(res.estimators[1].predict(X), single.predict(X), atol=1e-5)


def _order_refusal(est, reason):
    """The one message refusing a CompactFamily to an estimator whose model reads token
    order, as a regular expression."""
    return re.escape(
        "X is a CompactFamily (sequences in multiset form, without token order), but "
        f"{type(est).__name__} {reason}, which a multiset does not have: pass the "
        "materialised sequences, X of shape (n_sequences, seq_len, n_bits) in their "
        "order (X.expand()).")


ORDERED = {
    "kernel": (KernelAttentionRegressor(causal=True), "with causal=True"),
    "learned": (KernelAttentionRegressor(positional="learned"), "with positional='learned'"),
    "decay": (KernelAttentionRegressor(**OPTIONS["decay"]),
              "with causal=True and positional='decay'"),
    "classifier": (KernelAttentionClassifier(causal=True), "with causal=True"),
    "softmax": (SoftmaxAttentionRegressor(causal=True), "with causal=True"),
    "mixer": (SequenceMixerRegressor(state_size=2), "with any mixer"),
}


@pytest.mark.parametrize("name", list(ORDERED))
def test_compact_input_is_refused(name, data):
    est, option = ORDERED[name]
    family = CompactFamily.from_sequences(data[0])
    y = np.zeros((family.n_sequences, family.n_slots))
    match = _order_refusal(est, f"{option} depends on the order of the tokens")
    with pytest.raises(ValueError, match=match):
        clone(est).set_params(max_epochs=1).fit(family, y)


@pytest.mark.parametrize("name", list(ORDERED))
def test_compact_predict_is_refused(name, data):
    X, y = data
    est, option = ORDERED[name]
    est = clone(est).set_params(max_epochs=1, random_state=0).fit(X, y)
    match = _order_refusal(est, f"{option} depends on the order of the tokens")
    with pytest.raises(ValueError, match=match):
        est.predict(CompactFamily.from_sequences(X))


@pytest.mark.parametrize("est", [KernelAttentionRegressor(rank=2),
                                 SoftmaxAttentionRegressor()], ids=["kernel", "softmax"])
def test_compact_predict_after_final_query_targets_is_refused(est, data):
    X, y = data
    est = clone(est).set_params(max_epochs=1, random_state=0).fit(X, y[:, -1])
    reason = ("was fitted on final-query targets (query_='last') and predicts the last "
              "position of every sequence")
    with pytest.raises(ValueError, match=_order_refusal(est, reason)):
        est.predict(CompactFamily.from_sequences(X))


@pytest.mark.parametrize("est", [KernelAttentionRegressor(rank=2),
                                 SoftmaxAttentionRegressor()], ids=["kernel", "softmax"])
def test_compact_input_is_taken_by_positionless_heads(est, data):
    X, y = data
    est = clone(est).set_params(max_epochs=1, random_state=0).fit(X, y)
    family = CompactFamily.from_sequences(X)
    assert est.predict(family).shape == (family.n_sequences, family.n_slots)


@pytest.mark.parametrize("params, match", [
    (dict(positional="decay"), "needs decay"),
    (dict(decay=0.5), "decay is the factor"),
    (dict(positional="decay", decay=0.5), "needs causal=True"),
    (dict(causal=True, positional="decay", decay=1.5), "decay must be <= 1"),
    (dict(causal=True, positional="decay", decay=0.0), "decay must be > 0"),
    (dict(positional="rope"), "positional must be one of"),
])
def test_bad_options_name_the_parameter(params, match, data):
    X, y = data
    with pytest.raises(ValueError, match=match):
        KernelAttentionRegressor(max_epochs=1, **params).fit(X, y)


def test_clone_and_get_params_keep_the_options():
    est = KernelAttentionRegressor(causal=True, positional="decay", decay=0.7)
    params = clone(est).get_params()
    assert (params["causal"], params["positional"], params["decay"]) == (True, "decay", 0.7)
    assert clone(SoftmaxAttentionRegressor(causal=True)).get_params()["causal"] is True
    assert KernelAttentionClassifier(positional="learned").get_params()["positional"] == "learned"
    assert est.set_params(decay=0.5).decay == 0.5
