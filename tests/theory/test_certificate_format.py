"""The certificate format, read from untrusted text: strict fields, recomputed figures.

A skeptic runs ``verify_certificate`` on a family and a certificate a stranger sent;
whatever it accepts must be exactly the claim it checked. Each test of the first part
is one way a reader could be lax; the fuzz tests at the end mutate a valid
certificate's JSON and require acceptance or a one-line ValueError/TypeError.
"""

import dataclasses
import gzip
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from strategies import position_orders, token_pools, triple_families

from minip_learn.compact import load_family
from minip_learn.datasets import make_witness_suite
from minip_learn.theory import Certificate, certify, verify_certificate

FUZZ = dict(max_examples=150, deadline=None, derandomize=True)
EXACT = Path(__file__).resolve().parents[2] / "docs" / "_static" / "exact"

#: how every ValueError of reading or verifying a certificate begins
PREFIXES = ("certificate field", "certificate fields", "certificate lacks the field",
            "certificate has the unknown field", "certificate is not valid JSON",
            "certificate is nested deeper", "certificate is not UTF-8 text",
            "not a certificate", "certificate rejected: ", "the certificate is for",
            "certificate file ")


def _module():
    """The module that reads certificates (its ``LARGE_JSON_VALUE``)."""
    return sys.modules["minip_learn.theory.certificate"]


@pytest.fixture(scope="module")
def small():
    X = make_witness_suite(24, 3, construction="small").X
    return X, certify(X, return_certificate=True)[1].to_json()


def _edited(text, edit):
    doc = json.loads(text)
    edit(doc)
    return json.dumps(doc)


def _set(field, value):
    return lambda doc: doc.__setitem__(field, value)


def _entry(field, *path, value):
    def edit(doc):
        target = doc[field]
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
    return edit


# --------------------------------------------------------------------------- the audit
@pytest.mark.parametrize("edit", [_set("version", 99), _set("version", "1"),
                                  _set("version", None), lambda doc: doc.pop("version")])
def test_only_known_versions_are_read(small, edit):
    X, text = small
    with pytest.raises(ValueError, match=r"'version'.*this release reads version 1"):
        verify_certificate(_edited(text, edit), X)


@pytest.mark.parametrize("field,edit", [
    ("certified_min_rank", _set("certified_min_rank", "8")),
    ("certified_min_rank", _set("certified_min_rank", 8.0)),
    ("certified_min_rank", _set("certified_min_rank", 8.9)),
    ("certified_min_rank", _set("certified_min_rank", True)),
    ("seq_len", _set("seq_len", "3")),
    ("n_bits", _set("n_bits", "24")),
    ("query_index", _entry("query_index", 0, value=2.5)),
])
def test_integers_must_be_json_integers(small, field, edit):
    X, text = small
    with pytest.raises(ValueError, match=rf"^certificate field '{field}'( entry 0)? must be "
                                         r"(an integer|a token index)"):
        verify_certificate(_edited(text, edit), X)


@pytest.mark.parametrize("field,edit", [
    ("certified_min_rank", _set("certified_min_rank", float("inf"))),
    ("seq_len", _set("seq_len", float("inf"))),
    ("eps_denominators", _entry("eps_denominators", 0, 1, value=float("inf"))),
    ("query_index", _entry("query_index", 0, value=10**100)),
    ("overlap_gaps", _entry("overlap_gaps", 0, 1, value=10**100)),
    ("parents", _entry("parents", 0, 0, 1, value=10**100)),
])
def test_infinity_and_huge_integers_are_refused_not_converted(small, field, edit):
    X, text = small
    bad = _edited(text, edit)
    match = "Infinity is not a number" if "Infinity" in bad else f"field '{field}'"
    with pytest.raises(ValueError, match=match):
        verify_certificate(bad, X)


def test_a_zero_denominator_is_refused(small):
    X, text = small
    with pytest.raises(ValueError, match=r"field 'frobenius_value' must be a fraction"):
        verify_certificate(_edited(text, _set("frobenius_value", "1/0")), X)


@pytest.mark.parametrize("value", [{}, [], [{}] * 10, "parents"])
def test_parents_of_the_wrong_shape_are_refused(small, value):
    X, text = small
    with pytest.raises(ValueError, match=r"^certificate field 'parents'"):
        verify_certificate(_edited(text, _set("parents", value)), X)


