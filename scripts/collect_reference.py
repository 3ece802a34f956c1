"""Copy the small headline outputs of a full book run into data/reference/book/ and write the README's results
block from them (both to be committed).

    make reproduce && python scripts/collect_reference.py [--build build/book]

The reference is **one run**: every chapter ran ok (or was left out for its pair) in the same run of one commit,
with no uncommitted change, on one machine (``timings.csv`` records commit, machine and date per chapter), and
the copy replaces the whole reference. ``--partial`` accepts a run of some chapters (``run_book.py --only``): their
rows and tables replace the reference's and the others are kept, which the results block then reports as runs of
several commits. What is copied is listed below: the per-notebook timings, the tables behind each chapter's claims
and the headline figures. Everything else stays in the (ignored) build folder. The README's block between
``<!-- RESULTS:START -->`` and ``<!-- RESULTS:END -->`` is rewritten from the copied tables
(:func:`specdec_core.tools.headline.results_block`): it is never edited by hand.
"""
from __future__ import annotations

import argparse
import shutil
import sys

from run_book import notebooks, read_timings, write_timings  # scripts/ is on the path of a script run from it
from specdec_core.paths import REPO_ROOT as ROOT
from specdec_core.tools import headline

KEEP = [
    "timings.csv",
    "01_bottleneck/verdict.csv", "01_bottleneck/ceilings.csv", "01_bottleneck/knees.csv", "01_bottleneck/roofline.png",
    "01_bottleneck/blas_paths.csv", "01_bottleneck/blas_paths.png",
    "02_exactness/summary.csv", "02_exactness/mutant_power.csv", "02_exactness/tv_bound.csv",
    "02_exactness/family_power.csv",
    "02_exactness/audit_toy.csv", "02_exactness/audit_real.csv", "02_exactness/audit_calibration.csv",
    "02_exactness/audit_toy.png", "02_exactness/hybrid_vs_ngram_samples.csv",
    "03_linear/alpha_by_task.csv", "03_linear/pass_costs.csv", "03_linear/speedup_vs_k.csv",
    "03_linear/draft_pass_parts.csv",
    "04_tree/speed_ratios.csv", "04_tree/accept_vs_shape.csv", "04_tree/predicted_throughput.csv",
    "05_parallel/draft_cost.csv", "05_parallel/speed.csv", "05_parallel/parallel_vs_linear_by_task.csv",
    "05_parallel/acceptance_by_position.csv", "05_parallel/k_choice.csv",
    "06_speedup/summary.csv", "06_speedup/overall.csv", "06_speedup/theory_check.csv", "06_speedup/theory_calls.csv",
    "06_speedup/speedup_vs_k.csv", "06_speedup/latency.csv", "06_speedup/speedup_by_task.png", "06_speedup/speedup_by_task_t1.png",
    "06_speedup/theory_calls.png", "06_speedup/beside_the_field.csv",
    "08_adaptive/tuning.csv", "08_adaptive/eval_overall.csv", "08_adaptive/eval_by_task.csv", "08_adaptive/tuning.png",
    "08_adaptive/eval_by_task.png",
    "09_serving/batch_runs.csv", "09_serving/speedup_vs_batch.csv", "09_serving/pass_costs.csv",
    "09_serving/streaming_latency.csv", "09_serving/trend_vs_batch.csv", "09_serving/throughput_vs_batch.png", "09_serving/speedup_vs_batch.png",
    "09_serving/arrivals.png", "09_serving/step_costs.csv", "09_serving/load_summary.csv", "09_serving/goodput_verdicts.csv",
    "09_serving/load_summary_by_class.csv", "09_serving/k_by_batch_size.csv", "09_serving/load_sweep.png",
    "09_serving/engine_tuning.csv", "09_serving/engine_constants.csv",
    "10_curves/curve.csv", "10_curves/real_drafters.csv", "10_curves/step_budget.csv", "10_curves/draft_phase.csv",
    "10_curves/best_k.csv", "10_curves/breakeven.csv", "10_curves/alpha_needed.csv", "10_curves/gpu_predicted.csv",
    "10_curves/speedup_vs_alpha.png", "10_curves/gpu_predicted.png",
    "11_where_it_pays/speedup.csv", "11_where_it_pays/speedup_by_task.csv", "11_where_it_pays/training_sweep.csv",
    "11_where_it_pays/rule_training.csv", "11_where_it_pays/rule.csv", "11_where_it_pays/rule_eval.csv",
    "11_where_it_pays/greedy_identity.csv",
    "11_where_it_pays/draft_share.csv", "11_where_it_pays/traffic_mix.csv", "11_where_it_pays/speedup_by_task.png",
    "11_where_it_pays/traffic_mix.png", "11_where_it_pays/draft_lengths.png", "11_where_it_pays/beside_the_field.csv",
]
NOTEBOOKS = "notebooks"  # the run's executed chapters, with their outputs: `make book` renders them, `make lab` opens them
NOTEBOOKS_MAX_MB = 15.0  # what the repository holds of them at most


