"""Feature maps ``phi: R^m -> R^r`` for kernel attention, selected by name.

Every map is a small :class:`torch.nn.Module` made of an *encoder* (a learnable linear
projection, or a small MLP, of the token bits) followed by a fixed activation. All maps
registered with ``nonnegative=True`` produce features ``>= 0`` by construction, so the
kernel ``alpha(x, z) = <phi_Q(x), phi_K(z)>`` is nonnegative for every pair of tokens:
the hypothesis of the lower bound (see :ref:`theory-r4` and :ref:`theory-r5`).

Maps of exponential type (``exp``, ``favor+``, ``table``) are *log-domain*: they expose
``log_features`` and the kernel head exponentiates them after subtracting a shift that
cancels in the normalisation (one per query token, one per key sequence), so they
never overflow.

The registry (``FEATURE_MAPS``, a ``Registry`` of :mod:`minip_learn.nn._registry`, the
class of the mixers' registry too) is the single place that maps names to classes:
:func:`available_feature_maps` lists them, :func:`get_feature_map` resolves a
``feature_map=`` value and :func:`make_feature_map` builds one. Besides a registered
name, ``feature_map=`` takes a :class:`FeatureMap` subclass or a user's map: any
:class:`torch.nn.Module` class (or factory) called as
``cls(n_bits, rank, **feature_kwargs)`` that maps float tokens of shape
``(..., n_bits)`` to features of shape ``(..., rank)``. Such a map declares nothing: it
is wrapped in :class:`UserFeatureMap`, normalised with the guard of signed kernels,
stacked one rank at a time, and the estimators decide whether the theorem covers it
from the kernel values it computes on the training tokens (``kernel_min_``).
"""

import math
import weakref

import torch
from torch import nn

from ._registry import Registry, UserModule

__all__ = []  # public home: the package minip_learn.nn


def _encoder(n_in, n_out, width, depth):
    if depth == 0:
        return nn.Linear(n_in, n_out)
    layers, d = [], n_in
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.GELU()]
        d = width
    layers.append(nn.Linear(d, n_out))
    return nn.Sequential(*layers)


