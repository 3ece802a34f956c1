"""The benchmark bookkeeping: paired ratios, the runner row, and the per-call theory check."""
import math
import numpy as np
import pandas as pd
import pytest
import torch

import specdec_core as sd
from specdec_core.study import bench, theory


def synthetic_runs(alphas, k=4, c=0.1, verify=1.3, t_token=0.05, n=65, slowdown=1.0):
    """Rows as generate_runner writes them, timed exactly as Theorem 3.8 (with the verify cost) says."""
    rows = []
    for i, a in enumerate(alphas):
        steps = 40
        acc = int(round(a * 100))  # accepted / (accepted + rejections) = a
        rows.append(dict(id=f"p{i}", task="t", repeat=0, runner="ar", decode_tokens=n - 1,
                         decode_s=(n - 1) * t_token, accepted=0, rejections=0, tokens_per_s=1.0))
        s = float(theory.speedup(a, k, c, verify))
        rows.append(dict(id=f"p{i}", task="t", repeat=0, runner="sd", decode_tokens=n - 1,
                         decode_s=(n - 1) * t_token / s * slowdown, accepted=acc, rejections=100 - acc,
                         proposed=steps * k, tokens_per_s=1.0))
    return pd.DataFrame(rows)


def test_theory_check_agrees_with_the_theory_and_catches_a_slow_loop():
    alphas = [0.1, 0.3, 0.5, 0.8]
    calls, th = bench.theory_check(synthetic_runs(alphas), "sd", "ar", k=4, c=0.1, verify_ratio=1.3)
    assert th["calls"] == 4 and th["rel_error"] < 1e-9
    assert np.allclose(calls.alpha_hat, alphas) and np.allclose(calls.measured, calls.predicted)
    # per call vs pooled: the speedup is convex in α, so one pooled α̂ mispredicts the median here
    assert abs(th["predicted_pooled"] - th["predicted_median"]) > 0.01
    # a loop 15% slower than its passes account for is reported as a 15% disagreement
    _, slow = bench.theory_check(synthetic_runs(alphas, slowdown=1 / 0.85), "sd", "ar", 4, 0.1, 1.3)
    assert slow["rel_error"] == pytest.approx(0.15)


def test_theory_check_skips_calls_too_short_to_time():
    df = synthetic_runs([0.3, 0.5])
    df.loc[df.id == "p0", "decode_tokens"] = 3
    _, th = bench.theory_check(df, "sd", "ar", 4, 0.1, 1.3)
    assert th["calls"] == 1


def test_generate_runner_row_on_a_toy_pair():
    toy = sd.toy_pair(vocab_size=16, seed=0)
    run = bench.generate_runner(toy.target, 12, method="linear", drafter=toy.drafters["model"], k=3,
                                keep_steps=True)
    row = run(torch.tensor([1, 2, 3]))
    assert len(row["tokens"]) == 12 and row["decode_tokens"] == 11 and row["decode_s"] > 0
    assert row["accepted"] == sum(row["accepted_lengths"]) <= row["proposed"]
    assert 0 <= row["rejections"] <= len(row["accepted_lengths"])


def test_pooled_alpha_sums_before_dividing():
    """Two calls 3/(3+1) and 1/(1+3) pool to 4/8, not to the mean of the ratios; no test at all leaves α undefined
    (NaN, as ``Stats.alpha`` of an autoregressive run): both through the one α function, record.acceptance_rate."""
    import pandas as pd

    from specdec_core.study import bench

    df = pd.DataFrame(dict(runner=["a", "a", "b"], task=["x", "y", "x"], accepted=[3, 1, 0], rejections=[1, 3, 0]))
    got = bench.pooled_alpha(df)
    assert got["a"] == 0.5 and math.isnan(got["b"])
    assert bench.pooled_alpha(df, ["runner", "task"])[("a", "x")] == 0.75


def test_stored_k_reads_the_draft_s_calibrated_fixed_k_and_refuses_without_one():
    toy = sd.toy_pair(vocab_size=16, seed=0)
    spec = {"method": "linear", "drafter": "model", "k": "auto"}
    with pytest.raises(ValueError, match="no K stored|none"):
        bench.stored_k(toy, spec)  # a toy draft has no confidence.json
    toy.drafters["model"].calibration = {"fixed_k": 3, "theta": {}, "method": "linear"}
    assert bench.stored_k(toy, spec) == dict(spec, k=3) and spec["k"] == "auto"  # a copy: the parameter stays
    assert bench.stored_k(toy, dict(spec, k=5))["k"] == 5  # a number is kept
