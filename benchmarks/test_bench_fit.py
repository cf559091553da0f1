"""(a) One full-batch estimator fit vs a hand-written torch loop (target <= 1.1x).

Both sides train the same head class with the same initial weights, optimizer (the
estimator's class and settings: Adam, or AdamW with weight decay for softmax), MSE
loss, full-batch data (1,000 hard length-3 sequences, m = 24) and number
of optimizer steps; the estimator runs with ``stop_tolerance=None`` so it does exactly
``max_epochs`` steps. The estimator's time is its whole ``fit`` (validation, module
construction, the skorch loop, the final training-error pass); the hand loop's is the
bare loop. The two alternate round by round (see ``_bench.paired``).

Asserted: the trained head equals the loop's bit for bit, and the median per-round
ratio (estimator fit / hand loop) is at most 1.5, the 1.1x target widened by the
noise of the interleaved rounds (see the comment at the assertion).
"""

import pytest
import torch
from sklearn.base import clone

from _bench import check_ratio, hand_loop, paired
from minip_learn import KernelAttentionRegressor, SoftmaxAttentionRegressor
from minip_learn.datasets import make_minip

CASES = {
    "KernelAttentionRegressor(rank=16)": KernelAttentionRegressor(
        rank=16, stop_tolerance=None, random_state=0),
    "SoftmaxAttentionRegressor()": SoftmaxAttentionRegressor(stop_tolerance=None, random_state=0),
}


@pytest.fixture(scope="module")
def data():
    return make_minip(1000, seq_len=3, n_bits=24, min_gap=2, random_state=0)


@pytest.mark.benchmark(group="a-fit-vs-hand-loop")
@pytest.mark.parametrize("name", list(CASES))
def test_fit_vs_hand_loop(benchmark, bench_record, quick, data, name):
    X, y = data
    epochs, rounds = (100, 3) if quick else (300, 15)
    est = clone(CASES[name]).set_params(max_epochs=epochs)
    loop_est = clone(CASES[name])
    est.fit(X, y)  # warm-up: lazy imports, allocator
    hand_loop(loop_est, X, y, 20)

    res = paired(benchmark, lambda: est.fit(X, y),
                 lambda: hand_loop(loop_est, X, y, epochs), rounds=rounds)
    assert est.n_epochs_ == epochs  # same number of optimizer steps as the loop
    # the same work: the loop's trained head is the estimator's, bit for bit (the same
    # operations in the same order from the same initial weights)
    trained = []
    hand_loop(loop_est, X, y, epochs, trained=trained)
    for (param, p), q in zip(est.net_.module_.named_parameters(), trained[0].parameters(),
                             strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=param)
    benchmark.extra_info.update(ratio=res["ratio"], hand_loop_median=res["baseline_median"])
    bench_record("fit", {"name": name, "epochs": epochs, "rounds": rounds, **res})
    # Target: the fit at most 1.1x the loop. Its expected overhead is about 1.06x
    # (docs/performance.rst), but the machine's speed moves between rounds a second
    # apart: single rounds on the idle development machine ranged 0.74x-1.51x, medians
    # of 15 rounds 0.97x-1.19x. 1.5 (the largest single round seen there) holds the
    # median of a few rounds; a fit that did twice the loop's work would still fail.
    check_ratio(f"{name}: estimator fit / hand loop", res["ratio"],
                claim="at most 1.1x (measured medians 0.97x-1.19x)", at_most=1.5)
