import inspect
import itertools
import re

import numpy as np
import pytest
from minip_references import ref_gaps, ref_keep, ref_targets

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


# ---------------------------------------------------------------------------------------
# make_minip: the documented contract, option by option (defaults, validation, query,
# min_gap, distinct_tokens, unique, density, max_draws and the Bunch). Targets and gaps
# are recomputed here from the definition of Min-IP, not with the library's helpers.
# ---------------------------------------------------------------------------------------


def gaps_by_definition(X):
    """Second-smallest minus smallest overlap with the other tokens, every position."""
    return np.array(ref_gaps(X), dtype=np.int64).reshape(X.shape[:2])


def last_targets_by_definition(X):
    return np.array([row[-1] for row in ref_targets(X)], dtype=np.int64)


def test_make_minip_documented_defaults():
    sig = inspect.signature(make_minip)
    defaults = {name: p.default for name, p in sig.parameters.items()}
    assert defaults == dict(n_samples=100, seq_len=3, n_bits=24, density=0.5, min_gap=0,
                            distinct_tokens=False, unique=False, max_draws=None,
                            query="all", random_state=None, return_X_y=True)
    X, y = make_minip()
    assert X.shape == (100, 3, 24) and X.dtype == np.uint8
    assert y.shape == (100, 3) and y.dtype == np.int64
    data = make_minip(return_X_y=False)
    assert data.params == dict(n_samples=100, seq_len=3, n_bits=24, density=0.5, min_gap=0,
                               distinct_tokens=False, unique=False, query="all",
                               random_state=None)


def test_make_minip_defaults_allow_repeats():
    # distinct_tokens=False by default: 3 tokens of 1 bit must repeat a token
    X, _ = make_minip(20, seq_len=3, n_bits=1, random_state=0)
    assert X.shape == (20, 3, 1)
    # unique=False by default: 10 sequences out of the 2 possible ones
    X, _ = make_minip(10, seq_len=1, n_bits=1, random_state=0, max_draws=1000)
    assert X.shape == (10, 1, 1) and len({x.tobytes() for x in X}) <= 2


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_samples=0), "n_samples"),
    (dict(n_samples=2.5), "n_samples"),
    (dict(seq_len=0), "seq_len"),
    (dict(seq_len=1.5), "seq_len"),
    (dict(n_bits=0), "n_bits"),
    (dict(n_bits=-3), "n_bits"),
    (dict(n_bits=2.5), "n_bits"),
    (dict(density=-0.1), "density"),
    (dict(density=1.1), "density"),
    (dict(density="half"), "density"),
    (dict(min_gap=-1), "min_gap"),
    (dict(min_gap=1.5), "min_gap"),
    (dict(max_draws=0), "max_draws"),
    (dict(max_draws=-1), "max_draws"),
    (dict(max_draws=10.0), "max_draws"),
    (dict(query="first"), "query"),
    (dict(query=None), "query"),
])
def test_make_minip_error_names_the_parameter(kwargs, name):
    # an invalid argument is rejected up front by a message that starts with its name
    # (not by a sampling failure such as "Only 0 of 5 ... after 0 draws")
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        make_minip(**{"n_samples": 5, "seq_len": 3, "n_bits": 4, "random_state": 0, **kwargs})


def test_make_minip_smallest_accepted_values():
    X, y = make_minip(1, seq_len=1, n_bits=1, random_state=0)
    assert X.shape == (1, 1, 1) and y.shape == (1, 1)
    assert y[0, 0] == X[0, 0, 0]  # a length-1 sequence's target is |x_1|
    X, y = make_minip(1, seq_len=3, n_bits=4, max_draws=1, random_state=0)
    assert X.shape == (1, 3, 4)
    np.testing.assert_array_equal(y, brute_force_targets(X))


def test_make_minip_density_endpoints():
    X, y = make_minip(4, seq_len=3, n_bits=5, density=0.0, random_state=0)
    assert not X.any() and not y.any()
    X, y = make_minip(4, seq_len=3, n_bits=5, density=1.0, random_state=0)
    assert X.all() and (y == 5).all()


