"""Tests of the figures."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from minip_learn import KernelAttentionRegressor  # noqa: E402
from minip_learn.constructions import exact_kernel_realization  # noqa: E402
from minip_learn.datasets import make_witness_suite  # noqa: E402
from minip_learn.plotting import (  # noqa: E402
    kernel_matrix,
    plot_kernel_heatmap,
    plot_length_transition,
    plot_phase_transition,
    plot_rank_sandwich,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def suite():
    return make_witness_suite(construction="small")


def _summary():
    return pd.DataFrame({
        "model": ["kernel"] * 3 + ["softmax"],
        "feature_map": ["table"] * 3 + [np.nan],
        "rank": [4.0, 16.0, 64.0, np.nan],
        "n_fits": [2, 2, 2, 3], "n_solved": [0, 0, 2, 3],
        "solved_fraction": [0.0, 0.0, 1.0, 1.0],
        "solved_ci_low": [0.0, 0.0, 0.34, 0.44], "solved_ci_high": [0.66, 0.66, 1.0, 1.0],
        "exact_match_mean": [0.3, 0.8, 1.0, 1.0],
        "certified_min_rank": [17] * 4,
    })


def test_phase_transition_plot(tmp_path):
    ax = plot_phase_transition(_summary(), constructive_rank=46)
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("certified bound r >= 17" in t for t in labels)  # read from the column
    assert any("constructive rank 46" in t for t in labels)
    assert any("softmax" in t and "3/3" in t for t in labels)
    assert any("exact-match" in t for t in labels)
    vlines = [ln for ln in ax.get_lines() if np.allclose(ln.get_xdata(), ln.get_xdata()[0])
              and len(set(ln.get_ydata())) > 1]
    assert {float(ln.get_xdata()[0]) for ln in vlines} >= {17.0, 46.0}
    ax.figure.savefig(tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="rank"):
        plot_phase_transition(pd.DataFrame({"solved_fraction": [1.0]}))


def _sandwich():
    params = '{"max_sequences": 20000, "n_bits": %d, "seq_len": 3}'
    return pd.DataFrame({"n_bits": [8, 12, 16], "certified_min_rank": [2, 4, 8],
                         "smallest_solving_rank": [2, 4, 30],
                         "constructive_rank": [4, 8, 30],
                         "suite_params": [params % m for m in (8, 12, 16)]})


@pytest.mark.parametrize("n_rows", [3, 4])
def test_rank_sandwich_draws_the_exact_curve_beside_the_sandwich(n_rows):
    # the m = 20 row is not exact: it stays out of the curve
    exact = pd.DataFrame({"n_bits": [16, 8, 12, 20][:n_rows],
                          "certified_min_rank": [870, 14, 80, 3000][:n_rows],
                          "seq_len": [352, 15, 53, 900][:n_rows],
                          "exact": ["True", "True", "True", "False"][:n_rows]})
    ax = plot_rank_sandwich(_sandwich(), exact=exact)
    curves = {ln.get_label(): ln for ln in ax.get_lines()}
    line = curves.pop("exact minimum rank, long sequences (R9)")
    assert line.get_xdata().tolist() == [8, 12, 16]
    assert line.get_ydata().tolist() == [14, 80, 870]
    assert {a.get_text() for a in ax.texts} == {"14 (N = 15)", "80 (N = 53)", "870 (N = 352)"}
    # the sandwich names its sequence length, read from suite_params
    assert {"length 3: certified bound (lower)",
            "length 3: construction, one feature per token"} <= set(curves)
    assert ax.get_yscale() == "log"
    # with every row exact, a fourth size joins the curve
    exact["exact"] = True
    ax = plot_rank_sandwich(_sandwich(), exact=exact)
    line = ax.get_lines()[-1]
    assert line.get_xdata().tolist() == [8, 12, 16, 20][:n_rows]


def test_rank_sandwich_without_exact_summary():
    ax = plot_rank_sandwich(_sandwich().drop(columns="suite_params"))
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert not any("exact" in lab or "R9" in lab for lab in labels) and not ax.texts
    assert "certified bound (lower)" in labels  # no suite_params: no length named
    with pytest.raises(ValueError, match="'exact'"):
        plot_rank_sandwich(_sandwich(), exact=pd.DataFrame(
            {"n_bits": [8], "certified_min_rank": [14]}))


def test_length_transition_plot():
    s = pd.DataFrame({"seq_len": [1, 1, 2, 2, 3, 3], "rank": [1, 16] * 3,
                      "solved_fraction": [1, 1, 1, 1, 0, 1],
                      "certified_min_rank": [np.nan] * 4 + [8, 8]})
    ax = plot_length_transition(s)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:3] == ["seq_len = 1", "seq_len = 2", "seq_len = 3"]
    assert any("r >= 8" in t for t in labels)
    with pytest.raises(ValueError, match="seq_len"):
        plot_length_transition(s.drop(columns="seq_len"))


def test_kernel_heatmap_exact_construction_is_approximate_identity(suite):
    est = exact_kernel_realization(tokens=suite.tokens)
    B = kernel_matrix(est, suite.queries, suite.designated_keys)
    n = len(suite.queries)
    assert B.shape == (n, n)
    np.testing.assert_allclose(np.diag(B), 1.0)
    off = B[~np.eye(n, dtype=bool)]
    assert (off >= 0).all() and off.max() < 0.5
    ax = plot_kernel_heatmap(est, suite.queries, suite.designated_keys)
    assert ax.images[0].get_array().shape == (n, n)
    R = kernel_matrix(est, suite.queries, suite.designated_keys, normalize="row")
    np.testing.assert_allclose(R.sum(axis=1), 1.0)


def test_kernel_heatmap_trained_head(suite):
    est = KernelAttentionRegressor(rank=4, feature_map="table", max_epochs=3,
                                   random_state=0).fit(suite.X, suite.y)
    ax = plot_kernel_heatmap(est, suite.queries, suite.designated_keys, normalize=None,
                             log=False)
    assert "rank 4" in ax.get_title()
    with pytest.raises(ValueError, match="normalize"):
        kernel_matrix(est, suite.queries, suite.designated_keys, normalize="bad")
    with pytest.raises(ValueError, match="fitted kernel-attention"):
        kernel_matrix(object(), suite.queries, suite.designated_keys)
