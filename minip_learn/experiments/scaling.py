"""The scaling recipe: the rank sandwich across the number of bits ``m``.

For every ``m`` of a grid, :func:`scaling_experiment` builds a witness suite and
measures three ranks that sandwich the smallest rank of a nonnegative kernel head that
solves it:

* **lower** -- the certified minimum rank, recomputed from the sequences by
  :func:`~minip_learn.theory.certify` (see :ref:`theory-r5`);
* **upper** -- the smallest rank at which a head is *verified* to solve every sequence
  (``|p - t| < 1/2`` at every position, predictions in float64). Two routes look for it,
  in this order: *construction* (the exact head of :ref:`theory-r3` at the constructive
  rank, then nonnegative rank-``r`` factorisations ``P Q^T`` of a solving kernel
  plugged into that head below it, see :func:`factorized_kernel_head`) and *training*
  (a search below the construction's verified rank: the rank just below it first,
  then a bisection; several seeds per rank trained as one batched ensemble). Each
  search probes at most ``max_probes`` ranks, so the result is a bracket: the
  smallest rank found to solve and the largest found to fail. The smaller verified
  rank is reported with the route that gave it, and its model is saved as the proof;
* **constructive** -- the number of distinct tokens (the exact realisation of
  :ref:`theory-r3`),

beside dense softmax heads with ``m``-dimensional scores (:ref:`theory-r2`), and the
certified bound of the witness designs continued to large ``m`` as a calculation
(:func:`~minip_learn.theory.bound_table`). The growth of each rank with ``m`` is fitted
on a log2 scale (:func:`growth_fit`).

All numbers live in :data:`SETTINGS` (``"quick"`` and ``"full"``, also
``minip_learn.experiments.SETTINGS["scaling"]``); keyword arguments of
:func:`scaling_experiment` override them. ``minip-learn reproduce scaling`` runs it.
"""

import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.utils import Bunch, check_random_state

from ..constructions import exact_kernel_realization
from ..datasets import make_witness_suite
from ..estimators import KernelAttentionRegressor, SoftmaxAttentionRegressor
from ..theory import bound_table, certify
from ._shared import Recipe, report, settings_text

__all__ = ["SETTINGS", "SUMMARY_COLUMNS", "factorized_kernel_head", "growth_fit",
           "scaling_checks", "scaling_experiment", "verify_solver"]

#: Error below which a prediction rounds to its target: the solving criterion.
TOLERANCE = 0.5

#: The recipe's grids and training settings: ``SETTINGS["quick"|"full"]``.
SETTINGS = {
    "quick": dict(
        # default witness suites (the best certified design of at most max_sequences);
        # n_bits = 8, 12, 16, 20 give certified 2, 4, 8, 12 and constructive 4, 8, 30, 38
        sizes=(8, 12, 16, 20),
        suite=dict(seq_len=3, max_sequences=20000),
        feature_maps=("table",),
        seeds=(0, 1),
        softmax_seeds=(0, 1),
        # the training route probes below the construction's verified rank; at
        # m = 16, 20 those fits fail after 500 epochs with max errors 1.81-1.87 and
        # 2.24-2.47 (table map), after 1,000 epochs with 1.84-1.88 and 2.37-2.38
        kernel=dict(max_epochs=500, stop_tolerance=0.5),
        # the default lr (0.01) needs 400-850 epochs on the Hadamard suites of m = 16, 20
        softmax=dict(max_epochs=1500, stop_tolerance=0.5, n_init=2),
        construction=dict(seeds=(0,), nmf_iter=200, steps=300, lr=0.05, margin=0.1),
        # ranks probed by each route's search between the two ends (None: until the
        # smallest solving and the largest failing rank are adjacent)
        max_probes=None,
        design_bits=tuple(range(8, 129, 8)),
    ),
    "full": dict(
        # n_bits = 24, 28, 32 give certified 17, 17, 36 and constructive 46, 92, 171
        sizes=(8, 12, 16, 20, 24, 28, 32),
        suite=dict(seq_len=3, max_sequences=20000),
        feature_maps=("table", "exp"),
        seeds=(0, 1, 2, 3, 4),
        softmax_seeds=(0, 1, 2, 3, 4),
        # the training route probes below the construction's verified rank, where
        # every fit so far ran its whole budget; five seeds of rank 171 on the m = 32
        # suite (7,998 sequences) take 0.7 s per epoch and map on an idle core, and the
        # two maps' ensembles (ranks 35 and 170) took 830 s side by side on 2 shared cores
        kernel=dict(max_epochs=500, stop_tolerance=0.5),
        # at m = 32 the default lr (0.01) solves in 1,380-1,730 epochs; some
        # initialisations stall (max error 8.7 after 3,000 epochs, with or without
        # weight decay) and the next restart solves; lr = 0.03 diverges on one seed
        softmax=dict(max_epochs=2500, stop_tolerance=0.5, n_init=3),
        construction=dict(seeds=(0,), nmf_iter=200, steps=300, lr=0.05, margin=0.1),
        max_probes=3,
        design_bits=tuple(range(8, 129, 8)),
    ),
}


