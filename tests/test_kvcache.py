import os

import torch

import specdec_core as sd
from specdec_core.drafters import Draft, Drafter
from specdec_core.kvcache import KVCache
from specdec_core.lm import CachedLM


def test_preallocated_once_and_rollback_is_a_pointer_move(toy):
    lm = CachedLM(toy.target, 64)
    ptrs = [l.keys.data_ptr() for l in lm.cache.layers]
    lm.forward(torch.tensor([1, 2, 3, 4, 5]))
    assert lm.length == 5
    lm.cache.rollback(3)
    assert lm.length == 2
    lm.forward(torch.tensor([6]))
    assert lm.length == 3
    assert [l.keys.data_ptr() for l in lm.cache.layers] == ptrs


def test_rolled_back_entries_are_invisible(toy):
    """Logits after a rollback equal those of a cache that never saw the rejected tokens."""
    a, b = CachedLM(toy.target, 32), CachedLM(toy.target, 32)
    a.forward(torch.tensor([1, 2, 3]))
    a.forward(torch.tensor([7, 7, 7, 7]))  # rejected
    a.cache.rollback(4)
    la = a.forward(torch.tensor([4, 5]))
    b.forward(torch.tensor([1, 2, 3]))
    lb = b.forward(torch.tensor([4, 5]))
    assert torch.equal(la, lb)


def test_compact_keeps_selected_positions(toy):
    """Two branches after the prefix [1 2 3]: 4→5 and 6. Keep the path 4→5 and compare with plain decoding."""
    a, b = CachedLM(toy.target, 32), CachedLM(toy.target, 32)
    a.forward(torch.tensor([1, 2, 3]))
    allowed = torch.tensor([[1, 1, 1, 1, 0, 0],   # node 4 (depth 1) sees the prefix and itself
                            [1, 1, 1, 0, 1, 0],   # node 6 (depth 1, sibling) sees the prefix and itself
                            [1, 1, 1, 1, 0, 1]])  # node 5 (depth 2, child of 4)
    mask = torch.zeros(1, 1, 3, 6, dtype=torch.float64).masked_fill(allowed == 0, torch.finfo(torch.float64).min)
    a.forward(torch.tensor([4, 6, 5]), positions=torch.tensor([3, 3, 4]), mask=mask)
    a.cache.compact(torch.tensor([3, 5]), start=3)
    assert a.length == 5
    b.forward(torch.tensor([1, 2, 3, 4, 5]))
    for la, lb in zip(a.cache.layers, b.cache.layers):
        torch.testing.assert_close(la.keys[:, :, :5], lb.keys[:, :, :5], rtol=0, atol=1e-12)
        torch.testing.assert_close(la.values[:, :, :5], lb.values[:, :, :5], rtol=0, atol=1e-12)


def test_overflow_is_an_error(toy):
    lm = CachedLM(toy.target, 4)
    lm.forward(torch.tensor([1, 2, 3]))
    try:
        lm.forward(torch.tensor([1, 2]))
    except ValueError as e:
        assert "does not fit the KV cache" in str(e)
    else:
        raise AssertionError("overflow not detected")


class AlwaysWrong(Drafter):
    """Proposes k tokens the toy target never picks greedily (the target's argmax is avoided)."""

    name = "always-wrong"

    def propose(self, context, k, params, generator):
        return Draft(torch.full((k,), (context[-1] + 3) % 8, dtype=torch.long), None, passes=0)


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_flat_over_1000_rejecting_steps(toy):
    ids = [1, 2, 3]
    sd.generate(toy.target, ids, drafter=AlwaysWrong(), method="linear", k=4, max_new_tokens=50)  # warm-up
    before = _rss_bytes()
    res = sd.generate(toy.target, ids, drafter=AlwaysWrong(), method="linear", k=4, max_new_tokens=1000)
    grown = _rss_bytes() - before
    assert res.stats["target_passes"] >= 900  # most steps rejected: about one token per pass
    assert sum(res.stats["accepted_lengths"]) < 0.1 * sum(res.stats["proposed"])
    cache_bytes = KVCache(toy.target.config, 1010, torch.float64, "cpu").nbytes()
    assert grown < 8 * cache_bytes + (4 << 20), f"RSS grew by {grown} bytes"


def test_a_dropped_cache_frees_its_slabs_without_a_garbage_collection(toy, without_cyclic_gc):
    """A slab reads its owner's length through a weak reference, so a cache and its slabs form no cycle: dropped,
    a single-sequence cache and a batch cache free their tensors at once, with the cyclic collector off (the engine
    serves many runs in one process; before, each run's caches waited for a full collection, and chapter 9's sweep
    grew by 130 MB a run until the machine swapped). The mutant, an owner held strongly, keeps the slab alive."""
    import weakref

    from specdec_core.serving.cache import BatchKVCache

    def slab_outlives(make, strong=False):
        cache = make()
        layer = cache.layers[0]
        if strong:
            layer.owner = cache  # the mutant: the cycle back
        keys = weakref.ref(layer.keys)
        del cache, layer
        return keys() is not None

    single = lambda: KVCache(toy.target.config, 16, torch.float64, "cpu")  # noqa: E731
    batch = lambda: BatchKVCache(toy.target.config, 2, 16, torch.float64, "cpu")  # noqa: E731
    assert not slab_outlives(single) and not slab_outlives(batch)
    assert slab_outlives(single, strong=True)
