"""Side-by-side timing: every method on the same prompts, interleaved, in one run.

Protocol (what every benchmark in the book uses):

1. warm-up: each runner decodes the first prompt ``warmup`` times, untimed;
2. for each repeat, for each prompt, run every runner once, rotating the runner order per prompt so no
   runner always goes first; CUDA is synchronized around each timed call;
3. report per-call tokens/s, and *paired* ratios against a baseline runner (same prompt, same repeat),
   summarized by median and interquartile range.

Absolute times are never compared across runs, only ratios within one.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

Runner = Callable[[torch.Tensor], dict]  # prompt ids -> {"tokens": list[int], ...extra stats}


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_interleaved(runners: dict[str, Runner], prompts: list[tuple[dict, torch.Tensor]], repeats: int = 3,
                    warmup: int = 2, progress: bool = True) -> pd.DataFrame:
    """Time every runner on every ``(meta, ids)`` prompt. Returns one row per call."""
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            runners[name](prompts[0][1])
    rows = []
    total = repeats * len(prompts) * len(names)
    bar = tqdm(total=total, desc="benchmark", disable=not progress)
    for rep in range(repeats):
        for i, (meta, ids) in enumerate(prompts):
            order = names[(i + rep) % len(names):] + names[: (i + rep) % len(names)]
            for name in order:
                _sync()
                t = time.perf_counter()
                out = runners[name](ids)
                _sync()
                dt = time.perf_counter() - t
                n = len(out["tokens"])
                extra = {k: v for k, v in out.items() if k != "tokens" and not isinstance(v, dict)}
                rows.append(dict(meta, runner=name, repeat=rep, new_tokens=n, seconds=dt,
                                 tokens_per_s=n / dt, **extra))
                bar.update()
    bar.close()
    return pd.DataFrame(rows)


def generate_runner(target, max_new_tokens: int, temperature: float = 0.0, keep_steps: bool = False,
                    **generate_kwargs) -> Runner:
    """A runner calling :func:`specdec_core.generate`; its row carries the speculative counts (accepted,
    rejections, proposed, τ), the decode-loop time and tokens (prefill excluded) and latency percentiles;
    ``keep_steps`` also keeps the per-step accepted lengths."""
    from .decode import generate

    def run(ids):
        r = generate(target, ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=0,
                     **generate_kwargs)
        s = r.stats
        acc, prop = s["accepted_lengths"], s["proposed"]
        row = {"tokens": r.tokens, "tau": s["tau"], "accepted": sum(acc), "proposed": sum(prop),
               "rejections": sum(1 for a, p in zip(acc, prop) if a < p), "target_passes": s["target_passes"],
               "decode_s": s["decode_s"], "decode_tokens": max(0, len(r.tokens) - 1),
               **latency_percentiles(s["token_times"])}
        if keep_steps:
            row["accepted_lengths"] = acc
        return row
    return run


def theory_check(df: pd.DataFrame, runner: str, baseline: str, k: int, c: float, verify_ratio: float,
                 min_tokens: int = 8) -> tuple[pd.DataFrame, dict]:
    """Leviathan et al.'s prediction against the measurement, call by call.

    For each (prompt, repeat) where both runners decoded at least ``min_tokens`` tokens: α̂ from that
    call's own steps (:func:`theory.alpha_mle`), the predicted speedup :func:`theory.speedup` (α̂, K, c,
    verify ratio), and the measured one — the decode loops' tokens/s ratio (prefill, the same for both,
    is not what the theorem models). α varies from prompt to prompt, and the speedup is not linear in α,
    so each call is predicted from its own α̂ rather than from one pooled α.

    Returns the per-call table and a summary: median predicted, median measured, and the relative error
    between those medians (the agreement the book reports).
    """
    from .theory import speedup

    key = ["id", "repeat"]
    rate = lambda d: d.decode_tokens / d.decode_s  # noqa: E731
    base = df[df.runner == baseline].set_index(key)
    d = df[df.runner == runner].set_index(key)
    d = d[(d.decode_tokens >= min_tokens) & (base.loc[d.index].decode_tokens >= min_tokens).values]
    rows = d.reset_index()[key + [c_ for c_ in ("task",) if c_ in d.columns]].copy()
    a = d.accepted / (d.accepted + d.rejections)
    pooled = d.accepted.sum() / (d.accepted.sum() + d.rejections.sum())
    rows["alpha_hat"] = a.values
    rows["predicted"] = speedup(a.values, k, c, verify_ratio)
    rows["measured"] = (rate(d) / rate(base.loc[d.index])).values
    rows["rel_error"] = (rows.measured - rows.predicted) / rows.predicted
    pm, mm = float(rows.predicted.median()), float(rows.measured.median())
    summary = {"runner": runner, "k": k, "c": c, "verify_ratio": verify_ratio, "calls": len(rows),
               "alpha_pooled": float(pooled), "predicted_pooled": float(speedup(pooled, k, c, verify_ratio)),
               "predicted_median": pm, "measured_median": mm, "rel_error": abs(mm - pm) / pm,
               "per_call_abs_error_median": float(rows.rel_error.abs().median())}
    return rows, summary


def paired_ratios(df: pd.DataFrame, baseline: str, by: list[str] | None = None) -> pd.DataFrame:
    """tokens/s of each runner ÷ the baseline's on the same prompt and repeat; median, IQR, n per group."""
    key = ["id", "repeat"]
    base = df[df.runner == baseline].set_index(key)["tokens_per_s"]
    d = df[df.runner != baseline].copy()
    d["ratio"] = d.tokens_per_s.values / base.loc[list(zip(d["id"], d["repeat"]))].values
    groups = ["runner"] + (by or [])
    q = d.groupby(groups)["ratio"]
    return pd.DataFrame({"median": q.median(), "q25": q.quantile(0.25), "q75": q.quantile(0.75),
                         "n": q.size()}).reset_index()


