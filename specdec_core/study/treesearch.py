"""Choosing a tree from measurements: Sequoia's positional acceptance model, greedy replay, and the
hardware-aware choice by measured pass costs (chapter 4).

Trees are the core's data (:class:`specdec_core.tree.Tree`); this module only chooses among them:

- :func:`draft_ranks` the draft's rank of every token of a decoded text; :func:`greedy_accept_lengths`,
  :func:`replay_greedy` and :func:`replayed_accept` turn ranks into the accepted lengths of any static tree;
- :func:`optimal_tree` the best tree of n nodes under the positional model;
- :func:`pass_cost_curves`, :func:`step_ms` and :func:`predicted_throughput`: what a tree step costs on
  this machine, and the tokens/s each tree would give.
"""
from __future__ import annotations

import heapq

import numpy as np
import pandas as pd
import torch
from scipy.optimize import isotonic_regression

from ..lm import CachedLM
from ..tree import Tree
from .profiling import at_context, pass_fn, summarize, time_interleaved


def greedy_accept_lengths(tree: Tree, ranks: list[int]) -> list[int]:
    """Accepted path length of a greedy step starting at every position of a decoded text.

    ``ranks[t]``: the draft's rank of the text's token t given the text before it (0 = its top choice).
    Under greedy decoding the accepted path follows the target's own text, so a step whose root is token
    s accepts depth d iff the tree holds the node ``(ranks[s+1], .., ranks[s+d])``: exact, no model run.
    """
    out = []
    for s in range(len(ranks)):
        path, d = (), 0
        while s + 1 + d < len(ranks) and path + (ranks[s + 1 + d],) in tree:
            path += (ranks[s + 1 + d],)
            d += 1
        out.append(d)
    return out


def replay_greedy(tree: Tree, ranks: list[int], max_new_tokens: int | None = None) -> list[int]:
    """Accepted lengths of the steps greedy tree decoding takes on a text it produced (``ranks`` as in
    :func:`greedy_accept_lengths`, token 0 from the prefill): each step starts right after the previous
    step's accepted tokens and the target's own one, and stops at the end of the text. With the decode's
    ``max_new_tokens``, a step with room for r more tokens drafts at most r − 1 deep, as the loop does."""
    lengths, s, steps = greedy_accept_lengths(tree, ranks), 0, []
    while s < len(ranks) - 1:
        n = lengths[s] if max_new_tokens is None else min(lengths[s], max_new_tokens - (s + 1) - 1)
        steps.append(n)
        s += n + 1
    return steps


def optimal_tree(rank_probs, n: int, depth: int) -> Tree:
    """The n-node tree of depth <= ``depth`` with the largest expected accepted length when the child of rank r
    is the accepted one with probability ``rank_probs[r]``, independently at every depth (Sequoia's positional
    acceptance model, Chen et al. 2024). A node's chance of being on the accepted path is the product of
    rank_probs along its path; the expected accepted length is their sum over nodes. Values shrink from a
    node to its children and (for sorted rank_probs) to its younger siblings, so growing the tree by always
    adding the most valuable frontier node (a heap) is optimal and keeps ranks contiguous."""
    rp = [float(x) for x in rank_probs]
    heap, paths = [(-rp[0], (0,), 1.0)], []  # (−value, path, value of the parent)
    while heap and len(paths) < n:
        neg, path, parent = heapq.heappop(heap)
        if -neg <= 0:
            break
        paths.append(path)
        if len(path) < depth:
            heapq.heappush(heap, (neg * rp[0], path + (0,), -neg))
        if path[-1] + 1 < len(rp):
            heapq.heappush(heap, (-parent * rp[path[-1] + 1], path[:-1] + (path[-1] + 1,), parent))
    return Tree.of(paths)


# -- from a decoded text to the draft's ranks, and replaying any tree on them ------------------------
@torch.inference_mode()
def draft_ranks(draft_model, prompt, tokens) -> list[int]:
    """The draft's rank of every token of a decoded text (0 = the draft's top choice), from one draft pass
    over the prompt and the text: ``ranks[t]`` counts the tokens the draft scored above token t given the
    prompt and tokens[:t] (the ``ranks`` of :func:`greedy_accept_lengths`)."""
    prompt = torch.as_tensor(prompt, dtype=torch.long).view(-1)
    toks = torch.as_tensor(tokens, dtype=torch.long).view(-1)
    lm = CachedLM(draft_model, prompt.numel() + toks.numel())
    logits = lm.forward(torch.cat([prompt, toks]))[prompt.numel() - 1: -1].double().cpu()  # row t predicts token t
    return (logits > logits.gather(1, toks[:, None])).sum(1).tolist()


