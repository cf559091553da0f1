"""Causal attention of log-features in blocks (:func:`~minip_learn.nn.ops.chunk.log_block_sums`,
the every-position form of ``kernel``, ``retnet`` and ``positional`` with a log-domain
map such as ``table``): values and gradients equal the quadratic reference
(:func:`minip_learn.nn.ops.naive.kernel_attention`) and the block's masked log-domain
kernel, with decay, rank masks, lengths that are not powers of two, keys far above
the others and stacks under vmap; no tensor of the block's ``n x n x r`` terms is
built."""

import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minip_learn.nn import get_mixer, make_mixer, ops
from minip_learn.nn.ops import AttentionSpec, naive
from minip_learn.nn.ops.chunk import log_block_sums, masked_kernel

F64 = torch.float64
TOL = dict(rtol=1e-9, atol=1e-10)
MASK = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=F64)


def _inputs(n, seed, *, scale=3.0, lead=(2,), r=6, d=3):
    gen = torch.Generator().manual_seed(seed)
    lq, lk = (scale * torch.randn(*lead, n, r, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(*lead, n, d, generator=gen, dtype=F64)
    return [t.requires_grad_() for t in (lq, lk, v)]


def _grads(out, inputs, seed):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return torch.autograd.grad((out * weight).sum(), inputs)


def _reference(lq, lk, v, decay, mask):
    """The quadratic reference on the features ``exp(lq) * mask``, ``exp(lk)``."""
    fq = lq.exp() * (1.0 if mask is None else mask)
    return naive.kernel_attention(fq, lk.exp(), v, nonnegative=True, causal=True,
                                  decay=decay)


def _masked_kernel_form(lq, lk, v, decay, mask):
    """The block's masked log-domain kernel (one block, the whole sequence)."""
    spec = AttentionSpec(True, log_domain=True, decay=decay)
    fq, fk = ops.kernel.apply_rank_mask(lq, lk, mask, True)
    alpha = masked_kernel(fq, fk, spec)
    return (alpha @ v) / spec.guard(alpha.sum(-1)).unsqueeze(-1)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 21, 32])
@pytest.mark.parametrize("decay", [None, 0.8, 0.05])
@pytest.mark.parametrize("masked", [False, True], ids=["all", "rank-mask"])
def test_one_block_equals_the_reference_and_the_masked_kernel(n, decay, masked):
    """``log_block_sums`` over one block, normalised: values and gradients equal the
    quadratic reference and the masked log-domain kernel of the block."""
    inputs = _inputs(n, seed=n)
    lq, lk, v = inputs
    mask = MASK if masked else None
    lg = ops.log_decay(decay)
    fq, fk = ops.kernel.apply_rank_mask(lq, lk, mask, True)
    num, den, c = log_block_sums(fq, fk, v, lg)
    out = num / den.unsqueeze(-1)
    assert c.shape == (*v.shape[:-1], 1) and bool(torch.isfinite(c).all())
    grads = _grads(out, inputs, n)
    for want in (_reference(lq, lk, v, decay, mask), _masked_kernel_form(lq, lk, v, decay,
                                                                          mask)):
        torch.testing.assert_close(out, want, **TOL)
        for got, ref in zip(grads, _grads(want, inputs, n)):
            torch.testing.assert_close(got, ref, **TOL)


@pytest.mark.parametrize("n, chunk_size", [(40, None), (53, None), (53, 7), (17, 16),
                                           (9, 1)])
@pytest.mark.parametrize("decay", [None, 0.9])
@pytest.mark.parametrize("masked", [False, True], ids=["all", "rank-mask"])
def test_blocks_with_the_prefix_state_equal_the_reference(n, chunk_size, decay, masked):
    """Several blocks (the prefix state read beside each block's own sums): values and
    gradients of :func:`causal_attend` and :func:`causal_head_output` equal the
    reference's."""
    inputs = _inputs(n, seed=100 + n, lead=(2, 2))
    lq, lk, v = inputs
    mask = MASK if masked else None
    kw = dict(nonnegative=True, decay=decay, log_domain=True, mask=mask,
              chunk_size=chunk_size)
    ref = _reference(lq, lk, v, decay, mask)
    out = ops.causal_attend(lq, lk, v, **kw)
    torch.testing.assert_close(out, ref, **TOL)
    for got, want in zip(_grads(out, inputs, 1), _grads(ref, inputs, 1)):
        torch.testing.assert_close(got, want, **TOL)
    gen = torch.Generator().manual_seed(n)
    w, b = torch.randn(v.shape, generator=gen, dtype=F64), torch.randn(v.shape[:-1],
                                                                        generator=gen, dtype=F64)
    torch.testing.assert_close(ops.causal_head_output(lq, lk, v, w, b, **kw),
                               (w * ref).sum(-1) + b, **TOL)


def test_shift_from_elsewhere_is_taken_and_cancels():
    """A shift larger than the block's exponents scales every sum of a query alike: the
    normalised output is unchanged and the returned shift is the one given."""
    lq, lk, v = (t.detach() for t in _inputs(11, seed=3))
    num, den, c = log_block_sums(lq, lk, v, math.log(0.7))
    big = c.squeeze(-1) + 5.0
    num2, den2, c2 = log_block_sums(lq, lk, v, math.log(0.7), big)
    torch.testing.assert_close(c2.squeeze(-1), big, **TOL)
    torch.testing.assert_close(den2, den * math.exp(-5.0), **TOL)
    torch.testing.assert_close(num2 / den2.unsqueeze(-1), num / den.unsqueeze(-1), **TOL)


