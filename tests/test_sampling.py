import math

import pytest
import torch

from specdec_core.sampling import SamplingParams, process_logits, sample


def test_greedy_is_one_hot_on_first_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0]])
    p = process_logits(logits, SamplingParams(0.0))
    assert p.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_temperature_matches_softmax():
    logits = torch.randn(5, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    p = process_logits(logits, SamplingParams(0.7))
    torch.testing.assert_close(p, torch.softmax(logits / 0.7, -1))


def test_top_k_keeps_k_largest():
    logits = torch.tensor([0.0, 5.0, 1.0, 4.0, 3.0], dtype=torch.float64)
    p = process_logits(logits, SamplingParams(1.0, top_k=2))
    assert (p > 0).tolist() == [False, True, False, True, False]
    assert math.isclose(float(p.sum()), 1.0)


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    p = process_logits(probs.log(), SamplingParams(1.0, top_p=0.75))
    torch.testing.assert_close(p, torch.tensor([0.625, 0.375, 0.0, 0.0], dtype=torch.float64))
    # the top token alone always survives
    p = process_logits(probs.log(), SamplingParams(1.0, top_p=0.1))
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_top_k_then_top_p_order():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    # top_k=3 renormalizes to [4/9, 3/9, 2/9]; top_p=0.7 then keeps the first two
    p = process_logits(probs.log(), SamplingParams(1.0, top_k=3, top_p=0.7))
    torch.testing.assert_close(p, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("kw, word", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.2), "top_p"),
])
def test_bad_sampling_parameters_are_named(kw, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kw)


def test_sample_is_seeded():
    p = torch.full((3, 10), 0.1, dtype=torch.float64)
    a = sample(p, torch.Generator().manual_seed(3))
    b = sample(p, torch.Generator().manual_seed(3))
    assert a.tolist() == b.tolist() and a.shape == (3,)


def _unscaled(probs, generator):  # mutant: the uniform is not scaled by the row's total
    cum = probs.cumsum(-1)
    u = torch.rand((*probs.shape[:-1], 1), dtype=cum.dtype, generator=generator)
    return torch.searchsorted(cum, u, right=True).clamp_max(probs.shape[-1] - 1).squeeze(-1)


@pytest.mark.parametrize("sampler, exact", [(sample, True), (_unscaled, False)])
def test_sample_draws_the_weights_law(sampler, exact):
    """Chi-square of 20 000 draws from unnormalized weights with zeros (false-positive rate 1e-3): the sampler's
    law is the weights' own, a zero weight is never drawn, and a sampler that ignores the total is caught."""
    from scipy.stats import chisquare

    w = torch.tensor([0.0, 2.0, 0.0, 1.0, 0.5, 0.5, 0.0], dtype=torch.float64)  # total 4, zeros inside and last
    draws = sampler(w.expand(20_000, -1), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=w.numel()).double()
    assert counts[w == 0].sum() == 0 or not exact
    support = w > 0
    p = chisquare(counts[support].numpy(), (w[support] / w.sum() * counts[support].sum()).numpy()).pvalue
    assert (p > 1e-3) == exact, f"chi-square p = {p:.3g}"
