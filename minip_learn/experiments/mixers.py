"""The mixers recipe: a state-size leaderboard of sequence mixers on final-query Min-IP.

Every registered mixer (:func:`~minip_learn.nn.available_mixers`, read when the recipe
runs: a mixer registered by a user's module is trained too) is trained as a
:class:`~minip_learn.SequenceMixerRegressor` over a grid of state sizes and seeds on
witness families in final-query form (the query token last, one target per sequence),
whose minimum rank for a normalised nonnegative kernel head is certified (and, for the
exact families of :ref:`theory-r9`, known exactly). For the mixers the theorem covers,
the certified rank is a proven line; for the others the leaderboard measures where
they stand next to it.
"""

import copy

import numpy as np
import pandas as pd
import torch
from sklearn.utils import Bunch

from ..datasets import make_witness_suite
from ..estimators import SequenceMixerRegressor
from ..nn import available_mixers, get_mixer
from ._shared import Recipe, display, fmt, report, settings_text

__all__ = []  # public home: the package minip_learn.experiments

#: the kernel-attention mixers take the table map, the theorem's arbitrary map
_TABLE = {name: {"feature_map": "table"} for name in ("kernel", "retnet", "positional")}

#: The grids and training settings: ``SETTINGS["quick" | "full"]``. ``mixers=None``
#: means every registered mixer; ``state_sizes=None`` the grid :func:`state_grid`
#: around each family's certified rank (``state_factors`` times it, and one below it
#: when ``below_bound``). ``mixer_kwargs``: extra keyword arguments of a mixer, by name.
#: A family's dict holds :func:`~minip_learn.datasets.make_witness_suite` arguments and
#: may override :data:`FAMILY_OPTIONS` for that family.
SETTINGS = {
    # quick: the paper's witness bound at m = 24 (construction="small": 190 sequences
    # of length 3, certified rank 8) in final-query form, in its fixed order and in
    # every order of its keys (280 sequences, a positional certificate)
    "quick": dict(
        families=(dict(n_bits=24, seq_len=3, construction="small"),
                  dict(n_bits=24, seq_len=3, construction="small", orders="all")),
        mixers=None,
        state_sizes=None,
        state_factors=(0.5, 1, 2),
        below_bound=False,
        seeds=(0,),
        mixer=dict(max_epochs=400, stop_tolerance=0.5, lr=0.03, split_every=200),
        mixer_kwargs=_TABLE,
        lr_sweep=False,
        control=False,
    ),
    # full: the exact m = 8 family (exact rank 14) and the exact m = 12 family on the
    # first 20 words of its code (780 sequences of length 14, exact rank 20; one seed);
    # the paper's witness bound at m = 24
    # (``construction="small"``, certified rank 8) in its fixed order and in every order
    # of its keys, where the bound also covers position-dependent maps; the Hadamard
    # family R6 at m = 24 (4,186 sequences of length 3, certified rank 17). The kernel
    # mixers split shared features every 200 epochs (``split_every``, ignored by the
    # other mixers), as the kernel estimators do.
    # and the whole exact m = 12 family in final-query form (12,720 sequences of length
    # 53, exact rank 80: states 40, 79, 80, 160 and 320) with up to 1,500 epochs a fit
    # (the default max_sequences=5000 would keep 4,950 sequences over 50 words); what
    # its fits cost is on docs/performance.rst.
    # Each mixer's learning rate is the one of ``lr_sweep["lrs"]`` that solves most
    # fits of ``lr_sweep["family"]`` at ``lr_sweep["state_factors"]`` times its
    # certified rank (ties: the smaller mean maximum error, then the ``mixer`` lr,
    # then the smaller lr; ``lr_sweep=False``: ``mixer``'s lr). The ``control`` mixer must solve
    # every family named in ``control["families"]`` at some state (it did in the run
    # the docs show); a grid whose control fails there is reported invalid.
    "full": dict(
        families=(
            dict(n_bits=8, construction="exact"),
            dict(n_bits=12, construction="exact", n_queries=20, seeds=(0,)),
            dict(n_bits=24, seq_len=3, construction="small"),
            dict(n_bits=24, seq_len=3, construction="small", orders="all"),
            dict(n_bits=24, seq_len=3, construction="auto",
                 state_factors=(0.5, 1, 2, 4), below_bound=False),
            dict(n_bits=12, construction="exact", max_sequences=10**5,
                 mixer=dict(max_epochs=1500)),
        ),
        mixers=None,
        state_sizes=None,
        state_factors=(0.5, 1, 2, 4),
        below_bound=True,
        seeds=(0, 1, 2),
        mixer=dict(max_epochs=800, stop_tolerance=0.5, lr=0.03, split_every=200),
        mixer_kwargs=_TABLE,
        lr_sweep=dict(family=dict(n_bits=8, construction="exact"), lrs=(0.01, 0.03, 0.1),
                      state_factors=(1, 2), seeds=(0, 1, 2)),
        control=dict(mixer="softmax", families=("exact-m8", "exact-m12-20w", "auto-m24",
                                                "exact-m12")),
    ),
}

