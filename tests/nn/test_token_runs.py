"""The final-query form on runs of equal tokens (``Mixer.attend_last_runs``,
``minip_learn.nn.ops.tokens.token_runs``) of the recurrent mixers against the
token-by-token scan and the form per position: the same outputs and parameter
gradients, in float64, on sequences made of runs of every length, with and without
empty runs before the first."""

import pytest
import torch

from minip_learn.nn import make_mixer
from minip_learn.nn.mixers.mamba import run_readouts
from minip_learn.nn.ops.tokens import distinct_token_index, token_runs

N_BITS = 4
RUN_MIXERS = ["deltanet", "gla", "mamba"]


def _runs_family(n=40, seq_len=12, max_runs=4, seed=0):
    """Sequences of ``seq_len`` 0/1 tokens made of 1 to ``max_runs`` runs of random
    lengths (neighbouring runs may hold the same token and merge)."""
    g = torch.Generator().manual_seed(seed)
    pool = (torch.rand(7, N_BITS, generator=g) > 0.5).double()
    seqs = []
    for _ in range(n):
        k = int(torch.randint(1, max_runs + 1, (1,), generator=g))
        cuts = torch.randperm(seq_len - 1, generator=g)[:k - 1].add(1).sort().values.tolist()
        bounds = [0, *cuts, seq_len]
        tokens = torch.randint(0, 7, (k,), generator=g)
        seqs.append(torch.cat([pool[t].expand(b - a, N_BITS)
                               for t, a, b in zip(tokens, bounds, bounds[1:])]))
    return torch.stack(seqs)


def _mixer(name, seed=0, scale=0.7):
    torch.manual_seed(seed)
    mixer = make_mixer(name, N_BITS, 5).double()
    with torch.no_grad():  # parameters far from the initial ones: every term matters
        for p in mixer.parameters():
            p.add_(scale * torch.randn_like(p))
    return mixer


