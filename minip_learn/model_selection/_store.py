"""The on-disk results of a sweep: one run folder per configuration, one file per fit.

A run folder ``<out>/<name>-<config id>`` holds

* ``config.json`` -- the configuration (estimator class and fixed parameters, data
  fingerprint, scorers), its ``config_id`` and the library version that wrote it;
* ``fit-<fit_id>.json`` -- one record per finished fit, stamped with the same
  ``config_id`` and version, written atomically (a record exists complete or not at
  all);
* ``est-<fit_id>.joblib`` -- the fitted estimator, when saved; its SHA-256 is in the
  record, and it is loaded only through a record of this configuration;
* ``.locks/`` -- one lock file per fit being computed (:class:`filelock.FileLock`): two
  sweeps writing into one folder at once claim each fit once and share the work;
* ``corrupt/`` and ``foreign/`` -- files moved aside: records or estimators that cannot
  be read, and records written by another library version or for another
  configuration. Each move is reported in one :class:`ResultsFolderWarning` line naming
  the file; the fit is then computed again.

Every file is read strictly before it is used (:func:`read_json`: bounded nesting, no
duplicate keys, NaN and Infinity only where the writer writes them) and checked
against its declared fields (:data:`RECORD_FIELDS`, :data:`CONFIG_FIELDS`) and its file
name: the parameters and seed of a fit record reproduce its ``fit_id``.

A :class:`KeyedStore` keeps results that are not fits (e.g. the constructions of the
scaling recipe) with the same files, writes, locks and checks: one folder holds the
results of every configuration, each file named ``<key>-<config id>``.
"""

import datetime
import hashlib
import itertools
import json
import math
import numbers
import os
import re
import time
import warnings
from pathlib import Path

import joblib
import numpy as np
import pandas as pd

from .._io import HOST_TAG as _HOST_TAG
from .._io import TMP_PREFIX as _TMP_PREFIX
from .._io import write_atomic
from ..compact import is_compact

__all__ = ["KeyedStore", "ResultsFolderWarning", "check_writable", "load_sweep"]

_FIT_PREFIX = "fit-"
_EST_PREFIX = "est-"
_LOCKS = ".locks"
_CORRUPT = "corrupt"
_FOREIGN = "foreign"
#: subfolders of a run folder that hold no live results
_ASIDE = (_CORRUPT, _FOREIGN, _LOCKS)
#: fields of a record on disk that are about the file, not the fit
_FILE_FIELDS = ("config_id", "minip_learn_version", "estimator_sha256")
#: columns that hold booleans (None while unknown)
_BOOL_COLUMNS = ("solved", "below_certified_bound", "nonnegative", "theorem_applies")
#: the scorers of :func:`~minip_learn.metrics.get_scorers`: numbers in every record
_DEFAULT_SCORES = ("exact_match", "token_accuracy", "solved", "max_abs_error")


class ResultsFolderWarning(UserWarning):
    """A file of a results folder was unreadable or foreign and was moved aside.

    The message names the file and where it went; the fit it held is computed again.

    Examples
    --------
    >>> from minip_learn.model_selection import ResultsFolderWarning
    >>> issubclass(ResultsFolderWarning, UserWarning)
    True
    """


# -- values and fingerprints -----------------------------------------------------------
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


def _data_fingerprint(X, y):
    h = hashlib.sha1()
    arrays = (X.tokens, X.token_ids, X.counts, y) if is_compact(X) else (X, y)
    for arr in arrays:
        a = np.ascontiguousarray(np.asarray(arr))
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:12]


def _file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _slug(text):
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", str(text)).strip("_")[:60]


def fit_key(params, seed):
    """File stem of one fit: readable swept values plus a hash of the exact values."""
    parts = [f"{k}={params[k]}" for k in sorted(params)
             if isinstance(params[k], (str, numbers.Number)) and not isinstance(params[k], bool)]
    parts.append(f"seed={seed}")
    return _slug("_".join(parts)) + "_" + digest({"params": params, "seed": seed}, 8)


def _version():
    from .. import __version__

    return __version__


