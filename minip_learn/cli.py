"""Command line: ``minip-learn reproduce witness|length|ood|beyond|maps|scaling|exact|mixers|all``.

``minip-learn reproduce docs-artifacts [--out docs/_static] [--only NAME ...] [--list]``
regenerates the recipe outputs committed under ``docs/_static`` (listed in
:data:`~minip_learn.experiments.DOCS_ARTIFACTS`), each with the settings it was made
with.

``minip-learn certify FAMILY.npy [--out CERT.json] [--force]`` prints the certified
minimum rank of a family and writes its certificate: an existing file is replaced only
with ``--force`` and the family itself never, and the file is written whole or not at
all (``--query last``: final-query Min-IP, only each sequence's final position;
``--positional``: also for position-dependent maps, from the S3 the family holds in
every order of its keys). ``minip-learn verify FAMILY.npy CERT.json`` checks a
certificate independently (exit status 0 valid, 1 rejected, 2 a file that cannot be
read, named in one line). A family is an ``.npy`` array of sequences or a compact
``.npz`` family (:meth:`minip_learn.compact.CompactFamily.save`); certificates ending in
``.gz`` are gzip-compressed. Both show their stages on a progress bar when standard
error is a terminal (``--no-progress``: never).

``witness`` and ``length`` are the paper's experiments (``all`` runs those two);
``ood`` (out-of-distribution scaling), ``beyond`` (variants outside the theorem) and
``maps`` (a leaderboard of the registered feature maps) go beyond the paper and
regenerate the docs' results page; ``scaling`` measures the rank sandwich across the
number of bits ``m`` (docs: the scaling page); ``exact`` the exact minimum rank of the
R9 families (docs: the exact minimum rank page); ``full-task`` bounds ``r*(m)``, the
minimum rank that solves every length-3 sequence of ``m``-bit tokens, from both sides
(docs: the theory page).

Also available as ``python -m minip_learn``. Writes, per experiment, ``results.csv``
(one row per fit), ``summary.csv``, ``summary.md`` and PNG figures into
``--out/<experiment>/`` (fits are stored under ``--out/<experiment>/runs/``, so an
interrupted run resumes where it stopped), with ``provenance.json`` (library version,
git commit, this command line, settings, date, machine), prints the markdown summary
and says where the files are.

Exit status: 0 when every expected behaviour was observed, 1 when one was not or a
file could not be written, 2 on a bad option or an output folder that cannot be
written (both reported before any fit starts), 130 after Ctrl-C (SIGINT) and 143 after
SIGTERM (the finished fits are kept: the same command resumes).
"""

import argparse
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

__all__ = ["build_parser", "main"]


# -- option types: a bad value is refused by the parser, naming the option ---------------
_DEVICE = re.compile(r"(cpu|cuda|mps)(:\d+)?")


def _devices(text):
    # checked by name here (the parser answers at once, without importing torch); a
    # device this machine does not have is refused by resolve_devices before any fit
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("give a device such as cpu, cuda or cuda:0,cuda:1")
    for item in items:
        if not _DEVICE.fullmatch(item):
            raise argparse.ArgumentTypeError(
                f"unknown device {item!r}; use cpu, cuda, cuda:N or mps")
    return items[0] if len(items) == 1 else items


def _int(text, minimum, what):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}")
    return value


def _int_list(minimum, what):
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}; got {text!r}")
        try:
            return tuple(_int(t, minimum, what) for t in items)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}; got {text!r}") from None

    return parse


def _n_jobs(text):
    value = _int(text, -(10**6), "a nonzero integer (-1: all cores)")
    if value == 0:
        raise argparse.ArgumentTypeError("expected a nonzero integer (-1: all cores); got '0'")
    return value


