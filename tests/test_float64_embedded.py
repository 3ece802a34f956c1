"""Exact means exact: in float64 every greedy speculative method reproduces greedy autoregressive decoding on
the embedded target, token for token — no near-tie excuse (float32's excuse is tested beside each method)."""
import pytest
import torch

import specdec_core as sd

PROMPTS = ["Give me three tips for writing clear Python code.",
           "Summarize in one sentence: The library will close early on Friday because the heating system is "
           "being repaired, and it will reopen on Monday at nine."]
METHODS = [("linear", "model"), ("linear", "ngram"), ("tree", "model"), ("parallel", "block")]


@pytest.fixture(scope="module")
def smol64():
    pair = sd.load_pair("smollm2-135m", dtype=torch.float64)
    assert pair.target.dtype == torch.float64
    return pair


@pytest.mark.slow
@pytest.mark.parametrize("text", PROMPTS)
def test_every_method_is_identical_to_autoregressive_in_float64(smol64, text):
    ids = smol64.encode_chat(text)
    ar = sd.generate(smol64.target, ids, max_new_tokens=32).tokens
    for method, drafter in METHODS:
        if drafter not in smol64.drafters:
            pytest.fail(f"the embedded pair lacks its {drafter!r} drafter")
        d = smol64.drafters[drafter]
        if drafter != "ngram":
            assert next(d.model.parameters()).dtype == torch.float64, f"{drafter} draft is not float64"
        out = sd.generate(smol64.target, ids, drafter=d, method=method, k=4, max_new_tokens=32)
        assert out.tokens == ar, f"{method}:{drafter} differs from autoregressive in float64"
        assert out.stats["target_passes"] <= len(ar)
