"""The static-shape step (``graphs=True``; :mod:`specdec_core.graphs`) is the eager step, proved on CPU.

What a CUDA graph captures is the static-shape pass: the T new entries written at slots held in a device tensor,
attention over the whole preallocated slab under a mask built from the slots (or the caller's tree mask), ids,
positions, slots and mask in input buffers. On CPU, ``graphs=True`` runs that pass without capturing it, so:

- in float64 on a toy pair, every static pass equals the eager pass **bit for bit** (largest difference 0.0 on this
  machine, with torch 2.13 and transformers 4.57): every step length 1..K+1 of linear verification, tree
  verification (T = nodes + 1, the tree's mask and positions), the model draft's one-token steps, catch-up passes
  and tree depths, the block draft's pass; after rollbacks and after tree compaction (pointer move and index copy);
  the batch's passes likewise;
- a planted wrong step (its mask lets a query see one slot past its own) is caught by the same comparison;
- ``generate``, ``stream`` and ``generate_batch`` with ``graphs=True`` give the tokens and the record (times aside)
  that ``graphs=False`` gives, for every method and drafter, greedy and sampled, several seeds;
- ``graphs`` other than "auto", True or False is refused, naming it.
"""
import dataclasses
import gc
import itertools
import weakref

import pytest
import torch

import specdec_core as sd
from specdec_core import lm as lm_module
from specdec_core.graphs import step_mode
from specdec_core.lm import CachedLM
from specdec_core.serving.cache import BatchLM
from specdec_core.tree import Dynamic, Tree, attention_bias, default_tree
from conftest import requires_cuda

K = 4
PROMPT = torch.tensor([1, 5, 3, 7, 2, 9, 9, 4, 0, 15, 2])


class SeesOneSlotAhead(CachedLM):
    """PLANTED WRONG: the static step's causal mask lets query t see the slot after its own."""

    def fill_mask(self, x, mask):
        super().fill_mask(x, mask)
        if mask is None:
            ahead = torch.arange(self.cache.capacity, device=self.device) == x.slots[:, None] + 1
            x.mask[0, 0].masked_fill_(ahead, 0.0)


class Twins:
    """The same passes and cache moves on an eager lm and a static one; ``diffs``: each pass's largest difference
    between their logits (0.0 when bit for bit)."""

    def __init__(self, model, capacity: int, static_lm=CachedLM):
        self.eager = CachedLM(model, capacity)
        self.static = static_lm(model, capacity, "static")
        self.diffs: list[tuple[str, float, bool, bool]] = []  # label, difference, bit for bit, a causal step

    def forward(self, label: str, tokens, **kw) -> torch.Tensor:
        causal_step = self.static.length > 0 and "mask" not in kw  # a static pass with the causal mask
        a = self.eager.forward(tokens, **kw)
        b = self.static.forward(tokens, **kw)
        self.diffs.append((label, float((a - b).abs().max()), torch.equal(a, b), causal_step))
        return a

    def rollback(self, n: int) -> None:
        self.eager.cache.rollback(n)
        self.static.cache.rollback(n)

    def retain(self, slots: list[int], start: int) -> None:
        self.eager.cache.retain(slots, start)
        self.static.cache.retain(slots, start)

    @property
    def length(self) -> int:
        assert self.eager.length == self.static.length
        return self.eager.length


def tree_verify(tw: Twins, tree: Tree, label: str, path: list[int]) -> None:
    """Verify [root, nodes] with the tree's positions and mask, then keep the root and ``path`` (TreeDecoding's commit)."""
    L = tw.length
    tokens = torch.arange(tree.n + 1) % 16
    tw.forward(f"{label} verify T={tree.n + 1}", tokens, positions=L + tree.depths,
               mask=tree.bias(L, torch.float64, "cpu"))
    tw.retain([L + i for i in path], start=L + 1)
    tw.forward(f"{label} after compaction", torch.tensor([3]), logits_to_keep=1)


