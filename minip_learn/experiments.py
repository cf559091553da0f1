"""Reproduction recipes: the phase transition on witness suites and over sequence length.

Two experiments, each a function returning a :class:`~sklearn.utils.Bunch` and writing
its tables and figures when given an output folder:

* :func:`witness_experiment` -- kernel heads over feature ranks (and seeds) on an
  m = 24 witness suite against dense softmax over seeds: ``--quick`` uses the suite at
  the paper's scale (190 sequences, certified rank 8, constructive rank 20), the full
  run the THEORY R6 Hadamard family (4,186 sequences, certified rank 17, constructive
  rank 46). Expected: nothing solved
  below the certified bound, solved at some rank up to the constructive one, softmax
  solved for every seed.
* :func:`length_experiment` -- the same tokens at sequence lengths 1, 2, 3: lengths 1
  and 2 are solved at rank 1 (THEORY R1), length 3 needs a rank above its certified
  bound.

All numbers (ranks, seeds, epochs, feature map ...) live in :data:`SETTINGS`, one
``"quick"`` and one ``"full"`` entry per experiment; keyword arguments override them.
Beyond the paper (issue 8; the results page of the docs): :func:`ood_experiment`
(out-of-distribution scaling over disjoint token pools) and :func:`beyond_experiment`
(signed maps, several heads/layers, nonlinear readouts against the certified bound).

``minip-learn reproduce ...`` (:mod:`minip_learn.cli`) calls these functions.
"""

import copy
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from .datasets import make_witness_suite, minip_targets
from .estimators import KernelAttentionRegressor, SoftmaxAttentionRegressor
from .model_selection import rank_sweep, summarize_sweep
from .model_selection._sweep import _resolve_devices

__all__ = ["SETTINGS", "EXPERIMENTS", "beyond_experiment", "length_experiment",
           "markdown_table", "ood_experiment", "run_experiment", "witness_experiment"]

