"""Quadratic references: every attention form written as a loop over queries and keys.

Each function here is the definition of an attention form, with no shift, no block,
no sketch and no hand-written backward: in float64 they are the exact references the
fast forms of :mod:`minip_learn.nn.ops` are held to (``tests/nn/test_ops.py``), forward
and backward. Log-features enter as their exponentials (``phi = exp(l)``), a rank mask
as a factor of both sides; the fast forms' shifts cancel in the normalisation. The
module shares no code with the fast forms: even the denominator guard is written here
(``_guard``) from its definition. Slow by design: for tests and small checks only.

Examples
--------
>>> import torch
>>> from minip_learn.nn.ops import naive
>>> phi = torch.ones(1, 3, 2)
>>> v = torch.tensor([[[0.0], [3.0], [6.0]]])
>>> naive.kernel_attention(phi, phi, v, nonnegative=True, causal=True)[0, :, 0]
tensor([0.0000, 1.5000, 3.0000])
"""

import torch

__all__ = [
    "causal_mask",
    "decayed_scores",
    "head_output",
    "kernel_attention",
    "pair_readout",
    "pairwise_dots",
    "softmax_attention",
]


def _guard(den, *, nonnegative, eps=1e-3):
    """The denominator a normalised form divides by, written from its definition.

    Nonnegative kernels: a positive ``den`` as it is, anything else (a query that sees
    no key, so the numerator is 0 too) replaced by 1. Signed kernels: ``sign(den)
    max(|den|, eps)`` with ``sign(0) = +1``, i.e. ``+-eps`` (the sign of ``den``) when
    ``|den| < eps`` and ``den`` itself otherwise (NaN included); the gradient is 0 in the
    first case and 1 in the second.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import naive
    >>> naive._guard(torch.tensor([-2.0, 0.0, -1e-6]), nonnegative=False, eps=0.1)
    tensor([-2.0000,  0.1000, -0.1000])
    >>> naive._guard(torch.tensor([0.0, 3.0]), nonnegative=True)
    tensor([1., 3.])
    """
    if nonnegative:
        return torch.where(den > 0, den, torch.ones_like(den))
    floor = torch.full_like(den, eps)
    return torch.where(den.abs() < eps, torch.where(den < 0, -floor, floor), den)


def causal_mask(n_q, n_k, *, start=0):
    """``keep[a, b] = (b <= start + a)``: query ``start + a`` sees key ``b``.

    Examples
    --------
    >>> from minip_learn.nn.ops import naive
    >>> naive.causal_mask(1, 2).tolist()
    [[True, False]]
    """
    return torch.tensor([[b <= start + a for b in range(n_k)] for a in range(n_q)])


def pairwise_dots(a, c):
    """``out[..., i, j] = sum_k a[..., i, k] c[..., j, k]``, one pair at a time.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import naive
    >>> naive.pairwise_dots(torch.eye(2), torch.tensor([[1.0, 2.0]]))
    tensor([[1.],
            [2.]])
    """
    rows = [torch.stack([(a[..., i, :] * c[..., j, :]).sum(-1) for j in range(c.shape[-2])], -1)
            for i in range(a.shape[-2])]
    return torch.stack(rows, -2)


def kernel_attention(phi_q, phi_k, v, *, nonnegative, eps=1e-3, counts=None, causal=False,
                     decay=None):
    """``u_i = sum_j a_ij v_j / guard(sum_j a_ij)`` with ``a_ij = c_j gamma^(i-j)
    <phi_Q(x_i), phi_K(x_j)>``, over every key ``j`` (``causal``: ``j <= i``).

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
        Features (not log-features).
    v : Tensor of shape (..., N, d)
    nonnegative : bool
    eps : float, default=1e-3
        Clamp of signed denominators (``_guard``; as in
        :func:`~minip_learn.nn.ops.spec.guard_denominator`).
    counts : Tensor of shape (..., N), default=None
        Multiplicity ``c_j`` of every key slot; None: 1.
    causal : bool, default=False
    decay : float in (0, 1], default=None
        ``gamma`` of a causal form; None: 1.

    Returns
    -------
    Tensor of shape (..., N, d)
        The attended values, summed key by key.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import naive
    >>> phi, v = torch.ones(1, 2, 1), torch.tensor([[[0.0], [4.0]]])
    >>> naive.kernel_attention(phi, phi, v, nonnegative=True, causal=True, decay=0.5)[0, 1]
    tensor([2.6667])
    """
    gamma = 1.0 if decay is None else float(decay)
    n = v.shape[-2]
    out = []
    for i in range(n):
        num = den = 0.0
        for j in range(i + 1 if causal else n):
            a = (phi_q[..., i, :] * phi_k[..., j, :]).sum(-1)
            if causal:
                a = a * gamma ** (i - j)
            if counts is not None:
                a = a * counts[..., j]
            num = num + a.unsqueeze(-1) * v[..., j, :]
            den = den + a
        out.append(num / _guard(den, nonnegative=nonnegative, eps=eps).unsqueeze(-1))
    return torch.stack(out, -2)


