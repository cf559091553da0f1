"""The full-task recipe: ``r*(m)`` bounded from both sides (:ref:`theory-full-task`).

``r*(m)`` is the smallest rank of a nonnegative kernel head that solves every length-3
sequence of ``m``-bit tokens. Per size the recipe certifies the full task over named
sub-families (:func:`~minip_learn.theory.certify_full_task`: the lower bound, its
certificate verified against the whole task) and looks for the smallest rank that
solves it (the upper bound): key-weight groups
(:func:`~minip_learn.theory.grouped_key_weights`), nonnegative factorisations
(:func:`~minip_learn.constructions.factorized_kernel_head`) and trained heads below the
groups' rank, the R3 head (rank ``2^m``) as the ceiling. The smallest head found is
checked on all ``2^(3m)`` ordered sequences and saved. Where the bounds meet,
``r*(m)`` is exact; elsewhere it stays open between them.
"""

import json
import time

import pandas as pd
from sklearn.utils import Bunch

from ..datasets import make_full_task
from ..estimators import KernelAttentionRegressor, load_estimator, save_estimator
from ..metrics import within_tolerance
from ..theory import (
    Certificate,
    certify_full_task,
    grouped_key_weights,
)
from ..theory.full_task import FULL_TASK_LISTED_BITS
from ._full_task_report import (
    FLIP_METHOD,
    bound_exponents,
    exponent_lines,
    flip_cycle_record,
    full_task_figure,
    measure_unlisted,
    overlap_record,
)
from ._full_task_solvers import (
    ceiling_head,
    factorized_candidates,
    key_weight_head,
    solves,
    verify_ordered,
)
from ._shared import Recipe, display, fmt, markdown_table, report, settings_text

__all__ = []  # public home: the package minip_learn.experiments

#: The columns of ``summary.csv``, one row per size ``m``.
SUMMARY_COLUMNS = (
    "n_bits", "n_sequences", "n_ordered_sequences", "lower_bound", "certified_min_rank",
    "smallest_solving_rank", "exact", "lower_method", "upper_method", "solver",
    "solver_max_error", "certificate", "certificate_verified", "search_exhaustive",
    "group_rank", "factorized_rank", "trained_rank", "ceiling_rank", "overlap_rank",
    "overlap_degree", "overlap_max_error", "overlap_check", "overlap_check_error",
    "flip_cycle", "flip_cycle_verified", "certify_time", "upper_time", "settings_key",
)

_QUICK = dict(
    sizes=(2, 3, 4, 5, 9, 12, 16),
    # node budget of the exhaustive search for the best certificate
    search_nodes=200000,
    # nonnegative factorisations from the groups' rank minus one down to the certified
    # rank, while some seed solves, at sizes up to factorized_max_bits
    factorized=dict(steps=3000, margin=0.02, nmf_iter=200),
    factorized_seeds=(0, 1),
    factorized_max_bits=5,
    # trained heads (one batched model per size): ranks from the certified rank minus
    # one (a fit there must fail) up to the smallest rank found so far minus one, at
    # most max_train_ranks of them, at sizes up to train_max_bits
    kernel=dict(feature_map="table", max_epochs=1000, lr=0.03, stop_tolerance=0.45),
    seeds=(0, 1),
    max_train_ranks=3,
    train_max_bits=5,
    # ordered sequences per slice when a head is checked on all 2^(3m) of them
    verify_chunk=1 << 18,
    # above 8 bits (the task not listed): pools of at most this many sequences, and the
    # overlap kernel checked on this many random sequences besides its exact proof
    pool_max_sequences=200000,
    sample_size=100000,
    sample_seed=0,
)

#: The recipe's grids: ``SETTINGS["quick"|"full"]``.
SETTINGS = {
    "quick": _QUICK,
    # m = 7, 8: the groups only (a factorisation refines every multiset each step)
    "full": {**_QUICK, "sizes": tuple(range(2, 33)), "factorized_max_bits": 6,
             "factorized_seeds": (0, 1, 2), "seeds": (0, 1, 2), "max_train_ranks": 3,
             "train_max_bits": 6,
             "kernel": dict(feature_map="table", max_epochs=2000, lr=0.03,
                            stop_tolerance=0.45)},
}


