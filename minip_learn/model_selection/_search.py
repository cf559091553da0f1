"""The scikit-learn path to a sweep: ``GridSearchCV(cv=FullSetSplit())`` results as rows."""

import re

from ..metrics import get_scorers
from ._summary import as_stored
from ._values import jsonable, to_frame

__all__ = ["cv_results_to_frame"]


def cv_results_to_frame(cv_results, *, scoring=None):
    """Tidy per-fit rows from ``GridSearchCV(..., cv=FullSetSplit()).cv_results_``.

    The plain scikit-learn path to a sweep: put ``rank`` and ``random_state`` in the
    parameter grid, use :class:`~minip_learn.model_selection.FullSetSplit` as ``cv``,
    :func:`~minip_learn.metrics.get_scorers` as ``scoring`` and ``refit=False``; this
    function turns the result into the same table as :func:`rank_sweep` (one row per
    candidate and split, ``random_state`` renamed ``seed``, error scores un-negated) so
    that :func:`summarize_sweep` and the plots apply.

    Parameters
    ----------
    cv_results : dict
        The ``cv_results_`` attribute of a fitted search.
    scoring : dict of scorers, default=None
        The scoring the search used (for the signs); None means
        :func:`~minip_learn.metrics.get_scorers`.

    Returns
    -------
    results : pandas.DataFrame

    Examples
    --------
    >>> from sklearn.model_selection import GridSearchCV
    >>> from minip_learn import KernelAttentionRegressor
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.metrics import get_scorers
    >>> from minip_learn.model_selection import FullSetSplit, cv_results_to_frame
    >>> X, y = make_minip(32, seq_len=2, n_bits=6, random_state=0)
    >>> search = GridSearchCV(
    ...     KernelAttentionRegressor(max_epochs=20),
    ...     {"rank": [2, 4], "random_state": [0]}, cv=FullSetSplit(),
    ...     scoring=get_scorers(), refit=False).fit(X, y)
    >>> df = cv_results_to_frame(search.cv_results_)
    >>> df[["rank", "seed"]].to_dict("list")
    {'rank': [2, 4], 'seed': [0, 0]}
    """
    scoring = get_scorers() if scoring is None else dict(scoring)
    params = cv_results["params"]
    n_splits = len([k for k in cv_results if re.fullmatch(r"split\d+_test_.+", k)
                    and k.endswith("_" + next(iter(scoring)))]) or 1
    rows = []
    for i, p in enumerate(params):
        for split in range(n_splits):
            row = {("seed" if k == "random_state" else k): jsonable(v) for k, v in p.items()}
            row["split"] = split
            for name, scorer in scoring.items():
                col = f"split{split}_test_{name}"
                if col in cv_results:
                    row[name] = as_stored(scorer, cv_results[col][i])
            if "solved" in row:
                row["solved"] = bool(row["solved"] >= 1.0)
            row["fit_time"] = float(cv_results["mean_fit_time"][i])
            row["score_time"] = float(cv_results["mean_score_time"][i])
            rows.append(row)
    df = to_frame(rows)
    df.attrs["param_names"] = sorted({("seed" if k == "random_state" else k)
                                      for p in params for k in p} - {"seed"})
    return df
