"""Files written complete or not at all, and family files read without trusting them.

Results records, stored fits and certificates are written to a temporary file in the
same folder and moved into place with :func:`os.replace` (atomic on POSIX and Windows):
an interrupted write leaves the previous file, or none, but never a truncated one.

Family files (an ``.npy`` array of sequences or a compact ``.npz`` family) are read by
:func:`read_family_file`, which checks every declared size against the file and the
caller's limits before it allocates, never unpickles, and refuses anything else with a
:class:`ValueError` naming the file. What the arrays must hold is the caller's to check
(:func:`minip_learn.compact.load_family` passes its own checks and limits).
"""

import ast
import gzip
import hashlib
import math
import os
import socket
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["TMP_PREFIX", "HOST_TAG", "read_family_file", "tmp_path", "write_atomic",
           "write_text_atomic"]

#: Prefix of the temporary files of :func:`write_atomic`.
TMP_PREFIX = ".tmp-"
#: This host's tag in temporary names (several machines may share a results folder).
HOST_TAG = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def tmp_path(path):
    """Temporary name of a file being written: ``.tmp-<name>.<host tag>-<pid>``."""
    path = Path(path)
    return path.with_name(f"{TMP_PREFIX}{path.name}.{HOST_TAG}-{os.getpid()}")


def write_atomic(path, write):
    """Call ``write(tmp)`` and move ``tmp`` to ``path``: the file exists complete or not.

    The temporary file is removed if anything (an error, Ctrl-C) stops the write.

    Parameters
    ----------
    path : str or path
    write : callable
        Called with the temporary path; writes the whole file there.
    """
    path = Path(path)
    tmp = tmp_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path, text):
    """Write ``text`` to ``path`` atomically, gzip-compressed when the name ends in ``.gz``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from minip_learn._io import write_text_atomic
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "note.txt"
    >>> write_text_atomic(path, "hello")
    >>> path.read_text()
    'hello'
    """
    path = Path(path)

    def write(tmp):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(tmp, "wt") as fh:
            fh.write(text)
            fh.flush()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())

    write_atomic(path, write)


# -- family files -------------------------------------------------------------------
class _Refused(Exception):
    """A problem of a family file; :func:`read_family_file` turns it into a ValueError
    that names the file."""


#: the first bytes of an ``.npy`` file and of a zip archive (``.npz``; the second is an
#: empty archive)
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
#: the longest ``.npy`` header read (numpy's own bound)
_NPY_MAX_HEADER = 10000
#: the most bytes deflate produces per compressed byte (plus a small allowance)
_DEFLATE_MAX_RATIO = 1032
_READ_CHUNK = 1 << 24
#: the arrays of a compact family file: all required but ``version``
_NPZ_ARRAYS = ("format", "version", "tokens", "token_ids", "counts")
_NPZ_REQUIRED = ("format", "tokens", "token_ids", "counts")
#: what the zip layer raises for a corrupt or truncated archive
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError,
               struct.error, NotImplementedError, ValueError, OverflowError)


def _one_line(text, limit=200):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class _FamilyRules:
    """The caller's limits and checks of :func:`read_family_file`."""

    max_bytes: int
    max_seq_len: int
    npz_format: str
    npz_version: int
    check_array: object
    make_family: object


def read_family_file(path, *, max_bytes, max_seq_len, npz_format, npz_version,
                     check_array, make_family):
    """Read a family file: an ``.npy`` array of sequences or a compact ``.npz`` family.

    The file's kind is told by its first bytes, not its name. Headers, dtypes, shapes
    and declared sizes are checked before anything is allocated, and nothing is
    unpickled; the rules are those of :func:`minip_learn.compact.load_family`.

    Parameters
    ----------
    path : str or path-like
        The file. It is only read.
    max_bytes : int
        The most bytes of array data the file may declare (all arrays together).
    max_seq_len : int
        The longest sequence length of an ``.npy`` array.
    npz_format : str
        The format marker an ``.npz`` file must hold (its ``format`` array).
    npz_version : int
        The format version an ``.npz`` file must declare, if it declares one.
    check_array : callable
        Called with the array of an ``.npy`` file; returns the family, or raises a
        :class:`ValueError` naming the problem.
    make_family : callable
        Called with the arrays ``tokens``, ``token_ids`` and ``counts`` of an ``.npz``
        file as keyword arguments; returns the family, or raises a :class:`ValueError`.

    Returns
    -------
    family : object
        What ``check_array`` or ``make_family`` returns.

    Raises
    ------
    ValueError
        One line, ``"<path>: <problem>"``, for a file that cannot be read, is neither
        format, breaks a rule, is corrupt or cut short, or whose arrays the caller's
        checks refuse.

    Examples
    --------
    >>> import numpy as np, tempfile, pathlib
    >>> from minip_learn._io import read_family_file
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "family.npy"
    >>> np.save(path, np.eye(3, dtype=np.uint8)[None])
    >>> X = read_family_file(path, max_bytes=2**20, max_seq_len=16, npz_format="",
    ...                      npz_version=1, check_array=np.asarray, make_family=dict)
    >>> X.shape
    (1, 3, 3)
    """
    rules = _FamilyRules(max_bytes, max_seq_len, npz_format, npz_version, check_array,
                         make_family)
    path = Path(path)
    where = str(path) if str(path).isprintable() else ascii(str(path))
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            fh.seek(0)
            if head.startswith(_NPY_MAGIC):
                return _load_npy(fh, rules)
            if head[:4] in _ZIP_MAGICS:
                return _load_npz(fh, rules)
            raise _Refused(f"not a .npy array or an .npz compact family (it starts with "
                           f"{head!r}).")
    except _Refused as exc:
        raise ValueError(f"{where}: {_one_line(exc, 400)}") from None
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it ({_one_line(exc)}).") from None