#: the settings a family's dict may override for that family (``mixer``: estimator
#: parameters merged over the recipe's)
FAMILY_OPTIONS = ("mixers", "state_sizes", "state_factors", "below_bound", "seeds", "mixer")

#: the kernel-attention mixers, whose state size is a rank: covered on every family
#: (``"yes"``) or on families in every order of their keys (``"positional"``)
KERNEL_THEOREMS = ("yes", "positional")


def state_grid(certified_min_rank, factors=(0.5, 1, 2, 4), *, below_bound=True):
    """State sizes around a certified rank ``b``: ``int(f b)`` for every factor ``f``,
    and ``b - 1`` when ``below_bound``.

    Examples
    --------
    >>> from minip_learn.experiments.mixers import state_grid
    >>> state_grid(14)
    [7, 13, 14, 28, 56]
    >>> state_grid(14, (0.5, 1, 2), below_bound=False)
    [7, 14, 28]
    """
    b = int(certified_min_rank)
    sizes = {int(f * b) for f in factors} | ({b - 1} if below_bound else set())
    return sorted(s for s in sizes if s >= 1)


def _family_name(params):
    name = f"{params.get('construction', 'auto')}-m{params['n_bits']}"
    if params.get("n_queries") is not None:
        name += f"-{params['n_queries']}w"
    return name + ("-every-order" if params.get("orders", "fixed") == "all" else "")


def _proven(theorem, positional):
    """Whether the family's certificate binds a mixer declaring ``theorem``."""
    return theorem == "yes" or (theorem == "positional" and bool(positional))


