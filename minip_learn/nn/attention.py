"""The arithmetic of normalised kernel attention, written once.

Every function works on tensors with arbitrary leading dimensions: the last two are
(token position, feature) for features, values and readout coefficients, and (query,
key) for kernel matrices. A single head (:class:`~minip_learn.nn.KernelAttentionHead`)
calls them on ``(batch, seq_len, .)`` tensors; the fused forward of
:class:`~minip_learn.nn.HeadEnsemble` calls the same functions on
``(members, batch, seq_len, .)`` tensors after computing every member's token maps at
once.

With query features ``phi_Q``, key features ``phi_K``, values ``v`` and the affine
readout ``rho_x(u) = <w(x), u> + b(x)``, a head computes (see :ref:`theory-r1`)

    u_i = sum_j alpha_ij v_j / guard(sum_j alpha_ij),   alpha_ij = <phi_Q(x_i), phi_K(x_j)>,
    y_i = <w(x_i), u_i> + b(x_i),

either through the explicit ``N x N`` kernel (short sequences, :func:`is_short`) or
through the fixed-size sketch ``S = sum_j phi_K(x_j) v_j^T``, ``s = sum_j phi_K(x_j)``
(:func:`sketch`). Dense softmax attention (:func:`softmax_weights`,
:func:`softmax_attend`) is written here too.

**Token multiplicities.** A sequence may be given in multiset form: its distinct tokens
(slots) and how often each occurs (``counts``, shape ``(..., N)``, 0 for a padding slot
that stands for nothing). Normalised kernel attention and softmax attention without
positional maps see a sequence only through that multiset: the output at a token is

    u_i = sum_j c_j alpha_ij v_j / sum_j c_j alpha_ij

over the slots ``j`` (softmax: ``log c_j`` added to the scores), which is what the
materialised sequence, each token repeated ``c_j`` times, gives at every position of
that token. Every function that sums over keys takes an optional ``counts``; None means
one occurrence per position and leaves the arithmetic exactly as without it.

**Causal attention.** :func:`causal_attend` lets position ``i`` attend to the keys
``j <= i`` only, optionally with RetNet's decay, ``alpha_ij = g^(i-j) <phi_Q(x_i),
phi_K(x_j)>`` (position-dependent maps ``g^i phi(x)`` and ``g^-j phi(x)``, computed
from the offsets ``i - j``): the masked explicit kernel within blocks of
:data:`CAUSAL_CHUNK` positions and the prefix sketch carried from block to block.
:func:`recurrent_attend` is the same attention as a recurrent network over the
positions, ``S_i = g S_{i-1} + phi_K(x_i) v_i^T``, ``s_i = g s_{i-1} + phi_K(x_i)``,
the reference the tests hold the parallel form to. Causal softmax:
``softmax_weights(..., causal=True)`` and ``softmax_attend(..., causal=True)``.
Causal attention has no multiset form (a multiset has no order).
No scikit-learn in this layer.

Examples
--------
>>> import torch
>>> from minip_learn.nn import attention
>>> phi_q, phi_k = attention.attention_features(
...     torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), log_domain=True)
>>> v = torch.arange(6.0).reshape(1, 3, 2).expand(2, 3, 2)
>>> attention.attend(phi_q, phi_k, v, nonnegative=True)[0, 0]  # uniform weights
tensor([2., 3.])
"""

import math
import weakref

import torch

__all__ = [
    "CAUSAL_CHUNK",
    "affine_readout",
    "attend",
    "attention_features",
    "causal_attend",
    "causal_mask",
    "causal_head_output",
    "explicit_kernel",
    "guard_denominator",
    "head_output",
    "is_short",
    "kernel_from_log",
    "kernel_readout",
    "kernel_values",
    "log_decay",
    "log_kernel",
    "pair_readout",
    "pairwise_dots",
    "recurrent_attend",
    "recurrent_state",
    "recurrent_step",
    "sketch",
    "softmax_attend",
    "softmax_weights",
    "weight_keys",
]

#: below this many tokens per sequence :func:`pairwise_dots` loops over token pairs
_LOOP_TOKENS = 8


def attention_features(fq, fk, *, log_domain, mask=None):
    """Query and key features ready for the normalisation, shape ``(..., N, r)``.

    Parameters
    ----------
    fq, fk : Tensor of shape (..., N, r)
        Query and key features, or their logarithms when ``log_domain``.
    log_domain : bool
        Whether ``fq`` and ``fk`` are log-features. They are then exponentiated after a
        shift that cancels exactly in the normalisation: with the per-sequence,
        per-feature key maximum ``M_k = max_j fk_jk`` and ``c_i = max_k (fq_ik + M_k)``,
        ``phi_K(x_j)_k = exp(fk_jk - M_k)`` and ``phi_Q(x_i)_k = exp(fq_ik + M_k - c_i)``,
        so the kernel is multiplied by ``exp(-c_i)``, one positive constant per query.
        Every feature is ``<= 1`` and each query's denominator is ``>= 1``: nothing
        overflows and nothing underflows to the floor.
    mask : Tensor of shape (r,) or broadcastable to (..., 1, r), default=None
        Rank mask (entries 0 or 1): features where it is 0 are exact zeros on both
        sides. Log-domain features add ``log(mask)`` (``-inf``) before the per-query
        maximum, so the unmasked arithmetic is that of the smaller rank and masked
        parameters get zero gradients.

    Returns
    -------
    phi_q, phi_k : Tensor of shape (..., N, r)
    """
    if not log_domain:
        return (fq, fk) if mask is None else (fq * mask, fk * mask)
    # computed on (r, N, ...) views: the reductions keep the inputs' memory layout
    lq, lk = _front(fq), _front(fk)
    M = lk.amax(1, keepdim=True).detach()
    a = lq + M
    if mask is not None:
        mask = _front(mask.reshape((1,) * (fq.ndim - mask.ndim) + tuple(mask.shape)))
        a = a + torch.log(mask)
    phi_q = torch.exp(a - a.amax(0, keepdim=True).detach())
    phi_k = torch.exp(lk - M)
    if mask is not None:
        phi_k = phi_k * mask
    return _back(phi_q), _back(phi_k)


