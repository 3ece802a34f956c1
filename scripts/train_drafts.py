"""Train (or check) the model draft for SmolLM2-135M-Instruct — what ``make models`` runs.

    python scripts/train_drafts.py            # shipped draft present and valid: nothing to do
    python scripts/train_drafts.py --force    # retrain from scratch, compare with the shipped draft
    python scripts/train_drafts.py --force --install   # ... and replace the shipped draft (maintainers)

Recipe (:class:`Recipe`, the only place its defaults live): self-distillation. The target answers the
project's own training prompts (``data/prompts/train.jsonl``, disjoint from the eval mix) greedily and
at temperature 1; a draft of ``len(layers)`` Llama layers copied from the target, between the target's
frozen embedding and a frozen sub-head over the ``draft_vocab`` most frequent response tokens, is
trained to match the target's next-token law (top-k KD, :mod:`specdec_core.distill`). Deterministic
given the seed (on the same thread count); every stage caches under ``data/train_cache/`` and an
interrupted run resumes where it stopped. Hyperparameters were chosen on ``val_frac`` of the training
prompts, never on the eval mix.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import specdec_core as sd
from specdec_core import distill, shipped
from specdec_core.draft_model import DraftModel, load_draft, save_draft
from specdec_core.models import sha256_file
from specdec_core.prompts import encode

ROOT = Path(__file__).resolve().parent.parent
TRAIN_PROMPTS = ROOT / "data" / "prompts" / "train.jsonl"
CACHE = ROOT / "data" / "train_cache"
EOS = PAD = 2  # <|im_end|>


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    layers: tuple = (0, 1)  # target layers copied into the draft's trunk (their order in the trunk)
    draft_vocab: int = 8192  # most frequent response tokens the draft can propose (EOS always in)
    greedy_prompts: int = 700  # prompts the target answers greedily ...
    sample_prompts: int = 200  # ... and others it answers at temperature 1
    max_new_tokens: int = 128
    top_k_record: int = 20  # teacher law stored as its top-k (ids + float16 log-probs)
    gen_batch: int = 32
    val_frac: float = 0.05  # held-out slice of the training prompts: model selection and the FORCE report
    train: distill.TrainConfig = field(default_factory=lambda: distill.TrainConfig(
        steps=1800, lr=3e-3, warmup=50, batch_tokens=2048, seed=0, ckpt_every=100))

    def key(self) -> str:
        return f"{zlib.crc32(json.dumps(asdict(self), sort_keys=True).encode()):08x}"


def is_val(prompt_id: str, frac: float) -> bool:
    """Deterministic held-out split by a hash of the prompt id."""
    return zlib.crc32(prompt_id.encode()) % 10_000 < frac * 10_000


def teacher_records(pair, recipe: Recipe, progress=True) -> tuple[list[dict], list[dict], dict]:
    """Generate (or load) the teacher data; returns (train records, val records, info)."""
    prompts = sd.load_prompts(TRAIN_PROMPTS)
    target_sha = json.loads((shipped.REPO_ROOT / "data" / "models" / "smollm2-135m" / "manifest.sha256.json")
                            .read_text())["model.safetensors"]
    plan = distill.TeacherPlan(
        prompts_sha256=sha256_file(TRAIN_PROMPTS), target_sha256=target_sha,
        modes=(("greedy", 0.0, recipe.greedy_prompts), ("sample", 1.0, recipe.sample_prompts)),
        max_new_tokens=recipe.max_new_tokens, top_k_record=recipe.top_k_record, batch_size=recipe.gen_batch,
        seed=recipe.seed)
    t = time.perf_counter()
    folder = distill.generate_teacher_data(pair.target, [encode(pair, p) for p in prompts], [p.id for p in prompts],
                                           plan, CACHE, eos_id=EOS, pad_id=PAD, progress=progress)
    recs = distill.load_teacher_data(folder)
    train = [r for r in recs if not is_val(r["key"], recipe.val_frac)]
    val = [r for r in recs if is_val(r["key"], recipe.val_frac)]
    info = dict(teacher_folder=str(folder.relative_to(ROOT)), teacher_seconds=round(time.perf_counter() - t, 1),
                train_records=len(train), val_records=len(val),
                train_tokens=sum(r["response"].numel() for r in train), plan=asdict(plan))
    return train, val, info


def kd_step(slots):
    """The model draft's ``step_loss`` for :func:`distill.train`."""

    def step_loss(draft, recs):
        b = distill.collate(recs, slots, PAD)
        h = draft.hidden(b["input_ids"], attention_mask=b["attention_mask"], use_cache=False).last_hidden_state
        sel = b["valid"]  # the head only where the loss looks (response positions)
        return distill.kd_loss(draft.sub_logits(h[sel]), b["t_slot"][sel], b["t_logp"][sel])

    return step_loss


def sub_logits_fn(draft):
    def fn(b):
        return draft(input_ids=b["input_ids"], attention_mask=b["attention_mask"], full_vocab=False,
                     use_cache=False).logits

    return fn


def remapped_logits_fn(draft, slots):
    """Sub-logits of ``draft`` re-indexed to the draft vocabulary ``slots`` refers to (for comparing drafts)."""
    V = draft.config.vocab_size

    def fn(b):
        sub = draft(input_ids=b["input_ids"], attention_mask=b["attention_mask"], full_vocab=False,
                    use_cache=False).logits
        full = sub.new_full((*sub.shape[:-1], V), float("-inf"))
        full.index_copy_(-1, draft.vocab, sub)
        ids = (slots >= 0).nonzero().flatten()
        return full[..., ids]

    return fn