def test_make_minip_density_zero_even_at_a_uniform_of_zero():
    # a bit is 1 with probability ``density``: with density=0 never, even when the
    # uniform draw behind it is exactly 0.0 (a genuine Mersenne Twister state whose next
    # two 32-bit outputs are 0 makes random_sample return 0.0)
    rs = np.random.RandomState(0)
    key = rs.get_state()[1].copy()
    key[622:] = 0
    rs.set_state(("MT19937", key, 622))
    probe = np.random.RandomState(0)
    probe.set_state(("MT19937", key, 622))
    assert probe.random_sample() == 0.0
    X, _ = make_minip(1, seq_len=1, n_bits=1, density=0.0, random_state=rs)
    assert X.tolist() == [[[0]]]


def test_make_minip_query_last():
    X, y = make_minip(40, seq_len=4, n_bits=6, query="last", random_state=2)
    assert X.shape == (40, 4, 6) and y.shape == (40,) and y.dtype == np.int64
    np.testing.assert_array_equal(y, last_targets_by_definition(X))
    # with min_gap=0 the sequences do not depend on query; y is the last column
    X_all, y_all = make_minip(40, seq_len=4, n_bits=6, query="all", random_state=2)
    np.testing.assert_array_equal(X, X_all)
    np.testing.assert_array_equal(y, y_all[:, -1])
    np.testing.assert_array_equal(y_all, brute_force_targets(X_all))


def test_make_minip_last_min_gap_conditions_only_the_query():
    X, y = make_minip(100, seq_len=3, n_bits=8, min_gap=2, query="last", random_state=0)
    gaps = gaps_by_definition(X)
    assert (gaps[:, -1] >= 2).all()
    # only the final position is conditioned: earlier positions may have smaller gaps
    assert (gaps[:, :-1] < 2).any()
    np.testing.assert_array_equal(y, last_targets_by_definition(X))


@pytest.mark.parametrize("n_bits, seq_len", [(1, 2), (2, 4), (3, 7)])
def test_make_minip_distinct_tokens_up_to_all_tokens(n_bits, seq_len):
    # seq_len = 2**n_bits is allowed: every sequence is then a permutation of all tokens
    X, _ = make_minip(3, seq_len=seq_len, n_bits=n_bits, distinct_tokens=True,
                      random_state=0)
    assert X.shape == (3, seq_len, n_bits)
    for x in X:
        assert len({t.tobytes() for t in x}) == seq_len


@pytest.mark.parametrize("n_bits, seq_len", [(1, 3), (2, 5), (3, 9)])
def test_make_minip_distinct_tokens_needs_enough_tokens(n_bits, seq_len):
    with pytest.raises(ValueError, match=r"distinct_tokens needs seq_len <= 2\*\*n_bits"):
        make_minip(3, seq_len=seq_len, n_bits=n_bits, distinct_tokens=True, max_draws=10,
                   random_state=0)


def test_make_minip_unique_exhausts_small_space():
    X, _ = make_minip(2, seq_len=1, n_bits=1, unique=True, random_state=0)
    assert sorted(X.ravel().tolist()) == [0, 1]
    with pytest.raises(ValueError, match="Only 2 of 3 requested sequences"):
        make_minip(3, seq_len=1, n_bits=1, unique=True, max_draws=300, random_state=0)


def test_make_minip_max_draws_is_a_cap():
    # without constraints every candidate is accepted: n_samples draws are enough
    data = make_minip(5, seq_len=3, n_bits=4, max_draws=5, random_state=0, return_X_y=False)
    assert data.X.shape == (5, 3, 4) and data.n_drawn == 5
    # with constraints, never more draws than max_draws
    data = make_minip(20, seq_len=3, n_bits=8, min_gap=2, max_draws=5000, random_state=0,
                      return_X_y=False)
    assert 20 <= data.n_drawn <= 5000
    # an impossible constraint (1-bit tokens never have a positive gap) stops at max_draws
    with pytest.raises(ValueError, match=r"Only 0 of 2 .* after 100 draws"):
        make_minip(2, seq_len=3, n_bits=1, min_gap=1, max_draws=100, random_state=0)


@pytest.mark.parametrize("max_draws", [None, "omitted"])
def test_make_minip_default_max_draws(max_draws):
    kwargs = {} if max_draws == "omitted" else {"max_draws": max_draws}
    n = 3  # default cap 2000 * n_samples + 100000
    with pytest.raises(ValueError, match=rf"after {2000 * n + 100_000} draws"):
        make_minip(n, seq_len=3, n_bits=1, min_gap=1, random_state=0, **kwargs)


