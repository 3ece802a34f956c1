"""Tree speculative decoding: trees as data, greedy exactness, KV compaction, and the sampler's law.

Statistical tests use fixed seeds and the book's goodness-of-fit test (:func:`exactness.gof_test`, Pearson's
X² with a Monte Carlo p-value under the exact law) at level 1e-3 (false-positive rate 0.1 % per test for a
correct sampler; with fixed seeds the outcome is deterministic). Each names the mutant it kills; mutants
enter as arguments (``generate(..., rule=...)``), never by patching a module.
"""
import copy
import functools
import itertools

import numpy as np
import pytest
import torch

import specdec_core as sd
import specdec_core.tree as T
from specdec_core.lm import CachedLM
from specdec_core.sampling import SamplingParams
from specdec_core.study import exactness as ex
from specdec_core.study import treesearch
from specdec_core.tree import Dynamic, Tree, default_tree, draw_siblings
from specdec_core.verify import tree_speculative_sample

ALPHA = 1e-3  # chi-square level of every statistical test here


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Toy models are fastest on one thread (and timing-independent of other work on the machine)."""
    with ex.torch_threads(1):
        yield


# -- trees as data ------------------------------------------------------------------------------
def test_tree_from_paths():
    t = Tree.of([(0, 0, 0), (1,), (0,), (0, 1), (0, 0), (1, 0)])
    assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert t.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert t.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert t.children == ((1, 2), (3, 4), (5,), (6,), (), (), ())
    assert t.widths == [2, 3, 1] and t.depth == 3 and t.n == 6
    assert t.mask[6].nonzero().flatten().tolist() == [0, 1, 3, 6]  # (0,0,0) sees root, (0,), (0,0), itself
    assert t.mask.sum().item() == 1 + 2 * 2 + 3 * 3 + 4
    assert t.retrieve.tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    assert Tree.of(list(t.paths)) is t  # converted once
    assert Tree.from_branching([3, 2, 1]).widths == [3, 6, 6]
    assert Tree.chain(4).widths == [1, 1, 1, 1]
    assert t.truncate(2).paths == t.paths[:5]
    d = default_tree(5)
    assert d.depth == 5 and d.n == 2 * 5 + 2 and T.tree_size(None, 5) == d.n
    assert T.tree_size(Dynamic(budget=10, width=4), 2) == 8


@pytest.mark.parametrize("paths, msg", [
    ([(0, 0)], "no parent"),
    ([(0,), (2,)], "without gaps"),
    ([(0,), (-1,)], ">= 0"),
    ([()], "non-empty"),
])
def test_bad_tree_paths(paths, msg):
    with pytest.raises(ValueError, match=msg):
        Tree.of(paths)


def test_bad_tree_arguments(toy16):
    kw = dict(drafter=toy16.drafter, method="tree", k=3, max_new_tokens=5)
    with pytest.raises(ValueError, match="tree must be"):
        sd.generate(toy16.target, [1, 2], tree="wide", **kw)
    with pytest.raises(ValueError, match="no nodes"):
        sd.generate(toy16.target, [1, 2], tree=[], **kw)
    with pytest.raises(ValueError, match="budget"):
        Dynamic(budget=0)


def test_tree_bias_is_the_ancestor_mask():
    t = Tree.of([(0,), (1,), (0, 0)])
    b = t.bias(3, torch.float32, "cpu")
    assert b.shape == (1, 1, 4, 7)
    assert (b[0, 0, :, :3] == 0).all()
    assert torch.equal(b[0, 0, :, 3:] == 0, t.mask)


# -- greedy: identical to autoregressive -----------------------------------------------------------
TREES = {"chain": Tree.chain(7), "default": None, "b321": Tree.from_branching([3, 2, 1]),
         "dynamic": Dynamic(budget=12, width=3, topk=3), "paths": [(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]}


PROMPTS = ([1, 2, 3], [4, 4, 4, 4, 9], [0])


@pytest.fixture(scope="module")
def toy16_greedy(toy16):
    return {tuple(p): sd.generate(toy16.target, p, max_new_tokens=37).tokens for p in PROMPTS}


@pytest.mark.parametrize("shape", TREES)
@pytest.mark.parametrize("name", ["model", "ngram"])
def test_toy_tree_greedy_identical_float64(toy16, toy16_greedy, shape, name):
    for k, prompt in itertools.product([1, 2, 4, 6], PROMPTS):
        sp = sd.generate(toy16.target, prompt, drafter=toy16.drafters[name], method="tree", k=k,
                         tree=TREES[shape], max_new_tokens=37)
        assert sp.tokens == toy16_greedy[tuple(prompt)], (shape, name, k, prompt)


def test_chain_tree_is_linear(toy16):
    """A one-branch tree makes the same proposals and acceptances as linear speculative decoding."""
    for k in (1, 3, 5):
        lin = sd.generate(toy16.target, [5, 1], drafter=toy16.drafter, method="linear", k=k, max_new_tokens=40)
        tre = sd.generate(toy16.target, [5, 1], drafter=toy16.drafter, method="tree", k=k, tree=Tree.chain(k),
                          max_new_tokens=40)
        assert tre.tokens == lin.tokens
        assert tre.stats["accepted_lengths"] == lin.stats["accepted_lengths"]
        assert tre.stats["draft_passes"] == lin.stats["draft_passes"]


def test_tree_accepts_more_per_pass_than_its_chain():
    toy = sd.toy_pair(vocab_size=64, seed=1, draft_noise=0.4)
    kw = dict(drafter=toy.drafters["model"], method="tree", k=4, max_new_tokens=60)
    chain = sd.generate(toy.target, [3, 9, 27], tree=Tree.chain(4), **kw).stats
    tree = sd.generate(toy.target, [3, 9, 27], tree=Tree.from_branching([3, 2, 1, 1]), **kw).stats
    assert np.mean(tree["accepted_lengths"]) > 1.2 * np.mean(chain["accepted_lengths"])


@pytest.mark.parametrize("shape", [Tree.chain(4), default_tree(4), treesearch.optimal_tree([0.5, 0.2, 0.1], 9, 5)])
def test_replay_from_draft_ranks_predicts_greedy_steps(toy16, shape):
    """The draft's rank of each token of the greedy text fixes every greedy step: replaying the ranks gives
    exactly the accepted lengths that tree decoding records."""
    drafter, prompt = toy16.drafters["model"], [2, 7, 1]
    res = sd.generate(toy16.target, prompt, drafter=drafter, method="tree", k=shape.depth, tree=shape,
                      max_new_tokens=60)
    ids = torch.tensor(prompt + res.tokens)
    logits = CachedLM(drafter.model, 80).forward(ids)[len(prompt) - 1:-1]  # row j predicts token j
    ranks = (logits > logits.gather(1, ids[len(prompt):, None])).sum(1).tolist()
    assert treesearch.replay_greedy(shape, ranks, max_new_tokens=60) == res.stats["accepted_lengths"]


def test_optimal_tree_under_the_positional_model():
    rp = [0.6, 0.2, 0.1]
    t = treesearch.optimal_tree(rp, 6, 3)
    assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))  # .6 .2 .36 .12 .12 .216 (not (2,): .1)
    best = max(itertools.combinations([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)], 6),
               key=lambda ps: sum(np.prod([rp[r] for r in p]) for p in ps if all(p[:i] in ps for i in range(1, len(p)))))
    assert set(best) == set(t.paths)


def test_tree_stats_record(toy16):
    res = sd.generate(toy16.target, [1, 2], drafter=toy16.drafter, method="tree", k=3, max_new_tokens=30)
    s = res.stats
    steps = len(s["accepted_lengths"])
    assert s["method"] == "tree" and s["target_passes"] == 1 + steps
    assert len(s["nodes_per_pass"]) == len(s["proposed"]) == steps
    assert s["nodes_per_pass"][0] == default_tree(3).n and s["nodes_per_pass"] == s["drafted"]
    assert s["draft_passes"] <= 3 * steps  # one draft pass per depth (the last depth is never run)
    # proposed = depths tested: the accepted ones, plus the rejected one unless the path ended at a leaf
    assert all(a <= p <= min(a + 1, 3) for a, p in zip(s["accepted_lengths"], s["proposed"]))
    assert s["alpha"] == sum(s["accepted_lengths"]) / sum(s["proposed"])
    assert len(s["accept_probs"]) == sum(s["proposed"]) and s["alpha_predicted"] == s["alpha"]  # greedy: tests are 0/1
    assert sum(a + 1 for a in s["accepted_lengths"]) + 1 >= len(res.tokens)
    assert s["tau"] == pytest.approx(len(res.tokens) / s["target_passes"])
    assert len(s["token_times"]) == len(res.tokens)
    phases = [s[f"{p}_s"] for p in ("draft", "verify", "accept", "commit")]
    assert all(t > 0 for t in phases) and sum(phases) <= s["decode_s"]  # every phase ran, inside the decode loop


def test_eos_and_budget_inside_a_tree(toy16):
    ar = sd.generate(toy16.target, [3, 1], max_new_tokens=20)
    perfect = sd.ModelDrafter(toy16.target)
    res = sd.generate(toy16.target, [3, 1], drafter=perfect, method="tree", k=4, max_new_tokens=6)
    assert res.tokens == ar.tokens[:6] and res.stats["accepted_lengths"][0] == 4
    eos = ar.tokens[5]
    toy16.target.generation_config.eos_token_id = eos
    try:
        sp = sd.generate(toy16.target, [3, 1], drafter=perfect, method="tree", k=4, max_new_tokens=20)
    finally:
        toy16.target.generation_config.eos_token_id = None
    assert sp.tokens == ar.tokens[: ar.tokens.index(eos) + 1]


# -- KV: only the accepted path survives, by an index copy ---------------------------------------
def test_commit_keeps_only_the_accepted_path(toy16):
    """Verify a drafted tree, keep a path through a second-choice branch, and compare both caches (target
    and draft) and the next logits with plain decoding of the same tokens."""
    target, drafter = toy16.target, sd.ModelDrafter(copy.deepcopy(toy16.drafters["model"].model))
    context = [4, 2, 7, 1]
    lm = CachedLM(target, 64)
    lm.forward(torch.tensor(context[:-1]))
    drafter.reset(torch.tensor(context), 64)
    shape = Tree.from_branching([3, 2, 2])
    d = drafter.propose_tree(context, shape, 3, SamplingParams(), None)
    assert d.tree is shape and d.passes == 3
    L = lm.length
    lm.forward(torch.cat([torch.tensor(context[-1:]), d.tokens]), positions=L + d.tree.depths,
               mask=d.tree.bias(L, lm.dtype, lm.device))
    path = [2, 7, 16]  # (1,), (1, 1), (1, 1, 0): not contiguous in the cache
    assert [d.tree.paths[i - 1] for i in path] == [(1,), (1, 1), (1, 1, 0)]
    ptrs = [l.keys.data_ptr() for l in lm.cache.layers]
    lm.cache.retain([L + i for i in path], start=L + 1)
    drafter.accept_path(d, path)
    kept = context + [int(d.tokens[i - 1]) for i in path]
    assert lm.length == len(kept) and [l.keys.data_ptr() for l in lm.cache.layers] == ptrs
    ref = CachedLM(target, 64)
    ref.forward(torch.tensor(kept))
    for a, b in zip(lm.cache.layers, ref.cache.layers):
        torch.testing.assert_close(a.keys[:, :, :len(kept)], b.keys[:, :, :len(kept)], rtol=0, atol=1e-12)
        torch.testing.assert_close(a.values[:, :, :len(kept)], b.values[:, :, :len(kept)], rtol=0, atol=1e-12)
    torch.testing.assert_close(lm.forward(torch.tensor([3])), ref.forward(torch.tensor([3])), rtol=0, atol=1e-12)
    # the draft wrote depths 1 and 2 only (depth-3 leaves are never run): it keeps the first two path nodes
    assert drafter.lm.length == len(context) + 2
    dref = CachedLM(drafter.model, 64)
    dref.forward(torch.tensor(kept[:-1]))
    for a, b in zip(drafter.lm.cache.layers, dref.cache.layers):
        torch.testing.assert_close(a.keys[:, :, :len(kept) - 1], b.keys[:, :, :len(kept) - 1], rtol=0, atol=1e-12)


def test_caches_never_reallocated(toy16):
    """A tree decode keeps its preallocated buffers: the draft's cache (which survives the call) is the same
    tensor storage before and after 80 tokens of trees whose branches were dropped by index copies."""
    drafter = sd.ModelDrafter(toy16.drafters["model"].model)
    drafter.reset(torch.tensor([1, 2, 3]), 3 + 80 + T.tree_size(Tree.from_branching([3, 2, 1, 1]), 4) + 1)
    ptrs = [(l.keys.data_ptr(), l.values.data_ptr()) for l in drafter.lm.cache.layers]
    res = sd.generate(toy16.target, [1, 2, 3], drafter=drafter, method="tree", k=4,
                      tree=Tree.from_branching([3, 2, 1, 1]), max_new_tokens=80)
    assert len(res.tokens) == 80 and min(res.stats["accepted_lengths"]) < 4  # some branches were dropped
    assert [(l.keys.data_ptr(), l.values.data_ptr()) for l in drafter.lm.cache.layers] == ptrs


# -- sampling: the law of the tree sampler ---------------------------------------------------------
def _law(h: tuple, V: int, salt: int) -> torch.Tensor:
    """A fixed random next-token law for history ``h`` (salt 0: target p, 1: draft q)."""
    g = torch.Generator().manual_seed(10_000 * salt + sum((t + 1) * (V + 1) ** i for i, t in enumerate(h)))
    return torch.softmax(1.5 * torch.randn(V, generator=g, dtype=torch.float64), -1)


def _pure_decode(n: int, V: int, shape: Tree, generator, draw=draw_siblings, verify=tree_speculative_sample):
    """n tokens from the laws of :func:`_law`, one tree step at a time (no model: draw + verify only)."""
    out = []
    while len(out) < n:
        h = tuple(out)
        tokens, laws, hist = [], [], {0: h}
        for i, path in enumerate(shape.paths, start=1):  # draw each family once, in tree order
            parent = shape.parents[i].item()
            if path[-1] == 0:
                toks, qs = draw(None, _law(hist[parent], V, 1), shape.n_children(path[:-1]), generator)
                fam = iter(zip(toks, qs))
            x, q = next(fam)
            tokens.append(x)
            laws.append(q)
            hist[i] = hist[parent] + (x,)
        p = torch.stack([_law(hist[i], V, 0) for i in range(shape.n + 1)])
        _, new = verify(shape, torch.tensor(tokens), torch.stack(laws), p, generator)
        out += new.tolist()
    return out[:n]


def _pvalue(samples: np.ndarray, law: np.ndarray, V: int) -> float:
    counts = np.bincount(ex.cell_index(samples, V), minlength=law.size)
    return ex.gof_test(counts, law, seed=len(samples)).pvalue


def _pure_law(n: int, V: int) -> np.ndarray:
    law = np.zeros(V ** n)
    for i, seq in enumerate(itertools.product(range(V), repeat=n)):
        law[i] = np.prod([_law(seq[:t], V, 0)[seq[t]].item() for t in range(n)])
    return law


def _draw_reporting_base_law(logits, q, m, generator):  # mutant: siblings drawn without replacement, but
    toks, _ = draw_siblings(logits, q, m, generator)     # every one reported as drawn from the parent's q
    return toks, [q] * len(toks)


def _keep_residual(r, q):  # mutant: residual not updated between siblings
    return r


PURE_SHAPE = Tree.from_branching([3, 2])
N_PURE = 2000


def _pure_pvalue(residual=None, draw=draw_siblings) -> float:
    verify = functools.partial(tree_speculative_sample, **({"residual": residual} if residual else {}))
    g = torch.Generator().manual_seed(2024)
    V = 4
    samples = np.array([_pure_decode(2, V, PURE_SHAPE, g, draw=draw, verify=verify) for _ in range(N_PURE)])
    return _pvalue(samples, _pure_law(2, V), V)


def test_recursive_rejection_sampling_law():
    """Two tokens (16 cells) through 3 + 6 node trees with very different p and q: the law is p."""
    assert _pure_pvalue() > ALPHA


def test_mutant_residual_not_updated_is_caught():
    assert _pure_pvalue(residual=_keep_residual) < ALPHA


def test_mutant_sibling_law_not_updated_is_caught():
    """Siblings drawn without replacement but verified with the parent's q (not the law they were drawn from)."""
    assert _pure_pvalue(draw=_draw_reporting_base_law) < ALPHA


