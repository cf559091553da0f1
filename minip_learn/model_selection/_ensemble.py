"""Batched ensembles: many fits of one estimator (seeds x ranks) trained as one model.

:func:`fit_ensemble` is the one public route into stacked training. It fits
``clone(estimator).set_params(rank=r, random_state=s)`` for every rank ``r`` and seed
``s`` at once, through the estimator's public ``fit_members`` (the protocol of
stacking, as ``fit`` is the protocol of scikit-learn's model-selection tools): every
member's head is initialised exactly as ``fit`` initialises it, and the heads train as
one stack (see :func:`minip_learn.training.train_members`), each member with its own
stopping and restarts. Every member comes back as an ordinary fitted estimator.
:func:`~minip_learn.model_selection.rank_sweep` with ``ensemble=True`` groups its fits
and runs each group through :func:`fit_ensemble`.
"""

import numbers
import time

import numpy as np
from sklearn.utils import Bunch

from .._validation import check_seeds

__all__ = ["fit_ensemble"]


def _members(estimator, sizes, seeds, params):
    """The ``{size_name: size, "random_state": s}`` of every member (sizes outer);
    ``sizes``: ``{"rank": ranks, "state_size": state_sizes}`` as given."""
    if not callable(getattr(estimator, "fit_members", None)):
        raise ValueError(
            "fit_ensemble needs a KernelAttentionRegressor, SoftmaxAttentionRegressor or "
            f"SequenceMixerRegressor; got {type(estimator).__name__}.")
    allowed = tuple(getattr(estimator, "member_params", ("rank", "random_state")))
    name = type(estimator).__name__
    for key, value in sizes.items():
        if value is not None and key not in allowed:
            raise ValueError(f"{name} has no {key}; give {key}s=None.")
    given = {k: v for k, v in sizes.items() if v is not None}
    if params is not None:
        if given:
            raise ValueError(f"give either params or {' or '.join(k + 's' for k in given)}, "
                             "not both.")
        params = [dict(p) for p in params]
        if not params:
            raise ValueError("params must be a non-empty list of dicts.")
        for p in params:
            bad = sorted(set(p) - set(allowed))
            if bad:
                raise ValueError(f"{name} members may differ only in "
                                 f"{' and '.join(allowed)}; got {bad} in params.")
        return params
    key = next((k for k in allowed if k != "random_state"), None)
    values = given.get(key)
    if values is None:
        values = [None] if key is None else [getattr(estimator, key)]
    else:
        values = [values] if isinstance(values, numbers.Integral) else list(values)
        if not values:
            raise ValueError(f"{key}s must be a non-empty list of ints or None.")
    seeds = check_seeds(seeds)
    if len(set(map(repr, values))) != len(values):
        raise ValueError(f"{key}s must not contain duplicates; got {values!r}.")
    members = []
    for v in values:
        for s in seeds:
            p = {} if v is None else {key: v}
            p["random_state"] = s
            members.append(p)
    return members


