"""The exact formulas of ``minip_learn.datasets._minip`` against brute force.

Checks every helper of the module but ``make_minip`` on small inputs, with references
written here from the definitions of THEORY.md section 1 and the docstrings (Python
loops over exact integers, never the library's own helpers):

* ``token_overlaps``: the pairwise inner products ``<x_i, x_j>``, in chunks;
* ``minip_targets`` / ``last_targets``: ``t_i = min_j <x_i, x_j>`` (``j = i`` included),
  for both ``query`` values, on arrays and on compact (multiset) families with padding;
* ``minip_gaps`` / ``pairwise_gaps``: second-smallest minus smallest overlap with the
  *other* tokens;
* ``_keep``: the ``min_gap`` (final position only with ``query="last"``) and
  ``distinct_tokens`` filters, exhaustively over short sequences of 2- and 3-bit tokens;
* ``check_query``, ``check_min_gap`` and ``seed_param``: accepted values, exact errors.
"""

import itertools
import re

import numpy as np
import pytest
from minip_references import dot, ref_gaps, ref_keep, ref_overlaps, ref_targets

from minip_learn.compact import CompactFamily
from minip_learn.datasets import minip_gaps, minip_targets
from minip_learn.datasets._minip import (
    _keep,
    check_min_gap,
    check_query,
    last_targets,
    pairwise_gaps,
    seed_param,
    token_overlaps,
)

# -- inputs (the references, from the definitions, are in tests/minip_references.py) --


def all_sequences(N, m):
    tokens = list(itertools.product([0, 1], repeat=m))
    return np.array(list(itertools.product(tokens, repeat=N)), dtype=np.uint8)


def random_binary(seed, shape, dtype=np.uint8, density=0.5):
    rng = np.random.RandomState(seed)
    return (rng.random_sample(shape) < density).astype(dtype)


# -- token_overlaps -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.int64, np.float64])
@pytest.mark.parametrize("N", [1, 2, 3, 8, 9, 12])
@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 16])
def test_token_overlaps_brute_force_every_chunk(dtype, N, chunk):
    X = random_binary(N * 7 + chunk, (7, N, 5), dtype=dtype)
    G = token_overlaps(X, chunk=chunk)
    assert G.shape == (7, N, N) and G.dtype == np.int64
    assert G.tolist() == ref_overlaps(X.astype(np.int64))


def test_token_overlaps_zero_tokens_and_default_chunk():
    X = np.zeros((3, 4, 6), dtype=np.uint8)
    X[1, 2] = 1  # one all-ones token among zeros
    G = token_overlaps(X)
    assert G.dtype == np.int64
    assert G.tolist() == ref_overlaps(X)
    assert G[1, 2, 2] == 6 and G[0].sum() == 0


# -- check_query ----------------------------------------------------------------------


@pytest.mark.parametrize("query", ["all", "last"])
def test_check_query_accepts_the_two_modes(query):
    assert check_query(query) == query


@pytest.mark.parametrize("bad", ["foo", "ALL", "Last", "", 1, None, ("all",)])
def test_check_query_refuses_anything_else(bad):
    msg = f"query must be one of ['all', 'last']; got {bad!r}."
    with pytest.raises(ValueError, match=re.escape(msg)):
        check_query(bad)
    with pytest.raises(ValueError, match=re.escape(msg)):
        minip_targets(np.ones((1, 2, 3), dtype=np.uint8), query=bad)


# -- minip_targets on arrays -------------------------------------------------------------


@pytest.mark.parametrize("N, m", [(1, 4), (2, 3), (3, 3), (4, 2), (9, 5)])
def test_minip_targets_brute_force_both_queries(N, m):
    X = random_binary(N * 31 + m, (25, N, m))
    X[0] = 0  # an all-zero sequence: every target is 0
    X[1] = 1  # all ones: every target is m
    ref = ref_targets(X)
    y = minip_targets(X)
    assert y.shape == (25, N) and y.dtype == np.int64
    assert y.tolist() == ref
    y_last = minip_targets(X, query="last")
    assert y_last.shape == (25,) and y_last.dtype == np.int64
    assert y_last.tolist() == [r[-1] for r in ref]
    assert y[0].tolist() == [0] * N and y[1].tolist() == [m] * N


