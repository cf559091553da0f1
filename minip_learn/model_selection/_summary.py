"""Statistics of a sweep: the solved fraction per setting with a Wilson interval."""

import math
import statistics

import pandas as pd

__all__ = ["summarize_sweep"]


def as_stored(scorer, value):
    """A score as a row stores it: error scorers, negated by scikit-learn, as errors.

    A scorer made with ``make_scorer(..., greater_is_better=False)`` says so in its
    repr, the one public trace of its sign.
    """
    negated = "greater_is_better=False" in repr(scorer)
    return -float(value) if negated else float(value)

#: columns that identify a configuration when summarising (when present)
_GROUP_COLUMNS = ("model", "estimator", "feature_map", "seq_len", "rank")


def _wilson(k, n, confidence):
    if n == 0:
        return float("nan"), float("nan")
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    p = k / n
    den = 1 + z * z / n
    center = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, center - half), min(1.0, center + half)


def summarize_sweep(results, *, by=None, confidence=0.95):
    """Solved fraction (with a Wilson confidence interval) and mean scores per setting.

    Parameters
    ----------
    results : pandas.DataFrame
        Rows of fits, as in ``rank_sweep(...).results`` or :func:`load_sweep`.
    by : list of str, default=None
        Grouping columns. None uses those present among ``model``, ``estimator``,
        ``feature_map``, ``seq_len``, ``rank`` and the swept parameters recorded in
        ``results.attrs["param_names"]``. Missing values (e.g. the rank of a softmax
        head) form their own group.
    confidence : float, default=0.95
        Level of the Wilson score interval of the solved fraction.

    Returns
    -------
    summary : pandas.DataFrame
        One row per group: ``n_fits``, ``n_solved``, ``solved_fraction``,
        ``solved_ci_low``, ``solved_ci_high``, ``exact_match_mean``,
        ``exact_match_std``, ``token_accuracy_mean``, ``max_abs_error_median``,
        ``n_epochs_mean``, ``fit_time_mean`` (those whose columns exist) and
        ``certified_min_rank``.

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.model_selection import summarize_sweep
    >>> df = pd.DataFrame({"rank": [4, 4, 32, 32], "solved": [False, False, True, True],
    ...                    "exact_match": [0.5, 0.6, 1.0, 1.0]})
    >>> summarize_sweep(df)[["rank", "solved_fraction", "exact_match_mean"]]
       rank  solved_fraction  exact_match_mean
    0     4              0.0              0.55
    1    32              1.0              1.00
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence!r}.")
    df = results
    if by is None:
        params = list(getattr(df, "attrs", {}).get("param_names", []))
        by = [c for c in _GROUP_COLUMNS if c in df] + [
            c for c in params if c in df and c not in _GROUP_COLUMNS]
    by = list(by)
    missing = [c for c in by if c not in df]
    if missing:
        raise ValueError(f"grouping columns {missing} are not in the results.")
    if df.empty or "solved" not in df:
        cols = by + ["n_fits", "n_solved", "solved_fraction", "solved_ci_low", "solved_ci_high"]
        return pd.DataFrame(columns=cols)
    out = []
    groups = df.groupby(by, dropna=False, sort=True) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        n = len(g)
        k = int(g["solved"].astype(bool).sum())
        lo, hi = _wilson(k, n, confidence)
        row = dict(zip(by, key))
        row.update(n_fits=n, n_solved=k, solved_fraction=k / n, solved_ci_low=lo,
                   solved_ci_high=hi)
        if "exact_match" in g:
            row["exact_match_mean"] = float(g["exact_match"].mean())
            row["exact_match_std"] = float(g["exact_match"].std(ddof=0))
        if "token_accuracy" in g:
            row["token_accuracy_mean"] = float(g["token_accuracy"].mean())
        if "max_abs_error" in g:
            row["max_abs_error_median"] = float(g["max_abs_error"].median())
        if "n_epochs" in g:
            row["n_epochs_mean"] = float(g["n_epochs"].mean())
        if "fit_time" in g:
            row["fit_time_mean"] = float(g["fit_time"].mean())
        if "certified_min_rank" in g and g["certified_min_rank"].notna().any():
            row["certified_min_rank"] = int(g["certified_min_rank"].dropna().iloc[0])
        out.append(row)
    summary = pd.DataFrame(out)
    if "rank" in summary and summary["rank"].notna().all():
        summary["rank"] = summary["rank"].astype(int)
    return summary
