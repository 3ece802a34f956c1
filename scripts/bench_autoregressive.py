"""Our autoregressive decoder vs transformers' `generate` on the prompt mix, interleaved in one run.

    python scripts/bench_autoregressive.py [--per-task 2] [--max-new-tokens 64] [--repeats 3]

Prints the median paired tokens/s ratio (ours / transformers) and its spread; writes JSONL to
data/reference/bench_autoregressive.jsonl. Issue 2 asks for a median ratio >= 1.1.

Then the ceiling on that ratio: each decoder's time per decoded token (a call of n + 1 new tokens minus a
call of 1, over n; same prompt, interleaved) against one bare forward of the model over 1 token. Both run
the same forward; what is left is per-step overhead, the only place a decoder of the same model can win.
"""
from __future__ import annotations

import argparse
from functools import partial

import specdec_core as sd
from specdec_core.study import bench, peers
from specdec_core.data.prompts import encode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="data/reference/bench_autoregressive.jsonl")
    args = ap.parse_args()

    pair = sd.load_pair("smollm2-135m")
    model, n = pair.target, args.max_new_tokens
    prompts = [(dict(id=p.id, task=p.task), encode(pair, p))
               for p in sd.load_prompts(per_task=args.per_task)]

    def ours(ids, new=n):
        return {"tokens": sd.generate(model, ids, max_new_tokens=new).tokens}

    df = bench.run_interleaved({"transformers": peers.hf_runner(model, n), "ours": ours}, prompts,
                               repeats=args.repeats)
    bench.write_jsonl(df, args.out)
    r = bench.paired_ratios(df, baseline="transformers")
    print(df.groupby("runner").tokens_per_s.median().rename("median tokens/s").to_string())
    row = r.iloc[0]
    print(f"ours / transformers generate: median {row['median']:.3f}× "
          f"(IQR {row.q25:.3f}–{row.q75:.3f}, n={int(row.n)} paired calls)")

    ids = bench.median_length(prompts)
    fwd = bench.pass_costs(model, None, ids, ks=(1,), decoded=n // 2)["ms"]["target[1]"]
    runners = {f"transformers[{m}]": peers.hf_runner(model, m) for m in (1, n + 1)}
    runners |= {f"ours[{m}]": partial(ours, new=m) for m in (1, n + 1)}
    calls = bench.run_interleaved(runners, [(dict(id="ceiling"), ids)], repeats=2 * args.repeats, warmup=1,
                                  progress=False)
    med = calls.groupby("runner")[["seconds", "new_tokens"]].median()
    print(f"one forward over 1 token: {fwd:.1f} ms")
    for name in ("transformers", "ours"):
        long, short = med.loc[f"{name}[{n + 1}]"], med.loc[f"{name}[1]"]
        per = 1e3 * (long.seconds - short.seconds) / max(1.0, long.new_tokens - short.new_tokens)
        print(f"{name}: {per:.1f} ms per decoded token, of which the forward is {fwd:.1f} ms: per-step overhead "
              f"{per - fwd:+.1f} ms ({(per - fwd) / per:+.1%}; a negative value is timing noise), so a decoder with no "
              f"overhead at all would be at most {max(per / fwd, 1.0):.3f}× faster")


if __name__ == "__main__":
    main()
