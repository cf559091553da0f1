"""Cross-validation splitters for finite Min-IP families."""

import numpy as np
from sklearn.model_selection import BaseCrossValidator

from .._validation import check_int

__all__ = ["FullSetSplit"]


def _n_samples(X):
    """Number of samples of an array-like, a sparse matrix or a data frame."""
    if hasattr(X, "shape") and len(X.shape) > 0:
        return int(X.shape[0])
    if X is None or not hasattr(X, "__len__"):
        raise TypeError(f"Expected an array-like of samples; got {type(X).__name__}.")
    return len(X)


class FullSetSplit(BaseCrossValidator):
    """Train and evaluate on the same, full set.

    For a finite family of sequences the question is expressivity: *can* a model of a
    given rank fit every sequence exactly? The training set is then also the
    evaluation set, which :class:`~sklearn.model_selection.PredefinedSplit` cannot
    express. Use it as ``cv=FullSetSplit()`` in
    :class:`~sklearn.model_selection.GridSearchCV` and put seeds in the parameter grid
    (or ask for ``n_repeats`` identical splits).

    Parameters
    ----------
    n_repeats : int, default=1
        Number of (identical) splits yielded.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.model_selection import FullSetSplit
    >>> [(tr.tolist(), te.tolist()) for tr, te in FullSetSplit().split(np.zeros((3, 2)))]
    [([0, 1, 2], [0, 1, 2])]
    """

    def __init__(self, n_repeats=1):
        self.n_repeats = n_repeats

    def split(self, X, y=None, groups=None):
        """Yield ``(all indices, all indices)`` ``n_repeats`` times."""
        n_repeats = check_int(self.n_repeats, "n_repeats", min_value=1)
        idx = np.arange(_n_samples(X))
        for _ in range(n_repeats):
            yield idx, idx

    def _iter_test_indices(self, X=None, y=None, groups=None):
        for _, test in self.split(X):
            yield test

    def get_n_splits(self, X=None, y=None, groups=None):
        """Number of splits, ``n_repeats``."""
        return check_int(self.n_repeats, "n_repeats", min_value=1)

    def __repr__(self):
        return f"FullSetSplit(n_repeats={self.n_repeats})"
