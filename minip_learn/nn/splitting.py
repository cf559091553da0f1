"""Splitting shared features of ``table`` kernel heads (an optimisation aid).

Gradient training of a kernel head with a free feature table (the ``table`` map) at
rank ``r`` close to the number of query tokens tends to get stuck in an *assignment
trap*: the construction of :ref:`theory-r3` gives every query token its own dominant
feature, but from a random start two queries often settle on the same feature while
another feature is used by no query. Nothing in the gradient moves them apart (on the m = 24
witness suite of :ref:`theory-r6` every seed stalls at a max error of about 2.86 at the
constructive rank 46, with 41-43 of the 46 features in use).

:func:`split_shared_features` is the cure that k-means uses for empty clusters, done
without changing the head's function where it matters: when queries share a dominant
feature ``f`` and a feature ``g`` is dominant for no query, the key column of ``f`` is
copied into ``g`` and one of the sharing queries moves its weight from ``f`` to ``g``.
That query's kernel row is unchanged up to the small terms it had on ``g`` (its
dominant term moves from ``f`` to ``g`` intact), the other queries lose only their
small weight on ``g``, and from then on the two queries have features of their own
that the gradient can separate.

The *dominant feature* of a query token ``x`` is the one carrying most of its kernel
value with its partner key ``k(x)``, the token of smallest overlap ``<x, z>`` among the
tokens it shares a training sequence with (for Min-IP, the key it must attend to):
``argmax_f lq[x, f] + lk[k(x), f]`` in log-features.

Plain torch; the training pipeline runs it through the callback
:class:`~minip_learn.training.SplitSharedFeatures` (the estimators' ``split_every``) on
the stacked tables of the members it trains.
"""

import torch

__all__ = []  # public home: the package minip_learn.nn

#: entries switched off get the largest log-feature of their row plus ``OFF``
#: (a weight ``exp(-30)`` ~ 1e-13 relative to the row's largest feature)
OFF = -30.0


def splittable_tables(module):
    """The ``(query, key)`` log-feature tables of a head that can be split, else None.

    Splitting applies to a single :class:`~minip_learn.nn.KernelAttentionHead` whose
    query and key maps are separate ``table`` maps.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import KernelAttentionHead
    >>> head = KernelAttentionHead(3, 2, feature_map="table",
    ...                            feature_kwargs=dict(vocabulary=torch.eye(3)))
    >>> [t.shape for t in splittable_tables(head)]
    [torch.Size([3, 2]), torch.Size([3, 2])]
    >>> splittable_tables(KernelAttentionHead(3, 2)) is None
    True
    """
    from .heads import KernelAttentionHead

    if not isinstance(module, KernelAttentionHead):
        return None
    return module.token_tables()


def minip_partners(index, vocabulary, counts=None):
    """Partner key of every vocabulary token: its smallest-overlap co-occurring token.

    Parameters
    ----------
    index : LongTensor of shape (n_sequences, seq_len)
        Vocabulary index of every token of the training sequences.
    vocabulary : Tensor of shape (n_tokens, n_bits)
        The distinct 0/1 tokens.
    counts : Tensor of shape (n_sequences, seq_len), default=None
        For sequences in multiset form (``index`` lists the slots): the multiplicity of
        every slot, 0 for padding. Two slots share a sequence when both occur, and a
        slot shares it with itself when its token occurs twice. None: one per position.

    Returns
    -------
    partners : LongTensor of shape (n_tokens,)
        For token ``t``, the index of the token ``z`` minimising ``<t, z>`` over the
        tokens that share a sequence with ``t`` at another position (the first such on
        ties), or ``-1`` when ``t`` never shares a sequence with another position.

    Examples
    --------
    >>> import torch
    >>> vocab = torch.tensor([[1., 1., 0.], [0., 0., 1.], [1., 0., 0.]])
    >>> minip_partners(torch.tensor([[0, 1, 2], [2, 2, 2]]), vocab).tolist()
    [1, 0, 1]
    """
    n_tokens = len(vocabulary)
    seq_len = index.shape[1]
    seen = torch.zeros(n_tokens, n_tokens, dtype=torch.bool, device=index.device)
    for i in range(seq_len):
        for j in range(seq_len):
            if counts is None:
                if i != j:
                    seen[index[:, i], index[:, j]] = True
                continue
            both = (counts[:, i] > 1) if i == j else (counts[:, i] > 0) & (counts[:, j] > 0)
            seen[index[both, i], index[both, j]] = True
    overlap = vocabulary.to(torch.float64) @ vocabulary.to(torch.float64).T
    overlap = torch.where(seen, overlap, torch.full_like(overlap, float("inf")))
    partners = overlap.argmin(1)
    return torch.where(seen.any(1), partners, torch.full_like(partners, -1))


