"""The base of every mixer: :class:`Mixer`, its declarations and its two forms, the
per-token maps (:class:`TokenMaps`), the shared state bases, :class:`UserMixer` and
the registry (:data:`MIXERS`) with its functions."""

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from .._registry import RecordsArguments, Registry, UserModule
from ..ops.tokens import distinct_token_index, token_runs
from ..readout import AffineReadout, ValueMap

__all__ = [
    "MIXERS",
    "THEOREM_VALUES",
    "HeadMixer",
    "MatrixStateMixer",
    "Mixer",
    "QKVMaps",
    "TokenMaps",
    "UserMixer",
    "available_mixers",
    "check_mixer_output",
    "get_mixer",
    "make_mixer",
    "mixer_name",
    "mixer_table",
    "register_mixer",
    "unregister_mixer",
]

#: The values of a mixer's ``theorem`` declaration: the lower bound is proved for it on
#: every family, on final-query families that hold every order of their keys
#: (position-dependent maps), or it is outside the bound.
THEOREM_VALUES = ("yes", "positional", "no")

#: The values of a mixer's ``forward_form``: the form :meth:`Mixer.forward` (training
#: and prediction) computes.
FORWARD_FORMS = ("parallel", "recurrent")


@dataclass(frozen=True)
class TokenMaps:
    """The per-token maps a mixer's recurrence reads (:meth:`Mixer.token_maps`).

    Every field is a tensor whose leading axes are the tokens': ``(..., N, dim)`` for a
    sequence, ``(..., dim)`` for one token. A mixer family extends it with the maps its
    recurrence reads (queries and keys, gates, writing strengths ...).

    Attributes
    ----------
    v : Tensor of shape (..., d)
        The values ``v(x)``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer
    >>> from minip_learn.nn.mixers import TokenMaps
    >>> mixer = make_mixer("gla", 4, 3)
    >>> maps = mixer.token_maps(torch.zeros(2, 5, 4))
    >>> isinstance(maps, TokenMaps), maps.v.shape
    (True, torch.Size([2, 5, 4]))
    """

    v: torch.Tensor


@dataclass(frozen=True)
class QKVMaps(TokenMaps):
    """Queries and keys beside the values: the maps of a matrix-state recurrence.

    Attributes
    ----------
    q, k : Tensor of shape (..., r)
        Queries and keys (features, for linear attention).
    """

    q: torch.Tensor
    k: torch.Tensor


class _TheoremDeclaration:
    """The ``theorem`` of a mixer class, which an instance reads and cannot set.

    On the class it is the declared value. On an instance it is the same value, except
    that a class that declares ``theorem_condition`` is ``"no"`` on an instance that
    fails it (:meth:`Mixer.meets_theorem_condition`).
    """

    def __init__(self, value):
        self.value = value

    def __get__(self, obj, owner=None):
        if obj is None or self.value in (None, "no") or obj.meets_theorem_condition():
            return self.value
        return "no"

    def __set__(self, obj, value):
        raise AttributeError(
            f"theorem is a declaration of the class {type(obj).__name__} "
            f"({type(obj).theorem!r}); an instance cannot set it")