def mixers_experiment(*, quick=True, out=None, n_jobs=None, devices=None, progress=True,
                      figures=True, ensemble=False, **settings):
    """A leaderboard of sequence mixers: state needed to solve final-query Min-IP.

    For every family of ``families`` (:func:`~minip_learn.datasets.make_witness_suite`
    arguments, built with ``query="last"``) and every mixer of ``mixers``, a
    :class:`~minip_learn.SequenceMixerRegressor` is fitted at every state size and
    seed. Per family and mixer: the theorem's coverage (``"yes"``: proven on the
    theory page for every family; ``"positional"``: proven for families in every order
    of their keys, ``orders="all"``; ``"no"``),
    the certified minimum rank, the smallest state size at which some seed solves
    every sequence (``smallest_solving_state``; for the kernel-attention mixers it is
    their rank, ``smallest_solving_rank``), the floats that state carries from one
    token to the next, the solved fraction over seeds there, and the mean fit time.
    A mixer the proof covers on the family (``"yes"``, or ``"positional"`` on a family
    in every order, whose certificate is positional) that solves below the certified
    rank is a bug: the sweep raises, the check ``no_proven_mixer_solved_below_bound``
    fails and ``minip-learn reproduce mixers`` exits with status 1. Every row says
    whether some fit solved below the certified rank (``solved_below_bound``): a
    finding for the others; for position-dependent maps on a fixed-order family it is
    a measurement about that order, reported in ``summary.md``. The check
    ``recurrent_equals_parallel`` runs each mixer's best fit token by token (its
    recurrent form, a fixed-size state) and compares with its parallel form on the
    family.

    Parameters
    ----------
    quick : bool, default=True
        ``SETTINGS["mixers"]["quick"]`` or ``["full"]``.
    out, n_jobs, devices, progress, figures, ensemble
        As in :func:`~minip_learn.experiments.witness_experiment` (figure:
        ``leaderboard.png``). ``ensemble=True`` trains the seeds and state sizes of
        each family and mixer as batched stacks (one per state size, its seeds
        stacked: :func:`~minip_learn.model_selection.fit_ensemble`).
    **settings
        Overrides: ``families`` (dicts of
        :func:`~minip_learn.datasets.make_witness_suite` arguments, each of which may
        also set :data:`FAMILY_OPTIONS` for its family), ``mixers`` (list of registered names or mixer
        classes, see :class:`~minip_learn.SequenceMixerRegressor`), ``state_sizes`` (list of
        ints, or None for :func:`state_grid` per family), ``state_factors``,
        ``below_bound``, ``seeds``, ``mixer``
        (estimator parameters of every fit), ``mixer_kwargs`` (name -> keyword
        arguments of that mixer), ``lr_sweep`` (a dict of ``family``, ``lrs``,
        ``state_factors`` and ``seeds``: each mixer's learning rate is the one that
        solves most fits there; ``False``: ``mixer``'s ``lr`` for all), ``control``
        (a dict of ``mixer`` and ``families``: the check ``control_solved`` holds when
        the control mixer solves each of those families at some state; ``False``: no
        control).

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`
        ``results`` (one row per fit), ``summary`` (one row per family and mixer:
        ``family``, ``n_bits``, ``seq_len``, ``n_sequences``, ``mixer``, ``theorem``,
        ``proven`` (whether the family's certificate binds the mixer),
        ``certified_min_rank``, ``smallest_solving_state``,
        ``smallest_solving_state_floats``, ``smallest_solving_rank``,
        ``solved_fraction``, ``solved_below_bound``, ``solved_by_state``,
        ``cannot`` (states below a bound proven for the mixer), ``did_not_train``
        (the other states with unsolved seeds), ``lr``, ``lr_sweep`` (the sweep's
        solved fits per rate, or ``"fixed"``), ``fit_time``), ``lr_sweep`` (the
        learning-rate sweep's fits, or None), ``markdown``, ``checks``, ``figures``,
        ``files``, ``settings``, ``elapsed``.

    Examples
    --------
    >>> from minip_learn.experiments import mixers_experiment
    >>> res = mixers_experiment(mixers=["kernel"], state_sizes=[2], mixer={"max_epochs": 5},
    ...                         progress=False, figures=False)
    >>> res.summary[["family", "mixer", "theorem", "certified_min_rank"]].values.tolist()
    [['small-m24', 'kernel', 'yes', 8], ['small-m24-every-order', 'kernel', 'yes', 8]]
    """
    recipe = Recipe("mixers", SETTINGS, quick=quick, out=out, n_jobs=n_jobs,
                    devices=devices, progress=progress, figures=figures, ensemble=ensemble,
                    overrides=settings)
    cfg = recipe.cfg
    families = [_family_settings(cfg, f, settings.get("mixer")) for f in cfg["families"]]
    for _, fcfg in families:        # an unknown mixer name fails before any fit
        for mixer in fcfg["mixers"] or available_mixers():
            _label(mixer)
    suites = []
    for params, _ in families:      # so does a family too large to train on
        suite = make_witness_suite(**params, query="last")
        if suite.X is None:
            raise ValueError(
                f"family {_family_name(params)}: {len(suite.family):,} sequences of length "
                f"{suite.family.seq_len} would take {suite.family.materialized_nbytes:,} "
                "bytes as an array, more than MATERIALIZE_MAX_BYTES; the mixers train on "
                "materialised sequences: lower its max_sequences or n_queries.")
        suites.append(suite)
    every_mixer = {_label(m): m for _, fcfg in families
                   for m in (fcfg["mixers"] or available_mixers())}
    lrs, lr_fits = _learning_rates(recipe, cfg, every_mixer)
    parts, rows, agree = [], [], {}
    for (params, fcfg), suite in zip(families, suites):
        fam = _family_name(params)
        bound = int(suite.certified_min_rank)
        sizes = sorted(int(s) for s in (fcfg["state_sizes"] or state_grid(
            bound, fcfg["state_factors"], below_bound=fcfg["below_bound"])))
        mixers = list(fcfg["mixers"] or available_mixers())
        for mixer, name in zip(mixers, [_label(m) for m in mixers]):
            est = SequenceMixerRegressor(mixer=mixer,
                                         mixer_kwargs=cfg["mixer_kwargs"].get(name),
                                         **{**fcfg["mixer"], "lr": lrs[name][0]})
            res = recipe.sweep(est, suite.X, suite.y, name=f"mixers-{fam}-{name}",
                               param_grid={"state_size": sizes}, seeds=list(fcfg["seeds"]),
                               certified_min_rank=suite.certificate,
                               tags={"mixer": name, "family": fam}, estimators=True)
            fits = res.results.reset_index(drop=True)
            ests = [res.estimators[f] for f in fits["fit_id"]]
            fits["theorem"] = [e.theorem_ for e in ests]
            fits["positional_certificate"] = bool(suite.certificate.positional)
            fits["state_floats"] = [e.state_floats_ for e in ests]
            parts.append(fits)
            rows.append({**_summary_row(suite, fam, name, bound, fits),
                         "lr": lrs[name][0], "lr_sweep": lrs[name][1]})
            agree[f"{fam}/{name}"] = _recurrent_gap(ests, fits, suite.X)
    results = pd.concat(parts, ignore_index=True)
    summary = pd.DataFrame(rows)
    below = (results["state_size"] < results["certified_min_rank"]) & results[
        "solved"].astype(bool)
    proven = [_proven(t, p) for t, p in zip(results["theorem"],
                                            results["positional_certificate"])]
    checks = {
        "no_proven_mixer_solved_below_bound": bool(not below[proven].any()),
        "recurrent_equals_parallel": bool(max(agree.values()) < 1e-6),
    }
    failed = _control_failures(cfg["control"], summary)
    if failed is not None:
        checks["control_solved"] = not failed
    markdown = _markdown(cfg, families, summary, checks, agree, failed)
    figs = {"leaderboard": _figure(results, summary)} if figures else {}
    tables = {} if lr_fits is None else {"lr_sweep": lr_fits}
    return recipe.finish(Bunch(results=results, summary=summary, lr_sweep=lr_fits,
                               markdown=markdown, checks=checks, recurrent_gap=agree,
                               figures=figs),
                         table=display(summary, _display_row), tables=tables)


