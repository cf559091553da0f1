"""Experiments beyond the paper's witness suite (issue 8): OOD scaling and variants.

Imported at the bottom of :mod:`minip_learn.experiments`, which re-exports
:func:`ood_experiment` and :func:`beyond_experiment`; their grids live in
``minip_learn.experiments.SETTINGS["ood"]`` and ``SETTINGS["beyond"]``.
"""

import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.utils import Bunch

from .datasets import check_token_leakage, make_ood_minip, make_witness_suite
from .estimators import KernelAttentionRegressor, SoftmaxAttentionRegressor
from .metrics import max_abs_error, sequence_exact_match, solved, token_accuracy
from .model_selection import rank_sweep
from .model_selection._sweep import _resolve_devices

__all__ = ["beyond_experiment", "ood_experiment"]


# -- out-of-distribution scaling ------------------------------------------------------
def _test_scores(est, X, y):
    """Held-out scores of a fitted estimator (the test pool's sequences)."""
    pred = est.predict(X)
    return dict(test_exact_match=sequence_exact_match(y, pred),
                test_token_accuracy=token_accuracy(y, pred),
                test_max_abs_error=max_abs_error(y, pred),
                test_solved=bool(solved(y, pred)))


def _scored_sweep(estimator, data, *, ranks, seeds, n_jobs, devices, runs, name, tags,
                  progress, ensemble):
    """rank_sweep on the training pool, then every fit scored on the test pool."""
    res = rank_sweep(
        estimator, data.X_train, data.y_train, ranks=ranks, seeds=seeds, n_jobs=n_jobs,
        devices=devices, out=runs, name=name, tags=tags, return_estimators=True,
        save_estimators=runs is not None, progress=progress, ensemble=ensemble)
    rows = res.results.copy()
    scores = [_test_scores(res.estimators[fid], data.X_test, data.y_test)
              for fid in rows["fit_id"]]
    return pd.concat([rows.reset_index(drop=True), pd.DataFrame(scores)], axis=1)


def _ood_summary(results):
    keys = ["scale", "n_bits", "n_tokens", "model", "feature_map", "rank"]
    g = results.assign(rank=results["rank"].fillna(-1)).groupby(keys, dropna=False,
                                                                sort=True)
    out = g.agg(n_fits=("seed", "size"),
                train_exact_match=("exact_match", "mean"),
                test_exact_match=("test_exact_match", "mean"),
                test_exact_match_min=("test_exact_match", "min"),
                test_solved=("test_solved", "sum"),
                test_max_error_median=("test_max_abs_error", "median"),
                epochs=("n_epochs", "mean"),
                fit_time=("fit_time", "mean")).reset_index()
    out["rank"] = out["rank"].where(out["rank"] >= 0)
    return out


def _jump_ranks(summary, threshold):
    """Per scale: the smallest kernel rank whose every seed reaches ``threshold``."""
    jumps = {}
    k = summary[summary["model"] == "kernel"]
    for scale, g in k.groupby("scale"):
        ok = g.loc[g["test_exact_match_min"] >= threshold, "rank"]
        jumps[int(scale)] = int(ok.min()) if len(ok) else None
    return jumps


