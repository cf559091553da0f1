"""Torch modules: feature maps agree with their advertised rank and sign; the sketch
form of kernel attention equals the explicit quadratic form."""

import numpy as np
import pytest
import torch

from minip_learn.nn import (
    AffineReadout,
    KernelAttentionHead,
    SoftmaxAttentionHead,
    ValueMap,
    available_feature_maps,
    get_feature_map,
    make_feature_map,
    ops,
)

ALL_TOKENS_4 = torch.tensor(
    [[(i >> b) & 1 for b in range(4)] for i in range(16)], dtype=torch.float64)


def _kwargs(name):
    return {"vocabulary": ALL_TOKENS_4} if get_feature_map(name).requires_vocabulary else {}


def test_registry_lists_required_maps():
    assert set(available_feature_maps()) >= {
        "elu+1", "relu", "softplus", "exp", "squared_relu", "favor+", "table"}
    # the signed maps (outside the theorem, see docs/theory.rst, theory-r7) are flagged as such
    signed = {"identity", "rff", "taylor", "rebased"}
    assert set(available_feature_maps(nonnegative=False)) == signed
    assert set(available_feature_maps(nonnegative=True)) == set(available_feature_maps()) - signed


def test_unknown_map_lists_valid_names():
    with pytest.raises(ValueError, match="valid names are.*elu\\+1"):
        get_feature_map("cosine")


@pytest.mark.parametrize("name", available_feature_maps())
@pytest.mark.parametrize("rank", [1, 5, 33])
@pytest.mark.parametrize("depth", [0, 2])
def test_feature_map_rank_and_nonnegativity(name, rank, depth, valid_rank):
    rank = valid_rank(name, rank)
    torch.manual_seed(0)
    fmap = make_feature_map(name, 4, rank, **_kwargs(name),
                            **({} if name == "table" else {"depth": depth, "width": 8}))
    fmap.double()
    x = ALL_TOKENS_4[torch.randint(0, 16, (7, 3))]
    phi = fmap(x)
    assert phi.shape == (7, 3, rank) == (7, 3, fmap.rank)
    if fmap.nonnegative:
        assert (phi >= 0).all()
    # (signed maps may be >= 0 on a sample; tests/estimators/test_beyond.py checks their signs)
    assert torch.isfinite(phi).all()


def _explicit_attention(head, x):
    """Naive quadratic normalised kernel attention from the same feature maps."""
    phi_q = head.query_features(x)
    phi_k = head.key_features(x)
    alpha = torch.einsum("bir,bjr->bij", phi_q, phi_k)
    den = alpha.sum(-1, keepdim=True)
    # a query that sees no key (all kernel values 0, e.g. t2r) attends to nothing: u = 0
    u = torch.einsum("bij,bjd->bid", alpha, head.value(x)) / torch.where(den == 0, 1, den)
    return head.readout(x, u)


@pytest.mark.parametrize("name", available_feature_maps())
@pytest.mark.parametrize("seq_len", [1, 2, 3, 7])
@pytest.mark.parametrize("rank", [1, 6])
def test_sketch_equals_explicit_quadratic_form(name, seq_len, rank, valid_rank):
    rank = valid_rank(name, rank)
    torch.manual_seed(1)
    head = KernelAttentionHead(4, rank, feature_map=name, value_dim=5,
                               feature_kwargs=_kwargs(name)).double()
    x = ALL_TOKENS_4[torch.randint(0, 16, (11, seq_len))]
    torch.testing.assert_close(head(x), _explicit_attention(head, x))
    # and the explicit normalised matrix the head exposes agrees too
    u = head.attention_weights(x) @ head.value(x)
    torch.testing.assert_close(head(x), head.readout(x, u))


