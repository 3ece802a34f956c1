"""Greedy exactness of the baseline and of linear speculative decoding; stats bookkeeping."""
import pytest
import torch

import specdec_core as sd
from conftest import top2_gap


def hf_greedy(model, ids, n, eos=None):
    ids = torch.as_tensor(ids).view(1, -1)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n if eos is None else 0, eos_token_id=eos, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_toy_autoregressive_equals_transformers_generate(seed):
    toy = sd.toy_pair(vocab_size=16, seed=seed)
    ids = [1, 5, 2, 7]
    res = sd.generate(toy.target, ids, max_new_tokens=40)
    assert res.tokens == hf_greedy(toy.target, ids, 40)
    assert len(res.tokens) == 40 and res.stats["target_passes"] == 40
    assert sum(res.stats["proposed"]) == 0 and res.stats["alpha"] != res.stats["alpha"]  # nothing drafted: NaN


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("name", ["model", "ngram"])
def test_toy_linear_greedy_identical_float64(toy16, k, name):
    for prompt in ([1, 2, 3], [4, 4, 4, 4, 9], [0]):
        ar = sd.generate(toy16.target, prompt, max_new_tokens=37)
        sp = sd.generate(toy16.target, prompt, drafter=toy16.drafters[name], method="linear", k=k,
                         max_new_tokens=37)
        assert sp.tokens == ar.tokens
        assert len(sp.tokens) == 37


def test_linear_stats_record(toy16):
    res = sd.generate(toy16.target, [1, 2], drafter=toy16.drafter, method="linear", k=4, max_new_tokens=30)
    s = res.stats
    assert s["target_passes"] == 1 + len(s["accepted_lengths"])
    assert s["draft_passes"] == sum(s["drafted"])  # a model draft: one pass per drafted token
    # proposed = tokens tested: the accepted ones plus the first rejected one (none after a full accept)
    assert s["proposed"] == [a + (a < d) for a, d in zip(s["accepted_lengths"], s["drafted"])]
    assert s["alpha"] == sum(s["accepted_lengths"]) / sum(s["proposed"])
    assert len(s["accept_probs"]) == sum(s["proposed"]) and s["alpha_predicted"] == s["alpha"]  # greedy: tests are 0/1
    # every pass emits accepted + 1 tokens, except possibly the last (cut at the budget)
    assert sum(n + 1 for n in s["accepted_lengths"]) + 1 >= len(res.tokens)
    assert 0 <= s["alpha"] <= 1 and s["tau"] == pytest.approx(len(res.tokens) / s["target_passes"])
    assert len(s["token_times"]) == len(res.tokens)
    phases = [s[f"{p}_s"] for p in ("draft", "verify", "accept", "commit")]
    assert all(t > 0 for t in phases) and sum(phases) <= s["decode_s"]  # every phase ran, inside the decode loop


@pytest.mark.parametrize("budget", [7, 8, 9])
def test_max_new_tokens_reached_mid_block(toy16, budget):
    # a perfect drafter (the target itself) accepts everything, so with k=4 a whole step adds 5 tokens: after the
    # prefill's token and one whole step (6 tokens), a budget of 7 to 9 falls inside the second step's block. That
    # step drafts only what the room leaves beside the target's own token (none when the room is 1) and ends the
    # answer at the budget
    perfect = sd.ModelDrafter(toy16.target)
    res = sd.generate(toy16.target, [3, 1], drafter=perfect, method="linear", k=4, max_new_tokens=budget)
    ar = sd.generate(toy16.target, [3, 1], max_new_tokens=budget)
    assert res.tokens == ar.tokens and len(res.tokens) == budget
    room = budget - 1 - 5  # what the second step may add: less than a whole block (k + 1 = 5)
    assert res.stats["accepted_lengths"] == [4, room - 1]  # its block, accepted + the target's token, fills the room


def overdrafted(drafted: list[int], accepted: list[int], budget: int) -> list[int]:
    """The steps of a record that drafted more than their room − 1 tokens (the target's own token takes the
    last place of the room, so a step with room r needs at most r − 1 drafts)."""
    made, bad = 1, []  # the prefill's token
    for i, (d, a) in enumerate(zip(drafted, accepted)):
        if d > budget - made - 1:
            bad.append(i)
        made += a + 1
    return bad


