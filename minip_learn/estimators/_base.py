"""The shared base of the attention estimators: validation, the one training path,
prediction, persistence.

``__init__`` stores friendly hyperparameters (``rank=``, ``feature_map=``,
``score_dim=`` ...). ``fit`` checks them once against the class's
``_parameter_constraints`` table (and the memory the sizes it marks need, before
anything is allocated), validates the data, and trains the torch head of
:mod:`minip_learn.nn` through :func:`minip_learn.training.train_members` as a stack of
one member (restarts one after the other); ``fit_members`` trains many members at
once through the same function. The fitted skorch net is
``net_`` (history, ``module_``, ``save_params``...).

Every method that takes ``X`` also takes a family in multiset form
(:class:`~minip_learn.compact.CompactFamily`): the head then sees the tokens of every
slot and their multiplicities (``forward(x, counts=counts)``), never the materialised
``(n, N, n_bits)`` sequences, and targets and predictions are per slot, shape
``(n_sequences, n_slots)``, aligned with its ``token_ids`` (0 at padding).

Final-query targets: for 3-D ``X`` of shape ``(n, N, n_bits)`` a ``y`` of shape ``(n,)``
holds one target per sequence, for the output at its last position (the query token
last). The training loss reads that position only, the fitted estimator records
``query_ = "last"`` (else ``"all"``), ``predict`` then returns one output per sequence
and ``score`` is the fraction of sequences within 1/2 of their target. Their order
decides the last position, so they need materialised sequences.
"""

import copy
import math
import warnings
from typing import NamedTuple

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import Bunch
from sklearn.utils.validation import check_is_fitted

from .._memory import available_memory
from .._validation import (
    check_fits_in_memory,
    check_minip_targets,
    check_params,
    check_sequences,
    check_targets,
    distinct_tokens,
    size_parameters,
)
from ..compact import is_compact
from ..metrics import TOLERANCE, sequence_exact_match, solves
from ..training import (
    absolute_error,
    build_net,
    compact_input,
    module_forward,
    train_members,
)
from ._modules import compact_order_error, module_declarations
from ._versions import versioned_restore, versioned_state

__all__ = ["PREDICT_CHUNK_BYTES"]

_OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}

#: Predictions are computed in chunks of sequences whose estimated working memory
#: stays below this many bytes.
PREDICT_CHUNK_BYTES = 2**28

#: The types of the ``X`` and ``y`` that ``fit``, ``score`` and ``predict`` take, written
#: once: :func:`data_doc` puts them where a docstring says ``%(X)s`` and ``%(y)s``.
DATA_TYPES = {
    "X": "array-like of shape (n_samples, seq_len, n_bits) or (n_samples, n_bits), or "
         "CompactFamily",
    "y": "array-like of shape (n_samples, seq_len) or (n_samples,), or (n_samples, "
         "n_slots)",
}


def data_doc(method):
    """Complete ``method``'s docstring with the types of ``X`` and ``y``
    (:data:`DATA_TYPES`)."""
    for key, types in DATA_TYPES.items():
        method.__doc__ = method.__doc__.replace(f"%({key})s", types)
    return method


def _available_memory(device):
    """Free memory (bytes) on ``device``, or None when it cannot be told."""
    dev = torch.device(device)
    try:
        if dev.type == "cuda":
            return int(torch.cuda.mem_get_info(dev)[0])
        if dev.type == "cpu":
            return available_memory()
    except (AttributeError, ValueError, OSError, RuntimeError):
        return None
    return None


# -- the memory a fit needs, told before anything is allocated ------------------------
#: Sizes up to this are counted exactly, the head built on torch's ``meta`` device
#: (shapes without storage); the entries of a larger size are extrapolated from builds
#: at this size and at twice it (linearly: the heads' entries grow linearly in each size).
_EXACT_SIZE = 256

#: Values kept per trained parameter: the parameter and its gradient, and Adam's two
#: moments.
_STATE_PER_PARAMETER = {torch.optim.Adam: 4, torch.optim.AdamW: 4, torch.optim.SGD: 2}


def _meta_entries(build, params):
    """``(parameters, buffer entries)`` of ``build(**params)`` built on the meta device:
    nothing is allocated, and no random number is drawn (meta tensors have no values)."""
    with torch.device("meta"):
        module = build(**params)
    return (sum(p.numel() for p in module.parameters()),
            sum(b.numel() for b in module.buffers()))