def target_script(pair, static_lm=CachedLM) -> Twins:
    """The target's passes: prefill, linear verification at every T = 1..K+1 with rollbacks of every size, tree
    verification of three shapes with compaction by a pointer move and by an index copy."""
    tw = Twins(pair.target, 96, static_lm)
    tw.forward("prefill", PROMPT)
    for T in range(1, K + 2):
        for rejected in range(T):
            tw.forward(f"linear verify T={T}", (torch.arange(T) * 3 + rejected) % 16)
            tw.rollback(rejected)
    tw.forward("autoregressive T=1", torch.tensor([6]), logits_to_keep=1)
    tree_verify(tw, Tree.chain(K), "chain", [1, 2])  # the accepted entries already in place: a pointer move
    tree_verify(tw, default_tree(K), "default tree", [2, K + 2])  # off the spine: an index copy
    tree_verify(tw, Tree.from_branching([2, 2]), "2x2 tree", [])  # all rejected: only the root stays
    return tw


def draft_script(pair, static_lm=CachedLM) -> Twins:
    """The model draft's passes (ModelDrafter): catch-up passes of 1 and 2 tokens and one-token steps (last row
    only), rollbacks; a tree's depths (positions = depth, the frontier's mask); compaction of its accepted path."""
    tw = Twins(pair.drafters["model"].model, 96, static_lm)
    tw.forward("draft prefill", PROMPT, logits_to_keep=1)
    for unseen in (1, 2, 1):
        tw.forward(f"catch-up T={unseen}", torch.arange(unseen) + 4, logits_to_keep=1)
        for i in range(K - 1):
            tw.forward("draft step T=1", torch.tensor([i + 1]), logits_to_keep=1)
        tw.rollback(K - 2)
    base = tw.length
    tree = default_tree(K)
    for depth in range(1, tree.depth):
        nodes = [i for i in range(1, tree.n + 1) if int(tree.depths[i]) == depth]
        first, last = nodes[0], nodes[-1] + 1
        mask = attention_bias(tree.mask[first:last, 1:last], base, torch.float64, "cpu")
        tw.forward(f"draft tree depth {depth} T={len(nodes)}", torch.tensor(nodes) % 16,
                   positions=torch.full((len(nodes),), base - 1 + depth), mask=mask)
    tw.retain([base, base + 3], start=base)  # two accepted nodes, not contiguous: an index copy
    tw.forward("draft after compaction", torch.tensor([2]), logits_to_keep=1)
    return tw


def block_script(pair, static_lm=CachedLM) -> Twins:
    """The block draft's passes (BlockDrafter): unseen tokens + K - 1 masks, the last K rows over its own
    vocabulary, only the unseen committed."""
    drafter = pair.drafters["block"]
    tw = Twins(drafter.model, 96, static_lm)
    tw.forward("block prefill", PROMPT, commit=PROMPT.numel() - 1, logits_to_keep=1, full_vocab=False)
    for k in range(1, K + 1):
        for unseen in (1, 2):
            ids = torch.tensor([5] * unseen + drafter.mask_ids(k - 1))
            tw.forward(f"block k={k} unseen={unseen}", ids, commit=unseen, logits_to_keep=k, full_vocab=False)
            tw.rollback(unseen - 1)
    return tw


SCRIPTS = {"target": target_script, "model draft": draft_script, "block draft": block_script}


@pytest.mark.parametrize("script", list(SCRIPTS))
@pytest.mark.parametrize("static_lm, exact", [(CachedLM, True), (SeesOneSlotAhead, False)],
                         ids=["static step", "planted: sees one slot ahead"])
def test_static_step_equals_the_eager_step(toy16, script, static_lm, exact):
    """Every static pass's logits equal the eager pass's bit for bit (largest difference 0.0); the planted wrong
    mask changes the logits of every causal pass after the prefill (the comparison is not vacuous)."""
    diffs = SCRIPTS[script](toy16, static_lm).diffs
    worst = max(d for _, d, _, _ in diffs)
    assert len(diffs) > 5
    if exact:
        assert all(equal for _, _, equal, _ in diffs), (f"largest difference {worst:.3g}",
                                                        [(label, d) for label, d, equal, _ in diffs if not equal])
    else:
        causal = [(label, d) for label, d, _, causal_step in diffs if causal_step]
        assert len(causal) > 5 and all(d > 1e-6 for _, d in causal), causal