def _learning_rates(recipe, cfg, mixers):
    """Each mixer's learning rate, ``{label: (lr, how it was chosen)}``, and the
    learning-rate sweep's fits (None without ``lr_sweep``)."""
    default = cfg["mixer"].get("lr", SequenceMixerRegressor().lr)
    sweep = cfg["lr_sweep"]
    if not sweep:
        return {name: (default, "fixed") for name in mixers}, None
    suite = make_witness_suite(**sweep["family"], query="last")
    fam = _family_name(sweep["family"])
    sizes = state_grid(suite.certified_min_rank, sweep["state_factors"], below_bound=False)
    chosen, parts = {}, []
    for name, mixer in mixers.items():
        est = SequenceMixerRegressor(mixer=mixer, mixer_kwargs=cfg["mixer_kwargs"].get(name),
                                     **cfg["mixer"])
        res = recipe.sweep(est, suite.X, suite.y, name=f"lr-{fam}-{name}",
                           param_grid={"lr": list(sweep["lrs"]), "state_size": sizes},
                           seeds=list(sweep["seeds"]), certified_min_rank=suite.certificate,
                           tags={"mixer": name, "family": fam})
        fits = res.results.reset_index(drop=True).assign(mixer=name, family=fam)
        chosen[name] = _pick_lr(fits, default)
        parts.append(fits)
    return chosen, pd.concat(parts, ignore_index=True)


