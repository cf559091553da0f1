"""Any sequence mixer as a regressor: a registered mixer of :mod:`minip_learn.nn`
(:func:`~minip_learn.nn.available_mixers`) or a user's torch module, trained through
the pipeline of the heads."""

import numpy as np
import torch

from ..nn.feature_maps import is_registered
from ..nn.mixers import (
    available_mixers,
    check_mixer_output,
    get_mixer,
    make_mixer,
    mixer_name,
)
from ._base import AttentionEstimator, AttentionRegressorMixin
from ._modules import build_and_check

__all__ = []  # public home: the package minip_learn.estimators


def _check_mixer(value, name):
    get_mixer(value)  # a ValueError naming the valid names
    return value


def _build_mixer(mixer, n_bits, state_size, mixer_kwargs=None):
    """The module of :class:`SequenceMixerRegressor`:
    ``make_mixer(mixer, n_bits, state_size, **mixer_kwargs)`` (the net's ``module``,
    built from its ``module__*`` parameters)."""
    return make_mixer(mixer, n_bits, state_size, **(mixer_kwargs or {}))


def _registered_mixers():
    """The classes of the registered mixers."""
    return [get_mixer(name) for name in available_mixers()]


def _declared_state(module, seq_len):
    """The floats ``module`` declares it carries between tokens after ``seq_len``
    tokens (``state_floats``), or None when it declares none (a user's module)."""
    state_floats = getattr(module, "state_floats", None)
    if not callable(state_floats):
        return None
    try:
        value = state_floats(seq_len)
    except NotImplementedError:
        return None
    return None if value is None else int(value)


