"""Self-distillation for trained drafters: draft vocabulary, batches, loss, training loop, teacher-forced metrics.

The pipeline, each step a function:

1. teacher data — the target's own answers and its law at every response position: :mod:`specdec_core.train.teacher`
   (the one module that makes, caches and loads teacher records).
2. :func:`choose_draft_vocab` — the N most frequent tokens of the target's responses (+ EOS).
3. :func:`make_batches` / :func:`collate` — deterministic, length-bucketed, padded training batches;
   the teacher's top-k ids are mapped to draft-vocabulary slots (``-1`` outside it).
4. :func:`kd_loss` — cross-entropy of the draft's sub-vocabulary log-softmax against the teacher's
   law restricted to its top-k ∩ draft vocabulary and renormalised (forward KL up to a constant).
5. :func:`train` — AdamW + cosine schedule with a tqdm bar and an atomic, resumable checkpoint.
6. :func:`agreement` — teacher-forced metrics on held-out records: top-1 agreement on greedy responses
   (exactly the greedy per-token acceptance α, since greedy verification compares the draft's token
   with the target's argmax on the target's own prefix) and Σ min(p, q) on sampled responses (the
   temperature-1 acceptance, truncated to the teacher's top-k: a lower bound).

A record is a dict: ``prompt`` int32 ``[S]``, ``response`` int32 ``[n]``, ``top_idx`` int32 ``[n, k]``,
``top_logp`` float16 ``[n, k]`` (row j = the target's law for ``response[j]`` given everything before
it), ``key`` (prompt id), ``mode`` (``"greedy"`` or ``"sample"``).
"""
from __future__ import annotations

import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


