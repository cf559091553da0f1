"""(g) One final-query training epoch per mixer: the last position alone beside every
position.

A fit on final-query targets reads one output per sequence; the mixers compute it with
``forward(x, last=True)`` (the last query over every key, a state read out once). The
baseline is the whole-sequence form ``mixer(x)[:, -1:]``, every position computed and
the last one read. One epoch is one full-batch step (forward, loss, backward) of the
mixer at state 80 (``table`` features for the kernel mixers) on the exact m = 12 family
in final-query form (12,720 sequences of 53 tokens, exact rank 80). The two forms
alternate on its first ``N_RATIO`` sequences (the whole-sequence form of ``gla`` builds
``N x N x r`` scores and takes minutes on the whole family); the final-query form is
also timed on the whole family, against the target of 2 s an epoch on 2 cores.

``test_full_grid_epoch`` prices the mixers leaderboard at full size on this machine:
one final-query epoch (one torch thread, as every fit of a recipe has) of every mixer
at every state size the full grid gives the whole exact m = 12 family
(:func:`~minip_learn.experiments.mixers.state_grid` of its exact rank with the full
grid's factors), so that one epoch of the grid for one seed is their sum and the
grid's whole budget (every fit running ``max_epochs`` epochs, for every seed) is that
sum times epochs and seeds.
"""

import time

import numpy as np
import pytest
import torch

from _bench import paired
from minip_learn.datasets import make_witness_suite
from minip_learn.experiments.mixers import SETTINGS, state_grid
from minip_learn.nn import available_mixers, get_mixer, make_mixer

STATE = 80
#: sequences on which the two forms alternate (full, quick)
N_RATIO = {False: 2544, True: 636}
TABLE_MIXERS = ("kernel", "retnet", "positional")


@pytest.fixture(scope="module")
def family():
    suite = make_witness_suite(n_bits=12, construction="exact", max_sequences=10**5,
                               query="last")
    X = np.asarray(suite.X)
    return X, torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(
        np.asarray(suite.y), dtype=torch.float32), int(suite.certified_min_rank)


def _mixer(name, X, state=STATE):
    kwargs = {"feature_map": "table"} if name in TABLE_MIXERS else {}
    kwargs.update(get_mixer(name).data_kwargs(X, **kwargs))
    torch.manual_seed(0)
    return make_mixer(name, X.shape[2], state, **kwargs)


def _epoch(mixer, x, y, *, last):
    def run():
        start = time.perf_counter()
        mixer.zero_grad()
        out = mixer(x, last=True) if last else mixer(x)[:, -1:]
        ((out[:, 0] - y) ** 2).mean().backward()
        return time.perf_counter() - start
    return run


@pytest.mark.benchmark(group="g-final-query")
@pytest.mark.parametrize("name", available_mixers())
def test_final_query_epoch(benchmark, bench_record, quick, family, name):
    X, x, y, _ = family
    n = N_RATIO[quick]
    mixer = _mixer(name, X)
    _epoch(mixer, x[:n], y[:n], last=True)()  # warm-up
    _epoch(mixer, x[:n], y[:n], last=False)()
    with torch.no_grad():  # the same outputs at the last position
        torch.testing.assert_close(mixer(x[:64], last=True), mixer(x[:64])[:, -1:],
                                   rtol=1e-4, atol=1e-5)
    res = paired(benchmark, _epoch(mixer, x[:n], y[:n], last=True),
                 _epoch(mixer, x[:n], y[:n], last=False), rounds=2 if quick else 3)
    whole = min(_epoch(mixer, x, y, last=True)() for _ in range(1 if quick else 2))
    bench_record("final_query", {"name": name, "n_ratio": n, "n_sequences": len(X),
                                 "seq_len": X.shape[1], "whole_last": whole, **res})


@pytest.mark.benchmark(group="g-final-query")
def test_full_grid_epoch(benchmark, bench_record, quick, family):
    X, x, y, rank = family
    full = SETTINGS["full"]
    sizes = state_grid(rank, full["state_factors"], below_bound=full["below_bound"])
    if quick:  # the first sequences, the grid's two smallest states
        x, y, sizes = x[:N_RATIO[True]], y[:N_RATIO[True]], sizes[:2]
    epochs = {}

    def run():
        for name in available_mixers():
            for state in sizes:
                mixer = _mixer(name, X, state)
                _epoch(mixer, x, y, last=True)()  # warm-up
                epochs[name, state] = _epoch(mixer, x, y, last=True)()

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    for (name, state), seconds in epochs.items():
        bench_record("grid_epoch", {"name": name, "state": state, "epoch": seconds,
                                    "n_sequences": len(x), "seq_len": X.shape[1],
                                    "max_epochs": full["mixer"]["max_epochs"],
                                    "n_seeds": len(full["seeds"])})
