"""Tests of the rank/seed sweep: results, summary, resume, parallel backends, devices."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from joblib import parallel_config
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.model_selection import GridSearchCV

from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_minip
from minip_learn.metrics import get_scorers
from minip_learn.model_selection import (
    FullSetSplit,
    ResultsFolderWarning,
    check_writable,
    cv_results_to_frame,
    load_sweep,
    rank_sweep,
    resolve_devices,
    summarize_sweep,
)
from minip_learn.model_selection._execution import _assign_devices


class _Module:
    def __init__(self, nonnegative):
        self.nonnegative = nonnegative


class _Net:
    def __init__(self, module):
        self.module_ = module


class MemorizingRegressor(RegressorMixin, BaseEstimator):
    """Instant stand-in: 'solves' its training set when ``rank >= solve_from``."""

    def __init__(self, rank=1, *, solve_from=4, sleep=0.0, nonnegative=True,
                 random_state=None, device="cpu"):
        self.rank = rank
        self.solve_from = solve_from
        self.sleep = sleep
        self.nonnegative = nonnegative
        self.random_state = random_state
        self.device = device

    def fit(self, X, y):
        time.sleep(self.sleep)
        self.y_ = np.asarray(y, dtype=float)
        self.n_epochs_ = 7
        self.net_ = _Net(_Module(self.nonnegative))
        return self

    def predict(self, X):
        return self.y_ + (0.0 if self.rank >= self.solve_from else 0.7)


@pytest.fixture(scope="module")
def data():
    return make_minip(24, seq_len=2, n_bits=6, random_state=0)


def test_small_kernel_sweep_end_to_end(data):
    X, y = data
    est = KernelAttentionRegressor(max_epochs=25, stop_tolerance=0.5)
    res = rank_sweep(est, X, y, ranks=[2, 4], seeds=[0, 1], progress=False)
    df = res.results
    assert len(df) == 4 and res.n_computed == 4 and res.n_resumed == 0 and res.path is None
    for col in ("fit_id", "estimator", "rank", "seed", "feature_map", "exact_match",
                "token_accuracy", "solved", "max_abs_error", "n_epochs", "fit_time", "device"):
        assert col in df, col
    assert df[["rank", "seed"]].values.tolist() == [[2, 0], [2, 1], [4, 0], [4, 1]]
    assert (df["max_abs_error"] >= 0).all()  # un-negated
    assert (df["n_epochs"] <= 25).all() and (df["n_epochs"] >= 1).all()
    assert df["solved"].dtype == bool
    assert (df["solved"] == (df["max_abs_error"] < 0.5)).all()
    assert (df["feature_map"] == "elu+1").all()
    s = res.summary
    assert s["rank"].tolist() == [2, 4] and s["n_fits"].tolist() == [2, 2]
    assert ((s["solved_ci_low"] <= s["solved_fraction"])
            & (s["solved_fraction"] <= s["solved_ci_high"])).all()
    np.testing.assert_allclose(s["exact_match_mean"], df.groupby("rank")["exact_match"].mean())


def test_summary_wilson_interval_and_groups():
    df = pd.DataFrame({"model": ["kernel"] * 4 + ["softmax"] * 2,
                       "rank": [8, 8, 8, 8, np.nan, np.nan],
                       "solved": [True, False, False, False, True, True],
                       "exact_match": [1, 0.5, 0.5, 0.5, 1, 1]})
    s = summarize_sweep(df)
    assert len(s) == 2
    k = s[s["model"] == "kernel"].iloc[0]
    assert k["n_fits"] == 4 and k["n_solved"] == 1 and k["solved_fraction"] == 0.25
    assert 0 < k["solved_ci_low"] < 0.25 < k["solved_ci_high"] < 1
    sm = s[s["model"] == "softmax"].iloc[0]
    assert np.isnan(sm["rank"]) and sm["solved_fraction"] == 1.0 and sm["solved_ci_high"] == 1.0
    with pytest.raises(ValueError, match="not in the results"):
        summarize_sweep(df, by=["nope"])


def test_out_folder_resume_and_extension(tmp_path, data):
    X, y = data
    est = MemorizingRegressor()
    res = rank_sweep(est, X, y, ranks=[2, 4], seeds=[0, 1], out=tmp_path, progress=False)
    files = sorted(res.path.glob("fit-*.json"))
    assert len(files) == 4 and res.path.parent == tmp_path
    assert (res.path / "config.json").exists()
    stamps = {f.name: f.stat().st_mtime_ns for f in files}
    dead = res.path / ".tmp-fit-x.json.999999999"  # left by a killed writer
    alive = res.path / f".tmp-fit-y.json.{os.getpid()}"  # a live writer's
    dead.write_text("{")
    alive.write_text("{")
    again = rank_sweep(est, X, y, ranks=[2, 4], seeds=[0, 1], out=tmp_path, progress=False)
    assert again.n_computed == 0 and again.n_resumed == 4 and again.path == res.path
    pd.testing.assert_frame_equal(again.results, res.results)
    assert not dead.exists() and alive.exists()
    alive.unlink()
    more = rank_sweep(est, X, y, ranks=[2, 4, 8], seeds=[0, 1, 2], out=tmp_path,
                      progress=False)
    assert more.n_resumed == 4 and more.n_computed == 5 and len(more.results) == 9
    assert {f.name: f.stat().st_mtime_ns for f in files} == stamps
    assert len(load_sweep(tmp_path)) == 9 and len(load_sweep(res.path)) == 9
    # a different configuration goes to a different run folder
    other = rank_sweep(MemorizingRegressor(solve_from=2), X, y, ranks=[2], seeds=[0],
                       out=tmp_path, progress=False)
    assert other.path != res.path and other.n_computed == 1


_KILL_SCRIPT = """
import sys, time
import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from minip_learn.datasets import make_minip
from minip_learn.model_selection import rank_sweep

