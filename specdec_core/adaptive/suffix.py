"""A suffix drafter after SuffixDecoding (Oliaro et al., arXiv 2411.04975; vLLM ``method: "suffix"``, which runs
Snowflake's ArcticInference implementation): proposals copied from a count-annotated trie of suffixes, with a
length that follows how long the match is.

Two structures, each a trie of every suffix of its sequences cut at ``max_tree_depth`` tokens, each node counting
the suffix occurrences that pass through or end at it:

- the **request's**: the prompt and the output so far. ``reset`` indexes the prompt; each ``propose`` indexes the
  committed tokens it has not seen yet, O(``max_tree_depth``) per token (the nodes of the suffixes that end at the
  last token are kept: the next token extends each of them by one child).
- the **global** one: the outputs of earlier requests (outputs only, as SuffixDecoding: the request's own prompt is
  in its own structure, and earlier prompts would mostly dilute the counts), fed by ``finish(prompt, output)``,
  bounded to the ``max_cached_requests`` latest, the oldest evicted first (its suffixes' counts taken back);
  ``forget()`` empties it. ``max_cached_requests=0``: no memory across requests.

A proposal, as ArcticInference's ``SuffixDecodingCache.speculate`` does it: for every match length m = 1, 2, … (the
context's last m tokens, while they occur in the structure, m < ``max_tree_depth``), draft from the matched node at
most ``cap(m) = min(k, ⌊max_spec_offset + max_spec_factor · m⌋)`` tokens, following the most frequent child; each
token's probability is the *product along the path* of count(child) / count(parent) (vLLM's score, not the last
ratio alone), and the draft stops before a token whose probability falls below ``min_token_prob``. The draft's
score is the sum of its tokens' probabilities; the best-scoring m wins (a tie: the longer match). The global
structure's best draft replaces the request's only when it scores strictly higher. A node's count includes the
suffixes that end at it (in the request's structure, the context's own last occurrence), and a node sits at depth
<= ``max_tree_depth``, so a match of m tokens continues for at most ``max_tree_depth − m`` (with the defaults a
chain is at most 12 tokens long; a larger ``max_tree_depth`` lifts that).

Ties between children of equal count go to the smaller token id (ArcticInference leaves them to a hash map's order).

Why it stays exact. The draft is a function of the committed tokens and of finished requests, never of the target's
verdict on the tokens being drafted: the law each token is drawn from is the one-hot on it, and speculative
sampling with a one-hot q accepts x with probability p(x) and otherwise resamples p with x removed, which gives back
p exactly (greedy: the verifier compares with the target's argmax, whatever was drafted).
"""
from __future__ import annotations

import heapq
import math
from collections import deque

import torch

from ..drafters import Draft, Drafter
from ..sampling import OneHotLaws
from ..tree import Tree, TreeDraft, shape_depth, tree_size

__all__ = ["SuffixDrafter", "SuffixTrie", "TrieNode"]


class TrieNode:
    """One trie node: the token on the edge from its parent, its depth, the suffix occurrences through it
    (``count``), its children by token, and its most frequent child (``best``; ties: the smaller token)."""

    __slots__ = ("token", "depth", "count", "children", "best")

    def __init__(self, token: int, depth: int):
        self.token = token
        self.depth = depth
        self.count = 0
        self.children: dict[int, TrieNode] = {}
        self.best: TrieNode | None = None


def _better(a: TrieNode, b: TrieNode | None) -> bool:
    """True if child ``a`` ranks before child ``b``: the higher count, then the smaller token."""
    return b is None or a.count > b.count or (a.count == b.count and a.token < b.token)


