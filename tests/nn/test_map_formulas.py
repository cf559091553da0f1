"""Every registered feature map against its formula, written here from its definition.

Each map of the registry (:func:`minip_learn.nn.available_feature_maps`) has a reference
below, written with torch primitives at float64 from the formula of its paper or of its
docstring; no reference calls a module, activation or helper of the library. A map is
compared with its reference in value and in gradient (with respect to the input and to
every parameter of the map: encoder weights and biases, ``log_table``, ``gamma``,
``beta``) on random inputs and on edge inputs: pre-activations of +-30 and +-200,
all-zero tokens, binary tokens. Log-domain maps are compared twice: ``log_features``
with the log of the formula and ``forward`` with the formula itself.

The same references then check the places that compute with the features: a
:class:`~minip_learn.nn.KernelAttentionHead` of every map against normalised kernel
attention written here (its log-domain shift must cancel exactly), the fused forward
of :class:`~minip_learn.nn.HeadEnsemble` (which evaluates the maps of every member at
once, on positions and on token pairs, from its own stacked parameters) and
``kernel_min``. A registered map without a reference fails
:func:`test_every_registered_map_has_a_reference`.
"""

import itertools
import math
import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest
import torch

from minip_learn.nn import (
    FeatureMap,
    HeadEnsemble,
    KernelAttentionHead,
    UserFeatureMap,
    available_feature_maps,
    check_feature_map_output,
    get_feature_map,
    make_feature_map,
)

N_BITS = 4
#: the token set of the ``table`` map: the all-zero token and five others
VOCAB = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0], [1, 1, 0, 1],
                      [0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.float64)
RTOL = 1e-12
#: tolerance of whole attention heads: a few hundred roundings of the attention
#: arithmetic on values up to ~1e3
HEAD_RTOL = 1e-10


# -- the references ----------------------------------------------------------------------
def _gelu(z):
    """GELU, exact form: ``z Phi(z) = z (1 + erf(z / sqrt 2)) / 2``."""
    return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))


def _encode(x, P):
    """The encoder: ``W x + b``, or the MLP ``W_L gelu(... gelu(W_1 x + b_1)) + b_L``."""
    if "encoder.weight" in P:
        return x @ P["encoder.weight"].T + P["encoder.bias"]
    layers = sorted({int(k.split(".")[1]) for k in P if k.startswith("encoder.")})
    h = x
    for i, j in enumerate(layers):
        h = h @ P[f"encoder.{j}.weight"].T + P[f"encoder.{j}.bias"]
        if i < len(layers) - 1:
            h = _gelu(h)
    return h


def _relu(z):
    """``max(z, 0)`` (subgradient 0 at the kink)."""
    return torch.where(z > 0, z, torch.zeros_like(z))


def _elu_plus_one(x, P, B, kw):
    """``elu(z) + 1``: ``z + 1`` for ``z > 0``, ``exp(z)`` otherwise (Katharopoulos et
    al. 2020, eq. 7)."""
    z = _encode(x, P)
    return torch.where(z > 0, z + 1.0, torch.exp(torch.clamp(z, max=0.0)))


def _relu_floor(x, P, B, kw):
    """``relu(z) + floor``, floor ``1e-4`` unless given."""
    return _relu(_encode(x, P)) + kw.get("floor", 1e-4)


def _softplus(x, P, B, kw):
    """``log(1 + e^z)``, evaluated as ``z + log(1 + e^-z)`` for ``z > 0``."""
    z = _encode(x, P)
    pos = z + torch.log1p(torch.exp(-torch.clamp(z, min=0.0)))
    neg = torch.log1p(torch.exp(torch.clamp(z, max=0.0)))
    return torch.where(z > 0, pos, neg)


def _squared_relu(x, P, B, kw):
    """``relu(z)^2 + floor``, floor ``1e-4`` unless given."""
    return _relu(_encode(x, P)) ** 2 + kw.get("floor", 1e-4)


def _exp(x, P, B, kw):
    """log of ``exp(z)``: ``z``."""
    return _encode(x, P)


def _favor(x, P, B, kw):
    """log of ``exp(w_k . h - |h|^2 / 2) / sqrt(m)`` (Choromanski et al. 2021, Lemma 1:
    positive random features of the softmax kernel), ``m = rank``."""
    h = _encode(x, P)
    return (h @ B["directions"].T - 0.5 * (h * h).sum(-1, keepdim=True)
            - 0.5 * math.log(kw["rank"]))


def _table(x, P, B, kw):
    """log of ``exp(T[x])``: the row of the token in the log-table."""
    vocab = B["vocabulary"].numpy()
    tokens = x.detach().reshape(-1, x.shape[-1]).numpy()
    rows = [int(np.flatnonzero((vocab == t).all(1))[0]) for t in tokens]
    return P["log_table"][torch.tensor(rows)].reshape(x.shape[:-1] + (-1,))


def _identity(x, P, B, kw):
    """``z``."""
    return _encode(x, P)


def _taylor(x, P, B, kw):
    """Second-order Taylor features of ``exp(z . z')``, in the documented order
    ``[1; z_0, z_0^2/sqrt 2; z_1, z_1^2/sqrt 2, z_0 z_1; z_2, z_2^2/sqrt 2, z_0 z_2,
    z_1 z_2; ...]``, so that ``phi . phi' = 1 + t + t^2 / 2`` with ``t = z . z'``."""
    z = _encode(x, P)
    cols = [torch.ones_like(z[..., 0])]
    for k in range(z.shape[-1]):
        cols += [z[..., k], z[..., k] ** 2 / math.sqrt(2.0)]
        cols += [z[..., j] * z[..., k] for j in range(k)]
    return torch.stack(cols, -1)