class MemorizingRegressor(RegressorMixin, BaseEstimator):
    def __init__(self, rank=1, *, solve_from=4, sleep=0.0, nonnegative=True,
                 random_state=None, device="cpu"):
        self.rank = rank
        self.solve_from = solve_from
        self.sleep = sleep
        self.nonnegative = nonnegative
        self.random_state = random_state
        self.device = device

    def fit(self, X, y):
        time.sleep(self.sleep)
        self.y_ = np.asarray(y, dtype=float)
        return self

    def predict(self, X):
        return self.y_ + (0.0 if self.rank >= self.solve_from else 0.7)

X, y = make_minip(24, seq_len=2, n_bits=6, random_state=0)
rank_sweep(MemorizingRegressor(sleep=float(sys.argv[2])), X, y, ranks=[1, 2, 4, 8],
           seeds=[0, 1, 2], out=sys.argv[1], name="killme", progress=False)
"""


def test_resume_after_kill(tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(_KILL_SCRIPT)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(script), str(out), "0.25"])
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            if len(list(out.glob("*/fit-*.json"))) >= 3 or proc.poll() is not None:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    finished = {f.name: f.read_text() for f in out.glob("*/fit-*.json")}
    assert 3 <= len(finished) < 12, "the sweep should have been killed mid-way"
    # the same sweep, rerun here with the class of the script
    ns = {"__name__": "killtest"}
    exec(_KILL_SCRIPT.split("X, y =")[0], ns)
    from minip_learn.datasets import make_minip as mk
    X, y = mk(24, seq_len=2, n_bits=6, random_state=0)
    res = rank_sweep(ns["MemorizingRegressor"](sleep=0.25), X, y, ranks=[1, 2, 4, 8],
                     seeds=[0, 1, 2], out=out, name="killme", progress=False)
    assert len(res.results) == 12 and res.results["fit_id"].is_unique
    assert res.n_resumed == len(finished) and res.n_computed == 12 - len(finished)
    files = list(out.glob("*/fit-*.json"))
    assert len(files) == 12 and not list(out.glob("*/.tmp-*"))
    for f in files:  # finished fits were not refit (rows byte-identical)
        if f.name in finished:
            assert f.read_text() == finished[f.name]
    pids = set(res.results["pid"])
    assert os.getpid() in pids and len(pids) == 2  # the killed process and this one


def test_certified_bound_violation_raises(data):
    X, y = data
    with pytest.raises(RuntimeError, match=r"certified minimum\s+rank is 8.*bug"):
        rank_sweep(MemorizingRegressor(solve_from=2), X, y, ranks=[4], seeds=[0],
                   certified_min_rank=8, progress=False)
    res = rank_sweep(MemorizingRegressor(solve_from=8), X, y, ranks=[4, 8], seeds=[0],
                     certified_min_rank=8, progress=False)
    assert res.results["below_certified_bound"].tolist() == [True, False]
    assert res.results["solved"].tolist() == [False, True]
    # signed kernels (THEORY R7) are outside the theorem: recorded, not an error
    res = rank_sweep(MemorizingRegressor(solve_from=2, nonnegative=False), X, y, ranks=[4],
                     seeds=[0], certified_min_rank=8, progress=False)
    assert res.results["solved"].tolist() == [True]


def test_loky_parallel_and_device_assignment(data):
    X, y = data
    res = rank_sweep(MemorizingRegressor(), X, y, ranks=[1, 2, 4], seeds=[0, 1], n_jobs=2,
                     devices=["cpu", "cpu"], progress=False)
    df = res.results
    assert len(df) == 6 and (df["device"] == "cpu").all() and (df["n_threads"] == 1).all()
    assert os.getpid() not in set(df["pid"])
    assert df["solved"].tolist() == [False, False, False, False, True, True]


def test_devices_resolution_and_cuda_error(monkeypatch, data):
    import torch

    assert resolve_devices(None) is None
    assert resolve_devices("cpu") == ["cpu"]
    assert _assign_devices(["cuda:0", "cuda:1"], 5) == [
        "cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert _assign_devices(None, 2) == [None, None]
    with pytest.raises(ValueError, match="not a valid torch device"):
        resolve_devices("gpu!")
    with pytest.raises(ValueError, match="not supported"):
        resolve_devices(["cpu", "meta"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    X, y = data
    t0 = time.perf_counter()
    for devices in ("cuda", ["cpu", "cuda:1"]):
        with pytest.raises(ValueError, match="CUDA is not available"):
            rank_sweep(MemorizingRegressor(sleep=5), X, y, ranks=[1], seeds=[0],
                       devices=devices, progress=False)
    assert time.perf_counter() - t0 < 2  # at once, no fit started
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_devices("cuda") == ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="does not exist"):
        resolve_devices("cuda:2")


def test_validation_errors(data):
    X, y = data
    est = MemorizingRegressor()
    with pytest.raises(ValueError, match="invalid parameter"):
        rank_sweep(est, X, y, param_grid={"nope": [1]}, progress=False)
    with pytest.raises(ValueError, match="not both"):
        rank_sweep(est, X, y, ranks=[1], param_grid={"rank": [2]}, progress=False)
    with pytest.raises(ValueError, match="seeds="):
        rank_sweep(est, X, y, param_grid={"random_state": [2]}, progress=False)
    with pytest.raises(ValueError, match="duplicates"):
        rank_sweep(est, X, y, ranks=[1, 1], progress=False)
    with pytest.raises(ValueError, match="threads_per_fit"):
        rank_sweep(est, X, y, ranks=[1], threads_per_fit=0, progress=False)


@pytest.mark.parametrize("kwargs, match", [
    ({"seeds": True}, "seeds must be ints .*not bool; got True"),
    ({"seeds": [0, np.True_]}, "seeds must be ints .*not bool; got .*True"),
    ({"seeds": []}, "seeds must be a non-empty"),
    ({"seeds": [0.5]}, r"seeds must be ints \(or None\); got 0.5"),
    ({"seeds": "0"}, "seeds must be ints"),
    ({"seeds": 3.0}, "seeds must be ints"),
    ({"seeds": [1, 0, 1]}, "seeds must not contain duplicates; got 1 "),
    ({"seeds": [None, None]}, "duplicates"),
    ({"threads_per_fit": True}, "threads_per_fit must be an integer"),
    ({"threads_per_fit": 1.5}, "threads_per_fit must be an integer"),
    ({"n_jobs": 0}, "n_jobs"),
    ({"n_jobs": 1.5}, "n_jobs must be an integer"),
    ({"certified_min_rank": 2.5}, "certified_min_rank must be an integer"),
    ({"certified_min_rank": -1}, "certified_min_rank must be >= 0"),
    ({"devices": 3}, "devices must be None, a device string or a list"),
])
def test_settings_are_checked_before_any_folder_or_fit(kwargs, match, data, tmp_path):
    X, y = data
    out = tmp_path / "runs"
    with pytest.raises(ValueError, match=match):
        rank_sweep(MemorizingRegressor(sleep=5), X, y, ranks=[1], out=out, progress=False,
                   **kwargs)
    assert not out.exists()


def test_seeds_accept_ints_numpy_ints_and_none(data):
    X, y = data
    res = rank_sweep(MemorizingRegressor(), X, y, ranks=[1], seeds=(np.int64(4), None, 2),
                     progress=False)
    assert res.results["seed"].tolist()[::2] == [4, 2]
    assert res.results["seed"].isna().tolist() == [False, True, False]
    assert rank_sweep(MemorizingRegressor(), X, y, ranks=[1], seeds=7,
                      progress=False).results["seed"].tolist() == [7]


def test_param_grid_and_tags(data):
    X, y = data
    res = rank_sweep(MemorizingRegressor(), X, y, ranks=[2, 4],
                     param_grid={"solve_from": [2, 8]}, seeds=[0], tags={"model": "fake"},
                     progress=False)
    df = res.results
    assert len(df) == 4 and (df["model"] == "fake").all()
    assert set(res.summary.columns) >= {"model", "rank", "solve_from"}
    assert len(res.summary) == 4


def test_gridsearchcv_path_matches_rank_sweep(data):
    X, y = data
    est = MemorizingRegressor()
    search = GridSearchCV(est, {"rank": [2, 4], "random_state": [0, 1]}, cv=FullSetSplit(),
                          scoring=get_scorers(), refit=False).fit(X, y)
    cv = cv_results_to_frame(search.cv_results_)
    sw = rank_sweep(est, X, y, ranks=[2, 4], seeds=[0, 1], progress=False).results
    cv = cv.sort_values(["rank", "seed"]).reset_index(drop=True)
    for col in ("rank", "seed", "solved", "exact_match", "max_abs_error", "token_accuracy"):
        assert cv[col].tolist() == sw[col].tolist(), col
    s = summarize_sweep(cv)
    assert s["solved_fraction"].tolist() == [0.0, 1.0]


def test_dask_backend_on_local_cluster(data):
    distributed = pytest.importorskip("dask.distributed")
    X, y = data
    est = KernelAttentionRegressor(max_epochs=5)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        worker_pids = set(client.run(os.getpid).values())
        with parallel_config(backend="dask"):
            res = rank_sweep(est, X, y, ranks=[1, 2], seeds=[0, 1], progress=False)
    df = res.results
    assert len(df) == 4 and df["fit_id"].is_unique
    assert set(df["pid"]) <= worker_pids
    assert (df["n_epochs"] <= 5).all()


def test_rows_on_disk_are_json(tmp_path, data):
    X, y = data
    res = rank_sweep(MemorizingRegressor(), X, y, ranks=[4], seeds=[3], out=tmp_path,
                     name="my run", progress=False)
    assert res.path.name.startswith("my_run-")
    (f,) = res.path.glob("fit-*.json")
    row = json.loads(f.read_text())
    assert row["rank"] == 4 and row["seed"] == 3 and row["solved"] is True
    assert Path(f).name == f"fit-{row['fit_id']}.json"


def _small_head():
    return KernelAttentionRegressor(max_epochs=2)


def test_save_and_return_estimators(tmp_path, data):
    X, y = data
    kw = dict(ranks=[2, 4], seeds=[0], out=tmp_path, progress=False)
    res = rank_sweep(_small_head(), X, y, save_estimators=True, **kw)
    assert len(list(res.path.glob("est-*.safetensors"))) == 2
    assert not list(res.path.glob("est-*.joblib")) and not hasattr(res, "estimators")
    again = rank_sweep(_small_head(), X, y, return_estimators=True, **kw)
    assert again.n_computed == 0 and set(again.estimators) == set(res.results["fit_id"])
    est = again.estimators[res.results["fit_id"][1]]
    assert est.rank == 4 and est.predict(X).shape == y.shape
    mem = rank_sweep(MemorizingRegressor(), X, y, ranks=[2], seeds=[0, 1],
                     return_estimators=True, progress=False)
    assert [e.random_state for e in mem.estimators.values()] == [0, 1]
    with pytest.raises(ValueError, match="needs an output folder"):
        rank_sweep(MemorizingRegressor(), X, y, ranks=[2], save_estimators=True,
                   progress=False)


# -- results folders under faults -------------------------------------------------------
def _sweep_into(out, data, **kw):
    X, y = data
    kw.setdefault("ranks", [2, 4])
    kw.setdefault("seeds", [0, 1])
    est = kw.pop("estimator", None) or MemorizingRegressor()
    return rank_sweep(est, X, y, out=out, progress=False, **kw)


def _only_warning(record):
    (w,) = [w for w in record if issubclass(w.category, ResultsFolderWarning)]
    assert "\n" not in str(w.message)
    return str(w.message)


def test_record_cut_in_half_is_moved_aside_and_refitted(tmp_path, data):
    res = _sweep_into(tmp_path, data)
    victim = sorted(res.path.glob("fit-*.json"))[1]
    text = victim.read_text()
    victim.write_text(text[: len(text) // 2])  # a copy interrupted, a bad disk
    with pytest.warns(ResultsFolderWarning) as record:
        again = _sweep_into(tmp_path, data)
    message = _only_warning(record)
    assert str(victim) in message and "corrupt" in message
    assert (res.path / "corrupt" / victim.name).read_text() == text[: len(text) // 2]
    assert again.n_resumed == 3 and again.n_computed == 1
    assert len(again.results) == 4 and again.results["fit_id"].is_unique
    assert json.loads(victim.read_text())["fit_id"] == victim.stem[len("fit-"):]
    # nothing lost, nothing duplicated, the moved file is not read back
    assert len(load_sweep(tmp_path)) == 4
    third = _sweep_into(tmp_path, data)
    assert third.n_computed == 0 and third.n_resumed == 4


def test_load_sweep_skips_an_unreadable_record_naming_it(tmp_path, data):
    res = _sweep_into(tmp_path, data)
    victim = sorted(res.path.glob("fit-*.json"))[0]
    victim.write_text('{"fit_id": "x", "rank": 4,')
    with pytest.warns(ResultsFolderWarning, match=str(victim)):
        assert len(load_sweep(tmp_path)) == 3


@pytest.mark.parametrize("field, value, reason", [
    ("minip_learn_version", "0.0.1", "written by minip_learn 0.0.1"),
    ("config_id", "0123456789", "another configuration"),
])
def test_record_of_another_version_or_configuration_is_not_mixed_in(tmp_path, data, field,
                                                                    value, reason):
    res = _sweep_into(tmp_path, data)
    victim = sorted(res.path.glob("fit-*.json"))[2]
    row = json.loads(victim.read_text())
    row[field] = value
    row["solved"] = "foreign"
    victim.write_text(json.dumps(row))
    with pytest.warns(ResultsFolderWarning) as record:
        again = _sweep_into(tmp_path, data)
    message = _only_warning(record)
    assert str(victim) in message and reason in message and "foreign" in message
    assert (res.path / "foreign" / victim.name).exists()
    assert again.n_computed == 1 and (again.results["solved"] != "foreign").all()
    assert json.loads(victim.read_text())[field] == json.loads(
        sorted(res.path.glob("fit-*.json"))[0].read_text())[field] != value
    assert field not in again.results  # file fields stay in the files


def test_config_of_another_version_is_moved_aside(tmp_path, data):
    res = _sweep_into(tmp_path, data)
    cfg = json.loads((res.path / "config.json").read_text())
    assert cfg["config_id"] == res.path.name.rsplit("-", 1)[1]
    (res.path / "config.json").write_text(json.dumps({**cfg, "minip_learn_version": "0.0.1"}))
    with pytest.warns(ResultsFolderWarning, match="config.json: written by minip_learn 0.0.1"):
        _sweep_into(tmp_path, data, seeds=[0])
    assert json.loads((res.path / "config.json").read_text()) == cfg
    (res.path / "config.json").write_text("{")
    with pytest.warns(ResultsFolderWarning, match="config.json: unreadable"):
        _sweep_into(tmp_path, data, seeds=[0])


class _Trap:
    """Unpickling it runs code: it writes the file named ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path(self.marker).write_text, ("loaded",))


