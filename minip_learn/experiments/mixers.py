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
from ._mixers_report import (
    control_failures,
    display_row,
    family_name,
    leaderboard_figure,
    mixers_markdown,
    pick_lr,
    proven_here,
    summary_row,
)
from ._shared import Recipe, display

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
    # family R6 at m = 24 (4,186 sequences of length 3, certified rank 17); and the
    # whole exact m = 12 family in final-query form (12,720 sequences of length 53,
    # exact rank 80: states 40, 79, 80, 160 and 320) with up to 1,500 epochs a fit (the
    # default max_sequences=5000 would keep 4,950 sequences over 50 words; what its fits
    # cost is on docs/performance.rst). The kernel mixers split shared features every
    # 200 epochs (``split_every``, ignored by the other mixers), as the kernel
    # estimators do.
    # Each mixer's learning rate is the one of ``lr_sweep["lrs"]`` that solves most
    # fits of ``lr_sweep["family"]`` at ``lr_sweep["state_factors"]`` times its
    # certified rank (ties: the smaller mean maximum error, then the ``mixer`` lr,
    # then the smaller lr; ``lr_sweep=False``: ``mixer``'s lr). The ``control`` mixer
    # must solve every family named in ``control["families"]`` at some state (it did in
    # the run the docs show); a grid whose control fails there is reported invalid.
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
                f"family {family_name(params)}: {len(suite.family):,} sequences of length "
                f"{suite.family.seq_len} would take {suite.family.materialized_nbytes:,} "
                "bytes as an array, more than MATERIALIZE_MAX_BYTES; the mixers train on "
                "materialised sequences: lower its max_sequences or n_queries.")
        suites.append(suite)
    every_mixer = {_label(m): m for _, fcfg in families
                   for m in (fcfg["mixers"] or available_mixers())}
    lrs, lr_fits = _learning_rates(recipe, cfg, every_mixer)
    parts, rows, agree = [], [], {}
    for (params, fcfg), suite in zip(families, suites):
        fam = family_name(params)
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
            rows.append({**summary_row(suite, fam, name, bound, fits),
                         "lr": lrs[name][0], "lr_sweep": lrs[name][1]})
            agree[f"{fam}/{name}"] = _recurrent_gap(ests, fits, suite.X)
    results = pd.concat(parts, ignore_index=True)
    summary = pd.DataFrame(rows)
    below = (results["state_size"] < results["certified_min_rank"]) & results[
        "solved"].astype(bool)
    proven = [proven_here(t, p) for t, p in zip(results["theorem"],
                                                results["positional_certificate"])]
    checks = {
        "no_proven_mixer_solved_below_bound": bool(not below[proven].any()),
        "recurrent_equals_parallel": bool(max(agree.values()) < 1e-6),
    }
    failed = control_failures(cfg["control"], summary)
    if failed is not None:
        checks["control_solved"] = not failed
    markdown = mixers_markdown(cfg, families, summary, checks, agree, failed)
    figs = {"leaderboard": leaderboard_figure(results, summary)} if figures else {}
    tables = {} if lr_fits is None else {"lr_sweep": lr_fits}
    return recipe.finish(Bunch(results=results, summary=summary, lr_sweep=lr_fits,
                               markdown=markdown, checks=checks, recurrent_gap=agree,
                               figures=figs),
                         table=display(summary, display_row), tables=tables)


def _learning_rates(recipe, cfg, mixers):
    """Each mixer's learning rate, ``{label: (lr, how it was chosen)}``, and the
    learning-rate sweep's fits (None without ``lr_sweep``)."""
    default = cfg["mixer"].get("lr", SequenceMixerRegressor().lr)
    sweep = cfg["lr_sweep"]
    if not sweep:
        return {name: (default, "fixed") for name in mixers}, None
    suite = make_witness_suite(**sweep["family"], query="last")
    fam = family_name(sweep["family"])
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
        chosen[name] = pick_lr(fits, default)
        parts.append(fits)
    return chosen, pd.concat(parts, ignore_index=True)


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


def _recurrent_gap(ests, fits, X, n=64):
    """Largest |parallel - recurrent| output of the mixer's best fit on ``X[:n]``."""
    best = int(np.argmin(fits["max_abs_error"].to_numpy()))
    net = ests[best].net_
    x = torch.as_tensor(np.asarray(X[:n]), dtype=torch.float64, device=net.device)
    module = copy.deepcopy(net.module_).to(torch.float64)
    with torch.no_grad():
        return float((module(x) - module.recurrent(x)).abs().max())