def _settings_key(cfg):
    """What a size's row depends on (a resumed row must match it)."""
    keys = ("search_nodes", "factorized", "factorized_seeds", "factorized_max_bits",
            "kernel", "seeds", "max_train_ranks", "train_max_bits", "pool_max_sequences",
            "sample_size", "sample_seed")
    return json.dumps({k: cfg[k] for k in keys}, sort_keys=True, default=list)


def _lower(recipe, m):
    """The certified rank and its certificate (written to ``m{m}/certificate.json``)."""
    t0 = time.perf_counter()
    res = certify_full_task(m, search_nodes=recipe.cfg["search_nodes"])
    path = None
    if recipe.out is not None:
        path = recipe.out / f"m{m}" / "certificate.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(res.certificate.to_json())
        path = str(path.relative_to(recipe.out))
    pools = pd.DataFrame(res.pools).assign(n_bits=m)
    search = pools.loc[pools["pool"] == "search", "search_exhaustive"]
    return dict(certified_min_rank=res.certified_min_rank,
                lower_method=f"R5 certificate (pool {res.pool})",
                certificate=path, certificate_verified=bool(res.verified),
                search_exhaustive=bool(search.iloc[0]) if len(search) else False,
                certify_time=time.perf_counter() - t0), pools, res.certificate


def _trained(recipe, task, m, lower, best):
    """Trained heads at ranks ``lower - 1 .. best - 1`` (at most ``max_train_ranks``):
    records of every fit (a fit below ``lower`` that solves raises in the sweep). Only
    the estimator of the smallest solving fit is kept (a second sweep of that one fit
    stores it), so the run folder holds records, not every head."""
    cfg = recipe.cfg
    ranks = list(range(max(1, lower - 1), best))[: cfg["max_train_ranks"]]
    if not ranks or m > cfg["train_max_bits"]:
        return [], pd.DataFrame()
    options = dict(name=f"full-task-m{m}", certified_min_rank=lower, ensemble=True,
                   tags={"n_bits": m, "certified_min_rank": lower})
    est = KernelAttentionRegressor(**cfg["kernel"])
    fits = recipe.sweep(est, task.family, task.slot_targets, ranks=ranks,
                        seeds=list(cfg["seeds"]), **options).results
    recs = [dict(method="trained", rank=int(r["rank"]), seed=int(r["seed"]),
                 max_error=float(r["max_abs_error"]), solved=bool(r["solved"]),
                 estimator=None) for _, r in fits.iterrows()]
    solved = [r for r in recs if r["solved"]]
    if solved:
        first = min(solved, key=lambda r: (r["rank"], r["seed"]))
        res = recipe.sweep(est, task.family, task.slot_targets, ranks=[first["rank"]],
                           seeds=[first["seed"]], estimators=True, **options)
        first["estimator"] = next(iter(res.estimators.values()))
    return recs, fits


def _candidates(recipe, task, m, lower):
    """Every candidate head of size ``m`` (records), smallest rank first."""
    cfg = recipe.cfg
    groups = grouped_key_weights(m)
    recs = [dict(method="key-weight groups", rank=groups.rank, seed=None,
                 max_error=groups.max_error, solved=solves(groups.max_error),
                 estimator=key_weight_head(groups))]
    best = groups.rank
    if m <= cfg["factorized_max_bits"] and lower < best:
        for rec in factorized_candidates(task, range(lower, best), cfg["factorized_seeds"],
                                         cfg["factorized"]):
            recs.append(rec)
            if rec["solved"]:
                best = min(best, rec["rank"])
    trained, fits = _trained(recipe, task, m, lower, best)
    recs += trained
    recs.append(dict(method="R3 ceiling", rank=2 ** m, seed=None, max_error=None,
                     solved=True, estimator=None))
    return sorted(recs, key=lambda r: (r["rank"], r["method"])), fits


def _upper(recipe, task, m, recs):
    """The smallest candidate that solves every ordered sequence (checked in order of
    rank), saved to ``solvers/m{m}-rank{r}.safetensors``."""
    for rec in recs:
        ceiling = rec["method"] == "R3 ceiling"
        if not rec["solved"] or (rec["estimator"] is None and not ceiling):
            continue                       # a trained fit whose head was not kept
        est = ceiling_head(m) if ceiling else rec["estimator"]
        path = None
        if recipe.out is not None:
            path = recipe.out / "solvers" / f"m{m}-rank{rec['rank']}.safetensors"
            path.parent.mkdir(parents=True, exist_ok=True)
            est = load_estimator(save_estimator(est, path))
            path = str(path.relative_to(recipe.out))
        err = verify_ordered(est, task.tokens, chunk=recipe.cfg["verify_chunk"])
        rec["ordered_max_error"] = err
        if solves(err):
            return rec, err, path
    raise RuntimeError(f"no candidate head solves every sequence at m = {m}.")


