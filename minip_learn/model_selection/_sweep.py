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
  folder named from the configuration; a rerun skips finished fits, several sweeps on
  one folder share its fits, and unreadable or foreign files are moved aside and
  refitted (:mod:`minip_learn.model_selection._store`, and the docs page "Results
  folders and failures");
* the certified bound as a hard check: a nonnegative kernel fit below the family's
  certified minimum rank that reports *solved* contradicts the bound (see
  :ref:`theory-r5`) and raises.
"""

import numbers

import numpy as np
from sklearn.model_selection import ParameterGrid
from sklearn.utils import Bunch

from ..metrics import get_scorers
from ._execution import resolve_devices, resolve_threads_per_fit, run_fits
from ._store import RunFolder, fit_key, jsonable, to_frame
from ._summary import summarize_sweep

__all__ = ["rank_sweep"]


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
        The family's certified minimum rank (see :ref:`theory-r5`). A fit of a nonnegative kernel
        head with ``rank`` below it that reports *solved* raises :class:`RuntimeError`
        and is not recorded. Only models the theorem covers are checked (the module's
        ``theorem_applies``: one head, one layer, affine readout, nonnegative kernel);
        signed kernels, several heads or layers, MLP readouts and classifiers are
        variants outside it (see :ref:`theory-r7`) and are recorded, with ``theorem_applies``
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
        ranks or seeds reuses the fits it shares. Sweeps running at once on one folder
        claim each fit with a lock file and share the work. A record or saved
        estimator that cannot be read, or a record of another library version or
        configuration, is moved to ``corrupt/`` or ``foreign/`` with a
        :class:`~minip_learn.model_selection.ResultsFolderWarning` naming it, and the
        fit is computed again. The folder must be writable: checked before any fit.
        None keeps everything in memory.
    name : str, default=None
        Prefix of the run folder (default: the estimator's class name).
    tags : dict, default=None
        Constant columns added to every row (e.g. ``{"model": "kernel"}``).
    return_estimators : bool, default=False
        Also return the fitted estimators: those computed in this call, and those of
        resumed fits that were saved with ``save_estimators=True``. Loading a saved
        estimator runs :func:`joblib.load`, which can execute code from the file: only
        files whose SHA-256 matches the record this configuration wrote are loaded, and
        a results folder must be trusted as much as a script.
    save_estimators : bool, default=False
        With ``out``, also store each fitted estimator (:func:`joblib.dump`, file
        ``est-<fit_id>.joblib``, written before the fit's row, which records its
        SHA-256). With ``return_estimators`` too, a resumed fit whose estimator is
        missing or cannot be loaded is fitted again.
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
    ValueError
        For bad parameters, or an output folder that cannot be created or written
        (before any fit starts).
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
    device_list = resolve_devices(devices)
    if device_list is not None and "device" not in estimator.get_params(deep=False):
        raise ValueError(f"{type(estimator).__name__} has no device parameter; devices= needs one.")
    X = np.asarray(X)
    y = np.asarray(y)
    tags = {k: jsonable(v) for k, v in (tags or {}).items()}

    tasks = [(p, s, fit_key(p, s)) for p in combos for s in seeds]
    keys = [k for _, _, k in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("the parameter grid or the seeds contain duplicates.")
    swept = set().union(*combos)
    folder = None if out is None else RunFolder.open(out, name, estimator, X, y, swept,
                                                     scoring)
    n_threads = resolve_threads_per_fit(threads_per_fit, n_jobs, device_list)
    keep = return_estimators or save_estimators
    done, new_rows, estimators = {}, {}, {}
    bar = tqdm(total=len(tasks), unit="fit", disable=not progress,
               desc=name or type(estimator).__name__)
    pending = tasks
    try:
        while pending:
            if folder is not None:  # finished fits, by an earlier or a concurrent run
                for _, _, key in pending:
                    row, est = folder.finished(key, estimator=return_estimators,
                                               require_estimator=save_estimators)
                    if row is not None:
                        done[key] = row
                        bar.update(1)
                    if est is not None:
                        estimators[key] = est
            todo = [t for t in pending if t[2] not in done]
            elsewhere = []

            def claim(task, elsewhere=elsewhere):
                # a fit is computed by the one run holding its lock; the others wait
                if folder.claim(task[2]):
                    if not folder.record_path(task[2]).exists():
                        return True
                    folder.release(task[2])  # finished meanwhile: read it next round
                elsewhere.append(task)
                return False

            results = run_fits(estimator, X, y, todo, scoring=scoring, n_jobs=n_jobs,
                               devices=device_list, n_threads=n_threads,
                               certified_min_rank=certified_min_rank, keep=keep,
                               ensemble=ensemble, claim=None if folder is None else claim)
            try:
                for row, est in results:
                    row.update({k: v for k, v in tags.items() if k not in row})
                    if folder is not None:
                        folder.save(row, est if save_estimators else None)
                        folder.release(row["fit_id"])
                    new_rows[row["fit_id"]] = row
                    if return_estimators:
                        estimators[row["fit_id"]] = est
                    bar.update(1)
            finally:
                results.close()  # on an error or Ctrl-C: stop the workers now
            for _, _, key in elsewhere:  # wait for the other run to finish (or die)
                folder.claim(key, wait=True)
                folder.release(key)
            pending = elsewhere
    finally:
        bar.close()
        if folder is not None:
            folder.release_all()

    rows = []
    for _, _, k in tasks:
        row = dict(done.get(k) or new_rows[k])
        row.update({t: v for t, v in tags.items() if t not in row})
        rows.append(row)
    results = to_frame(rows)
    results.attrs["param_names"] = sorted(swept)
    result = Bunch(
        results=results,
        summary=summarize_sweep(results),
        path=None if folder is None else folder.path,
        n_computed=len(new_rows),
        n_resumed=len(done),
        config=None if folder is None else folder.config,
    )
    if return_estimators:
        result.estimators = {k: estimators[k] for k in keys if k in estimators}
    return result