class FeatureMap(nn.Module):
    """Base class: ``phi(x) = activation(encoder(x))`` with ``rank`` outputs.

    Parameters
    ----------
    n_bits : int
        Input dimension (bits per token).
    rank : int
        Number of features ``r``; ``forward`` returns tensors whose last dimension is
        exactly ``rank``.
    width : int, default=64
        Hidden width of the encoder MLP (unused when ``depth=0``).
    depth : int, default=0
        Hidden layers of the encoder; 0 means a single learnable linear projection.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import get_feature_map
    >>> phi = get_feature_map("softplus")(n_bits=5, rank=3, depth=1, width=8)
    >>> phi(torch.zeros(2, 4, 5)).shape, phi.nonnegative, phi.log_domain
    (torch.Size([2, 4, 3]), True, False)
    """

    name = None
    #: where the map comes from: the paper it follows, or that it is a baseline of this
    #: library (every registered map of the library declares it; read by
    #: :func:`feature_map_table`)
    paper = None
    #: features are >= 0 for every input
    nonnegative = True
    #: the kernel ``<phi(x), phi'(z)>`` of two maps of this class is >= 0 for every pair
    #: of tokens; a subclass that does not declare it inherits its own ``nonnegative``
    kernel_nonnegative = True
    #: the map defines ``log_features`` and ``forward = exp(log_features)``
    log_domain = False
    #: the map needs the finite token set seen in fit (``vocabulary=`` argument)
    requires_vocabulary = False
    #: batched form of the map (see ``fused_form``): ``"linear"`` when the map is
    #: ``activation(encoder(x))`` (log-domain: ``log_features = encoder(x)``) with an
    #: activation that is a fixed elementwise function (no parameters, no buffers);
    #: ``"table"`` for a token table (``log_table[token_index(x)]``); None otherwise.
    #: The parameters the batched form reads are declared by ``fused_parameters``
    fused = None
    #: feature ``k`` depends on encoder output ``k`` only (or on its own table column),
    #: so a map of a smaller rank is exactly this map with its encoder zero-padded and
    #: the features beyond the rank masked: heads of different ranks can then be
    #: stacked in one :class:`~minip_learn.nn.HeadEnsemble`. False for maps that mix
    #: the encoder outputs (a softmax or a normalisation over them)
    rank_maskable = True
    #: the constructor takes the encoder options ``width`` and ``depth``
    encoder_options = True
    #: the features of a token depend on that token alone (not on the other tokens of
    #: its sequence nor on the batch), so that a head may compute them once per
    #: distinct token and gather them
    per_token = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "nonnegative" in cls.__dict__ and "kernel_nonnegative" not in cls.__dict__:
            cls.kernel_nonnegative = cls.nonnegative

    def __init__(self, n_bits, rank, *, width=64, depth=0):
        super().__init__()
        self.n_bits = n_bits
        self.rank = rank
        self.encoder = _encoder(n_bits, self.pre_dim, width, depth)

    @property
    def pre_dim(self):
        """Output dimension of the encoder."""
        return self.rank

    @property
    def fused_form(self):
        """What this instance can do in a batched forward of many members.

        ``"linear"``: one matrix product (every member's encoder is a single
        :class:`torch.nn.Linear`) then the activation; ``"table"``: a lookup in the
        stacked tables; None: only the generic path (the class declares no fused form,
        or its encoder is an MLP, ``depth > 0``). Read by
        :class:`~minip_learn.nn.HeadEnsemble`.
        """
        if self.fused == "linear":
            return "linear" if type(self.encoder) is nn.Linear else None
        return self.fused

    def fused_parameters(self):
        """The parameters of the batched form (:attr:`fused_form`), by role.

        Read by :class:`~minip_learn.nn.HeadEnsemble` when it is built, so that the
        fused forward never looks a parameter up by its name.

        Returns
        -------
        roles : dict of str to torch.nn.Parameter
            ``{"weight": W, "bias": b}``, the linear encoder ``z = W x + b``, for the
            ``"linear"`` form; empty when the map has no fused form.
        """
        if self.fused_form != "linear":
            return {}
        return {"weight": self.encoder.weight, "bias": self.encoder.bias}

    def activation(self, z):
        raise NotImplementedError

    def forward(self, x):
        if self.log_domain:
            return torch.exp(self.log_features(x))
        return self.activation(self.encoder(x))

    def log_features(self, x):
        """Logarithm of the features (log-domain maps only)."""
        if not self.log_domain:
            raise NotImplementedError(f"{type(self).__name__} is not a log-domain map")
        return self.encoder(x)

    def extra_repr(self):
        return f"name={self.name!r}, n_bits={self.n_bits}, rank={self.rank}"


class UserFeatureMap(UserModule, FeatureMap):
    """A user's map, ``factory(n_bits, rank, **kwargs)``, seen as a :class:`FeatureMap`.

    :func:`make_feature_map` wraps any :class:`torch.nn.Module` class or factory that
    is not a :class:`FeatureMap` in this class. It declares nothing it cannot know:
    ``nonnegative`` and ``kernel_nonnegative`` are False (the head normalises with the
    guard of signed kernels, and the estimators flag the theorem from the kernel values
    the fitted map computes, ``kernel_min_``), no fused form, ``per_token=False`` (its
    features are computed at every position), and ``rank_maskable=False`` (heads of
    several ranks train one rank at a time). The estimator stays picklable and
    clonable when ``factory`` is importable (a class or function defined at module
    level).

    Parameters
    ----------
    n_bits, rank : int
        Passed to ``factory`` first.
    %(user)s

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import UserFeatureMap
    >>> phi = UserFeatureMap(6, 4, factory=torch.nn.Linear, bias=False)
    >>> phi(torch.ones(2, 6)).shape, phi.nonnegative, phi.name
    (torch.Size([2, 4]), False, 'torch.nn.modules.linear.Linear')
    """

    nonnegative = False
    kernel_nonnegative = False
    rank_maskable = False
    encoder_options = False
    per_token = False

    def __init__(self, n_bits, rank, *, factory, **kwargs):
        nn.Module.__init__(self)
        self.n_bits = n_bits
        self.rank = rank
        self.hold(FEATURE_MAPS, factory, n_bits, rank, **kwargs)


