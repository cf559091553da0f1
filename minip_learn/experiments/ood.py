"""The ood recipe: exact-match on unseen tokens over feature rank, per problem scale.

Disjoint training and test token pools at growing scale (bits per token and pool size);
kernel heads with a parametric feature map against dense softmax heads.
"""

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from ..datasets import check_token_leakage, make_ood_minip
from ..estimators import KernelAttentionRegressor, SoftmaxAttentionRegressor
from ..metrics import max_abs_error, sequence_exact_match, solved, token_accuracy
from ._shared import Recipe, display, fmt, report, settings_text

__all__ = []  # public home: the package minip_learn.experiments

#: The grids and training settings: ``SETTINGS["quick" | "full"]``. The kernel map is
#: parametric ("exp": exp of a learnable affine map of the token; "table" has no
#: features for unseen tokens). A small stop_tolerance buys the margin that carries an
#: exact fit over to unseen tokens.
SETTINGS = {
    "quick": dict(
        scales=(dict(n_bits=8, n_tokens=256, n_train=1024, n_test=256),
                dict(n_bits=12, n_tokens=1024),
                dict(n_bits=16, n_tokens=2048)),
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
                dict(n_bits=12, n_tokens=1024),
                dict(n_bits=16, n_tokens=2048), dict(n_bits=24, n_tokens=4096)),
        data=dict(n_train=4096, n_test=1024, test_tokens=0.5, min_gap=2, random_state=0),
        ranks=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        seeds=(0, 1, 2),
        softmax_seeds=(0, 1, 2),
        kernel=dict(feature_map="exp", max_epochs=4000, stop_tolerance=0.05),
        softmax=dict(max_epochs=4000, stop_tolerance=0.05, n_init=2, optimizer="adamw",
                     weight_decay=0.01),
        threshold=0.99,
    ),
}


def _test_scores(est, X, y):
    """Held-out scores of a fitted estimator (the test pool's sequences)."""
    pred = est.predict(X)
    return dict(test_exact_match=sequence_exact_match(y, pred),
                test_token_accuracy=token_accuracy(y, pred),
                test_max_abs_error=max_abs_error(y, pred),
                test_solved=bool(solved(y, pred)))


def _scored_sweep(recipe, estimator, data, **sweep):
    """A sweep on the training pool, then every fit scored on the test pool."""
    res = recipe.sweep(estimator, data.X_train, data.y_train, estimators=True, **sweep)
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


def ood_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                   figures=True, ensemble=False, **settings):
    """Out-of-distribution scaling: exact-match on unseen tokens over rank, per scale.

    For every problem scale (``n_bits`` and token-pool size) a token pool is split into
    disjoint training and test pools (:func:`~minip_learn.datasets.make_ood_minip`,
    leakage checked with :func:`~minip_learn.datasets.check_token_leakage`); kernel
    heads with a parametric feature map are trained on the training pool's sequences
    for every rank and seed and scored on the test pool's, next to dense softmax heads
    (the paper's OOD experiment, see :ref:`theory-experiments`). The table feature map
    cannot be used here:
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
    recipe = Recipe("ood", SETTINGS, quick=quick, out=out, n_jobs=n_jobs, devices=devices,
                    progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    cfg = recipe.cfg
    if cfg["kernel"].get("feature_map") == "table":
        raise ValueError("feature_map='table' has no features for unseen tokens; the OOD "
                         "experiment needs a parametric map (favor+, exp, elu+1 ...).")
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
            recipe, KernelAttentionRegressor(**cfg["kernel"]), data, name=f"{tag}-kernel",
            ranks=list(cfg["ranks"]), seeds=list(cfg["seeds"]),
            tags={"model": "kernel", **tags}))
        if cfg["softmax_seeds"]:
            parts.append(_scored_sweep(
                recipe, SoftmaxAttentionRegressor(**cfg["softmax"]), data,
                name=f"{tag}-softmax", seeds=list(cfg["softmax_seeds"]),
                tags={"model": "softmax", **tags}))
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
        from ..plotting import plot_ood_transition

        ax = plot_ood_transition(summary, threshold=cfg["threshold"])
        figs["ood_transition"] = ax.figure
    return recipe.finish(Bunch(results=results, summary=summary, jump_ranks=jumps,
                               markdown=markdown, checks=checks, figures=figs),
                         table=display(summary, _ood_row))


def _ood_row(r):
    return {
        "n_bits": fmt(r["n_bits"]),
        "tokens": fmt(r["n_tokens"]),
        "model": r["model"],
        "feature map": r["feature_map"] if isinstance(r["feature_map"], str) else "-",
        "rank": fmt(r["rank"]),
        "train exact-match": fmt(r["train_exact_match"]),
        "test exact-match (mean)": fmt(r["test_exact_match"]),
        "test exact-match (min)": fmt(r["test_exact_match_min"]),
        "test solved": f"{int(r['test_solved'])}/{int(r['n_fits'])}",
        "test max error (median)": fmt(r["test_max_error_median"]),
        "epochs": fmt(r["epochs"], 4),
    }


def _ood_markdown(cfg, datasets, summary, jumps, checks):
    scales = "; ".join(
        f"m = {d.params['n_bits']}: {d.params['n_train_tokens']} training / "
        f"{d.params['n_test_tokens']} test tokens, {len(d.X_train)} / {len(d.X_test)} "
        f"sequences" for d in datasets)
    thr = cfg["threshold"]
    return report(
        "Out-of-distribution scaling: disjoint train/test token pools",
        f"Scales: {scales}. Hard length-3 sequences (min_gap="
        f"{cfg['data'].get('min_gap', 2)}); no test token occurs in training. Kernel: "
        + settings_text(cfg["kernel"])
        + f"; seeds {list(cfg['seeds'])}. Softmax: seeds {list(cfg['softmax_seeds'])}. "
        "Exact-match is the fraction of sequences with every position within 1/2; "
        "*test solved* counts fits that are exact on every test sequence.",
        display(summary, _ood_row), checks,
        note="Jump rank (smallest rank whose every seed reaches test exact-match "
             f">= {thr}): " + ", ".join(
                 f"m = {datasets[s].params['n_bits']}: "
                 + (str(j) if j is not None else f"not reached (ranks <= {max(cfg['ranks'])})")
                 for s, j in jumps.items()) + ".",
        labels={
            "no_token_leakage": "no token shared between the training and test pools",
            "softmax_exact_on_test_every_seed": "dense softmax exact on the held-out pool "
                                                "for every seed and scale",
            "kernel_jump_found_at_smallest_scale": f"kernel test exact-match >= {thr} "
                                                   "reached at the smallest scale",
            "jump_rank_nondecreasing_with_scale": "the jump rank does not decrease as the "
                                                  "problem grows (not reached = beyond the "
                                                  "largest rank tried)",
        })
