"""Predicted outputs (``generate(..., prediction=ids)``): the caller's expected answer drafts, and the output is the
target's whatever the prediction (exact, corrupted, random), greedy bit for bit and sampled in law.

False-positive rate: the law test is one goodness-of-fit test at α = 0.01 against the exact law of the first
three tokens (enumerated on the 8-token toy pair); its seeds are fixed, so a correct sampler fails it for at most
1 % of seeds. The mutant that takes predicted tokens on trust (``mutants.accept_untested``) must fail it.
"""
import numpy as np
import pytest
import torch

import specdec_core as sd
from specdec_core.drafters import PredictionDrafter
from specdec_core.sampling import SamplingParams
from specdec_core.study import exactness as ex
from specdec_core.study import mutants as mu

PROMPT = [4, 4, 4, 4, 9, 3, 2]


def _predictions(reference: list[int]) -> dict[str, list[int]]:
    noise = torch.randint(0, 16, (len(reference),), generator=torch.Generator().manual_seed(0)).tolist()
    return {"exact": reference, "corrupted": reference[:10] + [0] * 5 + reference[15:],
            "shifted": reference[5:], "random": noise}


@pytest.mark.parametrize("method", ["linear", "tree"])
def test_greedy_output_is_the_targets_whatever_the_prediction(toy16, method):
    ar = sd.generate(toy16.target, PROMPT, max_new_tokens=40)
    for name, pred in _predictions(ar.tokens).items():
        for drafter in (None, toy16.drafters["model"]):
            r = sd.generate(toy16.target, PROMPT, prediction=pred, drafter=drafter, method=method, k=8,
                            max_new_tokens=40)
            assert r.tokens == ar.tokens, (name, drafter)
            s = r.stats
            assert s.prediction_accepted + s.prediction_rejected <= sum(s.drafted)
            if name == "exact":  # the whole answer was predicted: every predicted token accepted
                assert s.prediction_rejected == 0 and s.prediction_accepted > 30 and s.target_passes <= 8
            if name == "random" and drafter is None:  # nothing right to draft: at most one pass per token
                assert s.target_passes <= 40 and s.prediction_rejected > 0


def test_after_a_divergence_the_prediction_resumes_where_the_output_does(toy16):
    ar = sd.generate(toy16.target, PROMPT, max_new_tokens=40).tokens
    pred = ar[:10] + [0] * 5 + ar[15:]
    d = PredictionDrafter(pred)
    d.reset(PROMPT, 64)
    d.at = 15  # where a step that drafted past the corrupted stretch left off
    j = d.resume(ar[:20])
    assert j >= 15 and pred[j:j + 5] == ar[20:25]  # it drafts what the output continues with
    d.at = 10
    assert d.resume(ar[:10] + [0]) == 11  # the corruption itself is followed too
    assert d.resume(ar[:5] + [15]) is None if 15 not in pred else pred[d.resume(ar[:5] + [15]) - 1] == 15


def test_the_counts_follow_the_steps(toy16):
    ar = sd.generate(toy16.target, PROMPT, max_new_tokens=30).tokens
    r = sd.generate(toy16.target, PROMPT, prediction=ar[:12] + [1, 2, 3] + ar[15:], method="linear", k=6,
                    max_new_tokens=30)
    s = r.stats
    assert s.prediction_accepted == sum(s.accepted_lengths) and s.prediction_rejected == sum(s.drafted) - sum(
        s.accepted_lengths)  # no fallback drafter: every draft was the prediction's


@pytest.mark.parametrize("bad, match", [([1.5], "integer"), ([99], "outside the vocabulary"), ([], "no tokens"),
                                        ("abc", "prediction must be"), ([[1, 2], [3, 4]], "1-D")])
def test_a_bad_prediction_is_refused(toy16, bad, match):
    with pytest.raises(ValueError, match=f"prediction.*{match}|{match}.*prediction|prediction"):
        sd.generate(toy16.target, PROMPT, prediction=bad, method="linear")


def test_a_prediction_needs_a_speculative_method(toy16):
    with pytest.raises(ValueError, match="speculative method"):
        sd.generate(toy16.target, PROMPT, prediction=[1, 2])
    with pytest.raises(ValueError, match="prediction is per request"):
        sd.generate_batch(toy16.target, [PROMPT], prediction=[1, 2], method="linear", drafter=toy16.drafters["ngram"])


def _law_pvalue(toy, prediction, N: int, rule=None, seed0: int = 0) -> float:
    params = SamplingParams(1.0)
    n = 3
    law = ex.sequence_law(toy.target, [1, 2, 3], n, params)
    tokens = np.array([sd.generate(toy.target, [1, 2, 3], prediction=prediction, method="linear", k=4,
                                   max_new_tokens=n, temperature=1.0, seed=seed0 + i, rule=rule).tokens
                       for i in range(N)])
    counts = np.bincount(ex.cell_index(tokens, 8), minlength=8 ** n)
    return ex.gof_test(counts, law, seed=seed0).pvalue


def test_sampled_predictions_keep_the_targets_law_and_the_mutant_does_not(toy):
    """T = 1: the first three tokens follow the target's exact law with the greedy answer as prediction (α = 0.01,
    one test); taking the predicted tokens on trust is caught at the same size."""
    prediction = sd.generate(toy.target, [1, 2, 3], max_new_tokens=8).tokens
    assert _law_pvalue(toy, prediction, 800, seed0=20_000) > 0.01
    assert _law_pvalue(toy, prediction, 800, rule=mu.accept_untested, seed0=21_000) < 0.01
