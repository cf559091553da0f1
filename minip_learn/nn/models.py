"""Kernel-attention models *beyond* the single head of the theorem.

See :ref:`theory-r7` and :ref:`theory-r8`.

The lower bound (:ref:`theory-r4`, :ref:`theory-r5`) covers one normalised nonnegative
kernel head with a query-dependent **affine** readout. The modules here relax each of
those assumptions so that the loopholes can be measured on the same witness families:

* several heads per layer (``n_heads``) and several layers (``n_layers``) with a
  residual token stream between them;
* nonlinear readouts: an MLP readout ``rho(x, u) = MLP([x, u])``
  (:class:`MLPReadout`) and class logits for an argmax classifier (``n_outputs``);
* signed kernels come from the feature maps (``identity``, ``rff``; see
  :mod:`minip_learn.nn.feature_maps`).

A model is covered by the theorem only when ``theorem_applies`` is True: a single head,
a single layer, an affine scalar readout and a nonnegative kernel. With
``n_heads=1, n_layers=1, readout="affine"`` and no class logits,
:class:`KernelAttentionModel` computes exactly what :class:`KernelAttentionHead` computes
(same parameters, same arithmetic).
"""

import torch
from torch import nn

from .._validation import check_params
from ._registry import RecordsArguments
from .feature_maps import get_feature_map
from .heads import KernelAttentionHead
from .ops import affine_readout
from .readout import AffineReadout

__all__ = []  # public home: the package minip_learn.nn

_READOUTS = ("affine", "mlp")


class MLPReadout(nn.Module):
    """Nonlinear readout ``rho(x, u) = MLP([x, u])``: **outside the theorem**.

    The lower bound (:ref:`theory-r4`) needs a readout affine in the attended value
    ``u`` (the query output is then a weighted mean of per-key scalars); an MLP of the
    query token and ``u`` breaks that, so models using it are labelled
    ``theorem_applies = False`` (:ref:`theory-r7`).

    Parameters
    ----------
    n_bits : int
        Dimension of the query representation ``x``.
    value_dim : int
        Dimension of the attended values ``u``.
    width : int, default=64
        Hidden width.
    depth : int, default=2
        Number of hidden layers (GELU).
    n_outputs : int or None, default=None
        ``None``: one real output per position, shape (..., seq_len); an int: that many
        outputs (class logits), shape (..., seq_len, n_outputs).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import MLPReadout
    >>> MLPReadout(4, 3)(torch.zeros(2, 5, 4), torch.zeros(2, 5, 3)).shape
    torch.Size([2, 5])
    >>> MLPReadout(4, 3, n_outputs=5)(torch.zeros(2, 5, 4), torch.zeros(2, 5, 3)).shape
    torch.Size([2, 5, 5])
    """

    def __init__(self, n_bits, value_dim, *, width=64, depth=2, n_outputs=None):
        super().__init__()
        self.n_outputs = n_outputs
        layers, d = [], n_bits + value_dim
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.GELU()]
            d = width
        layers.append(nn.Linear(d, 1 if n_outputs is None else n_outputs))
        self.net = nn.Sequential(*layers)

    def forward(self, x, u):
        out = self.net(torch.cat([x, u], dim=-1))
        return out.squeeze(-1) if self.n_outputs is None else out


class _AffineClassReadout(nn.Module):
    """One query-dependent affine readout per class: ``<W_c x + w_c, u> + b_c(x)``."""

    def __init__(self, n_bits, value_dim, n_outputs):
        super().__init__()
        self.n_outputs = n_outputs
        self.value_dim = value_dim
        self.weight = nn.Linear(n_bits, value_dim * n_outputs)
        self.bias = nn.Linear(n_bits, n_outputs)

    def forward(self, x, u):
        w = self.weight(x).unflatten(-1, (self.n_outputs, self.value_dim))
        return affine_readout(w, self.bias(x), u.unsqueeze(-2))


