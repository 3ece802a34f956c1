"""The draft's fast pass (models/draft_step.py): the same layers as transformers' modules, one kernel call a layer,
the head's rows in float16; and q, however computed, exactly the law the draft sampled from."""
from __future__ import annotations

import pytest
import torch

import specdec_core as sd
from specdec_core import kernels
from specdec_core.kvcache import CacheFullError
from specdec_core.lm import CachedLM
from specdec_core.models import draft_step
from specdec_core.sampling import SamplingParams
from specdec_core.study import exactness, mutants

pytestmark = pytest.mark.skipif(kernels.load() is None, reason=f"no rows kernel here: {kernels.failure()}")


@pytest.fixture(scope="module")
def fast():
    """The embedded pair with its model and block drafts routed through the kernel (whatever this machine's
    calibration chose for them), so that the fast path runs."""
    pair = sd.load_pair("smollm2-135m")
    if "model" not in pair.drafters:
        pytest.skip("no shipped model draft (make models)")
    for name in ("model", "block"):
        if name in pair.drafters:
            kernels.install(pair.drafters[name].model)
    return pair


def test_half_weights_stream_at_half_the_bytes_and_give_the_float32_bits():
    rows = kernels.load()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 160, generator=g).half().float()  # every weight a float16 number
    x = torch.randn(3, 160, generator=g)
    full, half = rows.pack(w), rows.pack(w.half())
    assert half.dtype == torch.float16 and half.nbytes * 2 == full.nbytes
    assert torch.equal(rows.linear(x, full, 300, None), rows.linear(x, half, 300, None))
    other = torch.randn(300, 160, generator=g)  # not float16 numbers: the rounded weights' product
    assert torch.allclose(rows.linear(x, rows.pack(other.half()), 300, None), x @ other.half().float().T, atol=1e-4)


@pytest.mark.parametrize("name", ["model", "block"])
def test_the_fast_trunk_computes_the_module_path(fast, name):
    """Feeds after a prefill (one token, several): hidden states within float32 rounding of transformers' modules,
    and the same greedy token from the rounded head; a pass past the cache raises as the cache would."""
    d = fast.drafters[name].model
    ids = fast.encode_chat("Explain in two sentences why the sky is blue.")
    feeds = [ids, torch.tensor([5]), torch.tensor([7, 8, 9]), torch.tensor([11]), torch.tensor([3, 4, 5, 6, 7])]
    a, b = CachedLM(d, 80), CachedLM(d, 80)
    with torch.inference_mode():
        for i, f in enumerate(feeds):
            T, L = f.numel(), a.cache.length
            kw = dict(position_ids=torch.arange(L, L + T).view(1, T), cache_position=torch.arange(L, L + T),
                      use_cache=True)
            emb = d.embedding(f.view(1, T))
            got = draft_step.trunk(d, emb, past_key_values=a.cache, **kw)
            assert (got is None) == (i == 0), "the prefill takes the module path, every later pass the fast one"
            if got is None:
                got = d.trunk(inputs_embeds=emb, past_key_values=a.cache, **kw)
            want = d.trunk(inputs_embeds=emb, past_key_values=b.cache, **kw).last_hidden_state
            h = got.last_hidden_state
            assert float((h - want).norm() / want.norm()) < 1e-5
            assert torch.equal(draft_step.head(d, h).argmax(-1), (want @ d.head.T).argmax(-1))
            a.cache.advance(T)
            b.cache.advance(T)
        L = a.cache.length
        with pytest.raises(CacheFullError):
            draft_step.trunk(d, d.embedding(torch.ones(1, 80 - L + 1, dtype=torch.long)),
                             position_ids=torch.arange(L, 81).view(1, -1), past_key_values=a.cache)


def test_the_fast_path_steps_aside_where_it_does_not_apply(fast):
    d = fast.drafters["model"].model
    lm = CachedLM(d, 40)
    lm.forward(torch.tensor([1, 2, 3]))
    emb = d.embedding(torch.tensor([[4, 5]]))
    pos = torch.tensor([[3, 4]])
    with torch.inference_mode():
        assert draft_step.trunk(d, emb, position_ids=pos, past_key_values=lm.cache) is not None
        mask = torch.zeros(1, 1, 2, 5)  # a tree's mask
        assert draft_step.trunk(d, emb, position_ids=pos, past_key_values=lm.cache, attention_mask=mask) is None
        assert draft_step.trunk(d, emb.double(), position_ids=pos, past_key_values=lm.cache) is None
    with torch.enable_grad():  # training
        assert draft_step.trunk(d, emb, position_ids=pos, past_key_values=lm.cache) is None


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_q_is_the_law_the_fast_draft_sampled_from_and_the_float32_head_mutant_is_caught(fast, temperature):
    """The exactness family's check for the fast path: the reported q equals, to the bit, the law the draft's
    library path gives on the same tokens. The mutant that reports q from the float32 head (while sampling from the
    float16 one) is off by about 10⁻⁴–10⁻³, beyond any sample's power, and is caught here."""
    model = fast.drafters["model"]
    context = fast.encode_chat("Write a short poem about the sea.").tolist()
    params = SamplingParams(temperature=temperature)
    assert exactness.reported_law_gap(model, model.model, context, 4, params, seed=1) == 0.0
    gap = exactness.reported_law_gap(mutants.FullPrecisionHeadQ(model), model.model, context, 4, params, seed=1)
    assert gap > 1e-6, f"the float32-head mutant went unseen (gap {gap})"
    with pytest.raises(ValueError, match="greedy"):
        exactness.reported_law_gap(model, model.model, context, 4, SamplingParams())


def test_greedy_speculation_on_the_fast_path_gives_the_autoregressive_tokens(fast):
    ids = fast.encode_chat("Give three tips for learning Python.")
    ar = sd.generate(fast.target, ids, max_new_tokens=24)
    for method, name in (("linear", "model"), ("parallel", "block")):
        spec = sd.generate(fast.target, ids, drafter=fast.drafters[name], method=method, k=4, max_new_tokens=24)
        assert spec.tokens == ar.tokens, (method, name)
