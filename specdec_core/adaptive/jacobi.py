"""Jacobi refinement as a drafter: the fifth pattern of parallel decoding (beside speculation, trees, multi-token
heads and batching), non-autoregressive refinement, needing no model."""
from __future__ import annotations

import torch

from ..drafters import Draft, Drafter, NGramDrafter
from ..sampling import OneHotLaws

__all__ = ["JacobiDrafter"]


class JacobiDrafter(Drafter):
    """Jacobi refinement as a drafter: non-autoregressive decoding (Santilli et al. 2023) with the pool of lookahead
    decoding (Fu et al. 2024), needing no model.

    Jacobi decoding guesses a block of tokens and runs the target on all of them at once. Position i's output is the
    target's next token given the guess before it. Where the guess was right, that output is final, so the block's
    right prefix grows by at least one token a pass. The outputs after the first wrong guess came from a wrong
    prefix, but they are the next iterate of this fixed-point iteration, and often right further on.

    Here the verify pass *is* that run. After each step (:meth:`accept`, which reads the pass's logits in
    ``draft.state["seen"]``: ``reads_verify``):

    - the target's greedy outputs past the first rejection become the next guess (the iterate);
    - each output goes into a pool under the token it followed in the pass: the target's latest word on what comes
      after that token, even where the prefix before it was wrong (lookahead decoding keeps its trajectories'
      n-grams for the same reason).

    A proposal follows the pool from the context's last token, one token at a time, and takes the iterate's token
    where the pool knows nothing. Then prompt lookup; then the last token repeated, Jacobi's own first guess.

    Deterministic: q is one-hot on each token proposed, and the verifier stays lossless. The proposal depends only on
    the context and on earlier steps' verify passes, never on this step's. Where the caller shows no verify pass
    (the serving engine), nothing is learned: it proposes by prompt lookup, then the repeated last token.
    """

    name = "jacobi"
    reads_verify = True

    def __init__(self):
        self.lookup = NGramDrafter()
        self.reset(None, 0)

    def bind(self, target):
        self.vocab_size = target.config.get_text_config().vocab_size
        self.lookup.bind(target)

    def reset(self, prompt, capacity):
        self.iterate: list[int] = []  # the next guess, from the last verify pass
        self.at = -1  # the context length the iterate continues
        self.pool: dict[int, int] = {}  # token -> the target's latest output after it

    def guess(self, context: list[int], k: int) -> list[int]:
        """``k`` tokens after ``context`` (the class docstring)."""
        iterate = self.iterate if len(context) == self.at else []
        out: list[int] = []
        for j in range(k):
            last = out[-1] if out else context[-1]
            if last in self.pool:
                out.append(self.pool[last])
            elif j < len(iterate):
                out.append(iterate[j])
            else:
                break
        if len(out) < k:
            out += self.lookup.lookup(context + out, k - len(out))
        return out + [(context + out)[-1]] * (k - len(out))

    def propose(self, context, k, params, generator, confidence=None):  # q one-hot: confidence 1, never stops
        toks = torch.tensor(self.guess(list(context), k), dtype=torch.long)
        return Draft(toks, None if params.greedy else OneHotLaws(toks, self.vocab_size), passes=0,
                     state={"base": len(context), "last": context[-1]})

    def accept(self, draft, n):
        logits = draft.state.get("seen")
        if logits is None:  # a caller that does not show the verify pass (the serving engine)
            return
        out = logits.argmax(-1).tolist()  # the target's greedy output after the context and draft[:i], i = 0..k'
        for token, after in zip([draft.state["last"]] + draft.tokens.tolist(), out):
            self.pool[token] = after
        self.iterate, self.at = out[n + 1:], draft.state["base"] + n + 1
