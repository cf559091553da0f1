"""Figures of the phase transition (matplotlib).

* :func:`plot_phase_transition` -- solved fraction and exact-match vs feature rank
  (log2 axis), with the certified bound and the constructive rank as vertical lines and
  dense softmax as a horizontal reference.
* :func:`plot_length_transition` -- the same per sequence length (1, 2, 3, ...).
* :func:`plot_ood_transition` -- held-out exact-match vs rank, one curve per problem
  scale (disjoint train/test token pools), dense softmax per scale as a reference.
* :func:`plot_variant_sweep` -- solved fraction vs rank for model variants (signed
  maps, several heads/layers, nonlinear readouts) against a certified bound.
* :func:`plot_rank_sandwich` -- rank against the number of bits ``m`` (log axis): the
  band between the certified and the smallest solving rank, the constructive rank, the
  softmax score dimension and the design bound as a dashed calculation, beside the
  exact minimum rank of the long-sequence families (:ref:`theory-r9`).
* :func:`plot_exact` -- the exact minimum rank of the R9 families against ``m`` (log2
  axis, with its fitted growth line) beside the certified rank against the sequence
  length ``N`` (:ref:`theory-r9`).
* :func:`plot_kernel_heatmap` -- a fitted kernel head's matrix ``alpha(x_i, k_j)`` on a
  witness suite's queries and designated keys (the approximate identity of :ref:`theory-r5`).

Each function draws on ``ax`` (a new figure when None) and returns the axes
(:func:`plot_exact`: on a pair ``axes`` and returns the pair).
:mod:`matplotlib.pyplot` is imported only when a function is called.
"""

import numpy as np

__all__ = ["kernel_matrix", "plot_exact", "plot_kernel_heatmap", "plot_length_transition",
           "plot_ood_transition", "plot_phase_transition", "plot_rank_sandwich",
           "plot_variant_sweep"]


#: The parameters and return value every plotting function shares.
_AXES_DOC = """ax : matplotlib Axes, default=None
        Axes to draw on; None draws on a new figure.
    title : str, default=None
        Title; None uses the plot's own.

    Returns
    -------
    ax : matplotlib Axes
        The axes drawn on."""


def _plot_doc(func):
    """Complete ``func``'s docstring with the shared ``ax``/``title``/``Returns`` part."""
    func.__doc__ = func.__doc__.replace("%(axes)s", _AXES_DOC)
    return func


def _axes(ax, figsize=(6.4, 4.2)):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _split_reference(summary):
    """Rows with a rank (kernel) and rows without one (softmax reference)."""
    if "rank" not in summary:
        raise ValueError("summary has no 'rank' column; pass summarize_sweep(...) output.")
    has_rank = summary["rank"].notna()
    return summary[has_rank], summary[~has_rank]


def _series_label(row, columns):
    parts = [str(row[c]) for c in columns if c in row and row[c] == row[c]]
    return " ".join(parts)


