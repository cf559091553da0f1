"""Causal normalised kernel attention in chunks: the masked explicit kernel within a
block, the prefix sketch carried from block to block.

Position ``i`` attends to the keys ``j <= i``, optionally with RetNet's decay,
``alpha_ij = gamma^(i-j) <phi_Q(x_i), phi_K(x_j)>`` (position-dependent maps
``gamma^i phi(x)`` and ``gamma^-j phi(x)``, computed from the offsets ``i - j``). The
prefix state is :class:`PrefixSketch` for plain features and :class:`LogPrefixSketch`
for log-features; each has ``read`` (a block's numerators and denominators, over the
prefix and the block's own keys) and ``update`` (the block's keys folded in). The
token-by-token form is :mod:`minip_learn.nn.ops.recurrent`, the quadratic reference
:func:`minip_learn.nn.ops.naive.kernel_attention` with ``causal=True``.
"""

import math

import torch

from ._layout import finite_or_zero
from .kernel import affine_readout, apply_rank_mask, kernel_readout, log_kernel
from .masks import decayed_mask, position_decay
from .pair import pairwise_dots
from .spec import AttentionSpec

__all__ = []  # public home: the package minip_learn.nn.ops

#: Positions per block of :func:`causal_attend`: within a block the masked explicit
#: kernel, between blocks the carried prefix sketch.
CAUSAL_CHUNK = 32


def masked_kernel(fq, fk, spec):
    """The causal (decayed) explicit kernel of one block, ``gamma^(i-j) <phi_Q(x_i),
    phi_K(x_j)>`` for ``j <= i`` and 0 above the diagonal, up to a positive scale per
    row: log-features go through :func:`~minip_learn.nn.ops.kernel.log_kernel`, each row
    shifted by its maximum over the keys it sees (so the output at ``i`` is computed
    from the tokens up to ``i`` alone).

    Parameters
    ----------
    fq, fk : Tensor of shape (..., n, r)
        (Log-)features of the block, a rank mask already applied.
    spec : AttentionSpec

    Returns
    -------
    Tensor of shape (..., n, n)
        The kernel of the block's queries and keys, 0 above the diagonal.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import AttentionSpec
    >>> from minip_learn.nn.ops.chunk import masked_kernel
    >>> masked_kernel(torch.ones(2, 1), torch.ones(2, 1), AttentionSpec(True, decay=0.5))
    tensor([[1.0000, 0.0000],
            [0.5000, 1.0000]])
    """
    n = fq.shape[-2]
    if not spec.log_domain:
        dec = decayed_mask(n, spec.log_gamma, log=False, dtype=fq.dtype, device=fq.device)
        return pairwise_dots(fq, fk) * dec
    la = log_kernel(fq, fk) + decayed_mask(n, spec.log_gamma, log=True, dtype=fq.dtype,
                                           device=fq.device)
    return torch.exp(la - finite_or_zero(la.amax(-1).detach()).unsqueeze(-1))