class SuffixTrie:
    """Every suffix of the sequences added, cut at ``max_depth`` tokens, as a trie with counts.

    ``extend(tokens, ends)`` appends tokens to one sequence: ``ends`` are the nodes of that sequence's suffixes
    that end at its last token and can still grow (depth < ``max_depth``), shallowest first; it returns the new
    ones. Each token costs O(``max_depth``). ``remove(seq)`` takes a whole sequence's suffixes back.
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = TrieNode(-1, 0)

    def extend(self, tokens, ends: list[TrieNode]) -> list[TrieNode]:
        D = self.max_depth
        root = self.root
        for t in tokens:
            grown = []
            for node in [root] + ends:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = TrieNode(t, node.depth + 1)
                child.count += 1
                if child is not node.best and _better(child, node.best):
                    node.best = child
                if child.depth < D:
                    grown.append(child)
            root.count += 1
            ends = grown
        return ends

    def remove(self, seq: list[int]) -> None:
        """Take back the suffixes ``extend(seq, [])`` added: counts down, emptied nodes dropped."""
        for i in range(len(seq)):
            node = self.root
            node.count -= 1
            for t in seq[i:i + self.max_depth]:
                child = node.children[t]
                child.count -= 1
                if child.count == 0:
                    del node.children[t]
                if child is node.best:
                    node.best = None
                    for c in node.children.values():
                        if _better(c, node.best):
                            node.best = c
                if child.count == 0:
                    break
                node = child

    def match(self, pattern: list[int]) -> list[TrieNode]:
        """The nodes of ``pattern``'s suffixes, shortest first, while they occur (entry m - 1: the last m tokens)."""
        found = []
        for m in range(1, len(pattern) + 1):
            node = self.root
            for t in pattern[len(pattern) - m:]:
                node = node.children.get(t)
                if node is None:
                    return found
            found.append(node)
        return found

    def counts(self) -> dict[tuple[int, ...], int]:
        """Every node's path → count (the root excluded): the trie as data, for checks."""
        out, stack = {}, [((), self.root)]
        while stack:
            path, node = stack.pop()
            for t, c in node.children.items():
                out[path + (t,)] = c.count
                stack.append((path + (t,), c))
        return out


def _chain(node: TrieNode, limit: int, min_prob: float) -> tuple[list[TrieNode], float]:
    """The most frequent continuation of ``node``: at most ``limit`` tokens, while the path's probability (the
    product of count(child) / count(parent)) is >= ``min_prob``. Returns (its nodes, score = Σ probabilities)."""
    nodes: list[TrieNode] = []
    prob = 1.0
    score = 0.0
    while len(nodes) < limit:
        child = node.best
        if child is None:
            break
        prob *= child.count / node.count
        if prob < min_prob:
            break
        nodes.append(child)
        score += prob
        node = child
    return nodes, score


def _tree(node: TrieNode, depth: int, budget: int, min_prob: float) -> tuple[dict, float]:
    """A token tree grown best-first from ``node``: each candidate's probability is its parent's times
    count(child) / count(parent); candidates below ``min_prob`` are dropped; at most ``budget`` nodes, ``depth`` deep.
    Returns ({index path: trie node}, score = Σ probabilities). Siblings enter in rank order (count, then token)."""
    out: dict[tuple[int, ...], TrieNode] = {}
    ranks: dict[tuple[int, ...], int] = {(): 0}  # a drafted node's path → its children so far
    score = 0.0
    heap: list = []
    order = 0  # ties in probability: pushed first, popped first

    def push(parent: TrieNode, path: tuple[int, ...], prob: float) -> None:
        nonlocal order
        if len(path) >= depth:
            return
        for c in sorted(parent.children.values(), key=lambda c: (-c.count, c.token)):
            p = prob * c.count / parent.count
            if p < min_prob:
                break  # the rest are rarer still
            heapq.heappush(heap, (-p, order, c, path))
            order += 1

    push(node, (), 1.0)
    while heap and len(out) < budget:
        neg, _, c, parent_path = heapq.heappop(heap)
        path = parent_path + (ranks[parent_path],)
        ranks[parent_path] += 1
        ranks[path] = 0
        out[path] = c
        score -= neg
        push(c, path, -neg)
    return out, score