@pytest.mark.parametrize("where", ["file", "field"])
def test_deep_nesting_is_refused(small, where):
    X, text = small
    deep = "[" * 100_000 + "]" * 100_000
    bad = deep if where == "file" else text.replace('"reason": ', f'"reason": {deep}, "x": ')
    with pytest.raises(ValueError, match="nested deeper than 8"):
        verify_certificate(bad, X)


@pytest.mark.parametrize("field,value,match", [
    ("frobenius_value", "28/5", "stated frobenius_value 28/5 is not"),
    ("diagonally_dominant", True, "stated diagonally_dominant=True, but"),
    ("n_constraints", 91, "stated n_constraints=91, but X holds 90"),
    ("reason", "because I say so", "stated reason 'because I say so' is not"),
    ("certified_min_rank", 7, "claimed rank 7 is not the 8"),
    ("strategy", "none", "strategy 'none' states that no search found pairs"),
])
def test_stated_figures_are_recomputed(small, field, value, match):
    X, text = small
    assert json.loads(text)[field] != value
    bad = _edited(text, _set(field, value))
    Certificate.from_json(bad)                  # well formed: only verification refuses it
    with pytest.raises(ValueError, match="^certificate rejected: " + match):
        verify_certificate(bad, X)
    assert verify_certificate(bad, X, raise_on_failure=False) is False


def test_stated_figures_of_a_rank_one_certificate_are_recomputed():
    X = np.zeros((2, 3, 4), dtype=np.uint8)
    text = certify(X, return_certificate=True)[1].to_json()
    assert verify_certificate(text, X)
    for field, value in [("n_constraints", 1), ("frobenius_value", "2/1"),
                         ("strategy", "greedy by degree"), ("exhaustive", False),
                         ("reason", "no two (query, key) pairs constrain each other")]:
        with pytest.raises(ValueError, match="^certificate rejected: "):
            verify_certificate(_edited(text, _set(field, value)), X)


@pytest.mark.parametrize("edit,match", [
    (_set("comment", "trust me"), "unknown field 'comment'"),
    (_set("certified_min_rank_v2", 9), "unknown field 'certified_min_rank_v2'"),
])
def test_unknown_fields_are_refused(small, edit, match):
    X, text = small
    with pytest.raises(ValueError, match=match):
        verify_certificate(_edited(text, edit), X)


def test_duplicate_keys_and_nan_are_refused(small):
    X, text = small
    with pytest.raises(ValueError, match="key 'seq_len' appears twice"):
        verify_certificate(text.replace('"seq_len": 3', '"seq_len": 3, "seq_len": 3'), X)
    with pytest.raises(ValueError, match="NaN is not a number"):
        verify_certificate(text.replace('"n_constraints": 90', '"n_constraints": NaN'), X)


def test_certificate_as_str_bytes_path_or_gzip_path(small, tmp_path):
    X, text = small
    plain, packed = tmp_path / "c.json", tmp_path / "c.json.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    for cert in (text, text.encode(), bytearray(text.encode()), plain, packed,
                 Certificate.from_file(str(packed))):
        assert verify_certificate(cert, X)
    with pytest.raises(TypeError, match="certificate must be a Certificate"):
        verify_certificate(json.loads(text), X)
    # a str is JSON text, never a file name: the message says how to pass a file
    with pytest.raises(ValueError, match="not valid JSON.*pass a path such as pathlib.Path"):
        verify_certificate(str(plain), X)
    with pytest.raises(ValueError, match="not UTF-8 text"):
        verify_certificate(b"\xff" + text.encode(), X)


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "not gzip"])
def test_broken_gzip_is_a_value_error_naming_the_file(small, tmp_path, damage):
    X, text = small
    data = gzip.compress(text.encode())
    data = {"truncated": data[:len(data) // 2],
            "corrupt": data[:20] + bytes(b ^ 0x5A for b in data[20:40]) + data[40:],
            "not gzip": text.encode()}[damage]
    path = tmp_path / "c.json.gz"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=f"^certificate file {path} "):
        verify_certificate(path, X)


def test_a_complex_family_is_refused_as_certify_refuses_it(small, tmp_path):
    X, text = small
    np.save(tmp_path / "f.npy", X.astype(np.complex128))
    Xc = np.load(tmp_path / "f.npy")
    with pytest.raises(ValueError, match="complex"):
        certify(Xc)
    with pytest.raises(ValueError, match="complex"):
        verify_certificate(text, Xc)