#: The recipes' grids and training settings: ``SETTINGS[experiment]["quick"|"full"]``.
SETTINGS = {
    "witness": {
        # quick: the m = 24 witness suite at the paper's scale (certified bound 8,
        # constructive rank 20, 190 sequences): the whole transition in ~2-3 minutes.
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
        # full: the THEORY R6 suite (4,186 sequences, certified 17, constructive 46)
        "full": dict(
            suite=dict(n_bits=24, seq_len=3, construction="auto"),
            ranks=(2, 4, 8, 12, 16, 24, 32, 46, 64, 128),
            seeds=(0, 1, 2, 3, 4),
            softmax_seeds=(0, 1, 2, 3, 4),
            kernel=dict(feature_map="table", max_epochs=3000, stop_tolerance=0.5),
            softmax=dict(max_epochs=1500, stop_tolerance=0.5, n_init=8,
                         optimizer="adamw", weight_decay=0.01),
        ),
    },
    "length": {
        "quick": dict(
            suite=dict(n_bits=24, seq_len=3, construction="small"),
            seq_lens=(1, 2, 3),
            ranks=(1, 2, 4, 8, 16, 32),
            seeds=(0,),
            kernel=dict(feature_map="table", max_epochs=800, stop_tolerance=0.5),
        ),
        "full": dict(
            suite=dict(n_bits=24, seq_len=3, construction="small"),
            seq_lens=(1, 2, 3),
            ranks=(1, 2, 4, 8, 16, 32, 64),
            seeds=(0, 1, 2),
            kernel=dict(feature_map="table", max_epochs=3000, stop_tolerance=0.5),
        ),
    },
    # Beyond the paper (issue 8; minip_learn/_experiments_beyond.py, docs/results.rst).
    # ood: disjoint train/test token pools at growing scale (bits per token and pool
    # size). The kernel map is parametric ("exp": exp of a learnable affine map of the
    # token; "table" has no features for unseen tokens). A small stop_tolerance buys the
    # margin that carries an exact fit over to unseen tokens (at 0.25 even softmax fits
    # its training pool exactly and misses ~10% of the test pool).
    "ood": {
        "quick": dict(
            scales=(dict(n_bits=8, n_tokens=256, n_train=1024, n_test=256),
                    dict(n_bits=12, n_tokens=1024), dict(n_bits=16, n_tokens=2048)),
            data=dict(n_train=2048, n_test=512, test_tokens=0.5, min_gap=2, random_state=0),
            ranks=(1, 4, 16, 64),
            seeds=(0,),
            softmax_seeds=(0, 1),
            kernel=dict(feature_map="exp", max_epochs=1500, stop_tolerance=0.05),
            softmax=dict(max_epochs=1500, stop_tolerance=0.05, optimizer="adamw",
                         weight_decay=0.01),
            threshold=0.99,
        ),
        "full": dict(
            scales=(dict(n_bits=8, n_tokens=256, n_train=1024, n_test=256),
                    dict(n_bits=12, n_tokens=1024), dict(n_bits=16, n_tokens=2048),
                    dict(n_bits=24, n_tokens=4096)),
            data=dict(n_train=4096, n_test=1024, test_tokens=0.5, min_gap=2, random_state=0),
            ranks=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            seeds=(0, 1, 2),
            softmax_seeds=(0, 1, 2),
            kernel=dict(feature_map="exp", max_epochs=4000, stop_tolerance=0.05),
            softmax=dict(max_epochs=4000, stop_tolerance=0.05, n_init=2, optimizer="adamw",
                         weight_decay=0.01),
            threshold=0.99,
        ),
    },
    # beyond: variants outside the theorem on the m = 24 small witness suite (bound 8);
    # "table" is the theorem's arbitrary map, "exp" the parametric nonnegative baseline
    # (several layers need a parametric map: deeper layers see real-valued tokens)
    "beyond": {
        "quick": dict(
            suite=dict(n_bits=24, seq_len=3, construction="small"),
            ranks=(2, 4, 8, 16),
            seeds=(0,),
            base=dict(feature_map="table", max_epochs=600, stop_tolerance=0.5),
            variants=(
                ("baseline: table, 1 head", "regressor", {}),
                ("baseline: exp, 1 head", "regressor", dict(feature_map="exp")),
                ("signed: identity", "regressor", dict(feature_map="identity")),
                ("taylor (signed features, positive kernel)", "regressor", dict(feature_map="taylor", ranks=(3, 6, 10, 15))),
                ("signed: rff", "regressor", dict(feature_map="rff")),
                ("2 heads", "regressor", dict(n_heads=2)),
                ("4 heads", "regressor", dict(n_heads=4)),
                ("2 layers (exp)", "regressor", dict(n_layers=2, feature_map="exp")),
                ("MLP readout", "regressor", dict(readout="mlp")),
                ("argmax classifier", "classifier", {}),
            ),
        ),
        "full": dict(
            suite=dict(n_bits=24, seq_len=3, construction="small"),
            ranks=(1, 2, 4, 6, 8, 12, 16, 32),
            seeds=(0, 1, 2),
            base=dict(feature_map="table", max_epochs=2000, stop_tolerance=0.5),
            variants=(
                ("baseline: table, 1 head", "regressor", {}),
                ("baseline: exp, 1 head", "regressor", dict(feature_map="exp")),
                ("signed: identity", "regressor", dict(feature_map="identity")),
                ("taylor (signed features, positive kernel)", "regressor",
                 dict(feature_map="taylor", ranks=(3, 6, 10, 15, 21, 28))),
                ("signed: rff", "regressor", dict(feature_map="rff")),
                ("2 heads", "regressor", dict(n_heads=2)),
                ("4 heads", "regressor", dict(n_heads=4)),
                ("2 layers (exp)", "regressor", dict(n_layers=2, feature_map="exp")),
                ("MLP readout", "regressor", dict(readout="mlp")),
                ("argmax classifier", "classifier", {}),
            ),
        ),
    },
}

#: Names accepted by :func:`run_experiment` (and ``minip-learn reproduce``).
EXPERIMENTS = ("witness", "length", "ood", "beyond")


