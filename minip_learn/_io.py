"""Writing files so that they exist complete or not at all, never half-written.

Results records, stored fits and certificates are written to a temporary file in the
same folder and moved into place with :func:`os.replace` (atomic on POSIX and Windows):
an interrupted write leaves the previous file, or none, but never a truncated one.
"""

import gzip
import hashlib
import os
import socket
from pathlib import Path

__all__ = ["TMP_PREFIX", "HOST_TAG", "tmp_path", "write_atomic", "write_text_atomic"]

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