def _toy_samples(toy, prompt, n, params, N, tree, k, drafter="model", rule=None):
    return ex.sample_sequences(toy.target, prompt, n, N, params, "tree", toy.drafters[drafter], k=k, tree=tree,
                               rule=rule).tokens


@pytest.fixture(scope="module")
def toy_law(toy):
    params = SamplingParams(temperature=1.0, top_k=3)
    return params, ex.sequence_law(toy.target, [1, 2, 3], 3, params)


@pytest.mark.parametrize("shape", [Tree.from_branching([3, 2]), Dynamic(budget=6, width=3, topk=3)])
def test_toy_tree_sequence_law(toy, toy_law, shape):
    """End to end through sd.generate: 3 tokens after [1, 2, 3], top-k 3 (27 cells). At the root the three
    children exhaust q's support, so the without-replacement laws go down to one-hot."""
    params, law = toy_law
    with torch.inference_mode():
        samples = _toy_samples(toy, [1, 2, 3], 3, params, 1000, shape, k=2)
    assert _pvalue(samples, law, 8) > ALPHA


def test_toy_ngram_trie_sequence_law(toy):
    """Deterministic siblings: the n-gram trie offers 3, 4 and 5 after "1 2" (one-hot laws, each given the
    siblings before it); 3 tokens (top-k 3) must still follow the target's law."""
    prompt = [1, 2, 3, 1, 2, 4, 6, 1, 2, 5, 7, 1, 2]
    params = SamplingParams(temperature=1.0, top_k=3)
    d = toy.drafters["ngram"]
    d.bind(toy.target)
    first = d.propose_tree(prompt, Tree.from_branching([3, 1]), 2, params, None)
    assert first.tree.widths == [3, 3] and first.tokens.tolist() == [5, 4, 3, 7, 6, 1]
    with torch.inference_mode():
        samples = _toy_samples(toy, prompt, 3, params, 1000, Tree.from_branching([3, 1]), k=2, drafter="ngram")
    assert _pvalue(samples, ex.sequence_law(toy.target, prompt, 3, params), 8) > ALPHA