def _best_rank(recs, method):
    ranks = [r["rank"] for r in recs if r["method"] == method and r["solved"]]
    return min(ranks) if ranks else None


def _measure_size(recipe, m, previous=None):
    """The summary row of size ``m``, its pools and candidates, and the trained fits."""
    if m > FULL_TASK_LISTED_BITS:
        return measure_unlisted(recipe, m, previous, _settings_key(recipe.cfg))
    task = make_full_task(m)
    lower, pools, cert = _lower(recipe, m)
    t0 = time.perf_counter()
    recs, fits = _candidates(recipe, task, m, lower["certified_min_rank"])
    rec, err, path = _upper(recipe, task, m, recs)
    _, _, overlap = overlap_record(recipe, m, task)
    row = dict(n_bits=m, n_sequences=task.n_sequences,
               n_ordered_sequences=task.n_ordered_sequences, **lower,
               smallest_solving_rank=rec["rank"], upper_method=rec["method"], solver=path,
               solver_max_error=err, group_rank=_best_rank(recs, "key-weight groups"),
               factorized_rank=_best_rank(recs, "factorisation"),
               trained_rank=_best_rank(recs, "trained"), ceiling_rank=2 ** m, **overlap,
               upper_time=time.perf_counter() - t0, settings_key=_settings_key(recipe.cfg))
    cands = pd.DataFrame([{k: v for k, v in r.items() if k != "estimator"} for r in recs])
    return row, pools, cands.assign(n_bits=m), fits, cert


def _done(recipe):
    """Rows of ``summary.csv`` already in ``out`` with their files, for these settings."""
    path = None if recipe.out is None else recipe.out / "summary.csv"
    if path is None or not path.is_file():
        return {}
    done, key = {}, _settings_key(recipe.cfg)
    for row in pd.read_csv(path).to_dict("records"):
        files = [row.get("certificate"), row.get("solver")]
        if row.get("settings_key") == key and all(
                isinstance(f, str) and (recipe.out / f).is_file() for f in files):
            done[int(row["n_bits"])] = row
    return done


def _read_table(recipe, name):
    path = None if recipe.out is None else recipe.out / f"{name}.csv"
    return pd.read_csv(path) if path is not None and path.is_file() else pd.DataFrame()


def full_task_checks(summary, candidates):
    """The expected behaviours of a run, each True or False: every certificate and flip
    cycle verified, every smallest head checked on all ordered sequences, the lower
    bound never above the smallest solving rank, no head below the lower bound solving,
    and every overlap kernel checked.

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.experiments import full_task_checks
    >>> s = pd.DataFrame(dict(n_bits=[4], certificate_verified=[True], solver_max_error=[0.4],
    ...                       lower_bound=[2], smallest_solving_rank=[2]))
    >>> c = pd.DataFrame(dict(n_bits=[4, 4], rank=[1, 2], solved=[False, True]))
    >>> all(full_task_checks(s, c).values())
    True
    """
    bound = summary.set_index("n_bits")["lower_bound"]
    below = candidates["rank"] < candidates["n_bits"].map(bound)
    return {
        "certificates_verify": bool(summary["certificate_verified"].astype(bool).all()),
        "flip_cycles_verify": bool(summary.get("flip_cycle_verified", pd.Series(
            [True] * len(summary)))[summary["n_bits"] >= 5].astype(bool).all()),
        "solvers_verified_on_every_sequence": bool(
            within_tolerance(pd.to_numeric(summary["solver_max_error"])).all()),
        "bounds_ordered": bool((summary["lower_bound"]
                                <= summary["smallest_solving_rank"]).all()),
        "none_solved_below_bound": bool(not candidates.loc[below, "solved"].astype(bool).any()),
        "overlap_kernels_checked": bool(all(
            within_tolerance(pd.to_numeric(summary[c])).all() for c in
            ("overlap_max_error", "overlap_check_error") if c in summary)),
    }


