"""Bad input: every entry of the table in docs/bad_input.rst gets
the documented error, which names the problem (never a torch traceback).

Each case has an id; ``test_every_case_is_documented`` checks that the docs table lists
every id, and ``test_every_documented_case_is_tested`` the converse.
"""

import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.exceptions import DataConversionWarning, NotFittedError

import minip_learn.estimators._base as estimators_module
from minip_learn import KernelAttentionRegressor, SoftmaxAttentionRegressor
from minip_learn._validation import InputTypeError
from minip_learn.datasets import make_minip, minip_targets

DOC = Path(__file__).resolve().parents[1] / "docs" / "bad_input.rst"
K = KernelAttentionRegressor
S = SoftmaxAttentionRegressor

X_OK, Y_OK = make_minip(12, seq_len=3, n_bits=4, random_state=0)
X_HALF = np.full((3, 2, 4), 0.5)


def _obj_with_dict():
    X = X_OK.reshape(12, -1).astype(object)
    X[0, 0] = {"foo": "bar"}
    return X


def _fit(X, y=Y_OK, cls=K, check_minip=False, **params):
    params.setdefault("max_epochs", 1)
    return lambda: cls(**params).fit(X, y, check_minip=check_minip)


def _params(cls=K, **params):
    return _fit(X_OK, Y_OK, cls, **params)


