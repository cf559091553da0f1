"""The one way the library saves a fitted estimator: parameters as JSON, weights as
safetensors, one file that runs no code when it is loaded.

A file written by :func:`save_estimator` is a `safetensors
<https://huggingface.co/docs/safetensors>`_ file. Its tensors are the head's
``state_dict`` (``module.<name>``) and the arrays among the estimator's fitted attributes
and the head's arguments (``array.<n>``); its header's metadata holds

* ``format`` -- ``"minip_learn.estimator"`` and ``format_version`` -- ``"1"``;
* ``minip_learn_version`` -- the version that saved it;
* ``content`` -- JSON: the estimator's class name and hyperparameters
  (``get_params(deep=False)``), the head's class name and the arguments it was built
  with, the fitted attributes (``n_bits_``, ``solved_``, ``vocabulary_``, ...) and the
  training history;
* ``sha256`` -- the digest of ``content`` and of every tensor (name, dtype, shape,
  bytes): a file changed after it was written is refused.

Loading reads the JSON, looks the two class names up among the library's own
estimators and heads (nothing named in the file is imported or called), builds the head
from its arguments and loads the weights into it. Hyperparameters the estimator's class
gained since the file was saved take their defaults, with a
:class:`~minip_learn.estimators.MinIPVersionWarning` naming both versions.
"""

import hashlib
import inspect
import json
import math
import re
import struct
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load as _load_tensors
from safetensors.torch import save_file as _save_file

from .._io import write_atomic
from ..nn import (
    KernelAttentionHead,
    KernelAttentionModel,
    SoftmaxAttentionHead,
    available_mixers,
    get_mixer,
    init_arguments,
)
from ._versions import VERSION_KEY, versioned_restore

__all__ = ["load_estimator", "save_estimator"]

FORMAT = "minip_learn.estimator"
FORMAT_VERSION = "1"
#: the largest header a saved estimator's file may declare (its JSON and tensor table)
MAX_HEADER_BYTES = 256 * 2**20
_MODULE_PREFIX = "module."
#: the floating dtypes a saved head may have
_DTYPES = {str(d).removeprefix("torch."): d
           for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}
#: the names of fitted attributes (``n_bits_``, ``solved_`` ...)
_FITTED_NAME = re.compile(r"[a-z][a-z0-9_]*_")
_ARRAY_PREFIX = "array."


def _estimator_classes():
    from .classifier import KernelAttentionClassifier
    from .kernel import KernelAttentionRegressor
    from .mixer import SequenceMixerRegressor
    from .softmax import SoftmaxAttentionRegressor

    return {cls.__name__: cls for cls in (KernelAttentionRegressor, KernelAttentionClassifier,
                                          SoftmaxAttentionRegressor, SequenceMixerRegressor)}


def _module_classes():
    """The heads a saved estimator may name: the library's own, by class name."""
    classes = [KernelAttentionHead, KernelAttentionModel, SoftmaxAttentionHead]
    classes += [get_mixer(name) for name in available_mixers()]
    return {cls.__name__: cls for cls in classes if cls.__module__.startswith("minip_learn.")}


class _Encoder:
    """JSON values of Python values; arrays and tensors go to ``tensors`` by reference.

    A value that is neither a JSON value, a tuple, a NumPy scalar nor an array raises
    a ValueError naming ``what``: saving it would need code on loading.
    """

    def __init__(self):
        self.tensors = {}

    def __call__(self, value, what):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
            return int(value)
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, (float, np.floating)):
            value = float(value)
            return value if math.isfinite(value) else {"float": repr(value)}
        if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
            return {"strings": [self(v, what) for v in value.tolist()],
                    "dtype": value.dtype.str}
        if isinstance(value, (np.ndarray, torch.Tensor)):
            name = f"{_ARRAY_PREFIX}{len(self.tensors)}"
            tensor = torch.as_tensor(value).detach().cpu().contiguous()
            self.tensors[name] = tensor
            return {"array": name, "numpy": isinstance(value, np.ndarray)}
        if isinstance(value, tuple):
            return {"tuple": [self(v, what) for v in value]}
        if isinstance(value, list):
            return [self(v, what) for v in value]
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {"dict": {k: self(v, f"{what}[{k!r}]") for k, v in value.items()}}
        raise ValueError(
            f"{what}={value!r} cannot be saved without code: save_estimator keeps JSON "
            "values, tuples and arrays only (a registered name instead of a class or "
            "function). pickle the estimator to keep it, knowing that loading a pickle "
            "runs code from its file.")


