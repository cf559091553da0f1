"""Certificates a skeptic can check: monotone, stronger, fast, independently verifiable."""

import functools
import itertools
import json

import numpy as np
import pytest
from hypothesis import event, given, settings
from strategies import constraint_graphs, nested_families, sub_families

from minip_learn.cli import main
from minip_learn.datasets import make_witness_suite
from minip_learn.theory import (
    Certificate,
    _constraints,
    bound_table,
    certify,
    hadamard_code,
    product_code,
    verify_certificate,
    witness_family,
)
from minip_learn.theory.certify import _certify

SETTINGS = dict(deadline=None, derandomize=True)

TOKENS4 = np.array(list(itertools.product([0, 1], repeat=4)), dtype=np.uint8)
ALL_MULTISETS4 = TOKENS4[np.array(list(itertools.combinations_with_replacement(range(16), 3)))]


def _r6():
    return witness_family(hadamard_code(24), 3)


def _with_zero_token(X, words):
    """R6 plus, for every query, (x, 0, 0) and (x, 0, k_j) for every designated key."""
    zero = np.zeros(X.shape[2], dtype=np.uint8)
    keys = 1 - words
    extra = []
    for x in words:
        extra.append([x, zero, zero])
        extra += [[x, zero, k] for k in keys]
    return np.concatenate([X, np.array(extra, dtype=np.uint8)])


# --------------------------------------------------------------------------- monotone, stronger
def test_zero_token_superset_of_r6_still_certifies_17():
    X = _r6()
    big = _with_zero_token(X, hadamard_code(24))
    assert certify(X) == 17
    assert certify(big) >= 17


def test_every_multiset_over_four_bits_certifies_at_least_two():
    assert ALL_MULTISETS4.shape == (816, 3, 4)      # C(16 + 2, 3) multisets of 16 tokens
    rank, cert = certify(ALL_MULTISETS4, return_certificate=True)
    assert rank >= 2
    assert verify_certificate(cert, ALL_MULTISETS4)


@settings(max_examples=40, **SETTINGS)
@given(families=nested_families(6, [3, 3, 4], max_tokens=10))
def test_a_superset_never_certifies_less(families):
    # R4 triples and few-token sequences over a pool of 6-bit tokens, and a superset
    # (more of them, positions and rows reordered)
    sub, sup = families
    r_sub, c_sub = certify(sub, return_certificate=True)
    r_sup, c_sup = certify(sup, return_certificate=True)
    event(f"certified ranks {r_sub} <= {r_sup}")
    assert r_sup >= r_sub
    assert verify_certificate(c_sup, sup)


@functools.cache
def _h12():
    return make_witness_suite(12, 3, construction="hadamard").X


@functools.cache
def _h12_certified():
    """The certified ranks of the m = 12 suite and of the suite with the zero token."""
    X = _h12()
    return certify(X), certify(_with_zero_token(X, hadamard_code(12)))


@settings(max_examples=15, **SETTINGS)
@given(sub=sub_families(_h12))
def test_adding_sequences_to_a_witness_subfamily_never_lowers_it(sub):
    # the suite's sequences of some queries (all but a few, or a few), less a few rows
    if not len(sub):
        return
    whole, with_zero = _h12_certified()
    rank = certify(sub)
    event(f"certified rank {rank} of {whole}")
    assert whole >= rank
    assert with_zero >= whole


