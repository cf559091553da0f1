"""Batched ensembles: rank masking, HeadEnsemble, fit_ensemble == separate fits, sweeps."""

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.linear_model import LinearRegression

from minip_learn import KernelAttentionRegressor, SoftmaxAttentionRegressor
from minip_learn.datasets import make_minip
from minip_learn.model_selection import fit_ensemble, rank_sweep
from minip_learn.nn import HeadEnsemble, KernelAttentionHead


@pytest.fixture(scope="module")
def data():
    return make_minip(60, seq_len=3, n_bits=6, min_gap=2, random_state=0)


def _tokens(n=7, seq_len=3, n_bits=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n, seq_len, n_bits), generator=g).to(torch.float64)


def _kernel_head(rank, feature_map, x, seed):
    kw = {}
    if feature_map == "table":
        kw["vocabulary"] = np.unique(x.reshape(-1, x.shape[-1]).numpy(), axis=0)
    torch.manual_seed(seed)
    return KernelAttentionHead(x.shape[-1], rank, feature_map=feature_map,
                               feature_kwargs=kw).to(torch.float64)


# -- torch layer ------------------------------------------------------------------------
def test_feature_mask_absent_by_default():
    head = KernelAttentionHead(6, 3)
    assert head.feature_mask is None
    assert not any("feature_mask" in k for k in head.state_dict())


@pytest.mark.parametrize("feature_map", ["elu+1", "table", "exp"])
def test_rank_mask_gives_exactly_a_rank_r_head(feature_map):
    x = _tokens()
    small = _kernel_head(2, feature_map, x, seed=0)
    big = _kernel_head(5, feature_map, x, seed=1)
    with torch.no_grad():  # embed the rank-2 parameters into the rank-5 head
        for (_, p), (_, q) in zip(small.named_parameters(), big.named_parameters()):
            q.zero_()
            q[tuple(slice(0, k) for k in p.shape)] = p
    # without the mask the zero-padded features are not zero (elu(0)+1 = 1, exp(0) = 1)
    assert not torch.allclose(big(x), small(x), atol=1e-6)
    big.feature_mask = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(big(x), small(x), rtol=0, atol=1e-13)
    phi_q, phi_k = big.features(x)
    assert (phi_q[..., 2:] == 0).all() and (phi_k[..., 2:] == 0).all()
    sq, sk = small.features(x)
    torch.testing.assert_close(phi_q[..., :2] / phi_q[..., :2].sum(-1, keepdim=True),
                               sq / sq.sum(-1, keepdim=True), rtol=0, atol=1e-13)
    # masked parameters get zero gradients
    big(x).sum().backward()
    for (n, p), (_, q) in zip(small.named_parameters(), big.named_parameters()):
        if p.shape != q.shape:
            g = q.grad.clone()
            g[tuple(slice(0, k) for k in p.shape)] = 0
            assert (g == 0).all(), n


def test_head_ensemble_forward_and_shapes():
    x = _tokens()
    heads = [_kernel_head(r, "favor+", x, seed=s) for r, s in [(2, 0), (4, 1), (3, 2)]]
    ens = HeadEnsemble(heads)
    out = ens(x)
    assert out.shape == (3, 7, 3)
    for i, h in enumerate(heads):
        torch.testing.assert_close(out[i], h(x), rtol=0, atol=1e-12)
        state = ens.member_state_dict(i)
        for n, p in h.named_parameters():
            assert torch.equal(state[n], p.detach())
    with pytest.raises(ValueError, match="non-empty"):
        HeadEnsemble([])


