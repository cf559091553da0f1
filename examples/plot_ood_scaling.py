"""
Out-of-distribution scaling: unseen tokens at growing problem size
===================================================================

The paper's second experiment (:ref:`theory-experiments`): split a pool of random tokens into a
training pool and a *disjoint* test pool, train on hard length-3 Min-IP sequences over
the training pool only, and score exact sequence accuracy on sequences built from the
test pool -- tokens the model has never seen. The paper reports that a kernel head's
held-out exact-match jumps as its feature rank grows, that the jump moves to higher
rank as the problem grows (8 -> 16 -> 64), and that dense softmax attention stays exact.

:func:`~minip_learn.datasets.make_ood_minip` builds such a split and checks it with
:func:`~minip_learn.datasets.check_token_leakage`;
:func:`~minip_learn.experiments.ood_experiment` runs the rank sweep per scale and
scores every fit on the held-out pool. The kernel heads use ``feature_map="exp"``
(nonnegative features ``exp(A x + b)`` of a learnable affine map, defined for every
token): the ``table`` map of the witness experiments has no features for unseen tokens
and rejects them. Training stops only at a small margin (``stop_tolerance=0.05``): a
fit that just reaches the 1/2 criterion on its training pool tends to miss it on
unseen tokens.

This example runs a small version (two scales, one seed, a short training budget);
``minip-learn reproduce ood --quick`` runs the recipe of the results page.
"""

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

from minip_learn.datasets import check_token_leakage, make_ood_minip
from minip_learn.experiments import markdown_table, ood_experiment
from minip_learn.plotting import plot_ood_transition

torch.set_num_threads(1)
FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"

# %%
# A split with no shared token
# ----------------------------
data = make_ood_minip(256, 64, n_bits=8, n_tokens=256, random_state=0)
print(data.X_train.shape, data.X_test.shape)
print("training / test pool:", len(data.train_tokens), "/", len(data.test_tokens), "tokens")
print("shared tokens:", check_token_leakage(data.X_train, data.X_test))
train_set = {t.tobytes() for t in data.X_train.reshape(-1, 8)}
print("test tokens seen in training:",
      sum(t.tobytes() in train_set for t in data.X_test.reshape(-1, 8)))

# %%
# Rank sweep per scale, scored on the held-out pool
# -------------------------------------------------
if FAST:
    settings = dict(
        scales=[dict(n_bits=8, n_tokens=256), dict(n_bits=12, n_tokens=256)],
        data=dict(n_train=256, n_test=64, random_state=0),
        ranks=(1, 16), seeds=(0,), softmax_seeds=(0,),
        kernel=dict(feature_map="exp", max_epochs=60, stop_tolerance=0.05),
        softmax=dict(max_epochs=60, stop_tolerance=0.05, n_init=1))
else:
    settings = dict(
        scales=[dict(n_bits=8, n_tokens=256), dict(n_bits=12, n_tokens=1024)],
        data=dict(n_train=1024, n_test=256, random_state=0),
        ranks=(1, 4, 16), seeds=(0,), softmax_seeds=(0,),
        kernel=dict(feature_map="exp", max_epochs=800, stop_tolerance=0.05),
        softmax=dict(max_epochs=800, stop_tolerance=0.05, n_init=1, optimizer="adamw",
                     weight_decay=0.01))
res = ood_experiment(**settings, n_jobs=1, progress=False, figures=False)
print(markdown_table(res.summary[["n_bits", "model", "rank", "train_exact_match",
                                  "test_exact_match", "test_solved"]]))
print("jump rank per scale:", res.jump_ranks)
print("checks:", res.checks)

# %%
# Exact-match on unseen tokens vs rank
# ------------------------------------
plot_ood_transition(res.summary, threshold=res.settings["threshold"])
plt.show()

# %%
# Reading it
# ----------
# Each solid line is one problem scale (bits per token, size of the token pool); the
# dotted line of the same colour is dense softmax at that scale. The gap between
# *train* and *test* exact-match in the table is the out-of-distribution part: a head
# can fit its training sequences and still fail on tokens it has never seen. On the
# development machine this script (not in fast mode) gave held-out exact-match 0.82,
# 0.92, 1.0 at ranks 1, 4, 16 for m = 8, but only 0.89, 0.95, 0.98 for m = 12, while
# softmax was exact at both scales: the rank needed on unseen tokens grows with the
# problem. One seed and a short budget make this a sketch; the numbers measured with
# the recipe's settings (and what did and did not reproduce of the paper's
# 8 -> 16 -> 64 shift) are on the documentation's results page.
print("gap train - test per fit:",
      np.round(res.results["exact_match"] - res.results["test_exact_match"], 3).tolist())
