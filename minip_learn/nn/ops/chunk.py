"""Causal normalised kernel attention in chunks: the masked explicit kernel within a
block (log-features: :func:`log_block_sums`, its halves' matrix products), the prefix
sketch carried from block to block.

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
import torch.nn.functional as F

from ._layout import finite_or_zero
from .kernel import affine_readout, apply_rank_mask, kernel_readout, log_kernel
from .masks import decayed_mask, position_decay
from .pair import pairwise_dots
from .spec import AttentionSpec

__all__ = []  # public home: the package minip_learn.nn.ops

#: Positions per block of :func:`causal_attend`: within a block the masked explicit
#: kernel, between blocks the carried prefix sketch.
CAUSAL_CHUNK = 32
#: Products over at most this many positions (the finest halves of
#: :func:`log_block_sums`) are summed outer products, not batched matrix products.
SMALL_INNER = 4


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


def _halves(t, s, half):
    """The first (``half`` 0) or second (1) halves of the pairs of ``s`` positions of
    ``t`` (..., L, x): a view of shape (..., L / 2s, s, x)."""
    return t.unflatten(-2, (-1, 2, s))[..., half, :, :]


def _level_exponents(q, k, s, log_gamma):
    """The level of halves of ``s`` positions: the exponents ``lq_i + M`` of the second
    halves' queries and ``lk_j - M`` of the first halves' keys, ``M`` the keys' maximum
    per feature (a constant), the decay from the offsets within the pair (``(i - j) log
    gamma = (i' + 1) log gamma + (s - 1 - j') log gamma``)."""
    kh, qh = _halves(k, s, 0), _halves(q, s, 1)
    if log_gamma:
        kh = kh + position_decay(s, log_gamma, 0, k.dtype, k.device, log=True, reverse=True)
        qh = qh + position_decay(s, log_gamma, 1, q.dtype, q.device, log=True)
    # a feature no key uses (-inf) takes the least finite maximum: exp gives exact zeros
    m = kh.amax(-2, keepdim=True).clamp_min(torch.finfo(kh.dtype).min)
    return qh + m, kh - m


def _mm(a, b):
    """``a @ b``; over an inner dimension of at most ``SMALL_INNER`` as a sum of outer
    products (a batched product of so thin matrices costs several times more)."""
    if a.shape[-1] > SMALL_INNER:
        return a @ b
    out = a[..., :1] * b[..., :1, :]
    for j in range(1, a.shape[-1]):
        out.addcmul_(a[..., j:j + 1], b[..., j:j + 1, :])
    return out


class _LogBlockSums(torch.autograd.Function):
    """Numerators (and, in the last column, denominators) of one padded block of
    ``L = 2^k`` positions, :func:`log_block_sums`. The forward keeps the factors of
    every level (further outputs, not differentiable) and the backward accumulates
    level by level in place; the shift ``c`` and the maxima ``M`` are constants."""

    @staticmethod
    def forward(q, k, v1, shift, log_gamma):
        ed = q + k
        c = torch.maximum(ed.amax(-1), shift).unsqueeze(-1)
        levels, s = [], q.shape[-2] // 2
        while s >= 1:
            e, kd = _level_exponents(q, k, s, log_gamma)
            ch = _halves(c, s, 1)
            torch.maximum(ch, e.amax(-1, keepdim=True), out=ch)
            levels.append((s, e, kd))
            s //= 2
        c = finite_or_zero(c)
        ed = ed.sub_(c).exp_()
        out = ed.sum(-1, keepdim=True) * v1
        factors = []
        for s, e, kd in levels:
            pq, pk = e.sub_(_halves(c, s, 1)).exp_(), kd.exp_()
            _halves(out, s, 1).add_(_mm(pq @ pk.transpose(-2, -1), _halves(v1, s, 0)))
            factors += [pq, pk]
        return (out, c, ed, *factors)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[2], *output[2:])
        ctx.mark_non_differentiable(*output[1:])

    @staticmethod
    def vmap(info, in_dims, q, k, v1, shift, log_gamma):
        # the member (vmapped) dimension is one more leading dimension
        q, k, v1, shift = (t.movedim(d, 0) if d is not None
                           else t.expand(info.batch_size, *t.shape)
                           for t, d in zip((q, k, v1, shift), in_dims))
        out = _LogBlockSums.apply(q, k, v1, shift, log_gamma)
        return out, (0,) * len(out)

    @staticmethod
    def backward(ctx, grad, *_):
        v1, ed, *factors = ctx.saved_tensors
        dq = ed * (grad * v1).sum(-1, keepdim=True)
        dk = dq.clone()
        dv = ed.sum(-1, keepdim=True) * grad
        s = v1.shape[-2] // 2
        for pq, pk in zip(factors[::2], factors[1::2]):
            gq, vh = _halves(grad, s, 1), _halves(v1, s, 0)
            d_alpha = gq @ vh.transpose(-2, -1)  # (..., L / 2s, s, s)
            alpha = pq @ pk.transpose(-2, -1)
            _halves(dv, s, 0).add_(_mm(alpha.transpose(-2, -1), gq))
            _halves(dq, s, 1).add_(_mm(d_alpha, pk).mul_(pq))
            _halves(dk, s, 0).add_(_mm(d_alpha.transpose(-2, -1), pq).mul_(pk))
            s //= 2
        return dq, dk, dv, None, None


def log_block_sums(q, k, v, log_gamma, shift=None):
    """Numerators ``(..., n, d)`` and denominators ``(..., n)`` of causal (decayed)
    attention of log-features within one block, each query shifted by its maximum over
    the keys it sees, with matrix products.

    The block (padded with zeros to ``L = 2^k >= n`` positions; a padded key comes
    after every real query) is split into halves, quarters, ... down to single
    positions: at the level of halves of ``s`` positions, the queries of each second
    half take the keys of the first half before them, ``exp(lq_i + M - c_i) exp(lk_j -
    M)^T``, with ``M`` the maximum per feature over those keys alone (all before the
    queries) and ``c_i`` the query's shift; the diagonal ``j = i`` is taken elementwise.
    ``c_i`` is the maximum of every exponent the query's row takes (of ``shift`` too),
    so no factor exceeds 1, the largest term of a row is 1, and no key after ``i``
    takes part in the output at ``i``. Cost: matrix products of ``O(n L (r + d))``, as
    the masked explicit kernel's, and ``O(n r log L)`` elementwise (``log L`` passes
    over the log-features), without the ``n x n x r`` terms of the block's log-domain
    kernel. The backward is written out: it reuses every level's factors.

    Parameters
    ----------
    q, k : Tensor of shape (..., n, r)
        Log-features, a rank mask already applied (``-inf`` for a feature not in use).
    v : Tensor of shape (..., n, d)
    log_gamma : float
        ``log gamma <= 0``; 0.0 for no decay.
    shift : Tensor of shape (..., n), default=None
        Exponents the queries take elsewhere (the prefix state's), included in ``c``.

    Returns
    -------
    num : Tensor of shape (..., n, d)
    den : Tensor of shape (..., n)
    c : Tensor of shape (..., n, 1)
        The shift of each query (finite, detached).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.chunk import log_block_sums
    >>> num, den, c = log_block_sums(torch.zeros(1, 3, 1), torch.zeros(1, 3, 1),
    ...                              torch.tensor([[[0.0], [3.0], [6.0]]]), 0.0)
    >>> num[..., 0] / den  # prefix means
    tensor([[0.0000, 1.5000, 3.0000]])
    """
    n = q.shape[-2]
    pad = (1 << (n - 1).bit_length()) - n
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1)
    if shift is None:
        shift = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
    if pad:
        q, k, v1 = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v1))
        shift = F.pad(shift, (0, pad), value=-math.inf)
    out, c, *_ = _LogBlockSums.apply(q, k, v1, shift, float(log_gamma))
    out = out[..., :n, :]
    return out[..., :-1], out[..., -1], c[..., :n, :]


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
    ``C log gamma``. Within a block the sums are :func:`log_block_sums` (matrix
    products over halves of the block, each key before the queries it meets), and
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
        qa = c = None
        if self.S is not None:
            # the state's log-weight for query i: lq_i + (i - t0 + 1) log gamma + m
            qa = q + position_decay(q.shape[-2], self.log_gamma, 1, q.dtype, q.device,
                                    log=True) + self.m.unsqueeze(-2)
            c = qa.amax(-1).detach()
        num, den, c = log_block_sums(q, k, v, self.log_gamma, c)
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

    A sequence of at most ``chunk`` positions of plain features is one
    :func:`masked_kernel`; longer ones, and log-features at any length, go block by
    block, the prefix state (:class:`PrefixSketch` or
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
    if N <= chunk and not spec.log_domain:
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

    Sequences of at most ``chunk_size`` positions use the masked explicit kernel
    (log-features: :func:`log_block_sums`, without the ``n x n x r`` terms of the
    log-domain kernel); longer ones go block by block: the same within a block of
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

    Sequences of one block of plain features fold the readout into the masked explicit
    kernel (:func:`~minip_learn.nn.ops.kernel.kernel_readout` of the kernel and of
    ``<w(x_i), v(x_j)>``), as :func:`~minip_learn.nn.ops.kernel.head_output` does for
    short sequences; log-features go through :func:`causal_attend` (its blocks'
    matrix products, :func:`log_block_sums`) at every length.

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
    if v.shape[-2] > chunk or log_domain:
        u = causal_attend(phi_q, phi_k, v, nonnegative=nonnegative, eps=eps, decay=decay,
                          log_domain=log_domain, mask=mask, chunk_size=chunk)
        return affine_readout(w, b, u)
    spec = AttentionSpec(nonnegative, eps, log_domain, decay)
    fq, fk = apply_rank_mask(phi_q, phi_k, mask, log_domain)
    return kernel_readout(masked_kernel(fq, fk, spec), pairwise_dots(w, v), b,
                          nonnegative=nonnegative, eps=eps)