def _row_text(r):
    exact = str(r["exact"]) == "True"
    ordered = int(r["n_ordered_sequences"])
    return {"m": fmt(r["n_bits"]),
            "sequences": f"{ordered:,}" if ordered < 10**9 else f"2^{3 * int(r['n_bits'])}",
            "lower bound": fmt(r["lower_bound"]),
            "smallest solving (upper)": fmt(r["smallest_solving_rank"]),
            "r*(m)": fmt(r["lower_bound"]) if exact else
            f"open: {fmt(r['lower_bound'])}..{fmt(r['smallest_solving_rank'])}",
            "lower method": (FLIP_METHOD + f"; R5: {fmt(r['certified_min_rank'])}"
                             if r["lower_bound"] > r["certified_min_rank"]
                             else r["lower_method"]), "upper method": r["upper_method"],
            "groups": fmt(r["group_rank"]), "factorisation": fmt(r["factorized_rank"]),
            "trained": fmt(r["trained_rank"]),
            "overlap kernel": f"{fmt(r['overlap_rank'])} (D = {fmt(r['overlap_degree'])})",
            "R3": fmt(r["ceiling_rank"]),
            "max error (all sequences)": fmt(r["solver_max_error"])}


def _markdown(summary, checks, cfg):
    note = ("Lower: the best R4/R5 certificate over named sub-families of the task "
            "(constant-weight layers, codes, witness designs, and an exhaustive search "
            "over (query, key) pairs), lifted to the task and verified against all of it. "
            "Upper: the smallest head verified on every ordered sequence: key-weight "
            "groups (one shared weight vector per group of queries, found by linear "
            "programs), nonnegative factorisations (factorized_kernel_head: "
            + settings_text(cfg["factorized"]) + f", seeds {list(cfg['factorized_seeds'])}, "
            f"m <= {cfg['factorized_max_bits']}), trained table heads ("
            + settings_text(cfg["kernel"]) + f", seeds {list(cfg['seeds'])}, "
            f"m <= {cfg['train_max_bits']}), the R3 head with 2^m features as the ceiling. "
            f"Above m = {FULL_TASK_LISTED_BITS} the task is not listed: the lower bound is "
            f"the best certificate of pools of at most {cfg['pool_max_sequences']:,} "
            "sequences, or the previous size's padded with a zero bit, checked against "
            "every sequence implicitly; the upper bound is the overlap kernel (one "
            "feature per set of at most D bits, D the degree), proved by an exact "
            "check of every (query weight, overlap, overlap) and checked again on "
            f"{cfg['sample_size']:,} random sequences (up to m = {FULL_TASK_LISTED_BITS}: "
            "on every ordered sequence through a table head).\n\n"
            "Growth per bit of token:\n\n" + exponent_lines(bound_exponents(summary)))
    return report("r*(m): the full length-3 task",
                  "Every sequence of three m-bit tokens; r*(m) is the smallest rank of a "
                  "nonnegative kernel head that solves all of them. It is exact where "
                  "the two bounds meet, open between them elsewhere.",
                  display(summary, _row_text), checks, note=note)


