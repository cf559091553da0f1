"""Callbacks of the member-stack training: stopping, feature splitting, memory, progress.

Each works per member of the :class:`~minip_learn.nn.HeadEnsemble` that the net
trains (one member for a single ``fit``).
"""

import math

import numpy as np
import torch
from skorch.callbacks import Callback

from .._memory import heap_free_bytes, malloc_trim
from ..metrics import TOLERANCE
from ..nn.splitting import minip_partners, split_shared_features
from ._net import input_counts, input_tokens, is_periodic_epoch

__all__ = [
    "MemberLog",
    "ProgressBar",
    "SplitSharedFeatures",
    "StopWhenSolved",
    "TRIM_EVERY",
    "TRIM_MIN_FREE",
    "TrimMemory",
    "absolute_error",
]

#: epochs between two ``malloc_trim`` calls of :class:`TrimMemory`
TRIM_EVERY = 50
#: bytes free in glibc's heap from which :class:`TrimMemory` trims (64 MiB)
TRIM_MIN_FREE = 64 * 2**20


def absolute_error(y_pred, y):
    """Absolute error of every output position, ``|y_pred - y|`` (members leading)."""
    return (y_pred - y).abs()


def member_max_errors(error, y_pred, y, weights=None):
    """Largest ``error`` of every member, shape ``(E,)``; NaN becomes inf.

    ``weights`` (shaped like ``y``, e.g. the multiplicities of sequences in multiset
    form): positions of weight 0 (padding slots) are left out.
    """
    err = error(y_pred, y)
    if weights is not None:
        err = torch.where(weights > 0, err, torch.zeros((), dtype=err.dtype, device=err.device))
    # amax propagates NaN; one op turns it into inf and keeps the infinities
    return torch.nan_to_num(err.flatten(1).amax(1), nan=math.inf, posinf=math.inf,
                            neginf=-math.inf)


def member_snapshot(ens, opt, i):
    """Member ``i``'s parameters and optimizer state, cropped to its own shapes."""
    snap = {}
    for name, p in zip(ens.names, ens.params):
        state = {}
        for k, v in opt.state.get(p, {}).items():
            if torch.is_tensor(v) and v.shape == p.shape:
                state[k] = ens.crop(i, name, v.detach()).clone()
            elif torch.is_tensor(v):
                state[k] = v.detach().clone()
            else:
                state[k] = v
        snap[name] = (ens.crop(i, name, p.detach()).clone(), state)
    return snap


def _where_members(mask, a, b):
    """``a`` for the members in ``mask``, else ``b`` (tensors with members leading)."""
    return torch.where(mask.view(-1, *[1] * (a.ndim - 1)), a, b)


class MemberLog(Callback):
    """Record the loss of every member of every batch as ``member_loss``."""

    def on_batch_end(self, net, training=None, **kwargs):
        if training:
            # a tensor until the net's next check (MinIPNet.sync_history)
            net.history.record_batch("member_loss", net.criterion_.member_losses_)


