"""What every recipe shares: settings, sweeps into ``out/runs``, tables and output files.

Every output folder also gets ``provenance.json`` (:meth:`Recipe.provenance`): the
library version, the git commit of the package's checkout, the command, the settings,
the date and the machine of the run.

Each recipe module (:mod:`~minip_learn.experiments.witness`, ``length``, ``ood``,
``beyond``, ``maps``, ``scaling``) imports this module and no other recipe; the
scaling recipe keeps its searches and its tables in modules of its own
(``_scaling_search``, ``_scaling_report``).
"""

import contextlib
import contextvars
import copy
import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..model_selection import check_writable, jsonable, rank_sweep, resolve_devices

__all__ = ["markdown_table", "recorded_command"]

#: The command line recorded in provenance.json (None: a Python call, described there)
_COMMAND = contextvars.ContextVar("minip_learn_command", default=None)


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


@contextlib.contextmanager
def recorded_command(command):
    """Record ``command`` as the command line of the recipes run inside the block.

    Each recipe writes ``provenance.json`` into its output folder; its ``command`` is
    the text given here (``minip-learn reproduce`` passes the command line as typed),
    and outside such a block a description of the Python call, such as
    ``ood_experiment(quick=True, out='results/ood')``.

    Parameters
    ----------
    command : str
        The command line, e.g. ``"minip-learn reproduce length --quick"``.

    Yields
    ------
    command : str

    Examples
    --------
    >>> from minip_learn.experiments import recorded_command, run_experiment
    >>> with recorded_command("minip-learn reproduce length --quick"):
    ...     res = run_experiment("length", seq_lens=(1,), ranks=(1,), seeds=(0,),
    ...                          progress=False, figures=False)
    >>> res.provenance["command"]
    'minip-learn reproduce length --quick'
    """
    token = _COMMAND.set(str(command))
    try:
        yield command
    finally:
        _COMMAND.reset(token)