def head_output(phi_q, phi_k, v, w, b, **options):
    """``y_i = <w(x_i), u_i> + b(x_i)`` for ``u`` of :func:`kernel_attention` (same
    keyword options).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import naive
    >>> phi, v = torch.ones(1, 2, 1), torch.tensor([[[0.0], [4.0]]])
    >>> naive.head_output(phi, phi, v, torch.ones(1, 2, 1), torch.ones(1, 2), nonnegative=True)
    tensor([[3., 3.]])
    """
    return (w * kernel_attention(phi_q, phi_k, v, **options)).sum(-1) + b


def pair_readout(alpha, g, b, token_of, rows, *, nonnegative, eps=1e-3):
    """``y_i = sum_p R_ip alpha_p g_p / guard(sum_p R_ip alpha_p) + b_t(i)`` over the
    token pairs ``p`` of a dense ``R`` (shape (R, P)).

    Parameters
    ----------
    alpha, g : Tensor of shape (..., P)
    b : Tensor of shape (..., U) or None
    token_of : sequence of int of length R
    rows : Tensor of shape (R, P)
    nonnegative : bool
    eps : float, default=1e-3

    Returns
    -------
    Tensor of shape (..., R)
        The outputs ``y_i``, one per row of ``rows``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import naive
    >>> rows = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    >>> naive.pair_readout(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 4.0]), None, [0, 0],
    ...                    rows, nonnegative=True)
    tensor([3.7143, 4.0000])
    """
    out = []
    for i in range(rows.shape[0]):
        num = den = 0.0
        for p in range(rows.shape[1]):
            num = num + rows[i, p] * alpha[..., p] * g[..., p]
            den = den + rows[i, p] * alpha[..., p]
        y = num / _guard(den, nonnegative=nonnegative, eps=eps)
        out.append(y if b is None else y + b[..., int(token_of[i])])
    return torch.stack(out, -1)


def softmax_attention(q, k, v, *, scale, counts=None, causal=False):
    """``u_i = sum_j softmax_j(scale <q_i, k_j> + log c_j) v_j`` over every key ``j``
    (``causal``: ``j <= i``).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import naive
    >>> q = k = torch.zeros(1, 2, 3)
    >>> naive.softmax_attention(q, k, torch.tensor([[[0.0], [4.0]]]), scale=1.0,
    ...                         causal=True)[0, :, 0]
    tensor([0., 2.])
    """
    n = v.shape[-2]
    out = []
    for i in range(n):
        keys = range(i + 1 if causal else n)
        s = torch.stack([scale * (q[..., i, :] * k[..., j, :]).sum(-1)
                         + (0.0 if counts is None else torch.log(counts[..., j]))
                         for j in keys], -1)
        e = torch.exp(s - s.amax(-1, keepdim=True))
        weights = e / e.sum(-1, keepdim=True)
        out.append(sum(weights[..., j, None] * v[..., j, :] for j in keys))
    return torch.stack(out, -2)


def decayed_scores(q, k, log_cum):
    """``A[t, j] = sum_n q[t, n] k[j, n] exp(L[t, n] - L[j, n])`` for ``j <= t``, 0 for
    ``j > t``, for the cumulative log-decays ``L = log_cum``.

    Examples
    --------
    >>> import math, torch
    >>> from minip_learn.nn.ops import naive
    >>> log_cum = torch.tensor([[0.0], [math.log(0.5)]])
    >>> naive.decayed_scores(torch.ones(2, 1), torch.ones(2, 1), log_cum)
    tensor([[1.0000, 0.0000],
            [0.5000, 1.0000]])
    """
    n = q.shape[-2]
    zero = torch.zeros_like(q[..., 0, 0])
    rows = [torch.stack([(q[..., t, :] * k[..., j, :]
                          * torch.exp(log_cum[..., t, :] - log_cum[..., j, :])).sum(-1)
                         if j <= t else zero for j in range(n)], -1)
            for t in range(n)]
    return torch.stack(rows, -2)
