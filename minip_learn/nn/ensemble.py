"""Many independent heads as one batched module.

:class:`HeadEnsemble` stacks the parameters of ``E`` heads of the same architecture
along a new leading dimension and evaluates all of them in one forward. Heads may
differ in their rank: every member is padded with zeros to the largest one and a
per-member ``feature_mask`` (see :meth:`KernelAttentionHead.features
<minip_learn.nn.KernelAttentionHead.features>`) turns the padding into exact zero
features, so a member computes exactly what its own rank-``r`` head computes and its
padded parameters receive zero gradients.

Sequence mixers stack the same way at different state sizes, as their class declares
(``state_padding``): ``"mask"`` (a ``feature_mask``, as above) or ``"zeros"`` (zero
padding alone computes what the member computes alone and leaves the padding a zero
gradient, e.g. a key dimension whose padded keys and queries are zero).

Buffers that are equal in every member (e.g. the vocabulary of the ``table`` map) are
kept unbatched and shared; buffers that differ (e.g. the random directions of
``favor+``) are stacked like the parameters.

The paths, chosen from what the modules declare (never from the names of their
parameters) and reported by :attr:`HeadEnsemble.path`:

* **fused**: kernel heads whose feature maps declare a batched form
  (:attr:`FeatureMap.fused_form <minip_learn.nn.FeatureMap.fused_form>`) compute every
  member's token maps at once and then run the arithmetic of
  :mod:`minip_learn.nn.attention` with a leading member dimension -- per position
  (``"fused-positions"``) or, when the tokens repeat a lot, on the distinct tokens and
  their pairs (``"fused-pairs"``);
* **generic**: any other head runs its own forward on the stacked parameters
  (:func:`torch.func.functional_call`, vectorised with :func:`torch.func.vmap` over the
  members);
* **single**: a stack of one member holds a copy of its head as a submodule and runs
  the head's own forward on its own parameters (what a single ``fit`` trains: the cost
  of the plain head), except where the pair form applies.

The fused path reads the stacked tensors by the roles the modules declare
(``fused_parameters()`` of the feature maps, the value map and the readout), resolved
once when the stack is built.

Every path takes sequences in multiset form too: the distinct tokens of every sequence
as ``x`` and their multiplicities as ``counts`` (see :mod:`minip_learn.nn.heads`). The
pair form then counts each key slot with its multiplicity in its sparse matrix of token
pairs, the other paths hand ``counts`` to the attention arithmetic.

No scikit-learn in this layer.
"""

import copy
import warnings
from typing import NamedTuple

import torch
from torch import nn
from torch.func import functional_call, vmap

from .._validation import distinct_tokens
from . import ops
from .final_query import last_kwargs, last_output

__all__ = []  # public home: the package minip_learn.nn

PATHS = ("fused-pairs", "fused-positions", "generic", "single")


def _fused_obstacle(template):
    """Why ``template`` cannot take the fused path (a sentence), or None if it can."""
    if getattr(type(template), "fused", None) != "kernel":
        return f"{type(template).__name__} declares no fused form"
    if getattr(template, "ordered", False):
        return "causal and positional heads depend on the order of the tokens (no fused form)"
    for role in ("query_features", "key_features"):
        fm = getattr(template, role)
        if fm.fused_form is None:
            why = ("has an MLP encoder (feature_depth > 0); the fused form needs a single "
                   "linear layer" if type(fm).fused == "linear" else
                   f"({type(fm).__name__}) declares no fused form")
            return f"{role} {fm.name!r} {why}"
    if template.query_features.log_domain != template.key_features.log_domain:
        return "query_features and key_features mix log-domain and plain features"
    for role, form in (("value", "linear"), ("readout", "affine")):
        module = getattr(template, role)
        if getattr(type(module), "fused", None) != form:
            return f"{role} {type(module).__name__} declares no fused form {form!r}"
    return None


#: the roles of the parameters the fused forward reads, by the fused form of a module
FUSED_ROLES = {
    "linear": ("weight", "bias"),
    "table": ("log_table",),
    "affine": ("weight", "weight_bias", "bias", "bias_const"),
}


