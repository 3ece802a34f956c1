"""A pilot for the data-scaling study: does broader teacher data buy acceptance where the shipped draft is weakest?

    python scripts/pilot_more_data.py                    # ~50 min on 2 cores; resumes after an interruption
    python scripts/pilot_more_data.py --more 500 --out data/reference/draft_pilot_more.json

The shipped draft was distilled from the target's answers to 900 prompts of ``data/prompts/train.jsonl``
(:class:`specdec_core.train.drafts.Recipe`). This script regenerates that teacher data (cached under
``data/train_cache/``), adds the target's answers to ``--more`` prompts of ``data/prompts/train_more.jsonl``
(the eval mix's task proportions; translation *into* English and numbered retrieval passages, which the first
set lacks; no 8-word run of an eval prompt), trains a draft with the same recipe (architecture, vocabulary
size, optimiser, steps, seed) on both, and measures both drafts on the evaluation mix, teacher-forced:

- greedy α: the draft's argmax equals the target's on the target's own greedy answer (exactly the greedy
  per-token acceptance of speculative decoding), response positions 2 onwards, per task;
- T = 1 α: mean Σ min(p, q) over the target's temperature-1 answers (p truncated to its top-20: a lower bound).

Nothing is chosen on the eval mix: the recipe is the shipped one, only the data grows. The new draft is not
installed; its weights stay in the cache. Run it alone (it is long, and other timings would suffer).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from specdec_core.models import shipped
from specdec_core.models.draft import DraftModel, load_draft, save_draft
from specdec_core.models.hub import load_pair
from specdec_core.data.prompts import load_prompts
from specdec_core.train import curve, distill, drafts
from specdec_core.train.teacher import CACHE, EOS
from specdec_core.train.prompts import MORE_PATH
from specdec_core.train.prompts import TRAIN_PATH as TRAIN_PROMPTS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--more", type=int, default=500, help="prompts of train_more.jsonl the target answers")
    ap.add_argument("--sample-frac", type=float, default=0.2, help="share of --more answered at temperature 1")
    ap.add_argument("--eval-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None,
                    help="default: data/reference/draft_pilot_more.json (--smoke: build/pilot_smoke.json)")
    ap.add_argument("--smoke", action="store_true", help="every stage at a tiny size (a minute): checks the plumbing")
    args = ap.parse_args()
    if not MORE_PATH.exists():
        raise SystemExit(f"{MORE_PATH} is missing: python scripts/make_train_prompts.py --more")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    recipe = curve.SMOKE_RECIPE if args.smoke else drafts.FIRST
    if args.smoke:
        args.more, args.eval_tokens = 6, 6
    args.out = args.out or Path("build/pilot_smoke.json" if args.smoke else "data/reference/draft_pilot_more.json")
    pair = load_pair("smollm2-135m")
    pair.target.requires_grad_(False)
    # 1. the first recipe's teacher data, then the target's answers to the new prompts
    sets = curve.teacher_sets(pair, recipe, args.more, args.sample_frac)
    (train1, val1, info1), (train2, val2, info2) = sets["first"], sets["more"]
    n_sample = info2["plan"]["modes"][1][2]
    train = train1 + train2
    tokens = lambda rs: sum(r["response"].numel() for r in rs)
    print(f"teacher data: {tokens(train1)} + {tokens(train2)} response tokens "
          f"({info2['teacher_seconds']:.0f} s for the new prompts)")
    # 2. the same recipe on both sets (vocabulary chosen on the union, as the recipe chooses it on its data)
    vocab = distill.choose_draft_vocab(train, recipe.draft_vocab, pair.target.config.vocab_size, always=(EOS,))
    slots = distill.slot_map(vocab, pair.target.config.vocab_size)
    draft = DraftModel.from_target(pair.target, list(recipe.layers), vocab)
    run_dir = CACHE / f"pilot-more-{Path(info2['teacher_folder']).name}-{recipe.key()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    hist = distill.train(draft, drafts.kd_step(slots), train, recipe.train, ckpt=run_dir / "ckpt.pt")
    save_draft(draft, run_dir / "final", meta=dict(recipe=asdict(recipe), extra_prompts=str(MORE_PATH.name),
                                                   extra_plan=info2["plan"]))
    new = load_draft(run_dir / "final", pair.target)
    old = shipped.load_model_draft(pair.target)
    # 3. both drafts on the held-out training prompts (where a recipe may be chosen) and on the eval mix
    val = {"held-out training prompts (first set)": val1,
           "held-out training prompts (more)": val2}
    task_of = {p.id: p.task for p in load_prompts(TRAIN_PROMPTS) + load_prompts(MORE_PATH)}
    for recs in val.values():
        for r in recs:
            r["task"] = task_of[r["key"]]
    ev = curve.eval_records(pair, args.eval_tokens, recipe.gen_batch, per_task=1 if args.smoke else None)
    val["eval mix"] = ev
    report = dict(
        script="scripts/pilot_more_data.py", threads=torch.get_num_threads(),
        data=dict(first_set_tokens=tokens(train1), more_tokens=tokens(train2), more_prompts=args.more,
                  more_sample_prompts=n_sample, more_teacher_seconds=info2["teacher_seconds"]),
        recipe=asdict(recipe), train_seconds=round(hist["seconds"], 1),
        vocab_coverage_eval=round(distill.coverage([r for r in ev if r["mode"] == "greedy"], vocab), 4),
        shipped={k: curve.alpha_by_task(old, v) for k, v in val.items()},
        more_data={k: curve.alpha_by_task(new, v) for k, v in val.items()},
        total_seconds=round(time.perf_counter() - t0, 1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    ev_old, ev_new = report["shipped"]["eval mix"], report["more_data"]["eval mix"]
    print(f"\n{'task':16s} greedy α shipped → more data   T=1 α shipped → more data")
    for task in ev_old:
        print(f"{task:16s} {ev_old[task]['greedy_alpha']:.3f} → {ev_new[task]['greedy_alpha']:.3f}"
              f"              {ev_old[task]['t1_alpha']:.3f} → {ev_new[task]['t1_alpha']:.3f}")
    print(f"wrote {args.out} in {report['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
