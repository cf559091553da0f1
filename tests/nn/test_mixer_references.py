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
"""

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
