"""Helpers shared by the benchmark modules (not collected as tests).

* :func:`paired` times a *target* with pytest-benchmark and a *baseline* in the
  untimed setup of every round, so the two alternate (baseline, target, baseline,
  target, ...) in one process and machine noise hits both alike; the reported ratio is
  the median of the per-round ratios. :func:`interleaved` alternates two callables the
  same way outside pytest-benchmark.
* :func:`check_ratio` asserts a ratio measured side by side in one run against the
  bound a documented claim gives it, and says both when it fails;
  :func:`assert_same_fits` checks that batched fits predict what their separate fits do.
* :func:`hand_loop` is the bare torch training loop an estimator fit is compared with.
* :func:`exact_family` and :func:`make_bench_mixer`: the family and the mixers that
  groups (g) and (h) time.
* :func:`measure_forward_memory` runs attention forwards in a fresh subprocess and
  reports their peak memory (see ``MEMORY_METHOD``), next to :func:`analytic_bytes`.
* :func:`measure_certify_memory` does the same for ``certify`` and its baseline on a
  saved family (see ``CERTIFY_MEMORY_METHOD``).
"""

import copy
import inspect
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from skorch.callbacks import Callback

QUICK = os.environ.get("MINIP_BENCH_QUICK", "").strip().lower() not in ("", "0", "false", "no")


def paired(benchmark, target, baseline, *, rounds):
    """Time ``target()`` with pytest-benchmark, ``baseline()`` interleaved with it.

    ``baseline`` runs in the setup of each round (untimed by pytest-benchmark) and must
    return its own elapsed time in seconds, so it may exclude its own preparation.

    Returns
    -------
    dict with ``target`` and ``baseline`` (lists of seconds, one per round), their
    medians and ``ratio`` = median over rounds of target / baseline.
    """
    base = []

    def setup():
        base.append(baseline())

    benchmark.pedantic(target, setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)
    return _rounds(list(benchmark.stats.stats.data), base)


def interleaved(target, baseline, *, rounds):
    """Time ``baseline()`` then ``target()``, ``rounds`` times, with ``time.perf_counter``.

    The same alternation as :func:`paired` for a comparison that pytest-benchmark does
    not report (each callable is timed whole here). Returns the same dict.
    """
    tgt, base = [], []
    for _ in range(rounds):
        for fn, times in ((baseline, base), (target, tgt)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return _rounds(tgt, base)


def _rounds(tgt, base):
    ratios = [t / b for t, b in zip(tgt, base, strict=True)]
    return {
        "target": tgt,
        "baseline": base,
        "target_median": statistics.median(tgt),
        "baseline_median": statistics.median(base),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }


def check_ratio(what, measured, *, claim, at_least=None, at_most=None, timing=True):
    """Assert ``at_least <= measured <= at_most`` (either bound may be None).

    ``measured`` is a ratio of two figures measured side by side in the same run (never
    an absolute time); the bounds are the documented ``claim`` (text, quoted in the
    message) widened by the margin for noise that the caller states. ``timing``: the
    figures are times (the message then recalls the machine's load). Returns
    ``measured``.
    """
    low = -float("inf") if at_least is None else at_least
    high = float("inf") if at_most is None else at_most
    bounds = " and ".join(b for b in (at_least is not None and f">= {at_least:.3g}",
                                      at_most is not None and f"<= {at_most:.3g}") if b)
    note = ("; a loaded machine can move single rounds by 3-6x, see docs/performance.rst"
            if timing else "")
    assert low <= measured <= high, (
        f"{what}: measured {measured:.3g}, asserted {bounds} (documented: {claim}){note}")
    return measured


#: How far apart (max abs) two float32 fits of the same model may predict: half the 0.5
#: within which an answer counts as solved. Batched and single steps round differently
#: and training amplifies it: up to 7e-4 after 100 epochs (the kernel ensembles of
#: group (d)), up to 0.03 after 150 epochs (``gla`` stacks of group (i)); members
#: trained from other seeds or states differ by about 2 or more on these families.
SAME_FIT_ATOL = 0.25


def assert_same_fits(batched, separate, X, labels):
    """Assert that each batched estimator predicts ``X`` as its separate fit does
    (within :data:`SAME_FIT_ATOL`); ``labels`` names the pairs in the message."""
    import numpy as np

    for label, a, b in zip(labels, batched, separate, strict=True):
        np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=0, atol=SAME_FIT_ATOL,
                                   err_msg=f"{label}: batched fit != its separate fit")