class StopWhenSolved(Callback):
    """Stop each member as soon as it solves the training set (with a margin).

    During an epoch it tracks every member's largest error over the training batches
    (recorded in the history as ``member_max_error``, measured before each batch's
    update; padding slots of sequences in multiset form are left out), on the device.
    On the epochs the net checks (every one, or every ``check_every``-th of a
    :class:`~minip_learn.training.MinIPNet`), a member whose error falls below
    ``tolerance`` is checked with one forward pass over the whole training set; if
    every position is within ``tolerance`` of its target the member stops: its
    parameters and optimizer state stay those of that epoch. Training ends when every
    member has stopped.

    Parameters
    ----------
    tolerance : float, default=0.5
        Stop once ``error < tolerance`` everywhere. ``0.5`` is the solving criterion;
        a smaller value keeps training until a margin is reached, which generalises
        better to held-out sequences.
    error : callable, default=absolute_error
        ``error(y_pred, y)``: the error of every output position of every member
        (e.g. the distance between the argmax class and the target class).

    Attributes
    ----------
    active_ : BoolTensor of shape (n_members,)
        The members still training.
    n_epochs_ : ndarray of shape (n_members,)
        Epochs trained by every member.
    snapshots_ : dict
        Parameters and optimizer state of the members that stopped while others
        trained on, by member index.

    Examples
    --------
    An estimator's ``stop_tolerance`` is this callback's ``tolerance``:

    >>> import torch
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.nn import KernelAttentionHead
    >>> from minip_learn.training import StopWhenSolved, train_members
    >>> X, y = (torch.as_tensor(a, dtype=torch.float32)
    ...         for a in make_minip(32, seq_len=2, n_bits=4, random_state=0))
    >>> res = train_members(KernelAttentionHead, [(dict(n_bits=4, rank=4), 0)], X, y,
    ...                     lr=0.05, max_epochs=2000,
    ...                     callbacks=[StopWhenSolved(tolerance=0.5)])
    >>> len(res.members[0].net.history) < 2000  # stopped once solved
    True
    """

    def __init__(self, tolerance=TOLERANCE, error=absolute_error):
        self.tolerance = tolerance
        self.error = error

    def on_train_begin(self, net, **kwargs):
        E = net.module_.n_members
        self.active_ = torch.ones(E, dtype=torch.bool)
        self.n_epochs_ = np.zeros(E, dtype=int)
        self.snapshots_ = {}
        self._frozen = None
        net.active_members_ = self.active_

    def on_epoch_begin(self, net, **kwargs):
        self.max_errors_ = None

    def on_batch_end(self, net, batch=None, training=None, y_pred=None, **kwargs):
        if not training:
            return
        if self._frozen is not None:  # stopped members undo the step just taken
            with torch.no_grad():
                for p, f in zip(net.module_.params, self._frozen):
                    p.copy_(_where_members(self._stopped, f, p))
        err = member_max_errors(self.error, y_pred.detach(), batch[1], input_counts(batch[0]))
        self.max_errors_ = err if self.max_errors_ is None else torch.maximum(
            self.max_errors_, err)

    def on_epoch_end(self, net, dataset_train=None, **kwargs):
        net.history.record("member_max_error", self.max_errors_)
        active = self.active_
        self.n_epochs_[active.numpy()] += 1
        check = getattr(net, "is_check_epoch", None)
        if check is not None:
            if not check():
                return  # read with the next check (MinIPNet.sync_history)
            net.sync_history()
        errors = list.__getitem__(net.history, -1)["member_max_error"]
        if torch.is_tensor(errors):
            errors = errors.tolist()
        # the host's figures compared on the host (numpy: no device op)
        cand = active.numpy() & (np.asarray(errors, dtype=np.float64) < self.tolerance)
        if not cand.any():
            return
        with torch.no_grad():
            net.module_.eval()
            out = net.infer(dataset_train.X)
            err = member_max_errors(self.error, out, dataset_train.y,
                                    input_counts(dataset_train.X)).tolist()
        stop = torch.from_numpy(cand & (np.asarray(err, dtype=np.float64) < self.tolerance))
        if not bool(stop.any()):
            return
        if bool((active & ~stop).any()):
            self._freeze(net, stop)
        active &= ~stop
        if not bool(active.any()):
            raise KeyboardInterrupt

    def _freeze(self, net, stop):
        ens = net.module_
        for i in torch.nonzero(stop).flatten().tolist():
            self.snapshots_[i] = member_snapshot(ens, net.optimizer_, i)
        st = stop.to(ens.params[0].device)
        with torch.no_grad():
            if self._frozen is None:
                self._frozen = [p.detach().clone() for p in ens.params]
                self._stopped = st
            else:
                self._frozen = [_where_members(st, p.detach(), f)
                                for p, f in zip(ens.params, self._frozen)]
                self._stopped = self._stopped | st


