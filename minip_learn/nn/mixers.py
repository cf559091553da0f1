"""Sequence mixers: causal token mixers with a declared state size, selected by name.

A *mixer* maps a batch of float token sequences of shape ``(batch, N, n_bits)`` to one
real output per position, shape ``(batch, N)``; the output at position ``i`` depends on
the tokens ``x_1 .. x_i`` only. It is built as ``mixer(n_bits, state_size, **kwargs)``,
where ``state_size`` is its key (state) dimension ``r``. Every built-in mixer reads a
value map ``v(x)`` (:class:`~minip_learn.nn.ValueMap`, value dimension ``d``, default
``n_bits``) and ends with the query-dependent affine readout
``y_i = rho_{x_i}(u_i) = <w(x_i), u_i> + b(x_i)``
(:class:`~minip_learn.nn.AffineReadout`) of a mixed vector ``u_i`` of dimension ``d``.

Each built-in computes ``u`` in two ways that agree to rounding (the tests check it):
:meth:`Mixer.attend` over the whole sequence at once (a masked ``N x N`` form), and
:meth:`Mixer.attend_recurrent`, a loop over the tokens that carries a fixed-size state
from one token to the next (a cache that grows with the tokens, for softmax).
:meth:`Mixer.state_floats` says how many floats that state holds, per sequence.

The recurrences, with ``q_t``, ``k_t`` in ``R^r`` and ``v_t`` in ``R^d`` computed from
the token ``x_t`` (``S_0 = 0``):

``"kernel"`` -- causal normalised kernel attention (:class:`KernelMixer`)
    ``S_t = S_{t-1} + phi_K(x_t) v_t^T``, ``s_t = s_{t-1} + phi_K(x_t)``,
    ``u_t = S_t^T phi_Q(x_t) / phi_Q(x_t)^T s_t`` with nonnegative features of
    dimension ``r``. State ``r (d + 1)`` floats (``r`` more for log-domain maps such as
    ``exp``: the running maximum of the key log-features). The lower bound covers it
    (when the kernel is nonnegative).
``"retnet"`` -- normalised decayed attention, RetNet-style (:class:`RetNetMixer`)
    ``S_t = g S_{t-1} + phi_K(x_t) v_t^T``, ``s_t = g s_{t-1} + phi_K(x_t)``, ``u_t`` as
    for ``"kernel"``: the positional map ``phi_Q(x, i) = g^i phi(x)``,
    ``phi_K(x, j) = g^{-j} phi(x)``. State ``r (d + 1)``. Covered on final-query
    families that hold every order of their keys (``theorem = "positional"``).
``"positional"`` -- normalised kernel attention with learned positional weights
(:class:`PositionalKernelMixer`)
    as ``"kernel"`` with ``phi_Q(x, i) = exp(a_i) * phi(x)``, ``phi_K(x, j) = exp(b_j) *
    phi(x)`` (learned ``a_i``, ``b_j`` in ``R^r`` per position). State ``r (d + 1)``.
    Covered as ``"retnet"`` is.
``"linear"`` -- unnormalised linear attention (:class:`LinearAttentionMixer`)
    ``S_t = S_{t-1} + phi(k_t) v_t^T``, ``u_t = S_t^T phi(q_t)``. State ``r d``. Outside
    the theorem: its normaliser is part of the theorem's hypothesis.
``"gla"`` -- gated linear attention (:class:`GatedLinearAttentionMixer`)
    ``S_t = diag(alpha_t) S_{t-1} + k_t v_t^T``, ``u_t = S_t^T q_t`` with data-dependent
    gates ``alpha_t = sigmoid(W_a x_t + c_a)^(1 / gate_temperature)`` in ``(0, 1)^r``.
    State ``r d``. Outside the theorem.
``"deltanet"`` -- the delta rule (:class:`DeltaNetMixer`)
    ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, ``u_t = S_t^T q_t`` with
    L2-normalised ``q_t``, ``k_t`` and ``beta_t = sigmoid(<w_b, x_t> + c_b)``. State
    ``r d``. Outside the theorem.
``"mamba"`` -- a diagonal selective state-space model (:class:`MambaMixer`)
    per channel ``c`` of ``v_t`` (``d`` channels), a state ``h_t[c] in R^r``:
    ``h_t[c] = exp(Delta_t[c] A[c]) * h_{t-1}[c] + Delta_t[c] B_t v_t[c]``,
    ``u_t[c] = <C_t, h_t[c]> + D[c] v_t[c]`` with ``Delta_t = softplus(W_D x_t + c_D)``,
    ``A = -exp(A_log)`` (``d x r``, learned), ``B_t = W_B x_t`` and ``C_t = W_C x_t``.
    State ``d r``. Outside the theorem.
``"softmax"`` -- causal softmax attention (:class:`SoftmaxMixer`)
    ``u_t = sum_{j <= t} softmax_j(q_t^T k_j / tau) v_j``: the recurrent form keeps every
    key and value seen so far, ``N (r + d)`` floats after ``N`` tokens (grows with
    ``N``). Outside the theorem.

The registry is the single place that maps names to classes, as the registry of feature
maps (:mod:`minip_learn.nn.feature_maps`): :func:`available_mixers` lists the names,
:func:`mixer_table` the declarations, :func:`get_mixer` resolves a ``mixer=`` value and
:func:`make_mixer` builds one. Besides a registered name, ``mixer=`` takes a
:class:`Mixer` subclass (its declarations are used as they are) or a user's mixer: any
:class:`torch.nn.Module` class or factory called as
``mixer(n_bits, state_size, **kwargs)`` that maps ``(batch, N, n_bits)`` to
``(batch, N)``. Such a mixer declares nothing: it is wrapped in :class:`UserMixer`,
whose ``theorem`` and ``state_floats`` are None, and :func:`check_mixer_output` checks
what it returns. No scikit-learn in this layer.
"""

import math

import numpy as np
import torch
from torch import nn

from . import attention
from .feature_maps import get_feature_map, make_feature_map
from .heads import AffineReadout, KernelAttentionHead, SoftmaxAttentionHead, ValueMap

__all__ = [
    "DeltaNetMixer",
    "GatedLinearAttentionMixer",
    "KernelMixer",
    "LinearAttentionMixer",
    "MambaMixer",
    "Mixer",
    "RetNetMixer",
    "SoftmaxMixer",
    "UserMixer",
    "available_mixers",
    "check_mixer_output",
    "get_mixer",
    "make_mixer",
    "mixer_table",
    "register_mixer",
]