@pytest.mark.parametrize("feature_map", ["elu+1", "table"])
def test_fused_path_equals_vmap_path(feature_map):
    x = _tokens()
    heads = [_kernel_head(r, feature_map, x, seed=s) for r, s in [(2, 0), (5, 1)]]
    fused, plain = HeadEnsemble(heads), HeadEnsemble(heads)
    plain._fast = False
    out_f, out_p = fused(x), plain(x)
    assert fused._fast  # the fused path was taken (and passed its own check)
    torch.testing.assert_close(out_f, out_p, rtol=0, atol=1e-12)
    w = torch.randn(out_f.shape, dtype=out_f.dtype, generator=torch.Generator().manual_seed(0))
    g_f = torch.autograd.grad((out_f * w).sum(), list(fused.params))
    g_p = torch.autograd.grad((out_p * w).sum(), list(plain.params))
    for a, b in zip(g_f, g_p):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_fused_path_is_declared_not_self_checked(monkeypatch):
    # the path is chosen from the maps' declarations; a wrong fused forward is not
    # replaced behind the user's back by the generic one
    x = _tokens()
    heads = [_kernel_head(3, "elu+1", x, seed=s) for s in (0, 1)]
    ens = HeadEnsemble(heads)
    assert ens.path.startswith("fused")
    monkeypatch.setattr(ens, "_fast_forward", lambda xx, *a, **kw: torch.zeros(2, len(xx), 3))
    out = ens(x)
    assert ens.path.startswith("fused")
    assert torch.count_nonzero(out) == 0


# -- fit_ensemble == separate fits ------------------------------------------------------
CASES = {
    "elu+1": (KernelAttentionRegressor(dtype="float64", max_epochs=150), [2, 6]),
    "table": (KernelAttentionRegressor(dtype="float64", max_epochs=150,
                                       feature_map="table"), [3]),
    "softmax": (SoftmaxAttentionRegressor(dtype="float64", max_epochs=150, lr=0.03), None),
}


def _repeated_tokens(n=40, n_tokens=5, seq_len=3, n_bits=6, seed=0):
    """Sequences drawn from a few distinct tokens (as a witness suite is)."""
    g = torch.Generator().manual_seed(seed)
    vocab = torch.randint(0, 2, (n_tokens, n_bits), generator=g).to(torch.float64)
    return vocab[torch.randint(0, n_tokens, (n, seq_len), generator=g)]


@pytest.mark.parametrize("feature_map", ["elu+1", "table", "exp"])
def test_pair_path_equals_position_path(feature_map):
    # few distinct tokens: maps and kernel on the distinct tokens, gathered to pairs
    x = _repeated_tokens()
    heads = [_kernel_head(r, feature_map, x, seed=s) for r, s in [(2, 0), (5, 1)]]
    ens = HeadEnsemble(heads)
    plan = ens._pair_plan(x)
    assert plan is not None and plan.n_tokens == len(torch.unique(x.reshape(-1, 6), dim=0))
    assert ens._pair_plan(_tokens()) is None  # tokens that hardly repeat: per position
    outs = [ens._pair_forward(x, plan), ens._position_forward(x), ens._vmap_forward(x)]
    w = torch.randn(outs[0].shape, dtype=x.dtype, generator=torch.Generator().manual_seed(0))
    grads = [torch.autograd.grad((o * w).sum(), list(ens.params)) for o in outs]
    for o, gr in zip(outs[1:], grads[1:]):
        torch.testing.assert_close(outs[0], o, rtol=0, atol=1e-12)
        for a, b in zip(grads[0], gr):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    out = ens(x)  # the first call checks the pair form against vmap and keeps it
    assert ens._fast
    torch.testing.assert_close(out, outs[0], rtol=0, atol=0)
    plan = ens._pair_plan(x)
    assert ens._pair_plan(x) is plan  # cached for the same tensor ...
    x[0, 0] = 1 - x[0, 0]  # ... and recomputed after an in-place change
    assert ens._pair_plan(x) is not plan


@pytest.mark.parametrize("case", ["elu+1", "table"])
def test_members_equal_separate_fits_on_witness_suite(case, monkeypatch):
    # a witness suite (66 sequences of 12 distinct tokens) takes the pair path
    from minip_learn.datasets import make_witness_suite

    s = make_witness_suite(10, 3)
    est = clone(CASES[case][0]).set_params(max_epochs=40)
    calls = []
    pair = HeadEnsemble._pair_forward

    def spy(self, x, plan):
        calls.append(len(x))
        return pair(self, x, plan)

    def boom(self, x):
        raise AssertionError("the per-position path was taken")

    monkeypatch.setattr(HeadEnsemble, "_pair_forward", spy)
    monkeypatch.setattr(HeadEnsemble, "_position_forward", boom)
    res = fit_ensemble(est, s.X, s.y, ranks=[2, 4] if case == "elu+1" else None,
                       seeds=[0, 2])
    assert len(s.X) in calls
    for p, member in zip(res.params, res.estimators):
        ref = clone(est).set_params(**p).fit(s.X, s.y)
        np.testing.assert_allclose(member.predict(s.X), ref.predict(s.X), rtol=0, atol=1e-6)
        assert member.n_epochs_ == ref.n_epochs_
        np.testing.assert_allclose(member.net_.history[:, "train_loss"],
                                   ref.net_.history[:, "train_loss"], rtol=1e-6)



