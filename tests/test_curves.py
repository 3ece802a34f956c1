"""The controlled draft of chapter 10 (:mod:`specdec_core.study.curves`): its acceptance law, greedy identity, the
cost drafter's cache, its errors, and the helpers that turn a grid run into the chapter's tables.

Statistical checks use fixed seeds (a deterministic outcome) at a stated level: α̂ is tested against Binomial(n, α)
with a two-sided exact test at 1e-3, so a correct drafter fails with probability 1e-3 per check; a mutant whose
acceptance is not i.i.d. Bernoulli(α) (one draw per step decides every position) is shown to be caught. A grid's
calls draw independently (each its own seed): each cell's α̂ is checked against its 99 % Clopper–Pearson interval
(false-positive rate ≤ 3.9 % for the four cells), and the old shared seed is shown caught by comparing the draws of
calls that differ only in cost.
"""
import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest

import specdec_core as sd
from specdec_core.drafters import ModelDrafter
from specdec_core.paths import REFERENCE_DIR
from specdec_core.study import bench, curves
from specdec_core.study.theory import speedup
from specdec_core.tools import headline

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
        return sd.Draft(torch.tensor(tokens, dtype=torch.long), None, passes=0, state={"own": None})


class NaiveCost(curves.ControlledDrafter):
    """Mutant: tells the cost drafter that n of *its own* tokens were kept, whatever was committed."""

    def accept(self, draft, n):
        self.cost.accept(draft.state["own"], n)


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


# -- independent draws: every call of a grid its own stream ------------------------------------------------------
ALPHAS, KS = [0.3, 0.8], [2]  # four cells with both costs: 2 α × 1 K × {free, draft}


def test_cell_seed_is_deterministic_distinct_and_checked():
    assert curves.cell_seed(0, 1, 2, 3, 0, 0) == curves.cell_seed(0, 1, 2, 3, 0, 0)
    seeds = {curves.cell_seed(b, p, a, k, c, n) for b in (0, 1) for p in range(3) for a in range(2) for k in range(2)
             for c in range(2) for n in range(2)}
    assert len(seeds) == 2 * 3 * 2 * 2 * 2 * 2 and all(0 <= s < 2 ** 52 for s in seeds)
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(ValueError, match="non-negative integers"):
            curves.cell_seed(0, bad)


class OneSeedForAll(curves.ControlledDrafter):
    """Mutant: the old shared stream, every drafter seeded alike whatever seed its call was given."""

    def __init__(self, reference, alpha, cost=None, seed=0):
        super().__init__(reference, alpha, cost=cost, seed=0)


def grid_run(toy16, refs, baseline=True, warmup=1, drafter=None):
    """A grid of four cells (``ALPHAS`` × ``KS`` × {free, draft}), beside autoregressive decoding if ``baseline``,
    on the three prompts, keeping every call's per-step acceptances."""
    prompts = [(dict(id=f"p{i}", task="t"), p) for i, p in enumerate(PROMPTS)]
    references = {tuple(p.tolist()): ref for p, ref in zip(PROMPTS, refs)}
    runners = {"autoregressive": bench.decode_runner(toy16.target, N)} if baseline else {}
    runners.update(curves.grid_runners(toy16.target, references, ALPHAS, KS,
                                       {"free": None, "draft": toy16.drafters["model"]}, N, seed=7, keep_steps=True,
                                       drafter=drafter))
    return bench.run_interleaved(runners, prompts, repeats=1, warmup=warmup, progress=False)


@pytest.fixture(scope="module")
def grid(toy16, refs):
    return grid_run(toy16, refs)  # the warm-up is each runner's call 0 on p0: its timed call there is call 1


def test_each_call_draws_from_its_own_seed(grid):
    ctl = curves.parse_names(grid)
    assert ctl.seed.nunique() == len(ctl)  # no two calls share a stream
    # the seed is the documented one: (prompt's place, α's, K's, cost's, call count; the warm-up was call 0 on p0)
    for r in ctl.itertuples():
        p, call = int(r.id[1:]), r.repeat + (1 if r.id == "p0" else 0)
        cell = (ALPHAS.index(r.alpha), KS.index(r.K), ["free", "draft"].index(r.cost))
        assert r.seed == curves.cell_seed(7, p, *cell, call)


def test_alpha_hat_lies_in_its_99_percent_interval_with_independent_draws(grid):
    """Each of the four cells' pooled α̂ (≈ 80–120 tests) against its nominal α: a correct controlled draft leaves α
    outside a cell's 99 % Clopper–Pearson interval with probability ≤ 1 %, so this test's false-positive rate over
    base seeds is ≤ 1 − 0.99⁴ ≈ 3.9 % (at the fixed seed its outcome is fixed). A planted breach (the rows labelled
    with an α 0.2 above the one drawn) is shown caught by the same columns."""
    curve = curves.curve_table(grid, {"free": 0.0, "draft": 0.3}, {2: 1.1}, level=0.99)
    assert len(curve) == 4 and (curve.tests >= 60).all() and (curve.alpha_level == 0.99).all()
    assert curve.nominal_inside.all(), curve[["cost", "alpha", "alpha_hat", "tests", "alpha_lo", "alpha_hi"]]
    assert (curve.alpha_lo <= curve.alpha_hat).all() and (curve.alpha_hat <= curve.alpha_hi).all()
    check = curves.nominal_check(curve, 0.99)
    assert check["outside"] == 0 and check["p"] == 1.0 and check["expected"] == pytest.approx(0.04)
    planted = grid.assign(runner=grid.runner.str.replace("controlled|0.3|", "controlled|0.5|", regex=False))
    bad = curves.curve_table(planted, {"free": 0.0, "draft": 0.3}, {2: 1.1}, level=0.99)
    assert not bad[bad.alpha == 0.5].nominal_inside.any() and bad[bad.alpha == 0.8].nominal_inside.all()
    bad_check = curves.nominal_check(bad, 0.99)
    assert bad_check["outside"] == 2 and bad_check["p"] < 1e-3  # two of four outside: P ≤ 6e-4 by chance


