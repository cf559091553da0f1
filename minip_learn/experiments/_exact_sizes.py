"""One size of the exact recipe, measured in a fresh process: the family, its
certificate (written, read back and verified) and the peak memory of the certify."""

import gzip
import inspect
import json
import multiprocessing
import time

from .._memory import trim_heap
from ..compact import load_family
from ..datasets import make_witness_suite
from ..theory import Certificate, certify, verify_certificate

#: The arguments of make_witness_suite: what ``suite_params`` keeps of ``suite.params``
_SUITE_ARGS = tuple(inspect.signature(make_witness_suite).parameters)


def _peak_rss_mb():
    """Peak resident set size in MB: ``VmHWM`` (a spawned process's ``ru_maxrss``
    starts at its parent's), NaN without /proc."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(x.split()[1]) / 1024 for x in fh if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return float("nan")


def _reset_peak():
    """Start ``VmHWM`` again from the current resident size (Linux; else nothing)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def measure_in_process(n_bits, suite, folder):
    """Build, certify, write and verify one size (in a fresh process): its row and,
    without ``folder``, its family (else None: read back from ``folder/family.npz``)."""
    imported = _peak_rss_mb()
    suite = make_witness_suite(n_bits, **suite)
    build_peak = _peak_rss_mb()             # the build and its own certify, targets...
    family, params, constructive = suite.family, suite.params, suite.constructive_rank
    del suite                                # its targets and certificate: not kept
    trim_heap()
    _reset_peak()                            # from here: the certify, the family held
    t0 = time.perf_counter()
    rank, cert = certify(family, return_certificate=True)
    certify_time = time.perf_counter() - t0
    peak = _peak_rss_mb()
    text = cert.to_json()
    del cert
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        family.save(folder / "family.npz")
        with gzip.open(folder / "certificate.json.gz", "wt", compresslevel=6) as fh:
            fh.write(text)
        family = load_family(folder / "family.npz")       # verify what was written
        with gzip.open(folder / "certificate.json.gz", "rt") as fh:
            text = fh.read()
    cert = Certificate.from_json(text)
    del text
    t0 = time.perf_counter()
    verify_certificate(cert, family)
    verify_time = time.perf_counter() - t0
    code = params["code"]
    params = {k: v for k, v in params.items() if k in _SUITE_ARGS}
    row = dict(
        n_bits=n_bits, code=code, seq_len=family.seq_len,
        n_queries=int(params["n_queries"]), n_sequences=len(family),
        certified_min_rank=int(rank), constructive_rank=int(constructive),
        exact=bool(rank == constructive),
        suite_params=json.dumps(params, sort_keys=True),
        certificate=None if folder is None else f"{folder.name}/certificate.json.gz",
        family=None if folder is None else f"{folder.name}/family.npz",
        certify_time=certify_time, verify_time=verify_time, peak_memory=peak,
        build_peak_memory=build_peak,
        import_memory=imported)
    return row, (family if folder is None else None)


class SizeFailed(Exception):
    """A size whose measuring process ran out of memory or ended without a result."""


def _child(conn, n_bits, suite, folder):
    """Target of the measuring process: sends ``(status, payload)`` back."""
    try:
        conn.send(("ok", measure_in_process(n_bits, suite, folder)))
    except MemoryError as exc:
        conn.send(("failed", f"MemoryError: {exc}".rstrip(": ")))
    except Exception as exc:  # raised again in the parent
        conn.send(("raise", exc))
    finally:
        conn.close()


def in_fresh_process(n_bits, suite, folder):
    """:func:`measure_in_process` in a spawned process of its own, so that its peak
    memory is that size's alone; :class:`SizeFailed` when it runs out of memory or
    ends without a result (e.g. killed by the system's out-of-memory killer)."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, n_bits, suite, folder), daemon=True)
    proc.start()
    send.close()
    try:
        status, payload = recv.recv()
    except EOFError:
        proc.join()
        killed = "; killed: out of memory?" if proc.exitcode == -9 else ""
        raise SizeFailed(f"the measuring process ended without a result (exit code "
                          f"{proc.exitcode}{killed})") from None
    finally:
        recv.close()
        proc.join(timeout=60)
        proc.terminate()   # only a process that hangs is still there
    if status == "raise":
        raise payload
    if status == "failed":
        raise SizeFailed(payload)
    return payload
