"""Drafters: anything that proposes K tokens together with the exact laws q they were drawn from.

Interface (the loop in :mod:`specdec_core.linear` is its only caller):

- ``bind(target)``: check the drafter fits the target (same vocabulary) before decoding.
- ``reset(prompt, capacity)``: start a new sequence.
- ``propose(context, k, params, generator) -> Draft``: ``context`` is every token so far (prompt and
  generated, the last one not yet seen by the target). Returns up to ``k`` tokens and ``q [k', V]``
  (``None`` when greedy: the greedy verifier needs only tokens).
- ``accept(n)``: the verifier kept ``n`` of the proposed tokens; roll internal state back to
  ``context + draft[:n]`` (O(1) for cached drafters).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .lm import CachedLM
from .sampling import PROB_DTYPE, SamplingParams, choose


@dataclass
class Draft:
    tokens: torch.Tensor  # [k'] LongTensor
    q: torch.Tensor | None  # [k', V] float64 (None when greedy)
    passes: int  # draft forward passes spent


class Drafter:
    name = "drafter"
    vocab_size: int | None = None

    def bind(self, target) -> None:
        """Refuse a target whose vocabulary differs from the drafter's (tokenizer mismatch)."""
        vt = target.config.get_text_config().vocab_size
        if self.vocab_size is not None and self.vocab_size != vt:
            raise ValueError(
                f"tokenizer mismatch: {self.name} drafter has a vocabulary of {self.vocab_size}, target has {vt}"
            )

    def reset(self, prompt: torch.Tensor, capacity: int) -> None:
        pass

    def propose(self, context: list[int], k: int, params: SamplingParams, generator) -> Draft:
        raise NotImplementedError

    def accept(self, n: int) -> None:
        pass


class ModelDrafter(Drafter):
    """An autoregressive draft model (any causal LM with the target's vocabulary): K passes per draft.

    Keeps its own preallocated :class:`KVCache`; tokens the cache has not seen yet (the last committed
    ones) are fed in one pass at the start of the next proposal.
    """

    name = "model"

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.config.get_text_config().vocab_size
        self.lm: CachedLM | None = None
        self._base = 0

    def reset(self, prompt, capacity):
        if self.lm is None or self.lm.cache.capacity < capacity:
            self.lm = CachedLM(self.model, capacity)
        self.lm.cache.length = 0

    def propose(self, context, k, params, generator):
        lm = self.lm
        self._base = len(context)
        unseen = torch.tensor(context[lm.length:], dtype=torch.long)
        logits = lm.forward(unseen, last_only=True)[-1]
        tokens, qs = [], []
        for i in range(k):
            t, q = choose(logits, params, generator)
            tokens.append(t)
            qs.append(q)
            if i + 1 < k:
                logits = lm.forward(torch.tensor([t]), last_only=True)[-1]
        q = None if params.greedy else torch.stack(qs)
        return Draft(torch.tensor(tokens, dtype=torch.long), q, passes=k)

    def accept(self, n):
        keep = self._base + n
        if self.lm.length > keep:
            self.lm.cache.rollback(self.lm.length - keep)


class NGramDrafter(Drafter):
    """Prompt lookup (training-free): find the latest earlier occurrence of the context's last n-gram
    (n from ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed it.

    Deterministic: q is one-hot on each proposed token, and verification stays lossless.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def bind(self, target):  # works with any vocabulary; q needs its size
        self.vocab_size = target.config.get_text_config().vocab_size

    def lookup(self, context: list[int], k: int) -> list[int]:
        L = len(context)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            tail = context[L - n:]
            for start in range(L - n - 1, -1, -1):  # latest match first, not the suffix itself
                if context[start:start + n] == tail:
                    return context[start + n:start + n + k]
        return []

    def propose(self, context, k, params, generator):
        toks = torch.tensor(self.lookup(context, k), dtype=torch.long)
        q = None
        if not params.greedy:
            q = torch.zeros(toks.numel(), self.vocab_size, dtype=PROB_DTYPE)
            q[torch.arange(toks.numel()), toks] = 1.0
        return Draft(toks, q, passes=0)
