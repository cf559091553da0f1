"""
The exact constructions R1-R3, checked
======================================

Three results of the theory page (:ref:`theory-r1` to :ref:`theory-r3`) are
*constructions*: explicit heads that solve Min-IP exactly.
:mod:`minip_learn.constructions` builds each one from the library's own torch
heads with hand-set weights and returns a fitted estimator, so ``predict`` and
``score`` work without training:

* **R1** :func:`~minip_learn.constructions.rank_one_head` -- a rank-1 kernel head (uniform
  attention, ``rho_x(u) = 2<x, u> - |x|``) solves every sequence of length 1 and 2;
* **R2** :func:`~minip_learn.constructions.softmax_construction` -- softmax attention with
  scores ``-beta <x_i, x_j>`` solves every length-3 sequence; its error is at most
  ``(N-1)/(e*beta)``, below 1/2 for ``beta = 2``;
* **R3** :func:`~minip_learn.constructions.exact_kernel_realization` -- a nonnegative kernel
  head with one feature per token reproduces the R2 head exactly, so rank ``|T|``
  solves every sequence over a token set ``T``.

This example checks all three on random and witness data and plots the R2 error
against ``beta`` with its bound.
"""

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

from minip_learn.constructions import exact_kernel_realization, rank_one_head, softmax_construction
from minip_learn.datasets import make_minip, make_witness_suite
from minip_learn.metrics import max_abs_error

FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"
N_SAMPLES = 300 if FAST else 2000
N_BITS = 16

# %%
# R1: one rank-1 head for lengths 1 and 2
# ---------------------------------------
head = rank_one_head(N_BITS)
for length in (1, 2):
    X, y = make_minip(N_SAMPLES, seq_len=length, n_bits=N_BITS, random_state=length)
    err = max_abs_error(y, head.predict(X))
    print(f"R1, seq_len={length}: rank {head.rank}, max error {err:.2e}, "
          f"exact-match {head.score(X, y):.3f}")
    assert err < 1e-6

# %%
# R2: softmax with m-dimensional scores at length 3
# -------------------------------------------------
# ``min_gap=2`` keeps the hard sequences (two candidates whose overlaps differ by at
# least 2 at every position, the situation of the lower bound).
X3, y3 = make_minip(N_SAMPLES, seq_len=3, n_bits=N_BITS, min_gap=2, random_state=3)
soft = softmax_construction(N_BITS)  # beta = 2
err2 = max_abs_error(y3, soft.predict(X3))
print(f"R2, beta=2: max error {err2:.3f} <= 2/(2e) = {2 / (2 * np.e):.3f}; "
      f"exact-match {soft.score(X3, y3):.3f}")
assert err2 <= 2 / (2 * np.e) + 1e-9

# %%
# The error bound ``(N-1)/(e*beta)`` over ``beta``
betas = np.geomspace(0.5, 16, 7 if FAST else 13)
errors = [max_abs_error(y3, softmax_construction(N_BITS, beta).predict(X3)) for beta in betas]
bound = (3 - 1) / (np.e * betas)
assert np.all(np.asarray(errors) <= bound + 1e-9)

# %%
# R3: a nonnegative kernel head equal to the softmax head
# -------------------------------------------------------
# On the small witness suite (20 distinct tokens) the R3 head has rank 20 and its
# predictions equal those of the R2 head up to float64 rounding.
suite = make_witness_suite(n_bits=24, seq_len=3, construction="small")
kern = exact_kernel_realization(tokens=suite.tokens)
same = np.abs(kern.predict(suite.X) - softmax_construction(24).predict(suite.X)).max()
print(f"R3: rank {kern.rank} = constructive rank {suite.constructive_rank}; "
      f"exact-match {kern.score(suite.X, suite.y):.3f}; "
      f"largest difference from the R2 head {same:.1e}")
assert kern.score(suite.X, suite.y) == 1.0 and same < 1e-8

# %%
# The figure
# ----------
fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
ax.plot(betas, errors, "o-", label="softmax_construction: max error (length 3)")
ax.plot(betas, bound, "k--", label="bound (N-1)/(e beta), N = 3")
ax.axhline(0.5, color="C3", linewidth=1, label="solving threshold 1/2")
ax.axvline(2.0, color="0.5", linestyle=":", label="default beta = 2")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("inverse temperature beta")
ax.set_ylabel("max |p_i - t_i|")
ax.set_title(f"R2 on {N_SAMPLES} hard random sequences (m = {N_BITS})")
ax.legend(fontsize="small")
ax.grid(True, alpha=0.3)
plt.show()
