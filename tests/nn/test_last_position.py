"""The final-query form (``forward(x, last=True)``): the output at the last position
alone, equal to the last position of the whole-sequence form (values and gradients),
for every head, model and member stack, and what a final-query fit runs."""

import numpy as np
import pytest
import torch

from minip_learn.datasets import make_minip
from minip_learn.nn import (
    HeadEnsemble,
    KernelAttentionHead,
    KernelAttentionModel,
    SoftmaxAttentionHead,
    available_mixers,
    get_mixer,
    make_mixer,
    ops,
)
from minip_learn.nn.ops import naive
from minip_learn.training import train_members

HEADS = {
    "kernel": lambda: KernelAttentionHead(5, rank=4),
    "kernel-exp": lambda: KernelAttentionHead(5, rank=4, feature_map="exp"),
    "kernel-table": lambda: KernelAttentionHead(
        5, rank=4, feature_map="table",
        feature_kwargs={"vocabulary": torch.cartesian_prod(*[torch.tensor([0, 1])] * 5)}),
    "causal": lambda: KernelAttentionHead(5, rank=4, causal=True),
    "decay": lambda: KernelAttentionHead(5, rank=4, causal=True, positional="decay",
                                         decay=0.8, feature_map="exp"),
    "learned": lambda: KernelAttentionHead(5, rank=4, causal=True, positional="learned",
                                           max_len=40),
    "softmax": lambda: SoftmaxAttentionHead(5),
    "softmax-causal": lambda: SoftmaxAttentionHead(5, causal=True),
    "model-mlp": lambda: KernelAttentionModel(5, 4, n_heads=2, n_layers=2, readout="mlp"),
    "model-affine": lambda: KernelAttentionModel(5, 4, n_layers=2),
}


def _tokens(seq_len, batch=4, seed=0):
    torch.manual_seed(seed)
    return torch.randint(0, 2, (batch, seq_len, 5)).double()


def _perturbed(make, seed=0):
    torch.manual_seed(seed)
    module = make().double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("seq_len", [1, 3, 40])
@pytest.mark.parametrize("name", list(HEADS))
def test_last_is_the_last_position_in_value_and_gradient(name, seq_len):
    module, x = _perturbed(HEADS[name]), _tokens(seq_len)
    full = module(x)[:, -1:]
    last = module(x, last=True)
    assert last.shape == full.shape
    torch.testing.assert_close(last, full, rtol=1e-9, atol=1e-10)
    params = [p for p in module.parameters() if p.requires_grad]
    g_full = torch.autograd.grad(module(x)[:, -1].sum(), params, allow_unused=True)
    g_last = torch.autograd.grad(module(x, last=True).sum(), params, allow_unused=True)
    for a, b in zip(g_full, g_last):
        if a is None or b is None:
            assert (a if b is None else b) is None or not (a if b is None else b).abs().any()
        else:
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def test_the_last_query_form_is_the_naive_causal_reference():
    torch.manual_seed(1)
    fq, fk = torch.randn(3, 50, 4, dtype=torch.float64), torch.randn(3, 50, 4,
                                                                      dtype=torch.float64)
    v = torch.randn(3, 50, 2, dtype=torch.float64)
    ref = naive.kernel_attention(fq.exp(), fk.exp(), v, nonnegative=True, causal=True,
                                 decay=0.7)
    got = ops.last_attend(fq, fk, v, nonnegative=True, decay=0.7, log_domain=True)
    torch.testing.assert_close(got, ref[:, -1], rtol=1e-9, atol=1e-12)


def test_last_refuses_counts():
    head = KernelAttentionHead(5, rank=2)
    x = _tokens(3)
    with pytest.raises(ValueError, match="multiset form"):
        head(x, counts=torch.ones(4, 3), last=True)


@pytest.mark.parametrize("causal", [False, True])  # the fused and the generic path
@pytest.mark.parametrize("ranks", [(3,), (2, 4, 4)])
def test_a_stack_computes_each_members_last_position(ranks, causal):
    heads = [_perturbed(lambda r=r: KernelAttentionHead(5, rank=r, causal=causal), seed=i)
             for i, r in enumerate(ranks)]
    ens = HeadEnsemble(heads)
    x = _tokens(30)
    out = ens(x, last=True)
    assert out.shape == (len(ranks), 4, 1)
    for i, head in enumerate(heads):
        torch.testing.assert_close(out[i], head(x)[:, -1:], rtol=1e-9, atol=1e-10)


def test_a_final_query_fit_never_runs_the_whole_sequence_form(monkeypatch):
    X, Y = make_minip(24, seq_len=20, n_bits=5, random_state=0)
    X, y = torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(Y[:, -1],
                                                                     dtype=torch.float64)
    ref = train_members(KernelAttentionHead, [(dict(n_bits=5, rank=3), 0)], X, y,
                        query="last", max_epochs=5, dtype=torch.float64)

    def refuse(*args, **kwargs):
        raise AssertionError("a final-query fit ran the whole-sequence form")

    monkeypatch.setattr(ops, "head_output", refuse)
    monkeypatch.setattr(ops, "attend", refuse)
    res = train_members(KernelAttentionHead, [(dict(n_bits=5, rank=3), 0)], X, y,
                        query="last", max_epochs=5, dtype=torch.float64)
    a, b = ref.members[0].net.module_, res.members[0].net.module_
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("name", available_mixers())
def test_a_stack_of_mixers_computes_each_members_last_position(name):
    kwargs = get_mixer(name).data_kwargs(np.zeros((1, 40, 5)))
    mixers = [_perturbed(lambda: make_mixer(name, 5, 3, **kwargs), seed=i) for i in range(2)]
    x = _tokens(40)
    out = HeadEnsemble(mixers)(x, last=True)
    for i, mixer in enumerate(mixers):
        torch.testing.assert_close(out[i], mixer(x)[:, -1:], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["kernel", "retnet"])
def test_a_stack_of_log_domain_mixers_that_read_the_host_equals_its_members(
        monkeypatch, name):
    # token_scores tests the shifted product of many log-features for underflow on the
    # host, which vmap cannot trace: the stack runs such members one after the other
    monkeypatch.setattr(ops.tokens, "EXACT_LOG_TERMS", 0)
    kwargs = get_mixer(name).data_kwargs(np.zeros((1, 40, 5)))
    mixers = [_perturbed(lambda: make_mixer(name, 5, 3, feature_map="exp", **kwargs),
                         seed=i) for i in range(2)]
    # four distinct tokens, so the mixers attend on the distinct tokens
    two = _tokens(40)[:, :, :2]
    x = torch.cat([two, two, two[:, :, :1]], dim=-1)
    stack = HeadEnsemble(mixers)
    assert stack.path == "generic"
    out = stack(x, last=True)
    out.sin().sum().backward()
    for i, mixer in enumerate(mixers):
        own = mixer(x)[:, -1:]
        torch.testing.assert_close(out[i], own, rtol=1e-9, atol=1e-10)
        own.sin().sum().backward()
        for p, g in zip(mixer.parameters(), stack.stack, strict=True):
            torch.testing.assert_close(g.grad[i], p.grad, rtol=1e-9, atol=1e-10)
    assert stack._one_by_one  # vmap met the host-reading branch
