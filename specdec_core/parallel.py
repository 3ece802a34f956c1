"""Parallel drafting: a block drafter proposes all K tokens in **one** draft pass (PARD-style mask tokens).

    drafter = pair.drafters["block"]                       # or BlockDrafter(load_block(folder, target))
    res = sd.generate(pair.target, ids, drafter=drafter, method="parallel", k=6)

The draft is a :class:`~specdec_core.draft_model.DraftModel` whose input vocabulary is extended by
``max_block - 1`` *mask ids* ``V, V+1, …`` (one learned embedding per block offset). One pass over

    [ unseen committed tokens …, last token, MASK_1, …, MASK_{K-1} ]    (plain causal attention)

gives K next-token laws: the last token's row predicts x_1 (exactly an autoregressive draft's first
token), MASK_j's row predicts x_{j+1}. Each x_i is drawn from its processed law q_i =
``process_logits(row_i)``; q_i depends on the committed context only, never on x_<i, which is all
speculative sampling needs to stay lossless (the verifier compares x_i with p_i(· | context, x_<i)).
The pass commits only the real tokens' KV entries: the masks' entries lie past the cache's length, never
read and overwritten next time (the pointer arithmetic of ``KVCache.rollback``, O(1)), so the draft's
cache always holds exactly the committed tokens and ``accept(n)`` has nothing to undo.

One step has the four phases of :mod:`specdec_core.linear` (the loop is reused unchanged):
draft (1 pass, any K) → verify (1 target pass over K + 1 tokens) → accept → commit.
Trees work too (:meth:`BlockDrafter.propose_tree`, Medusa-style): a node at depth d gets its children
from the law of block position d + 1, so a whole tree also costs one draft pass.

Training (:func:`block_batch`, :func:`block_loss`, used by ``scripts/train_block.py``): every training
sequence is followed by blocks of masks anchored at positions a; MASK_j of anchor a sits at position
a + j and sees the real tokens ≤ a and its own block's earlier masks: the inference pass, reproduced
for many anchors at once by a 4D attention mask. Notation: p = target law, q = draft law.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .draft_model import DraftModel, load_draft, save_draft
from .drafters import Draft, Drafter
from .lm import CachedLM
from .sampling import SamplingParams, process_logits, sample
from .tree import Dynamic, TreeBuilder, TreeDraft, draw_siblings, shape_depth

MASKS_FILE = "mask_embed.safetensors"
KIND = "block"


# -- the model --------------------------------------------------------------------------------------
class BlockDraftModel(DraftModel):
    """A :class:`DraftModel` that also reads mask ids ``V + j - 1`` (j = 1 … ``max_block - 1``).

    :attr:`mask_embed` ``[max_block - 1, H]``: row j - 1 = the embedding of MASK_j, stored as the parameter
    ``mask_raw`` = mask_embed / ``MASK_GAIN`` so that an optimizer step moves the masks ``MASK_GAIN`` times
    further than the trunk's weights (they start far from where they end up; Adam's step is ~lr per
    coordinate). Everything else (trunk, shared embedding, frozen sub-head, full-vocabulary ``-inf``
    scatter) is the DraftModel's.
    """

    MASK_GAIN = 16.0

    def __init__(self, config, embedding, vocab, max_block: int = 8):
        super().__init__(config, embedding, vocab)
        if isinstance(max_block, bool) or not isinstance(max_block, int) or max_block < 1:
            raise ValueError(f"max_block must be an integer >= 1, got {max_block!r}")
        self.max_block = max_block
        self.mask_raw = nn.Parameter(torch.zeros(max_block - 1, config.hidden_size))

    @property
    def mask_embed(self) -> torch.Tensor:
        """The mask embeddings ``[max_block - 1, H]``."""
        return self.mask_raw * self.MASK_GAIN

    @classmethod
    def from_draft(cls, draft: DraftModel, max_block: int = 8, seed: int = 0,
                   mask_embed: torch.Tensor | None = None) -> "BlockDraftModel":
        """A block draft with ``draft``'s trunk (copied) and head. Masks: ``mask_embed`` if given, else the
        mean token embedding plus seeded noise of 0.1× the embedding's std (distinct offsets)."""
        p = next(draft.parameters())
        with torch.random.fork_rng(devices=[]):  # the trunk's throw-away random init leaves the global RNG alone
            m = cls(draft.config, draft.embedding, draft.vocab, max_block).to(device=p.device, dtype=p.dtype)
        m.trunk.load_state_dict(draft.trunk.state_dict())
        m.head = draft.head.detach().clone()
        with torch.no_grad():
            if mask_embed is None:
                w = draft.embedding.weight.detach().to(torch.float64)
                g = torch.Generator().manual_seed(seed)
                noise = torch.randn(max_block - 1, w.shape[1], generator=g, dtype=torch.float64)
                mask_embed = w.mean(0) + 0.1 * w.std() * noise
            if mask_embed.shape != m.mask_raw.shape:
                raise ValueError(f"mask_embed of shape {tuple(mask_embed.shape)}, expected {tuple(m.mask_raw.shape)}")
            m.mask_raw.copy_(mask_embed.to(p.dtype) / cls.MASK_GAIN)
        return m

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids [B, T]`` (token ids, or mask ids ``V + j - 1``) → embeddings ``[B, T, H]``."""
        V, M = self.config.vocab_size, self.mask_raw.shape[0]
        if bool((input_ids >= V + M).any()) or bool((input_ids < 0).any()):
            raise ValueError(f"ids must lie in [0, {V + M}): tokens < {V}, then {M} mask ids")
        is_mask = input_ids >= V
        emb = self.embedding(input_ids.masked_fill(is_mask, 0)).to(self.head.dtype)
        if bool(is_mask.any()):
            masks = self.mask_embed[(input_ids - V).clamp(0, max(M - 1, 0))].to(emb.dtype)
            emb = torch.where(is_mask.unsqueeze(-1), masks, emb)
        return emb

    def hidden(self, input_ids: torch.Tensor, **trunk_kwargs):
        """As :meth:`DraftModel.hidden`, with mask ids mapped to their learned embeddings."""
        return self.trunk(inputs_embeds=self.embed(input_ids), **trunk_kwargs)


def save_block(model: BlockDraftModel, folder: str | Path, meta: dict | None = None) -> list[str]:
    """``config.json`` + ``model.safetensors`` (:func:`save_draft`: trunk float16, draft vocabulary) and
    ``mask_embed.safetensors`` (float32). Returns the file names (for ``SHA256SUMS``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    save_draft(model, folder, meta=dict(meta or {}, kind=KIND, max_block=model.max_block, masks_file=MASKS_FILE))
    save_file({"mask_embed": model.mask_embed.detach().to("cpu", torch.float32).contiguous()},
              str(folder / MASKS_FILE), metadata={"format": "specdec-block-masks-v1"})
    return ["config.json", "model.safetensors", MASKS_FILE]


def load_block(folder: str | Path, target, dtype=None, device=None) -> BlockDraftModel:
    """The block draft saved in ``folder`` on top of ``target`` (checksums are the caller's job)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("kind") != KIND:
        raise ValueError(f"{folder / 'config.json'} is not a block draft (kind={cfg.get('kind')!r})")
    base = load_draft(folder, target, dtype=dtype, device=device)
    masks = load_file(str(folder / MASKS_FILE))["mask_embed"]
    return BlockDraftModel.from_draft(base, int(cfg["max_block"]), mask_embed=masks).eval().requires_grad_(False)


# -- the drafter ------------------------------------------------------------------------------------
class BlockDrafter(Drafter):
    """K draft tokens from one pass of a :class:`BlockDraftModel` (K is capped at ``max_block``).

    The draft's :class:`~specdec_core.kvcache.KVCache` holds exactly the committed tokens between steps.
    A proposal feeds the unseen committed tokens (the whole prompt, the first time) and K − 1 masks in one
    pass that computes K rows of logits; the masks' KV entries are not committed.
    """

    name = "block"

    def __init__(self, model: BlockDraftModel):
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.max_block = model.max_block
        self.lm: CachedLM | None = None

    @classmethod
    def untrained_for(cls, target, seed: int = 0, max_block: int = 8, noise: float = 0.15) -> "BlockDrafter":
        """A deterministic untrained block drafter for a (toy) Llama target, for exactness tests: the
        target's layers plus seeded noise (``noise`` × each tensor's std), the target's LM head rows as the
        head, seeded mask embeddings. Its laws are related to the target's; offsets > 1 are untrained."""
        cfg = target.config.get_text_config()
        p = next(target.parameters())
        with torch.random.fork_rng(devices=[]):
            base = DraftModel(cfg, target.get_input_embeddings(), torch.arange(cfg.vocab_size)).to(p.device, p.dtype)
        base.trunk.layers.load_state_dict(target.model.layers.state_dict())
        base.trunk.norm.load_state_dict(target.model.norm.state_dict())
        base.head = target.get_output_embeddings().weight.detach().clone()
        g = torch.Generator().manual_seed(seed + 104729)
        with torch.no_grad():
            for w in base.trunk.parameters():
                w.add_(noise * w.std() * torch.randn(w.shape, generator=g, dtype=torch.float64).to(w))
        return cls(BlockDraftModel.from_draft(base, max_block, seed=seed).eval().requires_grad_(False))

    def mask_ids(self, n: int) -> list[int]:
        return [self.vocab_size + j for j in range(n)]

    def reset(self, prompt, capacity):
        need = capacity + self.max_block  # masks are written past the committed tokens (never committed)
        if self.lm is None or self.lm.cache.capacity < need:
            self.lm = CachedLM(self.model, need)
        self.lm.cache.length = 0

    @torch.inference_mode()
    def _block_pass(self, context: list[int], k: int) -> torch.Tensor:
        """One pass over [unseen…, MASK_1..MASK_{k-1}] → sub-vocabulary logits ``[k, N]`` of the last k rows.

        Uses the model's public forward with the draft's cache (``logits_to_keep=k``, ``full_vocab=False``:
        no head rows for the unseen tokens, no full-vocabulary scatter). The cache then commits the unseen
        tokens only: the masks' KV entries stay beyond ``length``, never read, overwritten next time (as
        after a ``rollback``: O(1)).
        """
        lm = self.lm
        unseen = context[lm.length:]
        if not unseen:
            raise ValueError("the last context token must be new to the drafter (the loop's invariant)")
        ids = torch.tensor(unseen + self.mask_ids(k - 1), dtype=torch.long, device=lm.device).view(1, -1)
        T, start = ids.shape[1], lm.length
        if start + T > lm.cache.capacity:
            raise ValueError(f"block of {T} positions does not fit the draft's KV cache of {lm.cache.capacity}")
        slots = torch.arange(start, start + T, device=lm.device)
        out = self.model(input_ids=ids, position_ids=slots.view(1, T), cache_position=slots, past_key_values=lm.cache,
                         use_cache=True, logits_to_keep=k, full_vocab=False)
        lm.cache.advance(len(unseen))  # commit the real tokens; the masks are forgotten
        return out.logits[0]

    def _laws(self, sub: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Sub-vocabulary logits ``[k, N]`` → (q over the draft vocabulary ``[k, N]``, q over V ``[k, V]``)."""
        q_sub = process_logits(sub, params)  # the same law as process_logits on the -inf-padded row
        q = torch.zeros(sub.shape[0], self.vocab_size, dtype=q_sub.dtype, device=q_sub.device)
        q[:, self.model.vocab] = q_sub
        return q_sub, q

    def propose(self, context, k, params: SamplingParams, generator) -> Draft:
        """Up to ``min(k, max_block)`` tokens in one pass; x_i ~ q_i = process_logits(row i) (greedy: argmax)."""
        k = min(k, self.max_block)
        sub = self._block_pass(context, k)
        vocab = self.model.vocab
        if params.greedy:
            return Draft(vocab[sub.argmax(-1)].cpu(), None, passes=1)
        q_sub, q = self._laws(sub, params)  # q: exactly the laws the tokens are drawn from
        return Draft(vocab[sample(q_sub, generator)].cpu(), q, passes=1)

    def accept(self, n):
        pass  # the cache holds the committed context only: the accepted tokens are fed next time

    def propose_tree(self, context, shape, k, params, generator) -> TreeDraft:
        """A tree of depth <= min(k, max_block) from one pass: every node at depth d draws its children
        from the law of offset d + 1 (greedy: its top tokens; sampling: draws without replacement, each
        child carrying its law), so siblings under different parents repeat the same choices."""
        depth = min(shape_depth(shape, k), self.max_block)
        sub = self._block_pass(context, depth)
        logits = sub.new_full((depth, self.vocab_size), float("-inf"))
        logits[:, self.model.vocab] = sub
        q = None if params.greedy else self._laws(sub, params)[1]
        grow = TreeBuilder(shape, depth)
        while True:
            d, F = grow.depth, len(grow.frontier)
            if params.greedy:
                score = torch.softmax(logits[d].double(), -1).expand(F, -1) if isinstance(shape, Dynamic) else None
            else:
                score = q[d].expand(F, -1)
            for u, m in zip(grow.frontier, grow.plan(score)):
                if m:
                    grow.add(u, *draw_siblings(logits[d], None if q is None else q[d], m, generator))
            if not grow.advance():
                break
        return grow.result(passes=1)

    def accept_path(self, path):
        pass  # no node was written to the draft's cache


# -- measuring: the draft phase alone ----------------------------------------------------------------
def proposal_timer(drafter: Drafter, context: list[int], params: SamplingParams = SamplingParams()):
    """A callable ``k -> seconds`` timing one ``propose(context, k)`` with exactly one unseen token.

    The draft phase of a step that follows a full rejection, the same for every K and every cached drafter
    (anything with an ``lm``: :class:`BlockDrafter`, :class:`~specdec_core.drafters.ModelDrafter`). The
    drafter's cache is set up once and rolled back after each call (a pointer move)."""
    import time

    base = len(context) - 1
    drafter.reset(torch.tensor(context), len(context) + 2 * getattr(drafter, "max_block", 16) + 2)
    drafter.propose(context[:-1], 1, params, None)
    drafter.accept(0)

    def timed(k: int) -> float:
        drafter.lm.cache.rollback(drafter.lm.length - base)
        g = torch.Generator().manual_seed(k)
        t = time.perf_counter()
        drafter.propose(context, k, params, g)
        dt = time.perf_counter() - t
        drafter.accept(0)
        return dt

    return timed


class TimedDrafter(Drafter):
    """Any drafter with the wall time of each proposal recorded, unchanged otherwise (same tokens, laws and
    generator draws). ``records``: one dict per proposal: ``k`` asked, ``unseen`` committed tokens the draft
    had not seen (its ``lm`` cache, if any), ``seconds``, ``first`` (the proposal that also reads the prompt)."""

    def __init__(self, inner: Drafter):
        self.inner, self.name, self.vocab_size = inner, inner.name, inner.vocab_size
        self.records: list[dict] = []
        self._first = True

    def bind(self, target):
        self.inner.bind(target)
        self.vocab_size = self.inner.vocab_size

    def reset(self, prompt, capacity):
        self.inner.reset(prompt, capacity)
        self._first = True

    def _timed(self, fn, context, k):
        import time

        lm = getattr(self.inner, "lm", None)
        unseen = len(context) - (lm.length if lm is not None else 0)
        cuda = lm is not None and lm.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        self.records.append(dict(k=k, unseen=unseen, seconds=time.perf_counter() - t, first=self._first))
        self._first = False
        return out

    def propose(self, context, k, params, generator):
        return self._timed(lambda: self.inner.propose(context, k, params, generator), context, k)

    def propose_tree(self, context, shape, k, params, generator):
        return self._timed(lambda: self.inner.propose_tree(context, shape, k, params, generator), context, k)

    def accept(self, n):
        self.inner.accept(n)

    def accept_path(self, path):
        self.inner.accept_path(path)


# -- training: many blocks per sequence in one pass -------------------------------------------------
def block_batch(lengths: list[int], anchors: list[list[int]], K: int, V: int) -> dict:
    """Lay out training blocks after right-padded sequences of ``lengths`` (padded to L = max).

    anchors[b]: positions a (< lengths[b]) that start a block; MASK_j (j = 1..K-1) of anchor a goes to
    position a + j and attends to the real tokens <= a and to MASK_1..MASK_j of its own block.
    Returns ``ids_tail [B, M]`` (mask ids, ``V`` in unused slots), ``positions [B, L + M]``,
    ``allowed [B, L + M, L + M]`` (bool), ``src [B, M]`` (the anchor's position, -1 unused) and
    ``offset [B, M]`` (j), with M = max anchors × (K - 1).
    """
    B, L, J = len(lengths), max(lengths), K - 1
    M = max((len(a) for a in anchors), default=0) * J
    T = L + M
    allowed = torch.zeros(B, T, T, dtype=torch.bool)
    allowed[:, :L, :L] = torch.ones(L, L, dtype=torch.bool).tril()
    positions = torch.arange(T).repeat(B, 1)
    ids_tail = torch.full((B, M), V, dtype=torch.long)
    src = torch.full((B, M), -1, dtype=torch.long)
    offset = torch.zeros((B, M), dtype=torch.long)
    idx = torch.arange(T)
    for b, anc in enumerate(anchors):
        for i, a in enumerate(anc):
            if not 0 <= a < lengths[b]:
                raise ValueError(f"anchor {a} outside sequence {b} of length {lengths[b]}")
            s = L + i * J  # first slot of this block
            rows = slice(s, s + J)
            allowed[b, rows, : a + 1] = True  # the real prefix x_0..x_a
            allowed[b, rows, s:s + J] = torch.ones(J, J, dtype=torch.bool).tril()  # earlier masks of the block
            positions[b, rows] = a + torch.arange(1, J + 1)
            ids_tail[b, i * J:(i + 1) * J] = V + torch.arange(J)
            src[b, i * J:(i + 1) * J] = a
            offset[b, i * J:(i + 1) * J] = torch.arange(1, J + 1)
        unused = idx[L + len(anc) * J:]
        allowed[b, unused, unused] = True  # idle slots see themselves only (no empty softmax rows)
    return dict(ids_tail=ids_tail, positions=positions, allowed=allowed, src=src, offset=offset)


def block_loss(model: BlockDraftModel, batch: dict, anchors: list[list[int]], K: int, loss_fn):
    """KD loss of one training batch: every real row (the autoregressive loss, offset 1) and every mask row.

    ``batch``: :func:`specdec_core.distill.collate` output (``input_ids``, ``t_slot``, ``t_logp``
    ``[B, L, k]``, row t = the teacher's law for token t + 1). MASK_j of anchor a is taught row a + j.
    ``loss_fn(sub_logits, t_slot, t_logp) -> (loss, n)`` (:func:`specdec_core.distill.kd_loss`).
    Returns ``(loss, n_positions, per_position)``: per_position ``[K + 1]`` counts the taught rows by block
    position (1: real rows, the next token; j + 1: MASK_j).
    """
    ids, t_slot, t_logp = batch["input_ids"], batch["t_slot"], batch["t_logp"]
    B, L = ids.shape
    lengths = batch["attention_mask"].sum(1).tolist()
    lay = block_batch(lengths, anchors, K, model.config.vocab_size)
    full = torch.cat([ids, lay["ids_tail"]], 1)
    dev = model.head.device
    bias = torch.zeros(lay["allowed"].shape, dtype=model.head.dtype).masked_fill_(
        ~lay["allowed"], torch.finfo(model.head.dtype).min)[:, None]
    h = model.hidden(full.to(dev), attention_mask=bias.to(dev), position_ids=lay["positions"].to(dev),
                     use_cache=False).last_hidden_state  # [B, L + M, H]
    # teacher rows: real row t -> t; mask (a, j) -> a + j (invalid beyond the sequence: slot -1)
    row = torch.cat([torch.arange(L).repeat(B, 1), lay["src"] + lay["offset"]], 1)
    ok = torch.cat([torch.arange(L).repeat(B, 1) < torch.tensor(lengths)[:, None],
                    (lay["src"] >= 0) & (lay["src"] + lay["offset"] < torch.tensor(lengths)[:, None])], 1)
    bi = torch.arange(B)[:, None].expand_as(row)
    slot = torch.where(ok[..., None], t_slot[bi, row.clamp_max(L - 1)], torch.full_like(t_slot[:1, :1], -1))
    logp = t_logp[bi, row.clamp_max(L - 1)]
    valid = (slot >= 0).any(-1)
    loss, n = loss_fn(model.sub_logits(h[valid.to(dev)])[None], slot[valid][None].to(dev), logp[valid][None].to(dev))
    pos = torch.cat([torch.zeros(B, L, dtype=torch.long), lay["offset"]], 1)[valid] + 1
    return loss, n, torch.bincount(pos, minlength=K + 1)