def test_unreadable_or_foreign_estimator_is_not_loaded_but_refitted(tmp_path, data):
    import joblib

    kw = dict(ranks=[2, 4], seeds=[0], save_estimators=True, return_estimators=True)
    res = _sweep_into(tmp_path, data, estimator=_small_head(), **kw)
    broken, swapped = sorted(res.path.glob("est-*.safetensors"))
    broken.write_bytes(broken.read_bytes()[:20])  # cut in half
    marker = tmp_path / "marker"
    joblib.dump(_Trap(marker), swapped)  # a file this sweep did not write
    with pytest.warns(ResultsFolderWarning) as record:
        again = _sweep_into(tmp_path, data, estimator=_small_head(), **kw)
    messages = [str(w.message) for w in record]
    assert any(str(broken) in m and "cannot be loaded" in m for m in messages)
    assert any(str(swapped) in m and "not the one its record was written with" in m
               for m in messages)
    assert not marker.exists()  # never unpickled
    assert again.n_computed == 2 and len(again.estimators) == 2
    assert all(e.predict(data[0]).shape == data[1].shape for e in again.estimators.values())
    assert len(list((res.path / "corrupt").glob("est-*"))) == 2
    third = _sweep_into(tmp_path, data, estimator=_small_head(), **kw)
    assert third.n_computed == 0 and len(third.estimators) == 2


