"""The mixers recipe: a state-size leaderboard on final-query families (tiny settings)."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

import minip_learn.compact
from minip_learn import SequenceMixerRegressor
from minip_learn.cli import build_parser, main
from minip_learn.datasets import make_minip
from minip_learn.experiments import EXPERIMENTS, SETTINGS, mixers_experiment
from minip_learn.experiments.mixers import state_grid
from minip_learn.model_selection import rank_sweep
from minip_learn.nn import Mixer

TINY = dict(families=[dict(n_bits=8, construction="exact")], state_sizes=[2, 16],
            mixer={"max_epochs": 5}, progress=False, n_jobs=1)


class _ExactMinIP(Mixer):
    """A mixer that outputs the exact Min-IP target at every position (it looks at
    the whole sequence, so it only stands in for a model that would solve the family)
    and declares what the test asks it to."""

    theorem = "yes"

    def __init__(self, n_bits, state_size, *, value_dim=None):
        super().__init__(n_bits, state_size, value_dim=value_dim)
        self.scale = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return (x @ x.transpose(1, 2)).amin(-1) + 0.0 * self.scale

    def recurrent(self, x):
        return self.forward(x)

    def state_floats(self, seq_len=None):
        return self.state_size


class _PositionalExactMinIP(_ExactMinIP):
    theorem = "positional"


class _NoTheoremExactMinIP(_ExactMinIP):
    theorem = "no"


def test_mixers_leaderboard_rows_files_and_checks(tmp_path):
    res = mixers_experiment(mixers=["kernel", "deltanet", "softmax"], out=tmp_path, **TINY)
    s = res.summary.set_index("mixer")
    assert list(s.index) == ["kernel", "deltanet", "softmax"]
    assert s["theorem"].to_dict() == {"kernel": "yes", "deltanet": "no", "softmax": "no"}
    assert (s["certified_min_rank"] == 14).all()  # the exact m = 8 family, final query
    assert (s["seq_len"] == 15).all() and (s["n_sequences"] == 378).all()
    assert {"smallest_solving_state", "smallest_solving_state_floats",
            "smallest_solving_rank", "solved_fraction", "solved_by_state",
            "fit_time"} <= set(s.columns)
    assert s.loc["kernel", "solved_by_state"] == "2:0/1 16:0/1"
    # declared state floats: r (d + 1) for the kernel head, r d for DeltaNet
    fits = res.results.set_index(["mixer", "state_size"])
    assert fits.loc[("kernel", 16), "state_floats"] == 16 * (8 + 2)  # table: log domain
    assert fits.loc[("deltanet", 16), "state_floats"] == 16 * 8
    assert res.checks == {"no_proven_mixer_solved_below_bound": True,
                          "recurrent_equals_parallel": True}
    assert not s["solved_below_bound"].any()
    assert max(res.recurrent_gap.values()) < 1e-6
    for name in ("summary.csv", "summary.md", "table.csv", "leaderboard.png",
                 "provenance.json"):
        assert (tmp_path / name).exists(), name


def test_a_positional_mixer_below_a_fixed_order_bound_is_reported_not_failed():
    # a fixed-order family's certificate bounds positionless maps: for a
    # position-dependent one it is a finding
    res = mixers_experiment(mixers=[_PositionalExactMinIP], figures=False,
                            **{**TINY, "state_sizes": [1]})
    assert res.summary["mixer"].tolist() == ["_PositionalExactMinIP"]
    assert res.summary["smallest_solving_state"].tolist() == [1]
    assert res.summary["solved_below_bound"].tolist() == [True]
    assert res.summary["proven"].tolist() == [False]
    assert res.checks["no_proven_mixer_solved_below_bound"] is True
    assert "Solved below the certified rank: `_PositionalExactMinIP`" in res.markdown
    assert "every order of its keys" in res.markdown


def test_a_positional_mixer_below_an_every_order_bound_is_a_bug():
    # in every order of its keys the certificate is positional: it binds the mixer
    family = dict(n_bits=24, seq_len=3, construction="small", orders="all")
    with pytest.raises(RuntimeError, match="certified minimum rank is 8"):
        mixers_experiment(mixers=[_PositionalExactMinIP], figures=False,
                          **{**TINY, "families": [family], "state_sizes": [1]})
    # a mixer outside the theorem is recorded there
    res = mixers_experiment(mixers=[_NoTheoremExactMinIP], figures=False,
                            **{**TINY, "families": [family], "state_sizes": [1]})
    assert res.summary["family"].tolist() == ["small-m24-every-order"]
    assert res.summary["n_sequences"].tolist() == [280]
    assert res.summary["solved_below_bound"].tolist() == [True]
    assert res.checks["no_proven_mixer_solved_below_bound"] is True


def test_a_family_may_set_its_own_seeds_and_states():
    res = mixers_experiment(
        mixers=["linear"], figures=False,
        **{**TINY, "state_sizes": None, "seeds": (0, 1),
           "families": [dict(n_bits=24, seq_len=3, construction="small", seeds=(0,),
                             state_factors=(1,), below_bound=False)]})
    assert res.results["seed"].tolist() == [0]
    assert res.results["state_size"].tolist() == [8]
    with pytest.raises(ValueError, match="families must be a dict"):
        mixers_experiment(mixers=["linear"], **{**TINY, "families": [8]})


def test_a_family_too_large_to_materialise_fails_before_any_fit(tmp_path, monkeypatch):
    # the first family (190 x 3 x 24 bytes) fits, the second (378 x 15 x 8) does not
    monkeypatch.setattr(minip_learn.compact, "MATERIALIZE_MAX_BYTES", 20_000)
    families = [dict(n_bits=24, seq_len=3, construction="small"), *TINY["families"]]
    with pytest.raises(ValueError, match="family exact-m8: 378 sequences of length 15 "
                                         "would take 45,360 bytes"):
        mixers_experiment(mixers=["linear"], out=tmp_path, **{**TINY, "families": families})
    assert not any((tmp_path / "runs").iterdir())


def test_a_proven_mixer_solving_below_the_bound_is_a_bug():
    X, y = make_minip(16, seq_len=3, n_bits=4, query="last", random_state=0)
    est = SequenceMixerRegressor(mixer=_ExactMinIP, max_epochs=1)
    with pytest.raises(RuntimeError, match="certified minimum rank is 5"):
        rank_sweep(est, X, y, param_grid={"state_size": [2]}, seeds=[0],
                   certified_min_rank=5, progress=False, n_jobs=1)
    # at the bound it is recorded
    res = rank_sweep(est, X, y, param_grid={"state_size": [5]}, seeds=[0],
                     certified_min_rank=5, progress=False, n_jobs=1)
    assert res.results["solved"].astype(bool).all()
    assert res.results["theorem_applies"].astype(bool).all()


def test_state_grid():
    assert state_grid(17) == [8, 16, 17, 34, 68]
    assert state_grid(14, (0.5, 1, 2), below_bound=False) == [7, 14, 28]
    assert state_grid(1) == [1, 2, 4]


def test_mixers_registered_and_cli_options(tmp_path, capsys):
    assert "mixers" in EXPERIMENTS and set(SETTINGS["mixers"]) == {"quick", "full"}
    args = build_parser().parse_args(["reproduce", "mixers", "--quick", "--ranks", "2"])
    assert args.experiment == "mixers"
    # --ranks are the state sizes, --max-epochs reaches every fit
    status = main(["reproduce", "mixers", "--quick", "--ranks", "3", "--max-epochs", "2",
                   "--seeds", "0", "--no-progress", "--n-jobs", "1",
                   "--out", str(tmp_path)])
    assert status == 0
    out = capsys.readouterr().out
    assert "Sequence mixers on final-query Min-IP" in out
    summary = (tmp_path / "mixers" / "summary.csv").read_text()
    assert "3:0/1" in summary and "max_epochs=2" in (tmp_path / "mixers" / "summary.md").read_text()


def test_unknown_mixer_fails_before_any_fit(tmp_path):
    with pytest.raises(ValueError, match="Unknown mixer"):
        mixers_experiment(mixers=["nope"], out=tmp_path, **TINY)
    assert not any((tmp_path / "runs").iterdir())


def test_recipe_outputs_are_final_query():
    res = mixers_experiment(mixers=["linear"], figures=False, **{**TINY, "state_sizes": [2]})
    assert np.isfinite(res.results["max_abs_error"]).all()
    assert res.results["theorem"].tolist() == ["no"]


def test_the_whole_exact_m12_family_is_a_family_of_the_full_grid(tmp_path):
    # the leaderboard at full size (docs/causal.rst): the whole family in final-query
    # form, at the full grid's states around its exact rank
    whole = dict(n_bits=12, construction="exact", max_sequences=10**5)
    full = SETTINGS["mixers"]["full"]
    assert state_grid(80, full["state_factors"], below_bound=full["below_bound"]) == [
        40, 79, 80, 160, 320]
    res = mixers_experiment(quick=False, families=[whole], mixers=["kernel"],
                            state_sizes=[2], seeds=[0], mixer={"max_epochs": 1},
                            out=tmp_path, progress=False, n_jobs=1, figures=False)
    row = res.summary.iloc[0]
    assert (row["family"], row["n_sequences"], row["seq_len"]) == ("exact-m12", 12_720, 53)
    assert row["certified_min_rank"] == 80
    assert res.checks == {"no_proven_mixer_solved_below_bound": True,
                          "recurrent_equals_parallel": True}


def test_unsolved_fits_split_into_cannot_and_did_not_train():
    # kernel is proven on the exact family: below 14 it cannot solve; at 16 a fit of
    # 5 epochs did not train. linear is outside the theorem: nothing is "cannot"
    res = mixers_experiment(mixers=["kernel", "linear"], figures=False, **TINY)
    s = res.summary.set_index("mixer")
    assert (s.loc["kernel", "cannot"], s.loc["kernel", "did_not_train"]) == ("2", "16:1/1")
    assert (s.loc["linear", "cannot"], s.loc["linear", "did_not_train"]) == (
        "", "2:1/1 16:1/1")
    table = display_table(res)
    assert table.loc["kernel", "cannot: below the proven bound"] == "2"
    assert table.loc["linear", "cannot: below the proven bound"] == "-"
    # without a sweep every mixer trains at the settings' learning rate
    assert s["lr"].tolist() == [0.03, 0.03] and s["lr_sweep"].tolist() == ["fixed"] * 2
    assert res.lr_sweep is None and "control_solved" not in res.checks


def display_table(res):
    from minip_learn.experiments._mixers_report import display_row as _display_row

    rows = [_display_row(r) for _, r in res.summary.iterrows()]
    return pd.DataFrame(rows).set_index("mixer")


def _fits(rows):
    return pd.DataFrame(rows, columns=["lr", "solved", "max_abs_error"])


def test_the_learning_rate_solving_most_fits_is_picked():
    from minip_learn.experiments._mixers_report import pick_lr as _pick_lr

    fits = _fits([(0.01, True, 0.4), (0.01, False, 0.9),
                  (0.03, False, 1.2), (0.03, False, 1.3),
                  (0.1, True, 0.3), (0.1, True, 0.45)])
    assert _pick_lr(fits, 0.03) == (0.1, "0.01:1/2 0.03:0/2 0.1:2/2")
    # a tie in solved fits goes to the smaller mean maximum error ...
    fits = _fits([(0.01, True, 0.2), (0.01, False, 0.9), (0.1, True, 0.3),
                  (0.1, False, 1.0)])
    assert _pick_lr(fits, 0.1)[0] == 0.01
    # ... then to the settings' rate, then to the smaller rate
    fits = _fits([(0.01, False, 1.0), (0.03, False, 1.0), (0.1, False, 1.0)])
    assert _pick_lr(fits, 0.1)[0] == 0.1
    assert _pick_lr(fits, 0.5)[0] == 0.01


def test_each_mixer_trains_at_the_rate_its_sweep_picked(tmp_path):
    sweep = dict(family=dict(n_bits=24, seq_len=3, construction="small"), lrs=(0.5, 0.02),
                 state_factors=(1,), seeds=(0,))
    res = mixers_experiment(mixers=["kernel"], lr_sweep=sweep, out=tmp_path, **TINY)
    fits = res.lr_sweep
    assert sorted(fits["lr"]) == [0.02, 0.5] and set(fits["state_size"]) == {8}
    assert set(fits["family"]) == {"small-m24"}
    lr, evidence = res.summary.loc[0, "lr"], res.summary.loc[0, "lr_sweep"]
    assert evidence == " ".join(f"{r:g}:{int(k)}/1" for r, k in
                                fits.groupby("lr")["solved"].sum().items())
    # the grid's fits ran at the chosen rate: their stored parameters say so
    configs = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob(
        "mixers-*/config.json")]
    assert configs and all(c["params"]["lr"] == lr for c in configs), configs
    assert (tmp_path / "lr_sweep.csv").exists()
    assert "*lr*: the mixer's learning rate" in res.markdown


def test_a_grid_whose_control_fails_is_reported_invalid():
    control = dict(mixer="_NoTheoremExactMinIP", families=("exact-m8",))
    res = mixers_experiment(mixers=[_NoTheoremExactMinIP], control=control,
                            figures=False, **TINY)
    assert res.checks["control_solved"] is True and "INVALID" not in res.markdown
    res = mixers_experiment(mixers=["linear"], figures=False,
                            control=dict(mixer="linear", families=("exact-m8",)), **TINY)
    assert res.checks["control_solved"] is False
    assert res.markdown.splitlines()[2].startswith(
        "**INVALID: the control `linear` solved nothing on `exact-m8`")
    # a control that did not run, or ran on none of its families, checks nothing
    res = mixers_experiment(mixers=["linear"], figures=False,
                            control=dict(mixer="linear", families=("auto-m24",)), **TINY)
    assert "control_solved" not in res.checks


def test_a_family_may_set_its_own_training_settings():
    small = dict(n_bits=24, seq_len=3, construction="small")
    families = [{**small, "mixer": dict(max_epochs=2)},
                {**small, "orders": "all", "mixer": dict(max_epochs=3)}]
    options = {**TINY, "families": families, "mixer": {"stop_tolerance": 0.5}}
    res = mixers_experiment(mixers=["linear"], figures=False, **options)
    epochs = res.results.groupby("family")["n_epochs"].max()
    assert epochs.to_dict() == {"small-m24": 2, "small-m24-every-order": 3}
    assert "`small-m24`: max_epochs=2" in res.markdown
    # what the caller sets reaches every fit (as the command line's --max-epochs does)
    res = mixers_experiment(mixers=["linear"], figures=False,
                            **{**options, "mixer": {"max_epochs": 1}})
    assert res.results["n_epochs"].tolist() == [1, 1, 1, 1]
