"""Every registered mixer against a reference written here from its published recurrence.

Each reference is a loop over the positions ``t = 1 .. N``: it updates the state from the
token ``x_t`` by the recurrence of the mixer's paper and reads the output at ``t`` out of
it. It uses torch primitives on the mixer's own parameter tensors, read by attribute
(the weight and bias of each linear layer, ``A_log``, ``D``, the positional
log-weights); the maps, gates and helpers of the mixer and of ``minip_learn.nn.ops`` are
not called, every gate and feature is recomputed here from its formula. Options the
recurrence reads (RetNet's ``gamma``, GLA's temperature, softmax's temperature) are the
values the test passes, or, when it passes none, the defaults of the papers (RetNet's
first head, GLA's ``tau = 16``) and softmax's temperature 1.

Every form a mixer computes is compared, values and gradients with respect to the
tokens and every parameter, in float64: the whole sequence (``forward``, which training
runs, and the mixed vectors of ``attend`` and ``attend_recurrent``) and the last
position alone (``forward(x, last=True)``, which a final-query fit runs, and
``attend_last``), for sequences of 1, 2, 3 and 7 tokens, batches of 1 and 3, state sizes
1, 2 and 5, on binary and on real tokens.

The recurrences, with ``S_0 = 0``, the value ``v_t = V x_t + c`` of the token ``x_t`` and
the query-dependent affine readout ``y_t = <W x_t + w_0, u_t> + <c', x_t> + b_0``:

* ``kernel`` (normalised kernel attention, Katharopoulos et al. 2020 with the
  normaliser; the head ``u_i = sum_j alpha(x_i, x_j) v_j / sum_j alpha(x_i, x_j)``):
  ``S_t = S_{t-1} + phi_K(x_t) v_t^T``, ``s_t = s_{t-1} + phi_K(x_t)``,
  ``u_t = S_t^T phi_Q(x_t) / phi_Q(x_t)^T s_t``, ``phi(x) = elu(W x + b) + 1`` or
  ``exp(W x + b)``.
* ``retnet`` (Sun et al. 2023, retention normalised by its row sums):
  ``S_t = gamma S_{t-1} + phi_K(x_t) v_t^T``, ``s_t = gamma s_{t-1} + phi_K(x_t)``, the
  same read-out; ``gamma = 1 - 2^-5`` (RetNet's first head) by default.
* ``positional``: the kernel recurrence with the features ``exp(a_t) * phi_Q(x_t)`` and
  ``exp(b_t) * phi_K(x_t)`` of learned positional log-weights ``a``, ``b``.
* ``linear`` (Katharopoulos et al. 2020 without the normaliser):
  ``S_t = S_{t-1} + phi_K(x_t) v_t^T``, ``u_t = S_t^T phi_Q(x_t)``.
* ``gla`` (Yang et al. 2024): ``S_t = diag(alpha_t) S_{t-1} + k_t v_t^T``,
  ``u_t = S_t^T q_t``, ``alpha_t = sigmoid(W_a x_t + c_a)^(1 / tau)``, ``tau = 16`` by
  default.
* ``deltanet`` (Schlag et al. 2021; Yang et al. 2024):
  ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, ``u_t = S_t^T q_t``, unit
  ``q_t``, ``k_t`` and ``beta_t = sigmoid(<w_b, x_t> + c_b)``.
* ``mamba`` (Gu & Dao 2023, the selective scan of its reference code: ``A`` discretised
  by zero-order hold, ``exp(Delta A)``, and ``B`` to first order, ``Delta B``): per
  channel ``c``, ``h_t[c] = exp(Delta_t[c] A[c]) * h_{t-1}[c] + Delta_t[c] B_t v_t[c]``,
  ``u_t[c] = <C_t, h_t[c]> + D[c] v_t[c]``, ``Delta_t = softplus(W_D x_t + c_D)``,
  ``A = -exp(A_log)``, ``B_t = W_B x_t``, ``C_t = W_C x_t``.
* ``softmax`` (Vaswani et al. 2017, causal): the cache of the keys and values seen,
  ``u_t = sum_{j <= t} exp(s_tj) v_j / sum_{j <= t} exp(s_tj)``,
  ``s_tj = q_t^T k_j / tau``.

The last section checks the mixers' contracts: ``step`` from ``initial_state`` (batch
first, of the dtype and device asked) against the references, ``state_floats``, the
forms on the device of their tokens, the ``theorem`` declarations of subclasses, the
default final-query form and its blocks of sequences, the constructors' options
(feature maps, the signed kernel's guarded denominator, Mamba's and softmax's
initialisation), ``data_kwargs``, user mixers, the messages of ``check_mixer_output``,
and the blocks of :func:`~minip_learn.nn.mixers.mamba.selective_readouts`.
"""

import math

import pytest
import torch

