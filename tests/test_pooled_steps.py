"""bench.pooled_steps: α pooled over the steps of each group's runs (chapter 3's acceptance table)."""
import math

import pandas as pd

import specdec_core as sd
from specdec_core.study import bench


def test_pooled_steps_pools_steps_not_runs():
    runs = pd.DataFrame([
        dict(drafter="a", task="qa", accepted_lengths=[4, 4], proposed=[4, 4], alpha_predicted=0.9, tau=5.0),
        dict(drafter="a", task="qa", accepted_lengths=[0], proposed=[1], alpha_predicted=0.5, tau=1.0),
        dict(drafter="b", task="qa", accepted_lengths=[1, 2, 0], proposed=[2, 3, 1], alpha_predicted=0.4, tau=2.0),
        dict(drafter="b", task="rag", accepted_lengths=[], proposed=[], alpha_predicted=float("nan"), tau=1.0),
    ])
    t = bench.pooled_steps(runs, ["drafter", "task"]).set_index(["drafter", "task"])
    assert list(t.columns) == ["alpha", "alpha_predicted", "tau", "n"]
    assert t.loc[("a", "qa"), "alpha"] == 8 / 9  # pooled over the 3 steps; the mean of the runs' α would be 0.5
    assert t.loc[("a", "qa"), "alpha_predicted"] == 0.7 and t.loc[("a", "qa"), "tau"] == 3.0
    assert t.loc[("a", "qa"), "n"] == 2 and t.loc[("b", "qa"), "n"] == 1
    assert t.loc[("b", "qa"), "alpha"] == 3 / 6
    assert math.isnan(t.loc[("b", "rag"), "alpha"])  # nothing tested: NaN, not a division by zero
    only_tau = bench.pooled_steps(runs, ["drafter"], means=("tau",))
    assert list(only_tau.columns) == ["drafter", "alpha", "tau", "n"]


def test_pooled_steps_of_one_run_is_its_stats_alpha(toy):
    r = sd.generate(toy.target, [1, 2, 3], drafter=toy.drafters["model"], method="linear", k=3,
                    max_new_tokens=20, temperature=1.0, seed=0)
    s = r.stats
    runs = pd.DataFrame([dict(g=0, accepted_lengths=s.accepted_lengths, proposed=s.proposed, alpha_predicted=s.alpha_predicted,
                              tau=s.tau)])
    assert bench.pooled_steps(runs, ["g"]).alpha.iloc[0] == s.alpha
