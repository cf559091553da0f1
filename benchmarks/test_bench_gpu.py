"""(h) The GPU beside the CPU cores of the same machine.

Three workloads, each timed on the CPU (every core: ``n_jobs`` = the machine's CPU
count, one torch thread per fit) and, where a CUDA device is present, on ``cuda``:

* the full witness recipe with stacked fits (``minip-learn reproduce witness
  --ensemble``: 55 fits), and, on the GPU only, the same with the training figures
  read on the host every 10 epochs instead of every epoch (``check_every=10``);
* the mixers recipe's quick grid (``minip-learn reproduce mixers --quick``);
* one final-query epoch (forward, loss, backward) of every built-in mixer at state 80
  on the whole exact m = 12 family (12,720 sequences of 53 tokens).

Every recipe runs into a fresh folder (nothing is reused). Without a CUDA device the GPU
column reads "not measured" and the CPU figures are still printed. On a CUDA machine
(run ``python -m pytest benchmarks -k gpu --benchmark-only``) the whole group takes a few
minutes.
"""

import os
import time

import numpy as np
import pytest
import torch

from minip_learn.datasets import make_witness_suite
from minip_learn.experiments import mixers_experiment, witness_experiment
from minip_learn.nn import available_mixers, get_mixer, make_mixer

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TABLE_MIXERS = ("kernel", "retnet", "positional")


def _recipe(run, device, tmp_path):
    out = tmp_path / f"{run.__name__}-{device}"
    start = time.perf_counter()
    if device == "cpu":
        run(out=out, n_jobs=os.cpu_count(), progress=False, figures=False)
    else:
        run(out=out, devices=device, progress=False, figures=False)
    return time.perf_counter() - start


def _witness(**kwargs):
    return witness_experiment(quick=False, ensemble=True, **kwargs)


def _witness_check_10(**kwargs):
    return witness_experiment(quick=False, ensemble=True, kernel={"check_every": 10},
                              **kwargs)


def _mixers_quick(**kwargs):
    return mixers_experiment(quick=True, **kwargs)


def _epoch(name, X, y, device):
    kwargs = {"feature_map": "table"} if name in TABLE_MIXERS else {}
    kwargs.update(get_mixer(name).data_kwargs(X, **kwargs))
    torch.manual_seed(0)
    mixer = make_mixer(name, X.shape[2], 80, **kwargs).to(device)
    x = torch.as_tensor(X, dtype=torch.float32, device=device)
    target = torch.as_tensor(y, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(3):  # the first one warms up (kernels, allocator)
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        mixer.zero_grad()
        ((mixer(x, last=True)[:, 0] - target) ** 2).mean().backward()
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


RECIPES = {"witness --ensemble": _witness,
           "witness --ensemble, check_every=10": _witness_check_10,
           "mixers --quick": _mixers_quick}


@pytest.mark.benchmark(group="h-gpu")
@pytest.mark.parametrize("workload", list(RECIPES))
def test_recipe_cpu_and_gpu(benchmark, bench_record, workload, tmp_path):
    run = RECIPES[workload]
    # reading on the host every epoch or every 10th costs the same on the CPU: the
    # check_every variant runs on the GPU only
    devices = [d for d in DEVICES if d != "cpu"] if "check_every" in workload else DEVICES
    times = {"cpu": None, **{device: _recipe(run, device, tmp_path) for device in devices}}
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    bench_record("gpu", {"workload": f"minip-learn reproduce {workload}", **times,
                         "cuda_name": torch.cuda.get_device_name() if "cuda" in times
                         else None})


@pytest.mark.benchmark(group="h-gpu")
def test_final_query_epoch_cpu_and_gpu(benchmark, bench_record):
    suite = make_witness_suite(n_bits=12, construction="exact", max_sequences=10**5,
                               query="last")
    X, y = np.asarray(suite.X), np.asarray(suite.y)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count())
    try:
        for name in available_mixers():
            times = {device: _epoch(name, X, y, device) for device in DEVICES}
            bench_record("gpu", {"workload": f"final-query epoch, {name}, state 80", **times,
                                 "cuda_name": torch.cuda.get_device_name()
                                 if "cuda" in times else None})
    finally:
        torch.set_num_threads(threads)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
