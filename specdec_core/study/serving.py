"""Measuring serving-shaped decoding: batches against batch size, the cost model that predicts where
speculation stops paying, and the latency a streaming reader sees.

- :func:`time_batches`: every (method, batch size) decodes the same prompts, interleaved with rotating order,
  repeated: total tokens/s of the batch, per-request latency (when each row's last token was known), τ.
- :func:`predict_speedup`: speculation against autoregressive decoding at batch B from single-sequence pass
  costs t(T): autoregressive decoding spends t(B) per B tokens; a speculative step spends K draft passes
  t_d(B) and one verify pass over the tokens the rows feed, t(B·f) (f: a row's mean feed, its last token and the
  draft its drafter found, at most K + 1; the engine packs the rows, so it pays for these alone) per B·τ tokens,
  τ = tokens per row and target pass.
- :func:`rank_trend`: the direction of a measure in B (Spearman's ρ) with a permutation p-value, exact when the
  arrangements can be counted.
- :func:`chunk_latencies`: inter-token latency per token (a step's gap shared by the tokens it revealed) and
  per chunk (one gap per step, what a server that times its stream chunks reports).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import torch

from ..decode import generate
from ..lm import CachedLM
from ..record import Timer
from ..serving import generate_batch
from .bench import per_token_latency
from .profiling import at_context, pass_fn, summarize, time_interleaved


def batch_prompts(encoded: list[torch.Tensor], B: int, batch: int = 0) -> list[torch.Tensor]:
    """Batch number ``batch`` of size B from the pool ``encoded``: the B prompts from position ``batch · B`` on,
    cycling through the pool. Every B draws from the same pool, so B = 1's batches are several prompts, not one."""
    return [encoded[(batch * B + i) % len(encoded)] for i in range(B)]


def batch_indices(n_pool: int, B: int, batch: int = 0) -> list[int]:
    """The pool positions of :func:`batch_prompts`' rows (to check each row against its own prompt)."""
    return [(batch * B + i) % n_pool for i in range(B)]


def time_batches(target, encoded: list[torch.Tensor], methods: dict[str, dict], batch_sizes: list[int],
                 max_new_tokens: int, repeats: int = 1, warmup: int = 1, progress=None,
                 batches: int = 1) -> pd.DataFrame:
    """One row per (repeat, batch, B, method) call of :func:`~specdec_core.serving.generate_batch` (greedy).

    ``batches``: distinct batches at each B (:func:`batch_prompts`: the pool's prompts taken B at a time), the units
    a comparison at one B, or a trend over B, rests on; ``repeats``: rounds over all of them (the same batches again:
    timing noise, not new units).

    ``methods``: name → ``generate_batch`` keyword arguments (``method``, ``drafter``, ``k``); a method whose
    arguments hold ``single=True`` is instead :func:`~specdec_core.generate` on the one prompt (B = 1 only),
    the reference for the batch path's own overhead; one with ``one_at_a_time=True`` runs ``generate`` on each of
    the B prompts in turn (the same requests served without batching; its times are since the first request),
    at the batch sizes ``at`` (default: every one). Per call: ``tokens_per_s`` (all rows' tokens ÷ wall
    time), ``prefill_s`` (until the first tokens), ``decode_tokens_per_s`` (the tokens after the first ÷ the
    time after it: the decode loop alone), ``latency_s`` (median over rows of the time the row's last token
    was known), ``tau`` (tokens per row and target pass), ``outputs`` (the rows' tokens, to check that every
    method decoded the same text).
    """

    def call(name, B, batch=0):
        kw = dict(methods[name])
        prompts = batch_prompts(encoded, B, batch)
        timer = Timer(None)
        t = timer.now()
        in_turn, _ = kw.pop("one_at_a_time", False), kw.pop("at", None)
        if kw.pop("single", False):
            res = [generate(target, prompts[0], max_new_tokens=max_new_tokens, **kw)]
        elif in_turn:  # the same B requests served one after another
            res, t_done = [], 0.0
            for p in prompts:
                r = generate(target, p, max_new_tokens=max_new_tokens, **kw)
                r.stats.token_times = [t_done + x for x in r.stats.token_times]
                t_done = timer.now() - t
                res.append(r)
        else:
            res = generate_batch(target, prompts, max_new_tokens=max_new_tokens, **kw).results
        wall = timer.now() - t
        n = sum(len(r.tokens) for r in res)
        first = min(r.stats.token_times[0] for r in res)  # the (first) prefill's end
        decode_s = (sum(r.stats.token_times[-1] - r.stats.token_times[0] for r in res) if in_turn else
                    max(r.stats.token_times[-1] for r in res) - first)  # a batch's rows decode together
        return dict(method=name, B=B, tokens=n, seconds=wall, tokens_per_s=n / wall, prefill_s=first,
                    decode_tokens_per_s=(n - len(res)) / decode_s if decode_s > 0 else float("nan"),
                    latency_s=float(np.median([r.stats.token_times[-1] for r in res])),
                    tau=float(np.mean([r.stats.tau for r in res])),
                    fed=float(np.mean([1 + np.mean(r.stats.drafted) if r.stats.drafted else 1.0 for r in res])),
                    outputs=[r.tokens for r in res])

    plan = [(name, B) for B in batch_sizes for name in methods if not (methods[name].get("single") and B != 1)
            and not (methods[name].get("one_at_a_time") and B not in methods[name].get("at", batch_sizes))]
    for _ in range(warmup):
        for name in dict.fromkeys(n for n, _ in plan):
            call(name, min(batch_sizes))
    rows, it = [], [(rep, b) for rep in range(repeats) for b in range(batches)]
    for i, (rep, b) in enumerate(progress(it, desc="batches") if progress else it):
        shift = i % len(plan)
        for name, B in plan[shift:] + plan[:shift]:
            rows.append(dict(call(name, B, b), repeat=rep, batch=b))
    return pd.DataFrame(rows)


