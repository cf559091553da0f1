"""The length recipe: one token set at sequence lengths 1, 2 and 3.

Lengths 1 and 2 are solved at rank 1 (see :ref:`theory-r1`); length 3, a witness suite,
needs a rank above its certified bound.
"""

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from ..datasets import make_witness_suite, minip_targets
from ..estimators import KernelAttentionRegressor
from ..model_selection import summarize_sweep
from ._shared import Recipe, display_summary, report, settings_text

__all__ = []  # public home: the package minip_learn.experiments

#: The grids and training settings: ``SETTINGS["quick" | "full"]``.
SETTINGS = {
    "quick": dict(
        suite=dict(n_bits=24, seq_len=3, construction="small"),
        seq_lens=(1, 2, 3),
        ranks=(1, 2, 4, 8, 16, 32),
        seeds=(0,),
        kernel=dict(feature_map="table", max_epochs=800, stop_tolerance=0.5),
    ),
    "full": dict(
        suite=dict(n_bits=24, seq_len=3, construction="small"),
        seq_lens=(1, 2, 3),
        ranks=(1, 2, 4, 8, 16, 32, 64),
        seeds=(0, 1, 2),
        kernel=dict(feature_map="table", max_epochs=3000, stop_tolerance=0.5),
    ),
}


def _length_family(tokens, seq_len, suite):
    """All sequences of length 1 or 2 over ``tokens``; the witness suite for 3+."""
    if seq_len >= 3:
        return suite.X, suite.y, int(suite.certified_min_rank)
    if seq_len == 1:
        X = tokens[:, None, :]
    else:
        n = len(tokens)
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        X = np.stack([tokens[i.ravel()], tokens[j.ravel()]], axis=1)
    return X, minip_targets(X), None


def length_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                      figures=True, ensemble=False, **settings):
    """Length transition: one token set at sequence lengths 1, 2, 3.

    Length 1 uses every token of a witness suite, length 2 every ordered pair, length 3
    the suite itself. Lengths 1 and 2 are solved at rank 1 (see :ref:`theory-r1`); length
    3 is certified to need ``certified_min_rank`` features.

    Parameters
    ----------
    quick : bool, default=True
        ``SETTINGS["length"]["quick"]`` or ``["full"]``.
    out, n_jobs, devices, progress, figures, ensemble
        As in :func:`~minip_learn.experiments.witness_experiment` (figure:
        ``length_transition.png``).
    **settings
        Overrides: ``suite``, ``seq_lens``, ``ranks``, ``seeds``, ``kernel``.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``results``, ``summary`` (per ``seq_len`` and ``rank``), ``markdown``,
        ``checks``, ``certified_min_rank`` (of length 3), ``figures``, ``files``,
        ``settings``, ``elapsed``.

    Examples
    --------
    >>> from minip_learn.experiments import length_experiment
    >>> res = length_experiment(seq_lens=(1,), ranks=(1,), kernel={"max_epochs": 5},
    ...                         progress=False, figures=False)
    >>> res.summary[["seq_len", "rank", "n_fits"]].values.tolist()
    [[1, 1, 1]]
    """
    recipe = Recipe("length", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    cfg = recipe.cfg
    suite = make_witness_suite(**cfg["suite"])
    tag = f"length-{suite.construction}-m{suite.X.shape[2]}"
    parts, bounds = [], {}
    for n in cfg["seq_lens"]:
        X, y, bound = _length_family(suite.tokens, int(n), suite)
        if int(n) > suite.X.shape[1]:
            raise ValueError(f"seq_len {n} > the suite's length {suite.X.shape[1]}; "
                             "set suite={'seq_len': ...}.")
        bounds[int(n)] = bound
        res = recipe.sweep(
            KernelAttentionRegressor(**cfg["kernel"]), X, y, name=f"{tag}-N{n}",
            ranks=list(cfg["ranks"]), seeds=list(cfg["seeds"]), certified_min_rank=bound,
            tags={"model": "kernel", "seq_len": int(n), "n_sequences": len(X)})
        parts.append(res.results)
    results = pd.concat(parts, ignore_index=True)
    summary = summarize_sweep(results, by=["seq_len", "model", "feature_map", "rank"])

    def solved_at(n, r):
        g = results[(results["seq_len"] == n) & (results["rank"] == r)]
        return bool(len(g) and g["solved"].all())

    checks = {}
    for n in (1, 2):
        if n in bounds and 1 in cfg["ranks"]:
            checks[f"seq_len_{n}_solved_at_rank_1"] = solved_at(n, 1)
    long = [n for n in bounds if n >= 3]
    for n in long:
        g = results[results["seq_len"] == n]
        checks[f"seq_len_{n}_none_solved_below_bound"] = bool(
            not g.loc[g["rank"] < bounds[n], "solved"].any())
        checks[f"seq_len_{n}_solved_at_some_rank"] = bool(g["solved"].any())
    markdown = report(
        "Length transition",
        f"Tokens of the `{suite.construction}` witness suite ({len(suite.tokens)} tokens, "
        f"{suite.X.shape[2]} bits): length 1 = every token, length 2 = every ordered pair, "
        f"length {suite.X.shape[1]} = the suite ({len(suite.X)} sequences, certified "
        f"minimum rank **{suite.certified_min_rank}**). Kernel: "
        + settings_text(cfg["kernel"]) + f"; seeds {list(cfg['seeds'])}.",
        display_summary(summary), checks)
    figs = {}
    if figures:
        from ..plotting import plot_length_transition

        ax = plot_length_transition(summary, certified_min_rank={
            n: b for n, b in bounds.items() if b is not None})
        figs["length_transition"] = ax.figure
    return recipe.finish(Bunch(
        results=results, summary=summary, markdown=markdown, checks=checks,
        certified_min_rank=int(suite.certified_min_rank), figures=figs))
