"""Packed tokens: overlaps by popcount equal the dot products at every width, the
distinct packed rows are ``np.unique``'s, unpacking inverts packing, and the names that
``minip_learn.compact`` exported still import from there with a FutureWarning."""

import numpy as np
import pytest

from minip_learn import bits, compact
from minip_learn.bits import index_dtype, overlap_words, pack_tokens, unique_rows, unpack_tokens


@pytest.mark.parametrize("m", [1, 3, 63, 64, 65, 130])
def test_overlaps_are_the_dot_products_and_unpacking_inverts_packing(m):
    rng = np.random.default_rng(m)
    tokens = rng.integers(0, 2, size=(40, m), dtype=np.uint8)
    words = pack_tokens(tokens)
    assert words.dtype == np.uint64 and words.shape == (40, max(1, -(-m // 64)))
    a, b = np.meshgrid(np.arange(40), np.arange(40), indexing="ij")
    np.testing.assert_array_equal(overlap_words(words, a, b),
                                  tokens.astype(np.int64) @ tokens.T.astype(np.int64))
    np.testing.assert_array_equal(unpack_tokens(words, m), tokens)


@pytest.mark.parametrize("m", [5, 64, 100])
def test_unique_rows_are_numpys(m):
    rng = np.random.default_rng(m)
    tokens = rng.integers(0, 2, size=(200, m), dtype=np.uint8)[rng.integers(0, 30, 200)]
    uniq, inverse = unique_rows(pack_tokens(tokens))
    expected, expected_inverse = np.unique(tokens, axis=0, return_inverse=True)
    np.testing.assert_array_equal(unpack_tokens(uniq, m), expected)
    np.testing.assert_array_equal(inverse, expected_inverse.reshape(-1))
    empty, none = unique_rows(np.zeros((0, 2), dtype=np.uint64))
    assert empty.shape == (0, 2) and none.shape == (0,)


def test_index_dtype():
    assert index_dtype(2**31 - 1) is np.int32 and index_dtype(2**31) is np.int64


@pytest.mark.parametrize("name", ["pack_tokens", "overlap_words", "index_dtype"])
def test_the_old_path_in_compact_warns_and_returns_the_same_object(name):
    with pytest.warns(FutureWarning, match=rf"minip_learn\.bits\.{name}\b"):
        old = getattr(compact, name)
    assert old is getattr(bits, name)
    with pytest.warns(FutureWarning, match=rf"minip_learn\.bits\.{name}\b"):
        exec(f"from minip_learn.compact import {name} as old", namespace := {})
    assert namespace["old"] is getattr(bits, name)
    assert name not in compact.__all__


def test_compact_raises_attribute_error_for_other_names():
    with pytest.raises(AttributeError, match="no attribute 'unique_rows'"):
        compact.unique_rows  # noqa: B018
