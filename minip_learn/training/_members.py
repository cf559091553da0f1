"""One training pipeline: members initialised as single fits, trained as one stack.

:func:`train_members` initialises every member (and every restart) exactly as a single
fit initialises its head, stacks the heads into one
:class:`~minip_learn.nn.HeadEnsemble` (a leading member dimension, padded when the
ranks or state sizes differ; on the CPU within ``CPU_PADDING_TOKENS``, else in
several stacks), trains the stack with skorch's loop on the sum of the members' losses,
with per-member stopping and feature splitting as callbacks, and unpacks every member
into an ordinary fitted net around its own head. The members' gradients are
independent and Adam/AdamW/SGD act elementwise, so each member follows the trajectory
of its own separate fit (up to floating-point rounding).
"""

import functools
import inspect
import math
import threading

import numpy as np
import torch
from sklearn.utils import Bunch, check_random_state

from ..metrics import TOLERANCE
from ..nn import HeadEnsemble
from ._callbacks import (
    MemberLog,
    PairUnderflowStop,
    ProgressBar,
    SplitSharedFeatures,
    StopWhenSolved,
    TrimMemory,
    absolute_error,
    member_max_errors,
    member_snapshot,
)
from ._net import (
    LastPositionLoss,
    MemberLoss,
    MinIPHistory,
    MinIPNet,
    compact_input,
    input_counts,
    input_tokens,
    last_position_error,
    module_forward,
)

__all__ = ["build_net", "train_members"]

#: Initialisation draws from torch's global generator: it is seeded inside
#: ``fork_rng`` (the caller's RNG state is left alone) and under this lock, so that
#: fits running in threads (joblib's threading backend, dask threads) cannot
#: interleave their draws. Training itself uses only the nets' own seeded generators.
_INIT_LOCK = threading.Lock()


def build_net(module, *, criterion=torch.nn.MSELoss, optimizer=torch.optim.Adam, lr=0.01,
              weight_decay=0.0, max_epochs=100, batch_size=None, callbacks=None,
              dtype=torch.float32, device="cpu", verbose=0, seed=0, init_seed=None,
              query="all", check_every=1, **module_params):
    """An initialised :class:`MinIPNet` around one head (what an estimator's ``net_`` is).

    Parameters
    ----------
    module : type or torch.nn.Module
        Class of the head (built from ``module_params``) or a head to use as is.
    criterion, optimizer, lr, weight_decay, max_epochs, batch_size, callbacks, dtype, \
device, verbose, check_every
        As in :func:`train_members`.
    seed : int, default=0
        Seed of the net's mini-batch shuffling.
    init_seed : int or None, default=None
        When given, the head is built under ``torch.manual_seed(init_seed)``, inside
        ``torch.random.fork_rng`` (the caller's random state is left alone).
    query : {"all", "last"}, default="all"
        The outputs the net's module computes (:class:`MinIPNet`): ``"last"`` for
        final-query targets.
    **module_params
        Keyword arguments of ``module``.

    Returns
    -------
    net : MinIPNet

    Examples
    --------
    >>> from minip_learn.nn import KernelAttentionHead
    >>> from minip_learn.training import MinIPNet, build_net
    >>> net = build_net(KernelAttentionHead, n_bits=4, rank=2, init_seed=0)
    >>> isinstance(net, MinIPNet), type(net.module_).__name__
    (True, 'KernelAttentionHead')
    """
    net = MinIPNet(
        module=module, criterion=criterion, optimizer=optimizer,
        optimizer__weight_decay=weight_decay, **_step_params(optimizer, device),
        lr=lr, max_epochs=max_epochs,
        batch_size=-1 if batch_size is None else batch_size, train_split=None,
        callbacks=callbacks, verbose=verbose, device=device, seed=seed, dtype=dtype,
        query=query, check_every=check_every,
        **{f"module__{k}": v for k, v in module_params.items()})
    if init_seed is None:
        return net.initialize()
    cuda = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with _INIT_LOCK, torch.random.fork_rng(devices=cuda):
        if cuda:
            torch.manual_seed(init_seed)
        else:  # the same CPU draws, without torch.manual_seed's lazy CUDA bookkeeping
            torch.default_generator.manual_seed(init_seed)
        net.initialize()
    return net