def _module_entries(build, params, sizes):
    """``(parameters, buffer entries, growth)`` of the head ``build(**params)``.

    A size of ``sizes`` above :data:`_EXACT_SIZE` is extrapolated from builds at that
    size and twice it; ``growth`` maps each such size to the entries it adds. A head
    that cannot be built at those sizes (a rank tied to another option) is built at its
    own.
    """
    large = [k for k in sizes if type(params.get(k)) is int and params[k] > _EXACT_SIZE]
    if large:
        base = {**params, **dict.fromkeys(large, _EXACT_SIZE)}
        try:
            counts = list(_meta_entries(build, base))
            growth = {}
            for k in large:
                bigger = _meta_entries(build, {**base, k: 2 * _EXACT_SIZE})
                grown = [max(0, b - a) * (params[k] - _EXACT_SIZE) // _EXACT_SIZE
                         for a, b in zip(counts[:2], bigger)]
                counts = [c + g for c, g in zip(counts, grown)]
                growth[k] = sum(grown)
            return counts[0], counts[1], growth
        except Exception:  # noqa: BLE001 - e.g. a map whose rank is tied to proj_dim
            pass
    n_params, n_buffers = _meta_entries(build, params)
    return n_params, n_buffers, {}


def _is_out_of_memory(exc):
    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    msg = str(exc).lower()
    return "out of memory" in msg or "can't allocate memory" in msg


def _to_tensor(arr, dtype, device):
    # np.array copies: torch gets a writable, C-contiguous array even for read-only
    # (e.g. memory-mapped) input.
    return torch.from_numpy(np.array(arr, dtype=_NP_DTYPES[dtype], order="C")).to(device)


class _Inputs(NamedTuple):
    """Validated sequences as the head reads them.

    ``tokens`` (n, N, n_bits): the sequences, or for a
    :class:`~minip_learn.compact.CompactFamily` the tokens of its slots (n, k, n_bits)
    with ``counts`` (n, k) their multiplicities (None for materialised sequences);
    ``seq_len``: the length of the sequences.
    """

    tokens: np.ndarray
    was_2d: bool
    counts: np.ndarray | None
    seq_len: int

    @property
    def padding(self):
        """The padding slots (n, k), or None for materialised sequences."""
        return None if self.counts is None else self.counts == 0


def final_query_error(family, y):
    """The ValueError for final-query targets ``y`` with a compact ``family``: a
    multiset has no last position."""
    return ValueError(
        f"y has shape {np.shape(y)}: final-query targets need materialised sequences: a "
        "y of shape (n_sequences,) is one target per sequence at its last position, "
        "which a CompactFamily (a multiset, without order) does not have; pass the "
        "ordered sequences, X of shape (n_sequences, seq_len, n_bits), or for a "
        "CompactFamily X one target per slot, expected "
        f"{(family.n_sequences, family.n_slots)} (n_sequences, n_slots).")


def _target_query(X, data, y):
    """``"last"`` for final-query targets (3-D ``X``, ``y`` of shape ``(n,)``), else
    ``"all"``."""
    if data.was_2d or np.ndim(y) != 1:
        return "all"
    if data.counts is not None:
        raise final_query_error(X, y)
    return "last"


def _check_final_minip(X, y):
    """:func:`~minip_learn._validation.check_minip_targets` of final-query targets
    ``y`` (n,): the last position's target is the only one given."""
    Xf = X.astype(np.float64, copy=False)
    full = np.rint(np.matmul(Xf, Xf.transpose(0, 2, 1))).min(axis=2)
    full[:, -1] = y
    check_minip_targets(X, full)


def _compact_targets(y, family, fill):
    """Targets ``y`` of a compact ``family``, one per slot: shape-checked, padding set
    to ``fill`` (``"slot0"``: the target of the sequence's first slot)."""
    arr = np.asarray(y)
    expected = (family.n_sequences, family.n_slots)
    if arr.shape != expected:
        raise ValueError(
            f"y has shape {arr.shape}, which does not match X: for a CompactFamily X, y "
            f"holds one target per slot, expected {expected} (n_sequences, n_slots), "
            "aligned with X.token_ids as minip_targets(X) returns it.")
    pad = family.padding
    if pad.any():
        arr = np.where(pad, arr[:, :1] if fill == "slot0" else fill, arr)
    return arr