def _rff(x, P, B, kw):
    """``sqrt(2 / m) cos(w_k . h + b_k)`` (Rahimi & Recht 2007), ``m = rank``."""
    h = _encode(x, P)
    return math.sqrt(2.0 / kw["rank"]) * torch.cos(h @ B["directions"].T + B["phases"])


def _t2r(x, P, B, kw):
    """``relu(W x + b)`` (Kasai et al. 2021)."""
    return _relu(_encode(x, P))


def _hedgehog(x, P, B, kw):
    """log of ``softmax([2 z, -2 z])`` (the authors' reference implementation)."""
    z = _encode(x, P)
    a = torch.cat([2.0 * z, -2.0 * z], -1)
    m = a.amax(-1, keepdim=True).detach()
    return a - m - torch.log(torch.exp(a - m).sum(-1, keepdim=True))


def _dpfp(x, P, B, kw):
    """DPFP-nu (Schlag et al. 2021): ``y = [relu(z), relu(-z)]`` (``2p`` entries) and the
    features ``y_i y_{(i - j) mod 2p}`` for ``j = 1 .. nu``, block after block (the
    authors' code; the paper's ``y_i y_{i+j}`` are the same products in another
    order)."""
    z = _encode(x, P)
    y = torch.cat([_relu(z), _relu(-z)], -1)
    n = y.shape[-1]
    blocks = [y * y[..., [(i - j) % n for i in range(n)]] for j in range(1, kw.get("nu", 1) + 1)]
    return torch.cat(blocks, -1)


def _rebased(x, P, B, kw):
    """ReBased (Aksenov et al. 2024): ``h = gamma * (z - mean) / sqrt(var + eps) + beta``
    (biased variance, ``eps = 1e-5`` unless given), then ``h_k^2 / sqrt(p)`` for every
    ``k`` and ``sqrt(2 / p) h_j h_k`` for every ``j < k`` (row by row)."""
    z = _encode(x, P)
    p = z.shape[-1]
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    h = P["gamma"] * (z - mean) / torch.sqrt(var + kw.get("eps", 1e-5)) + P["beta"]
    cols = [h[..., k] ** 2 / math.sqrt(p) for k in range(p)]
    cols += [math.sqrt(2.0 / p) * h[..., j] * h[..., k]
             for j in range(p) for k in range(j + 1, p)]
    return torch.stack(cols, -1)


class Reference(NamedTuple):
    """A map's formula ``fn(x, params, buffers, kwargs)`` and what it implies."""

    fn: Callable
    #: ``fn`` returns the logarithm of the features
    log: bool
    #: the features are >= 0 for every input
    nonnegative: bool
    #: the kernel of two maps of the formula is >= 0 for every pair of tokens
    kernel_nonnegative: bool


REFERENCES = {
    "elu+1": Reference(_elu_plus_one, False, True, True),
    "relu": Reference(_relu_floor, False, True, True),
    "softplus": Reference(_softplus, False, True, True),
    "squared_relu": Reference(_squared_relu, False, True, True),
    "exp": Reference(_exp, True, True, True),
    "favor+": Reference(_favor, True, True, True),
    "table": Reference(_table, True, True, True),
    "identity": Reference(_identity, False, False, False),
    # 1 + t + t^2/2 = ((1 + t)^2 + 1) / 2 > 0
    "taylor": Reference(_taylor, False, False, True),
    "rff": Reference(_rff, False, False, False),
    "t2r": Reference(_t2r, False, True, True),
    "hedgehog": Reference(_hedgehog, True, True, True),
    "dpfp": Reference(_dpfp, False, True, True),
    # (h . h')^2 / p >= 0
    "rebased": Reference(_rebased, False, False, True),
}

#: (name, constructor kwargs): every map at least once, options away from their defaults
CONFIGS = [
    ("elu+1", {"rank": 5}),
    ("relu", {"rank": 5}),
    ("relu", {"rank": 5, "floor": 0.25}),
    ("softplus", {"rank": 5}),
    ("squared_relu", {"rank": 5}),
    ("squared_relu", {"rank": 5, "floor": 0.5}),
    ("exp", {"rank": 5}),
    ("favor+", {"rank": 7, "proj_dim": 3}),
    ("favor+", {"rank": 6, "orthogonal": False}),
    ("table", {"rank": 4}),
    ("identity", {"rank": 5}),
    ("taylor", {"rank": 3}),
    ("taylor", {"rank": 10}),
    ("rff", {"rank": 6}),
    ("rff", {"rank": 5, "proj_dim": 3, "bandwidth": 2.0}),
    ("t2r", {"rank": 5}),
    ("hedgehog", {"rank": 6}),
    ("dpfp", {"rank": 6}),
    ("dpfp", {"rank": 12, "nu": 2}),
    ("dpfp", {"rank": 12, "nu": 3}),
    ("rebased", {"rank": 6}),
    ("rebased", {"rank": 10, "eps": 0.01}),
]
CONFIG_IDS = ["-".join([name] + [f"{k}={v}" for k, v in kw.items()]) for name, kw in CONFIGS]
#: how the parameters and inputs are drawn (see ``_prepare``)
REGIMES = ["random", "binary", "zero", "large", "huge"]
#: pre-activations of the "huge" regime, repeated over the encoder's outputs
HUGE = [200.0, -200.0, 30.0, -30.0, 0.0, 1.5, -0.5]


