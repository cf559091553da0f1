"""A diagonal selective state-space model in the style of Mamba (``"mamba"``).

Per channel ``c`` of the value ``v_t`` (``d`` channels), a state ``h_t[c]`` in ``R^r``
(``h_0 = 0``):

    ``h_t[c] = exp(Delta_t[c] A[c]) * h_{t-1}[c] + Delta_t[c] B_t v_t[c]``,
    ``u_t[c] = <C_t, h_t[c]> + D[c] v_t[c]``,

with ``Delta_t = softplus(W_D x_t + c_D)``, ``A = -exp(A_log)`` (``d x r``, learned),
``B_t = W_B x_t`` and ``C_t = W_C x_t``. The input matrix is discretised to first
order, ``B-bar = Delta B``, as in the reference scan of the Mamba authors
(``selective_scan_ref``), not by the zero-order hold ``(Delta A)^-1 (exp(Delta A) - I)
Delta B`` of the paper's equation 4. State ``d r`` floats. Outside the theorem.
Its forward runs the recurrent form (the selective scan, ``forward_form =
"recurrent"``).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..ops.masks import decayed_scores
from ..ops.tokens import gather_rows, later_runs_sum
from ._base import Mixer, TokenMaps, register_mixer

__all__ = []  # public home: the package minip_learn.nn.mixers


#: floats of one block of decays ``exp(A S)`` in :func:`selective_readouts` (4 MiB in
#: float32): enough rows to spread the cost of each operation, few enough that a block
#: stays in the cache the cores share
SCAN_BLOCK_FLOATS = 2**20


@dataclass(frozen=True)
class SelectiveMaps(TokenMaps):
    """The per-token maps of the selective SSM beside the values ``v`` (..., d).

    Attributes
    ----------
    delta : Tensor of shape (..., d)
        The steps ``Delta = softplus(W_D x + c_D)``.
    B, C : Tensor of shape (..., r)
        The input and output maps ``B = W_B x`` and ``C = W_C x``.
    A : Tensor of shape (d, r)
        The diagonal ``A = -exp(A_log)`` (the same for every token).
    """

    delta: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    A: torch.Tensor


@register_mixer("mamba")
class MambaMixer(Mixer):
    """A diagonal selective state-space model in the style of Mamba (Gu & Dao, 2023).

    The value map ``v_t = v(x_t)`` gives ``d`` channels; channel ``c`` carries a state
    ``h_t[c]`` of dimension ``r = state_size``:

        ``h_t[c] = exp(Delta_t[c] A[c]) * h_{t-1}[c] + Delta_t[c] B_t v_t[c]``,
        ``u_t[c] = <C_t, h_t[c]> + D[c] v_t[c]``,

    with the input-dependent step ``Delta_t = softplus(W_D x_t + c_D)`` (its bias
    initialised so that ``Delta`` starts log-uniform in ``[dt_min, dt_max]``), the
    diagonal ``A = -exp(A_log)`` (initialised ``A[c, n] = -(n + 1)``, S4D-real), and
    ``B_t = W_B x_t``, ``C_t = W_C x_t``. Mamba's short convolution and output gate are
    left out (the affine readout follows the SSM). :meth:`attend` is the parallel form,
    which sums ``C_t^T diag(exp(L_t[c] - L_j[c])) B_j Delta_j[c] v_j[c]`` over ``j <= t``
    with the cumulative log-decays ``L``
    (:func:`~minip_learn.nn.mixers.decayed_scores`, one channel per leading index), and
    :meth:`step` the recurrent form. Like Mamba, :meth:`forward` (training and
    prediction) runs the selective scan, ``forward_form = "recurrent"``: its ``(d, r)``
    state is cheaper than the ``(d, N, N, r)`` scores of the parallel form once ``N r``
    exceeds a few hundred. The two forms are tested equal. The final-query form
    :meth:`attend_last` reads the last state out in closed form
    (:func:`selective_readouts`). State ``d r`` floats.

    Parameters
    ----------
    n_bits, state_size : int
        Bits per token and state dimension ``r`` per channel.
    value_dim : int, default=None
        Channels ``d``; None means ``n_bits``.
    dt_min, dt_max : float, default=1e-3, 1e-1
        Range of the initial step ``Delta``.

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import make_mixer
    >>> mixer = make_mixer("mamba", 4, 3).double()
    >>> x = torch.rand(2, 6, 4, dtype=torch.float64)
    >>> torch.allclose(mixer(x), mixer.recurrent(x)), mixer.state_floats()
    (True, 12)
    >>> torch.allclose(mixer.attend(x), mixer.attend_recurrent(x)), mixer.forward_form
    (True, 'recurrent')
    """

    theorem = "no"
    paper = "Gu & Dao 2023, Mamba: Linear-Time Sequence Modeling with Selective State Spaces"
    state_formula = "d r"
    forward_form = "recurrent"
    # B and C are zero on padded state dimensions: never written, never read
    state_padding = "zeros"
    run_maps = True

    def __init__(self, n_bits, state_size, *, value_dim=None, dt_min=1e-3, dt_max=1e-1):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        d, r = self.value_dim, self.state_size
        self.delta = nn.Linear(self.n_bits, d)
        self.input_gate = nn.Linear(self.n_bits, r, bias=False)   # B_t
        self.output_gate = nn.Linear(self.n_bits, r, bias=False)  # C_t
        self.A_log = nn.Parameter(torch.log(torch.arange(1, r + 1, dtype=torch.float32))
                                  .repeat(d, 1))
        self.D = nn.Parameter(torch.ones(d))
        with torch.no_grad():
            dt = torch.exp(torch.rand(d) * (math.log(dt_max) - math.log(dt_min))
                           + math.log(dt_min))
            self.delta.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def token_maps(self, x):
        """The per-token maps the recurrence reads: ``v`` (..., d), ``delta`` (..., d),
        ``B`` and ``C`` (..., r), and ``A`` (d, r)."""
        return SelectiveMaps(v=self.value(x), delta=nn.functional.softplus(self.delta(x)),
                             B=self.input_gate(x), C=self.output_gate(x),
                             A=-torch.exp(self.A_log))

    def attend(self, x):
        m = self.token_maps(x)
        v, delta = m.v.transpose(-2, -1), m.delta.transpose(-2, -1)  # (b, d, N)
        log_cum = (delta[..., None] * m.A[:, None, :]).cumsum(-2)  # (b, d, N, r)
        keys = m.B[:, None] * delta[..., None]  # (b, d, N, r)
        scores = decayed_scores(m.C[:, None].expand_as(keys), keys, log_cum)
        u = (scores @ v[..., None]).squeeze(-1) + self.D[:, None] * v
        return u.transpose(-2, -1)

    def attend_last(self, x):
        """``u_N = C_N^T h_N + D v_N`` in closed form (:func:`selective_readouts`):
        ``C_N^T h_N[c] = sum_t Delta_t[c] v_t[c] sum_n C_N[n] B_t[n]
        exp(A[c, n] S_t[c])`` with the step sums ``S_t = Delta_{t+1} + ... +
        Delta_N``: the state of :meth:`step` after the last token, unrolled. Its
        backward recomputes the decays block by block rather than keep a state per
        token."""
        m = self.token_maps(x)
        delta = m.delta
        after = delta.flip(-2).cumsum(-2).flip(-2)  # Delta_t + ... + Delta_N
        steps = torch.cat([after[..., 1:, :], torch.zeros_like(after[..., :1, :])], -2)
        keys = m.B * m.C[..., -1:, :]  # C_N[n] B_t[n]
        sums = selective_readouts(steps.reshape(-1, steps.shape[-1]),
                                  keys.reshape(-1, keys.shape[-1]), m.A,
                                  rows=max(1, SCAN_BLOCK_FLOATS // m.A.numel()))
        sums = sums.view(steps.shape)
        return (delta * m.v * sums).sum(-2) + self.D * m.v[..., -1, :]

    def attend_last_runs(self, tokens, runs):
        """``u_N = C_N^T h_N + D v_N`` one step per run of equal tokens: ``L`` steps of
        a token take ``h`` to ``exp(L Delta A) h + g_L(Delta A) Delta B v`` per channel,
        with the geometric sums ``g_L(a) = sum_{l < L} exp(l a) = expm1(L a) /
        expm1(a)`` (0 for an empty run), computed once per distinct (token, length)
        pair, and each run decayed by the steps of the runs after it
        (:func:`run_readouts`, once per distinct suffix of runs; stacked members under
        :func:`torch.func.vmap` read out one after another)."""
        m = self.token_maps(tokens)
        delta = gather_rows(m.delta, runs.index)  # (b, R, d)
        after = later_runs_sum(runs.lengths.to(delta.dtype)[..., None] * delta)
        tiny = torch.finfo(delta.dtype).tiny  # (a step of 0: g_L = L)
        a = (m.delta.index_select(0, runs.pair_index)[..., None] * m.A).clamp(max=-tiny)
        L = runs.pair_lengths.to(a.dtype)[:, None, None]
        table = (torch.expm1(L * a) / torch.expm1(a)
                 * m.B.index_select(0, runs.pair_index)[:, None, :])  # (P, d, r)
        last = runs.index[:, -1]
        rows, R = runs.suffix_rows, runs.index.shape[1]  # one run per distinct suffix
        d, r = m.A.shape
        sums = run_readouts(after.reshape(-1, d).index_select(0, rows),
                            m.C.index_select(0, last.index_select(0, rows // R)), table,
                            runs.pairs.reshape(-1).index_select(0, rows), m.A,
                            rows=max(1, SCAN_BLOCK_FLOATS // m.A.numel()))
        sums = gather_rows(torch.cat([sums, sums.new_zeros(1, d)]), runs.suffix)  # (empty: 0)
        v = gather_rows(m.v, runs.index)
        return (delta * v * sums).sum(-2) + self.D * m.v.index_select(0, last)

    @staticmethod
    def _advance(h, delta, v, B, A):
        """``h_t = exp(Delta_t A) h_{t-1} + (Delta_t v_t) B_t^T``, per channel: ``h``
        (b, d, r), ``delta`` and ``v`` (b, d), ``B`` (b, r), ``A`` (d, r)."""
        return torch.exp(delta[..., None] * A) * h + (delta * v)[..., None] * B[:, None, :]

    def initial_state(self, batch, *, dtype, device):
        return (torch.zeros(batch, self.value_dim, self.state_size, dtype=dtype,
                            device=device),)

    def step(self, state, x_t, position=0):
        m = self.token_maps(x_t)
        h = self._advance(state[0], m.delta, m.v, m.B, m.A)
        return (h,), (h * m.C[:, None, :]).sum(-1) + self.D * m.v

    def state_floats(self, seq_len=None):
        """``d r``: one state of dimension ``r`` per channel."""
        return self.value_dim * self.state_size


def _decays(steps, A2, floor, out):
    """``exp(A[c, n] S[i, c]) = 2 ** (S[i, c] A2[c, n])`` written into ``out`` (...,
    rows, d, r), for step sums ``S`` (..., rows, d) and ``A2 = A log2 e`` (..., d, r).
    The exponent is held at or above ``floor`` (:func:`_decay_floor`): a smaller decay
    is read as ``2 ** floor``."""
    torch.mul(steps[..., None], A2[..., None, :, :], out=out)
    return out.clamp_(min=floor).exp2_()


class _SelectiveReadouts(torch.autograd.Function):
    """The forward and hand-written backward of :func:`selective_readouts` over blocks
    of ``rows`` rows in one reused work buffer: only the inputs are kept, and the
    backward recomputes each block's decays."""

    @staticmethod
    def forward(steps, keys, A, rows):
        floor = _decay_floor(steps.dtype)
        A2 = A * math.log2(math.e)
        n_rows = steps.shape[-2]
        out = steps.new_empty(steps.shape)
        work = steps.new_empty(steps.shape[:-2] + (min(rows, n_rows),) + A.shape[-2:])
        for start in range(0, n_rows, rows):
            n = min(rows, n_rows - start)
            e = _decays(steps.narrow(-2, start, n), A2, floor, work.narrow(-3, 0, n))
            e.mul_(keys.narrow(-2, start, n)[..., None, :])
            torch.sum(e, -1, out=out.narrow(-2, start, n))
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        steps, keys, A, rows = inputs
        ctx.save_for_backward(steps, keys, A)
        ctx.rows = rows

    @staticmethod
    def vmap(info, in_dims, steps, keys, A, rows):
        # the vmapped dimension is one more leading dimension of every input (and the
        # blocks have fewer rows, for the same work buffer)
        steps, keys, A = (t.movedim(d, 0) if d is not None
                          else t.expand(info.batch_size, *t.shape)
                          for t, d in zip((steps, keys, A), in_dims[:3]))
        rows = max(1, rows // info.batch_size)
        return _SelectiveReadouts.apply(steps, keys, A, rows), 0

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        steps, keys, A = ctx.saved_tensors
        need_steps, need_keys, need_A = ctx.needs_input_grad[:3]
        rows, n_rows = ctx.rows, steps.shape[-2]
        floor = _decay_floor(steps.dtype)
        A2 = A * math.log2(math.e)
        d_steps = torch.empty_like(steps) if need_steps else None
        d_keys = torch.empty_like(keys) if need_keys else None
        d_A = torch.zeros_like(A) if need_A else None
        shape = steps.shape[:-2] + (min(rows, n_rows),) + A.shape[-2:]
        work = steps.new_empty(shape)
        scratch = steps.new_empty(shape) if need_steps else None
        for start in range(0, n_rows, rows):
            n = min(rows, n_rows - start)
            s, g = steps.narrow(-2, start, n), grad.narrow(-2, start, n)
            e = _decays(s, A2, floor, work.narrow(-3, 0, n))
            if need_keys:  # sum_c g[c] e[c, n]
                d_keys.narrow(-2, start, n).copy_((g[..., None, :] @ e).squeeze(-2))
            if not (need_steps or need_A):
                continue
            e.mul_(keys.narrow(-2, start, n)[..., None, :])  # the terms of G[c]
            if need_steps:  # g[c] sum_n A[c, n] e[c, n] k[n]
                t = torch.mul(e, A[..., None, :, :], out=scratch.narrow(-3, 0, n))
                torch.sum(t, -1, out=d_steps.narrow(-2, start, n)).mul_(g)
            if need_A:  # the sum over the rows of g[c] S[c] e[c, n] k[n]
                d_A += e.mul_((g * s)[..., None]).sum(-3)
        return d_steps, d_keys, d_A, None


def _decay_floor(dtype):
    """The exponent at or above which :func:`selective_readouts` and
    :func:`run_readouts` hold their decays: half that of the dtype's smallest normal
    number (``2**-63`` in float32), so that a decay's products with the other factors
    (and the gradient) stay normal numbers, whose arithmetic is several times faster
    than that of subnormal ones (an epoch of the per-position form on 2,544 sequences
    of the exact m = 12 family: about a fifth faster than with the smallest normal
    number as the floor). A decay below it weighs a write by less than ``2**-63``."""
    return math.log2(torch.finfo(dtype).tiny) / 2


class _RunReadouts(torch.autograd.Function):
    """The forward and hand-written backward of :func:`run_readouts` over blocks of
    ``rows`` rows in reused work buffers: only the inputs are kept, and the backward
    recomputes each block's decays."""

    @staticmethod
    def forward(steps, keys, table, pair, A, rows):
        floor = _decay_floor(steps.dtype)
        A2 = A * math.log2(math.e)
        n_rows = steps.shape[0]
        out = steps.new_empty(steps.shape)
        shape = (min(rows, n_rows),) + A.shape
        work, weights = steps.new_empty(shape), steps.new_empty(shape)
        for start in range(0, n_rows, rows):
            n = min(rows, n_rows - start)
            e = _decays(steps.narrow(0, start, n), A2, floor, work.narrow(0, 0, n))
            w = torch.index_select(table, 0, pair.narrow(0, start, n),
                                   out=weights.narrow(0, 0, n))
            e.mul_(w).mul_(keys.narrow(0, start, n)[:, None, :])
            torch.sum(e, -1, out=out.narrow(0, start, n))
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        steps, keys, table, pair, A, rows = inputs
        ctx.save_for_backward(steps, keys, table, pair, A)
        ctx.rows = rows

    @staticmethod
    def vmap(info, in_dims, steps, keys, table, pair, A, rows):
        # stacked members: one readout per member (each with its own blocks)
        inputs = (steps, keys, table, pair, A)
        moved = [t.movedim(d, 0) if d is not None else None
                 for t, d in zip(inputs, in_dims[:5])]
        out = [_RunReadouts.apply(*(m[i] if m is not None else t
                                    for m, t in zip(moved, inputs)), rows)
               for i in range(info.batch_size)]
        return torch.stack(out), 0

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        steps, keys, table, pair, A = ctx.saved_tensors
        need_steps, need_keys, need_table, _, need_A = ctx.needs_input_grad[:5]
        rows, n_rows = ctx.rows, steps.shape[0]
        floor = _decay_floor(steps.dtype)
        A2 = A * math.log2(math.e)
        d_steps = torch.empty_like(steps) if need_steps else None
        d_keys = torch.empty_like(keys) if need_keys else None
        d_table = torch.zeros_like(table) if need_table else None
        d_A = torch.zeros_like(A) if need_A else None
        shape = (min(rows, n_rows),) + A.shape
        work, weights = steps.new_empty(shape), steps.new_empty(shape)
        for start in range(0, n_rows, rows):
            n = min(rows, n_rows - start)
            s, g = steps.narrow(0, start, n), grad.narrow(0, start, n)
            k, p = keys.narrow(0, start, n)[:, None, :], pair.narrow(0, start, n)
            e = _decays(s, A2, floor, work.narrow(0, 0, n))
            ew = torch.index_select(table, 0, p, out=weights.narrow(0, 0, n)).mul_(e)
            if need_keys:  # sum_c g[c] W[c, n] e[c, n]
                d_keys.narrow(0, start, n).copy_((g[:, None, :] @ ew).squeeze(-2))
            if need_table:  # per pair, the sum over its rows of g[c] e[c, n] k[n]
                d_table.index_add_(0, p, e.mul_(k).mul_(g[..., None]))
            if not (need_steps or need_A):
                continue
            terms = ew.mul_(k).mul_(g[..., None])  # g[c] times the terms of G[c]
            if need_steps:  # sum_n A[c, n] g[c] T[c, n]
                torch.sum(torch.mul(terms, A, out=e), -1, out=d_steps.narrow(0, start, n))
            if need_A:  # the sum over the rows of S[c] g[c] T[c, n]
                d_A += torch.mul(terms, s[..., None], out=e).sum(0)
        return d_steps, d_keys, d_table, None, d_A, None


def run_readouts(steps, keys, table, pair, A, *, rows=1024):
    """``G[i, c] = sum_n keys[i, n] table[pair[i], c, n] exp(A[c, n] steps[i, c])``: the
    read-out decayed writes of the runs of equal tokens of a diagonal selective SSM,
    one row ``i`` per run.

    With ``table[p, c, n] = g_L(Delta[c] A[c, n]) B[n]`` for the (token, length) pair
    ``p`` of a run (``g_L(a) = sum_{l < L} exp(l a)``), ``keys`` the last token's
    ``C_N`` and ``steps`` the sums of the steps after the run, ``sum_i Delta_i v_i
    G_i`` over a sequence's runs is ``C_N^T h_N`` (:meth:`MambaMixer.attend_last_runs`).
    The work runs over blocks of ``rows`` rows in two work buffers of ``(rows, d, r)``
    floats, and the autograd keeps only the inputs (the backward recomputes each
    block's decays). A decay is computed as ``2 ** (S A log2 e)``, held at or above the
    square root of the dtype's smallest normal number (``2 ** -63`` in float32): a
    term below it is below the rounding of any term that is not.

    Parameters
    ----------
    steps : Tensor of shape (n_rows, d)
        The step sums after each run (nonnegative).
    keys : Tensor of shape (n_rows, r)
    table : Tensor of shape (P, d, r)
        A matrix per distinct pair.
    pair : Tensor of shape (n_rows,), int64
        The pair of every row.
    A : Tensor of shape (d, r)
        The diagonal of the state matrix (negative).
    rows : int, default=1024
        Rows per block (at least 1).

    Returns
    -------
    Tensor of shape (n_rows, d)

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn.mixers.mamba import run_readouts
    >>> steps = torch.rand(5, 2, dtype=torch.float64)
    >>> keys = torch.randn(5, 3, dtype=torch.float64)
    >>> table = torch.rand(4, 2, 3, dtype=torch.float64)
    >>> pair = torch.tensor([0, 3, 3, 1, 2])
    >>> A = -torch.rand(2, 3, dtype=torch.float64)
    >>> ref = (keys[:, None, :] * table[pair] * torch.exp(A * steps[:, :, None])).sum(-1)
    >>> torch.allclose(run_readouts(steps, keys, table, pair, A, rows=2), ref)
    True
    """
    if int(rows) < 1:
        raise ValueError(f"rows must be at least 1; got {rows!r}.")
    return _RunReadouts.apply(steps, keys, table, pair, A, int(rows))


def selective_readouts(steps, keys, A, *, rows=1024):
    """``G[i, c] = sum_n keys[i, n] exp(A[c, n] steps[i, c])``: the read-out decayed
    writes of a diagonal selective SSM, one row ``i`` per (sequence, token) pair.

    With ``steps`` the sums ``S_t = Delta_{t+1} + ... + Delta_N`` of the steps after
    token ``t`` and ``keys`` the products ``C_N B_t``, ``sum_t Delta_t v_t G_t`` is
    ``C_N^T h_N``, the read-out state of :class:`MambaMixer` after the last token. The
    work runs over blocks of ``rows`` rows in one work buffer of ``(rows, d, r)``
    floats, and the autograd keeps only the inputs (the backward recomputes each
    block's decays). A decay is computed as ``2 ** (S A log2 e)``, held at or above the
    square root of the dtype's smallest normal number. Under :func:`torch.func.vmap` the vmapped
    dimension becomes one more leading dimension.

    Parameters
    ----------
    steps : Tensor of shape (..., n_rows, d)
        The step sums ``S`` (nonnegative: decays at most 1).
    keys : Tensor of shape (..., n_rows, r)
        The products ``C_N B_t``.
    A : Tensor of shape (..., d, r)
        The diagonal of the state matrix (negative), with the leading dimensions of
        ``steps`` and ``keys``.
    rows : int, default=1024
        Rows per block (at least 1).

    Returns
    -------
    Tensor of shape (..., n_rows, d)

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn.mixers.mamba import selective_readouts
    >>> steps = torch.rand(5, 2, dtype=torch.float64)
    >>> keys = torch.randn(5, 3, dtype=torch.float64)
    >>> A = -torch.rand(2, 3, dtype=torch.float64)
    >>> ref = (keys[:, None, :] * torch.exp(A * steps[:, :, None])).sum(-1)
    >>> torch.allclose(selective_readouts(steps, keys, A, rows=2), ref)
    True
    """
    if int(rows) < 1:
        raise ValueError(f"rows must be at least 1; got {rows!r}.")
    return _SelectiveReadouts.apply(steps, keys, A, int(rows))
