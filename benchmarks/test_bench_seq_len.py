"""(c) Attention forward time and peak memory vs sequence length N, kernel vs softmax.

The kernel head (``KernelAttentionHead``, rank 64, ``elu+1`` features) computes the
fixed-size sketch: O(N r d) time and O(N r) memory. The softmax head
(``SoftmaxAttentionHead``, score_dim 64) runs both of its algorithms: ``softmax`` forms
the N x N scores and weights (``algorithm="explicit"``: O(N^2 d_s) time, O(N^2)
memory), ``softmax-fused`` calls ``scaled_dot_product_attention`` (``algorithm="fused"``,
what ``"auto"`` takes from N = 64 on: the same O(N^2 d_s) time, and on CPU O(N d)
memory, since the kernel streams over the keys). One sequence (batch 1) of N random 0/1
tokens with m = 24 bits, float32, ``torch.no_grad()``, 1 intra-op thread (as everywhere
in minip_learn). For each N the three heads run back to back. Time: pytest-benchmark, median (auto-calibrated
rounds below N = 4,096, else 3 rounds). Memory: ``_bench.measure_forward_memory`` in a
fresh subprocess, next to the analytic count ``_bench.analytic_bytes``.
"""

import pytest
import torch

import _bench
from _bench import analytic_bytes, available_memory, make_head, measure_forward_memory

FULL = [2 ** k for k in range(4, 15)]  # 16 ... 16,384
QUICK = [16, 64, 256, 1024, 4096]
BIG = 4096
HEADS = ("kernel", "softmax", "softmax-fused")
CASES = [(n, head) for n in FULL for head in HEADS]


def fits_in_memory(head, n):
    # the forward and the subprocess probe each need about the analytic peak; keep a
    # wide margin for the rest of the machine
    return 3 * analytic_bytes(head, n) + 2**30 <= available_memory()


@pytest.fixture(scope="module")
def memory():
    """Peak memory of every case of this run, measured once in one subprocess."""
    ns = QUICK if _bench.QUICK else FULL
    return measure_forward_memory(
        [(head, n) for n, head in CASES if n in ns and fits_in_memory(head, n)])


@pytest.mark.benchmark(group="c-seq-len")
@pytest.mark.parametrize("n,head", CASES, ids=[f"{h}-N{n}" for n, h in CASES])
def test_forward_vs_seq_len(benchmark, bench_record, bench_skip, quick, memory, n, head):
    if quick and n not in QUICK:
        pytest.skip(f"N={n} only in the full run")
    need = analytic_bytes(head, n)
    if (head, n) not in memory or not fits_in_memory(head, n):
        bench_skip(f"{head} N={n} needs about {need / 2**30:.2f} GiB; not enough free memory")
    module = make_head(head).eval()
    x = torch.rand(1, n, module.n_bits).round()

    def forward():
        with torch.no_grad():
            module(x)

    if n < BIG:
        forward()  # warm-up
        benchmark(forward)  # calibrated: rounds enough for about a second
    else:  # a softmax forward takes seconds here: 3 rounds (earlier N warmed torch up)
        benchmark.pedantic(forward, rounds=3, iterations=1)
    mem = memory[head, n]
    row = {"head": head, "n": n, "time_median": benchmark.stats.stats.median,
           "time_min": benchmark.stats.stats.min, "rounds": benchmark.stats.stats.rounds,
           "analytic": need, **mem}
    benchmark.extra_info.update(analytic_bytes=need, **mem)
    bench_record("seq_len", row)
