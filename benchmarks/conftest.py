"""pytest-benchmark suite: configuration and the side-by-side summary.

Run from the repository root (offline, about 13 minutes on 2 cores)::

    ./install.sh bench && python -m pytest benchmarks --benchmark-only

``--bench-quick`` (or ``MINIP_BENCH_QUICK=1``) runs smaller sizes in about a minute.
``-k certify`` runs only the certify group (e).
At the end the ratio tables are printed and written to ``benchmarks/results/``
(``MINIP_BENCH_OUT`` changes the folder): ``bench-results.json``, ``bench-results.md``
and ``bench_seq_len.png``. The repository's ``python -m pytest`` never collects this
folder (pyproject's ``testpaths`` are ``tests`` and ``minip_learn``).
"""

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

import pytest

try:
    import pytest_benchmark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise pytest.UsageError(
        "the benchmarks need pytest-benchmark: install the bench extra first "
        "(./install.sh bench, or pip install -e '.[bench]')."
    ) from exc

import _bench  # noqa: E402  (benchmarks/ is on sys.path: pytest's rootdir-based import)

SECTIONS = ("fit", "sweep", "seq_len", "ensemble", "certify", "startup", "final_query",
            "estimator_epoch", "grid_epoch", "gpu", "stacks", "dispatch")


def pytest_addoption(parser):
    parser.addoption("--bench-quick", action="store_true", default=False,
                     help="minip_learn benchmarks: smaller sizes (about a minute).")


def pytest_configure(config):
    if config.getoption("--bench-quick", default=False):
        os.environ["MINIP_BENCH_QUICK"] = "1"
        _bench.QUICK = True
    config._minip_bench = {
        "meta": {
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "load_avg_start": _loadavg(),
        },
        **{s: [] for s in SECTIONS},
        "skipped": [],
    }


def _loadavg():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every benchmark runs torch with one intra-op thread, as every fit of minip_learn
    does (docs/performance.rst, "What is measured"); a test that needs more sets them
    itself. Without it a process takes one thread per core, and two threads on cores
    that other jobs keep busy made a forward up to 30x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def quick():
    return _bench.QUICK


@pytest.fixture
def bench_record(request):
    """``bench_record(section, row_dict)``: add a row to the end-of-run summary."""
    store = request.config._minip_bench

    def record(section, row):
        store[section].append(row)

    return record


@pytest.fixture
def bench_skip(request):
    """``bench_skip(reason)``: skip this benchmark and list the reason in the summary."""
    store = request.config._minip_bench

    def skip(reason):
        store["skipped"].append({"test": request.node.nodeid, "reason": reason})
        pytest.skip(reason)

    return skip


# -- summary ------------------------------------------------------------------------------

