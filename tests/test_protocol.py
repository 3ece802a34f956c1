"""The evaluation protocol: distinct prompts are the unit, verdicts come from a test with a known false-positive
rate, low power says "cannot tell", and replays do not narrow an interval. Each test names the defect it catches."""
import numpy as np
import pandas as pd
import pytest

from specdec_core.study import bench, protocol, report


def test_wilcoxon_p_is_the_exact_signed_rank_test():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in (3, 6, 9, 14):
        r = np.exp(rng.normal(0.05, 0.1, n))
        assert protocol.wilcoxon_p(r) == pytest.approx(stats.wilcoxon(np.log(r), method="exact").pvalue)
    # all n units in one direction: the smallest p the arrangements allow, 2 / 2^n
    assert protocol.wilcoxon_p([1.1] * 6) == pytest.approx(2 / 2 ** 6)
    assert protocol.wilcoxon_p([1.0, 1.0]) == 1.0
    with pytest.raises(ValueError, match="not positive"):
        protocol.wilcoxon_p([1.1, -1.0])


def test_repeats_of_a_prompt_are_one_unit():
    r = protocol.by_unit([1.0, 1.2, 1.4, 2.0, 2.0], units=["a", "a", "a", "b", "b"])
    assert r.tolist() == [1.2, 2.0]
    with pytest.raises(ValueError, match="unit labels"):
        protocol.by_unit([1.0, 2.0], units=["a"])
    s = protocol.summarise([1.2] * 40, units=list(range(2)) * 20)  # 2 prompts replayed 20 times: n is 2
    assert s["n"] == 2 and s["power"] == 0 and s["p"] == 0.5


def _no_effect_sample(rng, prompts, repeats):
    """A run in which the two runners do not differ: each prompt has its own speed ratio noise around 1 (how
    prompts differ) and each repeat its own timing noise."""
    prompt_effect = rng.normal(0, 0.08, prompts)
    rows = []
    for i in range(prompts):
        for rep in range(repeats):
            base = 10 * np.exp(rng.normal(0, 0.03))
            rows += [dict(id=i, repeat=rep, runner="ar", tokens_per_s=base),
                     dict(id=i, repeat=rep, runner="sd", tokens_per_s=base * np.exp(prompt_effect[i]
                                                                                  + rng.normal(0, 0.03)))]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("prompts, repeats", [(6, 2), (12, 2), (8, 3)])
def test_no_effect_reads_faster_at_most_five_percent_of_the_time(prompts, repeats):
    """The book's sizes (6–12 prompts, 1–3 repeats): over 400 seeded runs without an effect, "faster" at most 5 %
    of the time (the test's own rate is at most 2.5 % a side)."""
    rng = np.random.default_rng(prompts * 10 + repeats)
    said = [report.verdict_of(bench.paired_ratios(_no_effect_sample(rng, prompts, repeats), "ar").iloc[0]) == "faster"
            for _ in range(400)]
    assert np.mean(said) <= 0.05, np.mean(said)


def test_the_iqr_rule_it_replaced_is_caught():
    """The mutant: the old rule, "faster" when the IQR's low end is above 1, at n = 6 prompts. Without an effect it
    reads "faster" about one run in nine, more than twice the rate the book states."""
    rng = np.random.default_rng(6)
    mutant = []
    for _ in range(800):
        d = _no_effect_sample(rng, 6, 1)
        ratio = d[d.runner == "sd"].tokens_per_s.values / d[d.runner == "ar"].tokens_per_s.values
        mutant.append(np.percentile(ratio, 25) > 1)
    assert np.mean(mutant) > 0.08, np.mean(mutant)


def test_a_real_effect_is_found_and_low_power_says_cannot_tell():
    rng = np.random.default_rng(3)
    strong = np.exp(rng.normal(np.log(1.3), 0.05, 12))
    s = protocol.summarise(strong)
    assert protocol.decide(s["median"], s["p"], s["power"], s["n_tell"]) == "faster"
    weak = [1.3, 1.2, 1.25]  # three prompts: no outcome of three can reach 5 %
    s = protocol.summarise(weak)
    said = protocol.decide(s["median"], s["p"], s["power"], s["n_tell"])
    assert said.startswith(protocol.CANNOT_TELL) and "prompts would tell" in said
    assert not report.VERDICT_WORDS.search(said)
    flat = np.exp(rng.normal(0, 0.01, 20))  # no change, tightly measured: the test would have seen 10 %
    s = protocol.summarise(flat)
    assert s["power"] >= protocol.POWER_MIN
    assert protocol.decide(s["median"], s["p"], s["power"], s["n_tell"]) == "ties"
    # a mutant that says "ties" whatever the power is caught by the three prompts above
    assert protocol.decide(1.0, 0.9, 0.1, 40) != "ties"


def test_power_grows_with_n_and_is_zero_where_no_outcome_reaches_the_level():
    assert protocol.power(5, 0.1) == 0.0  # 2 / 2^5 = 0.0625 > 0.05
    p = [protocol.power(n, 0.1) for n in (6, 10, 20, 40)]
    assert all(a < b for a, b in zip(p, p[1:])) and p[-1] > 0.9
    assert protocol.power(8, 0.1) == protocol.power(8, 0.1)  # seeded: the same data gives the same power
    n = protocol.n_to_tell(0.1)  # the first n with even odds: one fewer has less
    assert protocol.power(n, 0.1) >= protocol.POWER_MIN > protocol.power(n - 1, 0.1)


def test_holm_controls_the_family():
    assert protocol.holm([0.01, 0.04, 0.03, 0.5]).tolist() == pytest.approx([0.04, 0.09, 0.09, 0.5])
    out = protocol.holm([0.01, np.nan])
    assert out[0] == 0.01 and np.isnan(out[1])
    # family-wise: with 5 true nulls (uniform p), a rejection anywhere at most ~5 % of the time
    rng = np.random.default_rng(0)
    any_rejected = [(protocol.holm(rng.uniform(size=5)) <= 0.05).any() for _ in range(4000)]
    assert np.mean(any_rejected) <= 0.06


def test_replays_do_not_narrow_a_cluster_interval():
    """12 distinct requests each replayed 40 times get an interval about as wide as the 12 requests alone; a
    bootstrap that resamples replays as if independent (the mutant) is several times narrower."""
    rng = np.random.default_rng(1)
    requests = rng.lognormal(0, 0.3, 12)
    replayed = np.repeat(requests, 40) * rng.lognormal(0, 0.01, 480)
    ids = np.repeat(np.arange(12), 40)
    lo12, hi12 = protocol.cluster_bootstrap(requests, np.arange(12))
    lo, hi = protocol.cluster_bootstrap(replayed, ids)
    assert (hi - lo) == pytest.approx(hi12 - lo12, rel=0.35)
    lo_m, hi_m = protocol.cluster_bootstrap(replayed, np.arange(480))  # every replay its own cluster
    assert (hi_m - lo_m) < 0.5 * (hi - lo)


def test_a_row_picked_on_the_eval_prompts_is_adjusted_and_labelled():
    ratios = np.linspace(1.1, 1.4, 8)  # 8 prompts, all faster: p = 2 / 256
    alone, note_alone = report.verdict_table([dict(finding="a", ratios=ratios)])
    picked, note = report.verdict_table([dict(finding="a", ratios=ratios, selected_from=8)])
    assert alone.verdict.iloc[0] == "faster"
    assert picked.verdict.iloc[0].startswith("cannot tell")  # 8 × 2/256 > 5 %: the selection costs the verdict
    assert "Bonferroni" in note and "Bonferroni" not in note_alone