class PrefixSketch:
    """The decayed prefix sketch of plain features, carried from block to block.

    Before block ``[t0, t1)`` it holds ``S = sum_{j < t0} gamma^(t0-1-j) phi_K(x_j)
    v_j^T`` and ``s`` likewise, so a query ``i`` of the block adds ``gamma^(i-t0+1)
    phi_Q(x_i)^T S``; within the block the kernel is multiplied by ``gamma^(i-j)``
    (``j <= i``): every power of ``gamma`` has a nonnegative exponent.

    Parameters
    ----------
    log_gamma : float
        ``log gamma`` (:attr:`AttentionSpec.log_gamma`).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.chunk import PrefixSketch
    >>> state = PrefixSketch(0.0)
    >>> state.update(torch.ones(2, 1), torch.tensor([[1.0], [3.0]]))
    >>> num, den = state.read(torch.ones(1, 1), torch.ones(1, 1), torch.tensor([[8.0]]))
    >>> num / den.unsqueeze(-1)  # (1 + 3 + 8) / 3
    tensor([[4.]])
    """

    def __init__(self, log_gamma):
        self.log_gamma = log_gamma
        self.S = self.s = None

    def read(self, q, k, v):
        """Numerators ``(..., C, d)`` and denominators ``(..., C)`` of the block's
        queries ``q`` over the prefix and the block's keys ``k`` and values ``v``."""
        C, lg = q.shape[-2], self.log_gamma
        alpha = pairwise_dots(q, k) * decayed_mask(C, lg, dtype=q.dtype, device=q.device)
        num, den = alpha @ v, alpha.sum(-1)
        if self.S is not None:
            pq = q * position_decay(C, lg, 1, q.dtype, q.device)
            num = num + pq @ self.S
            den = den + (pq * self.s.unsqueeze(-2)).sum(-1)
        return num, den

    def update(self, k, v):
        """Fold the block's keys ``k`` and values ``v`` into the state (keys weighted by
        ``gamma^(t1-1-j)``)."""
        C, lg = k.shape[-2], self.log_gamma
        kd = k * position_decay(C, lg, 0, k.dtype, k.device, reverse=True)
        S_blk, s_blk = kd.transpose(-2, -1) @ v, kd.sum(-2)
        if self.S is not None:
            gamma_c = math.exp(C * lg)
            S_blk, s_blk = self.S * gamma_c + S_blk, self.s * gamma_c + s_blk
        self.S, self.s = S_blk, s_blk


class LogPrefixSketch:
    """The decayed prefix sketch of log-features, stored shifted.

    It holds ``exp(a_jk - m_k)`` with ``a_jk = lk_jk + (t0-1-j) log gamma`` and the
    running maximum ``m_k = max_j a_jk``: a new block's keys rescale it by
    ``exp(m_old - m_new) <= 1``, and moving on by ``C`` positions only shifts ``m`` by
    ``C log gamma``. Within a block the kernel is taken in the log domain
    (:func:`~minip_learn.nn.ops.kernel.log_kernel`, the keys after a query masked), and
    each query row is shifted by its maximum over the keys it sees in both parts, so
    the output at ``i`` is computed from the tokens up to ``i`` alone.

    Parameters
    ----------
    log_gamma : float

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.chunk import LogPrefixSketch
    >>> state = LogPrefixSketch(0.0)
    >>> state.update(torch.zeros(2, 1), torch.tensor([[1.0], [3.0]]))
    >>> num, den = state.read(torch.zeros(1, 1), torch.zeros(1, 1), torch.tensor([[8.0]]))
    >>> num / den.unsqueeze(-1)
    tensor([[4.]])
    """

    def __init__(self, log_gamma):
        self.log_gamma = log_gamma
        self.S = self.s = self.m = None

    def read(self, q, k, v):
        """Numerators ``(..., C, d)`` and denominators ``(..., C)`` of the block's
        queries ``q`` (log-features) over the prefix and the block's keys and values,
        each up to one positive scale per query."""
        C, lg, dtype, device = q.shape[-2], self.log_gamma, q.dtype, q.device
        # the block's kernel in the log domain, -inf above the diagonal: a key after
        # the query takes no part in its shift
        la = log_kernel(q, k) + decayed_mask(C, lg, log=True, dtype=dtype, device=device)
        c = la.amax(-1).detach()
        if self.S is not None:
            # the state's log-weight for query i: lq_i + (i - t0 + 1) log gamma + m
            qa = q + position_decay(C, lg, 1, dtype, device, log=True) + self.m.unsqueeze(-2)
            c = torch.maximum(c, qa.amax(-1).detach())
        c = finite_or_zero(c).unsqueeze(-1)
        alpha = torch.exp(la - c)
        num, den = alpha @ v, alpha.sum(-1)
        if self.S is not None:
            pq = torch.exp(qa - c)
            num = num + pq @ self.S
            den = den + (pq * self.s.unsqueeze(-2)).sum(-1)
        return num, den

    def update(self, k, v):
        """Fold the block's keys ``k`` (log-features) and values ``v`` into the state."""
        C, lg = k.shape[-2], self.log_gamma
        a = k + position_decay(C, lg, 0, k.dtype, k.device, log=True, reverse=True)
        m_new = a.amax(-2).detach()
        if self.m is not None:
            m_prev = self.m + C * lg
            m_new = torch.maximum(m_prev, m_new)
        shift = finite_or_zero(m_new)
        pk = torch.exp(a - shift.unsqueeze(-2))
        S_blk, s_blk = pk.transpose(-2, -1) @ v, pk.sum(-2)
        if self.S is not None:
            scale = torch.exp(m_prev - shift)  # <= 1 (0 for an empty feature)
            S_blk, s_blk = self.S * scale.unsqueeze(-1) + S_blk, self.s * scale + s_blk
        self.S, self.s, self.m = S_blk, s_blk, m_new


