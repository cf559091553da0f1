"""Saved estimators outlive versions: the estimators committed under ``docs/``
(``save_estimator`` files) load, print, clone and predict, and tell a later version
which version saved them. A pickle a user makes records the minip_learn version that
saved it too; loading fills the hyperparameters added since with their defaults and
warns (MinIPVersionWarning) when the versions differ or something was filled. The
same for a saved file: tests/estimators/test_saving.py.
"""

import pickle
import subprocess
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

import minip_learn
from minip_learn import (
    KernelAttentionClassifier,
    KernelAttentionRegressor,
    SequenceMixerRegressor,
    SoftmaxAttentionRegressor,
)
from minip_learn.datasets import make_minip
from minip_learn.estimators import MinIPVersionWarning, load_estimator

ROOT = Path(__file__).resolve().parents[2]


def _committed_files():
    """The saved estimators under ``docs/`` that the repository holds: a recipe rerun
    into ``docs/_static`` (``reproduce docs-artifacts``) also writes fits that git
    ignores, saved by the running version."""
    found = sorted(ROOT.glob("docs/**/*.safetensors"))
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "docs"], cwd=ROOT, check=True,
                                capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file
        return found
    tracked = {ROOT / name for name in listed if name}
    return [path for path in found if path in tracked]


COMMITTED = _committed_files()
VERSION_KEY = "_minip_learn_version"
FAST = dict(max_epochs=5, random_state=0)
ESTIMATORS = {
    "kernel": lambda: KernelAttentionRegressor(rank=2, check_every=3, **FAST),
    "table": lambda: KernelAttentionRegressor(rank=2, feature_map="table", check_every=3,
                                              **FAST),
    "classifier": lambda: KernelAttentionClassifier(rank=2, check_every=3, **FAST),
    "softmax": lambda: SoftmaxAttentionRegressor(check_every=3, **FAST),
    "mixer": lambda: SequenceMixerRegressor(state_size=2, check_every=3, **FAST),
}


def _version_warnings(caught):
    return [w.message for w in caught if issubclass(w.category, MinIPVersionWarning)]


def _small_input(est, rng):
    """Three sequences of four tokens of the estimator's width (from its vocabulary
    when it has one)."""
    vocab = getattr(est, "vocabulary_", None)
    if vocab is not None:
        return np.asarray(vocab, dtype=float)[rng.integers(0, len(vocab), (3, 4))]
    return rng.integers(0, 2, (3, 4, est.n_features_in_)).astype(float)


def test_the_docs_hold_saved_estimators():
    # the test below is parametrised over these: it must not silently test nothing
    assert len(COMMITTED) >= 9
    assert any("exact/solvers" in path.as_posix() for path in COMMITTED)
    assert not list(ROOT.glob("docs/**/*.joblib")), "the library saves no pickles"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_committed_estimator_loads_prints_clones_and_predicts(path, rng, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinIPVersionWarning)
        est = load_estimator(path)  # saved by the running version: silent
    X = _small_input(est, rng)
    before = est.predict(X)
    expected = (3,) if getattr(est, "query_", "all") == "last" else (3, 4)
    assert before.shape == expected and np.isfinite(before).all()
    assert type(est).__name__ in repr(est)
    params = est.get_params()
    copy = clone(est)
    assert copy.get_params().keys() == params.keys()
    with pytest.raises(NotFittedError):
        check_is_fitted(copy)
    assert est.set_params(**params) is est
    np.testing.assert_array_equal(est.predict(X), before)
    # a later version is told which version saved the file
    monkeypatch.setattr(minip_learn, "__version__", "999.0")
    with pytest.warns(MinIPVersionWarning) as later:
        again = load_estimator(path)
    monkeypatch.undo()
    assert [(w.saved_version, w.current_version, w.filled)
            for w in _version_warnings(later)] == [(minip_learn.__version__, "999.0", {})]
    np.testing.assert_array_equal(again.predict(X), before)


@pytest.fixture(scope="module")
def data():
    return make_minip(16, seq_len=3, n_bits=4, random_state=0)


@pytest.fixture(scope="module")
def fitted(data):
    return {name: make().fit(*data) for name, make in ESTIMATORS.items()}


class _Saved:
    """Pickles as ``est`` would, with ``state`` in place of its own: what an estimator
    saved by another version of the library holds."""

    def __init__(self, est, state):
        self.cls, self.state = type(est), state

    def __reduce__(self):
        return object.__new__, (self.cls,), self.state


def _save_and_load(est, state, tmp_path):
    path = tmp_path / "model.joblib"
    joblib.dump(_Saved(est, state), path)
    with pytest.warns(MinIPVersionWarning) as caught:
        loaded = joblib.load(path)
    [w] = _version_warnings(caught)
    return loaded, w


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_a_pickle_records_the_version_that_saved_it(fitted, name):
    est = fitted[name]
    state = est.__getstate__()
    assert state[VERSION_KEY] == minip_learn.__version__
    assert VERSION_KEY not in est.__dict__  # recorded in the pickle only
    assert VERSION_KEY.encode() in pickle.dumps(est)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_a_parameter_added_later_comes_back_at_its_default(fitted, data, name, tmp_path):
    est = fitted[name]
    state = est.__getstate__()
    del state["check_every"], state[VERSION_KEY]
    loaded, w = _save_and_load(est, state, tmp_path)
    assert loaded.check_every == 1  # the default, not the 3 it was fitted with
    assert w.estimator_name == type(est).__name__
    assert w.saved_version is None and w.current_version == minip_learn.__version__
    assert w.filled == {"check_every": 1}
    message = str(w)
    assert "check_every=1" in message
    assert "an unrecorded earlier version" in message
    assert f"minip_learn {minip_learn.__version__}" in message
    assert clone(loaded).get_params() == {**est.get_params(), "check_every": 1}
    np.testing.assert_array_equal(loaded.predict(data[0]), est.predict(data[0]))


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_a_round_trip_in_the_same_version_is_silent(fitted, data, name, tmp_path):
    est = fitted[name]
    path = tmp_path / "model.joblib"
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinIPVersionWarning)
        loaded = pickle.loads(pickle.dumps(est))
        joblib.dump(est, path)
        from_file = joblib.load(path)
        unfitted = pickle.loads(pickle.dumps(clone(est)))
    assert VERSION_KEY not in loaded.__dict__
    assert loaded.get_params() == from_file.get_params() == est.get_params()
    assert unfitted.get_params() == est.get_params()
    np.testing.assert_array_equal(from_file.predict(data[0]), est.predict(data[0]))


def test_a_state_saved_by_another_version_warns_naming_both(fitted, data, tmp_path):
    est = fitted["kernel"]
    state = {**est.__getstate__(), VERSION_KEY: "0.0.9"}
    loaded, w = _save_and_load(est, state, tmp_path)
    assert w.saved_version == "0.0.9" and w.current_version == minip_learn.__version__
    assert w.filled == {}
    assert "minip_learn 0.0.9" in str(w)
    assert f"minip_learn {minip_learn.__version__}" in str(w)
    assert loaded.get_params() == est.get_params()
    np.testing.assert_array_equal(loaded.predict(data[0]), est.predict(data[0]))


def test_a_missing_parameter_is_filled_even_in_the_same_version(fitted, tmp_path):
    est = fitted["softmax"]
    state = est.__getstate__()
    del state["check_every"]
    loaded, w = _save_and_load(est, state, tmp_path)
    assert w.saved_version == w.current_version == minip_learn.__version__
    assert w.filled == {"check_every": 1}
    assert loaded.check_every == 1
