"""The model draft's recipe for SmolLM2-135M-Instruct: teacher data, training, checks (its command line:
``scripts/train_drafts.py``, what ``make models`` runs).

Recipe (:class:`Recipe`, the only place its defaults live): self-distillation. The target answers the
project's own training prompts (disjoint from the eval mix) greedily and at temperature 1; a draft of
``len(layers)`` Llama layers copied from the target, between the target's frozen embedding and a frozen
sub-head over the ``draft_vocab`` most frequent response tokens, is trained to match the target's next-token
law (top-k KD, :mod:`specdec_core.train.distill`). The shipped draft trains on the wide set
(``teacher="wide"``: 1.17 M training response tokens over every task type, :mod:`specdec_core.train.wide`)
with two layers for two passes: the point of the learning curve (``scripts/draft_curve.py``,
``data/reference/draft_curve.json``) that the rule fixed before the eval mix was read chose. :data:`FIRST` is
the first draft's recipe (``data/prompts/train.jsonl`` only, 1800 steps): the base of the learning curve and of
the experiments that compare with it.
Deterministic given the seed (on the same thread count); every stage caches under ``data/train_cache/``
and an interrupted run resumes where it stopped. Hyperparameters were chosen on ``val_frac`` of the
training prompts, never on the eval mix. The block draft (:mod:`specdec_core.train.block`) and the
feature-draft experiment (:mod:`specdec_core.train.feature`) train on the same teacher records.
"""
from __future__ import annotations

import json
import shutil
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..models.calibration import CALIBRATION
from ..data.prompts import VAL_FRAC
from ..models import shipped
from ..models.draft import DraftModel, load_draft, save_draft
from ..models.hub import load_pair
from . import distill
from .teacher import CACHE, EOS, PAD, teacher_data


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
    val_frac: float = VAL_FRAC  # held-out slice of the training prompts: model selection and the FORCE report
    # "first": the target's answers to train.jsonl (the counts above); "wide": the 1 M-token set of
    # scripts/make_teacher_data.py (every training prompt file and the passages' writing requests, :mod:`.wide`)
    teacher: str = "wide"
    # 3006 steps of 2048 padded tokens: two passes over the wide set (distill.steps_per_epoch), as its curve point
    train: distill.TrainConfig = field(default_factory=lambda: distill.TrainConfig(
        steps=3006, lr=3e-3, warmup=50, batch_tokens=2048, seed=0, ckpt_every=100))

    def key(self) -> str:
        return f"{zlib.crc32(json.dumps(asdict(self), sort_keys=True).encode()):08x}"

    def out_dir(self) -> Path:
        """Where :func:`run` trains (resumable) and leaves the result (``final/``)."""
        return CACHE / f"draft-{self.key()}"


# the first shipped draft's recipe (95 k response tokens of train.jsonl, 1800 steps): the learning curve's base
# (its points change only the data, steps and layers) and the feature and block experiments' data
FIRST = replace(Recipe(), teacher="first", train=replace(Recipe().train, steps=1800))


def mean_tail(losses: list[float], n: int) -> float:
    """The mean of the last ``n`` losses, rounded as the training logs keep it."""
    return round(sum(losses[-n:]) / len(losses[-n:]), 4)


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


