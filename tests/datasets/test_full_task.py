"""The full length-3 task: the loader's family is every sequence, by brute force."""

import itertools
from collections import Counter
from math import comb

import numpy as np
import pytest

from minip_learn import compact
from minip_learn.datasets import make_full_task, minip_targets
from minip_learn.theory import full_task_family, full_task_size, full_task_tokens


def _ordered(m):
    """Every ordered length-3 sequence of m-bit tokens, as token-id triples."""
    return list(itertools.product(range(2 ** m), repeat=3))


def _multisets(family):
    """The multiset of token ids of each row of a compact family."""
    out = []
    for ids, cnt in zip(family.token_ids.tolist(), family.counts.tolist()):
        out.append(tuple(sorted(i for i, c in zip(ids, cnt) for _ in range(c))))
    return out


@pytest.mark.parametrize("m", [1, 2, 3])
def test_query_all_lists_every_multiset_of_every_ordered_sequence_once(m):
    task = make_full_task(m)
    assert np.array_equal(task.tokens, full_task_tokens(m))
    got = _multisets(task.family)
    assert len(got) == len(set(got)) == task.n_sequences == full_task_size(m)
    assert set(got) == {tuple(sorted(s)) for s in _ordered(m)}
    assert task.n_ordered_sequences == 2 ** (3 * m)
    # per-slot targets are the Min-IP targets of the materialised sequences
    assert np.array_equal(task.y, minip_targets(task.X))
    assert task.X.shape == (task.n_sequences, 3, m)


@pytest.mark.parametrize("m", [1, 2, 3])
def test_query_last_lists_every_query_with_every_key_multiset_once(m):
    task = make_full_task(m, query="last")
    fam = task.family
    X = fam.to_sequences()
    assert np.array_equal(X, task.X)
    ids = [tuple(map(int, row)) for row in
           (X.astype(np.int64) * (1 << np.arange(m - 1, -1, -1))).sum(-1)]
    keyed = Counter((s[-1], tuple(sorted(s[:-1]))) for s in ids)
    want = {(q, tuple(sorted((a, b)))) for a, b, q in _ordered(m)}
    assert set(keyed) == want and max(keyed.values()) == 1
    assert len(fam) == full_task_size(m, query="last") == 2 ** m * (2 ** m + 1) * 2 ** (m - 1)
    assert np.array_equal(task.y, minip_targets(X)[:, -1])


def test_sizes_match_the_paper_counts_and_m8_fits():
    # T = 2^m tokens; query last: T queries times C(T + 1, 2) key multisets; query all:
    # C(T + 2, 3) multisets of three tokens
    assert [full_task_size(m, query="last") for m in range(2, 7)] == [
        40, 288, 2176, 16896, 133120] == [2 ** m * comb(2 ** m + 1, 2) for m in range(2, 7)]
    assert full_task_size(8, query="last") == 8421376 == 256 * comb(257, 2)
    assert full_task_size(8) == 2829056 == comb(258, 3)


def test_zero_token_and_repeats_are_sequences_like_any_other():
    task = make_full_task(2)
    seqs = {tuple(map(tuple, s)) for s in task.X.tolist()}
    assert ((0, 0), (0, 0), (0, 0)) in seqs and ((1, 1), (1, 1), (1, 1)) in seqs
    # (x, x, x) has target |x|
    i = next(k for k, s in enumerate(task.X.tolist()) if s == [[1, 1]] * 3)
    assert task.y[i].tolist() == [2, 2, 2]


def test_token_subset_and_compact_form_above_the_materialisation_limit(monkeypatch):
    toks = full_task_tokens(3)[[0, 3, 5, 6]]
    task = make_full_task(3, tokens=toks)
    assert task.n_sequences == full_task_size(n_tokens=4) == 20 == comb(4 + 2, 3)
    monkeypatch.setattr(compact, "MATERIALIZE_MAX_BYTES", 100)
    big = make_full_task(3)
    assert big.X is None and big.y is None and big.slot_targets.shape == (120, 3)
    assert make_full_task(3, query="last").y.shape == (288,)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="query"):
        make_full_task(3, query="first")
    with pytest.raises(ValueError, match="FULL_TASK_MAX_SEQUENCES"):
        full_task_family(10)
    with pytest.raises(ValueError, match="n_bits"):
        full_task_tokens(17)
