"""The sequence mixers (minip_learn.nn.mixers): the whole-sequence form equals the
token-by-token recurrence, outputs are causal, the declared state is the state carried,
the registry and user mixers; and flash-linear-attention's naive reference recurrences
(``fla.ops.*.naive``) agree with the built-ins when the ``fla`` extra is installed."""

import importlib
import pkgutil
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import minip_learn.nn.mixers
from minip_learn.nn import (
    Mixer,
    UserMixer,
    available_mixers,
    check_mixer_output,
    get_mixer,
    make_mixer,
    mixer_table,
)
from minip_learn.nn.mixers import decayed_scores

#: every registered mixer: the built-ins, registered by importing the package
BUILT_INS = available_mixers()
N_BITS, STATE, VALUE_DIM = 5, 3, 4


def _data_kwargs(name, seq_len, **kwargs):
    """``kwargs`` with what the mixer takes from training sequences of ``seq_len``
    tokens (e.g. the ``max_len`` of learned positional weights)."""
    X = np.zeros((1, seq_len, N_BITS), dtype=np.uint8)
    return {**kwargs, **get_mixer(name).data_kwargs(X, **kwargs)}


def _mixer(name, seed=0, state=STATE, value_dim=VALUE_DIM, **kwargs):
    """A built-in mixer in float64 with parameters away from their initialisation (so
    that every part of the recurrence matters: Mamba's steps, GLA's gates ...)."""
    torch.manual_seed(seed)
    kwargs = _data_kwargs(name, 64, **kwargs)
    mixer = make_mixer(name, N_BITS, state, value_dim=value_dim, **kwargs).double()
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.3 * torch.randn_like(p))
        if name == "mamba":  # steps Delta of order 1: the decays exp(Delta A) matter
            mixer.delta.bias.fill_(0.5)
        if name == "gla":  # gates well inside (0, 1)
            mixer.gate.bias.fill_(1.0)
    return mixer


def _tokens(batch=3, seq_len=9, seed=1):
    torch.manual_seed(seed)
    bits = torch.randint(0, 2, (batch, seq_len, N_BITS)).double()
    return torch.cat([bits, torch.randn(batch, seq_len, N_BITS, dtype=torch.float64)])


