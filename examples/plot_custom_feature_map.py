"""
Bring your own feature map
==========================

``feature_map=`` takes, besides a registered name, any :class:`torch.nn.Module` class
called as ``cls(n_bits, rank, **feature_kwargs)`` that maps float tokens of shape
``(..., n_bits)`` to features of shape ``(..., rank)``. Such a map declares nothing
about its sign: after ``fit`` the estimator measures the smallest kernel value
``alpha(x, z)`` of the fitted head over the pairs of training tokens (``kernel_min_``)
and says whether the lower bound covers the fitted model (``theorem_applies_``): a
single head with an affine readout whose kernel is nonnegative (see
:ref:`theory-r4` and :ref:`theory-r5`).

Here the map is a squared linear projection, ``phi(x) = (W x + b)^2``: nonnegative by
construction, though it does not say so. We sweep its rank on the small witness suite
(190 sequences of 24-bit tokens, certified minimum rank 8): below the certified rank
no head whose kernel is nonnegative can solve the suite, whatever the map.
"""

# %%
# The map, in ten lines
# ---------------------
import os

import matplotlib.pyplot as plt
import torch
from torch import nn

from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_witness_suite


class SquaredLinear(nn.Module):
    """``phi(x) = (W x + b)^2``: ``rank`` nonnegative features of the token bits."""

    def __init__(self, n_bits, rank):
        super().__init__()
        self.linear = nn.Linear(n_bits, rank)

    def forward(self, x):
        return self.linear(x).square()


# %%
# The rank sweep
# --------------
torch.set_num_threads(1)
FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"
RANKS = [4, 16] if FAST else [4, 8, 16, 32]
MAX_EPOCHS = 100 if FAST else 1000

suite = make_witness_suite(n_bits=24, seq_len=3, construction="small")
bound = suite.certified_min_rank
rows = []
for rank in RANKS:
    est = KernelAttentionRegressor(rank=rank, feature_map=SquaredLinear,
                                   max_epochs=MAX_EPOCHS, random_state=0)
    est.fit(suite.X, suite.y)
    rows.append((rank, est.score(suite.X, suite.y), est.solved_))
    print(f"rank {rank:>2}: exact-match {rows[-1][1]:.3f}, solved {est.solved_}, "
          f"kernel_min_ {est.kernel_min_:.2e}, theorem_applies_ {est.theorem_applies_}")
    # a head inside the theorem below the certified rank cannot solve the suite
    assert not (est.theorem_applies_ and est.solved_ and rank < bound)

# %%
# The figure
# ----------
fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
ax.plot([r[0] for r in rows], [r[1] for r in rows], "o-", label="SquaredLinear")
ax.axvline(bound, color="C3", linestyle="--", label=f"certified rank {bound}")
ax.set_xlabel("rank")
ax.set_ylabel("sequence exact-match")
ax.set_ylim(0, 1.05)
ax.legend()
ax.set_title(f"A user's feature map on the witness suite ({MAX_EPOCHS} epochs max)")
plt.show()