@pytest.mark.parametrize("name", ["elu+1", "exp", "table"])
def test_short_sequence_form_equals_sketch(name):
    # N = 3 takes the explicit-kernel form in attend(); compare it with the sketch
    torch.manual_seed(2)
    head = KernelAttentionHead(4, 8, feature_map=name, value_dim=5,
                               feature_kwargs=_kwargs(name)).double()
    x = ALL_TOKENS_4[torch.randint(0, 16, (13, 3))]
    phi_q, phi_k = head.features(x)
    S, s = head.sketch(phi_k, head.value(x))
    u = (phi_q @ S) / (phi_q * s.unsqueeze(-2)).sum(-1, keepdim=True)
    assert ops.is_short(3, 8, 5)  # the short form is the one attend() takes here
    torch.testing.assert_close(head.attend(x), u)


def test_log_domain_maps_do_not_overflow():
    torch.manual_seed(0)
    head = KernelAttentionHead(256, 8, feature_map="exp")
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(100.0)
    x = (torch.rand(4, 3, 256) < 0.5).float()
    assert torch.isfinite(head(x)).all()


def test_zero_features_do_not_give_nan():
    head = KernelAttentionHead(4, 2, feature_map="relu", feature_kwargs={"floor": 0.0})
    with torch.no_grad():
        for fm in (head.query_features, head.key_features):
            fm.encoder.weight.zero_()
            fm.encoder.bias.fill_(-1.0)  # relu(-1) = 0: every feature vanishes
    out = head(torch.zeros(2, 3, 4))
    assert torch.isfinite(out).all()


def test_table_rejects_unseen_token():
    head = KernelAttentionHead(4, 2, feature_map="table",
                               feature_kwargs={"vocabulary": ALL_TOKENS_4[:3]})
    with pytest.raises(ValueError, match="not seen in fit"):
        head(ALL_TOKENS_4[None, 3:6].float())


def test_table_looks_up_the_same_input_once(monkeypatch):
    # full-batch training passes the same tensor every epoch: one lookup (and no
    # host read of its check); a new tensor, an in-place change or another
    # vocabulary is looked up again, and an unseen token is refused every time
    import copy
    import pickle

    table = make_feature_map("table", 4, 2, vocabulary=ALL_TOKENS_4[:5])
    lookups = []
    real = type(table)._lookup
    monkeypatch.setattr(type(table), "_lookup",
                        lambda self, x: lookups.append(1) or real(self, x))
    x = ALL_TOKENS_4[[3, 1, 4, 1]].float()
    first = table.log_features(x)
    torch.testing.assert_close(table.log_features(x), first)
    torch.testing.assert_close(table.log_features(x[-1]), table.log_table[1])
    torch.testing.assert_close(table.log_features(x[-1]), table.log_table[1])
    assert len(lookups) == 2  # the input and its last token
    torch.testing.assert_close(first, table.log_table[[3, 1, 4, 1]])
    x[0] = ALL_TOKENS_4[2]  # in place: looked up again
    torch.testing.assert_close(table.log_features(x)[0], table.log_table[2])
    table.log_features(x.clone())
    table.vocabulary = ALL_TOKENS_4[:5].clone()
    table.log_features(x)
    assert len(lookups) == 5
    for copied in (pickle.loads(pickle.dumps(table)), copy.deepcopy(table)):
        assert copied._index_cache is None
    with pytest.raises(ValueError, match="not seen in fit"):
        table.log_features(ALL_TOKENS_4[[3, 9]].float())
    table.log_features(x)
    with pytest.raises(ValueError, match="not seen in fit"):
        table.log_features(ALL_TOKENS_4[[3, 9]].float())
    with torch.inference_mode():  # inference tensors have no version counter
        z = ALL_TOKENS_4[[3, 1]].float()
        torch.testing.assert_close(table.log_features(z), table.log_table[[3, 1]])


def test_softmax_head_shapes_and_rows_sum_to_one():
    torch.manual_seed(0)
    head = SoftmaxAttentionHead(4, score_dim=3, value_dim=6, temperature=0.5)
    x = ALL_TOKENS_4[torch.randint(0, 16, (5, 4))].float()
    assert head(x).shape == (5, 4)
    w = head.attention_weights(x)
    torch.testing.assert_close(w.sum(-1), torch.ones(5, 4))


