"""The softmax head's fused path (scaled_dot_product_attention) against its explicit
form, and the memory of a long-sequence predict."""

import copy
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from minip_learn import SoftmaxAttentionRegressor
from minip_learn.datasets import make_minip
from minip_learn.nn import SoftmaxAttentionHead

TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5},
       torch.float64: {"atol": 1e-12, "rtol": 1e-12}}


def _head(n_bits=5, dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    head = SoftmaxAttentionHead(n_bits, **kwargs).to(dtype)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()  # large scores: a peaked softmax, not the near-uniform start
    return head


def _explicit(head, x):
    return head.attention_weights(x) @ head.value(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 3, 17, 64, 300])
@pytest.mark.parametrize("temperature", [1.0, 0.25])
def test_fused_equals_explicit(dtype, n, temperature):
    head = _head(dtype=dtype, temperature=temperature, score_dim=7, value_dim=4)
    x = torch.rand(3, n, 5, dtype=dtype).round()
    with torch.no_grad():
        explicit = _explicit(head, x)
        for algorithm in ("fused", "explicit", "auto"):
            head.algorithm = algorithm
            torch.testing.assert_close(head.attend(x), explicit, **TOL[dtype])
            torch.testing.assert_close(head(x), head.readout(x, explicit), **TOL[dtype])


def _with(head, algorithm):
    head.algorithm = algorithm
    return head


def test_fused_takes_any_leading_shape():
    head = _with(_head(), "fused")
    for shape in [(9, 5), (2, 9, 5), (2, 3, 9, 5)]:
        x = torch.rand(*shape, dtype=torch.float64).round()
        torch.testing.assert_close(head.attend(x), _explicit(head, x), **TOL[torch.float64])


@pytest.mark.parametrize("algorithm", ["fused", "explicit"])
def test_token_multiplicities_equal_the_materialised_sequences(algorithm, monkeypatch):
    # log c_j joins the scores of slot j (an attention mask in the fused kernel): the
    # output at a slot is that of every position of its token; padding weighs nothing
    from minip_learn.compact import CompactFamily

    head = _with(_head(), algorithm)
    vocab = torch.rand(6, 5, generator=torch.Generator().manual_seed(3)).round()
    idx = torch.randint(0, 6, (4, 40), generator=torch.Generator().manual_seed(4))
    idx[0] = 0  # one token only: padding in every other slot
    fam = CompactFamily.from_sequences(vocab[idx].numpy().astype(np.uint8))
    assert fam.padding.any()
    slots = torch.as_tensor(fam.slot_tokens(), dtype=torch.float64)
    counts = torch.as_tensor(fam.counts, dtype=torch.float64)
    seqs = torch.as_tensor(fam.to_sequences(), dtype=torch.float64)
    monkeypatch.setattr(SoftmaxAttentionHead, "FUSED_BLOCK_SCORES", 2 * fam.n_slots)
    with torch.no_grad():
        out = head(slots, counts=counts).numpy()
        u = head.attend(slots, counts=counts)
        ref = _with(copy.deepcopy(head), "explicit")(seqs).numpy()
    np.testing.assert_allclose(fam.expand(out), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        u, head.attention_weights(slots, counts) @ head.value(slots), **TOL[torch.float64])