@pytest.mark.parametrize("vocabulary", ["the tokens", "one more token", "reversed"])
def test_pair_path_gathers_table_rows_only_when_needed(vocabulary):
    # a table whose rows are the input's distinct tokens in order is read as it is;
    # any other vocabulary is gathered: every variant equals the per-position path and
    # the heads themselves
    x = _repeated_tokens()
    tokens = np.unique(x.reshape(-1, 6).numpy(), axis=0)
    every = np.array([[(v >> b) & 1 for b in range(6)] for v in range(64)], dtype=float)
    unseen = next(t for t in every if not (tokens == t).all(1).any())
    vocab = {"the tokens": tokens, "one more token": np.vstack([tokens, unseen]),
             "reversed": tokens[::-1].copy()}[vocabulary]
    heads = []
    for seed, rank in enumerate((2, 4)):
        torch.manual_seed(seed)
        heads.append(KernelAttentionHead(6, rank, feature_map="table",
                                         feature_kwargs={"vocabulary": vocab}).double())
    ens = HeadEnsemble(heads)
    plan = ens._pair_plan(x)
    out = ens._pair_forward(x, plan)
    gathers = [v for k, v in ens._input_cache[2].items() if k[0] == "index"]
    assert len(gathers) == 2
    assert all((g is None) == (vocabulary == "the tokens") for g in gathers)
    torch.testing.assert_close(out, ens._position_forward(x), rtol=0, atol=1e-12)
    for i, head in enumerate(heads):
        torch.testing.assert_close(out[i], head(x), rtol=0, atol=1e-12)

@pytest.mark.parametrize("case", list(CASES))
def test_members_equal_separate_fits(case, data):
    X, y = data
    est, ranks = CASES[case]
    res = fit_ensemble(est, X, y, ranks=ranks, seeds=[0, 2])
    assert len(res.estimators) == len(res.params) == (len(ranks) if ranks else 1) * 2
    epochs = set()
    for p, member in zip(res.params, res.estimators):
        ref = clone(est).set_params(**p).fit(X, y)
        assert type(member) is type(ref)
        assert member.get_params() == ref.get_params()
        np.testing.assert_allclose(member.predict(X), ref.predict(X), rtol=0, atol=1e-6)
        assert member.n_epochs_ == ref.n_epochs_ == len(member.net_.history)
        assert member.solved_ == ref.solved_
        assert member.seq_len_ == ref.seq_len_ and member.n_bits_ == ref.n_bits_
        np.testing.assert_allclose(member.train_max_error_, ref.train_max_error_, atol=1e-6)
        np.testing.assert_allclose(member.net_.history[:, "train_loss"],
                                   ref.net_.history[:, "train_loss"], rtol=1e-6)
        # optimizer state too: refitting with partial_fit continues the same trajectory
        s_m = member.net_.optimizer_.state_dict()["state"]
        s_r = ref.net_.optimizer_.state_dict()["state"]
        assert s_m.keys() == s_r.keys()
        for k in s_r:
            assert float(s_m[k]["step"]) == float(s_r[k]["step"])
            torch.testing.assert_close(s_m[k]["exp_avg"], s_r[k]["exp_avg"], rtol=0, atol=1e-6)
        if hasattr(ref, "vocabulary_"):
            np.testing.assert_array_equal(member.vocabulary_, ref.vocabulary_)
        epochs.add(member.n_epochs_)
    np.testing.assert_array_equal(res.n_epochs, [e.n_epochs_ for e in res.estimators])
    np.testing.assert_array_equal(res.solved, [e.solved_ for e in res.estimators])
    assert len(epochs) > 1  # members stopped at different epochs: stopping was per member