def test_a_family_with_tokens_the_certificate_does_not_list_is_rejected(small):
    X, text = small
    extra = np.ones((1, 3, 24), dtype=X.dtype)
    with pytest.raises(ValueError, match="^certificate rejected: token 1{24} of X is not"):
        verify_certificate(text, np.concatenate([X, extra]))


@pytest.mark.parametrize("field,value,match", [
    ("parents", {}, "'parents' must be a sequence of 10 chain trees"),
    ("certified_min_rank", 8.0, "'certified_min_rank' must be an integer"),
    ("seq_len", np.int64(3), None),
    ("query_index", np.arange(10) + 100, "'query_index' entry must be integers from 0 to 19"),
    ("eps_denominators", np.zeros((10, 10), dtype=int), "'eps_denominators' must be 1 on"),
    ("frobenius_value", 7.35, "'frobenius_value' must be a Fraction"),
    ("diagonally_dominant", "no", "'diagonally_dominant' must be True or False"),
    ("tokens", np.full((20, 24), 2), "'tokens' must be a \\(n_tokens, n_bits=24\\) array"),
])
def test_a_certificate_object_is_checked_field_by_field(small, field, value, match):
    X, text = small
    cert = Certificate.from_json(text)
    setattr(cert, field, value)
    if match is None:
        assert verify_certificate(cert, X)
        return
    with pytest.raises(ValueError, match="^certificate field " + match):
        verify_certificate(cert, X, raise_on_failure=False)


def _brute_force_count(X, query, positional):
    """The R4 triples of ``X`` by their definition, token triple by token triple."""
    n, N, m = X.shape
    tokens, ids = np.unique(X.reshape(-1, m), axis=0, return_inverse=True)
    ids = ids.reshape(n, N)
    if N < 3:
        return 0
    seqs = {tuple(r) for r in ids.tolist()}
    bags = {(tuple(sorted(r)), r[-1] if query == "last" else None) for r in ids.tolist()}
    ov = tokens.astype(int) @ tokens.T.astype(int)

    def has(*bag, x):
        return (tuple(sorted(bag)), x if query == "last" else None) in bags

    count = 0
    for x, y, z in itertools.product(range(len(tokens)), repeat=3):
        if y == z or ov[x, z] - ov[x, y] < 2:
            continue
        if not (has(x, *[y] * (N - 1), x=x) and has(x, *[z] * (N - 1), x=x)
                and has(x, y, *[z] * (N - 2), x=x)):
            continue
        if positional and not all((*[z] * p, y, *[z] * (N - 2 - p), x) in seqs
                                  for p in range(N - 1)):
            continue
        count += 1
    return count


@st.composite
def _few_token_families(draw):
    """``(X, mode)``: R4 triples (their S3 in some orders of the keys) and sequences of
    one to three distinct tokens, over 3 to 8 tokens of 6 bits; for ``mode="all"`` the
    positions of every sequence reordered."""
    N = draw(st.sampled_from([3, 4, 5, 3, 2]))
    mode = draw(st.sampled_from(["all", "last", "positional"]))
    pool = draw(token_pools(6, min_size=3, max_size=8))
    ids = draw(triple_families(pool, N, query="first" if mode == "all" else "last",
                               min_triples=1, max_triples=8, max_noise=20))
    if mode == "all":
        ids = np.take_along_axis(ids, draw(position_orders(len(ids), N)), axis=1)
    return pool[ids], mode


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=_few_token_families())
def test_n_constraints_is_counted_from_the_sequences(case):
    """verify counts the triples itself: its count is the definition's, on families of
    R4 triples and few distinct tokens per sequence."""
    X, mode = case
    N = X.shape[1]
    query, positional = ("last", True) if mode == "positional" else (mode, False)
    rank, cert = certify(X, query=query, positional=positional, return_certificate=True)
    event(f"{min(cert.n_constraints, 5)}{'+' if cert.n_constraints >= 5 else ''} triples")
    assert cert.n_constraints == _brute_force_count(X, query, positional)
    assert verify_certificate(cert, X)
    text = cert.to_json()
    wrong = _edited(text, _set("n_constraints", cert.n_constraints + 1))
    if rank > 1 or N < 3 or cert.n_constraints:   # else the stated reason fails first
        with pytest.raises(ValueError, match="certificate rejected: stated n_constraints"):
            verify_certificate(wrong, X)


