"""``CachedLM``: a transformers causal LM bound to its preallocated :class:`~specdec_core.kvcache.KVCache`.

Only the model's public forward is used: ``input_ids``, ``position_ids``, ``cache_position``,
``past_key_values`` and, for trees, a 4D additive ``attention_mask``.
"""
from __future__ import annotations

import torch

from .kvcache import KVCache


class CachedLM:
    """One sequence decoded by ``model``; a pass appends to :attr:`cache` and, by default, commits.

    Attributes: ``model``, ``cache`` (:class:`KVCache`), ``device``, ``dtype``.
    """

    def __init__(self, model, capacity: int):
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache = KVCache(model.config, capacity, p.dtype, p.device)

    @property
    def length(self) -> int:
        return self.cache.length

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                last_only: bool = False, hidden: bool = False, commit: bool | int = True, keep_last: int = 0,
                **model_kwargs):
        """Run ``tokens [T]`` at cache slots ``[length, length + T)``.

        positions: ``[T]`` rotary positions (default: the slots themselves; trees pass depths).
        mask: optional 4D additive mask ``[1, 1, T, length + T]`` (0 = attend, dtype-min = blocked).
        commit: ``True`` commits the T entries, ``False`` none (a pass that leaves the cache as it was:
        the entries lie past ``length``, never read, overwritten next time), an int n the first n.
        keep_last: logits of the last n rows only (``last_only`` = 1; 0 = all); ``model_kwargs`` go to the
        model's forward (the block draft's ``full_vocab``). Returns logits ``[T, V]`` (or the last rows);
        with ``hidden=True`` also the final normalized hidden states ``[T, H]``.
        """
        T = tokens.numel()
        start = self.cache.length
        if start + T > self.cache.capacity:
            raise ValueError(f"sequence of {start + T} tokens does not fit the KV cache of {self.cache.capacity} "
                             "positions")
        ids = tokens.to(self.device).view(1, T)
        cache_position = torch.arange(start, start + T, device=self.device)
        pos = cache_position if positions is None else positions.to(self.device)
        out = self.model(input_ids=ids, position_ids=pos.view(1, T), cache_position=cache_position, attention_mask=mask,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1 if last_only else keep_last,
                         output_hidden_states=hidden, **model_kwargs)
        self.cache.advance(T if commit is True else int(commit))
        if hidden:
            return out.logits[0], out.hidden_states[-1][0]
        return out.logits[0]