def _value_and_grads(mixer, fn):
    u = fn()
    weights = torch.linspace(-1, 1, u.numel(), dtype=u.dtype).view_as(u)
    params = list(mixer.parameters())
    grads = torch.autograd.grad((u * weights).sum(), params, allow_unused=True)
    return u, [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def test_token_runs_rebuild_the_sequences():
    x = _runs_family()
    tokens, index = distinct_token_index(x)
    runs = token_runs(index)
    run_index, lengths = runs.index, runs.lengths
    assert run_index.shape == lengths.shape and run_index.shape[1] <= 4
    assert bool((lengths.sum(1) == x.shape[1]).all())
    for s in range(len(x)):  # the runs, repeated, are the sequence; empty runs first
        rebuilt = torch.repeat_interleave(run_index[s], lengths[s])
        assert torch.equal(rebuilt, index[s])
        used = lengths[s] > 0
        assert bool((used[1:] >= used[:-1]).all())  # no empty run after a run
        merged = run_index[s][used]
        assert bool((merged[1:] != merged[:-1]).all())  # neighbouring runs differ


def test_token_runs_none_when_too_many():
    index = torch.tensor([[0, 1, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0]])
    assert token_runs(index) is None  # 6 runs of 6 positions
    assert token_runs(index, max_fraction=1.0) is not None


@pytest.mark.parametrize("name", RUN_MIXERS)
@pytest.mark.parametrize("seed", [0, 1])
def test_runs_form_equals_the_scan(name, seed):
    x = _runs_family(seed=seed)
    mixer = _mixer(name, seed=seed)
    tokens, index = distinct_token_index(x)
    runs = token_runs(index)
    u, grads = _value_and_grads(mixer, lambda: mixer.attend_last_runs(tokens, runs))
    scan, scan_grads = _value_and_grads(mixer, lambda: mixer.attend_recurrent(x)[:, -1])
    blocks, block_grads = _value_and_grads(mixer, lambda: mixer.last_in_blocks(x))
    assert u.abs().max() > 0.1  # not a trivial output
    torch.testing.assert_close(u, scan, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(u, blocks, rtol=1e-9, atol=1e-10)
    for g, ref, ref2 in zip(grads, scan_grads, block_grads, strict=True):
        torch.testing.assert_close(g, ref, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(g, ref2, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", RUN_MIXERS)
def test_final_query_steps_once_per_run(name, monkeypatch):
    x = _runs_family()
    mixer = _mixer(name)
    calls = []
    original = type(mixer).attend_last_runs

    def spy(self, tokens, runs):
        calls.append(runs.index.shape)
        return original(self, tokens, runs)

    monkeypatch.setattr(type(mixer), "attend_last_runs", spy)
    u = mixer(x, last=True)
    assert calls and calls[0][1] <= 4
    torch.testing.assert_close(u, mixer.recurrent(x)[:, -1:], rtol=1e-9, atol=1e-10)
    many = (torch.rand(5, 12, N_BITS, generator=torch.Generator().manual_seed(3)) > 0.5)
    mixer(many.double(), last=True)  # (almost) a run per position: the per-position form
    assert len(calls) == 1


@pytest.mark.parametrize("name", ["gla", "mamba"])
def test_runs_form_with_a_gate_or_step_of_zero(name):
    """A log-gate (gla) or step (mamba) that rounds to 0 makes ``g_L = L``, not 0/0."""
    x = _runs_family(n=8)
    mixer = _mixer(name, scale=0.0)
    with torch.no_grad():
        layer = mixer.gate if name == "gla" else mixer.delta
        layer.weight.zero_()
        layer.bias.fill_(800.0 if name == "gla" else -800.0)
    tokens, index = distinct_token_index(x)
    u = mixer.attend_last_runs(tokens, token_runs(index))
    assert bool(torch.isfinite(u).all())
    torch.testing.assert_close(u, mixer.attend_recurrent(x)[:, -1], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("rows", [1, 2, 64])
def test_run_readouts_is_its_formula_with_its_gradient(rows):
    g = torch.Generator().manual_seed(0)
    steps = torch.rand(7, 2, generator=g, dtype=torch.float64)
    keys = torch.randn(7, 3, generator=g, dtype=torch.float64)
    table = torch.randn(4, 2, 3, generator=g, dtype=torch.float64)
    pair = torch.tensor([0, 3, 3, 1, 2, 0, 3])
    A = -torch.rand(2, 3, generator=g, dtype=torch.float64) * 3
    inputs = [t.requires_grad_() for t in (steps, keys, table, A)]

    def formula(s, k, t, a):
        return (k[:, None, :] * t[pair] * torch.exp(a * s[:, :, None])).sum(-1)

    def fn(s, k, t, a):
        return run_readouts(s, k, t, pair, a, rows=rows)

    torch.testing.assert_close(fn(*inputs), formula(*inputs))
    w = torch.randn(7, 2, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((fn(*inputs) * w).sum(), inputs)
    want = torch.autograd.grad((formula(*inputs) * w).sum(), inputs)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(fn, inputs)
    for need in range(4):  # one input at a time asks for its gradient
        part = [t.detach().requires_grad_(i == need) for i, t in enumerate(inputs)]
        (grad,) = torch.autograd.grad((fn(*part) * w).sum(), part[need])
        torch.testing.assert_close(grad, want[need])


@pytest.mark.parametrize("name", RUN_MIXERS)
def test_runs_form_under_vmap_is_each_members(name):
    """Stacked members (parameters batched by vmap, the tokens shared) get each
    member's final query through the run form, and each member's gradients."""
    x = _runs_family(n=10)
    members = [_mixer(name, seed=s) for s in range(3)]
    stacked = {k: torch.stack([dict(m.named_parameters())[k].detach() for m in members])
               .requires_grad_()
               for k, _ in members[0].named_parameters()}

    def one(params):
        return torch.func.functional_call(members[0], params, (x,), {"last": True})

    calls = []
    original = type(members[0]).attend_last_runs

    def counted(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls.append(out is not None)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(members[0]), "attend_last_runs", counted)
        got = torch.func.vmap(one)(stacked)
    assert calls == [True]  # the run form, batched
    w = torch.linspace(-1, 1, got[0].numel(), dtype=got.dtype).reshape(got[0].shape)
    grads = torch.autograd.grad((got * w).sum(), list(stacked.values()))
    for i, m in enumerate(members):
        torch.testing.assert_close(got[i], m(x, last=True), rtol=1e-9, atol=1e-10)
        own = torch.autograd.grad((m(x, last=True) * w).sum(), list(m.parameters()))
        for g_all, g_own in zip(grads, own, strict=True):
            torch.testing.assert_close(g_all[i], g_own, rtol=1e-9, atol=1e-10)


def test_token_runs_suffixes():
    """Two runs share a suffix id exactly when their pairs and those after them agree,
    and the run given for each id has it."""
    x = _runs_family(n=60, seq_len=8, max_runs=3)
    runs = token_runs(distinct_token_index(x)[1])
    n, R = runs.index.shape
    keys = [tuple(runs.pairs[s, k:].tolist()) + (k,) for s in range(n) for k in range(R)]
    ids = runs.suffix.reshape(-1).tolist()
    empty = (runs.lengths.reshape(-1) == 0).tolist()
    by_key = {}
    for key, i, e in zip(keys, ids, empty, strict=True):
        if e:  # an empty run: one past the last suffix
            assert i == len(runs.suffix_rows)
            continue
        assert by_key.setdefault(key, i) == i
    assert len(set(by_key.values())) == len(by_key) == len(runs.suffix_rows) < n * R
    assert any(empty)
    for i, row in enumerate(runs.suffix_rows.tolist()):
        assert ids[row] == i
