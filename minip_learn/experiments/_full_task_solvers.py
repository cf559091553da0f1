"""The upper side of the full-task recipe: heads that solve every length-3 sequence.

Each candidate head of a size is one of the recipe's routes to an upper bound on
``r*(m)``: the key-weight groups of :func:`~minip_learn.theory.grouped_key_weights`
(as a ``table`` head), the nonnegative factorisations of
:func:`~minip_learn.constructions.factorized_kernel_head`, the trained heads of the
sweep, and the R3 head with one feature per token. A head counts only once
:func:`verify_ordered` has checked it on every one of the ``2^(3m)`` ordered sequences.
"""

import numpy as np

from ..constructions import exact_kernel_realization, factorized_kernel_head
from ..estimators import KernelAttentionRegressor
from ..metrics import solves, verify_solver
from ..nn import KernelAttentionHead
from ..theory import full_task_tokens, overlap_kernel_features

__all__ = ["ceiling_head", "factorized_candidates", "key_weight_head", "ordered_chunks",
           "overlap_head", "solves", "table_head", "verify_ordered"]

#: log-feature of a zero weight (``exp`` of it is 0 in float64)
_LOG_ZERO = -1e4


def table_head(tokens, query_features, key_features, bias):
    """A ``table`` head with given nonnegative features, ``v(t) = t`` and the readout
    ``<x, u> + bias``: ``alpha(x, t) = <query_features[x], key_features[t]>``.

    The table map stores log-features: a zero feature is stored as ``_LOG_ZERO``
    (``exp`` of it is 0 in float64). Rank: the number of columns.
    """
    import torch

    tokens = np.asarray(tokens)
    m, R = tokens.shape[1], query_features.shape[1]

    def log_of(F):
        F = np.asarray(F, dtype=np.float64)
        if (F < 0).any():
            raise ValueError("table_head takes nonnegative features.")
        with np.errstate(divide="ignore"):
            return np.where(F > 0, np.log(np.where(F > 0, F, 1.0)), _LOG_ZERO)

    vocabulary = {"vocabulary": tokens}
    head = KernelAttentionHead(m, R, feature_map="table", feature_kwargs=vocabulary).double()
    head.set_token_tables(query=torch.as_tensor(log_of(query_features)),
                          key=torch.as_tensor(log_of(key_features)))
    head.set_identity_value_readout(bias=float(bias))
    return KernelAttentionRegressor.from_module(
        head, rank=R, feature_map="table", feature_kwargs=vocabulary, dtype="float64")


def key_weight_head(groups):
    """The ``table`` head of key-weight groups: ``alpha(x, t) = c_g(x)(t)``.

    Query features are the one-hot of each token's group, key features the weights
    ``c_g(t)``; the value map ``v(t) = t`` and readout ``<x, u> + b`` with the groups'
    ``bias`` (:func:`~minip_learn.theory.grouped_key_weights`). Rank: the number of
    groups.
    """
    T = len(groups.tokens)
    query = np.zeros((T, groups.rank))
    query[np.arange(T), groups.query_group] = 1.0
    return table_head(groups.tokens, query, np.asarray(groups.key_weights).T, groups.bias)


def overlap_head(kernel):
    """The ``table`` head of an overlap kernel
    (:func:`~minip_learn.theory.overlap_kernel`) over every token of its size: rank
    ``sum_(j <= D) C(m, j)``, nonnegative features."""
    tokens = full_task_tokens(kernel.n_bits)
    query, key = overlap_kernel_features(kernel, tokens)
    return table_head(tokens, query, key, kernel.bias)


def ceiling_head(n_bits):
    """The R3 head with one feature per token (rank ``2^m``): the ceiling."""
    return exact_kernel_realization(n_bits)


def factorized_candidates(task, ranks, seeds, settings):
    """Nonnegative factorisations at ``ranks`` in decreasing order, while some seed
    solves: the first rank no seed solves ends the scan (the fits that fail, the
    slowest, are those of one rank). Yields one record per fit (``method``, ``rank``,
    ``seed``, ``max_error``, ``solved``, ``estimator``)."""
    for r in sorted(ranks, reverse=True):
        solved = False
        for seed in seeds:
            est = factorized_kernel_head(task.X, task.y, r, random_state=seed, **settings)
            rec = dict(method="factorisation", rank=int(r), seed=int(seed),
                       max_error=float(est.train_max_error_), solved=bool(est.solved_),
                       estimator=est)
            yield rec
            if rec["solved"]:
                solved = True
                break
        if not solved:
            return


def ordered_chunks(tokens, chunk):
    """Every ordered length-3 sequence over ``tokens`` (lexicographic in the token
    ids), in slices of ``chunk``: ``(X, y)`` with the exact targets."""
    T = len(tokens)
    G = tokens.astype(np.int64) @ tokens.T.astype(np.int64)
    total = T ** 3
    for a in range(0, total, chunk):
        i = np.arange(a, min(total, a + chunk), dtype=np.int64)
        ids = np.stack([i // (T * T), (i // T) % T, i % T], axis=1)
        ov = G[ids[:, :, None], ids[:, None, :]]                 # (n, 3, 3)
        yield tokens[ids], ov.min(axis=2)


def verify_ordered(estimator, tokens, *, chunk=1 << 18):
    """The largest error of ``estimator`` over all ``T^3`` ordered sequences of
    ``tokens`` (float64, in slices): below 1/2 it solves every sequence.

    Examples
    --------
    >>> from minip_learn.constructions import exact_kernel_realization
    >>> from minip_learn.theory import full_task_tokens
    >>> from minip_learn.experiments._full_task_solvers import verify_ordered
    >>> verify_ordered(exact_kernel_realization(3), full_task_tokens(3)) < 0.5
    True
    """
    worst = 0.0
    for X, y in ordered_chunks(np.asarray(tokens, dtype=np.uint8), chunk):
        worst = max(worst, float(verify_solver(estimator, X, y)))
        if not np.isfinite(worst):
            break
    return worst