def test_batch_static_step_equals_the_eager_step(toy16):
    """generate_batch's passes (rows of different lengths, right-padded, ragged commits) bit for bit."""
    rows = [PROMPT.tolist(), [3, 3, 2, 5, 6, 7], [0, 15, 2, 2, 8]]
    eager, static = BatchLM(toy16.target, 3, 40), BatchLM(toy16.target, 3, 40, "static")
    assert torch.equal(eager.prefill(rows), static.prefill(rows))
    for T in range(1, K + 2):
        feed = [[1] * T, [2] * (T - 1), [3] * T]
        a, b = eager.forward(feed), static.forward(feed)
        assert torch.equal(a, b), (T, float((a - b).abs().max()))
        commit = torch.tensor([T, max(T - 1, 0), 1])
        eager.cache.advance(commit)
        static.cache.advance(commit)


# -- the decoders with graphs=True on CPU ----------------------------------------------------------------------------
SPECS = [("autoregressive", None, {}), ("linear", "model", {}), ("linear", "ngram", {}), ("linear", "block", {}),
         ("linear", "hybrid", {}), ("linear", "adaptive", {}), ("parallel", "block", {}), ("tree", "model", {}),
         ("tree", "ngram", {}), ("tree", "block", {}), ("tree", "hybrid", {}),
         ("tree", "model", {"tree": Dynamic(budget=8, width=3, topk=2)}),
         ("linear", "model", {"confidence": 0.5}), ("tree", "model", {"confidence": 0.3})]


def _record(stats) -> dict:
    """The run record without its times."""
    return {k: v for k, v in dataclasses.asdict(stats).items() if not k.endswith("_s") and k != "token_times"}


@pytest.mark.parametrize("method, drafter, extra", SPECS, ids=[f"{m}:{d}{'+' if e else ''}" for m, d, e in SPECS])
def test_generate_with_graphs_decodes_what_eager_decodes(toy16, method, drafter, extra):
    """Same tokens, same record (steps, passes, accepted and proposed counts, α tests), temperatures 0 and 1,
    seeds 0–2; the budget (23 tokens) shortens the last verification."""
    d = toy16.drafters[drafter] if drafter else None
    for temperature in (0.0, 1.0):
        for seed in range(3):
            kw = dict(drafter=d, method=method, k=K, max_new_tokens=23, temperature=temperature, seed=seed, **extra)
            ref = sd.generate(toy16.target, PROMPT, graphs=False, **kw)
            got = sd.generate(toy16.target, PROMPT, graphs=True, **kw)
            assert got.tokens == ref.tokens, (temperature, seed)
            assert _record(got.stats) == _record(ref.stats), (temperature, seed)


def test_stream_with_graphs_yields_what_eager_yields(toy16):
    for method, drafter in (("linear", "model"), ("tree", "model"), ("parallel", "block")):
        kw = dict(drafter=toy16.drafters[drafter], method=method, k=K, max_new_tokens=20, temperature=1.0, seed=4)
        assert list(sd.stream(toy16.target, PROMPT, graphs=True, **kw)) == list(sd.stream(toy16.target, PROMPT, **kw))


def test_two_open_streams_never_share_a_static_cache(toy16):
    """Static caches are kept between decodes, never shared by two at once: interleaved streams decode as alone
    (each with its own drafter: two live decodes on one drafter are refused, tests/test_engine.py)."""
    kw = dict(method="linear", k=K, max_new_tokens=16, graphs=True)
    ngram = toy16.drafters["ngram"]
    alone = [sum(sd.stream(toy16.target, p, drafter=ngram, **kw), []) for p in (PROMPT, PROMPT[:5])]
    a = sd.stream(toy16.target, PROMPT, drafter=ngram, **kw)
    b = sd.stream(toy16.target, PROMPT[:5], drafter=ngram.fork(), **kw)
    out_a, out_b = [], []
    for x, y in itertools.zip_longest(a, b, fillvalue=[]):
        out_a += x
        out_b += y
    assert [out_a, out_b] == alone
    kept = lm_module._IDLE.get(toy16.target, [])
    assert kept and all(lm.model is None and lm.step_mode == "static" for lm in kept)  # they do not hold the model