@pytest.mark.parametrize("head", [
    KernelAttentionHead(4, 3, feature_map="elu+1"),
    SoftmaxAttentionHead(4),
])
def test_heads_are_permutation_equivariant(head):
    torch.manual_seed(0)
    x = ALL_TOKENS_4[torch.randint(0, 16, (3, 5))].float()
    perm = torch.randperm(5)
    torch.testing.assert_close(head(x)[:, perm], head(x[:, perm]))


def test_kernel_matrix_matches_attention():
    torch.manual_seed(0)
    head = KernelAttentionHead(4, 3, feature_map="exp").double()
    x = ALL_TOKENS_4[[1, 5, 9]]
    K = head.kernel(x, x)
    w = head.attention_weights(x[None])[0]
    torch.testing.assert_close(K / K.sum(-1, keepdim=True), w)
    assert (K >= 0).all() and np.isfinite(K.detach().numpy()).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(readout="relu"), "readout must be one of"),
    (dict(n_heads=0), "n_heads must be >= 1"),
    (dict(n_layers=1.5), "n_layers must be an integer"),
    (dict(rank=True), "rank must be an integer"),
])
def test_model_arguments_are_checked(kwargs, match):
    from minip_learn.nn import KernelAttentionModel

    with pytest.raises(ValueError, match=match):
        KernelAttentionModel(6, **{"rank": 2, **kwargs})


def _multiset(n, seq_len, n_distinct, seed):
    """A family of ``n`` sequences over ``n_distinct`` tokens of ALL_TOKENS_4, in
    multiset form: (family, slot tokens, counts, materialised sequences)."""
    from minip_learn.compact import CompactFamily

    g = torch.Generator().manual_seed(seed)
    vocab = ALL_TOKENS_4[torch.randperm(16, generator=g)[:n_distinct]]
    x = vocab[torch.randint(0, n_distinct, (n, seq_len), generator=g)]
    x[0] = x[0, :1]  # one token only: padding in every other slot
    fam = CompactFamily.from_sequences(x.numpy().astype(np.uint8))
    as_t = lambda a: torch.as_tensor(a, dtype=torch.float64)  # noqa: E731
    return fam, as_t(fam.slot_tokens()), as_t(fam.counts), as_t(fam.to_sequences())


@pytest.mark.parametrize("name", available_feature_maps())
@pytest.mark.parametrize("n_distinct, rank", [(3, 8), (7, 1)])  # explicit / sketch form
def test_kernel_head_reads_token_multiplicities(name, n_distinct, rank, valid_rank):
    # the output at a slot of multiplicity c is that of every position of its token in
    # the materialised sequence; a padding slot (c = 0) weighs nothing
    rank = valid_rank(name, rank)
    torch.manual_seed(3)
    head = KernelAttentionHead(4, rank, feature_map=name, value_dim=5,
                               feature_kwargs=_kwargs(name)).double()
    fam, slots, counts, seqs = _multiset(9, 25, n_distinct, seed=n_distinct)
    assert fam.padding.any()
    assert ops.is_short(fam.n_slots, rank, 5) == (n_distinct == 3)
    with torch.no_grad():
        out, ref = head(slots, counts=counts).numpy(), head(seqs).numpy()
        np.testing.assert_allclose(fam.expand(out), ref, rtol=1e-9, atol=1e-9)
        u = head.attention_weights(slots, counts) @ head.value(slots)
        torch.testing.assert_close(head.attend(slots, counts), u)


@pytest.mark.parametrize("kwargs", [dict(n_heads=2, n_layers=2, readout="mlp"),
                                    dict(n_outputs=4), dict()])
