"""Metrics for Min-IP under the "error strictly below 1/2" criterion (THEORY §1).

All metrics take ``y_true`` and ``y_pred`` of shape ``(n_samples, seq_len)``, or of
shape ``(n_samples,)``: one target per sequence (final-query Min-IP, where only the last
token's target is asked for, or single-token sequences), so that a sequence is correct
when its one target is, and token accuracy and exact match agree. A position is
*correct* when ``|y_pred - y_true| < 1/2``, so that rounding recovers the integer
target.
"""

import numpy as np
from sklearn.metrics import make_scorer

__all__ = [
    "TOLERANCE",
    "get_scorers",
    "max_abs_error",
    "sequence_exact_match",
    "solved",
    "solves",
    "token_accuracy",
    "verify_solver",
    "within_tolerance",
]

#: A prediction is correct when its absolute error is strictly below this.
TOLERANCE = 0.5


def within_tolerance(errors):
    """Whether each error is finite and strictly below :data:`TOLERANCE`, elementwise.

    The array form of :func:`solves`: an error of ``nan`` or ``inf`` is not within the
    tolerance.

    Parameters
    ----------
    errors : array-like of float
        Absolute errors, any shape.

    Returns
    -------
    within : ndarray of bool
        Of the shape of ``errors``.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.metrics import within_tolerance
    >>> within_tolerance([0.0, 0.4999, 0.5, np.inf, np.nan])
    array([ True,  True, False, False, False])
    """
    errors = np.asarray(errors, dtype=np.float64)
    return np.isfinite(errors) & (errors < TOLERANCE)


def solves(max_error):
    """Whether a largest error solves: finite and strictly below :data:`TOLERANCE`.

    A head solves a family when its largest absolute error over every position of
    every sequence passes: every prediction then rounds to its target.

    Parameters
    ----------
    max_error : float
        A largest absolute error (e.g. of :func:`max_abs_error` or
        :func:`verify_solver`).

    Returns
    -------
    solves : bool
        True when ``max_error`` is finite and ``max_error < TOLERANCE``; ``nan`` and
        ``inf`` do not solve.

    Examples
    --------
    >>> from minip_learn.metrics import solves
    >>> solves(0.49), solves(0.5), solves(float("nan"))
    (True, False, False)
    """
    return bool(within_tolerance(float(max_error)))


def _errors(y_true, y_pred):
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"y_true and y_pred have different shapes: {y_true.shape} vs {y_pred.shape}."
        )
    if y_true.size == 0:
        raise ValueError("y_true is empty.")
    if y_true.ndim == 1:
        y_true, y_pred = y_true[:, None], y_pred[:, None]
    if y_true.ndim != 2:
        raise ValueError(f"expected targets of shape (n_samples, seq_len) or (n_samples,); "
                         f"got {y_true.shape}.")
    err = np.abs(y_pred - y_true)
    return np.where(np.isnan(err), np.inf, err)


def token_accuracy(y_true, y_pred):
    """Fraction of positions predicted within 1/2 of their target.

    Examples
    --------
    >>> from minip_learn.metrics import token_accuracy
    >>> token_accuracy([[1, 2], [0, 0]], [[1.2, 2.6], [0.1, -0.3]])
    0.75
    """
    return float(within_tolerance(_errors(y_true, y_pred)).mean())


def sequence_exact_match(y_true, y_pred):
    """Fraction of sequences with every position within 1/2 of its target.

    Examples
    --------
    >>> from minip_learn.metrics import sequence_exact_match
    >>> sequence_exact_match([[1, 2], [0, 0]], [[1.2, 2.6], [0.1, -0.3]])
    0.5
    >>> sequence_exact_match([2, 0, 1], [2.4, 0.6, 1.0])    # one target per sequence
    0.6666666666666666
    """
    return float(within_tolerance(_errors(y_true, y_pred)).all(axis=1).mean())


def max_abs_error(y_true, y_pred):
    """Largest absolute error over all positions (``inf`` if a prediction is NaN).

    Examples
    --------
    >>> from minip_learn.metrics import max_abs_error
    >>> max_abs_error([[1, 2]], [[1.25, 1.5]])
    0.5
    """
    return float(_errors(y_true, y_pred).max())


def solved(y_true, y_pred):
    """1.0 if every position of every sequence is within 1/2 of its target, else 0.0.

    Averaged over seeds this is the probability of an exact fit, the quantity whose jump
    over rank is the phase transition.

    Examples
    --------
    >>> from minip_learn.metrics import solved
    >>> solved([[1, 2]], [[1.49, 2.0]]), solved([[1, 2]], [[1.5, 2.0]])
    (1.0, 0.0)
    """
    return float(solves(max_abs_error(y_true, y_pred)))


def verify_solver(estimator, X, y):
    """Largest error ``max |p - t|`` of a fitted head on a family, in float64.

    The head solves the family when the value is below :data:`TOLERANCE` (every
    prediction rounds to its target), as :func:`solves` decides. The estimators
    evaluate their parameters in float64 whatever dtype they were trained in, so a
    float32 fit is checked without float32 rounding.

    Parameters
    ----------
    estimator : fitted estimator
        A regressor with ``predict`` (e.g. loaded with
        :func:`~minip_learn.estimators.load_estimator`).
    X : array-like of shape (n_samples, seq_len, n_bits)
    y : array-like of shape (n_samples, seq_len) or (n_samples,)
        Targets; (n_samples,) for final-query targets (the estimator then predicts
        one value per sequence).

    Returns
    -------
    max_error : float
        :func:`max_abs_error` of the predictions: ``inf`` when a prediction is not
        finite.

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.constructions import exact_kernel_realization
    >>> from minip_learn.metrics import verify_solver
    >>> suite = make_witness_suite(16, construction="small")
    >>> verify_solver(exact_kernel_realization(tokens=suite.tokens), suite.X, suite.y) < 0.5
    True
    """
    return max_abs_error(y, estimator.predict(X))


def get_scorers():
    """Scorers for :class:`~sklearn.model_selection.GridSearchCV` (multi-metric).

    Returns
    -------
    scorers : dict
        ``{"exact_match", "token_accuracy", "solved", "max_abs_error"}``; the last one
        is negated (``greater_is_better=False``), as scikit-learn's error scorers are.

    Examples
    --------
    >>> from minip_learn.metrics import get_scorers
    >>> sorted(get_scorers())
    ['exact_match', 'max_abs_error', 'solved', 'token_accuracy']
    """
    return {
        "exact_match": make_scorer(sequence_exact_match),
        "token_accuracy": make_scorer(token_accuracy),
        "solved": make_scorer(solved),
        "max_abs_error": make_scorer(max_abs_error, greater_is_better=False),
    }