@pytest.mark.parametrize("large", [False, True])
def test_a_chain_tree_gives_each_token_one_parent(small, monkeypatch, large):
    X, text = small
    if large:
        monkeypatch.setattr(_module(), "LARGE_JSON_VALUE", 20)
    doc = json.loads(text)
    doc["parents"][3][5] = [doc["parents"][3][2][0], 1]
    with pytest.raises(ValueError, match=r"'parents' row 3 gives token 2 two parents"):
        verify_certificate(json.dumps(doc), X)
    doc = json.loads(text)
    doc["parents"][2].reverse()                  # any order: read sorted by child
    assert Certificate.from_json(json.dumps(doc)).to_json() == text


def test_triples_are_counted_as_rows_when_their_codes_would_leave_int64(monkeypatch):
    monkeypatch.setattr(sys.modules["minip_learn.theory.verify"]._Triples, "CODE_LIMIT", 0)
    X = make_witness_suite(12, construction="exact").family
    rank, cert = certify(X, return_certificate=True)
    # the R9 family of the first n = 58 words (n(3n - 2)/2 = 4,988 <= 5,000 sequences,
    # 60 words would need 5,340): the n(n - 1) designed triples (x, ~x, ~y), and the
    # (x, y, x) for y not x or ~x, whose S1 {x, y^(N-1)}, S2 {x^N} and S3 {y, x^(N-1)}
    # are among the family's n^2 multisets {q, k^(N-1)} (gap m/2 - <x, y> >= 2):
    # n(n - 1) + n(n - 2) = n(2n - 3)
    n = len(X.tokens)
    assert n * (3 * n - 2) // 2 <= 5000 < (n + 2) * (3 * n + 4) // 2
    assert cert.n_constraints == n * (2 * n - 3) == 6554 and verify_certificate(cert, X)


# --------------------------------------------------------------------------- committed files
@pytest.mark.parametrize("m", [8, 12, 16])
def test_committed_certificates_verify_from_their_files(m):
    family = load_family(EXACT / f"m{m}" / "family.npz")
    assert verify_certificate(EXACT / f"m{m}" / "certificate.json.gz", family)


def test_the_fast_reader_gives_what_json_gives(small, monkeypatch):
    X, text = small
    monkeypatch.setattr(_module(), "LARGE_JSON_VALUE", 50)
    back = Certificate.from_json(text)
    assert isinstance(back.parents, _module().ChainTrees) and back.to_json() == text
    # a leading zero, a space inside a number, a float: JSON decides, and refuses
    good = '"overlap_gaps": [[0, 6'
    for bad in ("[[0, 06", "[[0, - 6", "[[0, 6.0", "[[0, 6 6", "[[0, -6-6", "[[[0], 6"):
        assert good in text
        with pytest.raises(ValueError, match="not valid JSON|must be an integer|must be a list"):
            Certificate.from_json(text.replace(good, '"overlap_gaps": ' + bad, 1))
    # the n x n fields nested in another object are not read as the certificate's
    doc = json.loads(text)
    doc["note"] = {"parents": doc["parents"]}
    with pytest.raises(ValueError, match="unknown field 'note'"):
        Certificate.from_json(json.dumps(doc))


# --------------------------------------------------------------------------- fuzz
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, 1, 3, 8, 24, 90, "1/1", "0/1", "all", "last", "none"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=12,
)
_FIELDS = sorted(json.loads(
    certify(np.zeros((2, 3, 4), dtype=np.uint8), return_certificate=True)[1].to_json()))


@pytest.fixture(scope="module", params=["all", "positional", "rank 1"])
def fuzzed(request):
    """A certificate of each kind: every position; final query in every order of the
    keys (positional); none of the pairs (rank 1)."""
    if request.param == "rank 1":
        X = np.zeros((2, 3, 4), dtype=np.uint8)
        return X, certify(X, return_certificate=True)[1].to_json()
    if request.param == "all":
        X = make_witness_suite(24, 3, construction="small").X
        return X, certify(X, return_certificate=True)[1].to_json()
    X = make_witness_suite(24, 3, construction="small", query="last", orders="all").X
    return X, certify(X, query="last", positional=True, return_certificate=True)[1].to_json()


def _outcome(text, X):
    """``True`` when accepted, else the exception (ValueError or TypeError only)."""
    try:
        assert verify_certificate(text, X) is True
        return True
    except (ValueError, TypeError) as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(PREFIXES), message
        return exc


