"""Linear speculative decoding on the embedded target against transformers' peers, one interleaved run.

    python scripts/bench_linear.py [--k 4] [--per-task 2] [--max-new-tokens 64] [--repeats 2] [--temperatures 0 1]

Runners (same prompts, same K, interleaved): our autoregressive decoder; linear SD with the shipped draft
model and with the n-gram drafter; transformers' plain `generate`, assisted generation (with the closest
transformers-runnable form of our draft, see specdec_core.peers.hf_assistant) and prompt lookup.
Writes data/reference/bench_linear.jsonl and prints tokens/s, per-token latency p50/p95/p99, paired ratios,
and the speedup predicted by Leviathan et al.'s Theorem 3.8 from the measured α, c and verify cost.
"""
from __future__ import annotations

import argparse

import pandas as pd

import specdec_core as sd
from specdec_core import bench, peers, theory


def ours(pair, method, drafter, k, n, temperature):
    def run(ids):
        r = sd.generate(pair.target, ids, drafter=drafter, method=method, k=k, max_new_tokens=n,
                        temperature=temperature, seed=0)
        s = r.stats
        rej = sum(1 for a, p in zip(s["accepted_lengths"], s["proposed"]) if a < p)
        return {"tokens": r.tokens, "tau": s["tau"], "accepted": sum(s["accepted_lengths"]), "rejections": rej,
                "proposed": sum(s["proposed"]), "target_passes": s["target_passes"],
                **bench.latency_percentiles(s["token_times"])}
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--temperatures", type=float, nargs="*", default=[0.0, 1.0])
    ap.add_argument("--out", default="data/reference/bench_linear.jsonl")
    args = ap.parse_args()

    pair = sd.load_pair("smollm2-135m")
    k, n = args.k, args.max_new_tokens
    prompts = [(dict(id=p.id, task=p.task), sd.prompts.encode(pair, p))
               for p in sd.load_prompts(per_task=args.per_task)]
    model_drafter = pair.drafters.get("model")
    assistant = peers.hf_assistant(model_drafter.model, pair.target) if model_drafter else None
    frames = []
    for temp in args.temperatures:
        runners = {"ours:autoregressive": ours(pair, "autoregressive", None, k, n, temp),
                   "hf:generate": peers.hf_runner(pair.target, n, temp)}
        if model_drafter:
            runners["ours:linear-model"] = ours(pair, "linear", model_drafter, k, n, temp)
            runners["hf:assisted"] = peers.assisted_runner(pair.target, assistant, k, n, temp)
        runners["ours:linear-ngram"] = ours(pair, "linear", pair.drafters["ngram"], k, n, temp)
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
            lin = df[df.runner == "ours:linear-model"]
            alpha = lin.accepted.sum() / (lin.accepted.sum() + lin.rejections.sum())
            costs = bench.pass_costs(pair.target, model_drafter.model, prompts[0][1], ks=(k,))
            pred = theory.speedup(alpha, k, costs["c"], costs["verify_ratio"][k])
            pred38 = theory.speedup(alpha, k, costs["c"])
            meas = bench.paired_ratios(df[df.runner.isin(["ours:autoregressive", "ours:linear-model"])],
                                       baseline="ours:autoregressive").iloc[0]["median"]
            print(f"α̂ = {alpha:.3f}, c = {costs['c']:.3f}, verify({k + 1} tokens)/target(1) = "
                  f"{costs['verify_ratio'][k]:.3f}; predicted speedup {float(pred):.3f}× (Thm 3.8 with measured "
                  f"verify cost; {float(pred38):.3f}× with verify = 1 pass), measured {meas:.3f}×, "
                  f"relative error {abs(meas - pred) / pred:.1%}")
    bench.write_jsonl(pd.concat(frames), args.out)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