from minip_learn.nn import available_mixers, make_mixer

N_BITS, VALUE_DIM = 4, 3
#: the longest sequence of the ``positional`` mixer's weights (one more than the
#: longest sequence tested: a row no sequence reads)
MAX_LEN = 8
SEQ_LENS = (1, 2, 3, 7)
#: (batch, state size, tokens): every pair of batch size (1, 3), state size (1, 2, 5)
#: and kind of tokens (binary, real) occurs
SUB_CASES = [(1, 1, "binary"), (3, 1, "real"), (3, 2, "binary"), (1, 2, "real"),
             (1, 5, "binary"), (3, 5, "real")]
#: RetNet's decay of its first head, ``1 - 2^-5`` (Sun et al. 2023)
RETNET_GAMMA = 1.0 - 2.0 ** -5
#: GLA's gate temperature (Yang et al. 2024)
GLA_TEMPERATURE = 16.0


# -- the formulas, written from the papers -------------------------------------------
def _affine(layer, x):
    """``W x + b`` from the weight and bias of the linear layer ``layer``."""
    out = x @ layer.weight.transpose(0, 1)
    return out if layer.bias is None else out + layer.bias


def _sigmoid(z):
    return 1.0 / (1.0 + torch.exp(-z))


def _softplus(z):
    return torch.log(1.0 + torch.exp(z))


def _elu_plus_one(z):
    """``elu(z) + 1``: ``z + 1`` for ``z > 0``, ``exp(z)`` otherwise."""
    return torch.where(z > 0, z + 1.0, torch.exp(torch.clamp(z, max=0.0)))


#: the feature maps the kernel references read, by name
FEATURES = {"elu+1": _elu_plus_one, "exp": torch.exp}


def _value(mixer, x_t):
    """The value ``v_t = V x_t + c``."""
    return _affine(mixer.value.linear, x_t)


def _readout(mixer, x, u):
    """``y = <W x + w_0, u> + <c', x> + b_0``, the affine readout of the query token."""
    weights = _affine(mixer.readout.query_weight, x)
    bias = _affine(mixer.readout.query_bias, x)[..., 0]
    return (weights * u).sum(-1) + bias


def _outer(a, b):
    """Batched ``a b^T`` of (batch, r) and (batch, d)."""
    return a[:, :, None] * b[:, None, :]


def _read(S, q):
    """Batched ``S^T q`` of (batch, r, d) and (batch, r)."""
    return (q[:, :, None] * S).sum(1)


def _normalised_kernel(mixer, x, options, *, gamma=1.0, positional=False):
    """``kernel``, ``retnet`` and ``positional``: the normalised kernel recurrence with
    the decay ``gamma`` and, with ``positional``, the learned positional log-weights."""
    head = mixer.head
    phi = FEATURES[options.get("feature_map", "elu+1")]
    batch, n, _ = x.shape
    S = x.new_zeros(batch, mixer.state_size, mixer.value_dim)
    s = x.new_zeros(batch, mixer.state_size)
    out = []
    for t in range(n):
        x_t = x[:, t]
        phi_q = phi(_affine(head.query_features.encoder, x_t))
        phi_k = phi(_affine(head.key_features.encoder, x_t))
        if positional:
            phi_q = torch.exp(head.position_query[t]) * phi_q
            phi_k = torch.exp(head.position_key[t]) * phi_k
        S = gamma * S + _outer(phi_k, _value(mixer, x_t))
        s = gamma * s + phi_k
        out.append(_read(S, phi_q) / (phi_q * s).sum(-1, keepdim=True))
    return torch.stack(out, 1)


def _kernel(mixer, x, options):
    return _normalised_kernel(mixer, x, options)


def _retnet(mixer, x, options):
    return _normalised_kernel(mixer, x, options, gamma=options.get("decay", RETNET_GAMMA))


def _positional(mixer, x, options):
    return _normalised_kernel(mixer, x, options, positional=True)


def _linear(mixer, x, options):
    S = x.new_zeros(x.shape[0], mixer.state_size, mixer.value_dim)
    out = []
    for t in range(x.shape[1]):
        x_t = x[:, t]
        phi_q = _elu_plus_one(_affine(mixer.query_features.encoder, x_t))
        phi_k = _elu_plus_one(_affine(mixer.key_features.encoder, x_t))
        S = S + _outer(phi_k, _value(mixer, x_t))
        out.append(_read(S, phi_q))
    return torch.stack(out, 1)


def _gla(mixer, x, options):
    tau = options.get("gate_temperature", GLA_TEMPERATURE)
    S = x.new_zeros(x.shape[0], mixer.state_size, mixer.value_dim)
    out = []
    for t in range(x.shape[1]):
        x_t = x[:, t]
        alpha = _sigmoid(_affine(mixer.gate, x_t)) ** (1.0 / tau)
        S = alpha[:, :, None] * S + _outer(_affine(mixer.key, x_t), _value(mixer, x_t))
        out.append(_read(S, _affine(mixer.query, x_t)))
    return torch.stack(out, 1)


