"""Figure of benchmark (c): forward time and peak memory vs N, kernel vs softmax head
(explicit and fused).

    python benchmarks/plot_seq_len.py [RESULTS_JSON] [OUT_PNG]

defaults: ``benchmarks/results/bench-results.json`` and ``bench_seq_len.png`` beside
it. The benchmark run writes the same figure itself.
"""

import json
import sys
from pathlib import Path

COLORS = {"kernel": "C0", "softmax": "C3", "softmax-fused": "C1"}
LABELS = {"kernel": "kernel head (sketch, rank 64)",
          "softmax": "softmax head, explicit N x N (score_dim 64)",
          "softmax-fused": "softmax head, fused SDPA (score_dim 64)"}


def plot(res, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for head, c in COLORS.items():
        rows = sorted((r for r in res["seq_len"] if r["head"] == head), key=lambda r: r["n"])
        if not rows:
            continue
        n = [r["n"] for r in rows]
        ax_t.plot(n, [r["time_median"] * 1e3 for r in rows], "o-", color=c, label=LABELS[head])
        ax_m.plot(n, [r["torch_peak"] / 2**20 for r in rows], "o-", color=c,
                  label=f"{head}: measured (torch allocations)")
        rss = [(r["n"], r["rss_peak"] / 2**20) for r in rows if r.get("rss_peak")]
        if rss:
            ax_m.plot(*zip(*rss), "x:", color=c, alpha=0.7, label=f"{head}: measured (RSS)")
        ax_m.plot(n, [r["analytic"] / 2**20 for r in rows], "--", color=c, alpha=0.6,
                  label=f"{head}: analytic")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.grid(True, which="major", alpha=0.3)
    ax_t.set_ylabel("forward time [ms] (median)")
    ax_t.set_title("Forward time, batch 1, float32, 1 thread")
    ax_t.legend(fontsize=8)
    ax_m.set_ylabel("peak memory of one forward [MiB]")
    ax_m.set_title("Peak memory")
    ax_m.legend(fontsize=7)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    src = Path(argv[0]) if argv else Path(__file__).parent / "results" / "bench-results.json"
    out = Path(argv[1]) if len(argv) > 1 else src.with_name("bench_seq_len.png")
    plot(json.loads(src.read_text()), out)
    print(out)


if __name__ == "__main__":
    main()
