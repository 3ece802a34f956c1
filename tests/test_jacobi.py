"""The Jacobi drafter (:class:`specdec_core.adaptive.jacobi.JacobiDrafter`): exact, and fed by the verify passes.

Greedy runs equal autoregressive decoding token for token, on toy pairs and on the embedded target. The law test
runs 400 continuations of 4 tokens at T = 1 on the toy pair (so that steps after the first draft from the iterate
and the pool), Pearson's test against the enumerated law at α = 0.01: an exact sampler fails it with probability
<= 1% over seeds, and the seeds are fixed. The negative control (:class:`~specdec_core.study.mutants.JacobiSoftQ`,
q from the last verify pass's softmax instead of the one-hot on the token proposed) must be rejected at the same α
with the same sizes and seeds.
"""
from __future__ import annotations

import functools

import pytest
import torch

import specdec_core as sd
from specdec_core.adaptive.jacobi import JacobiDrafter
from specdec_core.sampling import SamplingParams
from specdec_core.study import exactness as ex
from specdec_core.study import mutants as mu

ALPHA, SEED = 0.01, 43_000
LAW_PROMPT = [4, 3, 1, 4, 7, 4, 3, 2, 4]
LAW_N, LAW_LEN = 400, 4


@pytest.mark.parametrize("vocab,seed", [(8, 0), (16, 1), (32, 2)])
def test_greedy_jacobi_gives_the_autoregressive_tokens_and_drafts(vocab, seed):
    pair = sd.toy_pair(vocab_size=vocab, seed=seed)
    ids = torch.tensor([1, 2, 3, 4, 5, 1, 2])
    ar = sd.generate(pair.target, ids, max_new_tokens=40)
    for k in (1, 3, 6):
        r = sd.generate(pair.target, ids, drafter=pair.drafters["jacobi"], method="linear", k=k, max_new_tokens=40)
        assert r.tokens == ar.tokens, k
        assert sum(r.stats["drafted"]) > 0


def test_greedy_jacobi_on_the_embedded_target(smol, smol_prompt):
    ar = sd.generate(smol.target, smol_prompt, max_new_tokens=32)
    r = sd.generate(smol.target, smol_prompt, drafter=smol.drafters["jacobi"], method="linear", k=4, max_new_tokens=32)
    assert r.tokens == ar.tokens


def test_the_verify_pass_feeds_the_pool_and_the_iterate():
    pair = sd.toy_pair(vocab_size=8, seed=0)
    d = JacobiDrafter()
    d.bind(pair.target)
    d.reset(None, 0)
    context = [1, 2, 3]
    draft = d.propose(context, 3, SamplingParams(), None)
    assert draft.tokens.tolist() == [3, 3, 3]  # nothing learned yet, no earlier match: Jacobi's first guess
    logits = torch.full((4, 8), -1.0)
    for row, token in enumerate([5, 6, 7, 0]):  # the target's outputs after 3, 3 (guess), 3, 3
        logits[row, token] = 1.0
    d.accept(draft, 0)  # no verify pass shown (the serving engine): nothing learned
    assert d.pool == {} and d.iterate == []
    draft.state["seen"] = logits  # as the loop shows it to a drafter that reads_verify
    d.accept(draft, 0)  # kept none: the step adds the target's 5
    assert d.pool == {3: 0} and d.iterate == [6, 7, 0] and d.at == 4
    assert d.guess(context + [5], 3) == [6, 7, 0]  # the iterate, where the pool knows nothing of 5
    assert d.guess(context + [5, 3], 2) == [0, 0]  # not the iterate's position: the pool after 3, then padding
    assert d.guess([1, 2, 3, 4, 1], 3)[:2] == [2, 3]  # no pool entry: prompt lookup


@functools.lru_cache(maxsize=None)
def law_run(mutant: bool):
    pair = sd.toy_pair(vocab_size=8, seed=0, draft_noise=0.6)
    d = mu.JacobiSoftQ() if mutant else JacobiDrafter()
    d.bind(pair.target)
    params = SamplingParams(1.0)
    law = ex.sequence_law(pair.target, LAW_PROMPT, LAW_LEN, params)
    s = ex.sample_sequences(pair.target, LAW_PROMPT, LAW_LEN, LAW_N, params, "linear", d, k=2, seed0=SEED, threads=1)
    return ex.gof_test(s.counts(8), law, 5.0, seed=SEED), s


def test_sampled_law_is_the_target_s():
    g, s = law_run(False)
    assert (s.proposed > 0).sum() >= LAW_N  # more than one tested draft token a run, on average
    assert g.pvalue > ALPHA, f"linear:jacobi emitted law differs from p: p = {g.pvalue:.3g}"


def test_soft_q_mutant_is_caught():
    g, _ = law_run(True)
    assert g.pvalue < ALPHA, f"JacobiSoftQ survived the law test: p = {g.pvalue:.3g}"
