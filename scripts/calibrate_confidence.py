"""Choose the confidence threshold θ of the shipped draft on held-out training prompts and store it with the draft.

    python scripts/calibrate_confidence.py               # 6 prompts, 64 tokens (about 10 min on 2 cores, alone)
    python scripts/calibrate_confidence.py --dry-run     # print the choice, write nothing

One greedy, interleaved run (:func:`specdec_core.study.calibrate.tune`): autoregressive decoding, the model
draft at each fixed K, and each θ with the model draft, the hybrid and the chooser (up to ``--k-max`` tokens a
step); the highest median speedup per family wins. Writes ``confidence.json`` into the draft's folder and adds
it to ``SHA256SUMS``; ``generate(..., confidence="auto")`` then reads it. The evaluation mix is not used.
Time it alone: the choice is a speed comparison.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time

import torch

import specdec_core as sd
from specdec_core.models import calibration
from specdec_core.study import calibrate
from specdec_core.models import shipped
from specdec_core.paths import rel
from specdec_core.data.prompts import sweep_prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=6, help="held-out training prompts")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats")
    ap.add_argument("--fixed-ks", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--thetas", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.9])
    ap.add_argument("--k-max", type=int, default=6, help="the most a confidence-stopped step drafts")
    ap.add_argument("--dry-run", action="store_true", help="print the choice; write nothing")
    args = ap.parse_args()
    if not all(0 < t <= 1 for t in args.thetas):
        raise SystemExit(f"--thetas must lie in (0, 1], got {args.thetas}")
    pair = sd.load_pair("smollm2-135m")
    if "model" not in pair.drafters:
        raise SystemExit(f"no shipped model draft in {shipped.MODEL_DRAFT}: `make models` trains it")
    t0 = time.perf_counter()
    prompts = sweep_prompts(pair, args.prompts)
    rec, table, chosen = calibrate.calibration(
        pair, prompts, args.fixed_ks, args.thetas, args.k_max, args.max_new_tokens, args.repeats,
        machine=f"{platform.machine()}, {torch.get_num_threads()} torch threads")
    print(table[["median", "q25", "q75", "alpha", "drafted_per_step"]].round(3).to_string())
    print("chosen:", chosen, f"c = {rec['cost']}")
    if not args.dry_run:
        path = calibration.save(shipped.MODEL_DRAFT, rec)
        shipped.write_sums(shipped.MODEL_DRAFT, shipped.REQUIRED + (calibration.CALIBRATION,))
        print("wrote", rel(path), "and SHA256SUMS")
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