class Mixer(RecordsArguments, nn.Module):
    """Base class of the mixers: ``y_i = rho_{x_i}(u_i)`` for a causal ``u``.

    A subclass computes the mixed vectors ``u`` of shape (batch, seq_len, value_dim) in
    two forms that agree to rounding:

    * the **parallel** form :meth:`attend`, over the whole sequence at once (a masked
      ``N x N`` form, or a chunked one);
    * the **recurrent** form :meth:`step`, one token at a time from the state built by
      :meth:`initial_state` (fixed-size, except for softmax's cache):
      :meth:`attend_recurrent` runs it over a sequence, :meth:`recurrent` adds the
      readout.

    :meth:`forward`, which training and prediction run, computes ``u`` in the form the
    class declares as ``forward_form`` (:meth:`mix`): ``"parallel"`` by default,
    ``"recurrent"`` for a mixer whose scan is cheaper than its ``N x N`` form (Mamba).
    A subclass declares the floats of its state (:meth:`state_floats`) and, as class
    attributes, ``theorem``, ``paper`` and ``state_formula``; the per-token maps its
    recurrence reads are :meth:`token_maps` (a :class:`TokenMaps`).

    Parameters
    ----------
    n_bits : int
        Bits per token ``m``.
    state_size : int
        The key (state) dimension ``r``.
    value_dim : int, default=None
        Dimension ``d`` of the value map and of ``u``; None means ``n_bits``.
    own_maps : bool, default=True
        Build the value map and the readout. False for a mixer that reads those of a
        module it wraps (:class:`HeadMixer`) or has none (:class:`UserMixer`).

    Attributes
    ----------
    value : ValueMap
        ``v(x)``, from ``n_bits`` to ``value_dim``.
    readout : AffineReadout
        ``rho_x(u) = <w(x), u> + b(x)``.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("deltanet", 5, 3).double()
    >>> x = torch.rand(2, 7, 5, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x))
    True
    >>> mixer.theorem, mixer.forward_form, mixer.state_floats()
    ('no', 'parallel', 15)
    """

    name = None
    #: whether the lower bound covers the mixer: "yes", "positional" (on final-query
    #: families that hold every order of their keys) or "no"; read on the class by
    #: available_mixers and mixer_table, and an instance cannot set it
    theorem = _TheoremDeclaration(None)
    #: the condition an instance must meet to be covered as ``theorem`` says (None:
    #: every instance is); an instance that fails it (:meth:`meets_theorem_condition`)
    #: reads ``theorem`` as "no"
    theorem_condition = None
    #: the paper (or source) the mixer follows
    paper = None
    #: the floats carried between tokens, as a formula in r, d (and N)
    state_formula = None
    #: the form forward computes: "parallel" (attend) or "recurrent" (attend_recurrent)
    forward_form = "parallel"
    #: how instances of different state sizes share one stack
    #: (:class:`~minip_learn.nn.HeadEnsemble`), each padded to the largest: "zeros" when
    #: zero padding alone computes what the instance computes alone and leaves the
    #: padding a zero gradient (keys and queries of the padded dimensions are zero),
    #: "mask" when a ``feature_mask`` (1 = state dimension in use) switches the padding
    #: off; None: one stack per state size
    state_padding = None
    #: whether the maps read the token alone (and its position, for positional maps):
    #: the final-query form then computes them once per distinct token of the batch
    #: (:meth:`attend_last_tokens`) instead of once per position
    per_token_maps = False
    #: whether the maps read the token alone and a run of equal tokens collapses into
    #: one step: the final-query form then steps once per run of equal tokens, with the
    #: maps of the distinct tokens (:meth:`attend_last_runs`)
    run_maps = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("theorem")
        if "theorem" in cls.__dict__ and not isinstance(declared, _TheoremDeclaration):
            cls.theorem = _TheoremDeclaration(declared)

    def __init__(self, n_bits, state_size, *, value_dim=None, own_maps=True):
        super().__init__()
        self.n_bits = int(n_bits)
        self.state_size = int(state_size)
        self.value_dim = self.n_bits if value_dim is None else int(value_dim)
        if own_maps:
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

    def meets_theorem_condition(self):
        """Whether this instance meets the class's ``theorem_condition`` (True when the
        class declares none). A class that overrides it declares
        ``theorem_condition``."""
        return True

    def token_maps(self, x):
        """The per-token maps the recurrence reads, a :class:`TokenMaps` (a mixer
        family's subclass of it), for tokens ``x`` of shape (..., n_bits)."""
        raise NotImplementedError(f"{type(self).__name__} declares no per-token maps")

    def attend(self, x):
        """Mixed vectors ``u`` of shape (batch, seq_len, value_dim): the parallel form."""
        raise NotImplementedError

    def initial_state(self, batch, *, dtype, device):
        """The state before the first token: a tuple of tensors, batch first (zeros;
        a log-domain kernel mixer's running maximum of the key log-features starts at
        ``-inf``)."""
        raise NotImplementedError

    def step(self, state, x_t, position=0):
        """The recurrent form, one token ``x_t`` (batch, n_bits) at ``position``
        (0-based; read by mixers with positional maps): returns ``(new_state, u_t)``."""
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

    def mix(self, x):
        """Mixed vectors ``u`` in the form of ``forward_form``: :meth:`attend` or
        :meth:`attend_recurrent`."""
        if self.forward_form == "recurrent":
            return self.attend_recurrent(x)
        return self.attend(x)

    def forward(self, x, *, last=False):
        """Outputs of shape (batch, seq_len): the readout of :meth:`mix`; ``last=True``:
        the last position's only, shape (batch, 1), the readout of :meth:`attend_last`
        (what a final-query fit reads)."""
        if last:
            return self.readout(x[:, -1:], self.final_query(x)[:, None])
        return self.readout(x, self.mix(x))

    def final_query(self, x):
        """The mixed vector at the last position, shape (batch, value_dim), in the
        cheapest of three forms with the same values: :meth:`attend_last_tokens` on the
        distinct tokens of ``x`` when the mixer declares ``per_token_maps``, or
        :meth:`attend_last_runs` on its runs of equal tokens when it declares
        ``run_maps``, both when the tokens are 0/1 constants (no gradient is asked of
        them); else :meth:`last_in_blocks`."""
        if (self.per_token_maps or self.run_maps) and not x.requires_grad:
            plan = self.distinct_tokens(x)
            u = None
            if plan is not None and self.per_token_maps:
                u = self.attend_last_tokens(x, *plan)
            if u is None and plan is not None and self.run_maps and not _is_batched(x):
                runs = self._cached_plan(x, "runs", lambda: token_runs(plan[1]))
                u = None if runs is None else self.attend_last_runs(plan[0], runs)
            if u is not None:
                return u
        return self.last_in_blocks(x)

    def distinct_tokens(self, x):
        """The distinct tokens of ``x`` and the index of every token among them
        (:func:`~minip_learn.nn.ops.tokens.distinct_token_index`), or None.

        The result for the last input tensor is kept: the same tensor again, not
        modified in place since (full-batch training, every epoch), is not searched
        again.
        """
        return self._cached_plan(x, "tokens", lambda: distinct_token_index(x))

    def _cached_plan(self, x, kind, compute):
        """``compute()``, kept for the last input tensor ``x`` under ``kind``: the same
        tensor again, not modified in place since, gets the kept value."""
        if x.is_inference() or _is_batched(x):  # no version counter / a vmapped input
            return compute()
        base = x if x._base is None else x._base
        view = (kind, x.storage_offset(), tuple(x.shape), x.stride(), x.dtype)
        cache = getattr(self, "_tokens_cache", None)
        if cache is None or cache[0]() is not base or cache[1] != base._version:
            cache = (weakref.ref(base), base._version, {})  # (the input is held weakly)
            self.__dict__["_tokens_cache"] = cache
        if view not in cache[2]:
            cache[2][view] = compute()
        return cache[2][view]

    def __getstate__(self):
        # the distinct tokens of the last input are a cache: never pickled or copied
        state = dict(super().__getstate__())
        state.pop("_tokens_cache", None)
        return state

    def attend_last_tokens(self, x, tokens, index):
        """The mixed vector at the last position, shape (batch, value_dim), from the
        maps of the distinct tokens: equal to :meth:`attend_last` up to rounding.

        Parameters
        ----------
        x : Tensor of shape (batch, seq_len, n_bits)
        tokens : Tensor of shape (U, n_bits)
            The distinct tokens of ``x``.
        index : Tensor of shape (batch, seq_len), int64
            The index of every token of ``x`` in ``tokens``.

        Returns
        -------
        Tensor of shape (batch, value_dim), or None
            None when this form does not apply or costs more than :meth:`attend_last`
            (the default: a mixer that declares ``per_token_maps`` overrides it).
        """
        return None

    def attend_last_runs(self, tokens, runs):
        """The mixed vector at the last position, shape (batch, value_dim), one step
        per run of equal tokens with the maps of the distinct tokens: equal to
        :meth:`attend_last` up to rounding.

        Parameters
        ----------
        tokens : Tensor of shape (U, n_bits)
            The distinct tokens of the batch.
        runs : TokenRuns
            The token (an index in ``tokens``) and the length of every run, the runs
            aligned on the right and empty runs (length 0) before the first
            (:func:`~minip_learn.nn.ops.tokens.token_runs`).

        Returns
        -------
        Tensor of shape (batch, value_dim), or None
            None when the mixer has no such form (the default: a mixer that declares
            ``run_maps`` overrides it).
        """
        return None

    #: floats of state one block of :meth:`last_in_blocks` holds: a cache-sized working
    #: set (about 1 MiB in float32)
    LAST_BLOCK_FLOATS = 2**18

    def last_in_blocks(self, x):
        """:meth:`attend_last` over blocks of sequences, each holding about
        :attr:`LAST_BLOCK_FLOATS` floats of state: the same values, with every tensor of
        a block small enough to stay in the CPU's cache (what it saves is on
        :ref:`performance`)."""
        per_sequence = self.state_floats(x.shape[1]) or 1
        block = max(1, self.LAST_BLOCK_FLOATS // per_sequence)
        if x.shape[0] <= block:
            return self.attend_last(x)
        return torch.cat([self.attend_last(part) for part in x.split(block)])

    def attend_last(self, x):
        """The mixed vector at the last position, shape (batch, value_dim): the state
        after the whole sequence read out once. The default slices :meth:`mix`; a
        mixer overrides it with a form that costs what one output needs (a sum over the
        keys, a scan or a chunked form), with no ``N x N`` tensor."""
        return self.mix(x)[:, -1]

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


class UserMixer(UserModule, Mixer):
    """A user's mixer, ``factory(n_bits, state_size, **kwargs)``, seen as a :class:`Mixer`.

    :func:`make_mixer` wraps any :class:`torch.nn.Module` class or factory that is not a
    :class:`Mixer` in this class. It declares nothing it cannot know: ``theorem`` and
    ``value_dim`` are None and :meth:`state_floats` returns None. Its forward is the
    user's module (``last=True`` slices its last position); :meth:`recurrent` is the
    module's own ``recurrent`` method when it has one.

    Parameters
    ----------
    n_bits, state_size : int
        Passed to ``factory`` first.
    %(user)s

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
        super().__init__(n_bits, state_size, own_maps=False)
        self.value_dim = None  # the user's module declares none
        self.hold(MIXERS, factory, n_bits, state_size, **kwargs)

    def forward(self, x, *, last=False):
        """The user's module on ``x``; ``last=True``: its output at the last position
        (the module computes every position; its own forward is all it declares)."""
        out = self.module(x)
        return out[:, -1:] if last else out

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


def _is_batched(x):
    """Whether ``x`` is a tensor batched by :func:`torch.func.vmap`."""
    return bool(torch._C._functorch.is_batchedtensor(x))


# ---------------------------------------------------------------------------------
# The shared state bases
# ---------------------------------------------------------------------------------
class MatrixStateMixer(Mixer):
    """A mixer whose state is one ``r x d`` matrix ``S`` (a fast weight)."""

    state_formula = "r d"

    def initial_state(self, batch, *, dtype, device):
        return (torch.zeros(batch, self.state_size, self.value_dim, dtype=dtype,
                            device=device),)

    def state_floats(self, seq_len=None):
        """``r d``: the matrix ``S``."""
        return self.state_size * self.value_dim


class HeadMixer(Mixer):
    """A mixer made of one causal attention head: its value map, readout and forward
    are the head's own (the parallel form with the readout folded in), and its
    ``value_dim`` is the head's.

    Parameters
    ----------
    n_bits, state_size : int
        As in :class:`Mixer`.
    head : torch.nn.Module
        A causal head with ``value``, ``readout``, ``value_dim`` and ``attend``.
    """

    def __init__(self, n_bits, state_size, head):
        super().__init__(n_bits, state_size, value_dim=head.value_dim, own_maps=False)
        self.head = head

    @property
    def value(self):
        return self.head.value

    @property
    def readout(self):
        return self.head.readout

    def attend(self, x):
        return self.head.attend(x)

    def attend_last(self, x):
        return self.head.attend_last(x)

    def attend_last_tokens(self, x, tokens, index):
        return self.head.attend_last_tokens(x, tokens, index)

    def forward(self, x, *, last=False):
        if last:
            return self.readout(x[:, -1:], self.final_query(x)[:, None])
        return self.head(x)


# ---------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------
def _check_declarations(name, cls):
    """A mixer class declares ``theorem``, and ``theorem_condition`` when its instances
    can fail it."""
    if cls.theorem not in THEOREM_VALUES:
        raise ValueError(
            f"mixer {name!r} must declare theorem as one of {THEOREM_VALUES}; got "
            f"{cls.theorem!r}."
        )
    if (cls.meets_theorem_condition is not Mixer.meets_theorem_condition
            and not cls.theorem_condition):
        raise ValueError(
            f"mixer {name!r} defines meets_theorem_condition: it must declare "
            "theorem_condition, the condition its instances are covered under.")
    if cls.forward_form not in FORWARD_FORMS:
        raise ValueError(f"mixer {name!r} must declare forward_form as one of "
                         f"{FORWARD_FORMS}; got {cls.forward_form!r}.")


#: The registry of sequence mixers: names to :class:`Mixer` subclasses.
MIXERS = Registry(
    "mixer", "mixer", Mixer, UserMixer, call="mixer(n_bits, state_size, **mixer_kwargs)",
    columns={"theorem": lambda cls: cls.theorem,
             "theorem_condition": lambda cls: cls.theorem_condition,
             "paper": lambda cls: cls.paper,
             "state": lambda cls: cls.state_formula},
    check=_check_declarations)
MIXERS.document(UserMixer)
#: Readable name of a ``mixer=`` value, for messages and tables.
mixer_name = MIXERS.name


@MIXERS.document
def register_mixer(name):
    """Class decorator adding a :class:`Mixer` subclass to the registry.

    Parameters
    ----------
    name : str
        Registry name (must be new); the class gets it as ``name``. The class must
        declare ``theorem`` as one of ``"yes"``, ``"positional"``, ``"no"`` (and
        ``theorem_condition`` when it defines ``meets_theorem_condition``).

    %(register_returns)s

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import Mixer, make_mixer, register_mixer, unregister_mixer
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
    >>> mixer = make_mixer("doc-mean", 4, 1).double()
    >>> x = torch.rand(2, 5, 4, dtype=torch.float64)
    >>> mixer(x).shape, torch.allclose(mixer(x), mixer.recurrent(x))
    (torch.Size([2, 5]), True)
    >>> _ = unregister_mixer("doc-mean")  # keep the registry as it was
    """
    return MIXERS.register(name)


@MIXERS.document
def unregister_mixer(name):
    """Remove a mixer from the registry (the inverse of :func:`register_mixer`).

    %(unregister)s

    Examples
    --------
    >>> from minip_learn.nn import Mixer, available_mixers, register_mixer, unregister_mixer
    >>> Doc = register_mixer("doc-none")(type("Doc", (Mixer,), {"theorem": "no"}))
    >>> unregister_mixer("doc-none") is Doc, "doc-none" in available_mixers()
    (True, False)
    """
    return MIXERS.unregister(name)


def available_mixers(*, theorem=None):
    """Names of the registered mixers, sorted.

    Parameters
    ----------
    theorem : {"yes", "positional", "no"} or None, default=None
        If given, only mixers whose ``theorem`` declaration (the ``"theorem"`` column of
        :func:`mixer_table`) equals it.

    Returns
    -------
    names : list of str

    Examples
    --------
    >>> from minip_learn.nn import available_mixers
    >>> "gla" in available_mixers(), "kernel" in available_mixers(theorem="yes")
    (True, True)
    """
    return MIXERS.available(theorem=theorem)


def mixer_table():
    """The registry as a table: one row per registered mixer, sorted by name.

    Returns
    -------
    rows : list of dict
        In the order of :func:`available_mixers`, one dict per mixer with keys
        ``"name"``, ``"theorem"`` (``"yes"``: the lower bound covers it;
        ``"positional"``: it covers it on final-query families in every order of their
        keys; ``"no"``: outside the bound), ``"theorem_condition"`` (the condition an
        instance must meet to be covered so, e.g. a nonnegative kernel; None when every
        instance is), ``"paper"`` (the source the mixer follows), ``"state"`` (the
        formula of the floats its recurrent form carries between tokens, in
        ``r = state_size``, ``d = value_dim`` and ``N`` the tokens seen) and
        ``"class"`` (the qualified name of the class).

    Examples
    --------
    >>> from minip_learn.nn import mixer_table
    >>> row = next(row for row in mixer_table() if row["name"] == "kernel")
    >>> row["theorem"], row["state"]
    ('yes', 'r (d + 1)')
    """
    return MIXERS.table()


@MIXERS.document
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
        Its class attributes are the mixer's declarations (``theorem``,
        ``theorem_condition``, ``paper``, ``state_formula``, ``forward_form``).

    %(get_raises)s

    Examples
    --------
    >>> from torch import nn
    >>> from minip_learn.nn import get_mixer
    >>> get_mixer("gla").theorem
    'no'
    >>> get_mixer(nn.Linear).__name__, get_mixer(nn.Linear).theorem is None
    ('UserMixer', True)
    """
    return MIXERS.get(value)


@MIXERS.document
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
    return MIXERS.make(mixer, n_bits, state_size, **kwargs)


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
    MIXERS.check_shape(out, name, expected, what="outputs",
                       tokens="(batch, seq_len, n_bits)", shape="(batch, seq_len)")
    bad = ~torch.isfinite(out)
    if bad.any():
        raise ValueError(
            f"mixer={label!r} returns NaN or infinite outputs on "
            f"{int(bad.any(-1).sum())} of the {expected[0]} sequences."
        )