#: torch optimizers and settings whose steps the stacks' tests compare
STEP_CASES = [("Adam", {}), ("AdamW", {"weight_decay": 0.01}),
              ("SGD", {"momentum": 0.9, "weight_decay": 1e-3})]


@pytest.mark.parametrize("optimizer, kwargs", STEP_CASES)
def test_foreach_steps_of_a_stack_are_the_per_tensor_steps(optimizer, kwargs):
    # an optimizer without a fused step steps a stack with foreach=True: on CPU the
    # same numbers, bit for bit, as the per-tensor loop that a single fit steps with
    gen = torch.Generator().manual_seed(0)
    shapes = [(20, 24, 24), (20, 24), (20, 46, 16), (20, 1)]
    start = [torch.randn(s, generator=gen) for s in shapes]
    params = {f: [p.clone().requires_grad_() for p in start] for f in (False, True)}
    cls = getattr(torch.optim, optimizer)
    opts = {f: cls(params[f], lr=0.01, foreach=f, **kwargs) for f in (False, True)}
    for _ in range(50):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for f in (False, True):
            for p, g in zip(params[f], grads):
                p.grad = g.clone()
            opts[f].step()
    for a, b in zip(params[False], params[True]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("optimizer, kwargs", STEP_CASES)
def test_a_fused_step_of_a_stack_is_every_members_own_fused_step(optimizer, kwargs):
    # every net steps with fused=True: a stack's step is, bit for bit, the steps of its
    # members' own fits (each member a slice of the stacked parameters)
    gen = torch.Generator().manual_seed(0)
    shapes = [(20, 24, 24), (20, 24), (20, 46, 16), (20, 1)]
    stack = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    members = [[p.detach()[i].clone().requires_grad_() for p in stack] for i in range(20)]
    cls = getattr(torch.optim, optimizer)
    opts = [cls(params, lr=0.01, fused=True, **kwargs) for params in (stack, *members)]
    for _ in range(50):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for p, g in zip(stack, grads):
            p.grad = g.clone()
        for i, params in enumerate(members):
            for p, g in zip(params, grads):
                p.grad = g[i].clone()
        for opt in opts:
            opt.step()
    # fused SGD's momentum update rounds by one ulp differently in the vector lanes
    # and the scalar tail of its loop (measured: at most 2.4e-7 after 50 steps), so
    # there the members agree to float32 rounding; Adam's and AdamW's bit for bit
    tol = dict(rtol=1e-6, atol=1e-6) if optimizer == "SGD" else dict(rtol=0, atol=0)
    for i, params in enumerate(members):
        for a, b in zip(stack, params):
            torch.testing.assert_close(a.detach()[i], b.detach(), **tol)


def test_nets_step_fused_or_stacks_foreach(monkeypatch):
    from minip_learn.training import MinIPNet, train_members

    seen = []
    partial_fit = MinIPNet.partial_fit
    monkeypatch.setattr(MinIPNet, "partial_fit", lambda self, *a, **k: (
        seen.append((self.optimizer_.defaults.get("fused"),
                     self.optimizer_.defaults.get("foreach"))), partial_fit(self, *a, **k))[1])
    X, y = (torch.as_tensor(a, dtype=torch.float32)
            for a in make_minip(16, seq_len=2, n_bits=5, random_state=0))
    # (optimizer, members): (fused, foreach) of the stack's optimizer; RMSprop has no
    # fused step, so a stack of several members takes torch's multi-tensor loop
    cases = [(torch.optim.Adam, 2, (True, None)), (torch.optim.Adam, 1, (True, None)),
             (torch.optim.SGD, 2, (True, None)), (torch.optim.RMSprop, 2, (None, True)),
             (torch.optim.RMSprop, 1, (None, None))]
    for optimizer, n_members, want in cases:
        res = train_members(KernelAttentionHead, [(dict(n_bits=5, rank=2), s)
                                                  for s in range(n_members)], X, y,
                            optimizer=optimizer, max_epochs=2)
        assert seen.pop() == want, (optimizer, n_members)
        assert res.members[0].net.optimizer_.defaults.get("fused") is want[0]


@pytest.mark.parametrize("layout", ["member-major", "position-major"])
def test_member_loss_is_each_members_mse(layout):
    # MemberLoss's MSE, in both memory layouts of the stack's outputs (the pair path's
    # are position-major): every member's torch MSE, gradient in the outputs' layout
    from minip_learn.training import MemberLoss

    gen = torch.Generator().manual_seed(0)
    E, n, N = 4, 6, 3
    if layout == "position-major":
        y_pred = torch.randn(n * N, E, dtype=torch.float64, generator=gen).T.reshape(E, n, N)
    else:
        y_pred = torch.randn(E, n, N, dtype=torch.float64, generator=gen)
    y_pred.requires_grad_()
    y = torch.randn(n, N, dtype=torch.float64, generator=gen)
    crit = MemberLoss(torch.nn.MSELoss())
    total = crit(y_pred, y)
    want = [torch.nn.functional.mse_loss(y_pred[e], y) for e in range(E)]
    torch.testing.assert_close(crit.member_losses_, torch.stack(want).detach(),
                               rtol=1e-12, atol=0)
    torch.testing.assert_close(total, sum(want), rtol=1e-12, atol=0)
    (grad,) = torch.autograd.grad(total, y_pred)
    assert grad.stride() == y_pred.stride()
    assert torch.autograd.gradcheck(lambda a: crit(a, y), (y_pred,))

@pytest.mark.parametrize("case", list(CASES))
def test_single_fit_is_a_one_member_ensemble(case, data):
    # one training path: fit and a one-member fit_ensemble give identical results
    X, y = data
    est, ranks = CASES[case]
    p = {"rank": ranks[-1], "random_state": 3} if ranks else {"random_state": 3}
    single = clone(est).set_params(**p).fit(X, y)
    res = fit_ensemble(est, X, y, params=[p])
    member = res.estimators[0]
    assert res.n_members == 1 and res.params == [p]
    assert member.get_params() == single.get_params()
    pred = member.predict(X)
    assert pred.dtype == np.float64
    np.testing.assert_array_equal(pred, single.predict(X))
    for (n, a), b in zip(member.net_.module_.state_dict().items(),
                         single.net_.module_.state_dict().values()):
        assert torch.equal(a, b), n
    h_m, h_s = member.net_.history, single.net_.history
    assert len(h_m) == len(h_s) == member.n_epochs_ == single.n_epochs_
    assert [sorted(r) for r in h_m] == [sorted(r) for r in h_s]
    for key in ("train_loss", "train_loss_best", "train_max_error"):
        assert h_m[:, key] == h_s[:, key]
    assert member.train_max_error_ == single.train_max_error_
    assert member.init_errors_ == single.init_errors_
    assert member.solved_ == single.solved_


def test_stopped_member_is_frozen(data):
    X, y = data
    est = KernelAttentionRegressor(rank=6, dtype="float64", max_epochs=150)
    res = fit_ensemble(est, X, y, seeds=[0, 1])
    early = int(np.argmin(res.n_epochs))
    assert res.n_epochs[early] < res.n_epochs.max()  # the ensemble ran on after it stopped
    member = res.estimators[early]
    # the same trajectory cut at the stopping epoch, without any stopping rule
    ref = clone(est).set_params(random_state=res.params[early]["random_state"],
                                stop_tolerance=None,
                                max_epochs=int(res.n_epochs[early])).fit(X, y)
    for (n, p), (_, q) in zip(member.net_.module_.named_parameters(),
                              ref.net_.module_.named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-8, msg=n)
    assert member.train_max_error_ < 0.25


def _periodic_reference(n, every, max_epochs):
    """Epoch ``n`` is periodic when it is a multiple of ``every`` or the last one."""
    multiples = set(range(every, n + every, every))
    return n in multiples or (max_epochs is not None and n >= max_epochs)


@pytest.mark.parametrize("max_epochs", [None, 1, 5, 6, 12])
def test_periodic_epochs_match_the_reference(max_epochs):
    from minip_learn.training import is_periodic_epoch

    for every in range(1, 7):
        for n in range(1, 15):
            assert is_periodic_epoch(n, every, max_epochs=max_epochs) == \
                _periodic_reference(n, every, max_epochs), (n, every, max_epochs)


def test_net_checks_and_callbacks_run_on_periodic_epochs(monkeypatch):
    # the net's check epochs include the last one; the periodic callbacks do not
    from types import SimpleNamespace

    from minip_learn.training import MinIPNet, SplitSharedFeatures, TrimMemory, _callbacks

    class History(list):
        def record(self, key, value):
            self[-1][key] = value

    ran = []
    monkeypatch.setattr(_callbacks, "split_shared_features", lambda *a, **k: (
        ran.append(("split", len(net.history))), None, None, [0])[1:])
    for every in (1, 3, 4):
        net = SimpleNamespace(check_every=every, max_epochs=10, history=History(),
                              module_=SimpleNamespace(n_members=1), optimizer_=None)
        trim, split = TrimMemory(every=every), SplitSharedFeatures(every=every)
        trim.trim_, trim.free_ = lambda net=net: ran.append(("trim", len(net.history))), None
        split.partners_, split.tables_, split.mask_ = [], (None, None), None
        checks, ran[:] = [], []
        for _ in range(10):
            net.history.append({})
            checks.append(MinIPNet.is_check_epoch(net))
            trim.on_epoch_end(net)
            split.on_epoch_end(net)
        assert checks == [_periodic_reference(n, every, 10) for n in range(1, 11)]
        assert ran == [(name, n) for n in range(1, 11) if _periodic_reference(n, every, None)
                       for name in ("trim", "split")]


@pytest.mark.parametrize("k", [4, 7])
def test_check_every_k_epochs(k, data, monkeypatch):
    # the figures stay on the device between checks: one read of the history per k
    # epochs; members stop only on checked epochs, on the trajectory of the fits
    # checked every epoch
    from minip_learn.training import MinIPNet

    X, y = data
    est = KernelAttentionRegressor(rank=6, dtype="float64", max_epochs=150)
    every = fit_ensemble(est, X, y, seeds=[0, 1, 2])
    reads = []
    sync = MinIPNet.sync_history
    monkeypatch.setattr(MinIPNet, "sync_history",
                        lambda self: (reads.append(len(self.history)), sync(self))[1])
    res = fit_ensemble(clone(est).set_params(check_every=k), X, y, seeds=[0, 1, 2])
    run = int(res.n_epochs.max())
    assert (every.n_epochs < 150).sum() == (res.n_epochs < 150).sum() == 2
    if k == 7:  # a check 7 epochs apart falls after some every-epoch stop
        assert (res.n_epochs != every.n_epochs).any()
    assert sorted(set(reads)) == sorted({n for n in range(k, run + 1, k)} | {run})
    for e1, ek in zip(every.estimators, res.estimators):
        n1, nk = e1.n_epochs_, ek.n_epochs_
        # stopped at the first check at or after its every-epoch stop, unless it was
        # no longer solved there
        assert nk == 150 or nk % k == 0
        assert nk >= n1 or n1 == 150
        hist = ek.net_.history
        assert len(hist) == nk and all(isinstance(v, float) for v in hist[:, "train_loss"])
        assert all(isinstance(v, float) for v in hist[:, "train_max_error"])
        # the common epochs are the same trajectory
        m = min(n1, nk)
        np.testing.assert_allclose(hist[:m, "train_loss"],
                                   e1.net_.history[:m, "train_loss"], rtol=1e-10)
        alone = clone(est).set_params(check_every=k, random_state=ek.random_state).fit(X, y)
        assert alone.n_epochs_ == nk
        np.testing.assert_allclose(alone.predict(X), ek.predict(X), atol=1e-8)


def test_n_init_picks_what_restarts_pick(data):
    X, y = data
    est = KernelAttentionRegressor(rank=6, dtype="float64", max_epochs=100, n_init=3,
                                   stop_tolerance=0.4)
    res = fit_ensemble(est, X, y, seeds=[0, 1, 2])
    assert res.n_members == 9
    n_tries = []
    for p, member in zip(res.params, res.estimators):
        ref = clone(est).set_params(**p).fit(X, y)
        np.testing.assert_allclose(member.init_errors_, ref.init_errors_, atol=1e-6)
        assert member.n_epochs_ == ref.n_epochs_
        np.testing.assert_allclose(member.predict(X), ref.predict(X), atol=1e-6)
        n_tries.append(len(member.init_errors_))
    assert len(set(n_tries)) > 1  # some seeds restarted, some did not


# -- sweeps -------------------------------------------------------------------------------
def test_rank_sweep_ensemble_rows_and_resume(data, tmp_path):
    X, y = data
    est = KernelAttentionRegressor(dtype="float64", max_epochs=40)
    plain = rank_sweep(est, X, y, ranks=[2], seeds=[0, 1], out=tmp_path, progress=False)
    assert not plain.results["ensemble"].any()
    both = rank_sweep(est, X, y, ranks=[2, 4], seeds=[0, 1], out=tmp_path, progress=False,
                      ensemble=True)
    assert (both.n_resumed, both.n_computed) == (2, 2)
    ref = rank_sweep(est, X, y, ranks=[2, 4], seeds=[0, 1], progress=False)
    a, b = both.results, ref.results
    assert list(a.columns) == list(b.columns)
    assert a["fit_id"].tolist() == b["fit_id"].tolist()
    assert a["ensemble"].tolist() == [False, False, True, True]
    np.testing.assert_allclose(a["max_abs_error"], b["max_abs_error"], atol=1e-6)
    assert a["n_epochs"].tolist() == b["n_epochs"].tolist()
    again = rank_sweep(est, X, y, ranks=[2, 4], seeds=[0, 1], out=tmp_path, progress=False,
                       ensemble=True)
    assert (again.n_resumed, again.n_computed) == (4, 0)


def test_rank_sweep_ensemble_keeps_certified_bound_check():
    X, y = make_minip(32, seq_len=2, n_bits=6, random_state=0)  # solved at rank 1 (R1)
    est = KernelAttentionRegressor(stop_tolerance=0.5)
    with pytest.raises(RuntimeError, match="certified minimum rank"):
        rank_sweep(est, X, y, ranks=[1], seeds=[0], certified_min_rank=3, progress=False,
                   ensemble=True)


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("est, kwargs, match", [
    (LinearRegression(), {}, "KernelAttentionRegressor, SoftmaxAttentionRegressor or "
                             "SequenceMixerRegressor"),
    (KernelAttentionRegressor(), {"state_sizes": [2]}, "has no state_size"),
    (SoftmaxAttentionRegressor(), {"ranks": [2]}, "has no rank"),
    (KernelAttentionRegressor(), {"ranks": []}, "ranks must be a non-empty"),
    (KernelAttentionRegressor(), {"ranks": [0]}, "rank"),
    (KernelAttentionRegressor(), {"seeds": []}, "seeds must be a non-empty"),
    (KernelAttentionRegressor(), {"seeds": [0, 0]}, "duplicates"),
    (KernelAttentionRegressor(), {"seeds": [0.5]}, "seeds must be ints"),
    (KernelAttentionRegressor(), {"seeds": True}, "seeds must be ints .*not bool; got True"),
    (KernelAttentionRegressor(), {"seeds": [0, False]}, "not bool; got False"),
    (KernelAttentionRegressor(), {"seeds": [2, 2]}, "seeds must not contain duplicates"),
    (KernelAttentionRegressor(), {"ranks": [2, 2]}, "ranks must not contain duplicates"),
    (KernelAttentionRegressor(batch_size=8), {}, "batch_size"),
    (KernelAttentionRegressor(callbacks=[]), {}, "callbacks"),
    (KernelAttentionRegressor(lr=-1.0), {}, "lr"),
])
def test_bad_input(est, kwargs, match, data):
    X, y = data
    with pytest.raises(ValueError, match=match):
        fit_ensemble(est, X, y, **kwargs)


def test_params_replace_ranks_and_seeds(data):
    X, y = data
    est = KernelAttentionRegressor(dtype="float64", max_epochs=20)
    members = [{"rank": 4, "random_state": 1}, {"rank": 2, "random_state": 1}]
    res = fit_ensemble(est, X, y, params=members, seeds=[7, 8])
    assert res.params == members and res.n_members == 2
    assert [e.rank for e in res.estimators] == [4, 2]
    assert [e.random_state for e in res.estimators] == [1, 1]
    with pytest.raises(ValueError, match="either params or ranks"):
        fit_ensemble(est, X, y, params=members, ranks=[2])
    with pytest.raises(ValueError, match="differ only in rank and random_state"):
        fit_ensemble(est, X, y, params=[{"lr": 0.1}])
    with pytest.raises(ValueError, match="non-empty"):
        fit_ensemble(est, X, y, params=[])
    with pytest.raises(ValueError, match="may differ only in random_state; got .'rank'"):
        fit_ensemble(SoftmaxAttentionRegressor(), X, y, params=[{"rank": 2}])


def test_model_selection_uses_only_public_attributes():
    # sweeps and ensembles use the estimators through their public API only
    import ast
    from pathlib import Path

    import minip_learn.model_selection as ms

    trees = {path.name: ast.parse(path.read_text())
             for path in sorted(Path(ms.__file__).parent.glob("*.py"))}
    # the package's own private methods (called on its own objects) are fine
    own = {node.name for tree in trees.values() for node in ast.walk(tree)
           if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    private = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.attr not in own
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))):
                private.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not private, private


