"""Chapter 11's helpers (specdec_core.study.grounded): a traffic mix's speedup is a ratio of summed times (a mutant
that takes the median of per-request ratios is told apart), the identity count sees one changed token, the rule
picks by training medians, a warm memory is frozen after training, and a runner's per-prompt arguments override
its own (a request without a prediction decodes autoregressively)."""
import pandas as pd
import pytest
import torch

import specdec_core as sd
from specdec_core.data.prompts import traffic_mix
from specdec_core.study import bench, grounded

CHAT, GROUNDED = [f"c{i}" for i in range(4)], [f"g{i}" for i in range(4)]
SECONDS = {"autoregressive": {"c": 1.0, "g": 3.0}, "fast": {"c": 1.0, "g": 1.0}}  # grounded requests: 3× faster


def timed_runs(repeats: int = 2) -> pd.DataFrame:
    return pd.DataFrame([dict(id=i, runner=r, repeat=rep, seconds=s[i[0]]) for r, s in SECONDS.items()
                         for i in CHAT + GROUNDED for rep in range(repeats)])


def test_mix_speedup_is_the_ratio_of_summed_times():
    runs = timed_runs()
    mix = grounded.mix_speedup(runs, "autoregressive", CHAT, GROUNDED, [0.0, 0.25, 0.5, 1.0], n=4, seeds=(0, 1))
    got = mix.set_index("share")["median"]
    for share, n_g in ((0.0, 0), (0.25, 1), (0.5, 2), (1.0, 4)):  # n_g grounded requests of 4, each 3 s against 1 s
        assert got[share] == pytest.approx((4 - n_g + 3 * n_g) / 4)
    assert (mix.n == 4).all()  # 2 repeats × 2 seeds

    def median_of_ratios(share):  # the mutant: a per-request median ignores how long each request takes
        drawn = traffic_mix(CHAT, GROUNDED, share, 4, seed=0)
        return pd.Series([SECONDS["autoregressive"][i[0]] / SECONDS["fast"][i[0]] for i in drawn]).median()
    assert median_of_ratios(0.25) == 1.0 and got[0.25] == pytest.approx(1.5)  # the mutant reads no gain at all


def test_mix_speedup_refuses_bad_shares_and_a_missing_baseline():
    with pytest.raises(ValueError, match="shares"):
        grounded.mix_speedup(timed_runs(), "autoregressive", CHAT, GROUNDED, [1.5])
    with pytest.raises(ValueError, match="baseline"):
        grounded.mix_speedup(timed_runs(), "nobody", CHAT, GROUNDED, [0.5])


def test_greedy_identity_counts_a_changed_token():
    base = {(1, 2): [5, 6, 7], (3,): [1]}
    out = {"autoregressive": base, "same": dict(base), "off": {(1, 2): [5, 6, 8], (3,): [1]}}
    t = grounded.greedy_identity(out, "autoregressive").set_index("runner")
    assert t.loc["same"].tolist() == [2, 2, 0] and t.loc["off"].tolist() == [2, 1, 1]


def test_choose_picks_the_best_training_median_or_autoregressive():
    r = pd.DataFrame(dict(runner=["a", "b", "a", "b"], **{"class": ["x", "x", "y", "y"]},
                          median=[1.4, 1.9, 0.8, 0.95]))
    assert grounded.choose(r, {"x": ["a", "b"], "y": ["a", "b"]}) == {"x": "b", "y": "autoregressive"}
    with pytest.raises(ValueError, match="class 'z'"):
        grounded.choose(r, {"z": ["a"]})


def test_chosen_calls_take_the_rule_s_runner_per_class():
    runs = pd.DataFrame(dict(id=["p", "p", "q", "q"], runner=["a", "b", "a", "b"], **{"class": ["x", "x", "y", "y"]},
                             seconds=[1.0, 2.0, 3.0, 4.0]))
    got = grounded.chosen_calls(runs, {"x": "b", "y": "a"})
    assert got.seconds.tolist() == [2.0, 3.0] and set(got.runner) == {"chooser"}
    with pytest.raises(ValueError, match="picks no timed runner"):
        grounded.chosen_calls(runs, {"x": "b", "y": "nobody"})


def test_build_memory_learns_from_training_requests_then_freezes(toy):
    d = sd.SuffixDrafter(max_cached_requests=8)
    prompts = [torch.tensor([1, 2, 3, 1, 2]), torch.tensor([4, 5, 6, 4])]
    assert grounded.build_memory(toy.target, d, prompts, max_new_tokens=12, k=8, progress=False) == 2
    assert d.learn is False
    sd.generate(toy.target, [7, 1, 2], drafter=d, method="linear", k=8, max_new_tokens=12)
    assert len(d.cached) == 2  # a timed request after the build adds nothing
    with pytest.raises(ValueError, match="at least one"):
        grounded.build_memory(toy.target, d, [], 12, 8)


def test_a_runner_s_per_prompt_arguments_override_its_own(toy):
    ids = torch.tensor([1, 2, 3, 4, 1, 2])
    ar = sd.generate(toy.target, ids, max_new_tokens=10).tokens
    run = bench.decode_runner(toy.target, 10, method="linear", k=4,
                              per_prompt=lambda x: {"method": "autoregressive"})  # no drafter: only AR can run
    row = run(ids)
    assert row["tokens"] == ar and row["proposed"] == 0
    pred = bench.decode_runner(toy.target, 10, method="linear", k=4, per_prompt=lambda x: {"prediction": ar})
    row = pred(ids)
    assert row["tokens"] == ar and row["prediction_accepted"] > 0 and row["prediction_rejected"] == 0