class _Out(argparse.Action):
    """``--out``, remembering that it was given (docs-artifacts has its own default)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.out_given = True


def build_parser():
    """The :class:`argparse.ArgumentParser` of ``minip-learn``.

    Returns
    -------
    parser : argparse.ArgumentParser

    Examples
    --------
    >>> from minip_learn.cli import build_parser
    >>> build_parser().parse_args(["reproduce", "witness", "--quick"]).quick
    True
    """
    from . import __version__
    from .experiments import DOCS_ARTIFACTS

    parser = argparse.ArgumentParser(
        prog="minip-learn",
        description="Kernel vs softmax attention on Min-IP: reproduce the phase transition.",
    )
    parser.add_argument("--version", action="version", version=f"minip-learn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser(
        "reproduce",
        help="run a reproduction recipe and write figures and tables",
        description="Run a reproduction recipe (minip_learn.experiments) and write "
                    "results.csv, summary.csv, summary.md and PNG figures.",
    )
    rep.add_argument("experiment",
                     choices=["witness", "length", "ood", "beyond", "maps", "scaling", "exact",
                              "mixers", "full-task", "all", "docs-artifacts"],
                     help="witness, length: the paper's experiments; ood, beyond, maps: "
                          "beyond the paper (docs: results page); mixers: sequence "
                          "mixers (GLA, DeltaNet, SSM ...) against the certified rank "
                          "on final-query Min-IP; scaling: the rank "
                          "sandwich across n_bits; full-task: r*(m), the minimum rank for "
                          "every length-3 sequence, bounded from both sides; all: the paper's two (witness, length); "
                          "docs-artifacts: every recipe output committed under "
                          "docs/_static, each with the settings it was made with")
    rep.add_argument("--quick", action="store_true",
                     help="small grid: from about 20 s (witness) to 2 min (ood) on 2 "
                          "cores (default: the full grid)")
    rep.add_argument("--out", default="minip-results", type=Path, action=_Out,
                     help="output folder (default: minip-results/; docs-artifacts: "
                          "docs/_static/)")
    rep.set_defaults(out_given=False)
    rep.add_argument("--n-jobs", type=_n_jobs, default=None,
                     help="parallel fits (default: number of CPU cores; -1 all cores)")
    rep.add_argument("--devices", type=_devices, default=None,
                     help="torch devices: cpu, cuda, or a list such as cuda:0,cuda:1")
    rep.add_argument("--ranks", type=_int_list(1, "positive integers"), default=None,
                     help="override the ranks, e.g. 8,16,64 (mixers: the state sizes; scaling "
                          "searches its ranks itself and refuses the option)")
    rep.add_argument("--seeds", type=_int_list(0, "nonnegative integers"), default=None,
                     help="override the kernel seeds, e.g. 0,1,2")
    rep.add_argument("--max-epochs", type=lambda t: _int(t, 1, "a positive integer"),
                     default=None, help="override max_epochs of every fit")
    rep.add_argument("--check-every", type=lambda t: _int(t, 1, "a positive integer"),
                     default=None, metavar="K",
                     help="read the training figures on the host every K epochs, where "
                          "fits stop (default 1; on a GPU, 10 spares a device sync an "
                          "epoch)")
    rep.add_argument("--no-progress", action="store_true",
                     help="no progress bars (none either when standard error is not a "
                          "terminal)")
    rep.add_argument("--ensemble", action="store_true", default=None,
                     help="train the seeds and ranks (a mixer's state sizes) of each sweep "
                          "as batched ensembles "
                          "(same results, several times cheaper per fit; scaling does "
                          "so by default)")
    docs = rep.add_argument_group("docs-artifacts")
    docs.add_argument("--only", nargs="+", action="extend", choices=list(DOCS_ARTIFACTS),
                      metavar="NAME",
                      help="regenerate these artifacts only: " + ", ".join(DOCS_ARTIFACTS))
    docs.add_argument("--list", action="store_true",
                      help="print what would run, where and about how long; run nothing")
    docs.add_argument("--fresh", action="store_true",
                      help="delete the stored fits of each artifact (runs/, constructions/, "
                           "solvers/) before it runs, so that every fit is computed again")
    _add_certificate_commands(sub)
    return parser


# -- certify / verify ------------------------------------------------------------------
def _add_certificate_commands(sub):
    cert = sub.add_parser(
        "certify", help="certified minimum kernel rank of a family of sequences",
        description="Compute the certified minimum rank of the family in FAMILY (an .npy "
                    "array of shape (n_samples, seq_len, n_bits) with 0/1 values, or an "
                    ".npz compact family: tokens, token_ids, counts) and write the "
                    "certificate as JSON (gzip-compressed when the name ends in .gz). An "
                    "existing file is never replaced without --force, and the family "
                    "itself never.")
    cert.add_argument("family", type=Path, help="the family: a .npy or compact .npz file")
    cert.add_argument("--out", type=Path, default=None,
                      help="certificate file (default: FAMILY.certificate.json)")
    cert.add_argument("--force", action="store_true",
                      help="replace the certificate file if it exists")
    cert.add_argument("--query", choices=("all", "last"), default="all",
                      help="'last': final-query Min-IP, only each sequence's final "
                           "position (default: all)")
    cert.add_argument("--positional", action="store_true",
                      help="with --query last and a .npy family: certify for "
                           "position-dependent maps too, from the S3 sequences held in "
                           "every order of their keys")
    ver = sub.add_parser(
        "verify", help="check a certificate against a family, independently of certify",
        description="Check CERT.json against FAMILY (.npy or compact .npz) with "
                    "minip_learn.theory.verify_certificate; exit status 0 when valid, 1 "
                    "when rejected, 2 when a file cannot be read.")
    ver.add_argument("family", type=Path, help="the family: a .npy or compact .npz file")
    ver.add_argument("certificate", type=Path,
                     help="the certificate: a JSON file (.json.gz: gzip-compressed)")
    ver.add_argument("--query", choices=("all", "last"), default=None,
                     help="'last': final-query Min-IP (default: the certificate's own)")
    for command in (cert, ver):
        command.add_argument("--no-progress", action="store_true",
                             help="no progress bar (none either when standard error is "
                                  "not a terminal)")


# what a damaged or hostile input file can raise while it is read: reported as one line
# naming the file (exit status 2), never as a traceback
_READ_ERRORS = (OSError, EOFError, MemoryError, OverflowError, RecursionError,
                UnicodeDecodeError)


def _reading(path, read):
    """``read()``, with any reading failure turned into a ValueError naming ``path``."""
    import zipfile
    import zlib

    try:
        return read()
    except ValueError:
        raise
    except (*_READ_ERRORS, zipfile.BadZipFile, zlib.error) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ValueError(f"cannot read {path}: {reason}.") from None


def _load_family(path):
    from .compact import load_family

    if not path.is_file():
        raise ValueError(f"family file {path} does not exist or is not a file.")
    return _reading(path, lambda: load_family(path))


def _read_certificate(path):
    from .theory import Certificate

    if not path.is_file():
        raise ValueError(f"certificate file {path} does not exist or is not a file.")
    return _reading(path, lambda: Certificate.from_file(path))


def _certificate_out(args):
    """The certificate file ``certify`` may write, checked before any work is done."""
    out = args.out or args.family.with_suffix(".certificate.json")
    if out.resolve() == args.family.resolve() or (
            out.exists() and args.family.exists() and os.path.samefile(out, args.family)):
        raise ValueError(f"--out {out} is the family file itself; certify never writes "
                         "over the family it reads.")
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give a file name.")
    if out.exists() and not args.force:
        raise ValueError(f"{out} exists; give --force to replace it (or another --out).")
    if not out.parent.is_dir():
        raise ValueError(f"cannot write {out}: the folder {out.parent} does not exist.")
    return out


def _progress(args):
    """Progress bars: unless ``--no-progress``, and only on a terminal."""
    return not args.no_progress and sys.stderr.isatty()


def _certify_command(args):
    from ._io import write_text_atomic
    from ._progress import stages
    from .theory import certify

    out = _certificate_out(args)
    with stages(f"certify {args.family.name}", ("read family", "certify", "write"),
                _progress(args)) as bar:
        bar.start("read family")
        X = _load_family(args.family)
        bar.start("certify")
        _, cert = certify(X, query=args.query, positional=args.positional,
                          return_certificate=True, progress=_progress(args))
        bar.start("write")
        write_text_atomic(out, cert.to_json())
    print(cert.summary())
    print(f"certificate written to {out}")
    return 0


def _verify_command(args):
    from ._progress import stages
    from .theory import verify_certificate

    with stages(f"verify {args.certificate.name}",
                ("read family", "read certificate", "verify"), _progress(args)) as bar:
        bar.start("read family")
        X = _load_family(args.family)
        bar.start("read certificate")
        cert = _read_certificate(args.certificate)
        bar.start("verify")
        try:
            verify_certificate(cert, X, query=args.query, progress=_progress(args))
        except ValueError as exc:
            if not str(exc).startswith("certificate rejected"):
                raise
            print(f"INVALID: {exc}")
            return 1
    heads = ("every nonnegative kernel head, position-dependent maps included,"
             if cert.positional else "every nonnegative kernel head")
    print(f"valid: {heads} that solves {args.family} has rank >= "
          f"{cert.certified_min_rank} ({len(cert.queries)} (query, key) pairs checked).")
    return 0


# -- reproduce ---------------------------------------------------------------------------
def _run(args, name):
    from .experiments import run_experiment

    kwargs = dict(quick=args.quick, out=args.out / name, n_jobs=args.n_jobs,
                  devices=args.devices, progress=_progress(args),
                  ranks=args.ranks, seeds=args.seeds)
    if args.ensemble is not None:  # otherwise the recipe's default
        kwargs["ensemble"] = args.ensemble
    if name == "scaling":
        kwargs.pop("ranks")
    if name == "mixers":  # the mixers' ranks are their state sizes
        kwargs["state_sizes"] = kwargs.pop("ranks")
    fits = {k: v for k, v in (("max_epochs", args.max_epochs),
                              ("check_every", args.check_every)) if v is not None}
    if fits:  # every fit of the recipe
        kwargs["kernel"] = dict(fits)
        if name in ("witness", "ood", "scaling"):
            kwargs["softmax"] = dict(fits)
        if name == "mixers":
            kwargs["mixer"] = kwargs.pop("kernel")
        if name == "maps":
            kwargs["ood_kernel"] = dict(fits)
        if name == "beyond":
            kwargs["base"] = kwargs.pop("kernel")
    return run_experiment(name, **kwargs)


def _print_result(name, res, where):
    print(res.markdown)
    print()
    print(f"[{name}] {len(res.results)} fits in {res.elapsed:.0f} s; files in {where}/:")
    for path in res.files.values():
        print(f"  {path}")
    print()


def _done(t0, ok):
    status = "all expected behaviours observed" if ok else "SOME EXPECTED BEHAVIOURS NOT OBSERVED"
    print(f"Done in {time.perf_counter() - t0:.0f} s: {status}.")
    return 0 if ok else 1


def _reproduce(args):
    from .experiments import recorded_command
    from .model_selection import check_writable, resolve_devices

    if args.experiment == "docs-artifacts":
        return _docs_artifacts(args)
    for option, given in (("--only", args.only), ("--list", args.list),
                          ("--fresh", args.fresh)):
        if given:
            raise ValueError(f"{option} applies to docs-artifacts only.")
    if args.n_jobs is None:
        args.n_jobs = os.cpu_count() or 1
    names = (["witness", "length"] if args.experiment == "all"
             else [args.experiment.replace("-", "_")])
    resolve_devices(args.devices)
    if args.ranks is not None and "scaling" in names:
        raise ValueError("--ranks does not apply to scaling: it searches the ranks "
                         "between the certified and the constructive rank itself.")
    for name in names:  # before any fit: every output folder can be written
        check_writable(args.out / name / "runs")
    t0 = time.perf_counter()
    ok = True
    texts = []
    for name in names:
        args.running = args.out / name
        with recorded_command(args.command_line):
            res = _run(args, name)
        texts.append(res.markdown)
        _print_result(name, res, args.out / name)
        ok &= all(res.checks.values())
    if len(names) > 1:
        (args.out / "summary.md").write_text("\n\n".join(texts) + "\n")
        print(f"Combined summary: {args.out / 'summary.md'}")
    return _done(t0, ok)


# -- reproduce docs-artifacts ------------------------------------------------------------
def _minutes(minutes):
    return f"~{minutes * 60:.0f} s" if minutes < 1 else f"~{minutes:g} min"


def _grid(artifact):
    grid = f"{artifact['experiment']} {'--quick' if artifact['quick'] else '(full grid)'}"
    return grid + (" --ensemble" if artifact.get("ensemble") else "")


def _docs_artifacts(args):
    from .experiments import DOCS_ARTIFACTS, recorded_command, run_experiment
    from .model_selection import check_writable, resolve_devices

    for option, given in (("--quick", args.quick), ("--ranks", args.ranks),
                          ("--seeds", args.seeds), ("--max-epochs", args.max_epochs),
                          ("--check-every", args.check_every),
                          ("--ensemble", args.ensemble)):
        if given:
            raise ValueError(f"{option} does not apply to docs-artifacts: each artifact "
                             "runs with the settings it was made with (see --list).")
    out = args.out if args.out_given else Path("docs/_static")
    if not args.out_given and not out.is_dir():
        raise ValueError("no docs/_static folder here: run from the repository root or "
                         "give --out.")
    plan = {name: art for name, art in DOCS_ARTIFACTS.items()
            if not args.only or name in args.only}
    if args.list:
        rows = [("NAME", "RUNS", "WRITES", "TIME")] + [
            (name, _grid(art), f"{out / art['folder']}/", _minutes(art["minutes"]))
            for name, art in plan.items()]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)) + "  " + row[3])
        total = sum(art["minutes"] for art in plan.values())
        print(f"{len(plan)} artifact(s), about {_minutes(total)[1:]} in all on 2 cores.")
        return 0
    if args.n_jobs is None:
        args.n_jobs = os.cpu_count() or 1
    resolve_devices(args.devices)
    for art in plan.values():  # before any fit: every output folder can be written
        check_writable(out / art["folder"] / "runs")
    t0 = time.perf_counter()
    ok = True
    for name, art in plan.items():
        where = out / art["folder"]
        if args.fresh:
            for stored in ("runs", "constructions", "solvers"):
                shutil.rmtree(where / stored, ignore_errors=True)
        args.running = where
        print(f"[{name}] {_grid(art)} -> {where}/ ({_minutes(art['minutes'])})", flush=True)
        with recorded_command(args.command_line):
            # an artifact that names no ``ensemble`` runs with its recipe's default
            stacked = {"ensemble": art["ensemble"]} if "ensemble" in art else {}
            res = run_experiment(art["experiment"], quick=art["quick"], out=where,
                                 n_jobs=args.n_jobs, devices=args.devices,
                                 progress=_progress(args), **stacked)
        _print_result(name, res, where)
        ok &= all(res.checks.values())
    return _done(t0, ok)


_COMMANDS = {"reproduce": _reproduce, "certify": _certify_command,
             "verify": _verify_command}


# -- faults: one line on standard error, an exit status, no traceback ---------------------
class _Stop(KeyboardInterrupt):
    """Raised in the main thread by SIGINT or SIGTERM."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum, frame):
    raise _Stop(signum)


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"minip-learn: warning: {message}", file=sys.stderr if file is None else file)