#: The registry of feature maps: names to :class:`FeatureMap` subclasses.
FEATURE_MAPS = Registry(
    "feature map", "feature_map", FeatureMap, UserFeatureMap,
    call="cls(n_bits, rank, **feature_kwargs)",
    columns={"paper": lambda cls: cls.paper,
             "nonnegative": lambda cls: bool(cls.nonnegative),
             "kernel_nonnegative": lambda cls: bool(cls.kernel_nonnegative)})
FEATURE_MAPS.document(UserFeatureMap)
#: Readable name of a ``feature_map=`` value, for messages and tables.
feature_map_name = FEATURE_MAPS.name
#: Whether a ``feature_map=`` value is a registered map (by name or class): maps the
#: library checks itself, whose outputs :func:`check_feature_map_output` need not check
#: at fit.
is_registered = FEATURE_MAPS.is_registered


@FEATURE_MAPS.document
def register_feature_map(name):
    """Class decorator adding a :class:`FeatureMap` subclass to the registry.

    Parameters
    ----------
    name : str
        Registry name (must be new); the class gets it as ``name``.

    %(register_returns)s

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import (FeatureMap, make_feature_map, register_feature_map,
    ...                             unregister_feature_map)
    >>> @register_feature_map("doc-sigmoid")
    ... class Sigmoid(FeatureMap):
    ...     def activation(self, z):
    ...         return torch.sigmoid(z)
    >>> make_feature_map("doc-sigmoid", 4, 2)(torch.ones(3, 4)).shape
    torch.Size([3, 2])
    >>> _ = unregister_feature_map("doc-sigmoid")  # keep the registry as it was
    """
    return FEATURE_MAPS.register(name)


@FEATURE_MAPS.document
def unregister_feature_map(name):
    """Remove a feature map from the registry (the inverse of
    :func:`register_feature_map`).

    %(unregister)s

    Examples
    --------
    >>> from minip_learn.nn import FeatureMap, register_feature_map, unregister_feature_map
    >>> Doc = register_feature_map("doc-constant")(type("Doc", (FeatureMap,), {}))
    >>> unregister_feature_map("doc-constant") is Doc
    True
    """
    return FEATURE_MAPS.unregister(name)


def available_feature_maps(*, nonnegative=None):
    """Names of the registered feature maps, sorted.

    Parameters
    ----------
    nonnegative : bool or None, default=None
        If given, only maps whose ``nonnegative`` flag equals it.

    Returns
    -------
    names : list of str

    Examples
    --------
    >>> from minip_learn.nn import available_feature_maps
    >>> {"elu+1", "exp", "favor+", "table"} <= set(available_feature_maps())
    True
    """
    return FEATURE_MAPS.available(nonnegative=nonnegative)