def _pick_lr(fits, default):
    """``(lr, evidence)``: the learning rate solving most fits (ties: the smaller mean
    maximum error, then ``default``, then the smaller rate); the evidence lists each
    rate's solved fits, ``"lr:k/n"``."""
    per_lr = fits.groupby("lr").agg(k=("solved", lambda s: int(s.astype(bool).sum())),
                                    n=("solved", "size"), error=("max_abs_error", "mean"))
    best = min(per_lr.index, key=lambda lr: (-per_lr.loc[lr, "k"], per_lr.loc[lr, "error"],
                                             lr != default, lr))
    return float(best), " ".join(f"{lr:g}:{int(r.k)}/{int(r.n)}" for lr, r in per_lr.iterrows())


def _control_failures(control, summary):
    """The families named in ``control`` on which the control mixer solved nothing
    (None without a control, or when the control mixer or none of its families ran)."""
    if not control:
        return None
    rows = summary[(summary["mixer"] == control["mixer"])
                   & summary["family"].isin(control["families"])]
    if not len(rows):
        return None
    return rows.loc[rows["n_solved"] == 0, "family"].tolist()


def _family_settings(cfg, family, given=None):
    """``(make_witness_suite arguments, settings)`` of one entry of ``families``: the
    recipe's settings with the entry's :data:`FAMILY_OPTIONS` in place (its ``mixer``
    merged over the recipe's, and the caller's ``mixer`` settings, ``given``, over
    both)."""
    if not isinstance(family, dict):
        raise ValueError(f"every entry of families must be a dict of make_witness_suite "
                         f"arguments; got {family!r}.")
    params = {k: v for k, v in family.items() if k not in FAMILY_OPTIONS}
    own = {k: v for k, v in family.items() if k in FAMILY_OPTIONS}
    if "mixer" in own:
        own["mixer"] = {**cfg["mixer"], **own["mixer"], **(given or {})}
    return params, {**cfg, **own}


def _label(mixer):
    """A mixer's name in the tables: its registry name, or its class name."""
    cls = get_mixer(mixer)
    if isinstance(mixer, str):
        return mixer
    return getattr(cls, "name", None) or getattr(mixer, "__name__", type(mixer).__name__)