def copy_notebooks(build, dest, partial: bool = False, max_mb: float = NOTEBOOKS_MAX_MB) -> list:
    """The run's executed chapters (``<build>/notebooks/NN_*.ipynb``, not papermill's ``.input`` copies) copied to
    ``<dest>/notebooks/``: they replace what was there (``partial``: they replace their own chapters and the others
    are kept); refused, naming the size, when they exceed ``max_mb``."""
    found = sorted(p for p in (build / NOTEBOOKS).glob("[0-9][0-9]_*.ipynb") if not p.name.endswith(".input.ipynb"))
    size = sum(p.stat().st_size for p in found) / 1e6
    if size > max_mb:
        raise SystemExit(f"{build / NOTEBOOKS}: the executed chapters take {size:.1f} MB, more than the "
                         f"{max_mb:g} MB the reference keeps")
    out = dest / NOTEBOOKS
    out.mkdir(parents=True, exist_ok=True)
    if not partial:
        for old in out.glob("*.ipynb"):
            old.unlink()
    for nb in found:
        shutil.copy2(nb, out / nb.name)
    print(f"copied {len(found)} executed chapters ({size:.1f} MB) to {out}")
    return found


def merge_timings(src, dest) -> None:
    """A run of some chapters (``run_book.py --only``) updates their rows of the reference timings and keeps the
    others' (say which run each row comes from where the results are described: data/reference/README.md)."""
    old, new = read_timings(dest), read_timings(src)
    write_timings(dest, old | new)  # the new run's rows win
    if kept := sorted(set(old) - set(new)):
        print(f"timings.csv: rows of {', '.join(kept)} kept from the earlier reference run")


def one_run(timings: dict) -> list[str]:
    """Why a run's timings are not one whole run of one commit (empty when they are)."""
    problems = []
    missing = sorted({p.stem for p in notebooks(None)} - set(timings))
    if missing:
        problems.append(f"chapters not in this run: {', '.join(missing)}")
    bad = sorted(stem for stem, t in timings.items() if t.status not in ("ok", "skipped"))
    if bad:
        problems.append(f"chapters that did not finish: {', '.join(bad)}")
    commits = {t.commit for t in timings.values()}
    if len(commits) != 1 or "" in commits:
        problems.append(f"rows from {len(commits)} commit(s) {sorted(commits)} (a run records one)")
    elif next(iter(commits)).endswith("+changes"):
        problems.append(f"the run was made with uncommitted changes ({next(iter(commits))}): commit, then rerun")
    if len({t.machine for t in timings.values()}) != 1:
        problems.append("rows from several machines")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build/book")
    ap.add_argument("--dest", default="data/reference/book")
    ap.add_argument("--partial", action="store_true",
                    help="accept a run of some chapters, or of another commit: merge it into the reference")
    ap.add_argument("--readme", default="README.md", help="the file whose RESULTS block is rewritten ('' : none)")
    args = ap.parse_args()
    build, dest = ROOT / args.build, ROOT / args.dest
    timings = read_timings(build / "timings.csv")
    problems = one_run(timings)
    if problems and not args.partial:
        print(f"{build}: not one whole run of one commit, so not a reference (--partial merges it):\n  "
              + "\n  ".join(problems), file=sys.stderr)
        return 1
    missing = []
    for rel in KEEP:
        src = build / rel
        if not src.exists():
            missing.append(rel)
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel == "timings.csv" and (dest / rel).exists() and args.partial:
            merge_timings(src, dest / rel)
        else:
            shutil.copy2(src, dest / rel)
    print(f"copied {len(KEEP) - len(missing)} files to {dest}")
    copy_notebooks(build, dest, partial=args.partial)
    if missing:
        print("missing (not produced by this run):", ", ".join(missing), file=sys.stderr)
    if args.readme:
        readme = ROOT / args.readme
        headline.replace_block(readme, headline.results_block(dest, where=str(dest.relative_to(ROOT))
                                                               if dest.is_relative_to(ROOT) else str(dest)))
        print(f"wrote the results block of {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
