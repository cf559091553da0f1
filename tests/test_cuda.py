"""The estimators, sweeps and recipes on a CUDA device (skipped where there is none).

A model fitted on the GPU predicts what the same parameters, pickled and moved to the
CPU, predict there (both evaluate in float64); the sweeps and the command line place
fits on ``cuda`` devices."""

import pickle

import numpy as np
import pytest
import torch

from minip_learn import KernelAttentionRegressor, SequenceMixerRegressor, SoftmaxAttentionRegressor
from minip_learn.cli import main
from minip_learn.datasets import make_witness_suite
from minip_learn.experiments import EXPERIMENTS
from minip_learn.model_selection import rank_sweep
from minip_learn.nn import available_mixers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def small():
    return make_witness_suite(construction="small")          # 190 sequences, bound 8


@pytest.fixture(scope="module")
def final():
    return make_witness_suite(8, construction="exact", query="last")  # 378, exact 14


def _on_cpu(est):
    """The fitted estimator's parameters, evaluated on the CPU."""
    cpu = pickle.loads(pickle.dumps(est))
    cpu.net_.module_.to("cpu")
    cpu.net_.device = cpu.device = "cpu"
    return cpu


@pytest.mark.parametrize("make", [
    lambda: KernelAttentionRegressor(rank=20, max_epochs=300, random_state=0),
    lambda: KernelAttentionRegressor(rank=8, feature_map="elu+1", max_epochs=50,
                                     random_state=0),
    lambda: SoftmaxAttentionRegressor(max_epochs=300, random_state=0),
])
def test_head_fitted_on_cuda_predicts_as_on_cpu(make, small):
    est = make().set_params(device="cuda").fit(small.X, small.y)
    assert next(est.net_.module_.parameters()).device.type == "cuda"
    y = est.predict(small.X)
    np.testing.assert_allclose(y, _on_cpu(est).predict(small.X), rtol=1e-10, atol=1e-10)
    assert np.isfinite(y).all() and y.std() > 1e-3


@pytest.mark.parametrize("mixer", available_mixers())
def test_mixer_fitted_on_cuda_predicts_as_on_cpu(mixer, final):
    est = SequenceMixerRegressor(mixer=mixer, state_size=14, max_epochs=20, device="cuda",
                                 random_state=0).fit(final.X, final.y)
    assert est.query_ == "last"
    y = est.predict(final.X)
    assert y.shape == (len(final.X),)
    np.testing.assert_allclose(y, _on_cpu(est).predict(final.X), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mixer", available_mixers())
def test_mixer_stacks_on_cuda_equal_fits_on_cpu(mixer, final):
    # state sizes x seeds stacked on the GPU, checked every 10 epochs: each member
    # follows its own fit on the CPU (float64), stopping on the same checked epochs
    from minip_learn.model_selection import fit_ensemble

    kwargs = {"feature_map": "table"} if mixer in ("kernel", "retnet", "positional") else None
    est = SequenceMixerRegressor(mixer=mixer, mixer_kwargs=kwargs, max_epochs=60,
                                 dtype="float64", stop_tolerance=0.5, check_every=10)
    res = fit_ensemble(est.set_params(device="cuda"), final.X, final.y,
                       state_sizes=[7, 14], seeds=[0, 1])
    for p, member in zip(res.params, res.estimators):
        alone = est.set_params(device="cpu", **p).fit(final.X, final.y)
        assert member.n_epochs_ == alone.n_epochs_
        np.testing.assert_allclose(member.predict(final.X), alone.predict(final.X),
                                   rtol=1e-7, atol=1e-7)


def test_causal_kernel_head_on_cuda_below_the_certified_rank(final):
    # rank 13 < certified 14 on final-query targets: a fit that solved would be a bug
    est = KernelAttentionRegressor(rank=13, causal=True, max_epochs=1000, n_init=2,
                                   device="cuda", random_state=0).fit(final.X, final.y)
    assert est.theorem_applies_ and est.query_ == "last"
    assert est.score(final.X, final.y) < 1.0
    np.testing.assert_allclose(est.predict(final.X), _on_cpu(est).predict(final.X),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("ensemble", [False, True])
def test_rank_sweep_over_cuda_devices(small, ensemble):
    res = rank_sweep(KernelAttentionRegressor(max_epochs=200), small.X, small.y,
                     param_grid={"rank": [4, 16]}, seeds=[0, 1], devices="cuda", n_jobs=2,
                     ensemble=ensemble, certified_min_rank=small.certified_min_rank,
                     progress=False)
    assert len(res.results) == 4
    assert set(res.results["device"]) <= {f"cuda:{i}" for i in range(torch.cuda.device_count())}
    assert not res.results.loc[res.results["rank"] == 4, "solved"].astype(bool).any()


def test_witness_recipe_on_cuda(tmp_path, capsys):
    status = main(["reproduce", "witness", "--quick", "--devices", "cuda", "--no-progress",
                   "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "all expected behaviours observed" in out


@pytest.mark.parametrize("recipe", [name.replace("_", "-") for name in EXPERIMENTS
                                    if name != "witness"])
def test_every_quick_recipe_on_cuda(recipe, tmp_path, capsys):
    status = main(["reproduce", recipe, "--quick", "--devices", "cuda", "--no-progress",
                   "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert (tmp_path / "summary.md").is_file()
