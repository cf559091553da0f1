"""(j) Compute ops and host syncs an epoch: what a GPU would launch and wait for.

Counted, not timed, so the figures do not depend on the machine: every aten op that a
fit dispatches is seen by a :class:`torch.utils._python_dispatch.TorchDispatchMode`
(the mode sits below autograd, so the backward's ops are counted too). An op is a
*compute op* unless it only makes a view or reads metadata (``VIEW_OPS``): on a GPU
each compute op is at least one kernel launch. A *host sync* is an op that copies a
device value to the host (``SYNC_OPS``: ``.item()``, ``bool(t)``, and every
``.tolist()``): on a GPU the host waits there for the device to finish everything
queued before it.

Counted for:

* a single fit, ``KernelAttentionRegressor(rank=46, feature_map="table")`` on the R6
  family (4,186 sequences of 3 tokens, 24 bits), with ``check_every`` 1 and 10: every
  epoch's counts, from one ``on_epoch_begin`` to the next (so a check's reads belong
  to its epoch);
* a mixer fit of every built-in mixer at state 16 on the exact m = 8 family in
  final-query form, ``check_every=10``;
* the full witness recipe with stacked fits (``reproduce witness --ensemble``; the
  quick recipe with ``--bench-quick``), serial, in all.

pytest-benchmark times each counted run once (``--benchmark-only`` collects only what
it times); the counting adds a Python call per op, so those times are not the fits'.

Asserted (docs/performance.rst, group (j)): an epoch that is not a check makes no host
sync, in every fit counted here (after the first, whose forward prepares the input
once); an epoch of the single table head dispatches at most ``MAX_HEAD_OPS`` compute
ops. The performance page turns the counts into the launch floor they imply on a GPU.
"""

import collections
import statistics

import pytest
import torch
from skorch.callbacks import Callback
from torch.utils._python_dispatch import TorchDispatchMode

from _bench import QUICK
from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_witness_suite
from minip_learn.estimators import SequenceMixerRegressor
from minip_learn.nn import available_mixers

#: ops that make a view, read metadata or mark a profiler range: no kernel launch
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "alias", "detach",
    "permute", "transpose", "t", "unsqueeze", "squeeze", "expand", "slice", "select",
    "split", "unbind", "lift_fresh", "_record_function_enter_new",
    "_record_function_exit"})
#: ops that copy a value from the device to the host
SYNC_OPS = frozenset({"_local_scalar_dense", "item", "is_nonzero", "equal"})
#: the most compute ops an epoch of the single table kernel head may dispatch
MAX_HEAD_OPS = 60


class _Count(TorchDispatchMode):
    """Counts every dispatched op: compute ops and host syncs.

    ``Tensor.tolist`` of a CPU tensor dispatches nothing (of a GPU tensor, a copy to
    the host), so the mode also counts every ``tolist`` call as a host sync.
    """

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.syncs = 0
        self.names = collections.Counter()

    def __enter__(self):
        tolist = self._tolist = torch.Tensor.tolist

        def counted(t):
            self.syncs += 1
            self.names["tolist"] += 1
            return tolist(t)

        torch.Tensor.tolist = counted
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in VIEW_OPS:
            self.ops += 1
            self.names[name] += 1
        if name in SYNC_OPS:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


class _EpochCounts(Callback):
    """The counter's figures at every epoch's start and at the end of training."""

    def __init__(self, counter):
        self.counter = counter

    def initialize(self):
        self.marks_ = []
        return self

    def on_epoch_begin(self, net, **kwargs):
        self.marks_.append((self.counter.ops, self.counter.syncs))

    def on_train_end(self, net, **kwargs):
        self.marks_.append((self.counter.ops, self.counter.syncs))


def _once(benchmark, fn):
    """``fn()`` run once, timed by pytest-benchmark; its result."""
    out = []
    benchmark.pedantic(lambda: out.append(fn()), rounds=1, iterations=1, warmup_rounds=0)
    return out[0]


def count_epochs(make, X, y, *, max_epochs, check_every):
    """Per epoch (all but the last, whose counts include the end of training): compute
    ops, host syncs and whether it is a check; and the fit's counter."""
    counter = _Count()
    marks = _EpochCounts(counter)
    est = make(max_epochs=max_epochs, check_every=check_every, callbacks=[marks])
    with counter:
        est.fit(X, y)
    m = marks.marks_
    epochs = [(m[i + 1][0] - m[i][0], m[i + 1][1] - m[i][1], (i + 1) % check_every == 0)
              for i in range(len(m) - 2)]
    return epochs, counter


def _summary(epochs):
    """The figures of a fit's epochs. The first epoch is apart: its forward prepares
    the input once (e.g. the distinct tokens and token pairs of the pair form, read on
    the host), which later epochs reuse."""
    first, rest = epochs[0], epochs[1:]
    plain = [e for e in rest if not e[2]]
    checks = [e for e in rest if e[2]]
    return {
        "ops_per_epoch": statistics.median(e[0] for e in rest),
        "syncs_per_plain_epoch": max((e[1] for e in plain), default=0),
        "syncs_per_check": statistics.median(e[1] for e in checks) if checks else None,
        "first_epoch_ops": first[0], "first_epoch_syncs": first[1],
        "epochs": len(epochs)}


@pytest.mark.parametrize("check_every", [1, 10])
def test_single_head_epoch_ops(benchmark, bench_record, check_every):
    suite = make_witness_suite(24, 3)
    epochs, counter = _once(benchmark, lambda: count_epochs(
        lambda **kw: KernelAttentionRegressor(rank=46, feature_map="table", random_state=0,
                                              **kw),
        suite.X, suite.y, max_epochs=41, check_every=check_every))
    row = {"fit": "KernelAttentionRegressor(rank=46, table), R6", "check_every": check_every,
           **_summary(epochs)}
    bench_record("dispatch", row)
    print(row, counter.names.most_common(12))
    assert row["ops_per_epoch"] <= MAX_HEAD_OPS, row
    if check_every > 1:
        assert row["syncs_per_plain_epoch"] == 0, row


def test_mixer_epoch_syncs(benchmark, bench_record):
    suite = make_witness_suite(n_bits=8, construction="exact", max_sequences=10**5,
                               query="last")

    def every_mixer():
        return {name: count_epochs(
            lambda name=name, **kw: SequenceMixerRegressor(name, state_size=16,
                                                           random_state=0, **kw),
            suite.X, suite.y, max_epochs=21, check_every=10)[0]
            for name in available_mixers()}

    failures = []
    for name, epochs in _once(benchmark, every_mixer).items():
        row = {"fit": f"SequenceMixerRegressor({name!r}, state_size=16), exact m = 8",
               "check_every": 10, **_summary(epochs)}
        bench_record("dispatch", row)
        print(row)
        if row["syncs_per_plain_epoch"]:
            failures.append(row)
    assert not failures, failures


def test_witness_recipe_counts(benchmark, bench_record, tmp_path):
    from minip_learn.experiments import witness_experiment

    counter = _Count()

    def run():
        with counter:
            return witness_experiment(quick=QUICK, ensemble=True, n_jobs=1, progress=False,
                                      figures=False, out=tmp_path / "witness")

    res = _once(benchmark, run)
    assert res.checks["none_solved_below_bound"]
    row = {"fit": f"reproduce witness --ensemble{' --quick' if QUICK else ''} (serial)",
           "check_every": 1, "ops": counter.ops, "syncs": counter.syncs}
    bench_record("dispatch", row)
    print(row, counter.names.most_common(12))
