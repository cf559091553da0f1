"""Sequence mixers: causal token mixers with a declared state size, selected by name.

A *mixer* maps a batch of float token sequences of shape ``(batch, N, n_bits)`` to one
real output per position, shape ``(batch, N)``; the output at position ``i`` depends on
the tokens ``x_1 .. x_i`` only. It is built as ``mixer(n_bits, state_size, **kwargs)``,
where ``state_size`` is its key (state) dimension ``r``. Every built-in mixer reads a
value map ``v(x)`` (:class:`~minip_learn.nn.ValueMap`, value dimension ``d``, default
``n_bits``) and ends with the query-dependent affine readout
``y_i = rho_{x_i}(u_i) = <w(x_i), u_i> + b(x_i)``
(:class:`~minip_learn.nn.AffineReadout`) of a mixed vector ``u_i`` of dimension ``d``.

Each mixer computes ``u`` in two forms that agree to rounding (the tests check it):
the parallel form :meth:`Mixer.attend`, over the whole sequence at once, and the
recurrent form :meth:`Mixer.step`, one token at a time from a fixed-size state (a cache
that grows with the tokens, for softmax), run over a sequence by
:meth:`Mixer.attend_recurrent`. :meth:`Mixer.forward`, which training runs, uses the
form the class declares as ``forward_form``. :meth:`Mixer.state_floats` says how many
floats the state holds, per sequence.

The package holds one module per mixer family (the base in ``_base``); each module's
docstring writes out its recurrence and its state, and importing it registers its
mixers. The registry (``MIXERS``, the ``Registry`` class of the feature maps' registry
too) is the single place that maps names to classes: :func:`available_mixers` lists
the names, :func:`mixer_table` the declarations, :func:`get_mixer` resolves a
``mixer=`` value and :func:`make_mixer` builds one. Besides a registered name,
``mixer=`` takes a :class:`Mixer` subclass (its declarations are used as they are) or a
user's mixer: any :class:`torch.nn.Module` class or factory called as
``mixer(n_bits, state_size, **kwargs)`` that maps ``(batch, N, n_bits)`` to
``(batch, N)``. Such a mixer declares nothing: it is wrapped in :class:`UserMixer`,
whose ``theorem`` and ``state_floats`` are None, and :func:`check_mixer_output` checks
what it returns. No scikit-learn in this layer.

Examples
--------
>>> from minip_learn.nn import available_mixers, mixer_table
>>> [row["name"] for row in mixer_table()] == available_mixers()
True
>>> all(row["theorem"] in ("yes", "positional", "no") for row in mixer_table())
True
"""

from ..ops.masks import DECAY_BLOCK_ELEMENTS, decayed_scores  # noqa: F401
from ._base import (  # noqa: F401  (MIXERS, THEOREM_VALUES, QKVMaps, mixer_name too)
    MIXERS,
    THEOREM_VALUES,
    Mixer,
    QKVMaps,
    TokenMaps,
    UserMixer,
    available_mixers,
    check_mixer_output,
    get_mixer,
    make_mixer,
    mixer_name,
    mixer_table,
    register_mixer,
    unregister_mixer,
)

# importing a mixer module registers its mixers
from .deltanet import DeltaNetMixer
from .gla import GatedLinearAttentionMixer
from .kernel import KernelMixer, PositionalKernelMixer, RetNetMixer
from .linear import LinearAttentionMixer
from .mamba import MambaMixer
from .softmax import SoftmaxMixer

#: The built-in mixers and the per-token maps of the base; the base's registry
#: (:class:`Mixer`, :func:`make_mixer`, ...) is exported by :mod:`minip_learn.nn`.
__all__ = [
    "DeltaNetMixer",
    "GatedLinearAttentionMixer",
    "KernelMixer",
    "LinearAttentionMixer",
    "MambaMixer",
    "PositionalKernelMixer",
    "RetNetMixer",
    "SoftmaxMixer",
    "TokenMaps",
]
