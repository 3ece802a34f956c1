"""Experiment: does conditioning the draft on the target's hidden states (EAGLE-style) raise α here? (Its
command line: ``scripts/feature_draft.py``; result in ``data/reference/feature_draft.json``.)

Not part of ``make models`` and not a drafter the library decodes with: a measurement that tells whether
the shipped draft (:mod:`specdec_core.models.draft`, tokens only) leaves acceptance on the table that the
target's own features would recover, as they do for 7B-70B targets in EAGLE (Li et al., 2024).

The *feature draft* reads, at position t, the target's final normalised hidden state f_t (the LM head's
input, which already decided token t+1) together with the embedding of token t+1, and predicts token t+2::

    [f_t ; embed(x_{t+1})] ─ Linear(2H → H) ─► n Llama layers (+ final norm) ─► h_t ─ sub-head ─► x_{t+2}

trained on the same self-distillation records as the shipped draft (the teacher data of
:func:`specdec_core.train.teacher.teacher_records`, answers to the training prompts only) with the same top-k
KD loss, plus a smooth-L1 pull of h_t towards f_{t+1} so that h_t can stand in for the target's feature at
the next draft step (EAGLE-1's recipe). Variant ``two_step`` also trains the second step on the draft's own
first-step output (EAGLE-3's "training-time test"); variant ``features_zeroed`` is the ablation. Trunk,
optimiser, steps and seed are the first draft's (:data:`specdec_core.train.drafts.FIRST`). The features
are recomputed teacher-forced with the target's public forward (``output_hidden_states=True``) and cached
beside the teacher data.

Measured on the held-out training prompts (greedy answers, teacher-forced, never the eval mix):

- ``alpha_1``: the first draft token of a step equals the target's (the draft saw the true f_t);
- ``alpha_2_given_1``: the second equals the target's given the first did, the draft now reading its own
  h_t in place of f_{t+1} (all rows of one pass through a 4D mask: row t+1 of the second step sees the
  true rows ≤ t and itself, at position t + 1, exactly what decoding would compute);
- the same two numbers for the shipped draft (position-wise agreement and its conditional at the next
  position: the chain a K-token draft grows).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..models import shipped
from ..models.draft import DraftModel
from ..models.hub import load_pair
from ..paths import REFERENCE_DIR, REPO_ROOT
from ..tree import attention_bias
from . import distill
from .drafts import FIRST, mean_tail
from .teacher import CACHE, PAD, teacher_records

OUT = REFERENCE_DIR / "feature_draft.json"
# name -> (features zeroed, second step trained on the draft's own output)
VARIANTS = {"with_features": (False, False), "features_zeroed": (True, False), "two_step": (False, True)}


class FeatureDraft(DraftModel):
    """``[f_t ; e(x_{t+1})] → fc → n Llama layers → h_t`` (normed); logits = ``sub_logits(h_t)``.

    A :class:`DraftModel` (its trunk, shared embedding and frozen sub-head) with the input projection ``fc``
    in front; every trunk layer starts as target layer ``init_layer``, the final norm as the target's. Not a
    causal LM: :meth:`forward` takes features and next tokens and returns hidden states, so the decoders
    cannot drive it (the experiment only measures it).
    """

    def __init__(self, target, vocab: torch.Tensor, n_layers: int, init_layer: int):
        cfg = copy.deepcopy(target.config.get_text_config())
        cfg.num_hidden_layers = n_layers
        super().__init__(cfg, target.get_input_embeddings(), vocab)
        H = cfg.hidden_size
        self.fc = nn.Linear(2 * H, H)
        with torch.no_grad():
            for layer in self.trunk.layers:
                layer.load_state_dict(target.model.layers[init_layer].state_dict())
            self.trunk.norm.load_state_dict(target.model.norm.state_dict())
            self.fc.weight.zero_()  # starts as "embedding only"; the optimiser decides how much f_t matters
            self.fc.weight[:, H:] = torch.eye(H)
            self.fc.weight[:, :H].normal_(0.0, 0.01)
            self.fc.bias.zero_()

    def forward(self, feat, next_ids, **trunk_kwargs):
        x = self.fc(torch.cat([feat, self.embedding(next_ids)], -1))
        return self.trunk(inputs_embeds=x, use_cache=False, **trunk_kwargs).last_hidden_state


@torch.inference_mode()
def add_features(target, records: list[dict], cache: Path, progress=True) -> None:
    """``r["feat"]`` float16 ``[S + n - 1, H]`` for every record (one teacher-forced pass each; cached)."""
    from tqdm.auto import tqdm

    if cache.exists():
        feats = torch.load(cache, weights_only=True)
    else:
        feats = []
        for r in tqdm(records, desc="target features", disable=not progress):
            ids = torch.cat([r["prompt"], r["response"][:-1]]).long().view(1, -1)
            out = target(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
            feats.append(out.hidden_states[-1][0].to(torch.float16))
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(feats, cache)
    if len(feats) != len(records) or any(f.shape[0] != len(r["prompt"]) + len(r["response"]) - 1
                                          for r, f in zip(records, feats)):
        raise ValueError(f"cached features {cache} do not match the teacher records: delete the file to recompute")
    for r, f in zip(records, feats):
        r["feat"] = f


def batch(records, slots, zero_features: bool):
    """Rows t = 0..L-2 of ``prompt + response[:-1]``: input (f_t, x_{t+1}), target law of x_{t+2}."""
    b = distill.collate(records, slots, PAD)
    B, L = b["input_ids"].shape
    F = torch.zeros(B, L, records[0]["feat"].shape[1])
    if not zero_features:
        for j, r in enumerate(records):
            F[j, :r["feat"].shape[0]] = r["feat"].float()
    mask = b["attention_mask"][:, 1:]
    return dict(feat=F[:, :-1], next_ids=b["input_ids"][:, 1:], mask=mask, feat_next=F[:, 1:],
                t_slot=b["t_slot"][:, 1:], t_logp=b["t_logp"][:, 1:], valid=b["valid"][:, 1:] & mask.bool())


def step_loss_fn(slots, zero_features: bool, w_feat: float, two_step: bool = False):
    """KD at every row (+ ``w_feat`` × feature regression). ``two_step``: also train the second draft step on the
    draft's own first-step output (training-time test, as EAGLE-3 does): a no-grad pass gives h, then one pass
    over the true rows and the second-step rows (:func:`step_pairs`) carries both losses."""

    def step_loss(m, recs):
        b = batch(recs, slots, zero_features)
        if two_step:
            with torch.no_grad():
                h0 = m(b["feat"], b["next_ids"], attention_mask=b["mask"])
            L = b["next_ids"].shape[1]
            f2, x2, kw = step_pairs(b["feat"], b["next_ids"], b["mask"], h0)
            out = m(f2, x2, **kw)
            h, h2 = out[:, :L], out[:, L:]
            v2 = b["valid"][:, 1:]
            kd2, _ = distill.kd_loss(m.sub_logits(h2[v2]), b["t_slot"][:, 1:][v2], b["t_logp"][:, 1:][v2])
        else:
            h, kd2 = m(b["feat"], b["next_ids"], attention_mask=b["mask"]), 0.0
        kd, n = distill.kd_loss(m.sub_logits(h[b["valid"]]), b["t_slot"][b["valid"]], b["t_logp"][b["valid"]])
        if zero_features:
            return kd + kd2, n
        real = b["mask"].bool()
        return kd + kd2 + w_feat * nn.functional.smooth_l1_loss(h[real], b["feat_next"][real]), n

    return step_loss


def step_pairs(feat, next_ids, mask, h):
    """Batched inputs for one pass over the true rows ``[B, L]`` and the second-step rows t = 0..L-2 (each
    reading (h_t, x_{t+2}) at position t + 1 and seeing the true rows <= t and itself; padding never seen).
    Returns ``(feat, next_ids)`` of length 2L - 1 and the trunk's ``attention_mask`` / ``position_ids``."""
    B, L = next_ids.shape
    t = torch.arange(L - 1)
    allowed = torch.zeros(2 * L - 1, 2 * L - 1, dtype=torch.bool)
    allowed[:L, :L] = torch.ones(L, L, dtype=torch.bool).tril()
    allowed[L:, :L] = torch.arange(L).view(1, -1) <= t.view(-1, 1)
    allowed[L + t, L + t] = True
    keys = torch.cat([mask, mask[:, 1:]], 1).bool()
    bias = attention_bias(allowed.unsqueeze(0) & keys.unsqueeze(1), 0, feat.dtype, feat.device)
    pos = torch.cat([torch.arange(L), t + 1]).expand(B, -1)
    return (torch.cat([feat, h[:, :L - 1]], 1), torch.cat([next_ids, next_ids[:, 1:]], 1),
            {"attention_mask": bias, "position_ids": pos})