#: Columns of ``summary.csv``, one row per ``n_bits``.
SUMMARY_COLUMNS = (
    "n_bits", "suite_params", "construction", "n_sequences", "n_tokens",
    "certified_min_rank", "smallest_solving_rank", "failed_rank_below", "upper_route",
    "constructive_rank", "training_rank", "training_failed_below", "construction_rank",
    "construction_failed_below", "softmax_score_dim", "softmax_solved", "design_bound",
    "solver", "solver_max_error", "certify_time", "training_time", "construction_time",
    "softmax_time", "fit_cpu_time", "wall_time",
)


# -- verification ---------------------------------------------------------------------
def verify_solver(estimator, X, y):
    """Largest error ``max |p - t|`` of a fitted head on a family, in float64.

    The head solves the family when the value is below 1/2 (every prediction rounds to
    its target). The estimators evaluate their parameters in float64 whatever dtype
    they were trained in, so a float32 fit is checked without float32 rounding.

    Parameters
    ----------
    estimator : fitted estimator
        A regressor with ``predict`` (e.g. loaded with :func:`joblib.load`).
    X : array-like of shape (n_samples, seq_len, n_bits)
    y : array-like of shape (n_samples, seq_len)

    Returns
    -------
    max_error : float
        ``inf`` when a prediction is not finite.

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.experiments import verify_solver
    >>> from minip_learn.constructions import exact_kernel_realization
    >>> suite = make_witness_suite(16, construction="small")
    >>> verify_solver(exact_kernel_realization(tokens=suite.tokens), suite.X, suite.y) < 0.5
    True
    """
    p = np.asarray(estimator.predict(X), dtype=np.float64)
    err = np.abs(p - np.asarray(y, dtype=np.float64))
    return float(err.max()) if np.isfinite(err).all() else math.inf


# -- the construction route -----------------------------------------------------------
def _masked_nmf(K, M, rank, n_iter, rng):
    """Multiplicative-update NMF of ``K`` on the entries where ``M`` is 1."""
    n = len(K)
    P = rng.uniform(0.1, 1.0, size=(n, rank))
    Q = rng.uniform(0.1, 1.0, size=(n, rank))
    MK = M * K
    tiny = 1e-12
    for _ in range(n_iter):
        P *= (MK @ Q) / ((M * (P @ Q.T)) @ Q + tiny)
        Q *= (MK.T @ P) / ((M * (P @ Q.T)).T @ P + tiny)
    return P, Q


