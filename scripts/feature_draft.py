"""Experiment: does conditioning the draft on the target's hidden states (EAGLE-style) raise α here?

    python scripts/feature_draft.py                  # ~65 min on 2 cores (three variants); writes data/reference/feature_draft.json
    python scripts/feature_draft.py --steps 200 --out /tmp/f.json   # a quick look
    python scripts/feature_draft.py --variants with_features        # one variant (finished ones resume instantly)

A draft that reads the target's final hidden state beside the next token, trained on the shipped draft's
records with its optimiser, steps and seed, against the shipped token-only draft: first and second
draft-token acceptance on held-out training prompts, teacher-forced. The experiment (model, losses,
measurements) is :mod:`specdec_core.train.feature`; this is its command line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from specdec_core.train import feature
from specdec_core.paths import rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=0, help="optimiser steps (default: the shipped recipe's)")
    ap.add_argument("--layers", type=int, default=1, help="Llama layers in the feature draft's trunk")
    ap.add_argument("--init-layer", type=int, default=0, help="target layer copied into every trunk layer")
    ap.add_argument("--w-feat", type=float, default=1.0, help="weight of the feature-regression loss")
    ap.add_argument("--variants", nargs="+", default=list(feature.VARIANTS), choices=list(feature.VARIANTS),
                    help="with_features: the EAGLE-1 recipe; features_zeroed: the ablation; two_step: also train "
                         "the second step on the draft's own output (EAGLE-3's training-time test)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=feature.OUT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = feature.run(args.variants, steps=args.steps, layers=args.layers, init_layer=args.init_layer,
                         w_feat=args.w_feat, log=print)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", rel(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
