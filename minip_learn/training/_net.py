"""The skorch net of the library: whole-batch iteration, a seeded shuffle, the dtype.

skorch's default ``Dataset``/``DataLoader`` collates one sample at a time, which makes
a full-batch fit of these tiny heads many times slower than a plain torch loop. The
:class:`BatchIterator` here slices whole batches out of tensors that already sit on the
training device.

Sequences in multiset form travel as a dict (:func:`compact_input`): ``{"x": tokens,
"counts": counts}`` with the distinct tokens of every sequence ``(n, k, n_bits)`` and
their multiplicities ``(n, k)``. skorch hands a dict ``X`` to the module's forward as
keyword arguments, so every module of :mod:`minip_learn.nn` receives
``forward(x, counts=counts)``; the batches slice both tensors, and the loss weights
every slot by its multiplicity (:func:`weighted_loss`), which makes it the loss of the
materialised sequences.
"""

import inspect
from collections.abc import Mapping

import numpy as np
import torch
from skorch import NeuralNet
from skorch.callbacks import Callback, EpochTimer
from skorch.history import History

from ..nn import last_kwargs, last_output

__all__ = ["BatchIterator", "LastPositionLoss", "MemberLoss", "MinIPHistory", "MinIPNet",
           "TrainLoss", "compact_input", "input_counts", "input_tokens", "is_periodic_epoch",
           "last_position_error", "module_forward", "weighted_loss"]


def compact_input(tokens, counts):
    """The training or prediction input of sequences in multiset form.

    Parameters
    ----------
    tokens : Tensor of shape (n_sequences, k, n_bits)
        The tokens of every slot (a padding slot repeats a token of its sequence).
    counts : Tensor of shape (n_sequences, k)
        The multiplicity of every slot, 0 for padding, in the dtype of ``tokens``.

    Returns
    -------
    X : dict
        ``{"x": tokens, "counts": counts}``: the keyword arguments of the modules'
        ``forward``.
    """
    return {"x": tokens, "counts": counts}


def input_tokens(X):
    """The token tensor of an input: ``X`` itself, or the ``"x"`` of a multiset input."""
    return X["x"] if isinstance(X, Mapping) else X


def input_counts(X):
    """The multiplicities of a multiset input (:func:`compact_input`), else None."""
    return X.get("counts") if isinstance(X, Mapping) else None


def module_forward(module, X, *, last=False):
    """``module(X)``, or ``module(**X)`` for a multiset input; ``last=True``: the output
    at the last position only (final-query targets; :mod:`minip_learn.nn.final_query`).

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> from minip_learn.training import module_forward
    >>> mixer, x = make_mixer("linear", 4, 2), torch.rand(3, 6, 4)
    >>> module_forward(mixer, x).shape, module_forward(mixer, x, last=True).shape
    (torch.Size([3, 6]), torch.Size([3, 1]))
    """
    kwargs = last_kwargs(module, last=last)
    out = module(**X, **kwargs) if isinstance(X, Mapping) else module(X, **kwargs)
    return last_output(module, out, last)


def _rows(X, index):
    """The sequences ``index`` of an input (both tensors of a multiset input)."""
    if isinstance(X, Mapping):
        return {k: v[index] for k, v in X.items()}
    return X[index]


def weighted_loss(loss, y_pred, y, weights):
    """The loss of one head's outputs, every position weighted by ``weights``.

    With the multiplicities of sequences in multiset form as ``weights`` this is the
    loss of the materialised sequences: the mean squared error
    ``sum_p w_p (y_pred_p - y_p)^2 / sum_p w_p`` for :class:`torch.nn.MSELoss` (mean),
    else ``loss(y_pred, y, weights=weights)`` for a loss that takes ``weights``
    (e.g. the classifier's cross-entropy). A :class:`MemberLoss` weights each member.

    Parameters
    ----------
    loss : torch.nn.Module
    y_pred, y : Tensor
    weights : Tensor of shape ``y.shape`` or None
        None: ``loss(y_pred, y)``.

    Returns
    -------
    Tensor

    Raises
    ------
    TypeError
        For a loss that neither is a mean squared error nor takes ``weights``.
    """
    if isinstance(loss, MemberLoss):
        return loss(y_pred, y, weights=weights)
    if weights is None:
        return loss(y_pred, y)
    if type(loss) is torch.nn.MSELoss and loss.reduction == "mean":
        d = y_pred - y
        return (weights * d * d).sum() / weights.sum()
    try:
        takes = "weights" in inspect.signature(loss.forward).parameters
    except (TypeError, ValueError):  # no signature to read
        takes = False
    if not takes:
        raise TypeError(
            f"the loss {type(loss).__name__} takes no per-position weights "
            "(forward(y_pred, y, weights=...)), which sequences in multiset form need.")
    return loss(y_pred, y, weights=weights)