@_plot_doc
def plot_phase_transition(
    summary,
    *,
    certified_min_rank=None,
    constructive_rank=None,
    show_exact_match=True,
    ax=None,
    title=None,
):
    """Solved fraction (with its confidence band) and exact-match vs feature rank.

    Parameters
    ----------
    summary : pandas.DataFrame
        Output of :func:`~minip_learn.model_selection.summarize_sweep`: rows with a
        ``rank`` are kernel fits (one line per ``feature_map``/``model``); rows whose
        ``rank`` is missing (a softmax head) are drawn as horizontal references.
    certified_min_rank : int, default=None
        Drawn as a vertical line (no nonnegative kernel head below it can solve the
        family). None reads it from the ``certified_min_rank`` column when present.
    constructive_rank : int, default=None
        Drawn as a vertical line (a rank that provably suffices, see :ref:`theory-r3`).
    show_exact_match : bool, default=True
        Also draw the mean sequence exact-match (dashed).
    %(axes)s

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.plotting import plot_phase_transition
    >>> summary = pd.DataFrame({
    ...     "rank": [4, 16, 64, None], "solved_fraction": [0, 0, 1, 1],
    ...     "solved_ci_low": [0, 0, .5, .5], "solved_ci_high": [.5, .5, 1, 1],
    ...     "exact_match_mean": [.4, .7, 1, 1], "model": ["kernel"] * 3 + ["softmax"]})
    >>> ax = plot_phase_transition(summary, certified_min_rank=17, constructive_rank=46)
    >>> ax.get_xscale()
    'log'
    """
    kernel, reference = _split_reference(summary)
    ax = _axes(ax, figsize=(9.0, 4.4))
    if certified_min_rank is None and "certified_min_rank" in summary:
        vals = summary["certified_min_rank"].dropna()
        certified_min_rank = int(vals.iloc[0]) if len(vals) else None
    series_cols = [c for c in ("model", "feature_map", "seq_len") if c in kernel]
    groups = kernel.groupby(series_cols, dropna=False, sort=False) if series_cols else [
        ((), kernel)]
    colors = iter(["C0", "C2", "C4", "C5", "C6", "C8", "C9"])
    for key, g in groups:
        g = g.sort_values("rank")
        color = next(colors, None)
        label = " ".join(str(k) for k in (key if isinstance(key, tuple) else (key,))
                         if k == k) or "kernel"
        r = g["rank"].to_numpy(float)
        ax.plot(r, g["solved_fraction"], "o-", color=color, label=f"{label}: solved fraction")
        if {"solved_ci_low", "solved_ci_high"} <= set(g):
            ax.fill_between(r, g["solved_ci_low"], g["solved_ci_high"], color=color,
                            alpha=0.15, linewidth=0)
        if show_exact_match and "exact_match_mean" in g:
            ax.plot(r, g["exact_match_mean"], "s--", color=color, alpha=0.7, markersize=4,
                    label=f"{label}: exact-match")
    for _, row in reference.iterrows():
        label = _series_label(row, ("model", "estimator")) or "softmax"
        n = f" ({int(row['n_solved'])}/{int(row['n_fits'])} seeds)" if "n_fits" in row else ""
        ax.axhline(row["solved_fraction"], color="C3", linestyle="-", linewidth=1.5,
                   label=f"{label}: solved fraction{n}")
        if show_exact_match and "exact_match_mean" in row and row["exact_match_mean"] != row[
                "solved_fraction"]:
            ax.axhline(row["exact_match_mean"], color="C3", linestyle=":",
                       label=f"{label}: exact-match")
    if certified_min_rank is not None:
        ax.axvline(certified_min_rank, color="k", linestyle="--", linewidth=1,
                   label=f"certified bound r >= {certified_min_rank}")
    if constructive_rank is not None:
        ax.axvline(constructive_rank, color="0.5", linestyle="-.", linewidth=1,
                   label=f"constructive rank {constructive_rank}")
    return _format_rank_axis(ax, kernel["rank"], "fraction",
                             title or "Phase transition: exact solving vs feature rank")


@_plot_doc
def plot_length_transition(summary, *, certified_min_rank=None, ax=None, title=None):
    """Solved fraction vs rank, one line per sequence length (``seq_len`` column).

    Lengths 1 and 2 are solved at rank 1 (see :ref:`theory-r1`); length 3 needs a rank above the
    certified bound of its family.

    Parameters
    ----------
    summary : pandas.DataFrame
        :func:`~minip_learn.model_selection.summarize_sweep` output with ``seq_len``
        and ``rank`` columns.
    certified_min_rank : int or dict, default=None
        Certified bound (or ``{seq_len: bound}``) drawn as vertical lines; None reads
        the ``certified_min_rank`` column when present.
    %(axes)s

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.plotting import plot_length_transition
    >>> summary = pd.DataFrame({"seq_len": [1, 1, 3, 3], "rank": [1, 8, 1, 8],
    ...                         "solved_fraction": [1, 1, 0, 1]})
    >>> len(plot_length_transition(summary).get_lines())
    2
    """
    if "seq_len" not in summary:
        raise ValueError("summary has no 'seq_len' column.")
    kernel, _ = _split_reference(summary)
    ax = _axes(ax, figsize=(8.5, 4.4))
    bounds = {}
    if isinstance(certified_min_rank, dict):
        bounds = dict(certified_min_rank)
    elif certified_min_rank is not None:
        bounds = {None: certified_min_rank}
    elif "certified_min_rank" in kernel:
        for n, g in kernel.groupby("seq_len"):
            vals = g["certified_min_rank"].dropna()
            if len(vals) and vals.iloc[0] > 1:
                bounds[n] = int(vals.iloc[0])
    for i, (n, g) in enumerate(kernel.groupby("seq_len", sort=True)):
        g = g.sort_values("rank")
        r = g["rank"].to_numpy(float)
        # identical curves (lengths 1 and 2 are both solved everywhere) stay visible:
        # hollow markers shrinking with the length, dash patterns differing
        ax.plot(r, g["solved_fraction"], marker="osD^v"[i % 5], markersize=max(4, 11 - 2.5 * i),
                fillstyle="none" if i % 2 == 0 else "full", linestyle=["-", "--", ":"][i % 3],
                color=f"C{i}", label=f"seq_len = {n}")
        if {"solved_ci_low", "solved_ci_high"} <= set(g):
            ax.fill_between(r, g["solved_ci_low"], g["solved_ci_high"], color=f"C{i}",
                            alpha=0.08, linewidth=0)
    for n, b in bounds.items():
        where = "" if n is None else f" (seq_len = {n})"
        ax.axvline(b, color="k", linestyle="--", linewidth=1,
                   label=f"certified bound r >= {b}{where}")
    return _format_rank_axis(
        ax, kernel["rank"], "solved fraction",
        title or "Length transition: seq_len 1-2 at rank 1, seq_len 3 needs more")