def _fused_roles(template):
    """Position in ``template.parameters()`` of every parameter the fused forward reads,
    keyed by ``(module, role)`` (the roles each module declares in ``fused_parameters``).

    Raises
    ------
    TypeError
        When a module declares a fused form but not the parameters of its roles.
    """
    position = {id(p): j for j, p in enumerate(template.parameters())}
    qf, kf = template.query_features, template.key_features
    roles = {}
    for owner, form in (("query_features", qf.fused_form), ("key_features", kf.fused_form),
                        ("value", "linear"), ("readout", "affine")):
        module = getattr(template, owner)
        declared = module.fused_parameters()
        for role in FUSED_ROLES[form]:
            param = declared.get(role)
            if param is None or id(param) not in position:
                raise TypeError(
                    f"{owner} {type(module).__name__} declares the fused form {form!r} but "
                    f"fused_parameters() gives no parameter of the head for the role {role!r}.")
            roles[owner, role] = position[id(param)]
    return roles


def _size(module):
    """The size in which the members of one stack may differ: a head's ``rank``, a
    mixer's ``state_size``; None for a module with neither."""
    for name in ("rank", "state_size"):
        size = getattr(module, name, None)
        if size is not None:
            return int(size)
    return None


def _padding(module):
    """How modules like ``module`` share a stack at different sizes: their class's
    ``state_padding`` declaration (``"mask"`` or ``"zeros"``), else ``"mask"`` when they
    have a ``feature_mask`` (kernel heads), else None."""
    declared = getattr(type(module), "state_padding", None)
    if declared is not None:
        return declared
    return "mask" if hasattr(module, "feature_mask") else None


def _padding_obstacle(head):
    """Why modules like ``head`` cannot share one stack at different sizes (a sentence),
    or None when padding applies to them: zero padding where their class declares it
    exact, else rank masking with every feature map ``rank_maskable``."""
    padding = _padding(head)
    if padding is None or _size(head) is None:
        return (f"{type(head).__name__} modules cannot be stacked at different sizes: "
                "the class declares no state_padding and has no feature_mask; stack one "
                "size at a time")
    if padding == "zeros":
        return None
    for role in ("query_features", "key_features"):
        fm = getattr(head, role, None)
        if fm is not None and not getattr(fm, "rank_maskable", True):
            return (f"heads with the feature map {getattr(fm, 'name', type(fm).__name__)!r} "
                    "cannot be stacked at different ranks: its features mix the encoder "
                    "outputs, so zero-padding changes them; stack heads of one rank at a time")
    return None


class _PairPlan(NamedTuple):
    """The token pairs of an input with few distinct tokens (see ``_make_plan``)."""

    tokens: torch.Tensor  # (U, n_bits): the distinct tokens
    token_of: torch.Tensor  # (n N,): the token of every position, sequence-major
    # sparse CSR (n N, U U): token pairs of every position's keys (counted with their
    # multiplicities)
    rows: torch.Tensor
    rows_t: torch.Tensor  # its transpose (CSR)
    occurring: torch.Tensor  # the token pairs that occur
    n_tokens: int
    buffers: list  # work buffers of ops.pair_readout, reused step after step


def _unique_rows(t):
    """Distinct rows of the 2-d tensor ``t`` and the index of each row among them
    (:func:`~minip_learn._validation.distinct_tokens`; ``torch.unique(dim=0)`` is slow
    on CPU)."""
    _, first, inv = distinct_tokens(t.detach().cpu().numpy(), return_index=True,
                                    return_inverse=True)
    return t[torch.from_numpy(first).to(t.device)], torch.from_numpy(inv).to(t.device)


def _gather_index(idx, n_rows):
    """``idx``, or None when it is ``0, 1, ..., n_rows - 1`` (gathering is a no-op)."""
    if len(idx) == n_rows and bool(
            (idx == torch.arange(n_rows, device=idx.device, dtype=idx.dtype)).all()):
        return None
    return idx


def _sequences(x):
    """``x`` of shape (..., seq_len, n_bits) as (n_sequences, seq_len, n_bits)."""
    return x.reshape((-1,) + tuple(x.shape[-2:]))


def _pad_to(t, shape):
    """Zero-pad ``t`` at the end of every dimension that is smaller than ``shape``."""
    if tuple(t.shape) == tuple(shape):
        return t
    if t.ndim != len(shape) or any(a > b for a, b in zip(t.shape, shape)):
        raise ValueError(f"cannot pad a tensor of shape {tuple(t.shape)} to {tuple(shape)}")
    out = t.new_zeros(shape)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


def _crop_to(t, shape):
    """The leading ``shape`` block of ``t`` (inverse of :func:`_pad_to`)."""
    return t[tuple(slice(0, n) for n in shape)]