def pass_cost_curve(target, token_counts, context: int, repeats: int = 5, draft=None) -> pd.DataFrame:
    """Median seconds of one pass over T tokens (single sequence, ``context`` cached positions) for every T,
    interleaved: ``who`` is ``target`` or ``draft``. The t(T) and t_d(T) of :func:`predict_speedup`."""
    models = {"target": target} | ({"draft": draft} if draft is not None else {})
    fns = {}
    for who, m in models.items():
        lm = CachedLM(m, context + max(token_counts) + 1)
        at_context(lm, context)
        fns |= {(who, T): pass_fn(lm, T) for T in token_counts}
    s = summarize(time_interleaved(fns, repeats=repeats, warmup=1))
    return pd.DataFrame([dict(who=n[0], T=n[1], seconds=med) for n, med in zip(s["name"], s["median"])])


def pass_time(cost: pd.DataFrame, T: float, who: str = "target") -> float:
    """Seconds of one pass over T tokens from :func:`pass_cost_curve` (linear between the measured T)."""
    c = cost[cost.who == who].sort_values("T")
    return float(np.interp(T, c["T"], c["seconds"]))


def predict_speedup(cost: pd.DataFrame, B: int, k: int, tau: float, drafted: bool, fed: float | None = None) -> float:
    """Speculation ÷ autoregressive decoding at batch B (see the module docstring), from :func:`pass_cost_curve`;
    ``drafted``: the draft costs K passes t_d(B) (a model draft) or nothing (prompt lookup); ``fed``: the tokens a
    row feeds a verify pass on average (default K + 1: every row drafts K), so the packed pass is over B·fed."""
    fed = k + 1 if fed is None else fed
    step = pass_time(cost, B * fed) + (k * pass_time(cost, B, "draft") if drafted else 0.0)
    return tau * pass_time(cost, B) / step


def crossover(batch_sizes, speedups) -> int | None:
    """The smallest batch size whose speedup is below 1 (None: speculation pays at every B measured)."""
    return next((B for B, s in zip(batch_sizes, speedups) if s < 1), None)


EXACT_ARRANGEMENTS = 500_000  # at most this many distinct arrangements: the trend's p enumerates them all


