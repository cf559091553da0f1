"""Mamba's final-query form: the closed form of the last state's readout
(:func:`~minip_learn.nn.mixers.mamba.selective_readouts`, a hand-written backward over
blocks of rows) equals the token-by-token scan in value and in the gradient of every
parameter, in float64 and float32, in blocks and in member stacks."""

import pytest
import torch
from torch.func import functional_call, vmap

from minip_learn.nn import HeadEnsemble, make_mixer
from minip_learn.nn.mixers import mamba
from minip_learn.nn.mixers.mamba import MambaMixer, selective_readouts

N_BITS, STATE, VALUE_DIM = 5, 3, 4


def _mixer(seed=0, dtype=torch.float64, state=STATE, value_dim=VALUE_DIM, bias=0.5):
    """A mixer with parameters away from their initialisation and steps Delta of order
    1 (the decays exp(Delta A) matter)."""
    torch.manual_seed(seed)
    mixer = make_mixer("mamba", N_BITS, state, value_dim=value_dim).to(dtype)
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.3 * torch.randn_like(p))
        mixer.delta.bias.fill_(bias)
    return mixer


def _tokens(batch=4, seq_len=9, seed=1, dtype=torch.float64):
    torch.manual_seed(seed)
    bits = torch.randint(0, 2, (batch, seq_len, N_BITS)).to(dtype)
    return torch.cat([bits, torch.randn(batch, seq_len, N_BITS, dtype=dtype)])


def _scan_last(mixer, x):
    """The reference: the state of :meth:`MambaMixer.step` carried over the tokens one
    at a time and read out once."""
    m = mixer.token_maps(x)
    h = mixer.initial_state(x.shape[0], dtype=x.dtype, device=x.device)[0]
    for t in range(x.shape[1]):
        h = MambaMixer._advance(h, m.delta[:, t], m.v[:, t], m.B[:, t], m.A)
    return (h * m.C[:, -1, None, :]).sum(-1) + mixer.D * m.v[:, -1]


def _grads(mixer, out):
    return torch.autograd.grad(out.square().sum(), list(mixer.parameters()),
                               allow_unused=True)


def _assert_same_grads(a, b, **tol):
    for ga, gb in zip(a, b):
        if ga is None or gb is None:  # the readout does not enter the mixed vectors
            assert ga is None and gb is None
        else:
            torch.testing.assert_close(ga, gb, **tol)


