"""Input validation shared by every layer that accepts user arrays, and the distinct
tokens of such arrays (:func:`distinct_tokens`).

Every check raises a :class:`ValueError` that names the offending argument and what
was expected, so that bad input never reaches torch as an opaque traceback.
"""

import numbers
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import DataConversionWarning

__all__ = [
    "MAX_SEQ_LEN",
    "InputTypeError",
    "check_binary",
    "check_family",
    "check_device",
    "check_float",
    "check_int",
    "check_params",
    "check_positive",
    "check_same_length",
    "check_seeds",
    "check_minip_targets",
    "check_sequences",
    "check_targets",
    "distinct_tokens",
]


#: the longest sequence a Min-IP family may hold (2**20 tokens): the certificates code
#: the multiplicities of a sequence's three slots as one 64-bit integer below
#: ``(seq_len + 1) ** 3``, and a compact family's length and counts stay far from
#: integer overflow
MAX_SEQ_LEN = 1 << 20


class InputTypeError(TypeError, ValueError):
    """Raised for array entries that are not numbers (e.g. a dict in an object array).

    It is both a :class:`ValueError` (what every bad input of this library raises) and a
    :class:`TypeError` (what NumPy and scikit-learn raise for the same input).
    """


def _as_numeric_array(X, name):
    if X is None:
        raise ValueError(f"{name} is None; expected an array of token sequences.")
    if sp.issparse(X):
        raise ValueError(
            f"{name} is a sparse {type(X).__name__}: sparse input is not supported; "
            f"convert it with {name}.toarray()."
        )
    if hasattr(X, "detach") and hasattr(X, "cpu"):  # torch tensor, possibly on a GPU
        X = X.detach().cpu().numpy()
    try:
        arr = np.asarray(X)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(
            f"{name} could not be converted to a rectangular array ({exc}); "
            "every sequence must have the same length and every token the same number of bits."
        ) from None
    if arr.dtype == object:
        try:
            arr = arr.astype(np.float64)
        except TypeError as exc:
            raise InputTypeError(
                f"{name} has dtype object with non-numeric entries ({exc}); expected numbers."
            ) from None
        except ValueError:
            raise ValueError(
                f"{name} has dtype object: sequences must have equal length and tokens equal "
                "numbers of bits, and every entry must be a number."
            ) from None
    if arr.dtype.kind == "c":
        raise ValueError(f"{name} is complex: Complex data not supported; expected real tokens.")
    if arr.dtype.kind not in "biuf":
        raise ValueError(
            f"{name} has non-numeric dtype {arr.dtype}; expected numbers (0/1 for Min-IP)."
        )
    return arr


def check_sequences(X, *, name="X", allow_2d=False, binary=False):
    """Validate a batch of token sequences.

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits)
        Sequences of token vectors. With ``allow_2d=True`` an array of shape
        ``(n_samples, n_bits)`` is accepted and read as single-token sequences.
    name : str, default="X"
        Name used in error messages.
    allow_2d : bool, default=False
        Accept 2-D input as sequences of length 1.
    binary : bool, default=False
        Require every entry to be 0 or 1.

    Returns
    -------
    X3 : ndarray of shape (n_samples, seq_len, n_bits)
        The validated array (a view when possible).
    was_2d : bool
        Whether the input was 2-D.

    Raises
    ------
    ValueError
        On wrong dimensionality, empty input, NaN or infinite values, or (with
        ``binary=True``) values other than 0 and 1.
    """
    arr = _as_numeric_array(X, name)
    shape = arr.shape
    was_2d = False
    if arr.ndim == 2 and allow_2d:
        arr = arr[:, None, :]
        was_2d = True
    if arr.ndim != 3:
        expected = "3 (n_samples, seq_len, n_bits)"
        if allow_2d:
            expected += " or 2 (n_samples, n_bits)"
        hint = ""
        if allow_2d and arr.ndim == 1:
            hint = (
                " Reshape your data either using array.reshape(-1, 1) if your data has a "
                "single feature or array.reshape(1, -1) if it contains a single sample."
            )
        raise ValueError(
            f"{name} must have ndim {expected}; got ndim={arr.ndim} with shape {shape}.{hint}"
        )
    n_samples, seq_len, n_bits = arr.shape
    if n_samples == 0:
        raise ValueError(
            f"{name} is empty: found array with 0 sample(s) (shape={shape}) while a "
            "minimum of 1 is required."
        )
    if seq_len == 0:
        raise ValueError(f"{name} has seq_len=0 (shape {shape}); sequences need >= 1 token.")
    if n_bits == 0:
        raise ValueError(
            f"{name} has n_bits=0: found array with 0 feature(s) (shape={shape}) while a "
            "minimum of 1 is required; tokens need >= 1 bit."
        )
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values.")
    if binary:
        check_binary(arr, name=name)
    return arr, was_2d


