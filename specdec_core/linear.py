"""Linear speculative decoding: draft → verify → accept → commit, repeated.

Invariant at the top of each step: ``seq`` holds every token so far; the target's cache holds all
of them but the last (``tok``, not yet seen by the target).

1. **draft**  the drafter proposes k tokens d_1..d_k with laws q_1..q_k.
2. **verify** one target pass over [tok, d_1..d_k] gives k + 1 next-token laws p_1..p_{k+1}.
3. **accept** greedy: longest argmax-matching prefix + the target's token; sampling:
   :func:`~specdec_core.verify.speculative_sample` (accepted prefix + corrected or bonus token).
4. **commit** roll the target cache back over the rejected drafts (a pointer move), tell the
   drafter how many it got right, append the new tokens (cut at EOS and at the budget).
"""
from __future__ import annotations

import torch

from .lm import CachedLM
from .sampling import SamplingParams, choose, process_logits
from .stats import Clock, Result, finish_stats, new_stats
from .verify import greedy_accept, overlap, speculative_sample


def emit(out: list[int], new: list[int], max_new_tokens: int, eos: set[int]) -> bool:
    """Append ``new`` to ``out``, cutting after EOS or at the budget. Returns True when done."""
    for t in new:
        out.append(t)
        if t in eos or len(out) >= max_new_tokens:
            return True
    return False


def linear(target, drafter, prompt: torch.Tensor, k: int, max_new_tokens: int, params: SamplingParams,
           generator, eos: set[int], capacity: int, method: str = "linear") -> Result:
    stats = new_stats(method)
    lm = CachedLM(target, capacity)
    clock = Clock(stats, lm.device)
    drafter.reset(prompt, capacity)
    with clock.phase("prefill"):
        logits = lm.forward(prompt, last_only=True)[-1]
        tok, _ = choose(logits, params, generator)
    stats["target_passes"] += 1
    clock.mark_tokens(1)
    out, seq = [tok], prompt.tolist() + [tok]
    done = tok in eos or max_new_tokens <= 1
    t_decode = clock.now()
    while not done:
        with clock.phase("draft"):
            d = drafter.propose(seq, min(k, max_new_tokens - len(out)), params, generator)
        kk = d.tokens.numel()
        with clock.phase("verify"):
            logits = lm.forward(torch.cat([torch.tensor([tok]), d.tokens]))  # [kk+1, V]
        with clock.phase("accept"):
            if params.greedy:
                argmax = logits.argmax(-1)
                new, n = greedy_accept(d.tokens, argmax)
                match = (d.tokens.to(argmax.device) == argmax[:kk]).double().mean() if kk else None
            else:
                p = process_logits(logits, params)
                new, n = speculative_sample(d.tokens, d.q, p, generator)
                match = overlap(p[:kk], d.q.to(p.device)).mean() if kk else None
        with clock.phase("commit"):
            lm.cache.rollback(kk - n)
            drafter.accept(n)
            new = new.tolist()
            before = len(out)
            done = emit(out, new, max_new_tokens, eos)
            seq += out[before:]
            tok = seq[-1]
        stats["target_passes"] += 1
        stats["draft_passes"] += d.passes
        stats["proposed"].append(kk)
        stats["accepted_lengths"].append(n)
        if match is not None:
            stats["tv_alpha"].append(float(match))
        clock.mark_tokens(len(out) - before)
    stats["decode_s"] = clock.now() - t_decode
    return Result(out, finish_stats(stats, len(out)))
