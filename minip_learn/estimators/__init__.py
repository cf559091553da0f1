"""scikit-learn estimators for single attention heads and sequence mixers, trained
through skorch.

The estimators are thin: ``__init__`` stores friendly hyperparameters (``rank=``,
``feature_map=``, ``score_dim=`` ...); ``fit`` checks them and the data once and
trains the torch head of :mod:`minip_learn.nn` through the training pipeline of
:mod:`minip_learn.training` (a single fit is a stack of one member;
:func:`minip_learn.model_selection.fit_ensemble` trains many at once). The fitted skorch net is ``net_`` (history,
``module_``, ``save_params``...). Estimators around hand-set weights come from the
classmethod ``from_module``.

Persistence
-----------
``pickle`` and ``joblib.dump``/``joblib.load`` store the whole fitted estimator
(hyperparameters, fitted attributes such as ``n_bits_`` and ``vocabulary_``, the trained
head, the optimizer state and the history) and give bitwise-identical predictions after
loading. A model fitted on a GPU loads on a CPU-only machine: skorch maps its tensors
to the CPU (with a ``skorch.exceptions.DeviceWarning``) and predictions run there; the
``device`` hyperparameter keeps its fitted value, so refit there with
``set_params(device="cpu")``.

Every pickle records the minip_learn version that saved it. An estimator saved by
another version loads with the hyperparameters its class gained since set to their
defaults, and with a :class:`MinIPVersionWarning` naming both versions and those
hyperparameters; refit it, or save it again with this version.

skorch's ``est.net_.save_params(f_params=...)`` / ``load_params`` store only torch
state (module weights and, if asked, optimizer, criterion and history). They do **not**
store the estimator's hyperparameters, its fitted attributes (``n_bits_``,
``seq_len_``, ``vocabulary_``, ``solved_``, ``train_max_error_``, ``n_epochs_``) or the
architecture: to load them, build an estimator with the same hyperparameters, fit it
on data with the same ``n_bits`` (and, for ``feature_map="table"``, the same
vocabulary; ``max_epochs=1`` is enough) and then call ``est.net_.load_params``. Prefer
pickle/joblib for a complete round trip.
"""

from ._base import PREDICT_CHUNK_BYTES  # noqa: F401  (importable here, not exported)
from ._modules import module_declarations
from ._versions import MinIPVersionWarning
from .classifier import KernelAttentionClassifier
from .kernel import KernelAttentionRegressor
from .mixer import SequenceMixerRegressor
from .softmax import SoftmaxAttentionRegressor

__all__ = [
    "KernelAttentionClassifier",
    "KernelAttentionRegressor",
    "MinIPVersionWarning",
    "SequenceMixerRegressor",
    "SoftmaxAttentionRegressor",
    "module_declarations",
]
