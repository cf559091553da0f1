"""The theory layer: exact constructions, lower bounds and certificates (THEORY R1-R8).

* :mod:`~minip_learn.theory.bounds` -- closed-form statements (R4, R5, R8), numpy only.
* :mod:`~minip_learn.theory.capacity` -- R8 applied to a model: its channel capacity
  against the transcript bound of a family (torch only to read a model's dtype).
* :mod:`~minip_learn.theory.certify` -- :func:`certify`: the certified minimum rank of
  any family of sequences, recomputed from the sequences (numpy only).
* :mod:`~minip_learn.theory.codes` and :mod:`~minip_learn.theory.design` -- the codes
  and designs behind the witness families, and :func:`bound_table` (numpy only).
* :mod:`~minip_learn.theory.constructions` -- the exact heads of R1-R3 as fitted
  estimators (torch is imported only when one is built).
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
from .constructions import exact_kernel_realization, rank_one_head, softmax_construction
from .design import (
    bound_table,
    chain_denominator,
    product_code_bound,
    witness_bound,
    witness_denominators,
)

__all__ = [
    "Certificate",
    "approximate_identity_rank_bound",
    "bound_table",
    "certify",
    "chain_denominator",
    "channel_capacity_bits",
    "exact_kernel_realization",
    "family_constraints",
    "gap_denominator",
    "gap_domination_ratio",
    "gap_mixture_weight",
    "greedy_constant_weight_code",
    "hadamard_code",
    "hadamard_matrix",
    "hadamard_orders",
    "model_channel_capacity",
    "product_code",
    "product_code_bound",
    "rank_one_head",
    "softmax_construction",
    "transcript_check",
    "transcript_lower_bound",
    "witness_bound",
    "witness_denominators",
]