def chunked_sums(fq, fk, v, spec, chunk):
    """Numerators ``(..., N, d)`` and denominators ``(..., N)`` of causal (decayed)
    kernel attention, each up to one positive scale per query.

    A sequence of at most ``chunk`` positions is one :func:`masked_kernel`; longer ones
    go block by block, the prefix state (:class:`PrefixSketch` or
    :class:`LogPrefixSketch`) read by each block and updated with its keys.

    Parameters
    ----------
    fq, fk : Tensor of shape (..., N, r)
        (Log-)features, a rank mask already applied.
    v : Tensor of shape (..., N, d)
    spec : AttentionSpec
    chunk : int
        Positions per block.

    Returns
    -------
    num : Tensor of shape (..., N, d)
    den : Tensor of shape (..., N)

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import AttentionSpec
    >>> from minip_learn.nn.ops.chunk import chunked_sums
    >>> num, den = chunked_sums(torch.ones(1, 3, 1), torch.ones(1, 3, 1),
    ...                         torch.tensor([[[0.0], [3.0], [6.0]]]), AttentionSpec(True), 2)
    >>> den
    tensor([[1., 2., 3.]])
    """
    N = fq.shape[-2]
    if N <= chunk:
        alpha = masked_kernel(fq, fk, spec)
        return alpha @ v, alpha.sum(-1)
    state = (LogPrefixSketch if spec.log_domain else PrefixSketch)(spec.log_gamma)
    nums, dens = [], []
    for t0 in range(0, N, chunk):
        t1 = min(N, t0 + chunk)
        k, vv = fk[..., t0:t1, :], v[..., t0:t1, :]
        num, den = state.read(fq[..., t0:t1, :], k, vv)
        nums.append(num)
        dens.append(den)
        if t1 < N:
            state.update(k, vv)
    return torch.cat(nums, -2), torch.cat(dens, -1)


def _chunk(chunk_size):
    return CAUSAL_CHUNK if chunk_size is None else max(1, int(chunk_size))