def _arrangements(x: np.ndarray) -> np.ndarray:
    """Every distinct ordering of the values of ``x`` (tied values are interchangeable), one per row:
    n! / (n_1! n_2! ...) rows for value counts n_1, n_2, .... Built one value at a time: each partial ordering
    is extended by every choice of its free slots for that value's copies."""
    values, counts = np.unique(x, return_counts=True)
    rows, used = np.zeros((1, len(x)), dtype=x.dtype), np.zeros((1, len(x)), dtype=bool)
    for value, count in zip(values, counts):
        free = np.nonzero(~used)[1].reshape(len(used), -1)  # [m, free slots], every row has as many
        chosen = free[:, np.array(list(itertools.combinations(range(free.shape[1]), int(count))))]  # [m, C, count]
        rows, used = (np.repeat(a, chosen.shape[1], axis=0) for a in (rows, used))
        at = (np.repeat(np.arange(len(rows)), count), chosen.reshape(-1))
        rows[at], used[at] = value, True
    return rows


def rank_trend(x, y, draws: int = 200_000, seed: int = 0, exact_max: int = EXACT_ARRANGEMENTS) -> dict:
    """Spearman's ρ between ``x`` and ``y`` (average ranks for ties) and its two-sided permutation p-value: the
    share of arrangements of x's ranks against y's whose |ρ| reaches the observed |ρ|. Under no association every
    distinct arrangement of x's (tied) values is equally likely, so with at most ``exact_max`` of them p is exact
    (every arrangement counted; its smallest possible value is 2 / arrangements when the two extreme orders are
    unique); with more, p comes from ``draws`` seeded random permutations, (1 + hits) / (1 + draws). No normal or
    t approximation, which with few points and ties can print a p far below any the arrangements allow.

    Returns ``rho``, ``p``, ``p_method`` (how p was computed, in words) and ``arrangements`` (the distinct
    arrangements of x; NaN ρ and p when n < 3 or either variable is constant)."""
    from scipy.stats import rankdata

    rx, ry = rankdata(np.asarray(x, dtype=float)), rankdata(np.asarray(y, dtype=float))
    n = len(rx)
    if len(ry) != n:
        raise ValueError(f"x and y differ in length ({n} and {len(ry)})")
    _, counts = np.unique(rx, return_counts=True)
    arrangements = math.factorial(n) // math.prod(math.factorial(int(c)) for c in counts) if n else 0
    if n < 3 or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return dict(rho=float("nan"), p=float("nan"), p_method="undefined (fewer than 3 points or a constant)",
                    arrangements=arrangements)
    cx, cy = rx - rx.mean(), ry - ry.mean()
    rho = float(cx @ cy / np.sqrt((cx @ cx) * (cy @ cy)))
    observed = abs(cx @ cy) * (1 - 1e-9)  # the same sum computed in another order: a rounding's margin
    if arrangements <= exact_max:
        hits = int((np.abs(_arrangements(cx) @ cy) >= observed).sum())
        return dict(rho=rho, p=hits / arrangements, p_method=f"exact permutation over {arrangements} arrangements",
                    arrangements=arrangements)
    gen = np.random.default_rng(seed)
    sums = np.concatenate([np.abs(gen.permuted(np.tile(cx, (m, 1)), axis=1) @ cy)
                           for m in np.diff(np.r_[0:draws:50_000, draws])])
    return dict(rho=rho, p=(1 + int((sums >= observed).sum())) / (1 + draws),
                p_method=f"permutation, {draws} seeded draws of {arrangements} arrangements", arrangements=arrangements)


def chunk_latencies(token_times: list[float]) -> dict:
    """Time to first token, and inter-token latency percentiles (ms) per token and per chunk.

    A step that reveals m tokens after a gap Δ counts, per token, m latencies of Δ/m (how a reader's
    tokens per second are experienced); per chunk, one latency of Δ (what a server timing its stream chunks
    reports: it overstates the wait per token whenever steps reveal several)."""
    t = np.asarray(token_times, dtype=float)
    arrivals = np.unique(t)
    per_chunk = np.diff(arrivals) * 1e3
    per_token = per_token_latency(token_times)[1:]
    out = {"ttft_ms": float(arrivals[0] * 1e3) if arrivals.size else float("nan"),
           "chunks": int(arrivals.size), "tokens": int(t.size)}
    for name, lat in (("token", per_token), ("chunk", per_chunk)):
        for p in (50, 90, 99):
            out[f"{name}_p{p}_ms"] = float(np.percentile(lat, p)) if lat.size else float("nan")
    return out
