import itertools

import numpy as np
import pytest

from minip_learn.datasets import make_minip, minip_gaps, minip_targets


def brute_force_targets(X):
    n, N, _ = X.shape
    y = np.empty((n, N), dtype=np.int64)
    for s in range(n):
        for i in range(N):
            y[s, i] = min(int(sum(int(a) * int(b) for a, b in zip(X[s, i], X[s, j])))
                          for j in range(N))
    return y


@pytest.mark.parametrize("seq_len", [1, 2, 3, 5])
@pytest.mark.parametrize("density", [0.2, 0.5, 0.9])
def test_targets_equal_brute_force(rng, seq_len, density):
    X = (rng.random((40, seq_len, 7)) < density).astype(np.uint8)
    np.testing.assert_array_equal(minip_targets(X), brute_force_targets(X))


def test_targets_exhaustive_small():
    tokens = np.array(list(itertools.product([0, 1], repeat=3)), dtype=np.uint8)
    X = tokens[np.array(list(itertools.product(range(8), repeat=3)))]
    np.testing.assert_array_equal(minip_targets(X), brute_force_targets(X))


def test_length_one_target_is_weight():
    X = np.array([[[1, 0, 1, 1]]], dtype=np.uint8)
    assert minip_targets(X).tolist() == [[3]]


@pytest.mark.parametrize("bad, match", [
    (np.zeros((2, 3)), "ndim"),
    (np.zeros((0, 3, 4)), "empty"),
    (np.zeros((2, 0, 4)), "seq_len=0"),
    (np.full((1, 2, 3), 2), "0/1"),
    (np.full((1, 2, 3), 0.5), "0/1"),
    (np.full((1, 2, 3), np.nan), "NaN"),
])
def test_targets_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        minip_targets(bad)


def test_make_minip_shapes_dtypes_and_targets():
    X, y = make_minip(50, seq_len=4, n_bits=10, random_state=0)
    assert X.shape == (50, 4, 10) and X.dtype == np.uint8
    assert y.shape == (50, 4) and np.issubdtype(y.dtype, np.integer)
    assert set(np.unique(X)) <= {0, 1}
    np.testing.assert_array_equal(y, minip_targets(X))


def test_make_minip_reproducible():
    a = make_minip(20, random_state=3)
    b = make_minip(20, random_state=3)
    c = make_minip(20, random_state=4)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("min_gap", [1, 2, 3])
def test_make_minip_min_gap(min_gap):
    X, _ = make_minip(100, seq_len=3, n_bits=16, min_gap=min_gap, random_state=0)
    assert (minip_gaps(X) >= min_gap).all()


def test_gaps_against_brute_force(rng):
    X = (rng.random((30, 4, 6)) < 0.5).astype(np.uint8)
    gaps = minip_gaps(X)
    for s in range(30):
        for i in range(4):
            ov = sorted(int(X[s, i] @ X[s, j]) for j in range(4) if j != i)
            assert gaps[s, i] == ov[1] - ov[0]


def test_make_minip_distinct_and_unique():
    X, _ = make_minip(200, seq_len=3, n_bits=3, distinct_tokens=True, unique=True, random_state=0)
    for s in X:
        assert len({t.tobytes() for t in s}) == 3
    assert len({s.tobytes() for s in X}) == 200


def test_make_minip_bunch():
    data = make_minip(10, seq_len=3, n_bits=8, min_gap=2, return_X_y=False, random_state=1)
    assert set(data) >= {"X", "y", "gaps", "params", "DESCR", "n_drawn"}
    assert data.params["min_gap"] == 2 and data.params["n_bits"] == 8
    assert data.n_drawn >= 10 and "Min-IP" in data.DESCR


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_samples=0), "n_samples"),
    (dict(seq_len=0), "seq_len"),
    (dict(n_bits=2.5), "n_bits"),
    (dict(density=1.5), "density"),
    (dict(seq_len=2, min_gap=2), "seq_len >= 3"),
    (dict(n_bits=4, min_gap=4, max_draws=500), "met the constraints"),
])
def test_make_minip_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_minip(**kwargs)
