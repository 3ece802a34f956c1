"""Drafters: anything that proposes K tokens together with the exact laws q they were drawn from.

Interface (the draft and commit phases of :mod:`specdec_core.loop` are its only callers):

- ``bind(target)``: check the drafter fits the target (same vocabulary) before decoding.
- ``reset(prompt, capacity)``: start a new sequence.
- ``propose(context, k, params, generator, confidence=None) -> Draft``: ``context`` is every token so far (prompt
  and generated, the last one not yet seen by the target). Returns up to ``k`` tokens and ``q [k', V]`` (``None``
  when greedy: the greedy verifier needs only tokens); with ``confidence=θ``, it stops before the first position
  after the first whose law's largest probability is below θ (:func:`~specdec_core.sampling.confidence`).
- ``accept(draft, n)``: the verifier kept ``n`` tokens of ``draft``, this drafter's proposal; roll internal state
  back to ``context + draft[:n]`` (O(1) for cached drafters). What a drafter needs to know about its proposal here
  travels in the draft (``draft.state``), never in attributes that ``propose`` leaves behind.
- ``finish(prompt, output)``: a request ended (EOS or budget) with these tokens; a drafter that remembers earlier
  requests learns here. Never called with what is still being decoded.
- ``reads_verify = True``: ``accept`` finds the verify pass's logits in ``draft.state["seen"]``, to shape the *next*
  proposal only (:class:`~specdec_core.adaptive.jacobi.JacobiDrafter`).
- ``set_step_mode(mode)``: how the drafter's own passes after its prefill run from the next ``reset`` (``"eager"``,
  ``"static"`` or ``"graph"``, :mod:`specdec_core.graphs`); the loop calls it before each decode.

Trees (:class:`specdec_core.loop.TreeDecoding`) use two more methods; the defaults propose the drafter's chain as a
one-branch tree, so every drafter works with ``method="tree"``:

- ``propose_tree(context, shape, k, params, generator, confidence=None) -> TreeDraft``: a tree of depth <= k
  grown to ``shape`` (a :class:`~specdec_core.tree.Tree` or :class:`~specdec_core.tree.Dynamic`), with the
  law q each node's token was drawn from; with ``confidence=θ``, nodes scored below θ get no children.
- ``accept_path(draft, path)``: the verifier kept the nodes ``path`` of ``draft`` (node ids, root excluded, root to
  leaf).

A drafter decides from the committed context and its own draws only, never from the target's verdict on
the tokens it is drafting: that is what keeps every method exact.
"""
from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field

import torch

from .lm import CachedLM, sized
from .sampling import OneHotLaws, SamplingParams, choose, process_logits, sample, confidence as conf_of
from .tree import Tree, TreeBuilder, TreeDraft, draw_siblings, shape_depth, tree_size


@dataclass
class Draft:
    """One proposal: ``tokens [k']``; ``q [k', V]`` float64, row i the law token i was drawn from, or None in a
    greedy run, where no token is drawn from a law (the greedy verifier compares tokens with the target's argmax,
    whatever the drafter); ``passes``, the draft forward passes it cost."""

    tokens: torch.Tensor
    q: torch.Tensor | None
    passes: int
    source: str = ""  # "prediction": the tokens are the caller's predicted output (Stats counts them apart)
    state: dict = field(default_factory=dict)  # what the drafter that proposed it needs at accept (its own record)