def _decode(value, tensors):
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "array" in value:
        tensor = tensors[value["array"]]
        return tensor.numpy() if value["numpy"] else tensor
    if "tuple" in value:
        return tuple(_decode(v, tensors) for v in value["tuple"])
    if "float" in value:
        return float(value["float"])
    if "strings" in value:
        return np.array(_decode(value["strings"], tensors), dtype=np.dtype(value["dtype"]))
    return {k: _decode(v, tensors) for k, v in value["dict"].items()}


def _digest(content, tensors):
    h = hashlib.sha256(content.encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _unshared(tensors):
    """``tensors`` with a copy of each one whose memory another one shares (safetensors
    stores every tensor on its own: a tied pair, e.g. ``shared_features``, is stored
    twice and tied again by the head built on loading)."""
    seen, out = set(), {}
    for name, tensor in tensors.items():
        storage = (tensor.untyped_storage().data_ptr(), tensor.device)
        out[name] = tensor.clone() if storage in seen else tensor
        seen.add(storage)
    return out


def _history(net):
    """The net's history as plain numbers (tensors recorded on the device read now)."""
    sync = getattr(net, "sync_history", None)
    if sync is not None:
        sync()
    return [dict(row) for row in list.__iter__(net.history)]


def save_estimator(estimator, path):
    """Save a fitted estimator of this library to one file that runs no code on loading.

    The hyperparameters, fitted attributes, history and the head's architecture are
    kept as JSON, the weights as safetensors (see :ref:`saving`). The file is written
    atomically: it exists complete or not at all. The optimizer's state is not kept (a
    loaded estimator predicts, scores and refits; it does not resume an interrupted
    training).

    Parameters
    ----------
    estimator : estimator object
        A fitted :class:`~minip_learn.KernelAttentionRegressor`,
        :class:`~minip_learn.KernelAttentionClassifier`,
        :class:`~minip_learn.SoftmaxAttentionRegressor` or
        :class:`~minip_learn.SequenceMixerRegressor` (fitted, or made by
        ``from_module``) whose head is the library's own.
    path : str or path
        The file to write (``.safetensors`` by convention).

    Returns
    -------
    path : pathlib.Path

    Raises
    ------
    ValueError
        When the estimator is not fitted, its head is a user's module, or a
        hyperparameter is a class, function or object (the message names it): those can
        be kept only by a pickle, which runs code when it is loaded.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from minip_learn import KernelAttentionRegressor
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.estimators import load_estimator, save_estimator
    >>> X, y = make_minip(16, seq_len=3, n_bits=4, random_state=0)
    >>> est = KernelAttentionRegressor(rank=4, max_epochs=5, random_state=0).fit(X, y)
    >>> path = save_estimator(est, pathlib.Path(tempfile.mkdtemp()) / "head.safetensors")
    >>> bool((load_estimator(path).predict(X) == est.predict(X)).all())
    True
    """
    name = type(estimator).__name__
    if _estimator_classes().get(name) is not type(estimator):
        raise ValueError(
            f"save_estimator saves the estimators of minip_learn; {name} is not one: keep "
            "it in memory (return_estimators=True) or pickle it yourself, knowing that "
            "loading a pickle runs code from its file.")
    net = estimator.__dict__.get("net_")
    if net is None:
        raise ValueError(f"This {name} is not fitted: fit it before saving it.")
    module = net.module_
    arguments = init_arguments(module)
    if _module_classes().get(type(module).__name__) is not type(module) or arguments is None:
        raise ValueError(
            f"the head of this {name} ({type(module).__name__}) is not one of the library's "
            "own heads built from arguments, so it cannot be saved without its code; "
            "pickle the estimator to keep it, knowing that loading a pickle runs code "
            "from its file.")
    encode = _Encoder()
    fitted = {k: v for k, v in vars(estimator).items()
              if k.endswith("_") and not k.startswith("_") and k != "net_"}
    content = json.dumps({
        "estimator": name,
        "params": {k: encode(v, k) for k, v in estimator.get_params(deep=False).items()},
        "module": {"class": type(module).__name__,
                   "arguments": {k: encode(v, f"the head's {k}") for k, v in arguments.items()},
                   "dtype": str(next(module.parameters()).dtype).removeprefix("torch."),
                   "tied": _tied(module)},
        "fitted": {k: encode(v, k) for k, v in fitted.items()},
        "history": encode(_history(net), "history"),
    }, allow_nan=False, sort_keys=True)
    tensors = dict(encode.tensors)
    for key, tensor in module.state_dict().items():
        tensors[_MODULE_PREFIX + key] = tensor.detach().cpu().contiguous()
    tensors = _unshared(tensors)
    from .. import __version__

    metadata = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "minip_learn_version": __version__, "content": content,
                "sha256": _digest(content, tensors)}
    path = Path(path)
    write_atomic(path, lambda tmp: _save_file(tensors, tmp, metadata=metadata))
    return path


