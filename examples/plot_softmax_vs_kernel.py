"""
Softmax vs kernel attention on hard random Min-IP
=================================================

Random length-3 sequences with ``min_gap=2`` (at every position the two best
candidates differ by at least 2 in overlap: the situation of the lower bound) are the
everyday version of the witness suites. We train

* :class:`~minip_learn.KernelAttentionRegressor` (``elu+1`` features, the usual linear
  attention) over a range of ranks, and
* :class:`~minip_learn.SoftmaxAttentionRegressor` (dense softmax, ``n_bits``-dim scores),

on one random training set and score both on the training set and on a held-out set of
fresh sequences. The softmax construction of :ref:`R2 <theory-r2>`
(:func:`~minip_learn.constructions.softmax_construction`) is drawn as a reference: it solves
every length-3 sequence, so the held-out score it gets is what a softmax head *can*
achieve.

A random training set has no certificate (:func:`~minip_learn.theory.certify` returns
1), so nothing forbids a kernel head from fitting it; what separates the two models here
is how well the fitted head carries over to new sequences. Numbers below are those of
this run (one seed, a short budget).
"""

# %%
import os

import matplotlib.pyplot as plt
import pandas as pd
import torch

from minip_learn import KernelAttentionRegressor, SoftmaxAttentionRegressor
from minip_learn.constructions import softmax_construction
from minip_learn.datasets import make_minip
from minip_learn.experiments import markdown_table
from minip_learn.theory import certify

torch.set_num_threads(1)
FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"
N_BITS = 12
N_TRAIN = 200 if FAST else 400
RANKS = [2, 32] if FAST else [2, 4, 8, 16, 32, 64]
MAX_EPOCHS = 250 if FAST else 600

# %%
# Data
# ----
X, y = make_minip(N_TRAIN, seq_len=3, n_bits=N_BITS, min_gap=2, random_state=0)
X_test, y_test = make_minip(1000, seq_len=3, n_bits=N_BITS, min_gap=2, random_state=1)
print("training set:", X.shape, "certified minimum rank:", certify(X))

# %%
# Fits
# ----
rows = []
for rank in RANKS:
    est = KernelAttentionRegressor(rank=rank, max_epochs=MAX_EPOCHS, random_state=0)
    est.fit(X, y)
    rows.append(dict(model="kernel (elu+1)", rank=rank, train=est.score(X, y),
                     test=est.score(X_test, y_test), epochs=est.n_epochs_))
soft = SoftmaxAttentionRegressor(max_epochs=MAX_EPOCHS, random_state=0).fit(X, y)
rows.append(dict(model="softmax (trained)", rank=None, train=soft.score(X, y),
                 test=soft.score(X_test, y_test), epochs=soft.n_epochs_))
exact = softmax_construction(N_BITS)
rows.append(dict(model="softmax (R2 construction)", rank=None, train=exact.score(X, y),
                 test=exact.score(X_test, y_test), epochs=0))
table = pd.DataFrame(rows)
print(markdown_table(table))

# %%
# The figure
# ----------
# Sequence exact-match (every position within 1/2 of its target) against rank.
fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
kern = table[table["rank"].notna()]
ax.plot(kern["rank"], kern["train"], "o-", color="C0", label="kernel: training set")
ax.plot(kern["rank"], kern["test"], "s--", color="C0", label="kernel: held-out")
ax.axhline(soft.score(X_test, y_test), color="C3", linestyle="--",
           label="trained softmax: held-out")
ax.axhline(exact.score(X_test, y_test), color="k", linestyle=":",
           label="R2 softmax construction: held-out")
ax.set_xscale("log", base=2)
ax.set_xticks(RANKS, [str(r) for r in RANKS])
ax.minorticks_off()
ax.set_ylim(-0.05, 1.05)
ax.set_xlabel("kernel feature rank r (log2)")
ax.set_ylabel("sequence exact-match")
ax.set_title(f"Hard random Min-IP (m = {N_BITS}, length 3, min_gap = 2)")
ax.legend(fontsize="small", loc="lower right")
ax.grid(True, alpha=0.3)
plt.show()
