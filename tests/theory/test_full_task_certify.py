"""The certified rank of the full length-3 task over named sub-families."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minip_learn.datasets import make_full_task
from minip_learn.estimators import KernelAttentionRegressor
from minip_learn.metrics import verify_solver
from minip_learn.theory import (
    certify,
    certify_full_task,
    family_constraints,
    full_task_constraint_count,
    full_task_family,
    full_task_tokens,
    grouped_key_weights,
    key_weight_excess,
    verify_certificate,
)
from minip_learn.theory._full_task_search import best_pairs, chain_products
from minip_learn.theory.full_task import lift_certificate


def _all_ordered(m):
    T = full_task_tokens(m)
    return T[np.array(list(itertools.product(range(len(T)), repeat=3)))]


@pytest.mark.parametrize("m, rank", [(1, 1), (2, 1), (3, 1), (4, 2)])
def test_certificate_verifies_on_every_ordered_sequence(m, rank):
    res = certify_full_task(m)
    assert res.certified_min_rank == rank and res.verified
    # brute force: the certificate holds on the 2^(3m) ordered sequences themselves
    assert verify_certificate(res.certificate, _all_ordered(m))
    assert res.pools[-1]["pool"] == "search" and res.pools[-1]["search_exhaustive"]
    assert "exhaustive" in res.reach


@pytest.mark.parametrize("m", [2, 3, 4])
def test_constraint_count_is_the_familys(m):
    _, edges, _ = family_constraints(full_task_family(m))
    assert full_task_constraint_count(m) == sum(len(v) for v in edges.values())


def test_a_pool_certificate_lifts_to_the_task_and_verifies():
    res = certify_full_task(4, pools=["weight-2"])
    # 2 is the most any set of pairs reaches at m = 4 (the exhaustive search below); the
    # lifted certificate lists all 2^4 = 16 tokens of the task
    assert res.pool == "weight-2" and res.certified_min_rank == 2 and res.verified
    assert len(res.certificate.tokens) == 16
    task = full_task_family(4)
    sub = full_task_family(tokens=full_task_tokens(4)[full_task_tokens(4).sum(1) == 2])
    _, cert = certify(sub, return_certificate=True)
    with pytest.raises(ValueError, match="certificate rejected"):
        verify_certificate(cert, task)              # tokens of the task it does not list
    lifted = lift_certificate(cert, task.tokens,
                              n_constraints=full_task_constraint_count(4))
    assert verify_certificate(lifted, task)


def test_the_search_is_exhaustive_and_agrees_with_every_pair_at_m4():
    T = full_task_tokens(4)
    assert best_pairs(T, full=True)[2:] == best_pairs(T, full=False)[2:] == (2, True)
    assert chain_products(range(9), 0)[8] == 9 and 1 not in chain_products([0, 1, 2], 0)


_subsets = st.lists(st.integers(0, 15), min_size=2, max_size=16, unique=True)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(small=_subsets, extra=_subsets)
def test_adding_tokens_never_lowers_the_certificate(small, extra):
    T = full_task_tokens(4)
    a = certify_full_task(tokens=T[small], verify=False)
    b = certify_full_task(tokens=T[sorted(set(small) | set(extra))], verify=False)
    assert b.certified_min_rank >= a.certified_min_rank


@pytest.mark.parametrize("above", [False, True], ids=["below-bound", "one-per-token"])
def test_trained_head_solves_only_at_or_above_the_certified_rank(above):
    """The same training fails one rank below the certified rank 2 and solves at the
    constructive rank 16 (one feature per token of the m = 4 task): a failure below the
    bound is the bound's, not the trainer's."""
    task = make_full_task(4)
    bound = certify_full_task(4).certified_min_rank
    assert bound == 2
    rank = 2 ** 4 if above else bound - 1
    est = KernelAttentionRegressor(rank=rank, feature_map="table", max_epochs=300,
                                   lr=0.05, random_state=0)
    est.fit(task.family, task.slot_targets)
    err = verify_solver(est, task.X, task.y)
    assert (err < 0.5) == above and est.solved_ == above


@pytest.mark.parametrize("m, groups", [(2, 1), (3, 1), (4, 2)])
def test_key_weight_groups_meet_the_certified_rank_at_small_m(m, groups):
    res = grouped_key_weights(m)
    assert res.rank == groups == certify_full_task(m, pools=["search"]).certified_min_rank
    assert res.excess < 1 and res.max_error < 0.5
    assert key_weight_excess(res.tokens, res.query_group, res.key_weights) == res.excess
