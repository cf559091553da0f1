"""``certify`` and ``verify_certificate`` run in named stages, shown with ``progress=True``."""

import numpy as np
import pytest

from minip_learn import _progress
from minip_learn.datasets import make_minip, make_witness_suite
from minip_learn.theory import certify, verify_certificate


@pytest.fixture(scope="module")
def suite():
    return make_witness_suite(24, 3, construction="small")


@pytest.fixture
def started(monkeypatch):
    """The stages started, as ``(desc, name, enabled)``, in order."""
    seen = []
    start = _progress.Stages.start

    def record(self, name):
        seen.append((self.desc, name, self.enabled))
        return start(self, name)

    monkeypatch.setattr(_progress.Stages, "start", record)
    return seen


CERTIFY = ["constraints", "reach", "search", "bound"]


@pytest.mark.parametrize("seq_len", [2, 3])
def test_certify_runs_each_stage_once_in_order(started, seq_len):
    """Also where nothing is certified (no triple, or sequences of two tokens)."""
    certify(make_minip(50, seq_len=seq_len, n_bits=8, random_state=0)[0])
    assert started == [("certify", name, False) for name in CERTIFY]


def test_certify_progress_names_the_stages_on_stderr(suite, capsys, started):
    rank, cert = certify(suite.X, return_certificate=True, progress=True)
    assert started == [("certify", name, True) for name in CERTIFY]
    err = capsys.readouterr().err
    assert "certify" in err and all(f"[{name}]" in err for name in CERTIFY)
    quiet_rank, quiet = certify(suite.X, return_certificate=True)
    assert capsys.readouterr().err == ""
    assert (rank, cert.to_json()) == (quiet_rank, quiet.to_json())


def test_verify_progress_names_the_stages_on_stderr(suite, capsys, started):
    cert = suite.certificate
    assert verify_certificate(cert, suite.X, progress=True)
    assert started == [("verify", "read", True), ("verify", "check", True)]
    err = capsys.readouterr().err
    assert "verify" in err and "[read]" in err and "[check]" in err
    assert verify_certificate(cert.to_json(), suite.X)
    assert capsys.readouterr().err == ""


def test_verify_progress_keeps_failures_and_errors(suite, capsys):
    cert = suite.certificate
    text = cert.to_json().replace('"certified_min_rank": 8', '"certified_min_rank": 9')
    assert verify_certificate(text, suite.X, raise_on_failure=False, progress=True) is False
    with pytest.raises(ValueError, match="certificate rejected: claimed rank 9"):
        verify_certificate(text, suite.X, progress=True)
    with pytest.raises(ValueError, match="the certificate is for sequences of length 3"):
        verify_certificate(cert, np.zeros((2, 4, 24), dtype=np.uint8), progress=True)


def test_progress_is_keyword_only(suite):
    with pytest.raises(TypeError):
        certify(suite.X, "all", False, False, True)
    with pytest.raises(TypeError):
        verify_certificate(suite.certificate, suite.X, None, True, True)
