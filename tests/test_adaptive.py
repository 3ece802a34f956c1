"""Adaptive speculation: the confidence stop (chains and trees), ``confidence="auto"``, the hybrid drafter and the
chooser that picks lookup or the model from past acceptance.

All decide from the committed context, the draft's own laws and past verdicts only, which keeps them exact; the
chapter-2 family (tests/test_exactness.py, specs ``linear:hybrid``, ``linear:adaptive``, ``linear:model@0.6``,
``parallel:block@0.6``, ``tree:model@0.3``) checks their sampled laws and greedy identity. Here: that the stops do
stop (and only where the draft is unsure), that the hybrid and the chooser really switch, that "auto" reads the
stored θ, that bad arguments are named, and that a stop and a chooser which read the target (the
:class:`~specdec_core.study.mutants.PeekingStop` and :class:`~specdec_core.study.mutants.PeekingChooser` mutants)
are caught by the same goodness-of-fit test at the family's level (α = 1e-3, fixed seeds: deterministic outcome;
a correct sampler fails with probability 1e-3).
"""
import pytest
import torch

import specdec_core as sd
from specdec_core.adaptive import ChoosingDrafter, HybridDrafter
from specdec_core.models import calibration
from specdec_core.lm import CachedLM
from specdec_core.sampling import SamplingParams, confidence
from specdec_core.study import exactness as ex
from specdec_core.study import mutants as mu
from specdec_core.tree import Dynamic, Tree, TreeBuilder

PROMPTS = [torch.tensor([1, 5, 3, 7, 2]), torch.tensor([9, 9, 4, 9, 9, 4, 9])]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with ex.torch_threads(1):
        yield


@pytest.mark.parametrize("method, drafter, tree", [("linear", "model", None), ("parallel", "block", None),
                                                  ("linear", "hybrid", None), ("linear", "adaptive", None),
                                                  ("tree", "model", None), ("tree", "block", None),
                                                  ("tree", "model", Dynamic(budget=10))])
@pytest.mark.parametrize("theta", [0.05, 0.5, 1.0])
def test_greedy_with_a_confidence_stop_is_autoregressive(toy16, method, drafter, tree, theta):
    for p in PROMPTS:
        ref = sd.generate(toy16.target, p, max_new_tokens=20).tokens
        got = sd.generate(toy16.target, p, drafter=toy16.drafters[drafter], method=method, k=4, max_new_tokens=20,
                          confidence=theta, tree=tree)
        assert got.tokens == ref