# -- helpers ------------------------------------------------------------------------------
def _assert_close(actual, expected, what, rtol=RTOL):
    """Elementwise ``|a - e| <= rtol |e| + rtol max(1, max |e|)`` (infinities equal)."""
    finite = expected[torch.isfinite(expected)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale,
                               msg=lambda m: f"{what}: {m}")


def _kwargs(name, kw):
    """Constructor kwargs of the map (``rank`` apart), with the table's vocabulary."""
    out = {k: v for k, v in kw.items() if k != "rank"}
    if name == "table":
        out["vocabulary"] = VOCAB.numpy()
    return out


def _fill(module, regime, gen, *, scale=1.0):
    """Seeded parameters of a map: normal draws, then the regime's encoder or table."""
    with torch.no_grad():
        for pname, p in module.named_parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            if regime == "large":
                if pname in ("encoder.weight", "log_table"):
                    p.copy_(30.0 * torch.randn(p.shape, generator=gen, dtype=p.dtype).sign())
                elif pname == "encoder.bias":
                    p.zero_()
            elif regime == "huge":
                if pname == "encoder.weight":
                    p.zero_()
                elif pname == "encoder.bias":
                    p.copy_(torch.tensor(HUGE, dtype=p.dtype).repeat(p.shape[0])[:p.shape[0]])
                elif pname == "log_table":
                    values = torch.tensor(HUGE + [-math.inf], dtype=p.dtype)
                    p.copy_(values.repeat(p.numel())[:p.numel()].reshape(p.shape))


def _inputs(name, regime, gen, shape=(2, 5)):
    """Tokens of the regime: real normal draws ("random"), zeros ("zero") or bits."""
    if name == "table":
        if regime == "zero":
            return torch.zeros(shape + (N_BITS,), dtype=torch.float64)
        return VOCAB[torch.randint(0, len(VOCAB), shape, generator=gen)]
    if regime == "random":
        return torch.randn(shape + (N_BITS,), generator=gen, dtype=torch.float64)
    if regime == "zero":
        return torch.zeros(shape + (N_BITS,), dtype=torch.float64)
    return torch.randint(0, 2, shape + (N_BITS,), generator=gen).double()


def _prepare(name, kw, regime, seed=0, depth=0):
    """A float64 map with the regime's parameters, and inputs."""
    torch.manual_seed(seed)
    extra = {} if name == "table" else {"depth": depth, "width": 5}
    fm = make_feature_map(name, N_BITS, kw["rank"], **_kwargs(name, kw), **extra).double()
    gen = torch.Generator().manual_seed(seed)
    _fill(fm, regime, gen)
    return fm, _inputs(name, regime, gen)


def _value_and_grads(f, x, params, cot):
    """``f(x)`` and the gradients of ``<f(x), cot>`` w.r.t. ``x`` and ``params``."""
    x = x.clone().requires_grad_()
    out = f(x)
    grads = torch.autograd.grad((out * cot).sum(), [x, *params], allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if g is None else g
                          for g, t in zip(grads, [x, *params])]


def _compare(lib, ref, x, fm, P, cot, what, rtol=RTOL):
    """Value and gradients (input, every parameter of ``fm``) of ``lib`` and ``ref``."""
    names = [n for n, _ in fm.named_parameters()]
    out, grads = _value_and_grads(lib, x, [p for _, p in fm.named_parameters()], cot)
    exp_out, exp_grads = _value_and_grads(ref, x, [P[n] for n in names], cot)
    _assert_close(out, exp_out, f"{what} value", rtol)
    for n, g, e in zip(["input"] + names, grads, exp_grads):
        _assert_close(g, e, f"{what} gradient w.r.t. {n}", rtol)


def _leaves(module):
    """Detached float64 copies of the parameters (leaves) and buffers of ``module``."""
    P = {n: p.detach().clone().requires_grad_() for n, p in module.named_parameters()}
    B = {n: b.detach().clone() for n, b in module.named_buffers()}
    return P, B


def _check_map(fm, name, kw, x, seed=0, rtol=None):
    """``fm`` against its reference (log-domain maps: ``log_features`` and ``forward``)."""
    rtol = RTOL if rtol is None else rtol
    ref = REFERENCES[name]
    P, B = _leaves(fm)
    kwargs = dict(kw)

    def formula(t):
        return ref.fn(t, P, B, kwargs)

    gen = torch.Generator().manual_seed(seed + 1)
    cot = torch.randn(x.shape[:-1] + (kw["rank"],), generator=gen, dtype=torch.float64)
    if ref.log:
        _compare(fm.log_features, formula, x, fm, P, cot, f"{name} log_features", rtol)
        _compare(fm, lambda t: torch.exp(formula(t)), x, fm, P, cot, f"{name} features",
                 rtol)
    else:
        _compare(fm, formula, x, fm, P, cot, f"{name} features", rtol)


