"""The draft's learning curve: α and the predicted speedup at several data sizes and trunk depths.

    python scripts/draft_curve.py                              # 3 sizes × 1 and 2 layers (~50 min, 2 cores, alone)
    python scripts/draft_curve.py --only-cached                # measure the points an interrupted run trained
    python scripts/draft_curve.py --layers 1 2 4 --shares 0.25 0.5 1
    python scripts/draft_curve.py --smoke                      # every stage at a tiny size (a minute)
    python scripts/draft_curve.py --shares 1 --steps 5400      # the largest set trained three times as long
    python scripts/draft_curve.py --min-epochs 2               # at least two passes over every point's data

Teacher data (``--teacher``): ``wide``, the 1 M-token set of ``scripts/make_teacher_data.py`` (run it first: about
2 h; this script loads it from ``data/train_cache/``), or ``pilot``, the first curve's: the target's answers to the
shipped draft's training prompts and to ``--more`` prompts of ``data/prompts/train_more.jsonl`` (generated here when
missing, about 25 min). Each point is the first draft's recipe (:data:`specdec_core.train.drafts.FIRST`) with its trunk cut to the first
``L`` target layers, trained on a nested share of the union (:mod:`specdec_core.train.curve`); each training is
cached and resumes after an interruption. Then, alone: the draft pass's cost c per depth and the target's verify
ratios (:func:`specdec_core.study.bench.pass_costs`), so that each point's α predicts a speedup at its best K
(Theorem 3.8 with the measured verify cost). The point a rule fixed in advance would ship, the highest predicted
speedup from *held-out training* α, is recorded; the eval-mix figures are reported beside it, never used to choose.
Writes ``data/reference/draft_curve.json``; chapter 3 draws it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zlib
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specdec_core.models import shipped
from specdec_core.models.hub import load_pair
from specdec_core.study import bench, theory
from specdec_core.data.prompts import encode, load_prompts
from specdec_core.data.prompts import DEFAULT_PATH as EVAL_PATH
from specdec_core.train import curve, distill, drafts, wide
from specdec_core.train.teacher import teacher_data
from specdec_core.train.teacher import CACHE
from specdec_core.train.prompts import MORE_PATH
from specdec_core.train.prompts import TRAIN_PATH as TRAIN_PROMPTS

KS = tuple(range(1, 9))


def predict(alpha: float, cost: dict) -> tuple[int, float]:
    """Best K in 1..8 and its predicted speedup for greedy α, with c and the verify ratios measured."""
    vr = cost["verify_ratio"]
    k = theory.best_k(alpha, cost["c"], verify_ratio=lambda k: vr[k], k_max=max(KS))
    return k, float(theory.speedup(alpha, k, cost["c"], vr[k]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shares", type=float, nargs="+", default=[0.25, 1.0, 0.5], help="nested data shares")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 1], help="trunk depths (first L target layers)")
    ap.add_argument("--teacher", choices=["wide", "pilot"], default="wide",
                    help="wide: the 1 M-token set of scripts/make_teacher_data.py (both stages); pilot: the shipped "
                         "draft's teacher data plus --more answers to train_more.jsonl (the first curve)")
    ap.add_argument("--more", type=int, default=900, help="pilot: prompts of train_more.jsonl the target answers")
    ap.add_argument("--sample-frac", type=float, default=0.2, help="share of --more answered at temperature 1")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimiser steps of every point (default: the recipe's); a point's cache folder keys on it")
    ap.add_argument("--min-epochs", type=float, default=0,
                    help="train each point for at least this many passes over its data (more steps than the "
                         "recipe's where its data needs them: a fixed step count sees only part of a large set)")
    ap.add_argument("--eval-tokens", type=int, default=64)
    ap.add_argument("--cost-repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="default data/reference/draft_curve.json")
    ap.add_argument("--only-cached", action="store_true",
                    help="skip points not trained yet (measure what an interrupted run left; rerun without it to finish)")
    ap.add_argument("--smoke", action="store_true", help="every stage at a tiny size: checks the plumbing")
    args = ap.parse_args()
    if not MORE_PATH.exists():
        raise SystemExit(f"{MORE_PATH} is missing: python scripts/make_train_prompts.py --more")
    if any(not 1 <= L <= 30 for L in args.layers):
        raise SystemExit(f"--layers are trunk depths in 1..30 (the target's layers), got {args.layers}")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    recipe = curve.SMOKE_RECIPE if args.smoke else drafts.FIRST  # the curve's base: only data and depth change
    if args.steps is not None:
        if args.steps < 1:
            raise SystemExit(f"--steps is a positive number of optimiser steps, got {args.steps}")
        recipe = replace(recipe, train=replace(recipe.train, steps=args.steps))
    if args.teacher == "wide" and not args.smoke:
        recipe = replace(recipe, teacher="wide")  # the report's recipe names the data its points trained on
    if args.smoke:
        args.more, args.eval_tokens, args.cost_repeats = 6, 6, 2
    out = args.out or Path("build/draft_curve_smoke.json" if args.smoke else "data/reference/draft_curve.json")
    pair = load_pair("smollm2-135m")
    pair.target.requires_grad_(False)
    if args.teacher == "wide" and not args.smoke:
        union, heldout, info = teacher_data(pair, recipe)  # the recipe names the wide set
        info1, info2 = info["stages"]["writing"], info["stages"]["answers"]
        files = wide.PROMPT_FILES
        teacher = dict(set="wide", writing_tokens=info1["train_tokens"], answer_tokens=info2["train_tokens"],
                       plans=dict(writing=info1["plan"], answers=info2["plan"]))
    else:
        if args.teacher == "wide":
            print("--smoke trains on the pilot set's tiny plan (the wide set is hours of generation)")
        sets = curve.teacher_sets(pair, recipe, args.more, args.sample_frac)
        (train1, val1, info1), (train2, val2, info2) = sets["first"], sets["more"]
        union, heldout, files = train1 + train2, val1 + val2, [TRAIN_PROMPTS, MORE_PATH]
        teacher = dict(set="pilot", first_set_tokens=info1["train_tokens"], more_tokens=info2["train_tokens"],
                       more_prompts=args.more, more_sample_prompts=info2["plan"]["modes"][1][2])
    tag = f"{zlib.crc32((info1['teacher_folder'] + info2['teacher_folder']).encode()):08x}"
    task_of = {p.id: p.task for f in files for p in load_prompts(f)}
    for r in heldout:
        r["task"] = task_of[r["key"]]
    target_sha = info1["plan"]["target_sha256"][:12]
    ev = curve.eval_records(pair, args.eval_tokens, recipe.gen_batch, per_task=1 if args.smoke else None,
                            cache=None if args.smoke else CACHE / f"eval-records-{args.eval_tokens}-{target_sha}.pt")
    points, depth_draft = [], {}

    def share_plan(share: float):
        """A share's data, its response tokens, steps per pass over it and recipe (the recipe's steps, or
        --min-epochs passes)."""
        data = curve.nested_subset(union, share)
        n_tok = sum(r["response"].numel() for r in data)
        per_epoch = distill.steps_per_epoch(data, recipe.train)
        steps = max(recipe.train.steps, math.ceil(args.min_epochs * per_epoch))
        return data, n_tok, per_epoch, replace(recipe, train=replace(recipe.train, steps=steps))

    shares = {s: share_plan(s) for s in args.shares}
    folder = lambda L, s: curve.point_dir(tag, s, tuple(range(L)), shares[s][3])
    grid = [(L, s) for L in args.layers for s in args.shares]  # in the order given: extremes first saves time
    if args.only_cached:
        grid = [(L, s) for L, s in grid if (folder(L, s) / "final" / "model.safetensors").exists()]
    for i, (L, share) in enumerate(grid):
        data, n_tok, per_epoch, point_recipe = shares[share]
        steps = point_recipe.train.steps
        print(f"[{i + 1}/{len(grid)}] {L} layer(s), share {share:g}: {len(data)} records, {n_tok} response tokens; "
              f"{steps} steps, {steps / per_epoch:.2f} passes over the data", flush=True)
        draft, log = curve.train_point(pair, data, tuple(range(L)), point_recipe, folder(L, share))
        depth_draft[L] = draft
        points.append(dict(layers=L, share=share, tokens=n_tok, records=len(data), steps=steps,
                           epochs=round(steps / per_epoch, 2), train_seconds=log["seconds"],
                           cached=log["cached"], heldout=curve.alpha_by_task(draft, heldout),
                           eval=curve.alpha_by_task(draft, ev)))
    old = shipped.load_model_draft(pair.target)
    shipped_point = dict(layers=len(old.trunk.layers), tokens=json.loads(
        (shipped.MODEL_DRAFT / "config.json").read_text())["training"]["train_tokens"],
                         heldout=curve.alpha_by_task(old, heldout), eval=curve.alpha_by_task(old, ev))
    # the pass costs, alone: c per depth (weights do not change a pass's time) and the verify ratios
    ids = bench.median_length([(None, encode(pair, p)) for p in load_prompts(EVAL_PATH)])
    costs = {}
    for L, draft in sorted(depth_draft.items()):
        pc = bench.pass_costs(pair.target, draft, ids, ks=KS, repeats=args.cost_repeats, decoded=args.eval_tokens // 2)
        costs[L] = dict(c=round(pc["c"], 4), verify_ratio={k: round(v, 4) for k, v in pc["verify_ratio"].items()},
                        ms=pc["ms"])
        print(f"{L} layer(s): c = {pc['c']:.3f}", flush=True)
    for p in points + [shipped_point]:
        cost = costs.get(p["layers"])
        if cost is None:
            continue
        for where in ("heldout", "eval"):
            k, s = predict(p[where]["all"]["greedy_alpha"], cost)
            p[f"{where}_best_k"], p[f"{where}_predicted_speedup"] = k, round(s, 4)
    rule = max(points, key=lambda p: p["heldout_predicted_speedup"])
    report = dict(script="scripts/draft_curve.py", threads=torch.get_num_threads(), recipe=asdict(recipe),
                  teacher=teacher,
                  eval_tokens=args.eval_tokens, costs=costs, points=points, shipped=shipped_point,
                  ship_rule="highest predicted speedup at its best K from greedy α on held-out training prompts",
                  ship_rule_choice=dict(layers=rule["layers"], share=rule["share"], tokens=rule["tokens"]),
                  total_seconds=round(time.perf_counter() - t0, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\n{'layers':>6} {'tokens':>8}  held-out α  eval α (greedy, T=1)  predicted (eval)")
    for p in points + [dict(shipped_point, share="shipped")]:
        print(f"{p['layers']:>6} {p['tokens']:>8}  {p['heldout']['all']['greedy_alpha']:.3f}      "
              f"{p['eval']['all']['greedy_alpha']:.3f} {p['eval']['all']['t1_alpha']:.3f}"
              f"            {p.get('eval_predicted_speedup', float('nan')):.3f}× at K = {p.get('eval_best_k')}")
    print(f"ship rule picks: {report['ship_rule_choice']}; wrote {out} in {report['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
