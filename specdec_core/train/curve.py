"""The draft's learning curve: the first draft's recipe at several data sizes and trunk depths, measured teacher-forced.

Data: the target's answers to the first training set (``data/prompts/train.jsonl``, the first draft's) and to
``data/prompts/train_more.jsonl`` (:func:`specdec_core.train.teacher.teacher_records`, cached). A size is a
*nested* subset of their union: records in a fixed pseudo-random order (a hash of the prompt id and mode), taken
until the size's share of the response tokens, so every smaller set lies inside every larger one and the sets
differ only in how much of the same distribution they hold. Everything else is the recipe's (vocabulary chosen
on the subset, optimiser, steps, seed); only the data and the trunk's layers change.

Measured per point, teacher-forced (:func:`~specdec_core.train.distill.agreement`): greedy α (draft argmax ==
target argmax on the target's greedy answers: exactly greedy speculative decoding's per-token acceptance) and
T = 1 α (mean Σ min(p, q) on its temperature-1 answers, p cut to its top 20: a lower bound), on the held-out
training prompts (where a draft may be chosen) and on the evaluation mix (reported, never used to choose).
"""
from __future__ import annotations

import zlib
from dataclasses import replace
from pathlib import Path

import torch

from ..data.prompts import DEFAULT_PATH as EVAL_PATH, encode, load_prompts
from ..models.draft import DraftModel, load_draft, save_draft
from . import distill, drafts, teacher
from .teacher import CACHE, EOS, PAD
from .prompts import MORE_PATH

# every stage at a tiny size (a minute): the scripts' --smoke checks their plumbing with it
SMOKE_RECIPE = drafts.Recipe(greedy_prompts=6, sample_prompts=3, max_new_tokens=8, gen_batch=4,
                             train=distill.TrainConfig(steps=3, lr=3e-3, warmup=1, batch_tokens=512, seed=0,
                                                       ckpt_every=100))


def teacher_sets(pair, recipe: drafts.Recipe, more: int, sample_frac: float) -> dict:
    """The recipe's teacher data on the first training set (``first``) and the target's answers to ``more``
    prompts of ``train_more.jsonl``, a ``sample_frac`` share of them at temperature 1 (``more``): each a
    ``(train, val, info)`` triple of :func:`~specdec_core.train.teacher.teacher_records` (cached, resumable)."""

    n_sample = round(more * sample_frac)
    return dict(first=teacher.teacher_records(pair, recipe),
                more=teacher.teacher_records(pair, recipe, prompt_file=MORE_PATH, counts=(more - n_sample, n_sample)))


def eval_records(pair, max_new_tokens: int, batch: int, per_task: int | None = None,
                 cache: Path | None = None) -> list[dict]:
    """The target's greedy and temperature-1 answers to every eval prompt (first turn), with its top-20 law
    (cached in ``cache`` when given: the answers depend only on the target and these arguments)."""
    if cache is not None and cache.exists():
        return torch.load(cache, weights_only=False)
    prompts = load_prompts(EVAL_PATH, per_task=per_task)
    ids = [encode(pair, p) for p in prompts]
    recs = []
    for mode, temp in (("greedy", 0.0), ("sample", 1.0)):
        order = sorted(range(len(prompts)), key=lambda i: len(ids[i]))
        for b in range(0, len(order), batch):
            items = order[b:b + batch]
            out = teacher.teacher_batch(pair.target, [ids[i] for i in items], max_new_tokens, temp, 20, 7 + b, EOS)
            for r, i in zip(out, items):
                r.update(key=prompts[i].id, mode=mode, task=prompts[i].task)
            recs += out
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(recs, cache)
    return recs


def alpha_by_task(draft, records: list[dict]) -> dict:
    """:func:`distill.agreement` of ``draft`` (its own vocabulary) per task and over all records (``"all"``)."""
    slots = distill.slot_map(draft.vocab, draft.config.vocab_size)
    fn = drafts.sub_logits_fn(draft)
    out = {}
    for task in sorted({r["task"] for r in records}) + ["all"]:
        sel = [r for r in records if task in ("all", r["task"])]
        with torch.no_grad():
            a = distill.agreement(fn, sel, slots, PAD)
        out[task] = {k: round(v, 4) if isinstance(v, float) else v for k, v in a.items()}
    return out


def nested_subset(records: list[dict], share: float) -> list[dict]:
    """The first ``share`` of the response tokens of ``records`` in a fixed pseudo-random order (nested in
    ``share``); the records keep their original order (the training schedule shuffles them by its seed)."""
    if not 0 < share <= 1:
        raise ValueError(f"a data share must lie in (0, 1], got {share}")
    order = sorted(range(len(records)), key=lambda i: zlib.crc32(f"{records[i]['key']}|{records[i]['mode']}".encode()))
    goal, total, keep = share * sum(r["response"].numel() for r in records), 0, set()
    for i in order:
        if total >= goal:
            break
        keep.add(i)
        total += records[i]["response"].numel()
    return [r for i, r in enumerate(records) if i in keep]


def point_dir(tag: str, share: float, layers: tuple, recipe: drafts.Recipe) -> Path:
    """The cache folder of one point (resumable training, ``final/`` at the end)."""
    return CACHE / f"curve-{tag}-s{share:g}-l{''.join(map(str, layers))}-{recipe.key()}"


def train_point(pair, train: list[dict], layers: tuple, recipe: drafts.Recipe, run_dir: Path, progress=True):
    """The recipe with trunk ``layers`` on ``train``; returns the stored (float16) draft and its training log."""

    recipe = replace(recipe, layers=tuple(layers))
    torch.manual_seed(recipe.seed)
    vocab = distill.choose_draft_vocab(train, recipe.draft_vocab, pair.target.config.vocab_size, always=(EOS,))
    slots = distill.slot_map(vocab, pair.target.config.vocab_size)
    final = run_dir / "final"
    if (final / "model.safetensors").exists():
        return load_draft(final, pair.target), {"seconds": None, "cached": True}
    draft = DraftModel.from_target(pair.target, list(layers), vocab)
    run_dir.mkdir(parents=True, exist_ok=True)
    hist = distill.train(draft, drafts.kd_step(slots), train, recipe.train, ckpt=run_dir / "ckpt.pt",
                         progress=progress)
    save_draft(draft, final, meta=dict(layers=list(layers), train_tokens=sum(r["response"].numel() for r in train)))
    return load_draft(final, pair.target), {"seconds": round(hist["seconds"], 1), "cached": False}
