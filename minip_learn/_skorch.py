"""The skorch machinery behind the estimators: a whole-batch iterator, the net, callbacks.

skorch's default ``Dataset``/``DataLoader`` collates one sample at a time, which makes
a full-batch fit of these tiny heads many times slower than a plain torch loop. The
:class:`BatchIterator` here slices whole batches out of tensors that already sit on the
training device.
"""

import torch
from skorch import NeuralNet
from skorch.callbacks import Callback

from .metrics import TOLERANCE
from .nn.splitting import (
    minip_partners,
    split_shared_features,
    splittable_tables,
)

__all__ = ["BatchIterator", "MinIPNet", "SplitSharedFeatures", "StopWhenSolved"]


class BatchIterator:
    """Iterate over ``(X, y)`` tensors of a skorch ``Dataset`` in whole batches.

    Parameters
    ----------
    dataset : skorch.dataset.Dataset
        Holds tensors ``X`` and ``y`` (``y`` may be None at predict time).
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
        self.n = len(self.X)
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
            order = torch.randperm(self.n, generator=self.generator).to(self.X.device)
        else:
            order = None
        for start in range(0, self.n, self.batch_size):
            if order is None:
                sl = slice(start, start + self.batch_size)
            else:
                sl = order[start:start + self.batch_size]
            yield self.X[sl], (None if self.y is None else self.y[sl])


class MinIPNet(NeuralNet):
    """skorch ``NeuralNet`` used by the Min-IP estimators.

    Differences from the stock net: whole-batch iteration (:class:`BatchIterator`)
    with a seeded shuffling generator, parameters cast to ``dtype`` when the module is
    initialised, and a lean set of default callbacks (epoch timer and training loss).
    """

    def __init__(self, *args, seed=0, dtype=torch.float32, **kwargs):
        super().__init__(*args, **kwargs)
        self.seed = seed
        self.dtype = dtype

    @property
    def _default_callbacks(self):
        from skorch.callbacks import EpochTimer, PassthroughScoring

        return [
            ("epoch_timer", EpochTimer()),
            ("train_loss", PassthroughScoring(name="train_loss", on_train=True)),
        ]

    def initialize_module(self):
        super().initialize_module()
        self.module_.to(dtype=self.dtype)
        return self

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


class StopWhenSolved(Callback):
    """Stop training as soon as the training set is solved (with an optional margin).

    During an epoch it tracks the largest absolute error of the training batches
    (recorded in the history as ``train_max_error``, measured before each batch's
    update). When that falls below ``tolerance`` it checks the current parameters with
    one forward pass over the whole training set and stops if every position is within
    ``tolerance`` of its target.

    Parameters
    ----------
    tolerance : float, default=0.5
        Stop once ``|p - t| < tolerance`` everywhere. ``0.5`` is the solving criterion;
        a smaller value keeps training until a margin is reached, which generalises
        better to held-out sequences.
    """

    def __init__(self, tolerance=TOLERANCE):
        self.tolerance = tolerance

    def on_epoch_begin(self, net, **kwargs):
        self.max_error_ = 0.0

    def on_batch_end(self, net, batch=None, training=None, y_pred=None, **kwargs):
        if training:
            err = (y_pred.detach() - batch[1]).abs().max().item()
            self.max_error_ = max(self.max_error_, err if err == err else float("inf"))

    def on_epoch_end(self, net, dataset_train=None, **kwargs):
        net.history.record("train_max_error", self.max_error_)
        if self.max_error_ < self.tolerance:
            with torch.no_grad():
                net.module_.eval()
                err = (net.infer(dataset_train.X) - dataset_train.y).abs().max().item()
            if err < self.tolerance:
                raise KeyboardInterrupt


class SplitSharedFeatures(Callback):
    """Every ``every`` epochs, give queries that share a dominant feature their own.

    Runs :func:`~minip_learn.nn.split_shared_features` on a kernel head with separate
    ``table`` query and key maps (other modules are left alone) and zeroes the
    optimizer state of the overwritten entries. The number of queries moved is
    recorded in the history as ``n_split`` on the epochs where it runs.

    Parameters
    ----------
    every : int, default=200
        Epochs between two splitting passes (the first runs after epoch ``every``).
    """

    def __init__(self, every=200):
        self.every = every

    def on_train_begin(self, net, X=None, y=None, **kwargs):
        self.partners_ = None
        tables = splittable_tables(net.module_)
        if tables is not None:
            qf = net.module_.query_features
            with torch.no_grad():
                index = qf.token_index(torch.as_tensor(X).to(qf.vocabulary.device))
            self.partners_ = minip_partners(index, qf.vocabulary)

    def on_epoch_end(self, net, **kwargs):
        if self.partners_ is None:
            return
        epoch = len(net.history)
        if epoch % self.every:
            return
        log_q, log_k = splittable_tables(net.module_)
        _, _, moved = split_shared_features(
            log_q, log_k, self.partners_, optimizer=net.optimizer_)
        net.history.record("n_split", moved)
