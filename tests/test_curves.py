"""The controlled draft of chapter 10 (:mod:`specdec_core.study.curves`): its acceptance law, greedy identity, the
cost drafter's cache, its errors, and the helpers that turn a grid run into the chapter's tables.

Statistical checks use fixed seeds (a deterministic outcome) at a stated level: α̂ is tested against Binomial(n, α)
with a two-sided exact test at 1e-3, so a correct drafter fails with probability 1e-3 per check; a mutant whose
acceptance is not i.i.d. Bernoulli(α) (one draw per step decides every position) is shown to be caught.
"""
import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest

import specdec_core as sd
from specdec_core.drafters import ModelDrafter
from specdec_core.study import bench, curves
from specdec_core.study.theory import speedup

LEVEL = 1e-3
PROMPTS = [torch.tensor([1, 5, 3, 7, 2]), torch.tensor([9, 9, 4, 9, 9, 4, 9]), torch.tensor([3, 1, 4, 1, 5, 9])]
N = 40  # new tokens per call


@pytest.fixture(scope="module")
def refs(toy16):
    return [curves.greedy_reference(toy16.target, p, N) for p in PROMPTS]


class OneDrawPerStep(curves.ControlledDrafter):
    """Mutant: one uniform per step keeps every position or none, so acceptance is α per *step*, not i.i.d. per
    tested position (after an accepted first token the rest are always accepted)."""

    def propose(self, context, k, params, generator, confidence=None):
        n, ref = len(context), self.reference
        tokens = ref[n:n + k]
        if tokens and float(torch.rand(1, generator=self._rng)) >= self.alpha:
            tokens[0] = (tokens[0] + 1) % self.vocab_size
        self._proposed = tokens
        return sd.Draft(torch.tensor(tokens, dtype=torch.long), None, passes=0)


class NaiveCost(curves.ControlledDrafter):
    """Mutant: tells the cost drafter that n of *its own* tokens were kept, whatever was committed."""

    def accept(self, n):
        self.cost.accept(n)


def pooled(toy16, refs, alpha, cls=curves.ControlledDrafter, k=4, min_tested=2000):
    """Decode with the controlled draft, seed after seed, until ``min_tested`` positions were tested."""
    acc = tested = seed = 0
    while tested < min_tested:
        for p, ref in zip(PROMPTS, refs):
            r = sd.generate(toy16.target, p, drafter=cls(ref, alpha, seed=seed), method="linear", k=k, max_new_tokens=N)
            acc, tested = acc + sum(r.stats.accepted_lengths), tested + sum(r.stats.proposed)
        seed += 1
    return acc, tested


@pytest.mark.parametrize("alpha", [0.3, 0.9])
def test_acceptance_is_bernoulli_alpha_per_tested_position(toy16, refs, alpha):
    acc, tested = pooled(toy16, refs, alpha)
    p = binomtest(acc, tested, alpha).pvalue
    assert p > LEVEL, f"α = {alpha}: α̂ = {acc / tested:.4f} over {tested} tested positions, p = {p:.2e}"
    # the mutant with one draw per step is caught by the same test on as many positions
    acc_m, tested_m = pooled(toy16, refs, alpha, cls=OneDrawPerStep)
    assert binomtest(acc_m, tested_m, alpha).pvalue < LEVEL, f"mutant not caught: α̂ = {acc_m / tested_m:.4f}"


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("with_cost", [False, True])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_is_autoregressive(toy16, refs, alpha, with_cost, k):
    for p, ref in zip(PROMPTS, refs):
        d = curves.ControlledDrafter(ref, alpha, cost=toy16.drafters["model"] if with_cost else None)
        r = sd.generate(toy16.target, p, drafter=d, method="linear", k=k, max_new_tokens=N)
        assert r.tokens == sd.generate(toy16.target, p, max_new_tokens=N).tokens == ref[len(p):]
        if alpha == 1.0:  # every proposal kept: K + 1 tokens per pass but at the budget's end
            assert r.stats.alpha == 1.0 and r.stats.tau > k
        if alpha == 0.0:
            assert r.stats.alpha == 0.0 and sum(r.stats.accepted_lengths) == 0
        assert (r.stats.draft_passes > 0) == with_cost  # the cost drafter's passes are paid, free ones are not


