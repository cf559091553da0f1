"""Every file a sweep reads back is validated: records against their file's key and the
declared fields, ``config.json`` against its fields and its id, the JSON strictly; and
:func:`load_sweep` refuses rows :func:`rank_sweep` could not have written."""

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import BaseEstimator, RegressorMixin

from minip_learn.datasets import make_minip
from minip_learn.model_selection import (
    KeyedStore,
    ResultsFolderWarning,
    load_sweep,
    rank_sweep,
)


class _Module:
    nonnegative = True


class _Net:
    module_ = _Module()


class InstantRegressor(RegressorMixin, BaseEstimator):
    """Fits at once; 'solves' its training set when ``rank >= 4``."""

    def __init__(self, rank=1, *, random_state=None, device="cpu"):
        self.rank = rank
        self.random_state = random_state
        self.device = device

    def fit(self, X, y):
        self.y_ = np.asarray(y, dtype=float)
        self.n_epochs_ = 3
        self.train_max_error_ = float("nan")  # written as NaN: read back as a number
        self.net_ = _Net()
        return self

    def predict(self, X):
        return self.y_ + (0.0 if self.rank >= 4 else 0.7)


DATA = make_minip(12, seq_len=2, n_bits=4, random_state=0)


def _sweep(out, **kw):
    kw = {"ranks": [2, 4], "seeds": [0], "progress": False, **kw}
    return rank_sweep(InstantRegressor(), *DATA, out=out, **kw)


