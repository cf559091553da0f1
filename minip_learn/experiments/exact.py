"""The exact recipe: the exact minimum rank of the R9 families (:ref:`theory-r9`) across
``m``: per size the family, its certificate (computed and verified in a fresh process)
and the R3 head with one feature per word; the growth of log2 |C| per bit; the certified
rank against the length ``N``; kernel heads trained below, at and above the exact rank.
"""

import json

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from ..compact import load_family
from ..constructions import exact_kernel_realization
from ..datasets import make_witness_suite
from ..estimators import KernelAttentionRegressor, load_estimator, save_estimator
from ..metrics import verify_solver, within_tolerance
from ._exact_sizes import SizeFailed, in_fresh_process
from ._shared import Recipe, display, fmt, markdown_table, report, settings_text

__all__ = []  # public home: the package minip_learn.experiments

#: The columns of ``summary.csv``, one row per size.
SUMMARY_COLUMNS = (
    "n_bits", "code", "seq_len", "n_queries", "n_sequences", "certified_min_rank",
    "constructive_rank", "exact", "suite_params", "certificate", "family", "certify_time",
    "verify_time", "peak_memory", "build_peak_memory", "solver_max_error", "solver_sequences",
    "solver", "error",
)

_QUICK = dict(
    # |C| = 14, 80, 870 at N = 15, 53, 352 (280, 9,520 and 1,134,480 sequences)
    sizes=(8, 12, 16),
    suite=dict(construction="exact", max_sequences=10**8),
    # per size, what replaces the suite's arguments (n_bits -> dict)
    size_suite={},
    # certified rank against N = 3, 4, ... until it meets the constructive rank
    length=dict(hadamard=dict(n_bits=24, construction="hadamard", ladder_gap=None),
                exact=dict(n_bits=12, construction="exact", max_sequences=10**6)),
    max_seq_len=400,
    # trained heads on the exact family of this size at ranks (None: r/2, r-1, r, r+16, 2r)
    transition_bits=12,
    ranks=None,
    seeds=(0,),
    kernel=dict(feature_map="table", max_epochs=2, stop_tolerance=0.5, split_every=None),
    # the R3 head is verified on every sequence of families up to this size, on a seeded
    # uniform sample of solver_sample sequences of larger ones (compact slices; at m = 20
    # one feature per word is 8,164 features)
    verify_max_sequences=10**6,
    solver_sample=4096,
    # the sweep gets the CompactFamily and per-slot targets (else X, y: <= 256 MiB)
    compact_input=True,
)

#: The recipe's grids and training settings: ``SETTINGS["quick"|"full"]``.
SETTINGS = {
    "quick": _QUICK,
    # m = 20: the first 8,164 of the 9,252 words (10^8 sequences at N = 2,291; all
    # 9,252 would take 128,390,004 sequences and about 10 GB to certify)
    "full": {**_QUICK, "sizes": (8, 12, 16, 20), "size_suite": {20: dict(max_sequences=10**8)},
             "suite": dict(construction="exact", max_sequences=10**9), "seeds": (0, 1, 2),
             "verify_max_sequences": 2 * 10**6,
             "kernel": dict(feature_map="table", max_epochs=3000, stop_tolerance=0.5)},
}

def _suite(cfg, m):
    """The keyword arguments of ``make_witness_suite`` for size ``m``."""
    return {**cfg["suite"], **cfg["size_suite"].get(m, {})}


def _construction(recipe, row, family):
    """The R3 head with one feature per word, saved to ``solvers/``, reloaded and
    verified on every sequence of families up to ``verify_max_sequences``, on a seeded
    uniform sample of ``solver_sample`` sequences of larger ones."""
    est = exact_kernel_realization(tokens=family.tokens, seq_len=family.seq_len)
    path = None
    if recipe.out is not None:
        path = recipe.out / "solvers" / f"m{row['n_bits']}-rank{est.rank}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        est = load_estimator(save_estimator(est, path))
    cap, step, n = recipe.cfg["verify_max_sequences"], 1 << 16, len(family)
    rows = (slice(a, a + step) for a in range(0, n, step))  # compact slices: bounded memory
    if cap is not None and n > cap:
        n = min(n, recipe.cfg["solver_sample"])
        sample = np.sort(np.random.default_rng(0).choice(len(family), n, replace=False))
        rows = (sample[a:a + step] for a in range(0, n, step))
    err = max(verify_solver(est, part, part.targets()) for part in map(family.__getitem__, rows))
    return dict(solver_max_error=err, solver_sequences=n,
                solver=None if path is None else str(path.relative_to(recipe.out)))