def to_frame(rows):
    """The rows of fits as a DataFrame, with boolean columns as booleans."""
    df = pd.DataFrame(rows)
    for col in _BOOL_COLUMNS:
        if col in df and df[col].notna().all():
            df[col] = df[col].astype(bool)
    return df


# -- reading files strictly -------------------------------------------------------------
#: Deepest nesting of arrays and objects a results file may have; checked on the text,
#: before it is parsed (a record is flat, a configuration two levels deep).
MAX_JSON_DEPTH = 32

_JSON_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _check_depth(text, limit=MAX_JSON_DEPTH):
    depth = 0
    for match in _JSON_BRACKETS.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                raise ValueError(f"nested deeper than {limit} levels")
        elif char in "]}":
            depth -= 1


def _unique_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _check_text(value):
    """Raise a ValueError for a string (anywhere in ``value``) that is not Unicode text
    (an unpaired surrogate escape)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{value[:20]!r} is not Unicode text") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k)
            _check_text(v)
    elif isinstance(value, list):
        for v in value:
            _check_text(v)


def read_json(text, *, nonfinite=False):
    """Parse the text of a results file strictly.

    Nesting deeper than :data:`MAX_JSON_DEPTH` is refused before parsing, and so are
    duplicate keys in an object, numbers out of the float range, strings that are not
    Unicode text and, unless ``nonfinite``, the constants ``NaN``, ``Infinity`` and
    ``-Infinity`` (which records write for non-finite scores and errors; a
    configuration never holds them).

    Parameters
    ----------
    text : str
    nonfinite : bool, default=False
        Accept ``NaN``, ``Infinity`` and ``-Infinity``.

    Returns
    -------
    object

    Raises
    ------
    ValueError
        Naming what is wrong.

    Examples
    --------
    >>> from minip_learn.model_selection._store import read_json
    >>> read_json('{"rank": 2, "max_abs_error": Infinity}', nonfinite=True)
    {'rank': 2, 'max_abs_error': inf}
    >>> read_json('{"rank": 2, "rank": 64}')
    Traceback (most recent call last):
    ...
    ValueError: duplicate key 'rank'
    """
    _check_depth(text)

    def constant(name):
        if not nonfinite:
            raise ValueError(f"{name} is not allowed in this file")
        return float(name)

    value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=constant,
                       parse_float=_finite_float)
    _check_text(value)
    return value


def _read_json_file(path, *, nonfinite=False):
    """:func:`read_json` of the file ``path`` (a UTF-8 text)."""
    return read_json(Path(path).read_text(encoding="utf-8"), nonfinite=nonfinite)


# -- the declared fields of the files -----------------------------------------------------
def _is_int(v):
    return type(v) is int


def _is_text(v):
    return type(v) is str


def _is_number(v):
    return type(v) in (int, float)


def _is_time(v):
    return _is_number(v) and math.isfinite(v) and v >= 0


def _is_iso_time(v):
    try:
        datetime.datetime.fromisoformat(v)
    except (TypeError, ValueError):
        return False
    return True


def _is_sha256(v):
    return _is_text(v) and re.fullmatch(r"[0-9a-f]{64}", v) is not None


def _or_null(check):
    return lambda v: v is None or check(v)


#: The fields of a fit record: ``name -> (what it holds, check, required)``. Any other
#: field is a swept parameter, a score of the sweep's scorers (a number, ``NaN`` and
#: ``Infinity`` included) or a tag (any JSON value).
RECORD_FIELDS = {
    "fit_id": ("text: the stem of the file name after fit-", _is_text, True),
    "estimator": ("text: the estimator's class name", _is_text, True),
    "seed": ("an integer or null", _or_null(_is_int), True),
    "rank": ("an integer or null", _or_null(_is_int), False),
    "feature_map": ("text or null", _or_null(_is_text), False),
    "solved": ("true or false", lambda v: type(v) is bool, True),
    "n_epochs": ("an integer", _is_int, True),
    "train_max_error": ("a number (NaN and Infinity allowed)", _is_number, True),
    "fit_time": ("a finite number >= 0", _is_time, True),
    "fit_cpu_time": ("a finite number >= 0", _is_time, True),
    "score_time": ("a finite number >= 0", _is_time, True),
    "device": ("text", _is_text, True),
    "n_threads": ("an integer >= 1", lambda v: _is_int(v) and v >= 1, True),
    "ensemble": ("true or false", lambda v: type(v) is bool, True),
    "nonnegative": ("true, false or null", _or_null(lambda v: type(v) is bool), True),
    "theorem_applies": ("true, false or null", _or_null(lambda v: type(v) is bool), True),
    "certified_min_rank": ("an integer >= 0 or null",
                           _or_null(lambda v: _is_int(v) and v >= 0), True),
    "below_certified_bound": ("true, false or null",
                              _or_null(lambda v: type(v) is bool), True),
    "host": ("text", _is_text, True),
    "pid": ("an integer >= 0", lambda v: _is_int(v) and v >= 0, True),
    "finished_at": ("an ISO 8601 time", _is_iso_time, True),
    "config_id": ("text", _is_text, True),
    "minip_learn_version": ("text", _is_text, True),
    "estimator_sha256": ("64 lowercase hexadecimal digits", _is_sha256, False),
}

#: The fields of a run folder's ``config.json`` (all required, no others).
CONFIG_FIELDS = {
    "estimator": ("text: the estimator's class name", _is_text, True),
    "params": ("an object: the fixed parameters", lambda v: type(v) is dict, True),
    "data": ("text: the data's fingerprint", _is_text, True),
    "scoring": ("a list of text: the scorers' names",
                lambda v: type(v) is list and all(map(_is_text, v)), True),
    "config_id": ("text", _is_text, True),
    "minip_learn_version": ("text", _is_text, True),
    "repr": ("text: the estimator's repr", _is_text, True),
}

#: The fields of a keyed store's record that are about the file (the others are the
#: result's, any JSON values).
_KEYED_FIELDS = {
    "key": ("text: the stem of the file name", _is_text, True),
    "config_id": ("text", _is_text, True),
    "minip_learn_version": ("text", _is_text, True),
    "estimator_sha256": ("64 lowercase hexadecimal digits", _is_sha256, False),
}

#: Record fields that a sweep computes (never a swept parameter).
_COMPUTED = frozenset(RECORD_FIELDS) - {"rank", "feature_map", "device"}


def _show(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _table_problem(row, table, *, numbers=(), closed=False):
    """The first field of ``row`` that breaks ``table`` (see :data:`RECORD_FIELDS`), in
    words, or None. ``numbers``: other fields that must be numbers; ``closed``: no
    other field is allowed."""
    for name, (what, check, required) in table.items():
        if name not in row:
            if required:
                return f"field {name!r} is missing"
        elif not check(row[name]):
            return f"field {name!r} is {_show(row[name])}, not {what}"
    for name in numbers:
        if name in table:
            continue
        if name not in row:
            return f"field {name!r} (a score) is missing"
        if not _is_number(row[name]):
            return f"field {name!r} is {_show(row[name])}, not a number (a score)"
    if closed:
        extra = sorted(set(row) - set(table))
        if extra:
            return f"field {extra[0]!r} is not a field of this file"
    return None


def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


#: Most candidate parameter fields :func:`_key_problem` tries subsets of.
_MAX_KEY_CANDIDATES = 14


def _key_problem(row, key, candidates, tried=None):
    """Why the parameters and seed of ``row`` do not give the fit key ``key``, or None.

    The parameters are a subset of the fields ``candidates`` (the swept parameters, or
    every field that could be one): the subset whose :func:`fit_key` hash with the
    row's seed is the key's (sets in ``tried`` first, and the one found added).
    """
    prefix, _, tag = key.rpartition("_")
    seed = row.get("seed")
    names = sorted(k for k in candidates if k in row and k != "seed")
    if len(names) > _MAX_KEY_CANDIDATES and len(prefix) < 55:
        # too many to try every subset: a number or a text among the parameters is
        # named in the key's readable part (when that is not cut at its 60 characters)
        names = [k for k in names if f"{k}=" in prefix or not (
            isinstance(row[k], (str, numbers.Number)) and not isinstance(row[k], bool))]
    if len(names) > _MAX_KEY_CANDIDATES:
        return (f"{len(names)} fields could be parameters; more than "
                f"{_MAX_KEY_CANDIDATES} cannot be checked against its fit_id")
    tried = [] if tried is None else tried
    subsets = itertools.chain(
        [t for t in tried if t <= set(names)],
        (frozenset(c) for n in range(len(names), -1, -1)
         for c in itertools.combinations(names, n)))
    for subset in subsets:
        params = {k: row[k] for k in subset}
        if digest({"params": params, "seed": seed}, 8) == tag:
            if subset not in tried:
                tried.append(subset)
            return None
    for k in names + ["seed"]:
        named = re.search(rf"(?:^|_){re.escape(k)}=(.+?)(?=_[A-Za-z][A-Za-z0-9_]*=|$)",
                          prefix)
        if named and _slug(f"{k}={row.get(k)}") != f"{k}={named.group(1)}":
            return (f"field {k!r} is {_show(row.get(k))}, but its file is the fit with "
                    f"{k}={named.group(1)}")
    shown = [f"{k}={_show(row[k])}" for k in names] + [f"seed={_show(seed)}"]
    return f"its {', '.join(shown)} do not give the fit_id of its file name ({key})"


def _fixed_problem(row, fixed):
    """A field of ``row`` that contradicts the fixed parameters ``fixed`` (a
    configuration's ``params``), in words, or None."""
    if "rank" in fixed and "rank" in row and _canonical(row["rank"]) != _canonical(
            fixed["rank"]):
        return (f"field 'rank' is {_show(row['rank'])}, but its configuration has "
                f"rank={_show(fixed['rank'])}")
    return None


def _parameter_fields(row, scoring, fixed):
    """The fields of a record that could be swept parameters (when the swept names are
    not known): neither computed by the fit, nor a score, nor a fixed parameter."""
    return [k for k in row if k not in _COMPUTED and k not in scoring
            and k not in _DEFAULT_SCORES and k not in fixed]


def _config_problem(config):
    """What is wrong with a parsed ``config.json``, in words, or None."""
    if not isinstance(config, dict):
        return "not a JSON object"
    problem = _table_problem(config, CONFIG_FIELDS, closed=True)
    if problem is None:
        ours = {k: config[k] for k in ("estimator", "params", "data", "scoring")}
        if digest(ours, 10) != config["config_id"]:
            problem = (f"its configuration does not give its config_id "
                       f"({config['config_id']})")
    return problem


# -- atomic writes (temporary file, then rename: minip_learn._io) ---------------------------
def _write_json_atomic(path, obj):
    """Write ``obj`` as JSON to ``path`` atomically (flushed to disk before the move)."""
    def write(tmp):
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=1, default=repr)
            fh.flush()
            os.fsync(fh.fileno())

    write_atomic(path, write)


