"""Our autoregressive decoder vs transformers' `generate` on the prompt mix, interleaved in one run.

    python scripts/bench_autoregressive.py [--per-task 2] [--max-new-tokens 64] [--repeats 3]

Prints the median paired tokens/s ratio (ours / transformers) and its spread; writes JSONL to
data/reference/bench_autoregressive.jsonl. Issue 2 asks for a median ratio >= 1.1.
"""
from __future__ import annotations

import argparse

import torch

import specdec_core as sd
from specdec_core import bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="data/reference/bench_autoregressive.jsonl")
    args = ap.parse_args()

    pair = sd.load_pair("smollm2-135m")
    model, n = pair.target, args.max_new_tokens
    prompts = [(dict(id=p.id, task=p.task), sd.prompts.encode(pair, p))
               for p in sd.load_prompts(per_task=args.per_task)]

    def ours(ids):
        return {"tokens": sd.generate(model, ids, max_new_tokens=n).tokens}

    @torch.inference_mode()
    def transformers_generate(ids):
        x = ids.view(1, -1)
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                             eos_token_id=2, pad_token_id=2)
        return {"tokens": out[0, x.shape[1]:].tolist()}

    df = bench.run_interleaved({"transformers": transformers_generate, "ours": ours}, prompts,
                               repeats=args.repeats)
    bench.write_jsonl(df, args.out)
    r = bench.paired_ratios(df, baseline="transformers")
    print(df.groupby("runner").tokens_per_s.median().rename("median tokens/s").to_string())
    row = r.iloc[0]
    print(f"ours / transformers generate: median {row['median']:.3f}× "
          f"(IQR {row.q25:.3f}–{row.q75:.3f}, n={int(row.n)} paired calls)")


if __name__ == "__main__":
    main()