def log_kernel(lq, lk, mask=None):
    """Logarithm of the kernel ``log alpha(q_a, k_b) = logsumexp_k (lq_ak + lk_bk)``.

    Parameters
    ----------
    lq : Tensor of shape (..., n_q, r)
    lk : Tensor of shape (..., n_k, r)
        Log-features of two token sets.
    mask : Tensor of shape (r,) or broadcastable, default=None
        Rank mask, added as ``log(mask)``.

    Returns
    -------
    Tensor of shape (..., n_q, n_k)
    """
    s = lq.unsqueeze(-2) + lk.unsqueeze(-3)
    if mask is not None:
        s = s + torch.log(mask).unsqueeze(-2)
    return torch.logsumexp(s, -1)


def kernel_from_log(la):
    """``exp(la - max_k la)`` per row: a log-kernel ``(..., n_q, n_k)`` exponentiated
    after the shift of each query row by its maximum (one positive constant per row)."""
    la = _front(la)  # (n_k, n_q, ...)
    return _back(torch.exp(la - la.amax(0, keepdim=True).detach()))


def explicit_kernel(fq, fk, *, log_domain, mask=None):
    """Kernel matrix ``alpha(q_a, k_b)`` between two token sets, up to a positive scale
    per query row (which the normalisation divides out).

    Log-domain features go through :func:`log_kernel` and are shifted by each row's
    maximum (so the largest entry of a row is 1); other features are multiplied.

    Parameters
    ----------
    fq : Tensor of shape (..., n_q, r)
    fk : Tensor of shape (..., n_k, r)
        (Log-)features of the queries and of the keys.
    log_domain : bool
    mask : Tensor, default=None
        Rank mask, as in :func:`attention_features`.

    Returns
    -------
    Tensor of shape (..., n_q, n_k)
    """
    if log_domain:
        return kernel_from_log(log_kernel(fq, fk, mask))
    if mask is not None:
        fq = fq * mask
    return pairwise_dots(fq, fk)


def guard_denominator(den, *, nonnegative, eps=1e-3):
    """The denominator actually divided by.

    Nonnegative kernels: ``den >= 0``, and ``den == 0`` only when a query sees no key
    at all (every ``alpha_ij = 0``, so the numerator is 0 too); such a denominator is
    replaced by 1, which gives ``u = 0`` and finite, zero gradients instead of NaN
    (maps without a floor, e.g. ``t2r`` or ``dpfp``, have all-zero features). Signed
    kernels (:ref:`theory-r7`): the sign-preserving clamp ``sign(den) max(|den|, eps)``
    with ``sign(0) = +1``, which keeps the exact normalisation whenever ``|den| >= eps``
    and bounds the output otherwise.

    Parameters
    ----------
    den : Tensor
    nonnegative : bool
        Whether the kernel is nonnegative by construction.
    eps : float, default=1e-3
        Clamp of signed denominators (ignored when ``nonnegative``).

    Returns
    -------
    Tensor like ``den``

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.attention import guard_denominator
    >>> guard_denominator(torch.tensor([-2.0, 0.0, 1e-6]), nonnegative=False, eps=0.1)
    tensor([-2.0000,  0.1000,  0.1000])
    """
    if nonnegative:
        return torch.where(den > 0, den, 1.0)
    sign = torch.where(den < 0, -torch.ones_like(den), torch.ones_like(den))
    return sign * den.abs().clamp_min(eps)


def is_short(seq_len, rank, value_dim):
    """Whether the explicit ``N x N`` kernel is cheaper than the ``r x d`` sketch.

    The explicit form costs about ``N^2 (r + d)`` per sequence, the sketch ``N r d``
    (and many tiny matrix products); Min-IP's ``N = 3`` is short for any useful rank.
    """
    return seq_len * (rank + value_dim) <= 2 * rank * value_dim


