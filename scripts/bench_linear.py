"""Linear speculative decoding on the embedded target against transformers' peers, one interleaved run.

    python scripts/bench_linear.py [--k 4] [--per-task 2] [--max-new-tokens 64] [--repeats 2] [--temperatures 0 1]

Runners (same prompts, same K, interleaved): our autoregressive decoder; linear SD with the shipped draft
model and with the n-gram drafter; transformers' plain `generate`, assisted generation (with the closest
transformers-runnable form of our draft, see specdec_core.study.peers.hf_assistant) and prompt lookup.
Writes data/reference/bench_linear.jsonl and prints tokens/s, per-token latency p50/p95/p99, paired ratios,
and the speedup predicted by Leviathan et al.'s Theorem 3.8 from the measured α, c and verify cost
(:func:`specdec_core.study.bench.theory_check`: each call predicted from its own α̂, decode loops compared).
"""
from __future__ import annotations

import argparse

import pandas as pd

import specdec_core as sd
from specdec_core.study import bench, peers
from specdec_core.data.prompts import encode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--temperatures", type=float, nargs="*", default=[0.0, 1.0])
    ap.add_argument("--out", default="data/reference/bench_linear.jsonl")
    args = ap.parse_args()

    pair = sd.load_pair("smollm2-135m")
    k, n = args.k, args.max_new_tokens
    prompts = [(dict(id=p.id, task=p.task), encode(pair, p))
               for p in sd.load_prompts(per_task=args.per_task)]
    model_drafter = pair.drafters.get("model")
    assistant = peers.hf_assistant(model_drafter.model, pair.target) if model_drafter else None
    costs = None
    if model_drafter:  # c and the verify cost, timed side by side at a typical context
        costs = bench.pass_costs(pair.target, model_drafter.model, bench.median_length(prompts), ks=(k,),
                                 decoded=n // 2)
        print(f"pass costs (ms): { {p: round(v, 1) for p, v in costs['ms'].items()} }")
    frames, theory_rows = [], []
    for temp in args.temperatures:
        runners = {"ours:autoregressive": bench.generate_runner(pair.target, n, temp),
                   "hf:generate": peers.hf_runner(pair.target, n, temp)}
        if model_drafter:
            runners["ours:linear-model"] = bench.generate_runner(pair.target, n, temp, method="linear",
                                                                 drafter=model_drafter, k=k)
            runners["hf:assisted"] = peers.assisted_runner(pair.target, assistant, k, n, temp)
        runners["ours:linear-ngram"] = bench.generate_runner(pair.target, n, temp, method="linear",
                                                             drafter=pair.drafters["ngram"], k=k)
        runners["hf:prompt-lookup"] = peers.prompt_lookup_runner(pair.target, k, n, temperature=temp)
        print(f"\n== temperature {temp}, K={k}: {len(prompts)} prompts × {args.repeats} repeats ==")
        df = bench.run_interleaved(runners, prompts, repeats=args.repeats)
        df["temperature"] = temp
        frames.append(df)
        summary = df.groupby("runner").agg(tokens_per_s=("tokens_per_s", "median"), p50_ms=("p50_ms", "median"),
                                           p95_ms=("p95_ms", "median"), p99_ms=("p99_ms", "median"))
        print(summary.round(2).to_string())
        for base, other in [("hf:assisted", "ours:linear-model"), ("hf:prompt-lookup", "ours:linear-ngram"),
                            ("ours:autoregressive", "ours:linear-model"), ("ours:autoregressive", "ours:linear-ngram"),
                            ("hf:generate", "ours:autoregressive")]:
            if {base, other} <= set(runners):
                r = bench.paired_ratios(df[df.runner.isin([base, other])], baseline=base).iloc[0]
                print(f"{other} / {base}: median {r['median']:.3f}× (IQR {r.q25:.3f}–{r.q75:.3f})")
        if model_drafter:
            calls, th = bench.theory_check(df, "ours:linear-model", "ours:autoregressive", k, costs["c"],
                                           costs["verify_ratio"][k])
            print(f"theory (per call: α̂ of the call, c = {th['c']:.3f}, verify({k + 1} tokens)/target(1) = "
                  f"{th['verify_ratio']:.3f}; decode loops, {th['calls']} calls; pooled α̂ {th['alpha_pooled']:.3f}): "
                  f"predicted median {th['predicted_median']:.3f}×, measured median {th['measured_median']:.3f}×, "
                  f"relative error {th['rel_error']:.1%} (per call: median |error| "
                  f"{th['per_call_abs_error_median']:.1%}; one pooled α̂ would predict {th['predicted_pooled']:.3f}×)")
            theory_rows.append(calls.assign(temperature=temp))
    bench.write_jsonl(pd.concat(frames), args.out)
    print(f"-> {args.out}")
    if theory_rows:
        path = bench.write_jsonl(pd.concat(theory_rows), args.out.replace(".jsonl", "_theory.jsonl"))
        print(f"-> {path}")


if __name__ == "__main__":
    main()