def test_a_forged_record_of_a_pickle_is_moved_aside_and_refitted(tmp_path, data):
    """An earlier version's pickled estimator, its record's SHA-256 forged to match:
    never unpickled, moved aside with the record, the fit computed again."""
    import joblib

    kw = dict(ranks=[2], seeds=[0], save_estimators=True, return_estimators=True)
    res = _sweep_into(tmp_path, data, estimator=_small_head(), **kw)
    (saved,) = res.path.glob("est-*.safetensors")
    (record,) = res.path.glob("fit-*.json")
    marker = tmp_path / "marker"
    pickled = saved.with_suffix(".joblib")
    joblib.dump(_Trap(marker), pickled)
    saved.unlink()
    row = json.loads(record.read_text())
    row["estimator_sha256"] = hashlib.sha256(pickled.read_bytes()).hexdigest()
    record.write_text(json.dumps(row))
    with pytest.warns(ResultsFolderWarning) as caught:
        again = _sweep_into(tmp_path, data, estimator=_small_head(), **kw)
    messages = [str(w.message) for w in caught]
    assert any(str(pickled) in m and "a pickle" in m for m in messages)
    assert not marker.exists()  # never unpickled
    assert again.n_computed == 1 and len(again.estimators) == 1
    assert (res.path / "corrupt" / pickled.name).exists()