class _PairDots(torch.autograd.Function):
    """``out[..., i, j] = <a[..., i, :], c[..., j, :]>`` for a few tokens.

    Works on the (feature, token, ...) views of :func:`_front` so that every product
    runs over long contiguous rows of the leading dimensions; the backward accumulates
    pair by pair in place.
    """

    @staticmethod
    def forward(a, c):
        at, ct = _front(a), _front(c)
        na, nc = at.shape[1], ct.shape[1]
        out = at.new_empty((nc, na) + tuple(at.shape[2:]))
        for i in range(na):
            for j in range(nc):
                torch.sum(at[:, i] * ct[:, j], 0, out=out[j, i])
        return _back(out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def vmap(info, in_dims, a, c):
        # the member (vmapped) dimension is one more leading dimension
        a, c = (t.movedim(d, 0) if d is not None else t.expand(info.batch_size, *t.shape)
                for t, d in zip((a, c), in_dims))
        return _PairDots.apply(a, c), 0

    @staticmethod
    def backward(ctx, grad):
        at, ct = (_front(t) for t in ctx.saved_tensors)
        g = _front(grad)  # (N_c, N_a, ...)
        da, dc = torch.empty_like(at), torch.empty_like(ct)
        for i in range(at.shape[1]):
            for j in range(ct.shape[1]):
                gij = g[j, i]
                if j == 0:  # the first term of each sum written, the others accumulated
                    torch.mul(ct[:, j], gij, out=da[:, i])
                else:
                    da[:, i].addcmul_(ct[:, j], gij)
                if i == 0:
                    torch.mul(at[:, i], gij, out=dc[:, j])
                else:
                    dc[:, j].addcmul_(at[:, i], gij)
        return _back(da), _back(dc)


def _front(t):
    """View of ``t`` (..., A, B) as (B, A, ...).

    The arithmetic reduces over these first dimensions, so that its outputs keep the
    memory layout of its inputs: in the fused forward of
    :class:`~minip_learn.nn.HeadEnsemble` (maps stored feature-first) every product
    and sum then runs over contiguous rows of members x sequences.
    """
    return t.movedim((-1, -2), (0, 1))


def _back(t):
    """Inverse of :func:`_front`."""
    return t.movedim((0, 1), (-1, -2))


def pairwise_dots(a, c):
    """All inner products ``<a_i, c_j>`` of two token sets: shape ``(..., N_a, N_c)``.

    The explicit kernel ``<phi_Q(x_i), phi_K(x_j)>`` and the readout-value products
    ``<w(x_i), v(x_j)>``. Few tokens (Min-IP's ``N = 3``) loop over the pairs with a
    hand-written backward over contiguous rows of the leading dimensions (faster on
    CPU than batches of tiny matrix products or broadcast temporaries); more tokens use
    a matrix product.

    Parameters
    ----------
    a : Tensor of shape (..., N_a, k)
    c : Tensor of shape (..., N_c, k)

    Returns
    -------
    Tensor of shape (..., N_a, N_c)
    """
    if a.shape[-2] * c.shape[-2] <= _LOOP_TOKENS ** 2 and a.shape[:-2] == c.shape[:-2]:
        return _PairDots.apply(a, c)
    return a @ c.transpose(-2, -1)


def kernel_values(alpha, v, *, nonnegative, eps=1e-3):
    """Attended values ``u_i = sum_j alpha_ij v_j / guard(sum_j alpha_ij)``.

    Parameters
    ----------
    alpha : Tensor of shape (..., N_q, N_k)
        Explicit kernel (up to a positive scale per row).
    v : Tensor of shape (..., N_k, d)
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`guard_denominator`.

    Returns
    -------
    Tensor of shape (..., N_q, d)
    """
    den = guard_denominator(alpha.sum(-1, keepdim=True), nonnegative=nonnegative, eps=eps)
    if alpha.shape[-1] > _LOOP_TOKENS:
        return (alpha @ v) / den
    # tiny matrix products are slow on CPU: sum over keys on (N_k, N_q, d, ...) views
    a, vv = _front(alpha), _front(v)  # (N_k, N_q, ...), (d, N_k, ...)
    num = (a.unsqueeze(2) * vv.transpose(0, 1).unsqueeze(1)).sum(0)  # (N_q, d, ...)
    return num.movedim((0, 1), (-2, -1)) / den


def kernel_readout(alpha, g, b, *, nonnegative, eps=1e-3):
    """Affine readout of the attended values, from the explicit kernel.

    ``y_i = sum_j alpha_ij g_ij / guard(sum_j alpha_ij) + b_i`` with
    ``g_ij = <w(x_i), v(x_j)>`` equals ``<w(x_i), u_i> + b(x_i)`` (the readout is
    linear in ``u``) without forming ``u``.

    Parameters
    ----------
    alpha, g : Tensor of shape (..., N, N)
        Kernel and readout-value products (:func:`pairwise_dots`).
    b : Tensor of shape (..., N)
        Readout bias ``b(x_i)``.
    nonnegative : bool
    eps : float, default=1e-3

    Returns
    -------
    Tensor of shape (..., N)
    """
    a, g = _front(alpha), _front(g)  # (N_k, N_q, ...): sums over keys keep the layout
    den = guard_denominator(a.sum(0), nonnegative=nonnegative, eps=eps)
    return ((a * g).sum(0) / den).movedim(0, -1) + b


#: Most work buffers a :func:`pair_readout` ``buffers`` list keeps.
_MAX_BUFFERS = 4


def _take_buffer(pool, shape, like):
    """A free work buffer of ``shape`` (dtype and device of ``like``) from ``pool``,
    or a new one."""
    for i, buf in enumerate(pool or ()):
        if buf.shape == shape and buf.dtype == like.dtype and buf.device == like.device:
            return pool.pop(i)
    return like.new_empty(shape)


def _give_buffer(pool, buf):
    """Keep ``buf`` in ``pool`` (a list, or None for no reuse) for a later call."""
    if pool is not None and len(pool) < _MAX_BUFFERS:
        pool.append(buf)


def _row_sums(rows, z, out=None):
    """``rows @ z`` for a sparse CSR ``rows`` and a dense ``z``, written straight into
    ``out`` (a new tensor when None; ``rows @ z`` fills a zero tensor and copies its
    result over)."""
    if out is None:
        out = z.new_empty(rows.shape[0], z.shape[1])
    return torch.addmm(out, rows, z, beta=0, out=out)


class _PairReadout(torch.autograd.Function):
    """The forward and hand-written backward of :func:`pair_readout` on ``(k, P)``
    pair values, in the position-major layout ``(R, k)``: the sums over keys are one
    sparse product with ``rows`` (backward: with ``rows_t``) and every elementwise
    step runs over contiguous rows of the ``k`` members, with no transposed copy of
    a ``(positions x members)`` tensor."""

    @staticmethod
    def forward(ctx, alpha, g, b, token_of, rows, rows_t, nonnegative, eps, positive, pool):
        k = alpha.shape[0]
        z = torch.cat([alpha * g, alpha]).T.contiguous()  # (P, 2k): small
        # (R, 2k), in a kept buffer that goes back once this graph is gone (some of it
        # is saved for the backward)
        s = _row_sums(rows, z, _take_buffer(pool, (rows.shape[0], 2 * k), z))
        if pool is not None:
            weakref.finalize(ctx, _give_buffer, pool, s)
        num, den = s[:, :k], s[:, k:]
        gd = den if positive else guard_denominator(den, nonnegative=nonnegative, eps=eps)
        if b is None:
            out = ratio = num / gd
        else:  # the ratio in place: few large allocations per step
            ratio = torch.div(num, gd, out=num)
            out = b.T.contiguous().index_select(0, token_of).add_(ratio)
        # the guard's slope (0 or 1): a nonnegative kernel's zero denominator has a zero
        # numerator (every kernel value of the row is 0), so ratio = 0 there already
        slope = None if nonnegative or positive else (den.abs() > eps).to(den.dtype)
        ctx.save_for_backward(alpha, g, token_of, ratio, gd, slope)
        ctx.rows_t, ctx.pool = rows_t, pool
        ctx.n_tokens = None if b is None else b.shape[1]
        return out.T  # (k, R), laid out position-major

    @staticmethod
    def backward(ctx, grad):
        alpha, g, token_of, ratio, gd, slope = ctx.saved_tensors
        k = alpha.shape[0]
        G = grad.T.contiguous()  # (R, k): a view when the loss kept the layout
        gs = _take_buffer(ctx.pool, (G.shape[0], 2 * k), G)
        gnum = torch.div(G, gd, out=gs[:, :k])
        gden = torch.mul(gnum, ratio, out=gs[:, k:])  # minus the denominator's gradient
        if slope is not None:
            gden.mul_(slope)
        gz = _row_sums(ctx.rows_t, gs).T.contiguous()  # (2k, P): small
        _give_buffer(ctx.pool, gs)
        g_ag, g_a = gz[:k], gz[k:]
        grad_alpha = torch.addcmul(g_a.neg_(), g_ag, g)
        grad_g = g_ag * alpha
        grad_b = (None if ctx.n_tokens is None else
                  G.new_zeros(ctx.n_tokens, k).index_add_(0, token_of, G).T)
        return grad_alpha, grad_g, grad_b, None, None, None, None, None, None, None


def pair_readout(alpha, g, b, token_of, rows, rows_t, *, nonnegative, eps=1e-3,
                 positive=False, buffers=None):
    """Affine readout of positions whose (query, key) token pairs are listed by a
    sparse matrix, from the kernel and the readout-value products on the token pairs.

    For every output position ``i`` (a query position of some sequence, with query
    token ``t(i)``), ``y_i = sum_p R_ip alpha_p g_p / guard(sum_p R_ip alpha_p) +
    b_t(i)``, where ``R_ip`` counts the keys of ``i``'s sequence that form the token
    pair ``p`` with ``i``'s token (each key slot with its multiplicity, for a sequence
    in multiset form): :func:`kernel_readout` with the sums over keys written as one
    sparse matrix product, so no ``(positions x keys)`` tensor is formed (sequences
    drawn from few distinct tokens, e.g. a witness suite). ``alpha`` may carry any
    positive scale per query token (the normalisation divides it out). The backward is
    written by hand.

    Parameters
    ----------
    alpha, g : Tensor of shape (..., P)
        Kernel and readout-value products ``<w(x), v(z)>`` on ``P`` token pairs.
    b : Tensor of shape (..., U) or None
        Readout bias of every token; None for none (e.g. already added to ``g``, which
        is exact where every denominator is positive).
    token_of : LongTensor of shape (R,)
        The query token of every output position.
    rows, rows_t : sparse CSR Tensor of shape (R, P) and (P, R)
        The pair counts ``R`` and their transpose, in the dtype of ``alpha``.
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`guard_denominator`.
    positive : bool, default=False
        Whether every kernel value of an occurring pair is known to be positive (e.g.
        log-domain features checked to lie above the floating-point range): every
        denominator is then positive and the guard is the identity, which is skipped.
    buffers : list, default=None
        Where the ``(R, 2 k)`` work buffers are kept between calls (a list owned by the
        caller, e.g. one per input that is trained on): a buffer goes back to it when
        the backward is done with it, or when the graph of the call is freed, and the
        next call reuses it instead of touching fresh memory. None: new buffers.

    Returns
    -------
    Tensor of shape (..., R)
        Laid out position-major (the leading dimensions vary fastest).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import attention
    >>> rows = torch.tensor([[1.0, 2.0], [0.0, 1.0]]).to_sparse_csr()
    >>> alpha, g = torch.tensor([1.0, 3.0]), torch.tensor([2.0, 4.0])
    >>> attention.pair_readout(alpha, g, torch.zeros(1), torch.tensor([0, 0]), rows,
    ...                        rows.t().to_sparse_csr(), nonnegative=True)  # 26 / 7, 12 / 3
    tensor([3.7143, 4.0000])
    """
    lead = alpha.shape[:-1]
    k = alpha[..., 0].numel()
    b = None if b is None else b.reshape(k, -1)
    out = _PairReadout.apply(alpha.reshape(k, -1), g.reshape(k, -1), b,
                             token_of, rows, rows_t, nonnegative, eps, positive, buffers)
    return out.reshape(lead + (-1,))


def weight_keys(phi_k, counts):
    """Key features weighted by the multiplicity of their token, ``c_j phi_K(x_j)``.

    Every kernel value ``alpha_ij`` a query sums over then carries the factor ``c_j``,
    in the numerator and in the denominator alike: the sums over the distinct tokens of
    a multiset equal the sums over the positions of its materialised sequence.

    Parameters
    ----------
    phi_k : Tensor of shape (..., N, r)
        Key features (:func:`attention_features`).
    counts : Tensor of shape (..., N) or None
        Multiplicity of every key slot (0 for padding); None: ``phi_k`` itself.

    Returns
    -------
    Tensor of shape (..., N, r)

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import attention
    >>> attention.weight_keys(torch.ones(1, 2, 3), torch.tensor([[2.0, 0.0]]))[0]
    tensor([[2., 2., 2.],
            [0., 0., 0.]])
    """
    return phi_k if counts is None else phi_k * counts.unsqueeze(-1)


def sketch(phi_k, v):
    """Fixed-size sketch ``(S, s)``: ``S = sum_j phi_K(x_j) v_j^T`` of shape (..., r, d)
    and ``s = sum_j phi_K(x_j)`` of shape (..., r)."""
    return phi_k.transpose(-2, -1) @ v, phi_k.sum(-2)


def attend(phi_q, phi_k, v, *, nonnegative, eps=1e-3, counts=None):
    """Attended values ``u`` of shape (..., N, d): explicit kernel or sketch.

    Short sequences (:func:`is_short`) go through the explicit kernel
    (:func:`pairwise_dots`, :func:`kernel_values`), longer ones through the sketch:
    ``u_i = phi_Q(x_i)^T S / guard(phi_Q(x_i)^T s)``, cost ``O(N r d)``.

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
        Features from :func:`attention_features`.
    v : Tensor of shape (..., N, d)
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`guard_denominator`.
    counts : Tensor of shape (..., N), default=None
        Multiplicity of every slot (:func:`weight_keys`); None: one per position.

    Returns
    -------
    Tensor of shape (..., N, d)
    """
    phi_k = weight_keys(phi_k, counts)
    if is_short(v.shape[-2], phi_q.shape[-1], v.shape[-1]):
        alpha = pairwise_dots(phi_q, phi_k)
        return kernel_values(alpha, v, nonnegative=nonnegative, eps=eps)
    S, s = sketch(phi_k, v)
    den = (phi_q * s.unsqueeze(-2)).sum(-1, keepdim=True)
    return (phi_q @ S) / guard_denominator(den, nonnegative=nonnegative, eps=eps)


def head_output(phi_q, phi_k, v, w, b, *, nonnegative, eps=1e-3, counts=None):
    """Output ``y_i = <w(x_i), u_i> + b(x_i)`` of a head with an affine readout.

    Short sequences fold the readout into the explicit kernel
    (:func:`kernel_readout` of the kernel and of ``<w(x_i), v(x_j)>``), longer ones
    read out the values attended through the sketch (:func:`attend`).

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
    v, w : Tensor of shape (..., N, d)
    b : Tensor of shape (..., N)
    nonnegative : bool
    eps : float, default=1e-3
    counts : Tensor of shape (..., N), default=None
        Multiplicity of every slot (:func:`weight_keys`); None: one per position.

    Returns
    -------
    Tensor of shape (..., N)
    """
    phi_k = weight_keys(phi_k, counts)
    if is_short(v.shape[-2], phi_q.shape[-1], v.shape[-1]):
        return kernel_readout(pairwise_dots(phi_q, phi_k), pairwise_dots(w, v), b,
                              nonnegative=nonnegative, eps=eps)
    return affine_readout(w, b, attend(phi_q, phi_k, v, nonnegative=nonnegative, eps=eps))


def affine_readout(w, b, u):
    """``rho_x(u) = <w(x), u> + b(x)``: ``w`` and ``u`` of shape (..., d), ``b`` of
    shape (...)."""
    return (w * u).sum(-1) + b


# -- causal attention -----------------------------------------------------------------

#: Positions per block of :func:`causal_attend`: within a block the masked explicit
#: kernel, between blocks the carried prefix sketch.
CAUSAL_CHUNK = 32


def log_decay(decay):
    """``log g`` of a decay factor ``g`` in ``(0, 1]``, or 0.0 for None (no decay).

    Examples
    --------
    >>> from minip_learn.nn.attention import log_decay
    >>> log_decay(None), log_decay(1.0)
    (0.0, 0.0)
    """
    if decay is None:
        return 0.0
    g = float(decay)
    if not 0.0 < g <= 1.0:
        raise ValueError(f"decay must be in (0, 1]; got {decay!r}.")
    return math.log(g)


def _offsets(n_q, n_k, q0, k0, device):
    """Relative offsets ``i - j`` of queries ``q0 .. q0+n_q-1`` and keys
    ``k0 .. k0+n_k-1``, shape (n_q, n_k)."""
    i = torch.arange(q0, q0 + n_q, device=device)
    j = torch.arange(k0, k0 + n_k, device=device)
    return i[:, None] - j[None, :]


def _decayed_mask(n, lg, *, log, dtype, device):
    """The causal (and decayed) mask of one block of ``n`` positions: ``g^(i-j)`` for
    ``j <= i`` and 0 above the diagonal (``log``: ``(i-j) log g`` and ``-inf``)."""
    d = _offsets(n, n, 0, 0, device)
    keep = d >= 0
    expo = d.clamp_min(0).to(dtype) * lg  # never a positive exponent
    if log:
        return torch.where(keep, expo, torch.full_like(expo, -math.inf))
    return torch.where(keep, torch.exp(expo), torch.zeros_like(expo))


def _position_decay(n, lg, start, dtype, device, *, log=False, reverse=False):
    """``g^(start + t)`` (``log``: ``(start + t) log g``) for ``t = 0 .. n-1``, or for
    ``t = n-1 .. 0`` when ``reverse``: shape (n, 1). Callers keep every exponent
    nonnegative."""
    t = torch.arange(n, device=device, dtype=dtype)
    if reverse:
        t = (n - 1) - t
    expo = (t + start) * lg
    return (expo if log else torch.exp(expo)).unsqueeze(-1)


def _apply_mask(fq, fk, mask, log_domain):
    """Rank mask: log-features add ``log(mask)`` on the query side (``-inf``: that
    feature's kernel terms are exact zeros), plain features are multiplied by it."""
    if mask is None:
        return fq, fk
    mask = mask.reshape((1,) * (fq.ndim - mask.ndim) + tuple(mask.shape))
    if log_domain:
        return fq + torch.log(mask), fk
    return fq * mask, fk * mask


def _finite_or_zero(t):
    """``t`` with its infinite entries replaced by 0 (a shift that is never used on
    anything but exact zeros)."""
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))


