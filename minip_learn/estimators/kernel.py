"""Kernel-attention estimators: the regressor, and the shared base of the classifier."""

import numpy as np
import torch

from .._validation import check_binary, distinct_tokens
from ..nn import (
    KernelAttentionHead,
    KernelAttentionModel,
    check_feature_map_output,
    get_feature_map,
)
from ..nn.feature_maps import is_registered
from ..nn.ops import CAUSAL_CHUNK
from ._base import AttentionEstimator, AttentionRegressorMixin
from ._modules import build_and_check

__all__ = []  # public home: the package minip_learn.estimators


def _check_feature_map(value, name):
    get_feature_map(value)  # a ValueError naming the valid names
    return value


class KernelAttentionBase(AttentionEstimator):
    """Hyperparameters, module and prediction of the kernel-attention estimators."""

    _parameter_constraints = {
        **AttentionEstimator._parameter_constraints,
        "split_every": ("int", {"min": 1, "none": True}),
        "feature_map": _check_feature_map,
        "feature_kwargs": ("instance", {"types": (dict,), "none": True,
                                        "what": "a dict or None"}),
        "rank": ("int", {"min": 1, "size": True}),
        "n_heads": ("int", {"min": 1}),
        "n_layers": ("int", {"min": 1}),
        "readout": ("choice", {"options": ("affine", "mlp")}),
        "readout_width": ("int", {"min": 1, "size": True}),
        "value_dim": ("int", {"min": 1, "none": True, "size": True}),
        "feature_width": ("int", {"min": 1, "size": True}),
        "feature_depth": ("int", {"min": 0}),
        "shared_features": ("bool",),
        "causal": ("bool",),
        "positional": ("choice", {"options": ("decay", "learned"), "none": True}),
        "decay": ("real", {"min": 0.0, "strict": True, "max": 1.0, "none": True}),
    }

    def __init__(
        self,
        rank=16,
        *,
        feature_map="elu+1",
        value_dim=None,
        feature_width=64,
        feature_depth=0,
        shared_features=False,
        feature_kwargs=None,
        causal=False,
        positional=None,
        decay=None,
        n_heads=1,
        n_layers=1,
        readout="affine",
        readout_width=64,
        lr=0.03,
        max_epochs=2000,
        batch_size=None,
        optimizer="adam",
        weight_decay=0.0,
        stop_tolerance=0.25,
        n_init=1,
        split_every=200,
        check_every=1,
        callbacks=None,
        dtype="float32",
        device="cpu",
        random_state=None,
        verbose=0,
    ):
        self.rank = rank
        self.feature_map = feature_map
        self.value_dim = value_dim
        self.feature_width = feature_width
        self.feature_depth = feature_depth
        self.shared_features = shared_features
        self.feature_kwargs = feature_kwargs
        self.causal = causal
        self.positional = positional
        self.decay = decay
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.readout = readout
        self.readout_width = readout_width
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

    def _n_outputs(self, fitted):
        """Outputs per position: None for one real output (regression)."""
        return None

    def _module_params(self, X, checked, fitted):
        cls = get_feature_map(checked["feature_map"])
        feature_kwargs = dict(checked["feature_kwargs"] or {})
        rank = checked["rank"]
        check = getattr(cls, "check_params", None)
        if check is not None:  # e.g. taylor: rank must be 1 + p + p(p+1)/2
            check(X.shape[2], rank, **feature_kwargs)
        if checked["n_layers"] > 1 and cls.requires_vocabulary:
            raise ValueError(
                f"feature_map={checked['feature_map']!r} is defined on the token bits only "
                f"and needs n_layers=1; got n_layers={checked['n_layers']}."
            )
        if cls.requires_vocabulary:
            check_binary(X, name="X")
            feature_kwargs["vocabulary"] = distinct_tokens(
                X.reshape(-1, X.shape[2])).astype(np.uint8)
        params = {k: checked[k] for k in ("rank", "feature_map", "value_dim", "feature_width",
                                          "feature_depth", "shared_features")}
        params.update(n_bits=X.shape[2], feature_kwargs=feature_kwargs)
        params.update(self._order_params(X, checked))
        beyond = dict(n_heads=checked["n_heads"], n_layers=checked["n_layers"],
                      readout=checked["readout"], readout_width=checked["readout_width"],
                      n_outputs=self._n_outputs(fitted))
        if (beyond["n_heads"], beyond["n_layers"], beyond["readout"],
                beyond["n_outputs"]) != (1, 1, "affine", None):
            params.update(beyond)  # a variant outside the theorem
        return params

    @staticmethod
    def _order_params(X, checked):
        """The head's ``causal``, ``positional``, ``decay`` and ``max_len`` (the training
        sequences' length, for ``positional="learned"``), where not the defaults."""
        causal, positional, decay = checked["causal"], checked["positional"], checked["decay"]
        if positional == "decay" and decay is None:
            raise ValueError("positional='decay' needs decay, the factor g in (0, 1] of "
                             "alpha_ij = g^(i-j) <phi(x_i), phi(x_j)>; got decay=None.")
        if positional != "decay" and decay is not None:
            raise ValueError(f"decay is the factor of positional='decay'; got decay={decay!r} "
                             f"with positional={positional!r}.")
        if positional == "decay" and not causal:
            raise ValueError("positional='decay' needs causal=True: the decayed kernel "
                             "g^(i-j) <phi(x_i), phi(x_j)> is defined for keys j <= i.")
        params = {"causal": True} if causal else {}
        if positional is not None:
            params["positional"] = positional
        if decay is not None:
            params["decay"] = decay
        if positional == "learned":
            params["max_len"] = X.shape[1]
        return params

    def _check_buildable(self, X, module_params, checked):
        if not is_registered(module_params["feature_map"]):
            head = {k: v for k, v in module_params.items()
                    if k not in ("n_heads", "n_layers", "readout", "readout_width",
                                 "n_outputs")}
            self._check_user_map(X, head, checked["dtype"])

    def _counted(self, module_params):
        return is_registered(module_params["feature_map"])

    def _activation_width(self, module_params):
        # the query and key features of every position: rank values per map, each head
        return module_params["rank"] * module_params.get("n_heads", 1)

    @staticmethod
    def _check_user_map(X, params, dtype):
        """Build a user's map as the head would and check its output on the distinct
        training tokens (a ValueError naming the map), leaving torch's RNG as it was."""
        tokens = torch.as_tensor(distinct_tokens(X.reshape(-1, X.shape[2])), dtype=dtype)

        def check(head):
            for phi in {id(m): m for m in (head.query_features, head.key_features)}.values():
                check_feature_map_output(phi, tokens, params["feature_map"])

        build_and_check(
            KernelAttentionHead, params, tokens.dtype, check,
            name=f"feature_map={params['feature_map']!r}",
            call=f"feature_map(n_bits={params['n_bits']}, rank={params['rank']}, "
                 "**feature_kwargs)")

    def _set_fitted_state(self, member, data, module_params, fitted, tokens=None):
        super()._set_fitted_state(member, data, module_params, fitted)
        self.kernel_min_ = self._kernel_min(data.tokens if tokens is None else tokens)
        return self

    def _set_fitted_module(self, module):
        super()._set_fitted_module(module)
        self.kernel_min_ = float("nan")  # no training tokens
        return self

    def _kernel_min(self, tokens):
        """Smallest kernel value over pairs of training tokens (any array of them, e.g.
        the sequences or their distinct tokens), over the heads that read the tokens
        (the first layer); see ``kernel_min_``."""
        module = self.net_.module_
        heads = getattr(module, "layers", [[module]])[0]
        seed = self.KERNEL_MIN_RANDOM_STATE
        return min(head.kernel_min(tokens, random_state=seed) for head in heads)

    def _module_class(self, module_params):
        # the single head of the theorem with the defaults, the general model otherwise
        if "n_heads" in module_params:
            return KernelAttentionModel
        return KernelAttentionHead

    def _stackable(self, module_params):
        if "n_heads" in module_params:
            return "with n_heads, n_layers, readout='mlp' or class logits"
        return None

    #: Seed of the sample of token pairs behind ``kernel_min_`` (above
    #: :attr:`KernelAttentionHead.KERNEL_MIN_MAX_PAIRS <minip_learn.nn.KernelAttentionHead.KERNEL_MIN_MAX_PAIRS>` pairs)
    KERNEL_MIN_RANDOM_STATE = 0

    @property
    def theorem_applies_(self):
        """Whether the certified lower bound covers the fitted model (see the class
        docstring and :ref:`theory-r4`). A causal head is covered on final-query targets
        (its last output is the full head's output at the query), not on targets at
        every position."""
        head = self.module_declarations_.single_head
        if head is None or head.positional is not None:
            return False
        if head.causal and getattr(self, "query_", "last") != "last":
            return False
        if head.nonnegative:  # declared: nonnegative for every pair of tokens
            return True
        return bool(getattr(self, "kernel_min_", float("nan")) >= 0)

    @property
    def theorem_(self):
        """Which statement covers the fitted model: ``"yes"`` (``theorem_applies_``),
        ``"positional"`` (a single head with a nonnegative kernel of positional
        maps) or ``"no"``."""
        if self.theorem_applies_:
            return "yes"
        head = self.module_declarations_.single_head
        if head is not None and head.positional is not None and (
                head.nonnegative or getattr(self, "kernel_min_", float("nan")) >= 0):
            return "positional"
        return "no"

    def _predict_bytes_per_sequence(self, seq_len, itemsize):
        # every head of every layer holds its own features and values; logits per class
        module = self.net_.module_
        per_head = super()._predict_bytes_per_sequence(seq_len, itemsize)
        if self.module_declarations_.causal:
            # a block's masked kernel (log-domain maps: its log-features per pair)
            block = min(seq_len, CAUSAL_CHUNK)
            per_head += 3 * block * block * (getattr(module, "rank", 1) + 1) * itemsize
        blocks = getattr(module, "n_heads", 1) * getattr(module, "n_layers", 1)
        outputs = getattr(module, "n_outputs", None) or 1
        readout = getattr(getattr(module, "readout", None), "net", None)
        width = 0 if readout is None else readout[0].out_features
        return blocks * per_head + 4 * seq_len * (outputs + width) * itemsize

    def _check_predict_tokens(self, X3):
        module = self.net_.module_
        max_len = getattr(getattr(module, "heads", [module])[0], "max_len", None)
        if max_len is not None and X3.shape[1] > max_len:
            raise ValueError(
                f"X has seq_len={X3.shape[1]}, longer than the training sequences "
                f"(max_len={max_len}): positional='learned' has a learned weight for "
                f"the positions 0..{max_len - 1} only.")
        vocab = getattr(self, "vocabulary_", None)
        if vocab is None:
            return
        check_binary(X3, name="X")
        tokens = distinct_tokens(X3.reshape(-1, X3.shape[2]).astype(np.uint8))
        known = {t.tobytes() for t in vocab}
        unseen = [t for t in tokens if t.tobytes() not in known]
        if unseen:
            raise ValueError(
                f"X contains {len(unseen)} token(s) not seen in fit, e.g. "
                f"{unseen[0].tolist()}; feature_map='table' is defined only on its "
                f"vocabulary of {len(vocab)} training tokens."
            )