class HeadEnsemble(nn.Module):
    """``E`` independent heads evaluated in one batched forward.

    Parameters
    ----------
    heads : list of torch.nn.Module
        The members, all of the same class and architecture except possibly their
        ``rank`` (kernel heads) or ``state_size`` (mixers whose class declares a
        ``state_padding``). Their current parameters and buffers are copied.
    template : torch.nn.Module, default=None
        A head with the largest shapes (e.g. the kernel head of the largest rank); its
        own parameter values are not used. None uses the first head of the largest
        ``rank`` or ``state_size`` (or the first head). A stack of one member uses a copy
        of its head.

    Attributes
    ----------
    n_members : int
        Number of members ``E``.
    names : list of str
        Names of the stacked parameters (as in ``template.named_parameters()``).
    params : sequence of torch.nn.Parameter
        The stacked parameters, one per name, of shape ``(E, *template_shape)`` (a
        :class:`torch.nn.ParameterList` the stack owns); a stack of one member holds
        its head's copy as a submodule, and these are that head's own parameters, at
        their own shapes.
    ranks : list of int or None
        Rank (kernel heads) or state size (mixers) of each member, else None.
    path : {"fused-pairs", "fused-positions", "generic", "single"}
        The path of the last forward (before the first one: ``"single"`` for one
        member, else ``"fused-positions"`` when the fused path is available, else
        ``"generic"``). The fused path is available exactly when the template declares
        it (:class:`KernelAttentionHead <minip_learn.nn.KernelAttentionHead>` whose
        feature maps have a ``fused_form``); it takes the pair form when the tokens of
        the input repeat enough (e.g. a witness suite), also for one member.
    path_reason : str
        Why: for ``"generic"`` the module that declares no fused form and why.
    pair_path : bool
        Whether the fused path may take the pair form (True at construction); False
        computes every position (``"fused-positions"``, or ``"single"`` for one member).
    defer_underflow_check : bool
        With log-domain features the pair form shifts the kernel per query token; where
        that leaves the kernel value of an occurring token pair below the floating-point
        range, the positions are computed instead. False (at construction): every
        forward reads that check on the host. True: in training mode the check stays on
        the device, accumulated over the forwards and read by :meth:`pair_underflowed`
        (a trainer reads it where it reads its other figures, and refits on the
        positions when it is set; the outputs of a forward that underflowed are not
        usable).

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import HeadEnsemble, KernelAttentionHead
    >>> heads = [KernelAttentionHead(6, r).double() for r in (2, 4, 4)]
    >>> ens = HeadEnsemble(heads)
    >>> x = torch.rand(5, 3, 6, dtype=torch.float64).round()
    >>> out = ens(x)
    >>> out.shape, ens.path
    (torch.Size([3, 5, 3]), 'fused-positions')
    >>> bool(torch.allclose(out[0], heads[0](x)))
    True
    >>> mlp = [KernelAttentionHead(6, 4, feature_depth=1) for _ in range(2)]
    >>> print(HeadEnsemble(mlp).path_reason)  # doctest: +NORMALIZE_WHITESPACE
    query_features 'elu+1' has an MLP encoder (feature_depth > 0); the fused form
    needs a single linear layer
    """

    def __init__(self, heads, template=None):
        super().__init__()
        heads = self._check_heads(heads)
        ranks = [_size(h) for h in heads]
        self.ranks = None if any(r is None for r in ranks) else ranks
        self.n_members = len(heads)
        # one member: the stack's head is a copy of its head and trains in place;
        # several: the template only lends its forward and shapes
        self._stacked = self.n_members > 1
        template = self._pick_template(heads, template)
        self.names = [n for n, _ in template.named_parameters()]
        self._shapes = [
            {n: tuple(p.shape) for n, p in h.named_parameters()} for h in heads]
        self._buffer_shapes = [
            {n: tuple(b.shape) for n, b in h.named_buffers()} for h in heads]
        for i, shapes in enumerate(self._shapes):
            if sorted(shapes) != sorted(self.names):
                raise ValueError(f"head {i} does not have the parameters of the template.")
        self._shared_names, self._stacked_names = [], []
        self._mask_name = "feature_mask"  # where the template holds it (_rank_mask)
        if self._stacked:
            self._stack_members(heads, template)
        else:
            self.head = template  # its parameters and buffers are the stack's
        self._template = [template]  # a plain reference (a submodule only for one member)
        self._choose_path(template)
        self._input_cache = None
        self.pair_path = True
        self.defer_underflow_check = False
        self._underflow = None  # the deferred check's flag (a device tensor)
        self._one_by_one = False  # the generic path loops over the members (see below)

    @staticmethod
    def _check_heads(heads):
        """The members as a list: non-empty, of one class."""
        heads = list(heads)
        if not heads:
            raise ValueError("heads must be a non-empty list of modules.")
        if len({type(h) for h in heads}) != 1:
            raise ValueError("all heads must be of the same class.")
        return heads

    def _pick_template(self, heads, template):
        """A private copy of the head whose forward and shapes every member uses."""
        if not self._stacked:
            return copy.deepcopy(heads[0])
        if template is None:
            template = heads[0] if self.ranks is None else heads[
                max(range(len(heads)), key=lambda i: self.ranks[i])]
        template = copy.deepcopy(template)
        for p in template.parameters():
            p.requires_grad_(False)
        return template

    def _stack_members(self, heads, template):
        """Several members: the stacked parameters, the shared and the stacked buffers
        (registered on the stack) and the rank mask."""
        members = [dict(h.named_parameters()) for h in heads]
        self.stack = nn.ParameterList([
            nn.Parameter(torch.stack([_pad_to(m[n].detach(), p.shape) for m in members]))
            for n, p in template.named_parameters()
        ])
        # buffers: shared when equal in every member, else stacked
        shared, stacked = {}, {}
        member_buffers = [dict(h.named_buffers()) for h in heads]
        for n, b in template.named_buffers():
            vals = [mb[n] for mb in member_buffers]
            if all(v.shape == b.shape and torch.equal(v, vals[0]) for v in vals):
                shared[n] = vals[0]
            else:
                stacked[n] = torch.stack([_pad_to(v, b.shape) for v in vals])
        mask = self._rank_mask(heads, template)
        if mask is not None:
            stacked[self._mask_name] = mask
        self._shared_names = list(shared)
        self._stacked_names = list(stacked)
        for i, n in enumerate(self._shared_names):
            self.register_buffer(f"shared_{i}", shared[n])
        for i, n in enumerate(self._stacked_names):
            self.register_buffer(f"stacked_{i}", stacked[n])

    def _rank_mask(self, heads, template):
        """The stacked ``feature_mask`` of members of different sizes that rank masking
        stacks (the template gets a mask of ones), or None when the sizes agree or zero
        padding is exact for them. Records the mask's buffer name.

        Raises
        ------
        ValueError
            For members of different shapes that padding cannot stack.
        """
        shapes = {n: p.shape for n, p in template.named_parameters()}
        padded = any(shapes.get(n) != p.shape for h in heads for n, p in h.named_parameters())
        if padded and (self.ranks is None or _padding(template) is None):
            raise ValueError(
                "heads of different shapes can be stacked only when they differ in rank "
                "(kernel heads, rank masking) or in state size (mixers whose class "
                "declares a state_padding).")
        if self.ranks is None or len(set(self.ranks)) == 1:
            return None
        obstacle = _padding_obstacle(template)
        if obstacle is not None:
            raise ValueError(obstacle + ".")
        if _padding(template) == "zeros":
            return None
        r_max = max(self.ranks)
        first = self.stack[0]
        mask = torch.zeros(self.n_members, r_max, dtype=first.dtype, device=first.device)
        for i, r in enumerate(self.ranks):
            mask[i, :r] = 1
        template.feature_mask = ones = torch.ones(r_max, dtype=mask.dtype, device=mask.device)
        self._mask_name = next(n for n, b in template.named_buffers() if b is ones)
        return mask

    def _choose_path(self, template):
        """The path the template's declarations allow, and the fused roles' positions."""
        obstacle = _fused_obstacle(template)
        self._fast = obstacle is None
        self._roles = _fused_roles(template) if self._fast else {}
        self.path = "fused-positions" if self._fast else "generic"
        self.path_reason = obstacle or "every map declares a fused form"
        if not self._stacked:
            self.path, self.path_reason = "single", self._single_reason()

    @staticmethod
    def stack_groups(heads, *, max_padding=None):
        """Which heads can share one stack: all of them when their parameters have the
        same shapes or padding applies (kernel heads of different ranks whose feature
        maps are ``rank_maskable``; mixers of different state sizes whose class declares
        a ``state_padding``), else one stack per shape (e.g. one per rank where a
        feature map declares that heads of different ranks cannot share a stack).

        Parameters
        ----------
        heads : list of torch.nn.Module
            Heads of one class and architecture (up to their shapes).
        max_padding : int or None, default=None
            The most padding one stack may add, in size units summed over its members
            (three members of state 2 in a stack of state 5 add 9), for heads that run
            the generic path (whose padded arithmetic costs what it pads); None: no
            limit. The largest heads come first and a stack takes the next one while
            the padding allows. The fused path (per distinct token) is never limited.

        Returns
        -------
        groups : list of list of int
            Indices into ``heads``, one list per stack, in the order of first
            appearance.

        Examples
        --------
        >>> from minip_learn.nn import HeadEnsemble, KernelAttentionHead, make_mixer
        >>> HeadEnsemble.stack_groups([KernelAttentionHead(4, r) for r in (2, 3, 2)])
        [[0, 1, 2]]
        >>> HeadEnsemble.stack_groups([KernelAttentionHead(4, r, feature_map="hedgehog")
        ...                            for r in (4, 6, 4)])
        [[0, 2], [1]]
        >>> mixers = [make_mixer("mamba", 4, r) for r in (8, 2, 7, 8)]
        >>> HeadEnsemble.stack_groups(mixers), HeadEnsemble.stack_groups(mixers, max_padding=1)
        ([[0, 1, 2, 3]], [[0, 2, 3], [1]])
        """
        heads = list(heads)
        shapes = [tuple((n, tuple(p.shape)) for n, p in h.named_parameters())
                  for h in heads]
        if not heads or len(set(shapes)) <= 1:
            return [list(range(len(heads)))]
        if _padding_obstacle(heads[0]) is not None:
            groups = {}
            for i, shape in enumerate(shapes):
                groups.setdefault(shape, []).append(i)
            return list(groups.values())
        if max_padding is None or _fused_obstacle(heads[0]) is None:
            return [list(range(len(heads)))]
        sizes = [_size(h) for h in heads]
        groups, padding = [], 0
        for i in sorted(range(len(heads)), key=lambda i: (-sizes[i], i)):
            add = sizes[groups[-1][0]] - sizes[i] if groups else None
            if add is None or padding + add > max_padding:
                groups.append([i])
                padding = 0
            else:
                groups[-1].append(i)
                padding += add
        return sorted(sorted(g) for g in groups)

    @property
    def template(self):
        """The (private copy of the) widest head whose forward every member runs; for
        one member, that member itself (the stack's submodule ``head``: its parameters
        are :attr:`params`)."""
        return self._template[0]

    @property
    def params(self):
        """The stacked parameters, one per name of :attr:`names` (for one member, the
        head's own parameters)."""
        return self.stack if self._stacked else list(self.template.parameters())

    def _member_params(self):
        """The parameters with their member dimension (views for one member)."""
        return list(self.stack) if self._stacked else [
            p.unsqueeze(0) for p in self.template.parameters()]

    def _buffer_dicts(self):
        if not self._stacked:
            return dict(self.template.named_buffers()), {}
        shared = {n: getattr(self, f"shared_{i}") for i, n in enumerate(self._shared_names)}
        stacked = {n: getattr(self, f"stacked_{i}") for i, n in enumerate(self._stacked_names)}
        return shared, stacked

    def stacked_buffer(self, name):
        """The stacked buffer ``name`` (one row per member, e.g. ``feature_mask`` when
        the ranks differ), or None when every member shares it or it does not exist."""
        return self._buffer_dicts()[1].get(name)

    @property
    def rank_mask(self):
        """The members' rank mask, shape (E, r) (1 = feature in use), when members of
        different sizes share the stack through a ``feature_mask``; else None."""
        return self.stacked_buffer(self._mask_name)

    def token_tables(self):
        """The stacked query and key log-feature tables, or None when the heads have none.

        Returns
        -------
        tables : tuple of two Parameters of shape (E, n_tokens, rank), or None
            The stack's own parameters (not copies), rows in the order of the maps'
            ``vocabulary`` (see :meth:`KernelAttentionHead.token_tables
            <minip_learn.nn.KernelAttentionHead.token_tables>`); for one member, its
            head's tables, of shape (n_tokens, rank).
        """
        token_tables = getattr(self.template, "token_tables", None)
        tables = None if token_tables is None else token_tables()
        if tables is None or not self._stacked:
            return tables
        position = {id(p): j for j, p in enumerate(self.template.parameters())}
        return tuple(self.stack[position[id(t)]] for t in tables)

    def forward(self, x, counts=None, *, last=False):
        """Outputs of every member on the same input ``x``: shape ``(E, *head_output)``.

        The path is the one :attr:`path` names (set from the declarations of the
        template's modules at construction; pairs or positions chosen per input).
        ``counts`` (shape ``x.shape[:-1]``): the multiplicity of every slot of sequences
        in multiset form; None: one per position. ``last=True``: every member's output
        at the last position only: its ``forward(x, last=True)`` (the final-query form)
        on the single and the generic path; the fused path computes every position and
        reads the last (its heads are non-causal kernel heads, whose cost is linear in
        the positions).
        """
        if not self._fast or (last and self.n_members == 1):
            if self.n_members == 1:
                return self._single_forward(x, counts, last=last)
            return self._vmap_forward(x, counts, last=last)
        out = self._fast_forward(x, counts)
        return out[:, :, -1:] if last else out

    def train(self, mode=True):
        """As :meth:`torch.nn.Module.train`; a no-op when the stack is in that mode
        already (skorch sets the mode before every step; the members' forwards set
        the template's)."""
        if isinstance(mode, bool) and mode == self.training:
            return self
        return super().train(mode)

    def _single_reason(self, why=None):
        why = why or ("" if self._fast else f" ({self.path_reason})")
        return f"one member: the head's own forward on its parameters{why}"

    def _report(self, path, reason):
        """Set :attr:`path` and :attr:`path_reason` (only when they change: a module's
        attribute assignment costs more than the comparison)."""
        if self.path != path or self.path_reason != reason:
            self.path, self.path_reason = path, reason

    def pair_underflowed(self):
        """Whether a deferred underflow check (:attr:`defer_underflow_check`) found a
        kernel value of an occurring token pair below the floating-point range in a
        forward since the stack was built (one host sync).

        Returns
        -------
        bool
        """
        return self._underflow is not None and bool(self._underflow)

    def _fast_forward(self, x, counts):
        # None: the tokens repeat too little
        plan = self._pair_plan(x, counts) if self.pair_path else None
        out = None if plan is None else self._pair_forward(x, plan)
        if out is not None:
            self._report("fused-pairs", f"{plan.n_tokens} distinct tokens at "
                         f"{x[..., 0].numel()} positions: maps on the distinct tokens, "
                         "kernel on their pairs")
            return out
        underflow = ("a kernel value of an occurring token pair is below the "
                     "floating-point range when shifted per token")
        if self.n_members == 1:
            self._report("single", self._single_reason(None if plan is None else f" ({underflow})"))
            return self._single_forward(x, counts)
        self._report("fused-positions",
                     "every member's token maps at once, attention per position"
                     if plan is None else f"{underflow}: attention per position, shifted "
                     "per sequence")
        return self._position_forward(x, counts)

    def _single_forward(self, x, counts=None, *, last=False):
        """The one member's output: its head's own forward (the head is the stack's
        submodule, so it holds the stack's parameters and buffers)."""
        template = self.template
        if template.training != self.training:
            template.train(self.training)
        out = template(x, **last_kwargs(template, counts, last))
        return last_output(template, out, last).unsqueeze(0)

    def _cached(self, x, key, make):
        """``make()`` cached for the input ``x``: the same tensor object, not modified
        in place since (its version counter); an inference tensor, which has none, is
        not cached."""
        if x.is_inference():
            return make()
        cache = self._input_cache
        if cache is None or cache[0] is not x or cache[1] != x._version:
            cache = self._input_cache = (x, x._version, {})
        if key not in cache[2]:
            cache[2][key] = make()
        return cache[2][key]

    def _pair_plan(self, x, counts=None):
        """Distinct tokens of ``x`` and the token pair of every (query, key) position.

        None when the tokens repeat too little for :meth:`_pair_forward` to pay (it
        computes every map and the full ``U x U`` kernel on the ``U`` distinct tokens,
        and sums over each position's keys through a sparse matrix of token-pair counts)
        or the sequences are long.
        """
        # keyed by the counts object too (the entry holds it, so its id stays its own)
        key = ("plan", id(counts), None if counts is None else counts._version)
        return self._cached(x, key, lambda: (counts, self._make_plan(x, counts)))[1]

    def _make_plan(self, x, counts=None):
        x = _sequences(x)
        n, N, m = x.shape
        t = self.template
        if n * N < 4 or not ops.is_short(N, t.rank, t.value_dim):
            return None
        uniq, inv = _unique_rows(x.reshape(-1, m))
        U = int(uniq.shape[0])
        if 2 * U > n * N or U * U > n * N * N:
            return None
        # output position (s, i) is row s N + i; its pairs (token of i, token of j),
        # each counted as often as key j occurs (once per position, or its multiplicity)
        tok = inv.view(n, N)
        pairs = (tok[:, :, None] * U + tok[:, None, :]).reshape(-1)
        row = torch.arange(n * N, device=x.device).repeat_interleave(N)
        if counts is None:
            weight = torch.ones(len(pairs), dtype=x.dtype, device=x.device)
        else:
            weight = counts.reshape(n, 1, N).expand(n, N, N).reshape(-1).to(x.dtype)
            keep = weight != 0  # padding slots pair with nothing
            pairs, row, weight = pairs[keep], row[keep], weight[keep]
        # the indices are valid by construction: invariant checks explicitly off for
        # every sparse tensor built here (torch warns when they are left implicit)
        with torch.sparse.check_sparse_tensor_invariants(enable=False), \
                warnings.catch_warnings():  # torch marks its CSR layout as beta
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support")
            pair_counts = torch.sparse_coo_tensor(
                torch.stack([row, pairs]), weight, (n * N, U * U),
                check_invariants=False).coalesce()
            rows = pair_counts.to_sparse_csr()
            rows_t = pair_counts.t().coalesce().to_sparse_csr()
        return _PairPlan(uniq.contiguous(), inv, rows, rows_t, torch.unique(pairs), U, [])

    def _vmap_forward(self, x, counts=None, *, last=False):
        """The generic path: the template's own forward on the stacked parameters.

        Vectorised over the members; a forward that branches on a value it computes
        (:func:`~minip_learn.nn.ops.token_scores` tests the shifted product of many
        log-features for underflow on the host), which :func:`torch.func.vmap` cannot
        trace, runs the members one after the other instead, from then on: the same
        forward of every member on its own slice of the stack.
        """
        template = self.template
        template.train(self.training)
        shared, stacked = self._buffer_dicts()
        params = dict(zip(self.names, self._member_params()))
        kwargs = last_kwargs(template, counts, last)

        def one(p, b, xx):
            out = functional_call(template, (p, b, shared), (xx,), kwargs)
            return last_output(template, out, last)

        if not self._one_by_one:
            try:
                return vmap(one, in_dims=(0, 0, None))(params, stacked, x)
            except RuntimeError as err:
                if "data-dependent control flow" not in str(err):
                    raise
                self._one_by_one = True
        return torch.stack([
            one({k: v[e] for k, v in params.items()},
                {k: v[e] for k, v in stacked.items()}, x)
            for e in range(self.n_members)])

    # -- the fused path ------------------------------------------------------------------
    def _token_maps(self, x, tokens, key):
        """Every member's maps on ``tokens`` (shape (n, N, m), derived from the input
        ``x``, which keys the caches), at once.

        Returns the query and key (log-)features (E, n, N, r), values and readout
        weights (E, n, N, d) and readout bias (E, n, N), in the memory layout
        (feature, member, position, sequence): every product of the attention then runs
        over contiguous rows of ``n`` sequences.
        """
        t = self.template
        P = self._member_params()
        roles = self._roles
        n, N, m = tokens.shape
        E = self.n_members
        X2 = self._cached(x, ("xT", key),
                          lambda: tokens.permute(2, 1, 0).reshape(m, N * n).contiguous())

        def linear(owner, weight="weight", bias="bias"):
            # one matrix product for every member: (E, n, N, o)
            W, b = P[roles[owner, weight]], P[roles[owner, bias]]  # (E, o, m), (E, o)
            o = W.shape[1]
            z = torch.addmm(b.T.reshape(o * E, 1), W.transpose(0, 1).reshape(o * E, m), X2)
            return z.view(o, E, N, n).permute(1, 3, 2, 0)

        def feats(owner, fm):  # log-features of log-domain maps, else features
            if fm.fused_form == "table":
                tab = P[roles[owner, "log_table"]]  # (E, n_tokens, r)
                # the table row of every token; None where the tokens are the table's
                # rows in order (the pair path on the training tokens): no gather
                idx = self._cached(x, ("index", key, id(fm)),
                                   lambda: _gather_index(fm.token_index(tokens).T.reshape(-1),
                                                         tab.shape[1]))
                r = tab.shape[2]
                rows = tab.permute(2, 0, 1)
                if idx is not None:
                    rows = rows[:, :, idx]
                return rows.view(r, E, N, n).permute(1, 3, 2, 0)
            z = linear(owner)
            return z if fm.log_domain else fm.activation(z)

        qf, kf = t.query_features, t.key_features
        fq = feats("query_features", qf)
        fk = fq if kf is qf else feats("key_features", kf)
        w = linear("readout", "weight", "weight_bias")
        b = linear("readout", "bias", "bias_const").squeeze(-1)
        return fq, fk, linear("value"), w, b

    def _mask(self):
        """The rank mask as (E or 1, 1, 1, r), or None."""
        if self._stacked:
            shared, stacked = self._buffer_dicts()
            mask = stacked.get(self._mask_name, shared.get(self._mask_name))
        else:
            mask = self.template.feature_mask
        return None if mask is None else mask.reshape(-1, 1, 1, mask.shape[-1])

    def _position_forward(self, x, counts=None):
        # the head's arithmetic with a leading member dimension
        t = self.template
        x3 = _sequences(x)
        fq, fk, v, w, b = self._token_maps(x, x3, "positions")
        phi_q, phi_k = ops.attention_features(
            fq, fk, log_domain=t.log_domain, mask=self._mask())
        out = ops.head_output(phi_q, phi_k, v, w, b, nonnegative=t.nonnegative,
                                    eps=t.denominator_eps,
                                    counts=None if counts is None else counts.reshape(x3.shape[:2]))
        return out.reshape(out.shape[:1] + x.shape[:-1])

    def _pair_forward(self, x, plan):
        # Few distinct tokens (e.g. a witness suite: 46 tokens at 12,558 positions):
        # every map on the U distinct tokens only, the kernel and the readout-value
        # products <w(u), v(z)> for all U x U token pairs, and the sums over each
        # position's keys as one sparse product (ops.pair_readout). Log-domain
        # features are shifted per feature over all U keys and per query token
        # (ops.attention_features on the distinct tokens); when that shift leaves
        # a kernel value of a pair that occurs below the floating-point range, the
        # per-position path (shifted per sequence) computes it instead. Returns None
        # then.
        t = self.template
        E = self.n_members
        fq, fk, v, w, b = (z.squeeze(1).contiguous()  # (E, U, .): small, made contiguous
                           for z in self._token_maps(x, plan.tokens[None], "pairs"))
        mask = self._mask()
        phi_q, phi_k = ops.attention_features(
            fq, fk, log_domain=t.log_domain, mask=None if mask is None else mask[:, 0])
        alpha = ops.pairwise_dots(phi_q, phi_k).reshape(E, -1)  # (E, U * U)
        if t.log_domain:
            tiny = torch.finfo(alpha.dtype).tiny / torch.finfo(alpha.dtype).eps
            low = alpha.detach().index_select(1, plan.occurring).amin() < tiny
            if self.training and self.defer_underflow_check:
                self._underflow = low if self._underflow is None else self._underflow | low
            elif bool(low):
                return None
        g = ops.pairwise_dots(w, v)  # (E, U, U): <w(query), v(key)>
        if t.log_domain:
            # every occurring pair's kernel value was just checked to be positive, so
            # every denominator is: the guard is the identity and the query's bias
            # joins its pair values, sum alpha (g + b) / sum alpha = (...) + b
            g, b = g + b.unsqueeze(-1), None
        rows, rows_t = plan.rows, plan.rows_t
        if rows.dtype != alpha.dtype:
            rows, rows_t = rows.to(alpha.dtype), rows_t.to(alpha.dtype)
        out = ops.pair_readout(alpha, g.reshape(E, -1), b, plan.token_of, rows, rows_t,
                                     nonnegative=t.nonnegative, eps=t.denominator_eps,
                                     positive=t.log_domain, buffers=plan.buffers)
        return out.reshape(out.shape[:1] + x.shape[:-1])

    def member_state_dict(self, i):
        """Parameters and buffers of member ``i`` at its own (unpadded) shapes.

        Parameters
        ----------
        i : int
            Member index.

        Returns
        -------
        state : dict of str to Tensor
            Detached copies, loadable into a head like the ``i``-th one with
            ``load_state_dict``.
        """
        state = {}
        shapes = self._shapes[i]
        for n, p in zip(self.names, self._member_params()):
            state[n] = _crop_to(p.detach()[i], shapes[n]).clone()
        shared, stacked = self._buffer_dicts()
        for n, shape in self._buffer_shapes[i].items():
            if n in shared:
                state[n] = shared[n].clone()
            elif n in stacked:
                state[n] = _crop_to(stacked[n][i], shape).clone()
        return state

    def crop(self, i, name, tensor):
        """Member ``i``'s block of a stacked tensor shaped like parameter ``name``.

        Parameters
        ----------
        i : int
        name : str
            A name of :attr:`names`.
        tensor : Tensor
            Shaped like the stacked parameter (e.g. an optimizer state).

        Returns
        -------
        Tensor
        """
        return _crop_to(tensor[i] if self._stacked else tensor, self._shapes[i][name])