def factorized_kernel_head(X, y, rank, *, beta=2.0, nmf_iter=200, steps=300, lr=0.05,
                           margin=0.1, random_state=None):
    """A kernel head of rank ``rank`` built from a nonnegative factorisation ``P Q^T``.

    The construction route to an upper bound on the rank a family needs. The kernel of
    :ref:`theory-r3`, ``exp(-beta <x, z>)`` (each query row scaled to maximum 1), is
    factorised on the token pairs that occur together in the family as ``P Q^T`` with
    ``P, Q >= 0`` of ``rank`` columns (masked multiplicative-update NMF). The factors
    are then refined by gradient descent on their logarithms (so they stay
    nonnegative) against the family's outputs: the value map ``v(x) = x`` and readout
    ``rho_x(u) = <x, u> + b`` of :ref:`theory-r3` (``b`` learnt), a squared hinge on
    ``|p - t| - (1/2 - 2 margin)``, stopping once every error is below
    ``1/2 - margin``. The result is a fitted ``feature_map="table"`` head with
    ``log P`` and ``log Q`` as its query and key tables; whether it solves the family
    is for :func:`verify_solver` to say.

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits)
        The family (0/1 tokens).
    y : array-like of shape (n_samples, seq_len)
        Its Min-IP targets.
    rank : int
        Number of features ``r``.
    beta : float, default=2.0
        Inverse temperature of the kernel that is factorised.
    nmf_iter : int, default=200
        Multiplicative updates.
    steps : int, default=300
        Gradient steps of the refinement (Adam, float64).
    lr : float, default=0.05
        Learning rate of the refinement.
    margin : float, default=0.1
        The refinement stops once every error is below ``1/2 - margin``.
    random_state : int, RandomState instance or None, default=None
        Seeds the NMF initialisation.

    Returns
    -------
    estimator : KernelAttentionRegressor
        Fitted without training, through
        :meth:`~minip_learn.estimators.KernelAttentionRegressor.from_module`
        (``feature_map="table"`` over the family's tokens, ``rank``, float64);
        ``train_max_error_`` and ``solved_`` describe the constructed head on
        ``(X, y)``.

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.experiments import factorized_kernel_head, verify_solver
    >>> suite = make_witness_suite(12, max_sequences=20000)
    >>> suite.certified_min_rank, suite.constructive_rank
    (4, 8)
    >>> est = factorized_kernel_head(suite.X, suite.y, 8, random_state=0)
    >>> est.rank, verify_solver(est, suite.X, suite.y) < 0.5
    (8, True)
    """
    import torch

    X = np.asarray(X)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 3:
        raise ValueError(f"X must have shape (n_samples, seq_len, n_bits); got {X.shape}.")
    if not (isinstance(rank, (int, np.integer)) and rank >= 1):
        raise ValueError(f"rank must be an int >= 1; got {rank!r}.")
    rng = check_random_state(random_state)
    n, N, m = X.shape
    tokens, inverse = np.unique(X.reshape(-1, m), axis=0, return_inverse=True)
    idx = inverse.reshape(n, N)
    T = tokens.astype(np.float64)
    G = T @ T.T
    K = np.exp(-beta * (G - G.min(axis=1, keepdims=True)))
    M = np.zeros_like(K)
    M[np.repeat(idx, N, axis=1).ravel(), np.tile(idx, (1, N)).ravel()] = 1.0
    P, Q = _masked_nmf(K, M, int(rank), int(nmf_iter), rng)

    dt = torch.float64
    LP = torch.log(torch.as_tensor(P, dtype=dt)).clamp_min(-300.0).requires_grad_()
    LQ = torch.log(torch.as_tensor(Q, dtype=dt)).clamp_min(-300.0).requires_grad_()
    b = torch.tensor(-0.25, dtype=dt, requires_grad=True)
    # flat index of the (query token, key token) pair at every (sequence, i, j)
    qi = np.repeat(idx[:, :, None], N, axis=2)
    kj = np.repeat(idx[:, None, :], N, axis=1)
    pairs = torch.as_tensor((qi * len(tokens) + kj).ravel())
    overlaps = torch.as_tensor(G[qi, kj], dtype=dt)
    target = torch.as_tensor(y, dtype=dt)
    optimizer = torch.optim.Adam([LP, LQ, b], lr=lr)
    for _ in range(int(steps)):
        log_kernel = torch.logsumexp(LP[:, None, :] + LQ[None, :, :], dim=-1)
        weights = torch.softmax(
            log_kernel.reshape(-1).index_select(0, pairs).reshape(n, N, N), dim=-1)
        err = ((weights * overlaps).sum(-1) + b - target).abs()
        if float(err.detach().max()) < TOLERANCE - margin:
            break
        loss = torch.relu(err - TOLERANCE + 2 * margin).square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    # the table head of R3 with the factors as its query and key tables (rows follow
    # the vocabulary, which is ``tokens``), value map x and readout <x, u> + b
    from ..nn import KernelAttentionHead

    vocabulary = {"vocabulary": tokens}
    head = KernelAttentionHead(m, int(rank), feature_map="table",
                               feature_kwargs=vocabulary).double()
    head.set_token_tables(query=LP.detach(), key=LQ.detach())
    head.set_identity_value_readout(bias=float(b.detach()))
    est = KernelAttentionRegressor.from_module(
        head, rank=int(rank), feature_map="table", feature_kwargs=vocabulary,
        dtype="float64")
    est.train_max_error_ = verify_solver(est, X, y)
    est.solved_ = est.train_max_error_ < TOLERANCE
    return est


# -- growth fits ----------------------------------------------------------------------
def growth_fit(n_bits, ranks, *, confidence=0.95):
    """Least-squares slope of ``log2(rank)`` against ``n_bits`` with a t-interval.

    Parameters
    ----------
    n_bits : array-like of shape (n,)
    ranks : array-like of shape (n,)
        Positive ranks; missing values (None, NaN) are left out.
    confidence : float, default=0.95
        Level of the two-sided interval ``slope +- t_{n-2} * se``.

    Returns
    -------
    fit : :class:`~sklearn.utils.Bunch`
        ``slope`` (doublings of the rank per bit), ``intercept``, ``stderr``,
        ``ci_low``, ``ci_high`` (NaN with fewer than 3 points), ``n`` (points used).

    Examples
    --------
    >>> from minip_learn.experiments import growth_fit
    >>> fit = growth_fit([8, 16, 24], [2, 8, 32])
    >>> fit.slope, fit.n, (fit.ci_low, fit.ci_high)
    (0.25, 3, (0.25, 0.25))
    """
    from scipy import stats

    x = np.asarray(n_bits, dtype=np.float64)
    r = pd.to_numeric(pd.Series(list(ranks)), errors="coerce").to_numpy(np.float64)
    if x.shape != r.shape:
        raise ValueError(f"n_bits and ranks differ in length: {x.shape} vs {r.shape}.")
    keep = np.isfinite(r) & np.isfinite(x)
    if (r[keep] <= 0).any():
        raise ValueError("ranks must be positive.")
    x, z = x[keep], np.log2(r[keep])
    n = len(x)
    nan = float("nan")
    if n < 2 or np.ptp(x) == 0:
        return Bunch(slope=nan, intercept=nan, stderr=nan, ci_low=nan, ci_high=nan, n=n)
    xm = x.mean()
    sxx = ((x - xm) ** 2).sum()
    slope = float(((x - xm) * (z - z.mean())).sum() / sxx)
    intercept = float(z.mean() - slope * xm)
    if n < 3:
        return Bunch(slope=slope, intercept=intercept, stderr=nan, ci_low=nan, ci_high=nan,
                     n=n)
    resid = z - (intercept + slope * x)
    stderr = float(np.sqrt((resid ** 2).sum() / (n - 2) / sxx))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 2)) * stderr
    return Bunch(slope=slope, intercept=intercept, stderr=stderr, ci_low=slope - half,
                 ci_high=slope + half, n=n)


