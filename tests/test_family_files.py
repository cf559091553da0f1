"""Family files are untrusted input: ``load_family`` reads ``.npy`` and compact ``.npz``
families with every declared size checked against the file before anything is
allocated, and refuses anything that is not a valid family with a one-line ValueError
that names the file (never another exception, never a MemoryError, never an unpickle).
The same rules hold for families built in memory."""

import io
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minip_learn import compact
from minip_learn._validation import MAX_SEQ_LEN, check_family
from minip_learn.compact import (
    MAX_FAMILY_BYTES,
    NPZ_FORMAT,
    NPZ_VERSION,
    CompactFamily,
    load_family,
)

TOKENS = np.array([[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 1], [0, 0, 1, 1]], dtype=np.uint8)
FAMILY = CompactFamily(TOKENS, [[0, 1, 2], [1, 3, -1], [2, 0, 3], [3, -1, -1]],
                       [[1, 1, 3], [2, 3, 0], [3, 1, 1], [5, 0, 0]])
X = FAMILY.to_sequences()
REPO = Path(__file__).resolve().parents[1]


def npy_bytes(arr=None, *, header=None, body=None, version=(1, 0)):
    """An ``.npy`` file: ``arr`` as ``np.save`` writes it, or a ``header`` dict (written
    with numpy's header writer) followed by ``body``."""
    buf = io.BytesIO()
    if header is None:
        np.lib.format.write_array(buf, np.asarray(arr), version=version, allow_pickle=False)
        return buf.getvalue()
    write = (np.lib.format.write_array_header_1_0 if version == (1, 0)
             else np.lib.format.write_array_header_2_0)
    write(buf, header)
    return buf.getvalue() + body