_REGISTRY = {}

#: The values of a mixer's ``theorem`` declaration: the lower bound is proved for it on
#: every family, on final-query families that hold every order of their keys
#: (position-dependent maps), or it is outside the bound.
THEOREM_VALUES = ("yes", "positional", "no")


def register_mixer(name):
    """Class decorator adding a :class:`Mixer` subclass to the registry.

    Parameters
    ----------
    name : str
        Registry name (must be new); the class gets it as ``name``. The class must
        declare ``theorem`` as one of ``"yes"``, ``"positional"``, ``"no"``.

    Returns
    -------
    decorator : callable

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import Mixer, make_mixer, register_mixer
    >>> @register_mixer("doc-mean")
    ... class Mean(Mixer):
    ...     theorem = "no"
    ...     paper = "none: a documentation example"
    ...     state_formula = "d"
    ...     def __init__(self, n_bits, state_size, *, value_dim=None):
    ...         super().__init__(n_bits, state_size, value_dim=value_dim)
    ...     def attend(self, x):
    ...         v = self.value(x)
    ...         return v.cumsum(1) / torch.arange(1, x.shape[1] + 1).to(v)[:, None]
    ...     def initial_state(self, batch, *, dtype, device):
    ...         return (torch.zeros(batch, self.value_dim, dtype=dtype, device=device),
    ...                 torch.zeros(batch, 1, dtype=dtype, device=device))
    ...     def step(self, state, x_t, position=0):
    ...         total, count = state[0] + self.value(x_t), state[1] + 1
    ...         return (total, count), total / count
    ...     def state_floats(self, seq_len=None):
    ...         return self.value_dim + 1
    >>> mixer = make_mixer("doc-mean", 4, 1)
    >>> x = torch.rand(2, 5, 4)
    >>> mixer(x).shape, torch.allclose(mixer(x), mixer.recurrent(x))
    (torch.Size([2, 5]), True)
    >>> from minip_learn.nn.mixers import _REGISTRY
    >>> del _REGISTRY["doc-mean"]  # keep the registry as it was
    """

    def decorator(cls):
        if name in _REGISTRY:
            raise ValueError(f"mixer {name!r} is already registered")
        if cls.theorem not in THEOREM_VALUES:
            raise ValueError(
                f"mixer {name!r} must declare theorem as one of {THEOREM_VALUES}; got "
                f"{cls.theorem!r}."
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def available_mixers(*, theorem=None):
    """Names of the registered mixers, sorted.

    Parameters
    ----------
    theorem : {"yes", "positional", "no"} or None, default=None
        If given, only mixers whose ``theorem`` declaration equals it.

    Returns
    -------
    names : list of str

    Examples
    --------
    >>> from minip_learn.nn import available_mixers
    >>> available_mixers()
    ['deltanet', 'gla', 'kernel', 'linear', 'mamba', 'positional', 'retnet', 'softmax']
    >>> available_mixers(theorem="yes")
    ['kernel']
    """
    return sorted(
        name for name, cls in _REGISTRY.items()
        if theorem is None or cls.theorem == theorem
    )


def mixer_table():
    """The registry as a table: one row per registered mixer, sorted by name.

    Returns
    -------
    rows : list of dict
        In the order of :func:`available_mixers`, one dict per mixer with keys
        ``"name"``, ``"theorem"`` (``"yes"``: the lower bound covers it;
        ``"positional"``: it covers it on final-query families in every order of their
        keys; ``"no"``: outside the bound),
        ``"paper"`` (the source the mixer follows), ``"state"`` (the formula of the
        floats its recurrent form carries between tokens, in ``r = state_size``,
        ``d = value_dim`` and ``N`` the tokens seen) and ``"class"`` (the qualified name
        of the class).

    Examples
    --------
    >>> from minip_learn.nn import mixer_table
    >>> row = next(row for row in mixer_table() if row["name"] == "kernel")
    >>> row["theorem"], row["state"]
    ('yes', 'r (d + 1)')
    """
    rows = []
    for name in available_mixers():
        cls = _REGISTRY[name]
        rows.append({
            "name": name,
            "theorem": cls.theorem,
            "paper": cls.paper,
            "state": cls.state_formula,
            "class": f"{cls.__module__}.{cls.__qualname__}",
        })
    return rows


def get_mixer(value):
    """Return the mixer class that ``mixer=value`` builds.

    Parameters
    ----------
    value : str, Mixer subclass or callable
        A registered name, a :class:`Mixer` subclass (returned as is), or a user's mixer:
        a :class:`torch.nn.Module` class or any factory called as
        ``value(n_bits, state_size, **kwargs)``, for which :class:`UserMixer` (the
        wrapper :func:`make_mixer` puts around it) is returned.

    Returns
    -------
    cls : Mixer subclass
        Its class attributes are the mixer's declarations (``theorem``, ``paper``,
        ``state_formula``).

    Raises
    ------
    ValueError
        If ``value`` is an unknown name (the message lists the valid names) or neither a
        name nor callable.

    Examples
    --------
    >>> from torch import nn
    >>> from minip_learn.nn import get_mixer
    >>> get_mixer("gla").theorem
    'no'
    >>> get_mixer(nn.Linear).__name__, get_mixer(nn.Linear).theorem is None
    ('UserMixer', True)
    """
    if isinstance(value, type) and issubclass(value, Mixer):
        return value
    if isinstance(value, str):
        if value in _REGISTRY:
            return _REGISTRY[value]
    elif callable(value):
        return UserMixer
    raise ValueError(
        f"Unknown mixer {value!r}; valid names are {available_mixers()}, or pass a Mixer "
        "subclass or a torch.nn.Module class called as "
        "mixer(n_bits, state_size, **mixer_kwargs)."
    )


def mixer_name(value):
    """Readable name of a ``mixer=`` value, for messages and tables.

    Examples
    --------
    >>> from torch import nn
    >>> from minip_learn.nn.mixers import mixer_name
    >>> mixer_name("gla"), mixer_name(nn.Linear)
    ('gla', 'torch.nn.modules.linear.Linear')
    """
    if isinstance(value, str):
        return value
    if isinstance(value, type) and issubclass(value, Mixer) and value.name is not None:
        return value.name
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None) or repr(value)
    return f"{module}.{qualname}" if module else qualname


