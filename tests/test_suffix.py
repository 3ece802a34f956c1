"""The suffix drafter (issue 43, :mod:`specdec_core.adaptive.suffix`): exact, adaptive in length, remembering.

Greedy runs on a toy pair must equal autoregressive decoding token for token while drafting; the request's trie,
updated token by token, must equal one built from scratch, and the global trie one built from the outputs it keeps
after evictions; a second request drafts more from the first one's output, and not after ``forget()``.

False-positive rates. The two law tests (chain and tree, T = 1, the toy pair) are Pearson's test of the sampled
continuations against the enumerated law at α = 0.01 each: an exact sampler fails one with probability <= 2% over
random seeds; the seeds are fixed, so the outcome is deterministic. One drafter serves all the runs of a test, so
each run drafts from the outputs of the runs before it as well: the memory across requests is under test too. The
negative control (:class:`~specdec_core.study.mutants.SuffixFrequencyQ`, q from the trie's frequencies) must be
rejected at the same α with the same sizes and seeds.
"""
from __future__ import annotations

import functools
import math
import random

import pytest
import torch

import specdec_core as sd
from specdec_core.adaptive.suffix import SuffixDrafter, SuffixTrie
from specdec_core.sampling import SamplingParams
from specdec_core.study import exactness as ex
from specdec_core.study import mutants as mu
from specdec_core.tree import default_tree

GREEDY = SamplingParams(0.0)
ALPHA = 0.01
SEED = 43_000


@functools.lru_cache(maxsize=None)
def _pair(vocab_size: int = 8):
    return sd.toy_pair(vocab_size=vocab_size, seed=0, draft_noise=0.6)


@pytest.fixture(autouse=True, scope="module")
def torch_threads():
    """Tiny models on a shared machine: one intra-op thread."""
    with ex.torch_threads(1):
        yield


def fresh(**kw) -> SuffixDrafter:
    d = SuffixDrafter(**kw)
    d.vocab_size = 64
    return d


# -- the structures ---------------------------------------------------------------------------------------------
def reference_counts(seqs, depth: int) -> dict:
    """Path → count of every suffix of ``seqs`` cut at ``depth``, counted by brute force."""
    out: dict = {}
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(i + depth, len(s)) + 1):
                out[tuple(s[i:j])] = out.get(tuple(s[i:j]), 0) + 1
    return out


def best_is_consistent(trie: SuffixTrie) -> bool:
    """Every node's ``best`` is its child of highest count, ties to the smaller token."""
    stack = [trie.root]
    while stack:
        node = stack.pop()
        want = min(node.children.values(), key=lambda c: (-c.count, c.token), default=None)
        if node.best is not want:
            return False
        stack.extend(node.children.values())
    return True


def test_trie_counts_every_suffix_and_incremental_indexing_equals_scratch():
    rng = random.Random(0)
    seq = [rng.randrange(4) for _ in range(80)]
    d = fresh(max_tree_depth=6)
    d.reset(torch.tensor(seq[:30]), 200)
    for n in range(31, 81, 7):  # proposals on a growing context index only the new tokens
        d.propose(seq[:n], 4, GREEDY, None)
    d.propose(seq, 4, GREEDY, None)
    assert d.seen == seq
    assert d.trie.counts() == reference_counts([seq], 6)
    assert best_is_consistent(d.trie)
    # a context that does not extend what was indexed (no reset) is indexed from scratch
    other = [3, 2, 1, 0, 3, 2, 1]
    d.propose(other, 4, GREEDY, None)
    assert d.trie.counts() == reference_counts([other], 6)


def test_eviction_is_oldest_first_and_takes_the_counts_back():
    a, b, c = [10, 11, 12, 13, 14], [20, 21, 22, 23, 24], [30, 31, 20, 21, 25]
    d = fresh(max_cached_requests=2)
    context = [1, 2, 3, 10, 11]
    for out in (a, b):
        d.finish([1, 2, 3], out)
    d.reset(torch.tensor(context[:-1]), 50)
    assert d.speculate(context, 8)[0] == [12, 13]  # a's continuation, from the global trie
    d.finish([1, 2, 3], c)  # a third output: a, the oldest, is evicted
    assert list(d.cached) == [b, c]
    assert d.global_trie.counts() == reference_counts([b, c], d.max_tree_depth)
    assert best_is_consistent(d.global_trie)
    d.reset(torch.tensor(context[:-1]), 50)
    assert d.speculate(context, 8)[0] == []
    d.finish([1, 2, 3], a)  # a again: b goes
    assert list(d.cached) == [c, a]
    assert d.global_trie.counts() == reference_counts([c, a], d.max_tree_depth)
    d.forget()
    assert not d.cached and d.global_trie.counts() == {}
    off = fresh(max_cached_requests=0)  # no memory across requests
    off.finish([1], a)
    assert not off.cached and off.global_trie.counts() == {}
    frozen = fresh()
    frozen.finish([1], a)
    frozen.learn = False  # a warm memory, frozen: a timed request's answer is not learned
    frozen.finish([1], b)
    assert list(frozen.cached) == [a] and frozen.global_trie.counts() == reference_counts([a], frozen.max_tree_depth)


