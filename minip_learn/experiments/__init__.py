"""Reproduction recipes: the phase transition on witness suites and beyond the paper.

Eight experiments, each a function returning a :class:`~sklearn.utils.Bunch` and writing
its tables and figures when given an output folder:

* :func:`witness_experiment` -- kernel heads over feature ranks (and seeds) on an
  m = 24 witness suite against dense softmax over seeds (see :ref:`theory-witness`):
  nothing solved below the certified bound, solved at some rank up to the constructive
  one, softmax solved for every seed.
* :func:`length_experiment` -- the same tokens at sequence lengths 1, 2, 3: lengths 1
  and 2 are solved at rank 1 (see :ref:`theory-r1`), length 3 needs a rank above its
  certified bound.
* :func:`ood_experiment` -- out-of-distribution scaling over disjoint token pools.
* :func:`beyond_experiment` -- signed maps, several heads or layers and nonlinear
  readouts against the certified bound (see :ref:`theory-r7`).
* :func:`maps_experiment` -- a leaderboard of every registered feature map: rank
  needed on a witness suite, theorem flag, out-of-distribution exact-match.
* :func:`exact_experiment` -- the exact minimum rank of the R9 families across ``m``
  (certified rank = constructive rank, see :ref:`theory-r9`), the certified rank
  against the sequence length, and kernel heads trained around the exact rank.
* :func:`mixers_experiment` -- a state-size leaderboard of sequence mixers (causal
  kernel attention, RetNet, linear attention, GLA, DeltaNet, a selective SSM, causal
  softmax) on final-query witness families, against their certified rank.
* :func:`scaling_experiment` -- the rank sandwich across the number of bits ``m``:
  certified bound, smallest verified solving rank (trained heads and nonnegative
  factorisations, :func:`~minip_learn.constructions.factorized_kernel_head`) and
  constructive rank, beside dense softmax with ``m``-dimensional scores.

All numbers (ranks, seeds, epochs, feature map ...) live in :data:`SETTINGS`, one
``"quick"`` and one ``"full"`` entry per experiment; keyword arguments override them.
Each recipe is a module of this package (``witness``, ``length``, ``ood``, ``beyond``,
``maps``, ``scaling``, ``exact``, ``mixers``)
with its own ``SETTINGS``; what they share is in one helpers module. The fits of a run
go to ``out/runs`` (see the docs page "Results folders and failures"), and every output
folder holds ``provenance.json``: library version, git commit, command
(:func:`recorded_command`), settings, date and machine of the run.

``minip-learn reproduce ...`` (:mod:`minip_learn.cli`) calls these functions;
:data:`DOCS_ARTIFACTS` lists the docs' figures and tables that they write, which
``minip-learn reproduce docs-artifacts`` regenerates.
"""

import importlib

__all__ = [
    "EXPERIMENTS",
    "SETTINGS",
    "beyond_experiment",
    "exact_checks",
    "exact_experiment",
    "full_task_checks",
    "full_task_experiment",
    "growth_fit",
    "length_experiment",
    "maps_experiment",
    "markdown_table",
    "mixers_experiment",
    "ood_experiment",
    "run_experiment",
    "scaling_checks",
    "scaling_experiment",
    "witness_experiment",
]

#: Names accepted by :func:`run_experiment` (and ``minip-learn reproduce``).
EXPERIMENTS = ("witness", "length", "ood", "beyond", "maps", "scaling", "exact", "mixers",
               "full_task")

#: The recipe outputs committed under the docs' ``_static`` folder, in the order
#: ``minip-learn reproduce docs-artifacts`` regenerates them: name -> ``experiment``,
#: ``quick`` (the grid), ``folder`` (under ``docs/_static``), ``minutes`` (about
#: how long the run takes on 2 cores) and, optionally, ``ensemble`` (its sweeps
#: trained as stacks, as ``--ensemble`` does; without it, the recipe's default: stacks
#: for ``scaling`` only). Each runs with the recipe's
#: ``SETTINGS``.
DOCS_ARTIFACTS = {
    "witness-quick": dict(experiment="witness", quick=True, folder="witness-quick",
                          minutes=0.5),
    "ood": dict(experiment="ood", quick=True, folder="extended/ood", minutes=2),
    "beyond": dict(experiment="beyond", quick=True, folder="extended/beyond", minutes=1),
    "maps": dict(experiment="maps", quick=True, folder="extended/maps", minutes=1.5),
    "mixers": dict(experiment="mixers", quick=False, folder="extended/mixers",
                   minutes=250, ensemble=True),
    # before "scaling": the scaling figure draws the exact curve from exact/summary.csv
    "exact": dict(experiment="exact", quick=False, folder="exact", minutes=35),
    "scaling-quick": dict(experiment="scaling", quick=True, folder="scaling/quick",
                          minutes=1),
    "scaling": dict(experiment="scaling", quick=False, folder="scaling", minutes=10),
    # after "exact" and "scaling": its figure draws their curves from their summaries
    "full-task": dict(experiment="full_task", quick=False, folder="full-task", minutes=55),
}


#: The recipe modules, imported on first use (PEP 562): the command line reads
#: :data:`EXPERIMENTS` and :data:`DOCS_ARTIFACTS` without importing torch.
_LAZY = {
    "beyond_experiment": "beyond",
    "exact_checks": "exact",
    "exact_experiment": "exact",
    "full_task_checks": "full_task",
    "full_task_experiment": "full_task",
    "growth_fit": "scaling",
    "length_experiment": "length",
    "maps_experiment": "maps",
    "markdown_table": "_shared",
    "mixers_experiment": "mixers",
    "ood_experiment": "ood",
    "recorded_command": "_shared",
    "scaling_checks": "scaling",
    "scaling_experiment": "scaling",
    "witness_experiment": "witness",
}


def _recipe(name):
    return importlib.import_module(f".{name}", __name__)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(_recipe(_LAZY[name]), name)
    elif name in EXPERIMENTS or name == "_shared":
        value = _recipe(name)
    elif name == "SETTINGS":
        # the recipes' grids: SETTINGS[experiment]["quick" | "full"], each recipe's own
        value = {recipe: _recipe(recipe).SETTINGS for recipe in EXPERIMENTS}
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__, *EXPERIMENTS})


def run_experiment(name, **kwargs):
    """Run the experiment ``name`` (one of :data:`EXPERIMENTS`) with ``kwargs``.

    Parameters
    ----------
    name : {"witness", "length", "ood", "beyond", "maps", "scaling", "exact", "mixers"}
    **kwargs
        Keyword arguments of :func:`witness_experiment`, :func:`length_experiment`,
        :func:`ood_experiment`, :func:`beyond_experiment`, :func:`maps_experiment`,
        :func:`scaling_experiment`, :func:`exact_experiment` or :func:`mixers_experiment`.

    Returns
    -------
    result : :class:`~sklearn.utils.Bunch`

    Examples
    --------
    >>> from minip_learn.experiments import run_experiment
    >>> res = run_experiment("length", seq_lens=(1,), ranks=(1,), seeds=(0,),
    ...                      progress=False, figures=False)
    >>> res.checks
    {'seq_len_1_solved_at_rank_1': True}
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose from {list(EXPERIMENTS)}.")
    return getattr(_recipe(name), f"{name}_experiment")(**kwargs)
