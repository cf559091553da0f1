"""The beyond recipe: variants outside the theorem against a certified bound.

On the m = 24 ``"small"`` witness suite (certified minimum rank 8 for one nonnegative
head with an affine readout): signed feature maps, several heads or layers, an MLP
readout and the argmax classifier, next to the nonnegative single-head baselines.
"""

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from ..datasets import make_witness_suite
from ..estimators import KernelAttentionClassifier, KernelAttentionRegressor
from ._shared import Recipe, display, fmt, report, settings_text, theorem_text

__all__ = []  # public home: the package minip_learn.experiments


def _variants(taylor_ranks):
    """The variants of both grids; ``taylor``'s rank is ``1 + p + p(p+1)/2``."""
    return (
        ("baseline: table, 1 head", "regressor", {}),
        ("baseline: exp, 1 head", "regressor", dict(feature_map="exp")),
        ("signed: identity", "regressor", dict(feature_map="identity")),
        ("taylor (signed features, positive kernel)", "regressor",
         dict(feature_map="taylor", ranks=taylor_ranks)),
        ("signed: rff", "regressor", dict(feature_map="rff")),
        ("2 heads", "regressor", dict(n_heads=2)),
        ("4 heads", "regressor", dict(n_heads=4)),
        ("2 layers (exp)", "regressor", dict(n_layers=2, feature_map="exp")),
        ("MLP readout", "regressor", dict(readout="mlp")),
        ("argmax classifier", "classifier", {}),
    )


#: The grids and training settings: ``SETTINGS["quick" | "full"]``. "table" is the
#: theorem's arbitrary map, "exp" the parametric nonnegative baseline (several layers
#: need a parametric map: deeper layers see real-valued tokens).
SETTINGS = {
    "quick": dict(
        suite=dict(n_bits=24, seq_len=3, construction="small"),
        ranks=(2, 4, 8, 16),
        seeds=(0,),
        base=dict(feature_map="table", max_epochs=600, stop_tolerance=0.5),
        variants=_variants(taylor_ranks=(3, 6, 10, 15)),
    ),
    "full": dict(
        suite=dict(n_bits=24, seq_len=3, construction="small"),
        ranks=(1, 2, 4, 6, 8, 12, 16, 32),
        seeds=(0, 1, 2),
        base=dict(feature_map="table", max_epochs=2000, stop_tolerance=0.5),
        variants=_variants(taylor_ranks=(3, 6, 10, 15, 21, 28)),
    ),
}


def _variant_estimator(kind, params):
    if kind == "classifier":
        return KernelAttentionClassifier(**params)
    if kind == "regressor":
        return KernelAttentionRegressor(**params)
    raise ValueError(f"variant kind must be 'regressor' or 'classifier'; got {kind!r}.")


def _capacity_columns(est, X):
    from ..theory import transcript_check

    try:
        check = transcript_check(est, X)
    except (ValueError, AttributeError):  # pragma: no cover - a model without a sketch
        return dict(capacity_bits=np.nan, transcript_bits=np.nan, capacity_ratio=np.nan)
    return dict(capacity_bits=check.capacity_bits, transcript_bits=check.required_bits,
                capacity_ratio=check.ratio)


def beyond_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                      figures=True, ensemble=False, **settings):
    """Variants outside the theorem on a certified witness suite.

    On the m = 24 ``"small"`` witness suite (190 length-3 sequences, certified minimum
    rank 8 for a single nonnegative head with an affine readout) every variant is swept
    over ranks below and above the bound next to the nonnegative single-head baseline:
    signed feature maps (``identity``, ``taylor``, ``rff``), several heads
    (``n_heads``) or layers (``n_layers``), an MLP readout and the argmax
    :class:`~minip_learn.KernelAttentionClassifier`. Every row carries
    ``theorem_applies`` as the estimator reports it (False for signed kernels, several
    heads or layers and nonlinear readouts: a "solved" below the bound is then a
    finding, not a bug; ``taylor`` has signed features but a positive kernel, so the
    bound still applies to it; see :ref:`theory-r7`) and the comparison of the model's
    channel capacity (heads x layers x rank x bits) with the transcript bound of the
    family (:func:`~minip_learn.theory.transcript_check`, see :ref:`theory-r8`).

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
    recipe = Recipe("beyond", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    cfg = recipe.cfg
    suite = make_witness_suite(**cfg["suite"])
    bound = int(suite.certified_min_rank)
    tag = f"beyond-{suite.construction}-m{suite.X.shape[2]}"
    parts = []
    for name, kind, params in cfg["variants"]:
        params = dict(params)
        ranks = list(params.pop("ranks", cfg["ranks"]))
        est = _variant_estimator(kind, {**cfg["base"], **params})
        sweep = dict(name=f"{tag}-{name}", ranks=ranks, seeds=list(cfg["seeds"]),
                     certified_min_rank=bound, tags={"variant": name, "kind": kind},
                     estimators=True)
        try:
            res = recipe.sweep(est, suite.X, suite.y, **sweep)
        except ValueError:
            if not ensemble:
                raise
            # batched ensembles stack single heads only (not n_heads/n_layers > 1):
            # those variants are fitted one by one (same rows, resumable)
            res = recipe.sweep(est, suite.X, suite.y, ensemble=False, **sweep)
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
        from ..plotting import plot_variant_sweep

        ax = plot_variant_sweep(
            summary, certified_min_rank=bound,
            title=f"Variants on the m = {suite.X.shape[2]} witness suite "
                  f"({len(suite.X)} sequences)")
        figs["variants"] = ax.figure
    return recipe.finish(Bunch(results=results, summary=summary, solved_below_bound=below,
                               markdown=markdown, checks=checks, certified_min_rank=bound,
                               figures=figs),
                         table=display(summary, _beyond_row))

def _beyond_row(r):
    return {
        "variant": r["variant"],
        "theorem applies": theorem_text(r["theorem_applies"]),
        "rank": fmt(r["rank"]),
        "solved": f"{int(r['n_solved'])}/{int(r['n_fits'])}",
        "exact-match": fmt(r["exact_match"]),
        "max error (median)": fmt(r["max_error_median"]),
        "capacity / transcript bits (R8)":
            f"{fmt(r['capacity_bits'])} / {fmt(r['transcript_bits'])}",
        "epochs": fmt(r["epochs"], 4),
    }


def _beyond_markdown(suite, cfg, summary, below, checks):
    bound = int(suite.certified_min_rank)
    return report(
        "Beyond the theorem: variants against the certified bound",
        f"Suite `{suite.construction}`: {len(suite.X)} sequences of length "
        f"{suite.X.shape[1]} over {suite.X.shape[2]}-bit tokens; certified minimum rank "
        f"**{bound}** for a single nonnegative head with an affine readout (R5). Shared "
        "settings: " + settings_text(cfg["base"])
        + f"; seeds {list(cfg['seeds'])}. Variants marked *no (R7)* are outside the "
        "theorem: solving below the bound is allowed for them and is reported as a "
        "finding. The R8 column compares the model's channel capacity (heads x layers "
        "x rank x significand bits) with the transcript bound of one sequence.",
        display(summary, _beyond_row), checks,
        note="Solved below the certified bound: " + ", ".join(
            f"{name}: {'rank ' + str(r) if r is not None else 'no'}"
            for name, r in below.items()) + ".",
        labels={
            "no_covered_fit_solved_below_bound": "no fit covered by the theorem solved "
                                                 f"below rank {bound}",
        })