def _settings(experiment, quick, overrides):
    cfg = copy.deepcopy(SETTINGS[experiment]["quick" if quick else "full"])
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in cfg:
            raise TypeError(
                f"{experiment}_experiment() got an unexpected setting {key!r}; "
                f"settings: {sorted(cfg)}."
            )
        if isinstance(cfg[key], dict) and isinstance(value, dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


def _fmt(value, digits=3):
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if isinstance(value, (float, np.floating)):
        if float(value).is_integer() and abs(value) < 1e6:
            return str(int(value))
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(df, columns=None):
    """A GitHub-markdown table of a DataFrame (no extra dependency).

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.experiments import markdown_table
    >>> print(markdown_table(pd.DataFrame({"rank": [4, 64], "solved": ["0/1", "1/1"]})))
    | rank | solved |
    |---:|---:|
    | 4 | 0/1 |
    | 64 | 1/1 |
    """
    columns = list(df.columns) if columns is None else list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" for _ in columns) + "|"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_fmt(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def _display_summary(summary):
    """The per-setting summary as shown in ``summary.md``."""
    rows = []
    for _, r in summary.iterrows():
        row = {}
        if "seq_len" in r:
            row["seq_len"] = _fmt(r["seq_len"])
        row["model"] = r.get("model", r.get("estimator"))
        fm = r.get("feature_map")
        row["feature map"] = fm if isinstance(fm, str) else "-"
        row["rank"] = _fmt(r["rank"]) if "rank" in r else "-"
        row["solved"] = f"{int(r['n_solved'])}/{int(r['n_fits'])}"
        row["solved fraction [95% CI]"] = (
            f"{r['solved_fraction']:.2f} [{r['solved_ci_low']:.2f}, {r['solved_ci_high']:.2f}]")
        row["exact-match"] = _fmt(r.get("exact_match_mean"))
        row["max error (median)"] = _fmt(r.get("max_abs_error_median"))
        row["epochs"] = _fmt(r.get("n_epochs_mean"), 4)
        row["fit time (s)"] = _fmt(r.get("fit_time_mean"))
        rows.append(row)
    return pd.DataFrame(rows)


def _write_outputs(out, name, results, summary, figures, markdown):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    files["results"] = out / "results.csv"
    results.to_csv(files["results"], index=False)
    files["summary_csv"] = out / "summary.csv"
    summary.to_csv(files["summary_csv"], index=False)
    files["summary_md"] = out / "summary.md"
    files["summary_md"].write_text(markdown + "\n")
    for fig_name, fig in figures.items():
        path = out / f"{fig_name}.png"
        fig.savefig(path, dpi=120)
        files[fig_name] = path
    return files


def _close(figures):
    import matplotlib.pyplot as plt

    for fig in figures.values():
        plt.close(fig)


def witness_experiment(
    *,
    quick=True,
    out=None,
    n_jobs=None,
    devices=None,
    progress=True,
    figures=True,
    ensemble=False,
    **settings,
):
    """Phase transition on a witness suite: kernel heads over rank vs dense softmax.

    Parameters
    ----------
    quick : bool, default=True
        Use ``SETTINGS["witness"]["quick"]`` (a few minutes on 2 cores) instead of
        ``"full"``.
    out : str or path, default=None
        Folder for ``results.csv``, ``summary.csv``, ``summary.md`` and the figures
        (``phase_transition.png``, ``kernel_heatmap.png``); the fits themselves go to
        ``out/runs`` so that a rerun resumes. None keeps everything in memory.
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
    t0 = time.perf_counter()
    _resolve_devices(devices)  # fail at once (e.g. CUDA asked for where there is none)
    cfg = _settings("witness", quick, settings)
    suite = make_witness_suite(**cfg["suite"])
    bound, constructive = int(suite.certified_min_rank), int(suite.constructive_rank)
    runs = None if out is None else Path(out) / "runs"
    tag = f"witness-{suite.construction}-m{suite.X.shape[2]}-N{suite.X.shape[1]}"

    kern = rank_sweep(
        KernelAttentionRegressor(**cfg["kernel"]), suite.X, suite.y,
        ranks=list(cfg["ranks"]), seeds=list(cfg["seeds"]), certified_min_rank=bound,
        n_jobs=n_jobs, devices=devices, out=runs, name=f"{tag}-kernel",
        tags={"model": "kernel"}, return_estimators=figures,
        save_estimators=figures and runs is not None, progress=progress,
        ensemble=ensemble)
    parts = [kern.results]
    if cfg["softmax_seeds"]:
        soft = rank_sweep(
            SoftmaxAttentionRegressor(**cfg["softmax"]), suite.X, suite.y,
            seeds=list(cfg["softmax_seeds"]), n_jobs=n_jobs, devices=devices, out=runs,
            name=f"{tag}-softmax", tags={"model": "softmax"}, progress=progress)
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
    result = Bunch(results=results, summary=summary, markdown=markdown, checks=checks,
                   certified_min_rank=bound, constructive_rank=constructive,
                   smallest_solving_rank=solving[0] if solving else None, figures=figs,
                   settings=cfg, files={}, elapsed=time.perf_counter() - t0)
    if out is not None:
        result.files = _write_outputs(out, "witness", results, summary, figs, markdown)
        _close(figs)
    return result


def _check_lines(checks, labels):
    return [f"- [{'x' if ok else ' '}] {labels.get(name, name)}" for name, ok in checks.items()]


def _witness_markdown(suite, cfg, summary, checks, solving):
    X = suite.X
    lines = [
        f"## Witness suite: phase transition over feature rank",
        "",
        f"Suite `{suite.construction}`: {len(X)} sequences of length {X.shape[1]} over "
        f"{suite.constructive_rank} distinct {X.shape[2]}-bit tokens; certified minimum "
        f"rank **{suite.certified_min_rank}** (THEORY R5), constructive rank "
        f"**{suite.constructive_rank}** (R3). Kernel: "
        + ", ".join(f"{k}={v}" for k, v in cfg["kernel"].items())
        + f"; seeds {list(cfg['seeds'])}. Softmax seeds {list(cfg['softmax_seeds'])}.",
        "",
        markdown_table(_display_summary(summary)),
        "",
        f"Smallest solving kernel rank: {solving[0] if solving else 'none'}.",
        "",
    ]
    lines += _check_lines(checks, {
        "none_solved_below_bound": f"no kernel fit below the certified bound "
                                   f"{suite.certified_min_rank} solved",
        "solved_at_or_below_constructive_rank": f"solved at some rank <= constructive rank "
                                                f"{suite.constructive_rank}",
        "softmax_solved_every_seed": "dense softmax solved for every seed",
    })
    return "\n".join(lines)


def _witness_figures(suite, summary, bound, constructive, kern):
    from .plotting import plot_kernel_heatmap, plot_phase_transition

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
        from .theory import exact_kernel_realization

        est = exact_kernel_realization(tokens=suite.tokens, seq_len=suite.X.shape[1])
        label = f"exact construction (R3), rank {est.rank}"
    ax = plot_kernel_heatmap(est, suite.queries, suite.designated_keys,
                             title=f"Kernel on queries x designated keys\n{label}")
    figs["kernel_heatmap"] = ax.figure
    return figs


def _length_family(tokens, seq_len, suite):
    """All sequences of length 1 or 2 over ``tokens``; the witness suite for 3+."""
    if seq_len >= 3:
        return suite.X, suite.y, int(suite.certified_min_rank)
    if seq_len == 1:
        X = tokens[:, None, :]
    else:
        n = len(tokens)
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        X = np.stack([tokens[i.ravel()], tokens[j.ravel()]], axis=1)
    return X, minip_targets(X), None


def length_experiment(
    *,
    quick=True,
    out=None,
    n_jobs=None,
    devices=None,
    progress=True,
    figures=True,
    ensemble=False,
    **settings,
):
    """Length transition: one token set at sequence lengths 1, 2, 3.

    Length 1 uses every token of a witness suite, length 2 every ordered pair, length 3
    the suite itself. THEORY R1: lengths 1 and 2 are solved at rank 1; length 3 is
    certified to need ``certified_min_rank`` features.

    Parameters
    ----------
    quick : bool, default=True
        ``SETTINGS["length"]["quick"]`` or ``["full"]``.
    out, n_jobs, devices, progress, figures, ensemble
        As in :func:`witness_experiment` (figure: ``length_transition.png``).
    **settings
        Overrides: ``suite``, ``seq_lens``, ``ranks``, ``seeds``, ``kernel``.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``results``, ``summary`` (per ``seq_len`` and ``rank``), ``markdown``,
        ``checks``, ``certified_min_rank`` (of length 3), ``figures``, ``files``,
        ``settings``, ``elapsed``.

    Examples
    --------
    >>> from minip_learn.experiments import length_experiment
    >>> res = length_experiment(seq_lens=(1,), ranks=(1,), kernel={"max_epochs": 5},
    ...                         progress=False, figures=False)
    >>> res.summary[["seq_len", "rank", "n_fits"]].values.tolist()
    [[1, 1, 1]]
    """
    t0 = time.perf_counter()
    _resolve_devices(devices)  # fail at once (e.g. CUDA asked for where there is none)
    cfg = _settings("length", quick, settings)
    suite = make_witness_suite(**cfg["suite"])
    runs = None if out is None else Path(out) / "runs"
    tag = f"length-{suite.construction}-m{suite.X.shape[2]}"
    parts, bounds = [], {}
    for n in cfg["seq_lens"]:
        X, y, bound = _length_family(suite.tokens, int(n), suite)
        if int(n) > suite.X.shape[1]:
            raise ValueError(f"seq_len {n} > the suite's length {suite.X.shape[1]}; "
                             "set suite={'seq_len': ...}.")
        bounds[int(n)] = bound
        res = rank_sweep(
            KernelAttentionRegressor(**cfg["kernel"]), X, y, ranks=list(cfg["ranks"]),
            seeds=list(cfg["seeds"]), certified_min_rank=bound, n_jobs=n_jobs,
            devices=devices, out=runs, name=f"{tag}-N{n}",
            tags={"model": "kernel", "seq_len": int(n), "n_sequences": len(X)},
            progress=progress, ensemble=ensemble)
        parts.append(res.results)
    results = pd.concat(parts, ignore_index=True)
    summary = summarize_sweep(results, by=["seq_len", "model", "feature_map", "rank"])

    def solved_at(n, r):
        g = results[(results["seq_len"] == n) & (results["rank"] == r)]
        return bool(len(g) and g["solved"].all())

    checks = {}
    for n in (1, 2):
        if n in bounds and 1 in cfg["ranks"]:
            checks[f"seq_len_{n}_solved_at_rank_1"] = solved_at(n, 1)
    long = [n for n in bounds if n >= 3]
    for n in long:
        g = results[results["seq_len"] == n]
        checks[f"seq_len_{n}_none_solved_below_bound"] = bool(
            not g.loc[g["rank"] < bounds[n], "solved"].any())
        checks[f"seq_len_{n}_solved_at_some_rank"] = bool(g["solved"].any())
    lines = [
        "## Length transition",
        "",
        f"Tokens of the `{suite.construction}` witness suite ({len(suite.tokens)} tokens, "
        f"{suite.X.shape[2]} bits): length 1 = every token, length 2 = every ordered pair, "
        f"length {suite.X.shape[1]} = the suite ({len(suite.X)} sequences, certified "
        f"minimum rank **{suite.certified_min_rank}**). Kernel: "
        + ", ".join(f"{k}={v}" for k, v in cfg["kernel"].items())
        + f"; seeds {list(cfg['seeds'])}.",
        "",
        markdown_table(_display_summary(summary)),
        "",
    ]
    lines += _check_lines(checks, {})
    markdown = "\n".join(lines)
    figs = {}
    if figures:
        from .plotting import plot_length_transition

        ax = plot_length_transition(summary, certified_min_rank={
            n: b for n, b in bounds.items() if b is not None})
        figs["length_transition"] = ax.figure
    result = Bunch(results=results, summary=summary, markdown=markdown, checks=checks,
                   certified_min_rank=int(suite.certified_min_rank), figures=figs,
                   settings=cfg, files={}, elapsed=time.perf_counter() - t0)
    if out is not None:
        result.files = _write_outputs(out, "length", results, summary, figs, markdown)
        _close(figs)
    return result


def run_experiment(name, **kwargs):
    """Run the experiment ``name`` (one of :data:`EXPERIMENTS`) with ``kwargs``.

    Parameters
    ----------
    name : {"witness", "length", "ood", "beyond"}
    **kwargs
        Keyword arguments of :func:`witness_experiment`, :func:`length_experiment`,
        :func:`ood_experiment` or :func:`beyond_experiment`.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`

    Examples
    --------
    >>> from minip_learn.experiments import run_experiment
    >>> res = run_experiment("length", seq_lens=(1,), ranks=(1,), seeds=(0,),
    ...                      progress=False, figures=False)
    >>> res.checks
    {'seq_len_1_solved_at_rank_1': True}
    """
    funcs = {"witness": witness_experiment, "length": length_experiment,
             "ood": ood_experiment, "beyond": beyond_experiment}
    if name not in funcs:
        raise ValueError(f"unknown experiment {name!r}; choose from {list(funcs)}.")
    return funcs[name](**kwargs)


# the experiments beyond the paper (issue 8) live in their own module
from ._experiments_beyond import beyond_experiment, ood_experiment  # noqa: E402