class Drafter:
    name = "drafter"
    vocab_size: int | None = None
    calibrated: dict[str, float] = {}  # θ per method for confidence="auto" (specdec_core.models.calibration)
    step_mode = "eager"  # how the drafter's own passes run (set_step_mode)
    previews = False  # True: proposes without a model pass, so the engine may ask first and cut (serving.Engine)
    reads_verify = False  # True: accept() reads the verify pass's logits in draft.state["seen"] (module docstring)

    def bind(self, target) -> None:
        """Refuse a target whose vocabulary differs from the drafter's (tokenizer mismatch)."""
        vt = target.config.get_text_config().vocab_size
        if self.vocab_size is not None and self.vocab_size != vt:
            raise ValueError(f"tokenizer mismatch: {self.name} drafter has a vocabulary of {self.vocab_size}, "
                             f"target has {vt}")

    def set_step_mode(self, mode: str) -> None:
        """Run the drafter's passes in ``mode`` from the next :meth:`reset`; the drafters it holds (a hybrid's
        model and n-gram drafters, a wrapped drafter) get the same mode."""
        self.step_mode = mode
        for inner in self.held().values():
            inner.set_step_mode(mode)

    def held(self) -> dict[str, Drafter]:
        """The drafters this one holds (a hybrid's model and n-gram drafters, a wrapped drafter), by attribute."""
        return {name: v for name, v in vars(self).items() if isinstance(v, Drafter)}

    def reset(self, prompt: torch.Tensor, capacity: int) -> None:
        pass

    def propose(self, context: list[int], k: int, params: SamplingParams, generator, confidence=None) -> Draft:
        raise NotImplementedError

    def accept(self, draft: Draft, n: int) -> None:
        pass

    def finish(self, prompt: list[int], output: list[int]) -> None:
        """A request ended with these tokens (a drafter that learns across requests keeps them; default: nothing)."""

    def propose_tree(self, context: list[int], shape, k: int, params, generator, confidence=None) -> TreeDraft:
        """Default tree: the drafter's own chain (as long as the shape is deep, cut by its own stop)."""
        kw = {} if confidence is None else {"confidence": confidence}
        d = self.propose(context, shape_depth(shape, k), params, generator, **kw)
        return TreeDraft(Tree.chain(d.tokens.numel()), d.tokens, d.q, d.passes, d.source, d.state)

    def accept_path(self, draft, path: list[int]) -> None:
        self.accept(draft, len(path))  # in a chain, node i is the i-th draft token

    def fork(self) -> Drafter:
        """A twin for one more live decode (the engine forks one per request): it shares model weights and a suffix
        drafter's memory of earlier requests, and owns its state (held drafters forked; a cache ``lm`` made anew)."""
        twin = copy.copy(self)
        for name, inner in self.held().items():
            setattr(twin, name, inner.fork())
        twin._owner, twin.lm = None, None
        return twin

    def claim(self, owner) -> None:
        """``owner`` (a decode's phases) drives this drafter and those it holds from now on (held weakly: no cycle)."""
        self._owner = weakref.ref(owner)
        for inner in self.held().values():
            inner.claim(owner)

    def check_owner(self, owner) -> None:
        """Refuse to draft for ``owner`` when another live decode has claimed this drafter (or one it holds) since."""
        claimed = getattr(self, "_owner", None)  # a weak reference; None before any claim (a fresh fork)
        if claimed is not None and claimed() is not owner:
            raise RuntimeError(f"the {self.name} drafter was started by another decode while this one is live (two "
                               "streams or requests sharing one drafter would corrupt each other's state): give "
                               "each its own, drafter.fork()")
        for inner in self.held().values():
            inner.check_owner(owner)


