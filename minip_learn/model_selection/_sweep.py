"""Rank and seed sweeps: many fits of one estimator on one finite family.

A sweep fits ``clone(estimator).set_params(**params, random_state=seed)`` on the full
set for every parameter combination and seed, scores it on the same set with
:func:`minip_learn.metrics.get_scorers` (the solving criterion is about *fitting* a
finite family, see :class:`~minip_learn.model_selection.FullSetSplit`) and collects one
tidy row per fit. It is the loop :class:`~sklearn.model_selection.GridSearchCV` runs with
``cv=FullSetSplit()``, plus what a phase-transition experiment needs on top:

* parallel fits through :class:`joblib.Parallel` (loky processes on CPU cores by
  default, any backend configured with :func:`joblib.parallel_config`, e.g. ``"dask"``
  against a :class:`dask.distributed.Client`), with torch intra-op threads capped so
  that ``n_jobs`` processes do not oversubscribe the cores;
* ``devices=``: fits assigned round-robin to torch devices (``"cuda:0"``, ``"cuda:1"``
  ...), validated up front;
* resumable results: one small JSON file per finished fit, written atomically in a run
  folder named from the configuration; a rerun skips finished fits;
* the certified bound as a hard check: a nonnegative kernel fit below the family's
  certified minimum rank that reports *solved* contradicts THEORY R5 and raises.
"""

import datetime
import hashlib
import json
import math
import numbers
import os
import re
import socket
import statistics
import time
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
from joblib import Parallel, delayed, effective_n_jobs
from sklearn.base import clone
from sklearn.metrics import check_scoring
from sklearn.model_selection import ParameterGrid
from sklearn.utils import Bunch

from .._validation import check_device
from ..metrics import get_scorers

__all__ = [
    "cv_results_to_frame",
    "load_sweep",
    "rank_sweep",
    "summarize_sweep",
]

#: columns that identify a configuration when summarising (when present)
_GROUP_COLUMNS = ("model", "estimator", "feature_map", "seq_len", "rank")
_FIT_PREFIX = "fit-"
_TMP_PREFIX = ".tmp-"
_EST_PREFIX = "est-"


# -- small helpers ------------------------------------------------------------------
def _jsonable(value):
    """A JSON-friendly version of a parameter value (numpy scalars, tuples, objects)."""
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
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return repr(value)


def _digest(obj, n=12):
    text = json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def _data_fingerprint(X, y):
    h = hashlib.sha1()
    for arr in (X, y):
        a = np.ascontiguousarray(np.asarray(arr))
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:12]


def _slug(text):
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", str(text)).strip("_")[:60]


def _fit_key(params, seed):
    """File stem of one fit: readable swept values plus a hash of the exact values."""
    parts = [f"{k}={params[k]}" for k in sorted(params)
             if isinstance(params[k], (str, numbers.Number)) and not isinstance(params[k], bool)]
    parts.append(f"seed={seed}")
    return _slug("_".join(parts)) + "_" + _digest({"params": params, "seed": seed}, 8)


def _write_json_atomic(path, obj):
    """Write ``obj`` as JSON to ``path`` so that the file either exists complete or not."""
    path = Path(path)
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, default=repr)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _dump_atomic(path, obj):
    path = Path(path)
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{os.getpid()}")
    joblib.dump(obj, tmp)
    os.replace(tmp, path)


