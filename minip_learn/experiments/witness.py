"""The witness recipe: kernel heads over feature rank against dense softmax.

On an m = 24 witness suite, kernel heads are swept over ranks (and seeds) below and
above the suite's certified minimum rank, next to dense softmax heads over seeds.
``--quick`` uses the small Hadamard suite (``construction="small"``: 190 sequences,
certified rank 8 as the paper's own 1,272-sequence suite, constructive rank 20), the
full run the Hadamard family of :ref:`theory-r6` (4,186 sequences, certified rank 17,
constructive rank 46). Expected: nothing solved below the
certified bound, solved at some rank up to the constructive one, softmax solved for
every seed.
"""

import pandas as pd
from sklearn.utils import Bunch

from ..datasets import make_witness_suite
from ..estimators import KernelAttentionRegressor, SoftmaxAttentionRegressor
from ..model_selection import summarize_sweep
from ._shared import Recipe, display_summary, report, settings_text

__all__ = []  # public home: the package minip_learn.experiments

#: The grids and training settings: ``SETTINGS["quick" | "full"]``.
SETTINGS = {
    # quick: the small m = 24 Hadamard suite (certified bound 8, constructive rank 20,
    # 190 sequences)
    "quick": dict(
        suite=dict(n_bits=24, seq_len=3, construction="small"),
        ranks=(2, 4, 8, 12, 16, 20, 32),
        seeds=(0, 1),
        softmax_seeds=(0, 1, 2),
        kernel=dict(feature_map="table", max_epochs=1000, stop_tolerance=0.5),
        # softmax training on these suites gets stuck for some initialisations
        # (one key absorbing all attention); restarts (n_init) cure it
        softmax=dict(max_epochs=500, stop_tolerance=0.5, n_init=8,
                     optimizer="adamw", weight_decay=0.01),
    ),
    # full: the Hadamard suite of the theory page, R6 (4,186 sequences, certified
    # bound 17, constructive rank 46)
    "full": dict(
        suite=dict(n_bits=24, seq_len=3, construction="auto"),
        ranks=(2, 4, 8, 12, 16, 24, 32, 46, 64, 128),
        seeds=(0, 1, 2, 3, 4),
        softmax_seeds=(0, 1, 2, 3, 4),
        kernel=dict(feature_map="table", max_epochs=3000, stop_tolerance=0.5),
        softmax=dict(max_epochs=1500, stop_tolerance=0.5, n_init=8,
                     optimizer="adamw", weight_decay=0.01),
    ),
}