def _read(path):
    """``(metadata, tensors)`` of a saved estimator's file, each part checked."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc}).") from None
    problem = None
    if len(raw) < 8 or struct.unpack("<Q", raw[:8])[0] > min(len(raw) - 8, MAX_HEADER_BYTES):
        problem = "not a safetensors file (no valid header)"
    else:
        size = struct.unpack("<Q", raw[:8])[0]
        try:
            header = json.loads(raw[8:8 + size])
            metadata = header.get("__metadata__") or {}
            tensors = _load_tensors(raw)
        except (ValueError, UnicodeDecodeError, AttributeError, RecursionError) as exc:
            problem = f"not a safetensors file ({str(exc)[:100]})"
        except Exception as exc:  # noqa: BLE001 - safetensors' own error types
            problem = f"not a safetensors file ({type(exc).__name__}: {str(exc)[:100]})"
    if problem is None and metadata.get("format") != FORMAT:
        problem = "a safetensors file, but not an estimator saved by minip_learn"
    elif problem is None and metadata.get("format_version") != FORMAT_VERSION:
        problem = (f"saved in format version {metadata.get('format_version')!r}; this "
                   f"version of minip_learn reads version {FORMAT_VERSION}")
    elif problem is None and _digest(metadata.get("content", ""), tensors) != metadata.get(
            "sha256"):
        problem = "its contents do not match the digest written with them (changed or damaged)"
    if problem is not None:
        raise ValueError(f"{path}: {problem}.")
    return metadata, tensors


def _restore_params(cls, params, saved_version, path):
    """The hyperparameters to build ``cls`` with, and the version warning (or None)."""
    unknown = sorted(set(params) - set(inspect.signature(cls.__init__).parameters))
    if unknown:
        raise ValueError(
            f"{path}: saved by minip_learn {saved_version} with hyperparameters "
            f"{cls.__name__} does not have here: {', '.join(unknown)}; load it with that "
            "version.")
    state, warning = versioned_restore(cls, {**params, VERSION_KEY: saved_version})
    return state, warning


def _tied(module):
    """The groups of ``module``'s ``state_dict`` keys that name one tensor (tied
    weights, e.g. ``shared_features``)."""
    groups = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(key)
    return sorted(sorted(keys) for keys in groups.values() if len(keys) > 1)


def _architecture_problem(cls, arguments, state, tied):
    """What keeps the head of ``cls`` built from ``arguments`` from taking the saved
    ``state`` (other weights or shapes, other tied weights), or None; the head is built
    on the meta device, so a file cannot make the loader allocate more than it holds."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        shell = cls(**arguments)
    built = shell.state_dict()
    none = {k for k in state if k not in built}  # buffers a head sets after it is built
    if set(built) | none != set(state):
        return (f"its head's weights are {sorted(state)}, but {cls.__name__} built from "
                f"its arguments has {sorted(built)}")
    shapes = [k for k in built if tuple(built[k].shape) != tuple(state[k].shape)]
    if shapes:
        return f"the shape of {shapes[0]} is not that of the head built from its arguments"
    if _tied(shell) != tied:
        return "its tied weights are not those of the head built from its arguments"
    return None


