"""The "beyond the paper" recipe: variants against the certified bound (tiny settings)."""

import pytest

from minip_learn.experiments import beyond_experiment, run_experiment


def test_beyond_experiment_rows_and_labels(tmp_path):
    variants = [("baseline", "regressor", {}),
                ("2 heads", "regressor", {"n_heads": 2}),
                ("classifier", "classifier", {})]
    res = beyond_experiment(ranks=(2, 16), variants=variants,
                            base={"feature_map": "table", "max_epochs": 5},
                            progress=False, n_jobs=1, out=tmp_path)
    s = res.summary
    assert s["variant"].tolist() == ["baseline", "baseline", "2 heads", "2 heads",
                                     "classifier", "classifier"]
    applies = dict(zip(s["variant"], s["theorem_applies"]))
    assert applies == {"baseline": True, "2 heads": False, "classifier": False}
    # R8: capacity = heads x layers x rank x 24 significand bits (float32)
    cap = s.set_index(["variant", "rank"])["capacity_bits"]
    assert cap[("baseline", 2)] == 2 * 24 and cap[("2 heads", 16)] == 2 * 16 * 24
    assert (s["transcript_bits"] > 0).all() and res.certified_min_rank == 8
    assert res.checks["no_covered_fit_solved_below_bound"]
    assert "outside the theorem" in res.markdown or "no (R7)" in res.markdown
    assert (tmp_path / "variants.png").exists() and (tmp_path / "summary.md").exists()


def test_beyond_variant_ranks_override_and_bad_kind():
    res = run_experiment("beyond", variants=[("taylor", "regressor",
                                              {"feature_map": "taylor", "ranks": (3,)})],
                         base={"feature_map": "table", "max_epochs": 2}, progress=False,
                         figures=False, n_jobs=1)
    assert res.summary["rank"].tolist() == [3]
    with pytest.raises(ValueError, match="variant kind"):
        beyond_experiment(variants=[("x", "ranker", {})], ranks=(2,), progress=False,
                          figures=False, base={"max_epochs": 1})
