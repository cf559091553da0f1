"""Causal normalised kernel attention: the mixers made of one causal
:class:`~minip_learn.nn.KernelAttentionHead` (``"kernel"``, ``"retnet"``,
``"positional"``).

The recurrence, with the query and key features ``phi_Q(x_t)``, ``phi_K(x_t)`` in
``R^r`` (nonnegative) and the value ``v_t`` in ``R^d`` of the token ``x_t``
(``S_0 = 0``, ``s_0 = 0``, ``g = 1`` without decay):

    ``S_t = g S_{t-1} + phi_K(x_t) v_t^T``,   ``s_t = g s_{t-1} + phi_K(x_t)``,
    ``u_t = S_t^T phi_Q(x_t) / phi_Q(x_t)^T s_t``.

``"kernel"`` has positionless maps; ``"retnet"`` the decay ``g`` (the positional map
``phi_Q(x, i) = g^i phi(x)``, ``phi_K(x, j) = g^{-j} phi(x)``); ``"positional"``
learned positional weights (``phi_Q(x, i) = exp(a_i) * phi(x)``, ``phi_K(x, j) =
exp(b_j) * phi(x)``, ``g = 1``). State ``r (d + 1)`` floats (``r`` more for
log-domain maps such as ``exp``: the running maximum of the key log-features). The
lower bound covers ``"kernel"`` when the kernel is nonnegative, and ``"retnet"`` and
``"positional"`` on final-query families that hold every order of their keys
(``theorem = "positional"``); a signed feature map is outside it (``theorem`` reads
``"no"`` on such an instance: ``theorem_condition``).
"""

import numpy as np

from ..._validation import distinct_tokens
from ..feature_maps import get_feature_map
from ..heads import KernelAttentionHead
from ._base import HeadMixer, register_mixer

__all__ = []  # public home: the package minip_learn.nn.mixers


class KernelHeadMixer(HeadMixer):
    """Causal normalised kernel attention (:class:`~minip_learn.nn.KernelAttentionHead`
    with ``causal=True``): :meth:`recurrent` is the head's recurrent form, and
    :meth:`step` the head's one-token step, which exposes the state.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and rank ``r`` (features).
    value_dim, feature_map, feature_width, feature_depth, shared_features, \
feature_kwargs, denominator_eps
        As in :class:`~minip_learn.nn.KernelAttentionHead`.
    **order
        The head's ``positional``, ``decay`` and ``max_len``.
    """

    #: a signed kernel (e.g. the ``identity`` feature map) is outside the bound
    theorem_condition = "a nonnegative kernel (signed feature maps are outside the bound)"
    state_formula = "r (d + 1)"
    state_padding = "mask"  # the head's rank mask
    per_token_maps = True

    def __init__(self, n_bits, state_size, *, value_dim=None, feature_map="elu+1",
                 feature_width=64, feature_depth=0, shared_features=False,
                 feature_kwargs=None, denominator_eps=1e-3, **order):
        head = KernelAttentionHead(
            n_bits, state_size, feature_map=feature_map, value_dim=value_dim,
            feature_width=feature_width, feature_depth=feature_depth,
            shared_features=shared_features, feature_kwargs=feature_kwargs,
            denominator_eps=denominator_eps, causal=True, **order)
        super().__init__(n_bits, state_size, head)

    @classmethod
    def data_kwargs(cls, X, *, feature_map="elu+1", feature_kwargs=None, **kwargs):
        """The ``vocabulary`` of a feature map defined on the training tokens
        (``table``), inside ``feature_kwargs``."""
        if not get_feature_map(feature_map).requires_vocabulary:
            return {}
        tokens = distinct_tokens(np.asarray(X).reshape(-1, np.shape(X)[-1]))
        return {"feature_kwargs": {**(feature_kwargs or {}),
                                   "vocabulary": tokens.astype(np.uint8)}}

    def meets_theorem_condition(self):
        """Whether the head's kernel is nonnegative (``head.nonnegative``)."""
        return self.head.nonnegative

    def recurrent(self, x):
        return self.head.recurrent(x)

    @property
    def query_features(self):
        """The head's query map (read by feature splitting, with :meth:`token_tables`)."""
        return self.head.query_features

    @property
    def key_features(self):
        """The head's key map."""
        return self.head.key_features

    @property
    def feature_mask(self):
        """The head's rank mask (shape ``(r,)``, 1 = feature in use; None by default),
        which a stack of mixers of several state sizes sets."""
        return self.head.feature_mask

    @feature_mask.setter
    def feature_mask(self, mask):
        self.head.feature_mask = mask

    def token_tables(self):
        """The head's query and key log-feature tables, or None
        (:meth:`KernelAttentionHead.token_tables
        <minip_learn.nn.KernelAttentionHead.token_tables>`): what
        :func:`~minip_learn.nn.split_shared_features` edits."""
        return self.head.token_tables()

    def state_floats(self, seq_len=None):
        """``r (d + 1)``: the sketch ``S`` and ``s`` (log-domain maps: ``r`` more, the
        running maximum of the key log-features)."""
        return self.head.state_floats(seq_len)

    def initial_state(self, batch, *, dtype, device):
        return self.head.initial_state((batch,), dtype=dtype, device=device)

    def step(self, state, x_t, position=0):
        return self.head.step(state, x_t, position=position)


