"""Build + certify of families in multiset form, beside the materialised path.

Run from the repository root::

    python benchmarks/bench_compact.py             # every case (about 30 minutes on 2 cores)
    python benchmarks/bench_compact.py --quick     # the small cases, a few minutes
    python benchmarks/bench_compact.py --cases product-24-40 exact-20-1e8

Every measurement runs in a fresh process, so its peak resident memory is that of one
measurement (sampled from ``/proc/self/statm`` every 0.1 s, and ``ru_maxrss``; the
larger is reported). ``compact`` is ``make_witness_suite`` itself: it builds the family
in multiset form (:class:`minip_learn.compact.CompactFamily`) and certifies it;
``materialised`` loads that family, materialises it as an ``(n, N, n_bits)`` array and
certifies the array -- run only where the array fits in ``--materialised-max-gb``. Both
give the same certified rank (checked).
The table goes to standard output and ``benchmarks/results/bench-compact.{json,md}``
(``MINIP_BENCH_OUT`` changes the folder), where the cases of this run replace their
earlier rows and the other cases' rows stay.

Cases (``name: what``):

* ``r6-24-3``: the R6 Hadamard family, 4,186 sequences of length 3;
* ``r6-24-40``: the same sequences at length 40;
* ``product-24-40``: the product family at m = 24, length 40, 2,000,000 sequences;
* ``exact-12`` / ``exact-16``: the exact families of R9 (9,520 sequences of length 53;
  1,134,480 of length 352);
* ``exact-20-1e8``: the exact family at m = 20 cut to 10^8 sequences (the first 8,164
  words of the code, 99,968,180 sequences of length 2,291): the materialised form
  would take 4.2 TiB;
* ``exact-20-1e8-certify``: the same family built and certified alone
  (``exact_compact``: ``complement_closed_code``, ``exact_family``, ``CompactFamily``
  and ``certify``), without what ``make_witness_suite`` adds (its per-slot targets,
  an int64 array per slot computed in one pass, and the Bunch).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CASES = {
    "r6-24-3": "make_witness_suite(24, 3, construction='hadamard')",
    "r6-24-40": "make_witness_suite(24, 40, construction='hadamard')",
    "product-24-40": "make_witness_suite(24, 40, construction='product', "
                     "max_sequences=2_000_000)",
    "exact-12": "make_witness_suite(12, construction='exact', max_sequences=10**8)",
    "exact-16": "make_witness_suite(16, construction='exact', max_sequences=10**8)",
    "exact-20-1e8": "make_witness_suite(20, construction='exact', max_sequences=10**8)",
    "exact-20-1e8-certify": "exact_compact(20, 10**8)",
}
QUICK = ("r6-24-3", "r6-24-40", "exact-12", "exact-16")

MEASURE = r"""
import json, resource, threading, time
peak = [0]
def watch():
    while True:
        peak[0] = max(peak[0], int(open('/proc/self/statm').read().split()[1]) * 4096)
        time.sleep(0.1)
threading.Thread(target=watch, daemon=True).start()
from sklearn.utils import Bunch
from minip_learn.compact import CompactFamily, load_family
from minip_learn.datasets import make_witness_suite
from minip_learn.theory import (certify, complement_closed_code, exact_family,
                                exact_family_size, exact_seq_len)
def exact_compact(m, max_sequences):
    # the family of make_witness_suite(m, construction="exact", max_sequences=...),
    # certified: Bunch(family, certified_min_rank)
    words = complement_closed_code(m)
    n = len(words)
    while exact_family_size(n) > max_sequences:
        n -= 2
    ids, counts = exact_family(words[:n], exact_seq_len(words[:n]))
    family = CompactFamily(words[:n], ids, counts)
    del ids, counts
    return Bunch(family=family, certified_min_rank=certify(family))
if {form!r} == "compact":
    t = time.perf_counter()
    suite = {call}
    seconds = time.perf_counter() - t
    suite.family.save({path!r})
    rank, n, N = suite.certified_min_rank, len(suite.family), suite.family.seq_len
    size = suite.family.materialized_nbytes
else:
    family = load_family({path!r})
    t = time.perf_counter()
    X = family.to_sequences()
    del family
    rank, n, N, size = certify(X), len(X), X.shape[1], X.nbytes
    seconds = time.perf_counter() - t
rss = max(peak[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print(json.dumps(dict(seconds=seconds, rank=int(rank), n_sequences=n, seq_len=N,
                      peak_mb=rss / 2**20, materialised_bytes=size)))
"""


def _measure(form, call, path, timeout):
    code = MEASURE.format(form=form, call=call, path=str(path))
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(note=f"over {timeout:.0f} s")
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["failed"])[-1]
        return dict(note=last[:120])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cases", nargs="*", default=None, choices=sorted(CASES))
    parser.add_argument("--materialised-max-gb", type=float, default=4.0,
                        help="largest materialised family the materialised path is run on")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    names = args.cases or (QUICK if args.quick else tuple(CASES))
    rows = []
    for name in names:
        call = CASES[name]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "family.npz"
            compact = _measure("compact", call, path, args.timeout)
            gb = compact.get("materialised_bytes", float("inf")) / 2**30
            if gb <= args.materialised_max_gb:
                mat = _measure("materialised", call, path, args.timeout)
            else:
                mat = dict(note=f"not run: X would take {gb:,.1f} GiB")
        row = dict(case=name, call=call, materialised_gib=round(gb, 3),
                   **{f"compact_{k}": v for k, v in compact.items()},
                   **{f"materialised_{k}": v for k, v in mat.items()})
        if compact.get("seconds") and mat.get("seconds"):
            row["speedup"] = mat["seconds"] / compact["seconds"]
            row["memory_ratio"] = mat["peak_mb"] / compact["peak_mb"]
            if mat["rank"] != compact["rank"]:
                raise SystemExit(f"{name}: the two forms certify {compact['rank']} and "
                                 f"{mat['rank']}")
        rows.append(row)
        print(json.dumps(row), flush=True)
    table = _table(rows)
    print(table)
    out = Path(os.environ.get("MINIP_BENCH_OUT", HERE / "results"))
    out.mkdir(parents=True, exist_ok=True)
    rows = _merged(out / "bench-compact.json", rows)
    table = _table(rows)
    (out / "bench-compact.json").write_text(json.dumps(rows, indent=1))
    (out / "bench-compact.md").write_text(table + "\n")
    return 0


def _merged(path, rows):
    """The rows of an earlier results file with this run's cases replaced (in the order
    of ``CASES``): a run of some cases keeps the others' measurements."""
    done = {r["case"]: r for r in (json.loads(path.read_text()) if path.is_file() else [])}
    done.update((r["case"], r) for r in rows)
    return sorted(done.values(), key=lambda r: list(CASES).index(r["case"])
                  if r["case"] in CASES else len(CASES))


def _table(rows):
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = ["| case | sequences | length | rank | compact s | compact peak MB | "
             "materialised s | materialised peak MB | speed-up | memory ratio |",
             "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['case']} | {f(r.get('compact_n_sequences'), ',')} | "
            f"{f(r.get('compact_seq_len'), ',')} | {f(r.get('compact_rank'), 'd')} | "
            f"{f(r.get('compact_seconds'), '.1f')} | {f(r.get('compact_peak_mb'), ',.0f')} | "
            f"{f(r.get('materialised_seconds'), '.1f')} | "
            f"{f(r.get('materialised_peak_mb'), ',.0f')} | {f(r.get('speedup'), '.1f')} | "
            f"{f(r.get('memory_ratio'), '.1f')} |"
            + ("" if not r.get("materialised_note") else f" {r['materialised_note']}")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