def feature_map_table():
    """The registry as a table: one row per registered feature map, sorted by name.

    The documentation's list of feature maps is generated from these rows, so it always
    names exactly the registered maps.

    Returns
    -------
    rows : list of dict
        In the order of :func:`available_feature_maps`, one dict per map with keys
        ``"name"`` (the registry name), ``"paper"`` (the class's ``paper`` declaration:
        the paper the map follows, or that it is a baseline of this library; None for a
        map that declares nothing), ``"nonnegative"`` (its features are ``>= 0``),
        ``"kernel_nonnegative"`` (its kernel ``<phi_Q(x), phi_K(z)>`` is ``>= 0`` for
        every pair of tokens: the hypothesis of the lower bound, :ref:`theory-r5`) and
        ``"class"`` (the qualified name of the class).

    Examples
    --------
    >>> from minip_learn.nn import available_feature_maps, feature_map_table
    >>> rows = feature_map_table()
    >>> [row["name"] for row in rows] == available_feature_maps()
    True
    >>> taylor = next(row for row in rows if row["name"] == "taylor")
    >>> taylor["nonnegative"], taylor["kernel_nonnegative"]
    (False, True)
    >>> next(row["paper"] for row in rows if row["name"] == "elu+1")
    'Katharopoulos et al. 2020, Transformers are RNNs'
    """
    return FEATURE_MAPS.table()


@FEATURE_MAPS.document
def get_feature_map(name):
    """Return the feature-map class that ``feature_map=name`` builds.

    Parameters
    ----------
    name : str, FeatureMap subclass or callable
        A registered name, a :class:`FeatureMap` subclass (returned as is), or a user's
        map: a :class:`torch.nn.Module` class or any factory called as
        ``name(n_bits, rank, **feature_kwargs)``, for which :class:`UserFeatureMap`
        (the wrapper :func:`make_feature_map` puts around it) is returned.

    Returns
    -------
    cls : FeatureMap subclass
        Its class attributes are the map's declarations (``paper``, ``nonnegative``,
        ``kernel_nonnegative``, ``log_domain``, ``requires_vocabulary``, ``fused``,
        ``rank_maskable``).

    %(get_raises)s

    Examples
    --------
    >>> from torch import nn
    >>> from minip_learn.nn import get_feature_map
    >>> get_feature_map("elu+1").name
    'elu+1'
    >>> get_feature_map(nn.Linear).__name__, get_feature_map(nn.Linear).nonnegative
    ('UserFeatureMap', False)
    """
    return FEATURE_MAPS.get(name)


@FEATURE_MAPS.document
def make_feature_map(name, n_bits, rank, **kwargs):
    """Build the feature map ``name`` from ``n_bits`` inputs to ``rank`` features.

    Parameters
    ----------
    name : str, FeatureMap subclass or callable
        As in :func:`get_feature_map`; a user's module class or factory is called as
        ``name(n_bits, rank, **kwargs)`` and wrapped in :class:`UserFeatureMap`.
    n_bits, rank : int
        Input bits and number of features.
    **kwargs
        Options of the map class (``width``, ``depth``, ``floor``, ``vocabulary`` ...).

    Returns
    -------
    FeatureMap

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_feature_map
    >>> phi = make_feature_map("elu+1", n_bits=6, rank=4)
    >>> out = phi(torch.ones(3, 6))
    >>> bool((out > 0).all()), tuple(out.shape)
    (True, (3, 4))
    >>> make_feature_map(torch.nn.Linear, 6, 4)(torch.ones(3, 6)).shape
    torch.Size([3, 4])
    """
    return FEATURE_MAPS.make(name, n_bits, rank, **kwargs)


def check_feature_map_output(phi, x, name):
    """Check that the map ``phi`` sends the tokens ``x`` to a tensor of features of
    shape ``(len(x), rank)`` without NaN: a clear ValueError naming the map otherwise.

    Parameters
    ----------
    phi : FeatureMap
    x : Tensor of shape (n_tokens, n_bits)
    name : str, FeatureMap subclass or callable
        The ``feature_map=`` value, named in the message.

    Raises
    ------
    ValueError
        If the output is not a tensor, has another shape, or contains NaN.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import check_feature_map_output, make_feature_map
    >>> phi = make_feature_map(torch.nn.Linear, 6, 3)
    >>> check_feature_map_output(phi, torch.zeros(5, 6), torch.nn.Linear)
    >>> short = make_feature_map(lambda n_bits, rank: torch.nn.Linear(n_bits, rank - 1), 6, 3)
    >>> check_feature_map_output(short, torch.zeros(5, 6), "my map")
    Traceback (most recent call last):
    ...
    ValueError: feature_map='my map' must map tokens of shape (n_tokens, n_bits) to ...
    """  # noqa: E501
    with torch.no_grad():
        out = phi.log_features(x) if phi.log_domain else phi(x)
    FEATURE_MAPS.check_shape(out, name, (x.shape[0], phi.rank), what="features",
                             tokens="(n_tokens, n_bits)", shape="(n_tokens, rank)")
    if torch.isnan(out).any():
        raise ValueError(
            f"feature_map={feature_map_name(name)!r} returns NaN features on "
            f"{int(torch.isnan(out).any(-1).sum())} of the {len(x)} training tokens."
        )