def full_task_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                         figures=True, ensemble=False, **settings):
    """``r*(m)`` bounded from both sides on the full length-3 task (:ref:`theory-full-task`).

    Parameters
    ----------
    quick : bool, default=True
        ``SETTINGS["quick"]`` (m = 2..5, 9, 12, 16) or ``["full"]`` (m = 2..32).
    out : str or path, default=None
        Folder for ``summary.csv`` (columns :data:`SUMMARY_COLUMNS`, rewritten as each
        size finishes; ``n_sequences`` counts the multisets of
        :func:`~minip_learn.datasets.make_full_task`, ``n_ordered_sequences`` the
        ``2^(3m)`` sequences they stand for), ``summary.md``, ``pools.csv`` (every pool certified),
        ``candidates.csv`` (every candidate head), ``results.csv`` (the trained fits),
        ``full_task.png``, ``table.csv`` (the table of ``summary.md``), ``growth.csv``
        (bits of rank per bit of token of each bound, least squares with a 95%
        t-interval, over the sizes above 8 bits), per size ``m{m}/certificate.json``
        and ``m{m}/overlap_kernel.json`` (the overlap kernel's exact weights, fractions
        as ``"p/q"`` strings), and up to 8 bits ``solvers/m{m}-rank{r}.safetensors``. A
        size already in ``summary.csv`` with its files present and the same settings
        is not measured again; trained fits go to ``out/runs``. None keeps everything
        in memory.
    n_jobs, devices, progress, figures, ensemble
        As in :func:`~minip_learn.experiments.witness_experiment` (the trained heads of
        a size always train as one batched model).
    **settings
        Overrides of :data:`SETTINGS`: ``sizes``, ``search_nodes``, ``factorized``
        (keyword arguments of :func:`~minip_learn.constructions.factorized_kernel_head`),
        ``factorized_seeds``, ``factorized_max_bits``, ``kernel`` (of
        :class:`~minip_learn.KernelAttentionRegressor`), ``seeds``,
        ``max_train_ranks``, ``train_max_bits``, ``verify_chunk``,
        ``pool_max_sequences`` (the ``max_sequences`` of
        :func:`~minip_learn.theory.certify_full_task` above 8 bits), ``sample_size``
        and ``sample_seed`` (the random sequences the overlap kernel is checked on
        above 8 bits).

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``summary``, ``pools``, ``candidates``, ``results``, ``markdown``, ``checks``
        (:func:`full_task_checks`), ``figures``, ``files``, ``settings``, ``elapsed``.

    Examples
    --------
    >>> from minip_learn.experiments import full_task_experiment
    >>> res = full_task_experiment(sizes=(3, 4), progress=False, figures=False)
    >>> res.summary[["n_bits", "certified_min_rank", "smallest_solving_rank",
    ...              "exact"]].values.tolist()
    [[3, 1, 1, True], [4, 2, 2, True]]
    """
    from tqdm.auto import tqdm

    recipe = Recipe("full_task", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    done = _done(recipe)
    old = {name: _read_table(recipe, name) for name in ("pools", "candidates", "results")}
    rows, pools, cands, fits, previous = [], [], [], [], None
    for m in tqdm(recipe.cfg["sizes"], desc="sizes", unit="size", disable=not progress):
        m = int(m)
        if m in done:                        # resumed: its rows of the other tables too
            rows.append(flip_cycle_record(recipe, dict(done[m])))
            for kept, name in ((pools, "pools"), (cands, "candidates"), (fits, "results")):
                table = old[name]
                kept.append(table[table["n_bits"] == m] if "n_bits" in table else table)
            previous = (m, Certificate.from_file(recipe.out / done[m]["certificate"]),
                        done[m]["lower_method"])
            continue
        row, p, c, f, cert = _measure_size(recipe, m, previous)
        previous = (m, cert, row["lower_method"])
        flip_cycle_record(recipe, row)
        rows.append(row)
        pools.append(p)
        cands.append(c)
        fits.append(f)
        if progress:
            tqdm.write(", ".join(f"{k} {v}" for k, v in _row_text(row).items()))
        _write(recipe, rows, pools, cands, fits)
    summary, pools_df, cand_df, fits_df = _frames(rows, pools, cands, fits)
    checks = full_task_checks(summary, cand_df)
    figs = {"full_task": full_task_figure(summary)} if figures else {}
    return recipe.finish(
        Bunch(summary=summary, pools=pools_df, candidates=cand_df, results=fits_df,
              markdown=_markdown(summary, checks, recipe.cfg), checks=checks, figures=figs),
        table=display(summary, _row_text),
        tables={"pools": pools_df, "candidates": cand_df, "growth": _growth_table(summary)})


def _growth_table(summary):
    """``growth.csv``: bits of rank per bit of token of each bound, with the interval."""
    rows = []
    for name, fit in bound_exponents(summary).items():
        rows.append(dict(bound=name, from_bits=fit.from_bits, n_sizes=fit.n,
                         slope=round(fit.slope, 4), ci_low=round(fit.ci_low, 4),
                         ci_high=round(fit.ci_high, 4)))
    return pd.DataFrame(rows)


def _frames(rows, pools, cands, fits):
    summary = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    concat = [pd.concat([d for d in ds if len(d)], ignore_index=True)
              if any(len(d) for d in ds) else pd.DataFrame() for ds in (pools, cands, fits)]
    return (summary, *concat)


def _write(recipe, rows, pools, cands, fits):
    """Rewrite the tables after each size (``provenance.json`` marked incomplete)."""
    summary, pools_df, cand_df, fits_df = _frames(rows, pools, cands, fits)
    recipe.write_tables(Bunch(results=fits_df, summary=summary,
                              markdown=markdown_table(display(summary, _row_text))),
                        {"pools": pools_df, "candidates": cand_df})
