"""Returning freed heap memory to the operating system (glibc only; numpy and torch),
and the memory this machine has available (:func:`available_memory`).

Large arrays freed in numpy or torch go back to glibc's heap, which keeps them: after
phases that allocate and free blocks of many sizes (the epochs of a fit, the phases of
a certificate of tens of millions of sequences) the resident size can stay gigabytes
above what is live. :func:`malloc_trim` hands the free pages back; :func:`trim_heap`
calls it once.
"""

import ctypes
import os

__all__ = ["available_memory", "heap_free_bytes", "malloc_trim", "trim_heap"]


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


def _meminfo_available(path="/proc/meminfo"):
    """``MemAvailable`` of Linux's ``/proc/meminfo`` in bytes, or None."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    value, unit = line.split()[1:3]
                    return int(value) * (1024 if unit.lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory():
    """Bytes of memory this machine can give a new allocation without swapping, or None.

    :mod:`psutil`'s ``virtual_memory().available`` when it is installed, else Linux's
    ``MemAvailable`` (free memory plus the page cache the kernel can reclaim), else the
    free physical pages (``os.sysconf``); None where none of them can be read.

    Returns
    -------
    int or None

    Examples
    --------
    >>> from minip_learn._memory import available_memory
    >>> free = available_memory()
    >>> free is None or free > 0
    True
    """
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, AttributeError, OSError):
        pass
    free = _meminfo_available()
    if free is not None:
        return free
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None
