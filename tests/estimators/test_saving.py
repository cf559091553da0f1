"""save_estimator / load_estimator: one file, parameters as JSON and weights as
safetensors, that runs no code when loaded.

The file format is read and rewritten here by code of this test alone (the safetensors
header parsed by hand, the digest computed from the documented recipe), so a change of
the format or of its digest fails.
"""

import hashlib
import json
import pickle
import struct
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone

import minip_learn
from minip_learn import (
    KernelAttentionClassifier,
    KernelAttentionRegressor,
    SequenceMixerRegressor,
    SoftmaxAttentionRegressor,
)
from minip_learn.datasets import make_minip
from minip_learn.estimators import MinIPVersionWarning, load_estimator, save_estimator
from minip_learn.nn import KernelAttentionHead, init_arguments, make_mixer

FAST = dict(max_epochs=4, random_state=0)
ESTIMATORS = {
    "kernel": lambda: KernelAttentionRegressor(rank=3, check_every=2, **FAST),
    "table": lambda: KernelAttentionRegressor(rank=3, feature_map="table", **FAST),
    "shared64": lambda: KernelAttentionRegressor(rank=3, shared_features=True,
                                                 dtype="float64", **FAST),
    "model": lambda: KernelAttentionRegressor(rank=2, n_heads=2, readout="mlp", **FAST),
    "causal": lambda: KernelAttentionRegressor(rank=3, causal=True, **FAST),
    "classifier": lambda: KernelAttentionClassifier(rank=3, **FAST),
    "softmax": lambda: SoftmaxAttentionRegressor(**FAST),
    "mamba": lambda: SequenceMixerRegressor("mamba", state_size=4, **FAST),
    "kernel-mixer": lambda: SequenceMixerRegressor(
        "kernel", state_size=4, mixer_kwargs={"feature_map": "table"}, **FAST),
}
#: every fitted attribute a fit sets and a loaded estimator must have again
FITTED = ("n_bits_", "n_features_in_", "seq_len_", "n_epochs_", "init_errors_",
          "train_max_error_", "solved_", "query_")


@pytest.fixture(scope="module")
def data():
    return make_minip(20, seq_len=3, n_bits=4, random_state=0)


def _targets(name, y):
    return np.where(y > 0, "far", "near") if name == "classifier" else y


@pytest.fixture(scope="module")
def fitted(data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: make().fit(X, _targets(name, y)) for name, make in ESTIMATORS.items()}


# -- the format, read and written by this test's own code ----------------------------------
def _parse(path):
    """``(metadata, {name: (dtype, shape, bytes)})`` of a safetensors file."""
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + size])
    metadata = header.pop("__metadata__")
    body = raw[8 + size:]
    tensors = {name: (info["dtype"], tuple(info["shape"]),
                      body[info["data_offsets"][0]:info["data_offsets"][1]])
               for name, info in header.items()}
    return metadata, tensors


_TORCH_DTYPE = {"F64": "torch.float64", "F32": "torch.float32", "U8": "torch.uint8",
                "I64": "torch.int64", "BOOL": "torch.bool"}


def _reference_digest(content, tensors):
    h = hashlib.sha256(content.encode())
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        h.update(f"\0{name}\0{_TORCH_DTYPE[dtype]}\0{shape}\0".encode())
        h.update(data)
    return h.hexdigest()


def _write(path, metadata, tensors):
    """A safetensors file of ``tensors`` (as :func:`_parse` returns them)."""
    header, offset, body = {"__metadata__": metadata}, 0, b""
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        body += data
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def _rewrite(path, change_content, *, version=None, digest=True):
    metadata, tensors = _parse(path)
    content = json.loads(metadata["content"])
    change_content(content)
    metadata["content"] = json.dumps(content)
    if version is not None:
        metadata["minip_learn_version"] = version
    if digest:
        metadata["sha256"] = _reference_digest(metadata["content"], tensors)
    _write(path, metadata, tensors)


# -- round trips ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_round_trip_predicts_the_same_and_keeps_everything(fitted, data, name, tmp_path):
    X, y = data
    est = fitted[name]
    path = save_estimator(est, tmp_path / "est.safetensors")
    state = torch.random.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same version: no warning at all
        loaded = load_estimator(path)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG untouched
    assert type(loaded) is type(est)
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    assert loaded.score(X, _targets(name, y)) == est.score(X, _targets(name, y))
    assert loaded.get_params() == est.get_params()
    for attr in FITTED:
        assert getattr(loaded, attr) == getattr(est, attr), attr
    for attr in ("vocabulary_", "classes_"):
        if hasattr(est, attr):
            np.testing.assert_array_equal(getattr(loaded, attr), getattr(est, attr))
            assert getattr(loaded, attr).dtype == getattr(est, attr).dtype
    assert len(loaded.net_.history) == len(est.net_.history) == est.n_epochs_
    assert loaded.net_.history[-1, "train_loss"] == pytest.approx(
        est.net_.history[-1, "train_loss"])
    assert next(loaded.net_.module_.parameters()).dtype == next(
        est.net_.module_.parameters()).dtype
    assert clone(loaded).get_params().keys() == est.get_params().keys()
    loaded.set_params(max_epochs=1).fit(X, _targets(name, y))  # refits


