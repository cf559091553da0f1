"""Causal kernel and softmax attention, positional maps: the parallel (masked, blocked)
form equals the recurrent prefix-sketch form and a brute-force per-position loop; no
output depends on a later token; decay stays finite and exact on long sequences."""

import math

import pytest
import torch

from minip_learn.nn import (
    HeadEnsemble,
    KernelAttentionHead,
    KernelAttentionModel,
    SoftmaxAttentionHead,
    ops,
)

F64 = torch.float64


def _brute(phi_q, phi_k, v, *, decay, nonnegative, eps=1e-3):
    """Position by position: u_i = sum_{j<=i} g^(i-j) <q_i, k_j> v_j / guard(sum ...),
    with the powers of g from the offsets i - j (float64)."""
    g = 1.0 if decay is None else decay
    out = torch.empty_like(v)
    for i in range(v.shape[-2]):
        w = torch.stack([g ** (i - j) * (phi_q[..., i, :] * phi_k[..., j, :]).sum(-1)
                         for j in range(i + 1)], -1)
        den = ops.guard_denominator(w.sum(-1, keepdim=True), nonnegative=nonnegative,
                                          eps=eps)
        out[..., i, :] = (w.unsqueeze(-1) * v[..., : i + 1, :]).sum(-2) / den
    return out


def _features(n, nonnegative, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, n, 5, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(2, n, 3, generator=gen, dtype=F64)
    return (q.exp(), k.exp(), v) if nonnegative else (q, k, v)


@pytest.mark.parametrize("n", [3, 11, 40])  # one block, several blocks
@pytest.mark.parametrize("decay", [None, 0.8])
@pytest.mark.parametrize("nonnegative", [True, False])
def test_parallel_equals_recurrent_equals_brute_force(n, decay, nonnegative):
    q, k, v = _features(n, nonnegative, seed=n)
    ref = _brute(q, k, v, decay=decay, nonnegative=nonnegative)
    kw = dict(nonnegative=nonnegative, decay=decay)
    par = ops.causal_attend(q, k, v, chunk_size=8, **kw)
    rec = ops.recurrent_attend(q, k, v, **kw)
    tol = dict(rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(par, ref, **tol)
    torch.testing.assert_close(rec, ref, **tol)
    if nonnegative:  # the same kernel from its log-features
        lq, lk = q.log(), k.log()
        torch.testing.assert_close(ops.causal_attend(
            lq, lk, v, chunk_size=8, log_domain=True, **kw), ref, **tol)
        torch.testing.assert_close(ops.recurrent_attend(
            lq, lk, v, log_domain=True, **kw), ref, **tol)


def test_rank_mask_and_readout_fold():
    q, k, v = _features(12, True, seed=1)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0], dtype=F64)
    ref = _brute(q * mask, k * mask, v, decay=0.7, nonnegative=True)
    for log in (False, True):
        fq, fk = (q.log(), k.log()) if log else (q, k)
        for fn, kw in ((ops.causal_attend, dict(chunk_size=5)),
                       (ops.recurrent_attend, {})):
            out = fn(fq, fk, v, nonnegative=True, decay=0.7, log_domain=log, mask=mask, **kw)
            torch.testing.assert_close(out, ref)
    w, b = torch.randn(2, 12, 3, dtype=F64), torch.randn(2, 12, dtype=F64)
    for chunk in (4, 32):  # blocked, and the readout folded into one block's kernel
        y = ops.causal_head_output(q, k, v, w, b, nonnegative=True, decay=0.7,
                                         mask=mask, chunk_size=chunk)
        torch.testing.assert_close(y, (w * ref).sum(-1) + b)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_decay_is_stable_on_long_sequences(log, dtype):
    n, g = 2000, 0.9
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.rand(1, n, 4, generator=gen, dtype=F64) + 0.1 for _ in range(2))
    v = torch.randn(1, n, 2, generator=gen, dtype=F64)
    off = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    powers = torch.where(off >= 0, g ** off.clamp_min(0).to(F64), torch.zeros((), dtype=F64))
    alpha = (q @ k.transpose(-2, -1)) * powers  # float64, from the offsets i - j
    ref = alpha @ v / alpha.sum(-1, keepdim=True)
    assert g ** -(n - 1) > torch.finfo(torch.float32).max  # g^-j alone would overflow
    fq, fk = (q.log(), k.log()) if log else (q, k)
    out = ops.causal_attend(fq.to(dtype), fk.to(dtype), v.to(dtype), nonnegative=True,
                                  decay=g, log_domain=log)
    assert torch.isfinite(out).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out.to(F64), ref, rtol=tol, atol=tol)


