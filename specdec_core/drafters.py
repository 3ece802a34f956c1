"""Drafters: anything that proposes K tokens together with the exact laws q they were drawn from.

Interface (the loop in :mod:`specdec_core.linear` is its only caller):

- ``bind(target)``: check the drafter fits the target (same vocabulary) before decoding.
- ``reset(prompt, capacity)``: start a new sequence.
- ``propose(context, k, params, generator) -> Draft``: ``context`` is every token so far (prompt and
  generated, the last one not yet seen by the target). Returns up to ``k`` tokens and ``q [k', V]``
  (``None`` when greedy: the greedy verifier needs only tokens).
- ``accept(n)``: the verifier kept ``n`` of the proposed tokens; roll internal state back to
  ``context + draft[:n]`` (O(1) for cached drafters).

Trees (:mod:`specdec_core.tree`) use two more methods; the defaults propose the drafter's chain as a
one-branch tree, so every drafter works with ``method="tree"``:

- ``propose_tree(context, shape, k, params, generator) -> TreeDraft``: a tree of depth <= k grown
  to ``shape`` (a :class:`~specdec_core.tree.Tree` or :class:`~specdec_core.tree.Dynamic`), with the
  law q each node's token was drawn from.
- ``accept_path(path)``: the verifier kept the nodes ``path`` (node ids, root excluded, root to leaf).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .lm import CachedLM
from .sampling import PROB_DTYPE, SamplingParams, choose, process_logits
from .tree import Dynamic, Tree, TreeBuilder, TreeDraft, draw_siblings, keep_slots, shape_depth, tree_size


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

    def propose_tree(self, context: list[int], shape, k: int, params: SamplingParams, generator) -> TreeDraft:
        """Default tree: the drafter's own chain (as long as the shape is deep), one node per depth."""
        d = self.propose(context, shape_depth(shape, k), params, generator)
        return TreeDraft(Tree.chain(d.tokens.numel()), d.tokens, d.q, d.passes)

    def accept_path(self, path: list[int]) -> None:
        self.accept(len(path))  # in a chain, node i is the i-th draft token


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

    def propose_tree(self, context, shape, k, params, generator):
        """Grow a tree of depth <= k, one depth per draft pass: the whole depth in one pass through the tree
        mask, at position ``len(context) - 1 + depth``. Children: greedy, a node's top-m tokens; sampling,
        m draws without replacement from its law q (:func:`~specdec_core.tree.draw_siblings`), each child
        carrying the law it was drawn from. Nodes of the last depth are never run (no children to draft).
        """
        lm = self.lm
        self._base = base = len(context)
        unseen = torch.tensor(context[lm.length:], dtype=torch.long)
        logits = lm.forward(unseen, last_only=True)  # [1, V]: the root's next-token logits
        grow, passes = TreeBuilder(shape, k), 1
        while True:
            if params.greedy:  # children: the top tokens; a Dynamic shape scores them with softmax(logits)
                probs, score = None, torch.softmax(logits.double(), -1) if isinstance(shape, Dynamic) else None
            else:  # children are drawn from q = the processed law [F, V], which also scores them
                probs = score = process_logits(logits, params)
            for i, (u, m) in enumerate(zip(grow.frontier, grow.plan(score))):
                if m:
                    grow.add(u, *draw_siblings(logits[i], None if probs is None else probs[i], m, generator))
            if not grow.advance():
                break
            new = grow.frontier_tokens()
            logits = lm.forward(new, positions=torch.full((new.numel(),), base - 1 + grow.depth),
                                mask=grow.frontier_bias(base, lm.dtype, lm.device))
            passes += 1
        self._written = lm.length - base  # nodes 1.._written sit at slots base.._written + base - 1
        return grow.result(passes)

    def accept_path(self, path):
        """Keep only the accepted nodes in the draft's cache, contiguous after the context (index copy)."""
        keep_slots(self.lm.cache, [self._base + i - 1 for i in path if i <= self._written], start=self._base)


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

    def propose_tree(self, context, shape, k, params, generator):
        """A trie of the continuations of several matches (longest n-gram first, latest match first), up to
        as many branches as the shape has at its root and as many nodes as it has in all. Deterministic:
        sibling j's law is one-hot on its token (given the siblings before it), which is what the tree
        verifier needs to stay lossless."""
        depth = shape_depth(shape, k)
        branches = shape.widths[0] if isinstance(shape, Tree) else shape.topk
        budget = tree_size(shape, k)
        L, seen, index, tokens = len(context), set(), {(): 0}, {}
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
                        index[path], tokens[path] = len(index), t
                    else:
                        break
                if len(seen) >= branches or len(tokens) >= budget:
                    break
            if len(seen) >= branches or len(tokens) >= budget:
                break
        tree = Tree.of(list(tokens))
        toks = torch.tensor([tokens[p] for p in tree.paths], dtype=torch.long)
        q = None
        if not params.greedy:
            q = torch.zeros(toks.numel(), self.vocab_size, dtype=PROB_DTYPE)
            q[torch.arange(toks.numel()), toks] = 1.0
        return TreeDraft(tree, toks, q, passes=0)

    def accept_path(self, path):
        pass
