"""The result record every strategy returns, and the phase clock that fills it."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

PHASES = ("draft", "verify", "accept", "commit")


@dataclass
class Result:
    """``tokens``: the new tokens only. ``stats``: see :func:`new_stats`."""

    tokens: list[int]
    stats: dict = field(default_factory=dict)


def new_stats(method: str) -> dict:
    """Stats keys shared by every method.

    target_passes / draft_passes: forward passes (the prefill counts as a target pass);
    proposed / accepted_lengths: per speculative step; token_times: seconds from decode start at
    which each new token became known; <phase>_s: wall time per phase of the speculative loop.
    """
    s = dict(method=method, target_passes=0, draft_passes=0, proposed=[], accepted_lengths=[],
             tv_alpha=[], token_times=[], prefill_s=0.0, decode_s=0.0)
    s.update({f"{p}_s": 0.0 for p in PHASES})
    return s


def finish_stats(s: dict, n_tokens: int) -> dict:
    """Derived figures: alpha (accepted / proposed), alpha_tv (mean 1 - TV(p, q)), tau (tokens per target pass)."""
    prop = sum(s["proposed"])
    s["new_tokens"] = n_tokens
    s["alpha"] = sum(s["accepted_lengths"]) / prop if prop else float("nan")
    s["alpha_tv"] = sum(s["tv_alpha"]) / len(s["tv_alpha"]) if s["tv_alpha"] else float("nan")
    s["tau"] = n_tokens / s["target_passes"] if s["target_passes"] else float("nan")
    s["tokens_per_s"] = n_tokens / (s["prefill_s"] + s["decode_s"]) if n_tokens else 0.0
    return s


class Clock:
    """Accumulates wall time into ``stats[name + '_s']``; synchronizes CUDA around reads."""

    def __init__(self, stats: dict, device: torch.device):
        self.stats, self.cuda = stats, torch.device(device).type == "cuda"
        self.t0 = self.now()

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str):
        t = self.now()
        try:
            yield
        finally:
            self.stats[f"{name}_s"] += self.now() - t

    def mark_tokens(self, n: int) -> None:
        """Record that ``n`` more tokens are known now (for per-token latency)."""
        t = self.now() - self.t0
        self.stats["token_times"].extend([t] * n)