def _measure_size(recipe, m):
    """The summary row of size ``m`` (with its ``error`` when it runs out of memory)."""
    folder = None if recipe.out is None else recipe.out / f"m{m}"
    try:
        row, family = in_fresh_process(m, _suite(recipe.cfg, m), folder)
    except (MemoryError, SizeFailed) as exc:
        text = str(exc) if isinstance(exc, SizeFailed) else f"MemoryError: {exc}".rstrip(": ")
        return dict(n_bits=m, exact=False, error=text)
    if family is None:
        family = load_family(folder / "family.npz")
    row.update(_construction(recipe, row, family))
    row["error"] = None
    return row


def _done_rows(recipe):
    """Rows of ``summary.csv`` already in ``out`` whose files are present and whose
    suite settings are this run's (None for a size to measure)."""
    path = None if recipe.out is None else recipe.out / "summary.csv"
    done = {}
    rows = pd.read_csv(path).to_dict("records") if path and path.is_file() else []
    for row in rows:
        if isinstance(row.get("error"), str) or not isinstance(row.get("suite_params"), str):
            continue
        params = json.loads(row["suite_params"])
        if any(params.get(k) != v for k, v in _suite(recipe.cfg, int(row["n_bits"])).items()):
            continue
        files = [row[c] for c in ("certificate", "family", "solver") if isinstance(row[c], str)]
        if len(files) == 3 and all((recipe.out / f).is_file() for f in files):
            done[int(row["n_bits"])] = {**row, "error": None}
    return done


def _length_curves(cfg, progress):
    """``length.csv``: the certified rank at N = 3, 4, ... until it meets the
    constructive rank (or ``max_seq_len``), per family of ``cfg["length"]``."""
    from tqdm.auto import tqdm

    rows = []
    for name, kwargs in cfg["length"].items():
        kwargs = dict(kwargs)
        n_bits = kwargs.pop("n_bits")
        for N in tqdm(range(3, cfg["max_seq_len"] + 1), desc=f"length {name} m={n_bits}",
                      unit="N", disable=not progress, leave=False):
            s = make_witness_suite(n_bits, N, **kwargs)
            rows.append(dict(family=name, n_bits=n_bits, seq_len=N,
                             certified_min_rank=int(s.certified_min_rank),
                             constructive_rank=int(s.constructive_rank)))
            if s.certified_min_rank >= s.constructive_rank:
                break
    return pd.DataFrame(rows, columns=["family", "n_bits", "seq_len", "certified_min_rank",
                                       "constructive_rank"])


