"""The continuous-batching engine on the embedded pair: its overhead at B = 1, and a load sweep of policies.

    .venv/bin/python scripts/bench_engine.py [--out build/bench_engine] [--requests 12] [--loads 0.15 0.6 1.2]

1. **B = 1**: one request at a time through ``Engine`` (``max_batch=1``) against ``sd.generate`` on the same
   prompts, autoregressive and prompt lookup, interleaved, after a warm-up: the median and IQR of the paired
   tokens/s ratios (the engine's pass is the batch cache's; ``generate``'s the single-sequence cache's).
2. **Load**: a traffic mix of chat and input-grounded requests (``--share`` of them grounded), served at loads given
   as fractions of autoregressive decoding's saturation throughput (measured first, every request waiting at t = 0),
   one Poisson schedule per load, the same for every policy: autoregressive; prompt lookup at a fixed K; the suffix
   drafter at a fixed cap (no memory across requests: the rounds replay the same requests); per class (suffix for
   grounded requests, prompt lookup for chat); load-adaptive (the same drafters, K chosen by the engine each step).
   Every greedy output is compared with ``generate`` alone (count printed). Goodput's SLOs are set from
   autoregressive decoding at the lowest load: TTFT ≤ ``--slo-ttft`` × its median, TPOT ≤ ``--slo-tpot`` × its median.

Timings: run it alone (idle OpenMP threads spin). Writes ``b1.csv``, ``load_runs.jsonl``, ``load_summary.csv`` and
``k_table.csv`` to ``--out`` and prints the tables.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

import specdec_core as sd
from specdec_core.record import Timer
from specdec_core.serving import Engine, StepCost
from specdec_core.study import load as ld


def b1_overhead(target, prompts, specs, max_new_tokens, repeats):
    """Paired: the same request through Engine(max_batch=1) and generate, interleaved; tokens/s per call."""
    rows = []
    timer = Timer(None)

    def engine_call(ids, spec):
        e = Engine(target, max_batch=1)
        e.submit(ids, max_new_tokens=max_new_tokens, **spec)
        return e.run()[0].tokens

    def generate_call(ids, spec):
        return sd.generate(target, ids, max_new_tokens=max_new_tokens, **spec).tokens

    for name, spec in specs.items():  # warm-up
        engine_call(prompts[0], spec), generate_call(prompts[0], spec)
    for rnd in range(repeats):
        for j, ids in enumerate(prompts):
            for name, spec in specs.items():
                order = [("engine", engine_call), ("generate", generate_call)]
                for who, fn in (order if (rnd + j) % 2 == 0 else order[::-1]):
                    t = timer.now()
                    toks = fn(ids, spec)
                    rows.append(dict(round=rnd, prompt=j, method=name, who=who, tokens=toks,
                                     tokens_per_s=len(toks) / (timer.now() - t)))
    df = pd.DataFrame(rows)
    wide = df.pivot_table(index=["round", "prompt", "method"], columns="who", values="tokens_per_s").reset_index()
    wide["ratio"] = wide.engine / wide.generate
    same = df.pivot_table(index=["round", "prompt", "method"], columns="who", values="tokens", aggfunc="first")
    return wide, int((same.engine == same.generate).sum()), len(same)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="build/bench_engine")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--share", type=float, default=0.5, help="input-grounded share of the traffic mix")
    ap.add_argument("--loads", type=float, nargs="+", default=[0.15, 0.6, 1.2])
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--b1-prompts", type=int, default=4)
    ap.add_argument("--b1-repeats", type=int, default=2)
    ap.add_argument("--k-ngram", type=int, default=8)
    ap.add_argument("--k-suffix", type=int, default=32)
    ap.add_argument("--slo-ttft", type=float, default=4.0)
    ap.add_argument("--slo-tpot", type=float, default=1.5)
    ap.add_argument("--skip-b1", action="store_true")
    ap.add_argument("--skip-load", action="store_true", help="the B = 1 comparison alone")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    pair = sd.load_pair("smollm2-135m")
    target = pair.target
    chat = [sd.prompts.encode(pair, p) for p in sd.load_prompts(per_task=2)]
    grounded = [sd.prompts.encode(pair, p) for p in sd.prompts.load_grounded("eval", per_task=3)]

    if not args.skip_b1:
        specs = {"autoregressive": {}, "linear, n-gram": dict(method="linear", drafter=pair.drafters["ngram"],
                                                               k=args.k_ngram)}
        wide, same, n = b1_overhead(target, chat[:args.b1_prompts], specs, 64, args.b1_repeats)
        wide.to_csv(out / "b1.csv", index=False)
        q = wide.groupby("method").ratio.quantile([0.25, 0.5, 0.75]).unstack()
        print("engine ÷ generate, tokens/s at B = 1 (paired calls; median and IQR):")
        print(q.round(3).to_string())
        print(f"identical outputs: {same} of {n} pairs")
    if args.skip_load:
        return

    mix = sd.prompts.traffic_mix([("chat", ids) for ids in chat], [("grounded", ids) for ids in grounded],
                                 args.share, args.requests, seed=0)
    policies = ld.traffic_policies(pair.drafters["ngram"], sd.SuffixDrafter(learn=False), args.k_ngram, args.k_suffix)
    sat = ld.saturation(target, mix, args.max_batch, args.max_new_tokens)
    print(f"autoregressive saturation: {sat:.2f} requests/s at {args.max_batch} rows")
    context = StepCost.typical_context(target, [(len(ids), args.max_new_tokens) for _, ids in mix])
    step_cost = StepCost.measure(target, max_rows=args.max_batch, context=context)
    runs = ld.load_sweep(target, mix, policies, args.loads, sat, args.max_batch, args.max_new_tokens,
                         repeats=args.repeats, step_cost=step_cost, progress=tqdm)
    ties = ld.greedy_identity(target, mix, runs, args.max_new_tokens)
    print(f"greedy identity: {len(runs)} requests equal generate alone ({len(ties)} at an excused near-tie)")
    slo = ld.slo_from(runs, args.slo_ttft, args.slo_tpot)
    print(f"SLOs: TTFT ≤ {1e3 * slo['ttft']:.0f} ms, TPOT ≤ {1e3 * slo['tpot']:.1f} ms")
    table = ld.summary(runs, slo)
    cls_table = ld.summary(runs, slo, by=("policy", "load", "cls"))
    runs.to_json(out / "load_runs.jsonl", orient="records", lines=True)
    table.to_csv(out / "load_summary.csv", index=False)
    cls_table.to_csv(out / "load_summary_by_class.csv", index=False)
    cols = ["policy", "load", "tokens_per_s", "goodput", "ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms"]
    print(table[cols].round(3).to_string(index=False))
    print(cls_table[["policy", "load", "cls", "tpot_p50_ms", "e2e_p50_ms"]].round(1).to_string(index=False))
    for name in policies:
        if name != "autoregressive":
            print(f"{name}: crossover load (goodput below autoregressive) {ld.crossover(table, name)}")
    kt = ld.k_table(runs, "load-adaptive")
    kt.to_csv(out / "k_table.csv", index=False)
    print(kt.round(2).to_string(index=False))
    print("num_speculative_tokens_per_batch_size =", json.dumps(ld.vllm_k_setting(kt)))


if __name__ == "__main__":
    main()
