"""Greedy exactness on the embedded target over the whole prompt mix.

    python scripts/check_greedy.py [--max-new-tokens 64] [--methods linear:ngram linear:model ...]

1. our autoregressive decoder == transformers `generate(do_sample=False)`, token for token, every prompt;
2. each speculative method == our autoregressive decoder, except at a float32 near-tie: at the first
   divergence the target's top-2 logit gap (recomputed on the shared prefix) must be < --tie-gap; every
   divergence is reported.
Writes data/reference/greedy_equality.jsonl; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

import specdec_core as sd
from specdec_core.lm import CachedLM


def top2_gap(model, ids: torch.Tensor, prefix: list[int]) -> float:
    lm = CachedLM(model, ids.numel() + len(prefix) + 1)
    logits = lm.forward(torch.cat([ids, torch.tensor(prefix, dtype=torch.long)]), last_only=True)[-1]
    top = torch.topk(logits.double(), 2).values
    return float(top[0] - top[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--methods", nargs="*", default=["linear:ngram", "linear:model", "tree:model", "parallel:block"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tie-gap", type=float, default=1e-3)
    ap.add_argument("--per-task", type=int, default=None)
    ap.add_argument("--out", default="data/reference/greedy_equality.jsonl")
    args = ap.parse_args()

    pair = sd.load_pair("smollm2-135m")
    model, n = pair.target, args.max_new_tokens
    methods = [m for m in args.methods if m.split(":")[1] in pair.drafters
               and (m.split(":")[0] != "tree" or Path(sd.__file__).with_name("tree.py").exists())]
    rows, failures = [], 0
    for p in tqdm(sd.load_prompts(per_task=args.per_task), desc="prompts"):
        ids = sd.prompts.encode(pair, p)
        ar = sd.generate(model, ids, max_new_tokens=n).tokens
        with torch.inference_mode():
            x = ids.view(1, -1)
            hf = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                eos_token_id=2, pad_token_id=2)[0, x.shape[1]:].tolist()
        ok = ar == hf
        failures += not ok
        rows.append(dict(id=p.id, check="autoregressive==transformers", equal=ok))
        for m in methods:
            method, drafter = m.split(":")
            sp = sd.generate(model, ids, drafter=pair.drafters[drafter], method=method, k=args.k,
                             max_new_tokens=n).tokens
            row = dict(id=p.id, check=f"{m}==autoregressive", equal=sp == ar)
            if sp != ar:
                i = next((i for i, (a, b) in enumerate(zip(sp, ar)) if a != b), min(len(sp), len(ar)))
                gap = top2_gap(model, ids, ar[:i])
                row.update(first_divergence=i, top2_gap=gap, near_tie=gap < args.tie_gap)
                print(f"{p.id} {m}: diverges at token {i}, top-2 logit gap {gap:.2e}"
                      f" -> {'near-tie' if gap < args.tie_gap else 'FAIL'}")
                failures += gap >= args.tie_gap
            rows.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    by = {}
    for r in rows:
        by.setdefault(r["check"], []).append(r["equal"])
    for check, eq in by.items():
        print(f"{check}: {sum(eq)}/{len(eq)} identical")
    print("FAILED" if failures else "all greedy checks pass", f"({len(rows)} comparisons) -> {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
