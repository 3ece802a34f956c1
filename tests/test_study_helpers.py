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
    assert serving.crossover([1, 2, 4], [1.2, 0.9, 0.8]) == 2 and serving.crossover([1, 2], [1.1, 1.2]) is None
    lat = serving.chunk_latencies([0.1, 0.2, 0.5, 0.5, 0.5])  # TTFT 100 ms, then a 1-token and a 3-token chunk
    assert lat["ttft_ms"] == pytest.approx(100) and lat["chunks"] == 3 and lat["tokens"] == 5
    assert lat["chunk_p50_ms"] == pytest.approx(200) and lat["token_p50_ms"] == pytest.approx(100)