def test_free_and_draft_rows_draw_independently_and_the_shared_seed_is_caught(toy16, refs, grid):
    """Calls of the same prompt, α, K and repeat that differ only in cost: with independent draws their per-step
    acceptances differ (equal by chance with probability below 1e-4 per pair at these α and lengths); the old
    shared seed (:class:`OneSeedForAll`: every drafter seeded alike) makes every pair identical."""
    same = curves.shared_draws(grid)
    assert len(same) == len(PROMPTS) * len(ALPHAS) * len(KS) and not same.identical.any()
    shared = curves.shared_draws(grid_run(toy16, refs, baseline=False, warmup=0, drafter=OneSeedForAll))
    assert shared.identical.all(), "the shared-seed mutant is not caught"
    with pytest.raises(ValueError, match="keep_steps"):
        curves.shared_draws(grid.drop(columns="accepted_lengths"))


def test_crossings_read_on_the_measured_alpha():
    """The same speedups reach a level at a different α when read on α̂ instead of the nominal α."""
    curve = pd.DataFrame(dict(cost="draft", K=4, alpha=[0.3, 0.6, 0.9], alpha_hat=[0.35, 0.70, 0.95],
                              median=[1.0, 1.4, 2.2], n=6))
    assert curves.read_crossing(curve, 1.8, on="alpha") == pytest.approx(0.75)
    assert curves.read_crossing(curve, 1.8) == pytest.approx(0.825)
    # α̂ out of the nominal order: the points are read in α̂'s order
    swapped = curve.assign(alpha_hat=[0.35, 0.96, 0.95])
    assert curves.read_crossing(swapped, 1.3) == pytest.approx(0.35 + 0.3 / 1.2 * 0.6)
    cross = curves.crossings(curve, {"draft": 0.1}, {4: 1.2}, level=1.8)
    assert cross.measured_alpha.iloc[0] == pytest.approx(0.825) and cross.nominal_alpha.iloc[0] == pytest.approx(0.75)
    assert (cross.grid_low.iloc[0], cross.grid_high.iloc[0]) == (0.35, 0.95)


def test_headline_names_controlled_proposals_and_the_shipped_draft(tmp_path):
    """The README's chapter-10 line on the committed reference (tables from before α̂'s intervals: the crossings are
    read again on curve.csv's α̂), on tables with the new columns, and on tables without α̂ (nominal, said so)."""
    line, = headline.curve_lines(REFERENCE_DIR / "book")
    assert "*controlled proposals*" in line and "linear (draft model) at α̂ = " in line
    assert "on the measured α̂" in line and "on the nominal α" in line
    curve = pd.DataFrame(dict(cost=["draft"] * 3, K=4, alpha=[0.3, 0.6, 0.9], alpha_hat=[0.35, 0.7, 0.95],
                              median=[1.0, 1.4, 2.2], q25=[0.9, 1.3, 2.0], q75=[1.1, 1.5, 2.4], n=6, tests=120,
                              alpha_lo=[0.25, 0.6, 0.88], alpha_hi=[0.46, 0.8, 0.99], alpha_level=0.99))
    real = pd.DataFrame(dict(runner=["linear (draft model)", "linear (n-gram)"], median=[1.16, 1.4], q25=[1.04, 1.3],
                             q75=[1.22, 1.6], n=6, alpha_hat=[0.39, 0.51]))
    need = pd.DataFrame(dict(speedup=[1.8], K=[4], predicted_alpha=[0.8], measured_alpha=[0.825], nominal_alpha=[0.75]))
    (tmp_path / "10_curves").mkdir()
    for name, df in (("curve", curve), ("real_drafters", real), ("alpha_needed", need)):
        df.to_csv(tmp_path / "10_curves" / f"{name}.csv", index=False)
    line, = headline.curve_lines(tmp_path)
    assert "α = 0.9 (α̂ 0.950 over 120 tests, 99% interval 0.88–0.99)" in line
    assert "linear (draft model) at α̂ = 0.39: 1.16×" in line and "n-gram" not in line
    assert "1.8× needs α̂ ≈ 0.82 (K = 4; on the nominal α 0.75; theory 0.80)" in line
    # tables without α̂: the crossing is the nominal one, and the line says so
    curve.drop(columns=["alpha_hat", "tests", "alpha_lo", "alpha_hi", "alpha_level"]).to_csv(
        tmp_path / "10_curves" / "curve.csv", index=False)
    need.drop(columns="nominal_alpha").assign(measured_alpha=0.75).to_csv(tmp_path / "10_curves" / "alpha_needed.csv",
                                                                          index=False)
    line, = headline.curve_lines(tmp_path)
    assert "on the nominal α (the run's tables carry no measured α̂): 1.8× needs α ≈ 0.75" in line