def _build_module(cls, arguments, dtype, state):
    """A head of ``cls`` built from its ``arguments`` (under a forked random state, so
    the caller's is left alone) with the saved ``state`` loaded into it."""
    with torch.random.fork_rng(devices=[]):
        module = cls(**arguments)
    module = module.to(dtype=dtype)
    for key, tensor in state.items():  # buffers the head sets after it is built (masks)
        owner, _, leaf = key.rpartition(".")
        sub = module.get_submodule(owner)
        if leaf in dict(sub.named_buffers(recurse=False, remove_duplicate=False)):
            continue
        if leaf not in dict(sub.named_parameters(recurse=False)) and hasattr(sub, leaf) and (
                getattr(sub, leaf) is None):
            setattr(sub, leaf, tensor.clone())
    module.load_state_dict(state, strict=True)
    return module


def load_estimator(path, *, device=None):
    """Load an estimator saved by :func:`save_estimator`, running no code from its file.

    The file's two class names are looked up among the library's estimators and heads;
    the head is built from its recorded arguments and the weights loaded into it.
    Hyperparameters the class gained since the file was saved are set to their defaults
    with a :class:`~minip_learn.estimators.MinIPVersionWarning` naming both versions
    (also issued, with nothing filled, when the versions merely differ).

    Parameters
    ----------
    path : str or path
        A file written by :func:`save_estimator`.
    device : str or None, default=None
        Where the loaded head runs (its ``device`` hyperparameter). None: the saved
        ``device`` when this machine has it, else ``"cpu"`` (with a warning naming the
        saved device).

    Returns
    -------
    estimator : estimator object
        The fitted estimator: its predictions are those of the saved one.

    Raises
    ------
    ValueError
        When the file is not a saved estimator, is damaged or was changed after it was
        written, names a class that is not the library's, or was saved by a version with
        hyperparameters this one lacks; the message names the file.

    Examples
    --------
    A round trip is in :func:`save_estimator`'s example. A file that is not a saved
    estimator is refused, and nothing in it runs:

    >>> import pathlib, pickle, tempfile
    >>> from minip_learn.estimators import load_estimator
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
    >>> _ = path.write_bytes(pickle.dumps(print))  # a pickle
    >>> load_estimator(path)
    Traceback (most recent call last):
    ...
    ValueError: .../model.safetensors: not a safetensors file (no valid header).
    """
    metadata, tensors = _read(path)
    try:
        content = json.loads(metadata["content"])
        est_cls = _estimator_classes()[content["estimator"]]
        mod_cls = _module_classes()[content["module"]["class"]]
        params = {k: _decode(v, tensors) for k, v in content["params"].items()}
        arguments = {k: _decode(v, tensors)
                     for k, v in content["module"]["arguments"].items()}
        fitted = {k: _decode(v, tensors) for k, v in content["fitted"].items()}
        history = _decode(content["history"], tensors)
        dtype = _DTYPES[content["module"]["dtype"]]
        if not all(isinstance(k, str) and _FITTED_NAME.fullmatch(k) and k != "net_"
                   for k in fitted):
            raise ValueError(f"fitted attributes {sorted(fitted)}")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"{path}: its description names no estimator and head of this "
                         f"library ({type(exc).__name__}: {str(exc)[:100]}).") from None
    params, warning = _restore_params(est_cls, params, metadata.get("minip_learn_version"),
                                      path)
    saved_device = params.get("device", "cpu")
    if device is None:
        device = saved_device
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            warnings.warn(f"{path}: saved on {saved_device!r}, which this machine does not "
                          "have; loaded on 'cpu' (device='cpu').", UserWarning, stacklevel=2)
            device = "cpu"
    params["device"] = device
    est = est_cls(**params)
    module_state = {k[len(_MODULE_PREFIX):]: v for k, v in tensors.items()
                    if k.startswith(_MODULE_PREFIX)}
    try:
        problem = _architecture_problem(mod_cls, arguments, module_state,
                                        content["module"]["tied"])
        if problem is None:
            module = _build_module(mod_cls, arguments, dtype, module_state)
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as exc:
        problem = f"its head cannot be built from its arguments ({str(exc)[:100]})"
    if problem is not None:
        raise ValueError(f"{path}: {problem}.")
    try:
        est._set_fitted_module(module)  # checks every hyperparameter
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    for name, value in fitted.items():
        setattr(est, name, value)
    est.net_.history_ = type(est.net_.history_)(history)
    if warning is not None:
        warnings.warn(warning, stacklevel=2)
    return est