def _train_stack(nets, X, y, *, criterion, error, stop_tolerance, split_every, callbacks,
                 progress, seed):
    """Train the heads of ``nets`` as one member stack and load the result into them.

    With ``check_every > 1`` the stack reads its pair form's underflow check only at the
    checks (:attr:`HeadEnsemble.defer_underflow_check
    <minip_learn.nn.HeadEnsemble.defer_underflow_check>`); where it was set, the stack is
    refitted from the members' initial parameters on the positions.

    Returns the path of the stack and every member's training max error.
    """
    first = nets[0]
    defer = first.check_every > 1
    for pair_path in (True, False):
        ens = HeadEnsemble([net.module_ for net in nets])
        ens.pair_path, ens.defer_underflow_check = pair_path, defer
        trainer, stopper = _stack_trainer(
            ens, first, error=error, stop_tolerance=stop_tolerance, criterion=criterion,
            split_every=split_every, callbacks=callbacks, progress=progress, seed=seed,
            guard=defer and pair_path)
        trainer.partial_fit(X, y)
        if not (defer and pair_path and ens.pair_underflowed()):
            break
    E = ens.n_members
    rows = list(trainer.history)
    n_epochs = (np.full(E, len(rows), dtype=int) if stopper is None else stopper.n_epochs_)
    snapshots = {} if stopper is None else stopper.snapshots_
    histories = _member_histories(rows, E, n_epochs)
    for i, net in enumerate(nets):
        snap = snapshots.get(i) or member_snapshot(ens, trainer.optimizer_, i)
        _load_member(net, snap)
        net.history = MinIPHistory(histories[i])
    return ens.path, _final_errors(ens, nets, X, y, error, stop_tolerance)


def _stack_trainer(ens, first, *, criterion, error, stop_tolerance, split_every, callbacks,
                   progress, seed, guard):
    """The initialised :class:`MinIPNet` that trains the stack ``ens`` with the settings
    of the member net ``first``, and its :class:`StopWhenSolved` (None without
    ``stop_tolerance``)."""
    extra = [("member_log", MemberLog())] if ens.n_members > 1 else []
    stopper = None
    if stop_tolerance is not None:
        stopper = StopWhenSolved(stop_tolerance, error)
        extra.append(("stop_when_solved", stopper))
    if split_every is not None:
        # after the stop check: a solved epoch ends training unsplit
        extra.append(("split_shared_features", SplitSharedFeatures(split_every)))
    if guard:
        extra.append(("pair_underflow", PairUnderflowStop()))
    extra.append(("trim_memory", TrimMemory()))
    if progress:
        extra.append(("progress", ProgressBar()))
    optimizer_params = {k: v for k, v in first.get_params().items()
                        if k.startswith("optimizer__")}
    if ens.n_members > 1 and not {"optimizer__foreach", "optimizer__fused"} & set(
            optimizer_params) and _takes(first.optimizer, "foreach"):
        # torch's multi-tensor loop (an optimizer without a fused step): on CPU the same
        # arithmetic as its default per-tensor loop, with fewer calls per step for the
        # stack's parameters
        optimizer_params["optimizer__foreach"] = True
    trainer = MinIPNet(
        module=ens,
        criterion=MemberLoss(criterion()),
        optimizer=first.optimizer,
        lr=first.lr,
        max_epochs=first.max_epochs,
        batch_size=first.batch_size,
        train_split=None,
        callbacks=list(callbacks or []) + extra,
        verbose=first.verbose,
        device=first.device,
        seed=seed,
        dtype=first.dtype,
        query=first.query,
        check_every=first.check_every,
        **optimizer_params,
    )
    return trainer.initialize(), stopper


def _takes(optimizer, argument):
    """Whether the optimizer class (or factory) has the keyword ``argument``."""
    try:
        return argument in inspect.signature(optimizer).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


#: the devices whose torch optimizers (Adam, AdamW, SGD, Adagrad) have a fused step
FUSED_DEVICES = ("cpu", "cuda")


def _step_params(optimizer, device):
    """``{"optimizer__fused": True}`` where the optimizer has a fused step on
    ``device``, else nothing.

    A fused step updates every parameter in one call with no host sync (its step
    counts stay on the device); torch's default loop makes several calls per parameter
    and reads every step count on the host. An element's update does not depend on
    the tensor it lies in, so a member of a stack and its separate fit stay on one
    trajectory (bit for bit for Adam and AdamW; SGD's momentum step may round one ulp
    apart in the vector and scalar parts of its loop).
    """
    if torch.device(device).type in FUSED_DEVICES and _takes(optimizer, "fused"):
        return {"optimizer__fused": True}
    return {}