def per_token_latency(token_times: list[float]) -> np.ndarray:
    """Amortized per-token latency (ms): a pass that took Δ and revealed m tokens gives each Δ / m.

    The first token's latency is the time to first token (prefill included).
    """
    t = np.asarray(token_times, dtype=float)
    if t.size == 0:
        return t
    arrivals, counts = np.unique(t, return_counts=True)
    gaps = np.diff(np.concatenate([[0.0], arrivals])) * 1e3
    return np.repeat(gaps / counts, counts)


def latency_percentiles(token_times: list[float]) -> dict:
    """p50/p95/p99 of :func:`per_token_latency` over decode tokens (the first token, TTFT, reported apart)."""
    lat = per_token_latency(token_times)
    out = {"ttft_ms": float(lat[0]) if lat.size else float("nan")}
    rest = lat[1:] if lat.size > 1 else lat
    out.update({f"p{p}_ms": float(np.percentile(rest, p)) for p in (50, 95, 99)})
    return out


def median_length(prompts: list[tuple[dict, torch.Tensor]]) -> torch.Tensor:
    """The prompt of median length (where :func:`pass_costs` times passes for a whole prompt set)."""
    return sorted((ids for _, ids in prompts), key=len)[len(prompts) // 2]


def write_jsonl(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for rec in df.to_dict(orient="records"):
            f.write(json.dumps(rec, default=float) + "\n")
    return path


def time_passes(fns: dict[str, Callable[[], None]], repeats: int = 15, warmup: int = 3) -> pd.DataFrame:
    """Time zero-argument callables interleaved (rotating order), ``repeats`` rounds. One row per call (ms)."""
    names = list(fns)
    for _ in range(warmup):
        for f in fns.values():
            f()
    rows = []
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            _sync()
            t = time.perf_counter()
            fns[name]()
            _sync()
            rows.append({"pass": name, "repeat": r, "ms": (time.perf_counter() - t) * 1e3})
    return pd.DataFrame(rows)


def pass_costs(target, draft_model, ids: torch.Tensor, ks=(1, 2, 4, 8), repeats: int = 15,
               decoded: int = 0) -> dict:
    """Measure, side by side, one target pass over 1 token, over K + 1 tokens, and one draft pass over 1 token
    at the context of ``ids`` followed by ``decoded`` more tokens (half the decode budget puts the context
    where a decode loop spends it on average). Returns medians (ms) and ``c`` = draft / target(1),
    ``verify_ratio[K]``."""
    from .lm import CachedLM

    ids = torch.as_tensor(ids).view(-1)
    if decoded:
        ids = torch.cat([ids, ids[-1:].repeat(decoded)])
    cap = ids.numel() + max(ks) + 2
    t_lm = CachedLM(target, cap)
    t_lm.forward(ids)
    fns = {}

    def target_pass(n):
        def f():
            t_lm.forward(torch.ones(n, dtype=torch.long), last_only=False)
            t_lm.cache.rollback(n)
        return f

    for n in sorted({1, *[k + 1 for k in ks]}):
        fns[f"target[{n}]"] = target_pass(n)
    if draft_model is not None:
        d_lm = CachedLM(draft_model, cap)
        d_lm.forward(ids)

        def draft_pass():
            d_lm.forward(torch.ones(1, dtype=torch.long), last_only=True)
            d_lm.cache.rollback(1)
        fns["draft[1]"] = draft_pass
    df = time_passes(fns, repeats=repeats)
    med = df.groupby("pass").ms.median()
    out = {"ms": med.to_dict(), "spread_ms": (df.groupby("pass").ms.quantile(0.75)
                                              - df.groupby("pass").ms.quantile(0.25)).to_dict()}
    t1 = med["target[1]"]
    out["c"] = float(med["draft[1]"] / t1) if draft_model is not None else float("nan")
    out["verify_ratio"] = {k: float(med[f"target[{k + 1}]"] / t1) for k in ks}
    return out