# --------------------------------------------------------------------------- fast == reference
FAMILIES = {
    "r6": lambda: _r6(),
    "r6+zero": lambda: _with_zero_token(_r6(), hadamard_code(24)),
    "all4": lambda: ALL_MULTISETS4,
    "ladder": lambda: make_witness_suite(33, 3, construction="hadamard-half").X,
    "product-N4": lambda: make_witness_suite(17, 4, construction="product", n_queries=20).X,
    "N5": lambda: make_witness_suite(8, 5, construction="hadamard").X,
    "shuffled": lambda: np.random.RandomState(0).permutation(
        np.stack([s[::-1] for s in make_witness_suite(12, 4, construction="hadamard").X])),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_fast_path_gives_exactly_the_reference_certificate(name):
    X = FAMILIES[name]()
    cons, ref = _constraints.constraints(X), _constraints.constraints_reference(X)
    np.testing.assert_array_equal(cons.tokens, ref.tokens)
    for a in ("x", "y", "z", "K", "gap"):
        np.testing.assert_array_equal(getattr(cons, a), getattr(ref, a))
    R, Rref = _constraints.reach(cons), _constraints.reach_reference(ref)
    for a in ("x", "s", "t", "K", "pred"):
        np.testing.assert_array_equal(getattr(R, a), getattr(Rref, a))
    fast, slow = _certify(X), _certify(X, reference=True)
    assert fast.certified_min_rank == slow.certified_min_rank
    np.testing.assert_array_equal(fast.query_index, slow.query_index)
    np.testing.assert_array_equal(fast.key_index, slow.key_index)
    assert (fast.eps_denominators == slow.eps_denominators).all()
    assert fast.parents == slow.parents
    assert fast.to_json() == slow.to_json()


# --------------------------------------------------------------------------- verification
@pytest.fixture(scope="module")
def small():
    s = make_witness_suite(24, 3, construction="small")
    return s.X, certify(s.X, return_certificate=True)[1]


def _doc(cert):
    return json.loads(cert.to_json())


def test_json_round_trip_and_verification(small):
    X, cert = small
    back = Certificate.from_json(cert.to_json())
    # 10 Hadamard-24 queries, eps = 1/5: 10/(1 + 9/25) = 7.35, so 8
    assert back.certified_min_rank == cert.certified_min_rank == 8
    np.testing.assert_array_equal(back.tokens, cert.tokens)
    assert back.chains == cert.chains and back.parents == cert.parents
    assert (back.eps_denominators == cert.eps_denominators).all()
    assert back.frobenius_value == cert.frobenius_value
    assert verify_certificate(back, X) and verify_certificate(cert.to_json(), X)


def _tampered(cert, edit):
    doc = _doc(cert)
    edit(doc)
    return json.dumps(doc)


def test_an_inflated_claim_is_rejected(small):
    X, cert = small
    text = _tampered(cert, lambda d: d.update(certified_min_rank=9))
    with pytest.raises(ValueError, match="claimed rank 9 exceeds"):
        verify_certificate(text, X)
    assert verify_certificate(text, X, raise_on_failure=False) is False


def test_an_inflated_ratio_bound_is_rejected(small):
    X, cert = small

    def edit(d):
        d["eps_denominators"][0][1] *= 2

    with pytest.raises(ValueError, match=r"pair \(0, 1\): claimed ratio bound"):
        verify_certificate(_tampered(cert, edit), X)


def test_a_missing_sequence_is_rejected(small):
    X, cert = small
    x0, k0, k1 = cert.queries[0], cert.keys[0], cert.keys[1]
    drop = np.array([(s[0] == x0).all() and (s[1] == k0).all() and (s[2] == k1).all()
                     for s in X])
    assert drop.sum() == 1
    with pytest.raises(ValueError, match="S3 for query .* is missing from X"):
        verify_certificate(cert, X[~drop])
    assert verify_certificate(cert, X[~drop], raise_on_failure=False) is False


def test_a_wrong_overlap_is_rejected(small):
    X, cert = small

    def edit(d):
        d["overlap_gaps"][2][3] += 1

    with pytest.raises(ValueError, match=r"pair \(2, 3\): claimed overlap distance"):
        verify_certificate(_tampered(cert, edit), X)


def test_a_chain_step_that_does_not_climb_is_rejected(small):
    X, cert = small

    def edit(d):
        # make a key its own designated key's child: a step of gap 0
        d["key_index"][1] = d["key_index"][0]

    with pytest.raises(ValueError, match="certificate rejected"):
        verify_certificate(_tampered(cert, edit), X)


def test_verification_of_a_mismatched_family_or_file(small):
    X, cert = small
    with pytest.raises(ValueError, match="length 3 over 24 bits"):
        verify_certificate(cert, X[:, :2])
    with pytest.raises(ValueError, match="not valid JSON"):
        Certificate.from_json("{nope")
    with pytest.raises(ValueError, match="not a certificate"):
        Certificate.from_json("[1, 2]")
    with pytest.raises(ValueError, match="lacks the field 'tokens'"):
        Certificate.from_json(_tampered(cert, lambda d: d.pop("tokens")))


def test_rank_one_certificates_verify():
    X = np.zeros((2, 2, 4), dtype=np.uint8)
    rank, cert = certify(X, return_certificate=True)
    assert rank == 1 and verify_certificate(Certificate.from_json(cert.to_json()), X)


# --------------------------------------------------------------------------- CLI
def test_cli_certify_and_verify(small, tmp_path, capsys):
    X, _ = small
    fam = tmp_path / "family.npy"
    np.save(fam, X)
    assert main(["certify", str(fam)]) == 0
    out = capsys.readouterr().out
    assert "certified minimum rank: 8" in out
    cert_file = tmp_path / "family.certificate.json"
    assert str(cert_file) in out and cert_file.exists()
    assert main(["verify", str(fam), str(cert_file)]) == 0
    assert "valid" in capsys.readouterr().out
    # a tampered claim: exit 1 with the reason
    doc = json.loads(cert_file.read_text())
    doc["certified_min_rank"] = 10
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["verify", str(fam), str(bad)]) == 1
    assert "INVALID" in capsys.readouterr().out
    custom = tmp_path / "c.json"
    assert main(["certify", str(fam), "--out", str(custom)]) == 0 and custom.exists()