def fit_ensemble(estimator, X, y, *, ranks=None, seeds=(0, 1, 2), params=None,
                 state_sizes=None, progress=False):
    """Fit one estimator for many seeds (and ranks or state sizes) at once, as one
    batched model.

    This is the one route into stacked training, in the manner of scikit-learn's
    model-selection functions: it takes an unfitted template and the parameters that
    vary, and returns the fitted clones. :func:`rank_sweep` with ``ensemble=True`` runs
    its fits through it. The estimators' ``fit_members`` method is the protocol it
    calls (``fit_ensemble(est, X, y, params=params)`` returns the members of
    ``est.fit_members(X, y, params)``, with their epochs, solving and fit time).

    Every member ``clone(estimator).set_params(rank=r, random_state=s)`` (for a
    :class:`~minip_learn.SequenceMixerRegressor`, ``state_size=r``) is initialised
    exactly as its own ``fit`` would initialise it; the members are trained together,
    full-batch, by one optimizer on the sum of their losses (independent gradients,
    elementwise optimizer state), each with its own stopping (``stop_tolerance``) and
    restarts (``n_init``). Heads of smaller rank are zero-padded to the largest rank and
    rank-masked (:class:`~minip_learn.nn.HeadEnsemble`), which leaves their arithmetic
    that of a rank-``r`` head; sequence mixers of different state sizes train as one
    stack per state size (their seeds stacked). The result equals the separate fits up
    to floating-point
    rounding (same initialisation, same steps, same stopping), at a fraction of their
    cost for small heads.

    Parameters
    ----------
    estimator : KernelAttentionRegressor, SoftmaxAttentionRegressor or \
SequenceMixerRegressor
        Unfitted template; its hyperparameters are shared by every member. It must
        train full-batch (``batch_size=None``) without extra ``callbacks``.
    X : array-like of shape (n_samples, seq_len, n_bits) or (n_samples, n_bits)
        Training sequences.
    y : array-like of shape (n_samples, seq_len) or (n_samples,)
        Per-token targets.
    ranks : int or list of int, default=None
        Ranks of the members (kernel heads only); None uses ``estimator.rank``.
    seeds : int or list of int, default=(0, 1, 2)
        ``random_state`` of the members; one member per rank (or state size) and seed.
    params : list of dict, default=None
        The members themselves, each a dict with keys among the estimator's
        ``member_params`` (``rank`` and ``random_state``; ``state_size`` and
        ``random_state`` for a mixer); replaces the product of ``ranks`` (or
        ``state_sizes``) and ``seeds`` (then those must be None and ``seeds`` is
        ignored).
    state_sizes : int or list of int, default=None
        State sizes of the members (:class:`~minip_learn.SequenceMixerRegressor`
        only); None uses ``estimator.state_size``.
    progress : bool, default=False
        Show a :mod:`tqdm` progress bar over epochs.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``estimators``: list of fitted estimators, one per member (ranks outer and
        seeds inner, or the order of ``params``); ``params``: the parameters of each;
        ``n_epochs``, ``solved``, ``train_max_error``: arrays of the members'
        ``n_epochs_``, ``solved_``, ``train_max_error_``; ``fit_time``: wall seconds
        of the whole ensemble; ``n_members``: heads trained (members x ``n_init``);
        ``path``: the forward path the stack took (None where it reports none).

    Raises
    ------
    ValueError
        For an estimator that is not a Min-IP regressor, ``ranks`` for a head without
        rank, empty or duplicate ranks or seeds, both ``ranks`` and ``params``,
        mini-batches (``batch_size`` smaller than the set), ``callbacks``, or any
        input ``fit`` rejects.

    See Also
    --------
    rank_sweep : With ``ensemble=True``, runs its fits through this function.

    Notes
    -----
    Single kernel heads with linear feature encoders (``elu+1``, ``relu``,
    ``softplus``, ``squared_relu``, ``exp``) or the ``table`` map, on short sequences,
    run a fused forward (:class:`~minip_learn.nn.HeadEnsemble`); other heads are
    vectorised with :func:`torch.func.vmap`. The saving is the per-fit overhead
    (Python, skorch, small-matrix products), not the arithmetic, which every member
    still does: it is largest for small heads and data and on GPUs. When the tokens
    repeat a lot (few distinct tokens), the fused forward works on pairs of distinct
    tokens instead of positions, which saves most of the arithmetic too. See the
    performance page for measured speed-ups.

    Examples
    --------
    Two ranks and two seeds on the witness suite of ``m = 8`` bits, whose few distinct
    tokens the stack evaluates once per token pair:

    >>> from minip_learn import KernelAttentionRegressor
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.model_selection import fit_ensemble
    >>> suite = make_witness_suite(8, 3)
    >>> est = KernelAttentionRegressor(feature_map="table", max_epochs=100)
    >>> res = fit_ensemble(est, suite.X, suite.y, ranks=[1, 4], seeds=[0, 1])
    >>> res.params[1], res.path
    ({'rank': 1, 'random_state': 1}, 'fused-pairs')
    >>> [type(e).__name__ for e in res.estimators][:1], len(res.estimators)
    (['KernelAttentionRegressor'], 4)
    >>> res.estimators[3].predict(suite.X).shape
    (6, 3)
    >>> fit_ensemble(est, suite.X, suite.y, params=[{"rank": 2, "random_state": 5}]).params
    [{'rank': 2, 'random_state': 5}]
    """
    start = time.perf_counter()
    members = _members(estimator, {"rank": ranks, "state_size": state_sizes}, seeds,
                       params)
    res = estimator.fit_members(X, y, members, progress=progress)
    out = res.estimators
    return Bunch(
        estimators=out,
        params=[dict(m) for m in members],
        n_epochs=np.array([e.n_epochs_ for e in out]),
        solved=np.array([bool(e.solved_) for e in out]),
        train_max_error=np.array([e.train_max_error_ for e in out]),
        fit_time=time.perf_counter() - start,
        n_members=res.n_members,
        path=res.path,
    )
