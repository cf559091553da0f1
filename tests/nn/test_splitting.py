"""Feature splitting of table heads (the cure of the assignment trap)."""

import itertools

import numpy as np
import pytest
import torch
from sklearn.base import clone

from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_witness_suite
from minip_learn.model_selection import fit_ensemble
from minip_learn.nn import (
    HeadEnsemble,
    KernelAttentionHead,
    minip_partners,
    reset_optimizer_entries,
    split_shared_features,
    splittable_tables,
)
from minip_learn.nn.splitting import OFF


@pytest.fixture(scope="module")
def hadamard12():
    # 22 tokens, constructive rank 22, certified 4: without splitting every seed stalls
    return make_witness_suite(n_bits=12, seq_len=3, construction="hadamard")


# -- partners: brute force -------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_partners_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    vocab = np.unique(rng.integers(0, 2, size=(12, 5)), axis=0)
    index = rng.integers(0, len(vocab), size=(9, 3))
    got = minip_partners(torch.as_tensor(index), torch.as_tensor(vocab, dtype=torch.float32))
    for t in range(len(vocab)):
        others = sorted({int(row[j]) for row in index for i, j in itertools.permutations(range(3), 2)
                         if row[i] == t})
        if not others:
            assert got[t] == -1
            continue
        best = min(others, key=lambda z: (int(vocab[t] @ vocab[z]), z))
        assert int(vocab[t] @ vocab[got[t]]) == int(vocab[t] @ vocab[best])
        assert int(got[t]) == best


@pytest.mark.parametrize("seed", [0, 1, 2, "zero-token"])
def test_partners_of_a_multiset_family_are_those_of_its_sequences(seed):
    # a padding slot repeats slot 0's token: it must not make that token its own
    # partner (the zero token overlaps every token in 0, itself included)
    from minip_learn.compact import CompactFamily

    if seed == "zero-token":
        vocab = np.array([[0, 0, 0], [0, 1, 1], [1, 0, 0], [1, 1, 0]])
        index = np.array([[0, 1, 1, 1], [1, 2, 3, 3]])
    else:
        rng = np.random.default_rng(seed)
        vocab = np.unique(rng.integers(0, 2, size=(10, 5)), axis=0)
        index = rng.integers(0, len(vocab), size=(30, 4))
        index[::3, 1:] = index[::3, :1]  # some sequences of one token
    fam = CompactFamily.from_sequences(vocab[index])
    vt = torch.as_tensor(vocab, dtype=torch.float32)
    got = minip_partners(_vocab_index(vocab, fam.slot_tokens()), vt,
                         torch.as_tensor(fam.counts))
    want = minip_partners(torch.as_tensor(index), vt)
    # slots of one occurrence beside padding (which repeats slot 0's token)
    assert ((fam.counts[:, 0] == 1) & fam.padding.any(1)).any()
    assert got.tolist() == want.tolist()
    if seed == "zero-token":
        assert got[0] == 1


def _vocab_index(vocab, tokens):
    """Row of ``vocab`` of every token of ``tokens`` (..., n_bits)."""
    keys = {row.tobytes(): i for i, row in enumerate(np.asarray(vocab, dtype=np.uint8))}
    flat = np.asarray(tokens, dtype=np.uint8).reshape(-1, tokens.shape[-1])
    return torch.as_tensor([keys[t.tobytes()] for t in flat]).reshape(tokens.shape[:-1])

# -- one splitting pass ----------------------------------------------------------------
def _dominant(lq, lk, partners):
    q = torch.nonzero(partners >= 0).flatten()
    return (lq[q] + lk[partners[q]]).argmax(1)


def _trap(seed, n_tokens=8, rank=8, assign=(0, 0, 0, 3, 4, 5, 6, 7)):
    """Random tables where query ``x`` has dominant feature ``assign[x]``
    (by default queries 0, 1, 2 share feature 0 and features 1, 2 are free)."""
    g = torch.Generator().manual_seed(seed)
    lq = 0.1 * torch.randn(n_tokens, rank, generator=g, dtype=torch.float64)
    lk = 0.1 * torch.randn(n_tokens, rank, generator=g, dtype=torch.float64)
    partners = torch.roll(torch.arange(n_tokens), 1)
    for x in range(n_tokens):
        f = assign[x]
        lq[x, f] += 5.0
        lk[partners[x], f] += 5.0
    return lq, lk, partners


