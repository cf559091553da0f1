"""Running the fits of a sweep: one fit or one batched ensemble per job, in parallel.

Jobs run through :class:`joblib.Parallel` (loky processes by default, any backend
configured with :func:`joblib.parallel_config`, e.g. ``"dask"``), with torch intra-op
threads capped per fit, on the torch devices given to the sweep (round-robin).
"""

import datetime
import os
import socket
import time
from dataclasses import dataclass

import numpy as np
from joblib import Parallel, delayed, effective_n_jobs
from sklearn.base import clone
from sklearn.metrics import check_scoring

from .._validation import check_device, check_int
from ..estimators import module_declarations
from ._ensemble import fit_ensemble
from ._summary import as_stored
from ._values import digest, jsonable

__all__ = ["resolve_devices"]


def resolve_devices(devices):
    """Validate torch devices and return them as a list of device strings.

    Parameters
    ----------
    devices : None, str or list of str
        ``"cpu"``, ``"cuda"`` (every visible CUDA device), ``"cuda:1"``, ``"mps"`` or a
        list of them.

    Returns
    -------
    devices : list of str or None
        The normalised devices (None for None).

    Raises
    ------
    ValueError
        For an empty list, a string torch does not parse, an unsupported device type,
        or a CUDA or MPS device this machine does not have: asked for at once, before
        any fit starts.

    Examples
    --------
    >>> from minip_learn.model_selection import resolve_devices
    >>> resolve_devices("cpu"), resolve_devices(None)
    (['cpu'], None)
    """
    if devices is None:
        return None
    import torch

    try:
        items = [devices] if isinstance(devices, (str, torch.device)) else list(devices)
    except TypeError:
        raise ValueError(
            f"devices must be None, a device string or a list of them; got {devices!r}."
        ) from None
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