class ModelDrafter(Drafter):
    """An autoregressive draft model (any causal LM with the target's vocabulary): K passes per draft.

    Keeps its own preallocated :class:`KVCache`; tokens the cache has not seen yet (the last committed
    ones) are fed in one pass at the start of the next proposal. ``draft.state["base"]``: ``len(context)`` at the
    proposal (the cache's entries below it are the context's, the draft's after it).
    """

    name = "model"

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.config.get_text_config().vocab_size
        self.lm: CachedLM | None = None

    def reset(self, prompt, capacity):
        if self.lm is None or not self.lm.serves(self.model, capacity, self.step_mode):
            self.lm = CachedLM(self.model, sized(capacity, self.step_mode), self.step_mode)
        self.lm.cache.reset()

    def propose(self, context, k, params, generator, confidence=None):
        lm = self.lm
        unseen = torch.tensor(context[lm.length:], dtype=torch.long)
        logits = lm.forward(unseen, logits_to_keep=1)[-1]
        tokens = []
        qs = []  # the law each token was drawn from
        passes = 1
        for i in range(k):
            t, q = choose(logits, params, generator)
            if i and confidence is not None and conf_of(logits, q) < confidence:
                break  # the draft's own law at this position decides: the target is never consulted
            tokens.append(t)
            qs.append(q)
            if i + 1 < k:
                logits = lm.forward(torch.tensor([t]), logits_to_keep=1)[-1]
                passes += 1
        q = None if params.greedy else torch.stack(qs)
        return Draft(torch.tensor(tokens, dtype=torch.long), q, passes=passes, state={"base": len(context)})

    def accept(self, draft, n):
        keep = draft.state["base"] + n  # the context and the first n draft tokens
        if self.lm.length > keep:
            self.lm.cache.rollback(self.lm.length - keep)

    def propose_tree(self, context, shape, k, params, generator, confidence=None):
        """Grow a tree of depth <= k, one depth per draft pass: the whole depth in one pass through the tree
        mask, at position ``len(context) - 1 + depth``. Children: greedy, a node's top-m tokens; sampling,
        m draws without replacement from its law q (:func:`~specdec_core.tree.draw_siblings`), each child
        carrying the law it was drawn from. Nodes of the last depth are never run (no children to draft).
        ``draft.state``: ``base`` (``len(context)``) and ``slots`` (node id → the cache slot its entry went to)."""
        lm = self.lm
        base = len(context)
        slots: dict[int, int] = {}
        unseen = torch.tensor(context[lm.length:], dtype=torch.long)
        logits = lm.forward(unseen, logits_to_keep=1)  # [1, V]: the root's next-token logits
        grow = TreeBuilder(shape, k, confidence)
        passes = 1
        while True:
            if params.greedy:  # children: the top tokens; scores (Dynamic, confidence) from softmax(logits)
                probs = None
                score = torch.softmax(logits.double(), -1) if grow.scored else None
            else:  # children are drawn from q = the processed law [F, V], which also scores them
                probs = process_logits(logits, params)
                score = probs
            for i, (u, m) in enumerate(zip(grow.frontier, grow.plan(score))):
                if m:
                    grow.add(u, *draw_siblings(logits[i], None if probs is None else probs[i], m, generator))
            if not grow.advance():
                break
            new = grow.frontier_tokens()
            first_slot = lm.length  # this depth's nodes are written in frontier order from here
            slots.update(zip(grow.frontier, range(first_slot, first_slot + new.numel())))
            logits = lm.forward(new, positions=torch.full((new.numel(),), base - 1 + grow.depth),
                                mask=grow.frontier_bias(base, lm.dtype, lm.device))
            passes += 1
        draft = grow.result(passes)
        draft.state = {"base": base, "slots": slots}
        return draft

    def accept_path(self, draft, path):
        """Keep only the accepted nodes in the draft's cache, contiguous after the context (index copy). Nodes
        of the last depth were never run, so they have no entry: the accepted token is fed next time."""
        slots = draft.state["slots"]
        self.lm.cache.retain([slots[i] for i in path if i in slots], start=draft.state["base"])


class NGramDrafter(Drafter):
    """Prompt lookup (training-free): find the latest earlier occurrence of the context's last n-gram
    (n from ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed it.

    Deterministic: q is one-hot on each proposed token (:class:`~specdec_core.sampling.OneHotLaws`: the tokens
    stand for the laws), and verification stays lossless."""

    name = "ngram"
    previews = True

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

    def propose(self, context, k, params, generator, confidence=None):  # q one-hot: confidence 1, never stops
        toks = torch.tensor(self.lookup(context, k), dtype=torch.long)
        return Draft(toks, None if params.greedy else OneHotLaws(toks, self.vocab_size), passes=0)

    def propose_tree(self, context, shape, k, params, generator, confidence=None):  # one-hot q: never pruned
        """A trie of the continuations of several matches (longest n-gram first, latest match first), up to
        as many branches as the shape has at its root and as many nodes as it has in all. Deterministic:
        sibling j's law is one-hot on its token (given the siblings before it), which is what the tree
        verifier needs to stay lossless."""
        depth = shape_depth(shape, k)
        branches = shape.widths[0] if isinstance(shape, Tree) else shape.topk
        budget = tree_size(shape, k)
        L = len(context)
        seen = set()  # the continuations inserted so far
        index = {(): 0}  # trie path → node id (the root is ())
        tokens = {}  # trie path → the node's token
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            tail = context[L - n:]
            for start in range(L - n - 1, -1, -1):
                cont = tuple(context[start + n:start + n + depth])
                if context[start:start + n] != tail or not cont or cont in seen:
                    continue
                seen.add(cont)
                path = ()
                for t in cont:  # insert into the trie: follow a sibling with this token, else a new child
                    kids = [p for p in index if len(p) == len(path) + 1 and p[:-1] == path]
                    same = [p for p in kids if tokens[p] == t]
                    if same:
                        path = same[0]
                    elif len(tokens) < budget:
                        path = path + (len(kids),)
                        index[path] = len(index)
                        tokens[path] = t
                    else:
                        break
                if len(seen) >= branches or len(tokens) >= budget:
                    break
            if len(seen) >= branches or len(tokens) >= budget:
                break
        tree = Tree.of(list(tokens))
        toks = torch.tensor([tokens[p] for p in tree.paths], dtype=torch.long)
        return TreeDraft(tree, toks, None if params.greedy else OneHotLaws(toks, self.vocab_size), passes=0)

    def accept_path(self, draft, path):
        pass


