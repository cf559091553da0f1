"""(e) ``certify`` time and peak memory against family size, beside the baseline.

Each family is a witness suite ``make_witness_suite(n_bits, 3, max_sequences=...)``.
``certify`` is :func:`minip_learn.theory.certify`; the baseline is the earlier
implementation kept in ``benchmarks/_certify_baseline.py`` (per-multiset Python
constraints, per-query Python chains, one greedy selection), run where it takes
seconds, not minutes. Time: pytest-benchmark, the two alternating round by round
(``_bench.paired``). Memory: ``_bench.measure_certify_memory``, one fresh subprocess
per family, the resident-set high-water mark of one call above the resident set just
before it (the family itself is reported beside it). ``python
benchmarks/bench_certify.py`` runs larger families (millions of sequences).

Asserted: ``certify`` gives the baseline's rank, exactly, where the baseline runs, and
the rank docs/performance.rst states where it does not; its speed-up over the baseline
is at least half the documented one (``CLAIMED``).
"""

import time

import numpy as np
import pytest

from _bench import check_ratio, measure_certify_memory, paired
from _certify_baseline import certify as certify_baseline
from minip_learn.datasets import make_witness_suite
from minip_learn.theory import certify

# (n_bits, max_sequences, run the baseline, rounds)
FULL = [(24, 5000, True, 3), (32, 20000, True, 3), (40, 10**5, True, 1),
        (48, 10**6, False, 1)]
QUICK = [(24, 5000, True, 2), (32, 20000, True, 1)]
CASES = sorted({c[:2] for c in FULL + QUICK})
#: docs/performance.rst, group (e): (speed-up over the baseline, rank) per n_bits
CLAIMED = {24: (2.1, 17), 32: (1.1, 36), 40: (28, 64), 48: (None, 189)}


@pytest.mark.benchmark(group="e-certify")
@pytest.mark.parametrize("n_bits,budget", CASES, ids=[f"m{m}-{b:.0e}" for m, b in CASES])
def test_certify_vs_family_size(benchmark, bench_record, quick, n_bits, budget, tmp_path):
    sizes = {c[:2]: c[2:] for c in (QUICK if quick else FULL)}
    if (n_bits, budget) not in sizes:
        pytest.skip(f"m={n_bits}, max_sequences={budget} only in the "
                    f"{'full' if quick else 'quick'} run")
    with_baseline, rounds = sizes[n_bits, budget]
    X = make_witness_suite(n_bits, 3, max_sequences=budget).X
    rank = int(certify(X))  # warm-up (lazy imports, allocator)

    def baseline():
        start = time.perf_counter()
        baseline.rank = int(certify_baseline(X))
        return time.perf_counter() - start

    if with_baseline:
        res = paired(benchmark, lambda: certify(X), baseline, rounds=rounds)
    else:
        benchmark.pedantic(certify, args=(X,), rounds=rounds, iterations=1)
        res = {"target_median": benchmark.stats.stats.median}
    path = tmp_path / "family.npy"
    np.save(path, X)
    mem = measure_certify_memory(path, baseline=with_baseline)
    row = {"n_bits": n_bits, "max_sequences": budget, "n_sequences": len(X),
           "family_bytes": int(X.nbytes), "rank": int(rank),
           "baseline_rank": getattr(baseline, "rank", None), "rounds": rounds, **res, **mem}
    benchmark.extra_info.update(n_sequences=len(X), rank=int(rank), **mem)
    bench_record("certify", row)

    speedup, documented_rank = CLAIMED[n_bits]
    if not with_baseline:
        assert rank == documented_rank, (
            f"m={n_bits}: certify gives rank {rank}; docs/performance.rst states "
            f"{documented_rank}")
        return
    assert rank == baseline.rank, (
        f"m={n_bits}: certify gives rank {rank}, the baseline {baseline.rank}")
    # Claim: the documented speed-up (measured with the machine shared, load average
    # 2.4-2.7). Margin: half of it, as the two alternate within a round and share its
    # load; at m = 32, where the two are about as fast (1.1x), that allows certify up to
    # 1.8x slower, at m = 40 it still asserts 14x.
    check_ratio(f"m={n_bits}: speed-up of certify over the baseline", 1 / res["ratio"],
                claim=f"{speedup}x", at_least=0.5 * speedup)
