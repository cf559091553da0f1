"""certify's data runs forward through the layers: the walk of ``X`` leaves a module
for good at most a few times.

The walk: every call of a function of the package that receives ``X`` itself, or an
array or family that such a call returned (the data derived from ``X``), in the order
of the calls. Consecutive calls in one module are one step; a *return* is a step into
a module the walk had already left. A walk that keeps coming back to a module is one
concept spread over several places.
"""

import sys

import numpy as np

from minip_learn.compact import CompactFamily
from minip_learn.datasets import make_witness_suite
from minip_learn.theory import certify

MAX_RETURNS = 4


def _arguments(frame):
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return [frame.f_locals.get(name) for name in names]


def _walk(func, X):
    """The modules of the calls that receive ``X`` or data derived from it."""
    tracked, modules = {id(X)}, []

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("minip_learn"):
            return
        takes_data = any(a is not None and id(a) in tracked for a in _arguments(frame))
        if event == "call" and takes_data:
            modules.append(module)
        elif event == "return" and takes_data and isinstance(arg, np.ndarray | CompactFamily):
            tracked.add(id(arg))

    sys.setprofile(profile)
    try:
        func(X)
    finally:
        sys.setprofile(None)
    steps = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    return steps


def _returns(steps):
    return sum(1 for i, m in enumerate(steps) if m in steps[:i])


def test_the_walk_counts_returns():
    # the measure itself: a -> b -> a -> c -> b returns twice
    assert _returns(["a", "b", "a", "c", "b"]) == 2
    assert _returns(["a", "b", "c"]) == 0


def test_certify_walks_its_data_forward():
    X = make_witness_suite(construction="small").X
    steps = _walk(certify, X)
    assert "minip_learn.theory.certify" in steps and len(steps) >= 3  # it saw the walk
    assert _returns(steps) <= MAX_RETURNS, " -> ".join(steps)
