"""Exact constructions as fitted estimators (:ref:`theory-r1` to :ref:`theory-r3`).

Each function sets the weights of the library's own heads
(:class:`~minip_learn.nn.KernelAttentionHead`,
:class:`~minip_learn.nn.SoftmaxAttentionHead`) by hand, in float64, and wraps them in
the matching estimator with its ``from_module``: ``predict`` and ``score`` work
without ``fit``. :func:`factorized_kernel_head` builds a head of a given rank for one
family from a nonnegative factorisation of the R3 kernel. torch is imported only when
a construction is built.
"""

import itertools

import numpy as np
from sklearn.utils import check_random_state

from ._validation import (
    check_float,
    check_int,
    check_params,
    check_sequences,
    check_targets,
    distinct_tokens,
)
from .metrics import TOLERANCE, solves, verify_solver

__all__ = ["default_beta", "exact_kernel_realization", "factorized_kernel_head",
           "rank_one_head", "softmax_construction"]


def default_beta(seq_len):
    """Default inverse temperature ``beta = max(2, N - 1)`` for the R2/R3 heads.

    The soft-min error is at most ``(N-1)/(e*beta)``; ``beta = max(2, N-1)`` keeps it
    at most ``1/e < 1/2`` for every length ``N`` (``beta = 2`` for ``N <= 3``, as in
    :ref:`theory-r2`).

    Examples
    --------
    >>> from minip_learn.constructions import default_beta
    >>> default_beta(3), default_beta(6)
    (2.0, 5.0)
    """
    seq_len = check_int(seq_len, "seq_len", min_value=1)
    return float(max(2, seq_len - 1))


def _resolve_beta(beta, seq_len):
    if beta is None:
        return default_beta(seq_len)
    return check_float(beta, "beta", min_value=0.0, strict=True)


def rank_one_head(n_bits):
    """A rank-1 kernel head that solves every sequence of length 1 and 2 (:ref:`theory-r1`).

    ``phi_Q = phi_K = 1`` (``elu+1`` features with zero encoder weights: uniform
    attention), ``v(x) = x`` and ``rho_x(u) = 2<x, u> - |x|``. For ``N = 2``,
    ``u = (x_1 + x_2)/2`` and ``p_1 = <x_1, x_2>``; for ``N = 1``, ``p_1 = |x_1|``.
    Exact.

    Parameters
    ----------
    n_bits : int
        Bits per token ``m``.

    Returns
    -------
    estimator : KernelAttentionRegressor
        Fitted (rank 1, float64).

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.constructions import rank_one_head
    >>> est = rank_one_head(4)
    >>> est.predict(np.array([[[1, 1, 0, 1], [0, 1, 1, 1]]])).round(6)
    array([[2., 2.]])
    """
    from .estimators import KernelAttentionRegressor
    from .nn import KernelAttentionHead

    n_bits = check_int(n_bits, "n_bits", min_value=1)
    head = KernelAttentionHead(n_bits, 1, feature_map="elu+1").double()
    head.set_uniform_features().set_identity_value_readout(scale=2.0, bias_per_bit=-1.0)
    return KernelAttentionRegressor.from_module(
        head, rank=1, feature_map="elu+1", dtype="float64")


def softmax_construction(n_bits, beta=None, *, seq_len=3):
    """Softmax attention with ``m``-dim scores solving length-3 Min-IP (:ref:`theory-r2`).

    Scores ``-beta <x_i, x_j>`` (``q(x) = x``, ``k(x) = -beta x``), ``v(x) = x`` and
    ``rho_x(u) = <x, u>``: the output is a soft-min of the overlaps with error at most
    ``(N-1)/(e*beta)``, below 1/2 for every sequence of length ``N`` when
    ``beta > 2(N-1)/e``.

    Parameters
    ----------
    n_bits : int
        Bits per token ``m``.
    beta : float, default=None
        Inverse temperature; None means :func:`default_beta` of ``seq_len``
        (``2.0`` for ``seq_len=3``).
    seq_len : int, default=3
        Longest sequence length the default ``beta`` must solve.

    Returns
    -------
    estimator : SoftmaxAttentionRegressor
        Fitted (float64).

    Examples
    --------
    >>> from minip_learn.datasets import make_minip
    >>> from minip_learn.constructions import softmax_construction
    >>> X, y = make_minip(200, seq_len=3, n_bits=12, random_state=0)
    >>> softmax_construction(12).score(X, y)
    1.0
    """
    import torch

    from .estimators import SoftmaxAttentionRegressor
    from .nn import SoftmaxAttentionHead

    n_bits = check_int(n_bits, "n_bits", min_value=1)
    seq_len = check_int(seq_len, "seq_len", min_value=1)
    beta = _resolve_beta(beta, seq_len)
    head = SoftmaxAttentionHead(n_bits, temperature=1.0).double()
    eye = torch.eye(n_bits, dtype=torch.float64)
    head.set_score_maps(eye, -beta * eye).set_identity_value_readout()
    return SoftmaxAttentionRegressor.from_module(head, temperature=1.0, dtype="float64")