@pytest.mark.parametrize(
    "setup,match",
    [
        ("missing", "does not exist"),
        ("text", "not a .npy"),
        ("shape", "shape"),
        ("values", "0/1"),
        ("cert-missing", "certificate file"),
        ("cert-json", "not valid JSON"),
    ],
)
def test_cli_reports_bad_files(tmp_path, capsys, setup, match):
    fam = tmp_path / "family.npy"
    cert = tmp_path / "cert.json"
    good = np.zeros((2, 3, 4), dtype=np.uint8)
    np.save(fam, good)
    cert.write_text(certify(good, return_certificate=True)[1].to_json())
    if setup == "missing":
        fam = tmp_path / "nothing.npy"
    elif setup == "text":
        fam.write_text("hello")
    elif setup == "shape":
        np.save(fam, np.zeros((3, 4)))
    elif setup == "values":
        np.save(fam, np.full((2, 3, 4), 2))
    elif setup == "cert-missing":
        cert = tmp_path / "none.json"
    elif setup == "cert-json":
        cert.write_text("{")
    cmd = ["verify", str(fam), str(cert)] if setup.startswith("cert") else ["certify", str(fam)]
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "minip-learn: error:" in err and match in err and "Traceback" not in err


# --------------------------------------------------------------------------- designs
@pytest.mark.parametrize("m,N", [(12, 4), (13, 5), (16, 5), (17, 3), (21, 3)])
def test_design_bound_equals_the_materialised_bound_on_exact_designs(m, N):
    t = bound_table(n_bits=[m], seq_len=[N], exact_only=True, max_sequences=30000,
                    as_frame=False)
    assert t["materialised"][0] is not None
    assert t["materialised"][0] == t["certified_min_rank"][0]


def test_growing_products_are_exponential_with_a_constant_rate():
    t = bound_table(n_bits=[64, 128, 256], seq_len=[3], max_sequences=0, as_frame=False)
    rate = t["bits_per_bit"]
    assert min(rate) >= 0.1
    assert rate[0] <= rate[1] <= rate[2]
    assert all(len(c.split(" x ")) >= 8 for c in t["construction"])   # blocks grow with m
    assert t["materialised"] == [None] * 3


def test_witness_family_matches_a_sequence_by_sequence_build():
    words = product_code([(8, True), (8, True)], n_bits=17)[:12]
    gap, N = 2, 4
    from minip_learn.theory import witness_denominators

    _, steps, _ = witness_denominators(words, N, ladder_gap=gap)
    X = witness_family(words, N, ladder_gap=gap)
    keys = 1 - words
    seqs = []
    for i, x in enumerate(words):
        ones = np.flatnonzero(x)
        ladder = [keys[i]]
        for t in range(1, steps[i].max() + 1):
            w = keys[i].copy()
            w[ones[: t * gap]] = 1
            ladder.append(w)
        seqs.append([x] + [keys[i]] * (N - 1))
        for j in range(len(words)):
            if j != i:
                seqs.append([x] + [keys[j]] * (N - 1))
                seqs.append([x, ladder[steps[i, j]]] + [keys[j]] * (N - 2))
        for t in range(1, len(ladder)):
            seqs.append([x] + [ladder[t]] * (N - 1))
            seqs.append([x, ladder[t - 1]] + [ladder[t]] * (N - 2))
    np.testing.assert_array_equal(X, np.array(seqs, dtype=np.uint8))


# --------------------------------------------------------------------------- search bounds
def _brute_force_best(A, Kinv):
    from minip_learn.theory._search import _exact_rank

    V, best = len(A), 1
    for size in range(2, V + 1):
        for C in itertools.combinations(range(V), size):
            if all(A[u, w] for u, w in itertools.combinations(C, 2)):
                best = max(best, _exact_rank(list(C), Kinv))
    return best


