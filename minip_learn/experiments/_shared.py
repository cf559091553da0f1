"""What every recipe shares: settings, sweeps into ``out/runs``, tables and output files.

Each recipe module (:mod:`~minip_learn.experiments.witness`, ``length``, ``ood``,
``beyond``, ``maps``, ``scaling``) imports this module and no other recipe; the
scaling recipe keeps its searches and its tables in modules of its own
(``_scaling_search``, ``_scaling_report``).
"""

import copy
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..model_selection import check_writable, rank_sweep, resolve_devices

__all__ = ["markdown_table"]


def fmt(value, digits=3):
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if isinstance(value, (float, np.floating)):
        if float(value).is_integer() and abs(value) < 1e6:
            return str(int(value))
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(df, columns=None):
    """A GitHub-markdown table of a DataFrame (no extra dependency).

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.experiments import markdown_table
    >>> print(markdown_table(pd.DataFrame({"rank": [4, 64], "solved": ["0/1", "1/1"]})))
    | rank | solved |
    |---:|---:|
    | 4 | 0/1 |
    | 64 | 1/1 |
    """
    columns = list(df.columns) if columns is None else list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" for _ in columns) + "|"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(fmt(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def display(summary, row):
    """A recipe's displayed table: ``row(r)`` (column name -> shown value) for every
    row ``r`` of ``summary``, in order."""
    return pd.DataFrame([row(r) for _, r in summary.iterrows()])


def theorem_text(applies):
    """The "theorem applies" cell of a displayed table."""
    return "yes" if applies else "no (R7)"


def display_summary(summary):
    """The per-setting summary of :func:`~minip_learn.model_selection.summarize_sweep`
    as shown in ``summary.md``."""
    return display(summary, _summary_row)


def _summary_row(r):
    row = {}
    if "seq_len" in r:
        row["seq_len"] = fmt(r["seq_len"])
    row["model"] = r.get("model", r.get("estimator"))
    fm = r.get("feature_map")
    row["feature map"] = fm if isinstance(fm, str) else "-"
    row["rank"] = fmt(r["rank"]) if "rank" in r else "-"
    row["solved"] = f"{int(r['n_solved'])}/{int(r['n_fits'])}"
    row["solved fraction [95% CI]"] = (
        f"{r['solved_fraction']:.2f} [{r['solved_ci_low']:.2f}, {r['solved_ci_high']:.2f}]")
    row["exact-match"] = fmt(r.get("exact_match_mean"))
    row["max error (median)"] = fmt(r.get("max_abs_error_median"))
    row["epochs"] = fmt(r.get("n_epochs_mean"), 4)
    row["fit time (s)"] = fmt(r.get("fit_time_mean"))
    return row


def report(title, text, table, checks, labels=None, note=None):
    """A recipe's ``summary.md``: title, description, table, an optional note and the
    checks as a task list (``labels``: check name -> text)."""
    lines = [f"## {title}", "", text, "", markdown_table(table), ""]
    if note is not None:
        lines += [note, ""]
    labels = labels or {}
    lines += [f"- [{'x' if ok else ' '}] {labels.get(name, name)}"
              for name, ok in checks.items()]
    return "\n".join(lines)


def settings_text(params):
    return ", ".join(f"{k}={v}" for k, v in params.items())


class Recipe:
    """One run of a recipe: its settings, its sweeps and its output files.

    Creating it starts the clock, checks ``devices`` and that ``out`` can be written
    (before any fit), and merges ``overrides`` into ``defaults["quick" | "full"]``.

    Parameters
    ----------
    name : str
        The recipe (for messages).
    defaults : dict
        ``{"quick": {...}, "full": {...}}``, the recipe's settings.
    quick, out, n_jobs, devices, progress, figures, ensemble
        As in :func:`~minip_learn.experiments.witness_experiment`.
    overrides : dict
        Settings given as keyword arguments (None leaves the default).
    """

    def __init__(self, name, defaults, *, quick, out, n_jobs, devices, progress, figures,
                 ensemble, overrides):
        self.t0 = time.perf_counter()
        resolve_devices(devices)  # fail at once (e.g. CUDA asked for where there is none)
        cfg = copy.deepcopy(defaults["quick" if quick else "full"])
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in cfg:
                raise TypeError(f"{name}_experiment() got an unexpected setting {key!r}; "
                                f"settings: {sorted(cfg)}.")
            if isinstance(cfg[key], dict) and isinstance(value, dict):
                cfg[key].update(value)
            else:
                cfg[key] = value
        self.cfg = cfg
        self.out = None if out is None else Path(out)
        self.runs = None if out is None else check_writable(self.out / "runs")
        self.figures = figures
        self._sweep_options = dict(n_jobs=n_jobs, devices=devices, progress=progress,
                                   ensemble=ensemble)

    def sweep(self, estimator, X, y, *, name, estimators=False, **kwargs):
        """:func:`~minip_learn.model_selection.rank_sweep` into ``out/runs``.

        ``estimators=True`` returns the fitted estimators (saved in the run folder).
        """
        options = {**self._sweep_options, **kwargs}
        return rank_sweep(estimator, X, y, out=self.runs, name=name,
                          return_estimators=estimators,
                          save_estimators=estimators and self.runs is not None, **options)

    def write_tables(self, result, tables=None):
        """Write ``results.csv``, ``summary.csv``, ``summary.md`` and ``tables`` (name ->
        DataFrame, each as ``name.csv``) into ``out``; returns name -> path (empty
        without ``out``)."""
        files = {}
        if self.out is None:
            return files
        self.out.mkdir(parents=True, exist_ok=True)
        files["results"] = self.out / "results.csv"
        result.results.to_csv(files["results"], index=False)
        files["summary_csv"] = self.out / "summary.csv"
        result.summary.to_csv(files["summary_csv"], index=False)
        files["summary_md"] = self.out / "summary.md"
        files["summary_md"].write_text(result.markdown + "\n")
        for name, df in (tables or {}).items():
            files[name] = self.out / f"{name}.csv"
            df.to_csv(files[name], index=False)
        return files

    def finish(self, result, *, table=None, tables=None):
        """Set ``elapsed`` and ``settings``; with ``out``, write the files and close the
        figures. ``table``: a displayed table also written as ``table.csv``;
        ``tables``: more tables (name -> DataFrame), each written as ``name.csv``."""
        result.settings = self.cfg
        result.elapsed = time.perf_counter() - self.t0
        tables = dict(tables or {})
        if table is not None:
            tables["table"] = table
        result.files = self.write_tables(result, tables)
        if self.out is None:
            return result
        import matplotlib.pyplot as plt

        for fig_name, fig in result.figures.items():
            result.files[fig_name] = self.out / f"{fig_name}.png"
            fig.savefig(result.files[fig_name], dpi=120)
            plt.close(fig)
        return result
