"""The options of an attention form, one frozen object, and the denominator guard.

Normalised kernel attention divides ``sum_j alpha_ij v_j`` by a guarded
``sum_j alpha_ij`` (:func:`guard_denominator`); whether the kernel is nonnegative, the
clamp ``eps`` of signed denominators, whether the features are log-features and the
causal decay travel together as an :class:`AttentionSpec`. The public functions of
:mod:`minip_learn.nn.attention` keep their keyword arguments and build the spec; the
forms of :mod:`minip_learn.nn.ops` take it whole.
"""

from dataclasses import dataclass, field

import torch

from .masks import log_decay

__all__ = []  # public home: the package minip_learn.nn.ops


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
    >>> from minip_learn.nn.ops import guard_denominator
    >>> guard_denominator(torch.tensor([-2.0, 0.0, 1e-6]), nonnegative=False, eps=0.1)
    tensor([-2.0000,  0.1000,  0.1000])
    """
    if nonnegative:
        return torch.where(den > 0, den, 1.0)
    sign = torch.where(den < 0, -torch.ones_like(den), torch.ones_like(den))
    return sign * den.abs().clamp_min(eps)


@dataclass(frozen=True)
class AttentionSpec:
    """What an attention form needs to know besides its tensors.

    Parameters
    ----------
    nonnegative : bool
        Whether the kernel is nonnegative by construction (:func:`guard_denominator`).
    eps : float, default=1e-3
        Clamp of signed denominators.
    log_domain : bool, default=False
        Whether the features are log-features (exponentiated after shifts that cancel
        in the normalisation).
    decay : float in (0, 1] or None, default=None
        Causal decay ``gamma``: the kernel of query ``i`` and key ``j <= i`` is
        multiplied by ``gamma^(i-j)``; None for none.

    Attributes
    ----------
    log_gamma : float
        ``log gamma`` (0.0 without decay, :func:`~minip_learn.nn.ops.masks.log_decay`).

    Raises
    ------
    ValueError
        When ``decay`` lies outside ``(0, 1]`` (:func:`~minip_learn.nn.ops.masks.log_decay`).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn.ops import AttentionSpec
    >>> spec = AttentionSpec(nonnegative=True, decay=1.0)
    >>> spec.log_gamma, spec.guard(torch.tensor([0.0, 2.0]))
    (0.0, tensor([1., 2.]))
    """

    nonnegative: bool
    eps: float = 1e-3
    log_domain: bool = False
    decay: float | None = None
    log_gamma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "log_gamma", log_decay(self.decay))

    def guard(self, den):
        """:func:`guard_denominator` of ``den`` with this spec's ``nonnegative`` and ``eps``.

        Parameters
        ----------
        den : Tensor

        Returns
        -------
        Tensor like ``den``
        """
        return guard_denominator(den, nonnegative=self.nonnegative, eps=self.eps)
