"""Out-of-distribution Min-IP: disjoint token pools, the leakage check, the OOD recipe."""

import numpy as np
import pytest

from minip_learn.datasets import check_token_leakage, make_ood_minip, minip_gaps, minip_targets


def _tokens(X):
    return {t.tobytes() for t in np.asarray(X, dtype=np.uint8).reshape(-1, X.shape[-1])}


def test_make_ood_minip_disjoint_pools_and_exact_targets():
    # 16 test tokens hold only 14 multisets with every gap >= 2: the pools need more
    d = make_ood_minip(60, 30, n_bits=10, n_tokens=96, test_tokens=48, random_state=0)
    assert d.X_train.shape == (60, 3, 10) and d.X_test.shape == (30, 3, 10)
    assert d.train_tokens.shape == (48, 10) and d.test_tokens.shape == (48, 10)
    assert not (_tokens(d.X_train) & _tokens(d.X_test))
    assert _tokens(d.X_train) <= _tokens(d.train_tokens)
    assert _tokens(d.X_test) <= _tokens(d.test_tokens)
    assert not (_tokens(d.train_tokens) & _tokens(d.test_tokens))
    np.testing.assert_array_equal(d.y_train, minip_targets(d.X_train))
    np.testing.assert_array_equal(d.y_test, minip_targets(d.X_test))
    assert (minip_gaps(d.X_train) >= 2).all() and (minip_gaps(d.X_test) >= 2).all()
    # distinct tokens within a sequence, no sequence twice
    for X in (d.X_train, d.X_test):
        assert len({x.tobytes() for x in X}) == len(X)
        assert all(len({t.tobytes() for t in x}) == 3 for x in X)
    assert d.params["n_train_tokens"] == 48 and "disjoint" in d.DESCR


@pytest.mark.parametrize("n_bits,n_tokens", [(8, 40), (12, 64)])
def test_ood_sequences_are_distinct_up_to_permutation(n_bits, n_tokens):
    d = make_ood_minip(n_train=300, n_test=100, n_bits=n_bits, n_tokens=n_tokens,
                       seq_len=3, min_gap=0, random_state=0)
    for X in (d.X_train, d.X_test):
        keys = {tuple(sorted(bytes(t) for t in s)) for s in X}
        assert len(keys) == len(X)


def test_make_ood_minip_is_reproducible():
    a = make_ood_minip(20, 10, n_bits=8, n_tokens=64, random_state=3)
    b = make_ood_minip(20, 10, n_bits=8, n_tokens=64, random_state=3)
    np.testing.assert_array_equal(a.X_train, b.X_train)
    np.testing.assert_array_equal(a.X_test, b.X_test)


def test_check_token_leakage():
    a = np.array([[[1, 0, 0], [0, 1, 0]]])
    assert check_token_leakage(a, np.array([[[0, 0, 1], [1, 1, 0]]])) == 0
    with pytest.raises(ValueError, match="token leakage: 1 token"):
        check_token_leakage(a, np.array([[[0, 0, 1], [0, 1, 0]]]))
    with pytest.raises(ValueError, match="n_bits"):
        check_token_leakage(a, np.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match="X_test"):
        check_token_leakage(a, np.full((1, 2, 3), 2))


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_train=0), "n_train"),
    (dict(n_test=-1), "n_test"),
    (dict(n_bits=4, n_tokens=17), "n_tokens"),
    (dict(test_tokens=1.5), "test_tokens"),
    (dict(test_tokens="half"), "test_tokens"),
    (dict(n_tokens=8, test_tokens=6), "each pool"),
    (dict(seq_len=2), "min_gap"),
    (dict(min_gap=20), "min_gap"),
    (dict(density=2.0), "density"),
    (dict(n_train=5000, n_tokens=12, test_tokens=4, max_draws=2000), "enlarge the pool"),
])
def test_make_ood_minip_bad_input(kwargs, match):
    params = dict(n_train=10, n_test=10, n_bits=8, n_tokens=40, random_state=0)
    params.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_ood_minip(**params)


# -- the OOD recipe (tiny settings) ----------------------------------------------------
TINY = dict(scales=[{"n_bits": 8, "n_tokens": 128}, {"n_bits": 10, "n_tokens": 96}],
            data={"n_train": 40, "n_test": 20}, ranks=(2, 8), seeds=(0,),
            softmax_seeds=(0,), kernel={"max_epochs": 5},
            softmax={"max_epochs": 5, "n_init": 1}, progress=False, n_jobs=1)


def test_ood_experiment_scores_the_held_out_pool(tmp_path):
    from minip_learn.experiments import ood_experiment

    res = ood_experiment(out=tmp_path, **TINY)
    r = res.results
    assert len(r) == 2 * (2 + 1)
    assert {"test_exact_match", "test_max_abs_error", "test_solved", "exact_match"} <= set(r)
    assert sorted(r["n_bits"].unique()) == [8, 10]
    assert set(r.loc[r["model"] == "kernel", "feature_map"]) == {"exp"}
    assert r["test_exact_match"].between(0, 1).all()
    s = res.summary
    assert len(s) == 2 * 3 and s.loc[s["model"] == "softmax", "rank"].isna().all()
    assert set(res.jump_ranks) == {0, 1}
    assert res.checks["no_token_leakage"] is True
    for name in ("results", "summary_csv", "summary_md", "ood_transition"):
        assert res.files[name].exists()
    assert "disjoint" in (tmp_path / "summary.md").read_text()
    # a rerun resumes from the saved fits and scores them again on the test pool
    again = ood_experiment(out=tmp_path, **TINY)
    np.testing.assert_allclose(again.results["test_exact_match"], r["test_exact_match"])


def test_ood_experiment_rejects_the_table_map():
    from minip_learn.experiments import ood_experiment

    with pytest.raises(ValueError, match="unseen tokens"):
        ood_experiment(**{**TINY, "kernel": {"feature_map": "table"}})


def test_jump_ranks_and_checks_logic():
    import pandas as pd

    from minip_learn.experiments.ood import _jump_ranks

    summary = pd.DataFrame({
        "scale": [0, 0, 1, 1, 1], "model": ["kernel"] * 5, "rank": [4, 16, 4, 16, 64],
        "test_exact_match_min": [0.5, 0.97, 0.1, 0.6, 0.99]})
    assert _jump_ranks(summary, 0.95) == {0: 16, 1: 64}
    assert _jump_ranks(summary, 0.999) == {0: None, 1: None}


def test_cli_knows_ood_and_beyond():
    from minip_learn.cli import build_parser
    from minip_learn.experiments import EXPERIMENTS, SETTINGS

    for name in ("ood", "beyond"):
        assert build_parser().parse_args(["reproduce", name, "--quick"]).experiment == name
        assert name in EXPERIMENTS and set(SETTINGS[name]) == {"quick", "full"}
    q = SETTINGS["ood"]["quick"]
    assert q["kernel"]["feature_map"] != "table" and len(q["scales"]) >= 2
