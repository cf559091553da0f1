"""The full-task recipe above the listed sizes, and its report: the overlap kernel's
record, the unlisted sizes' bounds, the growth exponents and the figure."""

import dataclasses
import json
import time
from fractions import Fraction

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state

from ..theory import (
    certify_full_task,
    flip_cycle,
    full_task_constraint_count,
    full_task_size,
    overlap_kernel,
    overlap_kernel_predict,
    pad_certificate,
    verify_flip_cycle,
    verify_full_task_certificate,
)
from ..theory.full_task import FULL_TASK_LISTED_BITS
from ._full_task_solvers import overlap_head, verify_ordered
from ._scaling_report import growth_fit

__all__ = ["FLIP_METHOD", "bound_exponents", "exponent_lines", "flip_cycle_record",
           "full_task_figure", "measure_unlisted", "overlap_record"]

#: the lower method of a size whose bound comes from an odd flip cycle
FLIP_METHOD = "odd flip cycle (no head of rank 2)"


def flip_cycle_record(recipe, row):
    """Add the rank-2 obstruction to a summary row (measured or resumed): from
    ``m = 5`` an odd flip cycle (:func:`~minip_learn.theory.flip_cycle`) verified on the
    full task and written to ``m{m}/flip_cycle.json``; ``lower_bound`` is the larger of
    the R5 certificate's rank and the 3 it proves (``lower_method`` keeps naming the
    certificate's pool)."""
    m, rank = int(row["n_bits"]), int(row["certified_min_rank"])
    row.setdefault("flip_cycle", None)         # (a resumed row keeps what it read)
    row.update(flip_cycle_verified=False, lower_bound=rank)
    if m >= 5:
        cycle = flip_cycle(m)
        ok = bool(verify_flip_cycle(cycle))
        if recipe.out is not None:
            path = recipe.out / f"m{m}" / "flip_cycle.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({
                "format": "minip-learn flip cycle", "version": 1, "n_bits": m,
                **{k: ["".join(map(str, t)) for t in cycle[k].tolist()]
                   for k in ("queries", "lo", "hi")}}, indent=1))
            row["flip_cycle"] = str(path.relative_to(recipe.out))
        row["flip_cycle_verified"] = ok
        if ok and rank < cycle.rank:
            row["lower_bound"] = cycle.rank
    row["exact"] = bool(row["lower_bound"] == row["smallest_solving_rank"])
    return row


def overlap_record(recipe, m, task=None):
    """The overlap kernel of size ``m`` (:func:`~minip_learn.theory.overlap_kernel`):
    its exact weights written to ``m{m}/overlap_kernel.json``, its rank and exact
    largest error, and a second check: every ordered sequence through a ``table`` head
    where the task is listed, ``sample_size`` random sequences above."""
    kern = overlap_kernel(m)
    path = None
    if recipe.out is not None:
        path = recipe.out / f"m{m}" / "overlap_kernel.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(kernel_json(kern))
        path = str(path.relative_to(recipe.out))
    if task is not None:
        check = "every ordered sequence (table head)"
        err = verify_ordered(overlap_head(kern), task.tokens, chunk=recipe.cfg["verify_chunk"])
    else:
        n = recipe.cfg["sample_size"]
        rng = check_random_state(recipe.cfg["sample_seed"])
        X = rng.randint(0, 2, size=(n, 3, m)).astype(np.int64)
        y = np.einsum("nim,njm->nij", X, X).min(axis=2)
        err = float(np.abs(overlap_kernel_predict(kern, X) - y).max())
        check = f"{n:,} random sequences"
    return kern, path, dict(overlap_rank=kern.rank, overlap_degree=kern.degree,
                            overlap_max_error=kern.max_error, overlap_check=check,
                            overlap_check_error=err)


def kernel_json(kern):
    """An overlap kernel as JSON: exact fractions as ``"p/q"`` strings, no code."""
    def frac(f):
        f = Fraction(f)
        return f"{f.numerator}/{f.denominator}"

    return json.dumps({"format": "minip-learn overlap kernel", "version": 1,
                       "n_bits": kern.n_bits, "degree": kern.degree, "rank": kern.rank,
                       "max_excess": frac(kern.max_excess), "bias": frac(kern.bias),
                       "weights": [[frac(d) for d in ws] for ws in kern.weights]}, indent=1)