def test_causal_softmax_fused_equals_explicit():
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 50, 4, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(2, 50, 3, generator=gen, dtype=F64)
    ref = ops.softmax_weights(q @ k.transpose(-2, -1) / 2, causal=True) @ v
    for rows in (50, 7):  # one call (is_causal), and blocks of queries (a mask)
        out = ops.softmax_attend(q, k, v, scale=0.5, block_rows=rows, causal=True)
        torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="counts"):
        ops.softmax_attend(q, k, v, scale=1.0, block_rows=50, causal=True,
                                 counts=torch.ones(2, 50, dtype=F64))


def _heads():
    return {
        "causal": KernelAttentionHead(5, 3, causal=True),
        "causal exp": KernelAttentionHead(5, 3, causal=True, feature_map="exp"),
        "decay": KernelAttentionHead(5, 3, causal=True, positional="decay", decay=0.8),
        "learned": KernelAttentionHead(5, 3, causal=True, positional="learned", max_len=40,
                                       feature_map="exp"),
        "softmax": SoftmaxAttentionHead(5, causal=True),
        "softmax fused": SoftmaxAttentionHead(5, causal=True, algorithm="fused"),
        "model": KernelAttentionModel(5, 3, n_heads=2, n_layers=2, causal=True),
    }


@pytest.mark.parametrize("name", list(_heads()))
@pytest.mark.parametrize("n", [4, 40])
def test_no_output_depends_on_a_later_token(name, n):
    torch.manual_seed(0)
    head = _heads()[name].double()
    if name == "learned":
        with torch.no_grad():
            for p in (head.position_query, head.position_key):
                p.normal_()
    x = torch.rand(3, n, 5, dtype=F64).round()
    later = x.clone()
    cut = n // 2
    later[:, cut:] = 1 - later[:, cut:]
    out, out_later = head(x), head(later)
    torch.testing.assert_close(out[:, :cut], out_later[:, :cut], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out[:, cut:], out_later[:, cut:])
    torch.testing.assert_close(head(x[:, :cut]), out[:, :cut])  # prefixes


@pytest.mark.parametrize("name", ["causal", "causal exp", "decay", "learned"])
def test_recurrent_equals_forward(name):
    torch.manual_seed(1)
    head = _heads()[name].double()
    x = torch.rand(2, 40, 5, dtype=F64)
    torch.testing.assert_close(head.recurrent(x), head(x))
    torch.testing.assert_close(head.attention_weights(x) @ head.value(x), head.attend(x))
    assert head.state_floats() == 3 * 5 + 3 * (2 if head.log_domain else 1)


@pytest.mark.parametrize("kind", ["kernel", "softmax"])
def test_causal_final_query_output_equals_the_non_causal_head(kind):
    torch.manual_seed(2)
    if kind == "kernel":
        plain, causal = KernelAttentionHead(5, 3), KernelAttentionHead(5, 3, causal=True)
    else:
        plain, causal = SoftmaxAttentionHead(5), SoftmaxAttentionHead(5, causal=True)
    causal.load_state_dict(plain.state_dict())
    x = torch.rand(4, 9, 5).round()
    torch.testing.assert_close(causal(x)[:, -1], plain(x)[:, -1])
    assert not torch.allclose(causal(x)[:, 0], plain(x)[:, 0])


