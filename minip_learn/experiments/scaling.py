"""The scaling recipe: the rank sandwich across the number of bits ``m``.

For every ``m`` of a grid, :func:`scaling_experiment` builds a witness suite and
measures three ranks that sandwich the smallest rank of a nonnegative kernel head that
solves it:

* **lower** -- the certified minimum rank, recomputed from the sequences by
  :func:`~minip_learn.theory.certify` (see :ref:`theory-r5`);
* **upper** -- the smallest rank at which a head is *verified* to solve every sequence
  (``|p - t| < 1/2`` at every position, predictions in float64). Two routes look for it,
  in this order: *construction* (the exact head of :ref:`theory-r3` at the constructive
  rank, then nonnegative rank-``r`` factorisations ``P Q^T`` of a solving kernel
  plugged into that head below it, see
  :func:`~minip_learn.constructions.factorized_kernel_head`) and *training*
  (a search below the construction's verified rank: the rank just below it first,
  then a bisection; several seeds per rank trained as one batched ensemble). Each
  search probes at most ``max_probes`` ranks, so the result is a bracket: the
  smallest rank found to solve and the largest found to fail. The smaller verified
  rank is reported with the route that gave it, and its model is saved as the proof;
* **constructive** -- the number of distinct tokens (the exact realisation of
  :ref:`theory-r3`),

beside dense softmax heads with ``m``-dimensional scores (:ref:`theory-r2`), and the
certified bound of the witness designs continued to large ``m`` as a calculation
(:func:`~minip_learn.theory.bound_table`). The growth of each rank with ``m`` is fitted
on a log2 scale (:func:`growth_fit`). The figure also draws the exact minimum rank of
the long-sequence families of :ref:`theory-r9`, read from the ``summary.csv`` of the
exact recipe when there is one (:func:`redraw_rank_sandwich` redraws the figure from
the tables of an output folder, without any fit).

All numbers live in :data:`SETTINGS` (``"quick"`` and ``"full"``, also
``minip_learn.experiments.SETTINGS["scaling"]``); keyword arguments of
:func:`scaling_experiment` override them. ``minip-learn reproduce scaling`` runs it.
"""

import json
import time
from pathlib import Path

import pandas as pd
from sklearn.utils import Bunch

from .._validation import distinct_tokens
from ..datasets import make_witness_suite
from ..estimators import SoftmaxAttentionRegressor, load_estimator, save_estimator
from ..metrics import solves, verify_solver
from ..theory import bound_table, certify
from ._scaling_report import (  # noqa: F401  (SUMMARY_COLUMNS, growth_fit: importable here)
    SUMMARY_COLUMNS,
    growth_fit,
    growth_lines,
    growth_table,
    results_frame,
    scaling_checks,
    scaling_markdown,
    summary_frame,
)
from ._scaling_search import construction_route, largest_below, training_route
from ._shared import Recipe

__all__ = []  # public home: the package minip_learn.experiments

#: The recipe's grids and training settings: ``SETTINGS["quick"|"full"]``.
SETTINGS = {
    "quick": dict(
        # default witness suites (the best certified design of at most max_sequences);
        # n_bits = 8, 12, 16, 20 give certified 2, 4, 8, 12 and constructive 4, 8, 30, 38
        sizes=(8, 12, 16, 20),
        suite=dict(seq_len=3, max_sequences=20000),
        feature_maps=("table",),
        seeds=(0, 1),
        softmax_seeds=(0, 1),
        # the training route probes below the construction's verified rank
        kernel=dict(max_epochs=500, stop_tolerance=0.5),
        # epochs enough for the default lr (0.01) on the Hadamard suites of the larger
        # sizes
        softmax=dict(max_epochs=1500, stop_tolerance=0.5, n_init=2),
        construction=dict(seeds=(0,), nmf_iter=200, steps=300, lr=0.05, margin=0.1),
        # ranks probed by each route's search between the two ends (None: until the
        # smallest solving and the largest failing rank are adjacent)
        max_probes=None,
        design_bits=tuple(range(8, 129, 8)),
    ),
    "full": dict(
        # n_bits = 24, 28, 32 give certified 17, 17, 36 and constructive 46, 92, 171
        sizes=(8, 12, 16, 20, 24, 28, 32),
        suite=dict(seq_len=3, max_sequences=20000),
        feature_maps=("table", "exp"),
        seeds=(0, 1, 2, 3, 4),
        softmax_seeds=(0, 1, 2, 3, 4),
        # the training route probes below the construction's verified rank
        kernel=dict(max_epochs=500, stop_tolerance=0.5),
        # the default lr (0.01), with restarts (n_init) for the initialisations that
        # stall
        softmax=dict(max_epochs=2500, stop_tolerance=0.5, n_init=3),
        construction=dict(seeds=(0,), nmf_iter=200, steps=300, lr=0.05, margin=0.1),
        max_probes=3,
        design_bits=tuple(range(8, 129, 8)),
    ),
}


