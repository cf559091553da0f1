"""
Comparing feature maps
======================

:class:`~minip_learn.KernelAttentionRegressor` takes its feature map by name from one
registry (:func:`~minip_learn.nn.available_feature_maps`). This example compares the
nonnegative ones, to which :ref:`R5 <theory-r5>` applies: no head below the certified
rank solves a witness suite, whatever the map (the signed maps ``identity``, ``rff`` and
``taylor`` are variants outside the theorem, except ``taylor``, whose kernel is
positive).

Above the certified rank the maps differ in whether gradient training *finds* a
solution. This example fits every map at one rank (32, above the constructive rank 20)
on the small witness suite (190 sequences, certified rank 8), with one seed and the same
short budget, and compares the largest training error and the sequence exact-match.
With a longer budget or other seeds the picture can change; the numbers are those of
this run.
"""

# %%
import os
import time

import matplotlib.pyplot as plt
import torch

from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_witness_suite
from minip_learn.nn import available_feature_maps

torch.set_num_threads(1)
FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"
RANK = 32
MAX_EPOCHS = 150 if FAST else 400
MAPS = ["table", "elu+1", "exp"] if FAST else available_feature_maps(nonnegative=True)
print("registered feature maps:", available_feature_maps())

# %%
suite = make_witness_suite(n_bits=24, seq_len=3, construction="small")
results = []
for name in MAPS:
    t0 = time.perf_counter()
    est = KernelAttentionRegressor(rank=RANK, feature_map=name, max_epochs=MAX_EPOCHS,
                                   stop_tolerance=0.5, random_state=0)
    est.fit(suite.X, suite.y)
    results.append((name, est.train_max_error_, est.score(suite.X, suite.y),
                    est.n_epochs_, time.perf_counter() - t0))
    print(f"{name:>12}: max error {est.train_max_error_:6.3f}, exact-match "
          f"{results[-1][2]:.3f}, solved {est.solved_}, {est.n_epochs_} epochs, "
          f"{results[-1][4]:.1f} s")

# %%
# The figure
# ----------
names = [r[0] for r in results]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
ax1.bar(names, [r[1] for r in results], color="C0")
ax1.axhline(0.5, color="C3", linewidth=1, label="solving threshold 1/2")
ax1.set_ylabel("largest training error")
ax1.set_yscale("log")
ax1.legend(fontsize="small")
ax2.bar(names, [r[2] for r in results], color="C2")
ax2.set_ylim(0, 1.05)
ax2.set_ylabel("sequence exact-match")
for ax in (ax1, ax2):
    ax.tick_params(axis="x", rotation=45)
fig.suptitle(f"Feature maps at rank {RANK}, small witness suite, {MAX_EPOCHS} epochs max")
plt.show()

# %%
# To sweep maps *and* ranks with several seeds, pass the map as a swept parameter:
# ``rank_sweep(est, X, y, ranks=[...], param_grid={"feature_map": [...]})`` (see the
# Dask example), or ``GridSearchCV`` with ``{"feature_map": [...], "rank": [...]}``.