@register_mixer("kernel")
class KernelMixer(KernelHeadMixer):
    """Causal normalised nonnegative kernel attention, the model of the theorem.

    ``S_t = S_{t-1} + phi_K(x_t) v_t^T``, ``s_t = s_{t-1} + phi_K(x_t)`` and
    ``u_t = S_t^T phi_Q(x_t) / phi_Q(x_t)^T s_t``: a
    :class:`~minip_learn.nn.KernelAttentionHead` with ``causal=True`` and
    ``rank = state_size``. Its parallel form is the head's forward and
    :meth:`recurrent` the head's recurrent form
    (:func:`minip_learn.nn.ops.recurrent_attend`). State ``r (d + 1)`` floats
    (log-domain maps such as ``exp``: ``r (d + 2)``, with the running maximum). The
    lower bound covers it when the kernel is nonnegative (``theorem_condition``: an
    instance with a signed feature map reads ``theorem`` as ``"no"``).

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and rank ``r`` (features).
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    feature_map, feature_width, feature_depth, shared_features, feature_kwargs, denominator_eps
        As in :class:`~minip_learn.nn.KernelAttentionHead`.

    Attributes
    ----------
    head : KernelAttentionHead
        The causal head.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("kernel", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats(), mixer.theorem
    (True, 15, 'yes')
    >>> make_mixer("kernel", 4, 3, feature_map="exp").state_floats()  # r (d + 2)
    18
    """

    theorem = "yes"
    paper = ("Opazo 2026, Three Tokens Force Exponential Feature Rank in Nonnegative Kernel "
             "Attention (causal: Katharopoulos et al. 2020, Transformers are RNNs)")

    def __init__(self, n_bits, state_size, *, value_dim=None, feature_map="elu+1",
                 feature_width=64, feature_depth=0, shared_features=False,
                 feature_kwargs=None, denominator_eps=1e-3):
        super().__init__(n_bits, state_size, value_dim=value_dim, feature_map=feature_map,
                         feature_width=feature_width, feature_depth=feature_depth,
                         shared_features=shared_features, feature_kwargs=feature_kwargs,
                         denominator_eps=denominator_eps)


