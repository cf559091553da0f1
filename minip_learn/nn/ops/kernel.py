"""Normalised kernel attention over whole sequences: explicit kernel or sketch.

With query features ``phi_Q``, key features ``phi_K``, values ``v`` and the affine
readout ``rho_x(u) = <w(x), u> + b(x)``, a head computes (see :ref:`theory-r1`)

    u_i = sum_j alpha_ij v_j / guard(sum_j alpha_ij),   alpha_ij = <phi_Q(x_i), phi_K(x_j)>,
    y_i = <w(x_i), u_i> + b(x_i),

either through the explicit ``N x N`` kernel (short sequences, :func:`is_short`) or
through the fixed-size sketch ``S = sum_j phi_K(x_j) v_j^T``, ``s = sum_j phi_K(x_j)``
(:func:`sketch`). Every function sums over keys with an optional ``counts``, the
multiplicity of every key slot of a sequence in multiset form (:func:`weight_keys`).
The quadratic reference is :func:`minip_learn.nn.ops.naive.kernel_attention`.
"""

import torch

from ._layout import back, front
from .pair import LOOP_TOKENS, pairwise_dots
from .spec import guard_denominator

__all__ = []  # public home: the package minip_learn.nn.ops


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
        Features ready for :func:`attend` (exponentiated, shifted, when ``log_domain``).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import attention_features
    >>> phi_q, phi_k = attention_features(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2),
    ...                                   log_domain=True)
    >>> phi_q[0, 0], phi_k[0, 0]
    (tensor([1., 1.]), tensor([1., 1.]))
    """
    if not log_domain:
        return (fq, fk) if mask is None else (fq * mask, fk * mask)
    # computed on (r, N, ...) views: the reductions keep the inputs' memory layout
    lq, lk = front(fq), front(fk)
    M = lk.amax(1, keepdim=True).detach()
    a = lq + M
    if mask is not None:
        mask = front(mask.reshape((1,) * (fq.ndim - mask.ndim) + tuple(mask.shape)))
        a = a + torch.log(mask)
    phi_q = torch.exp(a - a.amax(0, keepdim=True).detach())
    phi_k = torch.exp(lk - M)
    if mask is not None:
        phi_k = phi_k * mask
    return back(phi_q), back(phi_k)


def apply_rank_mask(fq, fk, mask, log_domain):
    """Rank mask on unshifted (log-)features: log-features add ``log(mask)`` on the
    query side (``-inf``: that feature's kernel terms are exact zeros), plain features
    are multiplied by it on both sides.

    Parameters
    ----------
    fq, fk : Tensor of shape (..., N, r)
    mask : Tensor of shape (r,) or None
    log_domain : bool

    Returns
    -------
    fq, fk : Tensor of shape (..., N, r)
        The (log-)features with the mask applied, not shifted.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import apply_rank_mask
    >>> apply_rank_mask(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([1.0, 0.0]),
    ...                 True)[0]
    tensor([[0., -inf]])
    """
    if mask is None:
        return fq, fk
    mask = mask.reshape((1,) * (fq.ndim - mask.ndim) + tuple(mask.shape))
    if log_domain:
        return fq + torch.log(mask), fk
    return fq * mask, fk * mask


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
        ``log alpha(q_a, k_b)`` for every pair of tokens.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import log_kernel
    >>> log_kernel(torch.zeros(1, 2), torch.zeros(1, 2)).exp()
    tensor([[2.]])
    """
    s = lq.unsqueeze(-2) + lk.unsqueeze(-3)
    if mask is not None:
        s = s + torch.log(mask).unsqueeze(-2)
    return torch.logsumexp(s, -1)


def kernel_from_log(la):
    """``exp(la - max_k la)`` per row: a log-kernel ``(..., n_q, n_k)`` exponentiated
    after the shift of each query row by its maximum (one positive constant per row).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import kernel_from_log
    >>> kernel_from_log(torch.tensor([[0.0, 2.0]])).log()
    tensor([[-2.,  0.]])
    """
    la = front(la)  # (n_k, n_q, ...)
    return back(torch.exp(la - la.amax(0, keepdim=True).detach()))


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
        ``alpha(q_a, k_b)``, up to a positive scale per query row.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import explicit_kernel
    >>> explicit_kernel(torch.ones(1, 2), torch.ones(2, 2), log_domain=False)
    tensor([[2., 2.]])
    """
    if log_domain:
        return kernel_from_log(log_kernel(fq, fk, mask))
    if mask is not None:
        fq = fq * mask
    return pairwise_dots(fq, fk)


def is_short(seq_len, rank, value_dim):
    """Whether the explicit ``N x N`` kernel is cheaper than the ``r x d`` sketch.

    The explicit form costs about ``N^2 (r + d)`` per sequence, the sketch ``N r d``
    (and many tiny matrix products); Min-IP's ``N = 3`` is short for any useful rank.

    Examples
    --------
    >>> from minip_learn.nn.ops.kernel import is_short
    >>> is_short(3, 16, 24), is_short(1000, 16, 24)
    (True, False)
    """
    return seq_len * (rank + value_dim) <= 2 * rank * value_dim


def kernel_values(alpha, v, *, nonnegative, eps=1e-3):
    """Attended values ``u_i = sum_j alpha_ij v_j / guard(sum_j alpha_ij)``.

    Parameters
    ----------
    alpha : Tensor of shape (..., N_q, N_k)
        Explicit kernel (up to a positive scale per row).
    v : Tensor of shape (..., N_k, d)
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`~minip_learn.nn.ops.spec.guard_denominator`.

    Returns
    -------
    Tensor of shape (..., N_q, d)
        Attended values ``u_i``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import kernel_values
    >>> kernel_values(torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0], [4.0]]),
    ...               nonnegative=True)
    tensor([[3.]])
    """
    den = guard_denominator(alpha.sum(-1, keepdim=True), nonnegative=nonnegative, eps=eps)
    if alpha.shape[-1] > LOOP_TOKENS:
        return (alpha @ v) / den
    # tiny matrix products are slow on CPU: sum over keys on (N_k, N_q, d, ...) views
    a, vv = front(alpha), front(v)  # (N_k, N_q, ...), (d, N_k, ...)
    num = (a.unsqueeze(2) * vv.transpose(0, 1).unsqueeze(1)).sum(0)  # (N_q, d, ...)
    return num.movedim((0, 1), (-2, -1)) / den


def kernel_readout(alpha, g, b, *, nonnegative, eps=1e-3):
    """Affine readout of the attended values, from the explicit kernel.

    ``y_i = sum_j alpha_ij g_ij / guard(sum_j alpha_ij) + b_i`` with the readout-value
    products ``g_ij = <w(x_i), v(x_j)>`` equals ``<w(x_i), u_i> + b(x_i)`` (the readout
    is linear in ``u``) without forming ``u``.

    Parameters
    ----------
    alpha, g : Tensor of shape (..., N, N)
        Kernel and readout-value products
        (:func:`~minip_learn.nn.ops.pair.pairwise_dots`).
    b : Tensor of shape (..., N)
        Readout bias ``b(x_i)``.
    nonnegative : bool
    eps : float, default=1e-3

    Returns
    -------
    Tensor of shape (..., N)
        Outputs ``y_i`` of the affine readout.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import kernel_readout
    >>> kernel_readout(torch.ones(1, 2), torch.tensor([[1.0, 3.0]]), torch.zeros(1),
    ...                nonnegative=True)
    tensor([2.])
    """
    a, g = front(alpha), front(g)  # (N_k, N_q, ...): sums over keys keep the layout
    den = guard_denominator(a.sum(0), nonnegative=nonnegative, eps=eps)
    return ((a * g).sum(0) / den).movedim(0, -1) + b


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
        ``c_j phi_K(x_j)``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import ops
    >>> ops.weight_keys(torch.ones(1, 2, 3), torch.tensor([[2.0, 0.0]]))[0]
    tensor([[2., 2., 2.],
            [0., 0., 0.]])
    """
    return phi_k if counts is None else phi_k * counts.unsqueeze(-1)


