"""The transcript bound (:ref:`theory-r8`) applied to a model: channel capacity vs bits needed.

A sketch model communicates across tokens only through its sketches: every head of
every layer sends ``rank`` numbers (what a query reads of ``S`` and ``s`` goes through
its ``rank`` features), each carrying at most ``bits_of_precision`` bits. Its
cross-token channel capacity is therefore ``n_heads x n_layers x rank x bits``
(:func:`~minip_learn.theory.channel_capacity_bits`), and :ref:`theory-r8` says that
computing ``q`` independent answers over ``s + 1`` values needs at least
``q log2(s + 1)`` bits (:func:`~minip_learn.theory.transcript_lower_bound`).

What a head sends is really its whole sketch ``(S, s)``: ``rank x (value_dim + 1)``
numbers. ``count="sketch"`` counts those; the default ``count="rank"`` is the one of :ref:`theory-r8`
formula. The difference matters: a nonlinear readout can decode a rank-1 sketch (the
plain mean of the values) when ``value_dim`` is large, which ``count="rank"`` does not
see.

Bits of precision default to the significand of the model's floating-point dtype
(24 for float32, 53 for float64, 11 for float16, 8 for bfloat16): the information a
real number of that dtype carries beyond its exponent. This is a modelling choice (an
exponent adds a few bits; noise removes many); pass ``bits_of_precision`` to use another.

torch is imported only when a model's dtype is read.
"""

import math

import numpy as np
from sklearn.utils import Bunch

from .._validation import check_int
from .bounds import channel_capacity_bits, transcript_lower_bound

__all__ = []  # public home: the package minip_learn.theory


def _module_of(model):
    net = getattr(model, "net_", None)
    if net is not None:
        return net.module_
    if hasattr(model, "get_params") and not hasattr(model, "parameters"):
        raise ValueError(
            f"{type(model).__name__} is not fitted: the channel capacity is read from the "
            "fitted module (call fit first, or pass a torch module).")
    return model


def _significand_bits(dtype):
    import torch

    return int(round(-math.log2(torch.finfo(dtype).eps))) + 1


def _capacity_terms(model, bits_of_precision, count="rank"):
    if count not in ("rank", "sketch"):
        raise ValueError(f"count must be 'rank' or 'sketch'; got {count!r}.")
    module = _module_of(model)
    rank = getattr(module, "rank", None)
    if rank is None:
        raise ValueError(
            f"{type(module).__name__} has no fixed-size sketch (no rank): dense softmax "
            "attention sends a cross-token message that grows with the sequence length, "
            "so R8's capacity does not apply to it.")
    n_heads = int(getattr(module, "n_heads", 1))
    n_layers = int(getattr(module, "n_layers", 1))
    if bits_of_precision is None:
        param = next(iter(module.parameters()), None)
        if param is None:
            raise ValueError("the module has no parameters to read a dtype from; pass "
                             "bits_of_precision.")
        bits_of_precision = _significand_bits(param.dtype)
    bits = check_int(bits_of_precision, "bits_of_precision", min_value=1)
    numbers = int(rank)
    if count == "sketch":
        numbers = int(rank) * (int(getattr(module, "value_dim", module.n_bits)) + 1)
    return n_heads, n_layers, numbers, bits


