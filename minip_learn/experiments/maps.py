"""The maps recipe: a leaderboard of every registered feature map.

Each map of the registry is swept over rank on a witness suite (the smallest rank at
which it solves the suite, the theorem flag and the smallest kernel value measured on
the training tokens) and fitted once on an out-of-distribution task (exact-match on
unseen tokens at a fixed rank).
"""

import math

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from ..datasets import make_ood_minip, make_witness_suite
from ..estimators import KernelAttentionRegressor
from ..metrics import sequence_exact_match
from ..nn import available_feature_maps, get_feature_map
from ._shared import Recipe, display, fmt, report, settings_text, theorem_text

__all__ = []  # public home: the package minip_learn.experiments

#: The grids and training settings: ``SETTINGS["quick" | "full"]``. ``maps=None``
#: means every registered map. A map whose rank has a form (``taylor``, ``dpfp``,
#: ``hedgehog``, ``rebased``) is swept at the smallest valid rank at or above each
#: rank of the grid.
SETTINGS = {
    # quick: the m = 24 witness suite (190 sequences, certified bound 8) and a small
    # OOD task, one seed, a short budget
    "quick": dict(
        maps=None,
        suite=dict(n_bits=24, seq_len=3, construction="small"),
        ranks=(8, 16, 32),
        seeds=(0,),
        kernel=dict(max_epochs=500, stop_tolerance=0.5),
        ood=dict(n_bits=8, n_tokens=256, n_train=512, n_test=256, test_tokens=0.5,
                 min_gap=2, random_state=0),
        ood_rank=16,
        ood_kernel=dict(max_epochs=200, stop_tolerance=0.05),
    ),
    # full: the Hadamard suite of the theory page, R6 (certified bound 17)
    "full": dict(
        maps=None,
        suite=dict(n_bits=24, seq_len=3, construction="auto"),
        ranks=(2, 4, 8, 12, 16, 24, 32, 46, 64, 128),
        seeds=(0, 1, 2),
        kernel=dict(max_epochs=3000, stop_tolerance=0.5),
        ood=dict(n_bits=12, n_tokens=1024, n_train=2048, n_test=512, test_tokens=0.5,
                 min_gap=2, random_state=0),
        ood_rank=64,
        ood_kernel=dict(max_epochs=1500, stop_tolerance=0.05),
    ),
}


def _valid_rank(cls, n_bits, rank):
    """The smallest rank ``>= rank`` that the map class accepts."""
    check = getattr(cls, "check_params", None)
    if check is None:
        return rank
    for r in range(rank, 4 * rank + 64):
        try:
            check(n_bits, r)
        except ValueError:
            continue
        return r
    raise ValueError(f"feature map {cls.name!r} accepts no rank from {rank} to {r}.")


def _map_ranks(name, n_bits, ranks):
    cls = get_feature_map(name)
    return sorted({_valid_rank(cls, n_bits, int(r)) for r in ranks})


def _ood_exact_match(recipe, name, cfg, data):
    """Exact-match on the test pool of one fit at ``ood_rank`` (nan for maps that
    reject unseen tokens), and the rank used."""
    rank = _valid_rank(get_feature_map(name), data.X_train.shape[2], cfg["ood_rank"])
    est = KernelAttentionRegressor(feature_map=name, **cfg["ood_kernel"])
    res = recipe.sweep(est, data.X_train, data.y_train, name=f"maps-ood-{name}",
                       ranks=[rank], seeds=[cfg["seeds"][0]], estimators=True)
    fitted = res.estimators[res.results["fit_id"].iloc[0]]
    if get_feature_map(name).requires_vocabulary:
        return math.nan, rank
    return float(sequence_exact_match(data.y_test, fitted.predict(data.X_test))), rank


