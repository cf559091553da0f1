"""Certificates for final-query Min-IP: only the constraints whose query is the final
token of every sequence they use, found by certify and checked by verify_certificate."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import position_orders

from minip_learn.cli import main
from minip_learn.compact import CompactFamily
from minip_learn.datasets import make_witness_suite, minip_targets
from minip_learn.theory import (
    Certificate,
    _constraints,
    certify,
    family_constraints,
    verify_certificate,
)
from minip_learn.theory.certify import _certify

SETTINGS = dict(deadline=None, derandomize=True)


@pytest.fixture(scope="module")
def r6():
    """The R6 family (Hadamard, m = 24, N = 3) in both forms."""
    return make_witness_suite(), make_witness_suite(query="last")


@pytest.fixture(scope="module")
def small_last():
    return make_witness_suite(construction="small", query="last")


@pytest.fixture(scope="module")
def exact8_last():
    return make_witness_suite(8, construction="exact", query="last")


def test_r6_final_query_certifies_17(r6):
    full, last = r6
    assert full.certified_min_rank == 17
    for X in (last.X, last.family):
        rank, cert = certify(X, query="last", return_certificate=True)
        assert rank == 17 and cert.query == "last"
        assert verify_certificate(cert, last.X) and verify_certificate(cert, last.family)
    # the final-query certificate is about fewer constraints: those with the query last
    assert last.certificate.n_constraints < full.certificate.n_constraints


def test_exact_m8_final_query_certifies_14(exact8_last):
    rank, cert = certify(exact8_last.X, query="last", return_certificate=True)
    # R9: the m = 8 code has 14 words (A(8, 4, 4) = 14) and the certificate is dominant
    assert rank == 14 == exact8_last.constructive_rank and cert.diagonally_dominant
    assert verify_certificate(cert, exact8_last.X, query="last")


def test_query_last_reads_only_the_final_position(r6):
    full, last = r6
    # the full form has its queries first: read at the last position it forces little
    assert certify(full.X, query="last") < 17
    assert certify(full.family, query="last") == certify(full.X, query="last")
    # and a final-query certificate does not hold for it
    cert = last.certificate
    assert not verify_certificate(cert, full.X, raise_on_failure=False)
    with pytest.raises(ValueError, match="with the query last"):
        verify_certificate(cert, full.family)
    # the final-query family holds every multiset the full form needs
    assert certify(last.X) == 17


def _pool_family(rng, T, m, N, frac):
    """A random part of all sequences of length N over T random tokens: R4 triples in
    some orders, not in others."""
    pool = np.unique(rng.randint(0, 2, size=(4 * T, m)), axis=0)[:T]
    seqs = np.array(list(itertools.product(range(len(pool)), repeat=N)))
    return pool[seqs[rng.random_sample(len(seqs)) < frac]].astype(np.uint8)


def test_fast_and_reference_constraints_agree_on_query_last(small_last):
    rng = np.random.RandomState(0)
    families = [small_last.X, small_last.family, _pool_family(rng, 6, 5, 3, 0.7),
                _pool_family(rng, 5, 6, 4, 0.5)]
    for X in families[2:]:
        families.append(CompactFamily.from_sequences(X))
    sizes = []
    for X in families:
        fast = _constraints.constraints(X, "last")
        ref = _constraints.constraints_reference(X, "last")
        for k in "xyzK":
            np.testing.assert_array_equal(getattr(fast, k), getattr(ref, k))
        sizes.append((len(fast), len(_constraints.constraints(X))))
    # the random families hold some triples with the query last, and fewer than in all
    assert all(0 < a < b for a, b in sizes[2:4])
    assert (_certify(small_last.X, query="last").to_json()
            == _certify(small_last.X, query="last", reference=True).to_json())


def test_family_constraints_query_last():
    x, y, z = [1, 1, 1, 0], [0, 0, 0, 1], [1, 1, 0, 1]
    first = np.array([[x, y, y], [x, z, z], [x, y, z]])
    last = first[:, [1, 2, 0]]
    _, edges, _ = family_constraints(first)
    assert edges == {2: [(0, 1, 1)]}
    assert family_constraints(first, query="last")[1] == {}
    assert family_constraints(last, query="last")[1] == edges


@settings(max_examples=6, **SETTINGS)
@given(which=st.sampled_from(["small", "exact8"]), data=st.data())
def test_permuting_the_prefix_changes_nothing(small_last, exact8_last, which, data):
    suite = small_last if which == "small" else exact8_last
    n, N, _ = suite.X.shape
    # one order of the first N - 1 positions for every sequence, a few sequences apart
    order = data.draw(position_orders(n, N - 1), label="orders of the first N - 1 positions")
    X = suite.X.copy()
    X[:, :-1] = np.take_along_axis(suite.X[:, :-1], order[:, :, None], axis=1)
    np.testing.assert_array_equal(minip_targets(X, query="last"), suite.y)
    rank, cert = certify(X, query="last", return_certificate=True)
    assert rank == suite.certified_min_rank
    assert verify_certificate(cert, X) and verify_certificate(suite.certificate, X)


def test_certificate_json_keeps_the_query(small_last):
    cert = small_last.certificate
    back = Certificate.from_json(cert.to_json())
    assert back.query == "last" and verify_certificate(back, small_last.X)
    assert "final-query" in cert.summary() and "query='last'" in repr(cert)
    doc = json.loads(cert.to_json())
    del doc["query"]                        # certificates written before: every position
    assert Certificate.from_json(json.dumps(doc)).query == "all"
    doc["query"] = "middle"
    with pytest.raises(ValueError, match="query"):
        Certificate.from_json(json.dumps(doc))


def test_verify_query_must_match_the_certificate(small_last):
    cert = small_last.certificate
    assert verify_certificate(cert, small_last.X, query="last")
    with pytest.raises(ValueError, match="certificate is for query='last'"):
        verify_certificate(cert, small_last.X, query="all")


@pytest.mark.parametrize("call", [
    lambda X, q: certify(X, query=q),
    lambda X, q: family_constraints(X, query=q),
    lambda X, q: verify_certificate(certify(X, return_certificate=True)[1], X, query=q),
])
@pytest.mark.parametrize("bad", ["first", "", 0])
def test_bad_query(call, bad):
    X = np.zeros((2, 3, 4), dtype=np.uint8)
    with pytest.raises(ValueError, match="query"):
        call(X, bad)


def test_cli_query_last(small_last, tmp_path, capsys):
    fam = tmp_path / "family.npy"
    np.save(fam, small_last.X)
    assert main(["certify", str(fam), "--query", "last"]) == 0
    assert "certified minimum rank: 8" in capsys.readouterr().out
    cert_file = tmp_path / "family.certificate.json"
    assert json.loads(cert_file.read_text())["query"] == "last"
    assert main(["verify", str(fam), str(cert_file)]) == 0
    assert main(["verify", str(fam), str(cert_file), "--query", "all"]) == 2
    # the family with its queries first does not hold the final-query certificate
    np.save(fam, small_last.X[:, ::-1])
    assert main(["verify", str(fam), str(cert_file)]) == 1


def test_cli_positional(tmp_path, capsys):
    every = make_witness_suite(24, 3, construction="small", query="last", orders="all")
    fam = tmp_path / "every.npy"
    np.save(fam, every.X)
    assert main(["certify", str(fam), "--query", "last", "--positional"]) == 0
    out = capsys.readouterr().out
    assert "certified minimum rank: 8" in out and "every order of its keys" in out
    cert_file = tmp_path / "every.certificate.json"
    assert json.loads(cert_file.read_text())["positional"] is True
    assert main(["verify", str(fam), str(cert_file)]) == 0
    assert "position-dependent maps included" in capsys.readouterr().out
    # the fixed-order family lacks orders the certificate claims
    np.save(fam, make_witness_suite(24, 3, construction="small", query="last").X)
    assert main(["verify", str(fam), str(cert_file)]) == 1
    assert "every order" in capsys.readouterr().out
    # positional needs query last: a message, no traceback
    assert main(["certify", str(fam), "--positional", "--force"]) == 2
    assert 'needs query="last"' in capsys.readouterr().err