class LastPositionLoss(torch.nn.Module):
    """The loss of one head on the output at the last position of every sequence only:
    final-query targets, one per sequence.

    Outputs at earlier positions get no gradient and no target; ``y_pred`` has the
    positions on its second axis (``(n, seq_len)`` real outputs or ``(n, seq_len,
    n_classes)`` logits) and ``y`` one target per sequence, shape ``(n,)``.

    Parameters
    ----------
    loss : type, default=torch.nn.MSELoss
        The loss class of one head (built with no arguments).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.training import LastPositionLoss
    >>> crit = LastPositionLoss()
    >>> y_pred = torch.tensor([[9.0, 1.0], [-5.0, 2.0]])  # earlier positions ignored
    >>> crit(y_pred, torch.tensor([1.0, 0.0])).item()
    2.0
    """

    def __init__(self, loss=torch.nn.MSELoss):
        super().__init__()
        self.loss = loss()

    def forward(self, y_pred, y, weights=None):
        if weights is not None:
            raise ValueError(
                "final-query targets need materialised sequences: their order decides "
                "the last position, which sequences in multiset form do not have.")
        return self.loss(y_pred[:, -1], y)


def last_position_error(y_pred, y, *, error):
    """``error`` of the output at the last position of every sequence, for
    final-query targets (see :class:`LastPositionLoss`).

    Parameters
    ----------
    y_pred : Tensor of shape (n_members, n, seq_len, ...)
        The outputs of every member, members leading.
    y : Tensor of shape (n,)
        One target per sequence.
    error : callable
        ``error(y_pred, y)`` of every output position (e.g.
        :func:`~minip_learn.training.absolute_error`).

    Returns
    -------
    Tensor of shape (n_members, n, ...)

    Examples
    --------
    >>> import torch
    >>> from minip_learn.training import absolute_error, last_position_error
    >>> y_pred = torch.tensor([[[9.0, 1.5], [7.0, 0.0]]])  # one member, 2 sequences
    >>> last_position_error(y_pred, torch.tensor([1.0, 1.0]), error=absolute_error)
    tensor([[0.5000, 1.0000]])
    """
    return error(y_pred[:, :, -1], y)


class MinIPHistory(History):
    """skorch's ``History`` whose recording methods reach the current epoch directly.

    ``History[-1]`` copies the whole history first (it resolves every kind of index
    through a list of all epochs), and skorch records through it several times per
    epoch: a cost that grows with the epochs run. Reading and indexing are skorch's.
    """

    def new_batch(self):
        list.__getitem__(self, -1)["batches"].append({})

    def record(self, attr, value):
        if not self:
            raise ValueError("Call new_epoch before recording for the first time.")
        list.__getitem__(self, -1)[attr] = value

    def record_batch(self, attr, value):
        list.__getitem__(self, -1)["batches"][-1][attr] = value