def _remove_stale_temporaries(folder):
    """Delete temporary files left by writers that died (pid no longer alive here)."""
    for tmp in folder.glob(f"{_TMP_PREFIX}*"):
        try:
            pid = int(tmp.name.rsplit(".", 1)[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            pass  # the writer is gone: the file is stale
        except (ValueError, IndexError, PermissionError, OSError):
            continue  # not ours, or alive (maybe another sweep on the same folder)
        else:
            continue
        try:
            tmp.unlink()
        except OSError:  # pragma: no cover
            pass


def _resolve_devices(devices):
    """Validate ``devices`` and return the list of torch device strings (or None).

    ``"cuda"`` expands to every visible CUDA device. Asking for CUDA where there is none
    raises at once (before any worker starts).
    """
    if devices is None:
        return None
    import torch

    items = [devices] if isinstance(devices, str) else list(devices)
    if not items:
        raise ValueError("devices must be None, a device string or a non-empty list of them.")
    out = []
    for d in items:
        dev = torch.device(check_device(d))
        if dev.type == "cuda" and dev.index is None:  # "cuda": every visible device
            out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        else:
            out.append(str(dev))
    return out


def _assign_devices(devices, n_tasks):
    """Round-robin assignment of ``n_tasks`` fits to ``devices`` (None: no assignment)."""
    if devices is None:
        return [None] * n_tasks
    return [devices[i % len(devices)] for i in range(n_tasks)]


def _threads_per_fit(threads_per_fit, n_jobs, devices):
    if threads_per_fit is not None:
        if not isinstance(threads_per_fit, numbers.Integral) or threads_per_fit < 1:
            raise ValueError(f"threads_per_fit must be a positive int or None; got {threads_per_fit!r}.")
        return int(threads_per_fit)
    if devices is not None and all(d.startswith("cuda") for d in devices):
        return 1
    return max(1, (os.cpu_count() or 1) // max(1, effective_n_jobs(n_jobs)))


# -- one fit --------------------------------------------------------------------------
def _fit_and_score(estimator, X, y, params, seed, device, scoring, n_threads,
                   certified_min_rank, key, return_estimator, fitted=None):
    """Fit one clone on the full set and score it there; returns ``(row, estimator)``.

    ``fitted=(est, fit_time, fit_cpu_time)``: score an estimator already fitted (by an
    ensemble, whose times are shared out over its members) instead of fitting one.
    """
    import torch

    old_threads = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        if fitted is None:
            est = clone(estimator)
            set_params = dict(params)
            if seed is not None:
                set_params["random_state"] = seed
            if device is not None:
                set_params["device"] = device
            est.set_params(**set_params)
            t0, c0 = time.perf_counter(), time.process_time()
            est.fit(X, y)
            fit_time, fit_cpu_time = time.perf_counter() - t0, time.process_time() - c0
        else:
            est, fit_time, fit_cpu_time = fitted
        t0 = time.perf_counter()
        raw = check_scoring(est, scoring=scoring)(est, X, y)
        score_time = time.perf_counter() - t0
    finally:
        torch.set_num_threads(old_threads)

    scores = {}
    for name, value in raw.items():
        # scikit-learn negates error scorers; store errors as errors
        sign = getattr(scoring[name], "_sign", 1)
        scores[name] = float(value) * (1 if sign >= 0 else -1)
    if "solved" in scores:
        is_solved = bool(scores["solved"] >= 1.0)
    else:
        is_solved = bool(getattr(est, "solved_", False))

    all_params = est.get_params(deep=False)
    rank = all_params.get("rank")
    module = getattr(getattr(est, "net_", None), "module_", None)
    nonnegative = getattr(module, "nonnegative", None)
    # THEORY R4-R5 cover one head, one layer, an affine readout and a nonnegative
    # kernel; a module without the property is checked whenever it is not signed.
    theorem_applies = getattr(module, "theorem_applies", None)
    covered = nonnegative is not False if theorem_applies is None else bool(theorem_applies)
    below = None
    if certified_min_rank is not None and rank is not None:
        below = bool(rank < certified_min_rank)
        if below and is_solved and covered:
            raise RuntimeError(
                f"fit {key!r} ({type(est).__name__} rank={rank}, seed={seed}, "
                f"params={params}) reports the family solved, but its certified minimum "
                f"rank is {certified_min_rank}: no nonnegative kernel head of rank "
                f"{rank} can solve it (THEORY R5). This is a bug (in the metric, the "
                "head or the certificate); the fit is not recorded."
            )

    row = {
        "fit_id": key,
        "estimator": type(est).__name__,
        **{k: _jsonable(v) for k, v in params.items()},
        "seed": seed,
    }
    for name in ("rank", "feature_map"):
        if name in all_params and name not in row:
            row[name] = _jsonable(all_params[name])
    row.update(scores)
    row.update(
        solved=is_solved,
        n_epochs=int(getattr(est, "n_epochs_", -1)),
        train_max_error=float(getattr(est, "train_max_error_", float("nan"))),
        fit_time=fit_time,
        fit_cpu_time=fit_cpu_time,
        score_time=score_time,
        device=str(all_params.get("device", device)),
        n_threads=n_threads,
        ensemble=fitted is not None,
        nonnegative=nonnegative,
        theorem_applies=theorem_applies,
        certified_min_rank=certified_min_rank,
        below_certified_bound=below,
        host=socket.gethostname(),
        pid=os.getpid(),
        finished_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
    )
    return row, (est if return_estimator else None)


def _fit_and_score_ensemble(estimator, X, y, group, device, scoring, n_threads,
                            certified_min_rank, return_estimator):
    """Fit the fits ``group`` (``(params, seed, key)`` sharing every parameter but
    ``rank``) as one batched ensemble and score each; returns a list of
    ``(row, estimator)``. Wall and CPU times are shared out equally over the members."""
    import torch

    from ._ensemble import fit_ensemble

    common = {k: v for k, v in group[0][0].items() if k != "rank"}
    if device is not None:
        common["device"] = device
    base = clone(estimator).set_params(**common)
    members = []
    for p, s, _ in group:
        m = {"rank": p["rank"]} if "rank" in p else {}
        m["random_state"] = s
        members.append(m)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        c0 = time.process_time()
        res = fit_ensemble(base, X, y, params=members)
        cpu = time.process_time() - c0
    finally:
        torch.set_num_threads(old_threads)
    n = len(group)
    return [
        _fit_and_score(estimator, X, y, p, s, device, scoring, n_threads,
                       certified_min_rank, k, return_estimator,
                       fitted=(est, res.fit_time / n, cpu / n))
        for (p, s, k), est in zip(group, res.estimators)
    ]


def _ensemble_jobs(todo, n_jobs, device_list):
    """Group the fits that differ only in rank and seed; split groups so that at least
    as many jobs as parallel workers exist (the fits of a job form one ensemble)."""
    groups = {}
    for t in todo:
        groups.setdefault(_digest({k: v for k, v in t[0].items() if k != "rank"}), []).append(t)
    jobs = list(groups.values())
    workers = max(effective_n_jobs(n_jobs), len(device_list or ()))
    if jobs and len(jobs) < workers:
        parts = -(-workers // len(jobs))
        jobs = [[job[i] for i in idx] for job in jobs
                for idx in np.array_split(np.arange(len(job)), min(parts, len(job)))]
    return jobs


# -- the sweep ------------------------------------------------------------------------
def _build_grid(estimator, ranks, param_grid):
    if param_grid is None:
        grid = [{}]
    elif isinstance(param_grid, dict):
        grid = [dict(param_grid)]
    else:
        grid = [dict(g) for g in param_grid]
    if ranks is not None:
        ranks = [ranks] if isinstance(ranks, numbers.Integral) else list(ranks)
        if not ranks:
            raise ValueError("ranks must be a non-empty list of ints or None.")
        for g in grid:
            if "rank" in g:
                raise ValueError("give the ranks either as ranks= or in param_grid, not both.")
            g["rank"] = ranks
    valid = estimator.get_params(deep=True)
    for g in grid:
        for name in g:
            if name in ("random_state",):
                raise ValueError("seeds are swept with seeds=, not through param_grid.")
            if name not in valid:
                raise ValueError(
                    f"invalid parameter {name!r} for {type(estimator).__name__}; valid "
                    f"parameters: {sorted(valid)}."
                )
    return list(ParameterGrid(grid))


def _run_folder(out, name, estimator, X, y, swept, scoring):
    base = {k: v for k, v in estimator.get_params(deep=False).items()
            if k not in swept and k not in ("random_state", "device", "verbose")}
    config = {
        "estimator": type(estimator).__name__,
        "params": _jsonable(base),
        "data": _data_fingerprint(X, y),
        "scoring": sorted(scoring),
    }
    stem = _slug(name) if name else type(estimator).__name__
    return Path(out) / f"{stem}-{_digest(config, 10)}", config


def _read_rows(folder):
    rows = []
    for path in sorted(Path(folder).glob(f"{_FIT_PREFIX}*.json")):
        with open(path) as fh:
            rows.append(json.load(fh))
    return rows


def rank_sweep(
    estimator,
    X,
    y,
    *,
    ranks=None,
    seeds=(0, 1, 2),
    param_grid=None,
    scoring=None,
    certified_min_rank=None,
    n_jobs=None,
    threads_per_fit=1,
    devices=None,
    out=None,
    name=None,
    tags=None,
    return_estimators=False,
    save_estimators=False,
    progress=True,
    ensemble=False,
):
    """Fit an estimator for every rank (and other parameter) and seed, on the full set.

    Each fit clones ``estimator``, sets ``rank``, the other swept parameters and
    ``random_state=seed``, fits on ``(X, y)`` and is scored there with
    :func:`~minip_learn.metrics.get_scorers` (the question for a finite family is
    whether a model *can* fit it exactly). This is what
    ``GridSearchCV(estimator, {"rank": ranks, "random_state": seeds},
    cv=FullSetSplit(), scoring=get_scorers(), refit=False)`` computes (see
    :func:`cv_results_to_frame` for that path), plus resumable on-disk results, device
    assignment, a progress bar and the certified-bound check.

    Parameters
    ----------
    estimator : estimator object
        Unfitted, e.g. :class:`~minip_learn.KernelAttentionRegressor`. It must accept
        ``random_state`` (and ``device`` when ``devices`` is given).
    X : array-like of shape (n_samples, seq_len, n_bits)
        The family of sequences.
    y : array-like of shape (n_samples, seq_len)
        Its targets.
    ranks : int or list of int, default=None
        Values of ``rank``; None leaves ``rank`` alone (e.g. for a softmax head).
    seeds : list of int, default=(0, 1, 2)
        Values of ``random_state``; one fit per seed and parameter combination.
    param_grid : dict or list of dicts, default=None
        Further parameters to sweep, as for :class:`~sklearn.model_selection.GridSearchCV`
        (e.g. ``{"feature_map": ["table", "elu+1"]}``).
    scoring : dict of scorers, default=None
        Multi-metric scoring; None uses :func:`~minip_learn.metrics.get_scorers`. Error
        scorers (negated by scikit-learn) are stored as positive errors.
    certified_min_rank : int, default=None
        The family's certified minimum rank (THEORY R5). A fit of a nonnegative kernel
        head with ``rank`` below it that reports *solved* raises :class:`RuntimeError`
        and is not recorded. Only models the theorem covers are checked (the module's
        ``theorem_applies``: one head, one layer, affine readout, nonnegative kernel);
        signed kernels, several heads or layers, MLP readouts and classifiers are
        variants outside it (THEORY R7) and are recorded, with ``theorem_applies``
        False in their row.
    n_jobs : int, default=None
        Number of parallel fits (:class:`joblib.Parallel`; ``-1``: all cores). The
        backend is joblib's default (loky processes) unless one is configured with
        :func:`joblib.parallel_config`, e.g. ``backend="dask"`` with a
        ``dask.distributed.Client``.
    threads_per_fit : int or None, default=1
        Torch intra-op threads in each fit. The heads are small: a sweep gains by
        running fits side by side (``n_jobs``), and intra-op threads only add
        contention. None uses ``cpu_count // n_jobs`` (no oversubscription either way).
    devices : str or list of str, default=None
        Torch devices for the fits: ``"cpu"``, ``"cuda"`` (every visible GPU), or a list
        such as ``["cuda:0", "cuda:1"]``; fits are assigned round-robin. None keeps the
        estimator's own ``device``. Asking for CUDA where there is none raises
        :class:`ValueError` at once.
    out : str or path, default=None
        Root folder for results. Each sweep writes into a run folder
        ``out/<name>-<hash of the configuration>`` one JSON file per finished fit
        (atomically: a file exists only complete). Rerunning with the same ``out``
        resumes: finished fits are read back, not recomputed; a grid extended with more
        ranks or seeds reuses the fits it shares. None keeps everything in memory.
    name : str, default=None
        Prefix of the run folder (default: the estimator's class name).
    tags : dict, default=None
        Constant columns added to every row (e.g. ``{"model": "kernel"}``).
    return_estimators : bool, default=False
        Also return the fitted estimators: those computed in this call, and those of
        resumed fits that were saved with ``save_estimators=True``.
    save_estimators : bool, default=False
        With ``out``, also store each fitted estimator (:func:`joblib.dump`, file
        ``est-<fit_id>.joblib``, written before the fit's row).
    progress : bool, default=True
        Show a :mod:`tqdm` progress bar over fits.
    ensemble : bool, default=False
        Train the fits that share every swept parameter except ``rank`` and the seed
        as one batched model (:func:`~minip_learn.model_selection.fit_ensemble`; needs
        full-batch training, ``batch_size=None``): same results up to floating-point
        rounding, several times cheaper per fit for small heads. Such groups are split
        only to keep ``n_jobs`` workers (or ``devices``) busy. Rows are the same, one per
        fit, with the same ``fit_id`` (resuming mixes both modes); the column
        ``ensemble`` says how a fit was trained, and its ``fit_time`` and
        ``fit_cpu_time`` are the ensemble's divided by its number of fits.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``results``: :class:`pandas.DataFrame`, one row per fit of the grid (swept
        parameters, ``seed``, ``feature_map``, the scores ``exact_match``,
        ``token_accuracy``, ``solved``, ``max_abs_error``, ``n_epochs``, ``fit_time`` (wall),
        ``fit_cpu_time``,
        ``device``, ...); ``summary``: :func:`summarize_sweep` of it; ``path``: the run
        folder (or None); ``n_computed`` and ``n_resumed``: fits computed in this call
        and read back from disk; ``config``; ``estimators``: ``{fit_id: estimator}``
        (only with ``return_estimators=True``).

    Raises
    ------
    RuntimeError
        When a nonnegative kernel fit below ``certified_min_rank`` reports solved.

    See Also
    --------
    summarize_sweep : Solved fraction per rank with a confidence interval.
    cv_results_to_frame : The same table from a ``GridSearchCV`` run.
    minip_learn.plotting.plot_phase_transition : Plot the summary.

    Examples
    --------
    >>> from minip_learn import KernelAttentionRegressor
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.model_selection import rank_sweep
    >>> X, y = make_minip(32, seq_len=2, n_bits=6, random_state=0)
    >>> est = KernelAttentionRegressor(max_epochs=50, stop_tolerance=0.5)
    >>> res = rank_sweep(est, X, y, ranks=[2, 4], seeds=[0, 1], progress=False)
    >>> res.results[["rank", "seed", "solved"]].shape
    (4, 3)
    >>> res.summary[["rank", "n_fits"]].to_dict("list")
    {'rank': [2, 4], 'n_fits': [2, 2]}
    """
    from tqdm.auto import tqdm

    if save_estimators and out is None:
        raise ValueError("save_estimators=True needs an output folder out=.")
    scoring = get_scorers() if scoring is None else dict(scoring)
    if not scoring:
        raise ValueError("scoring must be None or a non-empty dict of scorers.")
    if "random_state" not in estimator.get_params(deep=False):
        raise ValueError(f"{type(estimator).__name__} has no random_state parameter to seed.")
    seeds = [seeds] if seeds is None or isinstance(seeds, numbers.Integral) else list(seeds)
    if not seeds:
        raise ValueError("seeds must be a non-empty list of ints.")
    for s in seeds:
        if s is not None and not isinstance(s, numbers.Integral):
            raise ValueError(f"seeds must be ints (or None); got {s!r}.")
    seeds = [None if s is None else int(s) for s in seeds]
    if certified_min_rank is not None:
        certified_min_rank = int(certified_min_rank)
    combos = _build_grid(estimator, ranks, param_grid)
    device_list = _resolve_devices(devices)
    if device_list is not None and "device" not in estimator.get_params(deep=False):
        raise ValueError(f"{type(estimator).__name__} has no device parameter; devices= needs one.")
    X = np.asarray(X)
    y = np.asarray(y)
    tags = dict(tags or {})

    tasks = [(p, s, _fit_key(p, s)) for p in combos for s in seeds]
    keys = [k for _, _, k in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("the parameter grid or the seeds contain duplicates.")
    swept = set().union(*combos)

    folder, config = None, None
    done = {}
    if out is not None:
        folder, config = _run_folder(out, name, estimator, X, y, swept, scoring)
        folder.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(folder)
        cfg_path = folder / "config.json"
        if not cfg_path.exists():
            _write_json_atomic(cfg_path, {**config, "repr": repr(estimator)})
        wanted = set(keys)
        for row in _read_rows(folder):
            if row.get("fit_id") in wanted:
                done[row["fit_id"]] = row
    todo = [t for t in tasks if t[2] not in done]

    n_threads = _threads_per_fit(threads_per_fit, n_jobs, device_list)
    assigned = _assign_devices(device_list, len(todo))
    new_rows, estimators = {}, {}
    bar = tqdm(total=len(tasks), initial=len(done), unit="fit", disable=not progress,
               desc=name or type(estimator).__name__)
    try:
        if todo:
            parallel = Parallel(n_jobs=n_jobs, return_as="generator_unordered")
            keep = return_estimators or save_estimators
            if ensemble:
                jobs = _ensemble_jobs(todo, n_jobs, device_list)
                batches = parallel(
                    delayed(_fit_and_score_ensemble)(estimator, X, y, job, dev, scoring,
                                                     n_threads, certified_min_rank, keep)
                    for job, dev in zip(jobs, _assign_devices(device_list, len(jobs))))
                results = (pair for batch in batches for pair in batch)
            else:
                results = parallel(
                    delayed(_fit_and_score)(estimator, X, y, p, s, dev, scoring, n_threads,
                                            certified_min_rank, k, keep)
                    for (p, s, k), dev in zip(todo, assigned)
                )
            for row, est in results:
                row.update({k: _jsonable(v) for k, v in tags.items() if k not in row})
                if folder is not None:
                    if save_estimators:
                        _dump_atomic(folder / f"{_EST_PREFIX}{row['fit_id']}.joblib", est)
                    _write_json_atomic(folder / f"{_FIT_PREFIX}{row['fit_id']}.json", row)
                new_rows[row["fit_id"]] = row
                if return_estimators:
                    estimators[row["fit_id"]] = est
                bar.update(1)
    finally:
        bar.close()

    rows = []
    for _, _, k in tasks:
        row = dict(done.get(k) or new_rows[k])
        row.update({t: _jsonable(v) for t, v in tags.items() if t not in row})
        rows.append(row)
    results = _to_frame(rows)
    results.attrs["param_names"] = sorted(swept)
    result = Bunch(
        results=results,
        summary=summarize_sweep(results),
        path=folder,
        n_computed=len(new_rows),
        n_resumed=len(done),
        config=config,
    )
    if return_estimators:
        if folder is not None:
            for k in done:
                path = folder / f"{_EST_PREFIX}{k}.joblib"
                if path.exists():
                    estimators[k] = joblib.load(path)
        result.estimators = estimators
    return result


def _to_frame(rows):
    df = pd.DataFrame(rows)
    for col in ("solved", "below_certified_bound", "nonnegative", "theorem_applies"):
        if col in df and df[col].notna().all():
            df[col] = df[col].astype(bool)
    return df


def load_sweep(path):
    """Read the finished fits of a run folder, or of every run folder under a root.

    Parameters
    ----------
    path : str or path
        A run folder written by :func:`rank_sweep` (``out/<name>-<hash>``) or the
        ``out`` root itself (all its run folders, recursively).

    Returns
    -------
    results : pandas.DataFrame
        One row per finished fit (no duplicates: one file per fit).

    Examples
    --------
    >>> import tempfile
    >>> from minip_learn.model_selection import load_sweep
    >>> load_sweep(tempfile.mkdtemp()).empty
    True
    """
    path = Path(path)
    rows = []
    for f in sorted(path.rglob(f"{_FIT_PREFIX}*.json")):
        with open(f) as fh:
            row = json.load(fh)
        row.setdefault("run", f.parent.name)
        rows.append(row)
    return _to_frame(rows)


# -- summaries ------------------------------------------------------------------------
def _wilson(k, n, confidence):
    if n == 0:
        return float("nan"), float("nan")
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    p = k / n
    den = 1 + z * z / n
    center = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, center - half), min(1.0, center + half)


def summarize_sweep(results, *, by=None, confidence=0.95):
    """Solved fraction (with a Wilson confidence interval) and mean scores per setting.

    Parameters
    ----------
    results : pandas.DataFrame
        Rows of fits, as in ``rank_sweep(...).results`` or :func:`load_sweep`.
    by : list of str, default=None
        Grouping columns. None uses those present among ``model``, ``estimator``,
        ``feature_map``, ``seq_len``, ``rank`` and the swept parameters recorded in
        ``results.attrs["param_names"]``. Missing values (e.g. the rank of a softmax
        head) form their own group.
    confidence : float, default=0.95
        Level of the Wilson score interval of the solved fraction.

    Returns
    -------
    summary : pandas.DataFrame
        One row per group: ``n_fits``, ``n_solved``, ``solved_fraction``,
        ``solved_ci_low``, ``solved_ci_high``, ``exact_match_mean``,
        ``exact_match_std``, ``token_accuracy_mean``, ``max_abs_error_median``,
        ``n_epochs_mean``, ``fit_time_mean`` (those whose columns exist) and
        ``certified_min_rank``.

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.model_selection import summarize_sweep
    >>> df = pd.DataFrame({"rank": [4, 4, 32, 32], "solved": [False, False, True, True],
    ...                    "exact_match": [0.5, 0.6, 1.0, 1.0]})
    >>> summarize_sweep(df)[["rank", "solved_fraction", "exact_match_mean"]]
       rank  solved_fraction  exact_match_mean
    0     4              0.0              0.55
    1    32              1.0              1.00
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence!r}.")
    df = results
    if by is None:
        params = list(getattr(df, "attrs", {}).get("param_names", []))
        by = [c for c in _GROUP_COLUMNS if c in df] + [
            c for c in params if c in df and c not in _GROUP_COLUMNS]
    by = list(by)
    missing = [c for c in by if c not in df]
    if missing:
        raise ValueError(f"grouping columns {missing} are not in the results.")
    if df.empty or "solved" not in df:
        cols = by + ["n_fits", "n_solved", "solved_fraction", "solved_ci_low", "solved_ci_high"]
        return pd.DataFrame(columns=cols)
    out = []
    groups = df.groupby(by, dropna=False, sort=True) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        n = len(g)
        k = int(g["solved"].astype(bool).sum())
        lo, hi = _wilson(k, n, confidence)
        row = dict(zip(by, key))
        row.update(n_fits=n, n_solved=k, solved_fraction=k / n, solved_ci_low=lo,
                   solved_ci_high=hi)
        if "exact_match" in g:
            row["exact_match_mean"] = float(g["exact_match"].mean())
            row["exact_match_std"] = float(g["exact_match"].std(ddof=0))
        if "token_accuracy" in g:
            row["token_accuracy_mean"] = float(g["token_accuracy"].mean())
        if "max_abs_error" in g:
            row["max_abs_error_median"] = float(g["max_abs_error"].median())
        if "n_epochs" in g:
            row["n_epochs_mean"] = float(g["n_epochs"].mean())
        if "fit_time" in g:
            row["fit_time_mean"] = float(g["fit_time"].mean())
        if "certified_min_rank" in g and g["certified_min_rank"].notna().any():
            row["certified_min_rank"] = int(g["certified_min_rank"].dropna().iloc[0])
        out.append(row)
    summary = pd.DataFrame(out)
    if "rank" in summary and summary["rank"].notna().all():
        summary["rank"] = summary["rank"].astype(int)
    return summary


def cv_results_to_frame(cv_results, *, scoring=None):
    """Tidy per-fit rows from ``GridSearchCV(..., cv=FullSetSplit()).cv_results_``.

    The plain scikit-learn path to a sweep: put ``rank`` and ``random_state`` in the
    parameter grid, use :class:`~minip_learn.model_selection.FullSetSplit` as ``cv``,
    :func:`~minip_learn.metrics.get_scorers` as ``scoring`` and ``refit=False``; this
    function turns the result into the same table as :func:`rank_sweep` (one row per
    candidate and split, ``random_state`` renamed ``seed``, error scores un-negated) so
    that :func:`summarize_sweep` and the plots apply.

    Parameters
    ----------
    cv_results : dict
        The ``cv_results_`` attribute of a fitted search.
    scoring : dict of scorers, default=None
        The scoring the search used (for the signs); None means
        :func:`~minip_learn.metrics.get_scorers`.

    Returns
    -------
    results : pandas.DataFrame

    Examples
    --------
    >>> from sklearn.model_selection import GridSearchCV
    >>> from minip_learn import KernelAttentionRegressor
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.metrics import get_scorers
    >>> from minip_learn.model_selection import FullSetSplit, cv_results_to_frame
    >>> X, y = make_minip(32, seq_len=2, n_bits=6, random_state=0)
    >>> search = GridSearchCV(
    ...     KernelAttentionRegressor(max_epochs=20),
    ...     {"rank": [2, 4], "random_state": [0]}, cv=FullSetSplit(),
    ...     scoring=get_scorers(), refit=False).fit(X, y)
    >>> df = cv_results_to_frame(search.cv_results_)
    >>> df[["rank", "seed"]].to_dict("list")
    {'rank': [2, 4], 'seed': [0, 0]}
    """
    scoring = get_scorers() if scoring is None else dict(scoring)
    params = cv_results["params"]
    n_splits = len([k for k in cv_results if re.fullmatch(r"split\d+_test_.+", k)
                    and k.endswith("_" + next(iter(scoring)))]) or 1
    rows = []
    for i, p in enumerate(params):
        for split in range(n_splits):
            row = {("seed" if k == "random_state" else k): _jsonable(v) for k, v in p.items()}
            row["split"] = split
            for name, scorer in scoring.items():
                col = f"split{split}_test_{name}"
                if col in cv_results:
                    sign = getattr(scorer, "_sign", 1)
                    row[name] = float(cv_results[col][i]) * (1 if sign >= 0 else -1)
            if "solved" in row:
                row["solved"] = bool(row["solved"] >= 1.0)
            row["fit_time"] = float(cv_results["mean_fit_time"][i])
            row["score_time"] = float(cv_results["mean_score_time"][i])
            rows.append(row)
    df = _to_frame(rows)
    df.attrs["param_names"] = sorted({("seed" if k == "random_state" else k)
                                      for p in params for k in p} - {"seed"})
    return df
