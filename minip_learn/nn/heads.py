"""Single attention heads for Min-IP (see :ref:`theory`), as plain torch modules.

Both heads share a value map ``v(x)`` and a query-dependent affine readout
``rho_x(u) = <w(x), u> + b(x)`` and map a batch of sequences of shape
``(batch, seq_len, n_bits)`` to real outputs of shape ``(batch, seq_len)``.

Both also take sequences in multiset form: ``x`` holds the distinct tokens of every
sequence (its slots) and the keyword ``counts`` (shape ``(batch, n_slots)``) how often
each occurs, 0 for a padding slot. Without a positional map and without a causal mask,
the output at a slot equals the output of the materialised sequence at every position
of that token (see :mod:`minip_learn.nn.attention`); a padding slot adds nothing to
any sum. Causal heads (``causal=True``: position ``i`` attends to ``j <= i``) and
heads with a positional map (``positional``) depend on the order of the tokens and
refuse ``counts`` with a ValueError.

* :class:`KernelAttentionHead` computes normalised kernel attention through the
  fixed-size sketch ``S = sum_j phi_K(x_j) v(x_j)^T``, ``s = sum_j phi_K(x_j)``:
  ``u_i = phi_Q(x_i)^T S / phi_Q(x_i)^T s``. Cost ``O(N r d)``. Its arithmetic is that
  of :mod:`minip_learn.nn.attention`.
* :class:`SoftmaxAttentionHead` computes dense softmax attention with scores
  ``q(x_i)^T k(x_j) / temperature``. Cost ``O(N^2 d_s)``.

No scikit-learn in this layer.
"""

import copy
import math

import numpy as np
import torch
from torch import nn

from .._validation import distinct_tokens
from . import ops
from ._registry import RecordsArguments
from .feature_maps import get_feature_map, make_feature_map
from .readout import AffineReadout, ValueMap

__all__ = []  # public home: the package minip_learn.nn


class _Head(RecordsArguments, nn.Module):
    def __init__(self, n_bits, value_dim):
        super().__init__()
        self.n_bits = n_bits
        self.value_dim = n_bits if value_dim is None else value_dim
        self.value = ValueMap(n_bits, self.value_dim)
        self.readout = AffineReadout(n_bits, self.value_dim)

    def forward(self, x, counts=None):
        u = self.attention_weights(x, counts) @ self.value(x)
        return self.readout(x, u)

    @torch.no_grad()
    def set_identity_value_readout(self, *, scale=1.0, bias_per_bit=0.0, bias=0.0):
        """Set the value map and readout of the exact constructions.

        ``v(x) = x`` and ``rho_x(u) = scale <x, u> + bias_per_bit |x| + bias``
        (:ref:`theory-r1` to :ref:`theory-r3`). Needs ``value_dim == n_bits``.

        Parameters
        ----------
        scale, bias_per_bit, bias : float

        Returns
        -------
        self
        """
        if self.value_dim != self.n_bits:
            raise ValueError(f"the identity value map needs value_dim == n_bits "
                             f"({self.n_bits}); got value_dim={self.value_dim}.")
        eye = torch.eye(self.n_bits, dtype=self.value.linear.weight.dtype,
                        device=self.value.linear.weight.device)
        self.value.set_affine(eye, 0.0)
        self.readout.set_affine(scale * eye, 0.0, float(bias_per_bit), bias)
        return self


POSITIONAL = ("decay", "learned")


def _check_last(counts):
    """A ValueError for ``last=True`` with ``counts``: the last position is that of a
    materialised sequence."""
    if counts is not None:
        raise ValueError("last=True reads the output at the last position, which "
                         "sequences in multiset form (counts) do not have.")


def _check_order_options(causal, positional, decay, max_len):
    """The checked ``(causal, positional, decay, max_len)`` of a kernel head."""
    causal = bool(causal)
    if positional is not None and positional not in POSITIONAL:
        raise ValueError(f"positional must be one of {POSITIONAL} or None; got {positional!r}.")
    if positional == "decay":
        if decay is None:
            raise ValueError("positional='decay' needs decay, the factor gamma in (0, 1] of "
                             "alpha_ij = gamma^(i-j) <phi(x_i), phi(x_j)>; got decay=None.")
        ops.log_decay(decay)
        if not causal:
            raise ValueError("positional='decay' needs causal=True: the decayed kernel "
                             "g^(i-j) <phi(x_i), phi(x_j)> is defined for keys j <= i.")
        decay = float(decay)
    elif decay is not None:
        raise ValueError(f"decay is the factor of positional='decay'; got decay={decay!r} "
                         f"with positional={positional!r}.")
    if positional == "learned":
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
            raise ValueError("positional='learned' needs max_len, the longest sequence "
                             f"(an int >= 1); got max_len={max_len!r}.")
        max_len = int(max_len)
    else:
        max_len = None
    return causal, positional, decay, max_len


