"""Returning freed heap memory to the operating system (glibc only; numpy and torch).

Large arrays freed in numpy or torch go back to glibc's heap, which keeps them: after
phases that allocate and free blocks of many sizes (the epochs of a fit, the phases of
a certificate of tens of millions of sequences) the resident size can stay gigabytes
above what is live. :func:`malloc_trim` hands the free pages back; :func:`trim_heap`
calls it once.
"""

import ctypes

__all__ = ["heap_free_bytes", "malloc_trim", "trim_heap"]


def _glibc(name):
    """The C function ``name`` of glibc, or None (another C library, or an older glibc)."""
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def malloc_trim():
    """A function returning freed heap memory to the OS (glibc's ``malloc_trim``), or None.

    The batched forward/backward allocates and frees large blocks of varying size every
    epoch; glibc keeps the freed ones in its heap, and over thousands of epochs the
    resident size of a rank-128 ensemble grew to several GB (15 GB peak in the full
    witness run) although the live tensors need a few hundred MB.
    """
    trim = _glibc("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_free_bytes():
    """A function returning the bytes glibc's heap holds free (``mallinfo2().fordblks``,
    glibc >= 2.33), or None."""
    info = _glibc("mallinfo2")
    if info is None:
        return None
    info.restype = _MallInfo2
    return lambda: int(info().fordblks)


def trim_heap():
    """Return the heap's free memory to the OS now (glibc; elsewhere nothing)."""
    trim = malloc_trim()
    if trim is not None:
        trim()
