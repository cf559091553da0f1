"""Command line: ``minip-learn reproduce witness|length|ood|beyond|all [--quick] ...``.

``minip-learn certify FAMILY.npy [--out CERT.json]`` prints the certified minimum rank
of a family and writes its certificate; ``minip-learn verify FAMILY.npy CERT.json``
checks a certificate independently (exit status 0 valid, 1 rejected, 2 bad file).

``witness`` and ``length`` are the paper's experiments (``all`` runs those two);
``ood`` (out-of-distribution scaling) and ``beyond`` (variants outside the theorem)
go beyond the paper and regenerate the docs' results page.

Also available as ``python -m minip_learn``. Writes, per experiment, ``results.csv``
(one row per fit), ``summary.csv``, ``summary.md`` and PNG figures into
``--out/<experiment>/`` (fits are stored under ``--out/<experiment>/runs/``, so an
interrupted run resumes where it stopped), prints the markdown summary and says where
the files are. The exit status is 0 when every expected behaviour was observed, 1
otherwise.
"""

import argparse
import os
import sys
import time
from pathlib import Path

__all__ = ["build_parser", "main"]


def _devices(text):
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("give a device such as cpu, cuda or cuda:0,cuda:1")
    return items[0] if len(items) == 1 else items


def _int_list(text):
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers; got {text!r}") from None


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
    rep.add_argument("experiment", choices=["witness", "length", "ood", "beyond", "all"],
                     help="witness, length: the paper's experiments; ood, beyond: beyond "
                          "the paper (docs: results page); all: the paper's two "
                          "(witness, length)")
    rep.add_argument("--quick", action="store_true",
                     help="small grid: a few minutes on 2 cores (default: the full grid)")
    rep.add_argument("--out", default="minip-results", type=Path,
                     help="output folder (default: minip-results/)")
    rep.add_argument("--n-jobs", type=int, default=None,
                     help="parallel fits (default: number of CPU cores; -1 all cores)")
    rep.add_argument("--devices", type=_devices, default=None,
                     help="torch devices: cpu, cuda, or a list such as cuda:0,cuda:1")
    rep.add_argument("--ranks", type=_int_list, default=None,
                     help="override the ranks, e.g. 8,16,64")
    rep.add_argument("--seeds", type=_int_list, default=None,
                     help="override the kernel seeds, e.g. 0,1,2")
    rep.add_argument("--max-epochs", type=int, default=None,
                     help="override max_epochs of every fit")
    rep.add_argument("--no-progress", action="store_true", help="no progress bars")
    rep.add_argument("--ensemble", action="store_true",
                     help="train the seeds and ranks of each sweep as batched ensembles "
                          "(same results, several times cheaper per fit)")
    _add_certificate_commands(sub)
    return parser


def _add_certificate_commands(sub):
    cert = sub.add_parser(
        "certify", help="certified minimum kernel rank of a family of sequences",
        description="Compute the certified minimum rank of the family in FAMILY.npy "
                    "(an array of shape (n_samples, seq_len, n_bits) with 0/1 values) and "
                    "write the certificate as JSON.")
    cert.add_argument("family", type=Path, help="the family: a .npy file")
    cert.add_argument("--out", type=Path, default=None,
                      help="certificate file (default: FAMILY.certificate.json)")
    ver = sub.add_parser(
        "verify", help="check a certificate against a family, independently of certify",
        description="Check CERT.json against FAMILY.npy with minip_learn.theory."
                    "verify_certificate; exit status 0 when valid, 1 when rejected.")
    ver.add_argument("family", type=Path, help="the family: a .npy file")
    ver.add_argument("certificate", type=Path, help="the certificate: a JSON file")


def _load_family(path):
    import numpy as np

    if not path.is_file():
        raise ValueError(f"family file {path} does not exist.")
    try:
        X = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path} is not a .npy array file ({exc}).") from None
    if not isinstance(X, np.ndarray):
        raise ValueError(f"{path} holds several arrays; save the family alone with np.save.")
    if X.ndim != 3 or not X.size or not np.isin(X, (0, 1)).all():
        raise ValueError(f"{path}: a family is an array of shape (n_samples, seq_len, n_bits) "
                         f"with 0/1 values; got shape {X.shape}, dtype {X.dtype}.")
    return X


def _certificate_command(args):
    from .theory import Certificate, certify, verify_certificate

    try:
        X = _load_family(args.family)
        if args.command == "certify":
            rank, cert = certify(X, return_certificate=True)
            out = args.out or args.family.with_suffix(".certificate.json")
            out.write_text(cert.to_json())
            print(cert.summary())
            print(f"certificate written to {out}")
            return 0
        if not args.certificate.is_file():
            raise ValueError(f"certificate file {args.certificate} does not exist.")
        cert = Certificate.from_json(args.certificate.read_text())
        verify_certificate(cert, X)
    except ValueError as exc:
        if args.command == "verify" and str(exc).startswith("certificate rejected"):
            print(f"INVALID: {exc}")
            return 1
        print(f"minip-learn: error: {exc}", file=sys.stderr)
        return 2
    print(f"valid: every nonnegative kernel head that solves {args.family} has rank >= "
          f"{cert.certified_min_rank} ({len(cert.queries)} (query, key) pairs checked).")
    return 0


def _run(args, name):
    from .experiments import run_experiment

    kwargs = dict(quick=args.quick, out=args.out / name, n_jobs=args.n_jobs,
                  devices=args.devices, progress=not args.no_progress,
                  ranks=args.ranks, seeds=args.seeds, ensemble=args.ensemble)
    if args.max_epochs is not None:
        kwargs["kernel"] = {"max_epochs": args.max_epochs}
        if name in ("witness", "ood"):
            kwargs["softmax"] = {"max_epochs": args.max_epochs}
        if name == "beyond":
            kwargs["base"] = kwargs.pop("kernel")
    return run_experiment(name, **kwargs)


def main(argv=None):
    """Entry point of the ``minip-learn`` console script; returns the exit status.

    Parameters
    ----------
    argv : list of str, default=None
        Command-line arguments (``sys.argv[1:]`` when None).

    Returns
    -------
    status : int
        0 when every expected behaviour was observed, 1 when a check failed, 2 on a
        bad option (reported on standard error before any fit starts).

    Examples
    --------
    >>> from minip_learn.cli import main
    >>> main(["reproduce", "witness", "--devices", "tpu"])
    2
    """
    os.environ.setdefault("MPLBACKEND", "Agg")
    args = build_parser().parse_args(argv)
    if args.command in ("certify", "verify"):
        return _certificate_command(args)
    if args.n_jobs is None:
        args.n_jobs = os.cpu_count() or 1
    names = ["witness", "length"] if args.experiment == "all" else [args.experiment]
    t0 = time.perf_counter()
    ok = True
    texts = []
    for name in names:
        try:
            res = _run(args, name)
        except ValueError as exc:  # bad option (e.g. CUDA asked for where there is none)
            print(f"minip-learn: error: {exc}", file=sys.stderr)
            return 2
        texts.append(res.markdown)
        print(res.markdown)
        print()
        print(f"[{name}] {len(res.results)} fits in {res.elapsed:.0f} s; files in "
              f"{args.out / name}/:")
        for path in res.files.values():
            print(f"  {path}")
        print()
        ok &= all(res.checks.values())
    if len(names) > 1:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text("\n\n".join(texts) + "\n")
        print(f"Combined summary: {args.out / 'summary.md'}")
    status = "all expected behaviours observed" if ok else "SOME EXPECTED BEHAVIOURS NOT OBSERVED"
    print(f"Done in {time.perf_counter() - t0:.0f} s: {status}.")
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
