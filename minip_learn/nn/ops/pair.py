"""Fused CPU autograd of the token-pair arithmetic: the forms the estimators' fits run.

:func:`pairwise_dots` gives every inner product of two small token sets (the explicit
kernel of Min-IP's ``N = 3`` and the readout-value products ``g_ij = <w(x_i),
v(x_j)>``) with a hand-written backward over contiguous rows of the leading dimensions.
:func:`pair_readout` reads out the positions of many sequences drawn from few distinct
tokens through one sparse product over the token pairs, with a hand-written backward
and reused work buffers. Both equal the quadratic references of
:mod:`minip_learn.nn.ops.naive` (tests hold them to it, forward and backward).
"""

import weakref

import torch

from ._layout import back, front
from .spec import AttentionSpec

__all__ = []  # public home: the package minip_learn.nn.ops

#: below this many tokens per sequence :func:`pairwise_dots` loops over token pairs
LOOP_TOKENS = 8

#: Most work buffers a :func:`pair_readout` ``buffers`` list keeps.
MAX_BUFFERS = 4


class _PairDots(torch.autograd.Function):
    """``out[..., i, j] = <a[..., i, :], c[..., j, :]>`` for a few tokens.

    Works on the (feature, token, ...) views of :func:`front` so that every product
    runs over long contiguous rows of the leading dimensions; the backward accumulates
    pair by pair in place.
    """

    @staticmethod
    def forward(a, c):
        at, ct = front(a), front(c)
        na, nc = at.shape[1], ct.shape[1]
        out = at.new_empty((nc, na) + tuple(at.shape[2:]))
        for i in range(na):
            for j in range(nc):
                torch.sum(at[:, i] * ct[:, j], 0, out=out[j, i])
        return back(out)

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
        at, ct = (front(t) for t in ctx.saved_tensors)
        grad_t = front(grad)  # (N_c, N_a, ...)
        da, dc = torch.empty_like(at), torch.empty_like(ct)
        for i in range(at.shape[1]):
            for j in range(ct.shape[1]):
                grad_ij = grad_t[j, i]
                if j == 0:  # the first term of each sum written, the others accumulated
                    torch.mul(ct[:, j], grad_ij, out=da[:, i])
                else:
                    da[:, i].addcmul_(ct[:, j], grad_ij)
                if i == 0:
                    torch.mul(at[:, i], grad_ij, out=dc[:, j])
                else:
                    dc[:, j].addcmul_(at[:, i], grad_ij)
        return back(da), back(dc)


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
        ``<a_i, c_j>`` for every pair of tokens.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.pair import pairwise_dots
    >>> pairwise_dots(torch.eye(2)[None], torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]))[0]
    tensor([[1., 3.],
            [2., 4.]])
    """
    if a.shape[-2] * c.shape[-2] <= LOOP_TOKENS ** 2 and a.shape[:-2] == c.shape[:-2]:
        return _PairDots.apply(a, c)
    return a @ c.transpose(-2, -1)


def _take_buffer(pool, shape, like):
    """A free work buffer of ``shape`` (dtype and device of ``like``) from ``pool``,
    or a new one."""
    for i, buf in enumerate(pool or ()):
        if buf.shape == shape and buf.dtype == like.dtype and buf.device == like.device:
            return pool.pop(i)
    return like.new_empty(shape)


def _give_buffer(pool, buf):
    """Keep ``buf`` in ``pool`` (a list, or None for no reuse) for a later call."""
    if pool is not None and len(pool) < MAX_BUFFERS:
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
    def forward(ctx, alpha, g, b, token_of, rows, rows_t, spec, positive, pool):
        k = alpha.shape[0]
        z = torch.cat([alpha * g, alpha]).T.contiguous()  # (P, 2k): small
        # (R, 2k), in a kept buffer that goes back once this graph is gone (some of it
        # is saved for the backward)
        s = _row_sums(rows, z, _take_buffer(pool, (rows.shape[0], 2 * k), z))
        if pool is not None:
            weakref.finalize(ctx, _give_buffer, pool, s)
        num, den = s[:, :k], s[:, k:]
        guarded = den if positive else spec.guard(den)
        if b is None:
            out = ratio = num / guarded
        else:  # the ratio in place: few large allocations per step
            ratio = torch.div(num, guarded, out=num)
            out = b.T.contiguous().index_select(0, token_of).add_(ratio)
        # the guard's slope (0 or 1; 1 at |den| = eps, as the clamp of guard_denominator):
        # a nonnegative kernel's zero denominator has a zero numerator (every kernel
        # value of the row is 0), so ratio = 0 there already
        slope = (None if spec.nonnegative or positive
                 else (den.abs() >= spec.eps).to(den.dtype))
        ctx.save_for_backward(alpha, g, token_of, ratio, guarded, slope)
        ctx.rows_t, ctx.pool = rows_t, pool
        ctx.n_tokens = None if b is None else b.shape[1]
        return out.T  # (k, R), laid out position-major

    @staticmethod
    def backward(ctx, grad):
        alpha, g, token_of, ratio, guarded, slope = ctx.saved_tensors
        k = alpha.shape[0]
        G = grad.T.contiguous()  # (R, k): a view when the loss kept the layout
        grads = _take_buffer(ctx.pool, (G.shape[0], 2 * k), G)
        grad_num = torch.div(G, guarded, out=grads[:, :k])
        # minus the denominator's gradient
        grad_den = torch.mul(grad_num, ratio, out=grads[:, k:])
        if slope is not None:
            grad_den.mul_(slope)
        grad_z = _row_sums(ctx.rows_t, grads).T.contiguous()  # (2k, P): small
        _give_buffer(ctx.pool, grads)
        grad_ag, grad_a = grad_z[:k], grad_z[k:]  # of alpha * g and of alpha
        grad_alpha = torch.addcmul(grad_a.neg_(), grad_ag, g)
        grad_g = grad_ag * alpha
        grad_b = (None if ctx.n_tokens is None else
                  G.new_zeros(ctx.n_tokens, k).index_add_(0, token_of, G).T)
        return grad_alpha, grad_g, grad_b, None, None, None, None, None, None


def pair_readout(alpha, g, b, token_of, rows, rows_t, *, nonnegative, eps=1e-3,
                 positive=False, buffers=None):
    """Affine readout of positions whose (query, key) token pairs are listed by a
    sparse matrix, from the kernel and the readout-value products on the token pairs.

    For every output position ``i`` (a query position of some sequence, with query
    token ``t(i)``), ``y_i = sum_p R_ip alpha_p g_p / guard(sum_p R_ip alpha_p) +
    b_t(i)``, where ``R_ip`` counts the keys of ``i``'s sequence that form the token
    pair ``p`` with ``i``'s token (each key slot with its multiplicity, for a sequence
    in multiset form): :func:`~minip_learn.nn.ops.kernel.kernel_readout` with the sums
    over keys written as one sparse matrix product, so no ``(positions x keys)`` tensor
    is formed (sequences drawn from few distinct tokens, e.g. a witness suite).
    ``alpha`` may carry any positive scale per query token (the normalisation divides
    it out). The backward is written by hand.

    Parameters
    ----------
    alpha, g : Tensor of shape (..., P)
        Kernel and readout-value products ``g_p = <w(x), v(z)>`` on ``P`` token pairs.
    b : Tensor of shape (..., U) or None
        Readout bias of every token; None for none (e.g. already added to ``g``, which
        is exact where every denominator is positive).
    token_of : LongTensor of shape (R,)
        The query token of every output position.
    rows, rows_t : sparse CSR Tensor of shape (R, P) and (P, R)
        The pair counts ``R`` and their transpose, in the dtype of ``alpha``.
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`~minip_learn.nn.ops.spec.guard_denominator`.
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
    >>> from minip_learn.nn import ops
    >>> rows = torch.tensor([[1.0, 2.0], [0.0, 1.0]]).to_sparse_csr()
    >>> alpha, g = torch.tensor([1.0, 3.0]), torch.tensor([2.0, 4.0])
    >>> ops.pair_readout(alpha, g, torch.zeros(1), torch.tensor([0, 0]), rows,
    ...                        rows.t().to_sparse_csr(), nonnegative=True)  # 26 / 7, 12 / 3
    tensor([3.7143, 4.0000])
    """
    lead = alpha.shape[:-1]
    k = alpha[..., 0].numel()
    b = None if b is None else b.reshape(k, -1)
    spec = AttentionSpec(nonnegative, eps)
    out = _PairReadout.apply(alpha.reshape(k, -1), g.reshape(k, -1), b,
                             token_of, rows, rows_t, spec, positive, buffers)
    return out.reshape(lead + (-1,))
