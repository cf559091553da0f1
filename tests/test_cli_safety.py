"""The command line with untrusted input: it answers at once, never overwrites what a
user wrote, and reports every bad file or option in one line (no traceback)."""

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minip_learn.cli import build_parser, main
from minip_learn.compact import load_family
from minip_learn.datasets import make_witness_suite
from minip_learn.experiments import DOCS_ARTIFACTS
from minip_learn.theory import Certificate, verify_certificate


@pytest.fixture(scope="module")
def small_family():
    return make_witness_suite(24, 3, construction="small").X


@pytest.fixture
def family_file(tmp_path, small_family):
    path = tmp_path / "family.npy"
    np.save(path, small_family)
    return path


def _contents(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# -- start-up -----------------------------------------------------------------------------
@pytest.mark.parametrize("code,heavy", [
    ("import minip_learn.cli", "torch sklearn skorch matplotlib"),
    ("from minip_learn.cli import main; main(['--version'])", "torch sklearn"),
    ("from minip_learn.cli import main; main(['reproduce', 'witness', '--n-jobs', 'x'])",
     "torch sklearn"),
    ("from minip_learn.cli import build_parser; "
     "build_parser().parse_args(['reproduce', 'witness', '--quick'])", "torch sklearn"),
    ("import minip_learn, minip_learn.theory, minip_learn.datasets, minip_learn.compact",
     "torch skorch matplotlib"),
])
def test_cli_and_numpy_layers_start_without_torch(code, heavy):
    """``--help``, ``--version`` and argument errors import neither torch nor
    scikit-learn; the numpy layers never import torch."""
    check = ("import sys\ntry:\n    " + code
             + "\nexcept SystemExit:\n    pass\n"
             f"heavy = sorted(m for m in {heavy.split()!r} if m in sys.modules)\n"
             "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_help_and_version_answer(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and "minip-learn 0.1.0" in capsys.readouterr().out
    for argv in (["--help"], ["certify", "--help"], ["verify", "--help"],
                 ["reproduce", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
    assert "--force" in capsys.readouterr().out


def test_the_estimators_are_still_importable_from_the_package():
    import minip_learn

    assert minip_learn.KernelAttentionRegressor.__name__ == "KernelAttentionRegressor"
    assert set(minip_learn.__all__) <= set(dir(minip_learn))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        minip_learn.nothing  # noqa: B018


def test_bad_device_is_refused_by_the_parser_naming_it(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["reproduce", "witness", "--devices", "tpu"])
    assert exc.value.code == 2 and "unknown device 'tpu'" in capsys.readouterr().err
    args = build_parser().parse_args(["reproduce", "witness", "--devices", "cuda:0,cuda:1"])
    assert args.devices == ["cuda:0", "cuda:1"]


# -- nothing a user wrote is replaced -----------------------------------------------------
def test_certify_never_writes_over_the_family(family_file, capsys):
    before = _contents(family_file.parent)
    for extra in ([], ["--force"]):
        assert main(["certify", str(family_file), "--out", str(family_file), *extra]) == 2
        err = capsys.readouterr().err
        assert "is the family file itself" in err and str(family_file) in err
    # through another name for the same file
    link = family_file.parent / "link.npy"
    os.symlink(family_file, link)
    assert main(["certify", str(family_file), "--out", str(link), "--force"]) == 2
    link.unlink()
    assert _contents(family_file.parent) == before


def test_certify_refuses_an_existing_file_without_force(family_file, capsys):
    cert = family_file.with_suffix(".certificate.json")
    cert.write_text("my notes")
    assert main(["certify", str(family_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(cert) in err and "--force" in err
    assert cert.read_text() == "my notes"
    assert main(["certify", str(family_file), "--force"]) == 0
    assert '"certified_min_rank"' in cert.read_text()


def test_certify_checks_the_output_before_certifying(family_file, capsys, monkeypatch):
    import minip_learn.theory as theory

    def must_not_run(*args, **kwargs):
        raise AssertionError("certify ran although the output cannot be written")

    monkeypatch.setattr(theory, "certify", must_not_run)
    for out, reason in ((family_file.parent / "no-such-folder" / "c.json", "does not exist"),
                        (family_file.parent, "is a folder")):
        assert main(["certify", str(family_file), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert reason in err and "Traceback" not in err


def test_an_interrupted_write_leaves_no_file(family_file, monkeypatch, capsys):
    """The certificate is written to a temporary file and moved into place: a write
    that fails (a full disk) leaves neither a half certificate nor the temporary."""
    import errno

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    assert main(["certify", str(family_file)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in family_file.parent.iterdir()) == ["family.npy"]


# -- bad files: one line, exit 2 ----------------------------------------------------------
def _damaged(path, kind):
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "flipped":
        path.write_bytes(data[:20] + bytes(b ^ 0xFF for b in data[20:60]) + data[60:])
    elif kind == "empty":
        path.write_bytes(b"")
    return path


@pytest.mark.parametrize("name, kind, reason", [
    ("cert.json", "truncated", "certificate is not valid JSON"),
    ("cert.json", "flipped", "is not UTF-8 text"),   # bytes ^ 0xFF: invalid UTF-8
    ("cert.json", "empty", "is empty."),
    ("cert.json.gz", "truncated", "is not complete gzip data"),
    ("cert.json.gz", "flipped", "is not complete gzip data"),
    ("cert.json.gz", "empty", "is empty."),  # no gzip member: no text
])
def test_damaged_certificate_files_are_one_line(family_file, tmp_path, capsys, name, kind,
                                                reason):
    """A damaged certificate is a file that cannot be read: exit status 2 (not 1, which
    says a readable certificate was rejected), one line naming the file and the damage."""
    cert = tmp_path / name
    assert main(["certify", str(family_file), "--out", str(cert)]) == 0
    capsys.readouterr()
    _damaged(cert, kind)
    status = main(["verify", str(family_file), str(cert)])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""  # neither "valid" nor "INVALID"
    assert captured.err.startswith(f"minip-learn: error: certificate file {cert}")
    assert captured.err.count("\n") == 1 and reason in captured.err
    # a path was given: no hint about passing one
    assert "pass a path" not in captured.err


def test_not_utf8_and_not_gzip_certificates(family_file, tmp_path, capsys):
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"format": "\xff"}')
    notgz = tmp_path / "plain.json.gz"
    notgz.write_text("{}")
    for cert in (latin, notgz):
        assert main(["verify", str(family_file), str(cert)]) == 2
        err = capsys.readouterr().err
        assert str(cert) in err and err.count("\n") == 1


def test_a_folder_or_unreadable_family_is_one_line(tmp_path, capsys):
    assert main(["certify", str(tmp_path)]) == 2
    assert "is not a file" in capsys.readouterr().err
    if os.geteuid() != 0:  # root reads everything
        fam = tmp_path / "secret.npy"
        np.save(fam, np.zeros((1, 3, 4), dtype=np.uint8))
        fam.chmod(0)
        assert main(["certify", str(fam)]) == 2
        assert "cannot read" in capsys.readouterr().err


def test_gzip_certificate_round_trip(family_file, tmp_path, capsys):
    cert = tmp_path / "cert.json.gz"
    assert main(["certify", str(family_file), "--out", str(cert)]) == 0
    with gzip.open(cert, "rt") as fh:
        assert '"certified_min_rank"' in fh.read()
    assert main(["verify", str(family_file), str(cert)]) == 0


# -- fuzz: arbitrary bytes as files and arbitrary option values ---------------------------
def _verify_status(fam, cert):
    """The status ``minip-learn verify`` documents for these files (docs/formats.rst): 2
    when either file cannot be read as a family or a certificate, else 0 when the
    certificate verifies against the family and 1 when it is rejected."""
    try:
        family = load_family(fam)
        certificate = Certificate.from_file(cert)
    except (ValueError, OSError):
        return 2
    try:
        return 0 if verify_certificate(certificate, family) else 1
    except ValueError:
        return 1


@settings(max_examples=60, deadline=None)
@given(family=st.binary(max_size=300), certificate=st.binary(max_size=300),
       suffix=st.sampled_from([".npy", ".npz", ".json", ".json.gz"]))
def test_fuzz_arbitrary_files_never_traceback(tmp_path_factory, family, certificate, suffix):
    folder = tmp_path_factory.mktemp("fuzz")
    fam = folder / ("family" + (".npy" if suffix.startswith(".json") else suffix))
    cert = folder / ("cert" + (suffix if suffix.startswith(".json") else ".json"))
    fam.write_bytes(family)
    cert.write_bytes(certificate)
    before = _contents(folder)
    assert main(["verify", str(fam), str(cert), "--no-progress"]) == _verify_status(fam, cert)
    assert main(["certify", str(fam), "--out", str(cert), "--no-progress"]) == 2  # exists
    assert _contents(folder) == before


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                max_size=12)


@settings(max_examples=300, deadline=None)
@given(option=st.sampled_from(["--n-jobs", "--devices", "--ranks", "--seeds",
                               "--max-epochs", "--check-every", "--out", "--only"]),
       value=st.one_of(
           _TEXT,
           # near the boundaries the options draw: small integers, lists of them,
           # device names, artifact names
           st.integers(-3, 3).map(str),
           st.lists(st.integers(-2, 3).map(str), max_size=3).map(",".join),
           st.lists(st.sampled_from(["cpu", "cuda", "cuda:1", "mps", "gpu", " cpu "]),
                    min_size=1, max_size=2).map(",".join),
           st.sampled_from(sorted(DOCS_ARTIFACTS))))
def test_fuzz_option_values_parse_or_exit_2(option, value):
    # what the options are documented to take (docs/results_folders.rst, the CLI's
    # help), written here: the parsed value, or None where the parser must exit with 2
    expected = _documented_value(option, value)
    if expected is None:
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(["reproduce", "witness", option, value])
        assert exc.value.code == 2
    else:
        args = build_parser().parse_args(["reproduce", "witness", option, value])
        assert getattr(args, option[2:].replace("-", "_")) == expected


#: the documented device names of --devices
_DEVICE_NAMES = re.compile(r"cpu|cuda|cuda:\d+|mps")


def _integer(text, minimum):
    try:
        value = int(text)  # an integer as Python reads it, surrounding spaces included
    except ValueError:
        return None
    return value if value >= minimum else None


def _documented_value(option, value):
    """The value ``--option value`` parses to, or None where it is refused."""
    # argparse reads a value that starts with "-" as an option (so "--out" lacks its
    # argument) unless it is "-" alone, looks like a negative number or holds a space
    if (value.startswith("-") and value != "-" and " " not in value
            and not re.fullmatch(r"-\d+|-\d*\.\d+", value)):
        return None
    items = [t.strip() for t in value.split(",") if t.strip()]
    if option == "--out":
        return Path(value)
    if option == "--only":  # an option of docs-artifacts: a name of its artifacts
        return [value] if value in DOCS_ARTIFACTS else None
    if option == "--devices":
        if not items or not all(_DEVICE_NAMES.fullmatch(t) for t in items):
            return None
        return items[0] if len(items) == 1 else items
    if option in ("--ranks", "--seeds"):
        minimum = 1 if option == "--ranks" else 0
        values = [_integer(t, minimum) for t in items]
        return tuple(values) if values and None not in values else None
    if option == "--n-jobs":  # a nonzero integer, -1 for all cores
        n = _integer(value, -(10**6))
        return n if n else None
    return _integer(value, 1)  # --max-epochs, --check-every: positive integers