class KernelAttentionHead(_Head):
    """Normalised kernel attention of rank ``r`` computed through its sketch.

    Parameters
    ----------
    n_bits : int
        Bits per token ``m``.
    rank : int
        Number of features ``r``.
    feature_map : str, FeatureMap subclass or callable, default="elu+1"
        Name in the feature-map registry (see
        :func:`~minip_learn.nn.available_feature_maps`), a :class:`FeatureMap`
        subclass, or a user's :class:`torch.nn.Module` class or factory called as
        ``feature_map(n_bits, rank, **feature_kwargs)`` (see
        :func:`~minip_learn.nn.make_feature_map`).
    value_dim : int, default=None
        Dimension ``d`` of the value map; ``None`` means ``n_bits`` (the constructions
        need ``d >= m``).
    feature_width, feature_depth : int
        Encoder MLP width and number of hidden layers (0 = linear projection).
    shared_features : bool, default=False
        Use one map for queries and keys (``phi_Q = phi_K``).
    feature_kwargs : dict, default=None
        Extra keyword arguments of the feature-map class (``floor``, ``proj_dim``,
        ``vocabulary`` for ``table`` ...).
    denominator_eps : float, default=1e-3
        Guard of the normalisation for *signed* kernels only (``nonnegative`` False,
        e.g. ``identity`` or ``rff`` features, see :ref:`theory-r7`): there the
        denominator ``phi_Q(x_i)^T s`` can vanish or change sign, and it is replaced by
        ``sign(den) * max(|den|, denominator_eps)`` (``sign(0) = +1``), which keeps the
        exact normalisation whenever ``|den| >= denominator_eps`` and bounds the output
        by ``|num| / denominator_eps`` otherwise. Nonnegative kernels ignore it (their
        zero denominator, a query that sees no key, is replaced by 1).
    causal : bool, default=False
        Position ``i`` attends to the keys ``j <= i`` only
        (:func:`minip_learn.nn.ops.causal_attend`: the masked explicit kernel
        within blocks of :data:`~minip_learn.nn.ops.CAUSAL_CHUNK` positions,
        the prefix sketch between them). :meth:`recurrent` computes the same outputs
        token by token from a fixed-size state.
    positional : {None, "decay", "learned"}, default=None
        Position-dependent token maps. ``"decay"``: RetNet's normalised decayed
        attention, ``phi_Q(x, i) = g^i phi_Q(x)`` and ``phi_K(x, j) = g^-j phi_K(x)``,
        i.e. ``alpha_ij = g^(i-j) <phi_Q(x_i), phi_K(x_j)>`` (needs ``causal=True``;
        computed from the offsets ``i - j >= 0``, never from ``g^-j``). ``"learned"``:
        learned per-position log-weights of the features, ``phi_Q(x, i) =
        exp(a_i) * phi_Q(x)`` and ``phi_K(x, j) = exp(b_j) * phi_K(x)`` (elementwise,
        ``a, b`` of shape ``(max_len, rank)``, initialised to 0; log-domain maps add
        them to their log-features). The kernel stays nonnegative for nonnegative
        maps: every factor is positive. Causal or not.
    decay : float in (0, 1], default=None
        The factor ``gamma`` of ``positional="decay"`` (required there, refused
        elsewhere).
    max_len : int, default=None
        Longest sequence of ``positional="learned"`` (required there; longer sequences
        are a ValueError); ignored otherwise.

    Attributes
    ----------
    feature_mask : Tensor of shape (rank,) or None
        Optional rank mask (buffer, default None; see :meth:`features`).
    position_query, position_key : Parameter of shape (max_len, rank)
        The learned log-weights of ``positional="learned"``.

    Notes
    -----
    Theorem coverage (:attr:`theorem`): the library's proof of the lower bound
    (:ref:`theory-r4`, :ref:`theory-r5`) is for positionless maps. A causal head is
    covered on final-query sequences: its output at the last position sees every
    token and equals the non-causal head's output there. Positional maps are covered
    on final-query families that hold every order of their keys (``theorem =
    "positional"``, :ref:`theory-positional`); signed kernels are not (``"no"``,
    :ref:`theory-r7`).

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import KernelAttentionHead
    >>> head = KernelAttentionHead(n_bits=6, rank=4)
    >>> head(torch.zeros(2, 3, 6)).shape, head.nonnegative
    (torch.Size([2, 3]), True)
    >>> causal = KernelAttentionHead(6, 4, causal=True, positional="decay", decay=0.9).double()
    >>> x = torch.rand(2, 5, 6, dtype=torch.float64)
    >>> torch.allclose(causal(x), causal.recurrent(x)), causal.theorem
    (True, 'positional')
    """

    #: batched form (read by :class:`~minip_learn.nn.HeadEnsemble`): the fused
    #: forward applies when the feature maps, value map and readout declare one too
    #: (and the head is not :attr:`ordered`)
    fused = "kernel"
    # defaults of heads built before these options existed (e.g. unpickled ones)
    causal = False
    positional = None
    decay = None
    max_len = None

    def __init__(
        self,
        n_bits,
        rank,
        *,
        feature_map="elu+1",
        value_dim=None,
        feature_width=64,
        feature_depth=0,
        shared_features=False,
        feature_kwargs=None,
        denominator_eps=1e-3,
        causal=False,
        positional=None,
        decay=None,
        max_len=None,
    ):
        super().__init__(n_bits, value_dim)
        self.denominator_eps = float(denominator_eps)
        self.causal, self.positional, self.decay, self.max_len = _check_order_options(
            causal, positional, decay, max_len)
        cls = get_feature_map(feature_map)
        kwargs = dict(feature_kwargs or {})
        if cls.encoder_options and not cls.requires_vocabulary:
            kwargs.setdefault("width", feature_width)
            kwargs.setdefault("depth", feature_depth)
        self.rank = rank
        # None leaves the head and its state_dict exactly as without a mask
        self.register_buffer("feature_mask", None)
        self.query_features = make_feature_map(feature_map, n_bits, rank, **kwargs)
        self.key_features = (
            self.query_features if shared_features
            else make_feature_map(feature_map, n_bits, rank, **kwargs)
        )
        if self.positional == "learned":
            # learned log-weights of the query and key features at every position
            self.position_query = nn.Parameter(torch.zeros(self.max_len, rank))
            self.position_key = nn.Parameter(torch.zeros(self.max_len, rank))

    @property
    def nonnegative(self):
        """Whether the kernel is nonnegative by construction.

        True when both feature maps declare ``nonnegative``, and also when queries and
        keys use one map class that declares ``kernel_nonnegative`` (e.g. ``taylor``:
        signed features, kernel ``1 + t + t^2/2 > 0``) and no rank mask is set.
        """
        qf, kf = self.query_features, self.key_features
        if qf.nonnegative and kf.nonnegative:
            return True
        return (
            type(qf) is type(kf)
            and bool(type(qf).kernel_nonnegative)
            and self.feature_mask is None
        )

    @property
    def ordered(self):
        """Whether the outputs depend on the order of the tokens (``causal`` or a
        ``positional`` map): such a head takes no ``counts`` and has no fused form."""
        return bool(self.causal or self.positional is not None)

    @property
    def theorem(self):
        """Which statement covers this head: ``"yes"`` (the library's proof,
        :ref:`theory-r4` and :ref:`theory-r5`: a nonnegative kernel of positionless
        maps, causal or not -- a causal head's last output sees every token),
        ``"positional"`` (a nonnegative kernel of position-dependent maps, covered on
        final-query families that hold every order of their keys,
        :ref:`theory-positional`) or ``"no"`` (a signed kernel,
        :ref:`theory-r7`)."""
        if not self.nonnegative:
            return "no"
        return "yes" if self.positional is None else "positional"

    @property
    def theorem_applies(self):
        """Whether the certified lower bound (:ref:`theory-r4`, :ref:`theory-r5`) as
        proved in this library covers this head (:attr:`theorem` is ``"yes"``).

        A single head with an affine readout: the bound applies exactly when the
        kernel is nonnegative (``nonnegative``) and the maps are positionless (causal
        or not). Signed kernels are outside it (:ref:`theory-r7`); positional maps are
        covered on order-complete final-query families only (:attr:`theorem`
        ``"positional"``).
        """
        return self.theorem == "yes"

    def state_floats(self, seq_len=None):
        """Floats a causal head carries from one token to the next in
        :meth:`recurrent`: the sketch ``S`` (``rank x value_dim``) and ``s``
        (``rank``), and for log-domain maps their running maximum (``rank``). The same
        for every ``seq_len``."""
        return self.rank * self.value_dim + self.rank * (2 if self.log_domain else 1)

    @property
    def single_head(self):
        """The head itself: one head with an affine readout, the model of the theorem
        (as :attr:`KernelAttentionModel.single_head <minip_learn.nn.KernelAttentionModel.single_head>`)."""
        return self

    @property
    def log_domain(self):
        """Whether both maps are log-domain (their features are exponentiated after a
        shift, see :meth:`features`)."""
        return bool(self.query_features.log_domain and self.key_features.log_domain)

    def token_tables(self):
        """The query and key log-feature tables, or None when the head has none.

        A head has them when its query and key maps are two separate token tables
        (``feature_map="table"``, not ``shared_features``): rows follow the map's
        ``vocabulary``, columns are the ``rank`` features, and ``phi(x) = exp(row of x)``
        up to the normalisation's shift.

        Returns
        -------
        tables : tuple of two Parameters of shape (n_tokens, rank), or None
            The head's own parameters (not copies).
        """
        qf, kf = self.query_features, self.key_features
        if qf is kf or qf.fused_form != "table" or kf.fused_form != "table":
            return None
        return qf.log_table, kf.log_table

    @torch.no_grad()
    def set_token_tables(self, query=None, key=None):
        """Copy log-feature tables into the query and key token tables.

        Parameters
        ----------
        query, key : Tensor of shape (n_tokens, rank), default=None
            New tables (rows in the order of the map's ``vocabulary``); None keeps one.

        Returns
        -------
        self
        """
        tables = self.token_tables()
        if tables is None:
            raise ValueError("set_token_tables needs separate feature_map='table' maps "
                             "for queries and keys.")
        for table, new in zip(tables, (query, key)):
            if new is not None:
                table.copy_(torch.as_tensor(new))
        return self

    @torch.no_grad()
    def set_uniform_features(self):
        """Make both feature maps constant (every key weighted equally: uniform
        attention, as in :ref:`theory-r1`) by zeroing their linear encoders.

        Returns
        -------
        self
        """
        for fm in (self.query_features, self.key_features):
            if fm.fused_form != "linear":
                raise ValueError(f"set_uniform_features needs maps with a linear encoder; "
                                 f"{fm.name!r} has none.")
            fm.encoder.weight.zero_()
            fm.encoder.bias.zero_()
        return self

    def _map_outputs(self, queries, keys=None, maps=None):
        """Query and key (log-)features before the normalisation's shift and mask.

        Log-features when :attr:`log_domain`, else features. ``keys=None`` uses the
        queries (one sequence); tied maps are evaluated once. ``maps``: the query and
        key maps to use instead of the head's own (e.g. copies in another dtype).
        """
        same = keys is None
        keys = queries if same else keys
        qf, kf = maps or (self.query_features, self.key_features)
        f = (lambda fm, t: fm.log_features(t)) if self.log_domain else (lambda fm, t: fm(t))
        fq = f(qf, queries)
        return fq, (fq if same and kf is qf else f(kf, keys))

    def features(self, x):
        """Query and key features ``(phi_Q, phi_K)``, each of shape (..., seq_len, rank).

        Log-domain maps (``exp``, ``favor+``, ``table``) are exponentiated after a shift
        that cancels exactly in the normalisation: with log-features ``lq``, ``lk`` and
        the per-sequence, per-feature key maximum ``M_k = max_j lk_jk``,

            phi_K(x_j)_k = exp(lk_jk - M_k),
            phi_Q(x_i)_k = exp(lq_ik + M_k - c_i),   c_i = max_k (lq_ik + M_k),

        so ``alpha'(x_i, x_j) = exp(-c_i) alpha(x_i, x_j)``: one positive constant per
        query row, which the normalisation divides out. Every feature is <= 1 and the
        denominator ``phi_Q(x_i)^T s >= 1`` (the feature attaining ``c_i`` meets the key
        attaining ``M_k``), so nothing overflows and nothing underflows to the floor.

        Rank masking: when the buffer ``feature_mask`` (shape ``(rank,)``, entries 0 or
        1; default None) is set, features where it is 0 are exact zeros on both sides;
        log-domain maps add ``log(mask)`` (``-inf``) before the per-query maximum, so
        the unmasked arithmetic is that of a head of the smaller rank and masked
        parameters get zero gradients (:class:`~minip_learn.nn.HeadEnsemble` trains
        heads of several ranks this way). See
        :func:`minip_learn.nn.ops.attention_features`.
        """
        fq, fk = self.with_positions(*self._map_outputs(x))
        return ops.attention_features(
            fq, fk, log_domain=self.log_domain, mask=self.feature_mask)

    def with_positions(self, fq, fk, *, start=0):
        """Query and key (log-)features ``(..., n, r)`` of the positions ``start ..
        start+n-1`` with the learned positional log-weights (``positional="learned"``;
        the identity otherwise): ``fq + a_i``, ``fk + b_j`` in the log domain, else
        ``fq * exp(a_i)``, ``fk * exp(b_j)``."""
        if self.positional != "learned":
            return fq, fk
        n = start + fq.shape[-2]
        if n > self.max_len:
            raise ValueError(f"the sequences have {n} tokens, more than max_len={self.max_len} "
                             "of this head's learned positional map (positional='learned').")
        a, b = self.position_query[start:n], self.position_key[start:n]
        if self.log_domain:
            return fq + a, fk + b
        return fq * torch.exp(a), fk * torch.exp(b)

    def _check_counts(self, counts):
        if counts is not None and self.ordered:
            options = ", ".join(
                (["causal=True"] if self.causal else [])
                + ([f"positional={self.positional!r}"] if self.positional else []))
            raise ValueError(f"a head with {options} depends on the order of the tokens and "
                             "takes no counts (sequences in multiset form have no order).")

    def _causal(self, x, v, fn, *extra):
        """``fn`` of :mod:`minip_learn.nn.attention` on the head's (log-)features of
        ``x`` (with positions), values ``v`` and ``extra``, with its options."""
        fq, fk = self.with_positions(*self._map_outputs(x))
        return fn(fq, fk, v, *extra, nonnegative=self.nonnegative, eps=self.denominator_eps,
                  decay=self.decay, log_domain=self.log_domain, mask=self.feature_mask)

    def sketch(self, phi_k, v):
        """Fixed-size sketch ``(S, s)``: ``S = sum_j phi_K(x_j) v(x_j)^T`` (r x d),
        ``s = sum_j phi_K(x_j)`` (:func:`minip_learn.nn.ops.sketch`)."""
        return ops.sketch(phi_k, v)

    @staticmethod
    def _floor(den):
        """The guard of nonnegative kernels: a zero denominator is divided as 1."""
        return ops.guard_denominator(den, nonnegative=True)

    def _guard(self, den):
        """The denominator actually divided by
        (:func:`~minip_learn.nn.ops.guard_denominator`)."""
        return ops.guard_denominator(
            den, nonnegative=self.nonnegative, eps=self.denominator_eps)

    def attend(self, x, counts=None):
        """Attended values ``u_i`` of shape (..., seq_len, value_dim), before the readout.

        Short sequences (Min-IP's ``N = 3``) go through the explicit ``N x N`` kernel,
        longer ones through the sketch (:func:`minip_learn.nn.ops.attend`).
        ``counts`` (shape (..., seq_len)): the multiplicity of every slot of sequences
        in multiset form (see the module docstring); None: one per position. Causal
        heads: :func:`minip_learn.nn.ops.causal_attend`.
        """
        self._check_counts(counts)
        if self.causal:
            return self._causal(x, self.value(x), ops.causal_attend)
        phi_q, phi_k = self.features(x)
        return ops.attend(phi_q, phi_k, self.value(x), nonnegative=self.nonnegative,
                                eps=self.denominator_eps, counts=counts)

    def forward(self, x, counts=None, *, last=False):
        """Outputs of shape (..., seq_len); ``last=True``: the last position's only, shape
        (..., 1) (:meth:`output`)."""
        return self.output(x, self.readout, counts, last=last)

    def attend_last(self, x):
        """The attended value at the last position, shape (..., value_dim): its query over
        every key, with the head's positions and decay
        (:func:`minip_learn.nn.ops.last_attend`), ``O(N r d)`` per sequence."""
        return self._last(x, self.value(x), ops.last_attend)

    def attend_last_tokens(self, x, tokens, index):
        """:meth:`attend_last` from the maps of the distinct ``tokens`` of ``x`` (``index``:
        every token's row), shape (batch, value_dim): the kernel between the distinct
        query tokens and keys (with positions: (token, position) pairs), gathered per
        sequence (:func:`~minip_learn.nn.ops.gathered_last_attend`). None when a
        map declares no ``per_token`` or the kernel would hold more entries than ``x``
        has positions."""
        n, N = index.shape
        learned = self.positional == "learned"
        U = len(tokens)
        if (x.ndim != 3 or U * U * (N if learned else 1) > n * N
                or not (self.query_features.per_token and self.key_features.per_token)):
            return None
        fq, fk = self._map_outputs(tokens)
        keys = index
        if learned:  # the query at position N - 1, every key at every position
            fq = self.with_positions(fq[:, None], fq[:, None], start=N - 1)[0][:, 0]
            fk = self.with_positions(fk[:, None].expand(U, N, -1), fk[:, None])[1]
            fk, keys = fk.reshape(U * N, -1), index * N + torch.arange(N, device=x.device)
        lg = ops.log_decay(self.decay)
        age = None if lg == 0.0 else torch.arange(N - 1, -1, -1, dtype=fq.dtype,
                                                   device=x.device) * lg
        scores = ops.token_scores(fq, fk, log_domain=self.log_domain,
                                        mask=self.feature_mask)
        return ops.gathered_last_attend(
            scores, index[:, -1], keys, self.value(tokens), value_index=index,
            normalise="softmax" if self.log_domain else "kernel", key_log_weight=age,
            nonnegative=self.nonnegative, eps=self.denominator_eps)

    def _last(self, x, v, fn, *extra):
        """``fn`` (:func:`~minip_learn.nn.ops.last_attend` or
        :func:`~minip_learn.nn.ops.last_head_output`) on the last token's query
        (log-)features and every key's (with positions), values ``v`` and ``extra``,
        with the head's options: the query maps run on one token."""
        n = x.shape[-2]
        fq, fk = self._map_outputs(x[..., -1:, :], x)
        fq, fk = self.with_positions(fq, fq, start=n - 1)[0], self.with_positions(fk, fk)[1]
        return fn(fq, fk, v, *extra, nonnegative=self.nonnegative, eps=self.denominator_eps,
                  decay=self.decay, log_domain=self.log_domain, mask=self.feature_mask)

    def output(self, x, readout, counts=None, *, last=False):
        """``readout(x, attend(x, counts))`` for an affine ``readout`` (one that has
        ``coefficients``, e.g. :class:`AffineReadout`), shape (..., seq_len).

        Short sequences fold the readout into the explicit kernel
        (:func:`minip_learn.nn.ops.head_output`, causal heads:
        :func:`minip_learn.nn.ops.causal_head_output`). ``last=True``: the output
        at the last position only, shape (..., 1), whose query sees every key: the
        final-query form (:func:`minip_learn.nn.ops.last_head_output`), ``O(N r
        d)`` per sequence.
        """
        self._check_counts(counts)
        if last:
            _check_last(counts)
            w, b = readout.coefficients(x[..., -1:, :])
            return self._last(x, self.value(x), ops.last_head_output, w, b)
        w, b = readout.coefficients(x)
        if self.causal:
            return self._causal(x, self.value(x), ops.causal_head_output, w, b)
        phi_q, phi_k = self.features(x)
        return ops.head_output(phi_q, phi_k, self.value(x), w, b,
                                     nonnegative=self.nonnegative, eps=self.denominator_eps,
                                     counts=counts)

    def recurrent(self, x):
        """The outputs of a causal head computed token by token, shape (..., seq_len).

        The recurrent form of :meth:`forward`
        (:func:`minip_learn.nn.ops.recurrent_attend`): the prefix sketch
        ``S_i = g S_{i-1} + phi_K(x_i) v(x_i)^T``, ``s_i = g s_{i-1} + phi_K(x_i)``
        (``gamma = decay``, 1 without) is the only state carried from one token to the
        next (:meth:`state_floats` floats), and ``y_i = rho_{x_i}(phi_Q(x_i)^T S_i /
        phi_Q(x_i)^T s_i)``. Equal to :meth:`forward` up to rounding.

        Parameters
        ----------
        x : Tensor of shape (..., seq_len, n_bits)

        Returns
        -------
        Tensor of shape (..., seq_len)
        """
        if not self.causal:
            raise ValueError("recurrent needs a causal head (causal=True): a non-causal "
                             "head's output at i depends on the tokens after i.")
        if self.readout is None:
            raise ValueError("recurrent needs the head's own readout; this head has none "
                             "(it is part of a KernelAttentionModel).")
        u = self._causal(x, self.value(x), ops.recurrent_attend)
        return self.readout(x, u)

    def initial_state(self, batch_shape, *, dtype=None, device=None):
        """The state of :meth:`step` before the first token
        (:func:`minip_learn.nn.ops.recurrent_state`)."""
        return ops.recurrent_state(batch_shape, self.rank, self.value_dim,
                                         log_domain=self.log_domain, dtype=dtype, device=device)

    def step(self, state, x_t, position=0):
        """One token ``x_t`` (..., n_bits) at ``position`` (0-based) of the recurrence of
        :meth:`recurrent`: returns ``(new_state, u_t)``, ``u_t`` of shape (..., value_dim)
        before the readout (:func:`minip_learn.nn.ops.recurrent_step`)."""
        fq, fk = self._map_outputs(x_t)
        fq, fk = self.with_positions(fq[..., None, :], fk[..., None, :], start=position)
        if self.feature_mask is not None:  # as recurrent: log(mask) on the query side
            mask = self.feature_mask
            fq, fk = (fq + torch.log(mask), fk) if self.log_domain else (fq * mask, fk * mask)
        u, state = ops.recurrent_step(
            state, fq[..., 0, :], fk[..., 0, :], self.value(x_t), nonnegative=self.nonnegative,
            eps=self.denominator_eps, decay=self.decay, log_domain=self.log_domain)
        return state, u

    def attention_weights(self, x, counts=None):
        """Explicit ``(..., N, N)`` normalised kernel matrix (for checks and plots);
        with ``counts``, the weight of each key slot counts its multiplicity. Causal
        heads: zero above the diagonal."""
        self._check_counts(counts)
        if self.causal:  # the attended values of the unit vectors e_j: row i is u_i's weights
            n = x.shape[-2]
            eye = torch.eye(n, dtype=x.dtype, device=x.device).expand(*x.shape[:-2], n, n)
            return self._causal(x, eye, ops.causal_attend)
        phi_q, phi_k = self.features(x)
        a = ops.pairwise_dots(phi_q, ops.weight_keys(phi_k, counts))
        return a / self._guard(a.sum(-1, keepdim=True))

    def kernel(self, queries, keys):
        """Kernel matrix ``alpha(q_a, k_b)`` between two token sets, up to a positive
        scale per query row (which the normalisation ignores).

        Parameters
        ----------
        queries : Tensor of shape (n_q, n_bits)
        keys : Tensor of shape (n_k, n_bits)

        Returns
        -------
        Tensor of shape (n_q, n_k)
        """
        fq, fk = self._map_outputs(queries, keys)
        return ops.explicit_kernel(
            fq, fk, log_domain=self.log_domain, mask=self.feature_mask)

    #: Most token pairs :meth:`kernel_min` evaluates; above it, a seeded sample.
    KERNEL_MIN_MAX_PAIRS = 10**6

    def kernel_min(self, tokens, *, max_pairs=None, random_state=0):
        """Smallest kernel value ``alpha(x, z)`` over pairs of distinct tokens, in float64.

        Every ordered pair ``(x, z)`` of the distinct rows of ``tokens`` (``x = z``
        included) is evaluated when there are at most ``max_pairs`` of them; otherwise
        the pairs of ``isqrt(max_pairs)`` queries and as many keys, each drawn without
        replacement from the distinct tokens by
        ``numpy.random.RandomState(random_state)``. Log-domain kernels are
        ``sum_k exp(lq_k + lk_k)``, without the per-row scale of :meth:`kernel`, so
        the value is the kernel itself (never negative).
        Its feature maps are copied to float64; the head is left as it is.

        Parameters
        ----------
        tokens : array-like of shape (..., n_bits)
            Tokens, e.g. every token of the training sequences.
        max_pairs : int, default=None
            Cap on the pairs; None means :attr:`KERNEL_MIN_MAX_PAIRS` (``10**6``).
        random_state : int, default=0
            Seed of the sample of pairs (used only above the cap).

        Returns
        -------
        kernel_min : float
            ``nan`` when ``tokens`` is empty.

        Examples
        --------
        >>> import torch
        >>> from minip_learn.nn import KernelAttentionHead
        >>> head = KernelAttentionHead(3, 2, feature_map="identity")
        >>> with torch.no_grad():
        ...     _ = head.query_features.encoder.weight.copy_(torch.eye(2, 3))
        ...     _ = head.key_features.encoder.weight.copy_(-torch.eye(2, 3))
        ...     _ = head.query_features.encoder.bias.zero_()
        ...     _ = head.key_features.encoder.bias.zero_()
        >>> head.kernel_min([[1, 0, 0], [0, 1, 0], [1, 1, 0]])
        -2.0
        """
        max_pairs = self.KERNEL_MIN_MAX_PAIRS if max_pairs is None else int(max_pairs)
        tokens = distinct_tokens(np.asarray(tokens, dtype=np.float64).reshape(-1, self.n_bits))
        n = len(tokens)
        if n == 0:
            return float("nan")
        queries = keys = np.arange(n)
        if n * n > max_pairs:
            side = max(1, math.isqrt(max_pairs))
            rng = np.random.RandomState(random_state)
            queries = rng.choice(n, side, replace=False)
            keys = rng.choice(n, side, replace=False)
        param = next(self.parameters(), None)
        device = None if param is None else param.device
        # float64 copies of the maps only (a tied map stays tied)
        qf = copy.deepcopy(self.query_features).to(dtype=torch.float64)
        kf = (qf if self.key_features is self.query_features else
              copy.deepcopy(self.key_features).to(dtype=torch.float64))
        mask = None if self.feature_mask is None else self.feature_mask.to(torch.float64)
        x = torch.as_tensor(tokens, dtype=torch.float64, device=device)
        with torch.no_grad():
            fq, fk = self._map_outputs(x[torch.as_tensor(queries, device=device)],
                                       x[torch.as_tensor(keys, device=device)],
                                       maps=(qf, kf))
            if mask is not None:
                fq = fq + torch.log(mask) if self.log_domain else fq * mask
            if self.log_domain:
                # exp(lq + lk) summed over features, with a shift per token on each
                # side (undone after the product): the kernel's true values
                mq = fq.amax(-1, keepdim=True).clamp_min(-1e300)
                mk = fk.amax(-1, keepdim=True).clamp_min(-1e300)
                alpha = torch.exp(torch.log(torch.exp(fq - mq) @ torch.exp(fk - mk).T)
                                  + mq + mk.T)
            else:
                alpha = fq @ fk.T
        return float(alpha.min())


