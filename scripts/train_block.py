"""Train (or check) the block drafter for SmolLM2-135M-Instruct — the second step of ``make models``.

    python scripts/train_block.py                     # shipped block draft present and valid: nothing to do
    python scripts/train_block.py --force             # retrain, compare with the shipped block draft
    python scripts/train_block.py --force --install   # ... and replace the shipped one (maintainers)
    python scripts/train_block.py --write-card        # measure the shipped one and rewrite its MODEL_CARD.md

The recipe (the model draft's teacher data and KD loss, mask blocks trained in one pass; :class:`BlockRecipe`,
the only place its defaults live) is :mod:`specdec_core.train.block`; this is its command line.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from specdec_core.models import shipped
from specdec_core.train import block
from specdec_core.train.block import BLOCK_DIR
from specdec_core.paths import rel
from specdec_core.train.drafts import install


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="retrain even though a valid shipped block draft exists")
    ap.add_argument("--install", action="store_true", help="copy the retrained block draft over the shipped one")
    ap.add_argument("--write-card", action="store_true", help="measure the shipped block draft, rewrite MODEL_CARD.md")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.write_card and not args.force:
        shipped.verify(BLOCK_DIR)
        print("wrote", rel(block.card(BLOCK_DIR)))
        return 0
    if not args.force:
        if shipped.is_present(BLOCK_DIR):
            sums = shipped.verify(BLOCK_DIR)
            print(f"shipped block draft {rel(BLOCK_DIR)} is valid (model.safetensors sha256 "
                  f"{sums['model.safetensors'][:16]}…); nothing to train (make models FORCE=1 retrains)")
            return 0
        print(f"no shipped block draft in {rel(BLOCK_DIR)}: training one")
    t = time.perf_counter()
    model, ctx = block.run(block.BlockRecipe())
    out = ctx["out"]
    acc = ctx["val_accept_by_position"]
    print(f"\ntrained in {time.perf_counter() - t:.0f} s (training {ctx['train_seconds']} s); held-out greedy "
          f"P(accept >= j): block {acc['block']}, model draft {acc['model_draft']}; weights in {rel(out)}")
    if args.force and (cmp := block.compare_with_shipped(out)) is not None:
        print(f"retrained vs shipped: weights bitwise identical {cmp['same_files']}; P(accept >= j) shipped "
              f"{cmp['accept_by_position']}")
    if args.install or not shipped.is_present(BLOCK_DIR):
        install(out, BLOCK_DIR, block.FILES)
        print("installed the block draft in", rel(BLOCK_DIR))
        print("wrote", rel(block.card(BLOCK_DIR)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