def _block_kernel(fq, fk, lg, *, log_domain):
    """Masked (decayed) explicit kernel of one block: ``g^(i-j) <phi_Q(x_i), phi_K(x_j)>``
    for ``j <= i``, 0 above the diagonal. Log-domain: its logarithm
    (``-inf`` above the diagonal) and each row's maximum."""
    n = fq.shape[-2]
    if not log_domain:
        dec = _decayed_mask(n, lg, log=False, dtype=fq.dtype, device=fq.device)
        return pairwise_dots(fq, fk) * dec, None
    la = log_kernel(fq, fk) + _decayed_mask(n, lg, log=True, dtype=fq.dtype,
                                            device=fq.device)
    return la, la.amax(-1).detach()


def _causal_blocks(fq, fk, v, *, lg, log_domain, chunk):
    """Numerators ``(..., N, d)`` and denominators ``(..., N)`` of causal (decayed)
    kernel attention, block by block, each up to one positive scale per query.

    A sequence of one block is the masked explicit kernel (log-features: through
    :func:`log_kernel`, each row shifted by its maximum over the keys it sees, so the
    output at ``i`` is computed from the tokens up to ``i`` alone). Longer ones carry
    the prefix sketch from block to block. Plain features: the state before block
    ``[t0, t1)`` is ``S = sum_{j < t0} g^(t0-1-j) phi_K(x_j) v_j^T`` (and ``s``), so a
    query ``i`` of the block adds ``g^(i-t0+1) phi_Q(x_i)^T S``, and within the block
    the kernel is multiplied by ``g^(i-j)`` (``j <= i``): every power of ``g`` has a
    nonnegative exponent. Log-features: the state holds ``exp(a_jk - m_k)`` with
    ``a_jk = lk_jk + (t0-1-j) log g`` and the running maximum ``m_k = max_j a_jk``
    (a new block's keys rescale it by ``exp(m_old - m_new) <= 1``; moving on by ``C``
    positions only shifts ``m`` by ``C log g``); the block's own keys are shifted by
    their maximum per feature, and each query row by its maximum over both parts.
    """
    N = fq.shape[-2]
    if N <= chunk:
        alpha, c = _block_kernel(fq, fk, lg, log_domain=log_domain)
        if log_domain:
            alpha = torch.exp(alpha - _finite_or_zero(c).unsqueeze(-1))
        return alpha @ v, alpha.sum(-1)
    dtype, device = fq.dtype, fq.device
    nums, dens = [], []
    S = s = m = None
    for t0 in range(0, N, chunk):
        t1 = min(N, t0 + chunk)
        C = t1 - t0
        q, k, vv = fq[..., t0:t1, :], fk[..., t0:t1, :], v[..., t0:t1, :]
        dec = _decayed_mask(C, lg, log=False, dtype=dtype, device=device)
        if log_domain:
            M = _finite_or_zero(k.amax(-2, keepdim=True)).detach()
            qs = q + M
            c = qs.amax(-1).detach()
            if S is not None:
                # the state's log-weight for query i: lq_i + (i - t0 + 1) log g + m
                qa = q + _position_decay(C, lg, 1, dtype, device, log=True) + m.unsqueeze(-2)
                c = torch.maximum(c, qa.amax(-1).detach())
            c = _finite_or_zero(c).unsqueeze(-1)
            alpha = pairwise_dots(torch.exp(qs - c), torch.exp(k - M)) * dec
        else:
            alpha = pairwise_dots(q, k) * dec
        num = alpha @ vv
        den = alpha.sum(-1)
        if S is not None:
            pq = (torch.exp(qa - c) if log_domain
                  else q * _position_decay(C, lg, 1, dtype, device))
            num = num + pq @ S
            den = den + (pq * s.unsqueeze(-2)).sum(-1)
        nums.append(num)
        dens.append(den)
        if t1 == N:
            break
        # the state after the block: keys weighted by g^(t1-1-j)
        if log_domain:
            a = k + _position_decay(C, lg, 0, dtype, device, log=True, reverse=True)
            m_new = a.amax(-2).detach()
            if m is not None:
                m_prev = m + C * lg
                m_new = torch.maximum(m_prev, m_new)
            shift = _finite_or_zero(m_new)
            pk = torch.exp(a - shift.unsqueeze(-2))
            S_blk, s_blk = pk.transpose(-2, -1) @ vv, pk.sum(-2)
            if S is not None:
                scale = torch.exp(m_prev - shift)  # <= 1 (0 for an empty feature)
                S_blk, s_blk = S * scale.unsqueeze(-1) + S_blk, s * scale + s_blk
            S, s, m = S_blk, s_blk, m_new
        else:
            kd = k * _position_decay(C, lg, 0, dtype, device, reverse=True)
            S_blk, s_blk = kd.transpose(-2, -1) @ vv, kd.sum(-2)
            if S is not None:
                g_c = math.exp(C * lg)
                S_blk, s_blk = S * g_c + S_blk, s * g_c + s_blk
            S, s = S_blk, s_blk
    return torch.cat(nums, -2), torch.cat(dens, -1)


