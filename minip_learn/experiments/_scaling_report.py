"""The tables of the scaling recipe: summary, results, growth fits, checks, markdown."""

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from .._validation import check_float, check_positive, check_same_length
from ._shared import report, settings_text

__all__ = ["SUMMARY_COLUMNS", "growth_fit", "growth_lines", "growth_table",
           "results_frame", "scaling_checks", "scaling_markdown", "summary_frame"]

#: Columns of ``summary.csv``, one row per ``n_bits``.
SUMMARY_COLUMNS = (
    "n_bits", "suite_params", "construction", "n_sequences", "n_tokens",
    "certified_min_rank", "smallest_solving_rank", "failed_rank_below", "upper_route",
    "constructive_rank", "training_rank", "training_failed_below", "construction_rank",
    "construction_failed_below", "softmax_score_dim", "softmax_solved", "design_bound",
    "solver", "solver_max_error", "certify_time", "training_time", "construction_time",
    "softmax_time", "fit_cpu_time", "wall_time",
)


# -- growth fits ----------------------------------------------------------------------
def growth_fit(n_bits, ranks, *, confidence=0.95):
    """Least-squares slope of ``log2(rank)`` against ``n_bits`` with a t-interval.

    Parameters
    ----------
    n_bits : array-like of shape (n,)
    ranks : array-like of shape (n,)
        Positive ranks; missing values (None, NaN) are left out.
    confidence : float, default=0.95
        Level of the two-sided interval ``slope +- t_{n-2} * se``.

    Returns
    -------
    fit : :class:`~sklearn.utils.Bunch`
        ``slope`` (doublings of the rank per bit), ``intercept``, ``stderr``,
        ``ci_low``, ``ci_high`` (NaN with fewer than 3 points), ``n`` (points used).

    Examples
    --------
    >>> from minip_learn.experiments import growth_fit
    >>> fit = growth_fit([8, 16, 24], [2, 8, 32])
    >>> fit.slope, fit.n, (fit.ci_low, fit.ci_high)
    (0.25, 3, (0.25, 0.25))
    """
    from scipy import stats

    confidence = check_float(confidence, "confidence", min_value=0.0, strict=True,
                             max_value=1.0)
    x = np.asarray(n_bits, dtype=np.float64)
    r = pd.to_numeric(pd.Series(list(ranks)), errors="coerce").to_numpy(np.float64)
    check_same_length(x, r, ("n_bits", "ranks"))
    keep = np.isfinite(r) & np.isfinite(x)
    x, z = x[keep], np.log2(check_positive(r[keep], "ranks"))
    n = len(x)
    nan = float("nan")
    if n < 2 or np.ptp(x) == 0:
        return Bunch(slope=nan, intercept=nan, stderr=nan, ci_low=nan, ci_high=nan, n=n)
    xm = x.mean()
    sxx = ((x - xm) ** 2).sum()
    slope = float(((x - xm) * (z - z.mean())).sum() / sxx)
    intercept = float(z.mean() - slope * xm)
    if n < 3:
        return Bunch(slope=slope, intercept=intercept, stderr=nan, ci_low=nan, ci_high=nan,
                     n=n)
    resid = z - (intercept + slope * x)
    stderr = float(np.sqrt((resid ** 2).sum() / (n - 2) / sxx))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 2)) * stderr
    return Bunch(slope=slope, intercept=intercept, stderr=stderr, ci_low=slope - half,
                 ci_high=slope + half, n=n)


_GROWTH_QUANTITIES = (
    ("certified (lower)", "certified_min_rank"),
    ("smallest solving (upper)", "smallest_solving_rank"),
    ("constructive (R3)", "constructive_rank"),
)


def growth_table(summary, design):
    """``growth.csv``: the growth fit of every rank of the summary and of the design."""
    rows = []
    for label, col in _GROWTH_QUANTITIES:
        fit = growth_fit(summary["n_bits"], summary[col])
        rows.append(dict(quantity=label, **fit))
    fit = growth_fit(design["n_bits"], design["certified_min_rank"])
    rows.append(dict(quantity="design bound (calculation)", **fit))
    return pd.DataFrame(rows)


def growth_lines(growth):
    """The growth fits as markdown list items, one per quantity."""
    lines = []
    for _, g in growth.iterrows():
        n = int(g["n"])
        ci = (f"no interval (fewer than 3 points, n = {n} sizes)"
              if not np.isfinite(g["ci_low"]) else
              f"95% CI [{g['ci_low']:.3f}, {g['ci_high']:.3f}] (t-interval, n = {n} sizes)")
        lines.append(f"- {g['quantity']}: log2(rank) grows {g['slope']:.3f} per bit, {ci}")
    return "\n".join(lines)


# -- tables ---------------------------------------------------------------------------
def summary_frame(rows):
    """``summary.csv`` from one row (dict) per size: the columns of
    :data:`SUMMARY_COLUMNS` first, ranks as nullable integers."""
    df = pd.DataFrame(rows)
    cols = [c for c in SUMMARY_COLUMNS if c in df]
    df = df[cols + [c for c in df.columns if c not in cols]]
    for c in ("smallest_solving_rank", "failed_rank_below", "training_rank",
              "training_failed_below", "construction_rank", "construction_failed_below",
              "design_bound") + tuple(c for c in df.columns if c.startswith("training_rank_")):
        if c in df:
            df[c] = df[c].astype("Int64")
    return df