# -- checks ---------------------------------------------------------------------------
def scaling_checks(summary, results):
    """The expected behaviours of the scaling recipe, each ``True``/``False``.

    * ``none_solved_below_bound`` -- no kernel head (trained or constructed) with a
      rank below its family's certified bound solved it (one that does is a bug: in
      the metric, the head or the certificate);
    * ``sandwich_ordered`` -- ``certified <= smallest solving <= constructive`` at
      every ``n_bits`` (a missing upper bound fails);
    * ``softmax_solved_every_seed`` -- every dense softmax fit solved its family.

    Parameters
    ----------
    summary : pandas.DataFrame
        One row per ``n_bits`` (``certified_min_rank``, ``smallest_solving_rank``,
        ``constructive_rank``).
    results : pandas.DataFrame
        One row per fit (``model``, ``n_bits``, ``rank``, ``solved``).

    Returns
    -------
    checks : dict of str to bool

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.experiments import scaling_checks
    >>> summary = pd.DataFrame({"n_bits": [8], "certified_min_rank": [2],
    ...                         "smallest_solving_rank": [3], "constructive_rank": [4]})
    >>> results = pd.DataFrame({"model": ["kernel", "kernel", "softmax"],
    ...                         "n_bits": [8, 8, 8], "rank": [1, 3, None],
    ...                         "solved": [False, True, True]})
    >>> scaling_checks(summary, results)
    {'none_solved_below_bound': True, 'sandwich_ordered': True, 'softmax_solved_every_seed': True}
    """
    bound = dict(zip(summary["n_bits"], summary["certified_min_rank"]))
    heads = results[results["model"].isin(["kernel", "construction"])]
    below = heads["rank"].astype(float) < heads["n_bits"].map(bound).astype(float)
    solved = heads["solved"].astype(bool)
    upper = pd.to_numeric(summary["smallest_solving_rank"], errors="coerce")
    ordered = (upper.notna()
               & (summary["certified_min_rank"] <= upper)
               & (upper <= summary["constructive_rank"]))
    soft = results[results["model"] == "softmax"]
    return {
        "none_solved_below_bound": bool(not (below & solved).any()),
        "sandwich_ordered": bool(len(summary) > 0 and ordered.all()),
        "softmax_solved_every_seed": bool(len(soft) > 0 and soft["solved"].astype(bool).all()),
    }