# id -> (callable, exception, message regex)
FIT_CASES = {
    # X
    "x-none": (_fit(None), ValueError, "X is None"),
    "x-1d": (_fit(np.zeros(4), np.zeros(4)), ValueError, "ndim.*Reshape your data"),
    "x-4d": (_fit(np.zeros((2, 2, 2, 2)), np.zeros((2, 2))), ValueError, "ndim"),
    "x-no-samples": (_fit(np.zeros((0, 3, 4)), np.zeros((0, 3))), ValueError, "empty.*0 sample"),
    "x-seq-len-0": (_fit(np.zeros((5, 0, 4)), np.zeros((5, 0))), ValueError, "seq_len=0"),
    "x-n-bits-0": (_fit(np.zeros((5, 3, 0)), np.zeros((5, 3))), ValueError, "0 feature"),
    "x-nan": (_fit(np.full((12, 3, 4), np.nan)), ValueError, "NaN or infinite"),
    "x-inf": (_fit(np.full((12, 3, 4), np.inf)), ValueError, "NaN or infinite"),
    "x-ragged": (_fit([[[0, 1], [1]]], [[0, 0]]), ValueError, "rectangular|dtype object"),
    "x-strings": (_fit(np.array([[["a", "b"]]]), [[0]]), ValueError, "non-numeric"),
    "x-object-non-number": (_fit(_obj_with_dict(), np.zeros(12)), InputTypeError,
                            "non-numeric entries"),
    "x-complex": (_fit(X_OK + 1j, Y_OK), ValueError, "Complex data not supported"),
    "x-sparse": (_fit(sp.csr_matrix(X_OK.reshape(12, -1)), np.zeros(12)), ValueError,
                 "sparse input is not supported"),
    "x-non-binary-table": (_fit(X_HALF, np.zeros((3, 2)), feature_map="table"), ValueError,
                           "0/1"),
    "x-non-binary-minip": (_fit(X_HALF, np.zeros((3, 2)), check_minip=True), ValueError, "0/1"),
    # y
    "y-none": (_fit(X_OK, None), ValueError, "requires y to be passed"),
    "y-wrong-seq-len": (_fit(X_OK, Y_OK[:, :2]), ValueError, "does not match X"),
    "y-wrong-n-samples": (_fit(X_OK, Y_OK[:5]), ValueError, "does not match X"),
    "y-nan": (_fit(X_OK, np.where(Y_OK == Y_OK.max(), np.nan, Y_OK)), ValueError,
              "y contains NaN"),
    "y-inf": (_fit(X_OK, np.full(Y_OK.shape, np.inf)), ValueError, "y contains NaN or infinite"),
    "y-negative-minip": (_fit(X_OK, Y_OK - 1, check_minip=True), ValueError,
                         "negative target"),
    "y-fractional-minip": (_fit(X_OK, Y_OK + 0.5, check_minip=True), ValueError,
                           "non-integer target"),
    "y-above-n-bits-minip": (_fit(X_OK, Y_OK + 5, check_minip=True), ValueError,
                             "above n_bits=4"),
    "y-not-minip-targets": (_fit(X_OK, (Y_OK + 1) % 2, check_minip=True), ValueError,
                            "not the Min-IP target"),
    # hyperparameters (checked at fit, never in __init__)
    "rank-0": (_params(rank=0), ValueError, "rank must be >= 1"),
    "rank-negative": (_params(rank=-3), ValueError, "rank must be >= 1"),
    "rank-float": (_params(rank=2.5), ValueError, "rank must be an integer"),
    "rank-string": (_params(rank="4"), ValueError, "rank must be an integer"),
    "rank-bool": (_params(rank=True), ValueError, "rank must be an integer"),
    "feature-map-unknown": (_params(feature_map="nope"), ValueError, "valid names are"),
    "feature-kwargs-not-dict": (_params(feature_kwargs=[1]), ValueError, "feature_kwargs"),
    "value-dim-0": (_params(value_dim=0), ValueError, "value_dim must be >= 1"),
    "feature-width-0": (_params(feature_width=0), ValueError, "feature_width must be >= 1"),
    "feature-depth-negative": (_params(feature_depth=-1), ValueError, "feature_depth"),
    "lr-not-positive": (_params(lr=0), ValueError, "lr must be >"),
    "lr-nan": (_params(lr=float("nan")), ValueError, "lr must be finite"),
    "max-epochs-0": (_params(max_epochs=0), ValueError, "max_epochs must be >= 1"),
    "batch-size-0": (_params(batch_size=0), ValueError, "batch_size must be >= 1"),
    "weight-decay-negative": (_params(weight_decay=-1.0), ValueError, "weight_decay"),
    "optimizer-unknown": (_params(optimizer="lbfgs"), ValueError, "optimizer must be one of"),
    "dtype-unknown": (_params(dtype="float16"), ValueError, "dtype must be one of"),
    "stop-tolerance-above-half": (_params(stop_tolerance=0.7), ValueError, "stop_tolerance"),
    "stop-tolerance-0": (_params(stop_tolerance=0.0), ValueError, "stop_tolerance"),
    "n-init-0": (_params(n_init=0), ValueError, "n_init must be >= 1"),
    "callbacks-not-list": (_params(callbacks="x"), ValueError, "callbacks must be a list"),
    "verbose-negative": (_params(verbose=-1), ValueError, "verbose must be >= 0"),
    "score-dim-0": (_params(S, score_dim=0), ValueError, "score_dim must be >= 1"),
    "temperature-not-positive": (_params(S, temperature=0.0), ValueError, "temperature must be >"),
    "temperature-nan": (_params(S, temperature=float("nan")), ValueError, "temperature"),
    # devices
    "device-unknown-type": (_params(device="tpu"), ValueError, "not a valid torch device|not supported"),
    "device-garbage": (_params(device="not a device"), ValueError, "not a valid torch device"),
    "device-not-a-string": (_params(device=3), ValueError, "device must be a string"),
    "device-cuda-unavailable": (_params(device="cuda"), ValueError, "CUDA is not available|does not exist"),
    "device-cuda-index-missing": (_params(device="cuda:7"), ValueError, "CUDA is not available|does not exist"),
    "device-mps-unavailable": (_params(device="mps"), ValueError, "MPS is not available"),
    # Min-IP data helpers
    "minip-targets-non-binary": (lambda: minip_targets(X_HALF), ValueError, "0/1"),
    "make-minip-seq-len-0": (lambda: make_minip(3, seq_len=0, n_bits=4), ValueError,
                             "seq_len must be >= 1"),
    "make-minip-seq-len-float": (lambda: make_minip(3, seq_len=2.5, n_bits=4), ValueError,
                                   "seq_len must be an integer"),
}