def sketch(phi_k, v):
    """Fixed-size sketch ``(S, s)``: ``S = sum_j phi_K(x_j) v_j^T`` of shape (..., r, d)
    and ``s = sum_j phi_K(x_j)`` of shape (..., r).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import sketch
    >>> S, s = sketch(torch.ones(2, 1), torch.tensor([[1.0], [2.0]]))
    >>> S, s
    (tensor([[3.]]), tensor([2.]))
    """
    return phi_k.transpose(-2, -1) @ v, phi_k.sum(-2)


def attend(phi_q, phi_k, v, *, nonnegative, eps=1e-3, counts=None):
    """Attended values ``u`` of shape (..., N, d): explicit kernel or sketch.

    Short sequences (:func:`is_short`) go through the explicit kernel
    (:func:`~minip_learn.nn.ops.pair.pairwise_dots`, :func:`kernel_values`), longer ones
    through the sketch: ``u_i = phi_Q(x_i)^T S / guard(phi_Q(x_i)^T s)``, cost
    ``O(N r d)``.

    Parameters
    ----------
    phi_q, phi_k : Tensor of shape (..., N, r)
        Features from :func:`attention_features`.
    v : Tensor of shape (..., N, d)
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`~minip_learn.nn.ops.spec.guard_denominator`.
    counts : Tensor of shape (..., N), default=None
        Multiplicity of every slot (:func:`weight_keys`); None: one per position.

    Returns
    -------
    Tensor of shape (..., N, d)
        Attended values ``u_i``, from the explicit kernel or from the sketch.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import attend
    >>> v = torch.tensor([[[0.0], [3.0], [6.0]]])
    >>> attend(torch.ones(1, 3, 2), torch.ones(1, 3, 2), v, nonnegative=True)[0, :, 0]
    tensor([3., 3., 3.])
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
        Outputs ``y_i = <w(x_i), u_i> + b(x_i)``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import head_output
    >>> phi, v = torch.ones(1, 2, 2), torch.tensor([[[0.0], [4.0]]])
    >>> head_output(phi, phi, v, torch.ones(1, 2, 1), torch.ones(1, 2), nonnegative=True)
    tensor([[3., 3.]])
    """
    phi_k = weight_keys(phi_k, counts)
    if is_short(v.shape[-2], phi_q.shape[-1], v.shape[-1]):
        return kernel_readout(pairwise_dots(phi_q, phi_k), pairwise_dots(w, v), b,
                              nonnegative=nonnegative, eps=eps)
    return affine_readout(w, b, attend(phi_q, phi_k, v, nonnegative=nonnegative, eps=eps))


def affine_readout(w, b, u):
    """``rho_x(u) = <w(x), u> + b(x)``: ``w`` and ``u`` of shape (..., d), ``b`` of
    shape (...).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops.kernel import affine_readout
    >>> affine_readout(torch.tensor([1.0, 2.0]), torch.tensor(0.5), torch.tensor([3.0, 4.0]))
    tensor(11.5000)
    """
    return (w * u).sum(-1) + b