class SequenceMixerRegressor(AttentionRegressorMixin, AttentionEstimator):
    """Any sequence mixer as a regressor: one real output per position.

    The module is ``make_mixer(mixer, n_bits, state_size, **mixer_kwargs)`` (see
    :func:`minip_learn.nn.make_mixer`): an :class:`torch.nn.Module` that maps float
    tokens of shape ``(batch, seq_len, n_bits)`` to outputs ``(batch, seq_len)``.
    Training, restarts (``n_init``), stopping (``stop_tolerance``) and callbacks are
    those of the attention heads (:func:`~minip_learn.training.train_members`), and so
    are final-query targets (a ``y`` of shape ``(n_samples,)`` for 3-D ``X``: the
    loss reads the last position only).
    :func:`~minip_learn.model_selection.fit_ensemble` trains several seeds of a
    registered mixer as one stack; a user's module trains one by one. Mixers read the
    order of the tokens, so ``X`` must hold materialised sequences (no
    :class:`~minip_learn.compact.CompactFamily`).

    Parameters
    ----------
    mixer : str, Mixer subclass or callable, default="kernel"
        A registered mixer (the names of :func:`minip_learn.nn.available_mixers`,
        declared in :func:`minip_learn.nn.mixer_table`), a
        :class:`~minip_learn.nn.Mixer` subclass, or a user's module: any
        :class:`torch.nn.Module` class or factory called as
        ``mixer(n_bits, state_size, **mixer_kwargs)``. Fit runs the module once on the
        first batch (:func:`~minip_learn.nn.check_mixer_output`): a ValueError naming
        the mixer when it cannot be built, returns the wrong shape or NaN. The
        estimator pickles and clones when the class is importable.
    state_size : int, default=8
        Size of the mixer's state (the rank of kernel attention, the state dimension
        of the others; see each mixer's ``state_floats``).
    mixer_kwargs : dict, default=None
        Extra keyword arguments of the mixer.
    lr : float, default=0.01
        Learning rate.
    max_epochs : int, default=2000
    batch_size : int, default=None
        Mini-batch size; ``None`` trains full-batch.
    optimizer : {"adam", "adamw", "sgd"}, default="adam"
    weight_decay : float, default=0.0
    stop_tolerance, n_init, check_every, callbacks, dtype, device, random_state, verbose
        As in :class:`KernelAttentionRegressor`.
    split_every : int or None, default=None
        For the kernel mixers (``kernel``, ``retnet``, ``positional``) with the
        ``table`` map: every ``split_every`` epochs, queries that share a dominant
        feature get features of their own, as in :class:`KernelAttentionRegressor`
        (whose default is 200); ignored for other mixers and maps. None turns it off.

    Attributes
    ----------
    net_ : skorch.NeuralNet
        The trained skorch net; ``net_.module_`` is the mixer module.
    n_epochs_ : int
    init_errors_ : list of float
    solved_ : bool
    train_max_error_ : float
    n_bits_, seq_len_, n_features_in_, module_declarations_
        As in :class:`KernelAttentionRegressor` (a user's module declares nothing:
        ``module_declarations_.theorem`` is None).
    query_ : {"all", "last"}
        ``"last"`` after a fit on final-query targets (``predict`` then returns one
        output per sequence).
    state_floats_ : int or None
        Floats the mixer carries from one token to the next at the training
        ``seq_len`` (its ``state_floats(seq_len)`` declaration); None for a user's
        module, which declares nothing.
    theorem_ : {"yes", "positional", "no"} or None
        Whether the certified lower bound covers the mixer (its declaration; see
        :func:`~minip_learn.nn.mixer_table`); None for a user's module.
    theorem_applies_ : bool
        ``theorem_ == "yes"`` and final-query targets: the library's proof covers the
        fitted mixer, so it cannot solve a family below its certified rank (checked by
        :func:`~minip_learn.model_selection.rank_sweep`).
    rank_ : int or None
        The kernel rank of a mixer that is a normalised kernel-attention head (its
        ``state_size``, for ``theorem_`` "yes" or "positional"); None otherwise.

    Examples
    --------
    Causal kernel attention, which the lower bound covers, with its declared state
    ``r (d + 1)`` floats; final-query targets (one per sequence):

    >>> from minip_learn import SequenceMixerRegressor
    >>> from minip_learn.datasets import make_minip
    >>> X, y = make_minip(64, seq_len=3, n_bits=6, query="last", random_state=0)
    >>> est = SequenceMixerRegressor("kernel", state_size=4, max_epochs=50,
    ...                              random_state=0).fit(X, y)
    >>> est.theorem_, est.state_floats_, est.query_, est.predict(X).shape
    ('yes', 28, 'last', (64,))

    A user's module: a causal running mean of learned token maps.

    >>> import torch
    >>> class RunningMean(torch.nn.Module):
    ...     def __init__(self, n_bits, state_size):
    ...         super().__init__()
    ...         self.key = torch.nn.Linear(n_bits, state_size)
    ...         self.out = torch.nn.Linear(n_bits + state_size, 1)
    ...     def forward(self, x):
    ...         steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]
    ...         h = self.key(x).cumsum(1) / steps
    ...         return self.out(torch.cat([x, h], -1)).squeeze(-1)
    >>> X, y = make_minip(64, seq_len=3, n_bits=6, random_state=0)
    >>> est = SequenceMixerRegressor(RunningMean, state_size=4, max_epochs=20,
    ...                              random_state=0).fit(X, y)
    >>> est.predict(X).shape, est.state_floats_, est.theorem_
    ((64, 3), None, None)
    """

    member_params = ("state_size", "random_state")

    _parameter_constraints = {
        **AttentionEstimator._parameter_constraints,
        "mixer": _check_mixer,
        "state_size": ("int", {"min": 1, "size": True}),
        "mixer_kwargs": ("instance", {"types": (dict,), "none": True,
                                      "what": "a dict or None"}),
        "split_every": ("int", {"min": 1, "none": True}),
    }

    def __init__(
        self,
        mixer="kernel",
        state_size=8,
        *,
        mixer_kwargs=None,
        lr=0.01,
        max_epochs=2000,
        batch_size=None,
        optimizer="adam",
        weight_decay=0.0,
        stop_tolerance=0.25,
        n_init=1,
        split_every=None,
        check_every=1,
        callbacks=None,
        dtype="float32",
        device="cpu",
        random_state=None,
        verbose=0,
    ):
        self.mixer = mixer
        self.state_size = state_size
        self.mixer_kwargs = mixer_kwargs
        self.lr = lr
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.weight_decay = weight_decay
        self.stop_tolerance = stop_tolerance
        self.n_init = n_init
        self.split_every = split_every
        self.check_every = check_every
        self.callbacks = callbacks
        self.dtype = dtype
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # -- the module ------------------------------------------------------------------
    def _module_class(self, module_params):
        return _build_mixer

    def _module_params(self, X, checked, fitted):
        kwargs = dict(checked["mixer_kwargs"] or {})
        cls = get_mixer(checked["mixer"])
        data_kwargs = getattr(cls, "data_kwargs", None)
        if data_kwargs is not None:  # e.g. the token table of a kernel mixer's map
            kwargs.update(data_kwargs(X, **kwargs))
        return dict(mixer=checked["mixer"], n_bits=X.shape[2],
                    state_size=checked["state_size"], mixer_kwargs=kwargs)

    def _check_buildable(self, X, module_params, checked):
        if self._counted(module_params):  # the library's own mixer and maps: tested here
            return
        self._check_module(module_params, X[:checked["batch_size"] or len(X)],
                           checked["dtype"])

    def _counted(self, module_params):
        # the library's mixers (and feature maps), never a user's code
        mixer = module_params["mixer"]
        if not (isinstance(mixer, str) or mixer in _registered_mixers()):
            return False
        feature_map = module_params["mixer_kwargs"].get("feature_map")
        return feature_map is None or is_registered(feature_map)

    @staticmethod
    def _check_module(params, batch, dtype):
        """Build the mixer as training will and run it on the first ``batch`` (a
        ValueError naming the mixer), leaving torch's RNG as it was."""
        x = torch.tensor(np.asarray(batch), dtype=dtype)
        build_and_check(
            _build_mixer, params, dtype,
            lambda module: check_mixer_output(module, x, params["mixer"]),
            name=f"mixer={mixer_name(params['mixer'])!r}",
            call=f"mixer(n_bits={params['n_bits']}, state_size={params['state_size']}, "
                 "**mixer_kwargs)")

    def _stackable(self, module_params):
        # the registered mixers run vectorised over a stack's members (torch.func.vmap);
        # a user's module may not
        if isinstance(module_params["mixer"], str):
            return None
        return "with a user's mixer (a module class or factory)"

    # -- validation and fitted state -------------------------------------------------
    def _order_dependence(self, *, reset):
        return "with any mixer depends on the order of the tokens"

    def _set_fitted_state(self, member, data, module_params, fitted, tokens=None):
        super()._set_fitted_state(member, data, module_params, fitted)
        self._set_declarations(data.seq_len)
        return self

    def _set_fitted_module(self, module):
        super()._set_fitted_module(module)
        self._set_declarations(None)
        return self

    def _set_declarations(self, seq_len):
        """``theorem_`` and ``state_floats_`` from the module's declarations."""
        module = self.net_.module_
        self.theorem_ = self.module_declarations_.theorem
        # a causal mixer's bound is that of its final position (final-query targets)
        self.theorem_applies_ = self.theorem_ == "yes" and getattr(self, "query_", None) == "last"
        covered = self.theorem_ in ("yes", "positional")
        self.rank_ = int(module.state_size) if covered else None
        self.state_floats_ = None if seq_len is None else _declared_state(module, seq_len)

    # -- prediction ------------------------------------------------------------------
    def predict(self, X):
        """Real-valued outputs ``p_i`` for every token.

        Parameters
        ----------
        X : array-like of shape (n_samples, seq_len, n_bits) or (n_samples, n_bits)
            Sequences of any length; tokens must have the ``n_bits`` seen in fit.

        Returns
        -------
        y_pred : ndarray of shape (n_samples, seq_len), or (n_samples,) for 2-D X
            After a fit on final-query targets (``query_ = "last"``), shape
            (n_samples,): the output at the last position of every sequence.

        Raises
        ------
        ValueError
            When the mixer gives NaN outputs.
        """
        out = super().predict(X)
        bad = np.isnan(out)
        if bad.any():
            rows = int(bad.reshape(len(out), -1).any(axis=1).sum())
            raise ValueError(
                f"mixer={mixer_name(self.mixer)!r} gives NaN outputs on {rows} of the "
                f"{len(out)} sequences.")
        return out

    def _predict_bytes_per_sequence(self, seq_len, itemsize):
        # tokens, outputs and a state per position (prefix forms), and the masked
        # seq_len x seq_len scores of the whole-sequence forms
        state = _declared_state(self.net_.module_, 1)
        if state is None:
            state = self.state_size * (self.n_bits_ + 1)
        return 4 * (seq_len * (self.n_bits_ + 1 + state) + seq_len * seq_len) * itemsize

    def _predict_cost_note(self):
        return "a mixer's whole-sequence form takes seq_len^2 time and memory"
