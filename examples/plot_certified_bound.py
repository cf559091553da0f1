"""
Certified minimum rank against the number of bits
=================================================

The theorem says that the feature rank a nonnegative kernel head needs for length-3
Min-IP grows as ``2^Omega(m)`` in the number of bits ``m``. The library
turns that into numbers in two ways:

* :func:`~minip_learn.theory.bound_table` evaluates the witness designs (products of
  Hadamard codes, with a number of blocks that grows with ``m``, and ladders of
  intermediate tokens; see :ref:`theory-exponential`) analytically and reports the best
  certified rank for each ``(n_bits, seq_len)`` with the size of its family; where the
  family is small enough it builds it and ``certify`` recomputes the bound from the
  sequences (column ``materialised``);
* :func:`~minip_learn.datasets.make_witness_suite` materialises a family, and
  :func:`~minip_learn.theory.certify` recomputes its bound from the sequences alone.

This example draws both against ``n_bits`` (log scale on the rank axis).
"""

# %%
import os

import matplotlib.pyplot as plt

from minip_learn.datasets import make_witness_suite
from minip_learn.experiments import markdown_table
from minip_learn.theory import bound_table, certify

FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"
N_BITS = [8, 16, 24, 32] if FAST else [8, 16, 24, 32, 40, 48, 56, 64]
SEQ_LENS = [3, 4] if FAST else [3, 4, 5]
SUITE_BITS = [8, 12, 16, 24] if FAST else [8, 12, 16, 20, 24, 28, 32]

# %%
# Analytic bounds of the designs
# ------------------------------
# ``exact=False`` rows are designs whose materialised family certifies *at least* the
# value shown (a query token may also be a key there). ``materialised`` is the bound
# ``certify`` recomputed from the built family (families of at most 20,000
# sequences); the other rows are calculations. ``bits_per_bit`` is
# ``log2(certified_min_rank) / n_bits``.
table = bound_table(n_bits=N_BITS, seq_len=SEQ_LENS)
print(markdown_table(table[["n_bits", "seq_len", "certified_min_rank", "bits_per_bit",
                            "construction", "n_sequences", "exact", "materialised"]]))

# %%
# Materialised suites, certified from their sequences
# ---------------------------------------------------
# Families capped at 1,500 sequences, so each certificate takes well under a second.
rows = []
for m in SUITE_BITS:
    suite = make_witness_suite(n_bits=m, seq_len=3, max_sequences=1500)
    rank = certify(suite.X)
    assert rank == suite.certified_min_rank
    rows.append((m, len(suite.X), rank, suite.constructive_rank, suite.construction))
    print(f"m={m:2d}: {len(suite.X):5d} sequences, certified rank {rank:3d}, "
          f"constructive rank {suite.constructive_rank:3d} ({suite.construction})")

# %%
# The figure
# ----------
fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
for k, (N, g) in enumerate(table.groupby("seq_len")):
    ax.plot(g["n_bits"], g["certified_min_rank"], "o-", color=f"C{k}",
            label=f"bound_table (design), seq_len = {N}")
    built = g[g["materialised"].notna()]
    ax.plot(built["n_bits"], built["materialised"], "s", color=f"C{k}", mfc="none", ms=9,
            label=f"certify on the built family, seq_len = {N}" if k == 0 else None)
ax.plot([r[0] for r in rows], [r[2] for r in rows], "k^--",
        label="certify(make_witness_suite(m, 3, max_sequences=1500))")
ax.set_yscale("log", base=2)
ax.set_xlabel("number of bits m")
ax.set_ylabel("certified minimum rank (log2)")
ax.set_title("Certified lower bound on the kernel feature rank")
ax.grid(True, alpha=0.3)
ax.legend(fontsize="small")
plt.show()

# %%
# Reading it
# ----------
# On a log axis the bounds rise roughly linearly in ``m``: the exponential growth of
# the theorem. Longer sequences certify more, since ``eps(N, g) = 1/((N-2)(g-1))``
# shrinks with ``N`` (:ref:`theory-r4`). The materialised suites are capped at 1,500
# sequences, so they sit below the uncapped designs of ``bound_table``.