def _format_rank_axis(ax, ranks, ylabel, title):
    """Shared layout of the rank plots: log2 rank axis ticked at the ranks, [0, 1] fractions."""
    ax.set_xscale("log", base=2)
    ranks = sorted(set(ranks.astype(int)))
    if ranks:
        ax.set_xticks(ranks, [str(r) for r in ranks])
        ax.minorticks_off()
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("feature rank r (log2)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.grid(True, alpha=0.3)
    return ax


def kernel_matrix(estimator, queries, keys, *, normalize="diagonal"):
    """Kernel matrix ``alpha(q_a, k_b)`` of a fitted kernel-attention estimator.

    Parameters
    ----------
    estimator : fitted KernelAttentionRegressor
        Its head is ``estimator.net_.module_`` (it must have ``kernel(queries, keys)``).
    queries, keys : array-like of shape (n, n_bits)
    normalize : {"diagonal", "row", None}, default="diagonal"
        ``"diagonal"`` divides row ``a`` by ``alpha(q_a, k_a)`` (the matrix B of
        :ref:`theory-r5`: unit diagonal, off-diagonal below ``eps`` for a solving head); ``"row"``
        divides by the row sum (attention weights); None returns the raw values (up to
        a positive scale per row).

    Returns
    -------
    K : ndarray of shape (n_queries, n_keys)

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.plotting import kernel_matrix
    >>> from minip_learn.constructions import exact_kernel_realization
    >>> suite = make_witness_suite(construction="small")
    >>> est = exact_kernel_realization(tokens=suite.tokens)
    >>> B = kernel_matrix(est, suite.queries, suite.designated_keys)
    >>> B.shape, bool((B.diagonal() == 1).all())
    ((10, 10), True)
    """
    import torch

    module = getattr(getattr(estimator, "net_", None), "module_", None)
    if module is None or not hasattr(module, "kernel"):
        raise ValueError("estimator must be a fitted kernel-attention estimator "
                         "(its net_.module_ needs a kernel(queries, keys) method).")
    param = next(module.parameters())
    q = torch.as_tensor(np.asarray(queries), dtype=param.dtype, device=param.device)
    k = torch.as_tensor(np.asarray(keys), dtype=param.dtype, device=param.device)
    with torch.no_grad():
        K = module.kernel(q, k).detach().cpu().to(torch.float64).numpy()
    if normalize == "diagonal":
        if K.shape[0] != K.shape[1]:
            raise ValueError("normalize='diagonal' needs as many keys as queries.")
        d = np.diag(K).copy()
        d[d == 0] = np.nan
        K = K / d[:, None]
    elif normalize == "row":
        s = K.sum(axis=1, keepdims=True)
        s[s == 0] = np.nan
        K = K / s
    elif normalize is not None:
        raise ValueError(f"normalize must be 'diagonal', 'row' or None; got {normalize!r}.")
    return K


@_plot_doc
def plot_kernel_heatmap(estimator, queries, keys, *, normalize="diagonal", log=True,
                        ax=None, title=None):
    """Heatmap of a fitted head's kernel on a suite's queries and designated keys.

    For a witness suite (``suite.queries``, ``suite.designated_keys``) a solving
    nonnegative head must make the diagonal-normalised matrix an approximate identity
    (off-diagonal entries below ``eps``, see :ref:`theory-r5`); its rank is then at least the
    certified bound.

    Parameters
    ----------
    estimator : fitted KernelAttentionRegressor
    queries, keys : array-like of shape (n, n_bits)
    normalize : {"diagonal", "row", None}, default="diagonal"
        See :func:`kernel_matrix`.
    log : bool, default=True
        Colour by ``log10`` of the (nonnegative) values.
    %(axes)s

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.plotting import plot_kernel_heatmap
    >>> from minip_learn.constructions import exact_kernel_realization
    >>> suite = make_witness_suite(construction="small")
    >>> ax = plot_kernel_heatmap(exact_kernel_realization(tokens=suite.tokens),
    ...                          suite.queries, suite.designated_keys, log=False)
    >>> ax.images[0].get_array().shape == (len(suite.queries),) * 2
    True
    """
    K = kernel_matrix(estimator, queries, keys, normalize=normalize)
    ax = _axes(ax, figsize=(6.0, 5.0))
    label = {"diagonal": "alpha(x_i, k_j) / alpha(x_i, k_i)",
             "row": "attention weight", None: "alpha(x_i, k_j)"}[normalize]
    values = K
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.log10(np.where(K > 0, K, np.nan))
        floor = np.nanmin(values) if np.isfinite(values).any() else 0.0
        values = np.where(np.isnan(values), floor, values)
        label = f"log10 {label}"
    im = ax.imshow(values, cmap="viridis", interpolation="nearest")
    ax.figure.colorbar(im, ax=ax, label=label, shrink=0.85)
    ax.set_xlabel("designated key k_j")
    ax.set_ylabel("query x_i")
    rank = getattr(estimator, "rank", None)
    ax.set_title(title or f"Kernel matrix of a fitted head (rank {rank})")
    return ax


@_plot_doc
def plot_ood_transition(summary, *, threshold=None, ax=None, title=None):
    """Held-out exact-match vs feature rank, one curve per problem scale.

    Parameters
    ----------
    summary : pandas.DataFrame
        ``ood_experiment(...).summary``: columns ``scale``, ``n_bits``, ``n_tokens``,
        ``model``, ``rank``, ``test_exact_match`` and optionally
        ``test_exact_match_min``. Kernel rows (with a rank) are drawn as lines (the band
        spans the worst seed), softmax rows (no rank) as dotted horizontal lines in the
        colour of their scale.
    threshold : float, default=None
        Test exact-match counted as the jump, drawn as a thin horizontal line.
    %(axes)s

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.plotting import plot_ood_transition
    >>> summary = pd.DataFrame({
    ...     "scale": [0, 0, 0], "n_bits": [8, 8, 8], "n_tokens": [128] * 3,
    ...     "model": ["kernel", "kernel", "softmax"], "rank": [4, 16, None],
    ...     "test_exact_match": [0.6, 1.0, 1.0]})
    >>> ax = plot_ood_transition(summary, threshold=0.95)
    >>> ax.get_xscale()
    'log'
    """
    ax = _axes(ax, figsize=(9.0, 4.4))
    kernel, reference = _split_reference(summary)
    for i, (scale, g) in enumerate(kernel.groupby("scale", sort=True)):
        g = g.sort_values("rank")
        r = g["rank"].to_numpy(float)
        row = g.iloc[0]
        label = f"m = {int(row['n_bits'])}, {int(row['n_tokens'])} tokens"
        ax.plot(r, g["test_exact_match"], "o-", color=f"C{i}", label=f"kernel, {label}")
        if "test_exact_match_min" in g:
            ax.fill_between(r, g["test_exact_match_min"], g["test_exact_match"],
                            color=f"C{i}", alpha=0.15, linewidth=0)
        ref = reference[reference["scale"] == scale]
        if len(ref):
            ax.axhline(float(ref["test_exact_match"].mean()), color=f"C{i}", linestyle=":",
                       label=f"softmax, {label}")
    if threshold is not None:
        ax.axhline(threshold, color="0.6", linewidth=0.8, label=f"jump threshold {threshold}")
    ax = _format_rank_axis(ax, kernel["rank"], "exact-match on the held-out token pool",
                           title or "Out-of-distribution scaling (disjoint token pools)")
    return ax


@_plot_doc
def plot_variant_sweep(summary, *, metric="exact_match", certified_min_rank=None, ax=None,
                       title=None):
    """Exact-match (or solved fraction) vs feature rank, one curve per model variant.

    Parameters
    ----------
    summary : pandas.DataFrame
        ``beyond_experiment(...).summary``: columns ``variant``, ``rank``,
        ``solved_fraction`` and optionally ``theorem_applies`` (variants outside the
        theorem are drawn dashed and labelled so) and ``n_solved``/``n_fits`` (a rank
        where every fit solved the family gets a filled marker, otherwise a hollow one).
    metric : str, default="exact_match"
        Column on the y axis (``"solved_fraction"`` for the solved fraction).
    certified_min_rank : int, default=None
        Vertical line: below it no single nonnegative head with an affine readout can
        solve the family (see :ref:`theory-r5`).
    %(axes)s

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.plotting import plot_variant_sweep
    >>> summary = pd.DataFrame({
    ...     "variant": ["baseline", "baseline", "2 heads", "2 heads"],
    ...     "rank": [4, 16, 4, 16], "solved_fraction": [0, 1, 0.5, 1],
    ...     "exact_match": [0.7, 1, 0.9, 1], "theorem_applies": [True, True, False, False]})
    >>> ax = plot_variant_sweep(summary, certified_min_rank=8)
    >>> len(ax.get_lines())
    3
    """
    ax = _axes(ax, figsize=(9.0, 4.4))
    markers = "osD^v<>pP*X"
    for i, (name, g) in enumerate(summary.groupby("variant", sort=False)):
        g = g.sort_values("rank")
        inside = bool(g["theorem_applies"].all()) if "theorem_applies" in g else True
        label = name if inside else f"{name} (outside the theorem)"
        r, y = g["rank"].to_numpy(float), g[metric].to_numpy(float)
        color, marker = f"C{i % 10}", markers[i % 11]
        ax.plot(r, y, linestyle="-" if inside else "--", color=color, label=label,
                marker=marker, fillstyle="none")
        if {"n_solved", "n_fits"} <= set(g):
            done = (g["n_solved"] == g["n_fits"]).to_numpy()
            ax.plot(r[done], y[done], linestyle="none", marker=marker, color=color)
    if certified_min_rank is not None:
        ax.axvline(certified_min_rank, color="k", linestyle="--", linewidth=1,
                   label=f"certified bound r >= {certified_min_rank}")
    ax = _format_rank_axis(ax, summary["rank"], metric.replace("_", "-") + (
        " (filled: solved)" if "n_solved" in summary else ""),
        title or "Variants vs the certified bound")
    if metric != "solved_fraction":
        ax.set_ylim(None, 1.02)
    return ax


@_plot_doc
def plot_rank_sandwich(summary, *, design=None, exact=None, ax=None, title=None):
    """Rank against ``n_bits`` (log axis): the band between the certified and the
    smallest solving rank, the constructive rank, the softmax score dimension, the
    design bound as a dashed calculation and, when given, the exact minimum rank of
    the long-sequence families of :ref:`theory-r9`.

    The sandwich's labels name the sequence length of its suites (``length 3: ...``)
    when the ``suite_params`` of every row give the same ``seq_len``.

    Parameters
    ----------
    summary : pandas.DataFrame
        One row per size (the ``summary`` of
        :func:`~minip_learn.experiments.scaling_experiment`): ``n_bits``,
        ``certified_min_rank``, ``smallest_solving_rank``, ``constructive_rank`` and,
        optionally, ``softmax_score_dim`` and ``suite_params``.
    design : pandas.DataFrame, default=None
        :func:`~minip_learn.theory.bound_table` output (``n_bits``,
        ``certified_min_rank``), drawn dashed and labelled as a calculation.
    exact : pandas.DataFrame, default=None
        The ``summary`` of :func:`~minip_learn.experiments.exact_experiment`
        (``n_bits``, ``certified_min_rank``, ``exact`` and, optionally, ``seq_len``):
        its exact rows are drawn as the curve "exact minimum rank, long sequences
        (R9)", each point marked with its rank and sequence length; rows that are not
        exact, or have no rank, are left out. None draws no such curve.
    %(axes)s

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.plotting import plot_rank_sandwich
    >>> summary = pd.DataFrame({"n_bits": [8, 16], "certified_min_rank": [2, 8],
    ...                         "smallest_solving_rank": [2, 30],
    ...                         "constructive_rank": [4, 30], "softmax_score_dim": [8, 16]})
    >>> exact = pd.DataFrame({"n_bits": [8, 12], "certified_min_rank": [14, 80],
    ...                       "seq_len": [15, 53], "exact": [True, True]})
    >>> ax = plot_rank_sandwich(summary, exact=exact)
    >>> ax.get_yscale(), ax.get_lines()[-1].get_label()
    ('log', 'exact minimum rank, long sequences (R9)')
    """
    import pandas as pd

    ax = _axes(ax, figsize=(7.2, 4.6))
    s = summary.sort_values("n_bits")
    m = s["n_bits"].to_numpy(float)
    lower = pd.to_numeric(s["certified_min_rank"], errors="coerce").to_numpy(float)
    upper = pd.to_numeric(s["smallest_solving_rank"], errors="coerce").to_numpy(float)
    ok = np.isfinite(upper)
    n = _suite_seq_len(s)
    at = "" if n is None else f"length {n}: "
    ax.fill_between(m[ok], lower[ok], upper[ok], color="C0", alpha=0.18, linewidth=0,
                    label=f"{at}sandwich, the minimum rank lies here")
    ax.plot(m, lower, "o-", color="C0", label=f"{at}certified bound (lower)")
    ax.plot(m[ok], upper[ok], "s-", color="C3",
            label=f"{at}smallest verified solving rank (upper)")
    # hollow and larger: stays visible where the upper bound equals it
    ax.plot(m, s["constructive_rank"].to_numpy(float), "^:", color="C2", markersize=11,
            fillstyle="none", label=f"{at}construction, one feature per token")
    if "softmax_score_dim" in s:
        ax.plot(m, s["softmax_score_dim"].to_numpy(float), "d-.", color="C4",
                label="softmax score dimension (= m)")
    if design is not None and len(design):
        d = design.sort_values("n_bits")
        ax.plot(d["n_bits"], d["certified_min_rank"], "--", color="0.35",
                label=f"{at}design bound (calculation, not materialised)")
    if exact is not None:
        _plot_exact_curve(ax, exact)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("bits per token m")
    ax.set_ylabel("feature rank (log2)")
    ax.set_title(title or "Rank needed by nonnegative kernel attention")
    ax.grid(True, which="major", alpha=0.3)
    # every curve rises with m: the lower right corner is free
    ax.legend(fontsize=8, loc="lower right")
    return ax


def _suite_seq_len(summary):
    """The ``seq_len`` shared by the ``suite_params`` (JSON) of every row; None when a
    row has none or they differ."""
    import json

    if "suite_params" not in summary or not len(summary):
        return None
    lengths = {json.loads(p).get("seq_len") if isinstance(p, str) else None
               for p in summary["suite_params"]}
    return lengths.pop() if len(lengths) == 1 and None not in lengths else None


def _plot_exact_curve(ax, exact):
    """The exact rows of an exact-recipe summary: rank against ``n_bits``, each point
    marked with its rank and sequence length."""
    import pandas as pd

    missing = [c for c in ("n_bits", "certified_min_rank", "exact") if c not in exact]
    if missing:
        raise ValueError(f"exact has no column {missing[0]!r}; pass the summary of "
                         "exact_experiment (its summary.csv).")
    e = exact.sort_values("n_bits")
    rank = pd.to_numeric(e["certified_min_rank"], errors="coerce").to_numpy(float)
    ok = np.isfinite(rank) & (rank > 0) & e["exact"].astype(str).isin(["True", "true", "1"])
    m, r = e["n_bits"].to_numpy(float)[ok], rank[ok]
    lengths = e["seq_len"].to_numpy()[ok] if "seq_len" in e else [None] * len(m)
    ax.plot(m, r, "o-", color="k", linewidth=2, markersize=6,
            label="exact minimum rank, long sequences (R9)")
    for mi, ri, ni in zip(m, r, lengths):
        text = f"{int(ri):,}" + ("" if ni is None else f" (N = {int(ni):,})")
        ax.annotate(text, (mi, ri), textcoords="offset points", xytext=(-6, 4),
                    ha="right", fontsize=7)


def plot_exact(summary, length, *, axes=None, title=None):
    """The exact minimum rank against ``n_bits`` beside the certified rank against ``N``.

    Left: the exact minimum rank of the R9 families (:ref:`theory-r9`; certified rank =
    constructive rank) against ``n_bits`` on a log2 axis, with the least-squares line
    of ``log2(rank)`` on ``n_bits`` (its slope in the legend). Right: the certified
    rank against the sequence length ``N`` for each family of ``length``, with the
    family's constructive rank dashed: the certified rank rises with ``N`` until the
    two meet.

    Parameters
    ----------
    summary : pandas.DataFrame
        One row per size (the ``summary`` of
        :func:`~minip_learn.experiments.exact_experiment`): ``n_bits``,
        ``certified_min_rank``, ``constructive_rank`` and ``exact`` (rows that are not
        exact, or have no rank, are left out of the left panel).
    length : pandas.DataFrame
        Columns ``family``, ``n_bits``, ``seq_len``, ``certified_min_rank`` and
        ``constructive_rank`` (one row per family and length).
    axes : sequence of two matplotlib Axes, default=None
        Axes to draw on; None draws on a new figure with two panels.
    title : str, default=None
        Title of the figure; None uses the plot's own.

    Returns
    -------
    axes : ndarray of two matplotlib Axes
        The left (exact rank against ``n_bits``) and right (certified rank against
        ``N``) panels.

    Examples
    --------
    >>> import pandas as pd
    >>> from minip_learn.plotting import plot_exact
    >>> summary = pd.DataFrame({"n_bits": [8, 12, 16], "certified_min_rank": [14, 80, 870],
    ...                         "constructive_rank": [14, 80, 870], "exact": [True] * 3})
    >>> length = pd.DataFrame({"family": ["exact"] * 3, "n_bits": [8] * 3,
    ...                        "seq_len": [3, 4, 5], "certified_min_rank": [3, 9, 14],
    ...                        "constructive_rank": [14] * 3})
    >>> left, right = plot_exact(summary, length)
    >>> left.get_yscale(), len(right.get_lines())
    ('log', 2)
    """
    import pandas as pd

    if axes is None:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.4), layout="constrained")
    left, right = axes
    s = summary.sort_values("n_bits")
    rank = pd.to_numeric(s["certified_min_rank"], errors="coerce").to_numpy(float)
    ok = np.isfinite(rank) & (rank > 0) & s["exact"].astype(str).isin(["True", "true", "1"])
    m, r = s["n_bits"].to_numpy(float)[ok], rank[ok]
    left.plot(m, r, "o", color="C0", markersize=7, label="exact minimum rank |C|")
    for mi, ri in zip(m, r):
        left.annotate(f"{int(ri)}", (mi, ri), textcoords="offset points", xytext=(6, -10),
                      fontsize=8)
    if len(m) >= 2:
        slope, intercept = np.polyfit(m, np.log2(r), 1)
        grid = np.linspace(m.min(), m.max(), 50)
        left.plot(grid, 2.0 ** (intercept + slope * grid), "-", color="C0", alpha=0.6,
                  label=f"fit: log2 rank = {intercept:.2f} + {slope:.3f} m")
    left.set_yscale("log", base=2)
    left.set_xlabel("bits per token m")
    left.set_ylabel("minimum feature rank")
    left.set_title("Exact minimum rank (certified = constructive)")
    left.grid(True, which="major", alpha=0.3)
    left.legend(fontsize=8, loc="upper left")
    _plot_length_curves(right, length)
    if title:
        left.figure.suptitle(title)
    return np.asarray([left, right], dtype=object)


def _plot_length_curves(ax, length):
    """Right panel of :func:`plot_exact`: certified rank vs ``N`` per family."""
    for i, (name, g) in enumerate(length.groupby(["family", "n_bits"], sort=False)):
        g = g.sort_values("seq_len")
        label = f"{name[0]} (m = {name[1]})"
        ax.plot(g["seq_len"], g["certified_min_rank"], "o-", color=f"C{i}", markersize=3,
                label=f"{label}: certified")
        ax.plot(g["seq_len"], g["constructive_rank"], "--", color=f"C{i}", linewidth=1,
                label=f"{label}: constructive")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("feature rank")
    ax.set_title("Certified rank rises with N to the constructive rank")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