# -- 2. draft vocabulary -----------------------------------------------------------------------------
def choose_draft_vocab(records: list[dict], size: int, vocab_size: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """The ``size`` most frequent tokens of the responses (ties: lower id first), ``always`` included; ascending."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in records:
        counts.index_add_(0, r["response"].long(), torch.ones(r["response"].numel(), dtype=torch.long))
    counts[list(always)] = torch.iinfo(torch.long).max
    order = torch.sort(-counts, stable=True).indices[:size]
    return order.sort().values


def coverage(records: list[dict], vocab: torch.Tensor) -> float:
    """Fraction of response tokens inside ``vocab`` (an upper bound on greedy acceptance)."""
    inside = torch.zeros(max(int(vocab.max()), max(int(r["response"].max()) for r in records)) + 1, dtype=torch.bool)
    inside[vocab] = True
    hit = sum(int(inside[r["response"].long()].sum()) for r in records)
    return hit / sum(r["response"].numel() for r in records)


# -- 3. batches --------------------------------------------------------------------------------------
def make_batches(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Shuffle, bucket by length in windows of 64, cut to ~``batch_tokens`` padded tokens, shuffle batches."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    for w in range(0, len(order), 64):
        window = sorted(order[w:w + 64], key=lambda i: lengths[i])
        cur = []
        for i in window:
            if cur and (len(cur) + 1) * max(lengths[j] for j in cur + [i]) > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def slot_map(vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """LongTensor ``[V]``: token id → draft-vocabulary slot, ``-1`` outside the draft vocabulary."""
    m = torch.full((vocab_size,), -1, dtype=torch.long)
    m[vocab] = torch.arange(vocab.numel())
    return m


def collate(records: list[dict], slots: torch.Tensor, pad_id: int) -> dict:
    """Right-padded batch of ``prompt + response[:-1]`` with the teacher's law at each response position.

    Returns ``input_ids`` / ``attention_mask`` ``[B, L]``, ``t_slot`` long ``[B, L, k]`` (-1: not in the
    draft vocabulary or no teacher there), ``t_logp`` float32 ``[B, L, k]``, ``greedy`` bool ``[B]``,
    ``valid`` bool ``[B, L]`` (positions with a teacher law inside the draft vocabulary: the loss's).
    """
    seqs = [torch.cat([r["prompt"], r["response"][:-1]]).long() for r in records]
    B, L, k = len(records), max(len(s) for s in seqs), records[0]["top_idx"].shape[1]
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    t_slot = torch.full((B, L, k), -1, dtype=torch.long)
    t_logp = torch.zeros((B, L, k), dtype=torch.float32)
    for b, (r, s) in enumerate(zip(records, seqs)):
        ids[b, :len(s)], mask[b, :len(s)] = s, 1
        S, n = len(r["prompt"]), r["response"].numel()
        t_slot[b, S - 1:S - 1 + n] = slots[r["top_idx"].long()]
        t_logp[b, S - 1:S - 1 + n] = r["top_logp"].float()
    greedy = torch.tensor([r.get("mode") == "greedy" for r in records])
    valid = (t_slot >= 0).any(-1)
    return dict(input_ids=ids, attention_mask=mask, t_slot=t_slot, t_logp=t_logp, greedy=greedy, valid=valid)


# -- 4. loss -----------------------------------------------------------------------------------------
def teacher_law(t_slot: torch.Tensor, t_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher top-k restricted to the draft vocabulary and renormalised → (p̃ ``[..., k]``, valid ``[...]``)."""
    inside = t_slot >= 0
    logits = t_logp.masked_fill(~inside, float("-inf"))
    valid = inside.any(-1)
    p = torch.softmax(logits.masked_fill(~valid.unsqueeze(-1), 0.0), -1) * inside
    return p, valid


def kd_loss(sub_logits: torch.Tensor, t_slot: torch.Tensor, t_logp: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mean over positions of ``-Σ_j p̃_j log q(slot_j)`` (cross-entropy to the renormalised teacher top-k ∩
    draft vocabulary; forward KL up to a constant). sub_logits ``[..., N]``, t_slot / t_logp ``[..., k]``
    (usually already restricted to ``collate(...)["valid"]`` positions) → (loss, n_positions)."""
    p, valid = teacher_law(t_slot, t_logp)
    logq = torch.log_softmax(sub_logits[valid].float(), -1)  # [P, N]
    picked = logq.gather(-1, t_slot[valid].clamp_min(0))  # [P, k]
    n = int(valid.sum())
    return -(p[valid] * picked).sum() / max(n, 1), n


# -- 5. training -------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    steps: int = 1500
    lr: float = 1e-3
    min_lr_frac: float = 0.05
    warmup: int = 50
    weight_decay: float = 0.0
    batch_tokens: int = 4096
    grad_clip: float = 1.0
    seed: int = 0
    ckpt_every: int = 100


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def record_lengths(records: list[dict]) -> list[int]:
    """The length of each record's training sequence (``prompt + response[:-1]``, :func:`collate`)."""
    return [len(r["prompt"]) + len(r["response"]) - 1 for r in records]


def steps_per_epoch(records: list[dict], cfg: TrainConfig) -> int:
    """Optimiser steps in one pass over ``records``: the batches :func:`batch_schedule` cuts for an epoch."""
    return len(make_batches(record_lengths(records), cfg.batch_tokens, cfg.seed, 0))


def batch_schedule(records: list[dict], cfg: TrainConfig) -> list[list[int]]:
    """The whole run's batches (epochs concatenated), a pure function of the records and the seed."""
    lengths = record_lengths(records)
    out, epoch = [], 0
    while len(out) < cfg.steps:
        out += make_batches(lengths, cfg.batch_tokens, cfg.seed, epoch)
        epoch += 1
    return out[:cfg.steps]


def train(model, step_loss, records: list[dict], cfg: TrainConfig, ckpt: Path | None = None,
          progress: bool = True, on_checkpoint=None) -> dict:
    """Optimise ``model``'s trainable parameters for ``cfg.steps`` steps; resumable from ``ckpt``.

    ``step_loss(model, batch_records) -> (loss, n_positions)`` computes one batch's loss (the model
    draft uses :func:`collate` + :func:`kd_loss`; another drafter passes its own). The checkpoint holds
    the trainable state, the optimizer, the step and the loss history, written atomically every
    ``cfg.ckpt_every`` steps; the batch order is recomputed from the seed, so a resumed run sees the
    same batches. Returns ``{"losses": [...], "seconds": float, "resumed_at": int}``.
    """
    from tqdm.auto import tqdm

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    schedule = batch_schedule(records, cfg)
    state = dict(step=0, losses=[], seconds=0.0)
    if ckpt is not None and Path(ckpt).exists():
        saved = torch.load(ckpt, weights_only=False)
        if saved["config"] != asdict(cfg):
            raise RuntimeError(f"checkpoint {ckpt} was written with a different TrainConfig; delete it to restart")
        model.load_state_dict(saved["model"], strict=False)
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
    resumed_at = state["step"]
    torch.manual_seed(cfg.seed)
    model.train()
    bar = tqdm(total=cfg.steps, initial=state["step"], desc="train draft", disable=not progress, smoothing=0.05)
    t0 = time.perf_counter()

    def save():
        if ckpt is None:
            return
        tmp = Path(str(ckpt) + ".tmp")
        trainable = {k: v for k, v in model.state_dict().items()
                     if k in {n for n, p in model.named_parameters() if p.requires_grad}}
        torch.save(dict(model=trainable, opt=opt.state_dict(), state=state, config=asdict(cfg)), tmp)
        os.replace(tmp, ckpt)

    while state["step"] < cfg.steps:
        step = state["step"]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss, _ = step_loss(model, [records[i] for i in schedule[step]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        state["losses"].append(float(loss.detach()))
        state["step"] = step + 1
        bar.update(1)
        if state["step"] % 10 == 0:
            bar.set_postfix(loss=f"{sum(state['losses'][-50:]) / len(state['losses'][-50:]):.3f}")
        if state["step"] % cfg.ckpt_every == 0 or state["step"] == cfg.steps:
            state["seconds"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            save()
            if on_checkpoint is not None:
                on_checkpoint(state["step"])
    bar.close()
    model.eval()
    return dict(losses=state["losses"], seconds=state["seconds"], resumed_at=resumed_at)


# -- 6. teacher-forced metrics -----------------------------------------------------------------------
@torch.no_grad()
def agreement(logits_fn, records: list[dict], slots: torch.Tensor, pad_id: int, batch_tokens: int = 8192) -> dict:
    """Teacher-forced acceptance estimates on held-out records.

    ``logits_fn(batch) -> sub_logits [B, L, N]``. Returns ``greedy_alpha`` (draft argmax == target argmax
    on greedy responses, response positions 2.. — the first token comes from the target's prefill),
    ``t1_alpha`` (mean Σ min(p, q) over sampled responses' positions, p truncated to its top-k),
    and ``n_greedy`` / ``n_sample`` positions.
    """
    vocab_of_slot = torch.full((int(slots.max()) + 1,), -1, dtype=torch.long)
    vocab_of_slot[slots[slots >= 0]] = (slots >= 0).nonzero().flatten()
    hits = n_g = 0
    mass, n_s = 0.0, 0
    lengths = [len(r["prompt"]) + len(r["response"]) for r in records]
    for batch in make_batches(lengths, batch_tokens, seed=0, epoch=0):
        recs = [records[i] for i in batch]
        b = collate(recs, slots, pad_id)
        sub = logits_fn(b).float()
        for j, r in enumerate(recs):
            S, n = len(r["prompt"]), r["response"].numel()
            if n < 2:
                continue
            rows = sub[j, S:S - 1 + n]  # positions predicting response[1:]
            if r["mode"] == "greedy":
                pred = vocab_of_slot[rows.argmax(-1)]
                target_top1 = r["top_idx"][1:n, 0].long()
                hits += int((pred == target_top1).sum())
                n_g += n - 1
            else:
                q = torch.softmax(rows, -1)
                s = b["t_slot"][j, S:S - 1 + n]
                p = b["t_logp"][j, S:S - 1 + n].exp() * (s >= 0)
                mass += float(torch.minimum(p, q.gather(-1, s.clamp_min(0))).sum())
                n_s += n - 1
    return dict(greedy_alpha=hits / max(n_g, 1), t1_alpha=mass / max(n_s, 1), n_greedy=n_g, n_sample=n_s)