class PredictionDrafter(Drafter):
    """Predicted outputs (OpenAI's ``prediction``, Cursor's "fast apply"): the caller's expected output is the draft.

    Each step drafts the prediction from where the committed output's tail resumes in it: after an occurrence of
    the output's last token, preferring places at or after where the last step left off, then the longest
    matching tail (at most ``max_ngram`` tokens), then the nearest; it drafts the tokens there, as far as ``k``. Steps where
    the prediction has no match are the ``fallback`` drafter's (none: nothing is drafted). Deterministic given the
    committed tokens, so q is one-hot and any prediction, an adversarial one included, leaves the output exact.
    """

    name = "prediction"

    def __init__(self, prediction: list[int], fallback: Drafter | None = None, max_ngram: int = 8):
        self.prediction = [int(t) for t in prediction]
        self.fallback = fallback
        self.max_ngram = max_ngram
        self.after: dict[int, list[int]] = {}  # token → the places just after its occurrences in the prediction
        for i, t in enumerate(self.prediction):
            self.after.setdefault(t, []).append(i + 1)
        self.start, self.at = 0, 0  # prompt length; where the last step left off in the prediction

    def bind(self, target):
        self.vocab_size = target.config.get_text_config().vocab_size
        if self.fallback is not None:
            self.fallback.bind(target)

    def reset(self, prompt, capacity):
        self.start, self.at = len(prompt), 0
        if self.fallback is not None:
            self.fallback.reset(prompt, capacity)

    def resume(self, output: list[int]) -> int | None:
        """The place in the prediction where ``output`` resumes (see the class), or None when its last token is
        not in the prediction."""
        best, P = None, self.prediction
        for j in self.after.get(output[-1], []):
            m = 1
            while m < min(self.max_ngram, len(output), j) and P[j - 1 - m] == output[-1 - m]:
                m += 1
            key = (j >= self.at, m, -abs(j - self.at))
            if best is None or key > best[0]:
                best = (key, j)
        return None if best is None else best[1]

    def propose(self, context, k, params, generator, confidence=None):
        j = self.resume(context[self.start:])
        if (j is None or j >= len(self.prediction)) and self.fallback is not None:
            return self.fallback.propose(context, k, params, generator, confidence=confidence)
        toks = torch.tensor(self.prediction[j:j + k] if j is not None else [], dtype=torch.long)
        return Draft(toks, None if params.greedy else OneHotLaws(toks, self.vocab_size), passes=0, source="prediction",
                     state={"at": j or 0})

    def accept(self, draft, n):
        if draft.source != "prediction":  # the fallback's proposal
            self.fallback.accept(draft, n)
        else:
            self.at = draft.state["at"] + n

    def finish(self, prompt, output):
        if self.fallback is not None:
            self.fallback.finish(prompt, output)