def _same_with_both_readers(text, X):
    """The outcome with the fast reader on every field equals the json reader's."""
    C = _module()
    first = _outcome(text, X)
    old = C.LARGE_JSON_VALUE
    C.LARGE_JSON_VALUE = 20
    try:
        second = _outcome(text, X)
    finally:
        C.LARGE_JSON_VALUE = old
    assert (first is True) == (second is True) and str(first) == str(second)
    return first


@settings(**FUZZ)
@given(field=st.sampled_from(_FIELDS), value=_JSON, drop=st.booleans())
@example(field="overlap_gaps", value=[], drop=False)
@example(field="overlap_gaps", value=[[-100000, -100000]], drop=False)
@example(field="parents", value=[[]], drop=False)
def test_fuzz_replace_or_delete_a_field(fuzzed, field, value, drop):
    X, text = fuzzed
    doc = json.loads(text)
    if drop:
        del doc[field]
    else:
        doc[field] = value
    result = _same_with_both_readers(json.dumps(doc), X)
    if result is not True:
        message = str(result)
        assert (field in message or "certificate rejected" in message
                or "certificate field" in message or "not valid JSON" in message
                or "not a certificate" in message or "the certificate is for" in message)


@settings(**FUZZ)
@given(field=st.sampled_from(["eps_denominators", "overlap_gaps", "parents", "tokens",
                              "query_index", "key_index"]),
       path=st.lists(st.integers(0, 12), min_size=1, max_size=3), value=_JSON)
def test_fuzz_replace_an_entry(fuzzed, field, path, value):
    X, text = fuzzed
    doc = json.loads(text)
    target = doc[field]
    for p in path[:-1]:
        if not isinstance(target, list) or not target:
            break
        target = target[p % len(target)]
    if isinstance(target, list) and target:
        target[path[-1] % len(target)] = value
    _same_with_both_readers(json.dumps(doc), X)


@settings(**FUZZ)
@given(name=st.text(min_size=1, max_size=10), value=_JSON)
def test_fuzz_add_a_field(fuzzed, name, value):
    X, text = fuzzed
    doc = json.loads(text)
    if name in doc:
        return
    doc[name] = value
    result = _same_with_both_readers(json.dumps(doc), X)
    assert result is not True
    assert "unknown field" in str(result) or "not valid JSON" in str(result)   # NaN


@settings(**FUZZ)
@given(cut=st.integers(0, 10**6), flips=st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3), as_bytes=st.booleans())
def test_fuzz_truncate_or_flip_bytes(fuzzed, cut, flips, as_bytes):
    X, text = fuzzed
    data = bytearray(text.encode())
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    if not flips:
        data = data[:cut % len(data)]
    if as_bytes:
        result = _outcome(bytes(data), X)
    else:
        try:
            decoded = data.decode()
        except UnicodeDecodeError:
            return
        result = _same_with_both_readers(decoded, X)
    if result is True:               # accepted: then it states exactly what was checked
        back = Certificate.from_json(bytes(data))
        assert back.certified_min_rank == json.loads(text)["certified_min_rank"]


_ARRAYS = st.builds(
    lambda a, dtype: a.astype(dtype),
    hnp.arrays(np.int64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=12),
               elements=st.integers(-3, 30)),
    st.sampled_from([np.int64, np.int8, np.uint8, np.float64, bool, object, np.complex64]))


@settings(**FUZZ)
@given(field=st.sampled_from([f.name for f in dataclasses.fields(Certificate)]),
       value=_JSON | _ARRAYS)
def test_fuzz_a_certificate_objects_field(small, field, value):
    """A Certificate built in Python, any field replaced: accepted, or a one-line
    ValueError naming the field or the failed check."""
    X, text = small
    cert = Certificate.from_json(text)
    setattr(cert, field, value)
    try:
        verify_certificate(cert, X, raise_on_failure=False)
    except ValueError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(PREFIXES), str(exc)


def test_a_file_of_short_text_is_not_told_to_pass_a_path(tmp_path):
    # the hint about str being read as JSON text is for str and bytes, not for files
    path = tmp_path / "note.json"
    path.write_text("hello")
    with pytest.raises(ValueError, match="not valid JSON") as exc:
        Certificate.from_file(path)
    assert "pass a path" not in str(exc.value) and str(path) in str(exc.value)
    with pytest.raises(ValueError, match="pass a path such as pathlib.Path"):
        Certificate.from_json("hello")
    path.write_text("  \n")
    with pytest.raises(ValueError, match=r"certificate file .*note\.json is empty\.$"):
        Certificate.from_file(path)
