import numpy as np
import pytest

# torch threads and the matplotlib backend are set in the root conftest.py


@pytest.fixture
def rng():
    return np.random.default_rng(0)
