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
from dataclasses import dataclass

import numpy as np
from sklearn.model_selection import ParameterGrid
from sklearn.utils import Bunch

from .._validation import check_int, check_seeds
from ..compact import is_compact
from ..metrics import get_scorers
from ._execution import CertifiedRank, resolve_devices, resolve_threads_per_fit, run_fits
from ._store import RunFolder
from ._summary import summarize_sweep
from ._values import fit_key, jsonable, to_frame

__all__ = ["rank_sweep"]


def _build_grid(estimator, ranks, param_grid):
    """The parameter combinations of a sweep: ``param_grid`` with ``rank`` set to
    ``ranks``, each name checked against ``estimator``'s parameters."""
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


@dataclass(frozen=True)
class _SweepConfig:
    """The checked settings of one :func:`rank_sweep` call.

    Built by :meth:`from_keywords` from the keywords of :func:`rank_sweep` (described
    there), which checks them all before any folder is created or any fit starts; the
    steps of the sweep read their settings here.

    Parameters
    ----------
    estimator : estimator object
        The unfitted template of every fit.
    tasks : tuple of (dict, int or None, str)
        One ``(params, seed, fit_id)`` per fit, parameter combinations outer and seeds
        inner: the order of the result rows.
    swept : frozenset of str
        Names of the swept parameters (``rank`` among them when swept).
    scoring : dict of scorers
        The multi-metric scoring.
    certified_min_rank : int or None
        The family's certified minimum rank.
    n_jobs : int or None
        Parallel fits, as for :class:`joblib.Parallel`.
    n_threads : int
        Torch intra-op threads per fit (see :func:`resolve_threads_per_fit`).
    devices : list of str or None
        The resolved torch devices (see :func:`resolve_devices`).
    out : str or path or None
        Root folder of the run folders.
    name : str or None
        Prefix of the run folder.
    tags : dict
        Constant columns, as JSON values.
    return_estimators, save_estimators, progress, ensemble : bool
        As in :func:`rank_sweep`.
    """

    estimator: object
    tasks: tuple
    swept: frozenset
    scoring: dict
    certified_min_rank: int | None
    n_jobs: int | None
    n_threads: int
    devices: list | None
    out: object
    name: str | None
    tags: dict
    return_estimators: bool
    save_estimators: bool
    progress: bool
    ensemble: bool

    @classmethod
    def from_keywords(cls, estimator, *, ranks, seeds, param_grid, scoring,
                      certified_min_rank, n_jobs, threads_per_fit, devices, out, name, tags,
                      return_estimators, save_estimators, progress, ensemble):
        """Check the keywords of :func:`rank_sweep` and build its configuration.

        Raises
        ------
        ValueError
            For any bad keyword, as :func:`rank_sweep` documents.
        """
        if save_estimators and out is None:
            raise ValueError("save_estimators=True needs an output folder out=.")
        scoring = get_scorers() if scoring is None else dict(scoring)
        if not scoring:
            raise ValueError("scoring must be None or a non-empty dict of scorers.")
        own = estimator.get_params(deep=False)
        if "random_state" not in own:
            raise ValueError(f"{type(estimator).__name__} has no random_state parameter to seed.")
        seeds = check_seeds(seeds)
        positional = bool(getattr(certified_min_rank, "positional", False))
        certified_min_rank = getattr(certified_min_rank, "certified_min_rank",
                                     certified_min_rank)
        certified_min_rank = check_int(certified_min_rank, "certified_min_rank", min_value=0,
                                       allow_none=True)
        if certified_min_rank is not None:
            certified_min_rank = CertifiedRank(certified_min_rank, positional)
        combos = _build_grid(estimator, ranks, param_grid)
        devices = resolve_devices(devices)
        if devices is not None and "device" not in own:
            raise ValueError(
                f"{type(estimator).__name__} has no device parameter; devices= needs one.")
        n_jobs = check_int(n_jobs, "n_jobs", allow_none=True)
        if n_jobs == 0:
            raise ValueError("n_jobs must be None, -1 (all cores) or a nonzero int; got 0.")
        tasks = tuple((p, s, fit_key(p, s)) for p in combos for s in seeds)
        if len({key for _, _, key in tasks}) != len(tasks):
            raise ValueError("the parameter grid or the seeds contain duplicates.")
        return cls(
            estimator=estimator,
            tasks=tasks,
            swept=frozenset().union(*combos),
            scoring=scoring,
            certified_min_rank=certified_min_rank,
            n_jobs=n_jobs,
            n_threads=resolve_threads_per_fit(threads_per_fit, n_jobs, devices),
            devices=devices,
            out=out,
            name=name,
            tags={k: jsonable(v) for k, v in (tags or {}).items()},
            return_estimators=bool(return_estimators),
            save_estimators=bool(save_estimators),
            progress=bool(progress),
            ensemble=bool(ensemble),
        )

    @property
    def keys(self):
        """The ``fit_id`` of every task, in the order of the result rows."""
        return [key for _, _, key in self.tasks]

    @property
    def label(self):
        """The run folder's prefix and the progress bar's title."""
        return self.name or type(self.estimator).__name__

    @property
    def keep_estimators(self):
        """Whether the fits send their fitted estimators back."""
        return self.return_estimators or self.save_estimators

    def add_tags(self, row):
        """Add the constant columns to ``row`` (in place, keeping its own values)."""
        row.update({k: v for k, v in self.tags.items() if k not in row})
        return row

    def open_folder(self, X, y):
        """The run folder of this configuration on ``(X, y)``, or None without ``out``."""
        if self.out is None:
            return None
        return RunFolder.open(self.out, self.name, self.estimator, X, y, self.swept,
                              self.scoring)