def _interrupted(args, signum):
    where = getattr(args, "running", None)
    name = signal.Signals(signum).name
    print(f"\nminip-learn: stopped by {name}.", file=sys.stderr)
    if where is not None:
        print(f"Finished fits are kept in {where / 'runs'}/; run the same command again "
              "to resume.", file=sys.stderr)
    return 128 + signum


def main(argv=None):
    """Entry point of the ``minip-learn`` console script; returns the exit status.

    Parameters
    ----------
    argv : list of str, default=None
        Command-line arguments (``sys.argv[1:]`` when None).

    Returns
    -------
    status : int
        0 when every expected behaviour was observed; 1 when a check failed or a file
        could not be written; 2 on a bad option or an output folder that cannot be
        written (reported on standard error before any fit starts; a value the parser
        refuses exits with 2 as well); 130 or 143 when stopped by SIGINT (Ctrl-C) or
        SIGTERM.

    Examples
    --------
    >>> from minip_learn.cli import main
    >>> main(["reproduce", "witness", "--out", "/dev/null/results"])
    2
    """
    os.environ.setdefault("MPLBACKEND", "Agg")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["minip-learn", *map(str, argv)])
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, _raise_stop)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            return _COMMANDS[args.command](args)
    except KeyboardInterrupt as exc:
        return _interrupted(args, getattr(exc, "signum", signal.SIGINT))
    except ValueError as exc:  # bad option (e.g. CUDA asked for where there is none)
        print(f"minip-learn: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that could not be written (e.g. a full disk)
        where = f" {exc.filename}" if exc.filename else ""
        print(f"minip-learn: error: cannot write{where}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