class Recording(ModelDrafter):
    """The shipped kind of drafter, recording every (context, proposal) it makes."""

    def __init__(self, model):
        super().__init__(model)
        self.seen = []

    def propose(self, context, k, params, generator, confidence=None):
        d = super().propose(context, k, params, generator, confidence)
        self.seen.append((list(context), k, d.tokens.tolist()))
        return d


def cost_proposals_are_fresh(toy16, refs, cls) -> bool:
    """Whether every proposal the cost drafter made inside a controlled run equals a fresh drafter's for the same
    context (a cache holding anything but committed tokens would change some of them)."""
    fresh = ModelDrafter(toy16.drafters["model"].model)
    params = sd.SamplingParams()
    for p, ref in zip(PROMPTS, refs):
        rec = Recording(toy16.drafters["model"].model)
        sd.generate(toy16.target, p, drafter=cls(ref, 0.5, cost=rec), method="linear", k=4, max_new_tokens=N)
        assert len(rec.seen) > 5
        for context, k, tokens in rec.seen:
            fresh.reset(torch.tensor(context), len(context) + k + 2)
            if fresh.propose(context, k, params, None).tokens.tolist() != tokens:
                return False
    return True


def test_cost_drafter_cache_holds_committed_tokens_only(toy16, refs):
    assert cost_proposals_are_fresh(toy16, refs, curves.ControlledDrafter)
    assert not cost_proposals_are_fresh(toy16, refs, NaiveCost)  # the mutant's cache keeps its discarded tokens


def test_bad_arguments_are_named(toy16, refs):
    ref, p = refs[0], PROMPTS[0]
    for alpha in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="alpha must be a number in"):
            curves.ControlledDrafter(ref, alpha)
    with pytest.raises(ValueError, match="1-D"):
        curves.ControlledDrafter(torch.tensor([ref]), 0.5)
    with pytest.raises(ValueError, match="integer token ids"):
        curves.ControlledDrafter(torch.tensor(ref, dtype=torch.float32), 0.5)
    with pytest.raises(ValueError, match="integer token ids"):
        curves.ControlledDrafter([1, 2, 1.5], 0.5)
    with pytest.raises(ValueError, match="empty reference"):
        curves.ControlledDrafter([], 0.5)
    with pytest.raises(ValueError, match="cost must be None"):
        curves.ControlledDrafter(ref, 0.5, cost=toy16.drafters["model"].model)
    with pytest.raises(ValueError, match="outside the target's vocabulary of 16"):
        sd.generate(toy16.target, p, drafter=curves.ControlledDrafter(list(p) + [99], 0.5), method="linear")
    # a prompt the reference does not start with, and a reference that is not the target's greedy output
    with pytest.raises(ValueError, match="not a prefix of the reference at position 0"):
        sd.generate(toy16.target, PROMPTS[1], drafter=curves.ControlledDrafter(ref, 0.5), method="linear",
                    max_new_tokens=N)
    wrong = ref[:len(p)] + [(t + 1) % 16 for t in ref[len(p):]]
    with pytest.raises(ValueError, match=f"not a prefix of the reference at position {len(p)}"):
        sd.generate(toy16.target, p, drafter=curves.ControlledDrafter(wrong, 1.0), method="linear", max_new_tokens=N)
    with pytest.raises(ValueError, match="greedy decoding"):
        sd.generate(toy16.target, p, drafter=curves.ControlledDrafter(ref, 0.5), method="linear", temperature=1.0)
    with pytest.raises(ValueError, match="confidence stop"):
        sd.generate(toy16.target, p, drafter=curves.ControlledDrafter(ref, 0.5), method="linear", confidence=0.5)