def test_toy_mutant_residual_not_updated_is_caught(toy, toy_law):
    params, law = toy_law
    rule = functools.partial(tree_speculative_sample, residual=_keep_residual)
    with torch.inference_mode():
        samples = _toy_samples(toy, [1, 2, 3], 3, params, 1000, Tree.from_branching([3, 2]), k=2, rule=rule)
    assert _pvalue(samples, law, 8) < ALPHA


def test_tree_sampling_is_seeded(toy16):
    kw = dict(drafter=toy16.drafter, method="tree", k=3, max_new_tokens=25, temperature=1.0, top_k=6)
    a = sd.generate(toy16.target, [1, 2], seed=11, **kw)
    b = sd.generate(toy16.target, [1, 2], seed=11, **kw)
    c = sd.generate(toy16.target, [1, 2], seed=12, **kw)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_siblings_without_replacement():
    q = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    toks, laws = draw_siblings(None, q, 4, g)
    assert len(toks) == 3 and sorted(toks) == [0, 1, 2]  # no more children than q has tokens
    assert torch.equal(laws[0], q) and laws[1][toks[0]] == 0 and laws[2][toks[1]] == 0
    assert all(abs(float(l.sum()) - 1) < 1e-12 for l in laws)


# -- the embedded target (float32): near-tie rule ---------------------------------------------------
def _layer_skip_drafter(target, n_layers):
    """A cheap stand-in draft for the embedded target: its first n layers and its head."""
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:n_layers]
    draft.config.num_hidden_layers = n_layers
    return sd.ModelDrafter(draft)


@pytest.mark.slow
def test_embedded_tree_greedy(smol, smol_prompt):
    """float32: tree must equal autoregressive except at a near-tie (top-2 logit gap < 1e-3), reported."""
    drafter = smol.drafters.get("model") or _layer_skip_drafter(smol.target, 10)
    ar = sd.generate(smol.target, smol_prompt, max_new_tokens=40)
    for shape in (None, Dynamic(budget=12, width=4, topk=4)):
        sp = sd.generate(smol.target, smol_prompt, drafter=drafter, method="tree", k=4, tree=shape,
                         max_new_tokens=40)
        assert max(sp.stats["nodes_per_pass"]) > 4
        i, gap = ex.first_divergence(smol.target, smol_prompt, sp.tokens, ar.tokens)
        if i is not None:
            print(f"near-tie divergence at token {i}: top-2 logit gap {gap}")
        assert ex.excused(i, gap), f"divergence at token {i} is not a near-tie (gap {gap})"