class BatchIterator:
    """Iterate over ``(X, y)`` tensors of a skorch ``Dataset`` in whole batches.

    Parameters
    ----------
    dataset : skorch.dataset.Dataset
        Holds tensors ``X`` and ``y`` (``y`` may be None at predict time); ``X`` may be
        a multiset input (:func:`compact_input`), whose tensors are sliced together.
    batch_size : int
        Batch size; ``-1`` or ``None`` means the whole set in one batch.
    shuffle : bool
        Draw a new permutation per pass (only when batches are smaller than the set).
    generator : torch.Generator or None
        Source of the permutations.
    """

    def __init__(self, dataset, batch_size=-1, shuffle=False, generator=None):
        self.X = dataset.X
        self.y = dataset.y
        self.n = len(input_tokens(self.X))
        self.batch_size = self.n if batch_size in (None, -1) else int(batch_size)
        self.shuffle = shuffle
        self.generator = generator

    def __len__(self):
        return -(-self.n // self.batch_size)

    def __iter__(self):
        if self.batch_size >= self.n:
            yield self.X, self.y
            return
        if self.shuffle:
            order = torch.randperm(self.n, generator=self.generator).to(
                input_tokens(self.X).device)
        else:
            order = None
        for start in range(0, self.n, self.batch_size):
            if order is None:
                sl = slice(start, start + self.batch_size)
            else:
                sl = order[start:start + self.batch_size]
            yield _rows(self.X, sl), (None if self.y is None else self.y[sl])


def is_periodic_epoch(n_epochs, every, *, max_epochs=None):
    """Whether the epoch that brings the count to ``n_epochs`` is an ``every``-th one.

    Parameters
    ----------
    n_epochs : int
        Epochs run, the one just ended included (the length of the history).
    every : int
        The period: epochs ``every``, ``2 * every``, ... are periodic.
    max_epochs : int, default=None
        When given, the last epoch of training (``n_epochs >= max_epochs``) counts too,
        whatever the period.

    Returns
    -------
    periodic : bool
        ``n_epochs % every == 0``, or ``n_epochs >= max_epochs`` when ``max_epochs``
        is given.

    Examples
    --------
    >>> from minip_learn.training import is_periodic_epoch
    >>> [n for n in range(1, 11) if is_periodic_epoch(n, 4)]
    [4, 8]
    >>> [n for n in range(1, 11) if is_periodic_epoch(n, 4, max_epochs=10)]
    [4, 8, 10]
    """
    return n_epochs % every == 0 or (max_epochs is not None and n_epochs >= max_epochs)


class MinIPNet(NeuralNet):
    """skorch ``NeuralNet`` of the Min-IP estimators.

    Differences from the stock net: whole-batch iteration (:class:`BatchIterator`)
    with a seeded shuffling generator, parameters cast to ``dtype`` when the module is
    initialised, a lean set of default callbacks (epoch timer and training loss), and
    tensors already on the device passed to the module and the criterion unconverted.
    Its module is a single head (the fitted ``net_`` of an estimator) or, during
    training, a :class:`~minip_learn.nn.HeadEnsemble` of members with the criterion
    :class:`MemberLoss` (see :func:`~minip_learn.training.train_members`).

    Parameters
    ----------
    *args, **kwargs
        As for :class:`skorch.NeuralNet`.
    seed : int, default=0
        Seed of the generator that shuffles mini-batches.
    dtype : torch.dtype, default=torch.float32
        Floating-point type of the module's parameters.
    query : {"all", "last"}, default="all"
        The outputs the module computes: every position, or (final-query targets) the
        last position only, ``module(x, last=True)``, at the cost of one query.
    check_every : int, default=1
        Epochs between two reads of the training figures on the host. The batch
        losses and the callbacks' per-epoch figures are recorded in the history as
        tensors on the device and turned into numbers (:meth:`sync_history`, one
        transfer) on every ``check_every``-th epoch and at the end of training; the
        callbacks that decide something (stopping, :class:`TrainLoss`) decide on those
        epochs (:meth:`is_check_epoch`). On a GPU this keeps the device busy between
        checks instead of waiting for the host every epoch; 1 reads every epoch.

    Examples
    --------
    An estimator's ``net_`` is one (:func:`~minip_learn.training.build_net` builds it):

    >>> import torch
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.nn import KernelAttentionHead
    >>> from minip_learn.training import build_net
    >>> X, y = (torch.as_tensor(a, dtype=torch.float32)
    ...         for a in make_minip(16, seq_len=3, n_bits=4, random_state=0))
    >>> net = build_net(KernelAttentionHead, n_bits=4, rank=2, max_epochs=3)
    >>> len(net.fit(X, y).history), net.predict(X).shape
    (3, (16, 3))
    """

    def __init__(self, *args, seed=0, dtype=torch.float32, query="all", check_every=1,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.seed = seed
        self.dtype = dtype
        self.query = query
        self.check_every = check_every

    @property
    def _default_callbacks(self):
        return [("epoch_timer", EpochTimer()), ("train_loss", TrainLoss())]

    def initialize_history(self):
        super().initialize_history()
        if not isinstance(self.history_, MinIPHistory):
            self.history_ = MinIPHistory(self.history_)
        self._synced = 0
        return self

    def is_check_epoch(self):
        """Whether the epoch just run is one on which the training figures are read:
        every ``check_every``-th epoch and the last of ``max_epochs``."""
        n = len(self.history)
        return is_periodic_epoch(n, self.check_every, max_epochs=self.max_epochs)

    def sync_history(self):
        """Turn every tensor recorded in the history since the last call into numbers
        (a float for one element, else a list), with one transfer to the host."""
        rows = [list.__getitem__(self.history, i)
                for i in range(max(getattr(self, "_synced", 0) - 1, 0), len(self.history))]
        slots = []
        for row in rows:
            for d in (row, *row.get("batches", ())):
                slots.extend((d, k) for k, v in d.items() if torch.is_tensor(v))
        self._synced = len(self.history)
        if not slots:
            return
        values = [d[k] for d, k in slots]
        # one concatenation (promoting to the widest dtype) and one transfer; tolist
        # gives every float32 value exactly, as the Python float it widens to
        flat = torch.cat([v.detach().reshape(-1) for v in values]).tolist()
        start = 0
        for (d, k), v in zip(slots, values):
            n = v.numel()
            d[k] = flat[start] if v.ndim == 0 else flat[start:start + n]
            start += n

    def run_single_epoch(self, iterator, training, prefix, step_fn, **fit_params):
        """skorch's epoch, recording each batch's loss as a tensor (read on the host by
        :meth:`sync_history`) rather than with a host sync per batch."""
        if iterator is None:
            return
        batch_count = 0
        for batch in iterator:
            self.notify("on_batch_begin", batch=batch, training=training)
            step = step_fn(batch, **fit_params)
            self.history.record_batch(prefix + "_loss", step["loss"].detach())
            self.history.record_batch(prefix + "_batch_size", len(input_tokens(batch[0])))
            self.notify("on_batch_end", batch=batch, training=training, **step)
            batch_count += 1
        self.history.record(prefix + "_batch_count", batch_count)

    def partial_fit(self, X, y=None, classes=None, **fit_params):
        super().partial_fit(X, y, classes=classes, **fit_params)
        self.sync_history()  # e.g. training interrupted between two checks
        return self

    def initialize_module(self):
        super().initialize_module()
        tensors = [*self.module_.parameters(), *self.module_.buffers()]
        if any(t.is_floating_point() and t.dtype != self.dtype for t in tensors):
            self.module_.to(dtype=self.dtype)
        return self

    def _on_device(self, t):
        return torch.is_tensor(t) and t.device == torch.device(self.device)

    def infer(self, x, **fit_params):
        # a tensor already on the device (every batch of BatchIterator) goes to the
        # module as is, a multiset input as keyword arguments; anything else through
        # skorch's conversion
        last = getattr(self, "query", "all") == "last"
        if not fit_params:
            if self._on_device(x) or (
                    isinstance(x, Mapping) and all(self._on_device(v) for v in x.values())):
                return module_forward(self.module_, x, last=last)
        out = super().infer(x, **fit_params, **last_kwargs(self.module_, last=last))
        return last_output(self.module_, out, last)

    def get_loss(self, y_pred, y_true, X=None, training=False):
        weights = input_counts(X)
        if weights is not None:  # a multiset input: every slot weighted by its count
            return weighted_loss(self.criterion_, y_pred, y_true, weights)
        if self._on_device(y_true):
            return self.criterion_(y_pred, y_true)
        return super().get_loss(y_pred, y_true, X=X, training=training)

    def get_iterator(self, dataset, training=False):
        if training:
            if getattr(self, "_shuffle_generator", None) is None:
                self._shuffle_generator = torch.Generator().manual_seed(self.seed)
            return BatchIterator(
                dataset, self.batch_size, shuffle=True, generator=self._shuffle_generator
            )
        return BatchIterator(dataset, self.batch_size)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_shuffle_generator", None)
        return state

    #: the settings added since the first saved nets, with the value they behaved as
    ADDED_SETTINGS = {"query": "all", "check_every": 1}

    def __setstate__(self, state):
        # a net saved before a setting existed behaves as its value then
        for name, value in self.ADDED_SETTINGS.items():
            state.setdefault(name, value)
        super().__setstate__(state)


class TrainLoss(Callback):
    """Record the epoch's training loss ``train_loss`` and ``train_loss_best``.

    The values of skorch's ``PassthroughScoring(name="train_loss", on_train=True)``
    (the batch losses averaged with the batch sizes as weights), read from the
    epochs' batches directly: on the epochs a :class:`MinIPNet` checks
    (``check_every``), for every epoch since the previous check, and at the end of
    training.
    """

    def initialize(self):
        self.best_score_ = np.inf
        self.done_ = 0
        return self

    def on_epoch_end(self, net, **kwargs):
        check = getattr(net, "is_check_epoch", None)
        if check is None or check():
            self._score(net)

    def on_train_end(self, net, **kwargs):
        self._score(net)

    def _score(self, net):
        """Score every epoch not scored yet (those since the last check)."""
        sync = getattr(net, "sync_history", None)
        if sync is not None:
            sync()
        # the rows read as the list items they are: skorch's History indexing copies
        # the whole history on every call (see MinIPHistory)
        for i in range(self.done_, len(net.history)):
            row = list.__getitem__(net.history, i)
            batches = row["batches"]
            if not batches or "train_loss" not in batches[0]:
                continue
            if len(batches) == 1:
                loss = float(batches[0]["train_loss"])
            else:
                loss = float(np.average([b["train_loss"] for b in batches],
                                        weights=[b["train_batch_size"] for b in batches]))
            is_best = loss < self.best_score_
            if is_best:
                self.best_score_ = loss
            row["train_loss"] = loss
            row["train_loss_best"] = bool(is_best)
        self.done_ = len(net.history)


class _MemberMSE(torch.autograd.Function):
    """Mean squared error of every member, ``((y_pred - y) ** 2).mean()`` over all but
    the first dimension, computed in the memory layout of ``y_pred``; with ``weights``
    (shaped like ``y``) the weighted mean ``sum w (y_pred - y)^2 / sum w``.

    Outputs of the pair path are position-major (``y_pred[e]`` strided by ``E``): the
    differences are then formed as a contiguous (positions, members) matrix and summed
    over positions by a matrix-vector product (a strided reduction over the positions
    costs several times more), and the gradient comes back in that layout.
    """

    @staticmethod
    def forward(ctx, y_pred, y, weights=None):
        E = y_pred.shape[0]
        n = y_pred[0].numel()
        flat = y_pred.reshape(E, n)  # a view in both layouts
        target = y.expand(y_pred.shape[1:]).reshape(1, n)
        position_major = E > 1 and flat.stride() == (1, E)
        w = None if weights is None else weights.expand(y_pred.shape[1:]).reshape(n)
        if position_major:
            d = flat.T - target.T  # (positions, members), contiguous
            losses = torch.mv((d * d).T, d.new_ones(n) if w is None else w)
        else:
            d = flat - target
            losses = (d * d).sum(1) if w is None else torch.mv(d * d, w)
        ctx.save_for_backward(d, w)
        ctx.position_major = position_major
        ctx.shape = y_pred.shape
        ctx.total = n if w is None else w.sum()
        return losses / ctx.total

    @staticmethod
    def backward(ctx, grad):
        d, w = ctx.saved_tensors
        scale = (2 / ctx.total) * grad
        if ctx.position_major:
            d = d if w is None else d * w[:, None]
            return (d * scale).T.view(ctx.shape), None, None
        d = d if w is None else d * w
        return (d * scale[:, None]).reshape(ctx.shape), None, None


class MemberLoss(torch.nn.Module):
    """The loss of every member of a stack, summed: each member gets its own gradient.

    Parameters
    ----------
    loss : torch.nn.Module
        The loss of one member, ``loss(y_pred, y)`` (e.g. ``torch.nn.MSELoss()``).

    Attributes
    ----------
    member_losses_ : Tensor of shape (n_members,)
        The members' losses of the last call (detached).

    Examples
    --------
    >>> import torch
    >>> crit = MemberLoss(torch.nn.MSELoss())
    >>> y = torch.zeros(4, 3)
    >>> total = crit(torch.stack([torch.ones(4, 3), 2 * torch.ones(4, 3)]), y)
    >>> total.item(), crit.member_losses_.tolist()
    (5.0, [1.0, 4.0])
    """

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def forward(self, y_pred, y, weights=None):
        """The summed loss; ``weights`` (shaped like ``y``, e.g. the multiplicities of
        sequences in multiset form) weight every position (:func:`weighted_loss`)."""
        if len(y_pred) == 1:
            total = weighted_loss(self.loss, y_pred.squeeze(0), y, weights)
            self.member_losses_ = total.detach().reshape(1)
            return total
        if type(self.loss) is torch.nn.MSELoss and self.loss.reduction == "mean":
            losses = _MemberMSE.apply(y_pred, y, weights)
        elif weights is None:
            losses = torch.func.vmap(self.loss, in_dims=(0, None))(y_pred, y)
        else:
            losses = torch.func.vmap(lambda p: weighted_loss(self.loss, p, y, weights))(y_pred)
        self.member_losses_ = losses.detach()
        return losses.sum()