def witness_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                       figures=True, ensemble=False, **settings):
    """Phase transition on a witness suite: kernel heads over rank vs dense softmax.

    Parameters
    ----------
    quick : bool, default=True
        Use ``SETTINGS["witness"]["quick"]`` (a few minutes on 2 cores) instead of
        ``"full"``.
    out : str or path, default=None
        Folder for ``results.csv``, ``summary.csv``, ``summary.md`` and the figures
        (``phase_transition.png``, ``kernel_heatmap.png``); the fits themselves go to
        ``out/runs`` so that a rerun resumes (see the docs page "Results folders and
        failures"). The folder is checked to be writable before any fit starts
        (:class:`ValueError` otherwise). None keeps everything in memory.
    n_jobs : int, default=None
        Parallel fits (see :func:`~minip_learn.model_selection.rank_sweep`).
    devices : str or list of str, default=None
        Torch devices for the fits (``"cpu"``, ``"cuda"``, ``["cuda:0", "cuda:1"]``).
    progress : bool, default=True
        Progress bars.
    figures : bool, default=True
        Draw the figures.
    ensemble : bool, default=False
        Train the seeds and ranks of the kernel sweep as batched ensembles (see
        :func:`~minip_learn.model_selection.rank_sweep`); same results, cheaper. The
        softmax seeds are always fitted one by one: their ``n_init`` restarts stop at the
        first initialisation that solves, which an ensemble (running every
        initialisation to the end) cannot exploit, and a softmax ensemble on the R6
        suite held about 14 GB.
    **settings
        Overrides of the recipe's settings: ``suite`` (keyword arguments of
        :func:`~minip_learn.datasets.make_witness_suite`), ``ranks``, ``seeds``,
        ``softmax_seeds``, ``kernel`` and ``softmax`` (estimator parameters; dicts are
        merged into the defaults).

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``results`` (one row per fit, ``model`` is ``"kernel"`` or ``"softmax"``),
        ``summary``, ``markdown`` (the summary as text), ``checks`` (the expected
        behaviour, each ``True``/``False``), ``certified_min_rank``,
        ``constructive_rank``, ``figures`` (name -> matplotlib Figure), ``files``
        (name -> path, when ``out`` is given), ``settings`` and ``elapsed`` (seconds).

    Examples
    --------
    >>> from minip_learn.experiments import witness_experiment
    >>> res = witness_experiment(
    ...     suite={"construction": "small"}, ranks=(2,), seeds=(0,), softmax_seeds=(0,),
    ...     kernel={"max_epochs": 5}, softmax={"max_epochs": 5}, progress=False,
    ...     figures=False)
    >>> res.results["model"].tolist(), res.checks["none_solved_below_bound"]
    (['kernel', 'softmax'], True)
    """
    recipe = Recipe("witness", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    cfg = recipe.cfg
    suite = make_witness_suite(**cfg["suite"])
    bound, constructive = int(suite.certified_min_rank), int(suite.constructive_rank)
    tag = f"witness-{suite.construction}-m{suite.X.shape[2]}-N{suite.X.shape[1]}"

    kern = recipe.sweep(
        KernelAttentionRegressor(**cfg["kernel"]), suite.X, suite.y, name=f"{tag}-kernel",
        ranks=list(cfg["ranks"]), seeds=list(cfg["seeds"]), certified_min_rank=bound,
        tags={"model": "kernel"}, estimators=figures)
    parts = [kern.results]
    if cfg["softmax_seeds"]:
        soft = recipe.sweep(
            SoftmaxAttentionRegressor(**cfg["softmax"]), suite.X, suite.y,
            name=f"{tag}-softmax", seeds=list(cfg["softmax_seeds"]),
            tags={"model": "softmax"}, ensemble=False)
        parts.append(soft.results)
    results = pd.concat(parts, ignore_index=True)
    cols = ["model"] + [c for c in results.columns if c != "model"]
    results = results[cols]
    summary = summarize_sweep(results, by=["model", "feature_map", "rank"])
    summary["certified_min_rank"] = bound

    k = results[results["model"] == "kernel"]
    s = results[results["model"] == "softmax"]
    solving = sorted(k.loc[k["solved"], "rank"].astype(int).unique())
    checks = {
        "none_solved_below_bound": bool(not k.loc[k["rank"] < bound, "solved"].any()),
        "solved_at_or_below_constructive_rank": bool(any(r <= constructive for r in solving)),
        "softmax_solved_every_seed": bool(len(s) > 0 and s["solved"].all()),
    }
    markdown = _witness_markdown(suite, cfg, summary, checks, solving)
    figs = {}
    if figures:
        figs = _witness_figures(suite, summary, bound, constructive, kern)
    return recipe.finish(Bunch(
        results=results, summary=summary, markdown=markdown, checks=checks,
        certified_min_rank=bound, constructive_rank=constructive,
        smallest_solving_rank=solving[0] if solving else None, figures=figs))



def _witness_markdown(suite, cfg, summary, checks, solving):
    X = suite.X
    return report(
        "Witness suite: phase transition over feature rank",
        f"Suite `{suite.construction}`: {len(X)} sequences of length {X.shape[1]} over "
        f"{suite.constructive_rank} distinct {X.shape[2]}-bit tokens; certified minimum "
        f"rank **{suite.certified_min_rank}** (theory, R5), constructive rank "
        f"**{suite.constructive_rank}** (theory, R3). Kernel: "
        + settings_text(cfg["kernel"])
        + f"; seeds {list(cfg['seeds'])}. Softmax seeds {list(cfg['softmax_seeds'])}.",
        display_summary(summary), checks,
        note=f"Smallest solving kernel rank: {solving[0] if solving else 'none'}.",
        labels={
            "none_solved_below_bound": "no kernel fit below the certified bound "
                                       f"{suite.certified_min_rank} solved",
            "solved_at_or_below_constructive_rank": "solved at some rank <= constructive "
                                                    f"rank {suite.constructive_rank}",
            "softmax_solved_every_seed": "dense softmax solved for every seed",
        })


def _witness_figures(suite, summary, bound, constructive, kern):
    from ..plotting import plot_kernel_heatmap, plot_phase_transition

    figs = {}
    ax = plot_phase_transition(
        summary, certified_min_rank=bound, constructive_rank=constructive,
        title=f"Witness suite ({len(suite.X)} sequences, m = {suite.X.shape[2]})")
    figs["phase_transition"] = ax.figure
    est, label = None, ""
    fitted = getattr(kern, "estimators", {}) or {}
    solved = kern.results[kern.results["solved"] & kern.results["fit_id"].isin(list(fitted))]
    if len(solved):
        row = solved.sort_values("rank").iloc[0]
        est = fitted[row["fit_id"]]
        label = f"trained head, rank {int(row['rank'])}, seed {row['seed']}"
    else:
        from ..constructions import exact_kernel_realization

        est = exact_kernel_realization(tokens=suite.tokens, seq_len=suite.X.shape[1])
        label = f"exact construction (R3), rank {est.rank}"
    ax = plot_kernel_heatmap(est, suite.queries, suite.designated_keys,
                             title=f"Kernel on queries x designated keys\n{label}")
    figs["kernel_heatmap"] = ax.figure
    return figs