def _dump_atomic(path, obj):
    write_atomic(path, lambda tmp: joblib.dump(obj, tmp))


def _remove_stale_temporaries(folder):
    """Delete temporary files left by writers of this host that died.

    A temporary file names its writer (host tag and process id); those of writers on
    other hosts (a shared cluster disk) are left alone.
    """
    for tmp in folder.glob(f"{_TMP_PREFIX}*"):
        writer = tmp.name.rsplit(".", 1)[-1]
        host, _, pid = writer.rpartition("-")
        if host and host != _HOST_TAG:
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)  # the writer is gone: the file is stale
        except (ValueError, OSError):
            continue  # not a writer's file, or a live process of another user


def check_writable(folder):
    """Create ``folder`` if needed and check that a file can be written into it.

    Parameters
    ----------
    folder : str or path

    Returns
    -------
    folder : pathlib.Path

    Raises
    ------
    ValueError
        When the folder cannot be created (a path under a regular file, no permission)
        or a file cannot be written there (read-only mount, full disk); the message names
        the folder and the reason.

    Examples
    --------
    >>> import tempfile
    >>> from minip_learn.model_selection import check_writable
    >>> check_writable(tempfile.mkdtemp()).is_dir()
    True
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-check-{_HOST_TAG}-{os.getpid()}"
        _write_json_atomic(probe, {})
        probe.unlink(missing_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if isinstance(exc, (FileExistsError, NotADirectoryError)):
            reason = "a path component is a file, not a folder"
        raise ValueError(f"cannot write to the output folder {folder}: {reason}.") from None
    return folder


# -- the run folder ----------------------------------------------------------------------
def _folder_config(estimator, X, y, swept, scoring):
    base = {k: v for k, v in estimator.get_params(deep=False).items()
            if k not in swept and k not in ("random_state", "device", "verbose")}
    return {
        "estimator": type(estimator).__name__,
        "params": jsonable(base),
        "data": _data_fingerprint(X, y),
        "scoring": sorted(scoring),
    }


class RunFolder:
    """The run folder of one sweep configuration (see the module docstring).

    Parameters
    ----------
    path : path
    config : dict
        The configuration; its digest is the folder's ``config_id``.
    """

    #: the field of a record that holds its key (the stem of its file names)
    key_field = "fit_id"

    def __init__(self, path, config, swept=None):
        self.path = Path(path)
        self.config = config
        self.config_id = digest(config, 10)
        self.version = _version()
        self.swept = None if swept is None else frozenset(swept)
        self._locks = {}
        self._key_sets = []  # the sets of fields found to be a record's parameters

    @classmethod
    def open(cls, out, name, estimator, X, y, swept, scoring):
        """Create (or reopen) the run folder of this configuration under ``out``."""
        config = _folder_config(estimator, X, y, swept, scoring)
        stem = _slug(name) if name else type(estimator).__name__
        folder = cls(Path(out) / f"{stem}-{digest(config, 10)}", config, swept)
        check_writable(folder.path)
        _remove_stale_temporaries(folder.path)
        folder._check_config(repr(estimator))
        return folder

    @property
    def stamp(self):
        """The columns that tie a record to this folder."""
        return {"config_id": self.config_id, "minip_learn_version": self.version}

    # -- moving files aside --------------------------------------------------------------
    def move_aside(self, path, kind, reason, then="computed again"):
        """Move ``path`` into ``corrupt/`` or ``foreign/`` and say so in one warning line
        (ending with ``then``: what happens next)."""
        target_dir = self.path / kind
        target_dir.mkdir(exist_ok=True)
        target = target_dir / path.name
        if target.exists():
            target = target_dir / f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        try:
            os.replace(path, target)
        except FileNotFoundError:  # another sweep on this folder moved it first
            return
        warnings.warn(f"{path}: {reason}; moved to {target} and {then}.",
                      ResultsFolderWarning, stacklevel=4)

    def _check_config(self, estimator_repr):
        """Keep a valid ``config.json`` of this configuration and version; move any
        other aside (unreadable or invalid: ``corrupt/``, another version or
        configuration: ``foreign/``) and write ours."""
        path = self.path / "config.json"
        ours = {**self.config, **self.stamp, "repr": estimator_repr}
        then = "written again"
        if path.exists():
            try:
                theirs = _read_json_file(path)
            except (OSError, ValueError) as exc:
                self.move_aside(path, _CORRUPT, f"unreadable ({_short(exc)})", then)
            else:
                problem = _config_problem(theirs)
                if problem is not None and problem.startswith("its configuration") and (
                        {k: theirs.get(k) for k in self.stamp} != self.stamp):
                    problem = None  # another configuration's file: foreign, below
                if problem is not None:
                    self.move_aside(path, _CORRUPT, f"not a valid configuration ({problem})",
                                    then)
                elif {k: theirs[k] for k in self.stamp} == self.stamp:
                    return
                else:
                    self.move_aside(path, _FOREIGN, _foreign_reason(theirs, self.stamp), then)
        _write_json_atomic(path, ours)

    # -- records -------------------------------------------------------------------------
    def record_path(self, key):
        return self.path / f"{_FIT_PREFIX}{key}.json"

    def estimator_path(self, key):
        return self.path / f"{_EST_PREFIX}{key}.joblib"

    def read_record(self, key):
        """The record of fit ``key``, or None (a bad or foreign one is moved aside).

        The file is read strictly (:func:`read_json`) and checked: its ``fit_id`` is
        ``key``, it is stamped with this folder's configuration and version (else it
        is foreign), its fields are those of :data:`RECORD_FIELDS` and the scorers, and
        its swept parameters and seed reproduce ``key``.
        """
        path = self.record_path(key)
        try:
            row = _read_json_file(path, nonfinite=True)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.move_aside(path, _CORRUPT, f"unreadable ({_short(exc)})")
            return None
        if not isinstance(row, dict) or row.get(self.key_field) != key:
            self.move_aside(path, _CORRUPT, "not a fit record of this file name")
            return None
        if {k: row.get(k) for k in self.stamp} != self.stamp:
            self.move_aside(path, _FOREIGN, _foreign_reason(row, self.stamp))
            return None
        problem = self.record_problem(row, key)
        if problem is not None:
            self.move_aside(path, _CORRUPT, f"not a valid record of this fit ({problem})")
            return None
        return row

    def record_problem(self, row, key):
        """What makes ``row`` (a parsed record) no record of fit ``key`` in this
        folder, in words, or None."""
        config = self.config
        problem = _table_problem(row, RECORD_FIELDS, numbers=config.get("scoring", ()))
        if problem is None and "estimator" not in (self.swept or ()) and (
                row["estimator"] != config.get("estimator", row["estimator"])):
            problem = (f"field 'estimator' is {_show(row['estimator'])}, but its "
                       f"configuration is of {config['estimator']}")
        if problem is None:
            problem = _fixed_problem(row, config.get("params", {}))
        if problem is None:
            candidates = self.swept if self.swept is not None else _parameter_fields(
                row, config.get("scoring", ()), config.get("params", {}))
            problem = _key_problem(row, key, candidates, self._key_sets)
        return problem

    def _fit_row(self, record):
        """A record without its file fields: the row of the fit, as a sweep returns it."""
        return {k: v for k, v in record.items() if k not in _FILE_FIELDS}

    def read_records(self, keys):
        """``{key: record}`` of the finished fits among ``keys``."""
        rows = {}
        for key in keys:
            row = self.read_record(key)
            if row is not None:
                rows[key] = row
        return rows

    def load_estimator(self, row):
        """The saved estimator of a record, or None when there is none or it is unusable.

        Only a file whose SHA-256 matches the record's is loaded (:func:`joblib.load`
        runs code from the file: it is trusted as this folder's own); a file that does
        not match or cannot be loaded is moved to ``corrupt/`` with the record.
        """
        key = row[self.key_field]
        path = self.estimator_path(key)
        expected = row.get("estimator_sha256")
        if expected is None or not path.exists():
            if expected is not None:
                self.move_aside(self.record_path(key), _CORRUPT,
                                f"its saved estimator {path.name} is missing")
            return None
        try:
            if _file_sha256(path) != expected:
                raise ValueError("the file is not the one its record was written with")
            return joblib.load(path)
        except Exception as exc:  # noqa: BLE001 - any unpickling error means unusable
            self.move_aside(path, _CORRUPT, f"cannot be loaded ({_short(exc)})")
            self.move_aside(self.record_path(key), _CORRUPT,
                            f"its saved estimator {path.name} cannot be loaded")
            return None

    def finished(self, key, *, estimator=False, require_estimator=False):
        """``(record, estimator)`` of a finished fit; ``(None, None)`` to compute it.

        With ``estimator=True`` the saved estimator is loaded too (None when there is
        none); a fit whose estimator was moved aside, or that has none while
        ``require_estimator``, is to be computed again.
        """
        record = self.read_record(key)
        if record is None:
            return None, None
        est = self.load_estimator(record) if estimator else None
        if estimator and est is None and (require_estimator
                                          or not self.record_path(key).exists()):
            return None, None
        return self._fit_row(record), est

    def save(self, row, estimator=None):
        """Write a finished fit: the estimator first (when given), then its record (the
        row, stamped with this folder's ``config_id`` and version and the estimator
        file's SHA-256)."""
        key = row[self.key_field]
        record = {**row, **self.stamp}
        try:
            problem = self.record_problem(
                read_json(json.dumps(record, default=repr), nonfinite=True), key)
        except ValueError as exc:  # nested too deep, text that is not Unicode
            problem = str(exc)
        if problem is not None:
            raise ValueError(f"the row of fit {key!r} cannot be stored as a record its "
                             f"folder would read back: {problem}.")
        if estimator is not None:
            path = self.estimator_path(key)
            _dump_atomic(path, estimator)
            record["estimator_sha256"] = _file_sha256(path)
        _write_json_atomic(self.record_path(key), record)

    # -- claims of fits (several sweeps on one folder) -------------------------------------
    def _lock(self, key):
        from filelock import FileLock

        if key not in self._locks:
            (self.path / _LOCKS).mkdir(exist_ok=True)
            # claimed in joblib's dispatching thread, released in the main one
            self._locks[key] = FileLock(self.path / _LOCKS / f"{key}.lock",
                                        thread_local=False)
        return self._locks[key]

    def claim(self, key, *, wait=False):
        """Claim fit ``key`` for this process; False when another process holds it.

        With ``wait=True``, block until the other process releases it (finished, or
        died: the operating system releases the lock of a dead process).
        """
        from filelock import Timeout

        lock = self._lock(key)
        while True:
            try:
                lock.acquire(timeout=1.0 if wait else 0)
                return True
            except Timeout:
                if not wait:
                    return False

    def release(self, key):
        lock = self._locks.pop(key, None)
        if lock is not None:
            lock.release(force=True)

    def release_all(self):
        for key in list(self._locks):
            self.release(key)


class _KeyedFolder(RunFolder):
    """A run folder shared by the results of many configurations, without
    ``config.json``: a record is ``<stem>.json`` and an estimator ``<stem>.joblib``,
    each stem a key followed by its configuration's ``config_id``."""

    key_field = "key"

    def record_path(self, key):
        return self.path / f"{key}.json"

    def estimator_path(self, key):
        return self.path / f"{key}.joblib"

    def _fit_row(self, record):
        return {k: v for k, v in record.items()
                if k not in _FILE_FIELDS and k != self.key_field}

    def record_problem(self, row, key):
        # a result's own fields are any JSON values; the file's fields are checked
        return _table_problem(row, _KEYED_FIELDS)


class KeyedStore:
    """Results computed once per key: kept in memory and, with a folder, on disk.

    A result is a row (a dict of JSON values) and an optional fitted estimator. In
    ``folder`` each key has ``<key>-<tag>.json`` (the row, stamped with ``tag`` and the
    library version) and, with an estimator, ``<key>-<tag>.joblib`` (its SHA-256 in the
    row), written and checked as the records and estimators of a run folder (see
    :ref:`results-folders`): written atomically, computed under a lock per key (two
    processes on one folder compute a key once), files of another library version or
    unreadable ones moved aside and computed again; temporary files left by a writer
    that died are removed when the store is opened.
    ``tag`` is the digest of ``config`` and of the data: a rerun with the same
    configuration and data reads what is on disk, another configuration never does.

    Parameters
    ----------
    folder : str, path or None
        Where the results are kept; None keeps them in memory only.
    config : dict
        What the results depend on (JSON values).
    X, y : array-like, default=None
        Data the results depend on; its fingerprint joins ``config``.

    Attributes
    ----------
    tag : str
        The digest of ``config`` and the data, the end of every file name.
    n_computed : int
        Results computed by :meth:`fetch`.
    n_resumed : int
        Results read from disk by :meth:`fetch`.

    Examples
    --------
    >>> import tempfile
    >>> from minip_learn.model_selection import KeyedStore
    >>> folder = tempfile.mkdtemp()
    >>> store = KeyedStore(folder, {"power": 2})
    >>> store.fetch("x3", lambda: ({"value": 9}, None))
    ({'value': 9}, None)
    >>> rerun = KeyedStore(folder, {"power": 2})
    >>> rerun.fetch("x3", lambda: ({"value": -1}, None)), rerun.n_resumed
    (({'value': 9}, None), 1)
    """

    def __init__(self, folder, config, X=None, y=None):
        if X is not None:
            config = {"data": _data_fingerprint(X, y), **config}
        self.tag = digest(config, 10)
        self._files = None
        if folder is not None:
            self._files = _KeyedFolder(folder, config)
            check_writable(self._files.path)
            _remove_stale_temporaries(self._files.path)
        self._memory = {}
        self.n_computed = 0
        self.n_resumed = 0

    def fetch(self, key, compute):
        """The result of ``key``: from memory, from disk, or ``compute()``, saved.

        Parameters
        ----------
        key : str
            The result's name (the start of its file names).
        compute : callable
            ``compute()`` returns ``(row, estimator)``: a dict of JSON values and a
            fitted estimator or None.

        Returns
        -------
        row : dict
        estimator : estimator or None
        """
        if key not in self._memory:
            if self._files is None:
                result = compute()
                self.n_computed += 1
            else:
                result = self._fetch_file(f"{key}-{self.tag}", compute)
            self._memory[key] = result
        return self._memory[key]

    def _fetch_file(self, stem, compute):
        files = self._files
        files.claim(stem, wait=True)
        try:
            row, est = files.finished(stem, estimator=True)
            if row is not None:
                self.n_resumed += 1
                return row, est
            row, est = compute()
            files.save({**row, files.key_field: stem}, est)
            self.n_computed += 1
            return row, est
        finally:
            files.release(stem)


def _short(exc):
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


def _foreign_reason(row, stamp):
    if row.get("minip_learn_version") != stamp["minip_learn_version"]:
        theirs = row.get("minip_learn_version") or "an unknown version"
        return f"written by minip_learn {theirs}, not {stamp['minip_learn_version']}"
    return (f"written for another configuration ({row.get('config_id')}, "
            f"not {stamp['config_id']})")


def _reading_folder(path):
    """A :class:`RunFolder` for checking the records of the run folder ``path`` (its
    configuration from a valid ``config.json``, else none)."""
    config = {}
    try:
        theirs = _read_json_file(path / "config.json")
    except (OSError, ValueError):
        theirs = None
    if theirs is not None and _config_problem(theirs) is None:
        config = {k: theirs[k] for k in ("estimator", "params", "data", "scoring")}
    return RunFolder(path, config)


def load_sweep(path):
    """Read the finished fits of a run folder, or of every run folder under a root.

    Files moved aside (``corrupt/``, ``foreign/``) are not read; a record that cannot
    be read is skipped with a :class:`ResultsFolderWarning` naming it. A record that
    parses but that :func:`rank_sweep` could not have written (a declared field
    missing or of the wrong type, a score that is not a number, a ``fit_id`` other
    than its file name's, parameters and seed that do not reproduce it, a rank other
    than its configuration's; see :ref:`results-folders`) is a ValueError: its row is
    never returned. The configuration of a run folder is read from its
    ``config.json`` when that is valid.

    Parameters
    ----------
    path : str or path
        A run folder written by :func:`rank_sweep` (``out/<name>-<hash>``) or the
        ``out`` root itself (all its run folders, recursively).

    Returns
    -------
    results : pandas.DataFrame
        One row per finished fit (no duplicates: one file per fit).

    Raises
    ------
    ValueError
        ``"<file>: row '<fit_id>' is not a record rank_sweep writes: <field and
        why>."``

    Examples
    --------
    >>> import tempfile
    >>> from minip_learn.model_selection import load_sweep
    >>> load_sweep(tempfile.mkdtemp()).empty
    True
    """
    path = Path(path)
    rows = []
    folders = {}
    for f in sorted(path.rglob(f"{_FIT_PREFIX}*.json")):
        if f.parent.name in _ASIDE:
            continue
        try:
            row = _read_json_file(f, nonfinite=True)
        except (OSError, ValueError) as exc:
            warnings.warn(f"{f}: unreadable ({_short(exc)}); skipped.", ResultsFolderWarning,
                          stacklevel=2)
            continue
        key = f.stem[len(_FIT_PREFIX):]
        if f.parent not in folders:
            folders[f.parent] = _reading_folder(f.parent)
        if not isinstance(row, dict):
            problem = "not a JSON object"
        elif row.get("fit_id") != key:
            problem = (f"field 'fit_id' is {_show(row.get('fit_id'))}, not the {key!r} "
                       "of its file name")
        else:
            problem = folders[f.parent].record_problem(row, key)
        if problem is not None:
            raise ValueError(f"{f}: row {key!r} is not a record rank_sweep writes: {problem}.")
        row.setdefault("run", f.parent.name)
        rows.append(row)
    return to_frame(rows)
