"""SequenceMixerRegressor: built-in and user mixers through the training pipeline of
the heads, scikit-learn compatibility, bad modules and final-query targets."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.estimator_checks import parametrize_with_checks

from minip_learn import SequenceMixerRegressor
from minip_learn.compact import CompactFamily
from minip_learn.datasets import make_minip, make_witness_suite
from minip_learn.model_selection import fit_ensemble
from minip_learn.nn import available_mixers, get_mixer, make_mixer

FAST = dict(max_epochs=40, dtype="float64", random_state=0)


class RunningMean(torch.nn.Module):
    """A user's mixer: a causal running mean of learned token maps, read out with the
    token."""

    def __init__(self, n_bits, state_size, *, scale=1.0):
        super().__init__()
        self.key = torch.nn.Linear(n_bits, state_size)
        self.out = torch.nn.Linear(n_bits + state_size, 1)
        self.scale = scale

    def forward(self, x):
        steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype, device=x.device)[:, None]
        h = self.scale * self.key(x).cumsum(1) / steps
        return self.out(torch.cat([x, h], -1)).squeeze(-1)


def running_mean_factory(n_bits, state_size, scale=1.0):
    """A user's mixer given as a factory function."""
    return RunningMean(n_bits, state_size, scale=scale)


class PerToken(torch.nn.Module):
    """Wrong: one output of shape (batch, N, 1) per token."""

    def __init__(self, n_bits, state_size):
        super().__init__()
        self.lin = torch.nn.Linear(n_bits, 1)

    def forward(self, x):
        return self.lin(x)


class NaNMixer(RunningMean):
    """Wrong: NaN outputs."""

    def forward(self, x):
        return super().forward(x) * float("nan")


class ShortOnly(RunningMean):
    """Finite on sequences of at most 3 tokens, NaN on longer ones."""

    def forward(self, x):
        out = super().forward(x)
        return out + torch.log(torch.tensor(3.5 - x.shape[1], dtype=x.dtype))


@pytest.fixture(scope="module")
def data():
    return make_minip(40, seq_len=3, n_bits=6, random_state=0)


@parametrize_with_checks([SequenceMixerRegressor("kernel", state_size=4, max_epochs=30,
                                                 random_state=0)])
def test_sklearn_compatible_mixer_estimator(estimator, check):
    check(estimator)


@pytest.mark.parametrize("name", available_mixers())
def test_builtin_mixers_fit_and_declare(name, data):
    X, y = data
    est = SequenceMixerRegressor(name, state_size=3, **FAST).fit(X, y)
    assert est.predict(X).shape == y.shape
    assert est.theorem_ == get_mixer(name).theorem
    assert est.theorem_ in ("yes", "positional", "no")
    kwargs = {"max_len": 3} if name == "positional" else {}  # from the data in fit
    assert est.state_floats_ == make_mixer(name, 6, 3, **kwargs).state_floats(3)
    assert est.state_floats_ > 0 and est.n_bits_ == 6 and est.query_ == "all"
    assert len(est.net_.history) == est.n_epochs_


@pytest.mark.parametrize("mixer", [RunningMean, running_mean_factory])
def test_user_mixers(mixer, data):
    X, y = data
    est = SequenceMixerRegressor(mixer, state_size=4, mixer_kwargs={"scale": 0.5}, **FAST)
    est.fit(X, y)
    assert est.theorem_ is None and est.state_floats_ is None
    assert est.net_.module_.module.scale == 0.5
    assert est.predict(X).shape == y.shape
    assert est.predict(X[:, :2]).shape == (40, 2)  # any length
    # fitting reduces the error of the initial module
    init = clone(est).set_params(max_epochs=1, lr=1e-300).fit(X, y)
    assert est.net_.history[-1]["train_loss"] < 0.5 * init.net_.history[0]["train_loss"]
    # reproducible, and the pickled estimator predicts the same
    again = clone(est).fit(X, y)
    np.testing.assert_array_equal(again.predict(X), est.predict(X))
    loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))


def test_pickle_round_trip_of_a_builtin(data):
    X, y = data
    est = SequenceMixerRegressor("gla", state_size=4, **FAST).fit(X, y)
    loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    assert (loaded.theorem_, loaded.state_floats_) == (est.theorem_, est.state_floats_)


def test_grid_search_over_state_size_and_pipeline(data):
    X, y = data
    est = SequenceMixerRegressor("linear", max_epochs=20, random_state=0)
    search = GridSearchCV(est, {"state_size": [1, 4]}, cv=KFold(2)).fit(X, y)
    assert sorted(search.cv_results_["param_state_size"]) == [1, 4]
    assert search.best_estimator_.state_size in (1, 4)
    assert search.predict(X).shape == y.shape
    scores = search.cv_results_["mean_test_score"]
    assert ((0 <= scores) & (scores <= 1)).all()
    pipe = make_pipeline(FunctionTransformer(), clone(est).set_params(state_size=2))
    pipe.fit(X, y)
    assert pipe.predict(X).shape == y.shape and 0 <= pipe.score(X, y) <= 1


