"""HeadEnsemble's paths: fused (pairs, positions) == generic == separate heads.

The fused path runs the arithmetic of ``minip_learn.nn.attention`` with a leading member
dimension; which path an ensemble takes is read from the declarations of its modules
(``FeatureMap.fused``, ``fused_form``) and reported by ``path`` / ``path_reason``.
"""

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch

from minip_learn.nn import (
    FeatureMap,
    HeadEnsemble,
    KernelAttentionHead,
    SoftmaxAttentionHead,
    available_feature_maps,
    get_feature_map,
    ops,
)

FUSED = {"elu+1", "relu", "softplus", "squared_relu", "exp", "identity", "t2r", "table"}


def _valid_rank(name, rank, n_bits):
    """The smallest rank >= ``rank`` that the map ``name`` can have."""
    check = getattr(get_feature_map(name), "check_params", None)
    while check is not None:
        try:
            check(n_bits, rank)
            return rank
        except ValueError:
            rank += 1
    return rank


def _tokens(n, seq_len, n_bits=5, n_distinct=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    if n_distinct is None:
        return torch.randint(0, 2, (n, seq_len, n_bits), generator=g).double()
    vocab = torch.randint(0, 2, (n_distinct, n_bits), generator=g).double()
    return vocab[torch.randint(0, n_distinct, (n, seq_len), generator=g)]


def _heads(name, ranks, x, *, shared=False, dtype=torch.float64, depth=0):
    kw = {}
    if get_feature_map(name).requires_vocabulary:
        kw["vocabulary"] = np.unique(x.reshape(-1, x.shape[-1]).numpy(), axis=0)
    out = []
    for seed, r in enumerate(ranks):
        torch.manual_seed(seed)
        r = _valid_rank(name, r, x.shape[-1])
        out.append(KernelAttentionHead(x.shape[-1], r, feature_map=name, value_dim=6,
                                       shared_features=shared, feature_depth=depth,
                                       feature_width=7, feature_kwargs=kw).to(dtype))
    return out


def _check_against_heads(ens, heads, x, tol):
    """Outputs and gradients of every member equal those of its own head."""
    x = x.to(ens.params[0].dtype)
    out = ens(x)
    w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * w).sum(), list(ens.params))
    for i, head in enumerate(heads):
        ref = head(x)
        torch.testing.assert_close(out[i], ref, rtol=tol, atol=tol)
        ref_grads = torch.autograd.grad((ref * w[i]).sum(), list(head.parameters()))
        for name, g, rg in zip(ens.names, grads, ref_grads):
            torch.testing.assert_close(ens.crop(i, name, g), rg, rtol=tol, atol=tol,
                                       msg=f"member {i}, {name}")
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("ranks", [(3, 3), (2, 5)])
@pytest.mark.parametrize("name", available_feature_maps())
def test_every_path_equals_separate_heads(name, ranks, shared, dtype):
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    heads = _heads(name, ranks, _tokens(40, 3, n_distinct=6), shared=shared, dtype=dtype)
    if not get_feature_map(name).rank_maskable and len({h.rank for h in heads}) > 1:
        # maps that mix their encoder outputs cannot be zero-padded to a larger rank
        with pytest.raises(ValueError, match="cannot be stacked at different ranks"):
            HeadEnsemble(heads)
        return
    ens = HeadEnsemble(heads)
    assert (ens.path != "generic") == (name in FUSED), ens.path_reason
    inputs = {
        "fused-pairs": _tokens(40, 3, n_distinct=6),     # tokens that repeat
        "fused-positions": _tokens(9, 3, seed=1),       # tokens that hardly repeat
    }
    if name == "table":  # tokens of the vocabulary only
        inputs["fused-positions"] = _tokens(40, 3, n_distinct=6)[:3]
    outs = {}
    for path, x in inputs.items():
        outs[path] = _check_against_heads(ens, heads, x, tol)
        assert ens.path == (path if name in FUSED else "generic"), ens.path_reason
        # the generic path (each head's own forward on the stacked parameters) agrees
        torch.testing.assert_close(ens._vmap_forward(x.to(dtype)), outs[path],
                                   rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["elu+1", "exp", "identity"])