class SoftmaxAttentionHead(_Head):
    """Dense softmax attention with scores ``q(x_i)^T k(x_j) / temperature``.

    The attended values ``u_i = sum_j softmax_j(s_ij) v(x_j)`` are computed by one of
    two algorithms that agree to rounding (tests check it):

    * ``"explicit"``: the (N x N) scores, their softmax and its product with the values,
      as :meth:`scores` and :meth:`attention_weights` return them. Memory ``O(N^2)``.
    * ``"fused"``: :func:`torch.nn.functional.scaled_dot_product_attention` with
      ``scale = 1 / temperature``, on query blocks of at most
      ``max(1, FUSED_BLOCK_SCORES // N)`` rows. On CPU its kernel (float32 and
      float64) streams over the keys with a running maximum and never forms the score
      matrix, so one sequence of N tokens needs ``O(N d)`` memory; the time stays
      ``O(N^2 d_s)``.

    Parameters
    ----------
    n_bits : int
        Bits per token ``m``.
    score_dim : int, default=None
        Dimension ``d_s`` of queries and keys; ``None`` means ``n_bits``.
    value_dim : int, default=None
        Dimension of the value map; ``None`` means ``n_bits``.
    temperature : float, default=1.0
        Softmax temperature ``tau``.
    score_init_scale : float, default=0.1
        Factor applied to torch's default initialisation of the query and key
        weights (small scores at the start: near-uniform attention).
    algorithm : {"auto", "fused", "explicit"}, default="auto"
        How :meth:`forward` attends (see above). ``"auto"`` takes the fused kernel for
        sequences of at least ``FUSED_MIN_SEQ_LEN`` (64) tokens and the explicit form
        for shorter ones, where the scores are small and training keeps the explicit
        arithmetic.
    causal : bool, default=False
        Position ``i`` attends to the keys ``j <= i`` only: the scores above the
        diagonal are ``-inf`` (explicit form), or the fused kernel's causal mask. A
        causal head depends on the order of the tokens and takes no ``counts``.

    Notes
    -----
    Softmax attention is not a normalised kernel of finite rank, so the lower bound
    does not cover it (:attr:`theorem` is ``"no"``).

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import SoftmaxAttentionHead
    >>> SoftmaxAttentionHead(6)(torch.zeros(2, 3, 6)).shape
    torch.Size([2, 3])
    >>> head = SoftmaxAttentionHead(6, temperature=0.5).double()
    >>> x = torch.rand(1, 100, 6, dtype=torch.float64).round()
    >>> fused = head.attend(x)  # 100 tokens: the fused kernel
    >>> explicit = head.attention_weights(x) @ head.value(x)
    >>> torch.allclose(fused, explicit)
    True
    >>> causal = SoftmaxAttentionHead(6, causal=True).double()
    >>> torch.allclose(causal(x)[:, :10], causal(x[:, :10]))  # prefixes
    True
    """

    #: the lower bound does not cover softmax attention (not a finite-rank kernel)
    theorem = "no"
    theorem_applies = False
    # default of heads built before the option existed (e.g. unpickled ones)
    causal = False

    ALGORITHMS = ("auto", "fused", "explicit")
    #: Shortest sequence for which ``algorithm="auto"`` takes the fused kernel; shorter
    #: ones (Min-IP's N = 3) keep the explicit form, whose (N x N) scores are tiny.
    FUSED_MIN_SEQ_LEN = 64
    #: Most scores per sequence one fused call may hold: the fused path attends blocks
    #: of at most ``max(1, FUSED_BLOCK_SCORES // N)`` queries, which bounds the memory
    #: of backends that do form the (block x N) scores (e.g. float64 on CUDA); the CPU
    #: kernel never forms them.
    FUSED_BLOCK_SCORES = 2**20

    def __init__(self, n_bits, *, score_dim=None, value_dim=None, temperature=1.0,
                 score_init_scale=0.1, algorithm="auto", causal=False):
        super().__init__(n_bits, value_dim)
        self.causal = bool(causal)
        if algorithm not in self.ALGORITHMS:
            raise ValueError(
                f"algorithm must be one of {self.ALGORITHMS}; got {algorithm!r}.")
        self.score_dim = n_bits if score_dim is None else score_dim
        self.temperature = float(temperature)
        self.algorithm = algorithm
        self.query = nn.Linear(n_bits, self.score_dim)
        self.key = nn.Linear(n_bits, self.score_dim)
        # Small query/key weights: scores start near 0, attention near uniform, and
        # training grows the scores it needs. With torch's default scale many
        # initialisations start (and stay) with one key absorbing the attention.
        with torch.no_grad():
            self.query.weight.mul_(score_init_scale)
            self.key.weight.mul_(score_init_scale)

    @torch.no_grad()
    def set_score_maps(self, query, key):
        """Set ``q(x) = query x`` and ``k(x) = key x`` (no bias).

        Parameters
        ----------
        query, key : Tensor of shape (score_dim, n_bits)

        Returns
        -------
        self
        """
        for linear, weight in ((self.query, query), (self.key, key)):
            linear.weight.copy_(torch.as_tensor(weight))
            linear.bias.zero_()
        return self

    def scores(self, x):
        """Attention logits of shape (..., N, N)."""
        return self.query(x) @ self.key(x).transpose(-2, -1) / self.temperature

    def attention_weights(self, x, counts=None):
        """Softmax attention matrix of shape (..., N, N) (explicit; for checks and plots);
        with ``counts``, ``log c_j`` joins the scores of key slot ``j``
        (:func:`minip_learn.nn.ops.softmax_weights`); causal heads: zero above
        the diagonal."""
        self._check_counts(counts)
        return ops.softmax_weights(self.scores(x), counts, causal=self.causal)

    def _check_counts(self, counts):
        if counts is not None and self.causal:
            raise ValueError("a head with causal=True depends on the order of the tokens and "
                             "takes no counts (sequences in multiset form have no order).")

    def uses_fused(self, seq_len):
        """Whether :meth:`forward` takes the fused kernel for sequences of ``seq_len``."""
        algorithm = getattr(self, "algorithm", "auto")
        if algorithm == "auto":
            return seq_len >= self.FUSED_MIN_SEQ_LEN
        return algorithm == "fused"

    def live_scores(self, seq_len):
        """Most attention scores of one sequence held at once by :meth:`forward` (an
        upper bound: the CPU fused kernel holds none)."""
        if not self.uses_fused(seq_len):
            return seq_len * seq_len
        return min(seq_len, max(1, self.FUSED_BLOCK_SCORES // seq_len)) * seq_len

    def attend(self, x, counts=None):
        """Attended values ``u_i`` of shape (..., seq_len, value_dim), before the readout.

        ``counts`` (shape (..., seq_len)): the multiplicity of every slot of sequences in
        multiset form (see the module docstring); None: one per position. The fused
        kernel is :func:`minip_learn.nn.ops.softmax_attend`.
        """
        v = self.value(x)
        n = x.shape[-2]
        if not self.uses_fused(n):
            return self.attention_weights(x, counts) @ v
        self._check_counts(counts)
        return ops.softmax_attend(
            self.query(x), self.key(x), v, scale=1.0 / self.temperature,
            block_rows=self.FUSED_BLOCK_SCORES // n, counts=counts, causal=self.causal)

    def forward(self, x, counts=None, *, last=False):
        """Outputs of shape (..., seq_len); ``last=True``: the last position's only, shape
        (..., 1), from its query alone (``O(N d)`` per sequence: the final-query form)."""
        if not last:
            return self.readout(x, self.attend(x, counts))
        _check_last(counts)
        return self.readout(x[..., -1:, :], self.attend_last(x)[..., None, :])

    def attend_last_tokens(self, x, tokens, index):
        """:meth:`attend_last` from the maps of the distinct ``tokens`` of ``x``
        (``index``: every token's row), shape (batch, value_dim): the scores between
        the distinct tokens, gathered per sequence
        (:func:`~minip_learn.nn.ops.gathered_last_attend`). None when they would
        hold more entries than ``x`` has positions."""
        if x.ndim != 3 or len(tokens) ** 2 > index.numel():
            return None
        scores = self.query(tokens) @ self.key(tokens).T / self.temperature
        return ops.gathered_last_attend(scores, index[:, -1], index,
                                              self.value(tokens), normalise="softmax")

    def attend_last(self, x):
        """The attended value at the last position, shape (..., value_dim): its query
        over every key (causal or not, the same sum)."""
        scores = self.query(x[..., -1:, :]) @ self.key(x).transpose(-2, -1)
        weights = torch.softmax(scores / self.temperature, dim=-1)
        return (weights @ self.value(x))[..., 0, :]
