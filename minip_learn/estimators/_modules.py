"""The torch modules behind the estimators: what a module declares about itself, the
checked build of a user's module, and the refusal of a multiset for a model that reads
token order."""

import torch
from sklearn.utils import Bunch

__all__ = ["build_and_check", "compact_order_error", "module_declarations"]


def module_declarations(module):
    """What ``module`` (a head, a model or a mixer) declares about itself.

    A module that declares nothing (a user's module, or None before a fit) reads as
    positionless and non-causal, with no declaration of its kernel or of the theorem.

    Parameters
    ----------
    module : torch.nn.Module or None

    Returns
    -------
    declarations : :class:`~sklearn.utils.Bunch`
        ``causal`` (bool, default False), ``positional`` (the positional map, default
        None), ``nonnegative`` (whether the kernel is nonnegative by construction;
        None when not declared), ``theorem`` (``"yes"``, ``"positional"``, ``"no"``;
        None when not declared), ``theorem_applies`` (bool; None when not declared)
        and ``single_head`` (the single head with an affine readout, the model of the
        theorem; None otherwise).

    Examples
    --------
    >>> from minip_learn.nn import KernelAttentionHead
    >>> d = module_declarations(KernelAttentionHead(6, 2, causal=True))
    >>> d.causal, d.positional, d.theorem, d.theorem_applies
    (True, None, 'yes', True)
    >>> module_declarations(None).theorem is None
    True
    """
    return Bunch(
        causal=bool(getattr(module, "causal", False)),
        positional=getattr(module, "positional", None),
        nonnegative=getattr(module, "nonnegative", None),
        theorem=getattr(module, "theorem", None),
        theorem_applies=getattr(module, "theorem_applies", None),
        single_head=getattr(module, "single_head", None),
    )


def build_and_check(build, params, dtype, check, *, name, call):
    """Build a user's module ``build(**params)`` in ``dtype`` and ``check`` it, leaving
    torch's random state as it was.

    Parameters
    ----------
    build : callable
        The module's class or factory.
    params : dict
        Its keyword arguments.
    dtype : torch.dtype
    check : callable
        ``check(module)``: raises a ValueError naming what is wrong with the module's
        output.
    name : str
        What the user passed, for the message (e.g. ``"mixer='my_mixer'"``).
    call : str
        How the module is built, for the message (e.g.
        ``"mixer(n_bits=6, state_size=4, **mixer_kwargs)"``).

    Raises
    ------
    ValueError
        When the module cannot be built (its own ValueError as is, any other
        exception named with ``name`` and ``call``), or from ``check``.

    Examples
    --------
    >>> import torch
    >>> state = torch.random.get_rng_state()
    >>> build_and_check(torch.nn.Linear, {"in_features": 3, "out_features": 1},
    ...                 torch.float64, lambda m: None, name="m", call="m(3, 1)")
    >>> torch.equal(state, torch.random.get_rng_state())
    True
    """
    with torch.random.fork_rng(devices=[]):
        try:
            module = build(**params).to(dtype)
        except ValueError:
            raise
        except Exception as exc:  # a user's factory may raise anything: name it
            raise ValueError(f"{name} could not be built as {call}: "
                             f"{type(exc).__name__}: {exc}") from exc
        check(module)


def compact_order_error(estimator, reason):
    """The ValueError refusing a :class:`~minip_learn.compact.CompactFamily` ``X`` to
    ``estimator``, whose model ``reason`` (it reads token order, which a multiset
    does not have).

    Parameters
    ----------
    estimator : str
        The estimator's class name.
    reason : str
        How the model reads token order, e.g. ``"with causal=True depends on the
        order of the tokens"``.

    Returns
    -------
    error : ValueError

    Examples
    --------
    >>> print(compact_order_error("SoftmaxAttentionRegressor",
    ...                           "with causal=True depends on the order of the tokens"))
    X is a CompactFamily (sequences in multiset form, without token order), but
    SoftmaxAttentionRegressor with causal=True depends on the order of the tokens,
    which a multiset does not have: pass the materialised sequences, X of shape
    (n_sequences, seq_len, n_bits) in their order (X.expand()).
    """
    return ValueError(
        "X is a CompactFamily (sequences in multiset form, without token order), but "
        f"{estimator} {reason}, which a multiset does not have: pass the materialised "
        "sequences, X of shape (n_sequences, seq_len, n_bits) in their order "
        "(X.expand()).")
