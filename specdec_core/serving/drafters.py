"""Draft models that propose for every row of the engine's batch at once.

The engine (:class:`~specdec_core.serving.engine.Engine`) drafts each request with that request's own drafter (a
fork of the one it was given), except where requests share a draft *model* of a kind in :data:`BATCHED`: one
:class:`RowDrafts` then holds every such request's draft cache, one row per engine row (cleared when a request takes
the row, moved when the engine condenses its rows), and runs the draft passes of all its rows together: an
autoregressive draft costs K passes a step for the whole batch instead of K per request, a block draft one pass.
Each request holds a :class:`RowDraft`, the drafter its phases see: its proposals come from the shared
:class:`RowDrafts` (the engine asks for every row at once), and its ``accept`` rolls its own row back there.

Exactness: each row draws from its own generator, with its own sampling parameters, in exactly the order the
single-sequence drafter would, and reads only its own context and cache row: a row's draft never depends on its
neighbours (the batch shares passes, not decisions). The type must match exactly: a subclass (a mutant, a drafter
with a ``propose`` of its own) is drafted alone, by its own code, never replaced by the plain batched form.
"""
from __future__ import annotations

import torch

from ..drafters import BlockDrafter, Draft, Drafter, ModelDrafter
from ..lm import CachedLM
from ..sampling import choose, sample
from .cache import BatchLM


class RowDraft(Drafter):
    """A request's drafter when its draft model runs batched (:class:`RowDrafts`, which the engine binds to it for
    a run): it never proposes alone, and ``accept`` keeps its row's context and accepted tokens."""

    def __init__(self, base: Drafter):
        self.base, self.name, self.vocab_size = base, base.name, base.vocab_size
        self.rows: RowDrafts | None = None  # bound by the engine's run

    def held(self) -> dict[str, Drafter]:
        return {}  # the base drafter is the group's key, never driven by this request

    def propose(self, context, k, params, generator, confidence=None):
        raise RuntimeError(f"a batched {self.name} draft proposes for every row at once (RowDrafts.propose, called "
                           "by the engine's step), never for one request alone")

    def accept(self, draft, n):
        self.rows.truncate(draft.state["row"], draft.state["base"] + n)


class RowDrafts:
    """One draft model's cache over the engine's rows (``batch`` of them, ``capacity`` positions each) and its
    batched proposals. ``drafter``: the :data:`BATCHED` drafter the requests were given (its model)."""

    model_kwargs: dict = {}  # what the draft model's forward takes besides the ids (the block draft's full_vocab)

    def __init__(self, drafter: Drafter, batch: int, capacity: int, step_mode: str = "eager"):
        self.drafter = drafter
        self.extra = getattr(drafter, "max_block", 0)  # a block's masks are written past the committed entries
        self.lm = BatchLM(drafter.model, batch, capacity + self.extra, step_mode)
        self.capacity = capacity + self.extra
        self.one = CachedLM(drafter.model, self.capacity)  # a new request's catch-up pass, alone

    # -- rows, as the engine moves them ------------------------------------------------------------------------
    def clear(self, row: int) -> None:
        """A new request took ``row``: its draft cache is empty (its first proposal feeds its context)."""
        self.lm.cache.place(row, None, 0)

    def move(self, src: int, dst: int) -> None:
        self.lm.cache.move(src, dst)

    def truncate(self, row: int, n: int) -> None:
        """Row ``row`` keeps its first ``n`` entries (its context and accepted drafts); O(1), a pointer move."""
        cache = self.lm.cache
        cache.rollback_row(row, max(int(cache.lengths[row] - cache.starts[row]) - n, 0))

    # -- proposals --------------------------------------------------------------------------------------------
    def _unseen(self, n_live: int, asks: dict) -> list[list[int]]:
        """Each live row's tokens its cache has not seen (empty for a row that does not draft). A row that has seen
        nothing yet (a new request) first has all but its last context token prefilled alone (one single-sequence
        pass) and copied into its row: a prompt never pads the whole batch's pass."""
        cache = self.lm.cache
        cache.live(n_live)
        unseen = [[] for _ in range(n_live)]
        for r, (context, *_) in asks.items():
            seen = int(cache.lengths[r] - cache.starts[r])
            u = context[seen:]
            if seen == 0 and len(u) > 1:
                one = self.one
                one.cache.reset()
                one.forward(torch.tensor(u[:-1], dtype=torch.long), logits_to_keep=1, **self.model_kwargs)
                cache.place(r, one.cache, len(u) - 1)
                u = u[-1:]
            unseen[r] = u
        return unseen

    def propose(self, n_live: int, asks: dict[int, tuple]) -> dict[int, Draft]:
        """``asks``: row → (context, k, params, generator) for the rows that draft this step (k >= 1), of the
        ``n_live`` live rows. Returns each asking row's :class:`~specdec_core.drafters.Draft`, whose ``state``
        names its row and base (``len(context)``)."""
        raise NotImplementedError


class ModelRows(RowDrafts):
    """An autoregressive draft model over the rows: one pass per draft position for all of them."""

    def propose(self, n_live, asks):
        unseen = self._unseen(n_live, asks)
        raw = self.lm.forward(unseen, commit=[len(u) for u in unseen])
        logits = raw[torch.arange(n_live), torch.tensor([max(len(u), 1) - 1 for u in unseen])]
        tokens, laws = {r: [] for r in asks}, {r: [] for r in asks}
        for i in range(max(k for _, k, *_ in asks.values())):
            for r, (_, k, params, generator) in asks.items():
                if i < k:
                    t, q = choose(logits[r], params, generator)
                    tokens[r].append(t)
                    laws[r].append(q)
            feed = [[tokens[r][-1]] if r in asks and i + 1 < asks[r][1] else [] for r in range(n_live)]
            if any(feed):
                logits = self.lm.forward(feed, commit=[len(f) for f in feed])[:, 0]
        return {r: Draft(torch.tensor(tokens[r], dtype=torch.long),
                         None if params.greedy else torch.stack(laws[r]), len(tokens[r]),
                         state={"base": len(context), "row": r})
                for r, (context, _, params, _) in asks.items()}


class BlockRows(RowDrafts):
    """The block draft over the rows: each row's K tokens from one pass (K − 1 masks after each row's unseen
    tokens). Row r uses the first ``k_r`` laws: causal attention makes them independent of the masks after them,
    so they are the laws the single-sequence drafter computes."""

    model_kwargs = {"full_vocab": False}

    def propose(self, n_live, asks):
        drafter = self.drafter
        k = min(max(k for _, k, *_ in asks.values()), drafter.max_block)
        unseen = self._unseen(n_live, asks)
        masks = drafter.mask_ids(k - 1)
        raw = self.lm.forward([u + masks if u else [] for u in unseen], commit=[len(u) for u in unseen],
                              **self.model_kwargs)
        out = {}
        for r, (context, kr, params, generator) in asks.items():
            kr = min(kr, drafter.max_block)
            sub = raw[r, len(unseen[r]) - 1:len(unseen[r]) - 1 + kr]
            if params.greedy:
                tokens, q = drafter.model.vocab[sub.argmax(-1)].cpu(), None
            else:
                q_sub, q = drafter._laws(sub, params)
                tokens = drafter.model.vocab[sample(q_sub, generator)].cpu()
            out[r] = Draft(tokens, q, 1, state={"base": len(context), "row": r})
        return out


# the drafters whose requests the engine drafts together, by exact type (a subclass drafts alone, by its own code)
BATCHED: dict[type, type[RowDrafts]] = {ModelDrafter: ModelRows, BlockDrafter: BlockRows}
