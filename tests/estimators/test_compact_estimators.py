"""The estimators on families in multiset form (CompactFamily): fit, fit_ensemble,
predict and score at the cost of the slots, equal to the materialised family."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, KFold

from minip_learn import (
    KernelAttentionClassifier,
    KernelAttentionRegressor,
    SoftmaxAttentionRegressor,
)
from minip_learn.compact import CompactFamily
from minip_learn.datasets import make_minip, minip_targets
from minip_learn.model_selection import fit_ensemble
from minip_learn.nn import KernelAttentionHead
from minip_learn.training import absolute_error, member_max_errors, train_members

F64 = dict(dtype="float64", random_state=0)


@pytest.fixture(scope="module")
def family():
    """Length-12 sequences over 1 to 3 distinct tokens each (so with padding)."""
    rng = np.random.RandomState(0)
    X, _ = make_minip(48, seq_len=3, n_bits=6, random_state=0)
    pick = rng.randint(0, 3, size=(48, 12))
    pick[:, :3] = [0, 1, 2]
    pick[::4] = 0            # one distinct token
    pick[1::4, 6:] = 1       # ... or two
    pick[1::4, :6] = 0
    fam = CompactFamily.from_sequences(np.take_along_axis(X, pick[:, :, None], 1))
    assert fam.padding.any() and fam.n_slots == 3 and fam.seq_len == 12
    return fam


ESTIMATORS = {
    "kernel-elu": KernelAttentionRegressor(rank=4, max_epochs=40, **F64),
    "kernel-table": KernelAttentionRegressor(rank=4, feature_map="table", max_epochs=40,
                                             split_every=20, **F64),
    "kernel-exp-sketch": KernelAttentionRegressor(rank=1, feature_map="exp",
                                                  max_epochs=40, **F64),
    "softmax": SoftmaxAttentionRegressor(max_epochs=40, **F64),
    "classifier": KernelAttentionClassifier(rank=4, max_epochs=40, **F64),
}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_compact_fit_equals_the_materialised_fit(name, family):
    # the loss weights every slot by its multiplicity: the loss of the materialised
    # family, at initialisation (the first epoch's loss) and after every step
    est = ESTIMATORS[name]
    seqs = family.to_sequences()
    compact = clone(est).fit(family, minip_targets(family), check_minip=True)
    full = clone(est).fit(seqs, minip_targets(seqs))
    loss_c = [row["train_loss"] for row in compact.net_.history]
    loss_m = [row["train_loss"] for row in full.net_.history]
    assert len(loss_c) == len(loss_m)
    assert loss_c[0] == pytest.approx(loss_m[0], rel=1e-12, abs=1e-12)  # initialisation
    np.testing.assert_allclose(loss_c, loss_m, rtol=1e-8, atol=1e-10)
    assert compact.n_epochs_ == full.n_epochs_
    assert compact.train_max_error_ == pytest.approx(full.train_max_error_, abs=1e-8)
    assert compact.solved_ == full.solved_
    assert (compact.n_features_in_, compact.n_bits_, compact.seq_len_) == (6, 6, 12)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_predict_is_the_materialised_prediction_at_every_slot(name, family):
    est = clone(ESTIMATORS[name]).set_params(max_epochs=15)
    est.fit(family, minip_targets(family))
    pred = est.predict(family)
    assert pred.shape == (family.n_sequences, family.n_slots)
    assert (pred[family.padding] == 0).all()
    np.testing.assert_allclose(family.expand(pred), est.predict(family.to_sequences()),
                               rtol=0, atol=1e-9)
    # the estimator fitted on materialised sequences predicts the family alike
    full = clone(est).fit(family.to_sequences(), minip_targets(family.to_sequences()))
    np.testing.assert_allclose(family.expand(full.predict(family)),
                               full.predict(family.to_sequences()), rtol=0, atol=1e-9)
    assert est.score(family, minip_targets(family)) == est.score(
        family.to_sequences(), minip_targets(family.to_sequences()))


def test_padding_targets_are_ignored(family):
    y = minip_targets(family).astype(float)
    junk = y.copy()
    junk[family.padding] = np.nan  # padding holds no target
    a = KernelAttentionRegressor(rank=3, max_epochs=20, **F64).fit(family, y)
    b = KernelAttentionRegressor(rank=3, max_epochs=20, **F64).fit(family, junk)
    np.testing.assert_array_equal(a.predict(family), b.predict(family))
    assert a.score(family, y) == a.score(family, junk)


def test_max_errors_and_stopping_leave_padding_out(family):
    # huge targets at padding change neither the stop nor the reported max error
    y = torch.as_tensor(minip_targets(family), dtype=torch.float64)
    counts = torch.as_tensor(family.counts, dtype=torch.float64)
    slots = torch.as_tensor(family.slot_tokens(), dtype=torch.float64)
    err = member_max_errors(absolute_error, torch.zeros(2, *y.shape, dtype=y.dtype), y, counts)
    junk = y.clone()
    junk[torch.as_tensor(family.padding)] = 1e6
    assert err.tolist() == member_max_errors(
        absolute_error, torch.zeros(2, *y.shape, dtype=y.dtype), junk, counts).tolist()
    kw = dict(lr=0.1, max_epochs=400, stop_tolerance=0.5, dtype=torch.float64)
    vocab = np.unique(family.slot_tokens().reshape(-1, 6), axis=0)
    members = [(dict(n_bits=6, rank=r, feature_map="table",
                     feature_kwargs={"vocabulary": vocab}), 0) for r in (3, 12)]
    res = train_members(KernelAttentionHead, members, slots, y, counts=counts, **kw)
    junk_res = train_members(KernelAttentionHead, members, slots, junk, counts=counts, **kw)
    for m, j in zip(res.members, junk_res.members):
        assert len(m.net.history) == len(j.net.history) < 400  # stopped, solved
        assert m.train_max_error == j.train_max_error < 0.5


def test_mini_batches_slice_tokens_and_counts_together(family):
    # the same seeded shuffle over sequences: the same batches, the same losses
    est = KernelAttentionRegressor(rank=3, max_epochs=6, batch_size=10, **F64)
    seqs = family.to_sequences()
    compact = clone(est).fit(family, minip_targets(family))
    full = clone(est).fit(seqs, minip_targets(seqs))
    batches = [[b["train_loss"] for b in row["batches"]] for row in compact.net_.history]
    ref = [[b["train_loss"] for b in row["batches"]] for row in full.net_.history]
    assert len(batches[0]) == 5
    np.testing.assert_allclose(batches, ref, rtol=1e-9, atol=1e-12)


def test_fit_ensemble_on_a_compact_family(family):
    est = KernelAttentionRegressor(max_epochs=30, stop_tolerance=None, dtype="float64")
    params = [{"rank": 2, "random_state": 0}, {"rank": 5, "random_state": 1}]
    res = fit_ensemble(est, family, minip_targets(family), params=params)
    seqs = family.to_sequences()
    ref = fit_ensemble(est, seqs, minip_targets(seqs), params=params)
    for a, b in zip(res.estimators, ref.estimators):
        assert (a.rank, a.seq_len_) == (b.rank, 12)
        np.testing.assert_allclose(family.expand(a.predict(family)), b.predict(seqs),
                                   rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("bad", ["materialised", "transposed", "one-dim"])
def test_bad_compact_targets_name_y_and_the_slot_shape(bad, family):
    y = {"materialised": minip_targets(family.to_sequences()),
         "transposed": minip_targets(family).T,
         "one-dim": minip_targets(family)[:, 0]}[bad]
    for est in (KernelAttentionRegressor(max_epochs=1), KernelAttentionClassifier(max_epochs=1)):
        with pytest.raises(ValueError, match=r"y has shape .*expected \(48, 3\)"):
            est.fit(family, y)
    fitted = KernelAttentionRegressor(rank=2, max_epochs=2).fit(family, minip_targets(family))
    with pytest.raises(ValueError, match=r"y has shape .*expected \(48, 3\)"):
        fitted.score(family, y)


def test_predicting_other_n_bits_is_the_usual_error(family):
    est = KernelAttentionRegressor(rank=2, max_epochs=2).fit(family, minip_targets(family))
    other = CompactFamily.from_sequences(make_minip(5, seq_len=4, n_bits=7, random_state=0)[0])
    with pytest.raises(ValueError, match="X has 7 features, but KernelAttentionRegressor "
                                         "is expecting 6 features"):
        est.predict(other)
    # and the other way round: fitted on 7 bits, a 6-bit family
    est7 = KernelAttentionRegressor(rank=2, max_epochs=2).fit(other, minip_targets(other))
    assert est7.n_features_in_ == 7
    with pytest.raises(ValueError, match="expecting 7 features"):
        est7.score(family, minip_targets(family))


def test_clone_and_pickle_of_a_compact_fit(family):
    est = KernelAttentionRegressor(rank=3, feature_map="table", max_epochs=10, **F64)
    est.fit(family, minip_targets(family))
    assert clone(est).get_params() == est.get_params()
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(again.predict(family), est.predict(family))
    assert again.vocabulary_.shape[1] == 6


def test_grid_search_on_a_compact_family(family):
    search = GridSearchCV(KernelAttentionRegressor(max_epochs=5, random_state=0),
                          {"rank": [1, 3]}, cv=KFold(2, shuffle=True, random_state=0))
    search.fit(family, minip_targets(family))
    assert search.best_params_["rank"] in (1, 3)
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()
    assert search.best_estimator_.predict(family).shape == (48, 3)
    # a fold is a CompactFamily of its sequences, scored on its own slots
    assert search.score(family, minip_targets(family)) == search.best_estimator_.score(
        family, minip_targets(family))


def test_a_long_family_trains_on_its_slots_only(monkeypatch):
    # a length-400 family of 2-3 distinct tokens: the head never sees 400 positions
    from minip_learn.estimators import _base

    rng = np.random.RandomState(1)
    X, _ = make_minip(30, seq_len=3, n_bits=6, random_state=1)
    counts = np.stack([rng.multinomial(397, [0.5, 0.3, 0.2]) + 1 for _ in range(30)])
    tokens = np.unique(X.reshape(-1, 6), axis=0)
    keys = {t.tobytes(): i for i, t in enumerate(tokens)}
    ids = np.array([[keys[t.tobytes()] for t in seq] for seq in X])
    fam = CompactFamily.from_slots(tokens, ids, counts)
    seen = []

    def spy(module, members, X, y, **kwargs):
        seen.append((tuple(X.shape), tuple(kwargs["counts"].shape)))
        return train_members(module, members, X, y, **kwargs)

    monkeypatch.setattr(_base, "train_members", spy)
    est = KernelAttentionRegressor(rank=3, max_epochs=3, stop_tolerance=None).fit(
        fam, minip_targets(fam))
    assert seen == [((30, fam.n_slots, 6), (30, fam.n_slots))] and fam.n_slots <= 3
    assert est.predict(fam).shape == (30, fam.n_slots) and est.seq_len_ == 400
