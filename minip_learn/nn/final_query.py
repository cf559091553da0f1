"""Calling a module for the output at the last position only (final-query targets).

The library's modules take ``forward(x, ..., last=True)`` and compute that position
alone; a module that declares no ``last`` parameter (a user's module, a subclass with
its own ``forward(x)``) computes every position and the last one is sliced out.
"""

import inspect

__all__ = []  # public home: the package minip_learn.nn


def takes_last(module):
    """Whether ``module.forward`` has a ``last`` parameter.

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import make_mixer, takes_last
    >>> takes_last(make_mixer("gla", 4, 2)), takes_last(torch.nn.Linear(4, 1))
    (True, False)
    """
    try:
        return "last" in inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def last_kwargs(module, counts=None, last=False):
    """The keyword arguments of ``module``'s forward: ``counts`` when given and
    ``last=True`` when asked for and ``module`` takes it (then :func:`last_output`).

    Examples
    --------
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> from minip_learn.nn import KernelAttentionHead, last_kwargs, last_output
    >>> head, plain = KernelAttentionHead(4, rank=2), torch.nn.Linear(4, 1)
    >>> last_kwargs(head, last=True), last_kwargs(plain, last=True)
    ({'last': True}, {})
    >>> x = torch.rand(2, 5, 4)
    >>> last_output(plain, plain(x, **last_kwargs(plain, last=True)), True).shape
    torch.Size([2, 1, 1])
    """
    kwargs = {} if counts is None else {"counts": counts}
    if last and takes_last(module):
        kwargs["last"] = True
    return kwargs


def last_output(module, out, last):
    """``out`` of ``module``, cut to its last position (axis 1) when ``last`` was asked
    for and ``module`` computed every position (see :func:`last_kwargs`).

    Examples
    --------
    >>> import torch
    >>> from minip_learn.nn import last_output
    >>> last_output(torch.nn.Identity(), torch.arange(6.0).reshape(2, 3), True)
    tensor([[2.],
            [5.]])
    """
    if last and not takes_last(module):
        return out[:, -1:]
    return out
