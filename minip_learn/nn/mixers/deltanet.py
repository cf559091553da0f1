"""The delta rule (``"deltanet"``).

The recurrence, with L2-normalised ``q_t``, ``k_t`` in ``R^r``, the value ``v_t`` in
``R^d`` and the writing strength ``beta_t = sigmoid(<w_b, x_t> + c_b)`` of the token
``x_t`` (``S_0 = 0``):

    ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``,   ``u_t = S_t^T q_t``.

State ``r d`` floats. Outside the theorem.
"""

from dataclasses import dataclass

import torch
from torch import nn

from ..ops.chunk import CAUSAL_CHUNK
from ..ops.masks import causal_part
from ..ops.tokens import gather_rows
from ._base import MatrixStateMixer, QKVMaps, register_mixer

__all__ = []  # public home: the package minip_learn.nn.mixers


@dataclass(frozen=True)
class DeltaMaps(QKVMaps):
    """Unit-norm queries and keys, values and the writing strength of the delta rule.

    Attributes
    ----------
    beta : Tensor of shape (...,)
        The writing strength, in (0, 1).
    """

    beta: torch.Tensor


@register_mixer("deltanet")
class DeltaNetMixer(MatrixStateMixer):
    """The delta rule: ``S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T``,
    ``u_t = S_t^T q_t``.

    ``q_t`` and ``k_t`` are L2-normalised linear maps of the token and
    ``beta_t = sigmoid(<w_b, x_t> + c_b)`` is the writing strength (Schlag et al. 2021;
    Yang et al. 2024). The parallel form is the UT transform: the written values
    ``w_t = beta_t (v_t - S_{t-1}^T k_t)`` solve the unit lower-triangular system
    ``w_t + beta_t sum_{j < t} (k_t^T k_j) w_j = beta_t v_t`` (one triangular solve),
    and ``u_t = sum_{j <= t} (q_t^T k_j) w_j``. State ``r d`` floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and key dimension ``r``.
    value_dim : int, default=None
        ``d``; None means ``n_bits``.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("deltanet", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats()
    (True, 12)
    >>> maps = mixer.token_maps(x)  # unit-norm keys, one writing strength per token
    >>> torch.allclose(maps.k.norm(dim=-1), torch.ones(2, 6).double()), maps.beta.shape
    (True, torch.Size([2, 6]))
    """

    theorem = "no"
    paper = ("Schlag et al. 2021, Linear Transformers Are Secretly Fast Weight Programmers; "
             "Yang et al. 2024, Parallelizing Linear Transformers with the Delta Rule")
    # padded key and query entries are zero: the norms and the rows of S in use are unchanged
    state_padding = "zeros"
    run_maps = True

    def __init__(self, n_bits, state_size, *, value_dim=None):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        self.query = nn.Linear(self.n_bits, self.state_size)
        self.key = nn.Linear(self.n_bits, self.state_size)
        self.beta = nn.Linear(self.n_bits, 1)

    def token_maps(self, x):
        """The per-token maps the recurrence reads: unit-norm ``q`` and ``k``, ``v`` and
        the writing strength ``beta`` in (0, 1) (shape (...,))."""
        normalize = nn.functional.normalize
        return DeltaMaps(q=normalize(self.query(x), dim=-1), k=normalize(self.key(x), dim=-1),
                         v=self.value(x), beta=self.strength(x))

    def strength(self, x):
        """The writing strength ``beta = sigmoid(<w_b, x> + c_b)`` of tokens ``x``, shape
        (...,)."""
        return torch.sigmoid(self.beta(x)).squeeze(-1)

    @staticmethod
    def _written(k, v, beta):
        """The vectors ``w_t = beta_t (v_t - S_{t-1}^T k_t)`` the keys ``k`` (..., n, r)
        write from ``S = 0``, shape (..., n, d): the unit lower-triangular system
        ``(I + diag(beta) L) W = diag(beta) V`` with ``L`` the strictly lower part of
        ``K K^T`` (the WY form); ``S`` after them is ``K^T W``."""
        n = k.shape[-2]
        eye = torch.eye(n, dtype=k.dtype, device=k.device)
        system = eye + beta[..., None] * causal_part(k @ k.transpose(-2, -1), strict=True)
        return torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False,
                                             unitriangular=True)

    def attend(self, x):
        m = self.token_maps(x)
        return causal_part(m.q @ m.k.transpose(-2, -1)) @ self._written(m.k, m.v, m.beta)

    def attend_last(self, x):
        """``u_N = S_N^T q_N``, the state carried over chunks of :data:`CAUSAL_CHUNK`
        tokens (:meth:`_last_state`). ``O(N C r d)``, no ``N x N`` tensor."""
        normalize = nn.functional.normalize
        S = self._last_state(normalize(self.key(x), dim=-1), self.value(x), self.strength(x))
        return torch.einsum("br,brd->bd", normalize(self.query(x[:, -1]), dim=-1), S)

    def attend_last_runs(self, tokens, runs):
        """``u_N = S_N^T q_N`` one write per run of equal tokens: with a unit-norm key,
        ``(I - beta k k^T)^L = I - (1 - (1 - beta)^L) k k^T``, so ``L`` writes of
        ``(k, v, beta)`` are one write of ``(k, v, 1 - (1 - beta)^L)`` (an empty run,
        strength 0, leaves ``S`` as it is)."""
        normalize = nn.functional.normalize
        run_index = runs.index
        log_keep = nn.functional.logsigmoid(-self.beta(tokens).squeeze(-1))  # log(1 - beta)
        L = runs.pair_lengths.to(log_keep.dtype)
        beta = gather_rows(-torch.expm1(L * log_keep.index_select(0, runs.pair_index)),
                           runs.pairs)
        S = self._last_state(gather_rows(normalize(self.key(tokens), dim=-1), run_index),
                             gather_rows(self.value(tokens), run_index), beta)
        q = normalize(self.query(tokens), dim=-1).index_select(0, run_index[:, -1])
        return torch.einsum("br,brd->bd", q, S)

    def _last_state(self, keys, values, beta):
        """The state ``S_N`` after unit-norm keys ``keys`` (b, N, r), values ``values``
        (b, N, d) and strengths ``beta`` (b, N), carried over chunks of
        :data:`CAUSAL_CHUNK` writes: a chunk starting from ``S`` writes what its keys
        write from 0 into ``V - K S`` (:meth:`_written`) and adds ``K^T W`` to ``S``."""
        S = None
        for t0 in range(0, keys.shape[-2], CAUSAL_CHUNK):
            k, v = keys[:, t0:t0 + CAUSAL_CHUNK], values[:, t0:t0 + CAUSAL_CHUNK]
            written = self._written(k, v if S is None else v - k @ S,
                                    beta[:, t0:t0 + CAUSAL_CHUNK])
            S = k.transpose(-2, -1) @ written if S is None else S + k.transpose(-2, -1) @ written
        return S

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        S, k = state[0], m.k
        written = m.beta[:, None] * (m.v - torch.einsum("br,brd->bd", k, S))
        S = S + k[:, :, None] * written[:, None, :]
        return (S,), torch.einsum("br,brd->bd", m.q, S)