def _final_errors(ens, nets, X, y, error, stop_tolerance):
    """Every member's training max error (inf when not finite), from one forward of the
    trained stack (whose stopped members hold their stopping parameters).

    The stack computes each member's outputs up to floating-point rounding; a member
    whose error lies within that rounding of a threshold that decides something (its
    ``stop_tolerance``, the solving tolerance) is measured again through its own head,
    which is what ``predict`` runs.
    """
    counts = input_counts(X)
    with torch.no_grad():
        ens.eval()
        errors = member_max_errors(error, module_forward(ens, X, last=nets[0].query == "last"),
                                   y, counts).tolist()
        margin = 64 * torch.finfo(input_tokens(X).dtype).eps * max(1.0, float(y.abs().max()))
        thresholds = [t for t in (stop_tolerance, TOLERANCE) if t is not None]
        for i, net in enumerate(nets):
            if any(abs(errors[i] - t) <= margin for t in thresholds):
                net.module_.eval()
                errors[i] = member_max_errors(error, net.infer(X).unsqueeze(0), y,
                                              counts).item()
    return [e if math.isfinite(e) else math.inf for e in errors]


def _load_member(net, snap):
    """Parameters and optimizer state of a member snapshot into a plain net."""
    names = {id(p): n for n, p in net.module_.named_parameters()}
    with torch.no_grad():
        for n, p in net.module_.named_parameters():
            p.copy_(snap[n][0])
    for group in net.optimizer_.param_groups:
        for p in group["params"]:
            n = names.get(id(p))
            if n is not None and snap[n][1]:
                net.optimizer_.state[p] = dict(snap[n][1])


_MEMBER_KEYS = ("member_max_error", "member_n_split")


def _member_histories(rows, E, n_epochs):
    """The history of every member out of the stack's: its own loss, max error and
    splits; the epoch time shared out equally over the members.

    The stack's rows are split once into what every member shares and the per-member
    lists (``member_loss`` of every batch, ``member_max_error``, ``member_n_split``).
    """
    shared = []
    for row in rows:
        row = dict(row)
        lists = {k: row.pop(k) for k in _MEMBER_KEYS if k in row}
        batches = [dict(b) for b in row.get("batches", [])]
        member_loss = [b.pop("member_loss", None) for b in batches]
        row["batches"] = batches
        if E > 1:
            row["dur"] = row["dur"] / E
        shared.append((row, batches, member_loss, lists))
    out = []
    for i in range(E):
        member, best = [], math.inf
        for row, batches, member_loss, lists in shared[:int(n_epochs[i])]:
            row = dict(row)
            if E > 1:
                row["batches"] = [dict(b, train_loss=m[i]) for b, m in zip(batches, member_loss)]
                if len(batches) == 1:
                    loss = float(member_loss[0][i])
                else:
                    loss = float(np.average([m[i] for m in member_loss],
                                            weights=[b["train_batch_size"] for b in batches]))
                row["train_loss"] = loss
                row["train_loss_best"] = bool(loss < best)
                best = min(best, loss)
            if "member_max_error" in lists:
                row["train_max_error"] = lists["member_max_error"][i]
            splits = lists.get("member_n_split")
            if splits is not None and splits[i] is not None:
                row["n_split"] = splits[i]
            member.append(row)
        out.append(member)
    return out


#: On the CPU, the most padding a stack of members of several sizes may add, in tokens
#: of the training input times state dimensions: about what a stack step's overhead
#: costs in arithmetic (docs/performance.rst, group (i)). Beyond it the members train
#: as several stacks; on a GPU as one.
CPU_PADDING_TOKENS = 2**16


def _stack_groups(keys, nets, X):
    """The members trained as one stack: all of them, or several where their shapes
    cannot share one or, on the CPU, where padding them to one would cost more than
    ``CPU_PADDING_TOKENS`` (:meth:`HeadEnsemble.stack_groups
    <minip_learn.nn.HeadEnsemble.stack_groups>`)."""
    modules = [nets[key].module_ for key in keys]
    budget = None
    if torch.device(nets[keys[0]].device).type == "cpu":
        tokens = input_tokens(X)
        budget = CPU_PADDING_TOKENS // max(1, math.prod(tokens.shape[:-1]))
    groups = HeadEnsemble.stack_groups(modules, max_padding=budget)
    return [[keys[j] for j in group] for group in groups]


