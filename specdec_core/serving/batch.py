"""``generate_batch``: several prompts decoded together, each row exactly as it would be decoded alone.

A step is the single-sequence step for every row at once: the batched drafter proposes each row's tokens
(:mod:`specdec_core.serving.drafters`), one target pass verifies every row's draft (rows right-padded to the
longest, :class:`~specdec_core.serving.cache.BatchLM`), and each row's *accept* phase is the core's own
(:class:`~specdec_core.loop.Linear` / :class:`~specdec_core.loop.Autoregressive`, with that row's generator
and the same accept rule). Commit advances each row's cache by its own accepted length + 1: ragged
acceptance is a per-row pointer move, never a re-padding. A row stops on its own (EOS or budget) and
rides along, masked and uncommitted, until the last row is done.

Exactness follows from the row being decoded by the single-sequence phases: greedy rows equal autoregressive
decoding of the same prompt, and a sampled row with seed s equals ``generate(prompt, seed=s)`` up to the
rounding of batched arithmetic (bit for bit on float64 toy pairs, which the tests check). The rows share
passes, never random numbers or decisions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decode import DecodeOptions, cache_capacity, check_prompts, eos_ids
from ..loop import Autoregressive, Linear, Verdict, cut
from ..record import Result, Stats, Timer
from ..sampling import choose, make_generator
from ..verify import speculative_sample
from .cache import BatchLM
from .drafters import batched

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
                 "confidence": "the batched drafters have no confidence stop",
                 "prediction": "a prediction is per request: decode it with generate or stream"}


def generate_batch(target, prompts, drafter=None, method: str = "autoregressive", k: int = 4,
                   max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                   seed=0, cache_len: int | None = None, tree=None, rule=None, confidence: float | None = None,
                   graphs="auto", prediction=None, commit_rule=None) -> BatchResult:
    """Decode every prompt of ``prompts`` (token-id lists of any lengths) in one batch; ``generate``'s options
    (:class:`~specdec_core.decode.DecodeOptions`), each applying to every row, except those of
    :data:`BATCH_REFUSES`.

    ``seed``: an int (row r uses ``seed + r``) or one seed per prompt; each row has its own generator, so its
    output does not depend on its neighbours. ``method``: ``"autoregressive"``, ``"linear"`` or ``"parallel"``.
    ``cache_len``: the batch cache's positions per row (default: the longest prompt + ``max_new_tokens`` + one
    step's headroom). ``rule``: the accept rule, as in ``generate``. ``commit_rule``: how many of its verified
    tokens each row's cache keeps, from the rows' verdicts (default :func:`ragged_commit`, each row its own
    accepted + 1); the negative controls of the tests pass a wrong one. ``graphs``: as in ``generate`` (the
    prefill runs eager). Returns a :class:`BatchResult`.
    """
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts (each a 1-D list or tensor of token ids)")
    options = DecodeOptions.of(locals())
    for name, why in BATCH_REFUSES.items():
        if getattr(options, name) != getattr(DecodeOptions, name):
            raise ValueError(f"generate_batch does not take {name}={getattr(options, name)!r}: {why}")
    seeds = _row_seeds(seed, len(prompts))
    params, _, mode, drafter = options.check(target, drafter, methods=BATCH_METHODS, caller="generate_batch")
    rows = [p.tolist() for p in check_prompts(target, prompts)]
    B = len(rows)
    device = next(target.parameters()).device
    capacity = cache_capacity(target, max(map(len, rows)), options)
    gens = [make_generator(device, s) for s in seeds]
    rule = rule or speculative_sample
    own = [Autoregressive(params, g) for g in gens]  # each row's accept phase without a draft
    accept = own if method == "autoregressive" else [Linear(params, g, None, k, rule=rule) for g in gens]  # with
    batch_drafter = None if method == "autoregressive" else batched(drafter, target, B, capacity, mode)
    lm = BatchLM(target, B, capacity, mode)
    eos = eos_ids(target)
    stats = [Stats(method) for _ in rows]
    clock = Timer(lm.device)  # reads after a device sync, as the single-prompt loop's Clock
    t0 = clock.now()
    logits = lm.prefill(rows)[:, -1]
    first = [choose(logits[r], params, gens[r])[0] for r in range(B)]
    seqs = [p + [t] for p, t in zip(rows, first)]  # every token so far
    outs = [[t] for t in first]  # the new tokens
    done = [t in eos or max_new_tokens <= 1 for t in first]
    now = clock.now() - t0
    for s in stats:
        s.target_passes = 1
        s.new_tokens = 1
        s.prefill_s = now
        s.token_times = [now]
    n_steps = 0
    slots = 0  # token slots of the verify passes
    used = 0  # of them, those that carried a row's real token
    while not all(done):
        # a row drafts at most room − 1 tokens: the target's own token takes the last place
        ks = [0 if d else min(k, max_new_tokens - len(o) - 1) for d, o in zip(done, outs)]
        phase_start = {"draft": clock.now()}  # each phase's start time, then the step's end
        drafts = batch_drafter.propose(seqs, ks, params, gens) if batch_drafter else [None] * B
        phase_start["verify"] = clock.now()
        feed = [[] if done[r] else seqs[r][-1:] + (drafts[r].tokens.tolist() if drafts[r] else []) for r in range(B)]
        logits = lm.forward(feed)
        phase_start["accept"] = clock.now()
        verdicts = [None if done[r] else (accept[r] if ks[r] else own[r]).accept(drafts[r], logits[r, :len(feed[r])])
                    for r in range(B)]
        phase_start["commit"] = clock.now()
        lm.cache.advance(torch.tensor((commit_rule or ragged_commit)(verdicts)))
        if batch_drafter:
            batch_drafter.accept([0 if v is None else v.accepted for v in verdicts])
        phase_start["end"] = clock.now()
        n_steps += 1
        slots += B * logits.shape[1]
        used += sum(map(len, feed))
        for r, v in enumerate(verdicts):
            if v is not None:
                _emit(stats[r], v, drafts[r], outs[r], seqs[r], done, r, max_new_tokens, eos, phase_start, t0)
    wall = clock.now() - t0
    total = sum(map(len, outs))
    return BatchResult([Result(o, s) for o, s in zip(outs, stats)],
                       dict(batch=B, method=method, steps=n_steps, target_passes=n_steps + 1, new_tokens=total,
                            seconds=wall, tokens_per_s=total / wall, slot_use=used / slots if slots else 1.0))


def ragged_commit(verdicts: list[Verdict | None]) -> list[int]:
    """Each row keeps its last token and its own accepted drafts (a row that is done keeps nothing)."""
    return [0 if v is None else v.accepted + 1 for v in verdicts]


def _emit(stats: Stats, v: Verdict, draft, out: list[int], seq: list[int], done: list[bool], r: int,
          max_new_tokens: int, eos: set[int], phase_start: dict, t0: float) -> None:
    """Row r's commit bookkeeping: cut at EOS/budget, the record, the phase times it waited through."""
    new, done[r] = cut(v.tokens, max_new_tokens - len(out), eos)
    out += new
    seq += new
    stats.record_step(v.proposed, v.accepted, v.drafted, v.accept_probs, draft.passes if draft is not None else 0)
    stats.new_tokens = len(out)
    for a, b in (("draft", "verify"), ("verify", "accept"), ("accept", "commit"), ("commit", "end")):
        setattr(stats, f"{a}_s", getattr(stats, f"{a}_s") + phase_start[b] - phase_start[a])
    stats.token_times += [phase_start["end"] - t0] * len(new)
    stats.decode_s = phase_start["end"] - t0 - stats.prefill_s