@register_feature_map("elu+1")
class EluPlusOne(FeatureMap):
    """``elu(z) + 1`` (Katharopoulos et al., 2020): positive everywhere."""

    paper = "Katharopoulos et al. 2020, Transformers are RNNs"
    fused = "linear"

    def activation(self, z):
        # exp(z) for z <= 0 (elu(z) + 1 = expm1(z) + 1 would lose the relative precision
        # of exp(z) and be exactly 0 below z = -37.5 in float64), z + 1 above; two
        # elementwise ops, no select (the forward costs what elu's does)
        return torch.exp(torch.clamp(z, max=0.0)) + torch.relu(z)


@register_feature_map("relu")
class ReLUFloor(FeatureMap):
    """``relu(z) + floor``; the floor keeps every key visible (default ``1e-4``)."""

    paper = "none: a baseline of this library"
    fused = "linear"

    def __init__(self, n_bits, rank, *, floor=1e-4, **kwargs):
        super().__init__(n_bits, rank, **kwargs)
        self.floor = float(floor)

    def activation(self, z):
        return torch.relu(z) + self.floor


@register_feature_map("softplus")
class Softplus(FeatureMap):
    """``softplus(z) = log(1 + e^z)``."""

    paper = "none: a baseline of this library"
    fused = "linear"

    def activation(self, z):
        return nn.functional.softplus(z)


@register_feature_map("squared_relu")
class SquaredReLU(ReLUFloor):
    """``relu(z)^2 + floor`` (default floor ``1e-4``)."""

    paper = "none: a baseline of this library"

    def activation(self, z):
        return torch.relu(z).square() + self.floor


@register_feature_map("exp")
class Exp(FeatureMap):
    """``exp(z)``: log-domain, computed with a shift that cancels in the normalisation."""

    paper = "none: a baseline of this library"
    log_domain = True
    fused = "linear"


@register_feature_map("favor+")
class PositiveRandomFeatures(FeatureMap):
    """Positive random features of FAVOR+ (Choromanski et al., 2021).

    The token is first projected to ``proj_dim`` dimensions, ``h = encoder(x)``; then
    ``phi(h)_k = exp(w_k^T h - |h|^2 / 2) / sqrt(rank)`` with fixed Gaussian directions
    ``w_k`` (orthogonal blocks when ``orthogonal=True``), an unbiased estimator of the
    softmax kernel ``exp(<h, h'>)``.
    """

    paper = "Choromanski et al. 2021, Rethinking Attention with Performers"
    log_domain = True

    def __init__(self, n_bits, rank, *, proj_dim=None, orthogonal=True, **kwargs):
        self.proj_dim = n_bits if proj_dim is None else int(proj_dim)
        super().__init__(n_bits, rank, **kwargs)
        W = torch.randn(rank, self.proj_dim)
        if orthogonal:
            blocks = []
            for start in range(0, rank, self.proj_dim):
                rows = min(self.proj_dim, rank - start)
                q, r = torch.linalg.qr(torch.randn(self.proj_dim, self.proj_dim))
                # the sign correction makes q Haar-distributed (without it the rows lean
                # towards -e_k and the kernel estimate is biased)
                q = q * torch.sign(torch.diagonal(r))
                norms = torch.randn(rows, self.proj_dim).norm(dim=1, keepdim=True)
                blocks.append(q[:rows] * norms)
            W = torch.cat(blocks)
        self.register_buffer("directions", W)

    @property
    def pre_dim(self):
        return self.proj_dim

    def log_features(self, x):
        h = self.encoder(x)
        return (
            h @ self.directions.T
            - 0.5 * h.square().sum(-1, keepdim=True)
            - 0.5 * math.log(self.rank)
        )