class SplitSharedFeatures(Callback):
    """Every ``every`` epochs, give queries that share a dominant feature their own.

    Runs :func:`~minip_learn.nn.split_shared_features` on the members of a stack of
    kernel heads with separate ``table`` query and key maps (other modules are left
    alone), on the members still training (see :class:`StopWhenSolved`) and within
    each member's rank mask, and zeroes the optimizer state of the overwritten
    entries. The number of queries moved per member is recorded in the history as
    ``member_n_split`` on the epochs where it runs (None for a stopped member).

    Parameters
    ----------
    every : int, default=200
        Epochs between two splitting passes (the first runs after epoch ``every``).
    """

    def __init__(self, every=200):
        self.every = every

    def on_train_begin(self, net, X=None, y=None, **kwargs):
        self.partners_ = None
        ens = net.module_
        tables = ens.token_tables()
        if tables is None:
            return
        self.tables_ = tables
        self.mask_ = ens.rank_mask
        qf = ens.template.query_features
        with torch.no_grad():
            index = qf.token_index(torch.as_tensor(input_tokens(X)).to(qf.vocabulary.device))
        counts = input_counts(X)
        self.partners_ = minip_partners(
            index, qf.vocabulary, None if counts is None else counts.to(index.device))

    def on_epoch_end(self, net, **kwargs):
        if self.partners_ is None or not is_periodic_epoch(len(net.history), self.every):
            return
        active = getattr(net, "active_members_", None)
        E = net.module_.n_members
        live = list(range(E)) if active is None else torch.nonzero(active).flatten().tolist()
        _, _, moved = split_shared_features(
            *self.tables_, self.partners_, mask=self.mask_, members=live,
            optimizer=net.optimizer_)
        moved = torch.as_tensor(moved).reshape(-1)  # one member: its own tables, an int
        live = set(live)
        net.history.record("member_n_split",
                           [int(moved[i]) if i in live else None for i in range(E)])


class PairUnderflowStop(Callback):
    """End training on the first check epoch (``MinIPNet.is_check_epoch``) after a
    forward of the stack's pair form underflowed (:meth:`HeadEnsemble.pair_underflowed
    <minip_learn.nn.HeadEnsemble.pair_underflowed>`, with ``defer_underflow_check``):
    the trainer then refits on the positions."""

    def on_epoch_end(self, net, **kwargs):
        if net.is_check_epoch() and net.module_.pair_underflowed():
            raise KeyboardInterrupt


class TrimMemory(Callback):
    """On CPU, return freed heap memory to the OS every ``every`` epochs (glibc only),
    when the heap holds at least ``min_free`` bytes free.

    A trim hands the freed pages back, so the next steps fault fresh pages in: a small
    fit, whose heap never holds much free memory, is left alone.

    Parameters
    ----------
    every : int, default=TRIM_EVERY
    min_free : int, default=TRIM_MIN_FREE
        Bytes free in the heap from which a trim pays (where glibc cannot tell, every
        ``every`` epochs).
    """

    def __init__(self, every=TRIM_EVERY, min_free=TRIM_MIN_FREE):
        self.every = every
        self.min_free = min_free

    def on_train_begin(self, net, **kwargs):
        cpu = torch.device(net.device).type == "cpu"
        self.trim_ = malloc_trim() if cpu else None
        self.free_ = heap_free_bytes() if cpu else None

    def on_epoch_end(self, net, **kwargs):
        if self.trim_ is None or not is_periodic_epoch(len(net.history), self.every):
            return
        if self.free_ is None or self.free_() >= self.min_free:
            self.trim_()


class ProgressBar(Callback):
    """A :mod:`tqdm` progress bar over the epochs of ``max_epochs``."""

    def on_train_begin(self, net, **kwargs):
        from tqdm.auto import tqdm

        self.bar_ = tqdm(total=net.max_epochs, unit="epoch",
                         desc=f"{net.module_.n_members} member(s)")

    def on_epoch_end(self, net, **kwargs):
        self.bar_.update(1)

    def on_train_end(self, net, **kwargs):
        self.bar_.close()