def test_fused_sketch_form_for_long_sequences(name):
    # seq_len 12 with rank 2 takes the sketch form, in the heads and in the ensemble
    heads = _heads(name, (2, 2), _tokens(5, 12))
    assert not ops.is_short(12, 2, 6)
    ens = HeadEnsemble(heads)
    _check_against_heads(ens, heads, _tokens(5, 12), 1e-9)
    assert ens.path == "fused-positions"


def test_any_leading_dimensions():
    heads = _heads("elu+1", (2, 4), _tokens(4, 3))
    ens = HeadEnsemble(heads)
    x = _tokens(12, 3).reshape(2, 6, 3, 5)
    out = ens(x)
    assert out.shape == (2, 2, 6, 3)
    for i, head in enumerate(heads):
        torch.testing.assert_close(out[i], head(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(ens(x[0, 0])[:, None, None], ens(x[:1, :1]))


def test_one_member_costs_the_plain_head():
    # one member: the head's own forward on the stack's parameters, the same numbers
    # and gradients as the head itself, for fused and unfused heads alike
    x = _tokens(30, 3)
    soft = SoftmaxAttentionHead(5).double()
    ens = HeadEnsemble([soft])
    assert ens.path == "single" and "SoftmaxAttentionHead" in ens.path_reason
    torch.testing.assert_close(ens(x)[0], soft(x), rtol=0, atol=0)
    head = _heads("elu+1", (4,), x)[0]
    ens = HeadEnsemble([head])
    out = _check_against_heads(ens, [head], x, 0)
    assert ens.path == "single" and out.shape == (1, 30, 3)
    # the template is the member: its parameters are the stack's (no swap per call),
    # also after a conversion; train/eval follows the stack
    assert all(type(p) is torch.nn.Parameter for p in ens.template.parameters())
    assert [id(p) for p in ens.parameters()] == [id(p) for p in ens.template.parameters()]
    ens.float()
    assert all(p.dtype == torch.float32 for p in ens.template.parameters())
    assert [id(p) for p in ens.parameters()] == [id(p) for p in ens.template.parameters()]
    assert [id(b) for b in ens.buffers()] == [id(b) for b in ens.template.buffers()]
    torch.testing.assert_close(ens(x.float())[0], head.float()(x.float()), rtol=0, atol=0)
    ens.eval()
    ens(x.float())
    assert not ens.template.training


def test_path_reason_names_the_module_that_cannot_fuse():
    x = _tokens(6, 3)
    mlp = HeadEnsemble(_heads("elu+1", (2, 2), x, depth=1))
    assert mlp.path == "generic"
    assert "query_features 'elu+1'" in mlp.path_reason and "MLP" in mlp.path_reason
    rff = HeadEnsemble(_heads("rff", (2, 2), x))
    assert rff.path == "generic" and "RandomFourierFeatures" in rff.path_reason
    # generic stays generic and fused stays fused: nothing changes at run time
    for ens in (mlp, rff):
        ens(x)
        assert ens.path == "generic"


def test_declarations_are_read_from_the_map_class():
    elu = get_feature_map("elu+1")(5, 3)
    assert elu.fused_form == "linear"
    assert get_feature_map("elu+1")(5, 3, depth=1).fused_form is None
    assert get_feature_map("favor+")(5, 3).fused_form is None
    assert get_feature_map("table").fused == "table"
    taylor = get_feature_map("taylor")
    assert taylor.kernel_nonnegative and not taylor.nonnegative
    assert not get_feature_map("identity").kernel_nonnegative
    assert all(get_feature_map(n).kernel_nonnegative
               for n in available_feature_maps(nonnegative=True))

    class Tanh(FeatureMap):  # a user map: signed, no fused form unless it declares one
        nonnegative = False

        def activation(self, z):
            return torch.tanh(z)

    class Tanh2(Tanh):
        fused = "linear"

    assert not Tanh.kernel_nonnegative and Tanh.fused is None
    assert Tanh(4, 2).fused_form is None and Tanh2(4, 2).fused_form == "linear"
    head = KernelAttentionHead(4, 2, feature_map=Tanh2)
    assert head.nonnegative is False and head.theorem_applies is False
    ens = HeadEnsemble([head, KernelAttentionHead(4, 2, feature_map=Tanh2)])
    x = _tokens(5, 3, n_bits=4).float()
    assert ens.path == "fused-positions"
    torch.testing.assert_close(ens(x)[0], head(x))


def test_pair_plan_is_cached_per_input():
    heads = _heads("exp", (2, 3), _tokens(40, 3, n_distinct=5))
    ens = HeadEnsemble(heads)
    x = _tokens(40, 3, n_distinct=5)
    plan = ens._pair_plan(x)
    assert plan.n_tokens == len(torch.unique(x.reshape(-1, 5), dim=0))
    assert ens._pair_plan(x) is plan
    x[0, 0] = 1 - x[0, 0]  # an in-place change makes a new plan
    assert ens._pair_plan(x) is not plan


@pytest.mark.parametrize("name", ["hedgehog", "rebased"])
def test_fit_ensemble_stacks_unmaskable_maps_one_rank_at_a_time(name):
    # members of several ranks still equal separate fits: one stack per rank
    from minip_learn import KernelAttentionRegressor
    from minip_learn.datasets import make_minip
    from minip_learn.model_selection import fit_ensemble

    X, y = make_minip(24, seq_len=3, n_bits=4, random_state=0)
    est = KernelAttentionRegressor(feature_map=name, dtype="float64", max_epochs=20,
                                   split_every=None)
    ranks = [4, 10] if name == "hedgehog" else [3, 10]
    res = fit_ensemble(est, X, y, ranks=ranks, seeds=[0])
    for member, r in zip(res.estimators, ranks):
        single = KernelAttentionRegressor(feature_map=name, dtype="float64", max_epochs=20,
                                          split_every=None, rank=r, random_state=0).fit(X, y)
        np.testing.assert_allclose(member.predict(X), single.predict(X), rtol=1e-7, atol=1e-7)


def test_pair_path_hands_kernels_below_the_float_range_to_the_position_path():
    # tokens u, a, b; rank 3 (the explicit form); log-features lq = 0, lk(a) = 0,
    # lk(u) = lk(b) = -200:
    # shifted per query token (by a), alpha(u, b) = exp(-200) underflows in float32,
    # while in the sequence (u, b, b) every key has the same weight
    vocab = torch.tensor([[0.0, 0, 1], [0, 1, 0], [1, 0, 0]])  # u, a, b
    seqs = torch.tensor([[0, 2, 2], [0, 1, 2], [1, 0, 2], [2, 1, 0]] * 3)
    x = vocab[seqs]
    head = KernelAttentionHead(3, 3, feature_map="table",
                               feature_kwargs={"vocabulary": vocab.numpy()})
    order = head.key_features.token_index(vocab[None])[0]  # table rows of u, a, b
    with torch.no_grad():
        head.query_features.log_table.zero_()
        head.key_features.log_table[order] = torch.tensor([[-200.0], [0.0], [-200.0]])
    ens = HeadEnsemble([head])
    plan = ens._pair_plan(x)
    assert plan is not None and ens._pair_forward(x, plan) is None
    out = ens(x)
    assert ens.path == "single" and "floating-point range" in ens.path_reason
    torch.testing.assert_close(out[0], head(x))
    two = HeadEnsemble([head, head])
    out = two(x)
    assert two.path == "fused-positions" and "floating-point range" in two.path_reason
    torch.testing.assert_close(out[1], head(x))
    assert torch.isfinite(out).all()


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
@pytest.mark.parametrize("mode", ["positive", "nonnegative", "signed"])
def test_pair_readout_against_dense_sums_and_gradcheck(mode):
    # the sparse pair readout and its hand-written backward against the sums written
    # out position by position, for every guard; the bias separately or in the pairs
    gen = torch.Generator().manual_seed(0)
    U, R, E = 3, 7, 2
    token_of = torch.randint(0, U, (R,), generator=gen)
    # the keys of position r form pairs (token_of[r], key): at least one key each
    counts = torch.zeros(R, U, U, dtype=torch.float64)
    counts[torch.arange(R), token_of] = torch.randint(0, 3, (R, U), generator=gen).double()
    counts[torch.arange(R), token_of, token_of] += 1
    counts = counts.reshape(R, U * U)
    rows, rows_t = counts.to_sparse_csr(), counts.T.contiguous().to_sparse_csr()
    alpha = torch.rand(E, U * U, dtype=torch.float64, generator=gen) + 0.1
    if mode == "signed":
        alpha = alpha - 0.5
    alpha.requires_grad_()
    g = torch.randn(E, U * U, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(E, U, dtype=torch.float64, generator=gen, requires_grad=True)
    opts = dict(nonnegative=mode != "signed", eps=0.05, positive=mode == "positive")

    def dense(alpha, g, b):
        den = ops.guard_denominator(alpha @ counts.T, nonnegative=mode != "signed",
                                          eps=0.05)
        return (alpha * g) @ counts.T / den + b[:, token_of]

    out = ops.pair_readout(alpha, g, b, token_of, rows, rows_t, **opts)
    torch.testing.assert_close(out, dense(alpha, g, b), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda a, gg, bb: ops.pair_readout(a, gg, bb, token_of, rows, rows_t, **opts),
        (alpha, g, b))
    if mode == "positive":  # the bias joined to the pair values of its query token
        folded = g + b.repeat_interleave(U, dim=1)
        torch.testing.assert_close(
            ops.pair_readout(alpha, folded, None, token_of, rows, rows_t, **opts),
            dense(alpha, g, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["binary", "bool", "real"])
def test_distinct_tokens_is_numpy_unique(kind):
    # the byte comparison of 0/1 rows and the fallback give np.unique(axis=0)'s rows,
    # first occurrences and inverse (the pair plan's distinct tokens)
    from minip_learn._validation import distinct_tokens

    rng = np.random.RandomState(0)
    a = {"binary": rng.randint(0, 2, (300, 6)).astype(np.float32),
         "bool": rng.randint(0, 2, (80, 5)).astype(bool),
         "real": rng.randn(60, 3).round()}[kind]
    rows, first, inverse = np.unique(a, axis=0, return_index=True, return_inverse=True)
    np.testing.assert_array_equal(distinct_tokens(a), rows)
    got = distinct_tokens(a, return_index=True, return_inverse=True)
    for want, have in zip((rows, first, inverse.reshape(-1)), got):
        np.testing.assert_array_equal(have, want)
    np.testing.assert_array_equal(distinct_tokens(a, return_inverse=True)[1],
                                  inverse.reshape(-1))


def test_one_member_owns_its_head_through_public_registration():
    # one member: the head's copy is the stack's submodule; state_dict, parameters and
    # buffers hold every tensor once, and deepcopy / pickle keep the head the stack's

    x = _tokens(20, 3, n_distinct=6)
    head = _heads("table", (3,), x)[0]
    ens = HeadEnsemble([head])
    keys = list(ens.state_dict())
    assert keys == [f"head.{k}" for k in head.state_dict()]
    assert len({id(p) for p in ens.parameters()}) == len(list(ens.parameters())) == len(ens.names)
    assert [id(p) for p in ens.params] == [id(p) for p in ens.template.parameters()]
    for copied in (pickle.loads(pickle.dumps(ens)), copy.deepcopy(ens)):
        assert copied.template is copied.head
        assert [id(p) for p in copied.params] == [id(p) for p in copied.head.parameters()]
        torch.testing.assert_close(copied(x), ens(x), rtol=0, atol=0)
    # a conversion that replaces the parameter objects keeps them the stack's
    previous = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        ens.float()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(previous)
    assert [id(p) for p in ens.params] == [id(p) for p in ens.parameters()]
    assert all(p.dtype == torch.float32 for p in ens.params)
    torch.testing.assert_close(ens(x.float())[0], head.float()(x.float()))


def test_stacked_members_hold_every_tensor_once():
    x = _tokens(20, 3, n_distinct=6)
    heads = _heads("table", (2, 4), x)
    ens = HeadEnsemble(heads)
    state = ens.state_dict()
    params = list(ens.parameters())
    assert [id(p) for p in params] == [id(p) for p in ens.params]
    assert len(params) == len(ens.names) and all(p.shape[0] == 2 for p in params)
    # the template lends its forward and shapes only: none of its tensors is the stack's
    assert not any(k.startswith("head.") for k in state)
    assert not {id(p) for p in ens.template.parameters()} & {id(p) for p in params}
    assert ens.stacked_buffer("feature_mask").tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    ens.float()
    torch.testing.assert_close(ens(x.float())[1], heads[1].float()(x.float()))


def test_token_tables_are_the_stacks_parameters():
    x = _tokens(20, 3, n_distinct=6)
    heads = _heads("table", (2, 4), x)
    ens = HeadEnsemble(heads)
    q, k = ens.token_tables()
    params = list(ens.params)
    assert any(q is p for p in params) and any(k is p for p in params)
    assert q.shape == (2, 6, 4) and k.shape == (2, 6, 4)
    for i, head in enumerate(heads):
        hq, hk = head.token_tables()
        torch.testing.assert_close(q[i, :, :head.rank], hq, rtol=0, atol=0)
        torch.testing.assert_close(k[i, :, :head.rank], hk, rtol=0, atol=0)
    one = HeadEnsemble(heads[:1])
    assert all(a is b for a, b in zip(one.token_tables(), one.head.token_tables()))
    assert HeadEnsemble(_heads("elu+1", (2, 3), x)).token_tables() is None
    assert HeadEnsemble([SoftmaxAttentionHead(5)]).token_tables() is None
    assert HeadEnsemble(_heads("table", (2, 2), x, shared=True)).token_tables() is None


def test_fused_roles_are_resolved_when_the_stack_is_built():
    # a map that declares a fused form must name the parameters of its roles: a
    # missing or foreign parameter fails at construction, not in the fused forward
    class NoRoles(get_feature_map("elu+1")):
        def fused_parameters(self):
            return {"weight": self.encoder.weight}

    class Foreign(get_feature_map("elu+1")):
        def fused_parameters(self):
            other = torch.nn.Linear(4, 2)
            return {"weight": other.weight, "bias": other.bias}

    for cls, role in ((NoRoles, "bias"), (Foreign, "weight")):
        heads = [KernelAttentionHead(4, 2, feature_map=cls) for _ in range(2)]
        with pytest.raises(TypeError, match=f"role '{role}'"):
            HeadEnsemble(heads)
    # the declared roles of the library's modules cover what the fused path reads
    head = _heads("elu+1", (2,), _tokens(4, 3))[0]
    assert set(head.query_features.fused_parameters()) == {"weight", "bias"}
    assert set(head.value.fused_parameters()) == {"weight", "bias"}
    assert set(head.readout.fused_parameters()) == {"weight", "weight_bias", "bias",
                                                     "bias_const"}
    assert get_feature_map("favor+")(5, 3).fused_parameters() == {}


def test_stack_groups_is_the_one_rank_masking_test():
    x = _tokens(6, 3, n_bits=4)
    elu = [KernelAttentionHead(4, r) for r in (2, 3, 2)]
    assert HeadEnsemble.stack_groups(elu) == [[0, 1, 2]]
    # a padding limit holds on the generic path only (the fused one pads per token)
    assert HeadEnsemble.stack_groups(elu, max_padding=0) == [[0, 1, 2]]
    mlp = [KernelAttentionHead(4, r, feature_depth=1) for r in (2, 3, 2)]
    assert HeadEnsemble.stack_groups(mlp, max_padding=0) == [[0, 2], [1]]
    assert HeadEnsemble.stack_groups(mlp, max_padding=2) == [[0, 1, 2]]
    hedgehog = [KernelAttentionHead(4, r, feature_map="hedgehog") for r in (4, 6, 4)]
    assert HeadEnsemble.stack_groups(hedgehog) == [[0, 2], [1]]
    with pytest.raises(ValueError, match="cannot be stacked at different ranks"):
        HeadEnsemble(hedgehog)
    for group in HeadEnsemble.stack_groups(hedgehog):
        members = [hedgehog[i] for i in group]
        out = HeadEnsemble(members)(x.float())
        for o, head in zip(out, members):
            torch.testing.assert_close(o, head(x.float()))
    assert HeadEnsemble.stack_groups([SoftmaxAttentionHead(4)] * 2) == [[0, 1]]


# -- sequences in multiset form (counts) -------------------------------------------------
def _multiset(x):
    """The family of sequences ``x`` in multiset form and its materialised sequences
    (slot order: the family's, each token repeated as often as it occurs)."""
    from minip_learn.compact import CompactFamily

    fam = CompactFamily.from_sequences(x.numpy().astype(np.uint8))
    slots = torch.as_tensor(fam.slot_tokens(), dtype=x.dtype)
    counts = torch.as_tensor(fam.counts, dtype=x.dtype)
    return fam, slots, counts, torch.as_tensor(fam.to_sequences(), dtype=x.dtype)


def _check_counts_against_materialised(ens, fam, slots, counts, seqs):
    """Outputs of the multiset input at every slot, and the gradients of a loss weighted
    by the counts, equal those of the materialised sequences at its positions."""
    out = ens(slots, counts=counts)
    path = ens.path
    ref = ens(seqs)
    w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    w_pos = torch.as_tensor(np.stack([fam.expand(wi) for wi in w.numpy()]))
    for i in range(out.shape[0]):
        torch.testing.assert_close(torch.as_tensor(fam.expand(out[i].detach().numpy())),
                                   ref[i].detach(), rtol=1e-9, atol=1e-9)
    grads = torch.autograd.grad((out * w * counts).sum(), list(ens.params))
    ref_grads = torch.autograd.grad((ref * w_pos).sum(), list(ens.params))
    for name, g, rg in zip(ens.names, grads, ref_grads):
        torch.testing.assert_close(g, rg, rtol=1e-9, atol=1e-9, msg=name)
    return path


@pytest.mark.parametrize("ranks", [(3, 3), (2, 4), (3,)])
@pytest.mark.parametrize("name", ["elu+1", "exp", "table", "hedgehog"])
def test_every_path_takes_token_multiplicities(name, ranks):
    # a slot of multiplicity c weighs as c equal keys; padding slots weigh nothing
    if name == "hedgehog" and len(set(ranks)) > 1:
        return  # stacked one rank at a time
    repeated = _tokens(40, 10, n_distinct=4)     # few distinct tokens: the pair form
    fam, slots, counts, seqs = _multiset(repeated)
    assert fam.padding.any() and fam.n_slots < fam.seq_len
    ens = HeadEnsemble(_heads(name, ranks, repeated))
    path = _check_counts_against_materialised(ens, fam, slots, counts, seqs)
    expected = {"hedgehog": "generic"}.get(name, "fused-pairs")
    if name == "hedgehog" and len(ranks) == 1:
        expected = "single"
    assert path == expected, ens.path_reason
    if name != "table":  # tokens that hardly repeat: attention per position
        fam, slots, counts, seqs = _multiset(_tokens(3, 10, seed=1))
        path = _check_counts_against_materialised(ens, fam, slots, counts, seqs)
        assert path == {"hedgehog": expected}.get(name, "fused-positions"
                                                  if len(ranks) > 1 else "single")


def test_pair_plan_is_cached_per_input_and_counts():
    x = _tokens(40, 6, n_distinct=4)
    fam, slots, counts, _ = _multiset(x)
    ens = HeadEnsemble(_heads("exp", (2, 3), x))
    plan = ens._pair_plan(slots, counts)
    assert ens._pair_plan(slots, counts) is plan
    assert ens._pair_plan(slots) is not plan          # without counts: its own plan
    assert ens._pair_plan(slots, counts.clone()) is not plan


def test_the_pair_plan_warns_about_nothing():
    # torch warns when sparse invariant checks are left implicit: the plan opts out
    heads = _heads("elu+1", (2, 3), _tokens(40, 3, n_distinct=6))
    ens = HeadEnsemble(heads)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ens(_tokens(40, 3, n_distinct=6))
    assert ens.path == "fused-pairs"


def test_stacks_and_table_maps_run_under_inference_mode():
    # inference tensors have no version counter: the input caches step aside
    vocab = torch.eye(4)
    heads = [KernelAttentionHead(4, r, feature_map="table",
                                 feature_kwargs={"vocabulary": vocab}) for r in (2, 3)]
    ens = HeadEnsemble(heads)
    x = vocab[torch.randint(0, 4, (6, 3))]
    expected = ens(x)
    with torch.inference_mode():
        z = x.clone()
        torch.testing.assert_close(ens(z), expected)
        torch.testing.assert_close(heads[0](z), expected[0])