def npz_bytes(members, *, compression=zipfile.ZIP_DEFLATED):
    """A zip archive of ``name -> array`` (written as ``.npy``) or ``name -> bytes``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as zf:
        for name, value in members.items():
            data = value if isinstance(value, bytes) else npy_bytes(value)
            zf.writestr(name if "." in name else f"{name}.npy", data)
    return buf.getvalue()


def family_members(fam=FAMILY, **changes):
    members = dict(format=np.array(NPZ_FORMAT), version=np.array(NPZ_VERSION),
                   tokens=fam.tokens, token_ids=fam.token_ids, counts=fam.counts)
    members.update(changes)
    return {k: v for k, v in members.items() if v is not None}


def refused(path, match=None):
    """Load ``path``: a one-line ValueError naming it (matching ``match``), nothing else;
    the file is unchanged."""
    before = path.read_bytes()
    with pytest.raises(ValueError, match=match) as info:
        load_family(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert path.read_bytes() == before
    return message


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------- valid files load
def test_saved_family_round_trips_with_marker_and_version(tmp_path):
    path = FAMILY.save(tmp_path / "family.npz")
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == ["counts.npy", "format.npy", "token_ids.npy",
                                         "tokens.npy", "version.npy"]
    assert load_family(path) == FAMILY
    np.save(tmp_path / "family.npy", X)
    loaded = load_family(tmp_path / "family.npy")
    assert loaded.dtype == X.dtype and np.array_equal(loaded, X)


@pytest.mark.parametrize("m", [8, 12, 16])
def test_committed_families_load(m):
    path = REPO / "docs" / "_static" / "exact" / f"m{m}" / "family.npz"
    fam = load_family(path)
    with np.load(path, allow_pickle=False) as data:
        assert fam == CompactFamily(data["tokens"], data["token_ids"], data["counts"])


@pytest.mark.parametrize("arr", [
    X.astype(bool), X.astype(">i4"), np.asfortranarray(X.astype(np.int16)), X.astype(np.uint64),
])
def test_npy_of_any_bool_or_integer_dtype_and_order_loads(tmp_path, arr):
    loaded = load_family(write(tmp_path, "f.npy", npy_bytes(arr)))
    assert loaded.dtype.isnative and np.array_equal(loaded, X)


def test_npz_without_version_stored_or_with_wider_dtypes_loads(tmp_path):
    for i, members in enumerate([
        family_members(version=None),
        family_members(tokens=TOKENS.astype(bool), token_ids=FAMILY.token_ids.astype(">i8"),
                       counts=FAMILY.counts.astype(np.uint32)),
    ]):
        for compression in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            path = write(tmp_path, f"f{i}.npz", npz_bytes(members, compression=compression))
            assert load_family(path) == FAMILY


# ------------------------------------------------------------------ dtypes and shapes
@pytest.mark.parametrize("arr,match", [
    (X.astype(np.complex128), "dtype complex128; expected bool or integer"),
    (X.astype(np.float64), "dtype float64; expected bool or integer"),
    (X.astype("U1"), "dtype <U1"),
    (np.zeros(X.shape, dtype=[("a", "u1"), ("b", "u1")]), "structured dtype"),
    (npy_bytes(header={"descr": ("|u1", (4,)), "fortran_order": False,
                       "shape": X.shape[:2] + (1,)},
               body=X.tobytes()), "structured dtype"),
    (X[0], r"\(n_samples, seq_len, n_bits\) of 0/1 tokens; got shape \(5, 4\), dtype uint8"),
    (X[0].astype(float), r"got shape \(5, 4\), dtype float64"),
    (X[:0], "non-empty"),
    (X * 2, "must contain only 0/1 tokens"),
])
def test_npy_dtype_and_shape_rules(tmp_path, arr, match):
    # complex 0/1 was accepted and a structured dtype ended in a traceback; 2-D and
    # non-binary arrays were left to the command line to refuse
    data = arr if isinstance(arr, bytes) else npy_bytes(arr)
    refused(write(tmp_path, "f.npy", data), match)


def test_bool_npy_holding_other_bytes_is_refused(tmp_path):
    data = bytearray(npy_bytes(X.astype(bool)))
    data[-1] = 2
    refused(write(tmp_path, "f.npy", bytes(data)), "bool array holding bytes other than")


@pytest.mark.parametrize("member,value,match", [
    ("tokens", TOKENS.astype(np.float64), "array tokens has the dtype float64"),
    ("tokens", TOKENS.astype(np.complex64), "array tokens has the dtype complex64"),
    ("token_ids", FAMILY.token_ids.astype(np.float32), "array token_ids has the dtype float32"),
    ("counts", FAMILY.counts.astype(bool), "array counts has the dtype bool"),
    ("counts", np.zeros(4, dtype=[("a", "i4")]), "array counts has the structured dtype"),
    ("tokens", TOKENS[None], "array tokens must be 2-D"),
    ("version", np.array([1]), "array version must be 0-D"),
    ("format", np.array(7), "array format has the dtype int64; expected a string"),
])
def test_npz_member_dtype_and_shape_rules(tmp_path, member, value, match):
    refused(write(tmp_path, "f.npz", npz_bytes(family_members(**{member: value}))), match)


def test_pickles_are_never_loaded(tmp_path):
    sentinel = tmp_path / "unpickled"

    class Touch:
        def __reduce__(self):
            return Path.touch, (sentinel,)

    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array([[[Touch()]]], dtype=object), allow_pickle=True)
    assert pickle.loads(pickle.dumps(Touch())) is None and sentinel.exists()
    sentinel.unlink()
    refused(write(tmp_path, "f.npy", buf.getvalue()), "dtype object")
    refused(write(tmp_path, "f.npz", npz_bytes(family_members(tokens=buf.getvalue()))),
            "array tokens has the dtype object")
    assert not sentinel.exists()


# ------------------------------------------------------------------ declared sizes
def test_npy_declaring_931_gib_with_a_100_byte_body_is_refused_before_allocating(tmp_path):
    header = {"descr": "|u1", "fortran_order": False, "shape": (10**6, 10**3, 10**3)}
    path = write(tmp_path, "f.npy", npy_bytes(header=header, body=bytes(100)))
    refused(path, r"declares 1000000000000 bytes of data .* but holds 100")


def test_npy_above_the_size_limit_is_refused(tmp_path, monkeypatch):
    path = write(tmp_path, "f.npy", npy_bytes(X))
    monkeypatch.setattr(compact, "MAX_FAMILY_BYTES", X.nbytes - 1)
    refused(path, f"above MAX_FAMILY_BYTES = {X.nbytes - 1}")
    assert MAX_FAMILY_BYTES == 1 << 33


def test_npz_member_declaring_73_tib_is_refused_before_allocating(tmp_path):
    header = {"descr": "|u1", "fortran_order": False, "shape": (10**6, 8 * 10**7)}
    tokens = npy_bytes(header=header, body=bytes(100))
    path = write(tmp_path, "f.npz", npz_bytes(family_members(tokens=tokens)))
    refused(path, r"array tokens declares 80000000000000 bytes of data .* but holds 100")


def patch_central_sizes(data, member, file_size):
    """The archive with ``member``'s uncompressed size in the central directory set."""
    data = bytearray(data)
    at = data.index(b"PK\x01\x02")
    while True:
        at = data.index(b"PK\x01\x02", at)
        n = struct.unpack("<H", data[at + 28:at + 30])[0]
        if data[at + 46:at + 46 + n] == member.encode():
            data[at + 24:at + 28] = struct.pack("<I", file_size)
            return bytes(data)
        at += 4