def test_model_reads_token_multiplicities(kwargs):
    from minip_learn.nn import KernelAttentionModel

    torch.manual_seed(4)
    model = KernelAttentionModel(4, 3, **kwargs).double()
    fam, slots, counts, seqs = _multiset(9, 25, 4, seed=5)
    with torch.no_grad():
        out, ref = model(slots, counts=counts), model(seqs)
    for c in range(out.shape[-1] if out.ndim == 3 else 1):
        o, r = (out[..., c], ref[..., c]) if out.ndim == 3 else (out, ref)
        np.testing.assert_allclose(fam.expand(o.numpy()), r.numpy(), rtol=1e-9, atol=1e-9)


def test_attention_multiplicities_are_optional_weights():
    # counts of ones are the plain arithmetic; weight_keys scales the key features
    g = torch.Generator().manual_seed(0)
    phi_q, phi_k = torch.rand(2, 5, 3, generator=g), torch.rand(2, 5, 3, generator=g)
    v, w, b = torch.rand(2, 5, 4, generator=g), torch.rand(2, 5, 4, generator=g), torch.rand(2, 5)
    ones = torch.ones(2, 5)
    for f in (ops.attend, lambda q, k, vv, **kw: ops.head_output(q, k, vv, w, b, **kw)):
        torch.testing.assert_close(f(phi_q, phi_k, v, nonnegative=True, counts=ones),
                                   f(phi_q, phi_k, v, nonnegative=True))
    assert ops.weight_keys(phi_k, None) is phi_k
    scores = torch.rand(2, 5, 5, generator=g)
    torch.testing.assert_close(ops.softmax_weights(scores, ones),
                               torch.softmax(scores, -1))


# -- the value map and the affine readout: their batched form's parameters ----------------
def _affine_readout_reference(x, u, weight, weight_bias, bias, bias_const):
    """``rho_x(u) = <W x + w_0, u> + <c, x> + b_0``."""
    return ((x @ weight.T + weight_bias) * u).sum(-1) + x @ bias.reshape(-1) + bias_const


def test_value_map_batched_parameters_are_its_affine_map():
    """``fused_parameters()`` gives the module's own parameters ``V`` and ``c`` of
    ``v(x) = V x + c``, under the roles ``"weight"`` and ``"bias"``."""
    vm = ValueMap(4, 3).double()
    g = torch.Generator().manual_seed(0)
    V, c = (torch.randn(s, generator=g, dtype=torch.float64) for s in [(3, 4), (3,)])
    vm.set_affine(V, c)
    roles = vm.fused_parameters()
    assert set(roles) == {"weight", "bias"}
    assert {id(p) for p in roles.values()} == {id(p) for p in vm.parameters()}
    torch.testing.assert_close(roles["weight"].detach(), V)
    torch.testing.assert_close(roles["bias"].detach(), c)
    x = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(vm(x), x @ V.T + c)


def test_affine_readout_batched_parameters_are_those_of_set_affine():
    """``fused_parameters()`` gives the module's own parameters under the roles of
    :meth:`set_affine`: ``w(x) = weight x + weight_bias`` and ``b(x) = <bias, x> +
    bias_const``; the readout is ``<w(x), u> + b(x)`` of them."""
    ro = AffineReadout(4, 3).double()
    g = torch.Generator().manual_seed(1)
    W, w0, c = (torch.randn(s, generator=g, dtype=torch.float64) for s in [(3, 4), (3,), (4,)])
    ro.set_affine(W, w0, c, -0.75)
    roles = ro.fused_parameters()
    assert set(roles) == {"weight", "weight_bias", "bias", "bias_const"}
    assert {id(p) for p in roles.values()} == {id(p) for p in ro.parameters()}
    torch.testing.assert_close(roles["weight"].detach(), W)
    torch.testing.assert_close(roles["weight_bias"].detach(), w0)
    torch.testing.assert_close(roles["bias"].detach(), c.reshape(1, 4))
    torch.testing.assert_close(roles["bias_const"].detach(),
                               torch.tensor([-0.75], dtype=torch.float64))
    x = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    u = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ro(x, u), _affine_readout_reference(
        x, u, *(roles[k].detach() for k in ["weight", "weight_bias", "bias", "bias_const"])))
