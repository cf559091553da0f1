"""The final-query form on the distinct tokens (``Mixer.attend_last_tokens``, the ops of
``minip_learn.nn.ops.tokens``) against the form per position (``last_in_blocks``) and
against the formulas: the same outputs and parameter gradients, in float64, on
families whose tokens repeat, whose tokens are all distinct, and with one token."""

import math

import numpy as np
import pytest
import torch

from minip_learn.nn import make_feature_map, make_mixer
from minip_learn.nn.ops import naive
from minip_learn.nn.ops import tokens as tokens_ops
from minip_learn.nn.ops.tokens import (
    DENSE_VALUES,
    distinct_token_index,
    gathered_last_attend,
    token_scores,
)

N_BITS = 5


def _family(kind, n=60, seq_len=7, seed=0):
    """Sequences of 0/1 tokens: drawn from 6 tokens (``"repeated"``), every position of
    the batch a token of its own (``"distinct"``: two sequences), or one token."""
    g = torch.Generator().manual_seed(seed)
    if kind == "repeated":
        pool = (torch.rand(6, N_BITS, generator=g) > 0.5).double()
        return pool[torch.randint(0, 6, (n, seq_len), generator=g)]
    if kind == "distinct":  # every position of the batch holds a token of its own
        codes = torch.randperm(2**N_BITS, generator=g)[:2 * seq_len].view(2, seq_len)
        return ((codes[..., None] >> torch.arange(N_BITS)) & 1).double()
    token = (torch.rand(N_BITS, generator=g) > 0.5).double()
    return token.expand(n, seq_len, N_BITS).clone()


def _vocabulary(x):
    return np.unique(x.reshape(-1, N_BITS).numpy(), axis=0).astype(np.uint8)


CASES = [
    ("kernel", {}),
    ("kernel", {"feature_map": "table"}),
    ("kernel", {"feature_map": "relu"}),
    ("kernel", {"feature_map": "identity"}),  # a signed kernel: the clamp guard
    ("retnet", {"decay": 0.8}),
    ("retnet", {"decay": 0.8, "feature_map": "exp"}),
    ("retnet", {"decay": 0.8, "feature_map": "table"}),
    ("positional", {}),
    ("positional", {"feature_map": "table"}),
    ("linear", {}),
    ("softmax", {}),
]


def _mixer(name, kwargs, x, seed=0):
    kwargs = dict(kwargs)
    if kwargs.get("feature_map") == "table":
        kwargs["feature_kwargs"] = {"vocabulary": _vocabulary(x), "init_scale": 1.0}
    if name == "positional":
        kwargs["max_len"] = x.shape[1]
    torch.manual_seed(seed)
    mixer = make_mixer(name, N_BITS, 4, **kwargs).double()
    if name == "positional":  # positional weights away from their zero start
        with torch.no_grad():
            mixer.head.position_query.normal_()
            mixer.head.position_key.normal_()
    return mixer


def _outputs_and_grads(mixer, out):
    params = [p for p in mixer.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out.square() + out).sum(), params, allow_unused=True)
    return out.detach(), [torch.zeros_like(p) if g is None else g
                          for p, g in zip(params, grads, strict=True)]


@pytest.mark.parametrize("family", ["repeated", "distinct", "one"])
@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=lambda v: str(v or ""))
def test_distinct_form_equals_form_per_position(name, kwargs, family):
    x = _family(family)
    mixer = _mixer(name, kwargs, x)
    tokens, index = mixer.distinct_tokens(x)
    assert mixer.per_token_maps
    # the form applies, except where its kernel (U x U) would outgrow the positions
    applies = mixer.attend_last_tokens(x, tokens, index) is not None
    assert applies == (family != "distinct")
    new, new_grads = _outputs_and_grads(mixer, mixer(x, last=True))
    old, old_grads = _outputs_and_grads(
        mixer, mixer.readout(x[:, -1:], mixer.last_in_blocks(x)[:, None]))
    torch.testing.assert_close(new, old, rtol=1e-10, atol=1e-12)
    for g, h in zip(new_grads, old_grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-9, atol=1e-11)
    # and the whole-sequence form's last position
    with torch.no_grad():
        torch.testing.assert_close(new, mixer(x)[:, -1:], rtol=1e-9, atol=1e-11)


def test_distinct_token_index():
    x = _family("repeated")
    tokens, index = distinct_token_index(x)
    assert torch.equal(tokens[index], x)
    assert len(tokens) == len(np.unique(x.reshape(-1, N_BITS).numpy(), axis=0))
    assert distinct_token_index(x * 0.5) is None  # not 0/1
    assert distinct_token_index(torch.zeros(2, 3, 63)) is None  # too wide for a code


def test_token_index_kept_for_the_same_input():
    x = _family("repeated")
    mixer = _mixer("kernel", {}, x)
    first = mixer.distinct_tokens(x)
    assert mixer.distinct_tokens(x) is first
    x[0, 0] = 1 - x[0, 0]  # in place: searched again
    again = mixer.distinct_tokens(x)
    assert again is not first and torch.equal(again[0][again[1]], x)