def resolve_threads_per_fit(threads_per_fit, n_jobs, devices):
    """Torch intra-op threads for each fit of a sweep.

    Parameters
    ----------
    threads_per_fit : int or None
        Threads per fit (>= 1); None shares the CPU cores out over the ``n_jobs``
        parallel fits, or uses one thread when every fit runs on a CUDA device.
    n_jobs : int or None
        Parallel fits, as for :class:`joblib.Parallel`.
    devices : list of str or None
        The devices of the fits (see :func:`resolve_devices`).

    Returns
    -------
    n_threads : int

    Raises
    ------
    ValueError
        For a ``threads_per_fit`` that is neither None nor an int >= 1.
    """
    threads_per_fit = check_int(threads_per_fit, "threads_per_fit", min_value=1,
                                allow_none=True)
    if threads_per_fit is not None:
        return threads_per_fit
    if devices is not None and all(d.startswith("cuda") for d in devices):
        return 1
    return max(1, (os.cpu_count() or 1) // max(1, effective_n_jobs(n_jobs)))


class _torch_threads:
    """Context manager: torch intra-op threads set to ``n`` inside, restored after."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        import torch

        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.old)


# -- one fit --------------------------------------------------------------------------
class CertifiedRank(int):
    """A certified minimum rank that says what it bounds: ``positional`` when the
    certificate also covers position-dependent maps (``certify(..., positional=True)``),
    so fits whose ``theorem_`` is ``"positional"`` are held to it too."""

    def __new__(cls, value, positional=False):
        self = super().__new__(cls, value)
        self.positional = bool(positional)
        return self

    def __reduce__(self):
        return (CertifiedRank, (int(self), self.positional))


@dataclass(frozen=True)
class _Plan:
    """What every fit of one job shares: the estimator template, the data, the device,
    the scorers, the thread cap, the certified bound and whether to keep estimators."""

    estimator: object
    X: object
    y: object
    device: object
    scoring: dict
    n_threads: int
    certified_min_rank: object
    keep: bool


def _fit_one(plan, params, seed):
    """A clone of the template with ``params``, ``seed`` and the device set, fitted:
    ``(estimator, fit_time, fit_cpu_time)``."""
    est = clone(plan.estimator)
    set_params = dict(params)
    if seed is not None:
        set_params["random_state"] = seed
    if plan.device is not None:
        set_params["device"] = plan.device
    est.set_params(**set_params)
    t0, c0 = time.perf_counter(), time.process_time()
    est.fit(plan.X, plan.y)
    return est, time.perf_counter() - t0, time.process_time() - c0


def _scores(plan, est):
    """The stored scores of a fitted estimator on the full set, whether it solved the
    set, and the scoring time."""
    t0 = time.perf_counter()
    raw = check_scoring(est, scoring=plan.scoring)(est, plan.X, plan.y)
    score_time = time.perf_counter() - t0
    scores = {name: as_stored(plan.scoring[name], value) for name, value in raw.items()}
    if "solved" in scores:
        is_solved = bool(scores["solved"] >= 1.0)
    else:
        is_solved = bool(getattr(est, "solved_", False))
    return scores, is_solved, score_time


def _coverage(est, certified_min_rank):
    """What the certified bound says about a fitted estimator.

    Returns ``(rank, nonnegative, theorem_applies, covered)``. The bound (theory page,
    R4-R5) covers one head, one layer, an affine readout and a nonnegative kernel. The
    estimator's flag ``theorem_applies_`` (from the kernel values on the training tokens)
    decides when it has one, else the module's declaration
    (:func:`~minip_learn.estimators.module_declarations`, also for an estimator of
    another library around a module); a module that declares neither is covered unless
    it is signed. A sequence mixer that is a kernel head has a rank (``rank_``, its state
    size) but no such hyperparameter. A certificate for position-dependent maps also
    covers the heads declared ``theorem = "positional"`` on final-query targets.
    """
    rank = est.get_params(deep=False).get("rank", getattr(est, "rank_", None))
    declared = module_declarations(getattr(getattr(est, "net_", None), "module_", None))
    nonnegative = declared.nonnegative
    theorem_applies = getattr(est, "theorem_applies_", declared.theorem_applies)
    covered = nonnegative is not False if theorem_applies is None else bool(theorem_applies)
    if not covered and getattr(certified_min_rank, "positional", False):
        theorem = getattr(est, "theorem_", declared.theorem)
        covered = theorem == "positional" and getattr(est, "query_", "last") == "last"
    return rank, nonnegative, theorem_applies, covered


def _below_bound(plan, est, key, params, seed, is_solved):
    """Whether the fit's rank is below the certified rank (None when either is unknown).

    Raises
    ------
    RuntimeError
        When a covered fit below the certified rank reports the family solved: that is
        a bug, never a result, and the fit is not recorded.
    """
    bound = plan.certified_min_rank
    rank, _, _, covered = _coverage(est, bound)
    if bound is None or rank is None:
        return None
    below = bool(rank < bound)
    if below and is_solved and covered:
        raise RuntimeError(
            f"fit {key!r} ({type(est).__name__} rank={rank}, seed={seed}, "
            f"params={params}) reports the family solved, but its certified minimum "
            f"rank is {bound}: no nonnegative kernel head of rank "
            f"{rank} can solve it (see the theory page, section R5). This is a bug (in "
            "the metric, the head or the certificate); the fit is not recorded."
        )
    return below


def _record(plan, est, params, seed, key, times, scores, is_solved, below, ensemble):
    """The row stored for one fit (the fields of the results-folder format)."""
    all_params = est.get_params(deep=False)
    _, nonnegative, theorem_applies, _ = _coverage(est, plan.certified_min_rank)
    fit_time, fit_cpu_time, score_time = times
    row = {"fit_id": key, "estimator": type(est).__name__,
           **{k: jsonable(v) for k, v in params.items()}, "seed": seed}
    for name in ("rank", "feature_map"):
        if name in all_params and name not in row:
            row[name] = jsonable(all_params[name])
    row.update(scores)
    bound = plan.certified_min_rank
    row.update(
        solved=is_solved,
        n_epochs=int(getattr(est, "n_epochs_", -1)),
        train_max_error=float(getattr(est, "train_max_error_", float("nan"))),
        fit_time=fit_time,
        fit_cpu_time=fit_cpu_time,
        score_time=score_time,
        device=str(all_params.get("device", plan.device)),
        n_threads=plan.n_threads,
        ensemble=ensemble,
        nonnegative=None if nonnegative is None else bool(nonnegative),
        theorem_applies=None if theorem_applies is None else bool(theorem_applies),
        certified_min_rank=None if bound is None else int(bound),
        below_certified_bound=below,
        host=socket.gethostname(),
        pid=os.getpid(),
        finished_at=datetime.datetime.now(datetime.UTC).isoformat(),
    )
    return row


def _fit_and_score(plan, params, seed, key, fitted=None):
    """Fit one clone on the full set and score it there; returns ``(row, estimator)``.

    ``fitted=(est, fit_time, fit_cpu_time)``: score an estimator already fitted (by an
    ensemble, whose times are shared out over its members) instead of fitting one.
    """
    with _torch_threads(plan.n_threads):
        est, fit_time, fit_cpu_time = fitted or _fit_one(plan, params, seed)
        scores, is_solved, score_time = _scores(plan, est)
    below = _below_bound(plan, est, key, params, seed, is_solved)
    row = _record(plan, est, params, seed, key, (fit_time, fit_cpu_time, score_time),
                  scores, is_solved, below, ensemble=fitted is not None)
    return row, (est if plan.keep else None)


def _sizes(estimator):
    """The parameters other than the seed in which the members of one ensemble may
    differ (``rank``; ``state_size`` for a mixer)."""
    return [k for k in getattr(estimator, "member_params", ("rank",)) if k != "random_state"]


def _fit_and_score_ensemble(plan, group):
    """Fit the fits ``group`` (``(params, seed, key)`` sharing every parameter but
    their sizes, see :func:`_sizes`) as one batched ensemble and score each; returns a
    list of ``(row, estimator)``. Wall and CPU times are shared out equally over the
    members."""
    sizes = _sizes(plan.estimator)
    common = {k: v for k, v in group[0][0].items() if k not in sizes}
    if plan.device is not None:
        common["device"] = plan.device
    base = clone(plan.estimator).set_params(**common)
    members = []
    for p, s, _ in group:
        m = {k: p[k] for k in sizes if k in p}
        m["random_state"] = s
        members.append(m)
    with _torch_threads(plan.n_threads):
        c0 = time.process_time()
        res = fit_ensemble(base, plan.X, plan.y, params=members)
        cpu = time.process_time() - c0
    n = len(group)
    return [_fit_and_score(plan, p, s, k, fitted=(est, res.fit_time / n, cpu / n))
            for (p, s, k), est in zip(group, res.estimators)]


def _ensemble_jobs(todo, n_jobs, device_list, sizes=("rank",)):
    """Group the fits that differ only in ``sizes`` and seed; split groups so that at
    least as many jobs as parallel workers exist (the fits of a job form one
    ensemble)."""
    groups = {}
    for t in todo:
        common = {k: v for k, v in t[0].items() if k not in sizes}
        groups.setdefault(digest(common), []).append(t)
    jobs = list(groups.values())
    workers = max(effective_n_jobs(n_jobs), len(device_list or ()))
    if jobs and len(jobs) < workers:
        parts = -(-workers // len(jobs))
        jobs = [[job[i] for i in idx] for job in jobs
                for idx in np.array_split(np.arange(len(job)), min(parts, len(job)))]
    return jobs


def _run_job(plan, job, ensemble):
    """One job of :func:`run_fits`: a list of ``(row, estimator)``."""
    if ensemble:
        return _fit_and_score_ensemble(plan, job)
    ((params, seed, key),) = job
    return [_fit_and_score(plan, params, seed, key)]


def run_fits(estimator, X, y, tasks, *, scoring, n_jobs, devices, n_threads,
             certified_min_rank, keep, ensemble, claim=None):
    """Fit and score ``tasks`` (``(params, seed, fit_id)``) in parallel.

    Yields ``(row, estimator)`` as fits finish (estimator None unless ``keep``).
    ``claim(task) -> bool`` is asked just before a task is dispatched (possibly from
    joblib's dispatching thread); a task it refuses is skipped. ``ensemble=True`` groups
    the tasks that differ only in rank (or state size) and seed into batched ensembles.
    """
    jobs = (_ensemble_jobs(tasks, n_jobs, devices, _sizes(estimator)) if ensemble
            else [[t] for t in tasks])

    def dispatched():
        for job, device in zip(jobs, _assign_devices(devices, len(jobs))):
            if claim is not None:
                job = [t for t in job if claim(t)]
            if job:
                plan = _Plan(estimator, X, y, device, scoring, n_threads,
                             certified_min_rank, keep)
                yield delayed(_run_job)(plan, job, ensemble)

    for batch in Parallel(n_jobs=n_jobs, return_as="generator_unordered")(dispatched()):
        yield from batch