def _transition(recipe):
    """Kernel heads over ranks around the exact rank of the ``transition_bits`` family
    (a fit below the certified rank that solves raises, see
    :func:`~minip_learn.model_selection.rank_sweep`)."""
    cfg = recipe.cfg
    m = int(cfg["transition_bits"])
    suite = make_witness_suite(m, **_suite(cfg, m))
    bound, r = int(suite.certified_min_rank), int(suite.constructive_rank)
    ranks = cfg["ranks"] or sorted({max(1, r // 2), r - 1, r, r + 16, 2 * r})
    if not cfg["compact_input"] and suite.X is None:
        raise ValueError(f"the m = {m} exact family is not materialised (above 256 MiB): "
                         "choose a smaller transition_bits or compact_input=True.")
    X, y = (suite.family, suite.slot_targets) if cfg["compact_input"] else (suite.X, suite.y)
    N = suite.family.seq_len
    res = recipe.sweep(KernelAttentionRegressor(**cfg["kernel"]), X, y,
                       name=f"exact-m{m}-N{N}", ranks=list(ranks), seeds=list(cfg["seeds"]),
                       certified_min_rank=bound,
                       tags={"model": "kernel", "n_bits": m, "seq_len": N,
                             "certified_min_rank": bound})
    results = res.results
    table = results.groupby("rank").agg(
        seeds=("seed", "size"), n_solved=("solved", "sum"),
        best_max_error=("max_abs_error", "min")).reset_index()
    table.insert(3, "solved_fraction", table["n_solved"] / table["seeds"])
    return Bunch(results=results, table=table, certified_min_rank=bound, rank=r, n_bits=m,
                 seq_len=N)


def _growth(summary, confidence=0.95):
    """``growth.csv``: least-squares slope of log2(exact rank) per bit with its
    t-interval (``df = n - 2``; NaN with fewer than 3 sizes)."""
    from scipy import stats

    s = summary[summary["exact"].astype(str) == "True"]
    x = s["n_bits"].to_numpy(float)
    z = np.log2(pd.to_numeric(s["certified_min_rank"]).to_numpy(float))
    n, nan = len(x), float("nan")
    fit = dict(quantity="exact minimum rank", n=n, sizes=",".join(str(int(v)) for v in x),
               slope=nan, intercept=nan, stderr=nan, df=n - 2 if n >= 3 else nan,
               ci_low=nan, ci_high=nan)
    if n >= 2 and np.ptp(x) > 0:
        lr = stats.linregress(x, z)
        fit.update(slope=float(lr.slope), intercept=float(lr.intercept))
        if n >= 3:
            half = float(stats.t.ppf(0.5 + confidence / 2, n - 2)) * float(lr.stderr)
            fit.update(stderr=float(lr.stderr), ci_low=lr.slope - half,
                       ci_high=lr.slope + half)
    return pd.DataFrame([fit])


def exact_checks(summary, length, results, *, certified_min_rank):
    """The expected behaviours of an exact run, each True or False: every size of
    ``summary`` measured, exact, its certificate verified and its construction solving
    where verified; each ``length`` curve never falling and ending at its constructive
    rank; no fit of ``results`` below ``certified_min_rank`` solving.

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.experiments import exact_checks
    >>> s = pd.DataFrame(dict(error=[None], exact=True, verify_time=1, solver_max_error=0))
    >>> L = pd.DataFrame(dict(family="a", seq_len=[3, 4], certified_min_rank=[2, 3],
    ...                       constructive_rank=3))
    >>> results = pd.DataFrame(dict(rank=[2, 3], solved=[False, True]))
    >>> all(exact_checks(s, L, results, certified_min_rank=3).values())
    True
    """
    ok = summary[summary["error"].isna()]
    err = pd.to_numeric(ok["solver_max_error"], errors="coerce")
    checks = {
        "every_size_measured": bool(len(ok) == len(summary)),
        "exact_at_every_size": bool(len(ok) and (ok["exact"].astype(str) == "True").all()),
        "certificates_verify": bool(pd.to_numeric(ok["verify_time"]).notna().all()),
        "constructions_solve": bool(err.notna().any() and within_tolerance(err.dropna()).all()),
    }
    for name, g in length.groupby("family", sort=False):
        c = g.sort_values("seq_len")["certified_min_rank"].to_numpy()
        checks[f"length_{name}_never_falls"] = bool((np.diff(c) >= 0).all())
        checks[f"length_{name}_meets_constructive"] = bool(
            c[-1] == g.sort_values("seq_len")["constructive_rank"].iloc[-1])
    checks["none_solved_below_bound"] = bool(
        not results.loc[results["rank"] < certified_min_rank, "solved"].any())
    return checks


def _row_text(r):
    ok = not isinstance(r.get("error"), str)
    return {"m": fmt(r["n_bits"]), "N": fmt(r.get("seq_len")),
            "sequences": f"{int(r['n_sequences']):,}" if ok else "-",
            "certified": fmt(r.get("certified_min_rank")),
            "constructive": fmt(r.get("constructive_rank")),
            "exact": ("yes" if str(r["exact"]) == "True" else "no") if ok else "-",
            "certify (s)": fmt(r.get("certify_time")), "verify (s)": fmt(r.get("verify_time")),
            "peak (MB)": fmt(r.get("peak_memory"), 4),
            "build peak (MB)": fmt(r.get("build_peak_memory"), 4),
            "R3 max error": fmt(r.get("solver_max_error")),
            "R3 checked on": fmt(r.get("solver_sequences")), "error": "" if ok else r["error"]}


def _markdown(summary, length, transition, growth, checks, cfg, imported):
    g = growth.iloc[0]
    ci = (f"95% CI [{g['ci_low']:.3f}, {g['ci_high']:.3f}] (t-interval, df = "
          f"{g['df']:.0f})" if np.isfinite(g["ci_low"]) else "no interval (< 3 sizes)")
    meets = "; ".join(f"{name}: rank {int(d['certified_min_rank'].iloc[-1])} at "
                      f"N = {int(d['seq_len'].iloc[-1])}"
                      for name, d in length.groupby("family", sort=False))
    t = transition
    note = "\n\n".join([
        f"log2(exact rank) grows {g['slope']:.3f} per bit over m = {g['sizes']}, {ci}."
        if np.isfinite(g["slope"]) else "Fewer than 2 exact sizes: no growth fit.",
        f"Certified rank against N, where it meets the constructive rank: {meets}.",
        f"Trained heads on the m = {t.n_bits} family (N = {t.seq_len}, exact rank "
        f"{t.rank}): " + settings_text(cfg["kernel"]) + f"; seeds {list(cfg['seeds'])}.\n\n"
        + markdown_table(t.table),
        "peak (MB): peak resident set size (VmHWM) of a fresh process while it certifies "
        "the family it holds (its imports included"
        + (f": {imported:.0f} MB alone in this run" if np.isfinite(imported) else "")
        + "); build peak (MB): the same before, while make_witness_suite builds the family "
        "(with its own certificate and per-slot targets). R3 max error: the head with one "
        f"feature per word, on every sequence of a family up to verify_max_sequences = "
        f"{cfg['verify_max_sequences']}, on a seeded uniform sample of solver_sample = "
        f"{cfg['solver_sample']} sequences of a larger one (R3 checked on: how many)."])
    return report(
        "Exact minimum rank (R9)",
        "Families of R4 sequences over complement-closed constant-weight codes at the "
        "length where the certificate is diagonally dominant: the certified rank equals "
        "the constructive rank |C|, so the minimum rank is exactly |C|.",
        display(summary, _row_text), checks, note=note)


def exact_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                     figures=True, ensemble=False, **settings):
    """The exact minimum rank of the R9 families across ``n_bits`` (:ref:`theory-r9`).

    Parameters
    ----------
    quick : bool, default=True
        ``SETTINGS["exact"]["quick"]`` (sizes 8, 12, 16; one seed of a few epochs) or
        ``["full"]`` (sizes 8, 12, 16, 20; three seeds of up to 3,000 epochs).
    out : str or path, default=None
        Folder for ``summary.csv`` (columns :data:`SUMMARY_COLUMNS`, rewritten as each
        size finishes), ``summary.md``, ``length.csv``, ``results.csv`` (the trained
        fits), ``transition.csv``, ``growth.csv``, ``exact.png``, per size
        ``m{m}/family.npz`` and ``m{m}/certificate.json.gz``, and
        ``solvers/m{m}-rank{r}.safetensors``. A size already in ``summary.csv`` with its
        files present is not measured again; fits go to ``out/runs``. None keeps
        everything in memory.
    n_jobs, devices, progress, figures, ensemble
        As in :func:`~minip_learn.experiments.witness_experiment`.
    **settings
        Overrides: ``sizes``, ``suite`` (keyword arguments of
        :func:`~minip_learn.datasets.make_witness_suite` besides ``n_bits``),
        ``size_suite`` (``n_bits`` -> the arguments that replace ``suite``'s for that
        size: the family of a size is ``make_witness_suite(m, **{**suite,
        **size_suite[m]})``, and ``summary.csv``'s ``suite_params`` rebuilds it),
        ``length`` (family name -> its keyword arguments), ``max_seq_len``,
        ``transition_bits``, ``ranks``, ``seeds``, ``kernel``, ``verify_max_sequences``
        (largest family on which the R3 head is verified on every sequence; None: every
        family), ``solver_sample`` (the sample of a larger family it is verified on) and
        ``compact_input`` (True: the sweep gets the ``CompactFamily`` and per-slot
        targets; False: the materialised sequences, which exist up to 256 MiB).

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``summary``, ``length``, ``results``, ``transition``, ``growth``, ``markdown``,
        ``checks`` (:func:`exact_checks`), ``figures``, ``files``, ``settings``, ``elapsed``.

    Examples
    --------
    >>> from minip_learn.experiments import exact_experiment
    >>> res = exact_experiment(
    ...     sizes=(8,), length={"exact": {"n_bits": 8, "construction": "exact"}},
    ...     transition_bits=8, kernel={"max_epochs": 2}, progress=False, figures=False)
    >>> res.summary[["n_bits", "seq_len", "certified_min_rank", "exact"]].values.tolist()
    [[8, 15, 14, True]]
    """
    recipe = Recipe("exact", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    summary, imported = _measure_sizes(recipe, progress)
    length = _length_curves(recipe.cfg, progress)
    transition = _transition(recipe)
    growth = _growth(summary)
    checks = exact_checks(summary, length, transition.results,
                          certified_min_rank=transition.certified_min_rank)
    markdown = _markdown(summary, length, transition, growth, checks, recipe.cfg,
                         imported)
    figs = {}
    if figures:
        from ..plotting import plot_exact

        figs["exact"] = plot_exact(summary, length)[0].figure
    return recipe.finish(
        Bunch(summary=summary, length=length, results=transition.results,
              transition=transition.table, growth=growth, markdown=markdown,
              checks=checks, figures=figs),
        tables={"length": length, "transition": transition.table, "growth": growth})


def _measure_sizes(recipe, progress):
    """The summary (written as each size finishes) and the measuring processes' memory
    after imports (NaN when all resumed)."""
    from tqdm.auto import tqdm

    done, rows = _done_rows(recipe), []
    for m in tqdm(recipe.cfg["sizes"], desc="sizes", unit="size", disable=not progress):
        m = int(m)
        row = done.get(m) or _measure_size(recipe, m)
        rows.append(row)
        if progress:
            tqdm.write(_progress_line(row, m in done))
        summary = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
        recipe.write_tables(Bunch(results=pd.DataFrame(), summary=summary,
                                  markdown=markdown_table(display(summary, _row_text))))
    imported = [r["import_memory"] for r in rows if "import_memory" in r]
    return (pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS)),
            max(imported) if imported else float("nan"))


def _progress_line(row, resumed):
    return f"m = {row['n_bits']}: " + ", ".join(f"{k} {v}" for k, v in _row_text(row).items()
                                                 if v) + (" (resumed)" if resumed else "")