def test_static_caches_are_kept_between_decodes_without_keeping_the_model():
    """A decode with graphs=True borrows the static cache (and its captured steps) an earlier decode of a nearby
    length left; the kept caches do not keep the model alive."""
    pair = sd.toy_pair(vocab_size=16, seed=2)
    target = pair.target
    del pair
    sd.generate(target, PROMPT, max_new_tokens=8, graphs=True)
    [lm] = lm_module._IDLE[target]
    shapes = set(lm._inputs)
    sd.generate(target, PROMPT[:6], max_new_tokens=12, graphs=True)
    assert lm_module._IDLE[target] == [lm] and shapes and set(lm._inputs) == shapes  # the same steps, replayed
    alive = weakref.ref(target)
    del target
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("method, drafter", [("autoregressive", None), ("linear", "model"), ("linear", "ngram"),
                                             ("parallel", "block")])
def test_generate_batch_with_graphs_decodes_what_eager_decodes(toy16, method, drafter):
    prompts = [PROMPT.tolist(), [3, 3, 2], [0, 15, 2, 2, 8, 11, 6, 1, 1, 4]]
    d = toy16.drafters[drafter] if drafter else None
    for temperature in (0.0, 1.0):
        kw = dict(drafter=d, method=method, k=K, max_new_tokens=18, temperature=temperature, seed=7)
        ref = sd.generate_batch(toy16.target, prompts, graphs=False, **kw)
        got = sd.generate_batch(toy16.target, prompts, graphs=True, **kw)
        assert got.tokens == ref.tokens
        assert [_record(r.stats) for r in got.results] == [_record(r.stats) for r in ref.results]
        times = ("seconds", "tokens_per_s", "slot_use")  # eager packs ragged rows (every slot a token), graphs pad
        assert {k: v for k, v in got.stats.items() if k not in times} == {k: v for k, v in ref.stats.items()
                                                                          if k not in times}
        assert ref.stats["slot_use"] == 1.0 and got.stats["slot_use"] <= 1.0


def test_step_modes():
    assert step_mode("auto", "cpu") == "eager" and step_mode(False, "cpu") == "eager"
    assert step_mode(True, "cpu") == "static"
    assert step_mode("auto", "cuda") == "graph" and step_mode(True, "cuda:0") == "graph"
    assert step_mode(False, "cuda") == "eager"
    with pytest.raises(ValueError, match="graph"):
        CachedLM(sd.toy_pair().target, 8, "graph")


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, "graph", "True"])
def test_graphs_argument_is_checked(toy16, bad):
    with pytest.raises(ValueError, match="graphs"):
        sd.generate(toy16.target, PROMPT, graphs=bad)
    with pytest.raises(ValueError, match="graphs"):
        sd.stream(toy16.target, PROMPT, graphs=bad)
    with pytest.raises(ValueError, match="graphs"):
        sd.generate_batch(toy16.target, [PROMPT.tolist()], graphs=bad)


@requires_cuda
def test_captured_steps_decode_what_eager_decodes():
    pair = sd.toy_pair(vocab_size=16, seed=1, device="cuda")
    for method, drafter in (("autoregressive", None), ("linear", "model"), ("tree", "model"), ("parallel", "block")):
        kw = dict(drafter=pair.drafters[drafter] if drafter else None, method=method, k=K, max_new_tokens=24)
        assert sd.generate(pair.target, PROMPT, graphs=True, **kw).tokens == \
            sd.generate(pair.target, PROMPT, graphs=False, **kw).tokens
