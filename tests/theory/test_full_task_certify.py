"""The certified rank of the full length-3 task over named sub-families."""

import dataclasses
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
    pad_certificate,
    verify_certificate,
    verify_full_task_certificate,
)
from minip_learn.theory._full_task_search import best_pairs, chain_products
from minip_learn.theory._task_sets import full_task_triples
from minip_learn.theory.full_task import POOL_MAX_SEQUENCES, full_task_pools, lift_certificate


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


# ------------------------------------------------------------ the task beyond 8 bits
def _brute_constraints(m):
    """R4 triples of the full task over m bits, counted triple by triple."""
    toks = list(itertools.product((0, 1), repeat=m))
    dot = {(a, b): sum(u * v for u, v in zip(a, b)) for a in toks for b in toks}
    return sum(1 for x in toks for y in toks for z in toks if dot[x, z] - dot[x, y] >= 2)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_closed_form_constraint_count_is_the_brute_force_one(m):
    assert full_task_constraint_count(m) == _brute_constraints(m)


@pytest.mark.parametrize("m", [5, 6, 7])
def test_closed_form_constraint_count_matches_the_tokens_count(m):
    assert full_task_constraint_count(m) == full_task_constraint_count(
        tokens=full_task_tokens(m))


def test_implicit_verification_agrees_with_the_listed_family():
    """A certificate of the m = 4 task padded to 6 bits: checked without listing the task
    and, lifted to all 64 tokens, against the listed family of the 6-bit task."""
    cert = pad_certificate(certify_full_task(4).certificate, 6)
    n6 = full_task_constraint_count(6)
    implicit = dataclasses.replace(cert, n_constraints=n6)
    assert verify_full_task_certificate(implicit, 6)
    lifted = lift_certificate(cert, full_task_tokens(6), n_constraints=n6)
    assert verify_certificate(lifted, full_task_family(6))


def _break(cert, what):
    if what == "rank":
        return dataclasses.replace(cert, certified_min_rank=cert.certified_min_rank + 1)
    if what == "count":
        return dataclasses.replace(cert, n_constraints=cert.n_constraints - 1)
    if what == "gap":          # a designated key one bit heavier: its overlap gaps move
        tokens = cert.tokens.copy()
        k = int(cert.key_index[0])
        free = np.flatnonzero((tokens[k] == 0) & (cert.tokens[cert.query_index[0]] == 1))
        tokens[k, free[0]] = 1
        return dataclasses.replace(cert, tokens=tokens)
    if what == "denominator":
        K = cert.eps_denominators.copy()
        K[0, 1] += 1
        return dataclasses.replace(cert, eps_denominators=K)
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["rank", "count", "gap", "denominator"])
def test_implicit_verification_rejects_a_wrong_statement(what):
    res = certify_full_task(9, search_nodes=2000)
    assert res.verified and verify_full_task_certificate(res.certificate, 9)
    bad = _break(res.certificate, what)
    assert not verify_full_task_certificate(bad, 9, raise_on_failure=False)
    with pytest.raises(ValueError, match="certificate rejected"):
        verify_full_task_certificate(bad, 9)


def test_implicit_verification_names_a_task_of_other_bits():
    cert = certify_full_task(4).certificate
    with pytest.raises(ValueError, match="over 4 bits"):
        verify_full_task_certificate(cert, 5)
    with pytest.raises(ValueError, match="n_bits must be an integer from 1 to 64"):
        verify_full_task_certificate(cert, 65)


def test_certify_beyond_the_listed_task_keeps_its_own_tokens():
    """m = 9: the certificate lists the tokens it uses (not 2^9), states the closed-form
    count of the task's constraints, and certifies more than 2 (the most any certificate
    reaches at m <= 8, by the exhaustive search)."""
    res = certify_full_task(9, search_nodes=2000)
    cert = res.certificate
    assert res.n_tokens == 512 and len(cert.tokens) < 512
    assert cert.n_constraints == full_task_constraint_count(9) == res.n_constraints
    assert res.certified_min_rank >= 3 and "not listed" in res.reach
    # every pool that ran stayed under the cap
    assert max(r["n_sequences"] for r in res.pools) <= POOL_MAX_SEQUENCES
    # the pool's own family, certified directly, gives the same rank
    pools = {name: fam for name, fam, _ in full_task_pools(9, search_nodes=2000)}
    assert certify(pools[res.pool]) == res.certified_min_rank


def test_padding_never_lowers_the_bound():
    small = certify_full_task(9, search_nodes=2000)
    padded = pad_certificate(small.certificate, 12)
    padded = dataclasses.replace(padded, n_constraints=full_task_constraint_count(12))
    assert verify_full_task_certificate(padded, 12)
    assert padded.certified_min_rank == small.certified_min_rank
    with pytest.raises(ValueError, match="n_bits must be >= 9"):
        pad_certificate(small.certificate, 8)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 9, 32, 64])
def test_the_verifiers_count_of_triples_is_the_tasks(m):
    """The verifier counts the task's triples with its own closed form (Vandermonde):
    the same as the library's count (and, to m = 4, the brute force above)."""
    assert full_task_triples(m) == full_task_constraint_count(m)