def make_mixer(mixer, n_bits, state_size, **kwargs):
    """Build the mixer ``mixer`` on ``n_bits`` inputs with state dimension ``state_size``.

    Parameters
    ----------
    mixer : str, Mixer subclass or callable
        As in :func:`get_mixer`; a user's module class or factory is called as
        ``mixer(n_bits, state_size, **kwargs)`` and wrapped in :class:`UserMixer`.
    n_bits, state_size : int
        Bits per token and the mixer's key (state) dimension ``r``.
    **kwargs
        Options of the mixer class (``value_dim``, ``feature_map``, ``gate_temperature``
        ...).

    Returns
    -------
    Mixer

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("gla", n_bits=6, state_size=4)
    >>> mixer(torch.ones(2, 5, 6)).shape, mixer.state_floats()
    (torch.Size([2, 5]), 24)
    """
    cls = get_mixer(mixer)
    if cls is UserMixer and mixer is not UserMixer:
        return UserMixer(n_bits, state_size, factory=mixer, **kwargs)
    return cls(n_bits, state_size, **kwargs)


def check_mixer_output(module, x, name):
    """Check that ``module`` maps the tokens ``x`` to finite outputs of shape
    ``(batch, seq_len)``: a clear ValueError naming the mixer otherwise.

    Parameters
    ----------
    module : torch.nn.Module
        The mixer (e.g. from :func:`make_mixer`).
    x : Tensor of shape (batch, seq_len, n_bits)
        A few sequences (e.g. the first training sequences).
    name : str, Mixer subclass or callable
        The ``mixer=`` value, named in the message.

    Raises
    ------
    ValueError
        If the module raises on ``x``, returns something other than a tensor, a tensor
        of another shape, or NaN or infinite values.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import check_mixer_output, make_mixer
    >>> check_mixer_output(make_mixer("linear", 4, 2), torch.zeros(3, 5, 4), "linear")
    >>> def per_token(n_bits, state_size):
    ...     return torch.nn.Linear(n_bits, 1)  # (batch, N, 1): one dimension too many
    >>> check_mixer_output(make_mixer(per_token, 4, 2), torch.zeros(3, 5, 4), "my mixer")
    Traceback (most recent call last):
    ...
    ValueError: mixer='my mixer' must map tokens of shape (batch, seq_len, n_bits) to ...
    """  # noqa: E501
    label = mixer_name(name)
    expected = tuple(x.shape[:2])
    try:
        with torch.no_grad():
            out = module(x)
    except Exception as exc:  # a user's module may raise anything: name the mixer
        raise ValueError(
            f"mixer={label!r} fails on tokens of shape {tuple(x.shape)} (batch, seq_len, "
            f"n_bits): {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(out, torch.Tensor):
        raise ValueError(
            f"mixer={label!r} must return a torch.Tensor of outputs; got "
            f"{type(out).__name__}."
        )
    if tuple(out.shape) != expected:
        raise ValueError(
            f"mixer={label!r} must map tokens of shape (batch, seq_len, n_bits) to outputs "
            f"of shape (batch, seq_len) = {expected}; got shape {tuple(out.shape)}."
        )
    bad = ~torch.isfinite(out)
    if bad.any():
        raise ValueError(
            f"mixer={label!r} returns NaN or infinite outputs on "
            f"{int(bad.any(-1).sum())} of the {expected[0]} sequences."
        )


class Mixer(nn.Module):
    """Base class of the built-in mixers: ``y_i = rho_{x_i}(u_i)`` for a causal ``u``.

    A subclass computes the mixed vectors ``u`` of shape (batch, seq_len, value_dim) in
    two ways that must agree: :meth:`attend` over the whole sequence, and
    :meth:`step`, one token at a time from a fixed-size state built by
    :meth:`initial_state` (read by :meth:`attend_recurrent`). It declares the floats of
    that state (:meth:`state_floats`) and, as class attributes, ``theorem``, ``paper``
    and ``state_formula``.

    Parameters
    ----------
    n_bits : int
        Bits per token ``m``.
    state_size : int
        The key (state) dimension ``r``.
    value_dim : int, default=None
        Dimension ``d`` of the value map and of ``u``; None means ``n_bits``.

    Attributes
    ----------
    value : ValueMap
        ``v(x)``, from ``n_bits`` to ``value_dim``.
    readout : AffineReadout
        ``rho_x(u) = <w(x), u> + b(x)``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("deltanet", 5, 3).double()
    >>> x = torch.rand(2, 7, 5, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x))
    True
    >>> mixer.theorem, mixer.state_floats()
    ('no', 15)
    """

    name = None
    #: whether the lower bound covers the mixer: "yes", "positional" (on final-query
    #: families that hold every order of their keys) or "no"
    theorem = None
    #: the paper (or source) the mixer follows
    paper = None
    #: the floats carried between tokens, as a formula in r, d (and N)
    state_formula = None

    def __init__(self, n_bits, state_size, *, value_dim=None):
        super().__init__()
        self.n_bits = int(n_bits)
        self.state_size = int(state_size)
        self.value_dim = self.n_bits if value_dim is None else int(value_dim)
        self.value = ValueMap(self.n_bits, self.value_dim)
        self.readout = AffineReadout(self.n_bits, self.value_dim)

    @classmethod
    def data_kwargs(cls, X, **kwargs):
        """Keyword arguments the mixer takes from its training data, given its other
        keyword arguments ``kwargs`` (none by default).

        Parameters
        ----------
        X : ndarray of shape (n_sequences, seq_len, n_bits)
            The training sequences.
        **kwargs
            The mixer's keyword arguments as given.

        Returns
        -------
        dict
            Keyword arguments to add (e.g. the ``table`` feature map's ``vocabulary``).
        """
        return {}

    def attend(self, x):
        """Mixed vectors ``u`` of shape (batch, seq_len, value_dim), whole-sequence form."""
        raise NotImplementedError

    def initial_state(self, batch, *, dtype, device):
        """The state before the first token: a tuple of zero tensors, batch first."""
        raise NotImplementedError

    def step(self, state, x_t, position=0):
        """One token ``x_t`` (batch, n_bits) at ``position`` (0-based; read by mixers
        with positional maps): returns ``(new_state, u_t)``."""
        raise NotImplementedError

    def state_floats(self, seq_len=None):
        """Floats of the state carried from one token to the next, per sequence.

        Parameters
        ----------
        seq_len : int, default=None
            Tokens seen (needed only by mixers whose state grows with them).

        Returns
        -------
        int
        """
        raise NotImplementedError

    def forward(self, x):
        return self.readout(x, self.attend(x))

    def attend_recurrent(self, x, *, return_state=False):
        """Mixed vectors ``u`` computed token by token through :meth:`step`.

        Parameters
        ----------
        x : Tensor of shape (batch, seq_len, n_bits)
        return_state : bool, default=False
            Also return the state after the last token.

        Returns
        -------
        u : Tensor of shape (batch, seq_len, value_dim)
        state : tuple of Tensor
            Only when ``return_state``.
        """
        state = self.initial_state(x.shape[0], dtype=x.dtype, device=x.device)
        outputs = []
        for t in range(x.shape[1]):
            state, u_t = self.step(state, x[:, t], position=t)
            outputs.append(u_t)
        u = torch.stack(outputs, 1) if outputs else x.new_zeros(
            x.shape[0], 0, self.value_dim)
        return (u, state) if return_state else u

    def recurrent(self, x):
        """Outputs of shape (batch, seq_len) computed token by token: equal to
        ``forward(x)`` up to rounding."""
        return self.readout(x, self.attend_recurrent(x))

    def extra_repr(self):
        return (f"name={self.name!r}, n_bits={self.n_bits}, state_size={self.state_size}, "
                f"value_dim={self.value_dim}")


class UserMixer(Mixer):
    """A user's mixer, ``factory(n_bits, state_size, **kwargs)``, seen as a :class:`Mixer`.

    :func:`make_mixer` wraps any :class:`torch.nn.Module` class or factory that is not a
    :class:`Mixer` in this class. It declares nothing it cannot know: ``theorem`` is
    None and :meth:`state_floats` returns None. Its forward is the user's module;
    :meth:`recurrent` is the module's own ``recurrent`` method when it has one.

    Parameters
    ----------
    n_bits, state_size : int
        Passed to ``factory`` first.
    factory : callable
        A module class or a function returning a module.
    **kwargs
        Passed to ``factory`` (the estimator's ``mixer_kwargs``).

    Attributes
    ----------
    module : torch.nn.Module
        The user's mixer.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import UserMixer
    >>> class LastBit(torch.nn.Module):
    ...     def __init__(self, n_bits, state_size):
    ...         super().__init__()
    ...     def forward(self, x):
    ...         return x[..., -1]
    >>> mixer = UserMixer(4, 2, factory=LastBit)
    >>> mixer(torch.ones(2, 3, 4)).shape, mixer.theorem, mixer.state_floats()
    (torch.Size([2, 3]), None, None)
    """

    def __init__(self, n_bits, state_size, *, factory, **kwargs):
        nn.Module.__init__(self)
        self.n_bits = int(n_bits)
        self.state_size = int(state_size)
        self.factory = factory
        self.name = mixer_name(factory)
        module = factory(n_bits, state_size, **kwargs)
        if not isinstance(module, nn.Module):
            raise ValueError(
                f"mixer={self.name!r} must build a torch.nn.Module when called as "
                f"mixer(n_bits, state_size, **mixer_kwargs); got {type(module).__name__}."
            )
        self.module = module

    def forward(self, x):
        return self.module(x)

    def recurrent(self, x):
        """The user's module's own ``recurrent(x)``, when it defines one."""
        method = getattr(self.module, "recurrent", None)
        if method is None:
            raise NotImplementedError(
                f"mixer={self.name!r} has no recurrent form (its module defines no "
                "recurrent method).")
        return method(x)

    def state_floats(self, seq_len=None):
        """None: a user's mixer declares no state."""
        return None

    def extra_repr(self):
        return f"name={self.name!r}, n_bits={self.n_bits}, state_size={self.state_size}"


# ---------------------------------------------------------------------------------
# The whole-sequence forms
# ---------------------------------------------------------------------------------
#: Most elements of one (query block x keys x features) decay tensor of
#: :func:`decayed_scores`: longer sequences are taken a block of queries at a time.
DECAY_BLOCK_ELEMENTS = 2**22


def decayed_scores(q, k, log_cum):
    """Causal scores with per-feature decays, ``A[t, j] = sum_n q[t, n] k[j, n]
    exp(L[t, n] - L[j, n])`` for ``j <= t`` and 0 for ``j > t``.

    ``L`` is the cumulative sum of the log-decays (``L_t = sum_{l <= t} log alpha_l``,
    every ``log alpha <= 0``), so ``exp(L_t - L_j)`` is the product of the decays of
    the tokens ``j + 1 .. t``: every exponent is ``<= 0`` where it is kept, and the
    others are set to ``-inf`` before the exponential (no overflow, and no NaN in the
    gradients). Queries are taken in blocks so that the ``(block, N, r)`` decay tensor
    stays below :data:`DECAY_BLOCK_ELEMENTS` elements.

    Parameters
    ----------
    q, k, log_cum : Tensor of shape (..., N, r)

    Returns
    -------
    Tensor of shape (..., N, N)

    Examples
    --------
    >>> import math, torch
    >>> from minip_learn.nn.mixers import decayed_scores
    >>> ones = torch.ones(1, 3, 1)
    >>> log_cum = torch.log(torch.tensor([0.5, 0.5, 0.5])).cumsum(0).reshape(1, 3, 1)
    >>> decayed_scores(ones, ones, log_cum)[0]
    tensor([[1.0000, 0.0000, 0.0000],
            [0.5000, 1.0000, 0.0000],
            [0.2500, 0.5000, 1.0000]])
    """
    n = q.shape[-2]
    rows_per_block = max(1, DECAY_BLOCK_ELEMENTS // max(1, k[..., 0].numel() * q.shape[-1]))
    positions = torch.arange(n, device=q.device)
    blocks = []
    for start in range(0, n, rows_per_block):
        stop = min(n, start + rows_per_block)
        diff = log_cum[..., start:stop, None, :] - log_cum[..., None, :, :]  # (.., B, N, r)
        future = positions[None, :] > positions[start:stop, None]  # (B, N)
        diff = diff.masked_fill(future[..., None], -math.inf)
        blocks.append((q[..., start:stop, None, :] * k[..., None, :, :]
                       * torch.exp(diff)).sum(-1))
    return torch.cat(blocks, -2)


def _causal_mask(n, device):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _zeros(batch, *shape, dtype, device):
    return torch.zeros(batch, *shape, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------
# Built-in mixers outside the theorem, in plain torch
# ---------------------------------------------------------------------------------
class _MatrixStateMixer(Mixer):
    """A mixer whose state is one ``r x d`` matrix ``S`` (a fast weight)."""

    def initial_state(self, batch, *, dtype, device):
        return (_zeros(batch, self.state_size, self.value_dim, dtype=dtype, device=device),)

    def state_floats(self, seq_len=None):
        """``r d``: the matrix ``S``."""
        return self.state_size * self.value_dim


@register_mixer("linear")
class LinearAttentionMixer(_MatrixStateMixer):
    """Unnormalised causal linear attention: ``u_t = S_t^T phi(q_t)``,
    ``S_t = S_{t-1} + phi(k_t) v_t^T``.

    ``phi(q_t)`` and ``phi(k_t)`` are two feature maps of the registry (default
    ``"elu+1"``) of the token, with ``state_size`` features each. Without the
    normaliser ``phi(q_t)^T s_t`` of kernel attention, the theorem does not cover it.
    State ``r d`` floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and feature dimension ``r``.
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    feature_map : str, default="elu+1"
        A name of the feature-map registry (:func:`~minip_learn.nn.available_feature_maps`)
        or any ``feature_map=`` value of :func:`~minip_learn.nn.make_feature_map`.
    feature_kwargs : dict, default=None
        Options of the feature map (``width``, ``depth`` ...).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("linear", 4, 3, feature_map="relu")
    >>> mixer(torch.rand(2, 6, 4)).shape, mixer.state_floats()
    (torch.Size([2, 6]), 12)
    """

    theorem = "no"
    paper = ("Katharopoulos et al. 2020, Transformers are RNNs (without the normaliser, as "
             "in fla's linear_attn)")
    state_formula = "r d"

    def __init__(self, n_bits, state_size, *, value_dim=None, feature_map="elu+1",
                 feature_kwargs=None):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        kwargs = dict(feature_kwargs or {})
        self.query_features = make_feature_map(feature_map, self.n_bits, self.state_size,
                                               **kwargs)
        self.key_features = make_feature_map(feature_map, self.n_bits, self.state_size,
                                             **kwargs)

    def token_maps(self, x):
        """The per-token maps the recurrence reads: ``{"q": phi(q), "k": phi(k), "v": v}``."""
        return {"q": self.query_features(x), "k": self.key_features(x), "v": self.value(x)}

    def attend(self, x):
        m = self.token_maps(x)
        scores = (m["q"] @ m["k"].transpose(-2, -1)).masked_fill(
            ~_causal_mask(x.shape[-2], x.device), 0.0)
        return scores @ m["v"]

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        S = state[0] + m["k"][:, :, None] * m["v"][:, None, :]
        return (S,), torch.einsum("br,brd->bd", m["q"], S)



@register_mixer("gla")
class GatedLinearAttentionMixer(_MatrixStateMixer):
    """Gated linear attention with data-dependent per-key-dimension gates.

    ``S_t = diag(alpha_t) S_{t-1} + k_t v_t^T`` and ``u_t = S_t^T q_t``, with
    ``q_t = W_q x_t``, ``k_t = W_k x_t`` and ``alpha_t = sigmoid(W_a x_t + c_a)^(1/tau)``
    (``tau = gate_temperature``; 16 in Yang et al. 2024): the recurrence of GLA, whose
    output normalisation and gate are replaced by the affine readout. The whole-sequence
    form sums ``q_t^T diag(exp(L_t - L_j)) k_j v_j`` over ``j <= t`` with the cumulative
    log-gates ``L`` (:func:`decayed_scores`). State ``r d`` floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and key dimension ``r``.
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    gate_temperature : float, default=16.0
        ``tau``: the log-gates are ``logsigmoid(W_a x + c_a) / tau``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("gla", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats()
    (True, 12)
    """

    theorem = "no"
    paper = ("Yang et al. 2024, Gated Linear Attention Transformers with Hardware-Efficient "
             "Training")
    state_formula = "r d"

    def __init__(self, n_bits, state_size, *, value_dim=None, gate_temperature=16.0):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        self.gate_temperature = float(gate_temperature)
        self.query = nn.Linear(self.n_bits, self.state_size)
        self.key = nn.Linear(self.n_bits, self.state_size)
        self.gate = nn.Linear(self.n_bits, self.state_size)

    def token_maps(self, x):
        """The per-token maps the recurrence reads: ``q``, ``k``, ``v`` and the
        log-gates ``log_alpha = logsigmoid(W_a x + c_a) / tau`` (all ``<= 0``)."""
        log_alpha = nn.functional.logsigmoid(self.gate(x)) / self.gate_temperature
        return {"q": self.query(x), "k": self.key(x), "v": self.value(x),
                "log_alpha": log_alpha}

    def attend(self, x):
        m = self.token_maps(x)
        return decayed_scores(m["q"], m["k"], m["log_alpha"].cumsum(-2)) @ m["v"]

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        S = (torch.exp(m["log_alpha"])[:, :, None] * state[0]
             + m["k"][:, :, None] * m["v"][:, None, :])
        return (S,), torch.einsum("br,brd->bd", m["q"], S)



@register_mixer("deltanet")
class DeltaNetMixer(_MatrixStateMixer):
    """The delta rule: ``S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T``,
    ``u_t = S_t^T q_t``.

    ``q_t`` and ``k_t`` are L2-normalised linear maps of the token and
    ``beta_t = sigmoid(<w_b, x_t> + c_b)`` is the writing strength (Schlag et al. 2021;
    Yang et al. 2024). The whole-sequence form is the UT transform: the written values
    ``w_t = beta_t (v_t - S_{t-1}^T k_t)`` solve the unit lower-triangular system
    ``w_t + beta_t sum_{j < t} (k_t^T k_j) w_j = beta_t v_t`` (one triangular solve),
    and ``u_t = sum_{j <= t} (q_t^T k_j) w_j``. State ``r d`` floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and key dimension ``r``.
    value_dim : int, default=None
        ``d``; None means ``n_bits``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("deltanet", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats()
    (True, 12)
    """

    theorem = "no"
    paper = ("Schlag et al. 2021, Linear Transformers Are Secretly Fast Weight Programmers; "
             "Yang et al. 2024, Parallelizing Linear Transformers with the Delta Rule")
    state_formula = "r d"

    def __init__(self, n_bits, state_size, *, value_dim=None):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        self.query = nn.Linear(self.n_bits, self.state_size)
        self.key = nn.Linear(self.n_bits, self.state_size)
        self.beta = nn.Linear(self.n_bits, 1)

    def token_maps(self, x):
        """The per-token maps the recurrence reads: unit-norm ``q`` and ``k``, ``v`` and
        the writing strength ``beta`` in (0, 1) (shape (...,))."""
        normalize = nn.functional.normalize
        return {"q": normalize(self.query(x), dim=-1), "k": normalize(self.key(x), dim=-1),
                "v": self.value(x), "beta": torch.sigmoid(self.beta(x)).squeeze(-1)}

    def attend(self, x):
        m = self.token_maps(x)
        q, k, v, beta = m["q"], m["k"], m["v"], m["beta"]
        n = x.shape[-2]
        eye = torch.eye(n, dtype=k.dtype, device=k.device)
        system = eye + beta[..., None] * torch.tril(k @ k.transpose(-2, -1), -1)
        written = torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False,
                                                unitriangular=True)
        return torch.tril(q @ k.transpose(-2, -1)) @ written

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        S, k = state[0], m["k"]
        written = m["beta"][:, None] * (m["v"] - torch.einsum("br,brd->bd", k, S))
        S = S + k[:, :, None] * written[:, None, :]
        return (S,), torch.einsum("br,brd->bd", m["q"], S)



@register_mixer("mamba")
class MambaMixer(Mixer):
    """A diagonal selective state-space model in the style of Mamba (Gu & Dao, 2023).

    The value map ``v_t = v(x_t)`` gives ``d`` channels; channel ``c`` carries a state
    ``h_t[c]`` of dimension ``r = state_size``:

        ``h_t[c] = exp(Delta_t[c] A[c]) * h_{t-1}[c] + Delta_t[c] B_t v_t[c]``,
        ``u_t[c] = <C_t, h_t[c]> + D[c] v_t[c]``,

    with the input-dependent step ``Delta_t = softplus(W_D x_t + c_D)`` (its bias
    initialised so that ``Delta`` starts log-uniform in ``[dt_min, dt_max]``), the
    diagonal ``A = -exp(A_log)`` (initialised ``A[c, n] = -(n + 1)``, S4D-real), and
    ``B_t = W_B x_t``, ``C_t = W_C x_t``. Mamba's short convolution and output gate are
    left out (the affine readout follows the SSM). Like Mamba, :meth:`attend` is the
    selective scan (the recurrence, token by token: its ``(d, r)`` state is cheaper than
    the ``(d, N, N, r)`` scores of the whole-sequence form once ``N r`` exceeds a few
    hundred). :meth:`attend_parallel` is the whole-sequence form, which sums
    ``C_t^T diag(exp(L_t[c] - L_j[c])) B_j Delta_j[c] v_j[c]`` over ``j <= t`` with the
    cumulative log-decays ``L`` (:func:`decayed_scores`, one channel per leading index);
    the two are tested equal. State ``d r`` floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and state dimension ``r`` per channel.
    value_dim : int, default=None
        Channels ``d``; None means ``n_bits``.
    dt_min, dt_max : float, default=1e-3, 1e-1
        Range of the initial step ``Delta``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("mamba", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats()
    (True, 12)
    """

    theorem = "no"
    paper = "Gu & Dao 2023, Mamba: Linear-Time Sequence Modeling with Selective State Spaces"
    state_formula = "d r"

    def __init__(self, n_bits, state_size, *, value_dim=None, dt_min=1e-3, dt_max=1e-1):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        d, r = self.value_dim, self.state_size
        self.delta = nn.Linear(self.n_bits, d)
        self.input_gate = nn.Linear(self.n_bits, r, bias=False)   # B_t
        self.output_gate = nn.Linear(self.n_bits, r, bias=False)  # C_t
        self.A_log = nn.Parameter(torch.log(torch.arange(1, r + 1, dtype=torch.float32))
                                  .repeat(d, 1))
        self.D = nn.Parameter(torch.ones(d))
        with torch.no_grad():
            dt = torch.exp(torch.rand(d) * (math.log(dt_max) - math.log(dt_min))
                           + math.log(dt_min))
            self.delta.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def token_maps(self, x):
        """The per-token maps the recurrence reads: ``v`` (..., d), ``delta`` (..., d),
        ``B`` and ``C`` (..., r), and ``A`` (d, r)."""
        return {"v": self.value(x), "delta": nn.functional.softplus(self.delta(x)),
                "B": self.input_gate(x), "C": self.output_gate(x), "A": -torch.exp(self.A_log)}

    def attend(self, x):
        """The selective scan: :meth:`attend_recurrent`."""
        return self.attend_recurrent(x)

    def attend_parallel(self, x):
        """Mixed vectors ``u`` of the whole-sequence form (equal to :meth:`attend`)."""
        m = self.token_maps(x)
        v, delta = m["v"].transpose(-2, -1), m["delta"].transpose(-2, -1)  # (b, d, N)
        log_cum = (delta[..., None] * m["A"][:, None, :]).cumsum(-2)  # (b, d, N, r)
        keys = m["B"][:, None] * delta[..., None]  # (b, d, N, r)
        scores = decayed_scores(m["C"][:, None].expand_as(keys), keys, log_cum)
        u = (scores @ v[..., None]).squeeze(-1) + self.D[:, None] * v
        return u.transpose(-2, -1)

    def initial_state(self, batch, *, dtype, device):
        return (_zeros(batch, self.value_dim, self.state_size, dtype=dtype, device=device),)

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        v, delta = m["v"], m["delta"]  # (b, d)
        h = (torch.exp(delta[..., None] * m["A"]) * state[0]
             + (delta * v)[..., None] * m["B"][:, None, :])
        return (h,), (h * m["C"][:, None, :]).sum(-1) + self.D * v

    def state_floats(self, seq_len=None):
        """``d r``: one state of dimension ``r`` per channel."""
        return self.value_dim * self.state_size


# ---------------------------------------------------------------------------------
# Built-in mixers on the attention heads of minip_learn.nn.heads
# ---------------------------------------------------------------------------------
class _HeadMixer(Mixer):
    """A mixer made of one causal head: its value map, readout and forward are the
    head's own."""

    def __init__(self, n_bits, state_size, head):
        nn.Module.__init__(self)
        self.n_bits = int(n_bits)
        self.state_size = int(state_size)
        self.value_dim = head.value_dim
        self.head = head

    @property
    def value(self):
        return self.head.value

    @property
    def readout(self):
        return self.head.readout

    def attend(self, x):
        return self.head.attend(x)

    def forward(self, x):
        return self.head(x)


class _KernelHeadMixer(_HeadMixer):
    """Causal normalised kernel attention (:class:`~minip_learn.nn.KernelAttentionHead`
    with ``causal=True``): :meth:`recurrent` is the head's recurrent form, and
    :meth:`step` a second, token-by-token one that exposes the state."""

    def __init__(self, n_bits, state_size, *, value_dim=None, feature_map="elu+1",
                 feature_width=64, feature_depth=0, shared_features=False,
                 feature_kwargs=None, denominator_eps=1e-3, **order):
        head = KernelAttentionHead(
            n_bits, state_size, feature_map=feature_map, value_dim=value_dim,
            feature_width=feature_width, feature_depth=feature_depth,
            shared_features=shared_features, feature_kwargs=feature_kwargs,
            denominator_eps=denominator_eps, causal=True, **order)
        super().__init__(n_bits, state_size, head)
        #: this instance's coverage: the class's declaration, or "no" for a signed kernel
        self.theorem = head.theorem

    @classmethod
    def data_kwargs(cls, X, *, feature_map="elu+1", feature_kwargs=None, **kwargs):
        """The ``vocabulary`` of a feature map defined on the training tokens
        (``table``), inside ``feature_kwargs``."""
        if not get_feature_map(feature_map).requires_vocabulary:
            return {}
        tokens = np.unique(np.asarray(X).reshape(-1, np.shape(X)[-1]), axis=0)
        return {"feature_kwargs": {**(feature_kwargs or {}),
                                   "vocabulary": tokens.astype(np.uint8)}}

    def recurrent(self, x):
        return self.head.recurrent(x)

    def state_floats(self, seq_len=None):
        """``r (d + 1)``: the sketch ``S`` and ``s`` (log-domain maps: ``r`` more, the
        running maximum of the key log-features)."""
        return self.head.state_floats(seq_len)

    def initial_state(self, batch, *, dtype, device):
        return attention.recurrent_state((batch,), self.state_size, self.value_dim,
                                         log_domain=self.head.log_domain, dtype=dtype,
                                         device=device)

    def step(self, state, x_t, position=0):
        head = self.head
        if head.log_domain:
            fq = head.query_features.log_features(x_t)
            fk = head.key_features.log_features(x_t)
        else:
            fq, fk = head.query_features(x_t), head.key_features(x_t)
        fq, fk = head.with_positions(fq[:, None], fk[:, None], start=position)
        fq, fk = fq[:, 0], fk[:, 0]
        u, state = attention.recurrent_step(state, fq, fk, head.value(x_t),
                                            nonnegative=head.nonnegative,
                                            eps=head.denominator_eps, decay=head.decay,
                                            log_domain=head.log_domain)
        return state, u


@register_mixer("kernel")
class KernelMixer(_KernelHeadMixer):
    """Causal normalised nonnegative kernel attention, the model of the theorem.

    ``S_t = S_{t-1} + phi_K(x_t) v_t^T``, ``s_t = s_{t-1} + phi_K(x_t)`` and
    ``u_t = S_t^T phi_Q(x_t) / phi_Q(x_t)^T s_t``: a
    :class:`~minip_learn.nn.KernelAttentionHead` with ``causal=True`` and
    ``rank = state_size``. Its whole-sequence form is the head's forward and
    :meth:`recurrent` the head's recurrent form
    (:func:`minip_learn.nn.attention.recurrent_attend`). State ``r (d + 1)`` floats
    (log-domain maps such as ``exp``: ``r (d + 2)``, with the running maximum). The
    lower bound covers it when the kernel is nonnegative (the instance's ``theorem``
    is the head's: ``"no"`` for a signed feature map).

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and rank ``r`` (features).
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    feature_map, feature_width, feature_depth, shared_features, feature_kwargs, denominator_eps
        As in :class:`~minip_learn.nn.KernelAttentionHead`.

    Attributes
    ----------
    head : KernelAttentionHead
        The causal head.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("kernel", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats(), mixer.theorem
    (True, 15, 'yes')
    """

    theorem = "yes"
    paper = ("Opazo 2026, Three Tokens Force Exponential Feature Rank in Nonnegative Kernel "
             "Attention (causal: Katharopoulos et al. 2020, Transformers are RNNs)")
    state_formula = "r (d + 1)"

    def __init__(self, n_bits, state_size, *, value_dim=None, feature_map="elu+1",
                 feature_width=64, feature_depth=0, shared_features=False,
                 feature_kwargs=None, denominator_eps=1e-3):
        super().__init__(n_bits, state_size, value_dim=value_dim, feature_map=feature_map,
                         feature_width=feature_width, feature_depth=feature_depth,
                         shared_features=shared_features, feature_kwargs=feature_kwargs,
                         denominator_eps=denominator_eps)


@register_mixer("retnet")
class RetNetMixer(_KernelHeadMixer):
    """Normalised decayed kernel attention, RetNet-style.

    ``S_t = g S_{t-1} + phi_K(x_t) v_t^T``, ``s_t = g s_{t-1} + phi_K(x_t)`` and
    ``u_t = S_t^T phi_Q(x_t) / phi_Q(x_t)^T s_t``: the position-dependent maps
    ``phi_Q(x, i) = g^i phi(x)``, ``phi_K(x, j) = g^-j phi(x)`` of a
    :class:`~minip_learn.nn.KernelAttentionHead` with ``causal=True`` and
    ``positional="decay"``. RetNet's retention (Sun et al. 2023) with its normalisation
    by the decayed kernel's row sums and nonnegative feature maps. State ``r (d + 1)``
    floats (log-domain maps: ``r (d + 2)``). The lower bound covers these
    position-dependent maps on final-query families that hold every order of their
    keys (``theorem = "positional"``, :ref:`theory-positional`).

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and rank ``r`` (features).
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    decay : float in (0, 1], default=0.96875
        The factor ``g``; the default ``1 - 2^-5`` is the decay of RetNet's first head.
    feature_map, feature_width, feature_depth, shared_features, feature_kwargs, denominator_eps
        As in :class:`~minip_learn.nn.KernelAttentionHead`.

    Attributes
    ----------
    head : KernelAttentionHead
        The causal head.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("retnet", 4, 3, decay=0.9).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats(), mixer.theorem
    (True, 15, 'positional')
    """

    theorem = "positional"
    paper = ("Sun et al. 2023, Retentive Network: A Successor to Transformer for Large "
             "Language Models (normalised, nonnegative features)")
    state_formula = "r (d + 1)"

    def __init__(self, n_bits, state_size, *, value_dim=None, decay=0.96875,
                 feature_map="elu+1", feature_width=64, feature_depth=0,
                 shared_features=False, feature_kwargs=None, denominator_eps=1e-3):
        super().__init__(n_bits, state_size, value_dim=value_dim, feature_map=feature_map,
                         feature_width=feature_width, feature_depth=feature_depth,
                         shared_features=shared_features, feature_kwargs=feature_kwargs,
                         denominator_eps=denominator_eps, positional="decay", decay=decay)


@register_mixer("positional")
class PositionalKernelMixer(_KernelHeadMixer):
    """Causal normalised kernel attention with learned positional weights.

    ``alpha_ij = <phi_Q(x_i) * exp(a_i), phi_K(x_j) * exp(b_j)>`` for ``j <= i``: a
    :class:`~minip_learn.nn.KernelAttentionHead` with ``causal=True`` and
    ``positional="learned"`` (a learned log-weight per position and feature on each
    side, so the kernel stays nonnegative). Its recurrence is that of ``kernel`` with
    the position's weights applied to the token's features; state ``r (d + 1)`` floats
    (log-domain maps: ``r (d + 2)``). Covered as ``"retnet"`` is (``theorem =
    "positional"``). ``max_len``, the longest sequence, comes from the training data
    (:meth:`data_kwargs`) when the estimator builds it.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and rank ``r`` (features).
    max_len : int
        The longest sequence the positional weights cover.
    value_dim, feature_map, feature_width, feature_depth, shared_features, \
feature_kwargs, denominator_eps
        As in :class:`KernelMixer`.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("positional", 4, 3, max_len=6).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats(), mixer.theorem
    (True, 15, 'positional')
    """

    theorem = "positional"
    paper = ("Opazo 2026 (the statement for position-dependent maps); learned positional "
             "weights of this library")
    state_formula = "r (d + 1)"

    def __init__(self, n_bits, state_size, *, max_len, value_dim=None, feature_map="elu+1",
                 feature_width=64, feature_depth=0, shared_features=False,
                 feature_kwargs=None, denominator_eps=1e-3):
        super().__init__(n_bits, state_size, value_dim=value_dim, feature_map=feature_map,
                         feature_width=feature_width, feature_depth=feature_depth,
                         shared_features=shared_features, feature_kwargs=feature_kwargs,
                         denominator_eps=denominator_eps, positional="learned",
                         max_len=max_len)

    @classmethod
    def data_kwargs(cls, X, **kwargs):
        """The table's ``vocabulary`` (as :class:`KernelMixer`) and ``max_len``, the
        training sequences' length (unless given)."""
        out = super().data_kwargs(X, **kwargs)
        if kwargs.get("max_len") is None:
            out["max_len"] = int(np.shape(X)[1])
        return out


@register_mixer("softmax")
class SoftmaxMixer(_HeadMixer):
    """Causal softmax attention: ``u_t = sum_{j <= t} softmax_j(q_t^T k_j / tau) v_j``.

    A :class:`~minip_learn.nn.SoftmaxAttentionHead` with ``causal=True`` and
    ``score_dim = state_size``. Its recurrent form keeps every key and value seen so
    far (a cache): ``N (r + d)`` floats after ``N`` tokens, a state that grows with the
    sequence. Outside the theorem (softmax attention is not a kernel of finite rank).

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and score dimension ``r`` of queries and keys.
    value_dim : int, default=None
        ``d``; None means ``n_bits``.
    temperature, score_init_scale, algorithm
        As in :class:`~minip_learn.nn.SoftmaxAttentionHead`.

    Attributes
    ----------
    head : SoftmaxAttentionHead
        The causal head.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("softmax", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats(seq_len=6)
    (True, 42)
    """

    theorem = "no"
    paper = "Vaswani et al. 2017, Attention Is All You Need (causal)"
    state_formula = "N (r + d)"

    def __init__(self, n_bits, state_size, *, value_dim=None, temperature=1.0,
                 score_init_scale=0.1, algorithm="auto"):
        head = SoftmaxAttentionHead(
            n_bits, score_dim=state_size, value_dim=value_dim, temperature=temperature,
            score_init_scale=score_init_scale, algorithm=algorithm, causal=True)
        super().__init__(n_bits, state_size, head)

    def state_floats(self, seq_len=None):
        """``N (r + d)`` after ``N = seq_len`` tokens: the cached keys and values."""
        if seq_len is None:
            raise ValueError("the state of softmax attention grows with the tokens seen: "
                             "state_floats needs seq_len.")
        return int(seq_len) * (self.state_size + self.value_dim)

    def initial_state(self, batch, *, dtype, device):
        return (_zeros(batch, 0, self.state_size, dtype=dtype, device=device),
                _zeros(batch, 0, self.value_dim, dtype=dtype, device=device))

    def step(self, state, x_t, position=0):
        head = self.head
        keys = torch.cat([state[0], head.key(x_t)[:, None]], 1)
        values = torch.cat([state[1], head.value(x_t)[:, None]], 1)
        scores = torch.einsum("br,btr->bt", head.query(x_t), keys) / head.temperature
        return (keys, values), torch.einsum("bt,btd->bd", torch.softmax(scores, -1), values)