def _read_exact(fh, n, what):
    data = fh.read(n)
    if len(data) != n:
        raise _Refused(f"it ends inside {what} (cut short).")
    return data


def _read_header(fh, what):
    """Shape, dtype, Fortran order and length of the ``.npy`` header at ``fh``."""
    magic = _read_exact(fh, 8, f"the .npy magic string of {what}")
    if not magic.startswith(_NPY_MAGIC):
        raise _Refused(f"{what} is not a .npy array (bad magic string).")
    version = (magic[6], magic[7])
    if version not in ((1, 0), (2, 0)):
        raise _Refused(f"{what} is a .npy array of format version {version[0]}."
                       f"{version[1]}; versions 1.0 and 2.0 are read.")
    fmt = "<H" if version == (1, 0) else "<I"
    size = struct.calcsize(fmt)
    length = struct.unpack(fmt, _read_exact(fh, size, f"the .npy header of {what}"))[0]
    if length > _NPY_MAX_HEADER:
        raise _Refused(f"{what} declares a .npy header of {length} bytes, more than "
                       f"{_NPY_MAX_HEADER}.")
    text = _read_exact(fh, length, f"the .npy header of {what}").decode("latin1")
    try:
        header = ast.literal_eval(text)
    except Exception:  # any failure of parsing untrusted text: refused
        header = None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise _Refused(f"{what} has an unreadable .npy header {_one_line(repr(text), 80)} "
                       "(expected a dict with keys descr, fortran_order and shape).")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise _Refused(f"{what} declares the shape {_one_line(repr(shape), 80)} "
                       "(expected a tuple of integers >= 0).")
    if not isinstance(fortran, bool):
        raise _Refused(f"{what} declares fortran_order={_one_line(repr(fortran), 80)} "
                       "(expected True or False).")
    try:
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except Exception:  # any failure of parsing an untrusted dtype: refused
        raise _Refused(f"{what} declares the unknown dtype "
                       f"{_one_line(repr(header['descr']), 80)}.") from None
    return shape, dtype, fortran, 8 + size + length


def _check_dtype(dtype, what, kinds, expected):
    if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in kinds:
        kind = "structured " if dtype.fields is not None or dtype.subdtype is not None \
            else ""
        raise _Refused(f"{what} has the {kind}dtype {_one_line(dtype, 80)}; expected "
                       f"{expected}.")


def _read_body(fh, shape, dtype, fortran, what):
    """The array body of declared (and checked) ``shape`` and ``dtype`` at ``fh``."""
    nbytes = math.prod(shape) * dtype.itemsize
    try:
        buf = np.empty(nbytes, dtype=np.uint8)
    except MemoryError:
        raise _Refused(f"{what} takes {nbytes} bytes, more than this machine can "
                       "allocate.") from None
    view, pos = memoryview(buf), 0
    while pos < nbytes:
        n = fh.readinto(view[pos:pos + _READ_CHUNK])
        if not n:
            raise _Refused(f"{what} ends after {pos} of its {nbytes} bytes (cut short).")
        pos += n
    del view
    if fh.read(1):
        raise _Refused(f"{what} has bytes after its {nbytes} bytes of data.")
    if dtype.kind == "b" and nbytes and buf.max() > 1:
        raise _Refused(f"{what} is a bool array holding bytes other than 0 and 1.")
    arr = buf.view(dtype).reshape(shape, order="F" if fortran else "C")
    if not dtype.isnative:
        try:
            arr = arr.astype(dtype.newbyteorder("="))
        except MemoryError:
            raise _Refused(f"{what} takes {nbytes} bytes, more than this machine can "
                           "convert to native byte order.") from None
    return arr


def _check_nbytes(shape, dtype, held, what, max_bytes):
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes != held:
        raise _Refused(f"{what} declares {nbytes} bytes of data (shape {shape}, dtype "
                       f"{dtype}) but holds {held}.")
    if nbytes > max_bytes:
        raise _Refused(f"{what} declares {nbytes} bytes of data, above MAX_FAMILY_BYTES = "
                       f"{max_bytes}.")


