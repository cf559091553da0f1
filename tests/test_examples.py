"""Run every gallery script in ``examples/`` so that none can rot.

Each script runs as a plain ``python examples/plot_x.py`` in a subprocess, with the
non-interactive matplotlib backend and ``MINIP_EXAMPLES_FAST=1`` (each example shrinks
its grid to a few seconds of training). The full-size defaults run when the docs are
built (``python -m sphinx -W --keep-going -b html docs docs/_build/html``).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("plot_*.py"))
#: seconds allowed per example in fast mode (generous: CI machines are shared)
TIMEOUT = 300


def test_examples_found():
    assert len(EXAMPLES) >= 8, [p.name for p in EXAMPLES]


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script, tmp_path):
    if script.name == "plot_dask_sweep.py":
        pytest.importorskip("distributed")
    env = dict(os.environ, MPLBACKEND="Agg", MINIP_EXAMPLES_FAST="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=TIMEOUT,
    )
    assert proc.returncode == 0, (
        f"{script.name} exited with {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}"
        f"\n--- stderr ---\n{proc.stderr[-4000:]}"
    )