def check_family(X, *, name="X", integer=False):
    """Validate a Min-IP family held as an array (what certificates are made of).

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits)
        The sequences: no zero dimension, ``seq_len <= MAX_SEQ_LEN``, every entry 0
        or 1, of a real dtype (bool, integer or float; numbers in an object array are
        read as floats). Complex, string, structured and non-numeric object arrays
        are refused.
    name : str, default="X"
        Name used in error messages.
    integer : bool, default=False
        Require a bool or integer dtype (float 0/1 refused too): the rule for
        families read from files.

    Returns
    -------
    X3 : ndarray of shape (n_samples, seq_len, n_bits)
        The validated array (``X`` itself when it is an ndarray of a real dtype).

    Raises
    ------
    ValueError
        Naming ``name`` and the first rule broken.

    Examples
    --------
    >>> import numpy as np
    >>> check_family(np.ones((2, 3, 4), dtype=np.uint8)).shape
    (2, 3, 4)
    >>> check_family(np.ones((2, 3, 4)), integer=True)
    Traceback (most recent call last):
    ...
    ValueError: X must hold bool or integer 0/1 tokens; got dtype float64.
    """
    if integer:
        dtype = getattr(X, "dtype", None)
        if dtype is None:
            dtype = np.asarray(X).dtype
        if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in "biu":
            raise ValueError(f"{name} must hold bool or integer 0/1 tokens; got dtype {dtype}.")
    arr, _ = check_sequences(X, name=name, binary=True)
    if arr.shape[1] > MAX_SEQ_LEN:
        raise ValueError(
            f"{name} has seq_len={arr.shape[1]}, above the longest sequence length "
            f"MAX_SEQ_LEN = {MAX_SEQ_LEN}."
        )
    return arr