def test_final_query_fit(data):
    X, y = make_minip(40, seq_len=3, n_bits=6, query="last", random_state=0)
    assert y.shape == (40,)
    for mixer in ("kernel", RunningMean):
        est = SequenceMixerRegressor(mixer, state_size=4, **FAST).fit(X, y)
        assert est.query_ == "last"
        pred = est.predict(X)
        assert pred.shape == (40,)
        assert est.score(X, y) == pytest.approx(np.mean(np.abs(pred - y) < 0.5))
        full = est.net_.module_.eval()(torch.as_tensor(X, dtype=torch.float64))
        np.testing.assert_allclose(pred, full.detach().numpy()[:, -1], atol=1e-12)


@pytest.mark.parametrize("mixer, match", [
    (PerToken, r"mixer='.*PerToken' must map tokens .* got shape \(40, 3, 1\)"),
    (NaNMixer, r"mixer='.*NaNMixer' returns NaN"),
    (lambda n_bits, state_size: "not a module", "must build a torch.nn.Module"),
    (lambda n_bits, state_size, width: None, r"could not be built .* TypeError"),
])
def test_bad_mixers_are_named(mixer, match, data):
    X, y = data
    with pytest.raises(ValueError, match=match):
        SequenceMixerRegressor(mixer, **FAST).fit(X, y)


def test_nan_predictions_raise(data):
    X, y = data
    est = SequenceMixerRegressor(ShortOnly, state_size=2, **FAST).fit(X, y)
    assert np.isfinite(est.predict(X)).all()
    longer = np.concatenate([X, X[:, :1]], axis=1)
    with pytest.raises(ValueError, match=r"mixer='.*ShortOnly' gives NaN outputs on 40 "
                                         "of the 40 sequences"):
        est.predict(longer)


def test_bad_parameters_and_inputs(data):
    X, y = data
    for params, match in [({"mixer": "nope"}, "Unknown mixer 'nope'; valid names are"),
                          ({"mixer": 3}, "Unknown mixer 3"),
                          ({"state_size": 0}, "state_size must be >= 1"),
                          ({"mixer_kwargs": [1]}, "mixer_kwargs must be a dict or None")]:
        with pytest.raises(ValueError, match=match):
            SequenceMixerRegressor(**FAST).set_params(**params).fit(X, y)
    fam = CompactFamily.from_sequences(X)
    with pytest.raises(ValueError, match="SequenceMixerRegressor with any mixer depends "
                                         "on the order of the tokens"):
        SequenceMixerRegressor(**FAST).fit(fam, y)
    est = SequenceMixerRegressor(**FAST).set_params(max_epochs=2).fit(X, y)
    with pytest.raises(ValueError, match="with any mixer depends on the order"):
        est.predict(fam)
    with pytest.raises(ValueError, match="with a user's mixer .* is fitted one by one"):
        fit_ensemble(clone(est).set_params(mixer=RunningMean),
                     X, y, params=[{"random_state": 0}, {"random_state": 1}])


@pytest.mark.parametrize("name", ["kernel", "gla"])
def test_fit_ensemble_of_a_builtin_equals_separate_fits(name, data):
    X, y = data
    est = SequenceMixerRegressor(name, state_size=3, stop_tolerance=None, **FAST)
    res = fit_ensemble(est, X, y[:, -1], params=[{"random_state": 0}, {"random_state": 1}])
    assert res.n_members == 2
    for member, seed in zip(res.estimators, (0, 1)):
        alone = clone(est).set_params(random_state=seed).fit(X, y[:, -1])
        assert member.query_ == "last" and member.state_floats_ == alone.state_floats_
        np.testing.assert_allclose(member.predict(X), alone.predict(X), atol=1e-10)


@pytest.fixture
def stacks(monkeypatch):
    """The state sizes of every member stack built while the test runs, one sorted list
    per stack."""
    from minip_learn.nn import HeadEnsemble

    built = []
    real_init = HeadEnsemble.__init__

    def spy(self, heads, template=None):
        heads = list(heads)
        built.append(sorted(h.state_size for h in heads))
        real_init(self, heads, template)

    monkeypatch.setattr(HeadEnsemble, "__init__", spy)
    return built


