"""A diagonal selective state-space model in the style of Mamba (``"mamba"``).

Per channel ``c`` of the value ``v_t`` (``d`` channels), a state ``h_t[c]`` in ``R^r``
(``h_0 = 0``):

    ``h_t[c] = exp(Delta_t[c] A[c]) * h_{t-1}[c] + Delta_t[c] B_t v_t[c]``,
    ``u_t[c] = <C_t, h_t[c]> + D[c] v_t[c]``,

with ``Delta_t = softplus(W_D x_t + c_D)``, ``A = -exp(A_log)`` (``d x r``, learned),
``B_t = W_B x_t`` and ``C_t = W_C x_t``. State ``d r`` floats. Outside the theorem.
Its forward runs the recurrent form (the selective scan, ``forward_form =
"recurrent"``).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..ops.masks import decayed_scores
from ._base import Mixer, TokenMaps, register_mixer

__all__ = ["MambaMixer", "SelectiveMaps"]


@dataclass(frozen=True)
class SelectiveMaps(TokenMaps):
    """The per-token maps of the selective SSM beside the values ``v`` (..., d).

    Attributes
    ----------
    delta : Tensor of shape (..., d)
        The steps ``Delta = softplus(W_D x + c_D)``.
    B, C : Tensor of shape (..., r)
        The input and output maps ``B = W_B x`` and ``C = W_C x``.
    A : Tensor of shape (d, r)
        The diagonal ``A = -exp(A_log)`` (the same for every token).
    """

    delta: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    A: torch.Tensor


@register_mixer("mamba")
class MambaMixer(Mixer):
    """A diagonal selective state-space model in the style of Mamba (Gu & Dao, 2023).

    The value map ``v_t = v(x_t)`` gives ``d`` channels; channel ``c`` carries a state
    ``h_t[c]`` of dimension ``r = state_size``:

        ``h_t[c] = exp(Delta_t[c] A[c]) * h_{t-1}[c] + Delta_t[c] B_t v_t[c]``,
        ``u_t[c] = <C_t, h_t[c]> + D[c] v_t[c]``,

    with the input-dependent step ``Delta_t = softplus(W_D x_t + c_D)`` (its bias
    initialised so that ``Delta`` starts log-uniform in ``[dt_min, dt_max]``), the
    diagonal ``A = -exp(A_log)`` (initialised ``A[c, n] = -(n + 1)``, S4D-real), and
    ``B_t = W_B x_t``, ``C_t = W_C x_t``. Mamba's short convolution and output gate are
    left out (the affine readout follows the SSM). :meth:`attend` is the parallel form,
    which sums ``C_t^T diag(exp(L_t[c] - L_j[c])) B_j Delta_j[c] v_j[c]`` over ``j <= t``
    with the cumulative log-decays ``L``
    (:func:`~minip_learn.nn.mixers.decayed_scores`, one channel per leading index), and
    :meth:`step` the recurrent form. Like Mamba, :meth:`forward` (training and
    prediction) runs the selective scan, ``forward_form = "recurrent"``: its ``(d, r)``
    state is cheaper than the ``(d, N, N, r)`` scores of the parallel form once ``N r``
    exceeds a few hundred. The two forms are tested equal. State ``d r`` floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and state dimension ``r`` per channel.
    value_dim : int, default=None
        Channels ``d``; None means ``n_bits``.
    dt_min, dt_max : float, default=1e-3, 1e-1
        Range of the initial step ``Delta``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("mamba", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats()
    (True, 12)
    >>> torch.allclose(mixer.attend(x), mixer.attend_recurrent(x)), mixer.forward_form
    (True, 'recurrent')
    """

    theorem = "no"
    paper = "Gu & Dao 2023, Mamba: Linear-Time Sequence Modeling with Selective State Spaces"
    state_formula = "d r"
    forward_form = "recurrent"

    def __init__(self, n_bits, state_size, *, value_dim=None, dt_min=1e-3, dt_max=1e-1):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        d, r = self.value_dim, self.state_size
        self.delta = nn.Linear(self.n_bits, d)
        self.input_gate = nn.Linear(self.n_bits, r, bias=False)   # B_t
        self.output_gate = nn.Linear(self.n_bits, r, bias=False)  # C_t
        self.A_log = nn.Parameter(torch.log(torch.arange(1, r + 1, dtype=torch.float32))
                                  .repeat(d, 1))
        self.D = nn.Parameter(torch.ones(d))
        with torch.no_grad():
            dt = torch.exp(torch.rand(d) * (math.log(dt_max) - math.log(dt_min))
                           + math.log(dt_min))
            self.delta.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def token_maps(self, x):
        """The per-token maps the recurrence reads: ``v`` (..., d), ``delta`` (..., d),
        ``B`` and ``C`` (..., r), and ``A`` (d, r)."""
        return SelectiveMaps(v=self.value(x), delta=nn.functional.softplus(self.delta(x)),
                             B=self.input_gate(x), C=self.output_gate(x),
                             A=-torch.exp(self.A_log))

    def attend(self, x):
        m = self.token_maps(x)
        v, delta = m.v.transpose(-2, -1), m.delta.transpose(-2, -1)  # (b, d, N)
        log_cum = (delta[..., None] * m.A[:, None, :]).cumsum(-2)  # (b, d, N, r)
        keys = m.B[:, None] * delta[..., None]  # (b, d, N, r)
        scores = decayed_scores(m.C[:, None].expand_as(keys), keys, log_cum)
        u = (scores @ v[..., None]).squeeze(-1) + self.D[:, None] * v
        return u.transpose(-2, -1)

    def attend_last(self, x):
        """``u_N = C_N^T h_N + D v_N``: the scan of :meth:`step` carries the state ``h``
        over the tokens (their maps computed at once) and is read out once."""
        m = self.token_maps(x)
        h = self.initial_state(x.shape[0], dtype=x.dtype, device=x.device)[0]
        for t in range(x.shape[-2]):
            h = self._advance(h, m.delta[:, t], m.v[:, t], m.B[:, t], m.A)
        return (h * m.C[:, -1, None, :]).sum(-1) + self.D * m.v[:, -1]

    @staticmethod
    def _advance(h, delta, v, B, A):
        """``h_t = exp(Delta_t A) h_{t-1} + (Delta_t v_t) B_t^T``, per channel: ``h``
        (b, d, r), ``delta`` and ``v`` (b, d), ``B`` (b, r), ``A`` (d, r)."""
        return torch.exp(delta[..., None] * A) * h + (delta * v)[..., None] * B[:, None, :]

    def initial_state(self, batch, *, dtype, device):
        return (torch.zeros(batch, self.value_dim, self.state_size, dtype=dtype,
                            device=device),)

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        h = self._advance(state[0], m.delta, m.v, m.B, m.A)
        return (h,), (h * m.C[:, None, :]).sum(-1) + self.D * m.v

    def state_floats(self, seq_len=None):
        """``d r``: one state of dimension ``r`` per channel."""
        return self.value_dim * self.state_size
