"""Many independent heads as one batched module (stacked parameters + ``torch.func``).

:class:`HeadEnsemble` stacks the parameters of ``E`` heads of the same architecture
along a new leading dimension and evaluates all of them in one vectorised forward
(:func:`torch.func.vmap` over :func:`torch.func.functional_call`). Heads may differ in
their rank: every member is padded with zeros to the largest one and a per-member
``feature_mask`` (see :meth:`KernelAttentionHead.features
<minip_learn.nn.KernelAttentionHead.features>`) turns the padding into exact zero
features, so a member computes exactly what its own rank-``r`` head computes and its
padded parameters receive zero gradients.

Buffers that are equal in every member (e.g. the vocabulary of the ``table`` map) are
kept unbatched and shared; buffers that differ (e.g. the random directions of
``favor+``) are stacked like the parameters.

No scikit-learn in this layer.
"""

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

__all__ = ["HeadEnsemble"]


class _ShortAttention(torch.autograd.Function):
    """Normalised kernel attention and affine readout of short sequences, explicit kernel.

    Inputs in the layout (., E, N, n) (feature, member, sequence position, sequence):
    ``phi_q``, ``phi_k`` (r), values ``v`` and readout weights ``w`` (d); readout bias
    ``b`` of shape (E, N, n). With ``alpha_ij = <phi_q_i, phi_k_j>`` and
    ``g_ij = <w_i, v_j>``, the output (shape (E, N, n)) is
    ``p_i = sum_j alpha_ij g_ij / max(sum_j alpha_ij, tiny) + b_i``, which equals the
    head's ``rho_{x_i}(u_i)`` up to rounding. The hand-written backward works pair of
    positions by pair, in place, over long contiguous rows.
    """

    @staticmethod
    def forward(ctx, phi_q, phi_k, v, w, b):
        E, N, n = phi_q.shape[1:]
        alpha = phi_q.new_empty(N, N, E, n)
        g = phi_q.new_empty(N, N, E, n)
        for i in range(N):
            for j in range(N):
                torch.sum(phi_q[:, :, i] * phi_k[:, :, j], 0, out=alpha[i, j])
                torch.sum(w[:, :, i] * v[:, :, j], 0, out=g[i, j])
        den = alpha.sum(1)  # (N, E, n)
        den_c = den.clamp_min(torch.finfo(den.dtype).tiny)
        y = (alpha * g).sum(1) / den_c
        ctx.save_for_backward(phi_q, phi_k, v, w, alpha, g, den, den_c, y)
        return y.permute(1, 0, 2) + b

    @staticmethod
    def backward(ctx, go):
        phi_q, phi_k, v, w, alpha, g, den, den_c, y = ctx.saved_tensors
        N = alpha.shape[0]
        gb = go
        go = go.permute(1, 0, 2)  # (N, E, n)
        c = go / den_c
        dden = torch.where(den > torch.finfo(den.dtype).tiny, -c * y, torch.zeros_like(c))
        d_alpha = c.unsqueeze(1) * g + dden.unsqueeze(1)  # (N_i, N_j, E, n)
        d_g = c.unsqueeze(1) * alpha
        dq, dk = torch.empty_like(phi_q), torch.empty_like(phi_k)
        dv, dw = torch.empty_like(v), torch.empty_like(w)
        for i in range(N):
            for j in range(N):
                da, dg = d_alpha[i, j], d_g[i, j]
                if j == 0:  # first term of each sum written, then accumulated
                    torch.mul(phi_k[:, :, j], da, out=dq[:, :, i])
                    torch.mul(v[:, :, j], dg, out=dw[:, :, i])
                else:
                    dq[:, :, i].addcmul_(phi_k[:, :, j], da)
                    dw[:, :, i].addcmul_(v[:, :, j], dg)
                if i == 0:
                    torch.mul(phi_q[:, :, i], da, out=dk[:, :, j])
                    torch.mul(w[:, :, i], dg, out=dv[:, :, j])
                else:
                    dk[:, :, j].addcmul_(phi_q[:, :, i], da)
                    dv[:, :, j].addcmul_(w[:, :, i], dg)
        return dq, dk, dv, dw, gb


