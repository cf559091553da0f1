"""(i) A mixer sweep as stacks (``fit_ensemble``) beside the same fits one by one.

Every registered mixer on the quick recipe's family (the m = 24 witness bound in
final-query form: 190 sequences of 3 tokens), state sizes 4, 8 and 16, seeds 0, 1 and
2 (nine fits), ``max_epochs=E`` without stopping. Baseline: nine ``fit`` calls;
target: one ``fit_ensemble(estimator, X, y, state_sizes=[4, 8, 16], seeds=[0, 1,
2])``, which trains the nine as one stack, each member padded to state 16 (the
mixers' ``state_padding``). Both sides alternate round by round; ratio = stacked / one
by one (below 1: the stack is faster).
"""

import time

import pytest
from sklearn.base import clone

from _bench import paired
from minip_learn import SequenceMixerRegressor
from minip_learn.datasets import make_witness_suite
from minip_learn.model_selection import fit_ensemble
from minip_learn.nn import available_mixers

STATES = [4, 8, 16]
SEEDS = [0, 1, 2]
TABLE_MIXERS = ("kernel", "retnet", "positional")


@pytest.fixture(scope="module")
def family():
    suite = make_witness_suite(n_bits=24, seq_len=3, construction="small", query="last")
    return suite.X, suite.y


@pytest.mark.benchmark(group="i-stacks")
@pytest.mark.parametrize("name", available_mixers())
def test_mixer_sweep_stacked_vs_one_by_one(benchmark, bench_record, quick, family, name):
    X, y = family
    epochs, rounds = (40, 1) if quick else (150, 3)
    kwargs = {"feature_map": "table"} if name in TABLE_MIXERS else None
    est = SequenceMixerRegressor(name, mixer_kwargs=kwargs, max_epochs=epochs,
                                 stop_tolerance=None, lr=0.03)

    def one_by_one():
        start = time.perf_counter()
        for s in STATES:
            for seed in SEEDS:
                clone(est).set_params(state_size=s, random_state=seed).fit(X, y)
        return time.perf_counter() - start

    def stacked():
        return fit_ensemble(est, X, y, state_sizes=STATES, seeds=SEEDS)

    fit_ensemble(clone(est).set_params(max_epochs=2), X, y, state_sizes=STATES[:1],
                 seeds=SEEDS[:2])  # warm-up
    res = paired(benchmark, stacked, one_by_one, rounds=rounds)
    bench_record("stacks", {"name": name, "n_fits": len(STATES) * len(SEEDS),
                            "epochs": epochs, "rounds": rounds, **res})
