"""Values as results files store them: JSON-ready values, digests and fit keys."""

import hashlib
import json
import math
import numbers
import os
import re

import numpy as np
import pandas as pd

from ..compact import is_compact

#: columns that hold booleans (None while unknown)
_BOOL_COLUMNS = ("solved", "below_certified_bound", "nonnegative", "theorem_applies")


def jsonable(value, *, sort_keys=True):
    """A JSON-friendly version of a value: the one conversion of the results store, of
    the run folders' configurations and of the recipes' ``provenance.json``.

    Numpy scalars become Python numbers (non-finite floats their ``repr``), tuples
    lists, paths text, dicts dicts with text keys, and any other object its ``repr``.

    Parameters
    ----------
    value : object
    sort_keys : bool, default=True
        Sort the keys of dicts (what digests of configurations need); False keeps
        their order.

    Returns
    -------
    object
        Made of dicts, lists, text, numbers, booleans and None.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.model_selection import jsonable
    >>> jsonable({"b": (1, np.int64(2)), "a": np.float32(0.5)})
    {'a': 0.5, 'b': [1, 2]}
    >>> jsonable({"b": 1, "a": float("nan")}, sort_keys=False)
    {'b': 1, 'a': 'nan'}
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        return v if math.isfinite(v) else repr(v)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v, sort_keys=sort_keys) for v in value]
    if isinstance(value, dict):
        items = value.items()
        if sort_keys:
            items = sorted(items, key=lambda kv: str(kv[0]))
        return {str(k): jsonable(v, sort_keys=sort_keys) for k, v in items}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


def digest(obj, n=12):
    text = json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def data_fingerprint(X, y):
    h = hashlib.sha1()
    arrays = (X.tokens, X.token_ids, X.counts, y) if is_compact(X) else (X, y)
    for arr in arrays:
        a = np.ascontiguousarray(np.asarray(arr))
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:12]


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def slug(text):
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", str(text)).strip("_")[:60]


def fit_key(params, seed):
    """File stem of one fit: readable swept values plus a hash of the exact values."""
    parts = [f"{k}={params[k]}" for k in sorted(params)
             if isinstance(params[k], (str, numbers.Number)) and not isinstance(params[k], bool)]
    parts.append(f"seed={seed}")
    return slug("_".join(parts)) + "_" + digest({"params": params, "seed": seed}, 8)


def library_version():
    from .. import __version__

    return __version__


def to_frame(rows):
    """The rows of fits as a DataFrame, with boolean columns as booleans."""
    df = pd.DataFrame(rows)
    for col in _BOOL_COLUMNS:
        if col in df and df[col].notna().all():
            df[col] = df[col].astype(bool)
    return df
