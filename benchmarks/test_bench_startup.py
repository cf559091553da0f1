"""(f) Command-line start-up: ``minip-learn --help`` beside a bare Python start.

The command line answers ``--help``, ``--version`` and argument errors without importing
torch or scikit-learn (they are imported when a command runs). Each round starts a fresh
interpreter: the target runs ``python -m minip_learn --help``, the baseline
``python -c pass``; a third timing, ``python -c "import minip_learn.estimators"``, shows
what an eager import of the estimators would cost. Target: ``--help`` under 0.5 s on
2 cores.
"""

import subprocess
import sys
import time

import pytest

from _bench import paired

COMMANDS = {
    "help": [sys.executable, "-m", "minip_learn", "--help"],
    "bare python": [sys.executable, "-c", "pass"],
    "import estimators": [sys.executable, "-c", "import minip_learn.estimators"],
}


def _run(argv):
    def run():
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        return time.perf_counter() - start
    return run


@pytest.mark.benchmark(group="f-cli-startup")
def test_cli_startup(benchmark, bench_record, quick):
    rounds = 3 if quick else 7
    res = paired(benchmark, _run(COMMANDS["help"]), _run(COMMANDS["bare python"]),
                 rounds=rounds)
    eager = sorted(_run(COMMANDS["import estimators"])() for _ in range(rounds))
    bench_record("startup", {"rounds": rounds, "eager_median": eager[len(eager) // 2],
                             **res})