def test_bad_data(data):
    X, y = data
    with pytest.raises(ValueError, match="y is None"):
        fit_ensemble(KernelAttentionRegressor(), X, None)
    with pytest.raises(ValueError):
        fit_ensemble(KernelAttentionRegressor(), X, y[:5])


def test_cli_and_experiments_pass_ensemble_through(monkeypatch, tmp_path):
    from minip_learn import cli, experiments

    seen = {}

    def fake_sweep(*args, **kwargs):
        seen.setdefault("ensemble", []).append(kwargs.get("ensemble"))
        raise KeyboardInterrupt  # stop the recipe right after its first sweep call

    monkeypatch.setattr(experiments._shared, "rank_sweep", fake_sweep)
    for name in ("witness", "length"):
        with pytest.raises(KeyboardInterrupt):
            experiments.run_experiment(name, ensemble=True, progress=False, figures=False)
    assert seen["ensemble"] == [True, True]

    captured = {}

    def fake_run(name, **kwargs):
        captured.update(kwargs)
        raise ValueError("stop")  # main reports it and returns 2

    monkeypatch.setattr(experiments, "run_experiment", fake_run)
    assert cli.main(["reproduce", "witness", "--ensemble", "--no-progress",
                     "--out", str(tmp_path)]) == 2
    assert captured["ensemble"] is True