class BlockDrafter(Drafter):
    """K draft tokens from one pass of a :class:`~specdec_core.models.block.BlockDraftModel` (K is capped at
    ``max_block``), PARD-style: the last token's row predicts x_1, MASK_j's row x_{j+1}.

    Each x_i is drawn from its processed law q_i = ``process_logits(row_i)``; q_i depends on the committed
    context only, never on x_<i, which is all speculative sampling needs to stay lossless (the verifier
    compares x_i with p_i(· | context, x_<i)). A whole tree also costs one pass (Medusa-style).

    The draft's :class:`~specdec_core.kvcache.KVCache` holds exactly the committed tokens between steps.
    A proposal feeds the unseen committed tokens (the whole prompt, the first time) and K − 1 masks in one
    pass that computes K rows of logits; the masks' KV entries are not committed.
    """

    name = "block"

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.max_block = model.max_block
        self.lm: CachedLM | None = None

    def mask_ids(self, n: int) -> list[int]:
        return [self.vocab_size + j for j in range(n)]

    def reset(self, prompt, capacity):
        need = capacity + self.max_block  # masks are written past the committed tokens (never committed)
        if self.lm is None or not self.lm.serves(self.model, need, self.step_mode):
            self.lm = CachedLM(self.model, sized(need, self.step_mode), self.step_mode)
        self.lm.cache.reset()

    def _block_pass(self, context: list[int], k: int) -> torch.Tensor:
        """One pass over [unseen…, MASK_1..MASK_{k-1}] → sub-vocabulary logits ``[k, N]`` of the last k rows
        (``full_vocab=False``: no full-vocabulary scatter). The cache commits the unseen tokens only: the
        masks' KV entries stay beyond ``length``, never read, overwritten next time (as after a rollback)."""
        unseen = context[self.lm.length:]
        if not unseen:
            raise ValueError("the last context token must be new to the drafter (the loop's invariant)")
        ids = torch.tensor(unseen + self.mask_ids(k - 1), dtype=torch.long)
        if self.lm.length + ids.numel() > self.lm.cache.capacity:
            raise ValueError(f"block of {ids.numel()} positions does not fit the draft's KV cache of "
                             f"{self.lm.cache.capacity}")
        return self.lm.forward(ids, commit=len(unseen), logits_to_keep=k, full_vocab=False)

    def _laws(self, sub: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Sub-vocabulary logits ``[k, N]`` → (q over the draft vocabulary ``[k, N]``, q over V ``[k, V]``)."""
        q_sub = process_logits(sub, params)  # the same law as process_logits on the -inf-padded row
        q = torch.zeros(sub.shape[0], self.vocab_size, dtype=q_sub.dtype, device=q_sub.device)
        q[:, self.model.vocab] = q_sub
        return q_sub, q

    def propose(self, context, k, params: SamplingParams, generator, confidence=None) -> Draft:
        """Up to ``min(k, max_block)`` tokens in one pass; x_i ~ q_i = process_logits(row i) (greedy: argmax);
        ``confidence``: the block is cut before its first unconfident row after the first."""
        k = min(k, self.max_block)
        sub = self._block_pass(context, k)
        vocab = self.model.vocab
        q_sub, q = (None, None) if params.greedy else self._laws(sub, params)  # q: the laws drawn from
        if confidence is not None:
            low = (conf_of(sub, q_sub)[1:] < confidence).nonzero()
            k = 1 + int(low[0]) if len(low) else k
        toks = sub[:k].argmax(-1) if params.greedy else sample(q_sub, generator)[:k]
        return Draft(vocab[toks].cpu(), None if q is None else q[:k], passes=1)

    def accept(self, draft, n):
        pass  # the cache holds the committed context only: the accepted tokens are fed next time

    def propose_tree(self, context, shape, k, params, generator, confidence=None) -> TreeDraft:
        """A tree of depth <= min(k, max_block) from one pass: every node at depth d draws its children
        from the law of offset d + 1 (greedy: its top tokens; sampling: draws without replacement, each
        child carrying its law), so siblings under different parents repeat the same choices."""
        depth = min(shape_depth(shape, k), self.max_block)
        sub = self._block_pass(context, depth)
        logits = sub.new_full((depth, self.vocab_size), float("-inf"))
        logits[:, self.model.vocab] = sub
        q = None if params.greedy else self._laws(sub, params)[1]
        grow = TreeBuilder(shape, depth, confidence)
        while True:
            d = grow.depth
            F = len(grow.frontier)
            if params.greedy:
                score = torch.softmax(logits[d].double(), -1).expand(F, -1) if grow.scored else None
            else:
                score = q[d].expand(F, -1)
            for u, m in zip(grow.frontier, grow.plan(score)):
                if m:
                    grow.add(u, *draw_siblings(logits[d], None if q is None else q[d], m, generator))
            if not grow.advance():
                break
        return grow.result(passes=1)

    def accept_path(self, draft, path):
        pass  # no node was written to the draft's cache