def test_the_file_is_parameters_as_json_and_weights_as_tensors(fitted, tmp_path):
    est = fitted["table"]
    path = save_estimator(est, tmp_path / "est.safetensors")
    metadata, tensors = _parse(path)
    assert metadata["format"] == "minip_learn.estimator"
    assert metadata["format_version"] == "1"
    assert metadata["minip_learn_version"] == minip_learn.__version__
    assert metadata["sha256"] == _reference_digest(metadata["content"], tensors)
    content = json.loads(metadata["content"])
    assert content["estimator"] == "KernelAttentionRegressor"
    assert content["module"]["class"] == "KernelAttentionHead"
    assert content["params"]["rank"] == 3 and content["params"]["feature_map"] == "table"
    assert content["fitted"]["n_bits_"] == 4
    weights = {k[len("module."):] for k in tensors if k.startswith("module.")}
    assert weights == set(est.net_.module_.state_dict())
    assert b"\x80" not in path.read_bytes()[:2]  # no pickle protocol header


def test_a_loaded_head_is_built_from_its_recorded_arguments(fitted, tmp_path):
    est = fitted["table"]
    loaded = load_estimator(save_estimator(est, tmp_path / "est.safetensors"))
    saved, again = init_arguments(est.net_.module_), init_arguments(loaded.net_.module_)
    assert saved.keys() == again.keys() and saved["rank"] == again["rank"] == 3
    np.testing.assert_array_equal(saved["feature_kwargs"]["vocabulary"],
                                  again["feature_kwargs"]["vocabulary"])


def test_from_module_with_a_rank_mask_round_trips(data, tmp_path):
    X, _ = data
    head = KernelAttentionHead(4, 3, feature_map="exp")
    head.feature_mask = torch.tensor([1.0, 0.0, 1.0])  # a buffer set after building
    est = KernelAttentionRegressor.from_module(head, rank=3)
    loaded = load_estimator(save_estimator(est, tmp_path / "est.safetensors"))
    torch.testing.assert_close(loaded.net_.module_.feature_mask, head.feature_mask)
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    assert loaded.n_epochs_ == 0 and loaded.seq_len_ is None


# -- versions -------------------------------------------------------------------------------
def test_a_parameter_added_later_is_filled_and_named(fitted, data, tmp_path):
    est = fitted["kernel"]  # fitted with check_every=2
    path = save_estimator(est, tmp_path / "est.safetensors")
    _rewrite(path, lambda c: c["params"].pop("check_every"), version="0.0.9")
    with pytest.warns(MinIPVersionWarning) as caught:
        loaded = load_estimator(path)
    [w] = [w.message for w in caught if issubclass(w.category, MinIPVersionWarning)]
    assert (w.saved_version, w.current_version) == ("0.0.9", minip_learn.__version__)
    assert w.filled == {"check_every": 1}
    assert "minip_learn 0.0.9" in str(w) and "check_every=1" in str(w)
    assert loaded.check_every == 1
    assert clone(loaded).get_params() == {**est.get_params(), "check_every": 1}
    np.testing.assert_array_equal(loaded.predict(data[0]), est.predict(data[0]))


def test_a_parameter_this_version_lacks_is_refused(fitted, tmp_path):
    path = save_estimator(fitted["kernel"], tmp_path / "est.safetensors")
    _rewrite(path, lambda c: c["params"].update(future_option=3), version="9.0")
    with pytest.raises(ValueError, match=r"est.safetensors: saved by minip_learn 9.0 .*"
                                         r"future_option"):
        load_estimator(path)


