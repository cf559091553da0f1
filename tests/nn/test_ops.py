"""Every fast attention form of ``minip_learn.nn.ops`` equals its quadratic reference
in ``ops.naive`` (float64, tight tolerances), forward and backward, over shapes; the
causal masks are written in one module."""

import dataclasses
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minip_learn
from minip_learn.nn import ops
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


def test_attention_module_is_a_deprecated_alias_of_ops():
    code = "import minip_learn.nn as nn; nn.attention"
    run = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "minip_learn.nn.ops" in run.stderr
    import minip_learn.nn as nn
    from minip_learn.nn import attention

    assert attention.__all__ == []
    for name in attention._MOVED:
        with pytest.warns(FutureWarning, match=rf"minip_learn\.nn\.ops\.{name}\b"):
            assert getattr(attention, name) is getattr(ops, name), name
    assert nn.attention is attention
    with pytest.raises(AttributeError):
        attention.no_such_name  # noqa: B018


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


# -- the forms against formulas written here: guards, defaults, devices, work buffers -------
#
# The references below are written from the definitions (float64 torch), independently of
# ``ops.naive``: ``u_i = sum_j alpha_ij v_j / guard(sum_j alpha_ij)``, ``guard`` the
# nonnegative replacement of 0 by 1 or the signed clamp ``sign(den) max(|den|, eps)``.

def _guard_ref(den, nonnegative, eps):
    """The denominator guard of the theory, written out."""
    if nonnegative:
        return torch.where(den > 0, den, torch.ones_like(den))
    sign = torch.where(den < 0, -1.0, 1.0).to(den.dtype)
    return sign * torch.maximum(den.abs(), torch.full_like(den, eps))


def _causal_log_ref(lq, lk, v, log_gamma):
    """Causal attention of log-features computed in the log domain:
    ``log alpha_ij = logsumexp_r(lq_ir + lk_jr) + (i - j) log gamma`` for ``j <= i``,
    normalised per row with the row's maximum subtracted (finite for any magnitude)."""
    n = v.shape[-2]
    la = torch.logsumexp(lq[..., :, None, :] + lk[..., None, :, :], -1)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    la = la + ((i - j) * log_gamma).to(la.dtype)
    la = la.masked_fill(j > i, -float("inf"))
    w = torch.exp(la - la.amax(-1, keepdim=True))
    return (w / w.sum(-1, keepdim=True)) @ v


def _pair_ref(alpha, g, b, token_of, dense, *, guard):
    """``y_i = sum_p R_ip alpha_p g_p / guard(sum_p R_ip alpha_p) + b_t(i)``."""
    num, den = (alpha * g) @ dense.T, alpha @ dense.T
    y = num / guard(den)
    return y if b is None else y + b[..., token_of]


@pytest.mark.parametrize("nonnegative, positive, scale", [(True, False, 1e-5),
                                                          (True, True, 1e-5),
                                                          (False, True, 1e-5),
                                                          (False, None, 0.3),
                                                          (False, None, 1e-5)])
def test_pair_readout_guards_small_denominators_as_documented(nonnegative, positive, scale):
    """Default ``eps`` (1e-3); ``positive`` skips the guard (``y = num / den`` even
    below ``eps``); a nonnegative kernel divides by its (positive) denominator however
    small; the signed clamp otherwise. Forward and backward, without work buffers."""
    alpha, g, b, token_of, dense = _pair_case((2,), 3, 12, seed=11, signed=positive is None)
    alpha = (alpha * scale).requires_grad_()
    g.requires_grad_()
    if positive:
        def guard(den):
            return den
    else:
        def guard(den):
            return _guard_ref(den, nonnegative, 1e-3)
    ref = _pair_ref(alpha, g, b, token_of, dense, guard=guard)
    kw = {} if positive is None else dict(positive=positive)
    rows, rows_t = dense.to_sparse_csr(), dense.T.contiguous().to_sparse_csr()
    fast = ops.pair_readout(alpha, g, b, token_of, rows, rows_t, nonnegative=nonnegative,
                            **kw)
    torch.testing.assert_close(fast, ref, **TOL)
    weight = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    for got, want in zip(torch.autograd.grad((fast * weight).sum(), (alpha, g)),
                         torch.autograd.grad((ref * weight).sum(), (alpha, g))):
        torch.testing.assert_close(got, want, **TOL)
    if not positive:  # the quadratic reference guards the same way
        torch.testing.assert_close(
            naive.pair_readout(alpha, g, b, token_of.tolist(), dense, nonnegative=nonnegative),
            ref, **TOL)


def _pair_round(buffers, case):
    """One forward and backward of :func:`ops.pair_readout` with ``buffers``, its graph
    freed afterwards; checks the values against the formula."""
    alpha, g, b, token_of, dense = case
    alpha, g = alpha.clone().requires_grad_(), g.clone().requires_grad_()
    rows, rows_t = dense.to_sparse_csr(), dense.T.contiguous().to_sparse_csr()
    fast = ops.pair_readout(alpha, g, b, token_of, rows, rows_t, nonnegative=True,
                            buffers=buffers)
    ref = _pair_ref(alpha, g, b, token_of, dense,
                    guard=lambda den: _guard_ref(den, True, 1e-3))
    torch.testing.assert_close(fast, ref, **TOL)
    got = torch.autograd.grad(fast.sum(), (alpha, g))
    for grad, want in zip(got, torch.autograd.grad(ref.sum(), (alpha, g))):
        torch.testing.assert_close(grad, want, **TOL)
    del fast  # frees the graph: its work buffer goes back