def _load_npy(fh, rules):
    what = "the array"
    shape, dtype, fortran, offset = _read_header(fh, what)
    if len(shape) != 3 or 0 in shape:
        raise _Refused(f"a family is a non-empty array of shape (n_samples, seq_len, "
                       f"n_bits) of 0/1 tokens; got shape {shape}, dtype "
                       f"{_one_line(dtype, 80)}.")
    _check_dtype(dtype, what, "biu", "bool or integer 0/1 tokens")
    if shape[1] > rules.max_seq_len:
        raise _Refused(f"the array has seq_len={shape[1]}, above MAX_SEQ_LEN = "
                       f"{rules.max_seq_len}.")
    _check_nbytes(shape, dtype, os.fstat(fh.fileno()).st_size - offset, what,
                  rules.max_bytes)
    arr = _read_body(fh, shape, dtype, fortran, what)
    try:
        return rules.check_array(arr)
    except ValueError as exc:
        raise _Refused(str(exc)) from None


def _load_npz(fh, rules):
    try:
        with zipfile.ZipFile(fh) as zf:
            return _read_members(zf, rules)
    except _Refused:
        raise
    except _ZIP_ERRORS as exc:
        raise _Refused(f"a corrupt or truncated .npz archive ({type(exc).__name__}: "
                       f"{_one_line(exc)}).") from None


def _read_members(zf, rules):
    infos = zf.infolist()
    names = [info.filename for info in infos]
    missing = [k for k in _NPZ_REQUIRED if f"{k}.npy" not in names]
    if missing:
        raise _Refused(f"an .npz file without {', '.join(missing)}; a compact family holds "
                       "format, tokens, token_ids and counts (and optionally version).")
    unknown = [n for n in names if n not in [f"{k}.npy" for k in _NPZ_ARRAYS]]
    if unknown:
        shown = ", ".join(_one_line(repr(n), 40) for n in unknown[:5])
        raise _Refused(f"unknown array(s) {shown}"
                       f"{' and more' if len(unknown) > 5 else ''}; a compact family holds "
                       "only format, version, tokens, token_ids and counts.")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _Refused(f"the archive holds {', '.join(twice)} more than once.")
    by_key = {info.filename[:-4]: info for info in infos}
    for key, info in by_key.items():
        what = f"array {key}"
        if info.flag_bits & 0x1:
            raise _Refused(f"{what} is encrypted.")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _Refused(f"{what} uses zip compression method {info.compress_type}; "
                           "expected stored or deflated.")
        most = info.compress_size if info.compress_type == zipfile.ZIP_STORED else \
            _DEFLATE_MAX_RATIO * info.compress_size + 1024
        if info.file_size > most:
            raise _Refused(f"{what} declares {info.file_size} bytes from "
                           f"{info.compress_size} stored bytes (a corrupt archive).")
    total = sum(info.file_size for info in infos)
    if total > rules.max_bytes:
        raise _Refused(f"its arrays declare {total} bytes, above MAX_FAMILY_BYTES = "
                       f"{rules.max_bytes}.")
    marker = _read_member(zf, by_key["format"], "U", 0, "a string", rules.max_bytes)
    # compared as code points: the file's may be no characters at all
    codes = np.trim_zeros(np.frombuffer(marker.tobytes(), dtype=np.uint32), "b").tolist()
    if codes != [ord(c) for c in rules.npz_format]:
        text = "".join(chr(c) if c < 0x110000 else "\ufffd" for c in codes[:60])
        raise _Refused(f"its format marker is {_one_line(repr(text), 80)}, not "
                       f"{rules.npz_format!r}: not a compact family file.")
    if "version" in by_key:
        version = int(_read_member(zf, by_key["version"], "iu", 0, "an integer",
                                   rules.max_bytes))
        if version != rules.npz_version:
            raise _Refused(f"compact family format version {version}; this version of "
                           f"minip-learn reads version {rules.npz_version}.")
    arrays = {key: _read_member(zf, by_key[key], kinds, 2, expected, rules.max_bytes)
              for key, kinds, expected in (("tokens", "biu", "bool or integer 0/1 tokens"),
                                           ("token_ids", "iu", "integers"),
                                           ("counts", "iu", "integers"))}
    try:
        return rules.make_family(**arrays)
    except ValueError as exc:
        raise _Refused(str(exc)) from None


def _read_member(zf, info, kinds, ndim, expected, max_bytes):
    what = f"array {info.filename[:-4]}"
    with zf.open(info) as member:
        shape, dtype, fortran, offset = _read_header(member, what)
        _check_dtype(dtype, what, kinds, expected)
        if len(shape) != ndim:
            raise _Refused(f"{what} must be {ndim}-D; got shape {shape}.")
        _check_nbytes(shape, dtype, info.file_size - offset, what, max_bytes)
        return _read_body(member, shape, dtype, fortran, what)