def _deltanet(mixer, x, options):
    r = mixer.state_size
    eye = torch.eye(r, dtype=x.dtype)
    S = x.new_zeros(x.shape[0], r, mixer.value_dim)
    out = []
    for t in range(x.shape[1]):
        x_t = x[:, t]
        q, k = _affine(mixer.query, x_t), _affine(mixer.key, x_t)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True))
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True))
        beta = _sigmoid(_affine(mixer.beta, x_t))[:, :, None]  # (batch, 1, 1)
        S = (eye - beta * _outer(k, k)) @ S + beta * _outer(k, _value(mixer, x_t))
        out.append(_read(S, q))
    return torch.stack(out, 1)


def _mamba(mixer, x, options):
    A = -torch.exp(mixer.A_log)  # (d, r)
    h = x.new_zeros(x.shape[0], mixer.value_dim, mixer.state_size)
    out = []
    for t in range(x.shape[1]):
        x_t = x[:, t]
        delta = _softplus(_affine(mixer.delta, x_t))  # (batch, d)
        B, C = _affine(mixer.input_gate, x_t), _affine(mixer.output_gate, x_t)
        v = _value(mixer, x_t)
        h = torch.exp(delta[:, :, None] * A) * h + (delta * v)[:, :, None] * B[:, None, :]
        out.append((h * C[:, None, :]).sum(-1) + mixer.D * v)
    return torch.stack(out, 1)


def _softmax(mixer, x, options):
    head, tau = mixer.head, options.get("temperature", 1.0)
    keys, values, out = [], [], []
    for t in range(x.shape[1]):
        x_t = x[:, t]
        keys.append(_affine(head.key, x_t))
        values.append(_value(mixer, x_t))
        q = _affine(head.query, x_t)
        scores = torch.stack([(q * k).sum(-1) for k in keys], 1) / tau  # (batch, t + 1)
        weights = torch.exp(scores - scores.max(1, keepdim=True).values)
        weights = weights / weights.sum(1, keepdim=True)
        out.append((weights[:, :, None] * torch.stack(values, 1)).sum(1))
    return torch.stack(out, 1)


#: the reference of every mixer: ``reference(mixer, x, options)`` is the mixed vectors
#: ``u`` of shape (batch, N, value_dim)
REFERENCES = {
    "deltanet": _deltanet,
    "gla": _gla,
    "kernel": _kernel,
    "linear": _linear,
    "mamba": _mamba,
    "positional": _positional,
    "retnet": _retnet,
    "softmax": _softmax,
}

#: the mixers and options compared: every reference, its defaults and the options its
#: recurrence reads (another decay, temperature, feature map or form)
CASES = [
    ("kernel", {}),
    ("kernel", {"feature_map": "exp"}),
    ("retnet", {}),
    ("retnet", {"decay": 0.8}),
    ("retnet", {"decay": 0.7, "feature_map": "exp"}),
    ("positional", {"max_len": MAX_LEN}),
    ("positional", {"max_len": MAX_LEN, "feature_map": "exp"}),
    ("linear", {}),
    ("gla", {}),
    ("gla", {"gate_temperature": 2.0}),
    ("deltanet", {}),
    ("mamba", {}),
    ("mamba", {"dt_min": 0.3, "dt_max": 1.0}),  # steps of order 1: strong decays
    ("softmax", {}),
    ("softmax", {"temperature": 0.5}),
    ("softmax", {"temperature": 2.0, "algorithm": "fused"}),
]

#: every form a mixer computes: its call, and the reference value it equals (``y`` the
#: outputs, ``u`` the mixed vectors, ``_last`` at the last position)
FORMS = {
    "forward": (lambda mixer, x: mixer(x), "y"),
    "forward(last=True)": (lambda mixer, x: mixer(x, last=True), "y_last"),
    "attend": (lambda mixer, x: mixer.attend(x), "u"),
    "attend_recurrent": (lambda mixer, x: mixer.attend_recurrent(x), "u"),
    "attend_last": (lambda mixer, x: mixer.attend_last(x), "u_last"),
}


def _case_id(case):
    name, options = case
    return "-".join([name] + [f"{key}={value}" for key, value in options.items()])


def _mixer(name, state_size, options):
    """The mixer in float64, every parameter moved away from its initialisation (the
    positional weights start at 0, Mamba's ``D`` at 1: each part of the recurrence
    then matters)."""
    mixer = make_mixer(name, N_BITS, state_size, value_dim=VALUE_DIM, **options).double()
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return mixer