# -- the recipe -----------------------------------------------------------------------
def _bisect(lo, hi, solves, max_probes=None):
    """Search between a failing ``lo`` and a solving ``hi``; returns the largest failing
    and the smallest solving rank probed.

    The rank just below ``hi`` is probed first: when it fails, ``hi`` is the answer
    (assuming, as the bisection does, that a rank failing every seed means smaller
    ranks fail too). Otherwise a bisection continues until the two are adjacent, or
    until ``max_probes`` ranks were probed.
    """
    if hi - lo <= 1 or max_probes == 0:
        return lo, hi
    if not solves(hi - 1):
        return hi - 1, hi
    hi, probes = hi - 1, 1
    while hi - lo > 1 and (max_probes is None or probes < max_probes):
        probes += 1
        mid = (lo + hi) // 2
        if solves(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi


def _largest_below(ranks, limit):
    """The largest of ``ranks`` (None left out) below ``limit`` (None: no limit)."""
    ranks = [r for r in ranks if r is not None and (limit is None or r < limit)]
    return max(ranks) if ranks else None


def _digest(obj):
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


class _ConstructionStore:
    """One JSON row (and, when solved, the estimator) per construction attempt."""

    def __init__(self, out, X, y, params):
        self.folder = None if out is None else Path(out) / "constructions"
        fingerprint = hashlib.sha1(np.ascontiguousarray(X).tobytes()
                                   + np.ascontiguousarray(y).tobytes()).hexdigest()[:10]
        self.tag = _digest({"data": fingerprint, **params})
        self.memory = {}
        self.n_computed = 0
        self.n_resumed = 0

    def _path(self, stem, suffix):
        return self.folder / f"{stem}-{self.tag}{suffix}"

    def get(self, stem):
        if stem in self.memory:
            return self.memory[stem]
        if self.folder is not None and self._path(stem, ".json").exists():
            row = json.loads(self._path(stem, ".json").read_text())
            est_path = self._path(stem, ".joblib")
            est = None
            if est_path.exists():
                import joblib

                est = joblib.load(est_path)
            self.memory[stem] = (row, est)
            self.n_resumed += 1
            return self.memory[stem]
        return None

    def put(self, stem, row, est):
        self.memory[stem] = (row, est)
        self.n_computed += 1
        if self.folder is None:
            return
        import joblib

        self.folder.mkdir(parents=True, exist_ok=True)
        if est is not None:
            tmp = self._path(stem, ".joblib.tmp")
            joblib.dump(est, tmp)
            tmp.replace(self._path(stem, ".joblib"))
        tmp = self._path(stem, ".json.tmp")
        tmp.write_text(json.dumps(row))
        tmp.replace(self._path(stem, ".json"))


def _construction_route(suite, m, cfg, out, bound, constructive):
    """Bisection over ranks with :func:`factorized_kernel_head`; the R3 head closes it."""
    params = {k: v for k, v in cfg["construction"].items() if k != "seeds"}
    store = _ConstructionStore(out, suite.X, suite.y, params)
    rows, solvers = [], {}

    def attempt(rank, seed):
        stem = f"m{m}-r{rank}-s{seed}"
        hit = store.get(stem)
        if hit is None:
            t0, c0 = time.perf_counter(), time.process_time()
            if rank >= constructive:
                est = exact_kernel_realization(tokens=suite.tokens)
                method = "R3"
            else:
                est = factorized_kernel_head(suite.X, suite.y, rank, random_state=seed,
                                             **params)
                method = "nmf"
            err = verify_solver(est, suite.X, suite.y)
            row = dict(model="construction", n_bits=m, rank=int(est.rank), seed=seed,
                       method=method, solved=bool(err < TOLERANCE), max_abs_error=err,
                       fit_time=time.perf_counter() - t0,
                       fit_cpu_time=time.process_time() - c0)
            store.put(stem, row, est if row["solved"] else None)
            hit = (row, est if row["solved"] else None)
        rows.append(hit[0])
        return hit

    def solves(rank):
        seeds = [0] if rank >= constructive else list(cfg["construction"]["seeds"])
        for seed in seeds:
            row, est = attempt(rank, seed)
            if row["solved"]:
                solvers[rank] = est
                return True
        return False

    lo = bound - 1
    if not solves(constructive):  # the R3 head solves every family: never expected
        return None, None, None, rows, store
    lo, hi = _bisect(lo, constructive, solves, cfg["max_probes"])
    return hi, (lo if lo >= bound else None), solvers[hi], rows, store


def _training_route(recipe, suite, m, bound, upper):
    """Searches with trained heads below the construction's verified rank ``upper``.

    The first sweep trains, for every feature map at once (one batched ensemble per
    map, the maps side by side), a control fit one rank below the certified bound and
    the rank just below ``upper``; a rank that solves continues a bisection down to
    the control, per map. Returns ``{map: (smallest solving rank or None, largest
    failing rank or None, estimator)}``, the result frames and ``[computed, resumed]``.
    """
    cfg = recipe.cfg
    maps = list(cfg["feature_maps"])
    est = KernelAttentionRegressor(**cfg["kernel"])
    parts, fitted, tried = [], {}, {}
    counts = [0, 0]

    def sweep(ranks, fms):
        res = recipe.sweep(
            est, suite.X, suite.y, name=f"scaling-m{m}-kernel", estimators=True,
            ranks=sorted({int(r) for r in ranks}), seeds=list(cfg["seeds"]),
            param_grid={"feature_map": list(fms)}, tags={"model": "kernel", "n_bits": m})
        counts[0] += res.n_computed
        counts[1] += res.n_resumed
        parts.append(res.results)
        for (fm, rank), g in res.results.groupby(["feature_map", "rank"]):
            ok = g[g["solved"]].sort_values("max_abs_error")
            tried[fm, int(rank)] = len(ok) > 0
            if len(ok):
                fitted[fm, int(rank)] = res.estimators.get(ok["fit_id"].iloc[0])

    first = [r for r in (bound - 1, upper - 1) if r >= max(1, bound - 1)]
    if first:
        sweep(first, maps)
    routes = {}
    for fm in maps:
        def solves(rank, fm=fm):
            if (fm, rank) not in tried:
                sweep([rank], [fm])
            return tried[fm, rank]

        lo, hi = _bisect(bound - 1, upper, solves, cfg["max_probes"])
        found = hi < upper  # the bisection lowers ``hi`` only to a rank that solved
        routes[fm] = (hi if found else None, lo if lo >= 1 else None,
                      fitted.get((fm, hi)) if found else None)
    return routes, parts, counts


def _results_frame(parts):
    frames = [p for p in parts if len(p)]
    if not frames:
        return pd.DataFrame(columns=["model", "n_bits", "rank", "seed", "solved"])
    df = pd.concat(frames, ignore_index=True)
    first = [c for c in ("model", "n_bits", "feature_map", "rank", "seed", "solved",
                         "max_abs_error") if c in df]
    return df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)


