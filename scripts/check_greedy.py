"""Greedy exactness on the embedded target over the whole prompt mix.

    python scripts/check_greedy.py [--max-new-tokens 64] [--methods linear:ngram linear:model ...]

1. our autoregressive decoder == transformers `generate(do_sample=False)`, token for token, every prompt;
2. each speculative method == our autoregressive decoder, except at a float32 near-tie: at the first
   divergence (:func:`specdec_core.study.exactness.first_divergence`) the target's top-2 logit gap on the
   shared prefix must be < --tie-gap (:func:`~specdec_core.study.exactness.excused`; a length-only
   difference is never excused); every divergence is reported.
Writes data/reference/greedy_equality.jsonl; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

import specdec_core as sd
from specdec_core.study import peers
from specdec_core.study.exactness import NEAR_TIE, excused, first_divergence
from specdec_core.data.prompts import encode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--methods", nargs="*", default=["linear:ngram", "linear:model", "tree:model", "parallel:block"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tie-gap", type=float, default=NEAR_TIE)
    ap.add_argument("--per-task", type=int, default=None)
    ap.add_argument("--out", default="data/reference/greedy_equality.jsonl")
    args = ap.parse_args()

    pair = sd.load_pair("smollm2-135m")
    model, n = pair.target, args.max_new_tokens
    methods = [m for m in args.methods if m.split(":")[1] in pair.drafters]  # drafts not trained: skipped
    transformers_generate = peers.hf_runner(model, n)  # generate(do_sample=False), EOS as ours
    rows, failures = [], 0
    for p in tqdm(sd.load_prompts(per_task=args.per_task), desc="prompts"):
        ids = encode(pair, p)
        ar = sd.generate(model, ids, max_new_tokens=n).tokens
        ok = ar == transformers_generate(ids)["tokens"]
        failures += not ok
        rows.append(dict(id=p.id, check="autoregressive==transformers", equal=ok))
        for m in methods:
            method, drafter = m.split(":")
            sp = sd.generate(model, ids, drafter=pair.drafters[drafter], method=method, k=args.k,
                             max_new_tokens=n).tokens
            row = dict(id=p.id, check=f"{m}==autoregressive", equal=sp == ar)
            if sp != ar:
                i, gap = first_divergence(model, ids, sp, ar)
                tie = excused(i, gap, args.tie_gap)
                row.update(first_divergence=i, top2_gap=gap, near_tie=tie)
                where = f"top-2 logit gap {gap:.2e}" if gap is not None else "lengths differ"
                print(f"{p.id} {m}: diverges at token {i}, {where} -> {'near-tie' if tie else 'FAIL'}")
                failures += not tie
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