def _tokens(batch, seq_len, kind, seed):
    """Binary tokens in {0, 1}^m or real Gaussian tokens, shape (batch, seq_len, m)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "binary":
        x = torch.randint(0, 2, (batch, seq_len, N_BITS), generator=gen).double()
    else:
        x = torch.randn(batch, seq_len, N_BITS, generator=gen, dtype=torch.float64)
    return x.requires_grad_(True)


def _gradients(out, inputs, seed):
    """The gradient of ``<out, g>`` for a seeded random ``g`` with respect to each of
    ``inputs`` (zeros for one that ``out`` does not read)."""
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                    dtype=out.dtype)
    grads = torch.autograd.grad((out * g).sum(), inputs, allow_unused=True,
                                retain_graph=True)
    return [torch.zeros_like(t) if d is None else d for t, d in zip(inputs, grads)]


def _assert_same(labels, got, want, where, rtol=1e-8, atol=1e-10):
    """``got[i]`` close to ``want[i]`` for every ``i``: one comparison of all of them,
    then the message of the first that differs (``labels[i]`` names it)."""
    flat_got = torch.cat([t.reshape(-1) for t in got])
    flat_want = torch.cat([t.reshape(-1) for t in want])
    if bool(((flat_got - flat_want).abs() <= atol + rtol * flat_want.abs()).all()):
        return
    for label, a, b in zip(labels, got, want):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol,
                                   msg=lambda m, w=f"{where}: {label}": f"{w}. {m}")
    raise AssertionError(f"{where}: not close")  # a NaN on one side only


def test_every_registered_mixer_has_a_reference_and_cases():
    registered = set(available_mixers())
    assert not registered - set(REFERENCES), (
        f"registered mixers without a reference: {sorted(registered - set(REFERENCES))}")
    assert registered <= {name for name, _ in CASES}


#: parameters no output depends on: the key bias of softmax attention adds
#: ``q_t^T c_k`` to every score of the query ``t``, which its softmax ignores
INVARIANT = {("softmax", "head.key.bias")}


@pytest.mark.parametrize("seq_len", SEQ_LENS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_form_equals_the_reference_recurrence(case, seq_len):
    name, options = case
    seen = {}  # parameter name -> largest reference gradient over the sub-cases
    torch.manual_seed(CASES.index(case) * len(SEQ_LENS) + seq_len)
    for seed, (batch, state_size, kind) in enumerate(SUB_CASES):
        mixer = _mixer(name, state_size, options)
        x = _tokens(batch, seq_len, kind, seed)
        names, params = zip(*mixer.named_parameters())
        labels = ["values"] + [f"gradient of {what}" for what in ("tokens", *names)]
        inputs = [x, *params]
        u = REFERENCES[name](mixer, x, options)
        y = _readout(mixer, x, u)
        ref = {"y": y, "y_last": y[:, -1:], "u": u, "u_last": u[:, -1]}
        ref_grads = {key: _gradients(value, inputs, seed) for key, value in ref.items()}
        assert y.shape == (batch, seq_len)
        for form, (call, key) in FORMS.items():
            got = call(mixer, x)
            assert got.shape == ref[key].shape, (form, got.shape)
            _assert_same(labels, [got, *_gradients(got, inputs, seed)],
                         [ref[key], *ref_grads[key]],
                         f"{name} {options}, {form}: batch={batch}, "
                         f"state_size={state_size}, {kind} tokens, seq_len={seq_len}")
        for what, grad in zip(("tokens", *names), ref_grads["y"]):
            seen[what] = max(seen.get(what, 0.0), float(grad.abs().max()))
    if seq_len >= 2:  # every parameter shapes the outputs: the comparisons can fail
        unused = {what for what, size in seen.items() if size < 1e-6}
        assert unused == {what for mixer, what in INVARIANT if mixer == name}, seen


# -- the mixers' contracts ------------------------------------------------------------
# The recurrent form step by step from ``initial_state`` against the references, the
# state's floats, devices and dtypes, the declarations of subclasses, the options of the
# constructors and ``data_kwargs``, user mixers and the messages of ``check_mixer_output``.
def _signed_kernel(mixer, x, eps, *, gamma=1.0, positional=False):
    """The normalised kernel recurrence of the signed ``identity`` map ``phi(x) = W x + b``
    with its guarded denominator ``sign(den) max(|den|, eps)`` (``sign(0) = +1``); also
    returns every denominator."""
    head = mixer.head
    S = x.new_zeros(x.shape[0], mixer.state_size, mixer.value_dim)
    s = x.new_zeros(x.shape[0], mixer.state_size)
    out, dens = [], []
    for t in range(x.shape[1]):
        x_t = x[:, t]
        phi_q = _affine(head.query_features.encoder, x_t)
        phi_k = _affine(head.key_features.encoder, x_t)
        if positional:
            phi_q = torch.exp(head.position_query[t]) * phi_q
            phi_k = torch.exp(head.position_key[t]) * phi_k
        S = gamma * S + _outer(phi_k, _value(mixer, x_t))
        s = gamma * s + phi_k
        den = (phi_q * s).sum(-1, keepdim=True)
        guarded = torch.where(den < 0, -1.0, 1.0) * torch.clamp(den.abs(), min=eps)
        out.append(_read(S, phi_q) / guarded)
        dens.append(den)
    return torch.stack(out, 1), torch.cat(dens, 1)


def _options(name, options):
    """``options`` with what the mixer needs to be built (``positional``'s ``max_len``)."""
    return {"max_len": MAX_LEN, **options} if name == "positional" else dict(options)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_step_from_the_initial_state_is_the_reference_recurrence(case):
    name, options = case
    torch.manual_seed(CASES.index(case))
    mixer = _mixer(name, 2, options)
    x = _tokens(6, 5, "real", CASES.index(case)).detach()  # 6: no dimension of the state
    for dtype in (torch.float32, torch.float64):
        state = mixer.initial_state(6, dtype=dtype, device=torch.device("cpu"))
        assert isinstance(state, tuple) and state
        for tensor in state:  # batch first, of the dtype asked, nothing read yet:
            assert tensor.dtype == dtype and tensor.shape[0] == 6 and tensor.ndim >= 2
            # zeros (a running maximum of log-features starts at -inf)
            assert bool(((tensor == 0) | (tensor == -float("inf"))).all())
    want = REFERENCES[name](mixer, x, options)
    with torch.no_grad():
        for t in range(x.shape[1]):
            # the first token at the default position, 0
            state, u_t = (mixer.step(state, x[:, t], position=t) if t
                          else mixer.step(state, x[:, t]))
            torch.testing.assert_close(u_t, want[:, t], rtol=1e-9, atol=1e-10)
            if name != "softmax":
                assert sum(s[0].numel() for s in state) == mixer.state_floats()
        assert sum(s[0].numel() for s in state) == mixer.state_floats(x.shape[1])


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_form_computes_on_the_device_of_its_tokens(case):
    """The meta device computes shapes only: a tensor made without the tokens' device
    (on the CPU) meets a meta tensor and raises."""
    name, options = case
    meta = torch.device("meta")
    mixer = make_mixer(name, N_BITS, 2, value_dim=VALUE_DIM, **_options(name, options))
    mixer = mixer.double().to(meta)
    x = torch.zeros(3, 5, N_BITS, dtype=torch.float64, device=meta)
    for tensor in mixer.initial_state(3, dtype=torch.float64, device=meta):
        assert tensor.device == meta and tensor.dtype == torch.float64
    for form, (call, key) in FORMS.items():
        out = call(mixer, x)
        assert out.device == meta and out.dtype == torch.float64, form
        assert out.shape == {"y": (3, 5), "y_last": (3, 1), "u": (3, 5, VALUE_DIM),
                             "u_last": (3, VALUE_DIM)}[key], form


def test_the_state_of_softmax_needs_the_tokens_seen():
    mixer = make_mixer("softmax", N_BITS, 2, value_dim=VALUE_DIM)
    assert mixer.state_floats(seq_len=7) == 7 * (2 + VALUE_DIM)
    with pytest.raises(ValueError, match="^the state of softmax attention grows with the "
                                         "tokens seen: state_floats needs seq_len.$"):
        mixer.state_floats()


def _running_mean_class(**declarations):
    """A user's :class:`Mixer` subclass, made at run time: the running mean of the values,
    with no final-query form of its own (the base's ``attend_last``)."""
    from minip_learn.nn import Mixer

    def attend(self, x):
        v = self.value(x)
        return v.cumsum(1) / torch.arange(1, x.shape[1] + 1).to(v)[:, None]

    def state_floats(self, seq_len=None):  # the sum of the values and the count
        return self.value_dim + 1

    return type("RunningMean", (Mixer,), {"attend": attend, "state_floats": state_floats,
                                          **declarations})


def test_a_mixer_subclass_declares_theorem_read_only_on_its_instances():
    cls = _running_mean_class(theorem="positional")
    mixer = cls(N_BITS, 2)
    assert cls.theorem == "positional" and mixer.theorem == "positional"
    with pytest.raises(AttributeError, match=r"^theorem is a declaration of the class "
                                             r"RunningMean \('positional'\); an instance "
                                             r"cannot set it$"):
        mixer.theorem = "yes"
    with pytest.raises(NotImplementedError, match="^RunningMean declares no per-token maps$"):
        mixer.token_maps(torch.zeros(1, 2, N_BITS))


def test_an_instance_failing_a_subclass_condition_reads_no():
    cls = _running_mean_class(theorem="yes", theorem_condition="never",
                              meets_theorem_condition=lambda self: False)
    assert cls.theorem == "yes" and cls(N_BITS, 2).theorem == "no"


@pytest.mark.parametrize("name", ["kernel", "softmax"])
def test_a_subclass_that_declares_nothing_inherits_its_parents_declarations(name):
    from minip_learn.nn import get_mixer

    parent = get_mixer(name)
    child = type("Child", (parent,), {})
    assert child.theorem == parent.theorem and child(N_BITS, 2).theorem == parent.theorem
    if name == "kernel":  # and the condition: a signed kernel is outside the bound
        assert child(N_BITS, 2, feature_map="identity").theorem == "no"


def test_the_default_final_query_form_is_the_last_mixed_vector():
    torch.manual_seed(0)
    mixer = _running_mean_class(theorem="no")(N_BITS, 2, value_dim=VALUE_DIM).double()
    x = torch.randn(3, 4, N_BITS, dtype=torch.float64)
    want = _value(mixer, x).mean(1)  # the mean of the four values
    torch.testing.assert_close(mixer.attend_last(x), want)
    torch.testing.assert_close(mixer(x, last=True), _readout(mixer, x[:, -1:], want[:, None]))


class _Cumulative(torch.nn.Module):
    """A user's mixer: the running sum of the tokens' bits."""

    def __init__(self, n_bits, state_size):
        super().__init__()

    def forward(self, x):
        return x.sum(-1).cumsum(-1)


def test_a_user_mixer_declares_no_value_dim_and_no_recurrent_form():
    from minip_learn.nn import UserMixer

    mixer = make_mixer(_Cumulative, N_BITS, 2)
    assert isinstance(mixer, UserMixer) and mixer.value_dim is None
    name = f"{_Cumulative.__module__}.{_Cumulative.__qualname__}"
    with pytest.raises(NotImplementedError, match=(
            rf"^mixer='{name}' has no recurrent form \(its module defines no recurrent "
            rf"method\)\.$")):
        mixer.recurrent(torch.zeros(1, 2, N_BITS))


class _Raising(_Cumulative):
    def forward(self, x):
        raise RuntimeError("no tokens today")


class _PerToken(_Cumulative):
    def forward(self, x):
        return x[..., :3]


class _NaNs(_Cumulative):
    """NaN at positions 1, 3 and 4 of sequence 0 and at position 4 of sequence 2."""

    def forward(self, x):
        out = x.sum(-1)
        out[0, 1] = out[0, 3] = out[0, 4] = out[2, 4] = float("nan")
        return out


@pytest.mark.parametrize("user, message", [
    (_Raising, r"^mixer='my mixer' fails on tokens of shape \(3, 5, 4\) \(batch, seq_len, "
               r"n_bits\): RuntimeError: no tokens today$"),
    (_PerToken, r"^mixer='my mixer' must map tokens of shape \(batch, seq_len, n_bits\) to "
                r"outputs of shape \(batch, seq_len\) = \(3, 5\); got shape \(3, 5, 3\)\.$"),
    (_NaNs, r"^mixer='my mixer' returns NaN or infinite outputs on 2 of the 3 sequences\.$"),
])
def test_check_mixer_output_names_the_mixer_and_what_is_wrong(user, message):
    from minip_learn.nn import check_mixer_output

    mixer = make_mixer(user, N_BITS, 2)
    with pytest.raises(ValueError, match=message):
        check_mixer_output(mixer, torch.ones(3, 5, N_BITS), "my mixer")


def test_mamba_initialisation():
    """``Delta`` starts log-uniform in ``[dt_min, dt_max]`` (the step of a zero token is
    ``softplus(c_D)``), ``B_t = W_B x_t`` and ``C_t = W_C x_t`` have no bias."""
    torch.manual_seed(0)
    for dt_min, dt_max, options in ((1e-3, 1e-1, {}), (0.3, 1.0, {"dt_min": 0.3,
                                                                 "dt_max": 1.0})):
        mixer = make_mixer("mamba", N_BITS, 2, value_dim=200, **options).double()
        zero = torch.zeros(1, N_BITS, dtype=torch.float64)
        delta = _softplus(_affine(mixer.delta, zero))[0]
        assert delta.min() >= dt_min * (1 - 1e-6) and delta.max() <= dt_max * (1 + 1e-6)
        below = float((delta < (dt_min * dt_max) ** 0.5).double().mean())
        assert 0.35 < below < 0.65, below  # half below the geometric middle
        maps = mixer.token_maps(zero)
        assert not maps.B.any() and not maps.C.any()


def test_softmax_options_reach_its_head():
    """``score_init_scale`` scales torch's initialisation of the query and key weights,
    uniform in ``+-1 / sqrt(m)``; ``algorithm`` is validated by the head."""
    torch.manual_seed(0)
    bound = N_BITS ** -0.5
    for options, scale in (({}, 0.1), ({"score_init_scale": 1.0}, 1.0)):
        head = make_mixer("softmax", N_BITS, 16, **options).head
        for weight in (head.query.weight, head.key.weight):
            largest = float(weight.detach().abs().max())
            assert 0.8 * scale * bound < largest <= scale * bound, (options, largest)
    with pytest.raises(ValueError, match="^algorithm must be one of"):
        make_mixer("softmax", N_BITS, 2, algorithm="fast")


#: the normalised kernel mixers, and their base class built with the head's defaults
KERNEL_MIXERS = [("kernel", {}), ("retnet", {"decay": 0.8}), ("positional", {}),
                 ("KernelHeadMixer", {})]


def _kernel_mixer(name, state_size, options):
    """A kernel mixer by name, or the base of the kernel mixers, ``KernelHeadMixer``
    (the causal head with no positional map), built with ``options``."""
    from minip_learn.nn.mixers.kernel import KernelHeadMixer

    mixer = KernelHeadMixer if name == "KernelHeadMixer" else name
    return make_mixer(mixer, N_BITS, state_size, **_options(name, options))


def _mlp(m, width, r):
    """Weights and biases of an encoder with one hidden layer, ``m -> width -> r``."""
    return m * width + width + width * r + r


def test_linear_attention_passes_its_feature_kwargs_to_both_maps():
    mixer = make_mixer("linear", N_BITS, 3, feature_map="relu",
                       feature_kwargs={"depth": 1, "width": 5})
    for features in (mixer.query_features, mixer.key_features):
        assert sum(p.numel() for p in features.parameters()) == _mlp(N_BITS, 5, 3)


@pytest.mark.parametrize("case", KERNEL_MIXERS, ids=_case_id)
def test_kernel_mixers_pass_their_feature_options_to_the_maps(case):
    """The encoder ``phi(x) = activation(MLP(x))`` with ``feature_depth`` hidden layers of
    ``feature_width`` units (64 by default), ``feature_kwargs`` first; ``shared_features``
    makes ``phi_Q = phi_K``."""
    name, options = case
    m, r = N_BITS, 3

    def parameters(**given):
        mixer = _kernel_mixer(name, r, {**options, **given})
        return sum(p.numel() for p in mixer.query_features.parameters())

    torch.manual_seed(0)
    assert parameters() == m * r + r  # elu+1 of a linear map by default
    assert parameters(feature_depth=1) == _mlp(m, 64, r)
    assert parameters(feature_depth=1, feature_width=8) == _mlp(m, 8, r)
    assert parameters(feature_depth=1, feature_width=8,
                      feature_kwargs={"width": 5}) == _mlp(m, 5, r)
    x = torch.randn(2, 4, m)
    with torch.no_grad():
        for shared in (None, False, True):
            mixer = _kernel_mixer(name, r, {**options, **(
                {} if shared is None else {"shared_features": shared})})
            same = torch.equal(mixer.query_features(x), mixer.key_features(x))
            assert same == bool(shared)
            assert sum(p.numel() for p in mixer.parameters()) == (
                sum(p.numel() for p in mixer.head.value.parameters())
                + sum(p.numel() for p in mixer.head.readout.parameters())
                + (1 if shared else 2) * (m * r + r)
                + (2 * MAX_LEN * r if name == "positional" else 0))


@pytest.mark.parametrize("case", KERNEL_MIXERS, ids=_case_id)
def test_kernel_mixers_guard_a_signed_denominator_with_denominator_eps(case):
    """A signed kernel's denominator ``den`` is replaced by ``sign(den) max(|den|, eps)``
    (``eps = denominator_eps``, default ``1e-3``)."""
    name, options = case
    gamma, positional = options.get("decay", 1.0), name == "positional"
    torch.manual_seed(1)
    x = _tokens(3, 7, "real", 1).detach()
    for eps in (None, 0.5):
        given = {} if eps is None else {"denominator_eps": eps}
        mixer = _kernel_mixer(name, 2, {"feature_map": "identity", **options, **given})
        with torch.no_grad():
            for p in mixer.parameters():
                p.add_(0.3 * torch.randn_like(p))
        mixer = mixer.double()
        eps = 1e-3 if eps is None else eps
        want, dens = _signed_kernel(mixer, x, eps, gamma=gamma, positional=positional)
        # denominators in (1e-3, 0.5) and above 0.5: the outputs tell eps = 1e-3, 0.5
        # and a larger one apart
        assert ((dens.abs() > 1e-3) & (dens.abs() < 0.5)).any() and (dens.abs() > 1).any()
        with torch.no_grad():
            torch.testing.assert_close(mixer.attend(x), want, rtol=1e-9, atol=1e-10)


def test_data_kwargs_give_the_vocabulary_of_a_table_and_the_longest_sequence():
    import numpy as np

    from minip_learn.nn import get_mixer

    gen = np.random.default_rng(0)
    X = gen.integers(0, 2, size=(6, 5, N_BITS))  # 5 tokens of 4 bits: 30 tokens
    distinct = {tuple(token) for token in X.reshape(-1, N_BITS).tolist()}
    for name in ("kernel", "retnet", "positional", "linear", "mamba"):
        cls = get_mixer(name)
        length = {"max_len": 5} if name == "positional" else {}
        assert cls.data_kwargs(X) == length
        assert cls.data_kwargs(X, feature_map="exp") == length
        if name == "positional":
            assert cls.data_kwargs(X, max_len=9) == {}
        if name not in ("kernel", "retnet", "positional"):
            continue
        for given in (None, {"init_scale": 0.5}):
            out = cls.data_kwargs(X, feature_map="table", feature_kwargs=given)
            assert set(out) == {"feature_kwargs", *length}
            kwargs = out["feature_kwargs"]
            assert set(kwargs) == {"vocabulary", *(given or {})}
            assert kwargs.get("init_scale") == (given or {}).get("init_scale")
            vocabulary = kwargs["vocabulary"]
            assert vocabulary.dtype == np.uint8 and vocabulary.shape[1] == N_BITS
            assert sorted(map(tuple, vocabulary.tolist())) == sorted(distinct)
        mixer = make_mixer(name, N_BITS, 2, feature_map="table", **out)
        assert mixer(torch.as_tensor(X, dtype=torch.float32)).shape == (6, 5)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("lead", [(), (2,)])
def test_selective_readouts_work_in_blocks_of_its_buffer(lead):
    """``G[i, c] = sum_n keys[i, n] exp(A[c, n] steps[i, c])``, computed in blocks of a
    work buffer of ``rows`` rows that no block resizes (torch warns when it would)."""
    from minip_learn.nn.mixers.mamba import selective_readouts

    gen = torch.Generator().manual_seed(0)
    steps = torch.rand(*lead, 5, 2, generator=gen, dtype=torch.float64)
    keys = torch.randn(*lead, 5, 3, generator=gen, dtype=torch.float64)
    A = -torch.rand(*lead, 2, 3, generator=gen, dtype=torch.float64)
    want = (keys[..., :, None, :] * torch.exp(A[..., None, :, :] * steps[..., None])).sum(-1)
    torch.testing.assert_close(selective_readouts(steps, keys, A, rows=2), want)


@pytest.mark.parametrize("name", ["softmax", "mamba"])
def test_the_final_query_runs_in_blocks_of_about_last_block_floats(name):
    """``forward(x, last=True)`` splits the batch into blocks of
    ``LAST_BLOCK_FLOATS // state_floats(N)`` sequences (softmax's state grows with the
    ``N`` tokens); a batch no larger than a block is one block. (Tokens other than 0
    and 1: softmax's form on the distinct tokens does not apply.)"""
    mixer = make_mixer(name, N_BITS, 2, value_dim=VALUE_DIM)
    x = torch.full((7, 2, N_BITS), 0.5)
    calls, attend_last = [], mixer.attend_last
    mixer.attend_last = lambda part: calls.append(len(part)) or attend_last(part)
    mixer.LAST_BLOCK_FLOATS = 3 * mixer.state_floats(2) + 1  # three sequences a block
    assert mixer(x, last=True).shape == (7, 1)
    assert mixer(x[:3], last=True).shape == (3, 1)
    assert calls == [3, 3, 1, 3]


def test_selective_readouts_computes_each_row_once_in_blocks_of_rows(monkeypatch):
    """Blocks of ``rows`` rows (1024 by default), each row in one block; fewer than 1
    row a block is refused."""
    from minip_learn.nn.mixers import mamba

    blocks, decays = [], mamba._decays

    def spy(steps, *args):
        blocks.append(steps.shape[-2])
        return decays(steps, *args)

    monkeypatch.setattr(mamba, "_decays", spy)
    A = -torch.ones(2, 3)
    for n_rows, rows, want in ((5, 2, [2, 2, 1]), (1025, None, [1024, 1])):
        blocks.clear()
        given = {} if rows is None else {"rows": rows}
        out = mamba.selective_readouts(torch.ones(n_rows, 2), torch.ones(n_rows, 3), A,
                                       **given)
        torch.testing.assert_close(out, torch.full((n_rows, 2), 3 * math.exp(-1.0)))
        assert blocks == want
    with pytest.raises(ValueError, match=r"^rows must be at least 1; got 0\.$"):
        mamba.selective_readouts(torch.ones(5, 2), torch.ones(5, 3), A, rows=0)