def scaling_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                       figures=True, ensemble=True, **settings):
    """The rank sandwich across ``n_bits``: certified, smallest solving, constructive.

    For every size ``m`` in ``sizes``: the witness suite
    ``make_witness_suite(n_bits=m, **suite)``; its certified minimum rank (recomputed
    by :func:`~minip_learn.theory.certify`); the smallest rank at which a kernel head is
    verified to solve it, from two routes -- *construction* (the exact head of
    :ref:`theory-r3` at the constructive rank, then the rank just below it and, when
    that solves, a bisection towards the bound, with :func:`factorized_kernel_head`)
    and then *training* (the same search below the construction's verified rank; the
    first sweep trains every feature map side by side, each one batched ensemble of
    all ``seeds`` holding a control fit at ``certified - 1`` and the rank just below
    the construction's); the constructive rank; and dense
    softmax heads with ``score_dim = m`` over ``softmax_seeds``. The verified head at
    the smallest rank is saved as ``solvers/m{m}-rank{r}.joblib``, reloaded, and checked
    again (float64, :func:`verify_solver`) before it is reported.

    Parameters
    ----------
    quick : bool, default=True
        Use ``SETTINGS["scaling"]["quick"]`` (sizes 8-20, ``table`` maps, two seeds:
        under a minute on 2 cores) instead of ``"full"`` (sizes 8-32, ``table`` and
        ``exp`` maps, five seeds: about 25 minutes on 2 cores with ``n_jobs=2``).
    out : str or path, default=None
        Folder for ``results.csv`` (one row per fit or construction), ``summary.csv``
        (one row per size, the columns
        :data:`~minip_learn.experiments.scaling.SUMMARY_COLUMNS`; ``training_time``,
        ``construction_time``, ``softmax_time`` and ``fit_cpu_time`` add up the times
        stored with the fits, so a resumed run reports them too, while ``wall_time``
        is this call's), ``growth.csv``, ``design.csv``,
        ``summary.md``, ``rank_sandwich.png`` and ``solvers/``; tables are rewritten as
        each size finishes. Fits go to ``out/runs`` and constructions to
        ``out/constructions``: a rerun with the same ``out`` refits nothing that is on
        disk. None keeps everything in memory.
    n_jobs : int, default=None
        Parallel fits (see :func:`~minip_learn.model_selection.rank_sweep`).
    devices : str or list of str, default=None
        Torch devices for the fits.
    progress : bool, default=True
        Progress bars and one line per size.
    figures : bool, default=True
        Draw ``rank_sandwich`` (:func:`~minip_learn.plotting.plot_rank_sandwich`).
    ensemble : bool, default=True
        Train the seeds of a rank as one batched ensemble (kernel heads only).
    **settings
        Overrides of the recipe's settings (``SETTINGS["scaling"]``): ``sizes``,
        ``suite`` (keyword arguments of :func:`~minip_learn.datasets.make_witness_suite`
        besides ``n_bits``),
        ``feature_maps``, ``seeds``, ``softmax_seeds``, ``kernel``, ``softmax``,
        ``construction`` (keyword arguments of :func:`factorized_kernel_head` and its
        ``seeds``), ``max_probes`` (most ranks probed by each search between the two
        ends; None: until the smallest solving rank and a failing rank are adjacent),
        ``design_bits`` (sizes of the design-bound calculation).

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``summary`` (one row per size), ``results`` (one row per fit; ``model`` is
        ``"kernel"``, ``"construction"`` or ``"softmax"``), ``growth`` (slope of
        ``log2 rank`` per bit with its 95% t-interval, per quantity), ``design`` (the
        design-bound calculation), ``markdown``, ``checks`` (see
        :func:`scaling_checks`), ``figures``, ``files``, ``settings``, ``n_computed`` and
        ``n_resumed`` (fits and constructions computed in this call / read from disk),
        ``elapsed`` and ``cpu_time`` (seconds, this process).

    Examples
    --------
    >>> from minip_learn.experiments import scaling_experiment
    >>> res = scaling_experiment(
    ...     sizes=(8,), seeds=(0,), softmax_seeds=(0,), kernel={"max_epochs": 200},
    ...     softmax={"max_epochs": 200}, design_bits=(8, 16), progress=False,
    ...     figures=False)
    >>> row = res.summary.iloc[0]
    >>> int(row.certified_min_rank), int(row.smallest_solving_rank), int(row.constructive_rank)
    (2, 2, 4)
    >>> res.checks["sandwich_ordered"]
    True
    """
    c0 = time.process_time()
    recipe = Recipe("scaling", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    cfg, out = recipe.cfg, recipe.out
    design = bound_table(n_bits=sorted(set(cfg["design_bits"]) | set(cfg["sizes"])),
                         seq_len=[cfg["suite"].get("seq_len", 3)])
    design_bound = dict(zip(design["n_bits"], design["certified_min_rank"]))
    rows, parts = [], []
    n_computed = n_resumed = 0
    for m in cfg["sizes"]:
        m = int(m)
        tm = time.perf_counter()
        suite = make_witness_suite(n_bits=m, **cfg["suite"])
        tc = time.perf_counter()
        bound = int(certify(suite.X))
        certify_time = time.perf_counter() - tc
        constructive = len(np.unique(suite.X.reshape(-1, m), axis=0))

        # construction route: the exact head of R3 at the constructive rank, then
        # factorisations below it
        c_hi, c_lo, c_est, c_rows, store = _construction_route(
            suite, m, cfg, out, bound, constructive)
        m_parts = [pd.DataFrame(c_rows)]
        n_computed += store.n_computed
        n_resumed += store.n_resumed

        # training route, below the construction's verified rank (every map at once)
        training, fits, counts = _training_route(
            recipe, suite, m, bound, constructive + 1 if c_hi is None else c_hi)
        m_parts += fits
        n_computed += counts[0]
        n_resumed += counts[1]

        # dense softmax with m-dimensional scores, one seed at a time (their n_init
        # restarts stop at the first initialisation that solves)
        soft = None
        if cfg["softmax_seeds"]:
            soft = recipe.sweep(
                SoftmaxAttentionRegressor(score_dim=m, **cfg["softmax"]), suite.X,
                suite.y, name=f"scaling-m{m}-softmax", seeds=list(cfg["softmax_seeds"]),
                tags={"model": "softmax", "n_bits": m}, ensemble=False)
            m_parts.append(soft.results)
            n_computed += soft.n_computed
            n_resumed += soft.n_resumed
        parts += m_parts
        # fit times as stored with the fits: the same numbers when a rerun resumes
        fits = _results_frame(m_parts)
        fit_time = fits.groupby("model")["fit_time"].sum()

        # the smaller verified rank of the two routes (ties: training); below it, the
        # largest rank that a route probed and found failing
        found = [(hi, est, f"training ({fm})") for fm, (hi, _, est) in training.items()
                 if hi is not None and est is not None]
        t_hi = min(found, key=lambda f: f[0])[0] if found else None
        t_lo = _largest_below([lo for _, lo, _ in training.values()], t_hi)
        candidates = found + ([(c_hi, c_est, "construction")] if c_est is not None else [])
        upper = failed = route = solver_path = None
        solver_err = float("nan")
        if candidates:
            upper, solver, route = min(candidates, key=lambda f: f[0])
            failed = _largest_below([t_lo, c_lo], upper)
            solver_err = verify_solver(solver, suite.X, suite.y)
            if out is not None:
                import joblib

                solver_path = out / "solvers" / f"m{m}-rank{upper}.joblib"
                solver_path.parent.mkdir(parents=True, exist_ok=True)
                joblib.dump(solver, solver_path)
                solver_err = verify_solver(joblib.load(solver_path), suite.X, suite.y)
            if not solver_err < TOLERANCE:
                upper = failed = route = None
        rows.append(dict(
            n_bits=m, suite_params=json.dumps({"n_bits": m, **cfg["suite"]}, sort_keys=True),
            construction=suite.construction, n_sequences=len(suite.X),
            n_tokens=constructive, certified_min_rank=bound,
            smallest_solving_rank=upper, failed_rank_below=failed, upper_route=route,
            constructive_rank=constructive, training_rank=t_hi,
            training_failed_below=t_lo, construction_rank=c_hi,
            construction_failed_below=c_lo, softmax_score_dim=m,
            softmax_solved=(float(soft.results["solved"].mean()) if soft is not None
                            else float("nan")),
            design_bound=design_bound.get(m),
            solver=None if solver_path is None else str(solver_path.relative_to(out)),
            solver_max_error=solver_err, certify_time=certify_time,
            training_time=float(fit_time.get("kernel", 0.0)),
            construction_time=float(fit_time.get("construction", 0.0)),
            softmax_time=float(fit_time.get("softmax", 0.0)),
            fit_cpu_time=float(fits["fit_cpu_time"].sum()),
            wall_time=time.perf_counter() - tm,
            **{f"training_rank_{fm}": training[fm][0] for fm in cfg["feature_maps"]},
        ))
        if progress:
            r = rows[-1]
            print(f"m = {m}: certified {bound} <= smallest solving {upper} ({route}) <= "
                  f"constructive {constructive}; softmax solved {r['softmax_solved']:.2f}; "
                  f"{r['wall_time']:.1f} s", flush=True)
        # the tables so far, rewritten as each size finishes
        summary = _summary_frame(rows)
        recipe.write_tables(
            Bunch(results=_results_frame(parts), summary=summary,
                  markdown=_markdown(summary, None, {}, cfg)),
            {"design": design})

    summary = _summary_frame(rows)
    results = _results_frame(parts)
    checks = scaling_checks(summary, results)
    growth = _growth_table(summary, design)
    markdown = _markdown(summary, growth, checks, cfg)
    if progress:
        print(_growth_lines(growth), flush=True)
    figs = {}
    if figures:
        from ..plotting import plot_rank_sandwich

        figs["rank_sandwich"] = plot_rank_sandwich(summary, design=design).figure
    result = recipe.finish(
        Bunch(summary=summary, results=results, growth=growth, design=design,
              markdown=markdown, checks=checks, figures=figs, n_computed=n_computed,
              n_resumed=n_resumed),
        tables={"growth": growth, "design": design})
    result.cpu_time = time.process_time() - c0
    return result


def _summary_frame(rows):
    df = pd.DataFrame(rows)
    cols = [c for c in SUMMARY_COLUMNS if c in df]
    df = df[cols + [c for c in df.columns if c not in cols]]
    for c in ("smallest_solving_rank", "failed_rank_below", "training_rank",
              "training_failed_below", "construction_rank", "construction_failed_below",
              "design_bound") + tuple(c for c in df.columns if c.startswith("training_rank_")):
        if c in df:
            df[c] = df[c].astype("Int64")
    return df


_GROWTH_QUANTITIES = (
    ("certified (lower)", "certified_min_rank"),
    ("smallest solving (upper)", "smallest_solving_rank"),
    ("constructive (R3)", "constructive_rank"),
)


def _growth_table(summary, design):
    rows = []
    for label, col in _GROWTH_QUANTITIES:
        fit = growth_fit(summary["n_bits"], summary[col])
        rows.append(dict(quantity=label, **fit))
    fit = growth_fit(design["n_bits"], design["certified_min_rank"])
    rows.append(dict(quantity="design bound (calculation)", **fit))
    return pd.DataFrame(rows)


def _growth_lines(growth):
    lines = []
    for _, g in growth.iterrows():
        n = int(g["n"])
        ci = (f"no interval (fewer than 3 points, n = {n} sizes)"
              if not np.isfinite(g["ci_low"]) else
              f"95% CI [{g['ci_low']:.3f}, {g['ci_high']:.3f}] (t-interval, n = {n} sizes)")
        lines.append(f"- {g['quantity']}: log2(rank) grows {g['slope']:.3f} per bit, {ci}")
    return "\n".join(lines)


_CHECK_LABELS = {
    "none_solved_below_bound": "no kernel head below the certified bound solved",
    "sandwich_ordered": "certified <= smallest solving <= constructive at every m",
    "softmax_solved_every_seed": "dense softmax solved every seed at every m",
}

#: The columns of the markdown table: heading -> column of the summary.
_DISPLAY_COLUMNS = {
    "m": "n_bits", "suite": "construction", "sequences": "n_sequences",
    "certified (lower)": "certified_min_rank", "failed below": "failed_rank_below",
    "smallest solving (upper)": "smallest_solving_rank", "route": "upper_route",
    "training": "training_rank", "construction": "construction_rank",
    "constructive (R3)": "constructive_rank", "softmax solved": "softmax_solved",
    "fit time (s)": "fit_time_total", "fit CPU (s)": "fit_cpu_time",
}


def _markdown(summary, growth, checks, cfg):
    """``summary.md``: the table, the growth fits (when given) and the checks."""
    summary = summary.assign(fit_time_total=summary[
        ["training_time", "construction_time", "softmax_time"]].sum(axis=1))
    table = pd.DataFrame({head: summary[col] for head, col in _DISPLAY_COLUMNS.items()})
    text = (f"Witness suites `make_witness_suite(n_bits=m, {settings_text(cfg['suite'])})`; "
            f"kernel maps {list(cfg['feature_maps'])}, seeds {list(cfg['seeds'])} per rank "
            f"({settings_text(cfg['kernel'])}); construction seeds "
            f"{list(cfg['construction']['seeds'])} "
            f"({settings_text({k: v for k, v in cfg['construction'].items() if k != 'seeds'})}); "
            f"at most {cfg['max_probes'] or 'unlimited'} probes per search; softmax "
            f"(score_dim = m) seeds {list(cfg['softmax_seeds'])} "
            f"({settings_text(cfg['softmax'])}).")
    note = None if growth is None else (
        "Growth (least squares of log2 rank against m):\n\n" + _growth_lines(growth))
    return report("Rank sandwich across n_bits", text, table, checks,
                   labels=_CHECK_LABELS, note=note).rstrip()