@pytest.mark.parametrize("query", ["all", "last"])
def test_make_minip_bunch_fields(query):
    data = make_minip(30, seq_len=4, n_bits=6, density=0.4, min_gap=1, distinct_tokens=True,
                      unique=True, query=query, random_state=7, return_X_y=False)
    assert set(data) == {"X", "y", "gaps", "query", "params", "n_drawn", "DESCR"}
    assert data.query == query
    assert data.params == dict(n_samples=30, seq_len=4, n_bits=6, density=0.4, min_gap=1,
                               distinct_tokens=True, unique=True, query=query,
                               random_state=7)
    X = data.X
    assert X.shape == (30, 4, 6) and X.dtype == np.uint8
    assert len({x.tobytes() for x in X}) == 30
    gaps = gaps_by_definition(X)
    if query == "last":
        np.testing.assert_array_equal(data.y, last_targets_by_definition(X))
        np.testing.assert_array_equal(data.gaps, gaps[:, -1])
        assert (data.gaps >= 1).all()
    else:
        np.testing.assert_array_equal(data.y, brute_force_targets(X))
        np.testing.assert_array_equal(data.gaps, gaps)
        assert (data.gaps >= 1).all()
    X2, y2 = make_minip(30, seq_len=4, n_bits=6, density=0.4, min_gap=1, distinct_tokens=True,
                        unique=True, query=query, random_state=7)
    np.testing.assert_array_equal(X2, X)
    np.testing.assert_array_equal(y2, data.y)
    descr = data.DESCR
    for text in ("30 sequences", "seq_len=4", "n_bits=6", "density=0.4", "min_gap=1",
                 "distinct_tokens=True", "unique=True", f"query={query}",
                 f"{data.n_drawn} candidate sequences were drawn"):
        assert text in descr
    # the query mode in words (as the docstring states it), not as a code or a placeholder
    last_text = r"\bone target per sequence, at its last token\b"
    all_text = r"\ba target at every position\b"
    assert bool(re.search(last_text, descr)) == (query == "last")
    assert bool(re.search(all_text, descr)) == (query == "all")


@pytest.mark.parametrize("seq_len", [1, 2])
@pytest.mark.parametrize("query", ["all", "last"])
def test_make_minip_bunch_no_gaps_below_three_tokens(seq_len, query):
    data = make_minip(6, seq_len=seq_len, n_bits=4, query=query, random_state=0,
                      return_X_y=False)
    assert data.gaps is None
    assert data.y.shape == ((6,) if query == "last" else (6, seq_len))


def test_make_minip_bunch_gaps_at_three_tokens():
    data = make_minip(10, seq_len=3, n_bits=5, random_state=0, return_X_y=False)
    np.testing.assert_array_equal(data.gaps, gaps_by_definition(data.X))


@pytest.mark.parametrize("kwargs", [
    dict(seq_len=3, n_bits=6, min_gap=2),
    dict(seq_len=4, n_bits=6, min_gap=1, query="last"),
    dict(seq_len=3, n_bits=2, distinct_tokens=True),
    dict(seq_len=2, n_bits=3, unique=True),
    dict(seq_len=3, n_bits=5, density=0.3, min_gap=1, unique=True)])
def test_make_minip_n_drawn_counts_the_stream_up_to_the_last_accepted(kwargs):
    # the candidates are one random stream whatever the batch sizes: drawn here in one
    # piece and filtered from the definitions, the n-th accepted candidate is the last
    # one make_minip reports drawn, and the accepted ones are its sequences
    n, seed = 30, 7
    data = make_minip(n, random_state=seed, return_X_y=False, **kwargs)
    N, m = kwargs["seq_len"], kwargs["n_bits"]
    rng = np.random.RandomState(seed)
    stream = (rng.random_sample((data.n_drawn, N, m)) < kwargs.get("density", 0.5))
    stream = stream.astype(np.uint8)
    accepted, seen = [], set()
    for i, x in enumerate(stream):
        gaps = ref_gaps([x])[0] if N >= 3 else []
        if not ref_keep([x], [gaps], kwargs.get("min_gap", 0),
                        kwargs.get("distinct_tokens", False), kwargs.get("query", "all"))[0]:
            continue
        if kwargs.get("unique") and x.tobytes() in seen:
            continue
        seen.add(x.tobytes())
        accepted.append(i)
    assert len(accepted) == n and accepted[-1] == data.n_drawn - 1
    np.testing.assert_array_equal(stream[accepted], data.X)
    assert f"{data.n_drawn} candidate sequences were drawn" in data.DESCR