# -- the two forms, causality, the state --------------------------------------------------
@pytest.mark.parametrize("name", BUILT_INS)
def test_recurrent_form_equals_the_whole_sequence_form(name):
    mixer, x = _mixer(name), _tokens()
    y = mixer(x)
    assert y.shape == x.shape[:2]
    torch.testing.assert_close(mixer.recurrent(x), y, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(mixer.attend_recurrent(x), mixer.attend(x), rtol=1e-9,
                               atol=1e-10)
    assert y.std() > 1e-3  # not a constant: the comparison can fail


def test_mamba_forward_runs_the_scan_which_equals_its_parallel_form():
    mixer, x = _mixer("mamba"), _tokens()
    assert mixer.forward_form == "recurrent"  # training runs the selective scan
    u = mixer.attend(x)  # the parallel form
    torch.testing.assert_close(mixer.mix(x), u, rtol=1e-9, atol=1e-10)
    assert torch.equal(mixer.mix(x), mixer.attend_recurrent(x))
    assert torch.equal(mixer(x), mixer.readout(x, mixer.attend_recurrent(x)))
    assert u.std() > 1e-3


@pytest.mark.parametrize("name", BUILT_INS)
def test_forward_is_the_readout_of_the_declared_form(name):
    mixer, x = _mixer(name), _tokens()
    assert mixer.forward_form in ("parallel", "recurrent")
    form = mixer.attend if mixer.forward_form == "parallel" else mixer.attend_recurrent
    torch.testing.assert_close(mixer(x), mixer.readout(x, form(x)), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", BUILT_INS)
@pytest.mark.parametrize("seq_len", [1, 9, 60])
def test_the_final_query_form_is_the_last_position_and_its_gradient(name, seq_len):
    # 60 tokens: two chunks of the chunked forms
    mixer, x = _mixer(name), _tokens(seq_len=seq_len)
    full = mixer(x)[:, -1:]
    last = mixer(x, last=True)
    assert last.shape == (x.shape[0], 1)
    torch.testing.assert_close(last, full, rtol=1e-9, atol=1e-10)
    grads = [torch.autograd.grad(out.sum(), list(mixer.parameters()), allow_unused=True)
             for out in (full, mixer(x, last=True))]
    for a, b in zip(*grads):
        if a is None or b is None:
            assert a is None or not a.abs().any()
            continue
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("name", [n for n in BUILT_INS
                                  if get_mixer(n).attend_last is not Mixer.attend_last])
def test_the_final_query_form_builds_no_whole_sequence_form(name, monkeypatch):
    mixer, x = _mixer(name), _tokens(seq_len=40)
    expected = mixer(x)[:, -1:]
    for owner in (type(mixer), type(getattr(mixer, "head", mixer))):
        for method in ("attend", "attend_recurrent", "mix", "attention_weights", "scores"):
            if hasattr(owner, method):
                monkeypatch.setattr(owner, method, _refuse)
    torch.testing.assert_close(mixer(x, last=True), expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", BUILT_INS)
def test_the_final_query_form_in_blocks_of_sequences_is_the_same(name, monkeypatch):
    mixer, x = _mixer(name), _tokens(seq_len=12)
    whole = mixer(x, last=True)
    monkeypatch.setattr(Mixer, "LAST_BLOCK_FLOATS", 1)  # one sequence per block
    calls = []
    attend_last = type(mixer).attend_last
    monkeypatch.setattr(type(mixer), "attend_last",
                        lambda self, part: calls.append(len(part)) or attend_last(self, part))
    torch.testing.assert_close(mixer(x, last=True), whole, rtol=1e-12, atol=1e-12)
    assert calls == [1] * len(x)


def _refuse(*args, **kwargs):
    raise AssertionError("the final-query form ran a whole-sequence form")


def test_every_built_in_declares_its_final_query_form():
    assert [n for n in BUILT_INS if get_mixer(n).attend_last is Mixer.attend_last] == []


@pytest.mark.parametrize("name", BUILT_INS)
def test_outputs_are_causal(name):
    mixer, x = _mixer(name), _tokens(seq_len=8)
    y = mixer(x)
    for i in (0, 3, 6):
        changed = x.clone()
        changed[:, i + 1:] = torch.randn_like(changed[:, i + 1:])
        z = mixer(changed)
        torch.testing.assert_close(z[:, :i + 1], y[:, :i + 1], rtol=1e-10, atol=1e-12)
        assert (z[:, i + 1:] - y[:, i + 1:]).abs().max() > 1e-6  # later outputs do change


def formula_floats(formula, r, d, n):
    """The value of a ``state_formula`` such as ``"r (d + 1)"`` (juxtaposition is a
    product) at ``r``, ``d`` and ``N = n``."""
    expression = re.sub(r"(?<=[\w)])\s+(?=[\w(])", "*", formula)
    assert re.fullmatch(r"[rdN0-9+*() ]+", expression), formula
    return eval(expression, {"__builtins__": {}}, {"r": r, "d": d, "N": n})


def test_formula_floats():
    assert formula_floats("r (d + 1)", 3, 4, 7) == 15
    assert formula_floats("N (r + d)", 3, 4, 7) == 49
    assert formula_floats("d r", 3, 4, 7) == 12


@pytest.mark.parametrize("name", BUILT_INS)
def test_state_floats_is_the_state_carried(name):
    mixer, x = _mixer(name), _tokens(seq_len=7)
    _, state = mixer.attend_recurrent(x, return_state=True)
    carried = sum(t[0].numel() for t in state)  # per sequence
    formula = get_mixer(name).state_formula
    if "N" in formula:  # a state that grows with the tokens (softmax's cache)
        assert mixer.state_floats(7) == carried == formula_floats(formula, STATE, VALUE_DIM, 7)
        assert mixer.state_floats(20) == formula_floats(formula, STATE, VALUE_DIM, 20)
        with pytest.raises(ValueError, match="seq_len"):
            mixer.state_floats()
    else:
        assert mixer.state_floats() == mixer.state_floats(1000) == carried
        assert carried == formula_floats(formula, STATE, VALUE_DIM, 7)
        _, short = mixer.attend_recurrent(x[:, :2], return_state=True)
        assert [t.shape for t in short] == [t.shape for t in state]  # fixed size


@pytest.mark.parametrize("name", BUILT_INS)
def test_gradients_reach_every_parameter(name):
    mixer, x = _mixer(name), _tokens()
    (mixer(x) ** 2).mean().backward()
    for pname, p in mixer.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().max() > 0, pname


@pytest.mark.parametrize("name", BUILT_INS)
def test_float32_forms_agree_and_empty_sequences(name):
    mixer, x = _mixer(name).float(), _tokens().float()
    torch.testing.assert_close(mixer.recurrent(x), mixer(x), rtol=1e-4, atol=1e-5)
    assert mixer.attend_recurrent(x[:, :0]).shape == (len(x), 0, VALUE_DIM)


def test_decayed_scores_blocks_equal_one_block(monkeypatch):
    from minip_learn.nn.ops import masks

    torch.manual_seed(0)
    q, k = torch.randn(2, 11, 3, dtype=torch.float64), torch.randn(2, 11, 3,
                                                                   dtype=torch.float64)
    log_cum = (-torch.rand(2, 11, 3, dtype=torch.float64)).cumsum(-2)
    whole = decayed_scores(q, k, log_cum)
    monkeypatch.setattr(masks, "DECAY_BLOCK_ELEMENTS", 2 * 11 * 3 * 4)  # 4 rows a block
    torch.testing.assert_close(decayed_scores(q, k, log_cum), whole)
    # the definition, one entry at a time
    t, j = 7, 4
    ref = (q[:, t] * k[:, j] * torch.exp(log_cum[:, t] - log_cum[:, j])).sum(-1)
    torch.testing.assert_close(whole[:, t, j], ref)
    assert (whole[:, j, t] == 0).all()


def test_decayed_scores_are_stable_for_long_decays():
    # cumulative log-decays far below the float range: no overflow, no NaN gradient
    n = 400
    log_cum = torch.full((1, n, 2), -5.0, dtype=torch.float64, requires_grad=True)
    q = k = torch.ones(1, n, 2, dtype=torch.float64)
    scores = decayed_scores(q, k, log_cum.cumsum(-2))
    assert torch.isfinite(scores).all()
    scores.sum().backward()
    assert torch.isfinite(log_cum.grad).all()


# -- independent formulations ------------------------------------------------------------
def test_deltanet_equals_the_delta_rule_written_out():
    mixer, x = _mixer("deltanet"), _tokens(seq_len=6)
    m = mixer.token_maps(x)
    S = torch.zeros(len(x), STATE, VALUE_DIM, dtype=torch.float64)
    outs = []
    for t in range(x.shape[1]):
        k, v, beta = m.k[:, t], m.v[:, t], m.beta[:, t, None, None]
        eye = torch.eye(STATE, dtype=torch.float64)
        S = (eye - beta * k[:, :, None] * k[:, None, :]) @ S + beta * k[:, :, None] * v[:, None]
        outs.append((S * m.q[:, t, :, None]).sum(1))
    torch.testing.assert_close(mixer.attend(x), torch.stack(outs, 1))
    torch.testing.assert_close(m.k.norm(dim=-1), torch.ones(x.shape[:2], dtype=torch.float64))


def test_gla_gates_follow_the_temperature():
    mixer = _mixer("gla", gate_temperature=4.0)
    x = _tokens()
    alpha = torch.exp(mixer.token_maps(x).log_alpha)
    torch.testing.assert_close(alpha, torch.sigmoid(mixer.gate(x)) ** 0.25)


def test_kernel_mixer_with_a_log_domain_map_carries_the_running_maximum():
    mixer, x = _mixer("kernel", feature_map="exp"), _tokens()
    torch.testing.assert_close(mixer.recurrent(x), mixer(x), rtol=1e-9, atol=1e-10)
    u, state = mixer.attend_recurrent(x, return_state=True)
    torch.testing.assert_close(u, mixer.attend(x), rtol=1e-9, atol=1e-10)
    assert mixer.state_floats() == sum(t[0].numel() for t in state) == STATE * (VALUE_DIM + 2)


def test_kernel_theorem_follows_the_sign_of_the_kernel():
    assert make_mixer("kernel", N_BITS, STATE).theorem == "yes"
    assert make_mixer("kernel", N_BITS, STATE, feature_map="identity").theorem == "no"
    assert make_mixer("retnet", N_BITS, STATE).theorem == "positional"
    assert make_mixer("retnet", N_BITS, STATE, feature_map="identity").theorem == "no"


def test_retnet_without_decay_is_the_kernel_mixer():
    x = _tokens()
    kernel, retnet = _mixer("kernel", seed=4), _mixer("retnet", seed=4, decay=1.0)
    torch.testing.assert_close(retnet(x), kernel(x))
    decayed = _mixer("retnet", seed=4, decay=0.5)
    assert (decayed(x) - kernel(x)).abs().max() > 1e-3


def test_kernel_and_softmax_mixers_are_the_causal_heads():
    kernel, softmax = _mixer("kernel"), _mixer("softmax")
    assert kernel.head.causal and softmax.head.causal
    assert (kernel.head.rank, softmax.head.score_dim) == (STATE, STATE)
    assert _mixer("retnet", decay=0.75).head.decay == 0.75
    x = _tokens()
    torch.testing.assert_close(softmax.attend(x), softmax.head.attention_weights(x)
                               @ softmax.head.value(x))


# -- the registry --------------------------------------------------------------------------
def _package_mixers():
    """The mixer classes the modules of minip_learn.nn.mixers register."""
    package = minip_learn.nn.mixers
    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found |= {cls for cls in vars(module).values()
                  if isinstance(cls, type) and issubclass(cls, Mixer)
                  and cls.__module__ == module.__name__ and cls.name is not None}
    return found


def test_registry_lists_the_built_ins():
    assert {cls.name: cls for cls in _package_mixers()} == {
        name: get_mixer(name) for name in BUILT_INS}
    assert available_mixers() == sorted(BUILT_INS)
    assert "kernel" in available_mixers(theorem="yes")
    assert {"positional", "retnet"} <= set(available_mixers(theorem="positional"))
    rows = mixer_table()
    assert [row["name"] for row in rows] == BUILT_INS
    for theorem in ("yes", "positional", "no"):  # the filter reads the table's column
        assert available_mixers(theorem=theorem) == [
            row["name"] for row in rows if row["theorem"] == theorem]
    for row in rows:
        cls = get_mixer(row["name"])
        assert issubclass(cls, Mixer) and cls.name == row["name"]
        assert row["theorem"] == cls.theorem in ("yes", "positional", "no")
        assert row["paper"] and row["state"]
        assert row["class"].endswith(cls.__qualname__)
    assert {row["name"]: row["state"] for row in rows}["softmax"] == "N (r + d)"


@pytest.mark.parametrize("name", BUILT_INS)
def test_make_mixer_builds_the_class_with_its_options(name):
    kwargs = _data_kwargs(name, 4)
    mixer = make_mixer(name, N_BITS, STATE, value_dim=2, **kwargs)
    assert type(mixer) is get_mixer(name)
    assert isinstance(mixer, Mixer)
    assert (mixer.n_bits, mixer.state_size, mixer.value_dim) == (N_BITS, STATE, 2)
    assert mixer(torch.zeros(2, 4, N_BITS)).shape == (2, 4)
    assert get_mixer(type(mixer)) is type(mixer)
    check_mixer_output(mixer, torch.rand(2, 4, N_BITS), name)


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="Unknown mixer 'lstm'.*'deltanet'"):
        get_mixer("lstm")
    with pytest.raises(ValueError, match="Unknown mixer 3"):
        make_mixer(3, N_BITS, STATE)


def test_register_mixer_refuses_duplicates_and_undeclared_theorems():
    from minip_learn.nn import register_mixer

    with pytest.raises(ValueError, match="already registered"):
        register_mixer("gla")(type("Again", (Mixer,), {"theorem": "no"}))
    with pytest.raises(ValueError, match="theorem"):
        register_mixer("test-undeclared")(type("Undeclared", (Mixer,), {}))
    assert "test-undeclared" not in available_mixers()
    conditional = type("Conditional", (Mixer,), {"theorem": "yes",
                                                 "meets_theorem_condition": lambda self: False})
    with pytest.raises(ValueError, match="must declare theorem_condition"):
        register_mixer("test-conditional")(conditional)
    with pytest.raises(ValueError, match="forward_form"):
        register_mixer("test-form")(type("Form", (Mixer,), {"theorem": "no",
                                                            "forward_form": "chunked"}))
    assert not {"test-conditional", "test-form"} & set(available_mixers())


def test_unregister_mixer_removes_a_name():
    from minip_learn.nn import register_mixer, unregister_mixer

    cls = register_mixer("test-unregister")(type("Gone", (Mixer,), {"theorem": "no"}))
    assert "test-unregister" in available_mixers()
    assert unregister_mixer("test-unregister") is cls
    assert "test-unregister" not in available_mixers()
    with pytest.raises(KeyError, match="'test-unregister' is not registered"):
        unregister_mixer("test-unregister")


@pytest.mark.parametrize("name", BUILT_INS)
def test_an_instance_reads_the_class_theorem_and_cannot_set_it(name):
    mixer, cls = _mixer(name), get_mixer(name)
    assert mixer.theorem == cls.theorem  # default options: the class's declaration
    with pytest.raises(AttributeError, match="an instance cannot set it"):
        mixer.theorem = "yes"
    assert mixer.meets_theorem_condition() or cls.theorem_condition


def test_an_instance_outside_the_theorem_condition_reads_no():
    for name in available_mixers():
        cls = get_mixer(name)
        row = next(row for row in mixer_table() if row["name"] == name)
        assert row["theorem_condition"] == cls.theorem_condition
    signed = make_mixer("kernel", N_BITS, STATE, feature_map="identity")
    assert not signed.meets_theorem_condition() and signed.theorem == "no"
    assert type(signed).theorem == "yes" and type(signed).theorem_condition


def test_token_maps_are_declared_dataclasses():
    from dataclasses import fields, is_dataclass

    from minip_learn.nn.mixers import TokenMaps

    x = _tokens()
    for name in ("linear", "gla", "deltanet", "mamba"):
        m = _mixer(name).token_maps(x)
        assert isinstance(m, TokenMaps) and is_dataclass(m)
        assert all(isinstance(getattr(m, f.name), torch.Tensor) for f in fields(m))
    with pytest.raises(NotImplementedError, match="declares no per-token maps"):
        _mixer("softmax").token_maps(x)


@pytest.mark.parametrize("kwargs", [{}, {"feature_map": "exp"}, {"positional": "decay",
                                                                  "decay": 0.8},
                                    {"positional": "learned", "max_len": 9}])
def test_kernel_head_step_is_its_recurrence(kwargs):
    from minip_learn.nn import KernelAttentionHead

    torch.manual_seed(0)
    head = KernelAttentionHead(N_BITS, STATE, value_dim=VALUE_DIM, causal=True,
                               **kwargs).double()
    x = _tokens()
    state = head.initial_state((len(x),), dtype=x.dtype)
    outs = []
    for t in range(x.shape[1]):
        state, u = head.step(state, x[:, t], position=t)
        outs.append(u)
    y = head.readout(x, torch.stack(outs, 1))
    torch.testing.assert_close(y, head.recurrent(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, head(x), rtol=1e-9, atol=1e-10)
    with torch.no_grad():  # a rank mask: the step masks as the recurrent form does
        head.feature_mask = torch.tensor([1.0, 0.0, 1.0], dtype=x.dtype)
    state = head.initial_state((len(x),), dtype=x.dtype)
    masked = []
    for t in range(x.shape[1]):
        state, u = head.step(state, x[:, t], position=t)
        masked.append(u)
    torch.testing.assert_close(head.readout(x, torch.stack(masked, 1)), head.recurrent(x),
                               rtol=1e-12, atol=1e-12)


# -- user mixers ------------------------------------------------------------------------------
class LastTokenSum(nn.Module):
    """A user's mixer: a running sum of a linear map of the tokens."""

    def __init__(self, n_bits, state_size, *, scale=1.0):
        super().__init__()
        self.linear = nn.Linear(n_bits, 1)
        self.scale = scale

    def forward(self, x):
        return self.scale * self.linear(x).squeeze(-1).cumsum(-1)


def per_token_factory(n_bits, state_size):
    return nn.Sequential(nn.Linear(n_bits, state_size), nn.Linear(state_size, 1),
                         nn.Flatten(-2))


@pytest.mark.parametrize("user", [LastTokenSum, per_token_factory])
def test_user_class_and_factory_are_wrapped(user):
    assert get_mixer(user) is UserMixer
    mixer = make_mixer(user, N_BITS, STATE)
    assert isinstance(mixer, UserMixer)
    assert mixer.theorem is None and mixer.state_floats() is None
    x = torch.rand(2, 6, N_BITS)
    assert mixer(x).shape == (2, 6)
    check_mixer_output(mixer, x, user)
    assert mixer.name.endswith(user.__qualname__)
    (mixer(x) ** 2).sum().backward()
    assert all(p.grad is not None for p in mixer.parameters())
    torch.testing.assert_close(mixer(x, last=True), mixer(x)[:, -1:])
    with pytest.raises(NotImplementedError, match="no recurrent form"):
        mixer.recurrent(x)


def test_user_kwargs_reach_the_module():
    mixer = make_mixer(LastTokenSum, N_BITS, STATE, scale=2.5)
    assert mixer.module.scale == 2.5


def test_a_user_module_with_a_recurrent_form_is_used():
    class WithRecurrent(LastTokenSum):
        def recurrent(self, x):
            return torch.zeros(x.shape[:2])

    mixer = make_mixer(WithRecurrent, N_BITS, STATE)
    assert (mixer.recurrent(torch.ones(2, 3, N_BITS)) == 0).all()


def test_a_factory_that_builds_no_module_is_refused():
    with pytest.raises(ValueError, match="must build a torch.nn.Module"):
        make_mixer(lambda n_bits, state_size: "not a module", N_BITS, STATE)


class NaNMixer(nn.Module):
    def __init__(self, n_bits, state_size):
        super().__init__()

    def forward(self, x):
        out = x.sum(-1)
        out[0, -1] = float("nan")
        return out


class TupleMixer(NaNMixer):
    def forward(self, x):
        return (x.sum(-1),)


class BrokenMixer(NaNMixer):
    def forward(self, x):
        return x @ torch.ones(2, 2)  # n_bits != 2: a shape error inside the module


@pytest.mark.parametrize("user, message", [
    (nn.Linear, r"outputs of shape \(batch, seq_len\) = \(2, 6\); got shape \(2, 6, 3\)"),
    (NaNMixer, "NaN or infinite outputs on 1 of the 2 sequences"),
    (TupleMixer, "must return a torch.Tensor of outputs; got tuple"),
    (BrokenMixer, r"fails on tokens of shape \(2, 6, 5\)"),
])
def test_bad_user_mixers_raise_naming_the_mixer(user, message):
    mixer = make_mixer(user, N_BITS, STATE)
    name = f"{user.__module__}.{user.__qualname__}"
    with pytest.raises(ValueError, match=message) as info:
        check_mixer_output(mixer, torch.rand(2, 6, N_BITS), user)
    assert f"mixer={name!r}" in str(info.value)


def test_infinite_outputs_are_refused():
    mixer = make_mixer(lambda n_bits, state_size: LastTokenSum(n_bits, state_size,
                                                               scale=float("inf")),
                       N_BITS, STATE)
    with pytest.raises(ValueError, match="mixer='my mixer' returns NaN or infinite"):
        check_mixer_output(mixer, torch.rand(2, 6, N_BITS), "my mixer")


# -- flash-linear-attention's naive references ---------------------------------------------
FLA_REASON = (
    "flash-linear-attention's naive references (fla.ops.*.naive) are not importable: "
    "install the fla extra (pip install minip-learn[fla]) to compare with them"
)
fla_warnings = pytest.mark.filterwarnings("ignore::UserWarning")


def _fla(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Triton is not supported on current platform"
        return pytest.importorskip(module, reason=FLA_REASON)


# fla computes in float32 and scales the queries by K^-0.5 (K the key dimension), where
# it does, our queries are multiplied by K^0.5 before they go in
FLA_TOL = {"rtol": 1e-5, "atol": 1e-5}


def _heads(t):
    """(batch, T, K) -> (batch, T, 1, K): one head, fla's (B, T, H, K) layout."""
    return t.unsqueeze(2)


@fla_warnings
def test_linear_equals_fla_naive_recurrent_linear_attn():
    fla = _fla("fla.ops.linear_attn.naive")
    mixer, x = _mixer("linear"), _tokens()
    m = mixer.token_maps(x)
    ref, _ = fla.naive_recurrent_linear_attn(_heads(m.q), _heads(m.k),
                                             _heads(m.v), scale=1.0)
    torch.testing.assert_close(mixer.attend(x), ref[:, :, 0].double(), **FLA_TOL)


@fla_warnings
def test_gla_equals_fla_naive_recurrent_gla():
    fla = _fla("fla.ops.gla.naive")
    mixer, x = _mixer("gla"), _tokens()
    m = mixer.token_maps(x)
    ref, _ = fla.naive_recurrent_gla(_heads(m.q * STATE ** 0.5), _heads(m.k),
                                     _heads(m.v), _heads(m.log_alpha))
    torch.testing.assert_close(mixer.attend(x), ref[:, :, 0].double(), **FLA_TOL)


@fla_warnings
def test_deltanet_equals_fla_delta_rule_recurrence():
    fla = _fla("fla.ops.delta_rule.naive")
    mixer, x = _mixer("deltanet"), _tokens()
    m = mixer.token_maps(x)
    # (B, H, T, K) layout here
    ref, _ = fla.delta_rule_recurrence((m.q * STATE ** 0.5)[:, None], m.k[:, None],
                                       m.v[:, None], m.beta[:, None])
    torch.testing.assert_close(mixer.attend(x), ref[:, 0].double(), **FLA_TOL)


@fla_warnings
def test_mamba_equals_fla_naive_recurrent_gla_one_head_per_channel():
    # channel c of the SSM is GLA with one value: q = C_t, k = Delta_t[c] B_t,
    # v = v_t[c] and log-gates Delta_t[c] A[c]
    fla = _fla("fla.ops.gla.naive")
    mixer, x = _mixer("mamba"), _tokens()
    m = mixer.token_maps(x)
    q = m.C[:, :, None, :].expand(-1, -1, VALUE_DIM, -1)
    k = m.delta[..., None] * m.B[:, :, None, :]
    gk = m.delta[..., None] * m.A
    ref, _ = fla.naive_recurrent_gla(q * STATE ** 0.5, k, m.v[..., None], gk)
    ref = ref[..., 0].double() + mixer.D * m.v
    torch.testing.assert_close(mixer.attend(x), ref, **FLA_TOL)


@fla_warnings
def test_kernel_equals_fla_normalised_linear_attention():
    fla = _fla("fla.ops.linear_attn.naive")
    mixer, x = _mixer("kernel"), _tokens()
    head = mixer.head
    phi_q, phi_k = head.query_features(x), head.key_features(x)  # elu+1: positive
    ref, _ = fla.naive_recurrent_linear_attn(_heads(phi_q), _heads(phi_k),
                                             _heads(head.value(x)), scale=1.0,
                                             normalize=True)
    torch.testing.assert_close(mixer.attend(x), ref[:, :, 0].double(), **FLA_TOL)


@fla_warnings
def test_retnet_equals_fla_naive_retention_normalised():
    # fla's retention: one head decays by 1 - 2^-5 (our default), unnormalised; our
    # output is its numerator (values v) over its denominator (values 1)
    fla = _fla("fla.ops.retention.naive")
    mixer, x = _mixer("retnet"), _tokens()
    assert mixer.head.decay == 1 - 2 ** -5
    head = mixer.head
    q = (head.query_features(x) * STATE ** 0.5)[:, None]  # (B, H, T, K) layout
    k = head.key_features(x)[:, None]
    num = fla.naive_retention(q, k, head.value(x)[:, None])[:, 0]
    den = fla.naive_retention(q, k, torch.ones_like(x[:, None, :, :1]))[:, 0]
    torch.testing.assert_close(mixer.attend(x), (num / den).double(), **FLA_TOL)


# -- on a CUDA device ------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("name", BUILT_INS)
def test_mixer_on_cuda_equals_cpu_and_its_recurrence(name):
    cpu, x = _mixer(name), _tokens()
    gpu = _mixer(name).to("cuda")
    y = gpu(x.to("cuda"))
    assert y.device.type == "cuda"
    torch.testing.assert_close(y.cpu(), cpu(x), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(gpu.recurrent(x.to("cuda")), y, rtol=1e-9, atol=1e-10)
    assert y.std() > 1e-3


# flash-linear-attention's fused Triton kernels (chunked and fused-recurrent, on the
# GPU) against the float64 whole-sequence forms, on sequences of several chunks (state and
# value sizes of 16: the kernels' matrix blocks). The error is measured per position
# relative to the output's size there. Measured on an H200 (fla 0.6.0, Triton 3.6): the
# fused-recurrent kernels (float32) 1e-7 to 3e-6; the chunked ones, which multiply
# float32 blocks in TF32, 7e-4 to 1.8e-3; the delta rule's chunked kernel, bfloat16 only,
# 2.7e-2. A wrong gate, scale or mask is off by order one (the sequences reversed: > 1).
FUSED = {"state": 16, "value_dim": 16}
FUSED_RTOL = {"recurrent": 1e-4, "tf32": 1e-2, "bfloat16": 6e-2}


def fused_error(u, ref):
    """Largest error over positions of ``ref`` against ``u``, relative to ``|u|`` there."""
    ref = ref.double().cpu()
    return float(((u - ref).norm(dim=-1) / u.norm(dim=-1).clamp_min(1e-12)).max())


def _long():
    return _tokens(batch=2, seq_len=150, seed=2)


def _gpu(t, heads=True):
    t = _heads(t) if heads else t
    return t.float().cuda()


def _fused_case(name):
    """A mixer for the fused kernels, its per-token maps on ``_long()`` and its output."""
    mixer, x = _mixer(name, **FUSED), _long()
    return mixer, mixer.token_maps(x), mixer.attend(x)


def _close_to_fused(u, ref, dtype="tf32"):
    assert fused_error(u, ref) <= FUSED_RTOL[dtype]
    assert fused_error(u, ref.flip(-2)) > 0.1  # the comparison can fail


# One case per fused entry point, so that a test compiles one kernel family (Triton
# compiles and autotunes every kernel on its first call): ``case() -> (u, ref, dtype)``.
def _chunk_linear_attn():
    fla = _fla("fla.ops.linear_attn")
    _, m, u = _fused_case("linear")
    ref = fla.chunk_linear_attn(_gpu(m.q), _gpu(m.k), _gpu(m.v), scale=1.0,
                                normalize=False)[0]
    return u, ref[:, :, 0], "tf32"


def _fused_recurrent_linear_attn():
    fla = _fla("fla.ops.linear_attn")
    _, m, u = _fused_case("linear")
    ref = fla.fused_recurrent_linear_attn(_gpu(m.q), _gpu(m.k), _gpu(m.v), scale=1.0)[0]
    return u, ref[:, :, 0], "recurrent"


def _chunk_linear_attn_normalised():
    fla = _fla("fla.ops.linear_attn")
    x = _long()
    kernel = _mixer("kernel", **FUSED)
    head = kernel.head
    ref, _ = fla.chunk_linear_attn(_gpu(head.query_features(x)), _gpu(head.key_features(x)),
                                   _gpu(head.value(x)), scale=1.0, normalize=True)
    return kernel.attend(x), ref[:, :, 0], "tf32"


def _chunk_gla():
    fla = _fla("fla.ops.gla")
    _, m, u = _fused_case("gla")
    ref = fla.chunk_gla(_gpu(m.q), _gpu(m.k), _gpu(m.v), _gpu(m.log_alpha), scale=1.0)[0]
    return u, ref[:, :, 0], "tf32"


def _fused_recurrent_gla():
    fla = _fla("fla.ops.gla")
    _, m, u = _fused_case("gla")
    ref = fla.fused_recurrent_gla(_gpu(m.q), _gpu(m.k), _gpu(m.v), gk=_gpu(m.log_alpha),
                                  scale=1.0)[0]
    return u, ref[:, :, 0], "recurrent"


def _fused_recurrent_gla_mamba():
    # Mamba: channel c is GLA with one value (heads = channels, as in the naive test)
    fla = _fla("fla.ops.gla")
    mamba, m, u = _fused_case("mamba")
    q = m.C[:, :, None, :].expand(-1, -1, FUSED["value_dim"], -1)
    k = m.delta[..., None] * m.B[:, :, None, :]
    gk = m.delta[..., None] * m.A
    ref, _ = fla.fused_recurrent_gla(_gpu(q, False), _gpu(k, False),
                                     _gpu(m.v[..., None], False), gk=_gpu(gk, False),
                                     scale=1.0)
    return u, ref[..., 0].double().cpu() + mamba.D * m.v, "recurrent"


def _delta_rule_args(m):
    return (_gpu(m.q), _gpu(m.k), _gpu(m.v), m.beta[..., None].float().cuda())


def _fused_recurrent_delta_rule():
    fla = _fla("fla.ops.delta_rule")
    _, m, u = _fused_case("deltanet")
    ref = fla.fused_recurrent_delta_rule(*_delta_rule_args(m), scale=1.0)[0]
    return u, ref[:, :, 0], "recurrent"


def _chunk_delta_rule():
    fla = _fla("fla.ops.delta_rule")
    _, m, u = _fused_case("deltanet")
    half = [a.bfloat16() for a in _delta_rule_args(m)]  # bfloat16 only
    return u, fla.chunk_delta_rule(*half, scale=1.0)[0][:, :, 0], "bfloat16"


def _chunk_retention_normalised():
    fla = _fla("fla.ops.retention")
    x = _long()
    retnet = _mixer("retnet", **FUSED)
    head = retnet.head
    q, k = _gpu(head.query_features(x)), _gpu(head.key_features(x))
    num = fla.chunk_retention(q, k, _gpu(head.value(x)), scale=1.0)[0][:, :, 0]
    den = fla.chunk_retention(q, k, torch.ones_like(q), scale=1.0)[0][:, :, 0, :1]
    return retnet.attend(x), num.double() / den.double(), "tf32"


FUSED_CASES = {
    "linear-chunk_linear_attn": _chunk_linear_attn,
    "linear-fused_recurrent_linear_attn": _fused_recurrent_linear_attn,
    "kernel-chunk_linear_attn-normalize": _chunk_linear_attn_normalised,
    "gla-chunk_gla": _chunk_gla,
    "gla-fused_recurrent_gla": _fused_recurrent_gla,
    "mamba-fused_recurrent_gla-per-channel": _fused_recurrent_gla_mamba,
    "deltanet-fused_recurrent_delta_rule": _fused_recurrent_delta_rule,
    "deltanet-chunk_delta_rule": _chunk_delta_rule,
    "retnet-chunk_retention-normalised": _chunk_retention_normalised,
}


@cuda
@fla_warnings
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_mixer_equals_fla_fused_kernel(case):
    u, ref, dtype = FUSED_CASES[case]()
    _close_to_fused(u, ref, dtype)


# -- several state sizes in one stack ------------------------------------------------------
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("name, kwargs", [(n, {}) for n in BUILT_INS]
                         + [("kernel", {"feature_map": "exp"})])
def test_mixers_of_several_state_sizes_share_one_stack(name, kwargs, last):
    # each member padded to the largest state computes what it computes alone, and
    # its padding gets a zero gradient (zero padding, or the rank mask)
    from minip_learn.nn import HeadEnsemble

    sizes = (2, 5, 3)
    mixers = [_mixer(name, seed=i, state=r, **kwargs) for i, r in enumerate(sizes)]
    assert HeadEnsemble.stack_groups(mixers) == [[0, 1, 2]]
    ens = HeadEnsemble(mixers)
    assert ens.ranks == list(sizes) and ens.template.state_size == 5
    x = _tokens(seq_len=7)
    out = ens(x, last=last)
    weights = torch.randn(out.shape, dtype=out.dtype)
    grads = torch.autograd.grad((out * weights).sum(), list(ens.params))
    for i, mixer in enumerate(mixers):
        alone = mixer(x, last=last)
        torch.testing.assert_close(out[i], alone)
        own = torch.autograd.grad((alone * weights[i]).sum(), list(mixer.parameters()))
        for g, g_own in zip(grads, own):
            padded = torch.zeros_like(g[i])
            padded[tuple(slice(0, n) for n in g_own.shape)] = g_own
            torch.testing.assert_close(g[i], padded)


def test_mixers_without_a_padding_declaration_stack_one_state_size_at_a_time():
    from minip_learn.nn import HeadEnsemble

    def factory(n_bits, state_size):
        return nn.Sequential(nn.Linear(n_bits, state_size), nn.Linear(state_size, 1),
                             nn.Flatten(-2))

    users = [UserMixer(N_BITS, r, factory=factory) for r in (2, 3, 2)]
    assert HeadEnsemble.stack_groups(users) == [[0, 2], [1]]
    with pytest.raises(ValueError, match="declares a state_padding"):
        HeadEnsemble(users)
    hedgehog = [_mixer("linear", state=r, feature_map="hedgehog") for r in (2, 4)]
    assert HeadEnsemble.stack_groups(hedgehog) == [[0], [1]]
