"""Min-IP data: exact targets, random and out-of-distribution generators, witness suites.

This layer depends on numpy and scikit-learn utilities only.
"""

from ._full_task import make_full_task
from ._minip import make_minip, minip_gaps, minip_targets
from ._ood import check_token_leakage, make_ood_minip
from ._witness import make_witness_suite

__all__ = ["check_token_leakage", "make_full_task", "make_minip", "make_ood_minip",
           "make_witness_suite", "minip_gaps", "minip_targets"]