def test_the_reference_ends_and_proposals_shorten(toy16, refs):
    """Decoding past the reference: the draft proposes what is left, then the context leaves the reference."""
    p, ref = PROMPTS[0], refs[0][:len(PROMPTS[0]) + 10]
    d = curves.ControlledDrafter(ref, 1.0)
    assert sd.generate(toy16.target, p, drafter=d, method="linear", k=4, max_new_tokens=10).tokens == ref[len(p):]
    with pytest.raises(ValueError, match="runs past the reference"):
        sd.generate(toy16.target, p, drafter=curves.ControlledDrafter(ref, 1.0), method="linear", k=4,
                    max_new_tokens=N)


def test_alpha_needed_inverts_the_theorem():
    for k, c, vr in [(1, 0.1, 1.1), (4, 0.1, 1.3), (8, 0.0, 1.5)]:
        for s in (1.2, 1.5, 2.0):
            a = curves.alpha_needed(s, k, c, vr)
            if a == a:
                assert abs(float(speedup(a, k, c, vr)) - s) < 1e-4 and float(speedup(a - 1e-3, k, c, vr)) < s
    assert np.isnan(curves.alpha_needed(10.0, 2, 0.1, 1.0))  # K = 2 yields at most 3 tokens a pass
    assert curves.alpha_needed(1.0, 1, 0.0, 0.9) == 0.0  # a verify pass cheaper than one pass pays at any α


def test_crossing_interpolates_between_grid_points():
    assert curves.crossing([0.2, 0.4, 0.6], [0.8, 0.9, 1.1]) == pytest.approx(0.5)
    assert curves.crossing([0.2, 0.4], [1.2, 1.5]) == 0.2
    assert np.isnan(curves.crossing([0.2, 0.4], [0.5, 0.7]))


def test_a_grid_run_makes_the_chapters_tables(toy16, refs):
    prompts = [(dict(id=f"p{i}", task="t"), p) for i, p in enumerate(PROMPTS)]
    references = {tuple(p.tolist()): ref for p, ref in zip(PROMPTS, refs)}
    runners = {"autoregressive": bench.decode_runner(toy16.target, N)}
    runners.update(curves.grid_runners(toy16.target, references, [0.5, 0.9], [1, 4],
                                       {"free": None, "draft": toy16.drafters["model"]}, N))
    runs = bench.run_interleaved(runners, prompts, repeats=1, warmup=0, progress=False)
    c, vr = {"free": 0.0, "draft": 0.3}, {1: 1.0, 4: 1.1}
    curve = curves.curve_table(runs, c, vr)
    assert len(curve) == 8 and curve.identical.all() and (curve.n == 3).all()
    assert set(curve.cost) == {"free", "draft"} and set(curve.K) == {1, 4}
    # α̂ pooled over the calls, from the runs' own counts
    for r in curve.itertuples():
        rows = runs[runs.runner == curves.runner_name(r.alpha, r.K, r.cost)]
        assert r.alpha_hat == pytest.approx(rows.accepted.sum() / (rows.accepted.sum() + rows.rejections.sum()))
        assert r.predicted_nominal == pytest.approx(float(speedup(r.alpha, r.K, c[r.cost], vr[r.K])))
    budget = curves.step_budget(runs, c, vr)
    assert len(budget) == 4 and (budget.model_step == budget.model_draft + budget.model_verify).all()
    assert (budget[budget.cost == "free"].model_draft == 0).all() and (budget.step > 0).all()
    best = curves.best_k_table(curve)
    assert len(best) == 4 and set(best.measured_best_k) <= {1, 4}
    cross = curves.crossings(curve, c, vr)
    assert len(cross) == 4 and cross.predicted_alpha.between(0, 1).all()
    lines = curves.theory_lines([0.1, 0.5], [1, 4, 8], {"x": (0.1, {1: 1.0, 4: 1.2})})
    assert len(lines) == 4 and isinstance(lines, pd.DataFrame)  # K = 8 has no verify ratio: no line
