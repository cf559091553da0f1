"""Every fast attention form of ``minip_learn.nn.ops`` equals its quadratic reference
in ``ops.naive`` (float64, tight tolerances), forward and backward, over shapes; the
causal masks are written in one module."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import minip_learn
from minip_learn.nn import attention, ops
from minip_learn.nn.ops import AttentionSpec, naive

F64 = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)

#: (leading dimensions, N, r, d): explicit kernel (N <= 8: loops over token pairs; N = 10:
#: matrix products) and sketch (is_short is False), with and without leading dimensions
SHAPES = [((), 3, 8, 4), ((2,), 6, 16, 8), ((2, 3), 10, 16, 16), ((2,), 5, 3, 3),
          ((1, 2), 12, 4, 5), ((), 40, 6, 2)]
#: (leading dimensions, N, r, d) of the causal forms: one block, several, a partial last one
CAUSAL_SHAPES = [((), 1, 2, 1), ((2,), 5, 3, 2), ((2, 2), 13, 4, 3), ((1,), 40, 5, 2)]


def _shape_id(shape):
    lead, n, r, d = shape
    return f"lead{'x'.join(map(str, lead)) or '-'}-N{n}-r{r}-d{d}"


def _inputs(shape, seed):
    """Log-features ``lq, lk`` (..., N, r), values and readout ``v, w`` (..., N, d),
    bias ``b`` (..., N), multiplicities ``counts`` (..., N) and a rank mask (r,)."""
    lead, n, r, d = shape
    gen = torch.Generator().manual_seed(seed)

    def rand(*s):
        return torch.randn(*lead, *s, generator=gen, dtype=F64)

    lq, lk, v, w, b = 0.7 * rand(n, r), 0.7 * rand(n, r), rand(n, d), rand(n, d), rand(n)
    counts = torch.randint(0, 4, (*lead, n), generator=gen).to(F64)
    counts[..., 0] = 1.0  # every query sees a key
    mask = (torch.arange(r) % 3 != 1).to(F64)
    return lq, lk, v, w, b, counts, mask


def _features(lq, lk, nonnegative):
    """Plain features: nonnegative (exponentials) or signed (the log-features as they are)."""
    return (lq.exp(), lk.exp()) if nonnegative else (lq, lk)


# -- kernel attention over whole sequences ----------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("nonnegative", [True, False])
@pytest.mark.parametrize("with_counts", [False, True])
def test_attend_and_head_output_equal_naive(shape, nonnegative, with_counts):
    lq, lk, v, w, b, counts, _ = _inputs(shape, seed=1)
    phi_q, phi_k = _features(lq, lk, nonnegative)
    counts = counts if with_counts else None
    kw = dict(nonnegative=nonnegative, counts=counts)
    torch.testing.assert_close(ops.attend(phi_q, phi_k, v, **kw),
                               naive.kernel_attention(phi_q, phi_k, v, **kw), **TOL)
    torch.testing.assert_close(ops.head_output(phi_q, phi_k, v, w, b, **kw),
                               naive.head_output(phi_q, phi_k, v, w, b, **kw), **TOL)


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("masked", [False, True])
def test_log_domain_features_and_kernel_equal_naive(shape, masked):
    lq, lk, v, w, b, counts, mask = _inputs(shape, seed=2)
    mask = mask if masked else None
    factor = 1.0 if mask is None else mask
    phi_q, phi_k = lq.exp() * factor, lk.exp() * factor  # the reference: no shift at all
    fq, fk = ops.attention_features(lq, lk, log_domain=True, mask=mask)
    assert fq.max() <= 1 and fk.max() <= 1  # shifted: nothing overflows
    kw = dict(nonnegative=True, counts=counts)
    torch.testing.assert_close(ops.head_output(fq, fk, v, w, b, **kw),
                               naive.head_output(phi_q, phi_k, v, w, b, **kw), **TOL)
    # the explicit kernel up to a positive scale per query row
    alpha = ops.explicit_kernel(lq, lk, log_domain=True, mask=mask)
    ref = naive.pairwise_dots(phi_q, phi_k)
    torch.testing.assert_close(alpha / alpha.sum(-1, keepdim=True),
                               ref / ref.sum(-1, keepdim=True), **TOL)
    assert torch.allclose(alpha.amax(-1), torch.ones((), dtype=F64))


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
def test_sketch_and_kernel_values_equal_naive(shape):
    lq, lk, v, *_ = _inputs(shape, seed=3)
    phi_q, phi_k = lq.exp(), lk.exp()
    S, s = ops.sketch(phi_k, v)
    torch.testing.assert_close(S, sum(phi_k[..., j, :, None] * v[..., j, None, :]
                                      for j in range(v.shape[-2])), **TOL)
    torch.testing.assert_close(s, sum(phi_k[..., j, :] for j in range(v.shape[-2])), **TOL)
    alpha = naive.pairwise_dots(phi_q, phi_k)
    torch.testing.assert_close(ops.kernel_values(alpha, v, nonnegative=True),
                               naive.kernel_attention(phi_q, phi_k, v, nonnegative=True), **TOL)


# -- causal forms: chunked and recurrent ----------------------------------------------

def _causal_case(shape, log_domain, masked, nonnegative=True):
    """Inputs of a fast causal form and the features of the naive one."""
    lq, lk, v, w, b, _, mask = _inputs(shape, seed=4)
    mask = mask if masked else None
    factor = 1.0 if mask is None else mask
    if log_domain:
        return (lq, lk), (lq.exp() * factor, lk.exp() * factor), v, w, b, mask
    fq, fk = _features(lq, lk, nonnegative)
    return (fq, fk), (fq * factor, fk * factor), v, w, b, mask


@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("log_domain", [False, True], ids=["plain", "log"])
@pytest.mark.parametrize("decay", [None, 0.8])
@pytest.mark.parametrize("chunk_size", [None, 1, 4])
def test_chunked_causal_equals_naive(shape, log_domain, decay, chunk_size):
    for masked in (False, True):
        fast_in, ref_in, v, w, b, mask = _causal_case(shape, log_domain, masked)
        kw = dict(nonnegative=True, decay=decay)
        ref = naive.kernel_attention(*ref_in, v, causal=True, **kw)
        out = ops.causal_attend(*fast_in, v, log_domain=log_domain, mask=mask,
                                chunk_size=chunk_size, **kw)
        torch.testing.assert_close(out, ref, **TOL)
        y = ops.causal_head_output(*fast_in, v, w, b, log_domain=log_domain, mask=mask,
                                   chunk_size=chunk_size, **kw)
        torch.testing.assert_close(y, (w * ref).sum(-1) + b, **TOL)


@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("decay", [None, 0.7])
@pytest.mark.parametrize("chunk_size", [2, 32])
def test_chunked_causal_signed_kernel_equals_naive(shape, decay, chunk_size):
    fast_in, ref_in, v, *_ = _causal_case(shape, False, False, nonnegative=False)
    kw = dict(nonnegative=False, eps=1e-3, decay=decay)
    torch.testing.assert_close(ops.causal_attend(*fast_in, v, chunk_size=chunk_size, **kw),
                               naive.kernel_attention(*ref_in, v, causal=True, **kw), **TOL)


@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("log_domain", [False, True], ids=["plain", "log"])
@pytest.mark.parametrize("decay", [None, 0.8])
@pytest.mark.parametrize("masked", [False, True])
def test_recurrent_equals_naive(shape, log_domain, decay, masked):
    fast_in, ref_in, v, _, _, mask = _causal_case(shape, log_domain, masked)
    kw = dict(nonnegative=True, decay=decay)
    ref = naive.kernel_attention(*ref_in, v, causal=True, **kw)
    out = ops.recurrent_attend(*fast_in, v, log_domain=log_domain, mask=mask, **kw)
    torch.testing.assert_close(out, ref, **TOL)
    # one token at a time, from the initial state (a rank mask applied beforehand)
    fq, fk = ops.kernel.apply_rank_mask(*fast_in, mask, log_domain)
    state = ops.recurrent_state(v.shape[:-2], fq.shape[-1], v.shape[-1],
                                log_domain=log_domain, dtype=F64)
    for i in range(v.shape[-2]):
        u, state = ops.recurrent_step(state, fq[..., i, :], fk[..., i, :], v[..., i, :],
                                      log_domain=log_domain, **kw)
        torch.testing.assert_close(u, ref[..., i, :], **TOL)


@pytest.mark.parametrize("log_domain", [False, True], ids=["plain", "log"])
def test_chunked_causal_gradients_equal_naive(log_domain):
    fast_in, _, v, *_ = _causal_case(((2,), 11, 3, 2), log_domain, False)
    inputs = [t.clone().requires_grad_() for t in (*fast_in, v)]
    weight = torch.randn(2, 11, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    kw = dict(nonnegative=True, decay=0.9)
    fast = ops.causal_attend(*inputs, log_domain=log_domain, chunk_size=4, **kw)
    fq, fk = (inputs[0].exp(), inputs[1].exp()) if log_domain else inputs[:2]
    ref = naive.kernel_attention(fq, fk, inputs[2], causal=True, **kw)
    for got, want in zip(torch.autograd.grad((fast * weight).sum(), inputs),
                         torch.autograd.grad((ref * weight).sum(), inputs)):
        torch.testing.assert_close(got, want, **TOL)


# -- fused CPU autograd of token pairs --------------------------------------------------

@pytest.mark.parametrize("lead, n_a, n_c, k", [((), 1, 1, 1), ((3,), 3, 3, 5),
                                               ((2, 4), 8, 8, 3), ((2,), 9, 8, 4)])
def test_pairwise_dots_forward_backward_equal_naive(lead, n_a, n_c, k):
    gen = torch.Generator().manual_seed(5)
    a, c = (torch.randn(*lead, n, k, generator=gen, dtype=F64).requires_grad_()
            for n in (n_a, n_c))
    weight = torch.randn(*lead, n_a, n_c, generator=gen, dtype=F64)
    fast, ref = ops.pairwise_dots(a, c), naive.pairwise_dots(a, c)
    torch.testing.assert_close(fast, ref, **TOL)
    for got, want in zip(torch.autograd.grad((fast * weight).sum(), (a, c)),
                         torch.autograd.grad((ref * weight).sum(), (a, c))):
        torch.testing.assert_close(got, want, **TOL)
    if lead:  # the member dimension of torch.func.vmap is one more leading dimension
        torch.testing.assert_close(torch.func.vmap(ops.pairwise_dots)(a, c), ref, **TOL)


def _pair_case(lead, n_tokens, n_rows, seed, *, signed):
    gen = torch.Generator().manual_seed(seed)
    P = n_tokens * n_tokens
    alpha = torch.randn(*lead, P, generator=gen, dtype=F64)
    alpha = alpha if signed else alpha.abs() + 0.1
    g = torch.randn(*lead, P, generator=gen, dtype=F64)
    b = torch.randn(*lead, n_tokens, generator=gen, dtype=F64)
    dense = torch.randint(0, 3, (n_rows, P), generator=gen).to(F64)
    dense[:, 0] += 1  # every position has a key
    token_of = torch.randint(0, n_tokens, (n_rows,), generator=gen)
    return alpha, g, b, token_of, dense


@pytest.mark.parametrize("lead, n_tokens, n_rows", [((1,), 1, 1), ((3,), 4, 10),
                                                    ((2, 3), 5, 30)])
@pytest.mark.parametrize("signed, positive, with_bias", [(False, False, True),
                                                         (True, False, True),
                                                         (False, True, False)])
def test_pair_readout_forward_backward_equal_naive(lead, n_tokens, n_rows, signed, positive,
                                                   with_bias):
    alpha, g, b, token_of, dense = _pair_case(lead, n_tokens, n_rows, seed=6, signed=signed)
    inputs = [t.requires_grad_() for t in (alpha, g, b)]
    b = b if with_bias else None
    kw = dict(nonnegative=not signed, eps=0.05)
    ref = naive.pair_readout(alpha, g, b, token_of.tolist(), dense, **kw)
    weight = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7), dtype=F64)
    want = torch.autograd.grad((ref * weight).sum(), inputs, allow_unused=True)
    rows, rows_t = dense.to_sparse_csr(), dense.T.contiguous().to_sparse_csr()
    buffers = []
    for _ in range(2):  # the second call reuses the first one's work buffers
        fast = ops.pair_readout(alpha, g, b, token_of, rows, rows_t, positive=positive,
                                buffers=buffers, **kw)
        torch.testing.assert_close(fast, ref, **TOL)
        got = torch.autograd.grad((fast * weight).sum(), inputs, allow_unused=True)
        for grad, grad_ref in zip(got, want):
            if grad_ref is None:
                assert grad is None
            else:
                torch.testing.assert_close(grad, grad_ref, **TOL)
    assert buffers


# -- softmax ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_rows", [1, 4, None])
def test_softmax_blocked_equals_naive(shape, causal, block_rows):
    lq, lk, v, _, _, counts, _ = _inputs(shape, seed=8)
    n = v.shape[-2]
    counts = None if causal else counts
    kw = dict(scale=0.5, counts=counts, causal=causal)
    ref = naive.softmax_attention(lq, lk, v, **kw)
    out = ops.softmax_attend(lq, lk, v, block_rows=n if block_rows is None else block_rows,
                             **kw)
    torch.testing.assert_close(out, ref, **TOL)
    weights = ops.softmax_weights(0.5 * (lq @ lk.transpose(-2, -1)), counts, causal=causal)
    torch.testing.assert_close(weights @ v, ref, **TOL)


# -- masks and decays ------------------------------------------------------------------------

@pytest.mark.parametrize("n_q, n_k, start", [(1, 1, 0), (3, 3, 0), (2, 5, 3), (4, 2, 0)])
def test_causal_masks_equal_naive(n_q, n_k, start):
    keep = naive.causal_mask(n_q, n_k, start=start)
    assert torch.equal(ops.causal_mask(n_q, n_k, start=start), keep)
    if start == 0 and n_q == n_k:
        scores = torch.randn(2, n_q, n_k, dtype=F64)
        assert torch.equal(ops.causal_part(scores), scores * keep)
        strict = naive.causal_mask(n_q, n_k, start=-1)
        assert torch.equal(ops.causal_part(scores, strict=True), scores * strict)
        for decay in (None, 0.6):
            gamma = 1.0 if decay is None else decay
            powers = torch.tensor([[gamma ** (i - j) if j <= i else 0.0 for j in range(n_k)]
                                   for i in range(n_q)], dtype=F64)
            lg = ops.log_decay(decay)
            dec = ops.decayed_mask(n_q, lg, dtype=F64)
            torch.testing.assert_close(dec, powers, **TOL)
            assert torch.equal(ops.decayed_mask(n_q, lg, log=True, dtype=F64).exp(), dec)


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("block_elements", [None, 1, 50])
def test_decayed_scores_equal_naive(shape, block_elements):
    lq, lk, *_ = _inputs(shape, seed=9)
    log_alpha = torch.nn.functional.logsigmoid(lq + 2.0)  # every log-decay <= 0
    log_cum = log_alpha.cumsum(-2)
    out = ops.decayed_scores(lq, lk, log_cum, block_elements=block_elements)
    torch.testing.assert_close(out, naive.decayed_scores(lq, lk, log_cum), **TOL)
    from minip_learn.nn.mixers import decayed_scores as mixer_scores

    assert torch.equal(ops.decayed_scores(lq, lk, log_cum), mixer_scores(lq, lk, log_cum))


def test_attention_spec_is_frozen_and_checks_the_decay():
    spec = AttentionSpec(nonnegative=False, eps=0.1, log_domain=True, decay=0.5)
    assert spec.log_gamma == ops.log_decay(0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.decay = 0.9
    assert spec == AttentionSpec(False, 0.1, True, 0.5)
    den = torch.tensor([-2.0, 0.0, 1e-6])
    assert torch.equal(spec.guard(den), ops.guard_denominator(den, nonnegative=False, eps=0.1))
    for decay in (0.0, 1.5, -0.5):
        with pytest.raises(ValueError, match="decay"):
            AttentionSpec(True, decay=decay)


def test_attention_module_gives_the_ops_their_documented_names():
    for name in attention.__all__:
        assert getattr(attention, name) is getattr(ops, name), name


# -- one causal mask ----------------------------------------------------------------------

PACKAGE = Path(minip_learn.__file__).parent
MASKS_MODULE = PACKAGE / "nn" / "ops" / "masks.py"
#: a triangle of a matrix: torch.tril / torch.triu / Tensor.tril_ ... (not triu_indices)
TRIANGLE = re.compile(r"\b(tril|triu)_?\(")


def _triangles(paths):
    return [f"{path.relative_to(PACKAGE.parent).as_posix()}:{number}: {line.strip()}"
            for path in paths
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if TRIANGLE.search(line.split("#")[0])]


def _modules(*, mixers):
    """The package's torch modules (numpy code such as the theory layer builds no
    attention masks), the mixers or the others, the masks module aside."""
    return [path for path in sorted(PACKAGE.rglob("*.py")) if path != MASKS_MODULE
            and re.search(r"^import torch|^from torch", path.read_text(), flags=re.M)
            and path.relative_to(PACKAGE).as_posix().startswith("nn/mixers") == mixers]


def test_causal_masks_are_built_in_the_masks_module_only():
    hits = _triangles(_modules(mixers=False))
    assert not hits, ("build causal masks with minip_learn.nn.ops.masks (causal_mask, "
                      "causal_part, decayed_mask, decayed_scores):\n" + "\n".join(hits))


def test_the_mixers_build_no_causal_mask_of_their_own():
    assert _modules(mixers=True)
    assert not _triangles(_modules(mixers=True))


def test_the_masks_module_is_where_the_triangles_are():
    assert _triangles([MASKS_MODULE])
