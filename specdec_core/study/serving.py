"""Measuring serving-shaped decoding: batches against batch size, the cost model that predicts where
speculation stops paying, and the latency a streaming reader sees.

- :func:`time_batches`: every (method, batch size) decodes the same prompts, interleaved with rotating order,
  repeated: total tokens/s of the batch, per-request latency (when each row's last token was known), τ.
- :func:`predict_speedup`: speculation against autoregressive decoding at batch B from single-sequence pass
  costs t(T): autoregressive decoding spends t(B) per B tokens; a speculative step spends K draft passes
  t_d(B) and one verify pass t(B·(K+1)) per B·τ tokens, τ = tokens per row and target pass.
- :func:`chunk_latencies`: inter-token latency per token (a step's gap shared by the tokens it revealed) and
  per chunk (one gap per step, what a server that times its stream chunks reports).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..decode import generate
from ..lm import CachedLM
from ..record import Timer
from ..serving import generate_batch
from .bench import per_token_latency
from .profiling import at_context, pass_fn, summarize, time_interleaved


def batch_prompts(encoded: list[torch.Tensor], B: int) -> list[torch.Tensor]:
    """The first B prompts of ``encoded``, cycling through it when B is larger."""
    return [encoded[i % len(encoded)] for i in range(B)]


def time_batches(target, encoded: list[torch.Tensor], methods: dict[str, dict], batch_sizes: list[int],
                 max_new_tokens: int, repeats: int = 2, warmup: int = 1, progress=None) -> pd.DataFrame:
    """One row per (repeat, B, method) call of :func:`~specdec_core.serving.generate_batch` (greedy).

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

    def call(name, B):
        kw = dict(methods[name])
        prompts = batch_prompts(encoded, B)
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
                    tau=float(np.mean([r.stats.tau for r in res])), outputs=[r.tokens for r in res])

    plan = [(name, B) for B in batch_sizes for name in methods if not (methods[name].get("single") and B != 1)
            and not (methods[name].get("one_at_a_time") and B not in methods[name].get("at", batch_sizes))]
    for _ in range(warmup):
        for name in dict.fromkeys(n for n, _ in plan):
            call(name, min(batch_sizes))
    rows, it = [], range(repeats)
    for rep in (progress(it, desc="repeats") if progress else it):
        shift = rep % len(plan)
        for name, B in plan[shift:] + plan[:shift]:
            rows.append(dict(call(name, B), repeat=rep))
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


def predict_speedup(cost: pd.DataFrame, B: int, k: int, tau: float, drafted: bool) -> float:
    """Speculation ÷ autoregressive decoding at batch B (see the module docstring), from :func:`pass_cost_curve`;
    ``drafted``: the draft costs K passes t_d(B) (a model draft) or nothing (prompt lookup)."""
    t = cost[cost.who == "target"].set_index("T")["seconds"]
    draft = cost[cost.who == "draft"].set_index("T")["seconds"]
    step = t[B * (k + 1)] + (k * draft[B] if drafted else 0.0)
    return tau * t[B] / step


def crossover(batch_sizes, speedups) -> int | None:
    """The smallest batch size whose speedup is below 1 (None: speculation pays at every B measured)."""
    return next((B for B, s in zip(batch_sizes, speedups) if s < 1), None)


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
