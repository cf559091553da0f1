"""Saved estimators across minip_learn versions: the version a saved file or a pickle
records, the hyperparameters filled in on loading, and the warning that says so."""

import copy
import inspect

__all__ = ["MinIPVersionWarning"]

#: The key of a pickled estimator's state that records the minip_learn version that
#: saved it.
VERSION_KEY = "_minip_learn_version"


def _current_version():
    from .. import __version__  # read when called

    return __version__


class MinIPVersionWarning(UserWarning):
    """An estimator was loaded from a file saved by another minip_learn version.

    Issued by :func:`~minip_learn.estimators.load_estimator` (and while unpickling an
    estimator) when the version that saved it differs from the running one, or when
    the saved state lacks hyperparameters of the estimator's class (those added since
    it was saved), which are then set to their defaults. The loaded estimator predicts with its saved head;
    to be rid of the warning, refit it or save it again with this version.

    Parameters
    ----------
    estimator_name : str
        The class of the loaded estimator.
    saved_version : str or None
        The minip_learn version that saved it; None for a file saved before versions
        were recorded.
    current_version : str
        The running minip_learn version.
    filled : dict
        The hyperparameters missing from the saved state, set to these defaults.

    Examples
    --------
    >>> from minip_learn.estimators import MinIPVersionWarning
    >>> w = MinIPVersionWarning(estimator_name="KernelAttentionRegressor",
    ...                         saved_version=None, current_version="0.1.0",
    ...                         filled={"check_every": 1})
    >>> print(w)  # doctest: +NORMALIZE_WHITESPACE
    KernelAttentionRegressor was saved by an unrecorded earlier version of
    minip_learn and is loaded by minip_learn 0.1.0; hyperparameters missing from the
    saved state were set to their defaults: check_every=1. Refit it, or save it again
    with this version.
    """

    def __init__(self, *, estimator_name, saved_version, current_version, filled):
        self.estimator_name = estimator_name
        self.saved_version = saved_version
        self.current_version = current_version
        self.filled = dict(filled)
        super().__init__(str(self))

    def __str__(self):
        saved = ("an unrecorded earlier version of minip_learn"
                 if self.saved_version is None else f"minip_learn {self.saved_version}")
        msg = (f"{self.estimator_name} was saved by {saved} and is loaded by "
               f"minip_learn {self.current_version}")
        if self.filled:
            filled = ", ".join(f"{k}={v!r}" for k, v in self.filled.items())
            msg += ("; hyperparameters missing from the saved state were set to their "
                    f"defaults: {filled}")
        return msg + ". Refit it, or save it again with this version."


def _init_defaults(cls):
    """``{name: default}`` of the hyperparameters of ``cls.__init__`` (its named
    parameters with a default, as ``get_params`` lists them)."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in params
            if p.name != "self" and p.default is not p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def versioned_state(state):
    """A copy of an estimator's pickled ``state`` (the base may hand back the
    instance's own ``__dict__``) that records the running minip_learn version."""
    state = dict(state)
    state[VERSION_KEY] = _current_version()
    return state


def versioned_restore(cls, state):
    """The ``state`` of a pickled ``cls`` with the hyperparameters of ``cls`` missing
    from it (added since it was saved) set to their defaults, and the
    :class:`MinIPVersionWarning` to issue (None when the saving version is the running
    one and nothing was filled)."""
    state = dict(state)
    saved, current = state.pop(VERSION_KEY, None), _current_version()
    filled = {name: copy.deepcopy(default) for name, default in _init_defaults(cls).items()
              if name not in state}
    state.update(filled)
    if not filled and saved == current:
        return state, None
    return state, MinIPVersionWarning(estimator_name=cls.__name__, saved_version=saved,
                                      current_version=current, filled=filled)
