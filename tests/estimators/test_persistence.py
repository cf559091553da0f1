"""Persistence: pickle/joblib round trips, GPU -> CPU loading, and
what skorch's save_params/load_params keep."""

import pickle

import joblib
import numpy as np
import pytest
import torch
from sklearn.base import clone
from skorch.exceptions import DeviceWarning

from minip_learn import KernelAttentionRegressor, SoftmaxAttentionRegressor
from minip_learn.datasets import make_minip

FAST = dict(max_epochs=15, random_state=0)


@pytest.fixture(scope="module")
def data():
    return make_minip(24, seq_len=3, n_bits=5, random_state=0)


@pytest.fixture(scope="module")
def fitted(data):
    X, y = data
    return {
        "kernel": KernelAttentionRegressor(rank=3, **FAST).fit(X, y),
        "table": KernelAttentionRegressor(rank=3, feature_map="table", **FAST).fit(X, y),
        "softmax": SoftmaxAttentionRegressor(**FAST).fit(X, y),
        "float64": KernelAttentionRegressor(rank=3, dtype="float64", **FAST).fit(X, y),
    }


def _joblib_roundtrip(est, tmp_path):
    path = tmp_path / "model.joblib"
    joblib.dump(est, path)
    return joblib.load(path)


@pytest.mark.parametrize("name", ["kernel", "table", "softmax", "float64"])
@pytest.mark.parametrize("how", ["pickle", "joblib"])
def test_roundtrip_gives_identical_predictions(fitted, data, name, how, tmp_path):
    X, _ = data
    est = fitted[name]
    if how == "pickle":
        loaded = pickle.loads(pickle.dumps(est))
    else:
        loaded = _joblib_roundtrip(est, tmp_path)
    np.testing.assert_array_equal(est.predict(X), loaded.predict(X))
    assert loaded.get_params() == est.get_params()
    for attr in ("n_bits_", "seq_len_", "n_features_in_", "n_epochs_", "solved_",
                 "train_max_error_"):
        assert getattr(loaded, attr) == getattr(est, attr)
    if name == "table":
        np.testing.assert_array_equal(loaded.vocabulary_, est.vocabulary_)
    # a loaded model keeps training state: it can be refitted and cloned
    assert clone(loaded).get_params() == est.get_params()


def test_unfitted_estimator_roundtrip():
    est = KernelAttentionRegressor(rank=2, lr=0.1)
    loaded = pickle.loads(pickle.dumps(est))
    assert loaded.get_params() == est.get_params()
    assert not hasattr(loaded, "net_")


@pytest.fixture
def pretend_saved_on_gpu(monkeypatch):
    """Make torch tag every CPU storage it serialises as living on ``cuda:0``.

    This writes exactly what a model fitted on a GPU writes (storages tagged
    ``cuda:0``), without a GPU: loading it back needs a map to the CPU.
    """
    registry = torch.serialization._package_registry

    def tagger(storage):
        return "cuda:0" if storage.device.type == "cpu" else None

    def deserializer(obj, location):  # never the one that matches on load
        return None

    monkeypatch.setattr(torch.serialization, "_package_registry",
                        [(0, tagger, deserializer)] + list(registry))
    yield
    monkeypatch.setattr(torch.serialization, "_package_registry", registry)


@pytest.mark.parametrize("name", ["kernel", "softmax"])
def test_model_fitted_on_gpu_loads_and_predicts_on_cpu_only_machine(
        fitted, data, name, monkeypatch, pretend_saved_on_gpu):
    X, _ = data
    est = fitted[name]
    expected = est.predict(X)
    gpu_model = pickle.loads(pickle.dumps(est))  # a copy to mark as a GPU model
    gpu_model.net_.device = "cuda"
    gpu_model.device = "cuda"
    payload = pickle.dumps(gpu_model)
    tensor_payload = pickle.dumps(torch.zeros(2))
    monkeypatch.undo()  # back to normal serialisation for loading
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)

    # the simulation is faithful: a tensor pickled under it needs CUDA to load plainly
    with pytest.raises(RuntimeError, match="CUDA"):
        pickle.loads(tensor_payload)

    with pytest.warns(DeviceWarning, match="no CUDA devices"):
        loaded = pickle.loads(payload)
    assert loaded.net_.device == "cpu"
    assert next(loaded.net_.module_.parameters()).device.type == "cpu"
    np.testing.assert_array_equal(loaded.predict(X), expected)
    # the hyperparameter keeps its fitted value; refitting here says what to change
    assert loaded.device == "cuda"
    with pytest.raises(ValueError, match="CUDA is not available"):
        clone(loaded).fit(X, expected)
    refit = clone(loaded).set_params(device="cpu").fit(*data)
    assert refit.net_.device == "cpu"


def test_skorch_save_params_load_params_restores_weights_only(fitted, data, tmp_path):
    """Documented workflow (estimators module docstring): save_params keeps torch state
    only; the estimator must be rebuilt with the same hyperparameters and initialised
    by a fit on data of the same n_bits before load_params."""
    X, y = data
    est = fitted["kernel"]
    f_params, f_history = tmp_path / "params.pt", tmp_path / "history.json"
    est.net_.save_params(f_params=f_params, f_history=f_history)

    fresh = clone(est).set_params(max_epochs=1).fit(X, y)
    assert not np.array_equal(fresh.predict(X), est.predict(X))
    fresh.net_.load_params(f_params=f_params, f_history=f_history)
    np.testing.assert_array_equal(fresh.predict(X), est.predict(X))
    assert len(fresh.net_.history) == len(est.net_.history)
    # not stored by save_params: the estimator's fitted attributes
    assert fresh.n_epochs_ == 1 != est.n_epochs_
