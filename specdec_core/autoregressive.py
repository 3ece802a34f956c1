"""The baseline: prefill, then one target pass per new token over a preallocated KV cache."""
from __future__ import annotations

import torch

from .lm import CachedLM
from .sampling import SamplingParams, choose
from .stats import Clock, Result, finish_stats, new_stats


def autoregressive(target, prompt: torch.Tensor, max_new_tokens: int, params: SamplingParams,
                   generator, eos: set[int], capacity: int, lm: CachedLM | None = None) -> Result:
    stats = new_stats("autoregressive")
    lm = lm or CachedLM(target, capacity)
    clock = Clock(stats, lm.device)
    with clock.phase("prefill"):
        logits = lm.forward(prompt, last_only=True)[-1]
        tok, _ = choose(logits, params, generator)
    stats["target_passes"] += 1
    clock.mark_tokens(1)
    out = [tok]
    with clock.phase("decode"):
        while len(out) < max_new_tokens and tok not in eos:
            logits = lm.forward(torch.tensor([tok]), last_only=True)[-1]
            tok, _ = choose(logits, params, generator)
            stats["target_passes"] += 1
            out.append(tok)
            clock.mark_tokens(1)
    return Result(out, finish_stats(stats, len(out)))