def model_channel_capacity(model, *, bits_of_precision=None, count="rank"):
    """Cross-token channel capacity ``heads x layers x rank x bits`` of a sketch model.

    Parameters
    ----------
    model : fitted kernel estimator or torch module
        A fitted :class:`~minip_learn.KernelAttentionRegressor` /
        :class:`~minip_learn.KernelAttentionClassifier`, or a
        :class:`~minip_learn.nn.KernelAttentionHead` /
        :class:`~minip_learn.nn.KernelAttentionModel` (anything with ``rank`` and,
        optionally, ``n_heads`` and ``n_layers``; both default to 1).
    bits_of_precision : int, default=None
        Bits per transmitted number; None reads the significand of the model's dtype
        (24 for float32, 53 for float64; see the module docstring).
    count : {"rank", "sketch"}, default="rank"
        Numbers per head: ``rank`` (the formula of :ref:`theory-r8`) or the whole sketch,
        ``rank x (value_dim + 1)``.

    Returns
    -------
    bits : int

    Raises
    ------
    ValueError
        For an unfitted estimator or a model without a fixed-size sketch (softmax).

    Examples
    --------
    >>> from minip_learn.nn import KernelAttentionModel
    >>> from minip_learn.theory import model_channel_capacity
    >>> model = KernelAttentionModel(6, rank=4, n_heads=2, n_layers=3)
    >>> model_channel_capacity(model)   # 2 x 3 x 4 x 24 (float32)
    576
    >>> model_channel_capacity(model.double())
    1272
    >>> model_channel_capacity(model, bits_of_precision=8)
    192
    >>> model_channel_capacity(model, bits_of_precision=8, count="sketch")  # value_dim 6
    1344
    """
    return channel_capacity_bits(*_capacity_terms(model, bits_of_precision, count))


def transcript_check(model, X, *, n_answers=None, bits_of_precision=None, count="rank"):
    """Compare a model's channel capacity with the transcript bound of R8 for a family.

    One forward pass handles one sequence; its positions' answers (Min-IP targets in
    ``0..n_bits``) have to cross the sketches. With ``q = n_answers`` (default: the
    sequence length, an optimistic count: it treats every position's answer as
    independent) and ``s = n_bits``, the bound is ``q log2(n_bits + 1)`` bits.
    ``ratio = capacity / required``: below 1 the model cannot transmit the answers,
    whatever its weights; above 1 R8 does not rule it out (R5 still may, for a single
    nonnegative head).

    Parameters
    ----------
    model : fitted kernel estimator or torch module
        See :func:`model_channel_capacity`.
    X : array-like of shape (n_samples, seq_len, n_bits), or a Bunch with ``X``
        The family (e.g. :func:`~minip_learn.datasets.make_witness_suite`).
    n_answers : int, default=None
        Independent answers per sequence; None means ``seq_len``.
    bits_of_precision : int, default=None
        As in :func:`model_channel_capacity`.
    count : {"rank", "sketch"}, default="rank"
        As in :func:`model_channel_capacity`.

    Returns
    -------
    result : Bunch
        ``capacity_bits``, ``required_bits``, ``ratio``, ``sufficient`` (capacity >=
        required), and the terms ``n_heads``, ``n_layers``, ``numbers_per_head``
        (``rank``, or the sketch size with ``count="sketch"``), ``bits_of_precision``,
        ``n_answers``, ``alphabet_size``.

    Examples
    --------
    >>> from minip_learn.datasets import make_witness_suite
    >>> from minip_learn.nn import KernelAttentionHead
    >>> from minip_learn.theory import transcript_check
    >>> suite = make_witness_suite(24, 3, construction="small")
    >>> check = transcript_check(KernelAttentionHead(24, rank=2), suite)
    >>> check.capacity_bits, round(check.required_bits, 2), check.sufficient
    (48, 13.93, True)
    """
    X = getattr(X, "X", X)
    shape = np.shape(X)
    if len(shape) != 3:
        raise ValueError(f"X must have shape (n_samples, seq_len, n_bits); got {shape}.")
    _, seq_len, n_bits = shape
    q = seq_len if n_answers is None else check_int(n_answers, "n_answers", min_value=0)
    n_heads, n_layers, numbers, bits = _capacity_terms(model, bits_of_precision, count)
    capacity = channel_capacity_bits(n_heads, n_layers, numbers, bits)
    required = transcript_lower_bound(q, n_bits)
    return Bunch(
        capacity_bits=capacity,
        required_bits=required,
        ratio=math.inf if required == 0 else capacity / required,
        sufficient=bool(capacity >= required),
        n_heads=n_heads,
        n_layers=n_layers,
        numbers_per_head=numbers,
        bits_of_precision=bits,
        n_answers=q,
        alphabet_size=n_bits,
    )