def _fast_path_ok(template):
    """Whether ``template`` is a single kernel head the fused forward implements."""
    from .feature_maps import EluPlusOne, Exp, ReLUFloor, Softplus, SquaredReLU, TokenTable
    from .heads import AffineReadout, KernelAttentionHead, ValueMap

    if type(template) is not KernelAttentionHead:
        return False
    if type(template.value) is not ValueMap or type(template.readout) is not AffineReadout:
        return False
    qf, kf = template.query_features, template.key_features
    if qf.log_domain != kf.log_domain:
        return False
    for fm in (qf, kf):
        if type(fm) is TokenTable:
            continue
        if type(fm) not in (EluPlusOne, Exp, ReLUFloor, Softplus, SquaredReLU):
            return False
        if type(fm.encoder) is not nn.Linear:
            return False
    return True


def _unique_rows(t):
    """Distinct rows of the 2-d tensor ``t`` and the index of each row among them.

    Rows are compared by their bytes (``torch.unique(dim=0)`` is slow on CPU): rows
    with equal values but different bytes (``0.0`` and ``-0.0``) count as two, which
    only costs a little repetition.
    """
    a = t.detach().cpu().contiguous().numpy()
    keys = a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).reshape(-1)
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    first = torch.from_numpy(first).to(t.device)
    return t[first], torch.from_numpy(inv.reshape(-1)).to(t.device)


def _pad_to(t, shape):
    """Zero-pad ``t`` at the end of every dimension that is smaller than ``shape``."""
    if tuple(t.shape) == tuple(shape):
        return t
    if t.ndim != len(shape) or any(a > b for a, b in zip(t.shape, shape)):
        raise ValueError(f"cannot pad a tensor of shape {tuple(t.shape)} to {tuple(shape)}")
    out = t.new_zeros(shape)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


def _crop_to(t, shape):
    """The leading ``shape`` block of ``t`` (inverse of :func:`_pad_to`)."""
    return t[tuple(slice(0, n) for n in shape)]