def _all_tokens(n_bits):
    return np.array(list(itertools.product((0, 1), repeat=n_bits)), dtype=np.uint8)


def exact_kernel_realization(n_bits=None, tokens=None, *, beta=None, seq_len=3):
    """A nonnegative kernel head reproducing the softmax head exactly (:ref:`theory-r3`).

    ``phi_Q(x) = onehot(x)`` over a token set ``T`` and ``phi_K(z)_y = exp(-beta<y,z>)``
    give ``alpha(x, z) = exp(-beta <x, z>)``: with ``v(x) = x`` and
    ``rho_x(u) = <x, u>`` the head equals :func:`softmax_construction` on every
    sequence over ``T``, of any length. Its rank is ``|T|`` (``2^m`` for all tokens):
    the *constructive rank* of a family over ``T``. Built on the ``table`` feature map
    with query log-features ``0`` on the diagonal and ``-(beta * n_bits + 1e4)`` off it
    for the one-hot. The head evaluates its kernel in the log domain (a logsumexp over
    the features, shifted by each query's maximum), so the result is exact at any
    ``beta``: every off-diagonal term is at most ``exp(-1e4)`` times the largest term
    of its query, since ``beta <x, z> <= beta * n_bits`` for every pair of tokens
    (a fixed ``-1e4`` stops being negligible once ``beta <x, z>`` approaches ``1e4``:
    at 20 bits and ``N = 1972``, ``beta * n_bits / 2 = 19710``).

    Parameters
    ----------
    n_bits : int, default=None
        Bits per token; with ``tokens=None`` the token set is all ``2^n_bits`` tokens
        (at most ``2^16``).
    tokens : array-like of shape (n_tokens, n_bits) or (n_samples, seq_len, n_bits)
        A finite token set (duplicates are merged); a family of sequences may be given
        directly.
    beta : float, default=None
        Inverse temperature; None means :func:`default_beta` of ``seq_len``.
    seq_len : int, default=3
        Longest sequence length the default ``beta`` must solve.

    Returns
    -------
    estimator : KernelAttentionRegressor
        Fitted (``feature_map="table"``, ``rank = |T|``, float64); it accepts only
        sequences over ``T``.

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.constructions import exact_kernel_realization
    >>> suite = make_witness_suite(24, 3, construction="small")
    >>> est = exact_kernel_realization(tokens=suite.tokens)
    >>> est.rank == suite.constructive_rank, est.score(suite.X, suite.y)
    (True, 1.0)
    """
    import torch

    from .estimators import KernelAttentionRegressor
    from .nn import KernelAttentionHead

    if tokens is None:
        if n_bits is None:
            raise ValueError("give n_bits (all 2**n_bits tokens) or a token set `tokens`.")
        n_bits = check_int(n_bits, "n_bits", min_value=1)
        if n_bits > 16:
            raise ValueError(
                f"all 2**{n_bits} tokens is too many for a table; pass `tokens` instead."
            )
        T = _all_tokens(n_bits)
    else:
        arr = np.asarray(tokens)
        if arr.ndim == 3:
            arr, _ = check_sequences(arr, name="tokens", binary=True)
            arr = arr.reshape(-1, arr.shape[2])
        else:
            arr, _ = check_sequences(arr, name="tokens", allow_2d=True, binary=True)
            arr = arr[:, 0, :]
        T = np.unique(arr.astype(np.uint8), axis=0)
        if n_bits is not None and check_int(n_bits, "n_bits", min_value=1) != T.shape[1]:
            raise ValueError(f"tokens have {T.shape[1]} bits but n_bits={n_bits}.")
        n_bits = T.shape[1]
    seq_len = check_int(seq_len, "seq_len", min_value=1)
    beta = _resolve_beta(beta, seq_len)
    r = len(T)
    head = KernelAttentionHead(
        n_bits, r, feature_map="table", feature_kwargs={"vocabulary": T}
    ).double()
    Tt = torch.as_tensor(T, dtype=torch.float64)
    # table rows follow the vocabulary order, which is T itself; the off-diagonal log
    # value lies 1e4 below the smallest log-kernel -beta * n_bits of any pair
    onehot_log = torch.full((r, r), -(beta * n_bits + 1e4), dtype=torch.float64)
    onehot_log.fill_diagonal_(0.0)
    head.set_token_tables(query=onehot_log, key=-beta * (Tt @ Tt.T))
    head.set_identity_value_readout()
    return KernelAttentionRegressor.from_module(
        head, rank=r, feature_map="table", feature_kwargs={"vocabulary": T}, dtype="float64")