@register_feature_map("table")
class TokenTable(FeatureMap):
    """A free feature vector per distinct token: the arbitrary map of the theorem.

    The table is indexed by the finite token set seen in fit (``vocabulary``); features
    are stored as logarithms so that they are positive, and an entry of ``-inf`` (or
    below about ``-745``) gives an exact zero. Looking up a token that is not in the
    vocabulary raises a ``ValueError``.

    Parameters
    ----------
    vocabulary : array-like of shape (n_tokens, n_bits)
        The distinct tokens.
    init_scale : float, default=0.1
        Standard deviation of the initial log-features.
    """

    paper = ("Opazo 2026, Three Tokens Force Exponential Feature Rank in Nonnegative Kernel "
             "Attention (the theorem's arbitrary map)")
    log_domain = True
    requires_vocabulary = True
    fused = "table"

    def __init__(self, n_bits, rank, *, vocabulary, init_scale=0.1, width=None, depth=None):
        nn.Module.__init__(self)
        self.n_bits = n_bits
        self.rank = rank
        vocab = torch.as_tensor(vocabulary, dtype=torch.float32)
        if vocab.ndim != 2 or vocab.shape[1] != n_bits or len(vocab) == 0:
            raise ValueError(
                f"vocabulary must have shape (n_tokens>=1, {n_bits}); got {tuple(vocab.shape)}"
            )
        self.register_buffer("vocabulary", vocab)
        self.log_table = nn.Parameter(init_scale * torch.randn(len(vocab), rank))
        self._index_cache = None

    def __getstate__(self):
        # the index of the last input is a cache: never pickled or copied
        state = dict(super().__getstate__())
        state["_index_cache"] = None
        return state

    def token_index(self, x):
        """Index of each token of ``x`` in the vocabulary (exact match).

        The indices of the last input tensor (and of its views, such as its last
        position) are kept: the same tensor again, not modified in place since, with
        the same vocabulary (full-batch training, every epoch), is not looked up
        again, so that an epoch neither repeats the lookup nor reads the device's check
        of it on the host.
        """
        if x.is_inference():  # no version counter to key the cache on
            return self._lookup(x)
        base = x if x._base is None else x._base
        view = (x.storage_offset(), tuple(x.shape), x.stride(), x.dtype)
        cache = getattr(self, "_index_cache", None)
        if (cache is None or cache[0]() is not base or cache[1] != base._version
                or cache[2] is not self.vocabulary):  # (the input is held weakly)
            cache = self._index_cache = (weakref.ref(base), base._version, self.vocabulary,
                                         {})
        if view not in cache[3]:
            cache[3][view] = self._lookup(x)
        return cache[3][view]

    def _lookup(self, x):
        vocab = self.vocabulary.to(x.dtype)
        # squared distance, exact for 0/1 tokens
        d = (
            x.square().sum(-1, keepdim=True)
            - 2 * x @ vocab.T
            + vocab.square().sum(-1)
        )
        dist, idx = d.min(-1)
        if (dist.abs() > 1e-3).any():
            raise ValueError(
                "feature_map='table' got token(s) not seen in fit; a table map is defined "
                "only on its vocabulary of training tokens."
            )
        return idx

    def log_features(self, x):
        # index_select: its backward (index_add) costs a fraction of advanced indexing's
        idx = self.token_index(x)
        return self.log_table.index_select(0, idx.reshape(-1)).view(
            idx.shape + self.log_table.shape[-1:])

    def fused_parameters(self):
        """The parameters of the batched form, by role: ``{"log_table": table}``."""
        return {"log_table": self.log_table}

    def extra_repr(self):
        return f"name='table', n_tokens={len(self.vocabulary)}, rank={self.rank}"