def ood_experiment(
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
    """Out-of-distribution scaling: exact-match on unseen tokens over rank, per scale.

    For every problem scale (``n_bits`` and token-pool size) a token pool is split into
    disjoint training and test pools (:func:`~minip_learn.datasets.make_ood_minip`,
    leakage checked with :func:`~minip_learn.datasets.check_token_leakage`); kernel
    heads with a parametric feature map are trained on the training pool's sequences
    for every rank and seed and scored on the test pool's, next to dense softmax heads
    (THEORY §4, the paper's OOD experiment). The table feature map cannot be used here:
    it has no features for unseen tokens.

    Parameters
    ----------
    quick : bool, default=True
        ``SETTINGS["ood"]["quick"]`` (a few minutes on 2 cores) or ``["full"]``.
    out, n_jobs, devices, progress, figures, ensemble
        As in :func:`~minip_learn.experiments.witness_experiment` (figure:
        ``ood_transition.png``; fits and their estimators under ``out/runs``).
    **settings
        Overrides: ``scales`` (list of dicts of :func:`make_ood_minip` size arguments,
        e.g. ``{"n_bits": 8, "n_tokens": 128}``), ``data`` (the other arguments of
        :func:`make_ood_minip`), ``ranks``, ``seeds``, ``softmax_seeds``, ``kernel``,
        ``softmax``, ``threshold`` (test exact-match that counts as the jump).

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``results`` (one row per fit: training scores as in
        :func:`~minip_learn.model_selection.rank_sweep` plus ``test_exact_match``,
        ``test_token_accuracy``, ``test_max_abs_error``, ``test_solved`` and the scale),
        ``summary`` (per scale, model and rank), ``jump_ranks`` (scale -> smallest rank
        whose every seed reaches ``threshold`` test exact-match, or None), ``markdown``,
        ``checks``, ``figures``, ``files``, ``settings``, ``elapsed``.

    Examples
    --------
    >>> from minip_learn.experiments import ood_experiment
    >>> res = ood_experiment(
    ...     scales=[{"n_bits": 8, "n_tokens": 128}], data={"n_train": 40, "n_test": 20},
    ...     ranks=(2,), seeds=(0,), softmax_seeds=(0,), kernel={"max_epochs": 5},
    ...     softmax={"max_epochs": 5, "n_init": 1}, progress=False, figures=False)
    >>> res.summary[["n_bits", "model", "n_fits"]].values.tolist()
    [[8, 'kernel', 1], [8, 'softmax', 1]]
    >>> res.checks["no_token_leakage"]
    True
    """
    t0 = time.perf_counter()
    _resolve_devices(devices)
    cfg = _settings("ood", quick, settings)
    if cfg["kernel"].get("feature_map") == "table":
        raise ValueError("feature_map='table' has no features for unseen tokens; the OOD "
                         "experiment needs a parametric map (favor+, exp, elu+1 ...).")
    runs = None if out is None else Path(out) / "runs"
    parts, datasets, leak_ok = [], [], True
    for i, scale in enumerate(cfg["scales"]):
        params = {**cfg["data"], **scale}
        data = make_ood_minip(**params)
        try:
            check_token_leakage(data.X_train, data.X_test)
        except ValueError:  # pragma: no cover - make_ood_minip already checks
            leak_ok = False
        datasets.append(data)
        m, n_tok = data.params["n_bits"], data.params["n_tokens"]
        tags = {"scale": i, "n_bits": m, "n_tokens": n_tok,
                "n_train": len(data.X_train), "n_test": len(data.X_test)}
        tag = f"ood-m{m}-T{n_tok}-n{len(data.X_train)}"
        parts.append(_scored_sweep(
            KernelAttentionRegressor(**cfg["kernel"]), data, ranks=list(cfg["ranks"]),
            seeds=list(cfg["seeds"]), n_jobs=n_jobs, devices=devices, runs=runs,
            name=f"{tag}-kernel", tags={"model": "kernel", **tags}, progress=progress,
            ensemble=ensemble))
        if cfg["softmax_seeds"]:
            parts.append(_scored_sweep(
                SoftmaxAttentionRegressor(**cfg["softmax"]), data, ranks=None,
                seeds=list(cfg["softmax_seeds"]), n_jobs=n_jobs, devices=devices,
                runs=runs, name=f"{tag}-softmax", tags={"model": "softmax", **tags},
                progress=progress, ensemble=ensemble))
    results = pd.concat(parts, ignore_index=True)
    if "feature_map" not in results:
        results["feature_map"] = None
    results["feature_map"] = results["feature_map"].where(results["model"] == "kernel")
    summary = _ood_summary(results)
    jumps = _jump_ranks(summary, cfg["threshold"])
    soft = results[results["model"] == "softmax"]
    # a scale whose jump was not reached has it beyond the largest rank tried
    order = [np.inf if j is None else j for _, j in sorted(jumps.items())]
    checks = {
        "no_token_leakage": leak_ok,
        "softmax_exact_on_test_every_seed": bool(len(soft) > 0 and soft["test_solved"].all()),
        "kernel_jump_found_at_smallest_scale": bool(order and np.isfinite(order[0])),
        "jump_rank_nondecreasing_with_scale": bool(
            order and all(a <= b for a, b in zip(order, order[1:]))),
    }
    markdown = _ood_markdown(cfg, datasets, summary, jumps, checks)
    figs = {}
    if figures:
        from .plotting import plot_ood_transition

        ax = plot_ood_transition(summary, threshold=cfg["threshold"])
        figs["ood_transition"] = ax.figure
    result = Bunch(results=results, summary=summary, jump_ranks=jumps, markdown=markdown,
                   checks=checks, figures=figs, settings=cfg, files={},
                   elapsed=time.perf_counter() - t0)
    if out is not None:
        result.files = _write_outputs(out, "ood", results, summary, figs, markdown)
        result.files["table"] = _write_table(out, _ood_display(summary))
        _close(figs)
    return result


def _ood_display(summary):
    rows = []
    for _, r in summary.iterrows():
        rows.append({
            "n_bits": _fmt(r["n_bits"]),
            "tokens": _fmt(r["n_tokens"]),
            "model": r["model"],
            "feature map": r["feature_map"] if isinstance(r["feature_map"], str) else "-",
            "rank": _fmt(r["rank"]),
            "train exact-match": _fmt(r["train_exact_match"]),
            "test exact-match (mean)": _fmt(r["test_exact_match"]),
            "test exact-match (min)": _fmt(r["test_exact_match_min"]),
            "test solved": f"{int(r['test_solved'])}/{int(r['n_fits'])}",
            "test max error (median)": _fmt(r["test_max_error_median"]),
            "epochs": _fmt(r["epochs"], 4),
        })
    return pd.DataFrame(rows)


def _ood_markdown(cfg, datasets, summary, jumps, checks):
    scales = "; ".join(
        f"m = {d.params['n_bits']}: {d.params['n_train_tokens']} training / "
        f"{d.params['n_test_tokens']} test tokens, {len(d.X_train)} / {len(d.X_test)} "
        f"sequences" for d in datasets)
    thr = cfg["threshold"]
    lines = [
        "## Out-of-distribution scaling: disjoint train/test token pools",
        "",
        f"Scales: {scales}. Hard length-3 sequences (min_gap="
        f"{cfg['data'].get('min_gap', 2)}); no test token occurs in training. Kernel: "
        + ", ".join(f"{k}={v}" for k, v in cfg["kernel"].items())
        + f"; seeds {list(cfg['seeds'])}. Softmax: seeds {list(cfg['softmax_seeds'])}. "
        "Exact-match is the fraction of sequences with every position within 1/2; "
        "*test solved* counts fits that are exact on every test sequence.",
        "",
        markdown_table(_ood_display(summary)),
        "",
        "Jump rank (smallest rank whose every seed reaches test exact-match "
        f">= {thr}): " + ", ".join(
            f"m = {datasets[s].params['n_bits']}: "
            + (str(j) if j is not None else f"not reached (ranks <= {max(cfg['ranks'])})")
            for s, j in jumps.items()) + ".",
        "",
    ]
    lines += _check_lines(checks, {
        "no_token_leakage": "no token shared between the training and test pools",
        "softmax_exact_on_test_every_seed": "dense softmax exact on the held-out pool for "
                                            "every seed and scale",
        "kernel_jump_found_at_smallest_scale": f"kernel test exact-match >= {thr} "
                                               "reached at the smallest scale",
        "jump_rank_nondecreasing_with_scale": "the jump rank does not decrease as the "
                                              "problem grows (not reached = beyond the "
                                              "largest rank tried)",
    })
    return "\n".join(lines)


# -- variants outside the theorem -------------------------------------------------------
def _variant_estimator(kind, params):
    if kind == "classifier":
        from .estimators import KernelAttentionClassifier

        return KernelAttentionClassifier(**params)
    if kind == "regressor":
        return KernelAttentionRegressor(**params)
    raise ValueError(f"variant kind must be 'regressor' or 'classifier'; got {kind!r}.")


def _capacity_columns(est, X):
    from .theory import transcript_check

    try:
        check = transcript_check(est, X)
    except (ValueError, AttributeError):  # pragma: no cover - a model without a sketch
        return dict(capacity_bits=np.nan, transcript_bits=np.nan, capacity_ratio=np.nan)
    return dict(capacity_bits=check.capacity_bits, transcript_bits=check.required_bits,
                capacity_ratio=check.ratio)


def beyond_experiment(
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
    """Variants outside the theorem on a certified witness suite (THEORY R7, R8).

    On the m = 24 ``"small"`` witness suite (190 length-3 sequences, certified minimum
    rank 8 for a single nonnegative head with an affine readout) every variant is swept
    over ranks below and above the bound next to the nonnegative single-head baseline:
    signed feature maps (``identity``, ``taylor``, ``rff``), several heads
    (``n_heads``) or layers (``n_layers``), an MLP readout and the argmax
    :class:`~minip_learn.KernelAttentionClassifier`. Every row carries
    ``theorem_applies`` as the estimator reports it (False for signed kernels, several
    heads or layers and nonlinear readouts: a "solved" below the bound is then a
    finding, not a bug; ``taylor`` has signed features but a positive kernel, so the
    bound still applies to it) and the R8 comparison of the model's channel capacity
    (heads x layers x rank x bits) with the transcript bound of the family
    (:func:`~minip_learn.theory.transcript_check`).

    Parameters
    ----------
    quick : bool, default=True
        ``SETTINGS["beyond"]["quick"]`` or ``["full"]``.
    out, n_jobs, devices, progress, figures, ensemble
        As in :func:`~minip_learn.experiments.witness_experiment` (figure:
        ``variants.png``).
    **settings
        Overrides: ``suite``, ``ranks``, ``seeds``, ``base`` (estimator parameters
        shared by every variant) and ``variants`` (a list of ``(name, kind, params)``
        with ``kind`` ``"regressor"`` or ``"classifier"``; ``params`` override
        ``base`` and may hold their own ``ranks``, e.g. for ``taylor``, whose rank is
        ``1 + p + p(p+1)/2``).

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``results`` (one row per fit, with ``variant``), ``summary`` (per variant and
        rank: ``theorem_applies``, ``solved_fraction``, ``capacity_bits``,
        ``transcript_bits``), ``solved_below_bound`` (variant -> smallest rank below the
        bound at which a seed solved, or None), ``markdown``, ``checks``,
        ``certified_min_rank``, ``figures``, ``files``, ``settings``, ``elapsed``.

    Examples
    --------
    >>> from minip_learn.experiments import beyond_experiment
    >>> res = beyond_experiment(
    ...     ranks=(2,), variants=[("baseline", "regressor", {})],
    ...     base={"feature_map": "table", "max_epochs": 5}, progress=False, figures=False)
    >>> res.summary[["variant", "rank", "theorem_applies"]].values.tolist()
    [['baseline', 2, True]]
    """
    t0 = time.perf_counter()
    _resolve_devices(devices)
    cfg = _settings("beyond", quick, settings)
    suite = make_witness_suite(**cfg["suite"])
    bound = int(suite.certified_min_rank)
    runs = None if out is None else Path(out) / "runs"
    tag = f"beyond-{suite.construction}-m{suite.X.shape[2]}"
    parts, caps = [], []
    for name, kind, params in cfg["variants"]:
        params = dict(params)
        ranks = list(params.pop("ranks", cfg["ranks"]))
        est = _variant_estimator(kind, {**cfg["base"], **params})
        sweep = dict(ranks=ranks, seeds=list(cfg["seeds"]), certified_min_rank=bound,
                     n_jobs=n_jobs, devices=devices, out=runs, name=f"{tag}-{name}",
                     tags={"variant": name, "kind": kind}, return_estimators=True,
                     save_estimators=runs is not None, progress=progress)
        try:
            res = rank_sweep(est, suite.X, suite.y, ensemble=ensemble, **sweep)
        except ValueError:
            if not ensemble:
                raise
            # batched ensembles stack single heads only (not n_heads/n_layers > 1):
            # those variants are fitted one by one (same rows, resumable)
            res = rank_sweep(est, suite.X, suite.y, ensemble=False, **sweep)
        rows = res.results.reset_index(drop=True)
        extra = pd.DataFrame([_capacity_columns(res.estimators[f], suite.X)
                              for f in rows["fit_id"]])
        parts.append(pd.concat([rows, extra], axis=1))
    results = pd.concat(parts, ignore_index=True)
    if "theorem_applies" not in results:  # pragma: no cover - older sweeps
        results["theorem_applies"] = None
    order = {name: i for i, (name, _, _) in enumerate(cfg["variants"])}
    summary = (results.groupby(["variant", "rank"], sort=False)
               .agg(kind=("kind", "first"),
                    theorem_applies=("theorem_applies", lambda s: bool(s.fillna(True).all())),
                    n_fits=("seed", "size"), n_solved=("solved", "sum"),
                    solved_fraction=("solved", "mean"),
                    exact_match=("exact_match", "mean"),
                    max_error_median=("max_abs_error", "median"),
                    capacity_bits=("capacity_bits", "first"),
                    transcript_bits=("transcript_bits", "first"),
                    epochs=("n_epochs", "mean"))
               .reset_index())
    summary = summary.sort_values(["variant", "rank"], key=lambda c: c.map(order)
                                  if c.name == "variant" else c).reset_index(drop=True)
    summary["certified_min_rank"] = bound
    below = {}
    for name, g in summary.groupby("variant", sort=False):
        hit = g.loc[(g["rank"] < bound) & (g["n_solved"] > 0), "rank"]
        below[name] = int(hit.min()) if len(hit) else None
    covered = results[results["theorem_applies"].fillna(True).astype(bool)]
    checks = {
        "no_covered_fit_solved_below_bound": bool(
            not covered.loc[covered["rank"] < bound, "solved"].any()),
    }
    markdown = _beyond_markdown(suite, cfg, summary, below, checks)
    figs = {}
    if figures:
        from .plotting import plot_variant_sweep

        ax = plot_variant_sweep(
            summary, certified_min_rank=bound,
            title=f"Variants on the m = {suite.X.shape[2]} witness suite "
                  f"({len(suite.X)} sequences)")
        figs["variants"] = ax.figure
    result = Bunch(results=results, summary=summary, solved_below_bound=below,
                   markdown=markdown, checks=checks, certified_min_rank=bound, figures=figs,
                   settings=cfg, files={}, elapsed=time.perf_counter() - t0)
    if out is not None:
        result.files = _write_outputs(out, "beyond", results, summary, figs, markdown)
        result.files["table"] = _write_table(out, _beyond_display(summary))
        _close(figs)
    return result


def _write_table(out, frame):
    """The displayed table as ``table.csv`` (what the docs' results page includes)."""
    path = Path(out) / "table.csv"
    frame.to_csv(path, index=False)
    return path


def _beyond_display(summary):
    rows = []
    for _, r in summary.iterrows():
        rows.append({
            "variant": r["variant"],
            "theorem applies": "yes" if r["theorem_applies"] else "no (R7)",
            "rank": _fmt(r["rank"]),
            "solved": f"{int(r['n_solved'])}/{int(r['n_fits'])}",
            "exact-match": _fmt(r["exact_match"]),
            "max error (median)": _fmt(r["max_error_median"]),
            "capacity / transcript bits (R8)":
                f"{_fmt(r['capacity_bits'])} / {_fmt(r['transcript_bits'])}",
            "epochs": _fmt(r["epochs"], 4),
        })
    return pd.DataFrame(rows)


def _beyond_markdown(suite, cfg, summary, below, checks):
    bound = int(suite.certified_min_rank)
    lines = [
        "## Beyond the theorem: variants against the certified bound",
        "",
        f"Suite `{suite.construction}`: {len(suite.X)} sequences of length "
        f"{suite.X.shape[1]} over {suite.X.shape[2]}-bit tokens; certified minimum rank "
        f"**{bound}** for a single nonnegative head with an affine readout (R5). Shared "
        "settings: " + ", ".join(f"{k}={v}" for k, v in cfg["base"].items())
        + f"; seeds {list(cfg['seeds'])}. Variants marked *no (R7)* are outside the "
        "theorem: solving below the bound is allowed for them and is reported as a "
        "finding. The R8 column compares the model's channel capacity (heads x layers "
        "x rank x significand bits) with the transcript bound of one sequence.",
        "",
        markdown_table(_beyond_display(summary)),
        "",
        "Solved below the certified bound: " + ", ".join(
            f"{name}: {'rank ' + str(r) if r is not None else 'no'}"
            for name, r in below.items()) + ".",
        "",
    ]
    lines += _check_lines(checks, {
        "no_covered_fit_solved_below_bound": f"no fit covered by the theorem solved below "
                                             f"rank {bound}",
    })
    return "\n".join(lines)


# Imported last: minip_learn.experiments imports this module at its own end, so either
# module may be imported first (the helpers below are defined before that point).
from .experiments import (  # noqa: E402
    _check_lines,
    _close,
    _fmt,
    _settings,
    _write_outputs,
    markdown_table,
)
