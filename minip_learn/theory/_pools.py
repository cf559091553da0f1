"""Named token pools of a family: the sub-families a certificate may come from (numpy
only).

A *pool* is a set of tokens; its sub-family holds the sequences of a family whose
tokens all lie in it. A certificate of the sub-family holds for the whole family (its
R4 triples are some of the family's), so :func:`~minip_learn.theory.certify` and
:func:`~minip_learn.theory.certify_full_task` certify every family at least as high as
the pools named here (see the theory page, :ref:`theory-certificates`).
"""

import numpy as np

__all__ = ["weight_pools"]


def weight_pools(tokens, *, min_tokens=2):
    """The constant-weight pools of a token set and its complementary weight pairs.

    Parameters
    ----------
    tokens : ndarray of shape (n_tokens, n_bits)
        Distinct 0/1 tokens.
    min_tokens : int, default=2
        Only the pools of at least this many tokens (one token certifies nothing).

    Yields
    ------
    name : str
        ``"weight-w"`` (the tokens of Hamming weight ``w``, ``0 < w < n_bits``), then
        ``"weights-w+v"`` (the tokens of weight ``w`` or ``v = n_bits - w``,
        ``0 < w < v``).
    mask : ndarray of bool, shape (n_tokens,)
        The pool's tokens.

    Examples
    --------
    >>> from minip_learn.theory import full_task_tokens
    >>> from minip_learn.theory._pools import weight_pools
    >>> [(name, int(mask.sum())) for name, mask in weight_pools(full_task_tokens(4))]
    [('weight-1', 4), ('weight-2', 6), ('weight-3', 4), ('weights-1+3', 8)]
    """
    tokens = np.asarray(tokens)
    m = tokens.shape[1]
    weight = tokens.sum(axis=1, dtype=np.int64)
    counts = np.bincount(weight, minlength=m + 1)
    for w in range(1, m):
        if counts[w] >= min_tokens:
            yield f"weight-{w}", weight == w
    for w in range(1, (m + 1) // 2):
        if counts[w] + counts[m - w] >= min_tokens:
            yield f"weights-{w}+{m - w}", (weight == w) | (weight == m - w)
