"""Families in multiset form: the compact and materialised forms agree (targets,
certificates, their verification), reordering a sequence changes nothing, and bad
compact input is a ValueError that names the problem."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.model_selection import KFold

from minip_learn.compact import NPZ_FORMAT, CompactFamily, load_family, merge_slots
from minip_learn.datasets import make_witness_suite, minip_targets
from minip_learn.theory import certify, hadamard_code, verify_certificate, witness_family


def multisets(X):
    return sorted(tuple(sorted(map(tuple, s.tolist()))) for s in X)


@pytest.fixture(scope="module")
def suites():
    return [make_witness_suite(construction="small"),
            make_witness_suite(n_bits=12, seq_len=5),
            make_witness_suite(n_bits=16, seq_len=4, construction="product", max_sequences=3000),
            make_witness_suite(n_bits=10, seq_len=7, construction="greedy", random_state=0)]


def test_suite_compact_and_materialised_forms_agree(suites):
    for s in suites:
        fam = s.family
        assert fam.shape == s.X.shape and len(fam) == len(s.X)
        np.testing.assert_array_equal(fam.token_ids, s.token_ids)
        assert multisets(fam.to_sequences()) == multisets(s.X)
        np.testing.assert_array_equal(fam.to_sequences(), s.X)
        np.testing.assert_array_equal(fam.expand(s.slot_targets), s.y)
        np.testing.assert_array_equal(minip_targets(fam), s.slot_targets)
        assert (s.slot_targets[fam.padding] == 0).all()
        # the compact and the materialised forms run different code; each one's own
        # certificate passes the independent verifier on both forms
        rank, cert = certify(fam, return_certificate=True)
        assert certify(s.X) == rank == cert.certified_min_rank
        for c in (cert, s.certificate):
            assert verify_certificate(c, fam) and verify_certificate(c, s.X)
        again = CompactFamily.from_sequences(s.X)
        assert certify(again) == rank
        np.testing.assert_array_equal(again.expand(minip_targets(again)), s.y)


def test_from_sequences_lists_tokens_in_order_of_first_occurrence():
    X = np.array([[[0, 1], [1, 1], [0, 1]], [[1, 0], [1, 0], [1, 0]]])
    fam = CompactFamily.from_sequences(X)
    assert fam.tokens.tolist() == [[0, 1], [1, 0], [1, 1]]
    assert fam.token_ids.tolist() == [[0, 2], [1, -1]]
    assert fam.counts.tolist() == [[2, 1], [3, 0]]
    assert fam.to_sequences()[1].tolist() == X[1].tolist()
    assert minip_targets(fam).tolist() == [[1, 1], [1, 0]]


def test_merge_slots_and_from_slots():
    ids, cnt = merge_slots([[3, 3, 1], [2, 1, 2], [0, 1, 4]], [[1, 1, 4], [1, 1, 4], [1, 1, 4]])
    assert ids.tolist() == [[3, 1, -1], [2, 1, -1], [0, 1, 4]]
    assert cnt.tolist() == [[2, 4, 0], [5, 1, 0], [1, 1, 4]]
    tokens = np.eye(5, dtype=np.uint8)
    fam = CompactFamily.from_slots(tokens, [[0, 0]], [[1, 2]])
    assert fam.token_ids.tolist() == [[0]] and fam.counts.tolist() == [[3]]


def test_long_witness_family_never_materialises():
    fam = witness_family(hadamard_code(24), 2000, compact=True)
    assert fam.shape == (4186, 2000, 24) and fam.n_slots == 3
    assert fam.materialized_nbytes > 100 * fam.token_ids.nbytes
    rank, cert = certify(fam, return_certificate=True)
    assert rank == 46 and cert.diagonally_dominant   # every row of B sums below 1
    assert verify_certificate(cert, fam)
    y = minip_targets(fam)
    assert y.shape == (4186, 3) and set(np.unique(y[~fam.padding])) <= {0, 6, 12}


def test_indexing_like_an_array_for_splitters(suites):
    fam, y = suites[1].family, suites[1].slot_targets
    for train, test in KFold(3, shuffle=True, random_state=0).split(fam, y):
        part = fam[train, ...]
        assert len(part) == len(train) and part.shape[1:] == fam.shape[1:]
        np.testing.assert_array_equal(part.token_ids, fam.token_ids[train])
        np.testing.assert_array_equal(minip_targets(fam[test]), y[test])
    assert len(fam[3]) == 1 and len(fam[2:7]) == 5
    assert len(fam[np.arange(len(fam)) % 2 == 0]) == (len(fam) + 1) // 2
    with pytest.raises(IndexError):
        fam[0, 1]


def test_iter_sequences_slices_the_materialised_family(suites):
    s = suites[0]
    parts = list(s.family.iter_sequences(chunk_size=50))
    assert [len(p) for p in parts[:-1]] == [50] * (len(parts) - 1)
    np.testing.assert_array_equal(np.concatenate(parts), s.X)


def test_save_and_load_round_trip(tmp_path, suites):
    fam = suites[2].family
    path = fam.save(tmp_path / "family.npz")
    assert load_family(path) == fam
    np.save(tmp_path / "family.npy", suites[2].X)
    np.testing.assert_array_equal(load_family(tmp_path / "family.npy"), suites[2].X)


# ------------------------------------------------------------------- property tests
@st.composite
def families(draw):
    """Small families holding some R4 triples (so that certificates are not trivial),
    plus random sequences."""
    m = draw(st.integers(3, 6))
    N = draw(st.integers(3, 6))
    pool = np.array(draw(st.lists(st.lists(st.integers(0, 1), min_size=m, max_size=m),
                                  min_size=3, max_size=7, unique_by=tuple)), dtype=np.uint8)
    seqs = []
    for _ in range(draw(st.integers(1, 6))):
        x, y, z = (pool[draw(st.integers(0, len(pool) - 1))] for _ in range(3))
        seqs += [[x] + [y] * (N - 1), [x] + [z] * (N - 1), [x, y] + [z] * (N - 2)]
    for _ in range(draw(st.integers(0, 4))):
        seqs.append([pool[draw(st.integers(0, len(pool) - 1))] for _ in range(N)])
    return np.array(seqs, dtype=np.uint8)


@settings(max_examples=60, deadline=None)
@given(families(), st.randoms(use_true_random=False))
def test_certify_is_the_same_on_both_forms_and_ignores_token_order(X, rnd):
    fam = CompactFamily.from_sequences(X)
    rank, cert = certify(X, return_certificate=True)
    assert certify(fam) == rank
    assert verify_certificate(cert, fam)
    shuffled = np.array([s[rnd.sample(range(len(s)), len(s))] for s in X])
    assert certify(shuffled) == rank
    assert certify(CompactFamily.from_sequences(shuffled)) == rank
    # reversing the slots of the compact form is the same family
    rev = CompactFamily.from_slots(fam.tokens, fam.token_ids[:, ::-1], fam.counts[:, ::-1])
    assert certify(rev) == rank
    # targets: the compact form's, spread to positions, are those of its materialisation,
    # and per sequence the same multiset of targets as X (and as X reordered)
    y = fam.expand(minip_targets(fam))
    np.testing.assert_array_equal(y, minip_targets(fam.to_sequences()))
    for other in (X, shuffled):
        np.testing.assert_array_equal(np.sort(y, axis=1), np.sort(minip_targets(other), axis=1))


# ------------------------------------------------------------------------ bad input
TOKENS = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize("tokens,ids,counts,match", [
    (TOKENS, [[0, 3]], [[1, 2]], "token_ids holds 3, outside -1..2"),
    (TOKENS, [[0, -2]], [[1, 2]], "token_ids holds -2"),
    (TOKENS, [[0, 1], [1, 2]], [[1, 2], [1, 1]], "sum to the same sequence length"),
    (TOKENS, [[0, 1]], [[-1, 4]], "negative multiplicity"),
    (TOKENS, [[0, 1]], [[1, 2, 0]], "same shape"),
    (TOKENS, [[0, -1]], [[1, 2]], "0 exactly at padding"),
    (TOKENS, [[0, 1]], [[3, 0]], "0 exactly at padding"),
    (TOKENS, [[1, 1]], [[1, 2]], "lists token 1 twice"),
    (TOKENS, [[0.5, 1]], [[1, 2]], "token_ids must hold integers"),
    (TOKENS, [0, 1], [1, 2], "token_ids must be 2-D"),
    (TOKENS * 2, [[0, 1]], [[1, 2]], "tokens must contain only 0/1"),
    (TOKENS[[0, 0]], [[0, 1]], [[1, 2]], "holds a token twice"),
    (np.zeros((0, 3)), [[0]], [[1]], "non-empty 2-D"),
    (TOKENS, np.zeros((0, 2), dtype=int), np.zeros((0, 2), dtype=int), ">= 1 sequence"),
])
def test_bad_compact_input_is_a_value_error_naming_it(tokens, ids, counts, match):
    with pytest.raises(ValueError, match=match):
        CompactFamily(tokens, ids, counts)


def test_bad_family_files_name_the_file(tmp_path):
    good = make_witness_suite(construction="small").family
    np.savez(tmp_path / "ids.npz", format=NPZ_FORMAT, tokens=good.tokens,
             token_ids=good.token_ids.astype(int) + 999, counts=good.counts)
    np.savez(tmp_path / "missing.npz", format=NPZ_FORMAT, tokens=good.tokens,
             token_ids=good.token_ids)
    np.savez(tmp_path / "unmarked.npz", tokens=good.tokens, token_ids=good.token_ids,
             counts=good.counts)
    (tmp_path / "text.npz").write_text("hello")
    for name, match in [("ids.npz", "outside"), ("missing.npz", "without counts"),
                        ("unmarked.npz", "without format"),
                        ("text.npz", "not a .npy array or an .npz"),
                        ("none.npz", "cannot read")]:
        with pytest.raises(ValueError, match=match) as info:
            load_family(tmp_path / name)
        assert name in str(info.value)
