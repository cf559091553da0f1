"""The theory layer: lower bounds, certificates and designs (numpy only).

See the theory page (:ref:`theory-r4` to :ref:`theory-r8`, :ref:`theory-witness`).

* :mod:`~minip_learn.theory.bounds` -- closed-form statements (R4, R5, R8).
* :mod:`~minip_learn.theory.capacity` -- R8 applied to a model: its channel capacity
  against the transcript bound of a family (torch only to read a model's dtype).
* :mod:`~minip_learn.theory.certify` -- :func:`certify`: the certified minimum rank of
  any family of sequences, recomputed from the sequences in four stages (constraints,
  reach, search, bound).
* :mod:`~minip_learn.theory.certificate` -- the :class:`Certificate` it returns, and its
  JSON.
* :mod:`~minip_learn.theory.verify` -- :func:`verify_certificate`: an independent,
  exact check of a certificate against a family.
* :mod:`~minip_learn.theory.codes` and :mod:`~minip_learn.theory.design` -- the codes
  and designs behind the witness families, the families themselves
  (:func:`witness_family`) and :func:`bound_table`.
* :mod:`~minip_learn.theory.full_task` and :mod:`~minip_learn.theory.key_weights` --
  the full length-3 task (:func:`full_task_family`), its certified rank over named
  sub-families (:func:`certify_full_task`) and heads of small rank that solve it
  (:func:`grouped_key_weights`).

The exact heads of R1-R3 are estimators; they live in :mod:`minip_learn.constructions`.
"""

from .bounds import (
    approximate_identity_rank_bound,
    channel_capacity_bits,
    gap_denominator,
    gap_domination_ratio,
    gap_mixture_weight,
    transcript_lower_bound,
)
from .capacity import model_channel_capacity, transcript_check
from .certify import Certificate, certify, family_constraints
from .codes import (
    greedy_constant_weight_code,
    hadamard_code,
    hadamard_matrix,
    hadamard_orders,
    product_code,
)
from .design import (
    block_designs,
    bound_table,
    chain_denominator,
    describe_blocks,
    design_rank,
    product_code_bound,
    witness_bound,
    witness_denominators,
    witness_family,
)
from .exact import (
    complement_closed_code,
    exact_family,
    exact_family_size,
    exact_seq_len,
)
from .flip_cycles import flip_cycle, verify_flip_cycle
from .full_task import (
    certify_full_task,
    full_task_constraint_count,
    full_task_family,
    full_task_size,
    full_task_tokens,
    pad_certificate,
    verify_full_task_certificate,
)
from .key_weights import grouped_key_weights, key_weight_excess
from .overlap_kernels import overlap_kernel, overlap_kernel_features, overlap_kernel_predict
from .verify import verify_certificate

__all__ = [
    "Certificate",
    "approximate_identity_rank_bound",
    "block_designs",
    "bound_table",
    "certify",
    "certify_full_task",
    "chain_denominator",
    "channel_capacity_bits",
    "complement_closed_code",
    "describe_blocks",
    "design_rank",
    "exact_family",
    "exact_family_size",
    "exact_seq_len",
    "family_constraints",
    "flip_cycle",
    "full_task_constraint_count",
    "full_task_family",
    "full_task_size",
    "full_task_tokens",
    "gap_denominator",
    "gap_domination_ratio",
    "gap_mixture_weight",
    "greedy_constant_weight_code",
    "grouped_key_weights",
    "hadamard_code",
    "hadamard_matrix",
    "hadamard_orders",
    "key_weight_excess",
    "model_channel_capacity",
    "overlap_kernel",
    "overlap_kernel_features",
    "overlap_kernel_predict",
    "pad_certificate",
    "product_code",
    "product_code_bound",
    "transcript_check",
    "transcript_lower_bound",
    "verify_certificate",
    "verify_flip_cycle",
    "verify_full_task_certificate",
    "witness_bound",
    "witness_denominators",
    "witness_family",
]