@settings(max_examples=60, **SETTINGS)
@given(graph=constraint_graphs([1, 2, 3, 5, 9, 25], max_vertices=9))
def test_search_bounds_are_never_below_the_best_clique(graph):

    from minip_learn.theory._search import _clique_cover_bound, _root_bound

    A, Kinv = graph
    V = len(A)
    best = _brute_force_best(A, Kinv)
    assert _root_bound(A, Kinv) >= best
    nbr = [sum(1 << int(w) for w in np.flatnonzero(A[u])) for u in range(V)]
    largest = max(len(C) for size in range(1, V + 1)
                  for C in itertools.combinations(range(V), size)
                  if all(A[u, w] for u, w in itertools.combinations(C, 2)))
    event(f"best clique rank {best}, largest clique {largest}")
    assert _clique_cover_bound((1 << V) - 1, nbr) >= largest


@settings(max_examples=60, **SETTINGS)
@given(graph=constraint_graphs([1, 2, 3, 4, 6], max_vertices=9))
def test_exhaustive_search_finds_the_best_clique(graph):

    from minip_learn.theory._search import _exact_clique_search, _root_bound

    # denominators whose sums often land exactly on integers (row sums 1, n^2/(n+S) whole)
    A, Kinv = graph
    best = _brute_force_best(A, Kinv)
    rank, clique, complete = _exact_clique_search(A, Kinv, 1, 10**6)
    event(f"best clique rank {best}")
    assert complete and rank == best
    assert _root_bound(A, Kinv) >= best


def test_upper_bound_is_the_best_over_every_clique_size():
    from fractions import Fraction

    from minip_learn.theory._search import _upper_bound
    from minip_learn.theory.bounds import integer_above

    def above(q):
        r = 0
        while not r > q:
            r += 1
        return r

    for e in (Fraction(1), Fraction(1, 2), Fraction(1, 3), Fraction(1, 5), Fraction(1, 9)):
        largest_dominant = integer_above(1 / float(e), lambda e=e: 1 / e)
        for n, extra in itertools.product(range(6), (0, Fraction(1, 4), Fraction(1, 2), 1,
                                                     Fraction(3, 2), Fraction(7, 3))):
            S = n * (n - 1) * e * e + extra
            for n_max in range(n + 1, 12):
                S_k = [S + (k * (k - 1) - n * (n - 1)) * e * e for k in range(n_max + 1)]
                expected = max([n] + [
                    k if (k - 1) * e <= 1 else min(k, above(Fraction(k * k) / (k + S_k[k])))
                    for k in range(n, n_max + 1)
                ])
                got = _upper_bound(n, float(S), n_max, float(e), lambda S=S: S, e,
                                   largest_dominant)
                assert got == expected, (e, n, extra, n_max)


def test_r6_search_is_exhaustive():
    rank, cert = certify(_r6(), return_certificate=True)
    assert rank == 17 and cert.exhaustive


# --------------------------------------------------------------------------- large inputs
def test_binary_check_reads_slices_and_views():
    from minip_learn._validation import check_binary

    X = np.zeros((5, 3, 4), dtype=np.int8)
    check_binary(X[:, ::2])  # a strided view
    X[4, 2, 3] = -1
    with pytest.raises(ValueError, match="found 1 other value"):
        check_binary(X)
    with pytest.raises(ValueError, match="e.g. 0.5"):
        check_binary(np.full((2, 3, 4), 0.5)[:, ::-1])
    with pytest.raises(ValueError, match="found 2 other value"):
        check_binary(np.array([[[0, 2, 7]]], dtype=np.uint8))


def test_verification_streams_over_slices(small, monkeypatch):
    from minip_learn.theory import verify as verify_module

    X, cert = small
    monkeypatch.setattr(verify_module, "CHUNK", 7)  # many slices, one sequence per check
    assert verify_certificate(cert, X[::-1])
    assert verify_certificate(cert, X.astype(np.float64))
    drop = np.ones(len(X), dtype=bool)
    drop[np.flatnonzero((X[:, 0] == cert.queries[0]).all(axis=1)
                        & (X[:, 1] == cert.keys[0]).all(axis=1)
                        & (X[:, 2] == cert.keys[0]).all(axis=1))] = False
    with pytest.raises(ValueError, match="S1 for query"):
        verify_certificate(cert, X[drop])


# --------------------------------------------------------------------------- large families
def _module(name):
    """A module of ``minip_learn.theory`` (``certify`` is also a function's name there)."""
    import sys

    return sys.modules[f"minip_learn.theory.{name}"]


