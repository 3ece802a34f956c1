"""Train (or check) the model draft for SmolLM2-135M-Instruct — what ``make models`` runs.

    python scripts/train_drafts.py            # shipped draft present and valid: nothing to do
    python scripts/train_drafts.py --force    # retrain from scratch, compare with the shipped draft
    python scripts/train_drafts.py --force --install   # ... and replace the shipped draft (maintainers)

The recipe (self-distillation on the project's training prompts; :class:`Recipe`, the only place its
defaults live) is :mod:`specdec_core.train.drafts`; this is its command line.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from specdec_core.models import shipped
from specdec_core.train import drafts
from specdec_core.paths import rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="retrain even though a valid shipped draft exists")
    ap.add_argument("--install", action="store_true", help="copy the retrained draft over the shipped one")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = shipped.MODEL_DRAFT
    if not args.force:
        if shipped.is_present(target_dir):
            sums = shipped.verify(target_dir)  # raises, naming the file, if corrupt
            print(f"shipped draft {rel(target_dir)} is valid "
                  f"(model.safetensors sha256 {sums['model.safetensors'][:16]}…); nothing to train "
                  "(make models FORCE=1 retrains)")
            return 0
        print(f"no shipped draft in {rel(target_dir)}: training one")
    recipe = drafts.Recipe()
    out = recipe.out_dir() / "final"
    t = time.perf_counter()
    draft, ctx = drafts.run(recipe, out)
    print(f"\ntrained in {time.perf_counter() - t:.0f} s (teacher data {ctx['teacher_seconds']} s, "
          f"training {ctx['train_seconds']} s); held-out greedy alpha {ctx['val_greedy_alpha']}, "
          f"T=1 alpha {ctx['val_t1_alpha']}; weights in {rel(out)}")
    if args.force:
        print(drafts.format_comparison(drafts.compare_with_shipped(out, ctx)))
    if args.install or not shipped.is_present(target_dir):
        drafts.install(out, target_dir)
        print(f"installed the draft in {rel(target_dir)} "
              "(run scripts/eval_draft.py --write-card to refresh its model card)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
