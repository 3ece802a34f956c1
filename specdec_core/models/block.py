"""The block draft model behind parallel drafting (PARD-style mask tokens); the drafter is
:class:`specdec_core.drafters.BlockDrafter`, its training :mod:`specdec_core.train.block`.

The draft is a :class:`~specdec_core.models.draft.DraftModel` whose input vocabulary is extended by
``max_block - 1`` *mask ids* ``V, V+1, …`` (one learned embedding per block offset). One pass over

    [ unseen committed tokens …, last token, MASK_1, …, MASK_{K-1} ]    (plain causal attention)

gives K next-token laws: the last token's row predicts x_1 (exactly an autoregressive draft's first
token), MASK_j's row predicts x_{j+1}.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .draft import DraftModel, load_draft, save_draft

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
                w = draft.embedding.weight.detach().to("cpu", torch.float64)  # the seeded noise is drawn on CPU
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
        return self.run_trunk(self.embed(input_ids), **trunk_kwargs)


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


def untrained_block(target, seed: int = 0, max_block: int = 8, noise: float = 0.15) -> BlockDraftModel:
    """A deterministic untrained block draft model for a (toy) Llama target, for exactness tests: the
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
    return BlockDraftModel.from_draft(base, max_block, seed=seed).eval().requires_grad_(False)
