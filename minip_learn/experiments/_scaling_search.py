"""The two searches of the scaling recipe for the smallest rank that solves a suite.

* :func:`construction_route` -- the exact head of :ref:`theory-r3` at the constructive
  rank, then :func:`~minip_learn.constructions.factorized_kernel_head` below it, kept
  in ``out/constructions`` (:class:`~minip_learn.model_selection.KeyedStore`);
* :func:`training_route` -- trained heads below the construction's verified rank,
  every feature map side by side, through the recipe's sweeps.

Both search with :func:`bisect_ranks`.
"""

import time

import pandas as pd
from sklearn.utils import Bunch

from ..constructions import exact_kernel_realization, factorized_kernel_head
from ..estimators import KernelAttentionRegressor
from ..metrics import solves, verify_solver
from ..model_selection import KeyedStore

__all__ = ["bisect_ranks", "construction_route", "largest_below", "training_route"]


def bisect_ranks(lo, hi, rank_solves, max_probes=None):
    """Search between a failing ``lo`` and a solving ``hi``; returns the largest failing
    and the smallest solving rank probed.

    The rank just below ``hi`` is probed first: when it fails, ``hi`` is the answer
    (assuming, as the bisection does, that a rank failing every seed means smaller
    ranks fail too). Otherwise a bisection continues until the two are adjacent, or
    until ``max_probes`` ranks were probed.
    """
    if hi - lo <= 1 or max_probes == 0:
        return lo, hi
    if not rank_solves(hi - 1):
        return hi - 1, hi
    hi, probes = hi - 1, 1
    while hi - lo > 1 and (max_probes is None or probes < max_probes):
        probes += 1
        mid = (lo + hi) // 2
        if rank_solves(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi


def largest_below(ranks, limit):
    """The largest of ``ranks`` (None left out) below ``limit`` (None: no limit)."""
    ranks = [r for r in ranks if r is not None and (limit is None or r < limit)]
    return max(ranks) if ranks else None


def _construct(suite, m, rank, seed, constructive, params):
    """One construction attempt: its row, and the head when it solves the suite."""
    t0, c0 = time.perf_counter(), time.process_time()
    if rank >= constructive:
        est = exact_kernel_realization(tokens=suite.tokens)
        method = "R3"
    else:
        est = factorized_kernel_head(suite.X, suite.y, rank, random_state=seed, **params)
        method = "nmf"
    err = verify_solver(est, suite.X, suite.y)
    row = dict(model="construction", n_bits=m, rank=int(est.rank), seed=seed,
               method=method, solved=solves(err), max_abs_error=err,
               fit_time=time.perf_counter() - t0, fit_cpu_time=time.process_time() - c0)
    return row, (est if row["solved"] else None)


def construction_route(suite, m, cfg, out, bound, constructive):
    """Bisection over ranks with :func:`~minip_learn.constructions.factorized_kernel_head`;
    the R3 head closes it.

    Returns
    -------
    route : :class:`~sklearn.utils.Bunch`
        ``rank`` (smallest verified rank, or None), ``failed_below`` (largest failing
        rank probed at or above ``bound``, or None), ``estimator`` (the head at
        ``rank``), ``results`` (one row per attempt), ``n_computed``, ``n_resumed``.
    """
    params = {k: v for k, v in cfg["construction"].items() if k != "seeds"}
    store = KeyedStore(None if out is None else out / "constructions", params,
                       suite.X, suite.y)
    rows, solvers = [], {}

    def rank_solves(rank):
        seeds = [0] if rank >= constructive else list(cfg["construction"]["seeds"])
        for seed in seeds:
            row, est = store.fetch(
                f"m{m}-r{rank}-s{seed}",
                lambda seed=seed: _construct(suite, m, rank, seed, constructive, params))
            rows.append(row)
            if row["solved"]:
                solvers[rank] = est
                return True
        return False

    hi = lo = None
    if rank_solves(constructive):  # the R3 head solves every family
        lo, hi = bisect_ranks(bound - 1, constructive, rank_solves, cfg["max_probes"])
        lo = lo if lo >= bound else None
    return Bunch(rank=hi, failed_below=lo, estimator=solvers.get(hi),
                 results=pd.DataFrame(rows), n_computed=store.n_computed,
                 n_resumed=store.n_resumed)


def training_route(recipe, suite, m, bound, upper):
    """Searches with trained heads below the construction's verified rank ``upper``.

    The first sweep trains, for every feature map at once (one batched ensemble per
    map, the maps side by side), a control fit one rank below the certified bound and
    the rank just below ``upper``; a rank that solves continues a bisection down to
    the control, per map.

    Returns
    -------
    route : :class:`~sklearn.utils.Bunch`
        ``maps`` (``{map: (smallest solving rank or None, largest failing rank or
        None, estimator)}``), ``results`` (the sweeps' result frames), ``n_computed``,
        ``n_resumed``.
    """
    cfg = recipe.cfg
    maps = list(cfg["feature_maps"])
    est = KernelAttentionRegressor(**cfg["kernel"])
    route = Bunch(maps={}, results=[], n_computed=0, n_resumed=0)
    fitted, tried = {}, {}

    def sweep(ranks, fms):
        res = recipe.sweep(
            est, suite.X, suite.y, name=f"scaling-m{m}-kernel", estimators=True,
            ranks=sorted({int(r) for r in ranks}), seeds=list(cfg["seeds"]),
            param_grid={"feature_map": list(fms)}, tags={"model": "kernel", "n_bits": m})
        route.n_computed += res.n_computed
        route.n_resumed += res.n_resumed
        route.results.append(res.results)
        for (fm, rank), g in res.results.groupby(["feature_map", "rank"]):
            ok = g[g["solved"]].sort_values("max_abs_error")
            tried[fm, int(rank)] = len(ok) > 0
            if len(ok):
                fitted[fm, int(rank)] = res.estimators.get(ok["fit_id"].iloc[0])

    first = [r for r in (bound - 1, upper - 1) if r >= max(1, bound - 1)]
    if first:
        sweep(first, maps)
    for fm in maps:
        def rank_solves(rank, fm=fm):
            if (fm, rank) not in tried:
                sweep([rank], [fm])
            return tried[fm, rank]

        lo, hi = bisect_ranks(bound - 1, upper, rank_solves, cfg["max_probes"])
        found = hi < upper  # the bisection lowers ``hi`` only to a rank that solved
        route.maps[fm] = (hi if found else None, lo if lo >= 1 else None,
                          fitted.get((fm, hi)) if found else None)
    return route