# ---------------------------------------------------------------------------------
# Signed feature maps: outside the lower bound's hypothesis (theory-r7), except that
# the Taylor kernel happens to be positive (see SecondOrderTaylor).
# ---------------------------------------------------------------------------------
@register_feature_map("identity")
class Identity(FeatureMap):
    """No activation: ``phi(x) = encoder(x)``, signed features (plain linear attention).

    The kernel ``alpha(x, z) = <phi_Q(x), phi_K(z)>`` takes both signs, so this map is
    **outside** the hypothesis of the lower bound (:ref:`theory-r7`); the kernel head then
    normalises with a guarded denominator (see ``KernelAttentionHead``). ``rank`` is
    the output size of the encoder.
    """

    paper = "none: a baseline of this library (linear attention without a feature map)"
    nonnegative = False
    fused = "linear"

    def activation(self, z):
        return z


def _taylor_rank(proj_dim):
    """Number of features of the second-order Taylor map on ``proj_dim`` dimensions."""
    return 1 + proj_dim + proj_dim * (proj_dim + 1) // 2


@register_feature_map("taylor")
class SecondOrderTaylor(FeatureMap):
    """Second-order Taylor features of ``exp`` (as in Based, Arora et al., 2024).

    With a learnable projection ``z = encoder(x)`` of dimension ``proj_dim``, the
    features are ``1``, every ``z_k``, every ``z_k^2 / sqrt(2)`` and every ``z_j z_k``
    (``j < k``), so that ``phi(x) . phi(y) = 1 + z.z' + (z.z')^2 / 2`` exactly. This is
    the kernel of Based's ``[1, z, vec(z z^T) / sqrt(2)]`` with each product ``z_j z_k``
    (``j != k``) stored once instead of twice, so the reported ``rank`` is the real
    feature dimension. They are ordered by projection coordinate --
    ``[1; z_0, z_0^2/sqrt(2); z_1, z_1^2/sqrt(2), z_0 z_1; z_2, ...]`` -- so the map of
    a smaller ``proj_dim`` is a prefix of a larger one whose extra coordinates are 0
    (rank-nested, as the rank masks of :class:`~minip_learn.nn.HeadEnsemble` assume):

        ``rank = 1 + proj_dim + proj_dim (proj_dim + 1) / 2``  (3, 6, 10, 15, 21, 28 ...)

    ``proj_dim`` is derived from ``rank`` (a ``rank`` that is not of this form is a
    ``ValueError`` listing the nearest valid ones); an explicit ``proj_dim`` must agree
    with ``rank``.

    The features are signed (``nonnegative = False``) but the **kernel is positive**:
    ``1 + t + t^2/2 = ((1 + t)^2 + 1) / 2 >= 1/2`` for every real ``t``. So the lower
    bound (:ref:`theory-r4`, :ref:`theory-r5`) *does* apply to this map
    (``kernel_nonnegative = True``; a kernel head built on it reports
    ``nonnegative=True``), and a fit below the certified rank must fail.
    """

    paper = ("Arora et al. 2024, Simple linear attention language models balance the "
             "recall-throughput tradeoff (Based)")
    nonnegative = False
    #: the kernel ``<phi_Q(x), phi_K(z)>`` is >= 0 although the features are signed
    kernel_nonnegative = True

    def __init__(self, n_bits, rank, *, proj_dim=None, **kwargs):
        self.proj_dim = self.check_params(n_bits, rank, proj_dim=proj_dim)["proj_dim"]
        super().__init__(n_bits, rank, **kwargs)
        # feature = e[a] * e[b] * scale with e = [1, z]: (0, 0) is the constant, (0, k)
        # the linear term z_k, (k, k) the square (scaled), (j, k) the product, j < k
        terms = [(0, 0)]
        for k in range(1, self.proj_dim + 1):
            terms += [(0, k), (k, k)] + [(j, k) for j in range(1, k)]
        self.register_buffer("_terms", torch.tensor(terms).T.contiguous(), persistent=False)
        # which features are squares (scaled by 1/sqrt(2) in the dtype of the input: a
        # bool buffer, so that a float64 copy of a float32 map keeps the exact constant)
        self.register_buffer("_square", torch.tensor([a == b != 0 for a, b in terms]),
                             persistent=False)

    @classmethod
    def check_params(cls, n_bits, rank, **kwargs):
        """Validate ``rank`` (and ``proj_dim``); return ``{"proj_dim": p}``."""
        p = 1
        while _taylor_rank(p + 1) <= rank:
            p += 1
        proj_dim = kwargs.get("proj_dim")
        if _taylor_rank(p) != rank:
            raise ValueError(
                f"feature_map='taylor' has rank 1 + p + p(p+1)/2 for a projection of "
                f"dimension p >= 1; rank={rank} is not of this form (nearest valid ranks: "
                f"{_taylor_rank(p)} with proj_dim={p}, {_taylor_rank(p + 1)} with "
                f"proj_dim={p + 1})."
            )
        if proj_dim is not None and proj_dim != p:
            raise ValueError(
                f"feature_map='taylor' with proj_dim={proj_dim} has rank "
                f"{_taylor_rank(proj_dim)}, not rank={rank}; leave proj_dim=None to derive "
                "it from rank."
            )
        return {"proj_dim": p}

    @property
    def pre_dim(self):
        return self.proj_dim

    def activation(self, z):
        e = torch.cat([torch.ones_like(z[..., :1]), z], dim=-1)
        a, b = self._terms
        products = e[..., a] * e[..., b]
        return torch.where(self._square, products * math.sqrt(0.5), products)