@pytest.mark.parametrize("seed", range(5))
def test_split_gives_every_query_its_own_feature(seed):
    lq, lk, partners = _trap(seed)
    dom = _dominant(lq, lk, partners)
    assert len(set(dom.tolist())) == 6
    old_q, old_k = lq.clone(), lk.clone()
    cq, ck, moved = split_shared_features(lq, lk, partners)
    assert moved == 2
    # only the reported entries changed
    assert torch.equal((lq != old_q), (lq != old_q) & cq)
    assert torch.equal((lk != old_k), (lk != old_k) & ck)
    new_dom = _dominant(lq, lk, partners)
    assert len(set(new_dom.tolist())) == 8
    # every query keeps its dominant kernel term with its partner exactly
    for x in range(8):
        f, g = int(dom[x]), int(new_dom[x])
        p = int(partners[x])
        assert lq[x, g] + lk[p, g] == old_q[x, f] + old_k[p, f]
    # kernel rows change only by the split-into features' old terms (and OFF terms)
    alpha_old = torch.exp(old_q) @ torch.exp(old_k).T
    alpha_new = torch.exp(lq) @ torch.exp(lk).T
    cols = torch.nonzero(ck.all(0)).flatten()
    lost = torch.exp(old_q[:, cols]) @ torch.exp(old_k[:, cols]).T
    slack = 2 * lq.shape[1] * np.exp(OFF) * torch.exp(old_q).max() * torch.exp(old_k).max()
    assert torch.all(alpha_new >= alpha_old - lost - slack)
    assert torch.all(alpha_new <= alpha_old + slack)


def test_split_without_free_feature_does_nothing():
    lq, lk, partners = _trap(0, rank=6, assign=(0, 1, 2, 3, 4, 5, 0, 1))  # all 6 dominant
    before = lq.clone(), lk.clone()
    cq, ck, moved = split_shared_features(lq, lk, partners)
    assert moved == 0 and not cq.any() and not ck.any()
    assert torch.equal(lq, before[0]) and torch.equal(lk, before[1])


def test_split_respects_mask_and_members():
    lq, lk, partners = _trap(1)
    Q, K = torch.stack([lq, lq, lq]), torch.stack([lk, lk, lk])
    mask = torch.ones(3, 8, dtype=torch.float64)
    mask[1, 1:3] = 0                    # member 1 may not use the free features 1, 2
    Q0, K0 = Q.clone(), K.clone()
    _, _, moved = split_shared_features(Q, K, partners, mask=mask, members=[0, 1])
    assert moved.tolist() == [2, 0, 0]  # member 1: its only free features are masked
    assert torch.equal(Q[1:], Q0[1:]) and torch.equal(K[1:], K0[1:])
    # stacked == one member at a time
    lq2, lk2 = lq.clone(), lk.clone()
    split_shared_features(lq2, lk2, partners)
    assert torch.equal(Q[0], lq2) and torch.equal(K[0], lk2)


def test_reset_optimizer_entries():
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.Adam([p], lr=0.1)
    p.sum().backward()
    opt.step()
    changed = torch.zeros(4, 3, dtype=torch.bool)
    changed[1, 2] = True
    reset_optimizer_entries(opt, p, changed)
    for k in ("exp_avg", "exp_avg_sq"):
        assert opt.state[p][k][1, 2] == 0
        assert (opt.state[p][k][~changed] != 0).all()


def test_splittable_tables():
    vocab = torch.eye(4)
    head = KernelAttentionHead(4, 3, feature_map="table", feature_kwargs=dict(vocabulary=vocab))
    q, k = splittable_tables(head)
    assert q is head.query_features.log_table and k is head.key_features.log_table
    shared = KernelAttentionHead(4, 3, feature_map="table", shared_features=True,
                                 feature_kwargs=dict(vocabulary=vocab))
    assert splittable_tables(shared) is None
    assert splittable_tables(KernelAttentionHead(4, 3)) is None


# -- training ----------------------------------------------------------------------------
def test_splitting_escapes_the_assignment_trap(hadamard12):
    suite = hadamard12
    r = suite.constructive_rank
    est = KernelAttentionRegressor(rank=r, feature_map="table", max_epochs=800,
                                   stop_tolerance=0.5)
    for seed in (0, 1):
        stuck = clone(est).set_params(split_every=None, random_state=seed).fit(suite.X, suite.y)
        assert not stuck.solved_ and stuck.train_max_error_ > 1.0
        assert not any("n_split" in row for row in stuck.net_.history)
        fixed = clone(est).set_params(random_state=seed).fit(suite.X, suite.y)
        assert fixed.solved_, fixed.train_max_error_
        moves = [row["n_split"] for row in fixed.net_.history if "n_split" in row]
        assert moves and moves[0] > 0
        # the certified bound still holds: splitting cannot make a head solve below it
        assert fixed.rank >= suite.certified_min_rank