def _git_commit():
    """HEAD's short hash, with ``-dirty`` when tracked files differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def _machine():
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def _mib(b):
    return "-" if b is None else f"{b / 2**20:,.2f}"


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


def _section(title, intro, header, rows):
    """A titled section of the summary: its title, a sentence and its table."""
    return [f"### {title}", "", intro, "", *_table(header, rows), ""]


def markdown(res):
    """The summary tables of a results dict, as markdown lines."""
    out = []
    if res["fit"]:
        out += ["### (a) Estimator fit vs hand-written torch loop (same module, init, steps)", ""]
        out += _table(
            ["estimator", "epochs", "estimator fit [s]", "hand loop [s]", "ratio", "target"],
            [[r["name"], r["epochs"], f"{r['target_median']:.3f}", f"{r['baseline_median']:.3f}",
              f"{r['ratio']:.2f}x", "<= 1.1x"] for r in res["fit"]])
        out.append("")
    if res["sweep"]:
        out += ["### (b) Witness-suite rank sweep: serial vs n_jobs=2", ""]
        out += _table(
            ["suite", "sequences", "fits x epochs", "serial [s]", "n_jobs=2 [s]", "speed-up"],
            [[r["suite"], r["n_sequences"], f"{r['n_fits']} x {r['epochs']}",
              f"{r['baseline_median']:.2f}", f"{r['target_median']:.2f}",
              f"{1 / r['ratio']:.2f}x"] for r in res["sweep"]])
        out.append("")
    if res["seq_len"]:
        by_n = {}
        for r in res["seq_len"]:
            by_n.setdefault(r["n"], {})[r["head"]] = r
        out += [f"### (c) Attention forward vs sequence length N (batch 1, float32, "
                f"m={_bench.N_BITS}, kernel rank {_bench.RANK}, softmax score_dim "
                f"{_bench.SCORE_DIM}, 1 thread)", ""]
        heads = ("kernel", "softmax", "softmax-fused")

        def t(r):
            return "-" if r.get("time_median") is None else f"{r['time_median'] * 1e3:.3g}"

        def ratio(r, k):
            return ("-" if k.get("time_median") is None or r.get("time_median") is None
                    else f"{r['time_median'] / k['time_median']:.2f}")

        rows = []
        for n in sorted(by_n):
            per_head = [by_n[n].get(head, {}) for head in heads]
            k = per_head[0]
            row = [n, t(k)]
            for r in per_head[1:]:
                row += [t(r), ratio(r, k)]
            for r in per_head:
                row += [_mib(r.get("torch_peak")), _mib(r.get("rss_peak")),
                        _mib(r.get("analytic"))]
            rows.append(row)
        out += _table(["N", "kernel [ms]", "softmax [ms]", "softmax / kernel",
                       "fused softmax [ms]", "fused / kernel"]
                      + [f"{h} {what} [MiB]" for h in heads
                         for what in ("torch peak", "RSS peak", "analytic")], rows)
        out += ["", f"Memory: {_bench.MEMORY_METHOD}. Analytic: the "
                "float32 tensors live at the peak (input and weights excluded): kernel "
                "max(4Nr, 3Nr + 2Nd + rd + r, 3Nd) (features being formed; the sketch step; "
                "the readout; d = m), softmax max(2N^2, N^2 + 2N d_s) (scores and softmax "
                "weights together), fused softmax 4N w + 2N d with w = max(d_s, d) (queries, "
                "keys, values and attended values padded to one width, and the values and "
                "attended values; scaled_dot_product_attention's CPU kernel streams over "
                "the keys).", ""]
    if res["ensemble"]:
        out += ["### (d) Batched ensemble (fit_ensemble) vs separate fits", ""]
        out += _table(
            ["estimator", "models", "epochs", "separate, per model [s]", "ensemble, per model [s]",
             "speed-up per model", "target"],
            [[r["name"], r["n_models"], r["epochs"], f"{r['baseline_median'] / r['n_models']:.3f}",
              f"{r['target_median'] / r['n_models']:.3f}", f"{1 / r['ratio']:.1f}x", ">= 8x"]
             for r in res["ensemble"]])
        out.append("")
    if res["certify"]:
        out += ["### (e) certify vs family size (witness suites, N = 3), beside the baseline", ""]

        def secs(v):
            return "-" if v is None else f"{v:.3g}"

        rows = []
        for r in sorted(res["certify"], key=lambda r: r["n_sequences"]):
            base = r.get("baseline_median")
            rows.append([
                r["n_bits"], f"{r['n_sequences']:,}", _mib(r["family_bytes"]),
                secs(r["target_median"]), secs(base),
                "-" if base is None else f"{base / r['target_median']:.1f}x",
                _mib(r.get("certify_peak")), _mib(r.get("baseline_peak")),
                r["rank"], "-" if r.get("baseline_rank") is None else r["baseline_rank"]])
        out += _table(["n_bits", "sequences", "family [MiB]", "certify [s]", "baseline [s]",
                       "speed-up", "certify peak [MiB]", "baseline peak [MiB]", "rank",
                       "baseline rank"], rows)
        out += ["", f"Memory: {_bench.CERTIFY_MEMORY_METHOD}.", ""]
    if res["startup"]:
        out += ["### (f) Command-line start-up (a fresh interpreter each round)", ""]
        out += _table(
            ["minip-learn --help [s]", "python -c pass [s]", "difference [s]",
             "import minip_learn.estimators [s]", "target"],
            [[f"{r['target_median']:.3f}", f"{r['baseline_median']:.3f}",
              f"{r['target_median'] - r['baseline_median']:.3f}", f"{r['eager_median']:.2f}",
              "--help <= 0.5 s"] for r in res["startup"]])
        out.append("")
    if res["final_query"]:
        r0 = res["final_query"][0]
        out += _section(
            "(g) One final-query epoch per mixer at state 80 (exact m = 12 family)",
            f"Both forms on the first {r0['n_ratio']:,} sequences; the last-position form "
            f"also on all {r0['n_sequences']:,} sequences of {r0['seq_len']} tokens.",
            ["mixer", "last position [s]", "every position [s]", "speed-up",
             "whole family, last position [s]", "target"],
            [[r["name"], f"{r['target_median']:.3f}", f"{r['baseline_median']:.3f}",
              f"{1 / r['ratio']:.1f}x", f"{r['whole_last']:.2f}", "<= 2 s"]
             for r in res["final_query"]])
    if res["estimator_epoch"]:
        r0 = res["estimator_epoch"][0]
        out += _section(
            "(g) One final-query epoch through the estimator beside the formulas",
            f"All {r0['n_sequences']:,} sequences of {r0['seq_len']} tokens, state 80, "
            f"{r0['threads']} torch threads; the reference: a table kernel head written "
            "from the formulas on the distinct tokens.",
            ["mixer", "estimator epoch [s]", "reference epoch [s]", "ratio"],
            [[r["name"], f"{r['epoch']:.3f}", f"{r['reference']:.3f}", f"{r['ratio']:.2f}x"]
             for r in res["estimator_epoch"]])
    if res["grid_epoch"]:
        out += _grid_epoch_section(res["grid_epoch"])
    if res["gpu"]:
        cuda = next((r["cuda_name"] for r in res["gpu"] if r.get("cuda_name")), None)
        out += ["### (h) The GPU beside the machine's CPU cores", "",
                f"CPU: {os.cpu_count()} cores; GPU: {cuda or 'none (not measured)'}.", ""]

        def secs(v):
            return "not measured" if v is None else f"{v:.2f}"

        out += _table(["workload", "CPU [s]", "GPU [s]", "GPU speed-up"],
                      [[r["workload"], secs(r["cpu"]), secs(r.get("cuda")),
                        "-" if None in (r.get("cpu"), r.get("cuda"))
                        else f"{r['cpu'] / r['cuda']:.1f}x"]
                       for r in res["gpu"]])
        out.append("")
    if res["stacks"]:
        r0 = res["stacks"][0]
        out += _section(
            "(i) A mixer sweep as stacks beside its fits one by one",
            f"{r0['n_fits']} fits per mixer (state sizes 4, 8, 16 x seeds 0, 1, 2), "
            f"{r0['epochs']} epochs each, the quick recipe's family.",
            ["mixer", "stacked [s]", "one by one [s]", "speed-up"],
            [[r["name"], f"{r['target_median']:.2f}", f"{r['baseline_median']:.2f}",
              f"{1 / r['ratio']:.1f}x"] for r in res["stacks"]])
    if res["dispatch"]:
        def figure(v):
            return "-" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:,.1f}"

        out += _section(
            "(j) Compute ops and host syncs (counted with TorchDispatchMode)",
            "Per epoch after the first (median), per check, the first epoch (which "
            "prepares the input once), or for the whole run.",
            ["fit", "check_every", "compute ops / epoch", "syncs / plain epoch",
             "syncs / check", "first epoch: ops, syncs", "compute ops (run)",
             "syncs (run)"],
            [[r["fit"], r["check_every"], figure(r.get("ops_per_epoch")),
              figure(r.get("syncs_per_plain_epoch")), figure(r.get("syncs_per_check")),
              "-" if "first_epoch_ops" not in r else
              f"{r['first_epoch_ops']}, {r['first_epoch_syncs']}",
              figure(r.get("ops")), figure(r.get("syncs"))] for r in res["dispatch"]])
    for s in res["skipped"]:
        out.append(f"Skipped: {s['test']}: {s['reason']}")
    return out


def _grid_epoch_section(rows):
    """The full mixers grid on the whole exact m = 12 family: one epoch per mixer and
    state size, their sum per seed, and the budget of the whole grid."""
    sizes = sorted({r["state"] for r in rows})
    names = sorted({r["name"] for r in rows})
    cost = {(r["name"], r["state"]): r["epoch"] for r in rows}
    total = {s: sum(cost[n, s] for n in names) for s in sizes}
    r0, grid = rows[0], sum(total.values())
    budget = grid * r0["max_epochs"] * r0["n_seeds"] / 3600
    cores = os.cpu_count()
    return _section(
        "(g) One final-query epoch of the full mixers grid (exact m = 12 family)",
        f"{r0['n_sequences']:,} sequences of {r0['seq_len']} tokens, one torch thread; one "
        f"epoch of the grid for one seed: {grid:.1f} s; every fit for {r0['max_epochs']} "
        f"epochs and {r0['n_seeds']} seeds: {budget:.1f} h of one core, "
        f"{budget / cores:.1f} h on the {cores} cores ({cores} fits at a time).",
        ["mixer", *(f"state {s} [s]" for s in sizes)],
        [[n, *(f"{cost[n, s]:.2f}" for s in sizes)] for n in names]
        + [["all mixers", *(f"{total[s]:.2f}" for s in sizes)]])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    res = getattr(config, "_minip_bench", None)
    if res is None or not any(res[s] for s in SECTIONS + ("skipped",)):
        return
    res["meta"].update(
        finished=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        load_avg_end=_loadavg(), quick=_bench.QUICK, commit=_git_commit(), machine=_machine(),
    )
    out_dir = Path(os.environ.get("MINIP_BENCH_OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = markdown(res)
    meta = res["meta"]
    header = [f"minip_learn benchmarks ({'quick' if meta['quick'] else 'full'}), commit "
              f"{meta['commit']}, {meta['machine']['cpu_count']} CPUs, torch "
              f"{meta['machine']['torch']}, load average {meta['load_avg_start']} -> "
              f"{meta['load_avg_end']}", ""]
    (out_dir / "bench-results.json").write_text(json.dumps(res, indent=1) + "\n")
    (out_dir / "bench-results.md").write_text("\n".join(header + lines) + "\n")
    written = [out_dir / "bench-results.json", out_dir / "bench-results.md"]
    if res["seq_len"]:
        try:
            from plot_seq_len import plot

            plot(res, out_dir / "bench_seq_len.png")
            written.append(out_dir / "bench_seq_len.png")
        except Exception as exc:  # noqa: BLE001 - the figure must not hide the tables
            terminalreporter.write_line(f"(figure not written: {exc!r})")
    tr = terminalreporter
    tr.section("minip_learn benchmark ratios")
    for line in header + lines:
        tr.write_line(line)
    tr.write_line("written: " + ", ".join(str(p) for p in written))
