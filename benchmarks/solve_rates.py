"""Solve rates behind the "Training that solves" section of docs/performance.rst.

    python benchmarks/solve_rates.py softmax   [--seeds 0-9]  [--out FILE.csv]
    python benchmarks/solve_rates.py splitting [--seeds 0-3] [--bits 12,16,20,24] [--out FILE.csv]

``softmax``: :class:`~minip_learn.SoftmaxAttentionRegressor` with its defaults on hard
random length-3 Min-IP (m = 24, 2,000 training sequences drawn with
``make_minip(..., min_gap=2, random_state=10 + seed)``), scored on 1,000 held-out
sequences (``random_state=99``); about 15 s per seed on one core.

``splitting``: ``KernelAttentionRegressor(feature_map="table")`` at the constructive rank
of the Hadamard witness suite of each ``m``, with and without feature splitting
(``split_every=200`` / ``None``; at most 2,000 epochs, 3,000 for m = 24). Fits without
splitting run to the epoch limit (up to ~80 s each at m = 24).

Every fit is one row of the CSV (written as it finishes) and one printed line; a summary
per setting ends the run. The witness experiment itself (``minip-learn reproduce
witness --ensemble``) gives the per-rank table of the m = 24 witness suite (the
theory page, docs/theory.rst, R6).
"""

import argparse
import csv
import sys
import time

import torch


def _seeds(text):
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def softmax_rows(seeds):
    from minip_learn import SoftmaxAttentionRegressor
    from minip_learn.datasets import make_minip

    X_test, y_test = make_minip(1000, seq_len=3, n_bits=24, min_gap=2, random_state=99)
    for seed in seeds:
        X, y = make_minip(2000, seq_len=3, n_bits=24, min_gap=2, random_state=10 + seed)
        t = time.perf_counter()
        est = SoftmaxAttentionRegressor(random_state=seed).fit(X, y)
        yield dict(setting="softmax m=24 held-out", seed=seed, solved=est.solved_,
                   train_max_error=round(est.train_max_error_, 4), epochs=est.n_epochs_,
                   test_exact_match=est.score(X_test, y_test),
                   seconds=round(time.perf_counter() - t, 1))


def splitting_rows(seeds, bits):
    from minip_learn import KernelAttentionRegressor
    from minip_learn.datasets import make_witness_suite

    for m in bits:
        suite = make_witness_suite(n_bits=m, seq_len=3, construction="hadamard")
        rank = suite.constructive_rank
        for split in (None, 200):
            for seed in seeds:
                t = time.perf_counter()
                est = KernelAttentionRegressor(
                    rank=rank, feature_map="table", stop_tolerance=0.5, split_every=split,
                    max_epochs=3000 if m >= 24 else 2000, random_state=seed,
                ).fit(suite.X, suite.y)
                yield dict(setting=f"m={m} rank={rank} split_every={split}", seed=seed,
                           solved=est.solved_, train_max_error=round(est.train_max_error_, 4),
                           epochs=est.n_epochs_, seconds=round(time.perf_counter() - t, 1),
                           certified_min_rank=suite.certified_min_rank)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["softmax", "splitting"])
    parser.add_argument("--seeds", default=None, help="e.g. 0-9 or 0,2,5")
    parser.add_argument("--bits", default="12,16,20,24", help="splitting: m values")
    parser.add_argument("--out", default=None, help="CSV file (one row per fit)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.what == "softmax":
        rows = softmax_rows(_seeds(args.seeds or "0-9"))
    else:
        rows = splitting_rows(_seeds(args.seeds or "0-3"), [int(b) for b in args.bits.split(",")])
    writer, fh, summary = None, None, {}
    try:
        for row in rows:
            print(row, flush=True)
            if args.out:
                if writer is None:
                    fh = open(args.out, "w", newline="")
                    writer = csv.DictWriter(fh, fieldnames=list(row))
                    writer.writeheader()
                writer.writerow(row)
                fh.flush()
            ok = row["test_exact_match"] == 1.0 if "test_exact_match" in row else row["solved"]
            done, total = summary.get(row["setting"], (0, 0))
            summary[row["setting"]] = (done + bool(ok), total + 1)
    finally:
        if fh is not None:
            fh.close()
    label = "exact on every held-out sequence" if args.what == "softmax" else "solved"
    for setting, (done, total) in summary.items():
        print(f"{setting}: {done}/{total} seeds {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