def run(recipe: Recipe, out: Path, progress=True) -> tuple[DraftModel, dict]:
    torch.manual_seed(recipe.seed)
    t0 = time.perf_counter()
    pair = sd.load_pair("smollm2-135m")
    pair.target.requires_grad_(False)
    train_recs, val_recs, info = teacher_records(pair, recipe, progress)
    vocab = distill.choose_draft_vocab(train_recs, recipe.draft_vocab, pair.target.config.vocab_size, always=(EOS,))
    slots = distill.slot_map(vocab, pair.target.config.vocab_size)
    info["vocab_coverage_train"] = round(distill.coverage(train_recs, vocab), 4)
    info["vocab_coverage_val"] = round(distill.coverage(val_recs, vocab), 4)
    draft = DraftModel.from_target(pair.target, list(recipe.layers), vocab)
    run_dir = CACHE / f"draft-{recipe.key()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    hist = distill.train(draft, kd_step(slots), train_recs, recipe.train, ckpt=run_dir / "ckpt.pt", progress=progress)
    # what ships is float16: measure the stored weights, not the float32 ones
    save_draft(draft, out, meta=dict(recipe=asdict(recipe)))
    draft = load_draft(out, pair.target)
    val = distill.agreement(sub_logits_fn(draft), val_recs, slots, PAD)
    info.update(train_seconds=round(hist["seconds"], 1), resumed_at_step=hist["resumed_at"],
                final_loss=round(sum(hist["losses"][-50:]) / len(hist["losses"][-50:]), 4),
                val_greedy_alpha=round(val["greedy_alpha"], 4), val_t1_alpha=round(val["t1_alpha"], 4),
                total_seconds=round(time.perf_counter() - t0, 1))
    save_draft(draft, out, meta=dict(recipe=asdict(recipe), training=info))
    shipped.write_sums(out)
    (run_dir / "losses.json").write_text(json.dumps(hist["losses"]))
    return draft, dict(info, val_records=val_recs, slots=slots, pair=pair)


def compare_with_shipped(new_dir: Path, ctx: dict) -> None:
    """Print how close a retrained draft is to the shipped one, on the held-out training prompts."""
    if not shipped.is_present():
        print("no shipped draft to compare with")
        return
    pair, val, slots = ctx["pair"], ctx["val_records"], ctx["slots"]
    old = shipped.load_model_draft(pair.target)
    new = load_draft(new_dir, pair.target)
    same_files = shipped.read_sums(new_dir)["model.safetensors"] == shipped.read_sums(shipped.MODEL_DRAFT)["model.safetensors"]
    a_new = distill.agreement(remapped_logits_fn(new, slots), val, slots, PAD)
    a_old = distill.agreement(remapped_logits_fn(old, slots), val, slots, PAD)
    # agreement of the two drafts' greedy proposals, teacher-forced on the target's greedy responses
    agree = n = 0
    with torch.no_grad():
        for r in [r for r in val if r["mode"] == "greedy"]:
            ids = torch.cat([r["prompt"], r["response"][:-1]]).long().view(1, -1)
            S = len(r["prompt"])
            pa = new(input_ids=ids).logits[0, S - 1:].argmax(-1)
            pb = old(input_ids=ids).logits[0, S - 1:].argmax(-1)
            agree += int((pa == pb).sum())
            n += pa.numel()
    vocab_overlap = len(set(new.vocab.tolist()) & set(old.vocab.tolist())) / old.vocab.numel()
    print("\n== retrained vs shipped draft (held-out training prompts, teacher-forced) ==")
    print(f"  weights bitwise identical      : {same_files}")
    print(f"  greedy alpha  new / shipped    : {a_new['greedy_alpha']:.4f} / {a_old['greedy_alpha']:.4f}")
    print(f"  T=1 alpha     new / shipped    : {a_new['t1_alpha']:.4f} / {a_old['t1_alpha']:.4f}")
    print(f"  greedy proposals that agree    : {agree / max(n, 1):.4f} of {n} positions")
    print(f"  draft vocabulary overlap       : {vocab_overlap:.4f}")


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
            print(f"shipped draft {target_dir.relative_to(ROOT)} is valid "
                  f"(model.safetensors sha256 {sums['model.safetensors'][:16]}…); nothing to train "
                  "(make models FORCE=1 retrains)")
            return 0
        print(f"no shipped draft in {target_dir.relative_to(ROOT)}: training one")
    recipe = Recipe()
    out = CACHE / f"draft-{recipe.key()}" / "final"
    t = time.perf_counter()
    draft, ctx = run(recipe, out)
    print(f"\ntrained in {time.perf_counter() - t:.0f} s (teacher data {ctx['teacher_seconds']} s, "
          f"training {ctx['train_seconds']} s); held-out greedy alpha {ctx['val_greedy_alpha']}, "
          f"T=1 alpha {ctx['val_t1_alpha']}; weights in {out.relative_to(ROOT)}")
    if args.force:
        compare_with_shipped(out, ctx)
    if args.install or not shipped.is_present(target_dir):
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in (*shipped.REQUIRED, shipped.SUMS):
            shutil.copy2(out / name, target_dir / name)
        print(f"installed the draft in {target_dir.relative_to(ROOT)} "
              "(run scripts/eval_draft.py --write-card to refresh its model card)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
