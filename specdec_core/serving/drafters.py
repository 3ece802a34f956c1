"""The core's drafters, proposing for every row of a batch at once.

``propose(contexts, ks, params, generators)`` returns one :class:`~specdec_core.drafters.Draft` per row (``ks[r]``
tokens; 0 for a row that is done) and ``accept(ns)`` keeps ``ns[r]`` of row r's. Each row draws from its own
generator in exactly the order the single-sequence drafter would, and reads only its own context: a row's
draft never depends on its neighbours (the batch shares passes, not decisions).
"""
from __future__ import annotations

import torch

from ..drafters import BlockDrafter, Draft, ModelDrafter, NGramDrafter
from ..sampling import choose, sample
from .cache import BatchLM


class BatchNGram:
    """Prompt lookup per row: no model, nothing to batch."""

    def __init__(self, drafter: NGramDrafter, target, batch: int, capacity: int, step_mode: str = "eager"):
        self.drafter = drafter

    def propose(self, contexts, ks, params, generators):
        return [self.drafter.propose(c, k, params, g) for c, k, g in zip(contexts, ks, generators)]

    def accept(self, ns):
        pass


class BatchDraftCache:
    """A batched draft model's cache bookkeeping: what each row's draft has seen, and rolling back to it."""

    lm: BatchLM
    base: list[int]  # set by propose: row r's context length, the entries accept keeps before the drafted ones

    def seen(self) -> list[int]:
        return (self.lm.cache.lengths - self.lm.cache.starts).tolist()

    def unseen(self, contexts) -> list[list[int]]:
        return [c[s:] for c, s in zip(contexts, self.seen())]

    def accept(self, ns):
        """Row r keeps its context and ``ns[r]`` drafted tokens (O(1) per row)."""
        keep = torch.tensor([b + n for b, n in zip(self.base, ns)], device=self.lm.device)
        have = self.lm.cache.lengths - self.lm.cache.starts
        self.lm.cache.rollback((have - keep).clamp_min(0))


class BatchModel(BatchDraftCache):
    """An autoregressive draft model over the batch: one pass per draft position for all rows."""

    def __init__(self, drafter: ModelDrafter, target, batch: int, capacity: int, step_mode: str = "eager"):
        self.lm = BatchLM(drafter.model, batch, capacity, step_mode)
        self.fresh = True

    def propose(self, contexts, ks, params, generators):
        self.base = [len(c) for c in contexts]
        unseen = self.unseen(contexts)
        if self.fresh:
            logits = self.lm.prefill(unseen)[:, -1]
            self.fresh = False
        else:
            raw = self.lm.forward(unseen, commit=[len(u) for u in unseen])
            logits = raw[torch.arange(len(unseen)), torch.tensor([max(len(u), 1) - 1 for u in unseen])]
        tokens, laws = [[] for _ in ks], [[] for _ in ks]
        for i in range(max(ks, default=0)):
            for r, k in enumerate(ks):
                if i < k:
                    t, q = choose(logits[r], params, generators[r])
                    tokens[r].append(t)
                    laws[r].append(q)
            feed = [[tokens[r][-1]] if i + 1 < k else [] for r, k in enumerate(ks)]
            if any(feed):
                logits = self.lm.forward(feed, commit=[len(f) for f in feed])[:, 0]
        return [Draft(torch.tensor(t, dtype=torch.long), None if params.greedy or not t else torch.stack(q), len(t))
                for t, q in zip(tokens, laws)]


class BatchBlock(BatchDraftCache):
    """The block draft over the batch: every row's K tokens from one pass (K − 1 masks after each row's
    unseen tokens). Row r uses the first ``ks[r]`` laws: causal attention makes them independent of the
    masks after them, so they are the laws the single-sequence drafter would compute."""

    def __init__(self, drafter: BlockDrafter, target, batch: int, capacity: int, step_mode: str = "eager"):
        self.drafter = drafter
        self.lm = BatchLM(drafter.model, batch, capacity + drafter.max_block, step_mode)  # masks go past the rows
        self.fresh = True

    def propose(self, contexts, ks, params, generators):
        self.base = [len(c) for c in contexts]
        k = min(max(ks, default=0), self.drafter.max_block)
        if k == 0:
            return [Draft(torch.zeros(0, dtype=torch.long), None, 0) for _ in ks]
        unseen = self.unseen(contexts)
        masks = self.drafter.mask_ids(k - 1)
        if self.fresh:
            sub = self.lm.prefill([u + masks for u in unseen], logits_to_keep=k, uncommitted_tail=k - 1, full_vocab=False)
            self.fresh = False
        else:
            rows = [u + masks if u else [] for u in unseen]
            raw = self.lm.forward(rows, commit=[len(u) for u in unseen], full_vocab=False)
            sub = torch.stack([raw[r, len(u) - 1:len(u) - 1 + k] if u else raw[r, :k] for r, u in enumerate(unseen)])
        vocab = self.drafter.model.vocab
        out = []
        for r, kr in enumerate(ks):
            kr = min(kr, self.drafter.max_block)
            if kr == 0:
                out.append(Draft(torch.zeros(0, dtype=torch.long), None, 0))
            elif params.greedy:
                out.append(Draft(vocab[sub[r, :kr].argmax(-1)].cpu(), None, 1))
            else:
                q_sub, q = self.drafter._laws(sub[r, :kr], params)
                out.append(Draft(vocab[sample(q_sub, generators[r])].cpu(), q, 1))
        return out


def batched(drafter, target, batch: int, capacity: int, step_mode: str = "eager"):
    """The batched form of a core drafter; ``step_mode``: how its passes after the prefill run
    (:mod:`specdec_core.graphs`)."""
    for kind, cls in ((BlockDrafter, BatchBlock), (ModelDrafter, BatchModel), (NGramDrafter, BatchNGram)):
        if isinstance(drafter, kind):
            return cls(drafter, target, batch, capacity, step_mode)
    raise ValueError(f"generate_batch has no batched form of {type(drafter).__name__} (model, n-gram and block drafters)")
