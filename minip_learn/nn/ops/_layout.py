"""Memory-layout views and the neutral shift shared by the attention forms."""

import torch

__all__ = ["back", "finite_or_zero", "front"]


def front(t):
    """View of ``t`` (..., A, B) as (B, A, ...).

    The arithmetic reduces over these first dimensions, so that its outputs keep the
    memory layout of its inputs: in the fused forward of
    :class:`~minip_learn.nn.HeadEnsemble` (maps stored feature-first) every product
    and sum then runs over contiguous rows of members x sequences.
    """
    return t.movedim((-1, -2), (0, 1))


def back(t):
    """Inverse of :func:`front`."""
    return t.movedim((0, 1), (-1, -2))


def finite_or_zero(t):
    """``t`` with its infinite entries replaced by 0 (a shift that is never used on
    anything but exact zeros)."""
    return torch.where(torch.isfinite(t), t, torch.zeros_like(t))
