"""Write the draft's training prompt set ``data/prompts/train.jsonl`` (deterministic, seed-driven).

    python scripts/make_train_prompts.py            # writes data/prompts/train.jsonl
    python scripts/make_train_prompts.py --check    # fails if the committed file differs from a rebuild
    python scripts/make_train_prompts.py --more     # data/prompts/train_more.jsonl (--check works there too)

The generator (templates × topics of the project's own, disjoint from the eval mix) is
:mod:`specdec_core.train.prompts`; this is its command line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdec_core.train import prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=3000, help="number of prompts")
    ap.add_argument("--seed", type=int, default=None, help="default: the set's own (prompts.SEED, prompts.MORE_SEED)")
    ap.add_argument("--out", type=Path, default=None, help="default: data/prompts/train.jsonl (train_more.jsonl)")
    ap.add_argument("--check", action="store_true", help="only compare a rebuild with the file on disk")
    ap.add_argument("--more", action="store_true",
                    help="the second set (prompts.build_more: into-English translation, numbered passages, the eval "
                         "mix's task proportions), never repeating a first-set prompt")
    args = ap.parse_args()
    if args.more:
        first = {json.loads(line)["turns"][0] for line in prompts.TRAIN_PATH.read_text().splitlines() if line.strip()}
        args.seed = prompts.MORE_SEED if args.seed is None else args.seed
        args.out = args.out or prompts.MORE_PATH
        rows = prompts.build_more(args.n, args.seed, exclude=first)
    else:
        args.seed = prompts.SEED if args.seed is None else args.seed
        args.out = args.out or prompts.TRAIN_PATH
        rows = prompts.build(args.n, args.seed)
    try:
        prompts.check_disjoint(rows)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    text = prompts.to_jsonl(rows)
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'matches' if same else 'DIFFERS from'} a rebuild with seed {args.seed}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {len(rows)} prompts to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