def _masked_nmf(K, M, rank, n_iter, rng):
    """Multiplicative-update NMF of ``K`` on the entries where ``M`` is 1."""
    n = len(K)
    P = rng.uniform(0.1, 1.0, size=(n, rank))
    Q = rng.uniform(0.1, 1.0, size=(n, rank))
    MK = M * K
    tiny = 1e-12
    for _ in range(n_iter):
        P *= (MK @ Q) / ((M * (P @ Q.T)) @ Q + tiny)
        Q *= (MK.T @ P) / ((M * (P @ Q.T)).T @ P + tiny)
    return P, Q


#: Constraints of the arguments of :func:`factorized_kernel_head`.
_FACTORIZED_CONSTRAINTS = {
    "rank": ("int", {"min": 1}),
    "beta": ("real", {"min": 0.0}),
    "nmf_iter": ("int", {"min": 0}),
    "steps": ("int", {"min": 0}),
    "lr": ("real", {"min": 0.0, "strict": True}),
    "margin": ("real", {"min": 0.0}),
}


def _refine_factors(P, Q, G, idx, y, *, steps, lr, margin):
    """Gradient descent on ``log P``, ``log Q`` and the readout bias ``b`` (float64).

    ``G`` holds the overlaps of the distinct tokens and ``idx`` the token index at
    every position of every sequence. Returns ``(log P, log Q, b)`` as tensors.
    """
    import torch

    n, N = idx.shape
    dt = torch.float64
    LP = torch.log(torch.as_tensor(P, dtype=dt)).clamp_min(-300.0).requires_grad_()
    LQ = torch.log(torch.as_tensor(Q, dtype=dt)).clamp_min(-300.0).requires_grad_()
    b = torch.tensor(-0.25, dtype=dt, requires_grad=True)
    # flat index of the (query token, key token) pair at every (sequence, i, j)
    qi = np.repeat(idx[:, :, None], N, axis=2)
    kj = np.repeat(idx[:, None, :], N, axis=1)
    pairs = torch.as_tensor((qi * len(G) + kj).ravel())
    overlaps = torch.as_tensor(G[qi, kj], dtype=dt)
    target = torch.as_tensor(y, dtype=dt)
    optimizer = torch.optim.Adam([LP, LQ, b], lr=lr)
    for _ in range(steps):
        log_kernel = torch.logsumexp(LP[:, None, :] + LQ[None, :, :], dim=-1)
        weights = torch.softmax(
            log_kernel.reshape(-1).index_select(0, pairs).reshape(n, N, N), dim=-1)
        err = ((weights * overlaps).sum(-1) + b - target).abs()
        if float(err.detach().max()) < TOLERANCE - margin:
            break
        loss = torch.relu(err - TOLERANCE + 2 * margin).square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return LP.detach(), LQ.detach(), b.detach()


