"""
Length transition: one, two and three tokens
============================================

:ref:`R1 <theory-r1>`: a single rank-1 kernel head (uniform attention) solves Min-IP
on every sequence of length 1 and 2. :ref:`R4 <theory-r4>`-:ref:`R5 <theory-r5>`: at
length 3 the witness families force a feature rank that grows exponentially with the
number of bits.

This example takes the 20 distinct tokens of the small witness suite (24 bits) and
builds three families over them: every token alone (length 1, 20 sequences), every
ordered pair (length 2, 400 sequences) and the suite itself (length 3, 190 sequences,
certified minimum rank 8). It sweeps the rank of a ``table`` kernel head on each family
with :func:`~minip_learn.model_selection.rank_sweep` (one seed, a short budget) and plots
the solved fraction per length.

The same experiment with more ranks and seeds is ``minip-learn reproduce length``.
"""

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_witness_suite, minip_targets
from minip_learn.experiments import markdown_table
from minip_learn.model_selection import rank_sweep, summarize_sweep
from minip_learn.plotting import plot_length_transition
from minip_learn.theory import certify

torch.set_num_threads(1)
FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"
RANKS = [1, 32] if FAST else [1, 4, 16, 32]
MAX_EPOCHS = 300 if FAST else 500

# %%
# Three families over one token set
# ---------------------------------
suite = make_witness_suite(n_bits=24, seq_len=3, construction="small")
tokens = suite.tokens
n = len(tokens)
i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
families = {
    1: tokens[:, None, :],
    2: np.stack([tokens[i.ravel()], tokens[j.ravel()]], axis=1),
    3: suite.X,
}
bounds = {length: certify(X) for length, X in families.items()}
print({length: X.shape for length, X in families.items()})
print("certified minimum rank per length:", bounds)

# %%
# One rank sweep per length
# -------------------------
# ``certified_min_rank`` makes the sweep raise if a head below the bound ever reports
# that it solved the family (that would contradict :ref:`R5 <theory-r5>`).
estimator = KernelAttentionRegressor(feature_map="table", max_epochs=MAX_EPOCHS,
                                     stop_tolerance=0.5)
parts = []
for length, X in families.items():
    res = rank_sweep(estimator, X, minip_targets(X), ranks=RANKS, seeds=[0],
                     certified_min_rank=bounds[length], progress=False,
                     tags={"model": "kernel", "seq_len": length})
    parts.append(res.results)
results = pd.concat(parts, ignore_index=True)
summary = summarize_sweep(results, by=["seq_len", "model", "rank"])
print(markdown_table(summary[["seq_len", "rank", "n_solved", "n_fits",
                              "exact_match_mean", "max_abs_error_median"]]))

# %%
# The figure
# ----------
plot_length_transition(summary, certified_min_rank={3: bounds[3]})
plt.show()

# %%
# Reading it
# ----------
# Lengths 1 and 2 carry no certificate (``certify`` returns 1: gap domination needs
# three tokens) and rank 1 suffices in principle (R1); the table shows whether this
# short training run found it. At length 3 no rank below the certified bound solves
# the family. The exact rank-1 head of R1 is built, without training, by
# :func:`minip_learn.constructions.rank_one_head` (see the example on exact constructions).