@pytest.mark.parametrize("case", sorted(FIT_CASES))
def test_bad_fit_input(case):
    if case == "device-cuda-unavailable" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    if case == "device-mps-unavailable" and torch.backends.mps.is_available():
        pytest.skip("MPS is available here")
    call, exc, match = FIT_CASES[case]
    with pytest.raises(exc, match=match):
        call()


def test_object_non_number_is_both_value_and_type_error():
    with pytest.raises(ValueError):
        _fit(_obj_with_dict(), np.zeros(12))()
    with pytest.raises(TypeError, match="argument must be a string or a real number"):
        _fit(_obj_with_dict(), np.zeros(12))()


def test_failed_fit_leaves_no_fitted_attributes():
    est = K(rank=0, max_epochs=1)
    with pytest.raises(ValueError):
        est.fit(X_OK, Y_OK)
    assert not [a for a in vars(est) if a.endswith("_") and not a.startswith("_")]
    with pytest.raises(NotFittedError):
        est.predict(X_OK)


def test_failed_refit_keeps_previous_model():
    est = K(rank=2, max_epochs=2, random_state=0).fit(X_OK, Y_OK)
    before = est.predict(X_OK)
    with pytest.raises(ValueError):
        est.set_params(rank=0).fit(np.zeros((5, 3, 7)), np.zeros((5, 3)))
    assert est.n_bits_ == 4
    np.testing.assert_array_equal(est.predict(X_OK), before)


