"""Copy the small headline outputs of a full book run into data/reference/book/ (to be committed).

    python scripts/collect_reference.py [--build build/book]

What is copied is listed below: the per-notebook timings, the tables behind each chapter's claims and the
headline figure the README shows. Everything else stays in the (ignored) build folder.
"""
from __future__ import annotations

import argparse
import shutil
import sys

from run_book import read_timings, write_timings  # scripts/ is on the path of a script run from it
from specdec_core.paths import REPO_ROOT as ROOT

KEEP = [
    "timings.csv",
    "01_bottleneck/ceilings.csv", "01_bottleneck/knees.csv", "01_bottleneck/roofline.png",
    "01_bottleneck/blas_paths.csv", "01_bottleneck/blas_paths.png",
    "02_exactness/summary.csv", "02_exactness/mutant_power.csv", "02_exactness/tv_bound.csv",
    "02_exactness/audit_toy.csv", "02_exactness/audit_real.csv", "02_exactness/audit_calibration.csv",
    "02_exactness/audit_toy.png",
    "03_linear/alpha_by_task.csv", "03_linear/pass_costs.csv", "03_linear/speedup_vs_k.csv",
    "04_tree/speed_ratios.csv", "04_tree/accept_vs_shape.csv", "04_tree/predicted_throughput.csv",
    "05_parallel/draft_cost.csv", "05_parallel/speed.csv", "05_parallel/parallel_vs_linear_by_task.csv",
    "05_parallel/acceptance_by_position.csv",
    "06_speedup/summary.csv", "06_speedup/overall.csv", "06_speedup/theory_check.csv", "06_speedup/theory_calls.csv",
    "06_speedup/speedup_vs_k.csv", "06_speedup/latency.csv", "06_speedup/speedup_by_task.png",
    "06_speedup/theory_calls.png",
    "08_adaptive/tuning.csv", "08_adaptive/eval_overall.csv", "08_adaptive/eval_by_task.csv", "08_adaptive/tuning.png",
    "08_adaptive/eval_by_task.png",
    "09_serving/batch_runs.csv", "09_serving/speedup_vs_batch.csv", "09_serving/pass_costs.csv",
    "09_serving/streaming_latency.csv", "09_serving/throughput_vs_batch.png", "09_serving/speedup_vs_batch.png",
    "09_serving/arrivals.png",
    "10_curves/curve.csv", "10_curves/real_drafters.csv", "10_curves/step_budget.csv", "10_curves/draft_phase.csv",
    "10_curves/best_k.csv", "10_curves/breakeven.csv", "10_curves/alpha_needed.csv", "10_curves/gpu_predicted.csv",
    "10_curves/speedup_vs_alpha.png", "10_curves/gpu_predicted.png",
]


def merge_timings(src, dest) -> None:
    """A run of some chapters (``run_book.py --only``) updates their rows of the reference timings and keeps the
    others' (say which run each row comes from where the results are described: data/reference/README.md)."""
    old, new = read_timings(dest), read_timings(src)
    write_timings(dest, old | new)  # the new run's rows win
    if kept := sorted(set(old) - set(new)):
        print(f"timings.csv: rows of {', '.join(kept)} kept from the earlier reference run")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build/book")
    ap.add_argument("--dest", default="data/reference/book")
    args = ap.parse_args()
    build, dest = ROOT / args.build, ROOT / args.dest
    missing = []
    for rel in KEEP:
        src = build / rel
        if not src.exists():
            missing.append(rel)
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel == "timings.csv" and (dest / rel).exists():
            merge_timings(src, dest / rel)
        else:
            shutil.copy2(src, dest / rel)
    print(f"copied {len(KEEP) - len(missing)} files to {dest}")
    if missing:
        print("missing (not produced by this run):", ", ".join(missing), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