def scaling_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                       figures=True, ensemble=True, exact=None, **settings):
    """The rank sandwich across ``n_bits``: certified, smallest solving, constructive.

    For every size ``m`` in ``sizes``: the witness suite
    ``make_witness_suite(n_bits=m, **suite)``; its certified minimum rank (recomputed
    by :func:`~minip_learn.theory.certify`); the smallest rank at which a kernel head is
    verified to solve it, from two routes -- *construction* (the exact head of
    :ref:`theory-r3` at the constructive rank, then the rank just below it and, when
    that solves, a bisection towards the bound, with
    :func:`~minip_learn.constructions.factorized_kernel_head`)
    and then *training* (the same search below the construction's verified rank; the
    first sweep trains every feature map side by side, each one batched ensemble of
    all ``seeds`` holding a control fit at ``certified - 1`` and the rank just below
    the construction's); the constructive rank; and dense
    softmax heads with ``score_dim = m`` over ``softmax_seeds``. The verified head at
    the smallest rank is saved as ``solvers/m{m}-rank{r}.safetensors``, reloaded, and checked
    again (float64, :func:`~minip_learn.metrics.verify_solver`) before it is reported.

    Parameters
    ----------
    quick : bool, default=True
        Use ``SETTINGS["scaling"]["quick"]`` (sizes 8-20, ``table`` maps, two seeds:
        under a minute on 2 cores) instead of ``"full"`` (sizes 8-32, ``table`` and
        ``exp`` maps, five seeds: about 10 minutes on 2 idle cores with ``n_jobs=2``).
    out : str or path, default=None
        Folder for ``results.csv`` (one row per fit or construction), ``summary.csv``
        (one row per size, the columns
        :data:`~minip_learn.experiments.scaling.SUMMARY_COLUMNS`; ``training_time``,
        ``construction_time``, ``softmax_time`` and ``fit_cpu_time`` add up the times
        stored with the fits, so a resumed run reports them too, while ``wall_time``
        is this call's), ``growth.csv``, ``design.csv``,
        ``summary.md``, ``rank_sandwich.png`` and ``solvers/``; tables are rewritten as
        each size finishes. Fits go to ``out/runs`` and constructions to
        ``out/constructions``: a rerun with the same ``out`` refits nothing that is on
        disk. None keeps everything in memory.
    n_jobs : int, default=None
        Parallel fits (see :func:`~minip_learn.model_selection.rank_sweep`).
    devices : str or list of str, default=None
        Torch devices for the fits.
    progress : bool, default=True
        Progress bars and one line per size.
    figures : bool, default=True
        Draw ``rank_sandwich`` (:func:`~minip_learn.plotting.plot_rank_sandwich`).
    ensemble : bool, default=True
        Train the seeds of a rank as one batched ensemble (kernel heads only).
    exact : str, path, pandas.DataFrame or False, default=None
        The exact minimum rank drawn in the figure beside the sandwich: the
        ``summary.csv`` of :func:`~minip_learn.experiments.exact_experiment` (a path,
        read when the figure is drawn) or its ``summary``. None reads
        ``<out>/../exact/summary.csv`` when that file exists (the folder the exact
        recipe writes beside this one under ``minip-learn reproduce --out`` and
        ``minip-learn reproduce docs-artifacts``); False draws no exact curve.
    **settings
        Overrides of the recipe's settings (``SETTINGS["scaling"]``): ``sizes``,
        ``suite`` (keyword arguments of :func:`~minip_learn.datasets.make_witness_suite`
        besides ``n_bits``),
        ``feature_maps``, ``seeds``, ``softmax_seeds``, ``kernel``, ``softmax``,
        ``construction`` (keyword arguments of
        :func:`~minip_learn.constructions.factorized_kernel_head` and its ``seeds``),
        ``max_probes`` (most ranks probed by each search between the two ends; None:
        until the smallest solving rank and a failing rank are adjacent),
        ``design_bits`` (sizes of the design-bound calculation).

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``summary`` (one row per size), ``results`` (one row per fit; ``model`` is
        ``"kernel"``, ``"construction"`` or ``"softmax"``), ``growth`` (slope of
        ``log2 rank`` per bit with its 95% t-interval, per quantity), ``design`` (the
        design-bound calculation), ``markdown``, ``checks`` (see
        :func:`scaling_checks`), ``figures``, ``files``, ``settings``, ``n_computed`` and
        ``n_resumed`` (fits and constructions computed in this call / read from disk),
        ``elapsed`` and ``cpu_time`` (seconds, this process).

    Examples
    --------
    >>> from minip_learn.experiments import scaling_experiment
    >>> res = scaling_experiment(
    ...     sizes=(8,), seeds=(0,), softmax_seeds=(0,), kernel={"max_epochs": 200},
    ...     softmax={"max_epochs": 200}, design_bits=(8, 16), progress=False,
    ...     figures=False)
    >>> row = res.summary.iloc[0]
    >>> int(row.certified_min_rank), int(row.smallest_solving_rank), int(row.constructive_rank)
    (2, 2, 4)
    >>> res.checks["sandwich_ordered"]
    True
    """
    c0 = time.process_time()
    exact = _exact_source(exact, out)
    recipe = Recipe("scaling", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    cfg = recipe.cfg
    design = bound_table(n_bits=sorted(set(cfg["design_bits"]) | set(cfg["sizes"])),
                         seq_len=[cfg["suite"].get("seq_len", 3)])
    design_bound = dict(zip(design["n_bits"], design["certified_min_rank"]))
    rows, parts = [], []
    n_computed = n_resumed = 0
    for m in cfg["sizes"]:
        size = _measure_size(recipe, int(m), design_bound.get(int(m)))
        rows.append(size.row)
        parts += size.results
        n_computed += size.n_computed
        n_resumed += size.n_resumed
        if progress:
            print(_progress_line(size.row), flush=True)
        # the tables so far, rewritten as each size finishes
        summary = summary_frame(rows)
        recipe.write_tables(
            Bunch(results=results_frame(parts), summary=summary,
                  markdown=scaling_markdown(summary, None, {}, cfg)),
            {"design": design})

    summary = summary_frame(rows)
    results = results_frame(parts)
    checks = scaling_checks(summary, results)
    growth = growth_table(summary, design)
    markdown = scaling_markdown(summary, growth, checks, cfg)
    if progress:
        print(growth_lines(growth), flush=True)
    figs = {}
    if figures:
        figs["rank_sandwich"] = _rank_sandwich(summary, design, exact)
    result = recipe.finish(
        Bunch(summary=summary, results=results, growth=growth, design=design,
              markdown=markdown, checks=checks, figures=figs, n_computed=n_computed,
              n_resumed=n_resumed),
        tables={"growth": growth, "design": design})
    result.cpu_time = time.process_time() - c0
    return result


def redraw_rank_sandwich(out, *, exact=None):
    """Redraw ``rank_sandwich.png`` of a scaling output folder from its tables.

    Reads ``summary.csv`` and ``design.csv`` of ``out`` (and the exact recipe's
    ``summary.csv``, see ``exact``), draws
    :func:`~minip_learn.plotting.plot_rank_sandwich` as :func:`scaling_experiment`
    does, and writes ``out/rank_sandwich.png``; no fit runs and no other file changes.

    Parameters
    ----------
    out : str or path
        An output folder of :func:`scaling_experiment`.
    exact : str, path, pandas.DataFrame or False, default=None
        As in :func:`scaling_experiment`: None reads ``<out>/../exact/summary.csv``
        when it exists.

    Returns
    -------
    path : pathlib.Path
        The figure written.

    Examples
    --------
    >>> import tempfile
    >>> import pandas as pd
    >>> from minip_learn.experiments.scaling import redraw_rank_sandwich
    >>> with tempfile.TemporaryDirectory() as out:
    ...     pd.DataFrame({"n_bits": [8, 16], "certified_min_rank": [2, 8],
    ...                   "smallest_solving_rank": [2, 30], "constructive_rank": [4, 30]}
    ...                  ).to_csv(f"{out}/summary.csv", index=False)
    ...     pd.DataFrame({"n_bits": [8, 64], "certified_min_rank": [2, 3048]}
    ...                  ).to_csv(f"{out}/design.csv", index=False)
    ...     redraw_rank_sandwich(out, exact=False).name
    'rank_sandwich.png'
    """
    import matplotlib.pyplot as plt

    out = Path(out)
    exact = _exact_source(exact, out)
    fig = _rank_sandwich(pd.read_csv(out / "summary.csv"), pd.read_csv(out / "design.csv"),
                         exact)
    path = out / "rank_sandwich.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _exact_source(exact, out):
    """The exact recipe's summary to draw: a DataFrame, a path to its ``summary.csv``
    (read when the figure is drawn) or None."""
    if exact is None:
        found = None if out is None else Path(out).parent / "exact" / "summary.csv"
        return found if found is not None and found.is_file() else None
    if exact is False:
        return None
    if isinstance(exact, pd.DataFrame):
        return exact
    if not isinstance(exact, str | Path):
        raise ValueError(f"exact must be a path, a DataFrame, None or False; got {exact!r}.")
    if not Path(exact).is_file():
        raise ValueError(f"exact: no file {str(exact)!r} (the summary.csv of the exact "
                         "recipe).")
    return Path(exact)


def _rank_sandwich(summary, design, exact):
    """The figure of the recipe: the sandwich and, when given, the exact curve."""
    from ..plotting import plot_rank_sandwich

    if isinstance(exact, Path):
        exact = pd.read_csv(exact)
    return plot_rank_sandwich(summary, design=design, exact=exact).figure


def _measure_size(recipe, m, design_bound):
    """The row of ``summary.csv`` for size ``m``, the result frames of its fits and
    constructions, and how many of them were computed / read from disk."""
    cfg = recipe.cfg
    tm = time.perf_counter()
    suite = make_witness_suite(n_bits=m, **cfg["suite"])
    tc = time.perf_counter()
    bound = int(certify(suite.X))
    certify_time = time.perf_counter() - tc
    constructive = len(distinct_tokens(suite.X.reshape(-1, m)))

    # construction route: the exact head of R3 at the constructive rank, then
    # factorisations below it
    construction = construction_route(suite, m, cfg, recipe.out, bound, constructive)
    # training route, below the construction's verified rank (every map at once)
    training = training_route(
        recipe, suite, m, bound,
        constructive + 1 if construction.rank is None else construction.rank)
    soft = _softmax_sweep(recipe, suite, m)
    parts = [construction.results, *training.results]
    if soft is not None:
        parts.append(soft.results)

    row = dict(
        n_bits=m, suite_params=json.dumps({"n_bits": m, **cfg["suite"]}, sort_keys=True),
        construction=suite.construction, n_sequences=len(suite.X),
        n_tokens=constructive, certified_min_rank=bound, constructive_rank=constructive,
        construction_rank=construction.rank,
        construction_failed_below=construction.failed_below, softmax_score_dim=m,
        softmax_solved=(float(soft.results["solved"].mean()) if soft is not None
                        else float("nan")),
        design_bound=design_bound, certify_time=certify_time,
        **_smallest_solver(recipe.out, suite, m, construction, training.maps),
        **_fit_times(parts),
    )
    row["wall_time"] = time.perf_counter() - tm
    row.update({f"training_rank_{fm}": training.maps[fm][0] for fm in cfg["feature_maps"]})
    counts = [r.n_computed for r in (construction, training, soft) if r is not None]
    resumed = [r.n_resumed for r in (construction, training, soft) if r is not None]
    return Bunch(row=row, results=parts, n_computed=sum(counts), n_resumed=sum(resumed))


def _softmax_sweep(recipe, suite, m):
    """Dense softmax with m-dimensional scores, one seed at a time (their n_init
    restarts stop at the first initialisation that solves); None without seeds."""
    cfg = recipe.cfg
    if not cfg["softmax_seeds"]:
        return None
    return recipe.sweep(
        SoftmaxAttentionRegressor(score_dim=m, **cfg["softmax"]), suite.X, suite.y,
        name=f"scaling-m{m}-softmax", seeds=list(cfg["softmax_seeds"]),
        tags={"model": "softmax", "n_bits": m}, ensemble=False)


def _fit_times(parts):
    """Fit times as stored with the fits: the same numbers when a rerun resumes."""
    fits = results_frame(parts)
    fit_time = fits.groupby("model")["fit_time"].sum()
    return dict(training_time=float(fit_time.get("kernel", 0.0)),
                construction_time=float(fit_time.get("construction", 0.0)),
                softmax_time=float(fit_time.get("softmax", 0.0)),
                fit_cpu_time=float(fits["fit_cpu_time"].sum()))


def _smallest_solver(out, suite, m, construction, training):
    """The smaller verified rank of the two routes (ties: training) and, below it, the
    largest rank that a route probed and found failing; the head at that rank is saved
    to ``out/solvers``, reloaded and verified again."""
    found = [(hi, est, f"training ({fm})") for fm, (hi, _, est) in training.items()
             if hi is not None and est is not None]
    t_hi = min(found, key=lambda f: f[0])[0] if found else None
    t_lo = largest_below([lo for _, lo, _ in training.values()], t_hi)
    candidates = found + ([(construction.rank, construction.estimator, "construction")]
                          if construction.estimator is not None else [])
    upper = failed = route = solver_path = None
    solver_err = float("nan")
    if candidates:
        upper, solver, route = min(candidates, key=lambda f: f[0])
        failed = largest_below([t_lo, construction.failed_below], upper)
        solver_err = verify_solver(solver, suite.X, suite.y)
        if out is not None:
            solver_path = out / "solvers" / f"m{m}-rank{upper}.safetensors"
            solver_path.parent.mkdir(parents=True, exist_ok=True)
            save_estimator(solver, solver_path)
            solver_err = verify_solver(load_estimator(solver_path), suite.X, suite.y)
        if not solves(solver_err):
            upper = failed = route = None
    return dict(
        smallest_solving_rank=upper, failed_rank_below=failed, upper_route=route,
        training_rank=t_hi, training_failed_below=t_lo,
        solver=None if solver_path is None else str(solver_path.relative_to(out)),
        solver_max_error=solver_err)


def _progress_line(row):
    return (f"m = {row['n_bits']}: certified {row['certified_min_rank']} <= smallest "
            f"solving {row['smallest_solving_rank']} ({row['upper_route']}) <= "
            f"constructive {row['constructive_rank']}; softmax solved "
            f"{row['softmax_solved']:.2f}; {row['wall_time']:.1f} s")