def git_state(folder):
    """``(commit, dirty)`` of the git checkout that tracks ``folder``: the commit of
    ``HEAD`` and whether ``git status --porcelain`` lists a change inside ``folder``;
    ``(None, None)`` without git, without a checkout or when ``folder`` is not tracked
    in it (an installed copy of the package)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}

    def git(*args):
        return subprocess.run(["git", *args], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=20, check=True).stdout

    try:
        git("ls-files", "--error-unmatch", "__init__.py")
        commit = git("rev-parse", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--", ".").strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None, None
    return commit or None, dirty


def _python_call(name, quick, out, options, overrides):
    """The recipe call as text: ``ood_experiment(quick=True, out='res/ood', ...)``."""
    args = {"quick": quick}
    if out is not None:
        args["out"] = os.fspath(out)
    args.update((k, v) for k, v in options.items() if v is not None)
    args.update((k, v) for k, v in overrides.items() if v is not None)
    return f"{name}_experiment(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"


def settings_text(params):
    return ", ".join(f"{k}={v}" for k, v in params.items())


class Recipe:
    """One run of a recipe: its settings, its sweeps and its output files.

    Creating it starts the clock, checks ``devices`` and that ``out`` can be written
    (before any fit), and merges ``overrides`` into ``defaults["quick" | "full"]``.
    Every write of the tables writes ``provenance.json`` beside them
    (:meth:`provenance`).

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
        self.name, self.quick = name, bool(quick)
        self.started = datetime.datetime.now(datetime.UTC)
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
        self.options = dict(n_jobs=n_jobs, devices=devices, ensemble=ensemble,
                            figures=figures)
        self.command = _COMMAND.get() or _python_call(
            name, quick, out, {**self.options, "figures": None if figures else False},
            overrides)
        self.git = git_state(Path(__file__).resolve().parents[1])
        self.n_computed = self.n_resumed = 0

    def sweep(self, estimator, X, y, *, name, estimators=False, **kwargs):
        """:func:`~minip_learn.model_selection.rank_sweep` into ``out/runs``.

        ``estimators=True`` returns the fitted estimators (saved in the run folder).
        """
        options = {**self._sweep_options, **kwargs}
        res = rank_sweep(estimator, X, y, out=self.runs, name=name,
                         return_estimators=estimators,
                         save_estimators=estimators and self.runs is not None, **options)
        self.n_computed += res.n_computed
        self.n_resumed += res.n_resumed
        return res

    def provenance(self, *, complete=True):
        """Where this run's files came from, as written to ``provenance.json``.

        Keys: ``recipe``, ``grid`` (``"quick"`` or ``"full"``), ``command`` (the
        command line as typed, see :func:`recorded_command`, or the Python call),
        ``complete`` (False while a recipe rewrites its tables during the run),
        ``minip_learn_version``, ``git_commit`` and ``git_dirty`` (see
        :func:`git_state`; None without a checkout), ``started_utc``, ``written_utc``
        (ISO 8601), ``elapsed_s``, ``fits_computed`` and ``fits_resumed`` (fits of the
        sweeps computed in this run / read from ``out/runs``), ``cpu_count``,
        ``platform``, ``python_version``, ``torch_version``, ``options`` (``n_jobs``,
        ``devices``, ``ensemble``, ``figures``) and ``settings`` (the merged settings).
        """
        import torch

        from .. import __version__

        now = datetime.datetime.now(datetime.UTC)
        return {
            "recipe": self.name,
            "grid": "quick" if self.quick else "full",
            "command": self.command,
            "complete": bool(complete),
            "minip_learn_version": __version__,
            "git_commit": self.git[0],
            "git_dirty": self.git[1],
            "started_utc": self.started.isoformat(timespec="seconds"),
            "written_utc": now.isoformat(timespec="seconds"),
            "elapsed_s": round(time.perf_counter() - self.t0, 1),
            "fits_computed": self.n_computed,
            "fits_resumed": self.n_resumed,
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python_version": platform.python_version(),
            "torch_version": torch.__version__,
            "options": jsonable(self.options, sort_keys=False),
            "settings": jsonable(self.cfg, sort_keys=False),
        }

    def write_provenance(self, *, complete=True):
        """Write :meth:`provenance` to ``out/provenance.json``; returns the path (None
        without ``out``)."""
        if self.out is None:
            return None
        path = self.out / "provenance.json"
        path.write_text(json.dumps(self.provenance(complete=complete), indent=2) + "\n")
        return path

    def write_tables(self, result, tables=None):
        """Write ``results.csv``, ``summary.csv``, ``summary.md``, ``tables`` (name ->
        DataFrame, each as ``name.csv``) and ``provenance.json`` (marked incomplete until
        :meth:`finish`) into ``out``; returns name -> path (empty without ``out``)."""
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
        files["provenance"] = self.write_provenance(complete=False)
        return files

    def finish(self, result, *, table=None, tables=None):
        """Set ``elapsed``, ``settings`` and ``provenance``; with ``out``, write the files
        (``provenance.json`` last) and close the figures. ``table``: a displayed table
        also written as ``table.csv``; ``tables``: more tables (name -> DataFrame), each
        written as ``name.csv``."""
        result.settings = self.cfg
        result.elapsed = time.perf_counter() - self.t0
        tables = dict(tables or {})
        if table is not None:
            tables["table"] = table
        result.files = self.write_tables(result, tables)
        if self.out is None:
            result.provenance = self.provenance()
            return result
        import matplotlib.pyplot as plt

        provenance = result.files.pop("provenance")
        for fig_name, fig in result.figures.items():
            result.files[fig_name] = self.out / f"{fig_name}.png"
            fig.savefig(result.files[fig_name], dpi=120)
            plt.close(fig)
        result.provenance = self.provenance()
        provenance.write_text(json.dumps(result.provenance, indent=2) + "\n")
        result.files["provenance"] = provenance
        return result