def _last_position(criterion, error, counts, y, n):
    """The loss class and error of final-query targets (see :class:`LastPositionLoss`)."""
    if counts is not None:
        raise ValueError(
            "final-query targets need materialised sequences: their order decides the "
            "last position, which sequences in multiset form (counts) do not have.")
    if tuple(y.shape) != (n,):
        raise ValueError(
            f"query='last' takes one target per sequence, y of shape ({n},); got "
            f"{tuple(y.shape)}.")
    return (functools.partial(LastPositionLoss, criterion),
            functools.partial(last_position_error, error=error))


def train_members(module, members, X, y, *, counts=None, query="all",
                  criterion=torch.nn.MSELoss, error=absolute_error, n_init=1,
                  batched_restarts=True,
                  optimizer=torch.optim.Adam, lr=0.01, weight_decay=0.0, max_epochs=100,
                  batch_size=None, stop_tolerance=None, split_every=None, check_every=1,
                  callbacks=None, dtype=torch.float32, device="cpu", verbose=0,
                  progress=False):
    """Initialise, train, stop, split and restart heads as one member stack.

    Every member ``(module_params, random_state)`` draws ``n_init`` seeds from
    ``check_random_state(random_state)``; for each seed a :class:`MinIPNet` around
    ``module(**module_params)`` is initialised under ``torch.manual_seed(seed)`` (what
    a single fit does). The heads are stacked into a
    :class:`~minip_learn.nn.HeadEnsemble` (several where their shapes cannot share one,
    or where padding them to one would exceed ``CPU_PADDING_TOKENS`` on the CPU)
    and trained by skorch's loop on the sum of
    their losses (:class:`MemberLoss`), with the callbacks :class:`StopWhenSolved`
    (per member), :class:`SplitSharedFeatures` and :class:`TrimMemory`. Each trained
    member is loaded back into its own net (head, optimizer state cropped to its
    shapes, a skorch history of its own epochs), and of every member's restarts the
    one with the smallest training max error is kept, scanning the restarts in order
    and stopping at the first that meets ``stop_tolerance``.

    Parameters
    ----------
    module : type
        Class of the heads (e.g. :class:`~minip_learn.nn.KernelAttentionHead`).
    members : list of (dict, int or RandomState or None)
        ``(module_params, random_state)`` of every member; members may differ only in
        what :class:`~minip_learn.nn.HeadEnsemble` can stack (e.g. the rank).
    X : Tensor of shape (n_samples, seq_len, n_bits)
        Training sequences, on ``device`` in ``dtype``; with ``counts``, the tokens of
        the slots of sequences in multiset form, shape (n_samples, k, n_bits).
    y : Tensor
        Targets, on ``device`` in ``dtype`` (one per slot with ``counts``; the finite
        values at padding slots are ignored).
    counts : Tensor of shape (n_samples, k), default=None
        Multiplicity of every slot of sequences in multiset form (0 for padding), on
        ``device`` in ``dtype``. The input is then the dict ``{"x": X, "counts":
        counts}``, which skorch hands to the modules as ``forward(x, counts=counts)``;
        the loss weights every slot by its multiplicity (so it is the loss of the
        materialised sequences) and the max errors leave padding out. None: every
        position counts once.
    query : {"all", "last"}, default="all"
        ``"all"``: ``y`` holds a target for every output position (shape ``(n_samples,
        seq_len)``). ``"last"``: final-query targets, one per sequence (shape
        ``(n_samples,)``), for the output at its last position only: the loss
        (:class:`LastPositionLoss`) and the errors read that position, the others
        have no target, and the modules compute that position alone
        (``forward(x, last=True)``: one query per sequence, no ``N x N`` tensor).
        Not with ``counts``.
    criterion : type, default=torch.nn.MSELoss
        Loss class of one member.
    error : callable, default=absolute_error
        ``error(y_pred, y)``: error of every output position (members leading); a
        member is solved when all are below ``stop_tolerance``.
    n_init : int, default=1
        Initialisations per member.
    batched_restarts : bool, default=True
        Train every member's every initialisation at once. False: one stack per
        initialisation, in order, until one meets ``stop_tolerance`` (the later
        initialisations are then not trained).
    optimizer : type, default=torch.optim.Adam
    lr : float, default=0.01
    weight_decay : float, default=0.0
    max_epochs : int, default=100
    batch_size : int or None, default=None
        Mini-batch size (None: full batch). Stacks of several members train full-batch.
    stop_tolerance : float or None, default=None
        Stop a member once every position's error is below it; None runs
        ``max_epochs``.
    split_every : int or None, default=None
        Epochs between two passes of :class:`SplitSharedFeatures` (None: never).
    check_every : int, default=1
        Epochs between two reads of the training figures on the host
        (:class:`MinIPNet`): the losses and max errors stay on the device in between,
        and members stop (``stop_tolerance``) only on those epochs, so a member trains
        up to ``check_every - 1`` epochs past the one that first solved. Every member
        of a stack and its separate fit check on the same epochs.
    callbacks : list of skorch callbacks, default=None
        Extra callbacks; only for stacks of one member.
    dtype : torch.dtype, default=torch.float32
    device : str, default="cpu"
    verbose : int, default=0
    progress : bool, default=False
        Show a progress bar over epochs.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``members``: one Bunch per member with ``net`` (the kept fitted
        :class:`MinIPNet`, its module a plain head), ``train_max_error`` (its training
        max error, inf when not finite) and ``init_errors`` (the max error of every
        initialisation tried); ``n_members``: heads trained (members x restarts
        tried); ``path``: the forward path the stack reports
        (``HeadEnsemble.path``), None where it reports none.

    Raises
    ------
    ValueError
        For ``callbacks`` or mini-batches with more than one member in a stack, or
        ``query="last"`` with ``counts`` or a ``y`` of another shape than
        ``(n_samples,)``.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.nn import KernelAttentionHead
    >>> X, y = (torch.as_tensor(a, dtype=torch.float32)
    ...         for a in make_minip(32, seq_len=2, n_bits=6, random_state=0))
    >>> res = train_members(KernelAttentionHead, [(dict(n_bits=6, rank=r), 0)
    ...                                           for r in (1, 3)],
    ...                     X, y, lr=0.03, max_epochs=50)
    >>> res.n_members, [type(m.net.module_).__name__ for m in res.members]
    (2, ['KernelAttentionHead', 'KernelAttentionHead'])
    >>> [m.net.module_.rank for m in res.members], [len(m.net.history) for m in res.members]
    ([1, 3], [50, 50])
    """
    n = int(X.shape[0])
    if query == "last":
        criterion, error = _last_position(criterion, error, counts, y, n)
    elif query != "all":
        raise ValueError(f"query must be 'all' or 'last'; got {query!r}.")
    if counts is not None:
        X = compact_input(X, counts)
    seeds = []
    for _, random_state in members:
        rng = check_random_state(random_state)
        seeds.append([int(rng.randint(np.iinfo(np.int32).max)) for _ in range(n_init)])
    if len(members) * (n_init if batched_restarts else 1) > 1:
        if callbacks is not None:
            raise ValueError(
                "a stack of several members does not run skorch callbacks; set "
                "callbacks=None.")
        if batch_size is not None and batch_size < n:
            raise ValueError(
                f"a stack of several members trains full-batch only: batch_size="
                f"{batch_size} is smaller than the {n} training sequences; use "
                "batch_size=None.")
    net_params = dict(
        criterion=criterion, optimizer=optimizer, weight_decay=weight_decay, lr=lr,
        max_epochs=max_epochs, batch_size=batch_size, callbacks=callbacks, dtype=dtype,
        device=device, verbose=verbose, query=query, check_every=check_every)
    fit = dict(criterion=criterion, error=error, stop_tolerance=stop_tolerance,
               split_every=split_every, callbacks=callbacks, progress=progress)

    def make(i, k):
        seed = seeds[i][k]
        return build_net(module, seed=seed, init_seed=seed, **net_params, **members[i][0])

    out, path, n_trained, errors = [], None, 0, {}
    if batched_restarts:
        keys = [(i, k) for i in range(len(members)) for k in range(n_init)]
        nets = {key: make(*key) for key in keys}
        for group in _stack_groups(keys, nets, X):
            path, errs = _train_stack([nets[key] for key in group], X, y,
                                      seed=seeds[group[0][0]][group[0][1]], **fit)
            errors.update(zip(group, errs))
        n_trained = len(keys)
    for i in range(len(members)):
        best, err, init_errors = None, math.inf, []
        for k in range(n_init):
            if not batched_restarts:
                net = make(i, k)
                path, (errors[i, k],) = _train_stack([net], X, y, seed=seeds[i][k], **fit)
                n_trained += 1
            else:
                net = nets[(i, k)]
            e = errors[i, k]
            init_errors.append(e)
            if best is None or e < err:
                best, err = net, e
            if stop_tolerance is not None and err < stop_tolerance:
                break  # this initialisation reached the stopping margin: no restart
        out.append(Bunch(net=best, train_max_error=err, init_errors=init_errors))
    return Bunch(members=out, n_members=n_trained, path=path)