class SuffixDrafter(Drafter):
    """SuffixDecoding's drafter (module docstring): the request's suffix trie and a global one over earlier outputs.

    ``max_tree_depth``: the longest suffix indexed (a match of m tokens continues for at most ``max_tree_depth − m``);
    ``max_spec_factor``, ``max_spec_offset``: a match of m tokens drafts at most ``⌊offset + factor · m⌋`` tokens
    (and at most ``k``); ``min_token_prob``: the least path probability a drafted token may have;
    ``max_cached_requests``: how many finished requests' outputs the global trie keeps (0: none); ``learn``: whether
    ``finish`` adds a finished output to it (False freezes the memory: a benchmark's warm drafter, built from
    training requests, must not learn the answers of the evaluation requests it is timed on).
    Defaults are vLLM's (``max_tree_depth`` 24, ``max_spec_factor`` 1, ``min_token_prob`` 0.1, ``max_spec_offset``
    0), but for ``max_cached_requests``: vLLM keeps 10 000 in a C++ structure; here each cached output costs up to
    ``len(output) · max_tree_depth`` Python nodes of a few hundred bytes each, hence 64.

    Deterministic: q is one-hot on each drafted token (``[k', V]`` float64 when sampling; None when greedy); a
    proposal costs no model pass. Trees: siblings in order of frequency, each one-hot on its own token.
    """

    name = "suffix"
    previews = True  # no model pass: the engine asks an adaptive row first, then cuts to its K

    def __init__(self, max_tree_depth: int = 24, max_spec_factor: float = 1.0, min_token_prob: float = 0.1,
                 max_cached_requests: int = 64, max_spec_offset: float = 0.0, learn: bool = True):
        if isinstance(max_tree_depth, bool) or not isinstance(max_tree_depth, int) or max_tree_depth < 1:
            raise ValueError(f"max_tree_depth must be an integer >= 1, got {max_tree_depth!r}")
        if not isinstance(max_spec_factor, (int, float)) or not math.isfinite(max_spec_factor) or max_spec_factor <= 0:
            raise ValueError(f"max_spec_factor must be a finite number > 0, got {max_spec_factor!r}")
        if not isinstance(min_token_prob, (int, float)) or not 0.0 <= min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {min_token_prob!r}")
        if (isinstance(max_cached_requests, bool) or not isinstance(max_cached_requests, int)
                or max_cached_requests < 0):
            raise ValueError(f"max_cached_requests must be an integer >= 0, got {max_cached_requests!r}")
        if not isinstance(max_spec_offset, (int, float)) or not math.isfinite(max_spec_offset):
            raise ValueError(f"max_spec_offset must be a finite number, got {max_spec_offset!r}")
        self.max_tree_depth = max_tree_depth
        self.max_spec_factor = float(max_spec_factor)
        self.min_token_prob = float(min_token_prob)
        self.max_cached_requests = max_cached_requests
        self.max_spec_offset = float(max_spec_offset)
        if not isinstance(learn, bool):
            raise ValueError(f"learn must be True or False, got {learn!r}")
        self.learn = learn
        self.cached: deque[list[int]] = deque()  # the global trie's outputs, oldest first
        self.global_trie = SuffixTrie(max_tree_depth)
        self._start([])

    def bind(self, target):  # works with any vocabulary; q needs its size
        self.vocab_size = target.config.get_text_config().vocab_size

    # -- the request's trie ----------------------------------------------------------------------------
    def _start(self, tokens: list[int]) -> None:
        self.trie = SuffixTrie(self.max_tree_depth)
        self.seen: list[int] = []  # the tokens the request's trie has indexed
        self._ends: list[TrieNode] = []  # its nodes of the suffixes that end at seen[-1] and can still grow
        self._index(tokens)

    def _index(self, tokens: list[int]) -> None:
        self._ends = self.trie.extend(tokens, self._ends)
        self.seen += tokens

    def reset(self, prompt, capacity):
        self._start(prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt))

    def _sync(self, context: list[int]) -> None:
        """Index the committed tokens not seen yet; a context that does not extend what was indexed (a new
        sequence without ``reset``) is indexed from scratch."""
        n = len(self.seen)
        if len(context) < n or (n and (context[n - 1] != self.seen[-1] or context[0] != self.seen[0])):
            self._start(list(context))
        elif len(context) > n:
            self._index(list(context[n:]))

    # -- across requests ---------------------------------------------------------------------------------
    def finish(self, prompt, output):
        """Keep ``output`` in the global trie (the oldest cached output is evicted beyond ``max_cached_requests``);
        nothing when ``learn`` is False."""
        output = list(output)
        if not self.learn or self.max_cached_requests == 0 or not output:
            return
        self.global_trie.extend(output, [])
        self.cached.append(output)
        while len(self.cached) > self.max_cached_requests:
            self.global_trie.remove(self.cached.popleft())

    def forget(self) -> None:
        """Empty the global trie: no memory of earlier requests."""
        self.cached.clear()
        self.global_trie = SuffixTrie(self.max_tree_depth)

    # -- proposing -----------------------------------------------------------------------------------------
    def cap(self, m: int, k: int) -> int:
        """The most tokens a match of ``m`` tokens may draft: ``min(k, ⌊offset + factor · m⌋)``, at least 0."""
        return max(0, min(k, math.floor(self.max_spec_offset + self.max_spec_factor * m + 1e-9)))

    def _matches(self, context: list[int]):
        """The nodes of the context's last m tokens, m = 1, 2, … (< ``max_tree_depth``): in the request's trie, then
        (when it holds any output) in the global one."""
        self._sync(context)
        D = self.max_tree_depth
        yield self._ends[:D - 1]  # the request's trie holds the context: its own suffixes are the matches
        if self.cached:
            yield self.global_trie.match(list(context[-(D - 1):]) if D > 1 else [])

    @staticmethod
    def _implied(nodes: list[TrieNode], m: int, short: bool) -> bool:
        """True when the match of m + 1 tokens drafts at least as well as the match of m, so m need not be tried:
        both occur as often (every occurrence of the last m tokens is preceded by the same token), so their
        continuations have the same counts, and m's draft stops short of the depth m + 1 can reach (``short``);
        m + 1 may draft as many tokens, with the same probabilities (a tie goes to the longer match anyway)."""
        return short and m < len(nodes) and nodes[m].count == nodes[m - 1].count

    def chain(self, context: list[int], k: int) -> tuple[TrieNode | None, list[TrieNode], int]:
        """The chain a proposal drafts: (the matched node, the chain's nodes, the match length; 0: no draft)."""
        best, best_score = (None, [], 0), 0.0
        for i, nodes in enumerate(self._matches(context)):
            mine, mine_score = (None, [], 0), 0.0
            for m, node in enumerate(nodes, start=1):
                room = self.max_tree_depth - node.depth
                limit = min(self.cap(m, k), room)
                if self._implied(nodes, m, limit < room):
                    continue
                drafted, score = _chain(node, limit, self.min_token_prob)
                if score >= mine_score:
                    mine, mine_score = (node, drafted, m), score
            if i == 0 or mine_score > best_score:  # the global trie wins only by scoring higher
                best, best_score = mine, mine_score
        return best if best[1] else (None, [], 0)

    def speculate(self, context: list[int], k: int) -> tuple[list[int], int]:
        """The tokens a proposal drafts and the match length they follow (0: no draft)."""
        _, drafted, m = self.chain(context, k)
        return [c.token for c in drafted], m

    def propose(self, context, k, params, generator, confidence=None):  # q one-hot: confidence 1, never stops
        toks = torch.tensor(self.speculate(context, k)[0] if k > 0 else [], dtype=torch.long)
        return Draft(toks, None if params.greedy else self.one_hot(toks), passes=0)

    def propose_tree(self, context, shape, k, params, generator, confidence=None):  # one-hot q: never pruned
        """A token tree from the best-scoring match: grown best-first by path probability (>= ``min_token_prob``),
        depth <= min(``shape_depth(shape, k)``, the match's ``cap``), at most ``tree_size(shape, k)`` nodes.
        Deterministic: sibling j's law is one-hot on its token (given the siblings before it), which is what the
        tree verifier needs to stay lossless."""
        _, nodes = self.token_tree(context, shape, k)
        tree = Tree.of(list(nodes))
        toks = torch.tensor([nodes[p].token for p in tree.paths], dtype=torch.long)
        return TreeDraft(tree, toks, None if params.greedy else self.one_hot(toks), passes=0)

    def token_tree(self, context: list[int], shape, k: int) -> tuple[TrieNode | None, dict]:
        """The tree a proposal drafts: (the matched node, {index path: trie node}), as :meth:`propose_tree`."""
        depth, budget = shape_depth(shape, k), tree_size(shape, k)
        best, best_score = (None, {}), 0.0
        for i, nodes in enumerate(self._matches(context)):
            mine, mine_score = (None, {}), 0.0
            for m, node in enumerate(nodes, start=1):
                room = self.max_tree_depth - node.depth
                d = min(depth, self.cap(m, k), room)
                if self._implied(nodes, m, d < room):
                    continue
                paths, score = _tree(node, d, budget, self.min_token_prob) if d > 0 else ({}, 0.0)
                if score >= mine_score:
                    mine, mine_score = (node, paths), score
            if i == 0 or mine_score > best_score:  # the global trie wins only by scoring higher
                best, best_score = mine, mine_score
        return best

    def one_hot(self, toks: torch.Tensor) -> OneHotLaws:
        """The laws of deterministic tokens ``[k']``: row i one-hot on token i, kept as the tokens."""
        return OneHotLaws(toks, self.vocab_size)

    def accept(self, draft, n):
        pass  # the tries hold committed tokens only: the accepted ones are indexed at the next proposal

    def accept_path(self, draft, path):
        pass