def causal_attend(phi_q, phi_k, v, *, nonnegative, eps=1e-3, decay=None, log_domain=False,
                  mask=None, chunk_size=None):
    """Causal normalised kernel attention: position ``i`` attends to ``j <= i``.

    ``u_i = sum_{j<=i} alpha_ij v_j / guard(sum_{j<=i} alpha_ij)`` with
    ``alpha_ij = gamma^(i-j) <phi_Q(x_i), phi_K(x_j)>`` (``gamma = decay``; no decay:
    ``gamma = 1``). The decayed kernel is RetNet's normalised decayed attention:
    position-dependent maps ``phi_Q(x, i) = gamma^i phi(x)``, ``phi_K(x, j) = gamma^-j
    phi(x)``, computed from the relative offsets ``i - j >= 0`` only (never
    ``gamma^-j`` itself, which overflows for long sequences).

    Sequences of at most ``chunk_size`` positions use the masked explicit kernel;
    longer ones go block by block: the masked explicit kernel within a block of
    ``chunk_size`` positions and the prefix sketch ``S = sum_j gamma^(.) phi_K(x_j)
    v_j^T``, ``s = sum_j gamma^(.) phi_K(x_j)`` carried from block to block (memory
    ``O(N (r + d) + chunk_size^2 + r d)`` per sequence, cost ``O(N (chunk_size + r) d)``
    for plain features). It equals :func:`~minip_learn.nn.ops.recurrent.recurrent_attend`,
    the token-by-token form, up to rounding, and the output at ``i`` never depends on
    later tokens.

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
        Query and key features, or their logarithms when ``log_domain`` (no shift
        needed: every block is shifted by its own maxima, which cancel exactly in the
        normalisation).
    v : Tensor of shape (..., N, d)
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`~minip_learn.nn.ops.spec.guard_denominator`.
    decay : float in (0, 1], default=None
        Decay factor ``gamma``; None for none.
    log_domain : bool, default=False
    mask : Tensor of shape (r,), default=None
        Rank mask, as in :func:`~minip_learn.nn.ops.kernel.attention_features`.
    chunk_size : int, default=None
        Positions per block; None means :data:`CAUSAL_CHUNK`.

    Returns
    -------
    Tensor of shape (..., N, d)
        Attended values: ``u_i`` depends on the tokens up to ``i`` only.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import ops
    >>> phi = torch.ones(1, 3, 2)
    >>> v = torch.tensor([[[0.0], [3.0], [6.0]]])
    >>> ops.causal_attend(phi, phi, v, nonnegative=True)[0, :, 0]  # prefix means
    tensor([0.0000, 1.5000, 3.0000])
    """
    spec = AttentionSpec(nonnegative, eps, log_domain, decay)
    fq, fk = apply_rank_mask(phi_q, phi_k, mask, log_domain)
    num, den = chunked_sums(fq, fk, v, spec, _chunk(chunk_size))
    return num / spec.guard(den).unsqueeze(-1)


def causal_head_output(phi_q, phi_k, v, w, b, *, nonnegative, eps=1e-3, decay=None,
                       log_domain=False, mask=None, chunk_size=None):
    """Output ``y_i = <w(x_i), u_i> + b(x_i)`` of a causal head (:func:`causal_attend`).

    Sequences of one block fold the readout into the masked explicit kernel
    (:func:`~minip_learn.nn.ops.kernel.kernel_readout` of the kernel and of
    ``<w(x_i), v(x_j)>``), as :func:`~minip_learn.nn.ops.kernel.head_output` does for
    short sequences.

    Parameters
    ----------
    phi_q, phi_k, v, nonnegative
        As in :func:`causal_attend`.
    w : Tensor of shape (..., N, d)
        Readout weights ``w(x_i)``.
    b : Tensor of shape (..., N)
        Readout bias ``b(x_i)``.
    eps, decay, log_domain, mask, chunk_size
        As in :func:`causal_attend`.

    Returns
    -------
    Tensor of shape (..., N)
        Outputs ``y_i``, each from the tokens up to ``i`` only.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import ops
    >>> phi, v = torch.ones(1, 3, 2), torch.tensor([[[0.0], [3.0], [6.0]]])
    >>> ops.causal_head_output(phi, phi, v, torch.ones(1, 3, 1), torch.zeros(1, 3),
    ...                              nonnegative=True)
    tensor([[0.0000, 1.5000, 3.0000]])
    """
    chunk = _chunk(chunk_size)
    if v.shape[-2] > chunk:
        u = causal_attend(phi_q, phi_k, v, nonnegative=nonnegative, eps=eps, decay=decay,
                          log_domain=log_domain, mask=mask, chunk_size=chunk)
        return affine_readout(w, b, u)
    spec = AttentionSpec(nonnegative, eps, log_domain, decay)
    fq, fk = apply_rank_mask(phi_q, phi_k, mask, log_domain)
    return kernel_readout(masked_kernel(fq, fk, spec), pairwise_dots(w, v), b,
                          nonnegative=nonnegative, eps=eps)
