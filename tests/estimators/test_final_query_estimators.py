"""Final-query targets: a y of shape (n,) for 3-D X is one target per sequence, at its
last position; every estimator trains on that position only and predicts it."""

import numpy as np
import pytest
import torch
from sklearn.base import clone

from minip_learn import (
    KernelAttentionClassifier,
    KernelAttentionRegressor,
    SoftmaxAttentionRegressor,
)
from minip_learn.compact import CompactFamily
from minip_learn.constructions import softmax_construction
from minip_learn.datasets import make_minip, minip_targets
from minip_learn.model_selection import fit_ensemble
from minip_learn.nn import KernelAttentionHead
from minip_learn.training import LastPositionLoss, train_members

F64 = dict(dtype="float64", random_state=0)

ESTIMATORS = {
    "kernel": KernelAttentionRegressor(rank=4, max_epochs=60, **F64),
    "softmax": SoftmaxAttentionRegressor(max_epochs=60, **F64),
    "classifier": KernelAttentionClassifier(rank=4, max_epochs=60, **F64),
}


@pytest.fixture(scope="module")
def data():
    X, Y = make_minip(48, seq_len=4, n_bits=6, random_state=0)
    return X, Y, Y[:, -1]


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_final_query_fit_predicts_one_output_per_sequence(name, data):
    X, Y, y = data
    est = clone(ESTIMATORS[name]).fit(X, y, check_minip=True)
    assert est.query_ == "last"
    pred = est.predict(X)
    assert pred.shape == (len(X),)
    # score: the fraction of sequences whose last position is right
    if name == "classifier":
        expected = np.mean(pred == y)
    else:
        expected = np.mean(np.abs(pred - y) < 0.5)
    assert est.score(X, y) == pytest.approx(expected)
    # predictions are the module's outputs at the last position
    full = est.net_.module_.double().eval()(torch.as_tensor(X, dtype=torch.float64))
    last = full.detach().numpy()[:, -1]
    if name == "classifier":
        np.testing.assert_array_equal(pred, est.classes_[last.argmax(-1)])
    else:
        np.testing.assert_allclose(pred, last, rtol=1e-12, atol=1e-12)
    # all-position targets keep their meaning
    all_pos = clone(ESTIMATORS[name]).set_params(max_epochs=2).fit(X, Y)
    assert all_pos.query_ == "all" and all_pos.predict(X).shape == Y.shape


@pytest.mark.parametrize("name", ["kernel", "softmax"])
def test_the_loss_reads_the_last_position_only(name, data):
    # the first epoch's loss is the initial head's error at the last positions
    X, _, y = data
    est = clone(ESTIMATORS[name]).set_params(max_epochs=3, stop_tolerance=None).fit(X, y)
    init = clone(est).set_params(max_epochs=1, lr=1e-300).fit(X, y)  # the initial head
    p_last = init.predict(X)
    loss0 = est.net_.history[0]["train_loss"]
    assert loss0 == pytest.approx(np.mean((p_last - y) ** 2), rel=1e-9)
    assert est.net_.get_loss(torch.as_tensor(np.c_[np.zeros((len(y), 3)), p_last]),
                             torch.as_tensor(y)).item() == pytest.approx(loss0, rel=1e-9)


def test_last_position_loss_ignores_earlier_positions():
    y_pred = torch.tensor([[9.0, -3.0, 1.0], [4.0, 7.0, 2.0]], requires_grad=True)
    loss = LastPositionLoss()(y_pred, torch.tensor([0.0, 0.0]))
    assert loss.item() == 2.5
    loss.backward()
    assert (y_pred.grad[:, :-1] == 0).all() and (y_pred.grad[:, -1] != 0).all()
    # logits: the last position of (n, N, n_classes)
    crit = LastPositionLoss(torch.nn.CrossEntropyLoss)
    logits = torch.zeros(2, 3, 4)
    logits[:, :-1, 0] = 50.0  # earlier positions vote 0
    logits[:, -1, 2] = 50.0
    assert crit(logits, torch.tensor([2, 2])).item() < 1e-6


def test_fit_ensemble_on_final_query_targets_equals_separate_fits(data):
    X, _, y = data
    est = KernelAttentionRegressor(rank=3, max_epochs=30, stop_tolerance=None, **F64)
    res = fit_ensemble(est, X, y, params=[{"random_state": 0}, {"random_state": 1}])
    for member, seed in zip(res.estimators, (0, 1)):
        alone = clone(est).set_params(random_state=seed).fit(X, y)
        assert member.query_ == "last"
        np.testing.assert_allclose(member.predict(X), alone.predict(X), atol=1e-8)


def test_make_minip_final_query_family():
    X, y = make_minip(40, seq_len=3, n_bits=6, query="last", random_state=0)
    assert y.shape == (40,)
    np.testing.assert_array_equal(y, minip_targets(X)[:, -1])
    est = SoftmaxAttentionRegressor(max_epochs=400, **F64).fit(X, y, check_minip=True)
    assert est.predict(X).shape == (40,) and est.score(X, y) == 1.0


def test_constructions_score_final_query_targets(data):
    # an estimator fitted on every position scores final-query y at the last position
    X, Y, y = data
    est = softmax_construction(6, seq_len=4)
    assert est.query_ == "all" and est.predict(X).shape == Y.shape
    assert est.score(X, y) == 1.0
    wrong = y + np.where(np.arange(len(y)) < 12, 1, 0)  # 12 of 48 sequences off by one
    assert est.score(X, wrong) == 0.75


def test_two_d_X_keeps_its_meaning(data):
    X, _, _ = data
    X2 = X[:, 0]
    y2 = X2.sum(1).astype(float)
    est = KernelAttentionRegressor(rank=2, max_epochs=5, **F64).fit(X2, y2)
    assert est.query_ == "all" and est.predict(X2).shape == (len(X2),)


def test_final_query_errors(data):
    X, Y, y = data
    fam = CompactFamily.from_sequences(X)
    for est in ESTIMATORS.values():
        with pytest.raises(ValueError, match="final-query targets need materialised"):
            clone(est).fit(fam, y)
    est = clone(ESTIMATORS["kernel"]).set_params(max_epochs=2).fit(X, y)
    with pytest.raises(ValueError, match="fitted on final-query targets .* last position"):
        est.predict(fam)
    with pytest.raises(ValueError, match=r"pass y of shape \(48,\)"):
        est.score(X, Y)
    bad = y.copy()
    bad[5] += 1
    with pytest.raises(ValueError, match="not the Min-IP target of X .* sequence 5, "
                                         "position 3"):
        clone(est).fit(X, bad, check_minip=True)
    with pytest.raises(ValueError, match=r"y has shape \(47,\)"):
        clone(est).fit(X, y[:-1])
    Xt, yt = (torch.as_tensor(a, dtype=torch.float64) for a in (X, y))
    head = [(dict(n_bits=6, rank=2), 0)]
    with pytest.raises(ValueError, match="final-query targets need materialised"):
        train_members(KernelAttentionHead, head, Xt, yt, counts=torch.ones(48, 4,
                      dtype=torch.float64), query="last", dtype=torch.float64)
    with pytest.raises(ValueError, match=r"query='last' takes one target per sequence"):
        train_members(KernelAttentionHead, head, Xt, torch.as_tensor(Y, dtype=torch.float64),
                      query="last", dtype=torch.float64)
    with pytest.raises(ValueError, match="query must be 'all' or 'last'"):
        train_members(KernelAttentionHead, head, Xt, yt, query="first")