def causal_attend(phi_q, phi_k, v, *, nonnegative, eps=1e-3, decay=None, log_domain=False,
                  mask=None, chunk_size=None):
    """Causal normalised kernel attention: position ``i`` attends to ``j <= i``.

    ``u_i = sum_{j<=i} alpha_ij v_j / guard(sum_{j<=i} alpha_ij)`` with
    ``alpha_ij = g^(i-j) <phi_Q(x_i), phi_K(x_j)>`` (``g = decay``; no decay: ``g = 1``).
    The decayed kernel is RetNet's normalised decayed attention: position-dependent
    maps ``phi_Q(x, i) = g^i phi(x)``, ``phi_K(x, j) = g^-j phi(x)``, computed from
    the relative offsets ``i - j >= 0`` only (never ``g^-j`` itself, which overflows
    for long sequences).

    Sequences of at most ``chunk_size`` positions use the masked explicit kernel;
    longer ones go block by block: the masked explicit kernel within a block of
    ``chunk_size`` positions and the prefix sketch ``S = sum_j g^(.) phi_K(x_j) v_j^T``,
    ``s = sum_j g^(.) phi_K(x_j)`` carried from block to block (memory
    ``O(N (r + d) + chunk_size^2 + r d)`` per sequence, cost ``O(N (chunk_size + r) d)``
    for plain features). It equals :func:`recurrent_attend`, the token-by-token form,
    up to rounding, and the output at ``i`` never depends on later tokens.

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
        Query and key features, or their logarithms when ``log_domain`` (no shift
        needed: every block is shifted by its own maxima, which cancel exactly in the
        normalisation).
    v : Tensor of shape (..., N, d)
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`guard_denominator`.
    decay : float in (0, 1], default=None
        Decay factor ``g``; None for none.
    log_domain : bool, default=False
    mask : Tensor of shape (r,), default=None
        Rank mask, as in :func:`attention_features`.
    chunk_size : int, default=None
        Positions per block; None means :data:`CAUSAL_CHUNK`.

    Returns
    -------
    Tensor of shape (..., N, d)

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import attention
    >>> phi = torch.ones(1, 3, 2)
    >>> v = torch.tensor([[[0.0], [3.0], [6.0]]])
    >>> attention.causal_attend(phi, phi, v, nonnegative=True)[0, :, 0]  # prefix means
    tensor([0.0000, 1.5000, 3.0000])
    """
    chunk = CAUSAL_CHUNK if chunk_size is None else max(1, int(chunk_size))
    fq, fk = _apply_mask(phi_q, phi_k, mask, log_domain)
    num, den = _causal_blocks(fq, fk, v, lg=log_decay(decay), log_domain=log_domain,
                              chunk=chunk)
    return num / guard_denominator(den, nonnegative=nonnegative, eps=eps).unsqueeze(-1)