# -- the registry --------------------------------------------------------------------------
def test_every_registered_map_has_a_reference():
    """A map added to the registry needs a reference here (and a configuration)."""
    assert set(available_feature_maps()) == set(REFERENCES)
    assert {name for name, _ in CONFIGS} == set(REFERENCES)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_declarations_match_the_formula(name):
    cls = get_feature_map(name)
    ref = REFERENCES[name]
    assert bool(cls.log_domain) is ref.log
    assert bool(cls.nonnegative) is ref.nonnegative
    assert bool(cls.kernel_nonnegative) is ref.kernel_nonnegative
    if not ref.log:
        fm, x = _prepare(name, next(kw for n, kw in CONFIGS if n == name), "random")
        with pytest.raises(NotImplementedError):
            fm.log_features(x)


# -- each map against its formula ------------------------------------------------------------
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize(("name", "kw"), CONFIGS, ids=CONFIG_IDS)
def test_map_matches_its_formula(name, kw, regime):
    """Value and gradients at float64 (log-domain maps: ``log_features`` and
    ``forward``), on random reals, bits, all-zero tokens, pre-activations that are
    multiples of +-30 ("large") and pre-activations of +-200 ("huge")."""
    fm, x = _prepare(name, kw, regime)
    _check_map(fm, name, kw, x)


@pytest.mark.parametrize(("name", "kw"), [(n, kw) for n, kw in CONFIGS if n != "table"],
                         ids=[i for (n, _), i in zip(CONFIGS, CONFIG_IDS) if n != "table"])
def test_map_with_an_mlp_encoder_matches_its_formula(name, kw):
    """``depth=1``: the formula on ``W_2 gelu(W_1 x + b_1) + b_2``."""
    fm, x = _prepare(name, kw, "random", seed=3, depth=1)
    assert "encoder.0.weight" in dict(fm.named_parameters())
    _check_map(fm, name, kw, x, seed=3)


def test_taylor_kernel_is_the_second_order_taylor_polynomial():
    """``phi(x) . phi(y) = 1 + t + t^2 / 2`` with ``t = z(x) . z(y)``."""
    fm, x = _prepare("taylor", {"rank": 15}, "random")
    with torch.no_grad():
        phi, z = fm(x), fm.encoder(x)
    t = z @ z.transpose(-1, -2)
    _assert_close(phi @ phi.transpose(-1, -2), 1 + t + t * t / 2, "taylor kernel",
                  4 * RTOL)


def test_rebased_kernel_is_a_scaled_square():
    """``phi(x) . phi(y) = (h . h')^2 / p``."""
    fm, x = _prepare("rebased", {"rank": 10}, "random")
    P, _ = _leaves(fm)
    with torch.no_grad():
        phi, z = fm(x), _encode(x, P)
        mean = z.mean(-1, keepdim=True)
        var = ((z - mean) ** 2).mean(-1, keepdim=True)
        h = P["gamma"] * (z - mean) / torch.sqrt(var + 1e-5) + P["beta"]
    _assert_close(phi @ phi.transpose(-1, -2), (h @ h.transpose(-1, -2)) ** 2 / 4,
                  "rebased kernel")


@pytest.mark.parametrize("nu", [1, 2, 3])
def test_dpfp_kernel_is_that_of_the_paper(nu):
    """``sum_j sum_i y_i y_{i+j} y'_i y'_{i+j}`` (indices mod ``2p``), the paper's
    indexing: the library's order of the products leaves the kernel unchanged."""
    fm, x = _prepare("dpfp", {"rank": 8 * nu, "nu": nu}, "random")
    with torch.no_grad():
        phi, z = fm(x), fm.encoder(x)
    y = torch.cat([z.clamp(min=0), (-z).clamp(min=0)], -1)
    n = y.shape[-1]
    feats = torch.cat([y * y[..., [(i + j) % n for i in range(n)]]
                       for j in range(1, nu + 1)], -1)
    _assert_close(phi @ phi.transpose(-1, -2), feats @ feats.transpose(-1, -2),
                  "dpfp kernel")


def test_elu_plus_one_is_positive_with_relative_precision():
    """``elu(z) + 1 = exp(z) > 0`` for ``z <= 0``, to relative precision."""
    fm, _ = _prepare("elu+1", {"rank": 4}, "random")
    with torch.no_grad():
        fm.encoder.weight.zero_()
        fm.encoder.bias.copy_(torch.tensor([-5.0, -30.0, -50.0, -200.0]))
        out = fm(torch.zeros(1, N_BITS, dtype=torch.float64))
    torch.testing.assert_close(out[0], torch.exp(fm.encoder.bias.detach()), rtol=RTOL, atol=0)


# -- the random features' distributions -----------------------------------------------------
@pytest.mark.parametrize("name, kw", [("taylor", {"rank": 10}), ("rff", {"rank": 6})])
def test_float64_copy_keeps_the_exact_constants(name, kw):
    """A map built (in float32) then copied to float64 is the formula to float64
    precision."""
    fm, x = _prepare(name, kw, "random")
    _check_map(fm, name, kw, x, rtol=RTOL)


@pytest.mark.parametrize("orthogonal", [True, False])
def test_favor_directions_have_the_second_moment_of_gaussians(orthogonal):
    """``E[w w^T] = I`` over the directions (seeded, 8192 rows, within 0.1); with
    ``orthogonal=True`` they are orthogonal within each block of ``proj_dim`` rows."""
    torch.manual_seed(0)
    p, m = 3, 8192
    D = make_feature_map("favor+", 1, m, proj_dim=p, orthogonal=orthogonal).double().directions
    torch.testing.assert_close(D.T @ D / m, torch.eye(p, dtype=torch.float64), rtol=0,
                               atol=0.1)
    if orthogonal:
        for start in range(0, m, p):
            gram = D[start:start + p] @ D[start:start + p].T
            off = gram - torch.diag(torch.diagonal(gram))
            assert off.abs().max() <= 1e-6 * gram.diagonal().max()