def results_frame(parts):
    """``results.csv`` from the result frames of the fits and constructions."""
    frames = [p for p in parts if len(p)]
    if not frames:
        return pd.DataFrame(columns=["model", "n_bits", "rank", "seed", "solved"])
    df = pd.concat(frames, ignore_index=True)
    first = [c for c in ("model", "n_bits", "feature_map", "rank", "seed", "solved",
                         "max_abs_error") if c in df]
    return df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)


# -- checks ---------------------------------------------------------------------------
def scaling_checks(summary, results):
    """The expected behaviours of the scaling recipe, each ``True``/``False``.

    * ``none_solved_below_bound`` -- no kernel head (trained or constructed) with a
      rank below its family's certified bound solved it (one that does is a bug: in
      the metric, the head or the certificate);
    * ``sandwich_ordered`` -- ``certified <= smallest solving <= constructive`` at
      every ``n_bits`` (a missing upper bound fails);
    * ``softmax_solved_every_seed`` -- every dense softmax fit solved its family.

    Parameters
    ----------
    summary : pandas.DataFrame
        One row per ``n_bits`` (``certified_min_rank``, ``smallest_solving_rank``,
        ``constructive_rank``).
    results : pandas.DataFrame
        One row per fit (``model``, ``n_bits``, ``rank``, ``solved``).

    Returns
    -------
    checks : dict of str to bool

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.experiments import scaling_checks
    >>> summary = pd.DataFrame({"n_bits": [8], "certified_min_rank": [2],
    ...                         "smallest_solving_rank": [3], "constructive_rank": [4]})
    >>> results = pd.DataFrame({"model": ["kernel", "kernel", "softmax"],
    ...                         "n_bits": [8, 8, 8], "rank": [1, 3, None],
    ...                         "solved": [False, True, True]})
    >>> scaling_checks(summary, results)
    {'none_solved_below_bound': True, 'sandwich_ordered': True, 'softmax_solved_every_seed': True}
    """
    bound = dict(zip(summary["n_bits"], summary["certified_min_rank"]))
    heads = results[results["model"].isin(["kernel", "construction"])]
    below = heads["rank"].astype(float) < heads["n_bits"].map(bound).astype(float)
    solved = heads["solved"].astype(bool)
    upper = pd.to_numeric(summary["smallest_solving_rank"], errors="coerce")
    ordered = (upper.notna()
               & (summary["certified_min_rank"] <= upper)
               & (upper <= summary["constructive_rank"]))
    soft = results[results["model"] == "softmax"]
    return {
        "none_solved_below_bound": bool(not (below & solved).any()),
        "sandwich_ordered": bool(len(summary) > 0 and ordered.all()),
        "softmax_solved_every_seed": bool(len(soft) > 0 and soft["solved"].astype(bool).all()),
    }


# -- summary.md -----------------------------------------------------------------------
_CHECK_LABELS = {
    "none_solved_below_bound": "no kernel head below the certified bound solved",
    "sandwich_ordered": "certified <= smallest solving <= constructive at every m",
    "softmax_solved_every_seed": "dense softmax solved every seed at every m",
}

#: The columns of the markdown table: heading -> column of the summary.
_DISPLAY_COLUMNS = {
    "m": "n_bits", "suite": "construction", "sequences": "n_sequences",
    "certified (lower)": "certified_min_rank", "failed below": "failed_rank_below",
    "smallest solving (upper)": "smallest_solving_rank", "route": "upper_route",
    "training": "training_rank", "construction": "construction_rank",
    "constructive (R3)": "constructive_rank", "softmax solved": "softmax_solved",
    "fit time (s)": "fit_time_total", "fit CPU (s)": "fit_cpu_time",
}


def scaling_markdown(summary, growth, checks, cfg):
    """``summary.md``: the table, the growth fits (when given) and the checks."""
    summary = summary.assign(fit_time_total=summary[
        ["training_time", "construction_time", "softmax_time"]].sum(axis=1))
    table = pd.DataFrame({head: summary[col] for head, col in _DISPLAY_COLUMNS.items()})
    text = (f"Witness suites `make_witness_suite(n_bits=m, {settings_text(cfg['suite'])})`; "
            f"kernel maps {list(cfg['feature_maps'])}, seeds {list(cfg['seeds'])} per rank "
            f"({settings_text(cfg['kernel'])}); construction seeds "
            f"{list(cfg['construction']['seeds'])} "
            f"({settings_text({k: v for k, v in cfg['construction'].items() if k != 'seeds'})}); "
            f"at most {cfg['max_probes'] or 'unlimited'} probes per search; softmax "
            f"(score_dim = m) seeds {list(cfg['softmax_seeds'])} "
            f"({settings_text(cfg['softmax'])}).")
    note = None if growth is None else (
        "Growth (least squares of log2 rank against m):\n\n" + growth_lines(growth))
    return report("Rank sandwich across n_bits", text, table, checks,
                  labels=_CHECK_LABELS, note=note).rstrip()
