import numpy as np
import pytest

# torch threads and the matplotlib backend are set in the root conftest.py


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def valid_rank():
    """``valid_rank(name, rank)``: the smallest rank >= ``rank`` that the feature map
    ``name`` can have (``check_params`` of taylor, hedgehog, dpfp and rebased restricts
    it), for tests parametrised over every registered map."""
    from minip_learn.nn import get_feature_map

    def valid(name, rank, n_bits=4):
        check = getattr(get_feature_map(name), "check_params", None)
        while check is not None:
            try:
                check(n_bits, rank)
                break
            except ValueError:
                rank += 1
        return rank

    return valid