def test_a_tree_grows_only_below_nodes_scored_at_least_theta():
    """The rule on known laws: a static tree [2, 2] with θ = 0.3; the root's children score 0.6 and 0.25 (the law's
    two largest values), so only the first gets children, scored 0.6 × 0.5 and 0.6 × 0.3; θ = 0.25 keeps both."""
    law = torch.tensor([[0.6, 0.25, 0.1, 0.05]], dtype=torch.float64)
    for theta, kids in ((0.3, [2, 0]), (0.25, [2, 2])):
        b = TreeBuilder(Tree.from_branching([2, 2]), 2, confidence=theta)
        b.add(0, [0, 1], None) if b.plan(law) == [2] else pytest.fail("the root's children are always drafted")
        assert b.advance() and b.scores[1:] == pytest.approx([0.6, 0.25])
        assert b.plan(torch.tensor([[0.5, 0.3, 0.2, 0.0]] * 2, dtype=torch.float64)) == kids
    b = TreeBuilder(Tree.from_branching([2, 2]), 2, confidence=0.9)
    b.add(0, [0, 1], None) if b.plan(law) == [2] else pytest.fail("the root's children are always drafted")
    assert not b.advance(), "every node below θ: no draft pass may be spent on that depth"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_confidence_prunes_and_a_tiny_theta_changes_nothing(toy16, temperature):
    """θ = 1: only the root's children are drafted (one draft pass a step); θ → 0: the unpruned tree, draw for
    draw (the same tokens and step records)."""
    d, p = toy16.drafters["model"], PROMPTS[0]
    kw = dict(drafter=d, method="tree", k=4, max_new_tokens=24, temperature=temperature)
    top = sd.generate(toy16.target, p, confidence=1.0, **kw).stats
    drafting = top.drafted[:-1] if top.drafted[-1] == 0 else top.drafted  # a last step with room 1 drafts nothing
    assert set(drafting) == {3} and top.draft_passes == len(drafting)  # default tree: 3 root children
    full, tiny = sd.generate(toy16.target, p, **kw), sd.generate(toy16.target, p, confidence=1e-12, **kw)
    assert tiny.tokens == full.tokens and tiny.stats.drafted == full.stats.drafted


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_stop_cuts_exactly_where_the_draft_is_unsure(toy16, temperature):
    """θ = 1: a draft is never that sure, so every step drafts exactly one token; a tiny θ drafts K; in between,
    each draft's positions after the first are exactly those whose law's top probability reached θ."""
    d, params = toy16.drafters["model"], SamplingParams(temperature)
    runs = {th: sd.generate(toy16.target, PROMPTS[0], drafter=d, method="linear", k=4, max_new_tokens=24,
                            temperature=temperature, confidence=th).stats for th in (1.0, 1e-9)}
    drafting = runs[1.0].drafted[:-1] if runs[1.0].drafted[-1] == 0 else runs[1.0].drafted  # room 1: no draft
    assert set(drafting) == {1} and len(runs[1.0].drafted) == runs[1.0].target_passes - 1
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


def test_the_chooser_switches_on_past_verdicts_only(toy16):
    """Lookup is used where it matches and has done well; after rejections its estimate falls below the model's
    and the model drafts, from the counts alone (the same context, two histories)."""
    c = toy16.drafters["adaptive"]
    assert isinstance(c, ChoosingDrafter)
    sd.generate(toy16.target, PROMPTS[1], drafter=c, method="linear", k=3, max_new_tokens=24)
    assert c.choices["ngram"] > 0 and sum(c.counts["ngram"]) > 0, (c.choices, c.counts)
    ctx = PROMPTS[1].tolist()
    c.reset(PROMPTS[1], 64)
    d = c.propose(ctx, 3, SamplingParams(), None)
    assert c._last is c.ngram and d.state["by"] is c.ngram  # no evidence yet: lookup's match wins (free drafting)
    c.accept(d, 0)
    assert c.counts["ngram"] == [0, 1]  # the rejection is counted against the drafter that proposed
    c.counts = {"ngram": [0, 30], "model": [30, 0]}
    c.propose(ctx, 3, SamplingParams(), None)
    assert c._last is c.model
    with pytest.raises(ValueError, match="cost"):
        ChoosingDrafter(toy16.drafters["ngram"], toy16.drafters["model"], cost=-1)


def test_auto_reads_the_calibrated_theta(toy16, tmp_path):
    """"auto" decodes exactly as the stored θ; a drafter without one, or a malformed file, is named."""
    d, p = toy16.drafters["model"], PROMPTS[0]
    with pytest.raises(ValueError, match="auto"):
        sd.generate(toy16.target, p, drafter=d, method="linear", confidence="auto")
    rec = dict(method="linear", k_max=4, theta={"model": 0.5, "hybrid": 0.7, "adaptive": 0.7}, fixed_k=1, cost=0.1)
    calibration.save(tmp_path, rec)
    pair = sd.toy_pair(vocab_size=16, seed=1)
    calibration.attach(pair.drafters, calibration.load(tmp_path))
    for name, theta in (("model", 0.5), ("hybrid", 0.7)):
        kw = dict(drafter=pair.drafters[name], method="linear", k=4, max_new_tokens=20, temperature=1.0)
        a, b = sd.generate(pair.target, p, confidence="auto", **kw), sd.generate(pair.target, p, confidence=theta, **kw)
        assert a.tokens == b.tokens and a.stats.drafted == b.stats.drafted
    with pytest.raises(ValueError, match="auto"):  # calibrated for linear decoding only
        sd.generate(pair.target, p, drafter=pair.drafters["model"], method="tree", confidence="auto")
    calibration.save(tmp_path, dict(rec, theta={"model": 1.5}))
    with pytest.raises(ValueError, match="confidence.json"):
        calibration.load(tmp_path)