def test_saving_an_estimator_of_another_library_is_refused(tmp_path, data):
    with pytest.raises(ValueError, match="MemorizingRegressor"):
        _sweep_into(tmp_path, data, ranks=[2], seeds=[0], save_estimators=True)


_SHARE_SCRIPT = _KILL_SCRIPT.replace(
    'rank_sweep(MemorizingRegressor(sleep=float(sys.argv[2])), X, y, ranks=[1, 2, 4, 8],\n'
    '           seeds=[0, 1, 2], out=sys.argv[1], name="killme", progress=False)',
    'res = rank_sweep(MemorizingRegressor(sleep=float(sys.argv[2])), X, y,\n'
    '                 ranks=[1, 2, 4, 8], seeds=[0, 1, 2], out=sys.argv[1], name="shared",\n'
    '                 n_jobs=1, progress=False)\n'
    'print("computed", res.n_computed, "rows", len(res.results),\n'
    '      "unique", res.results["fit_id"].is_unique)')


def test_two_processes_share_one_folder(tmp_path):
    assert _SHARE_SCRIPT != _KILL_SCRIPT
    script = tmp_path / "share.py"
    script.write_text(_SHARE_SCRIPT)
    out = tmp_path / "out"
    procs = [subprocess.Popen([sys.executable, str(script), str(out), "1.0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode == 0 and "Traceback" not in stderr, stderr
        assert "rows 12 unique True" in stdout
    computed = [int(stdout.split()[1]) for stdout, _ in outputs]
    assert sum(computed) == 12  # each fit computed once, by one of the two
    pids = {p.pid for p in procs}
    assert set(load_sweep(out)["pid"]) <= pids
    files = list(out.glob("*/fit-*.json"))
    assert len(files) == 12 and not list(out.glob("*/.tmp-*"))
    assert len(load_sweep(out)) == 12


def test_a_fit_claimed_elsewhere_is_waited_for(tmp_path, data):
    from filelock import FileLock

    first = _sweep_into(tmp_path, data, seeds=[0])
    key = first.results["fit_id"][0]
    record = first.path / f"fit-{key}.json"
    saved = record.read_text()
    record.unlink()
    lock = FileLock(first.path / ".locks" / f"{key}.lock", thread_local=False)
    lock.acquire()  # another run is computing it ...
    timer = threading.Timer(1.0, lambda: (record.write_text(saved), lock.release()))
    timer.start()  # ... and finishes it a second later
    res = _sweep_into(tmp_path, data, seeds=[0])
    timer.join()
    assert res.n_computed == 0 and res.n_resumed == 2
    lock.acquire()  # a run that died holding it: the fit is computed here
    record.unlink()
    lock.release()
    again = _sweep_into(tmp_path, data, seeds=[0])
    assert again.n_computed == 1 and record.exists()


def test_unwritable_output_folder_fails_before_any_fit(tmp_path, data, monkeypatch):
    import errno

    X, y = data
    slow = MemorizingRegressor(sleep=5)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"cannot write to the output folder {a_file}"):
        rank_sweep(slow, X, y, ranks=[1], seeds=[0], out=a_file / "out", progress=False)
    if os.geteuid() != 0:  # root writes into read-only folders
        ro = tmp_path / "read-only"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ValueError, match=f"cannot write to the output folder {ro}"):
            rank_sweep(slow, X, y, ranks=[1], seeds=[0], out=ro, progress=False)
        ro.chmod(0o700)

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(ValueError, match="cannot write to the output folder .*No space left"):
        rank_sweep(slow, X, y, ranks=[1], seeds=[0], out=tmp_path / "full", progress=False)
    assert time.perf_counter() - t0 < 3  # no fit started
    assert not list(tmp_path.rglob(".tmp-*")) and not list(tmp_path.rglob(".write-check*"))
    monkeypatch.undo()
    assert check_writable(tmp_path / "fine" / "nested").is_dir()


def test_a_write_stopped_midway_leaves_no_temporary_file(tmp_path, data, monkeypatch):
    from minip_learn.model_selection import _store

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    res = _sweep_into(tmp_path, data, seeds=[0])
    (res.path / f"fit-{res.results['fit_id'][0]}.json").unlink()
    monkeypatch.setattr(_store.json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _sweep_into(tmp_path, data, seeds=[0])
    assert not list(tmp_path.rglob(".tmp-*"))
    monkeypatch.undo()
    assert _sweep_into(tmp_path, data, seeds=[0]).n_computed == 1


def test_full_set_split_counts_lists_and_frames():
    assert [len(t) for _, t in FullSetSplit().split([[0, 1], [1, 0], [1, 1]])] == [3]
    assert [len(t) for _, t in FullSetSplit(2).split(pd.DataFrame({"a": [1, 2]}))] == [2, 2]
    with pytest.raises(TypeError, match="array-like"):
        next(FullSetSplit().split(3))


# -- the keyed store -------------------------------------------------------------------
def test_keyed_store_resumes_by_key_configuration_and_data(tmp_path, data):
    from minip_learn.model_selection import KeyedStore

    X, y = data
    calls = []

    def compute(value, est=None):
        def run():
            calls.append(value)
            return {"value": value, "error": float("inf")}, est
        return run

    est = KernelAttentionRegressor(rank=3, max_epochs=1).fit(X, y)
    store = KeyedStore(tmp_path, {"steps": 2}, X, y)
    assert store.fetch("a", compute(1, est))[1] is est
    assert store.fetch("a", compute(99)) == ({"value": 1, "error": float("inf")}, est)
    assert store.fetch("b", compute(2)) == ({"value": 2, "error": float("inf")}, None)
    assert (store.n_computed, store.n_resumed, calls) == (2, 0, [1, 2])
    assert sorted(p.name for p in tmp_path.glob("*-*")) == [
        f"a-{store.tag}.json", f"a-{store.tag}.safetensors", f"b-{store.tag}.json"]
    # a rerun reads both from disk: rows without the file fields, the estimator loaded
    rerun = KeyedStore(tmp_path, {"steps": 2}, X, y)
    row, loaded = rerun.fetch("a", compute(99))
    assert row == {"value": 1, "error": float("inf")} and loaded.rank == 3
    assert rerun.fetch("b", compute(99))[0]["value"] == 2
    assert (rerun.n_computed, rerun.n_resumed, calls) == (0, 2, [1, 2])
    # another configuration or other data never reads them
    assert KeyedStore(tmp_path, {"steps": 3}, X, y).fetch("a", compute(3))[0]["value"] == 3
    assert KeyedStore(tmp_path, {"steps": 2}, X, 1 - y).fetch("a", compute(4))[1] is None
    # in memory only
    mem = KeyedStore(None, {"steps": 2}, X, y)
    assert mem.fetch("a", compute(5))[0]["value"] == 5 and mem.n_computed == 1


def test_keyed_store_moves_bad_files_aside_and_removes_stale_temporaries(tmp_path):
    from minip_learn.model_selection import KeyedStore

    store = KeyedStore(tmp_path, {"steps": 2})
    store.fetch("a", lambda: ({"value": 1}, None))
    store.fetch("b", lambda: ({"value": 2}, None))
    a, b = (tmp_path / f"{key}-{store.tag}.json" for key in "ab")
    a.write_text(a.read_text()[:10])
    b.write_text(json.dumps({**json.loads(b.read_text()), "minip_learn_version": "0.0.1"}))
    dead = tmp_path / f".tmp-{a.name}.999999999"  # left by a killed writer
    dead.write_text("partial")
    with pytest.warns(ResultsFolderWarning) as record:
        rerun = KeyedStore(tmp_path, {"steps": 2})
        assert rerun.fetch("a", lambda: ({"value": 3}, None))[0] == {"value": 3}
        assert rerun.fetch("b", lambda: ({"value": 4}, None))[0] == {"value": 4}
    messages = " ".join(str(w.message) for w in record)
    assert "unreadable" in messages and "written by minip_learn 0.0.1" in messages
    assert (tmp_path / "corrupt" / a.name).exists() and (tmp_path / "foreign" / b.name).exists()
    assert not dead.exists() and rerun.n_computed == 2
