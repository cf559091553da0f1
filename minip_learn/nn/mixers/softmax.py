"""Causal softmax attention (``"softmax"``), a mixer made of one causal
:class:`~minip_learn.nn.SoftmaxAttentionHead`.

``u_t = sum_{j <= t} softmax_j(q_t^T k_j / tau) v_j``: the recurrent form keeps every
key and value seen so far, ``N (r + d)`` floats after ``N`` tokens (grows with ``N``).
Outside the theorem.
"""

import torch

from ..heads import SoftmaxAttentionHead
from ._base import HeadMixer, register_mixer

__all__ = []  # public home: the package minip_learn.nn.mixers


@register_mixer("softmax")
class SoftmaxMixer(HeadMixer):
    """Causal softmax attention: ``u_t = sum_{j <= t} softmax_j(q_t^T k_j / tau) v_j``.

    A :class:`~minip_learn.nn.SoftmaxAttentionHead` with ``causal=True`` and
    ``score_dim = state_size``. Its recurrent form keeps every key and value seen so
    far (a cache): ``N (r + d)`` floats after ``N`` tokens, a state that grows with the
    sequence. Outside the theorem (softmax attention is not a kernel of finite rank).

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and score dimension ``r`` of queries and keys.
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    temperature, score_init_scale, algorithm
        As in :class:`~minip_learn.nn.SoftmaxAttentionHead`.

    Attributes
    ----------
    head : SoftmaxAttentionHead
        The causal head.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("softmax", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats(seq_len=6)
    (True, 42)
    """

    theorem = "no"
    paper = "Vaswani et al. 2017, Attention Is All You Need (causal)"
    state_formula = "N (r + d)"
    # padded query and key dimensions are zero: every score is unchanged
    state_padding = "zeros"
    per_token_maps = True

    def __init__(self, n_bits, state_size, *, value_dim=None, temperature=1.0,
                 score_init_scale=0.1, algorithm="auto"):
        head = SoftmaxAttentionHead(
            n_bits, score_dim=state_size, value_dim=value_dim, temperature=temperature,
            score_init_scale=score_init_scale, algorithm=algorithm, causal=True)
        super().__init__(n_bits, state_size, head)

    def state_floats(self, seq_len=None):
        """``N (r + d)`` after ``N = seq_len`` tokens: the cached keys and values."""
        if seq_len is None:
            raise ValueError("the state of softmax attention grows with the tokens seen: "
                             "state_floats needs seq_len.")
        return int(seq_len) * (self.state_size + self.value_dim)

    def initial_state(self, batch, *, dtype, device):
        return (torch.zeros(batch, 0, self.state_size, dtype=dtype, device=device),
                torch.zeros(batch, 0, self.value_dim, dtype=dtype, device=device))

    def step(self, state, x_t, position=0):
        head = self.head
        keys = torch.cat([state[0], head.key(x_t)[:, None]], 1)
        values = torch.cat([state[1], head.value(x_t)[:, None]], 1)
        scores = torch.einsum("br,btr->bt", head.query(x_t), keys) / head.temperature
        return (keys, values), torch.einsum("bt,btd->bd", torch.softmax(scores, -1), values)
