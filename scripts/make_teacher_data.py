"""The 1 M-token teacher set (issue 16): the target answers every training prompt, including prompts over passages
it wrote itself. Resumable: every batch is a shard under ``data/train_cache/``; rerun the same command to continue.

    python scripts/make_teacher_data.py                  # both stages (about 2 h on 2 cores; see --batch)
    python scripts/make_teacher_data.py --stage writing  # stage 1 only: passages, then the wide prompt file
    python scripts/make_teacher_data.py --smoke          # every stage at a tiny size (a minute; prompts in build/)

Stage 1 (``writing``): the target answers the writing requests of ``data/prompts/train_writing.jsonl``
(:func:`specdec_core.train.wide.build_writing`, up to ``--writing-tokens`` each); its kept answers become
``data/prompts/passages.jsonl`` and the prompts over them ``data/prompts/train_wide.jsonl`` (both committed: they
are prompts, and the passages cost the generation). Stage 2 (``answers``): the target answers every prompt of
``train.jsonl``, ``train_more.jsonl`` and ``train_wide.jsonl`` (up to 128 tokens, the recipe's). In both stages a
``--sample-frac`` share of the prompts is answered at temperature 1, the rest greedily; the recorded law is the
target's full-vocabulary softmax (top 20). Not a benchmark, but it runs best alone (2 cores).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from specdec_core.models.hub import load_pair
from specdec_core.train import drafts, teacher, wide
from specdec_core.train.prompts import to_jsonl


def run_stage(pair, files: list[Path], max_new_tokens: int, sample_frac: float, batch: int,
              limit: int | None = None) -> list[dict]:
    """:func:`specdec_core.train.teacher.stage` with a line of what it holds; returns every record."""
    t = time.perf_counter()
    train, val, info = teacher.stage(pair, drafts.Recipe(), files, max_new_tokens, batch, sample_frac, limit)
    recs = train + val
    n_tok = sum(r["response"].numel() for r in recs)
    print(f"{', '.join(f.name for f in files)}: {len(recs)} answers, {n_tok} response tokens in "
          f"{info['teacher_folder']} (this call {time.perf_counter() - t:.0f} s)", flush=True)
    return recs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=["writing", "answers", "all"], default="all")
    ap.add_argument("--writing", type=int, default=1200, help="writing requests the target answers (stage 1)")
    ap.add_argument("--writing-tokens", type=int, default=wide.WRITING_TOKENS, help="token budget of each passage")
    ap.add_argument("--wide", type=int, default=3000, help="prompts built over the passages")
    ap.add_argument("--sample-frac", type=float, default=wide.SAMPLE_FRAC, help="share answered at temperature 1")
    ap.add_argument("--batch", type=int, default=wide.BATCH, help="rows per batch (scripts/teacher_throughput.py)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, files under build/teacher-smoke/")
    args = ap.parse_args()
    if not 0 <= args.sample_frac <= 1 or min(args.writing, args.wide, args.batch, args.writing_tokens) < 1:
        raise SystemExit("--sample-frac lies in [0, 1]; --writing, --wide, --batch, --writing-tokens are positive")
    torch.set_num_threads(args.threads)
    limit, min_words = None, 60
    paths = dict(writing=wide.WRITING_PATH, passages=wide.PASSAGES_PATH, wide=wide.WIDE_PATH)
    if args.smoke:  # prompt files under build/; the (few) answers are cached as any others
        args.writing, args.writing_tokens, args.wide, args.batch, limit, min_words = 8, 24, 6, 4, 8, 3
        paths = {k: Path("build/teacher-smoke") / v.name for k, v in paths.items()}
    pair = load_pair("smollm2-135m")
    if args.stage in ("writing", "all"):
        rows = wide.build_writing(args.writing)
        paths["writing"].parent.mkdir(parents=True, exist_ok=True)
        paths["writing"].write_text(to_jsonl(rows))
        recs = run_stage(pair, [paths["writing"]], args.writing_tokens, args.sample_frac, args.batch)
        answers = {r["key"]: pair.tokenizer.decode(r["response"].tolist(), skip_special_tokens=True) for r in recs}
        passages = wide.passages_from(rows, answers, min_words)
        paths["passages"].write_text(to_jsonl(passages))
        print(f"kept {len(passages)} of {len(rows)} answers as passages "
              f"(median {sorted(len(p['text'].split()) for p in passages)[len(passages) // 2]} words) → {paths['passages']}")
        paths["wide"].write_text(to_jsonl(wide.build_wide(passages, args.wide)))
        print(f"wrote {args.wide} prompts over them → {paths['wide']}")
    if args.stage in ("answers", "all"):
        if not paths["wide"].exists():
            raise SystemExit(f"{paths['wide']} is missing: run --stage writing first")
        run_stage(pair, [*wide.ANSWER_FILES[:2], paths["wide"]], 8 if args.smoke else wide.ANSWER_TOKENS,
                  args.sample_frac, args.batch, limit=3 * limit if limit else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
