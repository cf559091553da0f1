"""Unnormalised causal linear attention (``"linear"``).

The recurrence, with the features ``phi(q_t)``, ``phi(k_t)`` in ``R^r`` and the value
``v_t`` in ``R^d`` of the token ``x_t`` (``S_0 = 0``):

    ``S_t = S_{t-1} + phi(k_t) v_t^T``,   ``u_t = S_t^T phi(q_t)``.

State ``r d`` floats. Outside the theorem: its normaliser is part of the theorem's
hypothesis.
"""

import torch

from ..feature_maps import make_feature_map
from ..ops.masks import causal_part
from ..ops.tokens import gathered_last_attend, token_scores
from ._base import MatrixStateMixer, QKVMaps, register_mixer

__all__ = []  # public home: the package minip_learn.nn.mixers


@register_mixer("linear")
class LinearAttentionMixer(MatrixStateMixer):
    """Unnormalised causal linear attention: ``u_t = S_t^T phi(q_t)``,
    ``S_t = S_{t-1} + phi(k_t) v_t^T``.

    ``phi(q_t)`` and ``phi(k_t)`` are two feature maps of the registry (default
    ``"elu+1"``) of the token, with ``state_size`` features each. Without the
    normaliser ``phi(q_t)^T s_t`` of kernel attention, the theorem does not cover it.
    State ``r d`` floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and feature dimension ``r``.
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    feature_map : str, default="elu+1"
        A name of the feature-map registry (:func:`~minip_learn.nn.available_feature_maps`)
        or any ``feature_map=`` value of :func:`~minip_learn.nn.make_feature_map`.
    feature_kwargs : dict, default=None
        Options of the feature map (``width``, ``depth`` ...).

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("linear", 4, 3, feature_map="relu")
    >>> mixer(torch.rand(2, 6, 4)).shape, mixer.state_floats()
    (torch.Size([2, 6]), 12)
    """

    theorem = "no"
    paper = ("Katharopoulos et al. 2020, Transformers are RNNs (without the normaliser, as "
             "in fla's linear_attn)")
    state_padding = "mask"  # phi(0) need not be 0: padded features are masked
    per_token_maps = True

    def __init__(self, n_bits, state_size, *, value_dim=None, feature_map="elu+1",
                 feature_kwargs=None):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        kwargs = dict(feature_kwargs or {})
        self.query_features = make_feature_map(feature_map, self.n_bits, self.state_size,
                                               **kwargs)
        self.key_features = make_feature_map(feature_map, self.n_bits, self.state_size,
                                             **kwargs)
        #: (r,) of 0 and 1, or None: the features in use (set by a stack of mixers of
        #: several state sizes)
        self.register_buffer("feature_mask", None)

    def features(self, fm, x):
        """The features ``phi(x)`` of the map ``fm`` (the query or the key map), zero
        outside :attr:`feature_mask`."""
        f = fm(x)
        return f if self.feature_mask is None else f * self.feature_mask

    def token_maps(self, x):
        """The per-token maps the recurrence reads: ``q = phi(q)``, ``k = phi(k)`` and
        ``v``."""
        return QKVMaps(q=self.features(self.query_features, x),
                       k=self.features(self.key_features, x), v=self.value(x))

    def attend(self, x):
        m = self.token_maps(x)
        return causal_part(m.q @ m.k.transpose(-2, -1)) @ m.v

    def attend_last(self, x):
        """``u_N = S_N^T phi(q_N)`` with ``S_N = sum_j phi(k_j) v_j^T``: ``O(N r d)``."""
        S = self.features(self.key_features, x).transpose(-2, -1) @ self.value(x)
        return torch.einsum("br,brd->bd", self.features(self.query_features, x[:, -1]), S)

    def attend_last_tokens(self, x, tokens, index):
        """:meth:`attend_last` from the features and values of the distinct ``tokens``
        of ``x`` (``index``: every token's row): the kernel between them, gathered per
        sequence. None when a map declares no ``per_token`` or the kernel would hold
        more entries than ``x`` has positions."""
        qf, kf = self.query_features, self.key_features
        if len(tokens) ** 2 > index.numel() or not (qf.per_token and kf.per_token):
            return None
        scores = token_scores(self.features(qf, tokens), self.features(kf, tokens),
                              log_domain=False)
        return gathered_last_attend(scores, index[:, -1], index, self.value(tokens),
                                    normalise="none")

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        S = state[0] + m.k[:, :, None] * m.v[:, None, :]
        return (S,), torch.einsum("br,brd->bd", m.q, S)