class KernelAttentionRegressor(AttentionRegressorMixin, KernelAttentionBase):
    """Normalised nonnegative kernel-attention head (rank ``r``) as a regressor.

    ``p_i = rho_{x_i}(u_i)`` with ``u_i = sum_j alpha(x_i, x_j) v(x_j) / sum_j alpha(x_i, x_j)``
    and ``alpha(x, z) = <phi_Q(x), phi_K(z)>``, computed through the fixed-size sketch
    (see :doc:`/theory`).

    Parameters
    ----------
    rank : int, default=16
        Number of features ``r``.
    feature_map : str, FeatureMap subclass or callable, default="elu+1"
        Name of the feature map; see :func:`minip_learn.nn.available_feature_maps`
        (``elu+1``, ``exp``, ``favor+``, ``relu``, ``softplus``, ``squared_relu``,
        ``table``, the literature's ``t2r``, ``hedgehog``, ``dpfp``, ``rebased`` ...).
        ``table`` learns a free feature vector per distinct token of the training set
        and rejects unseen tokens at predict. Also a
        :class:`~minip_learn.nn.FeatureMap` subclass, or a user's map: any
        :class:`torch.nn.Module` class or factory called as
        ``feature_map(n_bits, rank, **feature_kwargs)`` that maps float tokens of shape
        ``(..., n_bits)`` to features of shape ``(..., rank)`` (see
        :class:`~minip_learn.nn.UserFeatureMap`). Fit checks a map that is not
        registered once on the training tokens: a ValueError naming it when it returns
        no tensor, the wrong shape or NaN. The estimator pickles and clones when the
        class is importable.
    value_dim : int, default=None
        Dimension of the value map; ``None`` means ``n_bits``.
    feature_width : int, default=64
        Hidden width of the feature encoder MLP.
    feature_depth : int, default=0
        Hidden layers of the feature encoder (0: a learnable linear projection).
    shared_features : bool, default=False
        Use the same map for queries and keys.
    feature_kwargs : dict, default=None
        Extra options of the feature map (``floor`` for ``relu``, ``proj_dim`` for
        ``favor+`` ..., any keyword of a user's map).
    causal : bool, default=False
        Position ``i`` attends to the positions ``j <= i`` only (causal attention,
        as in a decoder; see :class:`~minip_learn.nn.KernelAttentionHead`). Still
        covered by the theorem: on final-query data the last position sees every token
        and computes what the non-causal head computes there.
    positional : {None, "decay", "learned"}, default=None
        Position-dependent token maps. ``"decay"``: RetNet-style normalised decayed
        attention ``alpha_ij = g^(i-j) <phi_Q(x_i), phi_K(x_j)>`` with ``g = decay``
        (needs ``causal=True``). ``"learned"``: learned per-position log-weights of the
        query and key features, for positions up to the training sequences' length
        (longer sequences are a ValueError at predict). Positional maps are covered on
        final-query families that hold every order of their keys only:
        ``theorem_applies_`` is False and ``theorem_`` is ``"positional"`` for a
        nonnegative kernel (:ref:`theory-positional`).
        Causal and positional estimators refuse a
        :class:`~minip_learn.compact.CompactFamily` ``X`` (a multiset has no order).
    decay : float in (0, 1], default=None
        The factor ``g`` of ``positional="decay"`` (required there, refused with any
        other ``positional``).
    n_heads : int, default=1
        Kernel heads per layer, each of rank ``rank``. Values above 1 are **outside
        the theorem** (see :ref:`theory-r7` and
        :class:`~minip_learn.nn.KernelAttentionModel`).
    n_layers : int, default=1
        Layers of heads with a residual token stream; above 1 is **outside the
        theorem**.
    readout : {"affine", "mlp"}, default="affine"
        Query-dependent affine readout (see :doc:`/theory`) or an MLP of the query and the
        attended values (**outside the theorem**).
    readout_width : int, default=64
        Hidden width of the MLP readout (ignored for ``"affine"``).
    lr : float, default=0.03
        Learning rate.
    max_epochs : int, default=2000
        Maximum number of passes over the training set.
    batch_size : int, default=None
        Mini-batch size; ``None`` trains full-batch.
    optimizer : {"adam", "adamw", "sgd"}, default="adam"
    weight_decay : float, default=0.0
    stop_tolerance : float or None, default=0.25
        Stop training once every training position is within ``stop_tolerance`` of its
        target (``<= 0.5``, the solving criterion; the default leaves a margin that
        generalises to held-out sequences). ``None`` always runs ``max_epochs``.
    n_init : int, default=1
        Number of initialisations (as in :class:`~sklearn.cluster.KMeans`): training
        restarts from a new seeded initialisation until one reaches
        ``stop_tolerance``, at most ``n_init`` times, and the run with the smallest
        training max error is kept. Gradient training of attention heads is non-convex;
        restarts are the honest cure for an unlucky initialisation, and the attempts
        are recorded in ``init_errors_``.
    split_every : int or None, default=200
        For ``feature_map="table"`` (a single head with separate query and key maps):
        every ``split_every`` epochs, queries that share a dominant feature while
        another feature is dominant for no query get features of their own
        (:func:`~minip_learn.nn.split_shared_features`, zeroing the optimizer state of
        the entries it overwrites). This cures the *assignment trap* that otherwise
        stops every seed of the witness suite (see :ref:`theory-r6`) at its constructive rank.
        Ignored for other maps and modules; ``None`` turns it off.
    check_every : int, default=1
        Epochs between two reads of the training figures (losses, max errors) on the
        host; in between they stay on the device, and training stops
        (``stop_tolerance``) only on those epochs. On a GPU a value such as 10 spares
        a host sync per epoch; the history still holds every epoch.
    callbacks : list of skorch callbacks, default=None
        Extra skorch callbacks (with ``check_every > 1`` they read the training figures
        in the history on the checked epochs only).
    dtype : {"float32", "float64"}, default="float32"
    device : str, default="cpu"
        Torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...).
    random_state : int, RandomState instance or None, default=None
        Seeds initialisation and shuffling; an int makes fits reproducible.
    verbose : int, default=0
        skorch verbosity.

    Attributes
    ----------
    net_ : skorch.NeuralNet
        The trained skorch net; ``net_.module_`` is the
        :class:`~minip_learn.nn.KernelAttentionHead`, ``net_.history`` the log.
    n_epochs_ : int
        Epochs run by the kept initialisation.
    init_errors_ : list of float
        Training max error reached by each initialisation tried (see ``n_init``).
    solved_ : bool
        Whether the fitted head solves its training set (every position within 1/2).
    train_max_error_ : float
        Largest absolute training error of the fitted head.
    n_bits_, seq_len_, n_features_in_ : int
        Bits per token, training sequence length, and ``n_bits_`` again.
    vocabulary_ : ndarray of shape (n_tokens, n_bits)
        Distinct training tokens (``feature_map="table"`` only).
    kernel_min_ : float
        Smallest kernel value ``alpha(x, z) = <phi_Q(x), phi_K(z)>`` of the fitted
        head over the ordered pairs of distinct training tokens (``x = z`` included),
        in float64 (:meth:`KernelAttentionHead.kernel_min
        <minip_learn.nn.KernelAttentionHead.kernel_min>`): every pair when there are at
        most ``10**6``, otherwise the pairs of 1,000 queries and 1,000 keys drawn with
        seed 0. With several heads, the smallest over the first layer's heads. ``nan`` for an
        estimator made by :meth:`from_module`.
    theorem_applies_ : bool
        Whether the certified lower bound (see :ref:`theory-r4` and :ref:`theory-r5`)
        covers the fitted model: one head, one layer, affine readout, and a kernel
        that is nonnegative -- declared so by the map (nonnegative features, or a
        provably nonnegative kernel such as ``taylor``'s), or measured so on the
        training tokens (``kernel_min_ >= 0``). Signed maps (``identity``, ``rff``, a
        user's map) are flagged from what they compute. ``n_heads > 1``,
        ``n_layers > 1`` and ``readout="mlp"`` are variants outside the theorem (see
        :ref:`theory-r7`). Positional maps (``positional``): False (their bound needs
        a family in every order of its keys, ``theorem_`` ``"positional"``). With the defaults the module is a
        :class:`~minip_learn.nn.KernelAttentionHead`; otherwise a
        :class:`~minip_learn.nn.KernelAttentionModel`.
    theorem_ : {"yes", "positional", "no"}
        ``"yes"`` when ``theorem_applies_``; ``"positional"`` for a single head
        with positional maps and a nonnegative kernel (covered on final-query
        families in every order of their keys); ``"no"`` otherwise.
    module_declarations_ : :class:`~sklearn.utils.Bunch`
        What the fitted module declares about itself: ``causal``, ``positional``,
        ``nonnegative``, ``theorem``, ``theorem_applies`` and ``single_head``.

    Examples
    --------
    >>> from minip_learn import KernelAttentionRegressor
    >>> from minip_learn.datasets import make_minip
    >>> X, y = make_minip(64, seq_len=2, n_bits=6, random_state=0)
    >>> est = KernelAttentionRegressor(rank=1, random_state=0).fit(X, y)
    >>> est.score(X, y)
    1.0
    >>> causal = KernelAttentionRegressor(rank=2, causal=True, positional="decay", decay=0.9,
    ...                                   max_epochs=5, random_state=0).fit(X, y)
    >>> causal.predict(X).shape, causal.theorem_
    ((64, 2), 'positional')
    """