class HeadEnsemble(nn.Module):
    """``E`` independent heads evaluated in one batched forward.

    Parameters
    ----------
    heads : list of torch.nn.Module
        The members, all of the same class and architecture except possibly their
        ``rank`` (kernel heads). Their current parameters and buffers are copied.
    template : torch.nn.Module, default=None
        A head with the largest shapes (e.g. the kernel head of the largest rank); its
        own parameter values are not used. None uses the first head of the largest
        ``rank`` (or the first head).

    Attributes
    ----------
    n_members : int
        Number of members ``E``.
    names : list of str
        Names of the stacked parameters (as in ``template.named_parameters()``).
    ranks : list of int or None
        Rank of each member (kernel heads), else None.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import HeadEnsemble, KernelAttentionHead
    >>> heads = [KernelAttentionHead(6, r) for r in (2, 4, 4)]
    >>> ens = HeadEnsemble(heads)
    >>> x = torch.rand(5, 3, 6).round()
    >>> out = ens(x)
    >>> out.shape
    torch.Size([3, 5, 3])
    >>> bool(torch.allclose(out[0], heads[0](x), atol=1e-6))
    True
    """

    def __init__(self, heads, template=None):
        super().__init__()
        heads = list(heads)
        if not heads:
            raise ValueError("heads must be a non-empty list of modules.")
        if len({type(h) for h in heads}) != 1:
            raise ValueError("all heads must be of the same class.")
        ranks = [getattr(h, "rank", None) for h in heads]
        self.ranks = None if any(r is None for r in ranks) else [int(r) for r in ranks]
        if template is None:
            template = heads[0] if self.ranks is None else heads[
                max(range(len(heads)), key=lambda i: self.ranks[i])]
        import copy

        template = copy.deepcopy(template)
        for p in template.parameters():
            p.requires_grad_(False)
        self.n_members = len(heads)
        members = [dict(h.named_parameters()) for h in heads]
        self.names = [n for n, _ in template.named_parameters()]
        for i, m in enumerate(members):
            if sorted(m) != sorted(self.names):
                raise ValueError(f"head {i} does not have the parameters of the template.")
        self.params = nn.ParameterList([
            nn.Parameter(torch.stack([_pad_to(m[n].detach(), p.shape) for m in members]))
            for n, p in template.named_parameters()
        ])
        # buffers: shared when equal in every member, else stacked
        shared, stacked = {}, {}
        member_buffers = [dict(h.named_buffers()) for h in heads]
        for n, b in template.named_buffers():
            vals = [mb[n] for mb in member_buffers]
            if all(v.shape == b.shape and torch.equal(v, vals[0]) for v in vals):
                shared[n] = vals[0]
            else:
                stacked[n] = torch.stack([_pad_to(v, b.shape) for v in vals])
        padded = any(self._shape_differs(h, template) for h in heads)
        if padded and not (self.ranks is not None and hasattr(template, "feature_mask")):
            raise ValueError(
                "heads of different shapes can be stacked only when they are single "
                "kernel heads that differ in rank (rank masking).")
        if self.ranks is not None and len(set(self.ranks)) > 1:
            r_max = int(template.rank)
            mask = torch.zeros(self.n_members, r_max, dtype=self.params[0].dtype,
                               device=self.params[0].device)
            for i, r in enumerate(self.ranks):
                mask[i, :r] = 1
            template.feature_mask = torch.ones(r_max, dtype=mask.dtype, device=mask.device)
            stacked["feature_mask"] = mask
        self._shared_names = list(shared)
        self._stacked_names = list(stacked)
        for i, n in enumerate(self._shared_names):
            self.register_buffer(f"shared_{i}", shared[n])
        for i, n in enumerate(self._stacked_names):
            self.register_buffer(f"stacked_{i}", stacked[n])
        self._template = [template]  # not a submodule: its parameters are not ours
        self._shapes = [
            {n: tuple(p.shape) for n, p in h.named_parameters()} for h in heads]
        self._buffer_shapes = [
            {n: tuple(b.shape) for n, b in h.named_buffers()} for h in heads]

        self._fast = _fast_path_ok(template)
        self._fast_checked = False
        self._index_cache = None

    @staticmethod
    def _shape_differs(head, template):
        shapes = {n: p.shape for n, p in template.named_parameters()}
        return any(shapes.get(n) != p.shape for n, p in head.named_parameters())

    @property
    def template(self):
        """The (private copy of the) widest head whose forward every member runs."""
        return self._template[0]

    def _buffer_dicts(self):
        shared = {n: getattr(self, f"shared_{i}") for i, n in enumerate(self._shared_names)}
        stacked = {n: getattr(self, f"stacked_{i}") for i, n in enumerate(self._stacked_names)}
        return shared, stacked

    def stacked_buffer(self, name):
        """The stacked buffer ``name`` (one row per member, e.g. ``feature_mask`` when
        the ranks differ), or None when every member shares it or it does not exist."""
        return self._buffer_dicts()[1].get(name)

    def forward(self, x):
        """Outputs of every member on the same input ``x``: shape ``(E, *head_output)``.

        Single kernel heads with linear feature encoders (or the ``table`` map), the
        affine value map and readout take a fused path: every token-wise linear map of
        every member in one matrix product, the attention of short sequences as
        broadcast products. When the tokens of ``x`` repeat a lot (e.g. a witness suite:
        46 distinct tokens at 12,558 positions), it computes the maps, the kernel
        ``alpha(u, v)`` and ``<w(u), v(v)>`` once for all pairs of distinct tokens and
        gathers them to the (query, key) positions of every sequence. It is checked
        against the generic path (``vmap``) on the first call and replaced by it if
        they disagree.
        """
        if self._fast and x.ndim == 3 and self._short(x):
            if not self._fast_checked:
                self._fast_checked = True
                with torch.no_grad():
                    xs = x[:8]
                    b = self._vmap_forward(xs)
                    try:  # the form (pairs of distinct tokens or not) x will take
                        a = self._fast_forward(xs, pairs=self._pair_plan(x) is not None)
                        tol = 1e-4 if b.dtype == torch.float32 else 1e-9
                        ok = (a.shape == b.shape and a.dtype == b.dtype and torch.allclose(
                            a, b, rtol=tol, atol=tol, equal_nan=True))
                    except Exception:  # noqa: BLE001 - any failure: use the generic path
                        ok = False
                self._fast = ok
            if self._fast:
                return self._fast_forward(x)
        return self._vmap_forward(x)

    def _pair_plan(self, x, force=False):
        """Distinct tokens of ``x`` and the token pair of every (query, key) position.

        None when the tokens repeat too little for :meth:`_pair_forward` to pay (it
        computes every map and the full ``U x U`` kernel on the ``U`` distinct tokens,
        and gathers per sequence), unless ``force``. Cached for the last ``x``: the
        same tensor object, not modified in place since (its version counter).
        """
        key = (x._version, force)
        cache = getattr(self, "_pair_cache", None)
        if cache is None or cache[0] is not x or cache[1] != key:
            n, N, m = x.shape
            plan = None
            if force or n * N >= 4:
                uniq, inv = _unique_rows(x.reshape(-1, m))
                U = int(uniq.shape[0])
                if force or (2 * U <= n * N and U * U <= n * N * N):
                    inv = inv.view(n, N).T  # (N, n): positions outer, as below
                    pidx = (inv[:, None, :] * U + inv[None, :, :]).reshape(-1)
                    plan = (uniq.contiguous(), inv.reshape(-1), pidx, U)
            cache = (x, key, plan)
            self._pair_cache = cache
        return cache[2]

    def _vmap_forward(self, x):
        template = self.template
        template.train(self.training)
        shared, stacked = self._buffer_dicts()
        params = dict(zip(self.names, self.params))

        def one(p, b, xx):
            return functional_call(template, (p, b, shared), (xx,))

        return vmap(one, in_dims=(0, 0, None))(params, stacked, x)

    def _short(self, x):
        # explicit (N x N) kernel cheaper than the (r x d) sketch
        t = self.template
        r, d = int(t.rank), int(t.value_dim)
        return x.shape[1] * (r + d) <= 2 * r * d

    def _token_index(self, fm, x):
        key = (x.data_ptr(), tuple(x.shape), x.dtype, x.device)
        if self._index_cache is None or self._index_cache[0] != key:
            self._index_cache = (key, fm.token_index(x).reshape(-1))
        return self._index_cache[1]

    def _fast_forward(self, x, pairs=None):
        # pairs: None chooses by the repetition of tokens (_pair_plan)
        plan = self._pair_plan(x, force=True) if pairs else (
            None if pairs is not None else self._pair_plan(x))
        if plan is not None:
            return self._pair_forward(x, plan)
        return self._position_forward(x)

    def _pair_forward(self, x, plan):
        # Few distinct tokens (e.g. a witness suite: 46 tokens at 12,558 positions):
        # every token-wise map on the U distinct tokens only, then the kernel
        # alpha(u, v) and the readout-value products <w(u), v(v)> for all U x U token
        # pairs, gathered to the (query, key) positions of every sequence. Autograd's
        # backward of the gathers (index_select) is a scatter-add into U x U.
        uniq, inv, pidx, U = plan
        t = self.template
        P = dict(zip(self.names, self.params))
        shared, stacked = self._buffer_dicts()
        mask = stacked.get("feature_mask", shared.get("feature_mask"))
        n, N, _ = x.shape
        E = self.n_members
        qf, kf = t.query_features, t.key_features
        tied = qf is kf
        qpre, kpre = "query_features", "query_features" if tied else "key_features"

        def amap(pre):  # (E, U, o)
            W, b = P[pre + ".weight"], P[pre + ".bias"]  # (E, o, m), (E, o)
            return torch.baddbmm(b.unsqueeze(1), uniq.expand(E, *uniq.shape),
                                 W.transpose(1, 2))

        def feats(fm, pre):  # (E, U, r): log-features or features
            if fm.requires_vocabulary:
                return P[pre + ".log_table"].index_select(1, fm.token_index(uniq))
            z = amap(pre + ".encoder")
            return z if fm.log_domain else fm.activation(z)

        fq = feats(qf, qpre)
        fk = fq if tied else feats(kf, kpre)
        if mask is not None:
            mask = mask.unsqueeze(1)  # (E, 1, r)
        if qf.log_domain:
            # log alpha(u, v) = logsumexp_k (lq_uk + lk_vk); per query row of each
            # sequence shifted by its maximum, as features() shifts by c_i
            s = fq.unsqueeze(2) + fk.unsqueeze(1)  # (E, U, U, r)
            if mask is not None:
                s = s + torch.log(mask).unsqueeze(1)
            la = torch.logsumexp(s, -1).reshape(E, U * U).index_select(1, pidx)
            la = la.view(E, N, N, n)
            alpha = torch.exp(la - la.amax(2, keepdim=True).detach())
        else:
            if mask is not None:
                fq, fk = fq * mask, fk * mask
            K = torch.bmm(fq, fk.transpose(1, 2))  # (E, U, U)
            alpha = K.reshape(E, U * U).index_select(1, pidx).view(E, N, N, n)
        G = torch.bmm(amap("readout.weight"), amap("value.linear").transpose(1, 2))
        g = G.reshape(E, U * U).index_select(1, pidx).view(E, N, N, n)
        # layout (E, N_i, N_j, n): the sums over keys j add contiguous rows of n
        den = alpha.sum(2)
        y = (alpha * g).sum(2) / den.clamp_min(torch.finfo(den.dtype).tiny)
        b = amap("readout.bias").reshape(E, U).index_select(1, inv).view(E, N, n)
        return (y + b).transpose(1, 2)  # (E, n, N)

    def _position_forward(self, x):
        # layout (o, E, N, n): feature, member, sequence position, sequence; every
        # (feature, member, position) row of n sequences is contiguous, so the
        # products below run over long rows, and each map is one matrix product
        t = self.template
        P = dict(zip(self.names, self.params))
        shared, stacked = self._buffer_dicts()
        mask = stacked.get("feature_mask", shared.get("feature_mask"))
        n, N, m = x.shape
        E = self.n_members
        X2 = self._transposed(x)  # (m, N * n), positions outer
        qf, kf = t.query_features, t.key_features
        tied = qf is kf
        qpre, kpre = "query_features", "query_features" if tied else "key_features"
        prefixes = []
        for fm, pre in ((qf, qpre), (kf, kpre)):
            if not fm.requires_vocabulary and pre + ".encoder" not in prefixes:
                prefixes.append(pre + ".encoder")
        prefixes += ["value.linear", "readout.weight", "readout.bias"]
        parts = {}
        for pre in prefixes:
            W, b = P[pre + ".weight"], P[pre + ".bias"]  # (E, o, m), (E, o)
            o = W.shape[1]
            Wf = W.transpose(0, 1).reshape(o * E, m)  # rows (o, E)
            bf = b.T.reshape(o * E, 1)
            parts[pre] = torch.addmm(bf, Wf, X2).view(o, E, N, n)

        def feats(fm, pre):  # (r, E, N, n): log-features or features
            if fm.requires_vocabulary:
                tab = P[pre + ".log_table"]  # (E, n_tokens, r)
                idx = self._position_index(fm, x)  # (N * n,), positions outer
                return tab.permute(2, 0, 1)[:, :, idx].view(tab.shape[2], E, N, n)
            z = parts[pre + ".encoder"]
            return z if fm.log_domain else fm.activation(z)

        fq = feats(qf, qpre)
        fk = fq if tied else feats(kf, kpre)
        if mask is not None:  # (E, r) -> (r, E, 1, 1)
            mask = mask.T[:, :, None, None]
        if qf.log_domain:
            M = fk.amax(2, keepdim=True).detach()
            a = fq + M
            if mask is not None:
                a = a + torch.log(mask)
            phi_q = torch.exp(a - a.amax(0, keepdim=True).detach())
            phi_k = torch.exp(fk - M)
            if mask is not None:
                phi_k = phi_k * mask
        else:
            phi_q, phi_k = fq, fk
            if mask is not None:
                phi_q, phi_k = phi_q * mask, phi_k * mask
        out = _ShortAttention.apply(phi_q, phi_k, parts["value.linear"],
                                    parts["readout.weight"], parts["readout.bias"][0])
        return out.transpose(1, 2)  # (E, N, n) -> (E, n, N)

    def _transposed(self, x):
        key = (x.data_ptr(), tuple(x.shape), x.dtype, x.device)
        cache = getattr(self, "_xT_cache", None)
        if cache is None or cache[0] != key:
            cache = (key, x.permute(2, 1, 0).reshape(x.shape[2], -1).contiguous())
            self._xT_cache = cache
        return cache[1]

    def _position_index(self, fm, x):
        n, N, _ = x.shape
        return self._token_index(fm, x).view(n, N).T.reshape(-1)

    def member_state_dict(self, i):
        """Parameters and buffers of member ``i`` at its own (unpadded) shapes.

        Parameters
        ----------
        i : int
            Member index.

        Returns
        -------
        state : dict of str to Tensor
            Detached copies, loadable into a head like the ``i``-th one with
            ``load_state_dict``.
        """
        state = {}
        shapes = self._shapes[i]
        for n, p in zip(self.names, self.params):
            state[n] = _crop_to(p.detach()[i], shapes[n]).clone()
        shared, stacked = self._buffer_dicts()
        for n, shape in self._buffer_shapes[i].items():
            if n in shared:
                state[n] = shared[n].clone()
            elif n in stacked:
                state[n] = _crop_to(stacked[n][i], shape).clone()
        return state

    def crop(self, i, name, tensor):
        """Member ``i``'s block of a stacked tensor shaped like parameter ``name``.

        Parameters
        ----------
        i : int
        name : str
            A name of :attr:`names`.
        tensor : Tensor
            Shaped like the stacked parameter (e.g. an optimizer state).

        Returns
        -------
        Tensor
        """
        return _crop_to(tensor[i], self._shapes[i][name])