@register_mixer("retnet")
class RetNetMixer(KernelHeadMixer):
    """Normalised decayed kernel attention, RetNet-style.

    ``S_t = g S_{t-1} + phi_K(x_t) v_t^T``, ``s_t = g s_{t-1} + phi_K(x_t)`` and
    ``u_t = S_t^T phi_Q(x_t) / phi_Q(x_t)^T s_t``: the position-dependent maps
    ``phi_Q(x, i) = g^i phi(x)``, ``phi_K(x, j) = g^-j phi(x)`` of a
    :class:`~minip_learn.nn.KernelAttentionHead` with ``causal=True`` and
    ``positional="decay"``. RetNet's retention (Sun et al. 2023) with its normalisation
    by the decayed kernel's row sums and nonnegative feature maps. State ``r (d + 1)``
    floats (log-domain maps: ``r (d + 2)``). The lower bound covers these
    position-dependent maps on final-query families that hold every order of their
    keys (``theorem = "positional"``, :ref:`theory-positional`).

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and rank ``r`` (features).
    decay : float in (0, 1], default=0.96875
        The factor ``g``; the default ``1 - 2^-5`` is the decay of RetNet's first head.
    value_dim, feature_map, feature_width, feature_depth, shared_features, feature_kwargs, denominator_eps
        As in :class:`KernelMixer`.

    Attributes
    ----------
    head : KernelAttentionHead
        The causal head, with ``positional="decay"``.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("retnet", 4, 3, decay=0.9).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats(), mixer.theorem
    (True, 15, 'positional')
    """

    theorem = "positional"
    paper = ("Sun et al. 2023, Retentive Network: A Successor to Transformer for Large "
             "Language Models (normalised, nonnegative features)")

    def __init__(self, n_bits, state_size, *, value_dim=None, decay=0.96875,
                 feature_map="elu+1", feature_width=64, feature_depth=0,
                 shared_features=False, feature_kwargs=None, denominator_eps=1e-3):
        super().__init__(n_bits, state_size, value_dim=value_dim, feature_map=feature_map,
                         feature_width=feature_width, feature_depth=feature_depth,
                         shared_features=shared_features, feature_kwargs=feature_kwargs,
                         denominator_eps=denominator_eps, positional="decay", decay=decay)


@register_mixer("positional")
class PositionalKernelMixer(KernelHeadMixer):
    """Causal normalised kernel attention with learned positional weights.

    ``alpha_ij = <phi_Q(x_i) * exp(a_i), phi_K(x_j) * exp(b_j)>`` for ``j <= i``: a
    :class:`~minip_learn.nn.KernelAttentionHead` with ``causal=True`` and
    ``positional="learned"`` (a learned log-weight per position and feature on each
    side, so the kernel stays nonnegative). Its recurrence is that of ``kernel`` with
    the position's weights applied to the token's features; state ``r (d + 1)`` floats
    (log-domain maps: ``r (d + 2)``). Covered as ``"retnet"`` is (``theorem =
    "positional"``). ``max_len``, the longest sequence, comes from the training data
    (:meth:`data_kwargs`) when the estimator builds it.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and rank ``r`` (features).
    max_len : int
        The longest sequence the positional weights cover.
    value_dim, feature_map, feature_width, feature_depth, shared_features, \
feature_kwargs, denominator_eps
        As in :class:`KernelMixer`.

    Examples
    --------
    >>> import numpy as np
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn.mixers import PositionalKernelMixer
    >>> X = np.zeros((5, 6, 4))  # five training sequences of six tokens
    >>> PositionalKernelMixer.data_kwargs(X)
    {'max_len': 6}
    >>> mixer = PositionalKernelMixer(4, 3, **PositionalKernelMixer.data_kwargs(X)).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.theorem
    (True, 'positional')
    """

    theorem = "positional"
    paper = ("Opazo 2026 (the statement for position-dependent maps); learned positional "
             "weights of this library")

    def __init__(self, n_bits, state_size, *, max_len, value_dim=None, feature_map="elu+1",
                 feature_width=64, feature_depth=0, shared_features=False,
                 feature_kwargs=None, denominator_eps=1e-3):
        super().__init__(n_bits, state_size, value_dim=value_dim, feature_map=feature_map,
                         feature_width=feature_width, feature_depth=feature_depth,
                         shared_features=shared_features, feature_kwargs=feature_kwargs,
                         denominator_eps=denominator_eps, positional="learned",
                         max_len=max_len)

    @classmethod
    def data_kwargs(cls, X, **kwargs):
        """The table's ``vocabulary`` (as :class:`KernelMixer`) and ``max_len``, the
        training sequences' length (unless given)."""
        out = super().data_kwargs(X, **kwargs)
        if kwargs.get("max_len") is None:
            out["max_len"] = int(np.shape(X)[1])
        return out