def _summary_row(suite, fam, name, bound, fits):
    solved = fits["solved"].astype(bool)
    per_state = fits.groupby("state_size")["solved"].agg(["sum", "count"])
    solving = per_state.index[per_state["sum"] > 0]
    smallest = int(solving.min()) if len(solving) else None
    at = fits[fits["state_size"] == smallest] if smallest is not None else fits.iloc[:0]
    theorem = fits["theorem"].iloc[0]
    kernel_like = theorem in KERNEL_THEOREMS
    proven = _proven(theorem, fits["positional_certificate"].iloc[0])
    # a proven mixer cannot solve below the bound; any other unsolved fit did not train
    cannot = [s for s in per_state.index if proven and s < bound]
    untrained = [(s, r["count"] - r["sum"]) for s, r in per_state.iterrows()
                 if s not in cannot and r["sum"] < r["count"]]
    return dict(
        family=fam,
        n_bits=int(suite.X.shape[2]),
        seq_len=int(suite.X.shape[1]),
        n_sequences=int(suite.X.shape[0]),
        mixer=name,
        theorem=theorem,
        proven=proven,
        certified_min_rank=bound,
        smallest_solving_state=smallest,
        smallest_solving_state_floats=(int(at["state_floats"].iloc[0])
                                       if len(at) and at["state_floats"].notna().all()
                                       else None),
        smallest_solving_rank=smallest if kernel_like else None,
        solved_fraction=float(at["solved"].astype(bool).mean()) if len(at) else 0.0,
        solved_below_bound=bool(smallest is not None and smallest < bound),
        solved_by_state=" ".join(f"{s}:{int(r['sum'])}/{int(r['count'])}"
                                 for s, r in per_state.iterrows()),
        cannot=" ".join(str(s) for s in cannot),
        did_not_train=" ".join(f"{s}:{int(k)}/{int(per_state.loc[s, 'count'])}"
                               for s, k in untrained),
        n_solved=int(solved.sum()),
        n_fits=int(len(fits)),
        fit_time=float(fits["fit_time"].mean()),
    )


def _recurrent_gap(ests, fits, X, n=64):
    """Largest |parallel - recurrent| output of the mixer's best fit on ``X[:n]``."""
    best = int(np.argmin(fits["max_abs_error"].to_numpy()))
    net = ests[best].net_
    x = torch.as_tensor(np.asarray(X[:n]), dtype=torch.float64, device=net.device)
    module = copy.deepcopy(net.module_).to(torch.float64)
    with torch.no_grad():
        return float((module(x) - module.recurrent(x)).abs().max())


def _display_row(r):
    return {
        "family": r["family"],
        "mixer": r["mixer"],
        "theorem": r["theorem"],
        "bound proven here": "yes" if r["proven"] else "no",
        "certified rank": fmt(r["certified_min_rank"]),
        "smallest solving state": fmt(r["smallest_solving_state"]),
        "state floats there": fmt(r["smallest_solving_state_floats"]),
        "solved there": fmt(r["solved_fraction"]),
        "below the bound": "yes" if r["solved_below_bound"] else "no",
        "solved per state (k/n)": r["solved_by_state"],
        "cannot: below the proven bound": r["cannot"] or "-",
        "did not train (unsolved/n)": r["did_not_train"] or "-",
        "lr": f"{r['lr']:g}",
        "lr sweep (solved per lr)": r["lr_sweep"],
        "fit time (s)": fmt(r["fit_time"]),
    }


