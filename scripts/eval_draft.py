"""Evaluate the shipped model draft of SmolLM2-135M-Instruct: acceptance, cost, speed, best K.

    python scripts/eval_draft.py                 # full run on the eval mix; writes data/reference/draft_*
    python scripts/eval_draft.py --quick         # 1 prompt per task, 32 tokens (smoke test)
    python scripts/eval_draft.py --write-card    # ... and refresh the draft's MODEL_CARD.md
    python scripts/eval_draft.py --card-only     # rewrite MODEL_CARD.md from the last run's draft_summary.jsonl

Stages (K sweep on held-out training prompts, cost, speed and acceptance on the eval mix) and the model card
are :mod:`specdec_core.tools.drafteval`; this is their command line. Writes ``draft_ksweep.jsonl``,
``draft_speed.jsonl``, ``draft_alpha.jsonl``, ``draft_cost.csv`` and ``draft_summary.jsonl`` to ``--out``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from specdec_core.tools import drafteval
from specdec_core.paths import rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8], help="K sweep")
    ap.add_argument("--k", type=int, default=None, help="skip the sweep and use this K")
    ap.add_argument("--sweep-prompts", type=int, default=12, help="held-out training prompts for the K sweep")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of the eval-mix speed run")
    ap.add_argument("--per-task", type=int, default=None, help="eval prompts per task (default: all)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 prompt per task, 32 tokens, K sweep on 2")
    ap.add_argument("--write-card", action="store_true", help="refresh data/drafts/smollm2-135m-draft/MODEL_CARD.md")
    ap.add_argument("--out", type=Path, default=drafteval.REF)
    ap.add_argument("--card-only", action="store_true", help="rewrite MODEL_CARD.md from the last draft_summary.jsonl")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.card_only:
        print("wrote", rel(drafteval.write_card(drafteval.last_summary(args.out))))
        return 0
    if args.quick:
        args.per_task, args.max_new_tokens, args.sweep_prompts = 1, 32, 2
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    try:
        summary = drafteval.evaluate(args.out, args.max_new_tokens, args.ks, args.k, args.sweep_prompts, args.repeats,
                                     args.per_task, log=print)
    except drafteval.NoModelDraft as e:
        raise SystemExit(str(e)) from None
    if args.write_card:
        print("wrote", rel(drafteval.write_card(summary)))
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
