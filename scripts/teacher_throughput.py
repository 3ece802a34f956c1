"""How fast can this machine write teacher data? Response tokens per second of batched target decoding
(:func:`specdec_core.train.distill.teacher_batch`, the recipe's generator, top-k recorder on) at each batch size.

    python scripts/teacher_throughput.py                       # B = 8 16 32 64, 3 interleaved repeats
    python scripts/teacher_throughput.py --batch 16 64 --repeats 5 --out data/reference/teacher_throughput.jsonl

Each repeat answers the same training prompts at every B, in a rotated order (one B never always runs
first); a batch holds the B shortest-to-longest prompts of a fixed seeded sample, as the recipe's length-
sorted batches do. "tokens" are response tokens kept (up to and including EOS), so the padding a batch
spends on rows that ended early counts as cost, not as output. Run it alone: it is a benchmark.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specdec_core.models import load_pair
from specdec_core.study.prompts import encode, load_prompts
from specdec_core.train.drafts import EOS, PAD
from specdec_core.train.distill import teacher_batch
from specdec_core.train.prompts import TRAIN_PATH


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the runs as JSON lines")
    args = ap.parse_args()
    if min(args.batch) < 1 or args.repeats < 1:
        raise SystemExit("--batch sizes and --repeats must be positive")
    torch.set_num_threads(args.threads)
    pair = load_pair("smollm2-135m")
    prompts = load_prompts(TRAIN_PATH)
    sample = random.Random(0).sample(prompts, max(args.batch))
    ids = {p.id: encode(pair, p) for p in sample}
    batches = {B: sorted(sample[:B], key=lambda p: (len(ids[p.id]), p.id)) for B in args.batch}
    teacher_batch(pair.target, [ids[p.id] for p in batches[min(args.batch)]][:4], 8, args.temperature, 20, 0,
                  EOS, PAD)  # warm-up
    runs = []
    for rep in range(args.repeats):
        order = args.batch[rep % len(args.batch):] + args.batch[:rep % len(args.batch)]
        for B in order:
            t = time.perf_counter()
            recs = teacher_batch(pair.target, [ids[p.id] for p in batches[B]], args.max_new_tokens,
                                 args.temperature, 20, rep, EOS, PAD)
            s = time.perf_counter() - t
            tokens = sum(r["response"].numel() for r in recs)
            runs.append(dict(B=B, repeat=rep, seconds=round(s, 3), tokens=tokens, tokens_per_s=round(tokens / s, 2),
                             threads=torch.get_num_threads(), temperature=args.temperature,
                             max_new_tokens=args.max_new_tokens))
            print(f"repeat {rep} B={B:3d}: {tokens} tokens in {s:6.1f} s = {tokens / s:6.1f} tokens/s", flush=True)
    quartiles = {B: np.percentile([r["tokens_per_s"] for r in runs if r["B"] == B], [25, 50, 75]) for B in args.batch}
    base = quartiles[args.batch[0]][1]
    print(f"\n  B   tokens/s median (IQR)        ÷ B={args.batch[0]}")
    for B, (q25, med, q75) in quartiles.items():
        print(f"{B:3d}   {med:7.1f} ({q25:.1f}–{q75:.1f})      {med / base:5.2f}×")
    best = max(quartiles, key=lambda B: quartiles[B][1])
    print(f"fastest: B = {best} ({quartiles[best][1]:.0f} tokens/s): 1 M response tokens take about "
          f"{1e6 / quartiles[best][1] / 3600:.1f} h on this machine")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in runs))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
