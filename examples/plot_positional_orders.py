"""
Position-dependent maps need every order of the keys
====================================================

The lower bound (:ref:`R4 <theory-r4>`-:ref:`R5 <theory-r5>`) is proved for kernels of
the tokens alone. With position-dependent maps -- learned positional weights, RetNet's
decay -- the weight of a key depends on where it sits, and a witness family in one fixed
order is no witness any more. Summing over the orders repairs it: on a final-query family
that holds each three-token sequence S3 with its keys in every order, R4 holds for the
kernel summed over key positions, ``W(t) = <phi_Q(x, N), sum_j phi_K(t, j)>``, which is
nonnegative, of the same rank and positionless (:ref:`theory-positional`).

This example takes the paper's ``m = 24`` witness (certified rank 8) in final-query form,
once in its fixed order and once with every order of its keys
(``make_witness_suite(..., orders="all")``), and trains the ``"positional"`` mixer
(normalised kernel attention with learned positional weights) over its rank on both.
"""

# %%
# Two families, one multiset of sequences
# ---------------------------------------
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

from minip_learn import SequenceMixerRegressor
from minip_learn.datasets import make_witness_suite
from minip_learn.model_selection import rank_sweep
from minip_learn.theory import certify

torch.set_num_threads(1)
fixed = make_witness_suite(24, 3, construction="small", query="last")
every = make_witness_suite(24, 3, construction="small", query="last", orders="all")
bound = every.certified_min_rank
print(f"fixed order: {len(fixed.X)} sequences; certify (positionless maps) = "
      f"{certify(fixed.X, query='last')}, certify(positional=True) = "
      f"{certify(fixed.X, query='last', positional=True)}")
print(f"every order: {len(every.X)} sequences; certify(positional=True) = {bound}")

# %%
# A rank-1 head that reads the first key
# --------------------------------------
# In the fixed order every S3 ``(y, z, x)`` has its smaller key first. A head of rank 1
# (``phi = 1``) with a dominant learned weight on the first position, values ``v(t) = t``
# and the readout ``<x, u>`` outputs ``<x, first key>``: right on S1, S2 and S3 alike.


def first_key_head(X, weight=1e6):
    w = np.ones(X.shape[1])
    w[0] = weight                                      # positional weights, query included
    u = np.einsum("j,njm->nm", w, X.astype(float)) / w.sum()
    return np.einsum("nm,nm->n", X[:, -1].astype(float), u)   # readout <x, u>


for name, suite in (("fixed", fixed), ("every order", every)):
    err = np.abs(first_key_head(suite.X) - suite.y)
    print(f"rank-1 first-key head, {name}: max error {err.max():.3f}, "
          f"solved {bool((err < 0.5).all())}")

# %%
# Trained positional heads over the rank
# --------------------------------------
# ``rank_sweep`` takes the certificate itself: the every-order one is positional, so a
# ``"positional"`` fit that solved that family below 8 would raise (it would be a bug).
FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"
STATES = [2, 8, 16] if FAST else [1, 2, 4, 8, 16]
est = SequenceMixerRegressor(mixer="positional", mixer_kwargs={"feature_map": "table"},
                             max_epochs=300 if FAST else 800, lr=0.03, stop_tolerance=0.5)
solved = {}
for name, suite in (("fixed order", fixed), ("every order", every)):
    res = rank_sweep(est, suite.X, suite.y, param_grid={"state_size": STATES}, seeds=[0],
                     certified_min_rank=suite.certificate, progress=False, n_jobs=1)
    solved[name] = res.results.set_index("state_size")["solved"].astype(float)
    print(name, solved[name].to_dict())
assert not solved["every order"][solved["every order"].index < bound].any()

# %%
# The figure
# ----------
fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
for (name, s), marker in zip(solved.items(), "os"):
    ax.plot(s.index, s.to_numpy(), marker=marker, label=f'"positional" mixer, {name}')
ax.axvline(bound, color="k", linestyle=":", label=f"certified rank {bound}")
ax.set_xscale("log", base=2)
ax.set_ylim(-0.05, 1.05)
ax.set_xlabel("rank (state size)")
ax.set_ylabel("solved (seed 0)")
ax.set_title("Learned positional weights: fixed order vs every order of the keys")
ax.legend(fontsize="small", loc="center right")
plt.show()