def _features_of_projections(fm, hs):
    """The features of ``fm`` at the projections ``h`` (rows of ``hs``): its linear
    encoder set to the constant ``h``, one row per ``h``."""
    with torch.no_grad():
        fm.encoder.weight.zero_()
        phi = []
        for h in hs:
            fm.encoder.bias.copy_(h)
            phi.append(fm(torch.zeros(1, 1, dtype=torch.float64))[0])
    return torch.stack(phi)


def _favor_kernel_estimate(orthogonal, hs, m=8192):
    """``phi(h) . phi(h')`` of one seeded ``favor+`` map of ``m`` features, for the rows
    ``h`` of ``hs``."""
    torch.manual_seed(0)
    fm = make_feature_map("favor+", 1, m, proj_dim=hs.shape[1],
                          orthogonal=orthogonal).double()
    phi = _features_of_projections(fm, hs)
    return phi @ phi.T


@pytest.mark.parametrize("orthogonal", [True, False])
def test_favor_features_estimate_the_softmax_kernel(orthogonal):
    """``E[phi(h) . phi(h')] = exp(h . h')`` over the random directions (Choromanski
    et al. 2021, Lemma 1 and the orthogonal random features of section 2.4): one
    seeded draw of 8192 features is within 6 %, 5 standard deviations."""
    hs = torch.tensor([[0.5, 0.0, 0.0], [0.3, 0.4, 0.0], [0.0, -0.3, 0.4]],
                      dtype=torch.float64)
    torch.testing.assert_close(_favor_kernel_estimate(orthogonal, hs),
                               torch.exp(hs @ hs.T), rtol=0.06, atol=0)


def test_rff_features_estimate_the_gaussian_kernel():
    """``E[phi(h) . phi(h')] = exp(-|h - h'|^2 / (2 bandwidth^2))`` over the random
    directions and phases (seeded, 8192 features, within 0.05), phases uniform on
    ``[0, 2 pi)``."""
    torch.manual_seed(0)
    fm = make_feature_map("rff", 1, 8192, proj_dim=3, bandwidth=2.0).double()
    hs = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 1.0], [3.0, 1.0, -1.0]],
                      dtype=torch.float64)
    phi = _features_of_projections(fm, hs)
    expected = torch.exp(-torch.cdist(hs, hs) ** 2 / (2 * 2.0 ** 2))
    torch.testing.assert_close(phi @ phi.T, expected, rtol=0, atol=0.05)
    # the phases are uniform on [0, 2 pi): in range, each half of it about half of them
    b = fm.phases
    assert 0 <= float(b.min()) and float(b.max()) < 2 * math.pi
    assert abs(float((b > math.pi).double().mean()) - 0.5) < 0.03


# -- attention computed with the features ---------------------------------------------------
def _sub(d, prefix):
    return {k[len(prefix):]: v for k, v in d.items() if k.startswith(prefix)}


def _reference_head(x, P, B, name, kw, eps=1e-3):
    """Normalised kernel attention with the affine value map and readout, from the
    formulas: ``y_i = <w(x_i), sum_j a_ij v(x_j) / sum_j a_ij> + b(x_i)`` with
    ``a_ij = phi_Q(x_i) . phi_K(x_j)``. Log-domain maps: ``log a_ij =
    logsumexp_k(lq_ik + lk_jk)`` and the weights are their softmax over ``j`` (the
    normalisation, without any shift to cancel). Zero denominators of nonnegative
    kernels are divided as 1; signed ones as ``sign(den) max(|den|, eps)``."""
    ref = REFERENCES[name]
    fq = ref.fn(x, _sub(P, "query_features."), _sub(B, "query_features."), kw)
    fk = ref.fn(x, _sub(P, "key_features."), _sub(B, "key_features."), kw)
    v = x @ P["value.linear.weight"].T + P["value.linear.bias"]
    w = x @ P["readout.query_weight.weight"].T + P["readout.query_weight.bias"]
    b = (x @ P["readout.query_bias.weight"].T + P["readout.query_bias.bias"])[..., 0]
    if ref.log:
        s = fq[..., :, None, :] + fk[..., None, :, :]
        m = s.amax(-1, keepdim=True).detach()
        log_a = (m + torch.log(torch.exp(s - m).sum(-1, keepdim=True)))[..., 0]
        mj = log_a.amax(-1, keepdim=True).detach()
        e = torch.exp(log_a - mj)
        u = (e / e.sum(-1, keepdim=True)) @ v
    else:
        a = fq @ fk.transpose(-1, -2)
        den = a.sum(-1, keepdim=True)
        if ref.kernel_nonnegative:
            den = torch.where(den > 0, den, torch.ones_like(den))
        else:
            sign = torch.where(den < 0, -torch.ones_like(den), torch.ones_like(den))
            den = sign * torch.clamp(den.abs(), min=eps)
        u = (a @ v) / den
    return (w * u).sum(-1) + b


def _head(name, kw, seed, *, scale=0.5, rank=None):
    """A float64 kernel head with seeded parameters (its feature maps' ``scale``)."""
    torch.manual_seed(seed)
    head = KernelAttentionHead(N_BITS, kw["rank"] if rank is None else rank,
                               feature_map=name, feature_kwargs=_kwargs(name, kw)).double()
    gen = torch.Generator().manual_seed(seed)
    _fill(head, "random", gen, scale=0.5)
    with torch.no_grad():
        for pname, p in head.named_parameters():
            if pname.startswith(("query_features.", "key_features.")):
                p.mul_(scale / 0.5)
    return head