def _reference_readouts(steps, keys, A):
    return (keys[..., :, None, :] * torch.exp(A[..., None, :, :] * steps[..., None])).sum(-1)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few rows and of a few sequences: every form runs over several,
    the last one partial."""
    monkeypatch.setattr(mamba, "SCAN_BLOCK_FLOATS", 5 * STATE * VALUE_DIM)
    monkeypatch.setattr(MambaMixer, "LAST_BLOCK_FLOATS", 3 * STATE * VALUE_DIM)


# -- the closed form ---------------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 4, 100])
@pytest.mark.parametrize("lead", [(), (2,)])
def test_selective_readouts_is_its_formula_with_its_gradient(rows, lead):
    torch.manual_seed(0)
    steps = (3 * torch.rand(*lead, 11, 4, dtype=torch.float64)).requires_grad_()
    keys = torch.randn(*lead, 11, 3, dtype=torch.float64, requires_grad=True)
    A = (-2 * torch.rand(*lead, 4, 3, dtype=torch.float64)).requires_grad_()
    torch.testing.assert_close(selective_readouts(steps, keys, A, rows=rows),
                               _reference_readouts(steps, keys, A), rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(
        lambda s, k, a: selective_readouts(s, k, a, rows=rows), (steps, keys, A))


@pytest.mark.parametrize("need", [(True, False, False), (False, True, False),
                                  (False, False, True), (False, True, True)])
def test_selective_readouts_differentiates_only_what_asks_for_it(need):
    torch.manual_seed(1)
    inputs = [3 * torch.rand(7, 2, dtype=torch.float64),
              torch.randn(7, 5, dtype=torch.float64),
              -torch.rand(2, 5, dtype=torch.float64)]
    for t, n in zip(inputs, need):
        t.requires_grad_(n)
    assert torch.autograd.gradcheck(lambda *t: selective_readouts(*t, rows=3), inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decays_below_the_normal_range_stay_finite_and_negligible(dtype):
    # exponents far below the smallest normal number: each decay is held at the square
    # root of the smallest normal number (2**-63 in float32), so a write it weighs
    # counts for at most that much
    steps = torch.tensor([[0.0, 1e3], [5.0, 1e4]], dtype=dtype, requires_grad=True)
    keys = torch.ones(2, 3, dtype=dtype, requires_grad=True)
    A = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]], dtype=dtype,
                     requires_grad=True)
    out = selective_readouts(steps, keys, A)
    ref = _reference_readouts(steps.detach().double(), keys.detach().double(),
                              A.detach().double())
    held = torch.finfo(dtype).tiny ** 0.5
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=A.shape[1] * held)
    out.sum().backward()
    for t in (steps, keys, A):
        assert torch.isfinite(t.grad).all()


def test_selective_readouts_under_vmap_is_each_members():
    torch.manual_seed(2)
    steps = 2 * torch.rand(9, 4, dtype=torch.float64)  # shared (not vmapped)
    keys = torch.randn(3, 9, 5, dtype=torch.float64)
    A = (-torch.rand(4, 5, 3, dtype=torch.float64)).requires_grad_()  # vmapped on dim 2
    out = vmap(lambda k, a: selective_readouts(steps, k, a, rows=4),
               in_dims=(0, 2))(keys, A)
    ref = torch.stack([_reference_readouts(steps, keys[i], A[..., i]) for i in range(3)])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    g = torch.autograd.grad(out.square().sum(), A)[0]
    g_ref = torch.autograd.grad(ref.square().sum(), A)[0]
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


# -- the mixer -----------------------------------------------------------------------------
@pytest.mark.parametrize("seq_len", [1, 2, 9, 60])
def test_attend_last_is_the_scan_in_value_and_gradient(seq_len, small_blocks):
    mixer, x = _mixer(), _tokens(seq_len=seq_len)
    ref = _scan_last(mixer, x)
    got = mixer.attend_last(x)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got, mixer.attend_recurrent(x)[:, -1], rtol=1e-10,
                               atol=1e-12)
    torch.testing.assert_close(got, mixer.attend(x)[:, -1], rtol=1e-9, atol=1e-10)
    assert got.std() > 1e-3  # not a constant: the comparison can fail
    _assert_same_grads(_grads(mixer, mixer(x, last=True)),
                       _grads(mixer, mixer.readout(x[:, -1:], ref[:, None])),
                       rtol=1e-9, atol=1e-10)


def test_the_final_query_form_is_the_whole_sequence_forms_last_position(small_blocks):
    mixer, x = _mixer(seed=3), _tokens(batch=7, seq_len=13, seed=4)
    full, last = mixer(x)[:, -1:], mixer(x, last=True)
    torch.testing.assert_close(last, full, rtol=1e-10, atol=1e-12)
    _assert_same_grads(_grads(mixer, full), _grads(mixer, last), rtol=1e-9, atol=1e-10)


def test_gradcheck_of_every_parameter(small_blocks):
    mixer, x = _mixer(seed=5), _tokens(batch=2, seq_len=6, seed=6)
    names = [n for n, _ in mixer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in mixer.parameters())

    def last(*values):
        return functional_call(mixer, dict(zip(names, values)), (x,), {"last": True})

    assert torch.autograd.gradcheck(last, params)


def test_float32_is_the_scan_to_rounding():
    mixer, x = _mixer(seed=7, dtype=torch.float32, state=80, value_dim=12, bias=1.0), \
        _tokens(batch=6, seq_len=53, seed=8, dtype=torch.float32)
    ref64 = _scan_last(mixer.double(), x.double())
    mixer.float()
    ref, got = _scan_last(mixer, x), mixer.attend_last(x)
    scale = ref64.abs().max()
    assert (got.double() - ref64).abs().max() <= 1e-5 * scale
    assert (ref.double() - ref64).abs().max() <= 1e-5 * scale
    _assert_same_grads(_grads(mixer, got), _grads(mixer, ref), rtol=1e-3, atol=1e-4)


def test_a_stack_of_mixers_computes_each_members_last_position():
    mixers = [_mixer(seed=i) for i in range(3)]
    ens = HeadEnsemble(mixers)
    x = _tokens(seq_len=11, seed=9)
    out = ens(x, last=True)
    assert out.shape == (3, x.shape[0], 1)
    params = list(ens.parameters())
    assert len(params) == len(list(mixers[0].parameters()))
    g_stack = torch.autograd.grad(out.square().sum(), params, allow_unused=True)
    for i in range(3):
        member = _mixer(seed=i)  # the same parameters as member i
        ref = member.readout(x[:, -1:], _scan_last(member, x)[:, None])
        torch.testing.assert_close(out[i], ref, rtol=1e-10, atol=1e-12)
        g_ref = torch.autograd.grad(ref.square().sum(), list(member.parameters()),
                                    allow_unused=True)
        for g, r in zip(g_stack, g_ref):
            if g is None or r is None:
                assert r is None or not r.abs().any()
            else:
                torch.testing.assert_close(g[i], r, rtol=1e-9, atol=1e-10)


def test_the_blocks_hold_a_set_number_of_floats(monkeypatch):
    mixer, x = _mixer(), _tokens(batch=2, seq_len=5)
    seen = []
    real = mamba.selective_readouts

    def spy(steps, keys, A, *, rows):
        seen.append(rows)
        return real(steps, keys, A, rows=rows)

    monkeypatch.setattr(mamba, "selective_readouts", spy)
    mixer.attend_last(x)
    assert seen == [mamba.SCAN_BLOCK_FLOATS // (STATE * VALUE_DIM)]
