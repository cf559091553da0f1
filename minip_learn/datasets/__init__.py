"""Min-IP data: exact targets, random generators and (later) witness suites.

This layer depends on numpy and scikit-learn utilities only.
"""

from ._minip import make_minip, minip_gaps, minip_targets
from ._witness import make_witness_suite

__all__ = ["make_minip", "make_witness_suite", "minip_gaps", "minip_targets"]
