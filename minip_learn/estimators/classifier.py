"""Kernel attention with class logits and an argmax readout, outside the theorem
(see :ref:`theory-r7`)."""

import numpy as np
import torch
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets

from .._validation import check_minip_targets, check_targets, ravel_column_vector
from ..compact import is_compact
from ._base import ExactMatchScore, data_doc
from .kernel import KernelAttentionBase

__all__ = []  # public home: the package minip_learn.estimators


class _TokenCrossEntropy(torch.nn.Module):
    """Cross-entropy of per-position logits ``(..., n_classes)`` against class indices
    stored as floats ``(...)`` (the estimators move targets in the training dtype);
    with ``weights`` (shaped like ``target``, e.g. the multiplicities of the slots of a
    compact family) the weighted mean over positions."""

    def forward(self, logits, target, weights=None):
        flat = logits.reshape(-1, logits.shape[-1])
        if weights is None:
            return torch.nn.functional.cross_entropy(flat, target.reshape(-1).long())
        losses = torch.nn.functional.cross_entropy(
            flat, target.reshape(-1).long(), reduction="none")
        w = weights.reshape(-1)
        return (w * losses).sum() / w.sum()


def _class_distance(logits, target):
    """``|argmax - target|`` per position, in class-index units: any
    ``stop_tolerance <= 1/2`` stops when every position is classified correctly."""
    return (logits.argmax(-1).to(target.dtype) - target).abs()


class KernelAttentionClassifier(ExactMatchScore, ClassifierMixin, KernelAttentionBase):
    """Kernel attention with class logits and an argmax readout -- **outside the theorem**.

    The same model as :class:`KernelAttentionRegressor` (same hyperparameters:
    ``rank``, ``feature_map``, ``n_heads``, ``n_layers``, ``readout`` ...), but the
    readout gives one logit per class at every position (one query-dependent affine
    readout per class for ``readout="affine"``, an MLP otherwise), training minimises
    the cross-entropy, and ``predict`` returns the argmax class. The argmax of several
    affine readouts is not an affine readout, so the certified bound does not cover
    this model (``theorem_applies_`` is always False; see :ref:`theory-r7`): it is a
    labelled variant for measuring whether the certified bound also binds classifiers.

    Classes: when every label is an integer in ``0..n_bits`` (Min-IP targets) the
    classes are all of ``0..n_bits`` (``n_bits + 1`` logits, whether or not a value
    occurs in training); otherwise the sorted distinct labels (any hashable labels,
    as usual in scikit-learn). Continuous targets are a ``ValueError``.

    Parameters
    ----------
    rank, feature_map, value_dim, feature_width, feature_depth, shared_features, \
feature_kwargs, causal, positional, decay, n_heads, n_layers, readout, readout_width, lr, max_epochs, batch_size, \
optimizer, weight_decay, stop_tolerance, n_init, split_every, check_every, callbacks, dtype, \
device, random_state, verbose
        As in :class:`KernelAttentionRegressor` (``split_every`` has no effect: the
        classifier's module is not a single head). A training position's error is the
        distance between its argmax class index and its target index, so
        ``stop_tolerance`` (any value ``<= 0.5``) stops training once every training
        position is classified correctly.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels (``0..n_bits`` for Min-IP targets).
    net_ : skorch.NeuralNet
        The trained net; ``net_.module_`` is a
        :class:`~minip_learn.nn.KernelAttentionModel` with ``n_outputs = n_classes``.
    solved_ : bool
        Whether every training position's argmax is its target.
    train_max_error_ : float
        Largest distance between predicted and true class index on the training set
        (0 when solved; in label units for Min-IP targets).
    theorem_applies_ : bool
        Always False (argmax readout).
    n_epochs_, init_errors_, n_bits_, seq_len_, n_features_in_, vocabulary_, \
kernel_min_, module_declarations_
        As in :class:`KernelAttentionRegressor`.

    Examples
    --------
    >>> from minip_learn import KernelAttentionClassifier
    >>> from minip_learn.datasets import make_minip
    >>> X, y = make_minip(64, seq_len=2, n_bits=6, random_state=0)
    >>> clf = KernelAttentionClassifier(rank=2, random_state=0).fit(X, y)
    >>> clf.classes_
    array([0, 1, 2, 3, 4, 5, 6])
    >>> clf.score(X, y), clf.solved_, clf.theorem_applies_
    (1.0, True, False)
    """

    _criterion = _TokenCrossEntropy
    _error = staticmethod(_class_distance)

    def _n_outputs(self, fitted):
        classes = fitted.get("classes_")
        if classes is None:
            classes = getattr(self, "classes_", None)
        return 2 if classes is None else len(classes)

    def _encode_targets(self, X, y, was_2d, check_minip):
        labels = np.asarray(y)
        if was_2d:
            labels = ravel_column_vector(labels, stacklevel=5)
        if labels.ndim == 0:
            raise ValueError(f"y must be an array of labels; got {y!r}.")
        check_classification_targets(labels.reshape(-1))
        flat = labels.reshape(-1)
        n_bits = X.shape[2]
        minip = False
        if flat.dtype.kind in "iub" or (
                flat.dtype.kind == "f" and np.isfinite(flat).all()
                and np.array_equal(flat, np.round(flat))):
            minip = flat.size > 0 and flat.min() >= 0 and flat.max() <= n_bits
        classes = np.arange(n_bits + 1) if minip else np.unique(flat)
        index = np.searchsorted(classes, labels).astype(np.float64)
        if check_minip:
            check_minip_targets(X, check_targets(labels, X.shape[0], X.shape[1],
                                                 was_2d=was_2d))
        index = check_targets(index, X.shape[0], X.shape[1], was_2d=was_2d)
        return index, {"classes_": classes}

    def _set_fitted_module(self, module):
        super()._set_fitted_module(module)
        self.classes_ = np.arange(module.n_outputs)
        return self

    @data_doc
    def fit(self, X, y, *, check_minip=False):
        """Fit the classifier on sequences ``X`` with per-token class labels ``y``.

        Parameters
        ----------
        X : %(X)s
        y : %(y)s
            Class labels, one per token (e.g. Min-IP targets ``0..n_bits``); for a
            compact ``X``, one per slot (padding entries are ignored).
        check_minip : bool, default=False
            Also require Min-IP data (0/1 tokens, ``y`` the exact Min-IP targets).

        Returns
        -------
        self : object
        """
        return super().fit(X, y, check_minip=check_minip)

    @data_doc
    def predict(self, X):
        """Predicted class of every token (argmax of its logits).

        Parameters
        ----------
        X : %(X)s

        Returns
        -------
        y_pred : ndarray of shape (n_samples, seq_len), or (n_samples,) for 2-D X
            For a compact ``X``, shape (n_samples, n_slots), with the zero of the
            labels' dtype (0 for Min-IP classes) at padding.
        """
        logits = self._raw_predict(X)
        pred = self.classes_[logits.argmax(-1)]
        if is_compact(X):
            pred[X.padding] = np.zeros((), dtype=pred.dtype)
        return pred

    def _exact_match(self, X, y, y_pred):
        labels = np.asarray(y)
        if labels.size != y_pred.size:
            raise ValueError(
                f"y has shape {labels.shape}, which does not match the predictions "
                f"{y_pred.shape} (one label per token of every sequence).")
        correct = labels.reshape(y_pred.shape) == y_pred
        if is_compact(X):
            correct |= X.padding  # padding holds no label
        return float(correct.reshape(len(y_pred), -1).all(axis=1).mean())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = True
        tags.classifier_tags.multi_label = False
        return tags