@pytest.mark.parametrize("seq_len", [3, 12])
@pytest.mark.parametrize("scale", [0.5, 5.0])
@pytest.mark.parametrize(("name", "kw"), CONFIGS, ids=CONFIG_IDS)
def test_kernel_head_is_reference_attention(name, kw, scale, seq_len):
    """The head's output and gradients (input, every parameter) equal normalised
    attention with the reference features, on bits: the short form (``N = 3``) and
    the sketch (``N = 12``); log-domain maps at a scale of the maps whose features
    span hundreds of orders of magnitude (the head's shift cancels exactly)."""
    head = _head(name, kw, seed=1, scale=scale)
    gen = torch.Generator().manual_seed(2)
    x = _inputs(name, "binary", gen, shape=(3, seq_len))
    P, B = _leaves(head)
    cot = torch.randn(x.shape[:-1], generator=gen, dtype=torch.float64)
    _compare(head, lambda t: _reference_head(t, P, B, name, kw), x, head, P, cot,
             f"{name} head", HEAD_RTOL)


LOG_DOMAIN = [(n, kw) for n, kw in CONFIGS if REFERENCES[n].log]


@pytest.mark.parametrize(("name", "kw"), LOG_DOMAIN, ids=[
    i for (n, _), i in zip(CONFIGS, CONFIG_IDS) if REFERENCES[n].log])
def test_log_domain_head_shift_cancels_beyond_the_float64_range(name, kw):
    """Log-features whose kernel terms ``exp(lq + lk)`` overflow or underflow float64:
    the head's shifted exponentials still give exactly normalised attention."""
    head = _head(name, kw, seed=1, scale=200.0)
    gen = torch.Generator().manual_seed(2)
    x = _inputs(name, "binary", gen, shape=(3, 3))
    P, B = _leaves(head)
    with torch.no_grad():
        lq = REFERENCES[name].fn(x, _sub(P, "query_features."), _sub(B, "query_features."), kw)
        lk = REFERENCES[name].fn(x, _sub(P, "key_features."), _sub(B, "key_features."), kw)
    terms = lq[..., :, None, :] + lk[..., None, :, :]
    assert float(terms.abs().max()) > 800  # exp of it is 0 or inf in float64
    cot = torch.randn(x.shape[:-1], generator=gen, dtype=torch.float64)
    _compare(head, lambda t: _reference_head(t, P, B, name, kw), x, head, P, cot,
             f"{name} head", HEAD_RTOL)


@pytest.mark.parametrize(("name", "kw"), CONFIGS, ids=CONFIG_IDS)
def test_kernel_min_is_the_smallest_reference_kernel_value(name, kw):
    head = _head(name, kw, seed=4, scale=2.0)
    tokens = VOCAB if name == "table" else torch.tensor(
        list(itertools.product([0.0, 1.0], repeat=N_BITS)), dtype=torch.float64)
    P, B = _leaves(head)
    ref = REFERENCES[name]
    with torch.no_grad():
        fq = ref.fn(tokens, _sub(P, "query_features."), _sub(B, "query_features."), kw)
        fk = ref.fn(tokens, _sub(P, "key_features."), _sub(B, "key_features."), kw)
        if ref.log:
            alpha = torch.exp(fq[:, None, :] + fk[None, :, :]).sum(-1)
        else:
            alpha = fq @ fk.T
    rtol = 4 * RTOL
    assert head.kernel_min(tokens.numpy()) == pytest.approx(
        float(alpha.min()), rel=rtol, abs=rtol * float(alpha.abs().max()))


FUSED = [(n, kw) for n, kw in CONFIGS if get_feature_map(n).fused is not None]


def _stack_inputs(name, path, gen):
    """Bits whose tokens repeat little (per-position path) or a lot (pair path)."""
    if path == "fused-positions":
        tokens = VOCAB if name == "table" else torch.tensor(
            list(itertools.product([0.0, 1.0], repeat=N_BITS)), dtype=torch.float64)
        return tokens[torch.randperm(len(tokens), generator=gen)[:6]].reshape(2, 3, N_BITS)
    few = VOCAB[[0, 2, 5]]
    return few[torch.randint(0, len(few), (20, 3), generator=gen)]


def test_fused_maps_are_the_maps_with_a_fused_form():
    """The maps below are exactly those that declare a batched form."""
    declared = {n for n in available_feature_maps() if get_feature_map(n).fused is not None}
    assert {n for n, _ in FUSED} == declared


@pytest.mark.parametrize("path", ["fused-positions", "fused-pairs"])
@pytest.mark.parametrize("scale", [0.5, 5.0])
@pytest.mark.parametrize(("name", "kw"), FUSED, ids=[
    i for (n, _), i in zip(CONFIGS, CONFIG_IDS) if get_feature_map(n).fused is not None])