def test_pair_readout_keeps_and_reuses_its_work_buffers():
    """A buffer goes back to the caller's list after the backward and when the graph is
    freed; the next call reuses those very buffers; buffers of another shape or dtype
    are left alone; the list keeps at most ``MAX_BUFFERS``."""
    import gc
    import warnings

    small = _pair_case((2,), 3, 10, seed=12, signed=False)
    large = _pair_case((2,), 3, 17, seed=13, signed=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. no output resized behind the caller's back
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        buffers = []
        _pair_round(buffers, small)
        gc.collect()
        assert len(buffers) == 2
        kept = list(buffers)
        for _ in range(2):
            _pair_round(buffers, small)
            gc.collect()
            assert len(buffers) == 2 and all(any(t is k for k in kept) for t in buffers)
        # another shape and another dtype stay where they are, untouched
        others = [torch.zeros(11, 4, dtype=F64), torch.zeros(10, 4, dtype=torch.float32)]
        buffers = list(others)
        _pair_round(buffers, small)
        gc.collect()
        assert len(buffers) == 4 and buffers[0] is others[0] and buffers[1] is others[1]
        assert buffers[0].shape == (11, 4) and buffers[1].dtype == torch.float32
        # one list shared by inputs of two sizes
        _pair_round(buffers, large)
        _pair_round(buffers, small)
        gc.collect()
        assert len(buffers) == ops.pair.MAX_BUFFERS
        full = [torch.zeros(1, 1, dtype=F64) for _ in range(ops.pair.MAX_BUFFERS)]
        buffers = list(full)
        _pair_round(buffers, small)
        gc.collect()
        assert len(buffers) == ops.pair.MAX_BUFFERS and all(a is b for a, b in zip(buffers, full))


@pytest.mark.parametrize("in_dims", [(0, None), (None, 0)])
def test_pairwise_dots_under_vmap_with_one_shared_input(in_dims):
    gen = torch.Generator().manual_seed(14)
    a = torch.randn(*((4,) if in_dims[0] == 0 else ()), 2, 3, 5, generator=gen, dtype=F64)
    c = torch.randn(*((4,) if in_dims[1] == 0 else ()), 2, 3, 5, generator=gen, dtype=F64)
    ref = (a[..., :, None, :] * c[..., None, :, :]).sum(-1)
    out = torch.func.vmap(ops.pairwise_dots, in_dims=in_dims)(a, c)
    torch.testing.assert_close(out, ref, **TOL)


def test_explicit_kernel_of_plain_features_with_a_rank_mask():
    gen = torch.Generator().manual_seed(15)
    fq, fk = (torch.randn(2, n, 6, generator=gen, dtype=F64) for n in (3, 4))
    mask = (torch.arange(6) % 3 != 1).to(F64)
    ref = torch.einsum("bir,bjr,r->bij", fq, fk, mask)
    torch.testing.assert_close(ops.explicit_kernel(fq, fk, log_domain=False, mask=mask), ref,
                               **TOL)
    torch.testing.assert_close(ops.explicit_kernel(fq, fk, log_domain=False),
                               torch.einsum("bir,bjr->bij", fq, fk), **TOL)


def _huge_log_features(n, seed):
    """Log-features whose kernels span thousands of e-folds: the query rows alternate
    between moderate and huge, the second sequence's queries lie far above the first's,
    and the first sequence's keys far above the second's."""
    gen = torch.Generator().manual_seed(seed)
    lq, lk = (torch.randn(2, n, 3, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(2, n, 2, generator=gen, dtype=F64)
    offset = 800.0 * torch.arange(2, dtype=F64)[:, None] + 1000.0 * (torch.arange(n) % 2)
    return lq + offset[..., None], lk + 900.0 * (1.0 - torch.arange(2, dtype=F64))[:, None, None], v


@pytest.mark.parametrize("decay", [None, 1e-6])
def test_log_domain_causal_forms_stay_exact_for_huge_log_features(decay):
    """The shifts of the log-domain forms keep every kernel finite: chunked and recurrent
    equal the log-domain reference, also with a decay strong enough that ``gamma^N``
    leaves the floating-point range."""
    n = 64
    lq, lk, v = _huge_log_features(n, seed=16)
    log_gamma = 0.0 if decay is None else math.log(decay)
    ref = _causal_log_ref(lq, lk, v, log_gamma)
    kw = dict(nonnegative=True, decay=decay, log_domain=True)
    for chunk_size in (None, 8, n):  # blocks, and the whole sequence as one block
        torch.testing.assert_close(ops.causal_attend(lq, lk, v, chunk_size=chunk_size, **kw),
                                   ref, **TOL)
    state = ops.recurrent_state((2,), 3, 2, log_domain=True, dtype=F64)
    for i in range(n):
        u, state = ops.recurrent_step(state, lq[:, i], lk[:, i], v[:, i], **kw)
        torch.testing.assert_close(u, ref[:, i], **TOL)


@pytest.mark.parametrize("nonnegative, scale", [(True, 1e-3), (False, 0.3)])
def test_recurrent_step_defaults_and_guard(nonnegative, scale):
    """Plain features by default (``log_domain=False``), ``eps = 1e-3``, no decay: a
    nonnegative kernel divides by its small denominators exactly, a signed one by the
    clamp."""
    gen = torch.Generator().manual_seed(17)
    q, k = (torch.randn(2, 6, 4, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(2, 6, 3, generator=gen, dtype=F64)
    q, k = ((q.exp(), k.exp()) if nonnegative else (q, k))
    q, k = scale * q, scale * k
    alpha = (q @ k.transpose(-2, -1)).tril()
    ref = (alpha @ v) / _guard_ref(alpha.sum(-1, keepdim=True), nonnegative, 1e-3)
    state = ops.recurrent_state((2,), 4, 3, log_domain=False, dtype=F64)
    for i in range(6):
        u, state = ops.recurrent_step(state, q[:, i], k[:, i], v[:, i], nonnegative=nonnegative)
        torch.testing.assert_close(u, ref[:, i], **TOL)


def _softmax_ref(q, k, v, scale, *, counts=None, causal=False):
    """``sum_j softmax_j(scale q_i^T k_j + log c_j) v_j``, each row shifted by its maximum."""
    s = scale * q @ k.transpose(-2, -1)
    if counts is not None:
        s = s + torch.log(counts.to(s.dtype))[..., None, :]
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -float("inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)) @ v


def test_softmax_forms_stay_exact_for_huge_scores():
    """Scores of thousands in one sequence and of order one in the other: each row is
    shifted by its own maximum (naive reference and fused form)."""
    gen = torch.Generator().manual_seed(18)
    q, k = (torch.randn(2, 5, 3, generator=gen, dtype=F64) for _ in range(2))
    q = q * torch.tensor([1.0, 40.0], dtype=F64)[:, None, None]
    k = k * torch.tensor([1.0, 40.0], dtype=F64)[:, None, None]
    v = torch.randn(2, 5, 2, generator=gen, dtype=F64)
    for causal in (False, True):
        ref = _softmax_ref(q, k, v, 1.0, causal=causal)
        assert torch.isfinite(ref).all()
        torch.testing.assert_close(naive.softmax_attention(q, k, v, scale=1.0, causal=causal),
                                   ref, **TOL)
        torch.testing.assert_close(ops.softmax_attend(q, k, v, scale=1.0, block_rows=2,
                                                      causal=causal), ref, **TOL)


def test_softmax_attend_defaults_counts_and_blocks(monkeypatch):
    """Not causal by default (fused form and naive reference); integer multiplicities
    work as counts; at most ``block_rows`` queries per call of the fused kernel; counts
    with ``causal`` raise."""
    gen = torch.Generator().manual_seed(19)
    q, k = (torch.randn(2, 5, 3, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(2, 5, 4, generator=gen, dtype=F64)
    counts = torch.randint(1, 4, (2, 5), generator=gen)
    torch.testing.assert_close(ops.softmax_attend(q, k, v, scale=0.7, block_rows=5),
                               _softmax_ref(q, k, v, 0.7), **TOL)
    torch.testing.assert_close(ops.softmax_attend(q, k, v, scale=0.7, block_rows=5,
                                                  counts=counts),
                               _softmax_ref(q, k, v, 0.7, counts=counts), **TOL)
    torch.testing.assert_close(naive.softmax_attention(q, k, v, scale=0.7),
                               _softmax_ref(q, k, v, 0.7), **TOL)
    torch.testing.assert_close(naive.softmax_attention(q, k, v, scale=0.7, counts=counts.to(F64)),
                               _softmax_ref(q, k, v, 0.7, counts=counts), **TOL)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    queries = []

    def counting(query, *args, **kwargs):
        queries.append(query.shape[-2])
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    for causal in (False, True):
        queries.clear()
        out = ops.softmax_attend(q, k, v, scale=0.7, block_rows=1, causal=causal)
        torch.testing.assert_close(out, _softmax_ref(q, k, v, 0.7, causal=causal), **TOL)
        assert queries == [1] * 5
    monkeypatch.undo()
    with pytest.raises(ValueError, match=re.escape(
            "causal softmax attention takes no counts: a sequence in multiset form has no "
            "order.")):
        ops.softmax_attend(q, k, v, scale=0.7, block_rows=5, counts=counts, causal=True)


def test_naive_masks_and_decayed_scores_equal_their_definitions():
    """``naive.causal_mask`` keeps ``b <= a`` by default; the decayed scores (naive and
    blocked) are
    ``sum_r q_tr k_jr exp(L_tr - L_jr)`` for ``j <= t`` and 0 above, also for one
    token or one feature."""
    assert torch.equal(naive.causal_mask(3, 3), torch.ones(3, 3, dtype=torch.bool).tril())
    gen = torch.Generator().manual_seed(20)
    for n, r in ((1, 2), (4, 1), (3, 3)):
        q, k = (torch.randn(2, n, r, generator=gen, dtype=F64) for _ in range(2))
        log_cum = torch.nn.functional.logsigmoid(
            torch.randn(2, n, r, generator=gen, dtype=F64)).cumsum(-2)
        ref = torch.zeros(2, n, n, dtype=F64)
        for t in range(n):
            for j in range(t + 1):
                ref[:, t, j] = (q[:, t] * k[:, j] * (log_cum[:, t] - log_cum[:, j]).exp()).sum(-1)
        torch.testing.assert_close(naive.decayed_scores(q, k, log_cum), ref, **TOL)
        for block_elements in (None, 1):
            torch.testing.assert_close(
                ops.decayed_scores(q, k, log_cum, block_elements=block_elements), ref, **TOL)


def test_masks_and_blocked_forms_follow_the_device_of_their_inputs():
    """Masks are built on the inputs' device (here the ``meta`` device, which mixes with
    no other)."""
    from minip_learn.nn.ops.chunk import masked_kernel

    assert ops.causal_mask(2, 3, device="meta").device.type == "meta"

    def meta(*shape):
        return torch.empty(*shape, dtype=F64, device="meta")

    q, v = meta(2, 5, 3), meta(2, 5, 2)
    outs = [ops.decayed_scores(q, q, q, block_elements=10),
            ops.softmax_attend(q, q, v, scale=1.0, block_rows=2, causal=True),
            masked_kernel(q, q, AttentionSpec(True, decay=0.5)),
            masked_kernel(q, q, AttentionSpec(True, log_domain=True, decay=0.5))]
    outs += [ops.causal_attend(q, q, v, nonnegative=True, decay=0.5, log_domain=log_domain,
                               chunk_size=2) for log_domain in (False, True)]
    assert all(out.device.type == "meta" for out in outs)


@pytest.mark.parametrize("nonnegative, scale, eps", [(True, 1e-3, 0.5), (False, 0.3, 1e-3),
                                                     (False, 0.3, 0.2)])
def test_kernel_values_and_readout_guard_as_documented(nonnegative, scale, eps):
    """``u_i = sum_j alpha_ij v_j / guard(sum_j alpha_ij)`` and the affine readout
    ``sum_j alpha_ij g_ij / guard(...) + b_i``: default ``eps = 1e-3``, a given ``eps``
    honoured, a nonnegative kernel's small denominators divided by exactly."""
    gen = torch.Generator().manual_seed(21)
    for n in (3, 10):  # short sequences loop over the keys, longer ones use a product
        alpha = scale * torch.randn(2, n, n, generator=gen, dtype=F64)
        alpha = alpha.abs() if nonnegative else alpha
        v = torch.randn(2, n, 3, generator=gen, dtype=F64)
        g, b = torch.randn(2, n, n, generator=gen, dtype=F64), torch.randn(2, n, dtype=F64)
        den = _guard_ref(alpha.sum(-1), nonnegative, eps)
        kw = dict(nonnegative=nonnegative) if eps == 1e-3 else dict(nonnegative=nonnegative,
                                                                     eps=eps)
        torch.testing.assert_close(ops.kernel_values(alpha, v, **kw),
                                   (alpha @ v) / den[..., None], **TOL)
        torch.testing.assert_close(ops.kernel_readout(alpha, g, b, **kw),
                                   (alpha * g).sum(-1) / den + b, **TOL)


def test_recurrent_state_before_the_first_token():
    for log_domain in (False, True):
        state = ops.recurrent_state((2, 3), 4, 5, log_domain=log_domain, dtype=F64)
        assert [t.shape for t in state] == [(2, 3, 4, 5), (2, 3, 4)] + [(2, 3, 4)] * log_domain
        assert all(t.dtype == F64 for t in state)
        assert not state[0].any() and not state[1].any()
        if log_domain:
            assert torch.equal(state[2], torch.full((2, 3, 4), -math.inf, dtype=F64))
        on_meta = ops.recurrent_state((2,), 4, 5, log_domain=log_domain, device="meta",
                                      dtype=torch.bfloat16)
        assert all(t.device.type == "meta" and t.dtype == torch.bfloat16 for t in on_meta)


def test_recurrent_attend_small_denominators_shapes_dtype_and_device():
    """A nonnegative kernel's small denominators are divided by exactly; any number of
    leading dimensions; the output keeps the inputs' dtype and device."""
    gen = torch.Generator().manual_seed(22)
    q, k = (1e-3 * torch.randn(3, 2, 6, 4, generator=gen, dtype=F64).exp() for _ in range(2))
    v = torch.randn(3, 2, 6, 3, generator=gen, dtype=F64)
    alpha = (q @ k.transpose(-2, -1)).tril()
    ref = (alpha @ v) / alpha.sum(-1, keepdim=True)
    for log_domain in (False, True):
        fq, fk = (q.log(), k.log()) if log_domain else (q, k)
        out = ops.recurrent_attend(fq, fk, v, nonnegative=True, log_domain=log_domain)
        torch.testing.assert_close(out, ref, **TOL)
        low = ops.recurrent_attend(fq.bfloat16(), fk.bfloat16(), v.bfloat16(),
                                   nonnegative=True, log_domain=log_domain)
        assert low.dtype == torch.bfloat16
        meta = ops.recurrent_attend(fq.to("meta"), fk.to("meta"), v.to("meta"),
                                    nonnegative=True, log_domain=log_domain)
        assert meta.device.type == "meta"


def test_softmax_weights_default_and_device():
    """Not causal by default: every row is the softmax of the scores plus ``log c``;
    causal weights are built on the scores' device."""
    gen = torch.Generator().manual_seed(23)
    scores = torch.randn(2, 4, 4, generator=gen, dtype=F64)
    counts = torch.tensor([1.0, 2.0, 0.0, 3.0], dtype=F64).expand(2, 4)
    e = scores.exp() * counts[..., None, :]
    torch.testing.assert_close(ops.softmax_weights(scores, counts), e / e.sum(-1, keepdim=True),
                               **TOL)
    e = scores.exp()
    torch.testing.assert_close(ops.softmax_weights(scores), e / e.sum(-1, keepdim=True), **TOL)
    meta = ops.softmax_weights(scores.to("meta"), causal=True)
    assert meta.device.type == "meta"


@pytest.mark.parametrize("nonnegative, scale, eps", [(True, 1e-3, 0.5), (False, 0.3, 1e-3),
                                                     (False, 0.3, 1.5)])
def test_head_outputs_guard_as_documented(nonnegative, scale, eps):
    """``y_i = <w_i, u_i> + b_i`` with ``u_i`` the guarded attention (whole sequence and
    causal): default ``eps = 1e-3``, a given ``eps`` honoured, a nonnegative kernel's
    small denominators divided by exactly; short and long sequences alike."""
    gen = torch.Generator().manual_seed(24)
    for n, r in ((3, 16), (40, 2)):
        q, k = (torch.randn(2, n, r, generator=gen, dtype=F64) for _ in range(2))
        q, k = ((q.exp(), k.exp()) if nonnegative else (q, k))
        q, k = scale * q, scale * k
        v, w = (torch.randn(2, n, 3, generator=gen, dtype=F64) for _ in range(2))
        b = torch.randn(2, n, generator=gen, dtype=F64)
        kw = dict(nonnegative=nonnegative) if eps == 1e-3 else dict(nonnegative=nonnegative,
                                                                     eps=eps)
        for causal in (False, True):
            alpha = q @ k.transpose(-2, -1)
            alpha = alpha.tril() if causal else alpha
            u = (alpha @ v) / _guard_ref(alpha.sum(-1, keepdim=True), nonnegative, eps)
            form = ops.causal_head_output if causal else ops.head_output
            torch.testing.assert_close(form(q, k, v, w, b, **kw), (w * u).sum(-1) + b, **TOL)


def test_pair_readout_gradient_at_a_denominator_equal_to_eps():
    """At ``|den| = eps`` the signed guard is the identity's branch of its clamp (as
    :func:`~minip_learn.nn.ops.spec.guard_denominator` differentiates it): the hand-written
    backward and the quadratic reference give the same gradient."""
    alpha = torch.tensor([[0.25, 0.25]], dtype=F64, requires_grad=True)
    g = torch.tensor([[1.0, 3.0]], dtype=F64, requires_grad=True)
    dense, token_of = torch.tensor([[1.0, 1.0]], dtype=F64), torch.tensor([0])
    rows, rows_t = dense.to_sparse_csr(), dense.T.contiguous().to_sparse_csr()
    fast = ops.pair_readout(alpha, g, None, token_of, rows, rows_t, nonnegative=False,
                            eps=0.5)
    ref = naive.pair_readout(alpha, g, None, [0], dense, nonnegative=False, eps=0.5)
    torch.testing.assert_close(fast, ref, **TOL)
    for got, want in zip(torch.autograd.grad(fast.sum(), (alpha, g)),
                         torch.autograd.grad(ref.sum(), (alpha, g))):
        torch.testing.assert_close(got, want, **TOL)


# -- edges the mutation run found untested: guards at 0 and eps, defaults, decays, dispatch --
#
# Each test states a documented property (docstrings of ``nn/ops``) and checks it against a
# formula written here: exact guards (a nonnegative zero denominator becomes 1, a signed one
# is ``sign(den) max(|den|, eps)`` with ``sign(0) = +1``), default arguments, the
# per-sequence shifts of log-features, and which of two documented evaluations runs.

def test_guard_denominator_and_the_naive_guard_at_their_edges():
    """A nonnegative kernel's zero denominator becomes exactly 1 and positive ones are kept
    however small; a signed one is ``sign(den) max(|den|, eps)`` with ``sign(0) = +1`` and
    ``eps = 1e-3`` by default -- in ``guard_denominator`` and in the reference's guard."""
    den = torch.tensor([0.0, 2.0, 1e-9], dtype=F64)
    kept = torch.tensor([1.0, 2.0, 1e-9], dtype=F64)
    signed = torch.tensor([0.5, 1e-4, -1e-4, 0.0, -2.0], dtype=F64)
    clamped = torch.tensor([0.5, 1e-3, -1e-3, 1e-3, -2.0], dtype=F64)
    for guard in (ops.guard_denominator, naive._guard):
        assert torch.equal(guard(den, nonnegative=True), kept)
        assert torch.equal(guard(signed, nonnegative=False), clamped)
        assert torch.equal(guard(torch.tensor([-2.0, 0.0, 1e-6, -1e-6]), nonnegative=False,
                                 eps=0.1), torch.tensor([-2.0, 0.1, 0.1, -0.1]))


def test_naive_kernel_attention_guards_exactly_at_the_edges():
    """The reference divides by the guarded denominator at its edges: with one-hot keys
    ``alpha_ij = phi_q[i, j]``, so the denominators are exactly 0, ``+-eps/2`` and beyond
    ``eps`` (signed, a given ``eps``), or exactly 0 and far below ``1e-3`` (nonnegative:
    ``u = 0`` and an exact division)."""
    eye = torch.eye(5, dtype=F64)
    v = torch.tensor([[1.0, -2.0], [3.0, 0.5], [-4.0, 2.0], [0.5, 1.0], [2.0, -1.0]],
                     dtype=F64)
    phi_q = torch.tensor([[1.0, -1.0, 0.0, 0.0, 0.0],     # den 0
                          [0.5, -0.25, 0.0, 0.0, 0.0],    # den eps / 2
                          [-0.5, 0.25, 0.0, 0.0, 0.0],    # den -eps / 2
                          [1.0, 0.5, -0.75, 0.0, 0.0],    # den 3 eps / 2
                          [0.0, 0.0, 0.0, -1.0, 0.25]],   # den -3 eps / 2
                         dtype=F64)
    den = phi_q.sum(-1, keepdim=True)
    torch.testing.assert_close(naive.kernel_attention(phi_q, eye, v, nonnegative=False, eps=0.5),
                               (phi_q @ v) / _guard_ref(den, False, 0.5), **TOL)
    phi_q = torch.tensor([[0.0] * 5, [1e-4, 0.0, 1e-4, 0.0, 0.0], [1e-6] * 5,
                          [1.0, 2.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 3e-5]], dtype=F64)
    den = phi_q.sum(-1, keepdim=True)
    u = naive.kernel_attention(phi_q, eye, v, nonnegative=True)
    torch.testing.assert_close(u, (phi_q @ v) / torch.where(den > 0, den, 1.0), **TOL)
    assert not u[0].any()


def test_log_decay_takes_one_as_no_decay_and_names_its_range():
    """``gamma`` lies in ``(0, 1]``: 1 is allowed (``log gamma = 0``, the same causal form as
    no decay); anything else raises with the range in the message."""
    assert ops.log_decay(1.0) == 0.0 and ops.log_decay(None) == 0.0
    assert AttentionSpec(True, decay=1.0).log_gamma == 0.0
    assert ops.log_decay(0.5) == math.log(0.5)
    fast_in, _, v, *_ = _causal_case(((2,), 5, 3, 2), False, False)
    torch.testing.assert_close(ops.causal_attend(*fast_in, v, nonnegative=True, decay=1.0),
                               ops.causal_attend(*fast_in, v, nonnegative=True), **TOL)
    for decay in (1.5, 0.0):
        with pytest.raises(ValueError, match=re.escape(
                f"decay must be in (0, 1]; got {decay!r}.")):
            ops.log_decay(decay)


def test_offsets_of_blocks_that_start_anywhere():
    """``offsets(n_q, n_k, q0, k0)[a, b] = (q0 + a) - (k0 + b)``, shape (n_q, n_k)."""
    for n_q, n_k, q0, k0 in ((2, 3, 0, 0), (2, 3, 1, 2), (3, 2, 4, 1), (1, 4, 0, 3)):
        want = torch.tensor([[(q0 + a) - (k0 + b) for b in range(n_k)] for a in range(n_q)])
        assert torch.equal(ops.masks.offsets(n_q, n_k, q0, k0), want)
        assert torch.equal(ops.masks.offsets(n_q, n_k, q0=q0, k0=k0), want)


@pytest.mark.parametrize("nonnegative, scale, eps", [(True, 1e-3, None), (False, 0.3, None),
                                                     (False, 0.3, 0.5)])
@pytest.mark.parametrize("decay", [None, 0.8])
def test_last_forms_guard_defaults_and_shape_as_documented(nonnegative, scale, eps, decay):
    """The final-query forms: ``u_{N-1} = sum_j gamma^(N-1-j) alpha_{N-1,j} v_j / guard(...)``
    of plain features by default (``log_domain=False``), ``eps = 1e-3`` by default, a given
    ``eps`` honoured, a nonnegative kernel's small denominators divided by exactly; the
    readout ``<w_{N-1}, u_{N-1}> + b_{N-1}`` with its position axis kept, (..., 1)."""
    gen = torch.Generator().manual_seed(25)
    n = 5
    q, k = (torch.randn(2, 3, n, 4, generator=gen, dtype=F64) for _ in range(2))
    q, k = ((q.exp(), k.exp()) if nonnegative else (q, k))
    q, k = scale * q, scale * k
    v, w = (torch.randn(2, 3, n, 3, generator=gen, dtype=F64) for _ in range(2))
    b = torch.randn(2, 3, n, generator=gen, dtype=F64)
    gamma = 1.0 if decay is None else decay
    alpha = (q[..., -1:, :] * k).sum(-1) * gamma ** torch.arange(n - 1, -1, -1, dtype=F64)
    den = _guard_ref(alpha.sum(-1, keepdim=True), nonnegative, 1e-3 if eps is None else eps)
    u = (alpha[..., None] * v).sum(-2) / den
    kw = dict(nonnegative=nonnegative, decay=decay, **({} if eps is None else dict(eps=eps)))
    torch.testing.assert_close(ops.last_attend(q, k, v, **kw), u, **TOL)
    y = ops.last_head_output(q, k, v, w, b, **kw)
    assert y.shape == (2, 3, 1)
    torch.testing.assert_close(y, ((w[..., -1, :] * u).sum(-1) + b[..., -1])[..., None], **TOL)


def test_last_forms_decay_on_the_device_of_their_inputs():
    """The decay of the final-query form is built on the inputs' device (``meta`` here)."""
    q, v = (torch.empty(2, 5, n, dtype=F64, device="meta") for n in (3, 2))
    for log_domain in (False, True):
        out = ops.last_attend(q, q, v, nonnegative=True, decay=0.5, log_domain=log_domain)
        assert out.device.type == "meta" and out.shape == (2, 2)
        y = ops.last_head_output(q, q, v, v, v[..., 0], nonnegative=True, decay=0.5,
                                 log_domain=log_domain)
        assert y.device.type == "meta" and y.shape == (2, 1)


def test_is_short_compares_the_costs_of_the_two_forms():
    """Explicit ``N x N`` kernel (about ``N^2 (r + d)``) while it costs at most the sketch
    (``N r d`` and many tiny products, counted twice): ``N (r + d) <= 2 r d``, a tie
    included. The docstring's examples, the crossover of ``r = 16, d = 24`` at
    ``N = 19.2`` and the tie ``N = r = d``."""
    assert ops.is_short(3, 16, 24) and not ops.is_short(1000, 16, 24)
    assert ops.is_short(19, 16, 24) and not ops.is_short(20, 16, 24)
    assert ops.is_short(8, 8, 8) and not ops.is_short(9, 8, 8)
    assert ops.is_short(1, 1, 1) and not ops.is_short(2, 1, 1)


@pytest.mark.parametrize("n, r, d", [(3, 16, 2), (10, 16, 2), (5, 4, 100), (40, 6, 2)])
def test_attend_takes_the_sketch_for_long_sequences_only(monkeypatch, n, r, d):
    """Short sequences (:func:`is_short`) go through the explicit kernel, longer ones
    through the sketch (counted here); both give the attended values."""
    gen = torch.Generator().manual_seed(26)
    q, k = (torch.randn(2, n, r, generator=gen, dtype=F64).exp() for _ in range(2))
    v = torch.randn(2, n, d, generator=gen, dtype=F64)
    alpha = q @ k.transpose(-2, -1)
    sketches = []
    real = ops.kernel.sketch
    monkeypatch.setattr(ops.kernel, "sketch", lambda *a: sketches.append(1) or real(*a))
    torch.testing.assert_close(ops.attend(q, k, v, nonnegative=True),
                               (alpha @ v) / alpha.sum(-1, keepdim=True), **TOL)
    assert bool(sketches) == (not ops.is_short(n, r, d))


@pytest.mark.parametrize("nonnegative, scale, eps", [(True, 1e-3, None), (False, 0.3, None),
                                                     (False, 0.3, 0.5)])
def test_attend_guards_as_documented(nonnegative, scale, eps):
    """``u_i = sum_j alpha_ij v_j / guard(sum_j alpha_ij)`` on short and long sequences:
    default ``eps = 1e-3``, a given ``eps`` honoured, a nonnegative kernel's small
    denominators divided by exactly."""
    gen = torch.Generator().manual_seed(27)
    for n, r in ((3, 16), (40, 2)):
        q, k = (torch.randn(2, n, r, generator=gen, dtype=F64) for _ in range(2))
        q, k = ((q.exp(), k.exp()) if nonnegative else (q, k))
        q, k = scale * q, scale * k
        v = torch.randn(2, n, 3, generator=gen, dtype=F64)
        alpha = q @ k.transpose(-2, -1)
        den = _guard_ref(alpha.sum(-1, keepdim=True), nonnegative, 1e-3 if eps is None else eps)
        kw = dict(nonnegative=nonnegative, **({} if eps is None else dict(eps=eps)))
        torch.testing.assert_close(ops.attend(q, k, v, **kw), (alpha @ v) / den, **TOL)


def _log_attention_ref(lq, lk, v):
    """Non-causal attention of log-features computed in the log domain:
    ``log alpha_ij = logsumexp_r(lq_ir + lk_jr)``, each row's softmax (any magnitude)."""
    la = torch.logsumexp(lq[..., :, None, :] + lk[..., None, :, :], -1)
    return torch.softmax(la, -1) @ v


def test_log_domain_features_are_shifted_per_sequence_and_query():
    """``attention_features`` shifts keys by their per-sequence, per-feature maximum and each
    query by its own: with sequences thousands of e-folds apart in one batch (queries of the
    second, keys of the third), every feature is ``<= 1``, every query's denominator is
    ``>= 1`` and the attended values are exact."""
    gen = torch.Generator().manual_seed(28)
    lq, lk = (torch.randn(3, 4, 3, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(3, 4, 2, generator=gen, dtype=F64)
    lq = lq + torch.tensor([0.0, 2000.0, 0.0], dtype=F64)[:, None, None]
    lk = lk + torch.tensor([0.0, 0.0, -2000.0], dtype=F64)[:, None, None]
    phi_q, phi_k = ops.attention_features(lq, lk, log_domain=True)
    assert phi_q.max() <= 1 and phi_k.max() <= 1
    assert ((phi_q @ phi_k.transpose(-2, -1)).sum(-1) >= 1).all()
    torch.testing.assert_close(ops.attend(phi_q, phi_k, v, nonnegative=True),
                               _log_attention_ref(lq, lk, v), **TOL)


def test_recurrent_log_domain_shifts_each_query_by_its_own_maximum():
    """``recurrent_step`` shifts the query by its own maximum: two sequences whose queries
    lie 2000 e-folds apart in one batch both stay exact."""
    gen = torch.Generator().manual_seed(29)
    lq, lk = (torch.randn(2, 5, 3, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(2, 5, 2, generator=gen, dtype=F64)
    lq = lq + torch.tensor([0.0, 2000.0], dtype=F64)[:, None, None]
    out = ops.recurrent_attend(lq, lk, v, nonnegative=True, log_domain=True)
    torch.testing.assert_close(out, _causal_log_ref(lq, lk, v, 0.0), **TOL)


def _spiked_log_features(n, spike_at, seed):
    """Log-features of moderate size with one key, at ``spike_at`` in the first sequence,
    2000 e-folds above the others in its first feature."""
    gen = torch.Generator().manual_seed(seed)
    lq, lk = (torch.randn(2, n, 2, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(2, n, 2, generator=gen, dtype=F64)
    lk[0, spike_at, 0] += 2000.0
    return lq, lk, v


@pytest.mark.parametrize("spike_at", [3, 12, 39])
def test_log_domain_causal_attend_is_exact_before_a_huge_later_key(spike_at):
    """The output at ``i`` never depends on later tokens (:func:`causal_attend`): a key 2000
    e-folds above the earlier ones leaves the outputs before it exact, in one masked block
    (``chunk_size`` = N, the whole sequence), in blocks of one position and in blocks
    that hold the key and earlier positions (the block's kernel is shifted per query over
    the keys it sees)."""
    n = 40
    lq, lk, v = _spiked_log_features(n, spike_at, seed=30)
    ref = _causal_log_ref(lq, lk, v, 0.0)
    for chunk_size in (1, 3, 8, 32, n):
        out = ops.causal_attend(lq, lk, v, nonnegative=True, log_domain=True,
                                chunk_size=chunk_size)
        torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("n_a, n_c, loops", [(1, 1, True), (3, 3, True), (4, 5, True),
                                             (8, 8, True), (1, 64, True), (9, 8, False),
                                             (65, 1, False), (10, 10, False)])
def test_pairwise_dots_loops_over_at_most_loop_tokens_squared_pairs(monkeypatch, n_a, n_c,
                                                                    loops):
    """Few token pairs (at most ``LOOP_TOKENS ** 2``) go through the loop over the pairs
    with its hand-written backward (counted here), more through a matrix product; both
    give every inner product."""
    gen = torch.Generator().manual_seed(31)
    a, c = (torch.randn(2, n, 3, generator=gen, dtype=F64) for n in (n_a, n_c))
    calls = []
    real = ops.pair._PairDots.apply
    monkeypatch.setattr(ops.pair._PairDots, "apply", lambda *t: calls.append(1) or real(*t))
    torch.testing.assert_close(ops.pairwise_dots(a, c), torch.einsum("bik,bjk->bij", a, c),
                               **TOL)
    assert bool(calls) == loops


def test_pairwise_dots_broadcasts_leading_dimensions():
    """Token sets with different leading dimensions broadcast like a matrix product (the
    loop over pairs needs equal ones): a key set shared by a batch of query sets, as
    :func:`explicit_kernel` forms with a rank mask per member, and the other way round."""
    gen = torch.Generator().manual_seed(32)
    fq, fk = (torch.randn(n, 5, generator=gen, dtype=F64) for n in (2, 3))
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0], [1.0] * 5, [0.0, 1.0, 1.0, 0.0, 1.0]],
                        dtype=F64)[:, None, :]  # (3 members, 1, r)
    torch.testing.assert_close(ops.explicit_kernel(fq, fk, log_domain=False, mask=mask),
                               torch.einsum("ik,mk,jk->mij", fq, mask[:, 0], fk), **TOL)
    a, c = torch.randn(2, 4, generator=gen, dtype=F64), torch.randn(3, 2, 4, generator=gen,
                                                                    dtype=F64)
    torch.testing.assert_close(ops.pairwise_dots(a, c), torch.einsum("ik,bjk->bij", a, c),
                               **TOL)
    torch.testing.assert_close(ops.pairwise_dots(c, a), torch.einsum("bik,jk->bij", c, a),
                               **TOL)