@pytest.mark.parametrize("name", ["model", "ngram", "block"])
def test_no_step_drafts_past_its_room(toy16, name):
    """At the budget's edge a step drafts at most room − 1 tokens, single sequence and batch; the old rule
    (min(k, room)) is caught on its record: at budget 3 its second step drafted 2 with room 2."""
    assert overdrafted([2], [1], 3) == [0] and overdrafted([1], [1], 3) == []
    method = "parallel" if name == "block" else "linear"
    for budget in range(2, 12):
        kw = dict(drafter=toy16.drafters[name], method=method, k=4, max_new_tokens=budget)
        s = sd.generate(toy16.target, [4, 4, 4, 4, 9], **kw).stats
        assert not overdrafted(s.drafted, s.accepted_lengths, budget), (budget, s.drafted, s.accepted_lengths)
        for r in sd.generate_batch(toy16.target, [[4, 4, 4, 4, 9], [1, 2]], **kw).results:
            assert not overdrafted(r.stats.drafted, r.stats.accepted_lengths, budget), (budget, r.stats.drafted)


def test_eos_inside_draft_stops_generation(toy16):
    ar = sd.generate(toy16.target, [3, 1], max_new_tokens=20)
    eos = ar.tokens[5]
    cut = ar.tokens[: ar.tokens.index(eos) + 1]
    toy16.target.generation_config.eos_token_id = eos
    try:
        perfect = sd.ModelDrafter(toy16.target)
        sp = sd.generate(toy16.target, [3, 1], drafter=perfect, method="linear", k=4, max_new_tokens=20)
        ar2 = sd.generate(toy16.target, [3, 1], max_new_tokens=20)
    finally:
        toy16.target.generation_config.eos_token_id = None
    assert sp.tokens == ar2.tokens == cut


def test_sampling_is_seeded(toy16):
    kw = dict(drafter=toy16.drafter, method="linear", k=3, max_new_tokens=25, temperature=1.0, top_k=6)
    a = sd.generate(toy16.target, [1, 2], seed=11, **kw)
    b = sd.generate(toy16.target, [1, 2], seed=11, **kw)
    c = sd.generate(toy16.target, [1, 2], seed=12, **kw)
    assert a.tokens == b.tokens and a.tokens != c.tokens


@pytest.mark.slow
def test_embedded_autoregressive_equals_generate(smol):
    """Acceptance (issue 2) on a sample of the mix; scripts/check_greedy.py runs every prompt."""
    for text in ["What is the capital of France?", "Write a haiku about autumn leaves.",
                 "Translate to French: The weather is nice today."]:
        ids = smol.encode_chat(text)
        ours = sd.generate(smol.target, ids, max_new_tokens=32)
        assert ours.tokens == hf_greedy(smol.target, ids, 32, eos=2)  # both stop at EOS: a truncated output fails


@pytest.mark.slow
def test_embedded_linear_ngram_greedy(smol, smol_prompt):
    """float32: linear must equal autoregressive except at a near-tie, each of which is reported."""
    ar = sd.generate(smol.target, smol_prompt, max_new_tokens=48)
    sp = sd.generate(smol.target, smol_prompt, drafter=smol.drafters["ngram"], method="linear", k=4,
                     max_new_tokens=48)
    if sp.tokens != ar.tokens:
        i = next(i for i, (a, b) in enumerate(zip(sp.tokens, ar.tokens)) if a != b)
        from specdec_core.lm import CachedLM

        lm = CachedLM(smol.target, smol_prompt.numel() + 64)
        logits = lm.forward(torch.cat([smol_prompt, torch.tensor(ar.tokens[:i], dtype=torch.long)]))[-1]
        gap = top2_gap(logits)
        print(f"near-tie divergence at token {i}: top-2 logit gap {gap:.2e}")
        assert gap < 1e-3, f"divergence at token {i} is not a near-tie (gap {gap})"
