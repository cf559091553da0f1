import os

import numpy as np
import pytest
import torch

# Tiny models: intra-op threads only add contention (and CI has 2 cores).
torch.set_num_threads(1)
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