@pytest.mark.parametrize("spike_at", [0, 5, 6, 12, 20])
@pytest.mark.parametrize("decay", [None, 0.9])
def test_a_key_far_above_the_others_leaves_every_output_exact(spike_at, decay):
    """A key 2000 e-folds above the others in one feature: the outputs before it equal the
    reference's (no key after a query takes part in its shift) and the outputs after it too
    (each query's largest term is 1), and so do their gradients."""
    inputs = _inputs(21, seed=7, scale=1.0)
    with torch.no_grad():
        inputs[1][0, spike_at, 0] += 2000.0
    lq, lk, v = inputs
    num, den, _ = log_block_sums(lq, lk, v, ops.log_decay(decay))
    out = num / den.unsqueeze(-1)
    # the reference in the log domain: exp overflows the features themselves
    lg = ops.log_decay(decay)
    i, j = torch.arange(21)[:, None], torch.arange(21)[None, :]
    la = torch.logsumexp(lq.unsqueeze(-2) + lk.unsqueeze(-3), -1) + torch.where(
        j <= i, (i - j).to(F64) * lg, torch.tensor(-math.inf, dtype=F64))
    ref = torch.softmax(la, -1) @ v
    torch.testing.assert_close(out, ref, **TOL)
    for got, want in zip(_grads(out, inputs, 2), _grads(ref, inputs, 2)):
        torch.testing.assert_close(got, want, **TOL)


class _LargestOutput(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_of_the_blocks_pairs_times_features_is_built():
    """Forward and backward of 64 sequences of 53 positions at rank 80 (blocks of 32):
    no tensor reaches a quarter of the ``32 x 32 x r`` terms per sequence the block's
    log-domain kernel takes (the largest are the features, ``53 x r`` per sequence)."""
    lq, lk, v = _inputs(53, seed=9, lead=(64,), r=80, d=12)
    with _LargestOutput() as mode:
        out = ops.causal_attend(lq, lk, v, nonnegative=True, log_domain=True, decay=0.9)
        out.sum().backward()
    assert mode.largest < 64 * 32 * 32 * 80 / 4, mode.largest


@pytest.mark.parametrize("name, kwargs", [("kernel", {}), ("retnet", {"decay": 0.7}),
                                          ("positional", {"max_len": 19})])
def test_table_mixers_every_position_equals_their_recurrence(monkeypatch, name, kwargs):
    """``kernel``, ``retnet`` and ``positional`` with ``table`` features (log-domain) and a
    rank mask: the every-position form (blocks of 8 here) equals the token-by-token
    recurrence, values and gradients of every parameter."""
    gen = np.random.default_rng(5)
    X = gen.integers(0, 2, size=(6, 19, 4)).astype(np.float64)
    torch.manual_seed(0)
    cls_kwargs = dict(get_mixer(name).data_kwargs(X, feature_map="table"), **kwargs)
    mixer = make_mixer(name, 4, 6, feature_map="table", **cls_kwargs).double()
    assert mixer.head.log_domain
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()),
                               dtype=F64))
    mixer.feature_mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0], dtype=F64)
    x = torch.as_tensor(X)
    monkeypatch.setattr(ops.chunk, "CAUSAL_CHUNK", 8)
    par = mixer(x)
    rec = mixer.recurrent(x)
    torch.testing.assert_close(par, rec, **TOL)
    weight = torch.randn(par.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    params = [p for p in mixer.parameters() if p.requires_grad]
    for got, want in zip(torch.autograd.grad((par * weight).sum(), params),
                         torch.autograd.grad((rec * weight).sum(), params)):
        torch.testing.assert_close(got, want, **TOL)


def test_a_stack_under_vmap_equals_each_member():
    """:func:`torch.func.vmap` over members (a rank mask each, as a padded stack has):
    values and gradients equal each member's own."""
    lq, lk, v = (t.detach() for t in _inputs(13, seed=11, lead=(3,)))
    masks = torch.stack([MASK, torch.ones(6, dtype=F64), MASK.flip(0)])

    def member(lq, lk, v, mask):
        return ops.causal_attend(lq, lk, v, nonnegative=True, log_domain=True, decay=0.9,
                                 mask=mask, chunk_size=8)

    def loss(lq, lk, v, mask):
        return (member(lq, lk, v, mask) ** 2).sum()

    stacked = torch.func.vmap(member, in_dims=(None, None, None, 0))(lq, lk, v, masks)
    grads = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)),
                            in_dims=(None, None, None, 0))(lq, lk, v, masks)
    for i, mask in enumerate(masks):
        torch.testing.assert_close(stacked[i], member(lq, lk, v, mask), **TOL)
        want = torch.func.grad(loss, argnums=(0, 1, 2))(lq, lk, v, mask)
        for got, ref in zip(grads, want):
            torch.testing.assert_close(got[i], ref, **TOL)