def test_everything_in_small_slices_gives_the_same_certificate(monkeypatch):
    """Constraints, chains, graph, denominators and gaps built a few rows at a time."""
    S = _module("_search")
    X = make_witness_suite(12, construction="exact").family
    whole = _certify(X).to_json()
    monkeypatch.setattr(_constraints, "SLOT_CHUNK", 97)
    monkeypatch.setattr(_constraints, "REACH_BLOCK", 61)
    monkeypatch.setattr(S, "GRAPH_CHUNK", 13)
    assert _certify(X).to_json() == whole
    monkeypatch.setattr(S, "GRAPH_CHUNK", 1)
    assert _certify(X).to_json() == whole


def test_indices_are_int16_and_denominators_come_from_the_gaps():
    X = make_witness_suite(12, construction="exact").family
    cons = _constraints.constraints(X)
    assert cons.x.dtype == cons.y.dtype == cons.z.dtype == np.int16
    assert cons.gap.dtype == np.int8
    np.testing.assert_array_equal(cons.K, (X.seq_len - 2) * (cons.gap.astype(int) - 1))
    R = _constraints.reach(cons)
    assert R.t.dtype == R.pred.dtype == np.int16 and R.dropped == 0


def test_sources_reaching_one_key_are_left_out_without_changing_the_certificate(monkeypatch):
    """``reach(drop_single=True)`` leaves them out and keeps them aside; the certificate
    equals the reference's, also on a family whose first search certifies less than 2
    (the rows left out are then put back: the chains are computed once)."""
    C, S = _module("certify"), _module("_search")
    X = _r6()
    cons = _constraints.constraints(X)
    full, part = _constraints.reach(cons), _constraints.reach(cons, drop_single=True)
    assert part.dropped == len(full) - len(part) > 0
    cons.release()                           # the rows are put back from the overlaps
    back = _constraints.with_singles(part, cons)
    for got, want in zip((back.x, back.s, back.t, back.K, back.pred),
                         (full.x, full.s, full.t, full.K, full.pred)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert _certify(X).to_json() == _certify(X, reference=True).to_json()
    rng = np.random.default_rng(1)           # the 109th subfamily: the rows put back
    for _ in range(109):
        X = ALL_MULTISETS4[rng.choice(len(ALL_MULTISETS4), rng.integers(10, 200),
                                      replace=False)]
    calls, put_back = [], []
    reach, with_singles = C.reach, S.with_singles

    def spy_reach(cons, drop_single=False):
        calls.append(drop_single)
        return reach(cons, drop_single=drop_single)

    def spy_put_back(R, cons):
        put_back.append(R.dropped)
        return with_singles(R, cons)

    monkeypatch.setattr(C, "reach", spy_reach)
    monkeypatch.setattr(S, "with_singles", spy_put_back)
    fast = _certify(X)
    assert calls == [True] and len(put_back) == 1 and put_back[0] > 0
    assert fast.to_json() == _certify(X, reference=True).to_json()


def test_large_json_fields_are_read_by_numpy(small, monkeypatch):
    C = _module("certificate")
    X, cert = small
    text = cert.to_json()
    monkeypatch.setattr(C, "LARGE_JSON_VALUE", 50)
    back = Certificate.from_json(text)
    assert isinstance(back.parents, C.ChainTrees) and back.eps_denominators.dtype == np.int64
    assert back.to_json() == text and verify_certificate(back, X)
    # anything but plain nested integer lists goes to the json reader, with its errors
    doc = json.loads(text)
    doc["eps_denominators"][1][2] = 4.0
    with pytest.raises(ValueError, match=r"'eps_denominators' entry \[1\]\[2\] must be an "
                                         r"integer; got 4.0 \(float\)"):
        Certificate.from_json(json.dumps(doc))
    doc = json.loads(text)
    doc["parents"][0][0] = [doc["parents"][0][0][0]]   # a pair of one number
    with pytest.raises(ValueError, match=r"'parents' row 0 pair 0 must be a \[child, parent\]"):
        Certificate.from_json(json.dumps(doc))
    doc = json.loads(text)
    doc["eps_denominators"][0][1] = 2**70                # beyond any chain of length 3
    with pytest.raises(ValueError, match=r"'eps_denominators' entry \[0\]\[1\] must be from 1"):
        Certificate.from_json(json.dumps(doc))
    doc["seq_len"] = 1000                                # longer chains: Python integers
    assert Certificate.from_json(json.dumps(doc)).eps_denominators[0, 1] == 2**70
