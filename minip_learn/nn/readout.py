"""The value map ``v(x)`` and the query-dependent affine readout ``rho_x(u) = <w(x), u>
+ b(x)`` that every attention head of the library shares (:mod:`minip_learn.nn.heads`,
:mod:`minip_learn.nn.models`, the mixers)."""

import torch
from torch import nn

from .ops.kernel import affine_readout

__all__ = []  # public home: the package minip_learn.nn


class ValueMap(nn.Module):
    """Affine value map ``v(x) = V x + c`` from ``n_bits`` to ``value_dim``.

    Parameters
    ----------
    n_bits : int
        Bits per token.
    value_dim : int
        Output dimension ``d``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import ValueMap
    >>> ValueMap(4, 3)(torch.zeros(2, 5, 4)).shape
    torch.Size([2, 5, 3])
    """

    #: batched form (read by :class:`~minip_learn.nn.HeadEnsemble`): ``v = linear(x)``
    fused = "linear"

    def __init__(self, n_bits, value_dim):
        super().__init__()
        self.linear = nn.Linear(n_bits, value_dim)

    def forward(self, x):
        return self.linear(x)

    def fused_parameters(self):
        """The parameters of the batched form, by role: ``{"weight": V, "bias": c}``
        (read by :class:`~minip_learn.nn.HeadEnsemble`)."""
        return {"weight": self.linear.weight, "bias": self.linear.bias}

    @torch.no_grad()
    def set_affine(self, weight, bias):
        """Set ``v(x) = weight x + bias`` (weight of shape (value_dim, n_bits))."""
        self.linear.weight.copy_(weight)
        self.linear.bias.copy_(torch.as_tensor(bias))


class AffineReadout(nn.Module):
    """Query-dependent affine readout ``rho_x(u) = <w(x), u> + b(x)``.

    ``w(x) = W x + w_0`` and ``b(x) = <c, x> + b_0`` are affine in the query token,
    which is enough for the exact constructions of :ref:`theory-r1` to
    :ref:`theory-r3` (e.g. ``rho_x(u) = 2<x, u> - |x|``).

    Parameters
    ----------
    n_bits : int
        Bits per token.
    value_dim : int
        Dimension of the attended values ``u``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import AffineReadout
    >>> AffineReadout(4, 3)(torch.zeros(2, 5, 4), torch.zeros(2, 5, 3)).shape
    torch.Size([2, 5])
    """

    #: batched form (read by :class:`~minip_learn.nn.HeadEnsemble`):
    #: ``w = query_weight(x)``, ``b = query_bias(x)``, both linear layers
    fused = "affine"

    def __init__(self, n_bits, value_dim):
        super().__init__()
        #: the linear map ``x -> w(x)`` (``W x + w_0``)
        self.query_weight = nn.Linear(n_bits, value_dim)
        #: the linear map ``x -> b(x)`` (``<c, x> + b_0``)
        self.query_bias = nn.Linear(n_bits, 1)

    def coefficients(self, x):
        """``(w(x), b(x))`` of shapes (..., value_dim) and (...)."""
        return self.query_weight(x), self.query_bias(x).squeeze(-1)

    def fused_parameters(self):
        """The parameters of the batched form, by role (read by
        :class:`~minip_learn.nn.HeadEnsemble`): ``w(x) = weight x + weight_bias`` and
        ``b(x) = <bias, x> + bias_const``, as in :meth:`set_affine`.

        Returns
        -------
        roles : dict of str to torch.nn.Parameter
            Keys ``"weight"`` (value_dim, n_bits), ``"weight_bias"`` (value_dim,),
            ``"bias"`` (1, n_bits) and ``"bias_const"`` (1,).
        """
        return {"weight": self.query_weight.weight, "weight_bias": self.query_weight.bias,
                "bias": self.query_bias.weight, "bias_const": self.query_bias.bias}

    @torch.no_grad()
    def set_affine(self, weight, weight_bias, bias, bias_const):
        """Set ``w(x) = weight x + weight_bias`` and ``b(x) = <bias, x> + bias_const``.

        Parameters
        ----------
        weight : Tensor of shape (value_dim, n_bits)
        weight_bias : Tensor of shape (value_dim,) or float
        bias : Tensor of shape (n_bits,) or float
        bias_const : float
        """
        self.query_weight.weight.copy_(weight)
        self.query_weight.bias.copy_(torch.as_tensor(weight_bias))
        self.query_bias.weight.copy_(torch.as_tensor(bias).reshape(1, -1).expand_as(
            self.query_bias.weight))
        self.query_bias.bias.fill_(float(bias_const))

    def forward(self, x, u):
        return affine_readout(*self.coefficients(x), u)
