"""``DraftModel``: a small draft LM that shares the target's token embedding and (tied) LM head.

    draft = DraftModel.from_target(target, layers=[0, 29], vocab=ids)   # a fresh draft
    draft = load_draft(folder, target)                                  # a saved one
    drafter = ModelDrafter(draft)                                       # plugs in unchanged

Architecture (for a Llama target with tied embeddings, e.g. SmolLM2-135M-Instruct)::

    ids [B, T] ─ target embedding (shared, frozen) ─► trunk: n Llama decoder layers + final RMSNorm
        (a transformers ``LlamaModel`` called through its public forward with ``inputs_embeds``)
        ─► h [B, T, H] ─ sub-head W[vocab] (rows of the tied embedding, frozen) ─► logits [B, T, N]

The draft predicts only the N tokens of its *draft vocabulary* ``vocab`` (the most frequent tokens of
the target's own outputs). :meth:`DraftModel.forward` scatters them into a full-vocabulary row with
``-inf`` elsewhere, so the draft law q is exactly 0 outside ``vocab`` and speculative decoding stays
lossless (a token the draft cannot propose is simply never proposed).

On disk (:func:`save_draft`): ``config.json`` and ``model.safetensors`` holding only the trunk
(layers + norm, float16) and ``draft_vocab`` (int64 ``[N]``); the embedding and head come from the
target at load time and are shared in memory, not copied.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from . import draft_step

FORMAT = "specdec-draft-v1"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
STORE_DTYPE = torch.float16  # trunk weights on disk (halves the file; loaded in the target's dtype)


def _trunk_config(target_config, n_layers: int) -> LlamaConfig:
    cfg = copy.deepcopy(target_config.get_text_config())
    if cfg.model_type != "llama":
        raise ValueError(f"DraftModel needs a Llama target, got model_type={cfg.model_type!r}")
    cfg.num_hidden_layers = int(n_layers)
    return cfg


class DraftModel(nn.Module):
    """n Llama layers between the target's frozen embedding and a frozen sub-head of its tied LM head.

    ``config``: a ``LlamaConfig`` with the target's full ``vocab_size`` and ``num_hidden_layers = n``
    (what :class:`~specdec_core.kvcache.KVCache` reads). ``vocab``: LongTensor ``[N]`` of token ids,
    ascending. The embedding is held by reference (not a submodule: ``.to()``, ``state_dict()`` and
    ``parameters()`` never touch the target's weights).
    """

    def __init__(self, config: LlamaConfig, embedding: nn.Embedding, vocab: torch.Tensor):
        super().__init__()
        vocab = torch.as_tensor(vocab, dtype=torch.long).flatten()
        V = config.vocab_size
        if vocab.numel() == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= V:
            raise ValueError(f"draft vocabulary must be non-empty ids in [0, {V})")
        if not bool((vocab[1:] > vocab[:-1]).all()):
            raise ValueError("draft vocabulary ids must be strictly ascending (no duplicates)")
        if embedding.weight.shape != (V, config.hidden_size):
            raise ValueError(f"embedding of shape {tuple(embedding.weight.shape)} does not match "
                             f"vocab_size={V}, hidden_size={config.hidden_size}")
        self.config = config
        trunk_cfg = copy.deepcopy(config)
        trunk_cfg.vocab_size, trunk_cfg.pad_token_id = 1, None  # its own embedding is never used
        self.trunk = LlamaModel(trunk_cfg)
        self.trunk.embed_tokens = None  # inputs arrive as inputs_embeds from the shared embedding
        object.__setattr__(self, "embedding", embedding)  # shared by reference, not registered
        self.register_buffer("vocab", vocab, persistent=False)
        # rows of the tied embedding = the target's LM head restricted to the draft vocabulary [N, H]
        self.register_buffer("head", embedding.weight.detach()[vocab].clone(), persistent=False)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_target(cls, target, layers: list[int], vocab: torch.Tensor) -> "DraftModel":
        """A draft whose trunk layers are copies of ``target`` layers ``layers`` and whose final norm
        is the target's; embedding and head are the target's (shared)."""
        cfg = _trunk_config(target.config, len(layers))
        _check_tied(target)
        draft = cls(cfg, target.get_input_embeddings(), vocab)
        src = target.model
        with torch.no_grad():
            for i, l in enumerate(layers):
                draft.trunk.layers[i].load_state_dict(src.layers[l].state_dict())
            draft.trunk.norm.load_state_dict(src.norm.state_dict())
        p = next(target.parameters())
        return draft.to(device=p.device, dtype=p.dtype)

    @property
    def draft_vocab_size(self) -> int:
        return self.vocab.numel()

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What :func:`save_draft` writes: the trunk's layers and norm (no embedding, no head)."""
        return {f"trunk.{k}": v for k, v in self.trunk.state_dict().items()}

    # -- forward --------------------------------------------------------------------------------
    def hidden(self, input_ids: torch.Tensor, **trunk_kwargs):
        """Trunk output: ``BaseModelOutputWithPast`` with ``last_hidden_state [B, T, H]`` (normed)."""
        return self.run_trunk(self.embedding(input_ids).to(self.head.dtype), **trunk_kwargs)

    def run_trunk(self, emb: torch.Tensor, **trunk_kwargs):
        """The trunk over embeddings ``emb [B, T, H]``: :func:`~specdec_core.models.draft_step.trunk` where it applies
        (a decoding pass on the kernel's path: the same bits in a few operations), else the module's forward."""
        out = draft_step.trunk(self, emb, **trunk_kwargs)
        return self.trunk(inputs_embeds=emb, **trunk_kwargs) if out is None else out

    def sub_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[..., H]`` → logits over the draft vocabulary ``[..., N]`` (in one kernel call on the
        kernel's path, :func:`~specdec_core.models.draft_step.head`)."""
        out = draft_step.head(self, h)
        return h @ self.head.T if out is None else out

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                cache_position=None, use_cache=None, logits_to_keep=0, output_hidden_states=None,
                full_vocab: bool = True, **kwargs) -> CausalLMOutputWithPast:
        """The causal-LM forward ``CachedLM`` calls. ``input_ids [B, T]`` → ``logits [B, T', V]`` (full
        vocabulary, ``-inf`` outside the draft vocabulary; ``T' = logits_to_keep`` if it is > 0), or
        ``[B, T', N]`` with ``full_vocab=False`` (training)."""
        out = self.hidden(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=past_key_values, cache_position=cache_position,
                          use_cache=use_cache, output_hidden_states=output_hidden_states, **kwargs)
        h = out.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            h = h[:, -logits_to_keep:]
        sub = self.sub_logits(h)
        if full_vocab:
            logits = sub.new_full((*sub.shape[:-1], self.config.vocab_size), float("-inf"))
            logits.index_copy_(-1, self.vocab, sub)
        else:
            logits = sub
        return CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values,
                                      hidden_states=out.hidden_states)