# -- the proposal ---------------------------------------------------------------------------------------------------
CAP_CONTEXT = [8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 6, 7]  # "5 6 7" recurs: a 3-token match, then "8 9 5 6 7"


@pytest.mark.parametrize("factor, offset", [(0.5, 0.0), (1.0, 0.0), (2.0, 0.0), (0.5, 2.0)])
def test_length_cap_follows_the_match_length(factor, offset):
    """The longest match is 3 tokens ("5 6 7"), followed by 5 known tokens: the chain is
    min(⌊offset + factor · 3⌋, 5, k) long; k caps it too; the tree is as deep."""
    d = fresh(max_spec_factor=factor, max_spec_offset=offset)
    toks, m = d.speculate(CAP_CONTEXT, 24)
    want = min(math.floor(offset + factor * 3), 5)
    assert m == 3 and toks == [8, 9, 5, 6, 7][:want]
    assert d.speculate(CAP_CONTEXT, 2)[0] == toks[:2]
    tree = d.propose_tree(CAP_CONTEXT, default_tree(24), 24, GREEDY, None)
    assert tree.tree.depth == want and tree.tokens[:want].tolist() == toks


def test_tree_depth_caps_a_match():
    """A match of m tokens in a trie of depth D continues for at most D − m tokens."""
    seg = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    d = fresh(max_tree_depth=6, max_spec_factor=4.0)
    toks, m = d.speculate(seg * 3, 24)
    assert m and len(toks) == 6 - m


def test_min_token_prob_is_the_path_product():
    """In CAP_CONTEXT every match's first continuation has probability 1/2 (the context's own last occurrence
    counts in the node): drafted at min_token_prob 0.5, nothing above it."""
    assert fresh(min_token_prob=0.5).speculate(CAP_CONTEXT, 24)[0] == [8, 9, 5]
    assert fresh(min_token_prob=0.51).speculate(CAP_CONTEXT, 24)[0] == []
    # branching: "4" occurs 4 times, followed by 3 twice and 7 once: 3 scores 1/2, 7 1/4; "4 3" by 1 and 2 (1/4
    # each on the path, the tie to the smaller token), and each of those continues with certainty (1/4)
    ctx = [4, 3, 1, 4, 7, 4, 3, 2, 4]
    assert fresh(min_token_prob=0.25, max_spec_factor=4.0).speculate(ctx, 24)[0] == [3, 1, 4, 7]
    assert fresh(min_token_prob=0.3, max_spec_factor=4.0).speculate(ctx, 24)[0] == [3]
    tree = fresh(min_token_prob=0.25, max_spec_factor=4.0).propose_tree(ctx, default_tree(4), 4, GREEDY, None)
    assert tree.tree.paths[:4] == ((0,), (1,), (0, 0), (0, 1)) and tree.tokens[:4].tolist() == [3, 7, 1, 2]
    assert tree.tree.depth <= 4 and tree.tree.n <= 10  # default_tree(4): 10 nodes
    tree = fresh(min_token_prob=0.3, max_spec_factor=4.0).propose_tree(ctx, default_tree(4), 4, GREEDY, None)
    assert tree.tokens.tolist() == [3]


def test_sampling_laws_are_one_hot():
    d = fresh()
    d.vocab_size = 16
    draft = d.propose(CAP_CONTEXT, 24, SamplingParams(1.0), None)
    q = draft.q.dense()  # the laws are kept as the tokens (OneHotLaws); dense, they are one-hot rows
    assert draft.passes == 0 and q.dtype == torch.float64 and q.shape == (3, 16)
    ones = torch.ones(3, dtype=torch.float64)
    assert torch.equal(q.argmax(-1), draft.tokens) and torch.equal(q.sum(-1), ones)
    tree = d.propose_tree([4, 3, 1, 4, 7, 4, 3, 2, 4], default_tree(4), 4, SamplingParams(1.0), None)
    ones = torch.ones(tree.tree.n, dtype=torch.float64)
    q = tree.q.dense()
    assert torch.equal(q.argmax(-1), tree.tokens) and torch.equal(q.sum(-1), ones)
    assert d.propose([5, 6], 24, GREEDY, None).tokens.numel() == 0  # no match: an empty draft


