"""The chapters' library helpers on hand-made inputs whose answers are known."""
import pandas as pd
import pytest
import torch

from specdec_core.kvcache import KVCache
from specdec_core.study import bench, profiling, serving, treesearch
from specdec_core.tree import Tree


def test_kv_bytes_per_slot_is_what_the_cache_allocates(toy):
    c = KVCache(toy.target.config, 10, torch.float64, "cpu")
    assert profiling.kv_bytes_per_slot(toy.target) * 10 == c.nbytes()


def test_acceptance_by_position_counts_reached_and_accepted():
    # three K = 3 steps: accepted 0 (rejected at 1), 2 (rejected at 3), 3 (all); proposed = tested
    steps = pd.DataFrame(dict(accepted=[0, 2, 3], proposed=[1, 3, 3], drafted=[3, 3, 3]))
    t = bench.acceptance_by_position(steps).set_index("position")
    assert t.reached.tolist() == [3, 2, 2] and t.steps.tolist() == [3, 3, 3]
    assert t.conditional.tolist() == pytest.approx([2 / 3, 1.0, 0.5])
    assert t.cumulative.tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3])


def test_tree_step_cost_and_throughput_on_a_synthetic_cost_table():
    costs = pd.DataFrame(dict(model=["target"] * 2 + ["draft"] * 2, tokens=[1, 11, 1, 11],
                              fitted=[10.0, 20.0, 1.0, 2.0]))
    chain, wide = Tree.chain(3), Tree.from_branching([2, 2])
    # chain: draft passes over widths [1, 1, 1] = 3 ms, verify over 4 tokens = 10 + 3 = 13 ms
    assert treesearch.step_ms(chain, costs) == pytest.approx(3 * 1.0 + 13.0)
    # 2 + 4 nodes: draft passes over [1, 2] = 1 + 1.1, verify over 7 tokens = 16
    assert treesearch.step_ms(wide, costs) == pytest.approx(1.0 + 1.1 + 16.0)
    df = treesearch.predicted_throughput({"chain": chain, "wide": wide}, {"chain": 1.0, "wide": 1.5}, costs)
    assert df.loc["chain", "predicted_tokens_per_s"] == pytest.approx(1e3 * 2 / 16.0)
    assert not df.loc["chain", "branching"] and df.loc["wide", "branching"]


def test_serving_prediction_and_latencies():
    cost = pd.DataFrame(dict(who=["target"] * 4 + ["draft"] * 2, T=[1, 2, 5, 10, 1, 2],
                             seconds=[1.0, 1.0, 1.5, 3.0, 0.1, 0.1]))
    # tau 1.5, K = 4: B = 1 -> 1.5 * 1 / (4 * 0.1 + 1.5); B = 2 -> 1.5 * 1 / (0.4 + 3.0)
    assert serving.predict_speedup(cost, 1, 4, 1.5, drafted=True) == pytest.approx(1.5 / 1.9)
    assert serving.predict_speedup(cost, 2, 4, 1.5, drafted=False) == pytest.approx(0.5)
    # rows feeding 3 tokens on average (prompt lookup found 2): a packed pass over 6 tokens, 1.5 + (3.0 - 1.5) / 5
    assert serving.predict_speedup(cost, 2, 4, 1.5, drafted=False, fed=3) == pytest.approx(1.5 / 1.8)
    assert serving.crossover([1, 2, 4], [1.2, 0.9, 0.8]) == 2 and serving.crossover([1, 2], [1.1, 1.2]) is None
    lat = serving.chunk_latencies([0.1, 0.2, 0.5, 0.5, 0.5])  # TTFT 100 ms, then a 1-token and a 3-token chunk
    assert lat["ttft_ms"] == pytest.approx(100) and lat["chunks"] == 3 and lat["tokens"] == 5
    assert lat["chunk_p50_ms"] == pytest.approx(200) and lat["token_p50_ms"] == pytest.approx(100)


def test_rank_trend_p_is_exact_over_the_arrangements():
    """The permutation p counts every distinct arrangement: against brute force over all n! orders (ties counted
    as often as they occur), and at chapter 9's shape (5 batch sizes × 2 ratios, a perfectly falling trend) it is
    2 / (10! / 2!^5) = 2 / 113400, where scipy's t-approximation prints a p orders of magnitude smaller."""
    import itertools

    import numpy as np
    from scipy import stats as st

    x, y = [1, 1, 2, 3, 3, 4, 5], [0.3, 0.1, 0.5, 0.4, 0.9, 0.7, 0.8]
    got = serving.rank_trend(x, y)
    rho = st.spearmanr(x, y)[0]
    hits = sum(abs(st.spearmanr(p, y)[0]) >= abs(rho) - 1e-12 for p in itertools.permutations(x))
    assert got["rho"] == pytest.approx(rho) and got["p"] == pytest.approx(hits / 5040)
    assert got["arrangements"] == 5040 // 4 and got["p_method"].startswith("exact permutation")
    B = [1, 1, 2, 2, 4, 4, 8, 8, 16, 16]
    falling = list(np.linspace(1.3, 0.5, 10))  # the ratio falls with B, two distinct ratios at each B
    exact = serving.rank_trend(B, falling)
    assert exact["arrangements"] == 113400 and exact["p"] == pytest.approx(2 / 113400) and exact["rho"] < -0.9
    assert st.spearmanr(B, falling)[1] < exact["p"] / 10  # scipy's t-approximation, 2.3e-07: below any p possible
    drawn = serving.rank_trend(x, y, exact_max=100, draws=20_000, seed=1)  # too many to count: seeded draws
    assert "draws" in drawn["p_method"] and drawn["p"] == pytest.approx(got["p"], abs=0.02)
    assert np.isnan(serving.rank_trend([1, 1, 1], [1, 2, 3])["p"])
    with pytest.raises(ValueError, match="differ in length"):
        serving.rank_trend([1, 2, 3], [1, 2])


def test_draft_cost_is_per_one_token_target_pass():
    """c = draft seconds per draft pass ÷ a one-token target pass (autoregressive decoding's step on the same
    prompt and repeat), not ÷ the speculative runner's own K + 1-token verify pass (which gave 0.0667 here)."""
    from specdec_core.study import calibrate

    runs = pd.DataFrame([
        dict(id=i, repeat=0, runner="autoregressive", draft_s=0.0, draft_passes=0, verify_s=0.010 * 20, steps=20)
        for i in range(3)] + [
        dict(id=i, repeat=0, runner="model, K=4", draft_s=0.001 * 40, draft_passes=40, verify_s=0.015 * 10, steps=10)
        for i in range(3)])
    assert calibrate.draft_cost(runs, "model, K=4") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="baseline"):
        calibrate.draft_cost(runs[runs.runner != "autoregressive"], "model, K=4")