def _rerun(out, **kw):
    """The sweep again: its result and the ResultsFolderWarning messages."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = _sweep(out, **kw)
    return res, [str(w.message) for w in record if w.category is ResultsFolderWarning]


def _rank2(res):
    (path,) = res.path.glob("fit-rank=2_*.json")
    return path


def _edit(path, **fields):
    row = json.loads(path.read_text())
    row.update(fields)
    path.write_text(json.dumps(row))


def _assert_refitted(res, again, messages, victim, *words):
    (message,) = messages
    assert str(victim) in message and "corrupt" in message and "computed again" in message
    for word in words:
        assert word in message
    assert again.n_computed == 1 and again.n_resumed == 1
    assert again.results["rank"].tolist() == [2, 4]
    assert again.results["solved"].tolist() == [False, True]
    assert (res.path / "corrupt" / victim.name).exists()


@pytest.mark.parametrize("fields, named", [
    ({"rank": "two", "solved": "maybe"}, "'rank'"),
    ({"solved": "maybe"}, "'solved'"),
    ({"n_epochs": 2.5}, "'n_epochs'"),
    ({"fit_time": -1.0}, "'fit_time'"),
    ({"pid": True}, "'pid'"),
    ({"finished_at": "yesterday"}, "'finished_at'"),
    ({"exact_match": "high"}, "'exact_match'"),
    ({"max_abs_error": None}, "'max_abs_error'"),
    ({"estimator_sha256": "not a digest"}, "'estimator_sha256'"),
    ({"estimator": "SomethingElse"}, "'estimator'"),
    ({"rank": float("nan")}, "'rank'"),
])
def test_a_record_with_wrong_types_is_moved_aside_and_refitted(tmp_path, fields, named):
    res = _sweep(tmp_path)
    victim = _rank2(res)
    _edit(victim, **fields)
    again, messages = _rerun(tmp_path)
    _assert_refitted(res, again, messages, victim, named)
    with pytest.raises(ValueError, match=named):
        _edit(victim, **fields)
        load_sweep(tmp_path)


def test_a_record_missing_a_field_is_moved_aside(tmp_path):
    res = _sweep(tmp_path)
    victim = _rank2(res)
    row = json.loads(victim.read_text())
    del row["solved"]
    victim.write_text(json.dumps(row))
    again, messages = _rerun(tmp_path)
    _assert_refitted(res, again, messages, victim, "'solved' is missing")


@pytest.mark.parametrize("fields, named", [
    ({"rank": 64, "solved": True}, "field 'rank' is 64, but its file is the fit with rank=2"),
    ({"seed": 7}, "field 'seed' is 7"),
])
def test_a_record_of_another_fit_is_not_taken_for_this_one(tmp_path, fields, named):
    res = _sweep(tmp_path)
    victim = _rank2(res)
    _edit(victim, **fields)
    with pytest.raises(ValueError, match=rf"{victim.name}: row '.*' is not a record "
                                         rf"rank_sweep writes: {named}"):
        load_sweep(tmp_path)
    again, messages = _rerun(tmp_path)
    _assert_refitted(res, again, messages, victim, named)


def test_a_record_with_a_fixed_rank_other_than_its_configuration_is_refused(tmp_path):
    res = _sweep(tmp_path, ranks=None, param_grid={"device": ["cpu"]}, seeds=[0, 1])
    victim = sorted(res.path.glob("fit-*.json"))[0]
    _edit(victim, rank=64)
    with pytest.raises(ValueError, match="field 'rank' is 64, but its configuration has rank=1"):
        load_sweep(tmp_path)
    again, messages = _rerun(tmp_path, ranks=None, param_grid={"device": ["cpu"]},
                             seeds=[0, 1])
    assert len(messages) == 1 and "rank=1" in messages[0] and again.n_computed == 1


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,
    '{"fit_id": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"a": ' * 50_000 + "1" + "}" * 50_000,
])
def test_deep_nesting_is_refused_before_parsing(tmp_path, text):
    res = _sweep(tmp_path)
    victim = _rank2(res)
    victim.write_text(text)
    with pytest.warns(ResultsFolderWarning, match="nested deeper than 32 levels"):
        assert len(load_sweep(tmp_path)) == 1
    again, messages = _rerun(tmp_path)
    _assert_refitted(res, again, messages, victim, "nested deeper")
    (res.path / "config.json").write_text(text)
    again, messages = _rerun(tmp_path)
    assert again.n_computed == 0 and "config.json: unreadable (nested deeper" in messages[0]
    assert json.loads((res.path / "config.json").read_text())["config_id"] in res.path.name


@pytest.mark.parametrize("insert, words", [
    ('"pid": 1, ', "duplicate key 'pid'"),
    ('"x": 1e999, ', "out of range"),
    ('"x": "\\udc80", ', "not Unicode text"),
])
def test_json_is_read_strictly(tmp_path, insert, words):
    res = _sweep(tmp_path)
    victim = _rank2(res)
    victim.write_text(victim.read_text().replace("{", "{" + insert, 1))
    with pytest.warns(ResultsFolderWarning, match=words):
        assert len(load_sweep(tmp_path)) == 1
    again, messages = _rerun(tmp_path)
    _assert_refitted(res, again, messages, victim, words)


def test_nan_and_infinity_round_trip_where_records_write_them(tmp_path):
    res = _sweep(tmp_path)
    victim = _rank2(res)
    assert "NaN" in victim.read_text()  # train_max_error
    _edit(victim, max_abs_error=float("inf"), exact_match=float("-inf"))
    again, messages = _rerun(tmp_path)
    assert messages == [] and again.n_computed == 0
    assert np.isinf(again.results["max_abs_error"][0])
    assert np.isnan(load_sweep(tmp_path)["train_max_error"]).all()
    # a configuration never holds them
    config = res.path / "config.json"
    config.write_text(config.read_text().replace('"data"', '"x": NaN, "data"'))
    again, messages = _rerun(tmp_path)
    assert again.n_computed == 0 and "NaN is not allowed" in messages[0]


@pytest.mark.parametrize("change, words", [
    (lambda c: c.update(scoring="solved"), "field 'scoring' is 'solved'"),
    (lambda c: c.update(repr=None), "field 'repr' is None"),
    (lambda c: c.pop("data"), "field 'data' is missing"),
    (lambda c: c.update(extra=1), "field 'extra' is not a field of this file"),
    (lambda c: c["params"].update(solve_from=1), "its configuration does not give its"),
])
def test_a_bad_config_json_is_moved_aside_and_written_again(tmp_path, change, words):
    res = _sweep(tmp_path)
    path = res.path / "config.json"
    good = path.read_text()
    config = json.loads(good)
    change(config)
    path.write_text(json.dumps(config))
    again, messages = _rerun(tmp_path)
    (message,) = messages
    assert f"{path}: not a valid configuration ({words}" in message
    assert "written again" in message and (res.path / "corrupt" / "config.json").exists()
    assert path.read_text() == good and again.n_computed == 0


def test_load_sweep_reads_real_rows_and_refuses_rows_it_could_not_have_written(tmp_path):
    kw = dict(param_grid={"device": ["cpu"]}, seeds=[0, None],
              tags={"model": "instant", "n_bits": 4, "extra": [1, {"a": None}], "flag": True})
    first = _sweep(tmp_path, **kw)
    again, messages = _rerun(tmp_path, **kw)
    assert messages == [] and again.n_computed == 0 and again.n_resumed == 4
    assert sorted(load_sweep(tmp_path)["fit_id"]) == sorted(first.results["fit_id"])
    (victim,) = first.path.glob("fit-device=cpu_rank=2_seed=0_*.json")
    good = victim.read_text()
    for text, words in [
        ("[1, 2]", "not a JSON object"),
        (good.replace('"fit_id": "device=cpu_rank=2', '"fit_id": "device=cpu_rank=4'),
         "field 'fit_id' is"),
        (good.replace('"solved": false', '"solved": "maybe"'), "field 'solved' is 'maybe'"),
        (good.replace('"rank": 2', '"rank": 64'), "field 'rank' is 64"),
        (good.replace('"device": "cpu"', '"device": "cuda"'), "field 'device' is 'cuda'"),
        (good.replace('"seed": 0', '"seed": null'), "field 'seed' is None"),
    ]:
        victim.write_text(text)
        with pytest.raises(ValueError, match=rf"^{victim}: row '{victim.stem[4:]}' is not a "
                                             rf"record rank_sweep writes: {words}"):
            load_sweep(tmp_path)
    victim.write_text(good)
    assert load_sweep(tmp_path)["rank"].tolist() == [2, 2, 4, 4]


def test_the_keyed_store_reads_its_files_strictly(tmp_path):
    store = KeyedStore(tmp_path, {"steps": 2})
    store.fetch("a", lambda: ({"value": float("inf")}, None))
    store.fetch("b", lambda: ({"value": 2}, None))
    a, b = (tmp_path / f"{key}-{store.tag}.json" for key in "ab")
    b.write_text(b.read_text().replace("{", '{"value": 3, ', 1))
    with pytest.warns(ResultsFolderWarning, match="duplicate key 'value'"):
        rerun = KeyedStore(tmp_path, {"steps": 2})
        assert rerun.fetch("a", lambda: ({"value": 0}, None))[0] == {"value": float("inf")}
        assert rerun.fetch("b", lambda: ({"value": 4}, None))[0] == {"value": 4}
    assert rerun.n_resumed == 1 and rerun.n_computed == 1


# -- fuzzing a real record ----------------------------------------------------------------
@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A run folder of two fits, written once (copied for every example)."""
    root = tmp_path_factory.mktemp("template")
    res = _sweep(root)
    return {"path": root, "folder": res.path.name, "victim": _rank2(res).name}


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)

