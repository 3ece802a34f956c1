"""``generate_batch``: several prompts decoded together, each row exactly as it would be decoded alone.

It is the engine's simplest schedule (:class:`~specdec_core.serving.engine.Engine`): every prompt submitted at
t = 0, as many rows as prompts, run until the last row is done. Each row is prefilled alone (the pass ``generate``
makes), drafted by its request's own drafter (rows sharing a draft model in one pass per position,
:mod:`specdec_core.serving.drafters`), verified with the others in one target pass (rows right-padded to the longest,
:class:`~specdec_core.serving.cache.BatchLM`), accepted with the core's phases and its own generator, and committed
by its own accepted length + 1, a per-row pointer move. A row that is done leaves the batch.

Exactness follows from the row being decoded by the single-sequence phases: greedy rows equal autoregressive
decoding of the same prompt, and a sampled row with seed s equals ``generate(prompt, seed=s)`` up to the
rounding of batched arithmetic (bit for bit on float64 toy pairs, which the tests check). The rows share
passes, never random numbers or decisions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decode import DecodeOptions, check_prompts
from ..record import Result
from .engine import Engine

BATCH_METHODS = ("autoregressive", "linear", "parallel")


@dataclass
class BatchResult:
    """``results[r]``: row r's :class:`~specdec_core.record.Result` (the record ``generate`` returns); ``stats``:
    the batch's steps, target passes, new tokens, wall seconds, total tokens/s and ``slot_use`` (the
    fraction of the token slots in the verify passes that carried a row's real token rather than padding)."""

    results: list[Result]
    stats: dict = field(default_factory=dict)

    @property
    def tokens(self) -> list[list[int]]:
        return [r.tokens for r in self.results]


def _row_seeds(seed, n_rows: int) -> list[int]:
    """Row r's seed: ``seed + r`` for an int, else the r-th of ``seed`` (one per prompt)."""
    seeds = [seed + r for r in range(n_rows)] if isinstance(seed, int) else list(seed)
    if len(seeds) != n_rows:
        raise ValueError(f"seed must be an int or one seed per prompt: {len(seeds)} seeds for {n_rows} prompts")
    return seeds


# generate's options that have no batched form here, and why (a call that sets one gets a ValueError saying so)
BATCH_REFUSES = {"tree": "trees are single-sequence only (method 'tree')",
                 "prediction": "a prediction is per request: submit each to an Engine, or decode it with generate"}


def generate_batch(target, prompts, drafter=None, method: str = "autoregressive", k: int = 4,
                   max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                   seed=0, cache_len: int | None = None, tree=None, rule=None, confidence: float | None = None,
                   graphs="auto", prediction=None, commit_rule=None) -> BatchResult:
    """Decode every prompt of ``prompts`` (token-id lists of any lengths) in one batch; ``generate``'s options
    (:class:`~specdec_core.decode.DecodeOptions`), each applying to every row, except those of
    :data:`BATCH_REFUSES`.

    ``confidence``: as in ``generate`` (such rows are drafted one by one: the batched draft passes have no stop).
    ``seed``: an int (row r uses ``seed + r``) or one seed per prompt; each row has its own generator, so its
    output does not depend on its neighbours. ``method``: ``"autoregressive"``, ``"linear"`` or ``"parallel"``.
    ``cache_len``: the batch cache's positions per row (default: the longest prompt + ``max_new_tokens`` + one
    step's headroom). ``rule``: the accept rule, as in ``generate``. ``commit_rule``: how many of its verified
    tokens each row's cache keeps, from the rows' verdicts (default: each row its own accepted + 1); the negative
    controls of the tests pass a wrong one. ``graphs``: as in ``generate`` (each prefill runs eager). A row that
    fails raises its error. Returns a :class:`BatchResult`.
    """
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts (each a 1-D list or tensor of token ids)")
    options = DecodeOptions.of(locals())
    for name, why in BATCH_REFUSES.items():
        if getattr(options, name) != getattr(DecodeOptions, name):
            raise ValueError(f"generate_batch does not take {name}={getattr(options, name)!r}: {why}")
    seeds = _row_seeds(seed, len(prompts))
    _, _, mode, drafter = options.check(target, drafter, methods=BATCH_METHODS, caller="generate_batch")
    rows = check_prompts(target, prompts)
    engine = Engine(target, max_batch=len(rows), cache_len=cache_len, step_mode=mode, commit_rule=commit_rule)
    for ids, s in zip(rows, seeds):
        engine.submit(ids, drafter=drafter, method=method, k=k, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_k=top_k, top_p=top_p, seed=s, rule=rule, confidence=confidence)
    results = engine.run()
    for r in results:
        if r.error is not None:
            raise r.error
    wall = max(r.finished_s for r in results)
    total = sum(len(r.tokens) for r in results)
    n = engine.counts
    return BatchResult(results, dict(batch=len(rows), method=method, steps=n["steps"],
                                     target_passes=n["steps"] + n["prefills"], new_tokens=total, seconds=wall,
                                     tokens_per_s=total / wall, slot_use=n["used"] / n["slots"] if n["slots"] else 1.0))