def maps_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                    figures=True, ensemble=False, **settings):
    """A leaderboard of feature maps: rank needed, theorem flag, OOD exact-match.

    Every map of ``maps`` (default: every registered map, see
    :func:`~minip_learn.nn.available_feature_maps`) is swept over ``ranks`` and
    ``seeds`` on a witness suite (quick: the m = 24 ``"small"`` suite, certified
    minimum rank 8; full: the Hadamard suite of :ref:`theory-r6`, certified rank 17)
    and fitted once, at ``ood_rank``, on an out-of-distribution task whose test tokens
    are unseen in training (:func:`~minip_learn.datasets.make_ood_minip`). Per map:
    the smallest rank at which a fit solves every sequence of the suite (None when no
    rank of the grid does), whether the theorem covers the fits
    (``theorem_applies_``: declared, or measured from ``kernel_min_``, the smallest
    kernel value on the training tokens), the smallest ``kernel_min_`` over its fits,
    the OOD exact-match (nan for ``table``, which rejects unseen tokens) and the mean
    fit time. A fit covered by the theorem that solves below the certified rank is a
    bug: the sweep raises, and the check ``no_covered_map_solved_below_bound`` fails.

    Parameters
    ----------
    quick : bool, default=True
        ``SETTINGS["maps"]["quick"]`` or ``["full"]``.
    out, n_jobs, devices, progress, figures, ensemble
        As in :func:`~minip_learn.experiments.witness_experiment` (figure:
        ``leaderboard.png``).
    **settings
        Overrides: ``maps`` (list of names), ``suite``, ``ranks``, ``seeds``,
        ``kernel`` (estimator parameters of the suite's fits), ``ood``
        (:func:`~minip_learn.datasets.make_ood_minip` arguments), ``ood_rank``,
        ``ood_kernel``.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``results`` (one row per witness fit, with ``kernel_min``), ``summary`` (one row
        per map: ``feature_map``, ``theorem_applies``, ``smallest_solving_rank``,
        ``kernel_min``, ``ood_exact_match``, ``ood_rank``, ``fit_time``, ``ranks``),
        ``markdown``, ``checks``, ``certified_min_rank``, ``figures``, ``files``,
        ``settings``, ``elapsed``.

    Examples
    --------
    >>> from minip_learn.experiments import maps_experiment
    >>> res = maps_experiment(maps=["elu+1"], ranks=(2,), kernel={"max_epochs": 5},
    ...                       ood_kernel={"max_epochs": 5}, ood_rank=2,
    ...                       progress=False, figures=False)
    >>> res.summary[["feature_map", "theorem_applies", "smallest_solving_rank"]].values.tolist()
    [['elu+1', True, None]]
    """
    recipe = Recipe("maps", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    cfg = recipe.cfg
    names = list(cfg["maps"] or available_feature_maps())
    for name in names:
        get_feature_map(name)  # an unknown name fails before any fit
    suite = make_witness_suite(**cfg["suite"])
    bound = int(suite.certified_min_rank)
    n_bits = suite.X.shape[2]
    ood = make_ood_minip(**cfg["ood"])
    tag = f"{suite.construction}-m{n_bits}"
    parts, rows = [], []
    for name in names:
        ranks = _map_ranks(name, n_bits, cfg["ranks"])
        est = KernelAttentionRegressor(feature_map=name, **cfg["kernel"])
        res = recipe.sweep(est, suite.X, suite.y, name=f"maps-{tag}-{name}", ranks=ranks,
                           seeds=list(cfg["seeds"]), certified_min_rank=bound,
                           tags={"map": name}, estimators=True)
        fits = res.results.reset_index(drop=True)
        fits["kernel_min"] = [res.estimators[f].kernel_min_ for f in fits["fit_id"]]
        parts.append(fits)
        solving = fits.loc[fits["solved"].astype(bool), "rank"]
        ood_em, ood_rank = _ood_exact_match(recipe, name, cfg, ood)
        rows.append(dict(
            feature_map=name,
            theorem_applies=bool(fits["theorem_applies"].astype(bool).all()),
            smallest_solving_rank=int(solving.min()) if len(solving) else None,
            kernel_min=float(fits["kernel_min"].min()),
            ood_exact_match=ood_em,
            ood_rank=ood_rank,
            fit_time=float(fits["fit_time"].mean()),
            ranks=" ".join(str(r) for r in ranks),
            certified_min_rank=bound,
        ))
    results = pd.concat(parts, ignore_index=True)
    summary = pd.DataFrame(rows)
    covered = results[results["theorem_applies"].astype(bool)]
    checks = {
        "no_covered_map_solved_below_bound": bool(
            not covered.loc[covered["rank"] < bound, "solved"].astype(bool).any()),
    }
    markdown = _maps_markdown(suite, cfg, summary, checks)
    figs = {"leaderboard": _leaderboard_figure(summary, bound, suite)} if figures else {}
    return recipe.finish(Bunch(results=results, summary=summary, markdown=markdown,
                               checks=checks, certified_min_rank=bound, figures=figs),
                         table=display(summary, _maps_row))


def _maps_row(r):
    return {
        "feature map": r["feature_map"],
        "theorem applies": theorem_text(r["theorem_applies"]),
        "smallest solving rank": fmt(r["smallest_solving_rank"]),
        "kernel min": fmt(r["kernel_min"]),
        "OOD exact-match (rank)": f"{fmt(r['ood_exact_match'])} ({r['ood_rank']})",
        "fit time (s)": fmt(r["fit_time"]),
        "ranks tried": r["ranks"],
    }


def _maps_markdown(suite, cfg, summary, checks):
    bound = int(suite.certified_min_rank)
    return report(
        "Feature maps: rank needed, theorem flag, out-of-distribution exact-match",
        f"Suite `{suite.construction}`: {len(suite.X)} sequences of length "
        f"{suite.X.shape[1]} over {suite.X.shape[2]}-bit tokens; certified minimum rank "
        f"**{bound}** for a single head whose kernel is nonnegative (R5). Witness fits: "
        + settings_text(cfg["kernel"]) + f"; seeds {list(cfg['seeds'])}. OOD task: "
        + settings_text(cfg["ood"]) + "; " + settings_text(cfg["ood_kernel"])
        + ". *Smallest solving rank*: the smallest rank of the grid at which a fit "
        "solves every sequence ('-': none). *Kernel min*: the smallest kernel value of "
        "the fitted heads over pairs of training tokens; the theorem covers a map whose "
        "kernel is declared or measured nonnegative.",
        display(summary, _maps_row), checks,
        labels={"no_covered_map_solved_below_bound":
                f"no fit covered by the theorem solved below rank {bound}"})


def _leaderboard_figure(summary, bound, suite):
    import matplotlib.pyplot as plt

    names = list(summary["feature_map"])
    ranks = summary["smallest_solving_rank"].astype(float)
    top = 2 * max([bound, *ranks.dropna()])
    colors = ["C0" if t else "C1" for t in summary["theorem_applies"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    ax1.bar(names, ranks.fillna(top), color=colors,
            hatch=["" if np.isfinite(r) else "//" for r in ranks])
    ax1.axhline(bound, color="C3", linestyle="--", label=f"certified rank {bound}")
    ax1.set_ylabel("smallest solving rank (hatched: none)")
    ax1.set_yscale("log", base=2)
    ax1.legend(fontsize="small")
    ax2.bar(names, summary["ood_exact_match"].fillna(0), color=colors)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("OOD exact-match")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=60)
    fig.suptitle(f"Feature maps on the {suite.construction} witness suite "
                 "(blue: inside the theorem, orange: outside)")
    return fig
