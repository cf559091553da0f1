"""Batched ensembles: many fits of one estimator (seeds x ranks) trained as one model.

:func:`fit_ensemble` fits ``clone(estimator).set_params(rank=r, random_state=s)`` for
every rank ``r`` and seed ``s`` at once: each member's head is initialised exactly as
``fit`` initialises it, the heads are stacked into one
:class:`~minip_learn.nn.HeadEnsemble` (zero-padded and rank-masked to the largest rank),
and one optimizer steps all of them on the sum of the per-member losses. The members'
gradients are independent and Adam/AdamW/SGD act elementwise, so each member follows
the trajectory of its own separate fit (up to floating-point rounding); a member that
meets ``stop_tolerance`` is frozen (its parameters and optimizer state are those of the
epoch it stopped at), and ``n_init`` restarts are run as further members, the kept one
chosen as ``fit`` chooses it. Every member is then converted back into an ordinary
fitted estimator.
"""

import copy
import math
import numbers
import time

import numpy as np
import torch
from sklearn.base import clone
from sklearn.utils import Bunch, check_random_state

from .._validation import check_int, check_targets
from ..estimators import _INIT_LOCK, _AttentionRegressor
from ..nn import HeadEnsemble
from ..nn.splitting import (
    minip_partners,
    split_shared_features,
    splittable_tables,
)

__all__ = ["fit_ensemble"]


