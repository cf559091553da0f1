"""The final-query form: the last position's query over every key of its sequence.

A final-query fit reads one output per sequence, at the last position ``N - 1``, whose
query sees every key ``j <= N - 1`` -- causal or not, the same sum. With RetNet's decay
the key ``j`` carries ``gamma^(N-1-j)``, folded into its (log-)features before the
normalisation's shift. The cost is that of one query: ``O(N r d)`` per sequence, no
``N x N`` tensor. Equal to the last position of :func:`~minip_learn.nn.ops.kernel.attend`
(non-causal) and of :func:`~minip_learn.nn.ops.chunk.causal_attend` (causal) up to
rounding; the reference is :func:`~minip_learn.nn.ops.naive.kernel_attention`.
"""

import torch

from .kernel import affine_readout, attend, attention_features
from .masks import log_decay

__all__ = []  # public home: the package minip_learn.nn.ops


def _last_features(fq, fk, *, decay, log_domain, mask):
    """The last query's features ``(..., 1, r)`` and the decayed key features
    ``(..., N, r)``, shifted and masked (:func:`attention_features`)."""
    lg = log_decay(decay)
    if lg != 0.0:
        n = fk.shape[-2]
        age = torch.arange(n - 1, -1, -1, dtype=fk.dtype, device=fk.device) * lg
        fk = fk + age[:, None] if log_domain else fk * torch.exp(age)[:, None]
    return attention_features(fq[..., -1:, :], fk, log_domain=log_domain, mask=mask)


def last_attend(fq, fk, v, *, nonnegative, eps=1e-3, decay=None, log_domain=False, mask=None):
    """The attended value at the last position, ``u_{N-1}``, of shape (..., d).

    Parameters
    ----------
    fq, fk : Tensor of shape (..., N, r)
        Query and key (log-)features of every position, positions already applied
        (only the last query is read).
    v : Tensor of shape (..., N, d)
    nonnegative : bool
    eps : float, default=1e-3
        As in :func:`~minip_learn.nn.ops.spec.guard_denominator`.
    decay : float in (0, 1] or None, default=None
        RetNet's ``gamma``: key ``j`` weighted by ``gamma^(N-1-j)``.
    log_domain : bool, default=False
        Whether ``fq`` and ``fk`` are log-features.
    mask : Tensor of shape (r,), default=None
        Rank mask (:func:`~minip_learn.nn.ops.kernel.attention_features`).

    Returns
    -------
    Tensor of shape (..., d)

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn.ops import causal_attend
    >>> from minip_learn.nn.ops.last import last_attend
    >>> phi = torch.rand(2, 5, 3, dtype=torch.float64)
    >>> v = torch.rand(2, 5, 4, dtype=torch.float64)
    >>> full = causal_attend(phi, phi, v, nonnegative=True, decay=0.9)
    >>> torch.allclose(last_attend(phi, phi, v, nonnegative=True, decay=0.9), full[:, -1])
    True
    """
    phi_q, phi_k = _last_features(fq, fk, decay=decay, log_domain=log_domain, mask=mask)
    return attend(phi_q, phi_k, v, nonnegative=nonnegative, eps=eps)[..., 0, :]


def last_head_output(fq, fk, v, w, b, *, nonnegative, eps=1e-3, decay=None,
                     log_domain=False, mask=None):
    """The output at the last position, ``y_{N-1} = <w(x_{N-1}), u_{N-1}> + b(x_{N-1})``.

    Parameters
    ----------
    fq, fk, v, nonnegative, eps, decay, log_domain, mask
        As in :func:`last_attend`.
    w : Tensor of shape (..., N, d) or (..., 1, d)
        Readout weights (only the last row is read).
    b : Tensor of shape (..., N) or (..., 1)
        Readout bias (only the last entry is read).

    Returns
    -------
    Tensor of shape (..., 1)
        The last position's output, its position axis kept.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn.ops import causal_head_output, last_head_output
    >>> phi = torch.rand(2, 5, 3, dtype=torch.float64)
    >>> v = torch.rand(2, 5, 4, dtype=torch.float64)
    >>> w, b = torch.rand(2, 5, 4, dtype=torch.float64), torch.rand(2, 5, dtype=torch.float64)
    >>> full = causal_head_output(phi, phi, v, w, b, nonnegative=True)
    >>> last = last_head_output(phi, phi, v, w, b, nonnegative=True)
    >>> last.shape, torch.allclose(last[:, 0], full[:, -1])
    (torch.Size([2, 1]), True)
    """
    u = last_attend(fq, fk, v, nonnegative=nonnegative, eps=eps, decay=decay,
                    log_domain=log_domain, mask=mask)
    return affine_readout(w[..., -1, :], b[..., -1], u).unsqueeze(-1)
