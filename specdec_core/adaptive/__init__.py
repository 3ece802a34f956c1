"""Adaptive speculation on top of the core's drafters: a hybrid drafter that chooses, step by step, between
prompt lookup and a draft model.

The draft-length half of adaptive speculation is in the core: ``generate(..., confidence=θ)`` lets a model or block
drafter stop drafting where its own law is unsure (:func:`specdec_core.sampling.confidence`).

Why these stay exact. Speculative sampling is lossless for *any* proposal law q, as long as q is exactly the law
the proposed token was drawn from and the choice of q (which drafter, how many tokens) is made before the target
sees the step: from the committed context and the draft's own draws, never from the target's verdict. The hybrid
decides from the context alone (does its last n-gram recur?); a prompt-lookup proposal is deterministic given the
context, so its law is the one-hot on the proposed token, and the accept rule min(1, p(x)/q(x)) = p(x) with the
residual max(p − q, 0) ∝ p with x removed gives back p exactly.
"""
from __future__ import annotations

import torch

from ..drafters import Draft, Drafter, ModelDrafter, NGramDrafter

__all__ = ["HybridDrafter"]


class HybridDrafter(Drafter):
    """Prompt lookup where the context holds a match of at least ``min_match`` tokens, else the draft model.

    ``ngram`` proposes only when its lookup finds a continuation (a context-only test); otherwise ``model``
    proposes, with the step's confidence threshold if one is set. ``choices`` counts how often each was used in
    the current sequence. The model's cache catches up on the tokens it did not see by itself (its proposals feed
    every unseen committed token first), so switching costs nothing beyond that catch-up pass.
    """

    name = "hybrid"

    def __init__(self, ngram: NGramDrafter, model: ModelDrafter, min_match: int = 1):
        if min_match < 1:
            raise ValueError(f"min_match must be >= 1 token, got {min_match}")
        self.ngram, self.model, self.min_match = ngram, model, min_match
        self.vocab_size = model.vocab_size
        self.choices = {"ngram": 0, "model": 0}
        self._last: Drafter | None = None

    def bind(self, target) -> None:
        self.ngram.bind(target)
        self.model.bind(target)

    def reset(self, prompt, capacity) -> None:
        self.ngram.reset(prompt, capacity)
        self.model.reset(prompt, capacity)
        self.choices = {"ngram": 0, "model": 0}
        self._last = None

    def propose(self, context, k, params, generator, confidence=None) -> Draft:
        d = self.ngram.propose(context, k, params, generator)
        if d.tokens.numel() >= min(self.min_match, k):
            self._last = self.ngram
        else:
            self._last = self.model
            d = self.model.propose(context, k, params, generator,
                                   **({} if confidence is None else {"confidence": confidence}))
        self.choices[self._last.name] += 1
        return d

    def accept(self, n: int) -> None:
        if self._last is None:
            raise RuntimeError("accept() before propose(): the loop calls them in turn")
        self._last.accept(n)


def hybrid_of(drafters: dict) -> HybridDrafter | None:
    """``drafters["hybrid"]`` for a pair's drafters: prompt lookup over its model draft (None without one)."""
    if "model" not in drafters or "ngram" not in drafters:
        return None
    return HybridDrafter(drafters["ngram"], drafters["model"])

