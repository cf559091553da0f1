"""Min-IP data: exact targets, random generators and (later) witness suites.

This layer depends on numpy and scikit-learn utilities only.
"""

from ._minip import make_minip, minip_gaps, minip_targets

__all__ = ["make_minip", "minip_gaps", "minip_targets"]