def test_not_bad_real_tokens_and_negative_targets_are_valid_regression_data():
    """The estimators are general attention regressors over real token vectors: real X
    and negative y are valid unless ``check_minip=True`` (see docs/bad_input.rst)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(10, 3, 4))
    y = -np.abs(rng.normal(size=(10, 3)))
    assert K(rank=2, max_epochs=2).fit(X, y).predict(X).shape == (10, 3)
    with pytest.raises(ValueError, match="0/1"):
        K(rank=2, max_epochs=2).fit(X, y, check_minip=True)


def test_check_minip_accepts_minip_data():
    est = K(rank=2, max_epochs=2).fit(X_OK, Y_OK, check_minip=True)
    assert est.n_bits_ == 4


def test_column_vector_y_for_2d_x_warns_and_is_used():
    X = X_OK[:, 0, :]
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        est = K(rank=2, max_epochs=2).fit(X, Y_OK[:, :1])
    assert est.predict(X).shape == (12,)


def test_diverged_training_warns():
    from sklearn.exceptions import ConvergenceWarning

    with pytest.warns(ConvergenceWarning, match="diverged"):
        est = K(rank=3, lr=1e20, max_epochs=20, random_state=0).fit(X_OK, Y_OK)
    assert not est.solved_ and est.train_max_error_ == float("inf")


# -- predict / score --------------------------------------------------------------

@pytest.fixture(scope="module")
def fitted():
    table = K(rank=2, feature_map="table", max_epochs=2, random_state=0)
    return {
        "kernel": K(rank=2, max_epochs=2, random_state=0).fit(X_OK, Y_OK),
        "softmax": S(max_epochs=2, random_state=0).fit(X_OK, Y_OK),
        "table": table.fit(X_OK[:3], Y_OK[:3]),
    }


def _unseen_token(est):
    known = {t.tobytes() for t in est.vocabulary_}
    for i in range(16):
        t = np.array([(i >> b) & 1 for b in range(4)], np.uint8)
        if t.tobytes() not in known:
            return t
    raise AssertionError("no unseen token")


PREDICT_CASES = {
    "predict-before-fit": ("unfitted", lambda est: est.predict(X_OK), NotFittedError,
                           "not fitted"),
    "predict-n-bits-mismatch": ("kernel", lambda est: est.predict(np.zeros((2, 3, 7))),
                                ValueError, "X has 7 features.*expecting 4 features"),
    "predict-1d": ("kernel", lambda est: est.predict(np.zeros(4)), ValueError,
                   "Reshape your data"),
    "predict-empty": ("kernel", lambda est: est.predict(np.zeros((0, 3, 4))), ValueError,
                      "empty"),
    "predict-seq-len-0": ("softmax", lambda est: est.predict(np.zeros((2, 0, 4))), ValueError,
                          "seq_len=0"),
    "predict-nan": ("kernel", lambda est: est.predict(np.full((1, 3, 4), np.nan)), ValueError,
                    "NaN"),
    "predict-unseen-token-table": (
        "table",
        lambda est: est.predict(np.broadcast_to(_unseen_token(est), (1, 2, 4)).copy()),
        ValueError, "not seen in fit"),
    "predict-non-binary-table": ("table", lambda est: est.predict(np.full((1, 2, 4), 0.5)),
                                 ValueError, "0/1"),
    "score-sample-weight": ("kernel", lambda est: est.score(X_OK, Y_OK, np.ones(12)),
                            ValueError, "sample_weight is not supported"),
    "score-y-shape": ("kernel", lambda est: est.score(X_OK, Y_OK[:, :2]), ValueError,
                      "does not match X"),
}


@pytest.mark.parametrize("case", sorted(PREDICT_CASES))
def test_bad_predict_input(case, fitted):
    which, call, exc, match = PREDICT_CASES[case]
    est = K() if which == "unfitted" else fitted[which]
    with pytest.raises(exc, match=match):
        call(est)


def test_predict_seq_len_too_long_for_memory(fitted, monkeypatch):
    """predict-seq-len-too-long: a sequence whose working memory exceeds what is free
    (dense softmax builds seq_len x seq_len matrices) is refused up front."""
    monkeypatch.setattr(estimators_module, "_available_memory", lambda device: 10**6)
    X = np.zeros((1, 400, 4))  # 3 * 400^2 * 4 bytes > 1 MB
    with pytest.raises(ValueError, match="seq_len=400, which this model cannot take"):
        fitted["softmax"].predict(X)
    # the kernel head's cost is linear in seq_len: the same input is fine
    assert fitted["kernel"].predict(X).shape == (1, 400)


def test_predict_out_of_memory_becomes_value_error(fitted, monkeypatch):
    """predict-out-of-memory: an allocation failure in torch is reported as a ValueError."""
    est = fitted["softmax"]

    def boom(x, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 40.00 GiB")

    monkeypatch.setattr(est.net_.module_, "forward", boom)
    with pytest.raises(ValueError, match="seq_len=3, which this model cannot take.*out of memory"):
        est.predict(X_OK)


def test_predict_chunks_long_inputs_identically(fitted, monkeypatch):
    est = fitted["softmax"]
    full = est.predict(X_OK)
    monkeypatch.setattr(estimators_module, "PREDICT_CHUNK_BYTES", 1)  # one sequence a chunk
    # float64 evaluation: chunking changes nothing beyond float64 rounding
    np.testing.assert_allclose(est.predict(X_OK), full, rtol=1e-12, atol=1e-12)


def test_2d_fitted_model_takes_sequences(fitted):
    """Not an error: a model fitted on single tokens predicts on longer sequences."""
    est = K(rank=2, max_epochs=2, random_state=0).fit(X_OK[:, 0, :], Y_OK[:, 0])
    assert est.predict(X_OK).shape == (12, 3)


def test_torch_tensor_input_is_accepted(fitted):
    est = fitted["kernel"]
    np.testing.assert_array_equal(est.predict(torch.as_tensor(X_OK)), est.predict(X_OK))


# -- the docs table -----------------------------------------------------------------

EXTRA_IDS = {"predict-seq-len-too-long", "predict-out-of-memory"}


def _documented_ids():
    text = DOC.read_text()
    return set(re.findall(r"``(\[[a-z0-9-]+\])``", text))


def test_every_case_is_documented():
    ids = {f"[{c}]" for c in (*FIT_CASES, *PREDICT_CASES, *EXTRA_IDS)}
    missing = ids - _documented_ids()
    assert not missing, f"cases missing from {DOC.name}: {sorted(missing)}"


def test_every_documented_case_is_tested():
    ids = {f"[{c}]" for c in (*FIT_CASES, *PREDICT_CASES, *EXTRA_IDS)}
    extra = _documented_ids() - ids
    assert not extra, f"documented cases without a test: {sorted(extra)}"