class _InitialState(Callback):
    """Keep a copy of the head as it was when training began (the only member of the
    stack that a single fit trains), and the class and settings of its optimizer."""

    def on_train_begin(self, net, **kwargs):
        stack = net.module_
        self.module = copy.deepcopy(stack.template).requires_grad_(True)
        self.module.load_state_dict(stack.member_state_dict(0))
        opt = net.optimizer_
        takes = inspect.signature(type(opt)).parameters
        self.optimizer = type(opt), {k: v for k, v in opt.defaults.items() if k in takes}


def hand_loop(est, X, y, epochs, *, trained=None):
    """Train the same module as ``est.fit`` with a bare torch loop; return seconds.

    The module is the estimator's own head with the estimator's own initial weights
    (captured by a one-epoch fit, untimed); the optimizer (its class and settings: Adam
    for the kernel estimators, AdamW with weight decay for softmax), loss (MSE) and
    full-batch data are the estimator's. ``epochs`` optimizer steps are timed.
    ``trained``: a list that receives the trained module.
    """
    initial = _InitialState()
    est.set_params(max_epochs=1, callbacks=[initial]).fit(X, y)
    est.set_params(callbacks=None)
    module = initial.module
    Xt = torch.as_tensor(X, dtype=torch.float32)
    yt = torch.as_tensor(y, dtype=torch.float32)
    optimizer, settings = initial.optimizer
    opt = optimizer(module.parameters(), **settings)
    loss_fn = torch.nn.MSELoss()
    start = time.perf_counter()
    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(module(Xt), yt)
        loss.backward()
        opt.step()
        loss.item()  # the estimator logs the loss each epoch, which syncs
    elapsed = time.perf_counter() - start
    if trained is not None:
        trained.append(module)
    return elapsed


# -- (g), (h), (i) sequence mixers --------------------------------------------------------

#: the kernel mixers, run with ``table`` features (one row per distinct token)
TABLE_MIXERS = ("kernel", "retnet", "positional")


def mixer_kwargs(name):
    """The mixer settings the benchmarks use: ``table`` features for the kernel mixers."""
    return {"feature_map": "table"} if name in TABLE_MIXERS else {}


def exact_family():
    """The whole exact m = 12 family in final-query form (12,720 sequences of 53
    tokens, exact rank 80)."""
    from minip_learn.datasets import make_witness_suite

    return make_witness_suite(n_bits=12, construction="exact", max_sequences=10**5,
                              query="last")


def make_bench_mixer(name, X, state):
    """The built-in mixer ``name`` with state ``state`` for the data ``X`` (its
    ``data_kwargs``, :func:`mixer_kwargs`), initialised from seed 0."""
    from minip_learn.nn import get_mixer, make_mixer

    kwargs = mixer_kwargs(name)
    kwargs.update(get_mixer(name).data_kwargs(X, **kwargs))
    torch.manual_seed(0)
    return make_mixer(name, X.shape[2], state, **kwargs)


# -- (c) attention forward: analytic and measured memory --------------------------------

N_BITS = 24
RANK = 64
SCORE_DIM = 64
FLOAT_BYTES = 4  # float32

MEMORY_METHOD = (
    "forwards under torch.no_grad (float32, batch 1) in one fresh subprocess, after a "
    "warm-up forward of each head at N=16, with glibc's mmap threshold fixed at 64 KiB "
    "(MALLOC_MMAP_THRESHOLD_=65536: every tensor above it is mapped and unmapped on its "
    "own, so memory freed at one N is not reused at the next); 'torch peak' is the "
    "high-water mark of live torch CPU allocations during a profiled forward "
    "(torch.profiler, profile_memory=True: the [memory] events summed in time order); "
    "'RSS peak' is the process's resident-set high-water mark during an unprofiled "
    "forward (VmHWM, reset through /proc/self/clear_refs just before it) minus the "
    "resident set just before it"
)


def make_head(kind):
    from minip_learn.nn import KernelAttentionHead, SoftmaxAttentionHead

    if kind == "kernel":
        return KernelAttentionHead(N_BITS, RANK)
    if kind in ("softmax", "softmax-fused"):  # the explicit (N x N) form, the fused kernel
        algorithm = "fused" if kind == "softmax-fused" else "explicit"
        return SoftmaxAttentionHead(N_BITS, score_dim=SCORE_DIM, algorithm=algorithm)
    raise ValueError(kind)


