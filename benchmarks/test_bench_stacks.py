"""(i) A mixer sweep as stacks (``fit_ensemble``) beside the same fits one by one.

Every registered mixer on the quick recipe's family (the m = 24 witness bound in
final-query form: 190 sequences of 3 tokens), state sizes 4, 8 and 16, seeds 0, 1 and
2 (nine fits), ``max_epochs=E`` without stopping. Baseline: nine ``fit`` calls;
target: one ``fit_ensemble(estimator, X, y, state_sizes=[4, 8, 16], seeds=[0, 1,
2])``, which trains the nine as one stack, each member padded to state 16 (the
mixers' ``state_padding``). Both sides alternate round by round; ratio = stacked / one
by one (below 1: the stack is faster).

Asserted: every stacked member predicts what its own fit of the same round predicts,
up to float32 rounding (docs/performance.rst: "nine fitted estimators, each equal to
its own fit"), and the stack's speed-up is at least half the documented one
(``SPEEDUP``, docs/performance.rst group (i): 1.1x to 2.3x).
"""

import time

import pytest
from sklearn.base import clone

from _bench import assert_same_fits, check_ratio, mixer_kwargs, paired
from minip_learn import SequenceMixerRegressor
from minip_learn.datasets import make_witness_suite
from minip_learn.model_selection import fit_ensemble
from minip_learn.nn import available_mixers

STATES = [4, 8, 16]
SEEDS = [0, 1, 2]
#: speed-up of the stack over the fits one by one (docs/performance.rst, group (i))
SPEEDUP = {"deltanet": 1.4, "gla": 1.2, "kernel": 2.0, "linear": 1.3, "mamba": 1.1,
           "positional": 2.3, "retnet": 2.2, "softmax": 1.1}


@pytest.fixture(scope="module")
def family():
    suite = make_witness_suite(n_bits=24, seq_len=3, construction="small", query="last")
    return suite.X, suite.y


@pytest.mark.benchmark(group="i-stacks")
@pytest.mark.parametrize("name", available_mixers())
def test_mixer_sweep_stacked_vs_one_by_one(benchmark, bench_record, quick, family, name):
    X, y = family
    epochs, rounds = (40, 1) if quick else (150, 3)
    est = SequenceMixerRegressor(name, mixer_kwargs=mixer_kwargs(name) or None, max_epochs=epochs,
                                 stop_tolerance=None, lr=0.03)

    fits, fits_stacked = [], []

    def one_by_one():
        start = time.perf_counter()
        fits[:] = [clone(est).set_params(state_size=s, random_state=seed).fit(X, y)
                   for s in STATES for seed in SEEDS]
        return time.perf_counter() - start

    def stacked():
        fits_stacked[:] = fit_ensemble(est, X, y, state_sizes=STATES, seeds=SEEDS).estimators

    fit_ensemble(clone(est).set_params(max_epochs=2), X, y, state_sizes=STATES[:1],
                 seeds=SEEDS[:2])  # warm-up
    res = paired(benchmark, stacked, one_by_one, rounds=rounds)
    bench_record("stacks", {"name": name, "n_fits": len(STATES) * len(SEEDS),
                            "epochs": epochs, "rounds": rounds, **res})
    assert [(e.state_size, e.random_state) for e in fits_stacked] == [
        (s, seed) for s in STATES for seed in SEEDS]
    # the same models, up to float32 rounding (see _bench.SAME_FIT_ATOL)
    assert_same_fits(fits_stacked, fits, X,
                     [f"state {s}, seed {seed}" for s in STATES for seed in SEEDS])
    # Margin: half the documented speed-up, as the two alternate within a round. For
    # the mixers documented at 1.1x-1.4x that allows the stack to be up to 1.8x slower
    # than the fits one by one; for kernel, positional and retnet (2.0x-2.3x) it still
    # asserts that the stack is the faster.
    check_ratio(f"{name}: speed-up of one stack over nine fits one by one", 1 / res["ratio"],
                claim=f"{SPEEDUP[name]}x", at_least=0.5 * SPEEDUP[name])
