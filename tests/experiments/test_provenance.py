"""provenance.json: every recipe's output folder says where its files came from."""

import json
import re
import subprocess

import numpy as np

from minip_learn import __version__
from minip_learn.experiments import recorded_command, run_experiment
from minip_learn.experiments._shared import git_state, jsonable

TINY = dict(seq_lens=(1, 2), ranks=(1,), seeds=(0,), progress=False, figures=False,
            n_jobs=1, kernel={"max_epochs": 3})
KEYS = {"recipe", "grid", "command", "complete", "minip_learn_version", "git_commit",
        "git_dirty", "started_utc", "written_utc", "elapsed_s", "fits_computed",
        "fits_resumed", "cpu_count", "platform", "python_version", "torch_version",
        "options", "settings"}


def test_recipe_writes_provenance_with_its_settings(tmp_path):
    res = run_experiment("length", out=tmp_path, **TINY)
    path = tmp_path / "provenance.json"
    assert res.files["provenance"] == path and list(res.files)[-1] == "provenance"
    prov = json.loads(path.read_text())
    assert set(prov) == KEYS and prov == res.provenance
    assert prov["recipe"] == "length" and prov["grid"] == "quick" and prov["complete"]
    assert prov["minip_learn_version"] == __version__
    assert prov["settings"] == json.loads(json.dumps(jsonable(res.settings)))
    assert prov["settings"]["seq_lens"] == [1, 2] and prov["settings"]["ranks"] == [1]
    assert prov["settings"]["kernel"]["max_epochs"] == 3
    assert prov["options"] == {"n_jobs": 1, "devices": None, "ensemble": False,
                               "figures": False}
    # outside the command line: the Python call
    assert prov["command"] == (
        f"length_experiment(quick=True, out={str(tmp_path)!r}, n_jobs=1, ensemble=False, "
        "figures=False, seq_lens=(1, 2), ranks=(1,), seeds=(0,), kernel={'max_epochs': 3})")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", prov["written_utc"])
    assert prov["started_utc"] <= prov["written_utc"] and prov["elapsed_s"] >= 0
    assert prov["cpu_count"] >= 1 and prov["python_version"].count(".") == 2
    assert prov["torch_version"] and prov["platform"]
    assert prov["fits_computed"] == len(res.results) == 2 and prov["fits_resumed"] == 0
    if prov["git_commit"] is None:
        assert prov["git_dirty"] is None
    else:
        assert re.fullmatch(r"[0-9a-f]{40}", prov["git_commit"])
        assert isinstance(prov["git_dirty"], bool)
    # a rerun resumes every fit and says so
    again = run_experiment("length", out=tmp_path, **TINY)
    assert again.provenance["fits_computed"] == 0 and again.provenance["fits_resumed"] == 2


def test_recorded_command_and_no_output_folder():
    with recorded_command("minip-learn reproduce length --quick --n-jobs 1"):
        res = run_experiment("length", **TINY)
    assert res.files == {}
    assert res.provenance["command"] == "minip-learn reproduce length --quick --n-jobs 1"
    res = run_experiment("length", **TINY)
    assert res.provenance["command"].startswith("length_experiment(quick=True, n_jobs=1")


def test_git_state_without_a_checkout_or_without_git(tmp_path, monkeypatch):
    assert git_state(tmp_path) == (None, None)
    assert git_state(tmp_path / "missing") == (None, None)

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert git_state(tmp_path) == (None, None)


def test_git_state_of_a_checkout(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    try:
        git("init", "-q")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
            "-m", "empty")
    except (OSError, subprocess.CalledProcessError):
        return  # no usable git here: nothing to compare with
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    assert git_state(pkg) == (None, None)  # not tracked: not the package's checkout
    git("add", "pkg/__init__.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "pkg")
    commit, dirty = git_state(pkg)
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and dirty is False
    (pkg / "__init__.py").write_text("x = 1\n")
    assert git_state(pkg) == (commit, True)


def test_jsonable_settings():
    value = {"ranks": (1, np.int64(2)), "lr": np.float32(0.5), "ok": np.bool_(True),
             "inf": float("inf"), 3: [None, "a"], "obj": object}
    out = jsonable(value)
    assert out == {"ranks": [1, 2], "lr": 0.5, "ok": True, "inf": "inf", "3": [None, "a"],
                   "obj": repr(object)}
    json.dumps(out)