@torch.no_grad()
def split_shared_features(log_q, log_k, partners, *, mask=None, members=None, optimizer=None):
    """Give queries that share a dominant feature features of their own (in place).

    Parameters
    ----------
    log_q, log_k : Tensor of shape (n_tokens, rank) or (n_members, n_tokens, rank)
        Query and key log-feature tables (``TokenTable.log_table``), or the stacked
        tables of an ensemble; modified in place.
    partners : LongTensor of shape (n_tokens,)
        Partner key of every token (:func:`minip_partners`); tokens with ``-1`` are not
        queries and are left alone.
    mask : Tensor of shape (rank,) or (n_members, rank), default=None
        Rank mask (1 = feature in use): masked features are never split into.
    members : iterable of int, default=None
        Stacked members to process (all when None); the others are left untouched.
    optimizer : torch.optim.Optimizer, default=None
        The optimizer of ``log_q`` and ``log_k``: when given, its state at the
        overwritten entries is zeroed (:func:`reset_optimizer_entries`).

    Returns
    -------
    changed_q, changed_k : BoolTensor shaped like ``log_q`` and ``log_k``
        The entries that were overwritten (e.g. to reset their optimizer state with
        :func:`reset_optimizer_entries`).
    n_moved : int or LongTensor of shape (n_members,)
        Number of queries moved to a feature of their own (per member for stacked
        tables).

    Notes
    -----
    For every feature ``f`` dominant for several queries, all but the first of them
    move, each to a feature ``g`` that is dominant for no query and in the mask (in
    increasing order of ``g``) while such features remain: ``lk[:, g] = lk[:, f]``,
    ``lq[:, g] = off`` except ``lq[x, g] = lq[x, f]``, and ``lq[x, f] = off``, where
    ``off`` is the row's largest log-feature (before the pass) minus 30: a weight of
    about 1e-13 relative to the row's largest feature, whatever the table's scale.

    Examples
    --------
    >>> import torch
    >>> lq = torch.tensor([[5., 0., 0.], [5., 0., 0.]])   # both queries use feature 0
    >>> lk = torch.zeros(2, 3)
    >>> _, _, moved = split_shared_features(lq, lk, torch.tensor([1, 0]))
    >>> moved, lq.argmax(1).tolist()
    (1, [0, 1])
    """
    stacked = log_q.ndim == 3
    lq = log_q if stacked else log_q.unsqueeze(0)
    lk = log_k if stacked else log_k.unsqueeze(0)
    changed_q = torch.zeros(lq.shape, dtype=torch.bool, device=lq.device)
    changed_k = torch.zeros(lk.shape, dtype=torch.bool, device=lk.device)
    if mask is not None:
        mask = mask.reshape(-1, mask.shape[-1]).expand(lq.shape[0], -1) > 0
    queries = torch.nonzero(partners >= 0).flatten()
    rank = lq.shape[-1]
    n_moved = [0] * lq.shape[0]
    for e in range(lq.shape[0]) if members is None else members:
        usable = torch.ones(rank, dtype=torch.bool, device=lq.device) if mask is None else mask[e]
        score = lq[e, queries] + lk[e, partners[queries]]
        score = score.masked_fill(~usable, float("-inf"))
        dom = score.argmax(1)
        counts = torch.bincount(dom, minlength=rank)
        free = torch.nonzero((counts == 0) & usable).flatten().tolist()
        if not free:
            continue
        off = lq[e].amax(1) + OFF  # (n_tokens,), before any change
        for f in torch.nonzero(counts > 1).flatten().tolist():
            sharing = queries[dom == f].tolist()
            for x in sharing[1:]:
                if not free:
                    break
                g = free.pop(0)
                lk[e, :, g] = lk[e, :, f]
                lq[e, :, g] = off
                lq[e, x, g] = lq[e, x, f]
                lq[e, x, f] = off[x]
                changed_k[e, :, g] = True
                changed_q[e, :, g] = True
                changed_q[e, x, f] = True
                n_moved[e] += 1
    if optimizer is not None and any(n_moved):
        reset_optimizer_entries(optimizer, log_q, changed_q.view(log_q.shape))
        reset_optimizer_entries(optimizer, log_k, changed_k.view(log_k.shape))
    if not stacked:
        return changed_q[0], changed_k[0], n_moved[0]
    return changed_q, changed_k, torch.tensor(n_moved)


@torch.no_grad()
def reset_optimizer_entries(optimizer, param, changed):
    """Zero the optimizer state of ``param`` (moments, momentum) at entries ``changed``.

    Every state tensor of the parameter's shape (Adam's ``exp_avg`` and
    ``exp_avg_sq``, SGD's ``momentum_buffer`` ...) is zeroed where ``changed`` is True;
    scalar state such as Adam's ``step`` is left alone.

    Examples
    --------
    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(2, 2))
    >>> opt = torch.optim.Adam([p])
    >>> p.sum().backward(); opt.step()
    >>> reset_optimizer_entries(opt, p, torch.tensor([[True, False], [False, False]]))
    >>> opt.state[p]["exp_avg"]
    tensor([[0.0000, 0.1000],
            [0.1000, 0.1000]])
    """
    state = optimizer.state.get(param)
    if not state:
        return
    for value in state.values():
        if torch.is_tensor(value) and value.shape == param.shape:
            value.masked_fill_(changed, 0)