def test_npz_member_declaring_more_than_deflate_produces_is_refused(tmp_path):
    data = npz_bytes(family_members())
    path = write(tmp_path, "f.npz", patch_central_sizes(data, "tokens.npy", 2**32 - 2))
    refused(path, "array tokens declares 4294967294 bytes from")


def test_npz_above_the_size_limit_is_refused(tmp_path, monkeypatch):
    path = FAMILY.save(tmp_path / "f.npz")
    monkeypatch.setattr(compact, "MAX_FAMILY_BYTES", 600)
    refused(path, "its arrays declare .* bytes, above MAX_FAMILY_BYTES = 600")


def test_npy_header_too_long_or_of_an_unknown_version_is_refused(tmp_path):
    data = bytearray(npy_bytes(X, version=(2, 0)))
    data[8:12] = struct.pack("<I", 2**32 - 1)
    refused(write(tmp_path, "long.npy", bytes(data)), "header of 4294967295 bytes")
    data = bytearray(npy_bytes(X))
    data[6] = 3
    refused(write(tmp_path, "v3.npy", bytes(data)), "format version 3.0")


# ---------------------------------------------------------------- corrupt archives
def test_npz_cut_in_half_is_refused(tmp_path):
    data = FAMILY.save(tmp_path / "good.npz").read_bytes()
    refused(write(tmp_path, "half.npz", data[:len(data) // 2]), "corrupt or truncated")


def test_npz_with_a_bad_crc_is_refused(tmp_path):
    data = bytearray(npz_bytes(family_members(), compression=zipfile.ZIP_STORED))
    raw = npy_bytes(FAMILY.counts)
    at = bytes(data).index(raw) + len(raw) - 1         # the last count: 0 -> 1
    data[at] ^= 1
    refused(write(tmp_path, "crc.npz", bytes(data)), "Bad CRC-32")


def test_npz_with_corrupt_deflate_data_is_refused(tmp_path):
    data = bytearray(FAMILY.save(tmp_path / "good.npz").read_bytes())
    info = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo("token_ids.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start:start + info.compress_size] = b"\xff" * info.compress_size
    refused(write(tmp_path, "zlib.npz", bytes(data)), "corrupt or truncated")


# ----------------------------------------------------------- format marker, members
@pytest.mark.parametrize("changes,match", [
    (dict(format=None), "without format"),
    (dict(format=np.array("some other family")), "format marker is 'some other family'"),
    (dict(format=np.array(NPZ_FORMAT[:-1])), "format marker is"),
    (dict(format=np.array(NPZ_FORMAT + "\0x", dtype="U40")), "format marker is"),
    (dict(format=np.frombuffer(np.uint32(0x110000).tobytes(), dtype="<U1").reshape(())),
     "format marker is '\ufffd'"),
    (dict(version=np.array(2)), "format version 2; this version of minip-learn reads"),
    (dict(extra=np.zeros(3)), "unknown array.* 'extra.npy'"),
    (dict(targets=np.zeros(3), labels=np.ones(2)), "'targets.npy', 'labels.npy'"),
    (dict(counts=None), "without counts"),
    ({"notes.txt": b"hello"}, "unknown array.* 'notes.txt'"),
])
def test_npz_marker_version_and_members_are_required(tmp_path, changes, match):
    refused(write(tmp_path, "f.npz", npz_bytes(family_members(**changes))), match)


def test_npz_with_a_member_twice_or_encrypted_or_of_another_method_is_refused(tmp_path):
    members = family_members()
    data = npz_bytes(members)
    with pytest.warns(UserWarning, match="Duplicate name"):
        with zipfile.ZipFile(buf := io.BytesIO(data), "a") as zf:
            zf.writestr("tokens.npy", npy_bytes(TOKENS))
    refused(write(tmp_path, "twice.npz", buf.getvalue()), "tokens.npy more than once")
    bz = npz_bytes(members, compression=zipfile.ZIP_BZIP2)
    refused(write(tmp_path, "bz.npz", bz), "compression method 12")
    enc = bytearray(data)
    at = enc.index(b"PK\x01\x02")
    enc[at + 8] |= 1                                    # the encrypted flag of format.npy
    refused(write(tmp_path, "enc.npz", bytes(enc)), "is encrypted")


def test_not_a_family_file_or_no_file(tmp_path):
    refused(write(tmp_path, "text.npz", b"hello"), "not a .npy array or an .npz")
    refused(write(tmp_path, "empty.npy", b""), "not a .npy array or an .npz")
    with pytest.raises(ValueError, match="cannot read it") as info:
        load_family(tmp_path / "none.npz")
    assert "none.npz" in str(info.value)


# ----------------------------------------------------------------------- counts
M = 2**63 - 1
WRAPPING = dict(token_ids=[[0, 1, 2, 3], [0, -1, -1, -1]],
                counts=np.array([[M, M, 2, 1], [1, 0, 0, 0]], dtype=np.int64))


def test_counts_that_wrap_around_int64_are_refused(tmp_path):
    # (2**63 - 1) * 2 + 2 + 1 wraps to 1: the family read as length 1, certified rank 1
    with pytest.raises(ValueError, match="counts holds 9223372036854775807"):
        CompactFamily(TOKENS, **WRAPPING)
    members = family_members(token_ids=np.array(WRAPPING["token_ids"]),
                             counts=WRAPPING["counts"])
    refused(write(tmp_path, "wrap.npz", npz_bytes(members)), "above the longest sequence")
    with pytest.raises(ValueError, match="counts holds"):
        CompactFamily(TOKENS, [[0, 1]], np.array([[2**64 - 1, 1]], dtype=np.uint64))
    with pytest.raises(ValueError, match="must hold integers"):
        CompactFamily(TOKENS, [[0, 1]], [[2.0**70, 1.0]])


def test_sequence_length_beyond_the_bound_is_refused():
    # a length of 10**12 overflowed in the certificate's constraints
    N = 10**12
    with pytest.raises(ValueError, match=f"counts holds {N - 2}"):
        CompactFamily(TOKENS, [[0, 1, 2], [1, 2, 3]], [[N - 2, 1, 1], [1, 1, N - 2]])
    k = MAX_SEQ_LEN // 2 + 1                          # each count in bounds, the sum not
    with pytest.raises(ValueError, match=f"sequence length {2 * k}, above"):
        CompactFamily(TOKENS, [[0, 1]], [[k, k]])
    fam = CompactFamily(TOKENS, [[0, 1]], [[MAX_SEQ_LEN - 1, 1]])
    assert fam.seq_len == MAX_SEQ_LEN == 2**20


# ------------------------------------------------------------- families in memory
@pytest.mark.parametrize("arr,match", [
    (X.astype(np.complex128), "complex"),
    (np.zeros(X.shape, dtype=[("a", "u1")]), "non-numeric dtype"),
    (X.astype(object) * 1j, "non-numeric entries|complex"),
    (X[0], "ndim 3"),
    (X * 2, "only 0/1"),
    (np.zeros((1, MAX_SEQ_LEN + 1, 1), dtype=np.uint8), "above the longest sequence"),
])
def test_families_in_memory_follow_the_same_rules(arr, match):
    with pytest.raises(ValueError, match=match):
        check_family(arr)


def test_float_families_in_memory_but_not_in_files():
    assert check_family(X.astype(np.float32)).dtype == np.float32
    assert check_family(X.astype(bool), integer=True).dtype == bool
    with pytest.raises(ValueError, match="bool or integer 0/1 tokens; got dtype float32"):
        check_family(X.astype(np.float32), integer=True)


# -------------------------------------------- seeded corruptions, each of a known kind
# Every input below is built as one kind: a valid family (it loads and equals what was
# written) or one rule of docs/formats.rst broken in one place (refused with the message
# of that rule, its numbers worked out from how the file was built).
SEEDS = range(12)


def random_sequences(rng):
    """A random 0/1 family array of a random integer or bool dtype and memory order."""
    arr = rng.integers(0, 2, size=tuple(rng.integers(1, 7, size=3)))
    arr = arr.astype(rng.choice(["?", "u1", "i1", ">i2", "<u4", ">i8"]))
    return np.asfortranarray(arr) if rng.random() < 0.5 else arr


def random_compact(rng, least=1):
    """Random valid compact-family arrays: ``T >= 2`` distinct tokens, ``n >= 2`` rows,
    each of ``j >= least`` distinct token ids (then ``-1`` padding) with counts >= 1
    summing to ``N``."""
    m = int(rng.integers(2, 7))
    T = int(rng.integers(2, min(2**m, 8) + 1))
    codes = rng.choice(2**m, size=T, replace=False)
    tokens = ((codes[:, None] >> np.arange(m)) & 1).astype(np.uint8)
    n, k = int(rng.integers(2, 6)), int(rng.integers(least, T + 1))
    N = int(rng.integers(k, k + 5))
    ids, counts = np.full((n, k), -1, dtype=np.int64), np.zeros((n, k), dtype=np.int64)
    for r in range(n):
        j = int(rng.integers(least, k + 1))
        ids[r, :j] = rng.choice(T, size=j, replace=False)
        counts[r, :j] = 1 + rng.multinomial(N - j, np.ones(j) / j)
    return tokens, ids, counts, N


def npy_case(kind, rng):
    """``(file bytes, expected)``: the array itself for ``"valid"``, else the text the
    refusal must hold."""
    arr = random_sequences(rng)
    data = npy_bytes(arr, version=[(1, 0), (2, 0)][rng.choice(2)])
    nbytes, offset = arr.nbytes, len(data) - arr.nbytes
    if kind == "valid":
        return data, arr
    if kind == "body-cut":
        held = int(rng.integers(0, nbytes))
        return data[:offset + held], (f"the array declares {nbytes} bytes of data (shape "
                                      f"{arr.shape}, dtype {arr.dtype}) but holds {held}.")
    if kind == "bytes-appended":
        extra = rng.bytes(int(rng.integers(1, 40)))
        return data + extra, (f"the array declares {nbytes} bytes of data (shape "
                              f"{arr.shape}, dtype {arr.dtype}) but holds "
                              f"{nbytes + len(extra)}.")
    if kind == "header-cut":
        cut = int(rng.integers(0, offset))
        if cut < 6:    # not even the magic string: not recognised as a family file
            return data[:cut], ("not a .npy array or an .npz compact family (it starts "
                                f"with {data[:cut]!r}).")
        part = "magic string" if cut < 8 else "header"
        return data[:cut], f"it ends inside the .npy {part} of the array (cut short)."
    if kind == "magic-changed":
        at = int(rng.integers(0, 6))
        bad = bytearray(data)
        bad[at] ^= int(rng.integers(1, 256))
        return bytes(bad), ("not a .npy array or an .npz compact family (it starts with "
                            f"{bytes(bad[:8])!r}).")
    if kind == "version-changed":
        major = int(rng.choice([0, 3, 255, rng.integers(4, 255)]))  # 1 and 2 are read
        bad = bytearray(data)
        bad[6] = major
        return bytes(bad), (f"the array is a .npy array of format version {major}.0; "
                            "versions 1.0 and 2.0 are read.")
    if kind == "value-not-0-1":
        index = tuple(int(rng.integers(0, n)) for n in arr.shape)
        if arr.dtype == bool:  # the byte itself: numpy cannot write such a bool
            bad = bytearray(data)
            flat = np.ravel_multi_index(index, arr.shape, order="F" if
                                        np.isfortran(arr) else "C")
            bad[offset + flat] = int(rng.integers(2, 256))
            return bytes(bad), "the array is a bool array holding bytes other than 0 and 1."
        low = -128 if arr.dtype.kind == "i" else 2
        value = int(rng.choice([v for v in range(low, 128) if v not in (0, 1)]))
        arr = arr.copy()
        arr[index] = value
        return npy_bytes(arr), (f"the array must contain only 0/1 tokens; found 1 other "
                                f"value(s), e.g. {value}.")
    if kind == "float-dtype":
        dtype = np.dtype(rng.choice(["<f2", "<f4", "<f8", ">f8"]))
        return npy_bytes(arr.astype(dtype)), (f"the array has the dtype {dtype}; expected "
                                               "bool or integer 0/1 tokens.")
    if kind == "not-3d":
        bad = rng.choice(4)
        arr = [arr.reshape(arr.shape[0], -1), arr[None], arr.reshape(-1),
               arr[:, :, :0]][bad]
        return npy_bytes(arr), ("a family is a non-empty array of shape (n_samples, "
                                "seq_len, n_bits) of 0/1 tokens; got shape "
                                f"{arr.shape}, dtype {arr.dtype}.")
    raise AssertionError(kind)


NPY_KINDS = ["valid", "body-cut", "bytes-appended", "header-cut", "magic-changed",
             "version-changed", "value-not-0-1", "float-dtype", "not-3d"]


def loads_or_is_refused_as_built(path, expected):
    """Load ``path``: the family that was written, or a one-line ValueError that starts
    with the file's name and holds the ``expected`` text; the file is unchanged."""
    before = path.read_bytes()
    if isinstance(expected, str):
        with pytest.raises(ValueError) as info:
            load_family(path)
        message = str(info.value)
        assert message.startswith(f"{path}: ") and "\n" not in message, message
        assert expected in message, (expected, message)
    else:
        got = load_family(path)
        if isinstance(expected, np.ndarray):
            assert isinstance(got, np.ndarray) and got.dtype.isnative
            assert got.dtype == expected.dtype.newbyteorder("=")
            assert got.shape == expected.shape and (got == expected).all()
        else:
            tokens, ids, counts = expected
            assert isinstance(got, CompactFamily)
            for have, want in ((got.tokens, tokens), (got.token_ids, ids),
                               (got.counts, counts)):
                assert have.shape == want.shape and (have == want).all()
    assert path.read_bytes() == before


@pytest.mark.parametrize("kind", NPY_KINDS)
def test_seeded_npy_files_of_each_kind_get_their_documented_outcome(tmp_path, kind):
    for seed in SEEDS:
        data, expected = npy_case(kind, np.random.default_rng([seed, NPY_KINDS.index(kind)]))
        loads_or_is_refused_as_built(write(tmp_path, f"f{seed}.npy", data), expected)


def npz_case(kind, rng):
    """``(file bytes, expected)``: the arrays for ``"valid"``, else the text of the
    refusal."""
    tokens, ids, counts, N = random_compact(rng, 2 if kind == "token-twice-in-a-row" else 1)
    T, (n, k) = len(tokens), ids.shape
    compression = int(rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
    members = dict(format=np.array(NPZ_FORMAT), version=np.array(NPZ_VERSION),
                   tokens=tokens, token_ids=ids, counts=counts)
    r = int(rng.integers(0, n))
    used = int((ids[r] >= 0).sum())                  # token slots of row r: 0 .. used - 1
    expected = None
    if kind == "valid":
        if rng.random() < 0.5:
            del members["version"]                    # read as version 1
        members.update(tokens=tokens.astype(rng.choice(["?", "u1", ">i8"])),
                       token_ids=ids.astype(rng.choice(["i1", "<i4", ">i8"])),
                       counts=counts.astype(rng.choice(["u1", ">u4", "<i8"])))
        expected = (tokens, ids, counts)
    elif kind == "member-missing":
        name = str(rng.choice(["format", "tokens", "token_ids", "counts"]))
        del members[name]
        expected = f"an .npz file without {name}; a compact family holds"
    elif kind == "member-unknown":
        name = str(rng.choice(["extra", "X", "labels", "Tokens"]))
        members[name] = np.zeros(2)
        expected = f"unknown array(s) '{name}.npy'; a compact family holds only"
    elif kind == "marker-changed":
        letters = list("abcdefghijklmnopqrstuvwxyz-")
        text = "".join(rng.choice(letters, size=int(rng.integers(0, 30))))
        members["format"] = np.array(text)
        expected = f"its format marker is {text!r}, not {NPZ_FORMAT!r}"
    elif kind == "version-changed":
        version = int(rng.choice([0, 2, rng.integers(3, 1000)]))
        members["version"] = np.array(version)
        expected = (f"compact family format version {version}; this version of "
                    "minip-learn reads version 1.")
    elif kind == "id-above-range":
        bad = T + int(rng.choice([0, 0, 1, 99]))          # T: the first id out of range
        ids[r, int(rng.integers(0, used))] = bad
        expected = f"token_ids holds {bad}, outside -1..{T - 1} (-1 is padding; "
    elif kind == "id-below-padding":
        bad = -2 - int(rng.choice([0, 0, 1, 99]))
        ids[r, int(rng.integers(0, k))] = bad
        expected = f"token_ids holds {bad}, outside -1..{T - 1} (-1 is padding; "
    elif kind == "count-negative":
        counts[r, int(rng.integers(0, used))] = -int(rng.choice([1, 1, 2, 99]))
        expected = f"counts holds a negative multiplicity (sequence {r})."
    elif kind == "count-zero-or-padding-counted":
        if used < k and rng.random() < 0.5:
            counts[r, int(rng.integers(used, k))] = int(rng.choice([1, 1, 4]))
        else:
            counts[r, int(rng.integers(0, used))] = 0
        expected = (f"sequence {r}: counts must be 0 exactly at padding (token_ids == -1) "
                    "and >= 1 elsewhere.")
    elif kind == "token-twice-in-a-row":
        a, b = sorted(rng.choice(used, size=2, replace=False))
        ids[r, b] = ids[r, a]
        expected = f"sequence {r} lists token {ids[r, a]} twice in token_ids; merge"
    elif kind == "row-length-differs":
        r = int(rng.integers(1, n))
        slot = int(rng.integers(0, (ids[r] >= 0).sum()))
        d = int(rng.choice([1 - int(counts[r, slot]), 1, 2, 3]) or 4)  # the count stays >= 1
        counts[r, slot] += d
        expected = (f"counts must sum to the same sequence length in every row; row 0 "
                    f"sums to {N}, row {r} to {N + d}.")
    elif kind == "token-repeated":
        a, b = rng.choice(T, size=2, replace=False)
        tokens = tokens.copy()
        tokens[b] = tokens[a]
        members["tokens"] = tokens
        expected = "tokens holds a token twice; the tokens of a compact family must be"
    elif kind == "token-not-0-1":
        value = int(rng.integers(2, 256))
        tokens = tokens.copy()
        tokens[int(rng.integers(0, T)), int(rng.integers(0, tokens.shape[1]))] = value
        members["tokens"] = tokens
        expected = (f"tokens must contain only 0/1 tokens; found 1 other value(s), "
                    f"e.g. {value}.")
    data = npz_bytes(members, compression=compression)
    if kind == "archive-cut":
        # the archive ends with its 22-byte end record (no comment), whose signature
        # occurs nowhere else: every cut leaves no complete end record
        assert data.index(b"PK\x05\x06") == len(data) - 22
        cut = int(rng.integers(0, len(data)))
        data = data[:cut]
        expected = ("a corrupt or truncated .npz archive (BadZipFile: File is not a zip "
                    "file).")
        if cut < 4:  # not even the zip signature: not recognised as a family file
            expected = ("not a .npy array or an .npz compact family (it starts with "
                        f"{data!r}).")
    elif kind == "stored-byte-flipped":
        data = npz_bytes(members, compression=zipfile.ZIP_STORED)
        name = str(rng.choice(["format", "tokens", "token_ids", "counts"]))
        info = zipfile.ZipFile(io.BytesIO(data)).getinfo(f"{name}.npy")
        start = info.header_offset + 30 + len(info.filename) + \
            struct.unpack("<H", data[info.header_offset + 28:info.header_offset + 30])[0]
        body = start + 10 + struct.unpack("<H", data[start + 8:start + 10])[0]
        at = int(rng.integers(body, start + info.file_size))
        data = bytearray(data)
        data[at] ^= 1 << int(rng.integers(0, 8))
        data = bytes(data)
        expected = (f"a corrupt or truncated .npz archive (BadZipFile: Bad CRC-32 for file "
                    f"'{name}.npy').")
    return data, expected


NPZ_KINDS = ["valid", "member-missing", "member-unknown", "marker-changed",
             "version-changed", "id-above-range", "id-below-padding", "count-negative",
             "count-zero-or-padding-counted", "token-twice-in-a-row", "row-length-differs",
             "token-repeated", "token-not-0-1", "archive-cut", "stored-byte-flipped"]


@pytest.mark.parametrize("kind", NPZ_KINDS)
def test_seeded_npz_files_of_each_kind_get_their_documented_outcome(tmp_path, kind):
    for seed in SEEDS:
        data, expected = npz_case(kind, np.random.default_rng([seed, NPZ_KINDS.index(kind)]))
        loads_or_is_refused_as_built(write(tmp_path, f"f{seed}.npz", data), expected)


# ------------------------------------------------------------------- fuzzing
def check_loaded(path):
    """Load ``path``: a valid family, or a one-line ValueError naming the file; the file
    is unchanged."""
    before = path.read_bytes()
    try:
        got = load_family(path)
    except ValueError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        got = None
    assert path.read_bytes() == before
    if isinstance(got, CompactFamily):
        assert CompactFamily(got.tokens, got.token_ids, got.counts) == got
    elif got is not None:
        assert np.array_equal(check_family(got, integer=True), got)
    return got


def mutate_bytes(data, draw):
    """Truncate, flip bits, overwrite a run or append to ``data``."""
    data = bytearray(data)
    kind = draw(st.sampled_from(["truncate", "flip", "overwrite", "append"]))
    if kind == "truncate":
        return bytes(data[:draw(st.integers(0, len(data) - 1))])
    if kind == "append":
        return bytes(data) + draw(st.binary(min_size=1, max_size=64))
    at = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            data[at] ^= 1 << draw(st.integers(0, 7))
            at = (at + draw(st.integers(0, 64))) % len(data)
        return bytes(data)
    run = draw(st.binary(min_size=1, max_size=16))
    data[at:at + len(run)] = run
    return bytes(data[:len(data)])


HEADERS = st.fixed_dictionaries({
    "descr": st.sampled_from(["|u1", "|b1", "<i8", ">i2", "<f8", "<c16", "|O", "<U1",
                              "|V3", [("a", "<i4")], ("<i2", (2,)), "<M8[s]", "xyz", 3]),
    "fortran_order": st.sampled_from([False, True, 1, None]),
    "shape": st.one_of(
        st.tuples(*[st.integers(0, 2**40)] * 3),
        st.lists(st.integers(-2, 12), max_size=4).map(tuple),
        st.sampled_from([(10**6, 10**3, 10**3), (2**62, 2**62, 2**62), [4, 7, 4], "x"])),
})


@st.composite
def npy_files(draw):
    arr = X[:draw(st.integers(1, len(X)))]
    kind = draw(st.sampled_from(["bytes", "header", "dtype"]))
    if kind == "dtype":
        dtype = draw(st.sampled_from(["u1", "?", ">i4", "<u8", "f4", "c8", "U1", "i1"]))
        return npy_bytes(arr.astype(dtype))
    data = npy_bytes(arr, version=draw(st.sampled_from([(1, 0), (2, 0)])))
    if kind == "bytes":
        return mutate_bytes(data, draw)
    body = draw(st.sampled_from([arr.tobytes(), b"", bytes(100), arr.tobytes()[:-1]]))
    header = draw(HEADERS)
    try:
        return npy_bytes(header=header, body=body)
    except (ValueError, TypeError):                   # numpy will not write it: raw text
        return npy_bytes(X)[:10] + repr(header).encode()[:200] + b"\n" + body


@st.composite
def npz_files(draw):
    members = family_members()
    kind = draw(st.sampled_from(["bytes", "members", "dtype", "header"]))
    compression = draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
    names = sorted(members)
    if kind == "members":
        for _ in range(draw(st.integers(1, 3))):
            op = draw(st.sampled_from(["drop", "add", "rename"]))
            name = draw(st.sampled_from(names))
            if op == "drop":
                members.pop(name, None)
            elif op == "add":
                members[draw(st.sampled_from(["extra", "X", "tokens.npy.npy", "a.b"]))] = \
                    np.zeros(2)
            elif name in members:
                members[draw(st.sampled_from(names + ["Tokens", "counts "]))] = \
                    members.pop(name)
    elif kind == "dtype":
        name = draw(st.sampled_from(names))
        dtype = draw(st.sampled_from(["u1", "?", ">i4", "<u8", "f4", "c8", "U1", "O"]))
        try:
            members[name] = members[name].astype(dtype)
        except (ValueError, TypeError):
            members[name] = np.zeros(3, dtype=dtype)
        if dtype == "O":
            buf = io.BytesIO()
            np.lib.format.write_array(buf, members[name], allow_pickle=True)
            members[name] = buf.getvalue()
    elif kind == "header":
        name = draw(st.sampled_from(names))
        header = draw(HEADERS)
        body = draw(st.sampled_from([members[name].tobytes(), b"", bytes(100)]))
        try:
            members[name] = npy_bytes(header=header, body=body)
        except (ValueError, TypeError):
            members[name] = npy_bytes(X)[:10] + repr(header).encode()[:200] + body
    data = npz_bytes(members, compression=compression)
    return mutate_bytes(data, draw) if kind == "bytes" else data


# function_scoped_fixture: the examples share tmp_path, and each one overwrites the single
# file it reads (write() truncates it), so no example sees another's bytes
FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=npy_files())
def test_fuzzed_npy_files_load_as_valid_families_or_are_refused(tmp_path, data):
    check_loaded(write(tmp_path, "fuzz.npy", data))


@FUZZ
@given(data=npz_files())
def test_fuzzed_npz_files_load_as_valid_families_or_are_refused(tmp_path, data):
    check_loaded(write(tmp_path, "fuzz.npz", data))
