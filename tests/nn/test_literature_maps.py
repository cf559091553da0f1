"""The literature's feature maps (hedgehog, dpfp, rebased, t2r): shapes, declared
capabilities, rank validation, estimator fits, and agreement with the reference
implementations of flash-linear-attention (``fla.modules.feature_map``) when the
``fla`` extra is installed."""

import re
import warnings

import numpy as np
import pytest
import torch

from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_minip
from minip_learn.nn import KernelAttentionHead, available_feature_maps, make_feature_map

# name -> (valid ranks, feature kwargs)
VALID = {
    "t2r": ([1, 5, 8], {}),
    "hedgehog": ([2, 6, 12], {}),
    "dpfp": ([2, 6, 12], {}),
    "rebased": ([3, 6, 10, 21], {}),
}
INVALID = {
    "hedgehog": [1, 3, 7],
    "dpfp": [1, 5],
    "rebased": [1, 2, 4, 7, 20],
}
NEW = sorted(VALID)
NONNEGATIVE_FEATURES = {"t2r": True, "hedgehog": True, "dpfp": True, "rebased": False}
FUSED = {"t2r": "linear", "hedgehog": None, "dpfp": None, "rebased": None}


def _tokens(n, n_bits, seed=0):
    """Bits and real-valued points (the maps must hold their flags on any input)."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (n, n_bits), generator=g).float()
    return torch.cat([bits, 3 * torch.randn(n, n_bits, generator=g)])


def test_registered():
    assert set(NEW) <= set(available_feature_maps())
    assert set(NEW) - {"rebased"} <= set(available_feature_maps(nonnegative=True))
    assert "rebased" in available_feature_maps(nonnegative=False)


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("depth", [0, 1])
def test_reported_rank_is_output_width(name, depth):
    torch.manual_seed(0)
    for rank in VALID[name][0]:
        phi = make_feature_map(name, 6, rank, depth=depth, width=8)
        out = phi(_tokens(7, 6).reshape(2, 7, 6))
        assert phi.rank == rank
        assert out.shape == (2, 7, rank)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("nu", [1, 2, 3])
def test_dpfp_rank_is_2_proj_dim_nu(nu):
    phi = make_feature_map("dpfp", 5, 2 * 4 * nu, nu=nu)
    assert (phi.nu, phi.proj_dim, phi.encoder.out_features) == (nu, 4, 4)
    assert phi(torch.rand(3, 5)).shape == (3, 8 * nu)


@pytest.mark.parametrize("name", NEW)
def test_declared_capabilities(name):
    cls = type(make_feature_map(name, 4, VALID[name][0][-1]))
    assert cls.nonnegative is NONNEGATIVE_FEATURES[name]
    assert cls.kernel_nonnegative is True
    assert cls.requires_vocabulary is False
    assert cls.fused == FUSED[name]
    assert cls.log_domain is (name == "hedgehog")


@pytest.mark.parametrize("name", NEW)
def test_flags_hold_on_the_features_and_the_kernel(name):
    """Features >= 0 where declared; the kernel between a query map and a *different*
    key map of the same class >= 0 for every map (all four declare it)."""
    torch.manual_seed(1)
    rank = VALID[name][0][-1]
    phi_q, phi_k = make_feature_map(name, 6, rank), make_feature_map(name, 6, rank)
    with torch.no_grad():
        for p in list(phi_q.parameters()) + list(phi_k.parameters()):
            p.normal_()  # beyond the initialisation: any weights
        x, z = _tokens(50, 6, seed=2), _tokens(50, 6, seed=3)
        fq, fk = phi_q(x), phi_k(z)
    if NONNEGATIVE_FEATURES[name]:
        assert (fq >= 0).all() and (fk >= 0).all()
    else:
        assert (fq < 0).any()  # rebased: signed features ...
    assert (fq @ fk.T >= -1e-6).all()  # ... but a nonnegative kernel
    assert KernelAttentionHead(6, rank, feature_map=name).nonnegative


def test_t2r_is_relu_of_the_encoder():
    phi = make_feature_map("t2r", 5, 3)
    x = torch.randn(4, 5)
    torch.testing.assert_close(phi(x), torch.relu(phi.encoder(x)))


def test_hedgehog_log_features_are_the_log_of_the_features():
    phi = make_feature_map("hedgehog", 5, 6)
    x = 10 * torch.randn(4, 5, dtype=torch.float64)
    phi = phi.double()
    torch.testing.assert_close(phi(x), torch.exp(phi.log_features(x)))
    torch.testing.assert_close(phi(x).sum(-1), torch.ones(4, dtype=torch.float64))


def test_rebased_kernel_is_a_scaled_square():
    phi = make_feature_map("rebased", 5, 10).double()
    x, z = torch.randn(6, 5, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    def h(t):
        return torch.nn.functional.layer_norm(phi.encoder(t), (4,), phi.gamma, phi.beta,
                                              phi.eps)

    torch.testing.assert_close(phi(x) @ phi(z).T, (h(x) @ h(z).T).square() / 4)


@pytest.mark.parametrize("name", sorted(INVALID))
def test_impossible_rank_is_a_value_error(name):
    for rank in INVALID[name]:
        with pytest.raises(ValueError, match=rf"feature_map='{name}'.*rank={rank}.*nearest valid"):
            make_feature_map(name, 6, rank)


def test_dpfp_bad_nu():
    for nu in (0, 1.5, True):
        with pytest.raises(ValueError, match="nu >= 1"):
            make_feature_map("dpfp", 6, 4, nu=nu)


@pytest.fixture(scope="module")
def minip():
    return make_minip(60, seq_len=3, n_bits=6, random_state=0)


@pytest.mark.parametrize("name", NEW)
def test_fits_in_kernel_regressor(name, minip):
    X, y = minip
    rank = VALID[name][0][1]
    est = KernelAttentionRegressor(rank, feature_map=name, max_epochs=5, random_state=0)
    est.fit(X, y)
    pred = est.predict(X)
    assert pred.shape == y.shape and np.isfinite(pred).all()
    assert est.n_epochs_ == 5
    assert est.theorem_applies_  # all four maps have a nonnegative kernel


def test_dpfp_nu_through_feature_kwargs(minip):
    X, y = minip
    est = KernelAttentionRegressor(8, feature_map="dpfp", feature_kwargs={"nu": 2},
                                   max_epochs=2, random_state=0).fit(X, y)
    assert est.net_.module_.query_features.nu == 2
    with pytest.raises(ValueError, match=r"rank=6 .*nearest valid ranks: 4 .*, 8 "):
        est.set_params(rank=6).fit(X, y)


@pytest.mark.parametrize("name", sorted(INVALID))
def test_impossible_rank_in_the_regressor(name, minip):
    X, y = minip
    est = KernelAttentionRegressor(INVALID[name][-1], feature_map=name, max_epochs=1)
    with pytest.raises(ValueError, match="nearest valid ranks"):
        est.fit(X, y)


# -- the reference implementations: flash-linear-attention ------------------------------

FLA_REASON = (
    "flash-linear-attention's feature maps (fla.modules.feature_map) are not importable: "
    "install the fla extra (pip install minip-learn[fla]) to compare with them"
)


@pytest.fixture(scope="module")
def fla_maps():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Triton is not supported on current platform"
        return pytest.importorskip("fla.modules.feature_map", reason=FLA_REASON)


def _copy_linear(dst, src):
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if dst.bias is not None:
            dst.bias.copy_(src.bias)


def _match_columns(ours, theirs, atol=1e-5):
    """Permutation ``perm`` with ``ours[..., k] == theirs[..., perm[k]]`` (a bijection)."""
    a, b = ours.reshape(-1, ours.shape[-1]), theirs.reshape(-1, theirs.shape[-1])
    assert a.shape == b.shape
    dist = (a.T.unsqueeze(1) - b.T.unsqueeze(0)).abs().amax(-1)  # (ours, theirs)
    perm = dist.argmin(1)
    assert sorted(perm.tolist()) == list(range(a.shape[1])), "no one-to-one match"
    return perm


def _inputs(n_bits):
    torch.manual_seed(0)
    return torch.cat([_tokens(20, n_bits).reshape(2, 20, n_bits),
                      torch.randn(2, 20, n_bits)], dim=1)


fla_warnings = pytest.mark.filterwarnings("ignore::UserWarning")


@fla_warnings
def test_hedgehog_equals_fla(fla_maps):
    p = 6  # fla's map is square: head_dim -> head_dim (then 2 head_dim features)
    ours = make_feature_map("hedgehog", p, 2 * p)
    ref = fla_maps.HedgehogFeatureMap(head_dim=p)
    with torch.no_grad():
        ours.encoder.weight.normal_()
        ours.encoder.bias.normal_()
    _copy_linear(ref.layer, ours.encoder)
    x = _inputs(p)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)


@fla_warnings
def test_t2r_equals_fla(fla_maps):
    ours = make_feature_map("t2r", 6, 9)
    ref = fla_maps.T2RFeatureMap(head_dim=6, dot_dim=9, bias=True)
    _copy_linear(ref.layer, ours.encoder)
    x = _inputs(6)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)


@fla_warnings
@pytest.mark.parametrize("nu", [1, 2, 3])
def test_dpfp_equals_fla(fla_maps, nu):
    p = 5
    ours = make_feature_map("dpfp", 6, 2 * p * nu, nu=nu)
    ref = fla_maps.DPFPFeatureMap(head_dim=p, nu=nu)  # parameter-free: on our projection
    x = _inputs(6)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(ours.encoder(x)), atol=1e-5, rtol=1e-5)


@fla_warnings
@pytest.mark.parametrize("p", [2, 4, 6])
def test_taylor_equals_fla(fla_maps, p):
    """fla's Taylor map is parameter-free with the kernel 1 + t/sqrt(p) + t^2/(2p) of
    its input; ours is 1 + t + t^2/2 of our projection: the same features on the input
    p^(1/4) * z, in another order (each product z_j z_k stored once by both)."""
    ours = make_feature_map("taylor", 6, 1 + p + p * (p + 1) // 2)
    ref = fla_maps.TaylorFeatureMap(head_dim=p)
    x = _inputs(6)
    with torch.no_grad():
        ours_f = ours(x)
        ref_f = ref(p ** 0.25 * ours.encoder(x))
    perm = _match_columns(ours_f, ref_f)
    torch.testing.assert_close(ours_f, ref_f[..., perm], atol=1e-5, rtol=1e-5)


@fla_warnings
@pytest.mark.parametrize("p", [2, 4, 6])
def test_rebased_quadratic_equals_fla(fla_maps, p):
    """Everything after the normalisation, on CPU: fla's RebasedFeatureMap normalises
    with its Triton LayerNorm kernel, which needs a GPU driver, so fla gets the
    normalised projection and its affine ``gamma * . + beta`` path (``normalize=False``)
    with our ``gamma`` and ``beta``."""
    ours = make_feature_map("rebased", 6, p * (p + 1) // 2)
    ref = fla_maps.RebasedFeatureMap(head_dim=p, normalize=False)
    with torch.no_grad():
        ours.gamma.normal_()
        ours.beta.normal_()
        ref.gamma.copy_(ours.gamma)
        ref.beta.copy_(ours.beta)
        x = _inputs(6)
        z = ours.encoder(x)
        normalised = torch.nn.functional.layer_norm(z, (p,), eps=ours.eps)
        torch.testing.assert_close(ours(x), ref(normalised), atol=1e-5, rtol=1e-5)


@fla_warnings
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="fla's RebasedFeatureMap normalises with a Triton kernel that "
                           "needs a GPU driver; no CUDA device here")
def test_rebased_equals_fla_on_gpu(fla_maps):
    p = 6
    ours = make_feature_map("rebased", 6, p * (p + 1) // 2).cuda()
    ref = fla_maps.RebasedFeatureMap(head_dim=p).cuda()
    with torch.no_grad():
        ours.gamma.normal_()
        ours.beta.normal_()
        ref.gamma.copy_(ours.gamma)
        ref.beta.copy_(ours.beta)
        z = ours.encoder(_inputs(6).cuda())
        torch.testing.assert_close(ours.activation(z), ref(z), atol=1e-5, rtol=1e-5)


def test_match_columns_finds_a_permutation():
    a = torch.arange(12.0).reshape(3, 4)
    assert _match_columns(a, a[:, [2, 0, 3, 1]]).tolist() == [1, 3, 0, 2]


# -- the maps' contracts: rank messages and saved state -----------------------------------
RANK_MESSAGES = [
    ("hedgehog", 1, {}, "2 * proj_dim", "2 (proj_dim=1)"),
    ("hedgehog", 7, {}, "2 * proj_dim", "6 (proj_dim=3), 8 (proj_dim=4)"),
    ("dpfp", 1, {}, "2 * proj_dim * nu (nu=1)", "2 (proj_dim=1)"),
    ("dpfp", 6, {"nu": 2}, "2 * proj_dim * nu (nu=2)", "4 (proj_dim=1), 8 (proj_dim=2)"),
    ("rebased", 1, {}, "proj_dim * (proj_dim + 1) / 2 with proj_dim >= 2", "3 (proj_dim=2)"),
    ("rebased", 4, {}, "proj_dim * (proj_dim + 1) / 2 with proj_dim >= 2",
     "3 (proj_dim=2), 6 (proj_dim=3)"),
    ("rebased", 20, {}, "proj_dim * (proj_dim + 1) / 2 with proj_dim >= 2",
     "15 (proj_dim=5), 21 (proj_dim=6)"),
]


@pytest.mark.parametrize(("name", "rank", "kw", "form", "nearest"), RANK_MESSAGES,
                         ids=[f"{n}-{r}" for n, r, *_ in RANK_MESSAGES])
def test_impossible_rank_message_states_the_form_and_the_nearest_ranks(
        name, rank, kw, form, nearest):
    """The message gives the form of the valid ranks and the valid ranks next to the
    one asked for, each with its ``proj_dim`` (only the one above when none is
    below)."""
    expected = (f"feature_map={name!r} has rank {form}; rank={rank} is not of this form "
                f"(nearest valid ranks: {nearest}).")
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        make_feature_map(name, 6, rank, **kw)


def test_rebased_saves_its_parameters_not_its_pair_indices():
    """The state dict of ``rebased`` holds the encoder, ``gamma`` and ``beta``; the
    indices of the pairs ``j < k`` follow from the rank."""
    phi = make_feature_map("rebased", 6, 6)
    assert set(phi.state_dict()) == {"encoder.weight", "encoder.bias", "gamma", "beta"}