@pytest.mark.parametrize("name", available_mixers())
def test_state_sizes_and_seeds_stacked_equal_separate_fits(name, data, stacks):
    # every registered mixer: state sizes x seeds through fit_ensemble (one stack, the
    # state-2 members padded to state 3), each member equal to its own fit, stopping
    # per member and checked every 3 epochs, splitting shared features every 10
    from minip_learn.model_selection import fit_ensemble

    X, y = data
    kwargs = {"feature_map": "table"} if get_mixer(name).theorem != "no" else None
    est = SequenceMixerRegressor(name, mixer_kwargs=kwargs, dtype="float64", lr=0.05,
                                 max_epochs=40, stop_tolerance=0.5, check_every=3,
                                 split_every=10)  # feature splitting: the kernel mixers
    res = fit_ensemble(est, X, y[:, -1], state_sizes=[2, 3], seeds=[0, 1])
    assert stacks == [[2, 2, 3, 3]]
    assert res.params == [{"state_size": s, "random_state": r} for s in (2, 3) for r in (0, 1)]
    for p, member in zip(res.params, res.estimators):
        alone = clone(est).set_params(**p).fit(X, y[:, -1])
        assert member.state_size == p["state_size"] and member.get_params() == alone.get_params()
        np.testing.assert_allclose(member.predict(X), alone.predict(X), atol=1e-8)
        assert member.n_epochs_ == alone.n_epochs_
        assert member.n_epochs_ % 3 == 0 or member.n_epochs_ == 40
        np.testing.assert_allclose(member.net_.history[:, "train_loss"],
                                   alone.net_.history[:, "train_loss"], rtol=1e-8)


def test_on_the_cpu_padding_beyond_the_budget_splits_the_stack(data, stacks, monkeypatch):
    # the budget in tokens x state dimensions: 0 leaves one stack per state size, and
    # the members still equal their own fits
    from minip_learn.model_selection import fit_ensemble
    from minip_learn.training import _members

    X, y = data
    est = SequenceMixerRegressor("gla", dtype="float64", max_epochs=5)
    n_tokens = X.shape[0] * X.shape[1]
    for budget, expected in ((0, [[2, 2], [3, 3], [4, 4]]),
                             (2 * n_tokens, [[2, 2], [3, 3, 4, 4]]),
                             (6 * n_tokens, [[2, 2, 3, 3, 4, 4]])):
        stacks.clear()
        monkeypatch.setattr(_members, "CPU_PADDING_TOKENS", budget)
        res = fit_ensemble(est, X, y[:, -1], state_sizes=[2, 3, 4], seeds=[0, 1])
        assert stacks == expected
        alone = clone(est).set_params(state_size=2, random_state=1).fit(X, y[:, -1])
        np.testing.assert_allclose(res.estimators[1].predict(X), alone.predict(X),
                                   atol=1e-10)


def test_mixer_sweep_as_ensembles_equals_fits_one_by_one(data):
    from minip_learn.model_selection import rank_sweep

    X, y = data
    est = SequenceMixerRegressor("deltanet", dtype="float64", max_epochs=30)
    kw = dict(param_grid={"state_size": [2, 3]}, seeds=[0, 1], progress=False)
    a = rank_sweep(est, X, y[:, -1], ensemble=True, **kw).results
    b = rank_sweep(est, X, y[:, -1], **kw).results
    assert a["ensemble"].all() and not b["ensemble"].any()
    assert a["fit_id"].tolist() == b["fit_id"].tolist()
    np.testing.assert_allclose(a["max_abs_error"], b["max_abs_error"], atol=1e-8)
    assert a["n_epochs"].tolist() == b["n_epochs"].tolist()


def test_fit_leaves_the_global_rng_alone(data):
    X, y = data
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    SequenceMixerRegressor(RunningMean, **FAST).set_params(max_epochs=2).fit(X, y)
    assert torch.equal(torch.rand(3), expected)


def test_from_module_of_a_builtin(data):
    X, y = data
    est = SequenceMixerRegressor.from_module(make_mixer("gla", 6, 4).double(), mixer="gla",
                                             state_size=4)
    assert est.theorem_ == "no" and est.state_floats_ is None and est.query_ == "all"
    assert est.predict(X).shape == y.shape


def test_feature_splitting_brings_the_kernel_mixer_to_the_exact_rank():
    # the exact m = 8 family in final-query form: exact rank 14 (THEORY.md R9)
    suite = make_witness_suite(n_bits=8, construction="exact", query="last")
    assert suite.exact_min_rank == 14
    kw = dict(mixer="kernel", mixer_kwargs={"feature_map": "table"}, lr=0.03,
              max_epochs=1500, stop_tolerance=0.5, random_state=0)
    split = SequenceMixerRegressor(state_size=14, split_every=200, **kw).fit(suite.X, suite.y)
    assert split.solved_ and split.train_max_error_ < 0.5
    assert any(h.get("n_split") for h in split.net_.history)
    plain = SequenceMixerRegressor(state_size=14, max_epochs=400, **{
        k: v for k, v in kw.items() if k != "max_epochs"}).fit(suite.X, suite.y)
    assert not any("n_split" in h for h in plain.net_.history)
    below = SequenceMixerRegressor(state_size=13, split_every=200, max_epochs=600, **{
        k: v for k, v in kw.items() if k != "max_epochs"}).fit(suite.X, suite.y)
    assert not below.solved_  # below the exact rank no training solves it
