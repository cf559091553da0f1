"""Root pytest configuration: applies to the doctests under minip_learn/ as well."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

# The heads are tiny: intra-op threads only add contention (CI has 2 cores).
torch.set_num_threads(1)