def test_splitting_is_ignored_by_other_maps(hadamard12):
    est = KernelAttentionRegressor(rank=4, feature_map="exp", max_epochs=210,
                                   stop_tolerance=None, random_state=0)
    est.fit(hadamard12.X[:64], hadamard12.y[:64])
    assert not any("n_split" in row for row in est.net_.history)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "often"])
def test_split_every_is_validated_at_fit(bad, hadamard12):
    est = KernelAttentionRegressor(rank=2, feature_map="table", split_every=bad)
    assert est.get_params()["split_every"] == bad     # no validation in __init__
    with pytest.raises(ValueError, match="split_every"):
        est.fit(hadamard12.X[:8], hadamard12.y[:8])


def test_ensemble_splits_as_separate_fits_do(hadamard12):
    suite = hadamard12
    est = KernelAttentionRegressor(feature_map="table", max_epochs=700, stop_tolerance=0.5,
                                   dtype="float64")
    ranks, seeds = [12, 22], [0, 1]
    res = fit_ensemble(est, suite.X, suite.y, ranks=ranks, seeds=seeds)
    for params, member in zip(res.params, res.estimators):
        single = clone(est).set_params(**params).fit(suite.X, suite.y)
        assert member.n_epochs_ == single.n_epochs_
        assert member.solved_ == single.solved_

        def splits(e):
            return [(r["epoch"], r["n_split"]) for r in e.net_.history if "n_split" in r]

        assert splits(member) == splits(single)
        for (n, a), b in zip(member.net_.module_.state_dict().items(),
                             single.net_.module_.state_dict().values()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=n)
    assert all(res.solved[[p["rank"] == 22 for p in res.params]])


def test_r6_suite_solves_at_its_constructive_rank():
    """The m = 24 witness suite (46 tokens) is solved at its constructive rank 46."""
    suite = make_witness_suite(n_bits=24, seq_len=3)
    assert suite.constructive_rank == 46 and suite.certified_min_rank == 17
    est = KernelAttentionRegressor(rank=46, feature_map="table", stop_tolerance=0.5,
                                   max_epochs=1200, random_state=0).fit(suite.X, suite.y)
    assert est.solved_, est.train_max_error_
    assert est.score(suite.X, suite.y) == 1.0


@pytest.mark.parametrize("ensemble", [True, False])
@pytest.mark.parametrize("heap_free", [None, 2**30, 2**20])
def test_training_returns_freed_memory_periodically(hadamard12, monkeypatch, ensemble,
                                                    heap_free):
    from minip_learn.training import TRIM_EVERY, TRIM_MIN_FREE, _callbacks

    real = _callbacks.malloc_trim()
    assert real is None or callable(real)  # glibc: malloc_trim; elsewhere nothing
    free = _callbacks.heap_free_bytes()
    assert free is None or free() >= 0  # glibc >= 2.33: mallinfo2
    calls = []
    monkeypatch.setattr(_callbacks, "malloc_trim", lambda: (lambda: calls.append(1)))
    # heap_free None: glibc cannot say how much is free, so every TRIM_EVERY epochs
    monkeypatch.setattr(_callbacks, "heap_free_bytes",
                        lambda: None if heap_free is None else (lambda: heap_free))
    est = KernelAttentionRegressor(rank=4, feature_map="table", max_epochs=120,
                                   stop_tolerance=None, random_state=0)
    if ensemble:
        fit_ensemble(est, hadamard12.X, hadamard12.y, seeds=[0, 1])
    else:
        est.fit(hadamard12.X, hadamard12.y)
    trims = 0 if heap_free is not None and heap_free < TRIM_MIN_FREE else 120 // TRIM_EVERY
    assert len(calls) == trims


def test_ensemble_token_tables_are_split_in_place():
    # the callback splits the stack's own tables (HeadEnsemble.token_tables)
    vocab = torch.eye(4)
    heads = [KernelAttentionHead(4, r, feature_map="table",
                                 feature_kwargs=dict(vocabulary=vocab)) for r in (2, 3)]
    ens = HeadEnsemble(heads)
    q, k = ens.token_tables()
    with torch.no_grad():
        q.zero_()
        q[:, :, 0] = 5.0  # every query on feature 0
    _, _, moved = split_shared_features(q, k, torch.tensor([1, 0, 3, 2]),
                                        mask=ens.stacked_buffer("feature_mask"))
    assert moved.tolist() == [1, 2]
    assert ens.token_tables()[0] is q
    assert (q[0, :, 2] == 0).all()  # member 0's padded feature is never split into
    assert q[0].argmax(1).unique().tolist() == [0, 1]
    assert q[1].argmax(1).unique().tolist() == [0, 1, 2]
