"""The softmax-attention regressor (the dense baseline of the kernel heads)."""

from ..nn import SoftmaxAttentionHead
from ._base import AttentionEstimator, AttentionRegressorMixin

__all__ = []  # public home: the package minip_learn.estimators


class SoftmaxAttentionRegressor(AttentionRegressorMixin, AttentionEstimator):
    """Dense softmax-attention head as a regressor.

    Scores ``q(x_i)^T k(x_j) / temperature`` with learnable affine ``q, k`` of
    dimension ``score_dim``, softmax weights, the same value map and query-dependent
    affine readout as the kernel head (see :doc:`/theory`). Cost ``O(N^2)`` per sequence.

    Parameters
    ----------
    score_dim : int, default=None
        Query/key dimension ``d_s``; ``None`` means ``n_bits`` (what :ref:`theory-r2` uses).
    temperature : float, default=1.0
        Softmax temperature ``tau`` (> 0).
    value_dim : int, default=None
        Dimension of the value map; ``None`` means ``n_bits``.
    causal : bool, default=False
        Position ``i`` attends to the positions ``j <= i`` only (masked scores; see
        :class:`~minip_learn.nn.SoftmaxAttentionHead`). A causal estimator refuses a
        :class:`~minip_learn.compact.CompactFamily` ``X`` (a multiset has no order).
    lr : float, default=0.01
        Learning rate.
    optimizer : {"adam", "adamw", "sgd"}, default="adamw"
    weight_decay : float, default=0.01
        With AdamW at ``lr=0.01`` (and the head's small initial query/key weights)
        the head generalises on hard random length-3 Min-IP; see the performance page
        for the solve rates of these defaults.
    max_epochs, batch_size, stop_tolerance, n_init, check_every, callbacks, \
dtype, device, random_state, verbose
        As in :class:`KernelAttentionRegressor`.

    Attributes
    ----------
    net_ : skorch.NeuralNet
        The trained skorch net; ``net_.module_`` is the
        :class:`~minip_learn.nn.SoftmaxAttentionHead`.
    n_epochs_ : int
    init_errors_ : list of float
    solved_ : bool
    train_max_error_ : float
    n_bits_, seq_len_, n_features_in_ : int
    module_declarations_ : :class:`~sklearn.utils.Bunch`
        As in :class:`KernelAttentionRegressor` (``theorem`` is ``"no"``).

    Examples
    --------
    >>> from minip_learn import SoftmaxAttentionRegressor
    >>> from minip_learn.datasets import make_minip
    >>> X, y = make_minip(200, seq_len=3, n_bits=8, min_gap=2, random_state=0)
    >>> est = SoftmaxAttentionRegressor(random_state=0).fit(X, y)
    >>> est.solved_
    True
    """

    member_params = ("random_state",)

    _parameter_constraints = {
        **AttentionEstimator._parameter_constraints,
        "score_dim": ("int", {"min": 1, "none": True, "size": True}),
        "value_dim": ("int", {"min": 1, "none": True, "size": True}),
        "temperature": ("real", {"min": 0.0, "strict": True}),
        "causal": ("bool",),
    }

    def __init__(
        self,
        score_dim=None,
        *,
        temperature=1.0,
        value_dim=None,
        causal=False,
        lr=0.01,
        max_epochs=2000,
        batch_size=None,
        optimizer="adamw",
        weight_decay=0.01,
        stop_tolerance=0.25,
        n_init=1,
        check_every=1,
        callbacks=None,
        dtype="float32",
        device="cpu",
        random_state=None,
        verbose=0,
    ):
        self.score_dim = score_dim
        self.temperature = temperature
        self.value_dim = value_dim
        self.causal = causal
        self.lr = lr
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.weight_decay = weight_decay
        self.stop_tolerance = stop_tolerance
        self.n_init = n_init
        self.check_every = check_every
        self.callbacks = callbacks
        self.dtype = dtype
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _module_class(self, module_params):
        return SoftmaxAttentionHead

    def _module_params(self, X, checked, fitted):
        params = dict(n_bits=X.shape[2], score_dim=checked["score_dim"],
                      value_dim=checked["value_dim"], temperature=checked["temperature"])
        if checked["causal"]:
            params["causal"] = True
        return params

    def _activation_width(self, module_params):
        # the queries of every position: score_dim values each (n_bits by default)
        return module_params["score_dim"] or module_params["n_bits"]

    def _predict_bytes_per_sequence(self, seq_len, itemsize):
        # scores, softmax weights and their product, for the scores the head holds at
        # once: all seq_len^2 on short sequences, a bounded block on long ones
        linear = super()._predict_bytes_per_sequence(seq_len, itemsize)
        return linear + 3 * self.net_.module_.live_scores(seq_len) * itemsize

    def _predict_cost_note(self):
        return ("softmax attention takes seq_len^2 time; the fused kernel keeps its "
                "memory linear in seq_len")