class _SweepRun:
    """The fits of one sweep: read back from its run folder, or computed.

    A round reads the fits finished in the folder (by an earlier or a concurrent
    sweep), computes the others in parallel, and waits for those another sweep on the
    folder holds; the fits that sweep left unfinished (it died) make the next round.

    Parameters
    ----------
    config : _SweepConfig
        The checked settings.
    X, y : ndarray
        The family and its targets.
    folder : RunFolder or None
        The run folder (None keeps everything in memory).
    """

    def __init__(self, config, X, y, folder):
        self.config = config
        self.X = X
        self.y = y
        self.folder = folder
        self.done = {}  # fit_id -> row read back from the folder
        self.new_rows = {}  # fit_id -> row computed by this sweep
        self.estimators = {}
        self.elsewhere = []  # tasks of the current round that another sweep holds
        self.bar = None

    def run(self):
        """Fit every task of the configuration, in rounds; returns ``self``."""
        from tqdm.auto import tqdm

        config = self.config
        self.bar = tqdm(total=len(config.tasks), unit="fit", disable=not config.progress,
                        desc=config.label)
        pending = list(config.tasks)
        try:
            while pending:
                if self.folder is not None:
                    self._read_finished(pending)
                self.elsewhere = []
                self._fit([t for t in pending if t[2] not in self.done])
                pending = self._wait_for_elsewhere()
        finally:
            self.bar.close()
            if self.folder is not None:
                self.folder.release_all()
        return self

    def claim(self, task):
        """Claim a task for this sweep just before it is dispatched.

        A fit is computed by the one sweep holding its lock. Returns False, and keeps
        the task for :meth:`_wait_for_elsewhere`, when another sweep holds it or has
        finished it meanwhile (its record is read next round).
        """
        key = task[2]
        if self.folder.claim(key):
            if not self.folder.record_path(key).exists():
                return True
            self.folder.release(key)
        self.elsewhere.append(task)
        return False

    def _read_finished(self, pending):
        """Read back the finished fits among ``pending``."""
        config = self.config
        for _, _, key in pending:
            row, est = self.folder.finished(key, estimator=config.return_estimators,
                                            require_estimator=config.save_estimators)
            if row is not None:
                self.done[key] = row
                self.bar.update(1)
            if est is not None:
                self.estimators[key] = est

    def _fit(self, todo):
        """Compute the tasks ``todo`` (those this sweep can claim) and record them."""
        config = self.config
        results = run_fits(config.estimator, self.X, self.y, todo, scoring=config.scoring,
                           n_jobs=config.n_jobs, devices=config.devices,
                           n_threads=config.n_threads,
                           certified_min_rank=config.certified_min_rank,
                           keep=config.keep_estimators, ensemble=config.ensemble,
                           claim=None if self.folder is None else self.claim)
        try:
            for row, est in results:
                self._record(row, est)
        finally:
            results.close()  # on an error or Ctrl-C: stop the workers now

    def _record(self, row, est):
        """Keep a computed fit, and write it to the folder (estimator first)."""
        config = self.config
        config.add_tags(row)
        if self.folder is not None:
            self.folder.save(row, est if config.save_estimators else None)
            self.folder.release(row["fit_id"])
        self.new_rows[row["fit_id"]] = row
        if config.return_estimators:
            self.estimators[row["fit_id"]] = est
        self.bar.update(1)

    def _wait_for_elsewhere(self):
        """Wait until the other sweeps release the tasks they hold (finished, or died);
        returns those tasks, to be read back or computed next round."""
        for _, _, key in self.elsewhere:
            self.folder.claim(key, wait=True)
            self.folder.release(key)
        return self.elsewhere

    def result(self):
        """The :class:`~sklearn.utils.Bunch` that :func:`rank_sweep` returns."""
        config = self.config
        rows = [config.add_tags(dict(self.done.get(key) or self.new_rows[key]))
                for key in config.keys]
        results = to_frame(rows)
        results.attrs["param_names"] = sorted(config.swept)
        result = Bunch(
            results=results,
            summary=summarize_sweep(results),
            path=None if self.folder is None else self.folder.path,
            n_computed=len(self.new_rows),
            n_resumed=len(self.done),
            config=None if self.folder is None else self.folder.config,
        )
        if config.return_estimators:
            result.estimators = {key: self.estimators[key] for key in config.keys
                                 if key in self.estimators}
        return result


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
    X : array-like of shape (n_samples, seq_len, n_bits) or CompactFamily
        The family of sequences.
    y : array-like of shape (n_samples, seq_len)
        Its targets.
    ranks : int or list of int, default=None
        Values of ``rank``; None leaves ``rank`` alone (e.g. for a softmax head).
    seeds : int or list of int, default=(0, 1, 2)
        Values of ``random_state`` (None: unseeded); one fit per seed and parameter
        combination. ``bool`` values and repeated seeds are rejected.
    param_grid : dict or list of dicts, default=None
        Further parameters to sweep, as for :class:`~sklearn.model_selection.GridSearchCV`
        (e.g. ``{"feature_map": ["table", "elu+1"]}``).
    scoring : dict of scorers, default=None
        Multi-metric scoring; None uses :func:`~minip_learn.metrics.get_scorers`. Error
        scorers (negated by scikit-learn) are stored as positive errors.
    certified_min_rank : int or Certificate, default=None
        The family's certified minimum rank (see :ref:`theory-r5`). A fit of a nonnegative kernel
        head with ``rank`` below it that reports *solved* raises :class:`RuntimeError`
        and is not recorded. Only models the theorem covers are checked (the module's
        ``theorem_applies``: one head, one layer, affine readout, nonnegative kernel);
        signed kernels, several heads or layers, MLP readouts and classifiers are
        variants outside it (see :ref:`theory-r7`) and are recorded, with ``theorem_applies``
        False in their row. A :class:`~minip_learn.theory.Certificate` gives its rank;
        a positional one (``certify(..., positional=True)``) also holds the fits whose
        ``theorem_`` is ``"positional"`` (position-dependent maps) to it.
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
        resumed fits that were saved with ``save_estimators=True``. A saved estimator
        is loaded only when its SHA-256 matches the record this configuration wrote,
        by :func:`~minip_learn.estimators.load_estimator`, which runs no code from the
        file.
    save_estimators : bool, default=False
        With ``out``, also store each fitted estimator
        (:func:`~minip_learn.estimators.save_estimator`, file
        ``est-<fit_id>.safetensors``, written before the fit's row, which records its
        SHA-256). With ``return_estimators`` too, a resumed fit whose estimator is
        missing or cannot be loaded is fitted again.
    progress : bool, default=True
        Show a :mod:`tqdm` progress bar over fits.
    ensemble : bool, default=False
        Train the fits that share every swept parameter except ``rank`` (for a
        :class:`~minip_learn.SequenceMixerRegressor`, ``state_size``) and the seed
        as one batched model, each group a call of
        :func:`~minip_learn.model_selection.fit_ensemble`, the one route into stacked
        training (needs full-batch training, ``batch_size=None``): same results up to
        floating-point rounding, several times cheaper per fit for small heads. Such
        groups are split
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
    fit_ensemble : The stacked fits that ``ensemble=True`` runs.
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
    config = _SweepConfig.from_keywords(
        estimator, ranks=ranks, seeds=seeds, param_grid=param_grid, scoring=scoring,
        certified_min_rank=certified_min_rank, n_jobs=n_jobs,
        threads_per_fit=threads_per_fit, devices=devices, out=out, name=name, tags=tags,
        return_estimators=return_estimators, save_estimators=save_estimators,
        progress=progress, ensemble=ensemble)
    X = X if is_compact(X) else np.asarray(X)
    y = np.asarray(y)
    folder = config.open_folder(X, y)
    return _SweepRun(config, X, y, folder).run().result()