def _markdown(cfg, families, summary, checks, agree, failed):
    fams = ", ".join(
        f"`{r.family}` ({r.n_sequences} sequences of length {r.seq_len}, certified rank "
        f"{r.certified_min_rank})"
        for r in summary.drop_duplicates("family").itertuples())
    own = "".join(f"; `{_family_name(params)}`: " + settings_text(
        {k: v for k, v in fcfg["mixer"].items() if cfg["mixer"].get(k) != v})
        for params, fcfg in families if fcfg["mixer"] != cfg["mixer"])
    sweep = cfg["lr_sweep"]
    lr_text = ("*lr*: the learning rate of every fit of the mixer" if not sweep else
               f"*lr*: the mixer's learning rate, the one of {list(sweep['lrs'])} that "
               f"solved most fits of `{_family_name(sweep['family'])}` at "
               f"{list(sweep['state_factors'])} times its certified rank, seeds "
               f"{list(sweep['seeds'])} (ties: the smaller mean maximum error); "
               "*lr sweep* gives each rate's solved fits (`lr_sweep.csv`)")
    invalid = ("" if not failed else
               f"**INVALID: the control `{cfg['control']['mixer']}` solved nothing on "
               + ", ".join(f"`{f}`" for f in failed) + ", where it solved before; a "
               "failed fit here says nothing about a mixer.** ")
    return report(
        "Sequence mixers on final-query Min-IP: state needed against the certified rank",
        invalid + f"Families in final-query form (the query token last): {fams}. Fits: "
        + settings_text({k: v for k, v in cfg["mixer"].items() if not (sweep and k == "lr")})
        + own + f"; seeds {list(cfg['seeds'])} (unless a family "
        "sets its own: the column *solved per state* counts them). " + lr_text + ". "
        "*Cannot*: states below the certified rank of a mixer the proof covers there; "
        "*did not train*: the other states where some seed did not solve (a failed fit "
        "is not evidence about a mixer). *Theorem*: "
        "'yes' when the lower bound is proven for the mixer (a normalised nonnegative "
        "kernel head; its state size is its rank), 'positional' when it is proven for "
        "families that hold every order of their keys (`-every-order`: position-"
        "dependent maps), 'no' outside it. *Smallest solving state*: the "
        "smallest state size of the grid at which some seed solves every sequence "
        "('-': none); *state floats*: what that state carries from one token to the "
        "next. Largest |parallel - recurrent| output over the fits checked: "
        f"{max(agree.values()):.2g}.",
        display(summary, _display_row), checks, note=_below_note(summary),
        labels={"no_proven_mixer_solved_below_bound":
                "no mixer the proof covers solved below the certified rank",
                "recurrent_equals_parallel":
                "every mixer's recurrent form gives its parallel outputs (within 1e-6)",
                "control_solved":
                f"the control ({(cfg['control'] or {}).get('mixer')}) solved every family "
                "it solved before"})


def _below_note(summary):
    """What solved below the certified rank, by theorem row (None if nothing did)."""
    rows = summary[summary["solved_below_bound"]]
    if not len(rows):
        return None
    found = "; ".join(f"`{r.mixer}` on `{r.family}` at state {fmt(r.smallest_solving_state)} "
                      f"(certified rank {r.certified_min_rank}, theorem: {r.theorem})"
                      for r in rows.itertuples())
    note = f"Solved below the certified rank: {found}."
    if (rows["theorem"] == "positional").any():
        note += (" A fixed-order family's certificate bounds positionless maps; a "
                 "position-dependent map that solves below it uses the order (the "
                 "smaller key of every three-distinct-token sequence at one fixed "
                 "position), which the same family in every order of its keys "
                 "(`-every-order`, a positional certificate) takes away.")
    return note


def _figure(results, summary):
    import matplotlib.pyplot as plt

    fams = list(dict.fromkeys(summary["family"]))
    ncols = min(3, len(fams))
    nrows = -(-len(fams) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols + 2.2, 4.0 * nrows + 0.6),
                             layout="constrained", squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(fams):]:
        ax.set_axis_off()
    markers = "osD^vP*Xh"
    for ax, fam in zip(axes, fams):
        part = results[results["family"] == fam]
        bound = int(summary.loc[summary["family"] == fam, "certified_min_rank"].iloc[0])
        groups = list(part.groupby("mixer", sort=True))
        for i, (name, g) in enumerate(groups):
            frac = g.groupby("state_size")["solved"].apply(lambda s: s.astype(bool).mean())
            theorem = g["theorem"].iloc[0]
            # a small horizontal offset per mixer keeps coinciding points visible
            shift = 2.0 ** (0.04 * (i - (len(groups) - 1) / 2))
            ax.plot(frac.index * shift, frac.to_numpy(), marker=markers[i % len(markers)],
                    color=f"C{i}", linestyle="-" if theorem in KERNEL_THEOREMS else "--",
                    label=f"{name} ({theorem})")
        ax.axvline(bound, color="k", linestyle=":", label="certified rank")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("state size (rank / key dimension)")
        ax.set_ylabel("solved fraction over seeds")
        ax.set_title(f"{fam} (certified rank {bound})")
    axes[ncols - 1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Final-query Min-IP: solved fraction against state size\n"
                 "(solid: kernel attention, covered on every family or in every order; "
                 "dashed: others)")
    return fig