# -- files that are not, or no longer, what was saved ------------------------------------------
def test_a_changed_file_is_refused(fitted, tmp_path):
    path = save_estimator(fitted["kernel"], tmp_path / "est.safetensors")
    _rewrite(path, lambda c: c["params"].update(lr=0.5), digest=False)
    with pytest.raises(ValueError, match="do not match the digest"):
        load_estimator(path)
    raw = bytearray((tmp_path / "est.safetensors").read_bytes())
    raw[-1] ^= 0xFF  # a weight's last byte
    (tmp_path / "est.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="est.safetensors"):
        load_estimator(tmp_path / "est.safetensors")


@pytest.mark.parametrize("field, value", [("estimator", "os.system"),
                                          ("module", {"class": "builtins.eval"})])
def test_a_class_outside_the_library_is_never_looked_up(fitted, tmp_path, field, value):
    path = save_estimator(fitted["kernel"], tmp_path / "est.safetensors")
    _rewrite(path, lambda c: c.update({field: value}))
    with pytest.raises(ValueError, match="names no estimator and head of this library"):
        load_estimator(path)


@pytest.mark.parametrize("change, message", [
    # a head far larger than its file: refused before anything is allocated
    (lambda c: c["module"]["arguments"].update(rank=10**12), "shape of"),
    (lambda c: c["module"]["arguments"].update(n_bits=10**12), "(shape of|cannot be built)"),
    (lambda c: c["module"]["arguments"].update(feature_map="exp", feature_kwargs=None),
     "weights are"),
    (lambda c: c["module"]["arguments"].update(shared_features=True), "tied weights"),
    (lambda c: c["module"]["arguments"].update(rank="three"), "cannot be built"),
    (lambda c: c["module"]["arguments"].update(colour=1), "cannot be built"),
])
def test_arguments_that_do_not_rebuild_the_saved_head_are_refused(fitted, tmp_path, change,
                                                                  message):
    path = save_estimator(fitted["table"], tmp_path / "est.safetensors")
    _rewrite(path, change)
    with pytest.raises(ValueError, match=f"est.safetensors: .*{message}"):
        load_estimator(path)


@pytest.mark.parametrize("change", [
    lambda c: c["module"].update(dtype="save"),
    lambda c: c["fitted"].update(net_=1),
    lambda c: c["fitted"].update(__class__=1),
])
def test_a_forged_dtype_or_attribute_is_refused(fitted, tmp_path, change):
    path = save_estimator(fitted["kernel"], tmp_path / "est.safetensors")
    _rewrite(path, change)
    with pytest.raises(ValueError, match="est.safetensors: its description"):
        load_estimator(path)


def test_a_forged_hyperparameter_is_refused_naming_the_file(fitted, tmp_path):
    path = save_estimator(fitted["kernel"], tmp_path / "est.safetensors")
    _rewrite(path, lambda c: c["params"].update(lr=-1.0))
    with pytest.raises(ValueError, match=r"est.safetensors: .*lr"):
        load_estimator(path)


def test_content_nested_too_deep_is_refused(fitted, tmp_path):
    path = save_estimator(fitted["kernel"], tmp_path / "est.safetensors")
    metadata, tensors = _parse(path)
    metadata["content"] = "[" * 100_000 + "]" * 100_000
    metadata["sha256"] = _reference_digest(metadata["content"], tensors)
    _write(path, metadata, tensors)
    with pytest.raises(ValueError, match="est.safetensors"):
        load_estimator(path)


class _Trap:
    ran = []

    def __reduce__(self):
        return _Trap.ran.append, ("code ran",)


@pytest.mark.parametrize("content", [b"", b"not a model", pickle.dumps(_Trap())])
def test_a_file_that_is_no_saved_estimator_is_refused_without_running_it(tmp_path,
                                                                          content):
    path = tmp_path / "est.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"est.safetensors: not a safetensors file"):
        load_estimator(path)
    assert _Trap.ran == []


def test_a_missing_file_names_itself(tmp_path):
    with pytest.raises(ValueError, match=r"nothing.safetensors: cannot be read"):
        load_estimator(tmp_path / "nothing.safetensors")


# -- what cannot be saved without code -----------------------------------------------------------
def test_an_unfitted_estimator_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not fitted"):
        save_estimator(KernelAttentionRegressor(rank=2), tmp_path / "est.safetensors")
    assert not (tmp_path / "est.safetensors").exists()


class _MyMixer(torch.nn.Module):
    def __init__(self, n_bits, state_size):
        super().__init__()
        self.inner = make_mixer("linear", n_bits, state_size)

    def forward(self, x):
        return self.inner(x)


def test_a_users_code_is_refused_with_its_name(data, tmp_path):
    X, y = data
    est = SequenceMixerRegressor(_MyMixer, state_size=2, max_epochs=1).fit(X, y)
    with pytest.raises(ValueError, match="cannot be saved without (its )?code"):
        save_estimator(est, tmp_path / "est.safetensors")
    with pytest.raises(ValueError, match="pickle"):
        save_estimator(est, tmp_path / "est.safetensors")
    assert not (tmp_path / "est.safetensors").exists()