_FIELDS = ["fit_id", "estimator", "rank", "seed", "solved", "exact_match", "max_abs_error",
           "n_epochs", "train_max_error", "fit_time", "device", "n_threads", "ensemble",
           "nonnegative", "certified_min_rank", "host", "pid", "finished_at", "config_id",
           "minip_learn_version", "new_field"]


@st.composite
def _mutations(draw):
    """A function of a record's text returning a mutated text."""
    kind = draw(st.sampled_from(["set", "delete", "truncate", "insert", "nest", "replace",
                                 "duplicate"]))
    field = draw(st.sampled_from(_FIELDS))
    value = draw(_json_values)
    position = draw(st.floats(min_value=0, max_value=1))
    junk = draw(st.text(max_size=6))
    depth = draw(st.integers(min_value=1, max_value=3000))

    def mutate(text):
        row = json.loads(text)
        at = int(position * len(text))
        if kind == "set":
            row[field] = value
            return json.dumps(row)
        if kind == "delete":
            row.pop(field, None)
            return json.dumps(row)
        if kind == "truncate":
            return text[:at]
        if kind == "insert":
            return text[:at] + junk + text[at:]
        if kind == "nest":
            row[field] = "<nested>"
            return json.dumps(row).replace('"<nested>"', "[" * depth + "]" * depth)
        if kind == "replace":
            return json.dumps(value)
        return text.replace("{", "{" + json.dumps(field) + ": " + json.dumps(value) + ", ", 1)

    return mutate


def _snapshot(root):
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not {"corrupt", "foreign", ".locks"} & set(p.parts)}


@settings(max_examples=100, deadline=None, derandomize=True)
@given(mutate=_mutations())
def test_any_damage_to_a_record_is_refitted_with_a_warning_or_refused(template, mutate):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "out"
        shutil.copytree(template["path"], root)
        folder = root / template["folder"]
        victim = folder / template["victim"]
        damaged = mutate(victim.read_text()).encode("utf-8")
        victim.write_bytes(damaged)
        before = _snapshot(root)

        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            try:
                loaded = load_sweep(root)
            except ValueError as exc:
                assert str(victim) in str(exc)
            else:
                assert len(loaded) in (1, 2)
        assert all(str(victim) in str(w.message) for w in record
                   if w.category is ResultsFolderWarning)
        assert _snapshot(root) == before  # reading writes nothing

        again, messages = _rerun(root)
        assert again.results["rank"].tolist() == [2, 4]
        assert again.n_computed + again.n_resumed == 2
        after = _snapshot(root)
        moved = [p for p in (folder / "corrupt", folder / "foreign") if p.exists()]
        if messages:
            (message,) = messages
            assert str(victim) in message and again.n_computed == 1
            (aside,) = [f for p in moved for f in p.iterdir()]
            assert aside.read_bytes() == damaged
            assert json.loads(victim.read_text())["rank"] == 2  # written again
        else:
            assert again.n_computed == 0 and not moved
        # no other file changed
        rel = victim.relative_to(root)
        assert {k: v for k, v in after.items() if k != rel} == {
            k: v for k, v in before.items() if k != rel}
        assert load_sweep(root)["rank"].tolist() == [2, 4]