@pytest.mark.parametrize("init_scale, refits", [(0.1, False), (60.0, True)])
def test_a_deferred_underflow_check_refits_on_the_positions(monkeypatch, init_scale, refits):
    # with check_every > 1 the pair form's underflow check stays on the device until a
    # check; log-features drawn with a spread of 60 put occurring pairs' kernel values
    # below float32's range (e^-60 and less against the largest), so the stack is
    # refitted on the positions: the trajectory of a fit that checks at every forward
    # (check_every=1), which falls back to the positions on each of them
    from minip_learn.datasets import make_witness_suite
    from minip_learn.nn import ensemble
    from minip_learn.training import train_members

    s = make_witness_suite(8, 3)
    X, y = (torch.as_tensor(a, dtype=torch.float32) for a in (s.X, s.y))
    vocab = torch.unique(X.reshape(-1, 8), dim=0)
    built = []
    init = ensemble.HeadEnsemble.__init__
    monkeypatch.setattr(ensemble.HeadEnsemble, "__init__",
                        lambda self, *a, **k: (built.append(self), init(self, *a, **k))[1])
    params = dict(n_bits=8, rank=4, feature_map="table",
                  feature_kwargs=dict(vocabulary=vocab, init_scale=init_scale))
    fits = {}
    for check_every in (1, 4):
        built.clear()
        fits[check_every] = train_members(KernelAttentionHead, [(params, 0)], X, y, lr=0.05,
                                          max_epochs=10, check_every=check_every)
        if check_every == 4:
            assert len(built) == (2 if refits else 1)
            assert [e.pair_path for e in built] == [True, False][:len(built)]
            assert built[0].pair_underflowed() is refits
    assert fits[4].path == fits[1].path == ("single" if refits else "fused-pairs")
    a, b = (dict(f.members[0].net.module_.named_parameters()) for f in fits.values())
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0 if refits else 1e-6)
    assert [h["train_loss"] for h in fits[4].members[0].net.history] == pytest.approx(
        [h["train_loss"] for h in fits[1].members[0].net.history], rel=1e-5)
