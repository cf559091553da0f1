"""make_witness_suite(construction="exact"): the family of R9 whose certified rank meets
its constructive rank, checked against the theory functions it is built from."""

import numpy as np
import pytest

from minip_learn.compact import CompactFamily
from minip_learn.datasets import make_witness_suite
from minip_learn.theory import (
    certify,
    complement_closed_code,
    exact_family_size,
    exact_seq_len,
    witness_family,
)


def multisets(family):
    """The family's sequences as a set of sorted (token bytes, count) tuples."""
    out = set()
    for ids, counts in zip(family.token_ids.tolist(), family.counts.tolist()):
        out.add(tuple(sorted((family.tokens[i].tobytes(), c) for i, c in zip(ids, counts)
                             if i >= 0)))
    return out


@pytest.mark.parametrize("m", [8, 10, 12])
def test_exact_suite_meets_its_constructive_rank(m):
    suite = make_witness_suite(m, construction="exact", max_sequences=10**6)
    code = complement_closed_code(m)
    N = exact_seq_len(code)
    assert suite.params["seq_len"] == N == suite.family.seq_len
    assert len(suite.family) == exact_family_size(len(code))
    assert suite.certified_min_rank == suite.constructive_rank == len(code)
    assert suite.exact_min_rank == len(code) == suite.design_bound
    assert suite.certificate.diagonally_dominant
    # the tokens are exactly the code words (every key is a word)
    assert multisets(CompactFamily(suite.tokens, np.arange(len(code))[:, None],
                                   np.ones((len(code), 1), dtype=int))) == \
        multisets(CompactFamily(code, np.arange(len(code))[:, None],
                                np.ones((len(code), 1), dtype=int)))


def test_exact_family_is_the_single_step_witness_family():
    # the same multisets as the general witness construction with single steps
    # (which lists one of them twice)
    suite = make_witness_suite(8, construction="exact")
    code = complement_closed_code(8)
    general = witness_family(code, suite.family.seq_len, ladder_gap=None, compact=True)
    assert multisets(general) == multisets(suite.family)
    # R9 at m = 8: the greedy code has |C| = 14 words, the exact minimum rank
    assert certify(general) == len(code) == 14


def test_below_the_exact_length_the_bound_is_lower_and_never_above_exact():
    ranks = []
    for N in (3, 8, 14, 15):
        suite = make_witness_suite(8, N, construction="exact")
        assert suite.design_bound <= suite.certified_min_rank <= suite.constructive_rank
        ranks.append(suite.certified_min_rank)
        assert (suite.exact_min_rank is not None) == (ranks[-1] == suite.constructive_rank)
    # R9 at m = 8: 14 words, exact from N = 15 on (THEORY.md)
    assert ranks == sorted(ranks) and ranks[-1] == 14 and ranks[0] < 14


def test_prefixes_and_shuffles_stay_exact():
    part = make_witness_suite(12, construction="exact", n_queries=20)
    assert part.certified_min_rank == part.exact_min_rank == 20
    fitted = make_witness_suite(12, construction="exact", max_sequences=2000)
    assert len(fitted.family) <= 2000 and fitted.exact_min_rank == fitted.constructive_rank
    shuffled = make_witness_suite(12, construction="exact", random_state=0,
                                  max_sequences=10**6)
    # the whole m = 12 code: 80 words (Graham-Sloane modulo 12, extended; 80 * 238 / 2
    # = 9,520 sequences fit), exact at its own length
    assert shuffled.exact_min_rank == 80 and shuffled.params["random_state"] == 0
    again = make_witness_suite(**{k: shuffled.params[k] for k in (
        "n_bits", "seq_len", "construction", "n_queries", "max_sequences", "random_state")})
    np.testing.assert_array_equal(again.token_ids, shuffled.token_ids)


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_bits=13), "needs an even n_bits"),
    (dict(n_bits=12, n_queries=7), "even n_queries"),
    (dict(n_bits=12, n_queries=200), "at most 80"),
    (dict(n_bits=12, max_sequences=3), "fits max_sequences=3"),
])
def test_bad_exact_arguments_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_witness_suite(construction="exact", **kwargs)