def test_minip_targets_length_one_and_two():
    X1 = np.array([[[1, 0, 1, 1]], [[0, 0, 0, 0]]], dtype=np.uint8)
    assert minip_targets(X1).tolist() == [[3], [0]]
    assert minip_targets(X1, query="last").tolist() == [3, 0]
    X2 = np.array([[[1, 1, 0], [0, 1, 1]], [[1, 1, 1], [1, 1, 1]]], dtype=np.uint8)
    assert minip_targets(X2).tolist() == [[1, 1], [3, 3]]
    assert minip_targets(X2, query="last").tolist() == [1, 3]


def test_last_targets_many_chunks():
    # N * m = 2**22: chunks of one sequence, so every sequence is its own chunk
    m = 1 << 21
    X = np.zeros((4, 2, m), dtype=np.uint8)
    for s, (a, b) in enumerate([(5, 9), (1000, 70), (0, 3), (77777, 77777)]):
        X[s, 0, :a] = 1
        X[s, 1, :b] = 1
    expected = [5, 70, 0, 77777]  # min(<x_2, x_1>, |x_2|) = min(a, b)
    y = minip_targets(X, query="last")
    assert y.dtype == np.int64 and y.tolist() == expected
    out = last_targets(X)
    assert out.dtype == np.int64 and out.tolist() == expected


def test_last_targets_dtype_is_int64_for_every_input_dtype():
    for dtype in (np.uint8, np.bool_, np.int32, np.float64):
        X = random_binary(3, (6, 3, 4), dtype=dtype)
        out = last_targets(X)
        assert out.dtype == np.int64
        assert out.tolist() == [r[-1] for r in ref_targets(X.astype(np.int64))]


# -- minip_targets on compact families ---------------------------------------------------


def compact_reference(tokens, ids, counts):
    """Per-slot targets (0 at padding) and the target of the final token of each
    materialised sequence, from the multiset definition."""
    all_t, last_t = [], []
    for row_ids, row_cnt in zip(ids, counts):
        present = [tokens[i] for i in row_ids if i >= 0]
        all_t.append([min(dot(tokens[i], t) for t in present) if i >= 0 else 0
                      for i in row_ids])
        seq = [tokens[i] for i, c in zip(row_ids, row_cnt) for _ in range(c)]
        last_t.append(min(dot(seq[-1], t) for t in seq))
    return all_t, last_t


