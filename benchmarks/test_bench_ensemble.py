"""(d) A batched ensemble (``fit_ensemble``) vs the same models fitted one by one.

20 seeds of ``KernelAttentionRegressor(rank=16, stop_tolerance=None, max_epochs=E)`` on
two data sets: 1,000 hard random length-3 sequences (m = 24; nearly every token
distinct) and the m = 24 witness suite (4,186 sequences over 46 distinct tokens,
``feature_map="table"``), where the ensemble computes every map and kernel once per
distinct token (pair). Baseline: 20 separate ``fit`` calls (serial, 1
thread); target: one ``fit_ensemble(estimator, X, y, seeds=range(20))``. Both sides
alternate round by round; the speed-up per model is (20 separate fits) / (one ensemble).
Target: >= 8x per model on the witness suite.

Asserted: every member of the ensemble predicts what its separate fit of the same round
predicts, up to float32 rounding (``fit_ensemble`` returns estimators "equal to the
separate fits up to floating-point rounding", docs/user_guide.rst), and the speed-up
per model is at least half the documented one: 8x on the witness suite, 1.9x on the
random data (docs/performance.rst: "On random data (nearly every token distinct) the 8x
target is **not** met"; 1.8x-2.1x measured).
"""

import time

import pytest
from sklearn.base import clone

from _bench import assert_same_fits, check_ratio, paired
from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_minip, make_witness_suite

N_MODELS = 20
#: speed-up per model, docs/performance.rst group (d)
CLAIMED = {"witness": 8, "random": 1.9}


@pytest.mark.benchmark(group="d-ensemble")
@pytest.mark.parametrize("data", ["random", "witness"])
def test_ensemble_vs_separate_fits(benchmark, bench_record, bench_skip, quick, data):
    from minip_learn import model_selection

    fit_ensemble = getattr(model_selection, "fit_ensemble", None)
    if fit_ensemble is None:
        bench_skip("minip_learn.model_selection.fit_ensemble does not exist yet")
    epochs, rounds = (30, 1) if quick else (100, 5)
    if data == "random":
        X, y = make_minip(1000, seq_len=3, n_bits=24, min_gap=2, random_state=0)
        est = KernelAttentionRegressor(rank=16, stop_tolerance=None, max_epochs=epochs)
    else:
        X, y = _witness()
        est = KernelAttentionRegressor(rank=16, feature_map="table", stop_tolerance=None,
                                       max_epochs=epochs)
    seeds = list(range(N_MODELS))
    fits, fits_batched = [], []

    def separate():
        start = time.perf_counter()
        fits[:] = [clone(est).set_params(random_state=s).fit(X, y) for s in seeds]
        return time.perf_counter() - start

    def ensemble():
        fits_batched[:] = fit_ensemble(est, X, y, seeds=seeds).estimators

    warm = fit_ensemble(est, X, y, seeds=seeds[:2])  # warm-up
    assert len(warm.estimators) == 2
    clone(est).set_params(random_state=0).fit(X, y)
    res = paired(benchmark, ensemble, separate, rounds=rounds)
    assert len(fits_batched) == N_MODELS
    benchmark.extra_info.update(speedup_per_model=1 / res["ratio"])
    name = ("KernelAttentionRegressor(rank=16), random m=24" if data == "random" else
            "KernelAttentionRegressor(rank=16, feature_map='table'), witness m=24")
    bench_record("ensemble", {"name": name, "n_models": N_MODELS,
                              "epochs": epochs, "rounds": rounds, **res})
    # the same models, up to float32 rounding (see _bench.SAME_FIT_ATOL)
    assert_same_fits(fits_batched, fits, X, [f"seed {s}" for s in seeds])
    # Claim: speed-up per model CLAIMED[data]. Margin: half of it; both sides share a
    # round's load, and the medians of four runs on the idle machine stayed within 15 %
    # of it (8.1x-9.3x, 1.8x-2.1x) while single rounds ranged 6.7x-10.3x.
    check_ratio(f"{name}: speed-up per model of fit_ensemble over separate fits",
                1 / res["ratio"], claim=f"{CLAIMED[data]}x", at_least=0.5 * CLAIMED[data])


def _witness():
    suite = make_witness_suite(24, 3)
    return suite.X, suite.y