def _check_tied(target) -> None:
    head, emb = target.get_output_embeddings(), target.get_input_embeddings()
    if head is None or head.weight.data_ptr() != emb.weight.data_ptr():
        raise ValueError("DraftModel reuses the target's tied embedding as its head: the target's LM head "
                         "must be tied to its input embedding")


# -- files ----------------------------------------------------------------------------------------
def save_draft(draft: DraftModel, folder: str | Path, meta: dict | None = None) -> Path:
    """Write ``config.json`` (architecture + ``meta``) and ``model.safetensors`` (trunk in float16 +
    ``draft_vocab``). Returns the weights path."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", STORE_DTYPE).contiguous() for k, v in draft.trainable_state().items()}
    tensors["draft_vocab"] = draft.vocab.detach().cpu().contiguous()
    path = folder / WEIGHTS
    save_file(tensors, str(path), metadata={"format": FORMAT})
    cfg = {"format": FORMAT, "num_hidden_layers": draft.config.num_hidden_layers,
           "draft_vocab_size": draft.draft_vocab_size, "hidden_size": draft.config.hidden_size,
           "target_vocab_size": draft.config.vocab_size, "store_dtype": str(STORE_DTYPE).removeprefix("torch.")}
    cfg.update(meta or {})
    (folder / CONFIG).write_text(json.dumps(cfg, indent=1) + "\n")
    return path


def load_draft(folder: str | Path, target, dtype=None, device=None) -> DraftModel:
    """Build the draft saved in ``folder`` on top of ``target`` (its embedding and head are shared).

    Loads in the target's dtype/device unless given. Raises ``ValueError`` if the files do not fit
    the target. Checksums are the caller's job (see :mod:`specdec_core.models.shipped`).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = json.loads((folder / CONFIG).read_text())
    if cfg.get("format") != FORMAT:
        raise ValueError(f"{folder / CONFIG}: format {cfg.get('format')!r} is not {FORMAT!r}")
    tcfg = target.config.get_text_config()
    for key, want in (("hidden_size", tcfg.hidden_size), ("target_vocab_size", tcfg.vocab_size)):
        if cfg[key] != want:
            raise ValueError(f"{folder}: draft has {key}={cfg[key]}, the target has {want}")
    tensors = load_file(str(folder / WEIGHTS))
    vocab = tensors.pop("draft_vocab")
    draft = DraftModel(_trunk_config(target.config, cfg["num_hidden_layers"]), target.get_input_embeddings(),
                       vocab)
    _check_tied(target)
    state = {k.removeprefix("trunk."): v for k, v in tensors.items()}
    draft.trunk.load_state_dict(state, strict=True)
    p = next(target.parameters())
    draft = draft.to(device=device or p.device, dtype=dtype or p.dtype)
    # the head must be re-read in the final dtype from the (shared) embedding, not up-cast from a copy
    draft.head = draft.embedding.weight.detach()[draft.vocab].to(draft.head.dtype).clone()
    return draft.eval().requires_grad_(False)