def factorized_kernel_head(X, y, rank, *, beta=2.0, nmf_iter=200, steps=300, lr=0.05,
                           margin=0.1, random_state=None):
    """A kernel head of rank ``rank`` built from a nonnegative factorisation ``P Q^T``.

    The construction route to an upper bound on the rank a family needs. The kernel of
    :ref:`theory-r3`, ``exp(-beta <x, z>)`` (each query row scaled to maximum 1), is
    factorised on the token pairs that occur together in the family as ``P Q^T`` with
    ``P, Q >= 0`` of ``rank`` columns (masked multiplicative-update NMF). The factors
    are then refined by gradient descent on their logarithms (so they stay
    nonnegative) against the family's outputs: the value map ``v(x) = x`` and readout
    ``rho_x(u) = <x, u> + b`` of :ref:`theory-r3` (``b`` learnt), a squared hinge on
    ``|p - t| - (1/2 - 2 margin)``, stopping once every error is below
    ``1/2 - margin``. The result is a fitted ``feature_map="table"`` head with
    ``log P`` and ``log Q`` as its query and key tables; whether it solves the family
    is for :func:`~minip_learn.metrics.verify_solver` to say.

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits)
        The family (0/1 tokens).
    y : array-like of shape (n_samples, seq_len)
        Its Min-IP targets.
    rank : int
        Number of features ``r``.
    beta : float, default=2.0
        Inverse temperature of the kernel that is factorised.
    nmf_iter : int, default=200
        Multiplicative updates.
    steps : int, default=300
        Gradient steps of the refinement (Adam, float64).
    lr : float, default=0.05
        Learning rate of the refinement.
    margin : float, default=0.1
        The refinement stops once every error is below ``1/2 - margin``.
    random_state : int, RandomState instance or None, default=None
        Seeds the NMF initialisation.

    Returns
    -------
    estimator : KernelAttentionRegressor
        Fitted without training, through
        :meth:`~minip_learn.estimators.KernelAttentionRegressor.from_module`
        (``feature_map="table"`` over the family's tokens, ``rank``, float64);
        ``train_max_error_`` and ``solved_`` describe the constructed head on
        ``(X, y)``.

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.constructions import factorized_kernel_head
    >>> from minip_learn.metrics import verify_solver
    >>> suite = make_witness_suite(12, max_sequences=20000)
    >>> suite.certified_min_rank, suite.constructive_rank
    (4, 8)
    >>> est = factorized_kernel_head(suite.X, suite.y, 8, random_state=0)
    >>> est.rank, verify_solver(est, suite.X, suite.y) < 0.5
    (8, True)
    """
    from .estimators import KernelAttentionRegressor
    from .nn import KernelAttentionHead

    X, _ = check_sequences(X, binary=True)
    n, N, m = X.shape
    y = check_targets(y, n, N).astype(np.float64, copy=False)
    params = check_params(
        dict(rank=rank, beta=beta, nmf_iter=nmf_iter, steps=steps, lr=lr, margin=margin),
        _FACTORIZED_CONSTRAINTS)
    rank = params["rank"]
    rng = check_random_state(random_state)
    tokens, inverse = distinct_tokens(X.reshape(-1, m), return_inverse=True)
    idx = inverse.reshape(n, N)
    T = tokens.astype(np.float64)
    G = T @ T.T
    K = np.exp(-params["beta"] * (G - G.min(axis=1, keepdims=True)))
    M = np.zeros_like(K)
    M[np.repeat(idx, N, axis=1).ravel(), np.tile(idx, (1, N)).ravel()] = 1.0
    P, Q = _masked_nmf(K, M, rank, params["nmf_iter"], rng)
    log_p, log_q, b = _refine_factors(P, Q, G, idx, y, steps=params["steps"],
                                      lr=params["lr"], margin=params["margin"])

    # the table head of R3 with the factors as its query and key tables (rows follow
    # the vocabulary, which is ``tokens``), value map x and readout <x, u> + b
    vocabulary = {"vocabulary": tokens}
    head = KernelAttentionHead(m, rank, feature_map="table",
                               feature_kwargs=vocabulary).double()
    head.set_token_tables(query=log_p, key=log_q)
    head.set_identity_value_readout(bias=float(b))
    est = KernelAttentionRegressor.from_module(
        head, rank=rank, feature_map="table", feature_kwargs=vocabulary, dtype="float64")
    est.train_max_error_ = verify_solver(est, X, y)
    est.solved_ = solves(est.train_max_error_)
    return est
