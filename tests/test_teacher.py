"""Teacher data (:func:`specdec_core.train.teacher.teacher_batch`): the target's own answers and its law at each step.

A greedy row must be the target's autoregressive decoding of its prompt, cut after EOS, whatever its neighbours
in the batch (float64 toy target: identical), and the law recorded at every position must be the top-k of the
full-vocabulary softmax of the target's logits on that row's own prefix (checked against a teacher-forced pass,
to float16 rounding). Sampled rows: the first tokens of 2000 rows follow softmax(logits / T) (chi-square at level
1e-3, a false-positive rate of 0.1 % for a correct sampler; fixed seeds make the outcome deterministic) while the
recorded law stays the temperature-1 law. Dropping finished rows from the cache changes nothing (both ways
tested). Mutants: a cache that never commits a row's token (caught by the greedy test's comparison) and a sampler
that ignores the temperature (caught by the law test).
"""
import numpy as np
import pytest
import torch

import specdec_core as sd
from specdec_core.serving.cache import BatchLM
from specdec_core.study import exactness as ex
from specdec_core.train import teacher

PROMPTS = [[1, 2, 3], [4, 4, 4, 4, 9], [0], [5, 6, 7, 8, 9, 10, 11]]
EOS, K = 8, 5  # token 8 ends rows 0, 1, 2 and 3 of the toy target's greedy answers at different steps


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with ex.torch_threads(1):
        yield


def _cut(tokens, eos):
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def _teacher(pair, temperature=0.0, n=20, prompts=PROMPTS, seed=0, **kw):
    return teacher.teacher_batch(pair.target, [torch.tensor(p) for p in prompts], n, temperature, K, seed, EOS, **kw)


def _greedy_mismatches(pair, **kw) -> list[int]:
    recs = _teacher(pair, **kw)
    return [i for i, (p, r) in enumerate(zip(PROMPTS, recs))
            if r["response"].tolist() != _cut(sd.generate(pair.target, p, max_new_tokens=20).tokens, EOS)]


@pytest.mark.parametrize("compact_below", [0.75, 0.0], ids=["finished rows dropped", "finished rows kept"])
def test_greedy_rows_are_autoregressive_decoding_cut_after_eos(toy16, compact_below):
    recs = _teacher(toy16, compact_below=compact_below)
    assert _greedy_mismatches(toy16, compact_below=compact_below) == []
    assert [len(r["response"]) for r in recs] == [3, 8, 18, 6]  # every row ends on its own EOS (or the budget)
    for p, r in zip(PROMPTS, recs):
        n = len(r["response"])
        assert r["top_idx"].shape == r["top_logp"].shape == (n, K)
        assert r["top_idx"].dtype == torch.int32 and r["top_logp"].dtype == torch.float16
        assert torch.equal(r["top_idx"][:, 0], r["response"])  # greedy: the recorded argmax is the token taken
        ids = torch.tensor(p + r["response"].tolist()[:-1])
        with torch.no_grad():
            law = torch.log_softmax(toy16.target(input_ids=ids[None]).logits[0, len(p) - 1:], -1).topk(K, -1)
        assert torch.equal(r["top_idx"].long(), law.indices)
        torch.testing.assert_close(r["top_logp"].double(), law.values.half().double(), rtol=0, atol=1e-3)


def test_a_cache_that_never_commits_is_caught(toy16):
    assert _greedy_mismatches(toy16, commit=lambda fed: [0] * len(fed)), \
        "the mutant decoded like the correct cache: the comparison cannot fail"


def test_select_rows_gathers_rows_and_names_bad_ones(toy16):
    lm = BatchLM(toy16.target, 4, 16)
    lm.prefill(PROMPTS)
    before = [layer.keys.clone() for layer in lm.cache.layers]
    lengths = lm.cache.lengths.clone()
    lm.cache.select_rows(torch.tensor([3, 1]))
    assert lm.cache.batch == 2 and lm.cache.lengths.tolist() == lengths[[3, 1]].tolist()
    assert all(torch.equal(layer.keys, b[[3, 1]]) for layer, b in zip(lm.cache.layers, before))
    for bad in ([], [2], [-1]):
        with pytest.raises(ValueError, match="row indices"):
            lm.cache.select_rows(torch.tensor(bad, dtype=torch.long))


def _first_token_pvalue(pair, temperature, law_temperature, sampler_patch=None):
    prompt, N = [2], 2000  # a flat law, far from its T = 0.5 version (total variation 0.28)
    recs = _teacher(pair, temperature, n=1, prompts=[prompt] * N, seed=11)
    counts = np.bincount([int(r["response"][0]) for r in recs], minlength=16)
    with torch.no_grad():
        logits = pair.target(input_ids=torch.tensor([prompt])).logits[0, -1]
    probs = torch.softmax(logits / law_temperature, -1).numpy()
    return ex.gof_test(counts, probs, mc=9999, seed=5).pvalue, recs[0], logits


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampled_rows_follow_the_tempered_law_and_record_the_plain_one(toy16, temperature):
    p, rec, logits = _first_token_pvalue(toy16, temperature, temperature)
    assert p > 1e-3, f"first tokens at T = {temperature} do not follow softmax(logits / T): p = {p:.2g}"
    law = torch.log_softmax(logits, -1).topk(K)  # recorded: the temperature-1 law, whatever T decoded with
    assert torch.equal(rec["top_idx"][0].long(), law.indices)
    torch.testing.assert_close(rec["top_logp"][0].double(), law.values.half().double(), rtol=0, atol=1e-3)


def test_a_sampler_that_ignores_the_temperature_is_caught(toy16):
    p, _, _ = _first_token_pvalue(toy16, 1.0, 0.5)  # the rows a T-ignoring sampler would draw at T = 0.5
    assert p < 1e-3, f"the law test cannot tell T = 1 draws from T = 0.5's law (p = {p:.2g})"


def test_sampled_rows_are_seeded(toy16):
    a, b, c = (_teacher(toy16, 1.0, seed=s) for s in (3, 3, 4))
    assert all(torch.equal(x["response"], y["response"]) for x, y in zip(a, b))
    assert any(not torch.equal(x["response"], z["response"]) for x, z in zip(a, c))


def test_an_unknown_teacher_set_is_named():
    from specdec_core.train import drafts

    with pytest.raises(ValueError, match="unknown teacher set 'wider'"):
        teacher.teacher_data(None, drafts.Recipe(teacher="wider"))