def test_bad_adaptive_arguments_are_named(toy16):
    d = toy16.drafters["model"]
    for bad in (0.0, 1.5, -1, "high", True):
        with pytest.raises(ValueError, match="confidence"):
            sd.generate(toy16.target, PROMPTS[0], drafter=d, method="linear", confidence=bad)
    with pytest.raises(ValueError, match="confidence"):
        sd.generate(toy16.target, PROMPTS[0], method="autoregressive", confidence=0.5)
    with pytest.raises(ValueError, match="min_match"):
        HybridDrafter(toy16.drafters["ngram"], d, min_match=0)
    with pytest.raises(ValueError, match="confidence after '@'"):
        ex.spec_confidence("linear:model@high")


@pytest.fixture(scope="module")
def vocab8():
    return sd.toy_pair(vocab_size=8, seed=0, draft_noise=0.6)


def test_a_stop_that_reads_the_target_is_caught_and_the_real_stop_is_not(vocab8):
    """The same test, the same seeds, 4-token continuations (the first comes from the prefill, so the second step,
    with room for 3, drafts K = 2): the confidence stop (θ = 0.6, which cuts most first steps here) passes, the peeking stop is
    rejected at α = 1e-3."""
    params, prompt, N = SamplingParams(1.0), torch.tensor([1, 2, 3]), 2000
    law = ex.sequence_law(vocab8.target, prompt, 4, params)
    model = vocab8.drafters["model"]
    cut = [sd.generate(vocab8.target, prompt, drafter=model, method="linear", k=2, max_new_tokens=4, temperature=1.0,
                       seed=i, confidence=0.6).stats.drafted[0] == 1 for i in range(100)]
    assert sum(cut) > 30, "θ = 0.6 should cut this draft's steps often, or the test below tests nothing"
    p = {}
    for name, drafter, theta in (("stop", model, 0.6), ("peek", mu.PeekingStop(model, vocab8.target), None)):
        s = ex.sample_sequences(vocab8.target, prompt, 4, N, params, "linear", drafter, k=2, seed0=7, threads=1,
                                confidence=theta)
        p[name] = ex.gof_test(s.counts(8), law, seed=7).pvalue
    assert p["stop"] > 1e-3, p
    assert p["peek"] < 1e-3, f"the peeking stop went undetected: {p}"


def test_a_chooser_that_reads_the_target_is_caught_and_the_real_chooser_is_not(vocab8):
    """The same test and seeds; the prompt holds every token, so lookup always has a continuation to switch to:
    the chooser passes, the chooser that swaps in lookup where the target disfavours the model's drawn token is
    rejected at α = 1e-3 (4-token continuations, as above). This mutant is the louder one: 1000 continuations
    suffice where the stop's mutant above takes 2000."""
    params, prompt, N = SamplingParams(1.0), torch.arange(8), 1000
    law = ex.sequence_law(vocab8.target, prompt, 4, params)
    peek = mu.PeekingChooser(vocab8.drafters["model"], vocab8.target, vocab8.drafters["ngram"])
    p = {}
    for name, drafter in (("chooser", vocab8.drafters["adaptive"]), ("peek", peek)):
        s = ex.sample_sequences(vocab8.target, prompt, 4, N, params, "linear", drafter, k=2, seed0=7, threads=1)
        p[name] = ex.gof_test(s.counts(8), law, seed=7).pvalue
    assert p["chooser"] > 1e-3, p
    assert p["peek"] < 1e-3, f"the peeking chooser went undetected: {p}"