def check_binary(arr, *, name="X"):
    """Raise a ValueError unless every entry of ``arr`` is 0 or 1."""
    if arr.dtype == bool or not arr.size:
        return
    if arr.dtype.kind == "u" and arr.max() <= 1:
        return  # unsigned: a reduction, no temporary the size of the array
    arr = np.atleast_1d(arr)
    step = max(1, (1 << 22) // max(1, arr.size // len(arr)))  # rows per slice: small masks
    n_bad, example = 0, None
    for start in range(0, len(arr), step):
        part = arr[start:start + step]
        bad = (part != 0) & (part != 1)
        if bad.any():
            n_bad += int(bad.sum())
            if example is None:
                example = part[bad][0].item()
    if n_bad:
        raise ValueError(
            f"{name} must contain only 0/1 tokens; found {n_bad} other value(s), "
            f"e.g. {example!r}."
        )


def distinct_tokens(tokens, *, return_index=False, return_inverse=False):
    """The distinct rows of a 2-d array, as ``np.unique(tokens, axis=0)`` returns them.

    0/1 tokens (the Min-IP case) are compared as the bytes of their ``uint8`` rows,
    which is many times faster than ``np.unique(axis=0)`` and gives the same rows in the
    same (lexicographic) order; other values go through ``np.unique(axis=0)``.

    Parameters
    ----------
    tokens : ndarray of shape (n_tokens, n_bits)
    return_index, return_inverse : bool, default=False
        Also return the index of every distinct row's first occurrence, and the index
        of every row among the distinct ones (as ``np.unique``).

    Returns
    -------
    ndarray of shape (n_distinct, n_bits), of the dtype of ``tokens``
        With ``return_index`` and ``return_inverse``, a tuple of it and the requested
        index arrays (1-d), in that order.

    Examples
    --------
    >>> import numpy as np
    >>> distinct_tokens(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]))
    array([[0., 1.],
           [1., 0.]])
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] == 0 or not (
            tokens.dtype == bool or ((tokens == 0) | (tokens == 1)).all()):
        out = np.unique(tokens, axis=0, return_index=return_index,
                        return_inverse=return_inverse)
    else:
        rows = np.ascontiguousarray(tokens, dtype=np.uint8)
        keys = rows.view(np.dtype((np.void, rows.shape[1]))).reshape(-1)
        _, first, *inverse = np.unique(keys, return_index=True,
                                       return_inverse=return_inverse)
        out = (tokens[first],) + ((first,) if return_index else ()) + tuple(inverse)
    if not (return_index or return_inverse):
        return out[0] if isinstance(out, tuple) else out
    return (out[0],) + tuple(a.reshape(-1) for a in out[1:])


def ravel_column_vector(arr, *, stacklevel=4):
    """``arr[:, 0]`` with scikit-learn's DataConversionWarning when ``arr`` is a
    column vector ``(n, 1)`` (targets of 2-D ``X``); ``arr`` unchanged otherwise.

    With the default ``stacklevel`` the warning points at the caller of the estimator
    method that validates ``y`` (``fit`` -> its validation helper -> this function).
    """
    if arr.ndim == 2 and arr.shape[1] == 1:
        warnings.warn(
            "A column-vector y was passed when a 1d array was expected. Please change "
            "the shape of y to (n_samples,), for example using ravel().",
            DataConversionWarning,
            stacklevel=stacklevel,
        )
        return arr[:, 0]
    return arr


def check_targets(y, n_samples, seq_len, *, was_2d=False, name="y", stacklevel=4):
    """Validate real-valued targets against the shape of the sequences.

    Returns ``y`` as a float array of shape ``(n_samples, seq_len)``. ``stacklevel``
    is that of the warning for a column-vector ``y`` (see :func:`ravel_column_vector`).
    """
    arr = _as_numeric_array(y, name)
    if was_2d:
        arr = ravel_column_vector(arr, stacklevel=stacklevel)
        expected = (n_samples,)
    else:
        expected = (n_samples, seq_len)
    if arr.shape != expected:
        raise ValueError(
            f"{name} has shape {arr.shape}, which does not match X: expected {expected} "
            "(one target per token of every sequence)."
        )
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values.")
    return arr.reshape(n_samples, seq_len)


def check_int(value, name, *, min_value=None, allow_none=False):
    """Validate an integer hyperparameter (``bool`` is rejected)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer; got {value!r} ({type(value).__name__}).")
    if min_value is not None and value < min_value:
        raise ValueError(f"{name} must be >= {min_value}; got {value}.")
    return int(value)


def check_float(value, name, *, min_value=None, strict=False, max_value=None):
    """Validate a real hyperparameter."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number; got {value!r}.")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}.")
    if min_value is not None and (value <= min_value if strict else value < min_value):
        op = ">" if strict else ">="
        raise ValueError(f"{name} must be {op} {min_value}; got {value}.")
    if max_value is not None and value > max_value:
        raise ValueError(f"{name} must be <= {max_value}; got {value}.")
    return value


def check_seeds(seeds, name="seeds"):
    """Validate random seeds and return them as a list.

    Parameters
    ----------
    seeds : int, None or iterable of int or None
        One seed, or several. None stands for an unseeded fit (fresh randomness).
    name : str, default="seeds"
        Name used in error messages.

    Returns
    -------
    seeds : list of int or None
        The seeds as Python ints (None kept), in the given order.

    Raises
    ------
    ValueError
        For an empty iterable, an entry that is neither an int nor None (``bool``
        included: ``True`` is not a seed), or an int given more than once.

    Examples
    --------
    >>> import numpy as np
    >>> check_seeds(3), check_seeds((0, np.int64(1), None))
    ([3], [0, 1, None])
    >>> check_seeds([0, True])
    Traceback (most recent call last):
    ...
    ValueError: seeds must be ints (or None), not bool; got True.
    """
    if isinstance(seeds, (str, bytes)) or not np.iterable(seeds):
        items = [seeds]  # one seed, checked below
    else:
        items = list(seeds)
    if not items:
        raise ValueError(f"{name} must be a non-empty list of ints (or None); got {seeds!r}.")
    out = []
    for seed in items:
        if isinstance(seed, (bool, np.bool_)):
            raise ValueError(f"{name} must be ints (or None), not bool; got {seed!r}.")
        if seed is not None and not isinstance(seed, numbers.Integral):
            raise ValueError(
                f"{name} must be ints (or None); got {seed!r} ({type(seed).__name__})."
            )
        out.append(None if seed is None else int(seed))
    given = [seed for seed in out if seed is not None]
    repeated = sorted({seed for seed in given if given.count(seed) > 1})
    if repeated:
        raise ValueError(
            f"{name} must not contain duplicates; got {', '.join(map(str, repeated))} "
            "more than once."
        )
    return out


def check_same_length(a, b, names):
    """Raise a ValueError unless the arrays ``a`` and ``b`` (``names``: theirs) have
    the same shape."""
    if a.shape != b.shape:
        raise ValueError(f"{names[0]} and {names[1]} differ in length: "
                         f"{a.shape} vs {b.shape}.")


def check_positive(values, name):
    """Raise a ValueError unless every entry of the array ``values`` is > 0."""
    bad = ~(values > 0)
    if bad.any():
        raise ValueError(f"{name} must be positive; got {values[bad][0].item()!r}.")
    return values


def _check_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}; got {value!r}.")
    return value


def _check_constraint(value, name, spec):
    """Check one value against one constraint spec of :func:`check_params`."""
    if callable(spec):
        return spec(value, name)
    kind = spec[0]
    opts = spec[1] if len(spec) > 1 else {}
    if opts.get("none") and value is None:
        return None
    if kind == "int":
        return check_int(value, name, min_value=opts.get("min"))
    if kind == "real":
        return check_float(value, name, min_value=opts.get("min"),
                           strict=opts.get("strict", False), max_value=opts.get("max"))
    if kind == "choice":
        return _check_choice(value, name, opts["options"])
    if kind == "device":
        return check_device(value)
    if kind == "bool":
        return bool(value)
    if kind == "verbosity":
        return int(value) if isinstance(value, bool) else check_int(value, name, min_value=0)
    if kind == "instance":
        if not isinstance(value, opts["types"]):
            raise ValueError(f"{name} must be {opts['what']}; got {value!r}.")
        return value
    if kind == "any":
        return value
    raise TypeError(f"unknown constraint {spec!r} for {name}")


def check_params(params, constraints):
    """Validate hyperparameters against a table of constraints, in the table's order.

    Parameters
    ----------
    params : dict
        Hyperparameter values (e.g. ``estimator.get_params(deep=False)``).
    constraints : dict of str to spec
        One entry per checked parameter. A spec is a callable ``spec(value, name)``
        returning the checked value, or a tuple ``(kind,)`` / ``(kind, options)`` with
        ``kind`` one of ``"int"`` (options ``min``), ``"real"`` (``min``, ``strict``,
        ``max``), ``"choice"`` (``options``), ``"device"``, ``"bool"``,
        ``"verbosity"`` (a bool or an int >= 0), ``"instance"`` (``types`` and
        ``what``, the words of the message) or ``"any"``; option ``none=True`` also
        accepts None.

    Returns
    -------
    checked : dict
        The checked (and normalised) value of every parameter of ``constraints``.

    Raises
    ------
    ValueError
        Naming the first parameter that violates its constraint.

    Examples
    --------
    >>> table = {"rank": ("int", {"min": 1}), "lr": ("real", {"min": 0.0, "strict": True})}
    >>> check_params({"rank": 4, "lr": 0.1}, table)
    {'rank': 4, 'lr': 0.1}
    >>> check_params({"rank": 0, "lr": 0.1}, table)
    Traceback (most recent call last):
    ...
    ValueError: rank must be >= 1; got 0.
    """
    return {name: _check_constraint(params[name], name, spec)
            for name, spec in constraints.items()}


def check_minip_targets(X, y, *, name="y"):
    """Require Min-IP data: 0/1 tokens ``X`` and ``y`` equal to its exact Min-IP targets.

    The estimators are general regressors over real token vectors and accept any finite
    real targets; this stricter check is what ``fit(..., check_minip=True)`` adds for
    data that is meant to be a Min-IP family (see :doc:`/theory`: ``t_i = min_j <x_i, x_j>``,
    an integer in ``0..n_bits``).

    Parameters
    ----------
    X : ndarray of shape (n_samples, seq_len, n_bits)
        Validated sequences (see :func:`check_sequences`).
    y : ndarray of shape (n_samples, seq_len)
        Validated finite targets (see :func:`check_targets`).
    name : str, default="y"

    Raises
    ------
    ValueError
        Naming the first problem found: non-binary tokens, negative targets,
        non-integer targets, targets above ``n_bits``, or targets that are not the
        Min-IP targets of ``X``.
    """
    check_binary(X, name="X")
    y = np.asarray(y, dtype=np.float64)
    n_bits = X.shape[2]
    if (y < 0).any():
        raise ValueError(
            f"{name} contains {int((y < 0).sum())} negative target(s), e.g. {float(y[y < 0][0])!r}; "
            f"Min-IP targets are inner products of 0/1 tokens, integers in 0..{n_bits}."
        )
    frac = y != np.rint(y)
    if frac.any():
        raise ValueError(
            f"{name} contains {int(frac.sum())} non-integer target(s), e.g. {float(y[frac][0])!r}; "
            f"Min-IP targets are integers in 0..{n_bits}."
        )
    if (y > n_bits).any():
        raise ValueError(
            f"{name} contains target(s) above n_bits={n_bits}, e.g. {float(y[y > n_bits][0])!r}; "
            f"Min-IP targets are integers in 0..{n_bits}."
        )
    Xf = X.astype(np.float64, copy=False)
    exact = np.rint(np.matmul(Xf, Xf.transpose(0, 2, 1))).min(axis=2)
    wrong = y != exact
    if wrong.any():
        s, i = np.argwhere(wrong)[0]
        raise ValueError(
            f"{name} is not the Min-IP target of X at {int(wrong.sum())} position(s), e.g. "
            f"sequence {s}, position {i}: {name}={float(y[s, i])!r} but min_j <x_i, x_j> = "
            f"{int(exact[s, i])} (see minip_learn.datasets.minip_targets)."
        )


def check_device(device):
    """Validate a torch device string and return it normalised (e.g. ``"cuda:0"``).

    Raises a ValueError for a non-string, a string torch does not parse, an unsupported
    device type, or a CUDA/MPS device that this machine does not have.
    """
    import torch  # lazily: the data layer that shares this module is numpy-only

    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device must be a string such as 'cpu' or 'cuda:0'; got {device!r}.")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device {device!r} is not a valid torch device string.") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r} was requested but CUDA is not available here (torch "
                f"{torch.__version__}, built with CUDA {torch.version.cuda}); use 'cpu' or "
                "install a CUDA build of torch."
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s)."
            )
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {device!r} was requested but MPS is not available here.")
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'.")
    return str(dev)


# -- sizes of models: the memory a fit of given hyperparameters needs -------------------
# (the ``"size": True`` option of a constraint of :func:`check_params` marks a
# hyperparameter whose value sets how much memory a fit takes; the estimators check
# those at fit, before anything is allocated)

#: The memory a fit may take when the free memory of its device cannot be told: 1 TiB.
UNKNOWN_MEMORY_CAP = 2**40


def size_parameters(constraints):
    """The hyperparameters of a constraints table that set the size of a model.

    Parameters
    ----------
    constraints : dict of str to spec
        A table of :func:`check_params`; a spec ``(kind, options)`` whose options have
        ``"size": True`` marks a size (a rank, a state or hidden dimension).

    Returns
    -------
    names : list of str
        In the table's order.

    Examples
    --------
    >>> table = {"rank": ("int", {"min": 1, "size": True}), "lr": ("real", {"min": 0.0})}
    >>> size_parameters(table)
    ['rank']
    """
    return [name for name, spec in constraints.items()
            if not callable(spec) and len(spec) > 1 and spec[1].get("size")]


def format_bytes(n_bytes):
    """A number of bytes in decimal units for a message (``"16.0 GB"``).

    Examples
    --------
    >>> format_bytes(16 * 10**9), format_bytes(3 * 10**6), format_bytes(4 * 10**30)
    ('16.0 GB', '3.0 MB', '4e+21 GB')
    """
    n_bytes = float(n_bytes)
    if n_bytes < 10**8:
        return f"{n_bytes / 10**6:.1f} MB"
    gb = n_bytes / 10**9
    return f"{gb:.1f} GB" if gb < 10**6 else f"{gb:.3g} GB"


def check_fits_in_memory(name, value, needed, available, *, detail, where):
    """Raise a ValueError unless ``needed`` bytes fit in the ``available`` ones.

    Parameters
    ----------
    name : str
        The size hyperparameter the need is blamed on.
    value : int
        Its value.
    needed : int
        Bytes the fit needs (a Python int: any size, no overflow).
    available : int or None
        Bytes available on the device; None when they cannot be told, in which case a
        fit may take at most :data:`UNKNOWN_MEMORY_CAP`.
    detail : str
        What the bytes are, for the message.
    where : str
        The device in words (``"this machine"``, ``"cuda:0"``).

    Raises
    ------
    ValueError
        ``"<name>=<value> needs about <bytes> of memory to train (<detail>); <where>
        has <bytes> available."``

    Examples
    --------
    >>> check_fits_in_memory("rank", 4, 10**6, 10**9, detail="x", where="this machine")
    >>> check_fits_in_memory("rank", 10**9, 16 * 10**9, 10**9, detail="its weights",
    ...                      where="this machine")
    Traceback (most recent call last):
    ...
    ValueError: rank=1000000000 needs about 16.0 GB of memory to train (its weights); this machine has 1.0 GB available.
    """
    limit = UNKNOWN_MEMORY_CAP if available is None else available
    if needed <= limit:
        return
    have = (f"{where} has {format_bytes(available)} available" if available is not None
            else f"the free memory of {where} cannot be told, and a fit may take at most "
                 f"{format_bytes(UNKNOWN_MEMORY_CAP)}")
    raise ValueError(f"{name}={value} needs about {format_bytes(needed)} of memory to train "
                     f"({detail}); {have}.")
