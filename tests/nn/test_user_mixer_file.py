"""A mixer defined in a user's own file: a :class:`~minip_learn.nn.Mixer` subclass with
``@register_mixer("name")``, imported, is in the registry, the registry's table, the
estimator and the mixers leaderboard with no other edit."""

import importlib
import sys
import textwrap

import pytest
import torch

from minip_learn import SequenceMixerRegressor
from minip_learn.datasets import make_minip
from minip_learn.experiments import mixers_experiment
from minip_learn.nn import available_mixers, get_mixer, mixer_table, unregister_mixer

NAME = "test-file-running-mean"

SOURCE = f'''
"""A running mean of the values: a mixer in a user's file."""

import torch

from minip_learn.nn import Mixer, register_mixer


@register_mixer({NAME!r})
class RunningMean(Mixer):
    """``u_t`` is the mean of ``v_1 .. v_t``."""

    theorem = "no"
    paper = "none: a test of a user's file"
    state_formula = "d + 1"

    def attend(self, x):
        v = self.value(x)
        return v.cumsum(1) / torch.arange(1, x.shape[1] + 1).to(v)[:, None]

    def initial_state(self, batch, *, dtype, device):
        return (torch.zeros(batch, self.value_dim, dtype=dtype, device=device),
                torch.zeros(batch, 1, dtype=dtype, device=device))

    def step(self, state, x_t, position=0):
        total, count = state[0] + self.value(x_t), state[1] + 1
        return (total, count), total / count

    def state_floats(self, seq_len=None):
        return self.value_dim + 1
'''


@pytest.fixture
def user_mixer(tmp_path, monkeypatch):
    """The module written to ``tmp_path`` and imported; unregistered afterwards."""
    (tmp_path / "my_running_mean.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_running_mean")
    yield module.RunningMean
    unregister_mixer(NAME)
    sys.modules.pop("my_running_mean", None)
    assert NAME not in available_mixers()


def test_a_mixer_in_a_user_file_is_registered_by_importing_it(user_mixer):
    assert NAME in available_mixers() and NAME in available_mixers(theorem="no")
    assert get_mixer(NAME) is user_mixer
    row = next(row for row in mixer_table() if row["name"] == NAME)
    assert (row["theorem"], row["state"]) == ("no", "d + 1")
    assert row["class"] == "my_running_mean.RunningMean"
    mixer = get_mixer(NAME)(4, 2).double()
    x = torch.rand(2, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(mixer(x), mixer.recurrent(x))


def test_a_mixer_in_a_user_file_trains_as_a_named_mixer(user_mixer):
    X, y = make_minip(32, seq_len=3, n_bits=5, query="last", random_state=0)
    est = SequenceMixerRegressor(mixer=NAME, state_size=2, max_epochs=3,
                                 random_state=0).fit(X, y)
    assert type(est.net_.module_) is user_mixer
    assert (est.theorem_, est.state_floats_, est.query_) == ("no", 6, "last")
    assert est.predict(X).shape == (32,)


def test_a_mixer_in_a_user_file_is_on_the_leaderboard(user_mixer):
    res = mixers_experiment(families=[dict(n_bits=24, seq_len=3, construction="small")],
                            state_sizes=[2], seeds=(0,), mixer={"max_epochs": 1},
                            progress=False, figures=False, n_jobs=1)
    assert res.summary["mixer"].tolist() == available_mixers()
    assert res.summary.set_index("mixer").loc[NAME, "theorem"] == "no"
    fits = res.results[res.results["mixer"] == NAME]
    assert fits["state_floats"].tolist() == [24 + 1]  # d + 1 at d = n_bits = 24
