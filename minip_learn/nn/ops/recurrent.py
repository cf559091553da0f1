"""Causal normalised kernel attention as a recurrent network, one token at a time.

The state after position ``i`` is the fixed-size prefix sketch

    S_i = gamma S_{i-1} + phi_K(x_i) v_i^T,   s_i = gamma s_{i-1} + phi_K(x_i)

(``gamma = decay``, 1 without decay), and ``u_i = phi_Q(x_i)^T S_i /
guard(phi_Q(x_i)^T s_i)``. It equals the chunked form
(:mod:`minip_learn.nn.ops.chunk`) and the quadratic reference
(:func:`minip_learn.nn.ops.naive.kernel_attention` with ``causal=True``) up to rounding.
"""

import math

import torch

from ._layout import finite_or_zero
from .kernel import apply_rank_mask
from .spec import AttentionSpec

__all__ = []  # public home: the package minip_learn.nn.ops


def recurrent_attend(phi_q, phi_k, v, *, nonnegative, eps=1e-3, decay=None, log_domain=False,
                     mask=None):
    """Causal normalised kernel attention as a recurrent network, token by token.

    The state after position ``i`` is the fixed-size prefix sketch

        S_i = gamma S_{i-1} + phi_K(x_i) v_i^T,   s_i = gamma s_{i-1} + phi_K(x_i)

    (``gamma = decay``, 1 without decay), and ``u_i = phi_Q(x_i)^T S_i /
    guard(phi_Q(x_i)^T s_i)``: ``r d + r`` floats carried from one token to the next
    (log-features: ``r`` more, the running maximum ``m`` of the decayed key
    log-features, by which the state is stored shifted). The reference form of
    :func:`~minip_learn.nn.ops.chunk.causal_attend`, equal to it up to rounding; one
    token at a time is :func:`recurrent_step` from :func:`recurrent_state`.

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
    v : Tensor of shape (..., N, d)
    nonnegative : bool
    eps, decay, log_domain, mask
        As in :func:`~minip_learn.nn.ops.chunk.causal_attend`.

    Returns
    -------
    Tensor of shape (..., N, d)
        Attended values, those of :func:`~minip_learn.nn.ops.chunk.causal_attend` up to rounding.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import ops
    >>> phi = torch.rand(1, 5, 2, dtype=torch.float64)
    >>> v = torch.rand(1, 5, 3, dtype=torch.float64)
    >>> u = ops.recurrent_attend(phi, phi, v, nonnegative=True, decay=0.9)
    >>> torch.allclose(u, ops.causal_attend(phi, phi, v, nonnegative=True, decay=0.9,
    ...                                           chunk_size=2))
    True
    """
    spec = AttentionSpec(nonnegative, eps, log_domain, decay)
    fq, fk = apply_rank_mask(phi_q, phi_k, mask, log_domain)
    state = recurrent_state(fq.shape[:-2], fq.shape[-1], v.shape[-1], log_domain=log_domain,
                            dtype=v.dtype, device=v.device)
    out = []
    for i in range(v.shape[-2]):
        u, state = _step(state, fq[..., i, :], fk[..., i, :], v[..., i, :], spec)
        out.append(u)
    return torch.stack(out, -2)


def recurrent_state(batch_shape, rank, value_dim, *, log_domain, dtype=None, device=None):
    """The state of :func:`recurrent_attend` before the first token.

    Parameters
    ----------
    batch_shape : tuple of int
        Leading dimensions (e.g. ``(batch,)``).
    rank, value_dim : int
    log_domain : bool
    dtype, device : optional

    Returns
    -------
    state : tuple of Tensor
        ``(S, s)``: zeros of shapes ``(*batch_shape, rank, value_dim)`` and
        ``(*batch_shape, rank)``; log-domain: also ``m``, the running maximum of the
        decayed key log-features, ``-inf`` (``S`` and ``s`` are stored scaled by
        ``exp(-m)``).

    Examples
    --------
    >>> from minip_learn.nn import ops
    >>> [t.shape for t in ops.recurrent_state((2,), 3, 4, log_domain=True)]
    [torch.Size([2, 3, 4]), torch.Size([2, 3]), torch.Size([2, 3])]
    """
    kw = dict(dtype=dtype, device=device)
    state = (torch.zeros(*batch_shape, rank, value_dim, **kw),
             torch.zeros(*batch_shape, rank, **kw))
    if log_domain:
        state += (torch.full((*batch_shape, rank), -math.inf, **kw),)
    return state


def recurrent_step(state, phi_q, phi_k, v, *, nonnegative, eps=1e-3, decay=None,
                   log_domain=False):
    """One token of :func:`recurrent_attend`: the new state and the attended value.

    ``S <- gamma S + phi_K(x) v^T``, ``s <- gamma s + phi_K(x)``, then
    ``u = phi_Q(x)^T S / guard(phi_Q(x)^T s)``. Log-features: ``m <- max(m + log gamma,
    lk)`` and ``S``, ``s`` rescaled by ``exp(m_old + log gamma - m_new) <= 1``, the
    query shifted by its own maximum.

    Parameters
    ----------
    state : tuple of Tensor
        From :func:`recurrent_state` or a previous step.
    phi_q, phi_k : Tensor of shape (..., r)
        The token's query and key features (log-features when ``log_domain``; a rank
        mask already applied).
    v : Tensor of shape (..., d)
    nonnegative : bool
    eps, decay, log_domain
        As in :func:`~minip_learn.nn.ops.chunk.causal_attend`.

    Returns
    -------
    u : Tensor of shape (..., d)
    state : tuple of Tensor

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import ops
    >>> state = ops.recurrent_state((1,), 2, 1, log_domain=False)
    >>> for value in (0.0, 3.0):
    ...     u, state = ops.recurrent_step(state, torch.ones(1, 2), torch.ones(1, 2),
    ...                                         torch.tensor([[value]]), nonnegative=True)
    >>> u
    tensor([[1.5000]])
    """
    return _step(state, phi_q, phi_k, v, AttentionSpec(nonnegative, eps, log_domain, decay))


def _step(state, phi_q, phi_k, v, spec):
    """:func:`recurrent_step` with its options as one spec."""
    if spec.log_domain:
        S, s, pk, pq, tail = _log_decay_state(state, phi_q, phi_k, spec.log_gamma)
    else:
        gamma = math.exp(spec.log_gamma)
        S, s, pk, pq, tail = state[0] * gamma, state[1] * gamma, phi_k, phi_q, ()
    S = S + pk.unsqueeze(-1) * v.unsqueeze(-2)
    s = s + pk
    num = (pq.unsqueeze(-1) * S).sum(-2)
    den = (pq * s).sum(-1, keepdim=True)
    return num / spec.guard(den), (S, s) + tail


def _log_decay_state(state, lq, lk, log_gamma):
    """The decayed log-domain state before the token is added, rescaled to the new
    running maximum ``m``, and the token's shifted features: ``(S, s, phi_k, phi_q,
    (m,))``."""
    S, s, m = state
    m_new = torch.maximum(m + log_gamma, lk.detach())
    shift = finite_or_zero(m_new)
    keep = torch.exp(m + log_gamma - shift)  # <= 1 (0 before the first token)
    S, s = S * keep.unsqueeze(-1), s * keep
    pk = torch.exp(lk - shift)
    a = lq + m_new
    pq = torch.exp(a - finite_or_zero(a.amax(-1, keepdim=True)).detach())
    return S, s, pk, pq, (m_new,)