@pytest.mark.parametrize("kw, name", [
    (dict(max_spec_factor=0), "max_spec_factor"), (dict(max_spec_factor=-1.0), "max_spec_factor"),
    (dict(min_token_prob=-0.1), "min_token_prob"), (dict(min_token_prob=1.5), "min_token_prob"),
    (dict(max_tree_depth=0), "max_tree_depth"), (dict(max_tree_depth=2.5), "max_tree_depth"),
    (dict(max_cached_requests=-1), "max_cached_requests"), (dict(max_spec_offset=float("nan")), "max_spec_offset"),
    (dict(learn=1), "learn"),
])
def test_bad_arguments_are_refused(kw, name):
    with pytest.raises(ValueError, match=name):
        SuffixDrafter(**kw)


def test_registered_on_every_pair():
    assert sd.SuffixDrafter is SuffixDrafter
    assert isinstance(_pair().drafters["suffix"], SuffixDrafter)


# -- exact decoding -------------------------------------------------------------------------------------------------
REPETITIVE = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]


@pytest.mark.parametrize("method", ["linear", "tree"])
@pytest.mark.parametrize("k", [8, 24])
def test_greedy_equals_autoregressive(method, k):
    pair = _pair()
    ref = sd.generate(pair.target, REPETITIVE, max_new_tokens=48).tokens
    d = pair.drafters["suffix"]
    d.forget()
    res = sd.generate(pair.target, REPETITIVE, drafter=d, method=method, k=k, max_new_tokens=48)
    assert res.tokens == ref
    assert sum(res.stats["drafted"]) > 0 and sum(res.stats["accepted_lengths"]) > 0
    assert max(res.stats["drafted"]) <= (k if method == "linear" else 2 * k + 2)


def test_a_second_request_drafts_from_the_first_ones_output():
    """Same prompt twice, greedy: the second request drafts the first one's output from the global trie (more
    accepted drafts, fewer target passes); after forget() it drafts as the first did."""
    pair = _pair()
    prompt = [3, 1, 4, 1, 5, 2, 6]  # no token recurs but 1: little to copy from the prompt itself
    d = pair.drafters["suffix"]
    d.forget()
    runs = []
    for forget in (False, False, True):
        if forget:
            d.forget()
        r = sd.generate(pair.target, prompt, drafter=d, method="linear", k=24, max_new_tokens=32)
        runs.append((r.tokens, sum(r.stats["accepted_lengths"]), r.stats["target_passes"]))
    ref = sd.generate(pair.target, prompt, max_new_tokens=32).tokens
    assert all(toks == ref for toks, _, _ in runs)
    (_, acc1, passes1), (_, acc2, passes2), (_, acc3, passes3) = runs
    assert acc2 > acc1 and passes2 < passes1
    assert (acc3, passes3) == (acc1, passes1)


# -- the sampled law at T = 1 (module docstring: FPR and the negative control) ------------------------------------
LAW_PROMPT = [4, 3, 1, 4, 7, 4, 3, 2, 4]  # branching continuations: the trie's frequencies are not one-hot
LAW_N, LAW_LEN = 400, 3


@functools.lru_cache(maxsize=None)
def law_run(method: str, mutant: bool):
    pair = _pair()
    d = mu.SuffixFrequencyQ() if mutant else SuffixDrafter()
    d.bind(pair.target)
    params = SamplingParams(1.0)
    law = ex.sequence_law(pair.target, LAW_PROMPT, LAW_LEN, params)
    s = ex.sample_sequences(pair.target, LAW_PROMPT, LAW_LEN, LAW_N, params, method, d, k=2, seed0=SEED, threads=1)
    return ex.gof_test(s.counts(8), law, 5.0, seed=SEED), s


@pytest.mark.slow
@pytest.mark.parametrize("method", ["linear", "tree"])
def test_sampled_law_is_the_target_s(method):
    g, s = law_run(method, False)
    assert (s.proposed > 0).sum() >= 0.9 * LAW_N  # a draft at the first speculative step of nearly every run
    assert g.pvalue > ALPHA, f"{method}:suffix emitted law differs from p: p = {g.pvalue:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["linear", "tree"])
def test_frequency_q_mutant_is_caught(method):
    g, _ = law_run(method, True)
    assert g.pvalue < ALPHA, f"SuffixFrequencyQ survived the law test ({method}): p = {g.pvalue:.3g}"
