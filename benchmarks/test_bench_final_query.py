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

``test_estimator_epoch`` times one final-query epoch through
``SequenceMixerRegressor.fit`` (a fit of 21 epochs less a fit of one, over 20) of
every built-in mixer at state 80 on the whole family, with two torch threads (the
machine's two cores), beside the epoch of a reference written from the formulas
(:func:`reference_epochs`: a rank-80 table kernel head, the kernel between the
distinct tokens gathered per sequence, affine value and readout, forward, backward and
an Adam step), the two alternating in every round. The ratio of the two is asserted
at most the ``EPOCH_OVER_REFERENCE`` bound of each mixer.

Asserted, against docs/performance.rst, group (g), with half the documented figure as
the margin: in ``test_final_query_epoch`` the two forms' outputs at the last position
agree and the last-position epoch's speed-up over the whole-sequence one is at least
half the documented one (``SPEEDUP``), at most 1.5x asserted (see the comment there);
in ``test_full_grid_epoch`` the grid's states are the documented ones
(``GRID_STATES``, about the exact rank 80) and an epoch at the largest state, over one
at the smallest (the median over the mixers), costs at least half the documented
multiple (``GRID_EPOCH``: the cost grows with the state as the budget says).
"""

import statistics
import time

import numpy as np
import pytest
import torch

from _bench import check_ratio, exact_family, make_bench_mixer, mixer_kwargs, paired
from minip_learn import SequenceMixerRegressor
from minip_learn.experiments.mixers import SETTINGS, state_grid
from minip_learn.nn import available_mixers, get_mixer

STATE = 80
#: sequences on which the two forms alternate (full, quick)
N_RATIO = {False: 2544, True: 636}
#: speed-up of the last-position epoch over the whole-sequence one on 2,544 sequences
#: (docs/performance.rst, group (g))
SPEEDUP = {"deltanet": 31.2, "gla": 1356, "kernel": 150.5, "linear": 47.2, "mamba": 48.7,
           "positional": 6.1, "retnet": 115.2, "softmax": 42.2}
#: the full grid's states on the whole family and one epoch of each mixer at each of
#: them, in seconds (docs/performance.rst, group (g), the full mixers grid)
GRID_STATES = [40, 79, 80, 160, 320]
GRID_EPOCH = {
    "deltanet": [0.10, 0.11, 0.10, 0.26, 0.38],
    "gla": [0.11, 0.15, 0.15, 0.15, 0.48],
    "kernel": [0.02, 0.02, 0.03, 0.03, 0.04],
    "linear": [0.03, 0.03, 0.03, 0.03, 0.03],
    "mamba": [0.16, 0.26, 0.26, 0.47, 0.97],
    "positional": [0.04, 0.05, 0.04, 0.05, 0.06],
    "retnet": [0.04, 0.04, 0.03, 0.03, 0.03],
    "softmax": [0.03, 0.03, 0.03, 0.03, 0.03],
}

#: one estimator epoch over one epoch of the reference (:func:`reference_epochs`), at
#: most: every per-token mixer within 2x of the formulas (measured: 1.1x-1.2x,
#: positional 1.5x, about 10 ms the reference's epoch on 2 cores); the recurrent
#: mixers, which step once per run of equal tokens, within their targets of 0.3 s
#: (deltanet, gla) and 0.6 s (mamba) an epoch over the reference's 10 ms
EPOCH_OVER_REFERENCE = {"deltanet": 30.0, "gla": 30.0, "kernel": 2.0, "linear": 2.0,
                        "mamba": 60.0, "positional": 2.0, "retnet": 2.0, "softmax": 2.0}
#: the torch threads of ``test_estimator_epoch``: the development machine's two cores
EPOCH_THREADS = 2


@pytest.fixture(scope="module")
def family():
    suite = exact_family()
    X = np.asarray(suite.X)
    return X, torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(
        np.asarray(suite.y), dtype=torch.float32), int(suite.certified_min_rank)


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
    mixer = make_bench_mixer(name, X, STATE)
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
    # Margin: half the documented speed-up, and never more than 1.5x asserted. The two
    # forms alternate within a round and share its load, but the larger figures
    # measure the memory system as much as the code (gla's whole-sequence form streams
    # N x N x r scores, 2.3 GB at 2,544 sequences): with other jobs busy on the 2-core
    # machine gla's 119x came out at 9.5x-36x and mamba's 4.0x at 1.7x-2.3x, and the
    # quick run has a quarter of the sequences. 1.5x still fails a last-position form
    # that computed every position (about 1x) for the seven mixers documented at 2.9x
    # or more.
    check_ratio(f"{name}: speed-up of the last-position epoch over every position",
                1 / res["ratio"], claim=f"{SPEEDUP[name]}x",
                at_least=min(0.5 * SPEEDUP[name], 1.5))


@pytest.mark.benchmark(group="g-final-query")
def test_full_grid_epoch(benchmark, bench_record, quick, family):
    X, x, y, rank = family
    full = SETTINGS["full"]
    sizes = state_grid(rank, full["state_factors"], below_bound=full["below_bound"])
    assert rank == 80 and list(sizes) == GRID_STATES, (rank, sizes)
    if quick:  # the first sequences, the grid's two smallest states
        x, y, sizes = x[:N_RATIO[True]], y[:N_RATIO[True]], sizes[:2]
    epochs = {}

    def run():
        for name in available_mixers():
            for state in sizes:
                mixer = make_bench_mixer(name, X, state)
                _epoch(mixer, x, y, last=True)()  # warm-up
                epochs[name, state] = _epoch(mixer, x, y, last=True)()

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    for (name, state), seconds in epochs.items():
        bench_record("grid_epoch", {"name": name, "state": state, "epoch": seconds,
                                    "n_sequences": len(x), "seq_len": X.shape[1],
                                    "max_epochs": full["mixer"]["max_epochs"],
                                    "n_seeds": len(full["seeds"])})
    # The grid's price. A mixer that computes its maps once per distinct token
    # (``per_token_maps``) works on the 80 distinct tokens of the family, so its epoch
    # hardly grows with the state; the recurrent mixers carry a state per sequence and
    # run of equal tokens, and theirs does. Claims: the documented growth from the
    # smallest to the largest state, as the median over the recurrent mixers of each
    # one's ratio (4.4x for states 40 to 320; 1.4x in the quick run's 40 and 79), at
    # least half of it; and the per-token mixers' median at most 3x (documented: 1.0x,
    # each 0.75x to 2.0x). The
    # epochs run one after another, not alternating, so a burst of load can land on one
    # of them (seen: one mixer's epoch 2.7x slower at the smaller state); the medians
    # leave such a one out.
    small, large = sizes[0], sizes[-1]
    per_token = [n for n in available_mixers() if get_mixer(n).per_token_maps]
    recurrent = [n for n in available_mixers() if n not in per_token]

    def growth(cost, names):
        return statistics.median(cost(n, large) / cost(n, small) for n in names)

    claimed = growth(lambda n, s: GRID_EPOCH[n][GRID_STATES.index(s)], recurrent)
    check_ratio(f"one epoch at state {large} / at state {small}, median over the "
                f"recurrent mixers {recurrent}", growth(lambda n, s: epochs[n, s], recurrent),
                claim=f"{claimed:.2f}x", at_least=0.5 * claimed)
    check_ratio(f"one epoch at state {large} / at state {small}, median over the "
                f"per-token mixers {per_token}", growth(lambda n, s: epochs[n, s], per_token),
                claim="1.0x", at_most=3.0)


def reference_epochs(X, y, epochs, *, rank=STATE, seed=0):
    """Seconds per epoch of a rank-``rank`` table kernel head in the final-query form,
    written from the formulas: log-feature tables ``lq``, ``lk`` of the ``U`` distinct
    tokens, the kernel ``K = exp(lq) exp(lk)^T`` between them (``U x U``), every
    sequence's weights ``K[last token, token j]`` gathered from it, affine values
    ``v = V x + c`` of the distinct tokens, the readout ``<W x + w, u> + <b, x> + b0``
    of the last token, the mean squared error, its backward and an Adam step (lr
    0.01), ``epochs`` times, full batch."""
    codes = torch.as_tensor((X.astype(np.int64) << np.arange(X.shape[2])).sum(-1))
    uniq, tok = torch.unique(codes, return_inverse=True)
    tokens = ((uniq[:, None] >> torch.arange(X.shape[2])) & 1).float()
    target = torch.as_tensor(y, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    U, m = tokens.shape

    def param(*shape, scale=0.1):
        return (scale * torch.randn(*shape, generator=g)).requires_grad_()

    lq, lk, V, c = param(U, rank), param(U, rank), param(m, m), param(m)
    W, w, b, b0 = param(m, m), param(m), param(m), param(())
    opt = torch.optim.Adam([lq, lk, V, c, W, w, b, b0], lr=0.01)
    flat = (tok[:, -1:] * U + tok).reshape(-1)
    last = tokens[tok[:, -1]]
    start = time.perf_counter()
    for _ in range(epochs):
        opt.zero_grad()
        kernel = torch.exp(lq) @ torch.exp(lk).T
        weights = kernel.reshape(-1).index_select(0, flat).view(tok.shape)
        per_token = torch.zeros(len(tok), U).scatter_add(1, tok, weights)
        u = (per_token @ (tokens @ V.T + c)) / weights.sum(-1, keepdim=True)
        out = ((last @ W.T + w) * u).sum(-1) + last @ b + b0
        ((out - target) ** 2).mean().backward()
        opt.step()
    return (time.perf_counter() - start) / epochs


def _estimator_epoch(name, X, y):
    def fit(epochs):
        est = SequenceMixerRegressor(name, state_size=STATE, max_epochs=epochs,
                                     mixer_kwargs=mixer_kwargs(name) or None, random_state=0)
        start = time.perf_counter()
        est.fit(X, y)
        assert est.n_epochs_ == epochs
        return time.perf_counter() - start
    return (fit(21) - fit(1)) / 20


@pytest.mark.benchmark(group="g-final-query")
@pytest.mark.parametrize("name", sorted(EPOCH_OVER_REFERENCE))
def test_estimator_epoch(benchmark, bench_record, quick, family, name):
    X = family[0]
    y = family[2].numpy()
    threads = torch.get_num_threads()
    torch.set_num_threads(EPOCH_THREADS)
    try:
        _estimator_epoch(name, X, y)  # warm-up
        reference = []

        def setup():
            reference.append(reference_epochs(X, y, 20))

        epochs = []
        benchmark.pedantic(lambda: epochs.append(_estimator_epoch(name, X, y)), setup=setup,
                           rounds=1 if quick else 3, iterations=1, warmup_rounds=0)
    finally:
        torch.set_num_threads(threads)
    ratio = statistics.median(e / r for e, r in zip(epochs, reference, strict=True))
    bench_record("estimator_epoch", {"name": name, "epoch": statistics.median(epochs),
                                     "reference": statistics.median(reference),
                                     "ratio": ratio, "threads": EPOCH_THREADS,
                                     "n_sequences": len(X), "seq_len": X.shape[1]})
    # Margin: the bound is the target itself (within 2x of the formulas), above the
    # measured 1.1x-1.5x on the idle machine
    check_ratio(f"{name}: one estimator epoch / one epoch of the formulas", ratio,
                claim=f"<= {EPOCH_OVER_REFERENCE[name]}x",
                at_most=EPOCH_OVER_REFERENCE[name])