def test_learned_positions_start_as_the_positionless_head():
    torch.manual_seed(3)
    plain = KernelAttentionHead(5, 3, feature_map="exp")
    learned = KernelAttentionHead(5, 3, feature_map="exp", positional="learned", max_len=6)
    learned.load_state_dict(plain.state_dict(), strict=False)
    x = torch.rand(2, 6, 5)
    torch.testing.assert_close(learned(x), plain(x))  # zero log-weights
    with torch.no_grad():
        learned.position_key[2] += 3.0
    assert not torch.allclose(learned(x), plain(x))
    with pytest.raises(ValueError, match="max_len=6"):
        learned(torch.rand(2, 7, 5))


def test_theorem_flags():
    assert KernelAttentionHead(4, 2, causal=True).theorem == "yes"
    assert KernelAttentionHead(4, 2, causal=True).theorem_applies
    decay = KernelAttentionHead(4, 2, causal=True, positional="decay", decay=0.5)
    assert (decay.theorem, decay.theorem_applies) == ("positional", False)
    signed = KernelAttentionHead(4, 2, causal=True, feature_map="identity")
    assert (signed.theorem, signed.theorem_applies) == ("no", False)
    assert SoftmaxAttentionHead(4, causal=True).theorem == "no"
    assert KernelAttentionModel(4, 2, causal=True).theorem == "yes"
    assert KernelAttentionModel(4, 2, positional="learned", max_len=3).theorem == "positional"


@pytest.mark.parametrize("kw, match", [
    (dict(positional="decay"), "needs decay"),
    (dict(positional="decay", decay=0.5), "needs causal=True"),
    (dict(causal=True, positional="decay", decay=1.5), "decay must be in"),
    (dict(causal=True, decay=0.5), "decay is the factor"),
    (dict(positional="learned"), "needs max_len"),
    (dict(positional="rope"), "positional must be one of"),
])
def test_bad_options(kw, match):
    with pytest.raises(ValueError, match=match):
        KernelAttentionHead(4, 2, **kw)


@pytest.mark.parametrize("head", [
    KernelAttentionHead(4, 2, causal=True),
    KernelAttentionHead(4, 2, positional="learned", max_len=3),
    SoftmaxAttentionHead(4, causal=True),
], ids=["causal", "learned", "softmax"])
def test_ordered_heads_refuse_counts(head):
    with pytest.raises(ValueError, match="takes no counts"):
        head(torch.zeros(1, 3, 4), counts=torch.ones(1, 3))


def test_recurrent_needs_a_causal_head():
    with pytest.raises(ValueError, match="causal=True"):
        KernelAttentionHead(4, 2).recurrent(torch.zeros(1, 3, 4))


def test_ensemble_of_causal_heads_equals_each_head():
    torch.manual_seed(4)
    x = torch.rand(3, 12, 5).round()
    heads = [KernelAttentionHead(5, r, causal=True, positional="decay", decay=0.9)
             for r in (2, 3)]
    stack = HeadEnsemble(heads)
    assert stack.path == "generic" and "order" in stack.path_reason
    out = stack(x)
    for i, head in enumerate(heads):
        torch.testing.assert_close(out[i], head(x))
    out.sum().backward()
    assert all(math.isfinite(float(p.grad.abs().sum())) for p in stack.parameters()
               if p.grad is not None)


@pytest.mark.parametrize("log", [False, True])
def test_gradients_equal_the_brute_force_gradients(log):
    q, k, v = _features(13, True, seed=5)
    weights = torch.randn(2, 13, 3, dtype=F64)

    def grads(fn, fq, fk):
        leaves = [t.clone().requires_grad_() for t in (fq, fk, v)]
        (fn(*leaves) * weights).sum().backward()
        return [t.grad for t in leaves]

    fq, fk = (q.log(), k.log()) if log else (q, k)
    got = grads(lambda a, b, c: ops.causal_attend(
        a, b, c, nonnegative=True, decay=0.8, log_domain=log, chunk_size=4), fq, fk)
    want = grads(lambda a, b, c: _brute(a.exp() if log else a, b.exp() if log else b, c,
                                        decay=0.8, nonnegative=True), fq, fk)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
