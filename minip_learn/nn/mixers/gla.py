"""Gated linear attention (``"gla"``).

The recurrence, with ``q_t``, ``k_t`` in ``R^r`` and ``v_t`` in ``R^d`` computed from
the token ``x_t`` (``S_0 = 0``) and data-dependent gates
``alpha_t = sigmoid(W_a x_t + c_a)^(1 / gate_temperature)`` in ``(0, 1)^r``:

    ``S_t = diag(alpha_t) S_{t-1} + k_t v_t^T``,   ``u_t = S_t^T q_t``.

State ``r d`` floats. Outside the theorem.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ..ops.masks import decayed_scores
from ..ops.tokens import gather_rows, later_runs_sum
from ._base import MatrixStateMixer, QKVMaps, register_mixer

__all__ = []  # public home: the package minip_learn.nn.mixers


@dataclass(frozen=True)
class GatedMaps(QKVMaps):
    """Queries, keys, values and the log-gates of gated linear attention.

    Attributes
    ----------
    log_alpha : Tensor of shape (..., r)
        ``log alpha = logsigmoid(W_a x + c_a) / tau``, all ``<= 0``.
    """

    log_alpha: torch.Tensor


@register_mixer("gla")
class GatedLinearAttentionMixer(MatrixStateMixer):
    """Gated linear attention with data-dependent per-key-dimension gates.

    ``S_t = diag(alpha_t) S_{t-1} + k_t v_t^T`` and ``u_t = S_t^T q_t``, with
    ``q_t = W_q x_t``, ``k_t = W_k x_t`` and ``alpha_t = sigmoid(W_a x_t + c_a)^(1/tau)``
    (``tau = gate_temperature``; 16 in Yang et al. 2024): the recurrence of GLA, whose
    output normalisation and gate are replaced by the affine readout. The parallel
    form sums ``q_t^T diag(exp(L_t - L_j)) k_j v_j`` over ``j <= t`` with the cumulative
    log-gates ``L`` (:func:`~minip_learn.nn.mixers.decayed_scores`). State ``r d``
    floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and key dimension ``r`` (one gate per key dimension).
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    gate_temperature : float, default=16.0
        ``tau``: the log-gates are ``logsigmoid(W_a x + c_a) / tau``.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("gla", 4, 3, gate_temperature=4.0).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats()
    (True, 12)
    >>> bool((mixer.token_maps(x).log_alpha <= 0).all())  # every gate in (0, 1]
    True
    """

    theorem = "no"
    paper = ("Yang et al. 2024, Gated Linear Attention Transformers with Hardware-Efficient "
             "Training")
    # padded keys and queries are zero: the padded rows of S stay zero whatever the gates
    state_padding = "zeros"
    run_maps = True

    def __init__(self, n_bits, state_size, *, value_dim=None, gate_temperature=16.0):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        self.gate_temperature = float(gate_temperature)
        self.query = nn.Linear(self.n_bits, self.state_size)
        self.key = nn.Linear(self.n_bits, self.state_size)
        self.gate = nn.Linear(self.n_bits, self.state_size)

    def token_maps(self, x):
        """The per-token maps the recurrence reads: ``q``, ``k``, ``v`` and the
        log-gates ``log_alpha = logsigmoid(W_a x + c_a) / tau`` (all ``<= 0``)."""
        return GatedMaps(q=self.query(x), k=self.key(x), v=self.value(x),
                         log_alpha=self.log_gates(x))

    def log_gates(self, x):
        """``log alpha = logsigmoid(W_a x + c_a) / tau`` of tokens ``x``, all ``<= 0``."""
        return nn.functional.logsigmoid(self.gate(x)) / self.gate_temperature

    def attend(self, x):
        m = self.token_maps(x)
        return decayed_scores(m.q, m.k, m.log_alpha.cumsum(-2)) @ m.v

    def attend_last(self, x):
        """``u_N = S_N^T q_N`` with ``S_N = sum_j diag(exp(L_N - L_j)) k_j v_j^T`` (the
        cumulative log-gates ``L``; every factor in (0, 1]), summed as
        ``sum_j <q_N, exp(L_N - L_j) k_j> v_j``: ``O(N (r + d))``, no ``S_N``."""
        log_cum = self.log_gates(x).cumsum(-2)
        keys = self.key(x) * torch.exp(log_cum[:, -1:] - log_cum)
        weights = (keys * self.query(x[:, -1:])).sum(-1)
        return (weights[:, None, :] @ self.value(x))[:, 0]

    def attend_last_runs(self, tokens, runs):
        """``u_N`` one write per run of equal tokens: ``L`` writes of ``(k, v, alpha)``
        add ``g_L(log alpha) k v^T`` to ``diag(alpha^L) S``, with the geometric sums
        ``g_L(a) = sum_{l < L} exp(l a) = expm1(L a) / expm1(a)`` (0 for an empty run),
        each run decayed by the runs after it."""
        log_alpha = self.log_gates(tokens)
        tiny = torch.finfo(log_alpha.dtype).tiny  # (a log-gate of 0: g_L = L)
        lg = log_alpha.clamp(max=-tiny).index_select(0, runs.pair_index)  # (P, r)
        L = runs.pair_lengths.to(lg.dtype)[:, None]
        writes = (torch.expm1(L * lg) / torch.expm1(lg)
                  * self.key(tokens).index_select(0, runs.pair_index))
        # per distinct (token, length) pair: the run's decayed keys and its log-decay
        keys, run_log = gather_rows(torch.cat([writes, L * lg], -1),
                                    runs.pairs).split(self.state_size, -1)
        q = self.query(tokens).index_select(0, runs.index[:, -1])
        weights = (keys * torch.exp(later_runs_sum(run_log)) * q[:, None, :]).sum(-1)
        return (weights[:, None, :] @ gather_rows(self.value(tokens), runs.index))[:, 0]

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        S = torch.exp(m.log_alpha)[:, :, None] * state[0] + m.k[:, :, None] * m.v[:, None, :]
        return (S,), torch.einsum("br,brd->bd", m.q, S)