def second_step(m, f, x, h, t):
    """The draft's second step for the rows ``t`` of one sequence (``f [R, H]`` true features, ``x [R]`` next
    tokens, ``h [R, H]`` first-step outputs): row t reads (h_t, x_{t+2}) at position t + 1 and sees the true
    rows <= t and itself, exactly what decoding computes. Returns ``[len(t), H]``."""
    R = x.numel()
    f2, x2, kw = step_pairs(f.unsqueeze(0), x.unsqueeze(0), torch.ones(1, R, dtype=torch.long), h.unsqueeze(0))
    return m(f2, x2, **kw)[0, R:][t]


@torch.no_grad()
def chain_alpha(matches, records) -> dict:
    """alpha_1 and alpha_2 | 1 over the greedy records with >= 3 response tokens. ``matches(r)`` gives the
    first-step hits ``ok1`` (rows predicting response[1:]) and the second-step hits ``ok2`` (response[2:],
    aligned with ``ok1[:-1]``, the step that proposed their first token)."""
    hit1 = n1 = hit2 = n2 = 0
    for r in (r for r in records if r["mode"] == "greedy" and r["response"].numel() >= 3):
        ok1, ok2 = matches(r)
        hit1, n1 = hit1 + int(ok1.sum()), n1 + ok1.numel()
        hit2, n2 = hit2 + int((ok2 & ok1[:-1]).sum()), n2 + int(ok1[:-1].sum())
    return dict(alpha_1=hit1 / n1, alpha_2_given_1=hit2 / max(n2, 1), positions=n1)