def replayed_accept(tree: Tree, texts_ranks) -> tuple[float, int]:
    """(mean accepted draft tokens per step, number of steps) of greedy decoding with ``tree`` on every text
    whose draft ranks are given (:func:`replay_greedy`). Each text's last step is left out of the mean: it may
    accept drafts past an EOS, which the text lacks."""
    steps = [replay_greedy(tree, r) for r in texts_ranks]
    accepted = [a for st in steps for a in st[:-1]]
    return (float(np.mean(accepted)) if accepted else float("nan")), sum(map(len, steps))


# -- choosing by measured cost -------------------------------------------------------------------------
def pass_cost_curves(target, draft_model, context: int, target_tokens, draft_tokens, repeats: int = 5,
                     warmup: int = 3) -> pd.DataFrame:
    """Time target passes over each of ``target_tokens`` tokens and draft passes over each of ``draft_tokens``
    after ``context`` cached positions, all interleaved (:func:`~specdec_core.study.profiling.time_interleaved`,
    one uncommitted pass each: :func:`~specdec_core.study.profiling.pass_fn`).

    A tree's attention mask does not change a pass's arithmetic, only which scores are kept, so plain passes
    of the same sizes stand in for tree passes. A pass cannot get cheaper with more tokens, so the medians
    are also smoothed by isotonic (non-decreasing) regression: ``fitted``, the curve :func:`step_ms` reads.
    Returns ``model`` ("target" / "draft"), ``tokens``, ``median``, ``q25``, ``q75``, ``fitted`` (ms)."""
    lms = {"target": CachedLM(target, context + max(target_tokens) + 1),
           "draft": CachedLM(draft_model, context + max(draft_tokens) + 1)}
    fns = {}
    for name, sizes in (("target", target_tokens), ("draft", draft_tokens)):
        at_context(lms[name], context)
        fns.update({f"{name}:{n}": pass_fn(lms[name], int(n)) for n in sorted(set(sizes))})
    device = next(target.parameters()).device
    s = summarize(time_interleaved(fns, repeats=repeats, warmup=warmup, device=device))
    s[["model", "tokens"]] = s["name"].str.split(":", expand=True)
    s["tokens"] = s["tokens"].astype(int)
    for q in ("median", "q25", "q75"):
        s[q] = 1e3 * s[q]
    s = s.sort_values(["model", "tokens"], ascending=[False, True]).reset_index(drop=True)
    s["fitted"] = s.groupby("model")["median"].transform(lambda m: isotonic_regression(m.values).x)
    return s[["model", "tokens", "median", "q25", "q75", "fitted"]]


def step_ms(tree: Tree, costs: pd.DataFrame) -> float:
    """Predicted time (ms) of one tree step from :func:`pass_cost_curves`: one draft pass per depth that has
    children to draft (the root's pass over one token, then each depth's nodes), plus one verify pass over
    the root and the N nodes. Sizes between those measured are interpolated on the fitted curves."""
    t, d = (costs[costs.model == m].sort_values("tokens") for m in ("target", "draft"))
    widths = [1] + tree.widths[:-1]
    return float(sum(np.interp(w, d.tokens, d.fitted) for w in widths) + np.interp(tree.n + 1, t.tokens, t.fitted))


def predicted_throughput(trees: dict, accepted: dict, costs: pd.DataFrame) -> pd.DataFrame:
    """Sequoia-style hardware-aware choice: for each named static tree, the predicted tokens/s of greedy
    decoding, (accepted + 1) tokens per step at :func:`step_ms` per step, with ``accepted[name]`` the mean
    accepted draft tokens per step (e.g. from :func:`replayed_accept`). Returns ``step_ms``,
    ``predicted_tokens_per_s`` and ``branching`` (the tree has a node with two children or more: not a
    chain) indexed by name."""
    rows = {name: dict(step_ms=step_ms(tree, costs), accepted=float(accepted[name]),
                       branching=max(tree.widths, default=0) > 1) for name, tree in trees.items()}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df["predicted_tokens_per_s"] = 1e3 * (df.accepted + 1) / df.step_ms
    return df[["step_ms", "predicted_tokens_per_s", "branching"]]