def _malloc_trim():
    """A function returning freed heap memory to the OS (glibc's ``malloc_trim``), or None.

    The batched forward/backward allocates and frees large blocks of varying size every
    epoch; glibc keeps the freed ones in its heap, and over thousands of epochs the
    resident size of a rank-128 ensemble grew to several GB (15 GB peak in the full
    witness run) although the live tensors need a few hundred MB.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


#: epochs between two ``malloc_trim`` calls on CPU
TRIM_EVERY = 50


def _member_losses(criterion, y_pred, y):
    """Training loss of every member, shape ``(E,)``.

    ``criterion`` is the estimator's own (skorch's ``criterion_``, mean squared error),
    applied to each member's predictions ``y_pred[e]`` against ``y``. The ensemble
    minimises the *sum* of these, so each member receives the gradient of its own
    loss. To change the training loss of the ensembles, change it here (and in the
    estimators' ``_build_net``).
    """
    return torch.func.vmap(criterion, in_dims=(0, None))(y_pred, y)


def _max_errors(y_pred, y):
    """Largest absolute error of every member, shape ``(E,)`` (NaN stays NaN)."""
    return (y_pred - y).abs().flatten(1).amax(1)


def _check_members(estimator, ranks, seeds):
    if not isinstance(estimator, _AttentionRegressor):
        raise ValueError(
            "fit_ensemble needs a KernelAttentionRegressor or SoftmaxAttentionRegressor; "
            f"got {type(estimator).__name__}.")
    has_rank = "rank" in estimator.get_params(deep=False)
    if ranks is None:
        ranks = [estimator.rank] if has_rank else [None]
    else:
        if not has_rank:
            raise ValueError(f"{type(estimator).__name__} has no rank; give ranks=None.")
        ranks = [ranks] if isinstance(ranks, numbers.Integral) else list(ranks)
        if not ranks:
            raise ValueError("ranks must be a non-empty list of ints or None.")
    if has_rank:
        ranks = [check_int(r, "rank", min_value=1) for r in ranks]
    seeds = [seeds] if seeds is None or isinstance(seeds, numbers.Integral) else list(seeds)
    if not seeds:
        raise ValueError("seeds must be a non-empty list of ints.")
    for s in seeds:
        if s is not None and (not isinstance(s, numbers.Integral) or isinstance(s, bool)):
            raise ValueError(f"seeds must be ints (or None); got {s!r}.")
    if len(set(ranks)) != len(ranks) or len(set(s for s in seeds if s is not None)) != len(
            [s for s in seeds if s is not None]):
        raise ValueError("ranks and seeds must not contain duplicates.")
    members = []
    for r in ranks:
        for s in seeds:
            p = {} if r is None else {"rank": r}
            p["random_state"] = None if s is None else int(s)
            members.append(p)
    return members


def _fit_members(estimator, X, y, members, *, progress=False):
    """Fit ``clone(estimator).set_params(**m)`` for every ``m`` in ``members`` as one
    batched model; ``members`` may differ only in ``rank`` and ``random_state``."""
    t_start = time.perf_counter()
    if any(set(m) - {"rank", "random_state"} for m in members):
        raise ValueError("ensemble members may differ only in rank and random_state.")
    ests = [clone(estimator).set_params(**m) for m in members]
    beyond = getattr(ests[0], "_beyond_params", None)
    if beyond is not None and beyond() is not None:
        # issue 8 variants (n_heads, n_layers, readout="mlp", classifiers) have other
        # modules, losses and errors than the single heads batched here
        raise ValueError(
            "fit_ensemble batches single kernel heads with an affine readout; "
            f"{type(ests[0]).__name__} with n_heads, n_layers, readout='mlp' or class "
            "logits is fitted one by one (ensemble=False).")
    first = ests[0]
    # -- the validation of fit -------------------------------------------------------
    if y is None:
        raise ValueError(
            f"{type(first).__name__} requires y to be passed, but the target y is None.")
    X3, was_2d = first._validate_X(X, reset=True)
    y2 = check_targets(y, X3.shape[0], X3.shape[1], was_2d=was_2d)
    train = first._validate_training_params()
    # members differ only in rank and seed: validate (and e.g. collect the vocabulary
    # of the table map) once per rank, not once per member
    by_rank, module_params = {}, []
    for m, e in zip(members, ests):
        if m.get("rank") not in by_rank:
            by_rank[m.get("rank")] = e._module_params(X3)
        module_params.append(copy.deepcopy(by_rank[m.get("rank")]))
    if first.callbacks is not None:
        raise ValueError("fit_ensemble does not run skorch callbacks; set callbacks=None.")
    if train["batch_size"] is not None and train["batch_size"] < X3.shape[0]:
        raise ValueError(
            f"fit_ensemble trains full-batch only: batch_size={train['batch_size']} is "
            f"smaller than the {X3.shape[0]} training sequences; use batch_size=None.")
    n_init = check_int(first.n_init, "n_init", min_value=1)
    dtype, device, tol = train["dtype"], train["device"], train["stop_tolerance"]
    Xt = first._to_tensor(X3, dtype, device)
    yt = first._to_tensor(y2, dtype, device)
    cuda = [torch.device(device)] if device.startswith("cuda") else []

    # -- every member's every initialisation, seeded as fit seeds it ------------------
    nets, owner = [], []
    for i, est in enumerate(ests):
        rng = check_random_state(est.random_state)
        for _ in range(n_init):
            seed = int(rng.randint(np.iinfo(np.int32).max))
            net = est._build_net(train, module_params[i], seed)
            with _INIT_LOCK, torch.random.fork_rng(devices=cuda):
                torch.manual_seed(seed)
                net.initialize()
            nets.append(net)
            owner.append(i)
    E = len(nets)
    ens = HeadEnsemble([net.module_ for net in nets])
    criterion = nets[0].criterion_
    params = list(ens.params)
    opt = train["optimizer"](params, lr=train["lr"], weight_decay=train["weight_decay"])

    # -- feature splitting of table heads (the estimators' SplitSharedFeatures) --------
    split_every, tables = train.get("split_every"), None
    if split_every is not None and splittable_tables(ens.template) is not None:
        pos = {n: j for j, n in enumerate(ens.names)}
        tables = (params[pos["query_features.log_table"]], params[pos["key_features.log_table"]])
        qf = ens.template.query_features
        with torch.no_grad():
            partners = minip_partners(qf.token_index(Xt), qf.vocabulary)
        split_mask = ens.stacked_buffer("feature_mask")
    n_split = {}
    trim = _malloc_trim() if not cuda else None

    # -- training: full-batch steps, per-member stopping -------------------------------
    active = torch.ones(E, dtype=torch.bool)
    n_epochs = np.zeros(E, dtype=int)
    frozen = [p.detach().clone() for p in params]
    snapshots = {}
    losses_log, errors_log, durations = [], [], []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=train["max_epochs"], unit="epoch", desc=f"ensemble of {E}")

    def freeze(stop):
        idx = torch.nonzero(stop).flatten().tolist()
        st = stop.to(device)
        for j, p in enumerate(params):
            frozen[j] = torch.where(st.view(-1, *[1] * (p.ndim - 1)), p.detach(), frozen[j])
        for i in idx:
            snapshots[i] = _member_snapshot(ens, opt, i)

    try:
        for _ in range(train["max_epochs"]):
            t0 = time.perf_counter()
            ens.train()
            opt.zero_grad(set_to_none=True)
            pred = ens(Xt)
            losses = _member_losses(criterion, pred, yt)
            losses.sum().backward()
            opt.step()
            if not bool(active.all()):
                with torch.no_grad():
                    st = (~active).to(device)
                    for j, p in enumerate(params):
                        p.copy_(torch.where(st.view(-1, *[1] * (p.ndim - 1)), frozen[j], p))
            err = _max_errors(pred.detach(), yt)
            losses_log.append(losses.detach())
            errors_log.append(err)
            n_epochs[active.numpy()] += 1
            if tol is not None:
                cand = active & (err < tol).cpu()
                if bool(cand.any()):
                    with torch.no_grad():
                        ens.eval()
                        err2 = _max_errors(ens(Xt), yt).cpu()
                    stop = cand & (err2 < tol)
                    if bool(stop.any()):
                        freeze(stop)
                        active &= ~stop
            epoch = len(losses_log)
            if tables is not None and epoch % split_every == 0 and bool(active.any()):
                live = torch.nonzero(active).flatten().tolist()
                _, _, moved = split_shared_features(
                    *tables, partners, mask=split_mask, members=live, optimizer=opt)
                for i in live:
                    n_split.setdefault(i, {})[epoch] = int(moved[i])
            if trim is not None and epoch % TRIM_EVERY == 0:
                trim()
            durations.append((time.perf_counter() - t0) / E)
            if bar is not None:
                bar.update(1)
            if not bool(active.any()):
                break
    finally:
        if bar is not None:
            bar.close()

    # -- back to ordinary fitted estimators --------------------------------------------
    losses_log = torch.stack(losses_log).cpu().to(torch.float64).numpy()
    errors_log = torch.stack(errors_log).cpu().to(torch.float64).numpy()
    errors_log = np.where(np.isnan(errors_log), np.inf, errors_log)
    for j in range(E):
        snap = snapshots.get(j) or _member_snapshot(ens, opt, j)
        _load_member(nets[j], snap, train["optimizer"])
        _fill_history(nets[j], n_epochs[j], losses_log[:, j], errors_log[:, j], durations,
                      X3.shape[0], tol is not None, n_split.get(j, {}))
    out = []
    for i, est in enumerate(ests):
        best, err, init_errors = None, math.inf, []
        for j in (j for j in range(E) if owner[j] == i):
            net = nets[j]
            with torch.no_grad():
                net.module_.eval()
                e = (net.infer(Xt) - yt).abs().max().item()
            e = e if math.isfinite(e) else math.inf
            init_errors.append(e)
            if best is None or e < err:
                best, err = net, e
            if tol is not None and err < tol:
                break
        est._set_fitted_state(best, X3, module_params[i], init_errors, err)
        out.append(est)
    fit_time = time.perf_counter() - t_start
    return Bunch(
        estimators=out,
        params=[dict(m) for m in members],
        n_epochs=np.array([e.n_epochs_ for e in out]),
        solved=np.array([bool(e.solved_) for e in out]),
        train_max_error=np.array([e.train_max_error_ for e in out]),
        fit_time=fit_time,
        n_members=E,
    )


def _member_snapshot(ens, opt, i):
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


def _load_member(net, snap, optimizer_cls):
    names = {id(p): n for n, p in net.module_.named_parameters()}
    with torch.no_grad():
        for n, p in net.module_.named_parameters():
            p.copy_(snap[n][0])
    for group in net.optimizer_.param_groups:
        for p in group["params"]:
            n = names.get(id(p))
            if n is not None and snap[n][1]:
                net.optimizer_.state[p] = dict(snap[n][1])


def _fill_history(net, n_epochs, losses, errors, durations, n_samples, stop, n_split):
    """Record the epochs of one member in its skorch history, as a separate fit would."""
    h = net.history  # a list of per-epoch dicts; appended directly (fast)
    best = math.inf
    losses, errors = losses[:n_epochs].tolist(), errors[:n_epochs].tolist()
    for t in range(int(n_epochs)):
        loss = losses[t]
        row = {
            "batches": [{"train_loss": loss, "train_batch_size": n_samples}],
            "epoch": t + 1,
            "train_batch_count": 1,
            "dur": float(durations[t]),
            "train_loss": loss,
            "train_loss_best": bool(loss <= best),
        }
        best = min(best, loss)
        if stop:
            row["train_max_error"] = errors[t]
        if t + 1 in n_split:
            row["n_split"] = n_split[t + 1]
        h.append(row)


def fit_ensemble(estimator, X, y, *, ranks=None, seeds=(0, 1, 2), params=None,
                 progress=False):
    """Fit one estimator for many seeds (and ranks) at once, as one batched model.

    Every member ``clone(estimator).set_params(rank=r, random_state=s)`` is initialised
    exactly as its own ``fit`` would initialise it; the members are trained together,
    full-batch, by one optimizer on the sum of their losses (independent gradients,
    elementwise optimizer state), each with its own stopping (``stop_tolerance``) and
    restarts (``n_init``). Heads of smaller rank are zero-padded to the largest rank and
    rank-masked (:class:`~minip_learn.nn.HeadEnsemble`), which leaves their arithmetic
    that of a rank-``r`` head. The result equals the separate fits up to floating-point
    rounding (same initialisation, same steps, same stopping), at a fraction of their
    cost for small heads.

    Parameters
    ----------
    estimator : KernelAttentionRegressor or SoftmaxAttentionRegressor
        Unfitted template; its hyperparameters are shared by every member. It must
        train full-batch (``batch_size=None``) without extra ``callbacks``.
    X : array-like of shape (n_samples, seq_len, n_bits) or (n_samples, n_bits)
        Training sequences.
    y : array-like of shape (n_samples, seq_len) or (n_samples,)
        Per-token targets.
    ranks : int or list of int, default=None
        Ranks of the members (kernel heads only); None uses ``estimator.rank``.
    seeds : int or list of int, default=(0, 1, 2)
        ``random_state`` of the members; one member per rank and seed.
    params : list of dict, default=None
        The members one by one instead of the product of ``ranks`` and ``seeds``: dicts
        with keys among ``"rank"`` and ``"random_state"`` (``ranks`` and ``seeds`` are
        then ignored).
    progress : bool, default=False
        Show a :mod:`tqdm` progress bar over epochs.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``estimators``: list of fitted estimators, one per (rank, seed), ranks outer
        and seeds inner; ``params``: the ``{"rank": r, "random_state": s}`` of each;
        ``n_epochs``, ``solved``, ``train_max_error``: arrays of the members'
        ``n_epochs_``, ``solved_``, ``train_max_error_``; ``fit_time``: wall seconds
        of the whole ensemble; ``n_members``: heads trained (members x ``n_init``).

    Raises
    ------
    ValueError
        For an estimator that is not a Min-IP regressor, ``ranks`` for a head without
        rank, empty or duplicate ranks or seeds, mini-batches (``batch_size`` smaller
        than the set), ``callbacks``, or any input ``fit`` rejects.

    See Also
    --------
    rank_sweep : With ``ensemble=True``, runs its fits as ensembles.

    Notes
    -----
    Single kernel heads with linear feature encoders (``elu+1``, ``relu``,
    ``softplus``, ``squared_relu``, ``exp``) or the ``table`` map, on short sequences,
    run a fused forward (:class:`~minip_learn.nn.HeadEnsemble`); other heads are
    vectorised with :func:`torch.func.vmap`. The saving is the per-fit overhead
    (Python, skorch, small-matrix products), not the arithmetic, which every member
    still does: it is largest for small heads and data and on GPUs. When the tokens
    repeat a lot (few distinct tokens), the fused forward works on pairs of distinct
    tokens instead of positions, which saves most of the arithmetic too. On one CPU
    thread, 20 seeds of ``KernelAttentionRegressor(rank=16)`` (200 epochs) on 1,000
    random length-3 sequences cost 2 to 3 times less per model than 20 separate fits,
    and 15 to 20 times less on the m = 24 witness suite (4,186 sequences of 46
    distinct tokens; ``feature_map="table"`` or the default ``elu+1``).

    Examples
    --------
    >>> from minip_learn import KernelAttentionRegressor
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.model_selection import fit_ensemble
    >>> X, y = make_minip(32, seq_len=2, n_bits=6, random_state=0)
    >>> est = KernelAttentionRegressor(max_epochs=100, stop_tolerance=0.5)
    >>> res = fit_ensemble(est, X, y, ranks=[1, 4], seeds=[0, 1])
    >>> res.params[1]
    {'rank': 1, 'random_state': 1}
    >>> [type(e).__name__ for e in res.estimators][:1], len(res.estimators)
    (['KernelAttentionRegressor'], 4)
    >>> res.estimators[3].predict(X).shape
    (32, 2)
    """
    members = _check_members(estimator, ranks, seeds) if params is None else [
        dict(p) for p in params]
    return _fit_members(estimator, X, y, members, progress=progress)