class KernelAttentionModel(RecordsArguments, nn.Module):
    """Several kernel-attention heads and layers, with an affine or MLP readout.

    Layer ``l`` runs ``n_heads`` normalised kernel heads (each a
    :class:`KernelAttentionHead` sketch of rank ``rank`` without its readout) on the
    token stream ``t^(l-1)`` (``t^(0) = x``, the bits) and concatenates their attended
    values ``u^(l)`` (dimension ``n_heads * value_dim``). Between layers the stream is
    residual, ``t^(l) = t^(l-1) + O_l u^(l)`` with a learnable ``O_l`` (the stream keeps
    ``n_bits`` dimensions). The output at position ``i`` is the readout of the last
    layer, ``rho(t_i^(L-1), u_i^(L))``: query-dependent affine (as in :ref:`theory`, one
    per class when ``n_outputs`` is set) or an :class:`MLPReadout`.

    **Outside the theorem** unless ``theorem_applies`` (one head, one layer, affine
    scalar readout, nonnegative kernel): :ref:`theory-r4` and :ref:`theory-r5` say
    nothing about the other configurations (:ref:`theory-r7`), and :ref:`theory-r8`
    bounds them only through the channel capacity
    ``n_heads x n_layers x rank x bits`` (see
    :func:`minip_learn.theory.model_channel_capacity`).

    Parameters
    ----------
    n_bits : int
        Bits per token ``m``.
    rank : int
        Feature rank ``r`` of every head.
    n_heads : int, default=1
        Heads per layer.
    n_layers : int, default=1
        Number of layers.
    readout : {"affine", "mlp"}, default="affine"
        Final readout.
    readout_width : int, default=64
        Hidden width of the MLP readout (ignored for ``"affine"``).
    n_outputs : int or None, default=None
        ``None``: one real output per position; an int: that many logits per position
        (for an argmax classifier -- outside the theorem).
    **head_options
        Options of every head, passed to :class:`KernelAttentionHead` (whose defaults
        apply): ``feature_map``, ``value_dim``, ``feature_width``, ``feature_depth``,
        ``shared_features``, ``feature_kwargs``, ``denominator_eps``, ``causal``,
        ``positional``, ``decay``, ``max_len`` (every layer then attends causally, or
        with its own positional maps; the residual stream is per token, so a causal
        model's output at ``i`` depends on the tokens up to ``i`` only).
        ``feature_map="table"`` needs ``n_layers=1`` (a table is defined on the token
        bits only).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import KernelAttentionModel
    >>> model = KernelAttentionModel(6, rank=4, n_heads=2, n_layers=2, readout="mlp")
    >>> model(torch.zeros(3, 5, 6)).shape, model.theorem_applies
    (torch.Size([3, 5]), False)
    >>> KernelAttentionModel(6, rank=4).theorem_applies   # one elu+1 head, affine
    True
    """

    def __init__(
        self,
        n_bits,
        rank,
        *,
        n_heads=1,
        n_layers=1,
        readout="affine",
        readout_width=64,
        n_outputs=None,
        **head_options,
    ):
        super().__init__()
        checked = check_params(
            dict(readout=readout, n_heads=n_heads, n_layers=n_layers, rank=rank),
            {"readout": ("choice", {"options": _READOUTS}), "n_heads": ("int", {"min": 1}),
             "n_layers": ("int", {"min": 1}), "rank": ("int", {"min": 1})})
        n_heads, n_layers, rank = checked["n_heads"], checked["n_layers"], checked["rank"]
        feature_map = head_options.get("feature_map")  # None: the head's default map
        if (n_layers > 1 and feature_map is not None
                and get_feature_map(feature_map).requires_vocabulary):
            raise ValueError(
                f"feature_map={feature_map!r} is defined on the token bits only and needs "
                f"n_layers=1; got n_layers={n_layers}."
            )
        self.n_bits = n_bits
        self.rank = rank
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.readout_kind = readout
        self.n_outputs = n_outputs
        self.layers = nn.ModuleList()
        for _ in range(n_layers):
            heads = nn.ModuleList()
            for _ in range(n_heads):
                head = KernelAttentionHead(n_bits, rank, **head_options)
                head.readout = None  # the model has one readout, after the last layer
                heads.append(head)
            self.layers.append(heads)
        self.value_dim = self.layers[0][0].value_dim
        u_dim = n_heads * self.value_dim
        self.mixers = nn.ModuleList(nn.Linear(u_dim, n_bits) for _ in range(n_layers - 1))
        if readout == "mlp":
            self.readout = MLPReadout(n_bits, u_dim, width=readout_width, n_outputs=n_outputs)
        elif n_outputs is None:
            self.readout = AffineReadout(n_bits, u_dim)
        else:
            self.readout = _AffineClassReadout(n_bits, u_dim, n_outputs)

    @property
    def heads(self):
        """All heads, layer by layer (a flat list of :class:`KernelAttentionHead`)."""
        return [head for layer in self.layers for head in layer]

    @property
    def nonnegative(self):
        """Whether every head's kernel is nonnegative by construction."""
        return all(head.nonnegative for head in self.heads)

    @property
    def single_head(self):
        """The head when the model is one head, one layer and an affine scalar readout
        (the model of the theorem, whatever its kernel); None otherwise."""
        if (self.n_heads, self.n_layers, self.readout_kind, self.n_outputs) == (
                1, 1, "affine", None):
            return self.heads[0]
        return None

    @property
    def causal(self):
        """Whether the heads attend causally (position ``i`` to ``j <= i``)."""
        return self.heads[0].causal

    @property
    def positional(self):
        """The heads' positional map (None, ``"decay"`` or ``"learned"``)."""
        return self.heads[0].positional

    @property
    def ordered(self):
        """Whether the outputs depend on the order of the tokens (causal or positional
        heads)."""
        return self.heads[0].ordered

    @property
    def theorem(self):
        """``"yes"``, ``"positional"`` or ``"no"``: that of the single head
        (:attr:`KernelAttentionHead.theorem
        <minip_learn.nn.KernelAttentionHead.theorem>`), ``"no"`` for every other
        configuration."""
        head = self.single_head
        return "no" if head is None else head.theorem

    @property
    def theorem_applies(self):
        """Whether the lower bound (:ref:`theory-r4`, :ref:`theory-r5`) as proved in this
        library covers this model: one nonnegative head with positionless maps (causal
        or not), one layer and an affine scalar readout. Everything else is a variant
        outside the theorem (:ref:`theory-r7`)."""
        return self.theorem == "yes"

    def forward(self, x, counts=None, *, last=False):
        """Outputs of shape (..., seq_len) (or (..., seq_len, n_outputs)).

        ``counts`` (shape (..., seq_len)): the multiplicity of every slot of sequences in
        multiset form (see :mod:`minip_learn.nn.heads`); every layer sees a sequence only
        through its multiset (the residual stream is per token), so the output at a
        slot is that of every position of its token. None: one per position. Causal
        and positional heads take no ``counts`` (a ValueError). ``last=True``: the
        output at the last position only (shape (..., 1) or (..., 1, n_outputs)); the
        last layer attends with that position's query alone.
        """
        t = x
        for index, layer in enumerate(self.layers):
            final = index == self.n_layers - 1
            if final and len(layer) == 1 and isinstance(self.readout, AffineReadout):
                # one head read out affinely: the head's own output arithmetic
                return layer[0].output(t, self.readout, counts, last=last)
            if final and last:
                if counts is not None:
                    raise ValueError("last=True reads the output at the last position, "
                                     "which sequences in multiset form (counts) do not have.")
                u = torch.cat([head.attend_last(t) for head in layer], dim=-1)
                return self.readout(t[..., -1:, :], u[..., None, :])
            u = torch.cat([head.attend(t, counts) for head in layer], dim=-1)
            if not final:
                t = t + self.mixers[index](u)
        return self.readout(t, u)

    def extra_repr(self):
        return (
            f"n_bits={self.n_bits}, rank={self.rank}, n_heads={self.n_heads}, "
            f"n_layers={self.n_layers}, readout={self.readout_kind!r}, "
            f"n_outputs={self.n_outputs}"
        )