def test_head_ensemble_fused_path_is_reference_attention(name, kw, scale, path):
    """The fused forward evaluates every member's maps itself, from the stacked
    parameters: each member's output is reference attention with its own parameters,
    and the gradient w.r.t. the stacked parameters is each member's reference gradient
    (zero in the padding of the smaller ranks)."""
    ranks = [kw["rank"], kw["rank"] - 1, kw["rank"]]
    heads = [_head(name, kw, seed=10 + i, scale=scale, rank=r) for i, r in enumerate(ranks)]
    ens = HeadEnsemble(heads)
    gen = torch.Generator().manual_seed(5)
    x = _stack_inputs(name, path, gen)
    cot = torch.randn((len(heads),) + x.shape[:-1], generator=gen, dtype=torch.float64)
    out = ens(x)
    assert ens.path == path, ens.path_reason
    grads = torch.autograd.grad((out * cot).sum(), list(ens.params))
    shapes = dict(zip(ens.names, (p.shape[1:] for p in ens.params)))
    expected_grads = {n: [] for n in ens.names}
    for i, head in enumerate(heads):
        P, B = _leaves(head)
        y = _reference_head(x, P, B, name, {**kw, "rank": ranks[i]})
        _assert_close(out[i].detach(), y.detach(), f"{name} member {i} output", HEAD_RTOL)
        g = torch.autograd.grad((y * cot[i]).sum(), [P[n] for n in ens.names],
                                allow_unused=True)
        for n, gi in zip(ens.names, g):
            gi = torch.zeros_like(P[n]) if gi is None else gi
            padded = gi.new_zeros(shapes[n])
            padded[tuple(slice(0, s) for s in gi.shape)] = gi
            expected_grads[n].append(padded)
    for n, g in zip(ens.names, grads):
        _assert_close(g, torch.stack(expected_grads[n]), f"{name} gradient w.r.t. {n}",
                      HEAD_RTOL)


# -- the maps' contracts: validation, messages, declarations, state ------------------------
def test_kernel_declaration_defaults_to_the_class_own_feature_sign():
    """A subclass that declares ``nonnegative`` but not ``kernel_nonnegative`` gets its
    own ``nonnegative`` as its kernel declaration; one that declares both keeps both, and
    one that declares neither inherits both from its parent."""
    signed = type("SignedMap", (FeatureMap,), {"nonnegative": False})
    assert signed.kernel_nonnegative is False
    positive = type("PositiveIdentity", (get_feature_map("identity"),), {"nonnegative": True})
    assert positive.kernel_nonnegative is True
    both = type("SignedPositiveKernel", (FeatureMap,),
                {"nonnegative": False, "kernel_nonnegative": True})
    assert (both.nonnegative, both.kernel_nonnegative) == (False, True)
    taylor_child = type("TaylorChild", (get_feature_map("taylor"),), {})
    assert (taylor_child.nonnegative, taylor_child.kernel_nonnegative) == (False, True)
    identity_child = type("IdentityChild", (get_feature_map("identity"),), {})
    assert (identity_child.nonnegative, identity_child.kernel_nonnegative) == (False, False)


def test_map_keeps_its_sizes_and_the_default_encoder_width():
    """``n_bits`` and ``rank`` are kept (and shown by ``repr``); an MLP encoder
    (``depth >= 1``) has hidden layers of width 64 unless ``width`` is given."""
    fm = make_feature_map("softplus", N_BITS, 3, depth=1)
    assert (fm.n_bits, fm.rank) == (N_BITS, 3)
    assert "name='softplus', n_bits=4, rank=3" in repr(fm)
    assert [m.out_features for m in fm.encoder if isinstance(m, torch.nn.Linear)] == [64, 3]
    assert fm(torch.zeros(2, N_BITS)).shape == (2, 3)
    user = UserFeatureMap(6, 4, factory=torch.nn.Linear)
    assert (user.n_bits, user.rank) == (6, 4)
    table = make_feature_map("table", N_BITS, 3, vocabulary=VOCAB.numpy())
    assert (table.n_bits, table.rank) == (N_BITS, 3)


def test_log_features_of_a_map_outside_the_log_domain_raise_naming_the_class():
    fm = make_feature_map("softplus", N_BITS, 3)
    with pytest.raises(NotImplementedError, match=r"^Softplus is not a log-domain map$"):
        fm.log_features(torch.zeros(2, N_BITS))


class _NanOnFirstBit(torch.nn.Module):
    """Features ``[nan if x_0 > 0 else 0, 0, ..., 0]``: NaN on the tokens whose first
    bit is set, in the first feature only."""

    def __init__(self, n_bits, rank):
        super().__init__()
        self.rank = rank

    def forward(self, x):
        first = torch.where(x[..., :1] > 0, math.nan, 0.0)
        return torch.cat([first, torch.zeros(x.shape[:-1] + (self.rank - 1,))], -1)


def test_feature_check_messages_name_the_map_and_count_the_tokens():
    """A wrong shape names the map, the shapes in words and the expected shape; NaN
    features name the map and count the tokens (not the features) that have one."""
    short = make_feature_map(lambda n_bits, rank: torch.nn.Linear(n_bits, rank - 1), 6, 3)
    expected = ("feature_map='my map' must map tokens of shape (n_tokens, n_bits) to "
                "features of shape (n_tokens, rank) = (5, 3); got shape (5, 2).")
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        check_feature_map_output(short, torch.zeros(5, 6), "my map")
    nan_map = make_feature_map(_NanOnFirstBit, N_BITS, 3)
    x = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]])
    expected = "feature_map='nan map' returns NaN features on 2 of the 5 training tokens."
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        check_feature_map_output(nan_map, x, "nan map")