def analytic_bytes(kind, n, *, rank=RANK, score_dim=SCORE_DIM, value_dim=N_BITS):
    """Bytes of the tensors live at the peak of one forward (input and weights excluded).

    Kernel head (``elu+1`` features, sketch form), the largest of three moments: while
    the key features are formed, the query features plus the key pre-activations, their
    elu and elu + 1 (4 N r); in the sketch, both features, the values, the sketch
    (``S``: r d, ``s``: r), the numerator and the denominator's product
    ``phi_Q * s`` (3 N r + 2 N d + r d + r); in the readout, the attended values, the
    readout weights and their product (3 N d). All linear in N. Softmax head: the
    larger of the moment the scores are formed (queries and keys 2 N d_s, the product
    N^2) and the softmax (scores and weights, 2 N^2). Fused softmax head
    (``scaled_dot_product_attention``, whose CPU kernel streams over the keys): queries,
    keys, values and attended values padded to one width ``w = max(d_s, d)`` (4 N w),
    and the values and attended values at their own width (2 N d).
    """
    if kind == "kernel":
        r, d = rank, value_dim
        floats = max(4 * n * r, 3 * n * r + 2 * n * d + r * d + r, 3 * n * d)
    elif kind == "softmax-fused":
        floats = 4 * n * max(score_dim, value_dim) + 2 * n * value_dim
    else:
        floats = max(2 * n * n, n * n + 2 * n * score_dim)
    return floats * FLOAT_BYTES


_PROBE = r"""
import json, re, sys, torch
sys.path.insert(0, {bench_dir!r})
from _bench import make_head
from torch.profiler import ProfilerActivity, profile

torch.set_num_threads(1)
cases = {cases!r}

def status():
    text = open("/proc/self/status").read()
    return {{k: int(re.search(k + r":\s+(\d+) kB", text).group(1)) * 1024
             for k in ("VmRSS", "VmHWM")}}

heads = {{kind: make_head(kind).eval() for kind in sorted({{k for k, _ in cases}})}}
with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True):
    for head in heads.values():
        head(torch.rand(1, 16, head.n_bits).round())  # lazy initialisation, not measured
for kind, n in cases:
    head = heads[kind]
    out = {{"head": kind, "n": n}}
    with torch.no_grad():
        x = torch.rand(1, n, head.n_bits).round()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            before = status()["VmRSS"]
            head(x)
            out["rss_peak"] = status()["VmHWM"] - before
        except OSError:
            out["rss_peak"] = None
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            head(x)
    cur = peak = 0
    mem = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(mem, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    out["torch_peak"] = peak
    del x, prof
    print("RESULT " + json.dumps(out), flush=True)
"""


def measure_forward_memory(cases, *, timeout=900):
    """Peak memory of one forward for each ``(head, n)`` in ``cases`` (bytes).

    Returns ``{(head, n): {"torch_peak": int, "rss_peak": int or None}}``; see
    ``MEMORY_METHOD``. One subprocess for all cases: importing torch and starting the
    profiler cost seconds each time.
    """
    code = _PROBE.format(bench_dir=os.path.dirname(os.path.abspath(__file__)),
                         cases=[tuple(c) for c in cases])
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            row = json.loads(line[len("RESULT "):])
            out[row.pop("head"), row.pop("n")] = row
    if len(out) != len(cases):
        raise RuntimeError(f"memory probe failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
    return out


# -- (e) certify: peak memory ------------------------------------------------------------

CERTIFY_MEMORY_METHOD = (
    "one fresh subprocess per family: the family is loaded from .npy, then for certify "
    "and for the baseline the resident-set high-water mark (VmHWM, reset through "
    "/proc/self/clear_refs just before the call) minus the resident set just before it "
    "(which holds the family, reported beside it)"
)

_CERTIFY_PROBE = r"""
import json, re, sys
import numpy as np
sys.path.insert(0, {bench_dir!r})
from _certify_baseline import certify as baseline
from minip_learn.theory import certify

def status():
    text = open("/proc/self/status").read()
    return {{k: int(re.search(k + r":\s+(\d+) kB", text).group(1)) * 1024
             for k in ("VmRSS", "VmHWM")}}

X = np.load({path!r})
out = {{}}
for name, fn in [("certify", certify)] + ([("baseline", baseline)] if {baseline!r} else []):
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status()["VmRSS"]
        fn(X)
        out[name + "_peak"] = status()["VmHWM"] - before
    except OSError:
        out[name + "_peak"] = None
print("RESULT " + json.dumps(out), flush=True)
"""


def measure_certify_memory(path, *, baseline=True, timeout=1800):
    """Peak memory (bytes above the resident set before the call) of ``certify`` on
    the family saved at ``path``, and of the baseline with ``baseline=True``.

    Returns ``{"certify_peak": int or None, "baseline_peak": int or None}``; see
    ``CERTIFY_MEMORY_METHOD``.
    """
    code = _CERTIFY_PROBE.format(bench_dir=os.path.dirname(os.path.abspath(__file__)),
                                 path=str(path), baseline=bool(baseline))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {"baseline_peak": None, **json.loads(line[len("RESULT "):])}
    raise RuntimeError(f"memory probe failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")


def available_memory():
    """Available system memory in bytes (psutil if present, else sysconf)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