def causal_head_output(phi_q, phi_k, v, w, b, *, nonnegative, eps=1e-3, decay=None,
                       log_domain=False, mask=None, chunk_size=None):
    """Output ``y_i = <w(x_i), u_i> + b(x_i)`` of a causal head (:func:`causal_attend`).

    Sequences of one block fold the readout into the masked explicit kernel
    (:func:`kernel_readout` of the kernel and of ``<w(x_i), v(x_j)>``), as
    :func:`head_output` does for short sequences.

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
    v, w : Tensor of shape (..., N, d)
    b : Tensor of shape (..., N)
    nonnegative : bool
    eps, decay, log_domain, mask, chunk_size
        As in :func:`causal_attend`.

    Returns
    -------
    Tensor of shape (..., N)
    """
    chunk = CAUSAL_CHUNK if chunk_size is None else max(1, int(chunk_size))
    if v.shape[-2] > chunk:
        u = causal_attend(phi_q, phi_k, v, nonnegative=nonnegative, eps=eps, decay=decay,
                          log_domain=log_domain, mask=mask, chunk_size=chunk)
        return affine_readout(w, b, u)
    fq, fk = _apply_mask(phi_q, phi_k, mask, log_domain)
    alpha, c = _block_kernel(fq, fk, log_decay(decay), log_domain=log_domain)
    if log_domain:
        alpha = torch.exp(alpha - _finite_or_zero(c).unsqueeze(-1))
    return kernel_readout(alpha, pairwise_dots(w, v), b, nonnegative=nonnegative, eps=eps)


