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
:func:`save_estimator` keeps a fitted estimator in one file, parameters as JSON and
weights as safetensors, and :func:`load_estimator` reads it back without running code
from the file (the head is rebuilt from the arguments it recorded; see the user guide's
"Saving and loading a fitted model"). Predictions after loading are bitwise identical;
a model fitted on a GPU loads on a CPU-only machine (``device="cpu"``, with a warning).
An estimator saved by another version loads with the hyperparameters its class gained
since set to their defaults, and with a :class:`MinIPVersionWarning` naming both
versions and those hyperparameters; refit it, or save it again with this version.

The estimators also pickle (scikit-learn's convention; the pickle records the version
that saved it and fills hyperparameters on loading the same way), but loading a pickle
runs code from its file, and the library itself never writes or reads one. skorch's
``est.net_.save_params(f_params=...)`` / ``load_params`` store only torch state, not the
hyperparameters, the fitted attributes or the architecture.
"""

from ._base import PREDICT_CHUNK_BYTES  # noqa: F401  (importable here, not exported)
from ._modules import module_declarations
from ._saving import load_estimator, save_estimator
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
    "load_estimator",
    "module_declarations",
    "save_estimator",
]
