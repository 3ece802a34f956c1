"""Adaptive speculation on top of the core's drafters: drafters that choose, step by step, between prompt lookup
and a draft model (:class:`HybridDrafter` by a fixed rule, :class:`ChoosingDrafter` from the acceptance it has seen),
whose confidence threshold is tuned by :mod:`specdec_core.study.calibrate` and stored with the draft
(:mod:`specdec_core.models.calibration`).

The draft-length half of adaptive speculation is in the core: ``generate(..., confidence=θ)`` lets a model or block
drafter stop drafting where its own law is unsure (:func:`specdec_core.sampling.confidence`), and a tree stop
growing below nodes the draft thinks unlikely; ``confidence="auto"`` reads the θ calibrated for the drafter.

Why these stay exact. Speculative sampling is lossless for *any* proposal law q, as long as q is exactly the law
the proposed token was drawn from and the choice of q (which drafter, how many tokens) is made before the target
sees the step: from the committed context and the draft's own draws, never from the target's verdict. The hybrid
decides from the context alone (does its last n-gram recur?), the chooser from the context and the verdicts of
*past* steps (already committed); a prompt-lookup proposal is deterministic given the
context, so its law is the one-hot on the proposed token, and the accept rule min(1, p(x)/q(x)) = p(x) with the
residual max(p − q, 0) ∝ p with x removed gives back p exactly.
"""
from __future__ import annotations

from ..drafters import Draft, Drafter, ModelDrafter, NGramDrafter

__all__ = ["ChoosingDrafter", "HybridDrafter"]


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

    def use_lookup(self, lookup: Draft, k: int) -> bool:
        """Whether lookup's proposal drafts this step (a function of the context only)."""
        return lookup.tokens.numel() >= min(self.min_match, k)

    def propose(self, context, k, params, generator, confidence=None) -> Draft:
        d = self.ngram.propose(context, k, params, generator)
        if self.use_lookup(d, k):
            self._last = self.ngram
        else:
            self._last = self.model
            d = self.model.propose(context, k, params, generator,
                                   **({} if confidence is None else {"confidence": confidence}))
        self.choices[self._last.name] += 1
        d.state["by"] = self._last  # who proposed it: accept hands the verdict to that drafter
        return d

    def accept(self, draft, n: int) -> None:
        draft.state["by"].accept(draft, n)


class ChoosingDrafter(HybridDrafter):
    """Prompt lookup or the draft model, step by step: whichever this sequence's past verdicts predict commits
    more tokens per unit of time.

    Each drafter counts its own verdicts in the current sequence: tokens accepted, a, and steps that ended in a
    rejection, r; its acceptance estimate is α̂ = (a + 1) / (a + r + 2) (Laplace's rule: ½ before any evidence,
    so each gets tried). A step drafting K tokens at acceptance α commits (1 − α^(K+1)) / (1 − α) tokens on
    average (Leviathan et al., Thm 3.8) for one verify pass, plus K draft passes of ``cost`` c each (the draft
    pass ÷ the target pass) for the model; lookup drafts for free. Where lookup matches (K_n tokens), it drafts
    if its expected tokens are at least the model's divided by (1 + K·c); elsewhere the model drafts.

    Exact for the hybrid's reason: the choice reads the context and the verdicts of *past* steps, all committed
    before this step's draft exists; the target never sees the step's tokens before the choice is made.
    """

    name = "adaptive"

    def __init__(self, ngram: NGramDrafter, model: ModelDrafter, cost: float = 0.1, min_match: int = 1):
        super().__init__(ngram, model, min_match)
        if not 0 <= cost < 10:
            raise ValueError(f"cost must be the draft pass's cost over the target pass's, in [0, 10), got {cost}")
        self.cost, self.counts = cost, {"ngram": [0, 0], "model": [0, 0]}

    def reset(self, prompt, capacity) -> None:
        super().reset(prompt, capacity)
        self.counts = {"ngram": [0, 0], "model": [0, 0]}

    def alpha(self, name: str) -> float:
        a, r = self.counts[name]
        return (a + 1) / (a + r + 2)

    @staticmethod
    def expected(alpha: float, k: int) -> float:
        return (1 - alpha ** (k + 1)) / (1 - alpha)

    def use_lookup(self, lookup: Draft, k: int) -> bool:
        kn = lookup.tokens.numel()
        model = self.expected(self.alpha("model"), k) / (1 + k * self.cost)
        return super().use_lookup(lookup, k) and kn > 0 and self.expected(self.alpha("ngram"), kn) >= model

    def accept(self, draft, n: int) -> None:
        super().accept(draft, n)
        c = self.counts[draft.state["by"].name]
        c[0], c[1] = c[0] + n, c[1] + (n < draft.tokens.numel())


def hybrid_of(drafters: dict) -> dict:
    """``{"hybrid": …, "adaptive": …}`` for a pair's drafters: prompt lookup over its model draft, by a fixed rule
    and by observed acceptance (empty without a model draft). The model draft's calibration, when it carries one
    (:mod:`~specdec_core.models.calibration`), gives the chooser its c; :func:`specdec_core.models.hub.load_pair`
    attaches their θ for ``confidence="auto"`` from it."""
    if "model" not in drafters or "ngram" not in drafters:
        return {}
    ngram, model = drafters["ngram"], drafters["model"]
    rec = getattr(model, "calibration", None)
    out = {"hybrid": HybridDrafter(ngram, model),
           "adaptive": ChoosingDrafter(ngram, model, cost=(rec or {}).get("cost", 0.1))}
    return out