def test_minip_targets_of_a_compact_family_with_padding():
    tokens = [[1, 1, 0, 0], [0, 0, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    ids = [[0, 1, 2], [2, 4, -1], [4, -1, -1], [3, 4, 0], [2, 0, -1]]
    counts = [[1, 1, 2], [2, 2, 0], [4, 0, 0], [1, 1, 2], [1, 3, 0]]
    fam = CompactFamily(tokens, ids, counts)
    ref_all, ref_last = compact_reference(tokens, ids, counts)
    assert ref_last == [1, 3, 4, 0, 2]  # the final token is not always in the last column
    t = minip_targets(fam)
    assert t.shape == (5, 3) and t.tolist() == ref_all
    assert minip_targets(fam, query="all").tolist() == ref_all
    t_last = minip_targets(fam, query="last")
    assert t_last.shape == (5,) and t_last.tolist() == ref_last


def test_minip_targets_of_a_random_compact_family():
    rng = np.random.RandomState(5)
    tokens = np.array(list(itertools.product([0, 1], repeat=4)), dtype=np.uint8)
    ids, counts = [], []
    for _ in range(40):
        k = rng.randint(1, 4)
        row = list(rng.choice(len(tokens), size=k, replace=False)) + [-1] * (3 - k)
        cnt = [1] * k + [0] * (3 - k)
        for _ in range(5 - k):  # sequences of length 5
            cnt[rng.randint(k)] += 1
        ids.append(row)
        counts.append(cnt)
    fam = CompactFamily(tokens, ids, counts)
    ref_all, ref_last = compact_reference(tokens, ids, counts)
    assert minip_targets(fam).tolist() == ref_all
    assert minip_targets(fam, query="last").tolist() == ref_last


# -- minip_gaps / pairwise_gaps ----------------------------------------------------------


@pytest.mark.parametrize("N, m", [(3, 2), (3, 4), (4, 3), (5, 6), (9, 4), (10, 5)])
def test_minip_gaps_brute_force(N, m):
    X = random_binary(N * 13 + m, (30, N, m))
    X[0] = 0  # all ties: gap 0 everywhere
    g = minip_gaps(X)
    assert g.shape == (30, N) and g.dtype == np.int64
    assert g.tolist() == ref_gaps(X)
    assert g[0].tolist() == [0] * N


def test_minip_gaps_exhaustive_length_three():
    X = all_sequences(3, 3)
    assert minip_gaps(X).tolist() == ref_gaps(X)


def test_pairwise_gaps_of_overlap_matrices():
    G = np.array([[[4, 1, 3], [1, 2, 1], [3, 1, 3]],
                  [[5, 0, 0], [0, 5, 5], [0, 5, 5]]], dtype=np.int64)
    # position 0 of the first: others 1, 3 -> 2; position 1: 1, 1 -> 0; position 2: 3, 1
    assert pairwise_gaps(G).tolist() == [[2, 0, 2], [0, 5, 5]]
    G4 = np.array([[[9, 7, 2, 4], [7, 9, 1, 1], [2, 1, 9, 6], [4, 1, 6, 9]]])
    # sorted others: (2, 4, 7), (1, 1, 7), (1, 2, 6), (1, 4, 6)
    assert pairwise_gaps(G4).tolist() == [[2, 0, 1, 3]]


@pytest.mark.parametrize("bad", [2, 3, -1, 0.5])
def test_minip_gaps_refuses_non_binary_tokens(bad):
    X = np.zeros((2, 3, 4))
    X[1, 2, 3] = bad
    with pytest.raises(ValueError, match="X must contain only 0/1 tokens"):
        minip_gaps(X)


@pytest.mark.parametrize("N, m", [(1, 5), (2, 5), (2, 1), (1, 3)])
def test_minip_gaps_needs_three_tokens(N, m):
    msg = (f"minip_gaps needs seq_len >= 3 (two competing candidates); "
           f"got seq_len={N}.")
    with pytest.raises(ValueError, match=re.escape(msg)):
        minip_gaps(np.ones((2, N, m), dtype=np.uint8))


@pytest.mark.parametrize("m", [1, 2])
def test_minip_gaps_with_fewer_bits_than_tokens(m):
    X = all_sequences(3, m)
    assert minip_gaps(X).tolist() == ref_gaps(X)


# -- check_min_gap, seed_param ------------------------------------------------------------


@pytest.mark.parametrize("min_gap, seq_len, n_bits", [
    (0, 1, 4), (0, 2, 4), (0, 2, 1), (0, 3, 1), (1, 3, 4), (4, 3, 4), (2, 5, 2)])
def test_check_min_gap_accepts_feasible_gaps(min_gap, seq_len, n_bits):
    assert check_min_gap(min_gap, seq_len, n_bits) is None


@pytest.mark.parametrize("min_gap, seq_len", [(1, 1), (1, 2), (2, 2), (3, 1)])
def test_check_min_gap_positive_gap_needs_three_tokens(min_gap, seq_len):
    msg = (f"min_gap={min_gap} needs seq_len >= 3 (two competing candidates); "
           f"got seq_len={seq_len}.")
    with pytest.raises(ValueError, match=re.escape(msg)):
        check_min_gap(min_gap, seq_len, 8)


@pytest.mark.parametrize("min_gap, n_bits", [(5, 4), (2, 1), (25, 24)])
def test_check_min_gap_cannot_exceed_n_bits(min_gap, n_bits):
    msg = f"min_gap={min_gap} cannot exceed n_bits={n_bits}."
    with pytest.raises(ValueError, match=re.escape(msg)):
        check_min_gap(min_gap, 3, n_bits)


def test_seed_param_records_integers_only():
    assert seed_param(7) == 7
    assert seed_param(0) == 0
    assert seed_param(np.int64(3)) == 3
    assert seed_param(None) is None
    assert seed_param(np.random.RandomState(0)) is None
    assert seed_param(np.random.default_rng(0)) is None
    assert seed_param(1.0) is None


# -- _keep -------------------------------------------------------------------------------


@pytest.mark.parametrize("N, m", [(1, 3), (2, 2), (2, 3), (3, 2), (3, 3), (4, 2), (4, 3)])
def test_keep_exhaustive(N, m):
    X = all_sequences(N, m)
    # gaps exist from three tokens on; min_gap > 0 needs them (check_min_gap)
    gaps = ref_gaps(X) if N >= 3 else [[]] * len(X)
    for query in ("all", "last"):
        for distinct in (False, True):
            for min_gap in range(m + 1) if N >= 3 else [0]:
                keep = _keep(X, min_gap, distinct, query)
                assert keep.shape == (len(X),) and keep.dtype == bool
                assert keep.tolist() == ref_keep(X, gaps, min_gap, distinct, query), \
                    (query, distinct, min_gap)


def test_keep_final_query_looks_at_the_last_position_only():
    z, x, y = [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]
    # first: the last token z's others (y, y, x) overlap (3, 3, 1): gap 2, but x's
    # others (y, y, z) tie (gap 0); second: the last token x's others all overlap 1
    X = np.array([[y, y, x, z], [y, z, y, x]], dtype=np.uint8)
    assert _keep(X, 2, False, "last").tolist() == [True, False]
    assert _keep(X, 2, False, "all").tolist() == [False, False]
    # with distinct tokens the repeated y rejects the first
    assert _keep(X, 2, True, "last").tolist() == [False, False]
    assert _keep(X, 0, False, "last").tolist() == [True, True]
    assert _keep(X, 0, True, "all").tolist() == [False, False]
    # (x, z, y): the final y's others overlap (1, 3): gap 2; the middle z's (1, 3): 2;
    # the first x's (1, 1): 0
    X3 = np.array([[x, z, y]], dtype=np.uint8)
    assert _keep(X3, 2, False, "last").tolist() == [True]
    assert _keep(X3, 2, True, "last").tolist() == [True]
    assert _keep(X3, 2, True, "all").tolist() == [False]
    # (z, x, y): the middle x's others (1, 1) tie, the final y's (3, 1) do not
    X4 = np.array([[z, x, y]], dtype=np.uint8)
    assert _keep(X4, 2, False, "last").tolist() == [True]
    assert _keep(X4, 2, False, "all").tolist() == [False]


def test_keep_without_constraints_keeps_everything():
    tokens = all_sequences(1, 5)[:, 0]  # the 32 distinct 5-bit tokens
    X = np.stack([tokens[:10], tokens[10:20]], axis=1)
    X[3, 1] = X[3, 0]
    assert _keep(X, 0, False, "all").tolist() == [True] * 10
    assert _keep(X, 0, False, "last").tolist() == [True] * 10
    assert _keep(X, 0, True, "all").tolist() == [i != 3 for i in range(10)]
    one = random_binary(1, (4, 1, 3))
    assert _keep(one, 0, True, "all").tolist() == [True] * 4