class AttentionEstimator(BaseEstimator):
    """Shared fit/predict of the attention-head estimators.

    Subclasses declare their hyperparameters' constraints in
    ``_parameter_constraints`` (checked once, at fit), the head's keyword arguments in
    ``_module_params`` and, for other targets than real numbers, ``_encode_targets``,
    ``_criterion`` (the training loss) and ``_error`` (a position's error).
    """

    #: the hyperparameters in which the members of one stack (:meth:`fit_members`,
    #: :func:`~minip_learn.model_selection.fit_ensemble`) may differ
    member_params = ("rank", "random_state")

    #: hyperparameter -> constraint (see :func:`minip_learn._validation.check_params`)
    _parameter_constraints = {
        "lr": ("real", {"min": 0.0, "strict": True}),
        "max_epochs": ("int", {"min": 1}),
        "batch_size": ("int", {"min": 1, "none": True}),
        "weight_decay": ("real", {"min": 0.0}),
        "optimizer": ("choice", {"options": tuple(_OPTIMIZERS)}),
        "dtype": ("choice", {"options": tuple(_DTYPES)}),
        "device": ("device",),
        "verbose": ("verbosity",),
        "stop_tolerance": ("real", {"min": 0.0, "strict": True, "max": TOLERANCE,
                                    "none": True}),
        "n_init": ("int", {"min": 1}),
        "check_every": ("int", {"min": 1}),
        "callbacks": ("instance", {"types": (list, tuple), "none": True,
                                   "what": "a list of skorch callbacks or None"}),
    }
    #: training loss of one head (a torch loss class)
    _criterion = torch.nn.MSELoss
    #: error of every output position: a head solves its data when all are < 1/2
    _error = staticmethod(absolute_error)

    # -- hooks for subclasses -------------------------------------------------------
    def _module_class(self, module_params):
        """The torch head class for ``module_params``."""
        raise NotImplementedError

    def _module_params(self, X, checked, fitted):
        """Keyword arguments of the torch head, from the ``checked`` hyperparameters,
        the training data ``X`` and the ``fitted`` attributes of ``_encode_targets``."""
        raise NotImplementedError

    def _encode_targets(self, X, y, was_2d, check_minip):
        """Training targets as a float array and the fitted attributes they give.

        Final-query targets reach this hook as the targets of single-token sequences:
        the last token of every sequence as ``X`` of shape ``(n, 1, n_bits)``, with
        ``was_2d=True`` and ``check_minip=False`` (the base checks them).
        """
        y2 = check_targets(y, X.shape[0], X.shape[1], was_2d=was_2d, stacklevel=5)
        if check_minip:
            check_minip_targets(X, y2)
        return y2, {}

    def _stackable(self, module_params):
        """None if heads of ``module_params`` can train as a stack of several members,
        else the reason."""
        return None

    def _check_buildable(self, X, module_params, checked):
        """Build a head of ``module_params`` once when its code is the user's (a
        ValueError naming it when it cannot be built or gives wrong outputs on ``X``);
        called after :meth:`_check_memory`."""

    def _counted(self, module_params):
        """Whether a head of ``module_params`` is the library's own, whose parameters
        :meth:`_check_memory` counts by building it on the meta device (a user's code
        is not run for that)."""
        return True

    def _activation_width(self, module_params):
        """Values the head computes at once for every position of a batch that grow
        with its size (e.g. ``rank`` features), or 0."""
        return 0

    # -- validation ----------------------------------------------------------------
    def _check_memory(self, data, checked, members, *, restarts=1):
        """Refuse sizes whose training would not fit in the memory of the device.

        The need is counted before anything is allocated: the parameters and buffers
        of every head ``members`` (their module parameters; each trained ``restarts``
        times at once), counted on the meta device (sizes above
        :data:`_EXACT_SIZE` extrapolated, in Python ints: any size), with their
        gradients and optimizer state, plus the size-wide values the heads compute for
        every position of a batch, in the training dtype. A ValueError naming the size
        hyperparameter and the bytes when the need exceeds the device's available
        memory (see :func:`~minip_learn._validation.check_fits_in_memory`).
        """
        sizes = size_parameters(self._parameter_constraints)
        if not sizes:
            return
        dtype = checked["dtype"]
        itemsize = torch.finfo(dtype).bits // 8
        per_param = _STATE_PER_PARAMETER.get(checked["optimizer"], 2)
        n_seq, seq_len = data.tokens.shape[:2]
        positions = min(checked["batch_size"] or n_seq, n_seq) * seq_len
        n_params = n_buffers = width = 0
        growth = dict.fromkeys(sizes, 0)
        counted, seen = True, {}
        build = self._module_class(members[0])
        for module_params in members:
            width += self._activation_width(module_params)
            if not counted:
                continue
            key = tuple(repr(module_params.get(k)) for k in sizes)
            if key not in seen:
                try:
                    seen[key] = (_module_entries(build, module_params, sizes)
                                 if self._counted(module_params) else None)
                except Exception:  # noqa: BLE001 - not countable: activations only
                    seen[key] = None
            if seen[key] is None:
                counted = False
                continue
            p, b, grown = seen[key]
            n_params, n_buffers = n_params + p, n_buffers + b
            for k, g in grown.items():
                growth[k] += g
        if not counted:
            n_params = n_buffers = 0
        needed = restarts * ((per_param * n_params + n_buffers) * itemsize
                             + positions * width * itemsize)
        values = {k: max([m.get(k, checked.get(k)) for m in members
                          if type(m.get(k, checked.get(k))) is int], default=0) for k in sizes}
        name = max(sizes, key=lambda k: (growth[k], values[k]))
        parts = []
        if n_params:
            parts.append(f"{n_params:,} parameters with their gradients and optimizer "
                         f"state, {per_param} values each")
        if n_buffers:
            parts.append(f"{n_buffers:,} buffer values")
        if width:
            parts.append(f"{positions * width:,} values computed for the {positions:,} "
                         "positions of a batch")
        heads = restarts * len(members)
        detail = ", ".join(parts) + f", in {str(dtype).replace('torch.', '')}"
        if heads > 1:
            detail += f", for a stack of {heads:,} heads"
        device = torch.device(checked["device"])
        check_fits_in_memory(
            name, values[name], needed, _available_memory(device), detail=detail,
            where="this machine" if device.type == "cpu" else str(device))

    def _check_params(self):
        """Every hyperparameter of the constraints table, checked and normalised."""
        checked = check_params(self.get_params(deep=False), self._parameter_constraints)
        checked["optimizer"] = _OPTIMIZERS[checked["optimizer"]]
        checked["dtype"] = _DTYPES[checked["dtype"]]
        return checked

    def _order_dependence(self, *, reset):
        """How the model depends on the order of the tokens (a phrase naming what
        makes it so), or None when it reads the tokens as a multiset.

        At fit (``reset=True``) the ``causal`` and ``positional`` hyperparameters
        decide, afterwards the fitted module's declarations
        (:attr:`module_declarations_`) and final-query targets (``query_``).
        """
        if reset:
            params = self.get_params(deep=False)
            causal, positional = params.get("causal", False), params.get("positional")
        else:
            declared = self.module_declarations_
            causal, positional = declared.causal, declared.positional
        options = (["causal=True"] if bool(causal) else []) + (
            [f"positional={positional!r}"] if positional is not None else [])
        if options:
            return f"with {' and '.join(options)} depends on the order of the tokens"
        if not reset and self._final_query():
            return ("was fitted on final-query targets (query_='last') and predicts the "
                    "last position of every sequence")
        return None

    @property
    def module_declarations_(self):
        """What the fitted module declares about itself, as a
        :class:`~sklearn.utils.Bunch`: ``causal`` (default False), ``positional``
        (default None), ``nonnegative``, ``theorem`` and ``theorem_applies`` (None when
        not declared) and ``single_head`` (the single head with an affine readout, the
        model of the theorem; None otherwise)."""
        check_is_fitted(self, "net_")
        return module_declarations(self.net_.module_)

    def _validate_X(self, X, *, reset):
        """``X`` as :class:`_Inputs` (a compact family: its slots, never materialised);
        a compact family is refused when the model reads token order
        (:meth:`_order_dependence`)."""
        # fit sets n_bits_ & co. only once training succeeded (reset=True: no check)
        if is_compact(X):  # validated when it was made
            reason = self._order_dependence(reset=reset)
            if reason is not None:
                raise compact_order_error(type(self).__name__, reason)
            data = _Inputs(X.slot_tokens(), False, X.counts, X.seq_len)
        else:
            X3, was_2d = check_sequences(X, allow_2d=True)
            data = _Inputs(X3, was_2d, None, X3.shape[1])
        n_bits = data.tokens.shape[2]
        if not reset and n_bits != self.n_bits_:
            raise ValueError(
                f"X has {n_bits} features, but {type(self).__name__} is expecting "
                f"{self.n_bits_} features as input: X has n_bits={n_bits} per token, "
                f"but the model was fitted with n_bits={self.n_bits_}."
            )
        return data

    def _validate_data(self, X, y, check_minip):
        if y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None."
            )
        data = self._validate_X(X, reset=True)
        query = _target_query(X, data, y)
        if query == "last":
            tokens = data.tokens
            y2, fitted = self._encode_targets(tokens[:, -1:], y, True, False)
            if check_minip:
                _check_final_minip(tokens, check_targets(y, len(tokens), 1, was_2d=True,
                                                         stacklevel=5)[:, 0])
            return data, y2.reshape(-1), {**fitted, "query_": query}
        if data.counts is not None:
            # padding holds no target: it mirrors the first slot, whose token it repeats
            y = _compact_targets(y, X, "slot0")
        y2, fitted = self._encode_targets(data.tokens, y, data.was_2d, check_minip)
        return data, y2, {**fitted, "query_": query}

    @staticmethod
    def _training_args(checked):
        """Keyword arguments of :func:`~minip_learn.training.build_net` and
        :func:`~minip_learn.training.train_members` from checked hyperparameters."""
        return {k: checked[k] for k in ("optimizer", "lr", "weight_decay", "max_epochs",
                                        "batch_size", "check_every", "callbacks", "dtype",
                                        "device", "verbose")}

    # -- training ------------------------------------------------------------------
    def _train(self, data, y2, members, checked, *, batched, query="all", progress=False):
        """Train ``members`` ``(module_params, random_state)`` as one stack on the
        validated ``data`` (:class:`_Inputs`); ``query="last"``: ``y2`` holds
        final-query targets."""
        dtype, device = checked["dtype"], checked["device"]
        counts = None if data.counts is None else _to_tensor(data.counts, dtype, device)
        return train_members(
            self._module_class(members[0][0]), members,
            _to_tensor(data.tokens, dtype, device), _to_tensor(y2, dtype, device),
            counts=counts, query=query, criterion=self._criterion, error=self._error,
            n_init=checked["n_init"],
            batched_restarts=batched, stop_tolerance=checked["stop_tolerance"],
            split_every=checked.get("split_every"), progress=progress,
            **self._training_args(checked))

    @data_doc
    def fit(self, X, y, *, check_minip=False):
        """Fit the head on sequences ``X`` with per-token targets ``y``.

        Parameters
        ----------
        X : %(X)s
            Token sequences of real token vectors; a 2-D array is read as sequences of
            one token. A :class:`~minip_learn.compact.CompactFamily` trains on its
            slots and their multiplicities, at the cost of ``n_slots`` tokens per
            sequence, with every slot's loss weighted by its multiplicity: the loss of
            the materialised family.
        y : %(y)s
            Finite real targets, one per token (e.g.
            :func:`~minip_learn.datasets.minip_targets`); for a compact ``X``, one per
            slot, aligned with its ``token_ids`` (padding entries are ignored). For 3-D
            ``X``, shape ``(n_samples,)`` means final-query targets: one per sequence,
            for the output at its last position, the only position the loss reads
            (``query_ = "last"``; e.g. ``make_minip(..., query="last")``).
        check_minip : bool, default=False
            Also require Min-IP data: 0/1 tokens and ``y`` equal to the exact Min-IP
            targets of ``X`` (integers in ``0..n_bits``); negative, fractional or wrong
            targets then raise a ValueError. See
            :func:`minip_learn._validation.check_minip_targets`.

        Returns
        -------
        self : object
            The fitted estimator.

        Raises
        ------
        ValueError
            For bad hyperparameters or data, and for sizes (``rank``, ``score_dim``,
            ``state_size`` ...) whose head would not fit in the device's memory:
            ``"rank=1000000000 needs about 160.0 GB of memory to train (...); this
            machine has 31.2 GB available."``, before anything is allocated.
        """
        data, y2, fitted = self._validate_data(X, y, check_minip)
        checked = self._check_params()
        module_params = self._module_params(data.tokens, checked, fitted)
        self._check_memory(data, checked, [module_params])
        self._check_buildable(data.tokens, module_params, checked)
        res = self._train(data, y2, [(module_params, self.random_state)], checked,
                          batched=False, query=fitted["query_"])
        # Everything fitted is set together, after training: a fit that raises leaves
        # the estimator as it was (unfitted, or fitted by the previous call).
        return self._set_fitted_state(res.members[0], data, module_params, fitted)

    @data_doc
    def fit_members(self, X, y, params, *, progress=False):
        """Fit ``clone(self).set_params(**p)`` for every ``p`` in ``params`` at once.

        The estimator's side of stacked training: users call
        :func:`minip_learn.model_selection.fit_ensemble`, the one public route, which
        builds ``params`` from ranks (or state sizes) and seeds, calls this method and
        adds each member's epochs, solving and fit time;
        :func:`~minip_learn.model_selection.rank_sweep` with ``ensemble=True`` runs
        its fits through :func:`~minip_learn.model_selection.fit_ensemble`. This
        method is the protocol those tools rely on (an estimator with
        ``fit_members`` and :attr:`member_params` can be stacked), as scikit-learn's
        model-selection tools rely on ``fit``.

        The members are initialised exactly as their own ``fit`` would initialise
        them and trained together, full-batch, as one stack (see
        :func:`minip_learn.training.train_members`): each with its own stopping and
        restarts, equal to its separate fit up to floating-point rounding.

        Parameters
        ----------
        X : %(X)s
        y : %(y)s
            As in :meth:`fit`.
        params : list of dict
            The parameters of every member; keys among :attr:`member_params` (``rank``
            and ``random_state``; ``state_size`` and ``random_state`` for
            :class:`~minip_learn.SequenceMixerRegressor`). Members whose modules have
            parameters of different shapes (e.g. mixers of different state sizes)
            train as one stack per shape, one after the other; kernel heads of
            different ranks share one stack (rank masking).
        progress : bool, default=False
            Show a :mod:`tqdm` progress bar over epochs.

        Returns
        -------
        result : :class:`~sklearn.utils.Bunch`
            ``estimators``: the fitted members, in the order of ``params``;
            ``n_members``: heads trained (members x ``n_init``); ``path``: the
            forward path the stack took (None where it reports none).

        Raises
        ------
        ValueError
            For other parameters than :attr:`member_params`, modules that
            train one by one only (several heads or layers, MLP readouts, class
            logits), mini-batches or ``callbacks`` (with several members), any
            input ``fit`` rejects, or a stack (every member, ``n_init`` times) that
            would not fit in the device's memory.

        Examples
        --------
        >>> from minip_learn import KernelAttentionRegressor
        >>> from minip_learn.datasets import make_minip
        >>> X, y = make_minip(32, seq_len=2, n_bits=6, random_state=0)
        >>> est = KernelAttentionRegressor(max_epochs=100, stop_tolerance=0.5)
        >>> res = est.fit_members(X, y, [{"rank": 1, "random_state": 0},
        ...                              {"rank": 4, "random_state": 0}])
        >>> [e.rank for e in res.estimators], res.n_members
        ([1, 4], 2)

        The same members through the public route:

        >>> from minip_learn.model_selection import fit_ensemble
        >>> fit_ensemble(est, X, y, ranks=[1, 4], seeds=[0]).params
        [{'rank': 1, 'random_state': 0}, {'rank': 4, 'random_state': 0}]
        """
        params = [dict(p) for p in params]
        if not params:
            raise ValueError("params must be a non-empty list of dicts.")
        for p in params:
            bad = set(p) - set(self.member_params)
            if bad:
                raise ValueError(
                    f"members of a {type(self).__name__} stack may differ only in "
                    f"{' and '.join(self.member_params)}; got {sorted(bad)}.")
        data, y2, fitted = self._validate_data(X, y, False)
        X3 = data.tokens
        ests = [clone(self).set_params(**p) for p in params]
        by_key, members, checked = {}, [], None
        sizes = [k for k in self.member_params if k != "random_state"]
        for est in ests:
            key = tuple(getattr(est, k) for k in sizes)
            if key not in by_key:
                # members differ only in size and seed: check (and e.g. collect the
                # vocabulary of the table map) once per size
                checked = est._check_params()
                by_key[key] = (est._module_params(X3, checked, fitted), est, checked)
            members.append((copy.deepcopy(by_key[key][0]), est.random_state))
        # the whole stack (members x restarts, trained at once) must fit in memory
        self._check_memory(data, checked, [m for m, _ in members], restarts=checked["n_init"])
        for module_params, est, est_checked in by_key.values():
            est._check_buildable(X3, module_params, est_checked)
        reason = self._stackable(members[0][0])
        if reason is not None and len(members) * checked["n_init"] > 1:
            raise ValueError(
                f"{type(self).__name__} {reason} is fitted one by one (ensemble=False); "
                "several members train as one stack only for single heads with an "
                "affine readout.")
        res = self._train(data, y2, members, checked, batched=True,
                          query=fitted["query_"], progress=progress)
        tokens = distinct_tokens(X3.reshape(-1, X3.shape[2]))  # once for every member
        for est, member, (module_params, _) in zip(ests, res.members, members):
            est._set_fitted_state(member, data, module_params, fitted, tokens=tokens)
        return Bunch(estimators=ests, n_members=res.n_members, path=res.path)

    def _set_fitted_state(self, member, data, module_params, fitted, tokens=None):
        """Set every fitted attribute from a trained member (``fit``, ``fit_members``)
        on the training ``data`` (:class:`_Inputs`); ``tokens``: the distinct tokens of
        ``data.tokens`` when already known."""
        self.__dict__.pop("vocabulary_", None)
        vocab = module_params.get("feature_kwargs", {}).get("vocabulary")
        if vocab is not None:
            self.vocabulary_ = vocab
        net, err = member.net, member.train_max_error
        self.net_ = net
        self.n_bits_ = self.n_features_in_ = data.tokens.shape[2]
        self.seq_len_ = data.seq_len
        self.n_epochs_ = len(net.history)
        self.init_errors_ = member.init_errors
        self.train_max_error_ = err
        self.solved_ = solves(self.train_max_error_)
        for name, value in fitted.items():
            setattr(self, name, value)
        if not math.isfinite(err):
            warnings.warn(
                f"Training diverged: the fitted {type(self).__name__} gives non-finite "
                "outputs on its training set (solved_=False, train_max_error_=inf). Try a "
                "smaller lr, dtype='float64' or a bounded feature_map.",
                ConvergenceWarning,
                stacklevel=3,
            )
        return self

    @classmethod
    def from_module(cls, module, **params):
        """A fitted estimator around a head with hand-set weights.

        The estimator predicts and scores without ``fit`` (e.g. the exact
        constructions of :mod:`minip_learn.constructions`). The module's ``n_bits`` becomes
        ``n_bits_``; the module is used as is (its dtype is kept, it is moved to the
        estimator's ``device``); ``params`` are the estimator's hyperparameters.

        Parameters
        ----------
        module : torch.nn.Module
            A head of :mod:`minip_learn.nn` of the estimator's kind.
        **params
            Hyperparameters of the estimator.

        Returns
        -------
        estimator : object
            A fitted estimator (``n_epochs_ = 0``, ``seq_len_ = None``).

        Examples
        --------
        >>> from minip_learn import KernelAttentionRegressor
        >>> from minip_learn.nn import KernelAttentionHead
        >>> est = KernelAttentionRegressor.from_module(KernelAttentionHead(6, 2), rank=2)
        >>> est.n_bits_, est.n_epochs_
        (6, 0)
        """
        return cls(**params)._set_fitted_module(module)

    def _set_fitted_module(self, module):
        """Make this estimator fitted around ``module`` (see :meth:`from_module`)."""
        train = self._training_args(self._check_params())
        train["dtype"] = next(module.parameters()).dtype
        self.net_ = build_net(module.to(device=train["device"]), criterion=self._criterion,
                              **train)
        vocab = getattr(getattr(module, "query_features", None), "vocabulary", None)
        self.__dict__.pop("vocabulary_", None)
        if vocab is not None:
            self.vocabulary_ = vocab.cpu().numpy().astype(np.uint8)
        self.n_bits_ = self.n_features_in_ = module.n_bits
        self.seq_len_ = None
        self.n_epochs_ = 0
        self.query_ = "all"
        return self

    # -- prediction ------------------------------------------------------------------
    def _raw_predict(self, X):
        """The module's outputs for ``X`` in float64 (chunked, memory-checked); for a
        compact ``X``, one per slot and 0 at padding."""
        check_is_fitted(self, "net_")
        data = self._validate_X(X, reset=False)
        X3, was_2d, counts = data.tokens, data.was_2d, data.counts
        final = self._final_query()
        self._check_predict_tokens(X3)
        n_samples, seq_len, _ = X3.shape  # seq_len: the slots of a compact X
        # The trained parameters are evaluated in float64: float32 matrix products round
        # a row differently depending on its position in the batch (by an ulp), which
        # would make predictions depend on the order and chunking of X.
        dtype, device = torch.float64, self.net_.device
        module = copy.deepcopy(self.net_.module_).to(dtype=dtype).eval()
        itemsize = torch.finfo(dtype).bits // 8
        per_seq = self._predict_bytes_per_sequence(seq_len, itemsize)
        free = _available_memory(device)
        if free is not None and per_seq > free:
            raise ValueError(
                f"X has seq_len={seq_len}, which this model cannot take on {device}: one "
                f"sequence needs about {per_seq / 2**30:.3g} GiB of working memory "
                f"({self._predict_cost_note()}) but {free / 2**30:.3g} GiB are free."
            )
        chunk = int(max(1, min(n_samples, PREDICT_CHUNK_BYTES // max(per_seq, 1))))
        out = []
        with torch.no_grad():
            for start in range(0, n_samples, chunk):
                xb = _to_tensor(X3[start:start + chunk], dtype, device)
                if counts is not None:
                    xb = compact_input(xb, _to_tensor(counts[start:start + chunk], dtype,
                                                      device))
                try:
                    out.append(module_forward(module, xb, last=final).detach().cpu())
                except RuntimeError as exc:
                    if not _is_out_of_memory(exc):
                        raise
                    raise ValueError(
                        f"X has seq_len={seq_len}, which this model cannot take on {device}: "
                        f"predicting ran out of memory ({self._predict_cost_note()})."
                    ) from None
        out = torch.cat(out).to(torch.float64).numpy()
        if counts is not None:
            out[data.padding] = 0.0
        if was_2d:
            return out[:, 0]
        return out[:, -1] if final else out

    def _final_query(self):
        """Whether the estimator was fitted on final-query targets (``query_``)."""
        return getattr(self, "query_", "all") == "last"

    def _predict_bytes_per_sequence(self, seq_len, itemsize):
        """Rough working memory of one sequence in a forward pass (linear in seq_len)."""
        module = self.net_.module_
        width = module.n_bits + 2 * getattr(module, "value_dim", module.n_bits)
        width += 4 * getattr(module, "rank", 0) + 2 * getattr(module, "score_dim", 0)
        return 4 * seq_len * width * itemsize

    def _predict_cost_note(self):
        return "the sketch makes the cost linear in seq_len"

    def _check_predict_tokens(self, X3):
        """Hook for heads that cannot take some tokens at predict time."""

    def __getstate__(self):
        return versioned_state(super().__getstate__())

    def __setstate__(self, state):
        """Restore a pickled estimator, also one saved by another minip_learn version.

        Hyperparameters of the class missing from ``state`` (added since it was saved)
        are set to their defaults; a :class:`MinIPVersionWarning` names both versions
        and those hyperparameters when the saving version (``_minip_learn_version``;
        absent from files saved before versions were recorded) is not the running one
        or something was filled.
        """
        state, warning = versioned_restore(type(self), state)
        # skorch has already restored ``net_``, mapping a GPU model to the CPU when
        # CUDA is not available here (with a DeviceWarning); keep its device a string.
        super().__setstate__(state)
        net = self.__dict__.get("net_")
        if net is not None and isinstance(getattr(net, "device", None), torch.device):
            net.device = str(net.device)
        if warning is not None:
            warnings.warn(warning, stacklevel=2)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # X: (n_samples, seq_len, n_bits) sequences, or 2-D (n_samples, n_bits) read as
        # single-token sequences; real, dense, finite.
        tags.input_tags.two_d_array = True
        tags.input_tags.three_d_array = True
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = False
        # y: one target per token; (n_samples,) for 2-D X. Not generic multi-output.
        tags.target_tags.required = True
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = False
        # fixed random_state -> bitwise-identical fits and predictions
        tags.non_deterministic = False
        return tags


class ExactMatchScore:
    """The sequence exact-match ``score`` of every estimator of this library."""

    @data_doc
    def score(self, X, y, sample_weight=None):
        """Sequence exact-match accuracy: the fraction of sequences whose every
        position is predicted correctly (within 1/2 of its target for a regressor, its
        class for a classifier); for 2-D ``X`` the fraction of tokens. For a compact
        ``X`` every slot stands for the positions of its token (the same output), so
        the score is that of the materialised family. With final-query targets (3-D
        ``X``, ``y`` of shape ``(n_samples,)``) the fraction of sequences whose last
        position is predicted correctly.

        Parameters
        ----------
        X : %(X)s
        y : %(y)s
            For a compact ``X``, one target per slot; padding entries are ignored. For
            3-D ``X``, shape ``(n_samples,)``: final-query targets.
        sample_weight : None
            Not supported; must be None.

        Returns
        -------
        score : float
        """
        if sample_weight is not None:
            raise ValueError("sample_weight is not supported by the exact-match score.")
        return self._exact_match(X, y, self.predict(X))


class AttentionRegressorMixin(ExactMatchScore, RegressorMixin):
    """Real outputs per token, exact when within 1/2 of the target."""

    @data_doc
    def predict(self, X):
        """Real-valued outputs ``p_i`` for every token.

        Parameters
        ----------
        X : %(X)s
            Sequences of any length; tokens must have the ``n_bits`` seen in fit.

        Returns
        -------
        y_pred : ndarray of shape (n_samples, seq_len), or (n_samples,) for 2-D X
            For a compact ``X``, shape (n_samples, n_slots): the output at every slot
            (that of every position of its token, see ``X.expand``), 0.0 at padding.
            After a fit on final-query targets (``query_ = "last"``), shape
            (n_samples,): the output at the last position of every sequence.
        """
        return self._raw_predict(X)

    def _exact_match(self, X, y, y_pred):
        final = self._final_query()
        if is_compact(X):
            if np.ndim(y) == 1:
                raise final_query_error(X, y)
            y2 = check_targets(_compact_targets(y, X, 0.0), X.n_sequences, X.n_slots)
            return sequence_exact_match(y2, y_pred)  # 0 and 0 at padding
        X3, was_2d = check_sequences(X, allow_2d=True)
        n, seq_len = X3.shape[:2]
        if not was_2d and np.ndim(y) == 1:  # final-query targets: the last positions
            y1 = check_targets(y, n, 1, was_2d=True)
            return sequence_exact_match(y1, (y_pred if final else y_pred[:, -1]).reshape(n, 1))
        y2 = check_targets(y, n, seq_len, was_2d=was_2d)
        if final and not was_2d:
            raise ValueError(
                f"y has shape {y2.shape}, but {type(self).__name__} was fitted on "
                "final-query targets (query_='last') and predicts one output per "
                f"sequence: pass y of shape ({n},), the targets of the last positions.")
        return sequence_exact_match(y2, y_pred.reshape(y2.shape))
