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

import torch
from torch import nn
from torch.func import functional_call, vmap

__all__ = ["HeadEnsemble"]


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

    @property
    def template(self):
        """The (private copy of the) widest head whose forward every member runs."""
        return self._template[0]

    def _buffer_dicts(self):
        shared = {n: getattr(self, f"shared_{i}") for i, n in enumerate(self._shared_names)}
        stacked = {n: getattr(self, f"stacked_{i}") for i, n in enumerate(self._stacked_names)}
        return shared, stacked

    def forward(self, x):
        """Outputs of every member on the same input ``x``: shape ``(E, *head_output)``."""
        template = self.template
        template.train(self.training)
        shared, stacked = self._buffer_dicts()
        params = dict(zip(self.names, self.params))

        def one(p, b, xx):
            return functional_call(template, (p, b, shared), (xx,))

        return vmap(one, in_dims=(0, 0, None))(params, stacked, x)

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
