"""Adaptive speculation: the confidence stop and the hybrid drafter.

Both decide from the committed context and the draft's own laws only, which keeps them exact; the chapter-2 family
(tests/test_exactness.py, specs ``linear:hybrid``, ``linear:model@0.6``, ``parallel:block@0.6``) checks their
sampled laws and greedy identity. Here: that the stop does stop (and only where the draft is unsure), that the
hybrid really switches, that bad arguments are named, and that a stop which reads the target (the
:class:`~specdec_core.study.mutants.PeekingStop` mutant) is caught by the same goodness-of-fit test at the family's
level (α = 1e-3, fixed seeds: deterministic outcome; a correct sampler fails with probability 1e-3).
"""
import pytest
import torch

import specdec_core as sd
from specdec_core.adaptive import HybridDrafter
from specdec_core.lm import CachedLM
from specdec_core.sampling import SamplingParams, confidence
from specdec_core.study import exactness as ex
from specdec_core.study import mutants as mu

PROMPTS = [torch.tensor([1, 5, 3, 7, 2]), torch.tensor([9, 9, 4, 9, 9, 4, 9])]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with ex.torch_threads(1):
        yield


@pytest.mark.parametrize("method, drafter", [("linear", "model"), ("parallel", "block"), ("linear", "hybrid")])
@pytest.mark.parametrize("theta", [0.05, 0.5, 1.0])
def test_greedy_with_a_confidence_stop_is_autoregressive(toy16, method, drafter, theta):
    for p in PROMPTS:
        ref = sd.generate(toy16.target, p, max_new_tokens=20).tokens
        got = sd.generate(toy16.target, p, drafter=toy16.drafters[drafter], method=method, k=4, max_new_tokens=20,
                          confidence=theta)
        assert got.tokens == ref


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_stop_cuts_exactly_where_the_draft_is_unsure(toy16, temperature):
    """θ = 1: a draft is never that sure, so every step drafts exactly one token; a tiny θ drafts K; in between,
    each draft's positions after the first are exactly those whose law's top probability reached θ."""
    d, params = toy16.drafters["model"], SamplingParams(temperature)
    runs = {th: sd.generate(toy16.target, PROMPTS[0], drafter=d, method="linear", k=4, max_new_tokens=24,
                            temperature=temperature, confidence=th).stats for th in (1.0, 1e-9)}
    assert set(runs[1.0].drafted) == {1} and len(runs[1.0].drafted) == runs[1.0].target_passes - 1
    assert max(runs[1e-9].drafted) == 4
    g = torch.Generator().manual_seed(0)
    d.reset(PROMPTS[0], 64)
    ctx = PROMPTS[0].tolist()
    draft = d.propose(ctx, 4, params, g, confidence=0.4)
    d.reset(PROMPTS[0], 64)
    full = d.propose(ctx, 4, params, torch.Generator().manual_seed(0))
    assert draft.tokens.tolist() == full.tokens[:draft.tokens.numel()].tolist()  # a prefix of the same draws
    lm = CachedLM(d.model, 16)
    logits = lm.forward(torch.cat([PROMPTS[0], full.tokens[:-1]]))[-4:]
    law = None if params.greedy else full.q
    conf = confidence(logits, law)
    n = draft.tokens.numel()
    assert all(conf[1:n] >= 0.4) and (n == 4 or conf[n] < 0.4)


def test_hybrid_uses_lookup_where_the_context_repeats(toy16):
    h = toy16.drafters["hybrid"]
    assert isinstance(h, HybridDrafter)
    sd.generate(toy16.target, PROMPTS[1], drafter=h, method="linear", k=3, max_new_tokens=24)
    assert h.choices["ngram"] > 0 and h.choices["model"] > 0, h.choices
    assert sd.generate(toy16.target, torch.tensor([1]), drafter=h, method="linear", k=3, max_new_tokens=1).tokens


def test_bad_adaptive_arguments_are_named(toy16):
    d = toy16.drafters["model"]
    for bad in (0.0, 1.5, -1):
        with pytest.raises(ValueError, match="confidence"):
            sd.generate(toy16.target, PROMPTS[0], drafter=d, method="linear", confidence=bad)
    for method in ("tree", "autoregressive"):
        with pytest.raises(ValueError, match="confidence"):
            sd.generate(toy16.target, PROMPTS[0], drafter=d, method=method, confidence=0.5)
    with pytest.raises(ValueError, match="min_match"):
        HybridDrafter(toy16.drafters["ngram"], d, min_match=0)
    with pytest.raises(ValueError, match="confidence after '@'"):
        ex.spec_confidence("linear:model@high")


@pytest.fixture(scope="module")
def vocab8():
    return sd.toy_pair(vocab_size=8, seed=0, draft_noise=0.6)


def test_a_stop_that_reads_the_target_is_caught_and_the_real_stop_is_not(vocab8):
    """The same test, the same seeds, 3-token continuations (the first comes from the prefill, so the second step
    drafts K = 2): the confidence stop (θ = 0.6, which cuts most first steps here) passes, the peeking stop is
    rejected at α = 1e-3."""
    params, prompt, N = SamplingParams(1.0), torch.tensor([1, 2, 3]), 2000
    law = ex.sequence_law(vocab8.target, prompt, 3, params)
    model = vocab8.drafters["model"]
    cut = [sd.generate(vocab8.target, prompt, drafter=model, method="linear", k=2, max_new_tokens=3, temperature=1.0,
                       seed=i, confidence=0.6).stats.drafted[0] == 1 for i in range(100)]
    assert sum(cut) > 30, "θ = 0.6 should cut this draft's steps often, or the test below tests nothing"
    p = {}
    for name, drafter, theta in (("stop", model, 0.6), ("peek", mu.PeekingStop(model, vocab8.target), None)):
        s = ex.sample_sequences(vocab8.target, prompt, 3, N, params, "linear", drafter, k=2, seed0=7, threads=1,
                                confidence=theta)
        p[name] = ex.gof_test(s.counts(8), law, seed=7).pvalue
    assert p["stop"] > 1e-3, p
    assert p["peek"] < 1e-3, f"the peeking stop went undetected: {p}"