@register_feature_map("rff")
class RandomFourierFeatures(FeatureMap):
    """Random Fourier features ``sqrt(2/r) cos(w_k^T h + b_k)`` (Rahimi & Recht, 2007).

    ``h = encoder(x)`` is a learnable projection of dimension ``proj_dim`` (default
    ``n_bits``); the directions ``w_k ~ N(0, I / bandwidth^2)`` and phases
    ``b_k ~ U[0, 2 pi)`` are fixed buffers. In expectation the kernel is the Gaussian
    ``exp(-|h - h'|^2 / (2 bandwidth^2))``, which is positive, but at any finite rank
    ``r`` the features and the kernel are **signed**: outside the lower bound's
    hypothesis (:ref:`theory-r7`). Any ``rank >= 1``.
    """

    paper = "Rahimi & Recht 2007, Random Features for Large-Scale Kernel Machines"
    nonnegative = False

    def __init__(self, n_bits, rank, *, proj_dim=None, bandwidth=1.0, **kwargs):
        self.proj_dim = n_bits if proj_dim is None else int(proj_dim)
        super().__init__(n_bits, rank, **kwargs)
        self.bandwidth = float(bandwidth)
        self.register_buffer("directions", torch.randn(rank, self.proj_dim) / self.bandwidth)
        self.register_buffer("phases", 2 * math.pi * torch.rand(rank))
        # a buffer, not a constant of the class: a member of a HeadEnsemble padded to a
        # larger rank keeps the scale of its own rank. It holds the rank (an integer, which
        # a change of dtype leaves alone); sqrt(2 / rank) is taken in the input's dtype
        self.register_buffer("scale_rank", torch.tensor(rank), persistent=False)

    @property
    def pre_dim(self):
        return self.proj_dim

    def activation(self, z):
        scale = torch.sqrt(2.0 / self.scale_rank.to(z.dtype))
        return scale * torch.cos(z @ self.directions.T + self.phases)
