"""The on-disk results of a sweep: one run folder per configuration, one file per fit.

A run folder ``<out>/<name>-<config id>`` holds

* ``config.json`` -- the configuration (estimator class and fixed parameters, data
  fingerprint, scorers), its ``config_id`` and the library version that wrote it;
* ``fit-<fit_id>.json`` -- one record per finished fit, stamped with the same
  ``config_id`` and version, written atomically (a record exists complete or not at
  all);
* ``est-<fit_id>.safetensors`` -- the fitted estimator, when saved
  (:func:`~minip_learn.estimators.save_estimator`: parameters as JSON, weights as
  safetensors; loading it runs no code from the file); its SHA-256 is in the record,
  and it is loaded only through a record of this configuration;
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

import json
import os
import time
import warnings
from pathlib import Path

from .._io import HOST_TAG as _HOST_TAG
from .._io import TMP_PREFIX as _TMP_PREFIX
from .._io import write_atomic
from ..estimators import load_estimator, save_estimator
from ._records import (
    KEYED_FIELDS,
    RECORD_FIELDS,
    config_problem,
    fixed_problem,
    key_problem,
    parameter_fields,
    read_json,
    read_json_file,
    show_value,
    table_problem,
)
from ._values import (
    data_fingerprint,
    digest,
    file_sha256,
    jsonable,
    library_version,
    slug,
    to_frame,
)

__all__ = ["KeyedStore", "ResultsFolderWarning", "check_writable", "load_sweep"]

_FIT_PREFIX = "fit-"
_EST_PREFIX = "est-"
_EST_SUFFIX = ".safetensors"
#: the suffix of the estimators that earlier versions pickled: never loaded
_PICKLE_SUFFIX = ".joblib"
_LOCKS = ".locks"
_CORRUPT = "corrupt"
_FOREIGN = "foreign"
#: subfolders of a run folder that hold no live results
_ASIDE = (_CORRUPT, _FOREIGN, _LOCKS)
#: fields of a record on disk that are about the file, not the fit
_FILE_FIELDS = ("config_id", "minip_learn_version", "estimator_sha256")


class ResultsFolderWarning(UserWarning):
    """A file of a results folder was unreadable or foreign and was moved aside.

    The message names the file and where it went; the fit it held is computed again.

    Examples
    --------
    >>> from minip_learn.model_selection import ResultsFolderWarning
    >>> issubclass(ResultsFolderWarning, UserWarning)
    True
    """


# -- atomic writes (temporary file, then rename: minip_learn._io) ---------------------------
def _write_json_atomic(path, obj):
    """Write ``obj`` as JSON to ``path`` atomically (flushed to disk before the move)."""
    def write(tmp):
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=1, default=repr)
            fh.flush()
            os.fsync(fh.fileno())

    write_atomic(path, write)


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
        "data": data_fingerprint(X, y),
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
        self.version = library_version()
        self.swept = None if swept is None else frozenset(swept)
        self._locks = {}
        self._key_sets = []  # the sets of fields found to be a record's parameters

    @classmethod
    def open(cls, out, name, estimator, X, y, swept, scoring):
        """Create (or reopen) the run folder of this configuration under ``out``."""
        config = _folder_config(estimator, X, y, swept, scoring)
        stem = slug(name) if name else type(estimator).__name__
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
                theirs = read_json_file(path)
            except (OSError, ValueError) as exc:
                self.move_aside(path, _CORRUPT, f"unreadable ({_short(exc)})", then)
            else:
                problem = config_problem(theirs)
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
        return self.path / f"{_EST_PREFIX}{key}{_EST_SUFFIX}"

    def read_record(self, key):
        """The record of fit ``key``, or None (a bad or foreign one is moved aside).

        The file is read strictly (:func:`read_json`) and checked: its ``fit_id`` is
        ``key``, it is stamped with this folder's configuration and version (else it
        is foreign), its fields are those of :data:`RECORD_FIELDS` and the scorers, and
        its swept parameters and seed reproduce ``key``.
        """
        path = self.record_path(key)
        try:
            row = read_json_file(path, nonfinite=True)
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
        problem = table_problem(row, RECORD_FIELDS, numbers=config.get("scoring", ()))
        if problem is None and "estimator" not in (self.swept or ()) and (
                row["estimator"] != config.get("estimator", row["estimator"])):
            problem = (f"field 'estimator' is {show_value(row['estimator'])}, but its "
                       f"configuration is of {config['estimator']}")
        if problem is None:
            problem = fixed_problem(row, config.get("params", {}))
        if problem is None:
            candidates = self.swept if self.swept is not None else parameter_fields(
                row, config.get("scoring", ()), config.get("params", {}))
            problem = key_problem(row, key, candidates, self._key_sets)
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

        Only a file whose SHA-256 matches the record's is loaded, by
        :func:`~minip_learn.estimators.load_estimator` (which runs no code from the
        file); a file that does not match or cannot be loaded is moved to ``corrupt/``
        with the record. A pickled estimator of an earlier version is never loaded: it
        is moved to ``corrupt/`` with its record, and the fit is computed again.
        """
        key = row[self.key_field]
        path = self.estimator_path(key)
        expected = row.get("estimator_sha256")
        if expected is None or not path.exists():
            pickled = path.with_suffix(_PICKLE_SUFFIX)
            if expected is not None and pickled.exists():
                self.move_aside(pickled, _CORRUPT,
                                "a pickle, which this version of the library never loads")
            if expected is not None:
                self.move_aside(self.record_path(key), _CORRUPT,
                                f"its saved estimator {path.name} is missing")
            return None
        try:
            if file_sha256(path) != expected:
                raise ValueError("the file is not the one its record was written with")
            return load_estimator(path)
        except Exception as exc:  # noqa: BLE001 - any loading error means unusable
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
            save_estimator(estimator, path)
            record["estimator_sha256"] = file_sha256(path)
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
    ``config.json``: a record is ``<stem>.json`` and an estimator ``<stem>.safetensors``,
    each stem a key followed by its configuration's ``config_id``."""

    key_field = "key"

    def record_path(self, key):
        return self.path / f"{key}.json"

    def estimator_path(self, key):
        return self.path / f"{key}{_EST_SUFFIX}"

    def _fit_row(self, record):
        return {k: v for k, v in record.items()
                if k not in _FILE_FIELDS and k != self.key_field}

    def record_problem(self, row, key):
        # a result's own fields are any JSON values; the file's fields are checked
        return table_problem(row, KEYED_FIELDS)


class KeyedStore:
    """Results computed once per key: kept in memory and, with a folder, on disk.

    A result is a row (a dict of JSON values) and an optional fitted estimator. In
    ``folder`` each key has ``<key>-<tag>.json`` (the row, stamped with ``tag`` and the
    library version) and, with an estimator, ``<key>-<tag>.safetensors`` (its SHA-256 in the
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
            config = {"data": data_fingerprint(X, y), **config}
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
        theirs = read_json_file(path / "config.json")
    except (OSError, ValueError):
        theirs = None
    if theirs is not None and config_problem(theirs) is None:
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
            row = read_json_file(f, nonfinite=True)
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
            problem = (f"field 'fit_id' is {show_value(row.get('fit_id'))}, not the {key!r} "
                       "of its file name")
        else:
            problem = folders[f.parent].record_problem(row, key)
        if problem is not None:
            raise ValueError(f"{f}: row {key!r} is not a record rank_sweep writes: {problem}.")
        row.setdefault("run", f.parent.name)
        rows.append(row)
    return to_frame(rows)