def test_fused_query_blocks(monkeypatch):
    """Query blocks (a bounded number of scores per call) change nothing."""
    head = _with(_head(), "fused")
    x = torch.rand(2, 100, 5, dtype=torch.float64).round()
    whole = head.attend(x)
    monkeypatch.setattr(SoftmaxAttentionHead, "FUSED_BLOCK_SCORES", 300)  # 3-row blocks
    assert head.live_scores(100) == 300
    torch.testing.assert_close(head.attend(x), whole, **TOL[torch.float64])
    monkeypatch.setattr(SoftmaxAttentionHead, "FUSED_BLOCK_SCORES", 1)  # one row a call
    torch.testing.assert_close(head.attend(x), whole, **TOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_gradients_equal_explicit(dtype):
    x = torch.rand(2, 80, 5, dtype=dtype).round()
    grads = {}
    for algorithm in ("fused", "explicit"):
        head = _with(_head(dtype=dtype), algorithm)
        head(x).square().sum().backward()
        grads[algorithm] = [p.grad for p in head.parameters()]
    # relative to the largest gradient entry (the key bias's is 0 up to rounding)
    scale = max(float(g.abs().max()) for g in grads["explicit"])
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for a, b in zip(grads["fused"], grads["explicit"]):
        assert float((a - b).abs().max()) <= tol * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("score_dim, value_dim", [(5, 5), (16, 5), (3, 7)])
def test_fused_path_takes_the_streaming_kernel(dtype, score_dim, value_dim):
    """With only the flash kernel allowed (on CPU: the one that streams over the keys
    and never forms the scores), the fused path still runs, forward and backward, for
    any score and value widths and both dtypes; any other layout would raise "No
    available kernel"."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    head = _with(_head(dtype=dtype, score_dim=score_dim, value_dim=value_dim), "fused")
    x = torch.rand(2, 70, 5, dtype=dtype).round()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        u = head.attend(x)
        head(x).sum().backward()
    torch.testing.assert_close(u, _explicit(head, x).detach(), **TOL[dtype])


def test_auto_takes_the_fused_kernel_on_long_sequences_only():
    head = SoftmaxAttentionHead(4)
    assert head.algorithm == "auto"
    n0 = SoftmaxAttentionHead.FUSED_MIN_SEQ_LEN
    assert not head.uses_fused(3) and not head.uses_fused(n0 - 1)
    assert head.uses_fused(n0) and head.uses_fused(16384)
    assert head.live_scores(3) == 9  # explicit: all N^2 scores
    assert head.live_scores(16384) < 16384**2 // 100  # fused: a bounded block
    assert _with(SoftmaxAttentionHead(4), "fused").uses_fused(3)
    assert not _with(SoftmaxAttentionHead(4), "explicit").uses_fused(10**6)


def test_unpickled_head_without_algorithm_is_auto():
    head = SoftmaxAttentionHead(4)
    del head.algorithm  # a head saved before the option existed
    assert head.uses_fused(64) and not head.uses_fused(3)


def test_bad_algorithm():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        SoftmaxAttentionHead(4, algorithm="flash")


@pytest.fixture(scope="module")
def fitted():
    X, y = make_minip(100, seq_len=3, n_bits=8, random_state=0)
    return SoftmaxAttentionRegressor(max_epochs=20, random_state=0).fit(X, y)


def test_predict_long_sequence_equals_explicit(fitted):
    rng = np.random.default_rng(0)
    X = rng.integers(0, 2, size=(2, 500, 8)).astype(np.float64)
    pred = fitted.predict(X)
    module = fitted.net_.module_.double()
    try:
        module.algorithm = "explicit"
        with torch.no_grad():
            ref = module(torch.as_tensor(X)).numpy()
    finally:
        module.algorithm = "auto"
        module.float()
    np.testing.assert_allclose(pred, ref, rtol=1e-12, atol=1e-12)


def test_predict_memory_estimate_is_linear(fitted):
    """The per-sequence estimate of predict (which sizes its chunks and refuses
    sequences that cannot fit) follows the fused path: far below N^2 floats."""
    est = fitted
    for n in (16384, 65536):
        per_seq = est._predict_bytes_per_sequence(n, 8)
        assert per_seq < 300 * 2**20
        assert per_seq < n * n * 8 / 10
    assert est._predict_bytes_per_sequence(3, 8) >= 3 * 9 * 8


_PROBE = textwrap.dedent("""
    import re, sys
    import numpy as np, torch
    from minip_learn import SoftmaxAttentionRegressor
    from minip_learn.datasets import make_minip
    from minip_learn.nn import SoftmaxAttentionHead

    def status():
        text = open("/proc/self/status").read()
        return {k: int(re.search(k + r":\\s+(\\d+) kB", text).group(1)) * 1024
                for k in ("VmRSS", "VmHWM")}

    what, n, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    X_long = np.random.default_rng(0).integers(0, 2, size=(1, n, m)).astype(np.uint8)
    if what == "predict":
        X, y = make_minip(50, seq_len=3, n_bits=m, random_state=0)
        est = SoftmaxAttentionRegressor(max_epochs=2, random_state=0).fit(X, y)
        run = lambda: est.predict(X_long)
    else:  # one float32 forward of a head whose score and value widths differ
        head = SoftmaxAttentionHead(m, score_dim=64, value_dim=m)
        x = torch.as_tensor(X_long, dtype=torch.float32)
        def run():
            with torch.no_grad():
                return head(x).numpy()
    run()  # warm-up (the fused kernel's first call)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the resident-set high-water mark
    before = status()["VmRSS"]
    out = run()
    assert out.shape == (1, n) and np.isfinite(out).all()
    print("RISE", status()["VmHWM"] - before)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("what, limit_mib", [("predict", 300), ("head", 50)])
def test_one_long_sequence_is_memory_lean(what, limit_mib):
    """One sequence of N = 16,384 tokens of m = 24 bits. ``predict`` (float64) raises
    the peak resident memory by under 300 MB (the explicit form needs about 4 GB); a
    float32 forward of a head with score_dim 64 and value_dim 24 by under 50 MB (the
    explicit form: 2 GB). Measured in a fresh process, whose high-water mark only this
    call moves."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pytest.skip("cannot reset the resident-set high-water mark (/proc/self/clear_refs)")
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-c", _PROBE, what, "16384", "24"],
                          capture_output=True, text=True, timeout=600, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rise = int(proc.stdout.split("RISE")[-1])
    assert rise < limit_mib * 2**20, f"{what} raised peak memory by {rise / 2**20:.0f} MiB"
