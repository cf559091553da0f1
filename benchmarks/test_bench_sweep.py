"""(b) A witness-suite rank sweep, serial vs ``n_jobs=2`` (joblib/loky processes).

``rank_sweep`` of a ``feature_map="table"`` kernel head over ranks and seeds with a
fixed number of epochs (``stop_tolerance=None``: every fit does the same work),
``threads_per_fit=1``. The loky worker pool is started by an untimed warm-up sweep, as
it is in a process that runs several sweeps; serial and parallel sweeps then
alternate round by round. Ideal speed-up on 2 idle cores: 2x (docs/performance.rst:
1.94x-1.96x measured there).

Asserted: both sweeps give the same rows (the same fits, whatever runs them), and the
speed-up serial / ``n_jobs=2`` is at least half the ideal ``min(2, CPU count)``: on 2
or more cores, ``n_jobs=2`` is not slower than the serial sweep.
"""

import os
import time

import numpy as np
import pytest
from sklearn.base import clone

from _bench import check_ratio, paired
from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_witness_suite
from minip_learn.model_selection import rank_sweep

SUITES = {
    # construction: (ranks, seeds, epochs) full / quick
    "small": (([4, 8, 16, 32], [0, 1], 100), ([4, 16], [0, 1], 50)),  # 190 sequences
    "auto": (([8, 16], [0, 1], 30), None),  # 4,186 sequences
}


@pytest.mark.benchmark(group="b-sweep-serial-vs-parallel")
@pytest.mark.parametrize("construction", list(SUITES))
def test_sweep_serial_vs_parallel(benchmark, bench_record, quick, construction):
    full, fast = SUITES[construction]
    if quick and fast is None:
        pytest.skip(f"witness suite {construction!r} only in the full run")
    ranks, seeds, epochs = fast if quick else full
    rounds = 2 if quick or construction == "auto" else 3
    suite = make_witness_suite(24, 3, construction=construction)
    est = KernelAttentionRegressor(feature_map="table", stop_tolerance=None, max_epochs=epochs)

    results = {}

    def sweep(n_jobs):
        def run():
            start = time.perf_counter()
            results[n_jobs] = rank_sweep(est, suite.X, suite.y, ranks=ranks, seeds=seeds,
                                         n_jobs=n_jobs, threads_per_fit=1, progress=False)
            return time.perf_counter() - start
        return run

    rank_sweep(clone(est).set_params(max_epochs=1), suite.X, suite.y, ranks=ranks[:1],
               seeds=seeds, n_jobs=2, threads_per_fit=1, progress=False)  # starts the workers
    res = paired(benchmark, sweep(2), sweep(1), rounds=rounds)
    benchmark.extra_info.update(speedup=1 / res["ratio"], serial_median=res["baseline_median"])
    bench_record("sweep", {"suite": construction, "n_sequences": len(suite.X),
                           "n_fits": len(ranks) * len(seeds), "ranks": ranks, "seeds": seeds,
                           "epochs": epochs, "rounds": rounds, **res})
    # the same fits either way: every fit is seeded, one thread each
    serial, parallel = (results[n].results.sort_values(["rank", "seed"]) for n in (1, 2))
    assert serial["fit_id"].tolist() == parallel["fit_id"].tolist()
    np.testing.assert_array_equal(serial["max_abs_error"], parallel["max_abs_error"])
    # Claim: 2x on two idle cores (measured 1.94x-1.96x). Margin: half of it (the
    # cores' load moves a round's time by 3-6x, though both sides of a round share it),
    # which still asserts the claim's direction: n_jobs=2 no slower than serial. On a
    # machine whose cores are busy with other jobs the claim does not hold (the docs
    # record 0.82x-1.04x there) and this fails: that machine cannot run two fits at once.
    ideal = min(2, os.cpu_count() or 1)
    check_ratio(f"witness suite {construction!r}: speed-up of n_jobs=2 over serial",
                1 / res["ratio"], claim=f"{ideal}x on {ideal} idle cores",
                at_least=0.5 * ideal)