def feature_matches(m, slots, zero_features: bool):
    """The feature draft's hits: its first step reads the true f_t, its second its own h_t (:func:`second_step`)."""
    vocab = (slots >= 0).nonzero().flatten()

    def matches(r):
        S, n = len(r["prompt"]), r["response"].numel()
        b = batch([r], slots, zero_features)
        f, x = b["feat"][0], b["next_ids"][0]  # [R, H], [R] with R = S + n - 2 rows
        h = m(f.unsqueeze(0), x.unsqueeze(0))[0]
        top1 = r["top_idx"][:, 0].long()  # the target's greedy token at response index j
        ok1 = vocab[m.sub_logits(h).argmax(-1)][S - 1:] == top1[1:n]  # rows S-1.. predict response[1..]
        h2 = second_step(m, f, x, torch.zeros_like(h) if zero_features else h, torch.arange(S - 1, x.numel() - 1))
        return ok1, vocab[m.sub_logits(h2).argmax(-1)] == top1[2:n]  # row t predicts response[t + 3 - S]

    return matches


def token_matches(draft):
    """A token-only draft's hits: position-wise agreement; its second step is the next position."""

    def matches(r):
        S, n = len(r["prompt"]), r["response"].numel()
        ids = torch.cat([r["prompt"], r["response"][:-1]]).long().view(1, -1)
        ok = draft(input_ids=ids).logits[0, S:].argmax(-1) == r["top_idx"][1:n, 0].long()
        return ok, ok[1:]

    return matches


def run(variants=tuple(VARIANTS), steps: int = 0, layers: int = 1, init_layer: int = 0, w_feat: float = 1.0,
        progress: bool = True, log: Callable[[str], None] = lambda line: None) -> dict:
    """The experiment: the shipped draft's chain acceptance, then each of ``variants`` (names of
    :data:`VARIANTS`) trained (resumably, under ``data/train_cache/feature-*``) and measured. ``steps`` 0: the
    first recipe's. ``log`` receives one line per measured draft. Returns what ``feature_draft.json`` holds."""
    t0 = time.perf_counter()
    recipe = FIRST  # the first draft's data and optimiser: the experiment compares with it
    pair = load_pair("smollm2-135m")
    pair.target.requires_grad_(False)
    train_recs, val_recs, info = teacher_records(pair, recipe, progress)
    add_features(pair.target, train_recs + val_recs,
                 REPO_ROOT / info["teacher_folder"] / "features_teacher_forced.pt", progress)
    draft = shipped.load_model_draft(pair.target)
    slots = distill.slot_map(draft.vocab, pair.target.config.vocab_size)  # the shipped draft's vocabulary
    cfg = dataclasses.replace(recipe.train, steps=steps or recipe.train.steps)  # the shipped draft's optimiser
    result = dict(question="EAGLE-style feature conditioning vs the shipped token-only draft",
                  data=dict(train_records=len(train_recs), val_records=len(val_recs),
                            train_tokens=info["train_tokens"], teacher_folder=info["teacher_folder"]),
                  feature_draft=dict(layers=layers, init_layer=init_layer, w_feat=w_feat,
                                     train=dataclasses.asdict(cfg)),
                  shipped=chain_alpha(token_matches(draft), val_recs))
    log(f"shipped draft (2 layers, tokens only): {result['shipped']}")
    for name in variants:
        zero, two = VARIANTS[name]
        torch.manual_seed(recipe.seed)
        m = FeatureDraft(pair.target, draft.vocab, layers, init_layer)
        run_dir = CACHE / f"feature-{layers}x{init_layer}-{cfg.steps}-{w_feat}-{name}"
        run_dir.mkdir(parents=True, exist_ok=True)
        hist = distill.train(m, step_loss_fn(slots, zero, w_feat, two), train_recs, cfg, ckpt=run_dir / "ckpt.pt",
                             progress=progress)
        result[name] = dict(chain_alpha(feature_matches(m, slots, zero), val_recs),
                            train_seconds=round(hist["seconds"], 1), final_loss=mean_tail(hist["losses"], 50))
        log(f"{name} {result[name]}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result
