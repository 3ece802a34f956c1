"""How fast can this machine write teacher data? Response tokens per second of batched target decoding at
each batch size, for the recipe's generator (:func:`specdec_core.train.teacher.teacher_batch`: one preallocated
cache, rows at their own lengths) and for ``transformers``' ``generate`` with a top-k recording logits processor
(the generator it replaced, whose cache grows by concatenation), side by side.

    python scripts/teacher_throughput.py                 # cache at B = 8 16 32 64, generate at B = 32, 3 repeats
    python scripts/teacher_throughput.py --batch 32 64 --generate-batch --out data/reference/teacher_throughput.jsonl

Each repeat answers the same training prompts at every (generator, B), in a rotated order (none always runs
first); a batch holds the B shortest-to-longest prompts of a fixed seeded sample, as the recipe's length-
sorted batches do. "tokens" are response tokens kept (up to and including EOS), so the passes a batch
spends on rows that ended early count as cost, not as output. Run it alone: it is a benchmark.
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
from specdec_core.data.prompts import encode, load_prompts
from specdec_core.train.teacher import EOS, PAD, teacher_batch
from specdec_core.train.prompts import TRAIN_PATH


class _Recorder:
    """A logits processor keeping the top-k of ``log_softmax(scores)``; ``generate`` runs it on the raw logits."""

    def __init__(self, k: int):
        self.k, self.idx, self.logp = k, [], []

    def __call__(self, input_ids, scores):
        top = torch.log_softmax(scores.float(), -1).topk(self.k, dim=-1)
        self.idx.append(top.indices.to(torch.int32))
        self.logp.append(top.values.to(torch.float16))
        return scores


@torch.inference_mode()
def hf_teacher_batch(target, prompts, max_new_tokens, temperature, top_k_record, seed, eos_id, pad_id=PAD):
    """The same records from ``generate`` (left-padded batch, dynamic cache): the reference for the speed-up."""
    from transformers import LogitsProcessorList

    B, L = len(prompts), max(len(p) for p in prompts)
    ids, mask = torch.full((B, L), pad_id, dtype=torch.long), torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):], mask[i, L - len(p):] = p, 1
    rec, sample = _Recorder(top_k_record), temperature > 0
    torch.manual_seed(seed)
    out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=sample,
                          temperature=temperature if sample else None, top_k=0 if sample else None,
                          top_p=1.0 if sample else None, logits_processor=LogitsProcessorList([rec]),
                          eos_token_id=eos_id, pad_token_id=pad_id)[:, L:]
    top_idx = torch.stack(rec.idx, 1)
    records = []
    for i, row in enumerate(out):
        hit = (row == eos_id).nonzero()
        n = int(hit[0]) + 1 if hit.numel() else row.numel()
        records.append(dict(response=row[:n], top_idx=top_idx[i, :n]))
    return records


GENERATORS = {"cache": teacher_batch, "generate": hf_teacher_batch}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--generate-batch", type=int, nargs="*", default=[32],
                    help="batch sizes at which to time transformers' generate too (none: skip it)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the runs as JSON lines")
    args = ap.parse_args()
    if min(args.batch + args.generate_batch) < 1 or args.repeats < 1:
        raise SystemExit("--batch sizes and --repeats must be positive")
    torch.set_num_threads(args.threads)
    pair = load_pair("smollm2-135m")
    prompts = load_prompts(TRAIN_PATH)
    sizes = sorted(set(args.batch + args.generate_batch))
    sample = random.Random(0).sample(prompts, max(sizes))
    ids = {p.id: encode(pair, p) for p in sample}
    batches = {B: sorted(sample[:B], key=lambda p: (len(ids[p.id]), p.id)) for B in sizes}
    for fn in GENERATORS.values():  # warm-up
        fn(pair.target, [ids[p.id] for p in batches[min(sizes)]][:4], 8, args.temperature, 20, 0, EOS)
    cells = [("cache", B) for B in args.batch] + [("generate", B) for B in args.generate_batch]
    runs = []
    for rep in range(args.repeats):
        for g, B in cells[rep % len(cells):] + cells[:rep % len(cells)]:
            t = time.perf_counter()
            recs = GENERATORS[g](pair.target, [ids[p.id] for p in batches[B]], args.max_new_tokens,
                                 args.temperature, 20, rep, EOS)
            s = time.perf_counter() - t
            tokens = sum(r["response"].numel() for r in recs)
            runs.append(dict(generator=g, B=B, repeat=rep, seconds=round(s, 3), tokens=tokens,
                             tokens_per_s=round(tokens / s, 2), threads=torch.get_num_threads(),
                             temperature=args.temperature, max_new_tokens=args.max_new_tokens))
            print(f"repeat {rep} {g:>8} B={B:3d}: {tokens} tokens in {s:6.1f} s = {tokens / s:6.1f} tokens/s", flush=True)
    q = {c: np.percentile([r["tokens_per_s"] for r in runs if (r["generator"], r["B"]) == c], [25, 50, 75])
         for c in cells}
    print(f"\n{'generator':>9}   B   tokens/s median (IQR)")
    for (g, B), (q25, med, q75) in q.items():
        print(f"{g:>9} {B:3d}   {med:7.1f} ({q25:.1f}–{q75:.1f})")
    best = max(args.batch, key=lambda B: q["cache", B][1])
    print(f"fastest: B = {best} ({q['cache', best][1]:.0f} tokens/s): 1 M response tokens take about "
          f"{1e6 / q['cache', best][1] / 3600:.1f} h on this machine")
    for B in args.generate_batch:
        if ("cache", B) in q:
            print(f"B = {B}: cache ÷ generate = {q['cache', B][1] / q['generate', B][1]:.2f}× (medians)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in runs))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