def run(recipe: Recipe, out: Path | None = None, progress=True) -> tuple[DraftModel, dict]:
    """Train under ``recipe.out_dir()`` (resumable); the draft lands in ``out`` (default: its ``final/``).
    Returns the draft as stored (float16 weights) and the training log plus ``val_records``, ``slots``, ``pair``
    (for :func:`compare_with_shipped`)."""
    torch.manual_seed(recipe.seed)
    t0 = time.perf_counter()
    pair = load_pair("smollm2-135m")
    pair.target.requires_grad_(False)
    train_recs, val_recs, info = teacher_data(pair, recipe, progress)
    vocab = distill.choose_draft_vocab(train_recs, recipe.draft_vocab, pair.target.config.vocab_size, always=(EOS,))
    slots = distill.slot_map(vocab, pair.target.config.vocab_size)
    info["vocab_coverage_train"] = round(distill.coverage(train_recs, vocab), 4)
    info["vocab_coverage_val"] = round(distill.coverage(val_recs, vocab), 4)
    draft = DraftModel.from_target(pair.target, list(recipe.layers), vocab)
    run_dir = recipe.out_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Path(out) if out is not None else run_dir / "final"
    hist = distill.train(draft, kd_step(slots), train_recs, recipe.train, ckpt=run_dir / "ckpt.pt", progress=progress)
    # what ships is float16: measure the stored weights, not the float32 ones
    save_draft(draft, out, meta=dict(recipe=asdict(recipe)))
    draft = load_draft(out, pair.target)
    val = distill.agreement(sub_logits_fn(draft), val_recs, slots, PAD)
    info.update(train_seconds=round(hist["seconds"], 1), resumed_at_step=hist["resumed_at"],
                final_loss=mean_tail(hist["losses"], 50),
                val_greedy_alpha=round(val["greedy_alpha"], 4), val_t1_alpha=round(val["t1_alpha"], 4),
                total_seconds=round(time.perf_counter() - t0, 1))
    save_draft(draft, out, meta=dict(recipe=asdict(recipe), training=info))
    shipped.write_sums(out)
    (run_dir / "losses.json").write_text(json.dumps(hist["losses"]))
    return draft, dict(info, val_records=val_recs, slots=slots, pair=pair)


def compare_with_shipped(new_dir: Path, ctx: dict) -> dict | None:
    """How close a retrained draft is to the shipped one, on the held-out training prompts (``ctx``: what
    :func:`run` returned); None without a shipped draft. Keys: ``same_files`` (weights bitwise identical),
    ``new`` / ``old`` (:func:`distill.agreement`), ``greedy_agree`` of ``positions`` (the two drafts' greedy
    proposals, teacher-forced on the target's greedy responses), ``vocab_overlap``."""
    if not shipped.is_present():
        return None
    pair, val, slots = ctx["pair"], ctx["val_records"], ctx["slots"]
    old = shipped.load_model_draft(pair.target)
    new = load_draft(new_dir, pair.target)
    same_files = shipped.read_sums(new_dir)["model.safetensors"] == shipped.read_sums(shipped.MODEL_DRAFT)["model.safetensors"]
    a_new = distill.agreement(remapped_logits_fn(new, slots), val, slots, PAD)
    a_old = distill.agreement(remapped_logits_fn(old, slots), val, slots, PAD)
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
    return dict(same_files=same_files, new=a_new, old=a_old, greedy_agree=agree / max(n, 1), positions=n,
                vocab_overlap=vocab_overlap)


def format_comparison(cmp: dict | None) -> str:
    """:func:`compare_with_shipped`'s result as the report ``make models FORCE=1`` prints."""
    if cmp is None:
        return "no shipped draft to compare with"
    return "\n".join([
        "\n== retrained vs shipped draft (held-out training prompts, teacher-forced) ==",
        f"  weights bitwise identical      : {cmp['same_files']}",
        f"  greedy alpha  new / shipped    : {cmp['new']['greedy_alpha']:.4f} / {cmp['old']['greedy_alpha']:.4f}",
        f"  T=1 alpha     new / shipped    : {cmp['new']['t1_alpha']:.4f} / {cmp['old']['t1_alpha']:.4f}",
        f"  greedy proposals that agree    : {cmp['greedy_agree']:.4f} of {cmp['positions']} positions",
        f"  draft vocabulary overlap       : {cmp['vocab_overlap']:.4f}",
    ])


def install(src: Path, dest: Path, names=shipped.REQUIRED) -> None:
    """Copy a trained draft's ``names`` and its ``SHA256SUMS`` from ``src`` into the shipped folder ``dest``; a
    confidence calibration there belonged to the replaced weights and is removed (scripts/calibrate_confidence.py
    makes the new draft's)."""

    dest.mkdir(parents=True, exist_ok=True)
    for name in (*names, shipped.SUMS):
        shutil.copy2(src / name, dest / name)
    (dest / CALIBRATION).unlink(missing_ok=True)