def recurrent_attend(phi_q, phi_k, v, *, nonnegative, eps=1e-3, decay=None, log_domain=False,
                     mask=None):
    """Causal normalised kernel attention as a recurrent network, token by token.

    The state after position ``i`` is the fixed-size prefix sketch

        S_i = g S_{i-1} + phi_K(x_i) v_i^T,   s_i = g s_{i-1} + phi_K(x_i)

    (``g = decay``, 1 without decay), and ``u_i = phi_Q(x_i)^T S_i /
    guard(phi_Q(x_i)^T s_i)``: ``r d + r`` floats carried from one token to the next
    (log-features: ``r`` more, the running maximum ``m`` of the decayed key
    log-features, by which the state is stored shifted). The reference form of
    :func:`causal_attend`, equal to it up to rounding; one token at a time is
    :func:`recurrent_step` from :func:`recurrent_state`.

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
    v : Tensor of shape (..., N, d)
    nonnegative : bool
    eps, decay, log_domain, mask
        As in :func:`causal_attend`.

    Returns
    -------
    Tensor of shape (..., N, d)

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import attention
    >>> phi = torch.ones(1, 3, 2)
    >>> v = torch.tensor([[[0.0], [3.0], [6.0]]])
    >>> attention.recurrent_attend(phi, phi, v, nonnegative=True)[0, :, 0]
    tensor([0.0000, 1.5000, 3.0000])
    """
    fq, fk = _apply_mask(phi_q, phi_k, mask, log_domain)
    state = recurrent_state(fq.shape[:-2], fq.shape[-1], v.shape[-1], log_domain=log_domain,
                            dtype=v.dtype, device=v.device)
    out = []
    for i in range(v.shape[-2]):
        u, state = recurrent_step(state, fq[..., i, :], fk[..., i, :], v[..., i, :],
                                  nonnegative=nonnegative, eps=eps, decay=decay,
                                  log_domain=log_domain)
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
    >>> from minip_learn.nn import attention
    >>> [t.shape for t in attention.recurrent_state((2,), 3, 4, log_domain=True)]
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

    ``S <- g S + phi_K(x) v^T``, ``s <- g s + phi_K(x)``, then
    ``u = phi_Q(x)^T S / guard(phi_Q(x)^T s)``. Log-features: ``m <- max(m + log g,
    lk)`` and ``S``, ``s`` rescaled by ``exp(m_old + log g - m_new) <= 1``, the query
    shifted by its own maximum.

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
        As in :func:`causal_attend`.

    Returns
    -------
    u : Tensor of shape (..., d)
    state : tuple of Tensor

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import attention
    >>> state = attention.recurrent_state((1,), 2, 1, log_domain=False)
    >>> for value in (0.0, 3.0):
    ...     u, state = attention.recurrent_step(state, torch.ones(1, 2), torch.ones(1, 2),
    ...                                         torch.tensor([[value]]), nonnegative=True)
    >>> u
    tensor([[1.5000]])
    """
    lg = log_decay(decay)
    S, s = state[0], state[1]
    if log_domain:
        m = state[2]
        m_new = torch.maximum(m + lg, phi_k.detach())
        shift = _finite_or_zero(m_new)
        keep = torch.exp(m + lg - shift)  # <= 1 (0 before the first token)
        S, s = S * keep.unsqueeze(-1), s * keep
        pk = torch.exp(phi_k - shift)
        a = phi_q + m_new
        pq = torch.exp(a - _finite_or_zero(a.amax(-1, keepdim=True)).detach())
        tail = (m_new,)
    else:
        g = math.exp(lg)
        S, s, pk, pq, tail = S * g, s * g, phi_k, phi_q, ()
    S = S + pk.unsqueeze(-1) * v.unsqueeze(-2)
    s = s + pk
    num = (pq.unsqueeze(-1) * S).sum(-2)
    den = (pq * s).sum(-1, keepdim=True)
    return num / guard_denominator(den, nonnegative=nonnegative, eps=eps), (S, s) + tail


def causal_mask(n_q, n_k, *, start=0, device=None):
    """Boolean mask ``(n_q, n_k)``: True where query ``start + a`` may see key ``b``
    (``b <= start + a``).

    Examples
    --------
    >>> from minip_learn.nn.attention import causal_mask
    >>> causal_mask(2, 3, start=1).int()
    tensor([[1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    return _offsets(n_q, n_k, start, 0, device) >= 0


def softmax_weights(scores, counts=None, *, causal=False):
    """Softmax attention weights ``softmax_j(s_ij + log c_j)`` of shape (..., N, N).

    Parameters
    ----------
    scores : Tensor of shape (..., N, N)
        Attention logits (already divided by the temperature).
    counts : Tensor of shape (..., N), default=None
        Multiplicity of every key slot: ``log c_j`` joins the scores, so a slot counts
        as ``c_j`` equal keys and a padding slot (``c_j = 0``, ``log 0 = -inf``) gets
        weight 0. None: one per position.
    causal : bool, default=False
        Query ``i`` sees the keys ``j <= i`` only (the scores above the diagonal are
        ``-inf``).

    Returns
    -------
    Tensor of shape (..., N, N)

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import attention
    >>> attention.softmax_weights(torch.zeros(1, 2, 2), torch.tensor([[3.0, 1.0]]))[0, 0]
    tensor([0.7500, 0.2500])
    >>> attention.softmax_weights(torch.zeros(1, 2, 2), causal=True)[0]
    tensor([[1.0000, 0.0000],
            [0.5000, 0.5000]])
    """
    if counts is not None:
        scores = scores + torch.log(counts).unsqueeze(-2)
    if causal:
        keep = causal_mask(scores.shape[-2], scores.shape[-1], device=scores.device)
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1)


def softmax_attend(q, k, v, *, scale, block_rows, counts=None, causal=False):
    """Softmax attention ``u_i = sum_j softmax_j(scale q_i^T k_j + log c_j) v_j`` through
    :func:`torch.nn.functional.scaled_dot_product_attention`, ``block_rows`` queries
    per call.

    On CPU the fused kernel streams over the keys with a running maximum and never
    forms the score matrix. It needs ``(batch, heads, N, width)`` inputs and one width
    for queries, keys and values: zero columns pad them to it (they add nothing to the
    scores) and the padded output columns are dropped.

    Parameters
    ----------
    q, k : Tensor of shape (..., N, d_s)
    v : Tensor of shape (..., N, d)
    scale : float
        Factor of the scores (``1 / temperature``).
    block_rows : int
        Most queries per call (bounds the memory of backends that form the scores).
    counts : Tensor of shape (..., N), default=None
        Multiplicity of every key slot, added to the scores as ``log c_j`` (an additive
        attention mask); None: one per position (no mask).
    causal : bool, default=False
        Query ``i`` attends to the keys ``j <= i`` only: a block of queries sees the
        keys up to its last query, through ``is_causal`` when the block is the whole
        sequence and a boolean mask otherwise. Not with ``counts`` (a multiset has no
        order).

    Returns
    -------
    Tensor of shape (..., N, d)

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import attention
    >>> q = k = torch.zeros(1, 2, 3)
    >>> v = torch.tensor([[[0.0], [4.0]]])
    >>> attention.softmax_attend(q, k, v, scale=1.0, block_rows=2,
    ...                          counts=torch.tensor([[3.0, 1.0]]))[0, :, 0]  # (3*0 + 4) / 4
    tensor([1., 1.])
    >>> attention.softmax_attend(q, k, v, scale=1.0, block_rows=1, causal=True)[0, :, 0]
    tensor([0., 2.])
    """
    if causal and counts is not None:
        raise ValueError("causal softmax attention takes no counts: a sequence in "
                         "multiset form has no order.")
    lead, n, d = q.shape[:-2], q.shape[-2], v.shape[-1]
    width = max(q.shape[-1], d)
    q, k, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])).reshape(-1, 1, n, width)
               for t in (q, k, v))
    mask = (None if counts is None else
            torch.log(counts.to(q.dtype)).expand(*lead, n).reshape(-1, 1, 1, n))
    rows = min(n, max(1, int(block_rows)))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    blocks = []
    for start in range(0, n, rows):
        qb = q[:, :, start:start + rows]
        if not causal:
            blocks.append(sdpa(qb, k, v, attn_mask=mask, scale=scale))
        elif rows == n:
            blocks.append(sdpa(qb, k, v, is_causal=True, scale=scale))
        else:  # the keys up to the block's last query, masked above the diagonal
            end = start + qb.shape[-2]
            keep = causal_mask(qb.shape[-2], end, start=start, device=q.device)
            blocks.append(sdpa(qb, k[:, :, :end], v[:, :, :end], attn_mask=keep,
                               scale=scale))
    u = torch.cat(blocks, dim=-2)
    return u[..., :d].reshape(*lead, n, d)