def test_feature_check_reads_the_log_features_of_a_log_domain_map():
    """A log-domain map is checked on what it defines, its ``log_features``: a registered
    one passes, and log-features that are not a tensor are named as such."""
    assert check_feature_map_output(make_feature_map("exp", N_BITS, 3),
                                    torch.zeros(5, N_BITS), "exp") is None

    class ArrayLogFeatures(FeatureMap):
        log_domain = True

        def log_features(self, x):
            return np.zeros((len(x), self.rank))

    with pytest.raises(ValueError, match=r"^feature_map='arrays' must return a torch\.Tensor "
                                         r"of features; got ndarray\.$"):
        check_feature_map_output(ArrayLogFeatures(N_BITS, 3), torch.zeros(5, N_BITS), "arrays")


def test_favor_directions_are_orthogonal_blocks_by_default():
    """``orthogonal=True`` is the default: rows within each block of ``proj_dim`` are
    orthogonal."""
    torch.manual_seed(0)
    D = make_feature_map("favor+", 1, 7, proj_dim=3).double().directions
    for start in range(0, 7, 3):
        gram = D[start:start + 3] @ D[start:start + 3].T
        off = gram - torch.diag(torch.diagonal(gram))
        assert off.abs().max() <= 1e-6 * gram.diagonal().max()


@pytest.mark.parametrize("shape", [(3, N_BITS + 1), (N_BITS,), (0, N_BITS)])
def test_table_vocabulary_of_another_shape_is_refused(shape):
    """The vocabulary must be a non-empty ``(n_tokens, n_bits)`` array."""
    expected = f"vocabulary must have shape (n_tokens>=1, {N_BITS}); got {shape}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        make_feature_map("table", N_BITS, 3, vocabulary=np.zeros(shape))


def test_table_of_one_token():
    fm = make_feature_map("table", N_BITS, 3, vocabulary=VOCAB[:1].numpy())
    assert fm.log_features(VOCAB[:1].float()).shape == (1, 3)


@pytest.mark.parametrize("vocabulary", [VOCAB.numpy(), VOCAB.int().tolist()],
                         ids=["float64-array", "int-lists"])
def test_table_vocabulary_is_stored_in_the_module_dtype(vocabulary):
    """The vocabulary buffer is float32, as the module is when built, whatever the
    array type it was given in; ``.double()`` then converts it with the table."""
    fm = make_feature_map("table", N_BITS, 3, vocabulary=vocabulary)
    assert fm.vocabulary.dtype == fm.log_table.dtype == torch.float32
    assert fm.double().vocabulary.dtype == torch.float64
    torch.testing.assert_close(fm.vocabulary, VOCAB)


@pytest.mark.parametrize("init_scale", [None, 0.5])
def test_table_initial_log_features_have_the_init_scale(init_scale):
    """The initial log-features are normal with standard deviation ``init_scale``
    (default 0.1): 4000 seeded draws, within 5 %."""
    torch.manual_seed(0)
    kw = {} if init_scale is None else {"init_scale": init_scale}
    fm = make_feature_map("table", N_BITS, 4000, vocabulary=VOCAB[:1].numpy(), **kw)
    scale = 0.1 if init_scale is None else init_scale
    table = fm.log_table.detach().double()
    assert abs(float(table.std()) / scale - 1) < 0.05
    assert abs(float(table.mean())) < 0.1 * scale


def test_table_refuses_a_token_outside_its_vocabulary():
    fm = make_feature_map("table", N_BITS, 3, vocabulary=VOCAB.numpy())
    expected = ("feature_map='table' got token(s) not seen in fit; a table map is defined "
                "only on its vocabulary of training tokens.")
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        fm(torch.tensor([[0.0, 0.0, 0.0, 1.0]]))


def test_taylor_rank_not_of_the_form_lists_the_nearest_valid_ranks():
    expected = ("feature_map='taylor' has rank 1 + p + p(p+1)/2 for a projection of "
                "dimension p >= 1; rank=7 is not of this form (nearest valid ranks: 6 with "
                "proj_dim=2, 10 with proj_dim=3).")
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        make_feature_map("taylor", N_BITS, 7)


def test_taylor_explicit_proj_dim_must_agree_with_the_rank():
    assert make_feature_map("taylor", N_BITS, 6, proj_dim=2).proj_dim == 2
    expected = ("feature_map='taylor' with proj_dim=3 has rank 10, not rank=6; leave "
                "proj_dim=None to derive it from rank.")
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        make_feature_map("taylor", N_BITS, 6, proj_dim=3)


def test_constants_derived_from_the_rank_are_not_saved():
    """A map's state dict holds what it learned or drew, not what its rank determines:
    ``taylor`` saves its encoder only, ``rff`` its encoder, directions and phases."""
    taylor = make_feature_map("taylor", N_BITS, 6)
    assert set(taylor.state_dict()) == {"encoder.weight", "encoder.bias"}
    rff = make_feature_map("rff", N_BITS, 6)
    assert set(rff.state_dict()) == {"encoder.weight", "encoder.bias", "directions", "phases"}


def test_rff_default_bandwidth_is_one():
    """``w_k ~ N(0, I / bandwidth^2)`` with ``bandwidth=1`` by default: 4000 seeded
    draws have standard deviation 1 within 5 %."""
    torch.manual_seed(0)
    fm = make_feature_map("rff", N_BITS, 4000, proj_dim=1)
    assert fm.bandwidth == 1.0
    assert abs(float(fm.directions.double().std()) - 1.0) < 0.05