def test_not_binary_tokens_take_the_form_per_position():
    x = _family("repeated") * 0.5
    mixer = _mixer("kernel", {}, x)
    assert mixer.distinct_tokens(x) is None
    torch.testing.assert_close(mixer(x, last=True), mixer(x)[:, -1:])


def test_user_feature_map_takes_the_form_per_position():
    x = _family("repeated")
    mixer = _mixer("kernel", {"feature_map": torch.nn.Linear}, x)
    assert mixer.attend_last_tokens(x, *mixer.distinct_tokens(x)) is None
    torch.testing.assert_close(mixer(x, last=True), mixer(x)[:, -1:])


@pytest.mark.parametrize("tokens", ["repeated", "distinct", "one"])
@pytest.mark.parametrize("log_domain", [False, True])
@pytest.mark.parametrize("decay", [None, 0.7])
def test_gathered_last_attend_equals_the_formulas(log_domain, decay, tokens):
    """The kernel between distinct tokens, gathered per sequence, against the quadratic
    reference on the features of every position: tokens that repeat (values summed
    through the dense matrix of weights per token), every position a token of its own
    (values gathered per position), one token."""
    g = torch.Generator().manual_seed(1)
    n, N, r, d = 10, 6, 3, 2  # all distinct: more values than DENSE_VALUES * N
    U = {"repeated": 5, "distinct": n * N, "one": 1}[tokens]
    fq = torch.randn(U, r, generator=g, dtype=torch.float64, requires_grad=True)
    fk = torch.randn(U, r, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(U, d, generator=g, dtype=torch.float64, requires_grad=True)
    tok = (torch.randperm(U, generator=g).view(n, N) if tokens == "distinct"
           else torch.randint(0, U, (n, N), generator=g))
    assert (U > DENSE_VALUES * N) == (tokens == "distinct")
    age = None if decay is None else torch.arange(N - 1, -1, -1).double() * np.log(decay)
    if log_domain:
        scores = token_scores(fq, fk, log_domain=True)
        u = gathered_last_attend(scores, tok[:, -1], tok, v, normalise="softmax",
                                 key_log_weight=age)
        phi_q, phi_k = torch.exp(fq), torch.exp(fk)
    else:
        phi_q, phi_k = fq.exp(), fk.exp()
        u = gathered_last_attend(token_scores(phi_q, phi_k, log_domain=False), tok[:, -1],
                                 tok, v, normalise="kernel", key_log_weight=age)
    ref = naive.kernel_attention(phi_q[tok], phi_k[tok], v[tok], nonnegative=True,
                                 causal=True, decay=decay)[:, -1]
    torch.testing.assert_close(u, ref)
    gu = torch.autograd.grad(u.sin().sum(), (fq, fk, v), retain_graph=True)
    gr = torch.autograd.grad(ref.sin().sum(), (fq, fk, v))
    for a, b in zip(gu, gr, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("exact_terms", [tokens_ops.EXACT_LOG_TERMS, 0])
def test_token_scores_log_domain_far_apart_features(monkeypatch, exact_terms):
    """Log-features whose maxima sit in different features, far apart: the shifted
    product underflows and the exact logsumexp gives the kernel (taken at once for
    few terms, after the product's test for many)."""
    monkeypatch.setattr(tokens_ops, "EXACT_LOG_TERMS", exact_terms)
    lq = torch.tensor([[0.0, -900.0]], dtype=torch.float64)
    lk = torch.tensor([[-900.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    got = token_scores(lq, lk, log_domain=True)
    # the kernel written out: log sum_k exp(lq_k + lk_k), each sum by hand
    # log(e^-900 + e^-900) = log 2 - 900; log(1 + e^-900) = 0 in float64
    want = torch.tensor([[math.log(2.0) - 900.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("masked", [False, True])
def test_token_scores_log_domain_paths_agree(monkeypatch, masked):
    """The exact logsumexp of few terms and the shifted product of many give the same
    log-kernel, and the same gradients."""
    g = torch.Generator().manual_seed(0)
    lq = torch.randn(2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    lk = torch.randn(2, 7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64) if masked else None
    small = token_scores(lq, lk, log_domain=True, mask=mask)
    monkeypatch.setattr(tokens_ops, "EXACT_LOG_TERMS", 0)
    large = token_scores(lq, lk, log_domain=True, mask=mask)
    weight = torch.ones(4, dtype=torch.float64) if mask is None else mask
    ref = torch.log(torch.einsum("bik,bjk->bij", lq.exp() * weight, lk.exp()))
    torch.testing.assert_close(small, ref)
    torch.testing.assert_close(large, ref)
    ga = torch.autograd.grad(small.sin().sum(), (lq, lk))
    gb = torch.autograd.grad(large.sin().sum(), (lq, lk))
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b)


def test_token_scores_of_few_terms_read_nothing_on_the_host():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Syncs(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Syncs.n += 1
            return func(*args, **(kwargs or {}))

    lq, lk = torch.randn(6, 3), torch.randn(9, 3)
    with Syncs():
        token_scores(lq, lk, log_domain=True)
    assert Syncs.n == 0


def test_table_map_declares_per_token():
    phi = make_feature_map("table", N_BITS, 3, vocabulary=np.eye(N_BITS))
    user = make_feature_map(torch.nn.Linear, N_BITS, 3)
    assert phi.per_token and not user.per_token
