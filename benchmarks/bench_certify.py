"""Time and peak memory of ``certify`` against family size, beside the baseline.

Run from the repository root::

    python benchmarks/bench_certify.py                 # sizes up to 3 million sequences
    python benchmarks/bench_certify.py --quick         # up to 10^5 sequences, a minute
    python benchmarks/bench_certify.py --sizes 48:1e6 64:3e6 96:1e7 --baseline-max 0

Each family is a witness suite (``make_witness_suite(n_bits, 3,
max_sequences=...)``), saved once; every measurement runs in a fresh process, so the
peak resident memory (``ru_maxrss``) is that of one ``certify`` call plus loading the
family. ``baseline`` is the earlier implementation (``benchmarks/_certify_baseline.py``:
per-multiset Python constraints, per-query Python chains, a single greedy selection);
``certify`` is :func:`minip_learn.theory.certify`. The table goes to standard output and
``benchmarks/results/bench-certify.{json,md}`` (``MINIP_BENCH_OUT`` changes the
folder). Group (e) of the pytest-benchmark suite (``test_bench_certify.py``) runs the
same comparison on the smaller families.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

MEASURE = r"""
import json, resource, sys, time
import numpy as np
sys.path.insert(0, {here!r})
X = np.load({path!r})
if {which!r} == "baseline":
    from _certify_baseline import certify
else:
    from minip_learn.theory import certify
t = time.perf_counter()
rank = certify(X)
print(json.dumps(dict(seconds=time.perf_counter() - t, rank=int(rank),
                      peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def _measure(which, path, timeout):
    code = MEASURE.format(here=str(HERE), path=str(path), which=which)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout, check=True).stdout
    except subprocess.TimeoutExpired:
        return dict(seconds=None, rank=None, peak_mb=None, note=f"over {timeout} s")
    return json.loads(out.strip().splitlines()[-1])


def _parse_sizes(items):
    out = []
    for item in items:
        m, n = item.split(":")
        out.append((int(m), int(float(n))))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", nargs="*", default=None,
                        help="n_bits:max_sequences pairs, e.g. 48:1e6")
    parser.add_argument("--baseline-max", type=float, default=1.2e6,
                        help="largest family the baseline is run on (0: never)")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    if args.sizes:
        sizes = _parse_sizes(args.sizes)
    elif args.quick:
        sizes = [(24, 5000), (32, 20000), (40, 100000)]
    else:
        sizes = [(24, 5000), (32, 20000), (40, 100000), (48, 10**6), (64, 3 * 10**6)]

    from minip_learn.datasets import make_witness_suite

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m, budget in sizes:
            t = time.perf_counter()
            suite = make_witness_suite(m, 3, max_sequences=budget)
            build = time.perf_counter() - t
            path = Path(tmp) / f"family-{m}.npy"
            import numpy as np

            np.save(path, suite.X)
            n_seq = len(suite.X)
            del suite
            new = _measure("certify", path, args.timeout)
            base = (_measure("baseline", path, args.timeout) if n_seq <= args.baseline_max
                    else dict(seconds=None, rank=None, peak_mb=None, note="not run"))
            row = dict(n_bits=m, max_sequences=budget, n_sequences=n_seq,
                       build_and_certify_s=round(build, 2),
                       certify_s=new["seconds"], certify_rank=new["rank"],
                       certify_peak_mb=new["peak_mb"],
                       baseline_s=base["seconds"], baseline_rank=base["rank"],
                       baseline_peak_mb=base["peak_mb"])
            if new["seconds"] and base.get("seconds"):
                row["speedup"] = base["seconds"] / new["seconds"]
            rows.append(row)
            print(json.dumps(row), flush=True)

    header = ("| n_bits | sequences | certify s | rank | peak MB | baseline s | baseline rank "
              "| baseline peak MB | speed-up |")
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        def f(v, fmt):
            return "-" if v is None else format(v, fmt)
        lines.append(
            f"| {r['n_bits']} | {r['n_sequences']:,} | {f(r['certify_s'], '.2f')} | "
            f"{f(r['certify_rank'], 'd')} | {f(r['certify_peak_mb'], '.0f')} | "
            f"{f(r['baseline_s'], '.2f')} | {f(r['baseline_rank'], 'd')} | "
            f"{f(r['baseline_peak_mb'], '.0f')} | {f(r.get('speedup'), '.1f')} |"
        )
    table = "\n".join(lines)
    print(table)
    out = Path(os.environ.get("MINIP_BENCH_OUT", HERE / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-certify.json").write_text(json.dumps(rows, indent=1))
    (out / "bench-certify.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