def measure_unlisted(recipe, m, previous, settings_key):
    """A size above :data:`~minip_learn.theory.full_task.FULL_TASK_LISTED_BITS`: the best
    certificate of the capped pools or the previous size's padded (``previous``:
    ``(m, certificate, lower_method)``; verified without listing the task), and the
    overlap kernel as the upper bound."""
    t0 = time.perf_counter()
    res = certify_full_task(m, search_nodes=recipe.cfg["search_nodes"],
                            max_sequences=recipe.cfg["pool_max_sequences"])
    cert, method = res.certificate, f"R5 certificate (pool {res.pool})"
    if previous is not None and previous[1].certified_min_rank > res.certified_min_rank:
        cert = dataclasses.replace(pad_certificate(previous[1], m),
                                   n_constraints=full_task_constraint_count(m))
        base, _, padded = previous[2].partition("; padded from m = ")
        method = f"{base}; padded from m = {padded or previous[0]}"
    verified = bool(verify_full_task_certificate(cert, m))
    path = None
    if recipe.out is not None:
        path = recipe.out / f"m{m}" / "certificate.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cert.to_json())
        path = str(path.relative_to(recipe.out))
    pools = pd.DataFrame(res.pools).assign(n_bits=m)
    certify_time, t0 = time.perf_counter() - t0, time.perf_counter()
    kern, solver, overlap = overlap_record(recipe, m)
    row = dict(n_bits=m, n_sequences=full_task_size(m), n_ordered_sequences=2 ** (3 * m),
               certified_min_rank=int(cert.certified_min_rank), lower_method=method,
               certificate=path, certificate_verified=verified,
               search_exhaustive=False,
               smallest_solving_rank=kern.rank,
               upper_method=f"overlap kernel (degree {kern.degree})", solver=solver,
               solver_max_error=kern.max_error, group_rank=None, factorized_rank=None,
               trained_rank=None, ceiling_rank=2 ** m, **overlap, certify_time=certify_time,
               upper_time=time.perf_counter() - t0, settings_key=settings_key)
    cands = pd.DataFrame([dict(method="overlap kernel", rank=kern.rank, seed=None,
                               max_error=kern.max_error, solved=True, n_bits=m),
                          dict(method="R3 ceiling", rank=2 ** m, seed=None, max_error=None,
                               solved=True, n_bits=m)])
    return row, pools, cands, pd.DataFrame(), cert


def bound_exponents(summary, *, min_bits=FULL_TASK_LISTED_BITS + 1):
    """Bits of rank per bit of token: the least-squares slope of ``log2`` of each bound
    against ``m`` with its 95% t-interval (:func:`~minip_learn.experiments.growth_fit`),
    over the sizes from ``min_bits`` (all sizes when fewer than three are there).

    Returns
    -------
    fits : dict
        ``"lower"``, ``"upper"``: a :class:`~sklearn.utils.Bunch` of
        :func:`growth_fit` each, with ``from_bits``.
    """
    m = summary["n_bits"].astype(int)
    keep = m >= min_bits if (m >= min_bits).sum() >= 3 else m >= 0
    out = {}
    for name, col in (("lower", "lower_bound"), ("upper", "smallest_solving_rank")):
        fit = growth_fit(m[keep], summary.loc[keep, col])
        fit["from_bits"] = int(m[keep].min()) if keep.any() else None
        out[name] = fit
    return out


def exponent_lines(fits):
    lines = []
    for name, label in (("lower", "certified (lower)"), ("upper", "smallest solving (upper)")):
        f = fits[name]
        ci = (f"95% CI [{f.ci_low:.3f}, {f.ci_high:.3f}]" if np.isfinite(f.ci_low)
              else "no interval (fewer than 3 sizes)")
        lines.append(f"- {label}: log2(rank) grows {f.slope:.3f} per bit, {ci} "
                     f"(least squares, m = {f.from_bits} and up, n = {f.n} sizes)")
    return "\n".join(lines)


def full_task_figure(summary):
    """log2 of both bounds against ``m``, beside the witness and exact curves of the
    docs' scaling and exact recipes when their tables are there."""
    from pathlib import Path

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    m = summary["n_bits"].to_numpy(int)
    fits = bound_exponents(summary)

    def slope(name):
        f = fits[name]
        if not np.isfinite(f.slope):
            return ""
        ci = f" [{f.ci_low:.2f}, {f.ci_high:.2f}]" if np.isfinite(f.ci_low) else ""
        return f", {f.slope:.2f}{ci} bits/bit from m = {f.from_bits}"

    ax.plot(m, np.log2(summary["lower_bound"].to_numpy(float)), "o-",
            label="full task: certified rank (lower)" + slope("lower"))
    ax.plot(m, np.log2(summary["smallest_solving_rank"].to_numpy(float)), "s-",
            label="full task: smallest solving rank (upper)" + slope("upper"))
    ax.plot(m, m, ":", color="gray", label="R3: 2^m features")
    static = Path(__file__).resolve().parents[2] / "docs" / "_static"
    for folder, col, label in (
            ("scaling", "certified_min_rank", "witness families (N = 3): certified"),
            ("exact", "certified_min_rank", "R9 families (longer N): exact minimum rank")):
        path = static / folder / "summary.csv"
        if path.is_file():
            other = pd.read_csv(path)
            if "exact" in other:
                other = other[other["exact"].astype(str) == "True"]
            ok = pd.to_numeric(other[col], errors="coerce") > 0
            ax.plot(other.loc[ok, "n_bits"], np.log2(other.loc[ok, col].astype(float)),
                    "^--", alpha=0.6, label=label)
    ax.set_xlabel("bits per token m")
    ax.set_ylabel("log2 rank")
    ax.grid(alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=1, fontsize=7)
    fig.subplots_adjust(bottom=0.3)
    return fig
