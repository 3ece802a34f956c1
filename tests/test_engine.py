"""The continuous-batching engine: exactness under load, its measures, and what it refuses.

Each request of the engine must be *the* single-sequence decode of its prompt, whatever its neighbours, its row and
its arrival: greedy requests equal autoregressive decoding; a sampled request with a fixed K equals
``generate(prompt, seed=s)`` bit for bit on the float64 toy pairs (its row has its own generator and its own drafter
state). A request whose K the engine chooses (``k="adaptive"``) draws differently from ``generate``, so its law is
tested instead: the chapter-2 goodness-of-fit test at level 1e-3 (false-positive rate 0.1 % for a correct sampler;
fixed seeds make each outcome deterministic), and a mutant that accepts a row against its neighbour's logits is
caught by both checks.
"""
import gc
import math

import numpy as np
import pytest
import torch

import specdec_core as sd
from specdec_core.drafters import Draft, Drafter
from specdec_core.record import Timer
from specdec_core.sampling import OneHotLaws, SamplingParams
from specdec_core.serving import Engine, StepCost, arrivals, request_metrics, summarize
from specdec_core.study import exactness as ex
from specdec_core.study import mutants as mu

ALPHA = 1e-3
PROMPTS = [[1, 2, 3], [4, 4, 4, 4, 9], [0], [5, 6, 7, 8, 9, 10, 11], [3, 3], [7, 1, 7, 1, 7]]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with ex.torch_threads(1):
        yield


def _specs(pair):
    """One request per method and drafter the engine serves, adaptive K and a prediction included (a suffix drafter
    with no memory: one that learns would draft from the outputs of the requests that finished before it, which
    ``generate`` alone never saw)."""
    d = pair.drafters
    return [dict(), dict(method="linear", drafter=d["model"], k=3), dict(method="linear", drafter=d["ngram"], k=3),
            dict(method="parallel", drafter=d["block"], k=3), dict(method="linear", drafter=sd.SuffixDrafter(learn=False), k=6),
            dict(method="linear", drafter=d["model"], k="adaptive"), dict(method="linear", drafter=d["hybrid"], k=2),
            dict(method="linear", prediction=[5, 6, 7, 1, 2, 3], k=4)]


def _serve(pair, prompts, specs, gaps=0.002, max_batch=3, engine=Engine, **kw):
    e = engine(pair.target, max_batch=max_batch)
    for i, (p, s) in enumerate(zip(prompts, specs)):
        e.submit(p, arrival_s=gaps * i, **s, **kw)
    return e.run()


# -- exactness ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_batch, gaps", [(3, 0.002), (8, 0.0), (1, 0.0)])
def test_greedy_requests_equal_autoregressive(toy16, max_batch, gaps):
    """Eight requests, every method, staggered arrivals: rows join a running batch, leave, and are refilled (3
    rows for 8 requests), or all start at once, or run one at a time. Each equals autoregressive decoding."""
    prompts = PROMPTS + [[2, 9], [1, 1, 1]]
    res = _serve(toy16, prompts, _specs(toy16), gaps, max_batch, max_new_tokens=30)
    assert [r.error for r in res] == [None] * len(prompts)
    assert [r.tokens for r in res] == [sd.generate(toy16.target, p, max_new_tokens=30).tokens for p in prompts]
    assert all(len(r.stats.token_times) == r.stats.new_tokens == 30 for r in res)
    assert all(0 <= k <= StepCost.K_MAX for k in res[5].ks)  # the engine chose each step's K (timed: any K)


def test_sampled_requests_are_their_own_single_decode(toy16):
    """T = 1, top-k 6, fixed K: each request equals generate(prompt, seed=s) bit for bit, whatever its row."""
    specs = [s for s in _specs(toy16) if s.get("k") != "adaptive"]
    prompts = PROMPTS[:len(specs)] + [[2, 9]] * (len(specs) - len(PROMPTS))
    kw = dict(max_new_tokens=24, temperature=1.0, top_k=6)
    e = Engine(toy16.target, max_batch=3)
    for i, (p, s) in enumerate(zip(prompts, specs)):
        e.submit(p, arrival_s=0.001 * i, seed=40 + i, **s, **kw)
    res = e.run()
    alone = [sd.generate(toy16.target, p, seed=40 + i, **s, **kw).tokens for i, (p, s) in enumerate(zip(prompts, specs))]
    assert [r.tokens for r in res] == alone


def test_neighbour_logits_mutant_breaks_greedy_identity(toy16):
    """A row accepting against its neighbour's logits (mutants.NeighbourLogitsEngine) departs from autoregressive
    decoding; with one row (no neighbour) it is the engine itself."""
    specs = [dict(method="linear", drafter=toy16.drafters["model"], k=3)] * 4
    bad = _serve(toy16, PROMPTS[:4], specs, 0.0, 4, engine=mu.NeighbourLogitsEngine, max_new_tokens=20)
    assert [r.tokens for r in bad] != [sd.generate(toy16.target, p, max_new_tokens=20).tokens for p in PROMPTS[:4]]
    one = _serve(toy16, PROMPTS[:1], specs, 0.0, 1, engine=mu.NeighbourLogitsEngine, max_new_tokens=20)
    assert one[0].tokens == sd.generate(toy16.target, PROMPTS[0], max_new_tokens=20).tokens


LAW_TOKENS = 4


# passes that cost more per row and token as the batch grows, and a draft token a tenth of a one-row pass: the K
# chosen then depends on each row's acceptance and on the live rows, not on the machine's timings
COSTS = {(b, t): 1.0 + 0.02 * b * t for b in (1, 2, 4) for t in (1, 2, 3, 5, 9, 17, 33)}
# each drafted token a third of a pass: a row holding a proposal of 2 or 3 tokens often verifies fewer (its cut)
STEEP_COSTS = {(b, t): 1.0 + 0.3 * b * (t - 1) for b in (1, 2, 4) for t in (1, 2, 3, 5, 9, 17, 33)}


def _row(accepted, drafted, steps=10, allowed=None):
    """A row's record after ``steps`` steps that each drafted ``drafted`` and accepted ``accepted`` (each a number or
    a list: one per step, cycled), allowed ``allowed`` (default: the most it drafted)."""
    s = sd.Stats("linear")
    accepted = accepted if isinstance(accepted, list) else [accepted]
    drafted = drafted if isinstance(drafted, list) else [drafted]
    for i in range(steps):
        a, d = accepted[i % len(accepted)], drafted[i % len(drafted)]
        s.record_step(min(a + 1, d), a, d, [], 0, False)
    return s, [allowed or max(drafted)] * steps, None


class Stationary(StepCost):
    """Every step of a row weighs alike (``DECAY = 1``): the tests of the per-position model read drafters whose
    acceptance does not drift, so its running rates are their long-run ones, not those of the last few steps."""
    DECAY = 1.0


def test_step_cost_chooses_k_by_acceptance_and_load():
    """K grows with the rows' acceptance, falls to 0 at none, and shrinks as more rows share the pass."""
    cost = StepCost(COSTS, draft_cost=0.1)
    ks = [cost.best_k([_row(a, 32)]) for a in (0, 8, 24, 31)]
    assert ks[0] == 0 and ks == sorted(ks) and ks[-1] > ks[1] > 0, ks
    assert cost.best_k([_row(24, 32)] * 4) < ks[2]
    assert cost.t(1, 1) == COSTS[(1, 1)] and cost.t(8, 1) == pytest.approx(2 * COSTS[(4, 1)])
    with pytest.raises(ValueError, match="draft_cost"):
        StepCost(COSTS, draft_cost=-1)


def test_the_step_cost_is_timed_in_interleaved_rounds(toy):
    """Each shape is warmed up once, then timed in rounds over every T of a row count, so a drift (the passes right
    after a prefill or a change of live rows ran slower on this machine: a one-token pass timed first read 1.13 of
    the engine's) falls on every T alike; the grid holds every (rows, tokens). Timing each T's repeats back to back
    (the mutant order) is caught."""
    class Recording(Timer):
        def time(self, fn, *args, **kwargs):
            timed.append(sum(map(len, args[0])) // len(args[0]))  # the mean T of the pass timed
            return super().time(fn, *args, **kwargs)

    timed = []
    cost = StepCost.measure(toy.target, max_rows=2, context=4, repeats=3, timer=Recording())
    T = list(StepCost.TOKENS)
    assert timed == T * 3 * 2  # 2 row counts, 3 rounds each
    assert sorted(cost.verify) == sorted((b, t) for b in (1, 2) for t in T)


def test_the_step_cost_times_packed_passes_whose_rows_feed_different_counts(toy):
    """The engine's speculative steps are packed passes whose rows feed different counts, and a packed pass need not
    cost what a padded one of the same tokens does (torch's attention takes the longer rows one call each: 4 rows
    after 200 tokens, 12 tokens cost 1.20 one-token passes packed and 1.12 padded on the book's CPU before the rows
    kernel's packed call); the curve timed on padded rows after 64 tokens priced the engine's steps at 0.87 of what
    they took (4-row steps of chapter 9's mix at load 0.6). So every shape of more than one row and token is timed
    through ``BatchLM.verify`` on rows of 1 and 2T − 1 tokens (mean T), which packs them; a curve timed on rows of
    T each (the mutant) is caught."""
    for B in (2, 3, 4, 8):
        for T in StepCost.TOKENS:
            ns = StepCost.feeds(B, T)
            assert len(ns) == B and sum(ns) == B * T and min(ns) >= 1
            assert (len(set(ns)) > 1) == (T > 1), (B, T, ns)
    assert StepCost.feeds(1, 9) == [9] and StepCost.feeds(4, 1) == [1] * 4

    class Recording(Timer):
        def time(self, fn, *args, **kwargs):
            lengths.append([len(r) for r in args[0]])
            packed.append(fn.__self__.packs and len(set(lengths[-1])) > 1)
            return super().time(fn, *args, **kwargs)

    lengths, packed = [], []
    StepCost.measure(toy.target, max_rows=2, context=4, repeats=1, timer=Recording())
    two = [ns for ns in lengths if len(ns) == 2]
    assert two == [StepCost.feeds(2, T) for T in StepCost.TOKENS]
    assert packed == [False] * len(StepCost.TOKENS) + [False] + [True] * (len(StepCost.TOKENS) - 1)
    assert StepCost.typical_context(toy.target, [(10, 8), (30, 8), (50, 20)]) == 34  # 30 + 8 // 2
    assert StepCost.typical_context(toy.target, [(10 ** 6, 8)]) < 10 ** 6  # within the model's positions


def test_step_cost_prices_each_draft_position_by_its_own_acceptance():
    """A geometric drafter's positions come out near α^i. A drafter accepted all or nothing (a copied span of 8, one
    step in 5) gets P_i ≈ 0.2 at every position up to 8 and none past what it proposes: drafted at least to its
    span's end where passes are cheap, not at all where each drafted token costs a quarter pass (0.2 tokens bought
    for 0.25 passes). The mutant with one α over all its tests (0.67, SmartSpec's running rate) prices the first
    token at 0.67 and speculates there."""
    cost = Stationary(COSTS, draft_cost=0.02)
    rng = np.random.default_rng(0)
    geometric = _row([int(rng.geometric(0.4)) - 1 for _ in range(400)], 12, steps=400)
    c = cost.counts(*geometric[:2])
    assert np.allclose(cost.acceptance(c, c)[:6], 0.6 ** np.arange(1, 7), atol=0.05)
    burst = _row([8, 0, 0, 0, 0], 8, steps=100, allowed=16)
    c = cost.counts(*burst[:2])
    p = cost.acceptance(c, c)
    assert np.allclose(p[:8], 0.2, atol=0.02) and p[8:16].max() < 0.05, p[:16]
    assert cost.best_k([burst]) >= 8  # past its span it proposes (so feeds) almost nothing: a longer K is no dearer
    steep = {(1, t): 1.0 + 0.25 * (t - 1) for t in (1, 2, 3, 5, 9, 17)}
    assert Stationary(steep, draft_cost=0.0).best_k([burst]) == 0

    class OneAlpha(Stationary):  # the mutant: one rate for every position, fill as measured
        def _rates(self, c, pooled):
            alpha = c[3].sum() / c[2].sum()
            fill = c[1] / np.maximum(c[0], 1)
            return (np.array([fill[self.octave(i)] for i in range(1, self.K_MAX + 1)]),
                    alpha ** np.arange(1, self.K_MAX + 1))

    assert OneAlpha(steep, draft_cost=0.0).best_k([burst]) > 0


def test_a_draft_position_is_priced_by_how_often_the_drafter_fills_it():
    """A lookup that finds a match one step in 4 (a span of 8, accepted whole) and proposes nothing on the others feeds
    2 draft tokens a step on average at K = 8, not 8: where each fed token costs a quarter pass, its span pays
    (3 tokens for 1.5 passes) and it drafts at least to the span's end; one that always proposes and is accepted as
    often (the burst row of the test above) buys the same tokens for 3 passes and does not draft. The mutant prices
    every allowed position as fed, and chooses K = 0 for the lookup too."""
    steep = {(1, t): 1.0 + 0.25 * (t - 1) for t in (1, 2, 3, 5, 9, 17)}
    cost = Stationary(steep, draft_cost=0.01)
    lookup = _row([8, 0, 0, 0], [8, 0, 0, 0], steps=100, allowed=16)
    c = cost.counts(*lookup[:2])
    fill = cost.fill(c, c)
    assert np.allclose(fill[:8], 0.25, atol=0.03) and fill[8:16].max() < 0.05
    assert cost.best_k([lookup]) >= 8 and cost.best_ks([lookup])[0] >= 8
    assert cost.best_k([_row([8, 0, 0, 0], 8, steps=100, allowed=16)]) == 0

    class AllowedIsFed(Stationary):  # the mutant
        def _expected(self, rows, pools=None, proposals=None):
            G, F = super()._expected(rows, pools, proposals)
            return G, np.ones_like(F)  # every allowed position fed

    assert AllowedIsFed(steep, draft_cost=0.01).best_k([lookup]) == 0


def test_a_row_s_acceptance_follows_its_recent_steps():
    """A request's acceptance drifts (prompt lookup finds more of the output as it grows; a copy runs in spans). A row
    that accepted nothing of 4 drafted tokens for 40 steps and then all 4 for 10 is priced near its recent rate: its
    first position above 0.6, so it drafts where each drafted token costs a quarter pass, and one that never accepted
    does not. The mutant that weighs every step alike (``Stationary``) prices it at a fifth, and does not draft."""
    steep = {(1, t): 1.0 + 0.25 * (t - 1) for t in (1, 2, 3, 5, 9, 17)}
    turned = _row([0] * 40 + [4] * 10, 4, steps=50)
    cost, flat = StepCost(steep, draft_cost=0.0), Stationary(steep, draft_cost=0.0)
    c, f = cost.counts(*turned[:2]), flat.counts(*turned[:2])
    assert cost.acceptance(c, c)[0] > 0.6 and flat.acceptance(f, f)[0] < 0.3
    assert cost.best_k([turned]) > 0 and cost.best_k([_row(0, 4, steps=50)]) == 0
    assert flat.best_k([turned]) == 0


def test_a_row_s_prior_pools_only_the_rows_of_its_own_drafter():
    """A row with no steps yet is priced by its pool's rows. Beside a grounded row whose copied spans are accepted
    whole (16 of 16 every step), a new chat row of another drafter starts from the prior (fill 1, each position
    accepted with chance 0.5: about 2 tokens at K = 8) and drafts shorter than a new row of the grounded row's own
    drafter, which starts from that row's acceptance. The mutant that pools every live row prices the chat row as
    if it were grounded, and is caught; pools of the wrong length are refused."""
    cost = StepCost(COSTS, draft_cost=0.02)
    rows = [_row(16, 16, steps=20), _row(0, 0, steps=0), _row(0, 0, steps=0)]
    pools = ["suffix", "ngram", "suffix"]
    G = cost.gains(rows, pools)
    assert G[1, 8] == pytest.approx(1 + sum(0.5 ** i for i in range(1, 9)))
    assert G[2, 8] > 6 and G[0, 8] > 8
    ks = cost.best_ks(rows, pools=pools)
    assert ks[1] < ks[2], ks

    class OnePool(StepCost):  # the mutant: every live row in one pool
        def _expected(self, rows, pools=None, proposals=None):
            return super()._expected(rows, None, proposals)

    assert OnePool(COSTS, draft_cost=0.02).gains(rows, pools)[1, 8] > 6
    with pytest.raises(ValueError, match="one pool per row"):
        cost.gains(rows, pools[:2])


def test_a_row_holding_a_proposal_is_priced_by_it_and_verifies_at_least_its_first_token():
    """The engine asks a drafter without a model first (``Drafter.previews``), so the cost model knows such a row's
    feed, its proposal as far as K allows (fill 1 up to its length, 0 past it), and its drafting is already paid.
    Four rows whose first draft token is always rejected: asked nothing, none drafts; holding proposals of 3, 0 and 2
    tokens and one asked nothing, the first and the third verify at least one token (``HELD_FLOOR``) and the last
    none; the mutant without the floor leaves them at 0. A row whose drafts are always accepted, where a drafted
    token costs 100 s: asked nothing, it does not draft; holding 2 tokens, it verifies both (their drafting is paid).
    Proposals of the wrong length are refused."""
    cost = StepCost(COSTS, draft_cost=0.02)
    doubtful = [_row(0, 4, allowed=4)] * 4
    assert cost.best_ks(doubtful) == [0, 0, 0, 0]
    ks = cost.best_ks(doubtful, proposals=[3, 0, 2, None])
    assert ks[0] >= 1 and ks[2] >= 1 and ks[3] == 0, ks

    class NoFloor(StepCost):  # the mutant
        HELD_FLOOR = 0

    bare = NoFloor(COSTS, draft_cost=0.02).best_ks(doubtful, proposals=[3, 0, 2, None])
    assert bare[0] == bare[2] == 0, bare
    _, F = cost._expected([_row(4, 4)], proposals=[2])
    assert F[0].tolist() == [1.0, 1.0] + [0.0] * (StepCost.K_MAX - 2)
    dear, sure = StepCost(COSTS, draft_cost=100.0), [_row(4, 4, allowed=4)]
    assert dear.best_ks(sure) == [0] and dear.best_ks(sure, proposals=[2])[0] >= 2
    with pytest.raises(ValueError, match="proposals"):
        cost.best_ks(doubtful, proposals=[1])


def test_a_step_that_leaves_no_row_a_choice_is_answered_without_the_model():
    """Choosing K evaluates the cost model (some 50 numpy calls: 0.36 ms a step on the book's CPU right after a verify
    pass, 2 % of a one-row step), so a step whose rows have no choice left skips it: every row fixed, or holding a
    proposal of 0 or ``HELD_FLOOR`` tokens (its floor is its cap). A row that holds more, or was asked nothing, is
    still chosen for: a sure row holding 2 tokens where a drafted token costs 100 s verifies both, which the mutant
    that answers every held row with its floor (1) gets wrong. Bad pools are refused either way."""
    class Counting(StepCost):
        calls = 0

        def _expected(self, rows, pools=None, proposals=None):
            self.calls += 1
            return super()._expected(rows, pools, proposals)

    class FloorMutant(Counting):
        def _best(self, rows, packed, per_row, pools=None, proposals=None):
            if proposals and all(d is not None for d in proposals):
                return np.array([min(d, self.HELD_FLOOR) for d in proposals])
            return super()._best(rows, packed, per_row, pools, proposals)

    sure, fixed = _row(4, 4, allowed=4), (*_row(4, 4)[:2], 3)
    cost = Counting(COSTS, draft_cost=100.0)
    assert cost.best_ks([sure], proposals=[0]) == [0] and cost.best_ks([sure], proposals=[1]) == [1]
    assert cost.best_ks([sure, fixed, sure], proposals=[0, None, 1]) == [0, 3, 1]
    assert cost.calls == 0
    assert cost.best_ks([sure], proposals=[2]) == [2] and cost.calls == 1
    assert cost.best_ks([sure, sure], proposals=[0, None]) == [0, 0] and cost.calls == 2  # asked nothing: chosen
    assert FloorMutant(COSTS, draft_cost=100.0).best_ks([sure], proposals=[2]) == [1]  # the mutant, caught above
    with pytest.raises(ValueError, match="one pool per row"):
        cost.best_ks([sure], pools=[0, 1], proposals=[0])


def test_adaptive_rows_of_drafters_without_a_model_are_asked_first(toy16):
    """Prompt lookup and the suffix drafter propose without a model pass: the engine asks an adaptive row's drafter
    for its longest draft before choosing K and cuts it to K. Greedy, staggered arrivals, 3 rows: every request is
    autoregressive decoding's text; every choice gave a row holding a proposal at least one of its tokens, and never
    fed a row more than its K; the model draft's rows are never asked first."""
    seen = []

    class Spy(Engine):
        def _choose_ks(self, live, stalled=False, packed=True, held=None):
            ks = super()._choose_ks(live, stalled, packed, held)
            held = held or {}
            seen.extend((q.method.drafter.previews if q.adaptive else None,
                         len(held[r].tokens) if r in held else None, k) for r, (q, k) in enumerate(zip(live, ks)))
            return ks

    d = toy16.drafters
    specs = [dict(method="linear", drafter=d["ngram"], k="adaptive"),
             dict(method="linear", drafter=sd.SuffixDrafter(learn=False), k="adaptive"),
             dict(method="linear", drafter=d["model"], k="adaptive"), dict(method="linear", drafter=d["ngram"], k=3)]
    prompts = PROMPTS + [[2, 9], [1, 1, 1]]
    res = _serve(toy16, prompts, specs * 2, 0.002, 3, engine=Spy, max_new_tokens=30)
    assert [r.tokens for r in res] == [sd.generate(toy16.target, p, max_new_tokens=30).tokens for p in prompts]
    assert all(d <= k for r in res for d, k in zip(r.stats.drafted, r.ks))
    asked = [(n, k) for previews, n, k in seen if previews and n is not None]  # None: a stalled step, or no room
    assert sum(n > 0 for n, _ in asked) > 10 and all(k >= 1 for n, k in asked if n), asked
    assert all(n is None for previews, n, _ in seen if previews is not True)


def test_the_engine_pools_rows_by_the_drafter_and_method_they_were_submitted_with(toy16):
    """Rows share a prior when submitted with one drafter object and method: two n-gram drafters make two pools,
    and a request of the same drafter under another method a third."""
    seen = []

    class Recording(StepCost):
        def best_ks(self, rows, packed=True, pools=None, proposals=None):
            seen.append(list(pools))
            return super().best_ks(rows, packed, pools, proposals)

    e = Engine(toy16.target, max_batch=4, step_cost=Recording(COSTS, draft_cost=0.0))
    a, b = sd.NGramDrafter(), sd.NGramDrafter()
    prompt = list(range(3, 11)) * 2
    for drafter, method in ((a, "linear"), (a, "linear"), (b, "linear"), (a, "parallel")):
        e.submit(prompt, drafter=drafter, method=method, k="adaptive", max_new_tokens=6)
    assert not any(r.error for r in e.run())
    first = seen[0]
    assert len(first) == 4 and first[0] == first[1] and len(set(first)) == 3, first


def test_a_step_is_priced_at_its_expected_time_not_at_the_time_of_its_mean_feed():
    """A row at K feeds min(K, its proposal): a lookup feeds all of K or nothing. On a pass time that grows faster
    than its tokens, the step's expected time is above the time of its mean feed. ``verify_time`` is the exact
    expectation for one and two rows (against the convolution of the rows' feed laws, on 200 seeded random sets of
    fills) and within 10 % of it for 3 to 8 rows (a normal summed feed); a model draft, which always feeds K, is
    priced at t(n, (n + ΣK) / n) exactly. A lookup that fires one step in four then drafts shorter than the mutant
    that prices the mean feed (alone and beside a second such row), which is caught."""
    rng = np.random.default_rng(0)
    convex = {(b, t): 1.0 + 0.01 * (b * t - 1) + 0.01 * (b * t - 1) ** 2 for b in (1, 2, 4, 8) for t in StepCost.TOKENS}
    cost = Stationary(convex, draft_cost=0.0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        F = np.minimum.accumulate(rng.uniform(0, 1, (n, StepCost.K_MAX)), axis=1)
        ks = rng.integers(0, StepCost.K_MAX + 1, (2, n))
        got = cost.verify_time(n, ks, F)
        for c in range(2):
            law = np.array([1.0])
            for r in range(n):
                Fx, K = np.concatenate([[1.0], F[r]]), ks[c, r]
                law = np.convolve(law, np.concatenate([Fx[:K] - Fx[1:K + 1], [Fx[K]]]))
            exact = float(law @ cost.t(n, (n + np.arange(len(law))) / n))
            assert got[c] == pytest.approx(exact, rel=1e-12 if n <= 2 else 0.1)
        always = np.ones((n, StepCost.K_MAX))
        assert cost.verify_time(n, ks, always) == pytest.approx(cost.t(n, (n + ks.sum(axis=1)) / n), rel=1e-12)

    class MeanFeed(Stationary):  # the mutant: the time of the mean feed
        def verify_time(self, n, ks, F, packed=True):
            return self.t(n, (n + self._upto_k(F)[np.arange(n), ks].sum(axis=1)) / n)

    quiet = [0, 0, 0]  # it fires one step in four, proposing all 16 tokens and accepting 1, 4, 8 and 16 in turn
    lookup = _row([1] + quiet + [4] + quiet + [8] + quiet + [16] + quiet, [16] + quiet, steps=96)
    for rows in ([lookup], [lookup, lookup]):
        ours, mutant = Stationary(convex, draft_cost=0.0).best_ks(rows), MeanFeed(convex, draft_cost=0.0).best_ks(rows)
        assert max(ours) < min(mutant), (ours, mutant)


def test_adaptive_rows_do_not_speculate_on_the_step_after_a_prefill(toy):
    """Rows that waited for a neighbour's prefill take K = 0 on the next step (their gap is already the longest);
    a request admitted into an empty batch, and every later step, speculate as the cost model says. The engine
    told to speculate after a prefill does so on that step."""
    def ks(max_batch, speculate_after_prefill=False):
        e = Engine(toy.target, max_batch=max_batch, step_cost=StepCost(COSTS, draft_cost=0.1))
        e.speculate_after_prefill = speculate_after_prefill
        for prompt in ([1, 2, 3], [4, 5]):
            e.submit(prompt, method="linear", drafter=toy.drafters["model"], k="adaptive", max_new_tokens=6)
        return [r.ks for r in e.run()]

    together = ks(2)  # the second prefill stalls the first row: both rows' first step is K = 0
    assert [k[0] for k in together] == [0, 0] and all(k[1] > 0 for k in together), together
    one_by_one = ks(1)  # each admitted into an empty batch: nothing waited
    assert all(k[0] > 0 for k in one_by_one), one_by_one
    assert ks(2, speculate_after_prefill=True)[0][0] > 0


def test_the_price_of_a_drafted_token_counts_only_the_steps_that_drafted(toy):
    """The running draft price (seconds per drafted token) is read from the steps that asked a row to draft. A step
    where every row takes K = 0 adds no token; had it added its time (choosing K, the step's bookkeeping), the price
    would only rise while no row drafts, and a cost model that once chose K = 0 everywhere would never speculate
    again. Rows held at K = 0 for 10 steps, then free to choose: nothing is priced while they are held (the mutant
    that observes every step prices the first 10), and they speculate afterwards."""
    class HeldFirst(StepCost):
        def best_ks(self, rows, packed=True, pools=None, proposals=None):
            self.calls = getattr(self, "calls", 0) + 1
            return [0] * len(rows) if self.calls <= 10 else super().best_ks(rows, packed, pools, proposals)

    cost = HeldFirst(COSTS)
    e = Engine(toy.target, max_batch=2, step_cost=cost)
    e.speculate_after_prefill = True
    priced = []
    observe = cost.observe_draft
    cost.observe_draft = lambda s, d: (priced.append((cost.calls, d)), observe(s, d))
    for prompt in ([1, 2, 3], [4, 5]):
        e.submit(prompt, method="linear", drafter=toy.drafters["model"], k="adaptive", max_new_tokens=30)
    res = e.run()
    assert priced and min(c for c, _ in priced) > 10 and all(d > 0 for _, d in priced), priced[:3]
    assert all(max(r.ks[10:]) > 0 for r in res) and all(max(r.ks[:10]) == 0 for r in res)


def test_one_pause_in_a_drafting_window_does_not_set_the_draft_price():
    """50 drafting steps at 0.05 ms a token, then one that a 200 ms pause landed in: the price stays within 25 % of
    the drafter's (uncapped, the running mean: 17 times it). A drafter 100 times dearer from then on still sets the
    price within a median window. The uncapped mutant fails the first check."""
    cost = StepCost(COSTS)
    for _ in range(50):
        cost.observe_draft(0.25e-3, 5)
    cost.observe_draft(0.2, 5)
    assert cost.draft_time() < 1.25 * 0.05e-3, cost.draft_time()
    for _ in range(StepCost.SETTLED // 2 + 1 + 200):
        cost.observe_draft(25e-3, 5)
    assert cost.draft_time() > 0.7 * 5e-3, cost.draft_time()  # the running mean, the cheap steps included


class _Uncapped(StepCost):
    def observe_draft(self, seconds, drafted):
        self.draft_s += seconds
        self.drafted += drafted


def test_the_uncapped_draft_price_mutant_is_caught():
    cost = _Uncapped(COSTS)
    for _ in range(50):
        cost.observe_draft(0.25e-3, 5)
    cost.observe_draft(0.2, 5)
    assert cost.draft_time() > 10 * 0.05e-3

class _Repeating(Drafter):
    """A drafter without a model that proposes 1, 2, 0, 1, 2, 0, … at every step, as far as it is allowed: a draft that
    depends on nothing the target does, so verifying it is exact, and always as long as the room left, so that a
    row asked first is cut wherever its K is shorter (prompt lookup on these short requests rarely proposes 2)."""

    previews = True

    def bind(self, target):
        self.vocab_size = target.config.get_text_config().vocab_size

    def propose(self, context, k, params, generator, confidence=None):
        toks = torch.tensor(([1, 2, 0] * (k // 3 + 1))[:k], dtype=torch.long)
        return Draft(toks, None if params.greedy else OneHotLaws(toks, self.vocab_size), passes=0)


def _engine_samples(toy, n_requests, engine=Engine, drafter="model", costs=COSTS):
    """Requests for [1, 2, 3] at T = 1, top-k 3, each its own seed, K chosen by the engine (from fixed costs, so
    the outcome is deterministic), 3 at a time among neighbours of other prompts (a greedy one and a sampled one):
    only the [1, 2, 3] requests are returned. Nearly every step of such short requests follows an admission: the
    rows speculate there too, so that K varies on every step. ``drafter``: the pair's drafter the [1, 2, 3] requests
    draft with, or ``"repeating"`` (:class:`_Repeating`, asked first and cut to K); ``costs``: the step-cost model's
    passes."""
    cut = _engine_samples.cut = []  # per draft asked first and cut: whether the cut is shorter than the proposal

    class Counting(engine):
        def _cut(self, draft, k):
            cut.append(k < len(draft.tokens))
            return super()._cut(draft, k)

    e = Counting(toy.target, max_batch=3, step_cost=StepCost(costs, draft_cost=0.02))  # cheap drafts: K 0 to 2
    e.speculate_after_prefill = True
    ours = []
    drafter = _Repeating() if drafter == "repeating" else toy.drafters[drafter]
    for i in range(n_requests):
        ours.append(e.submit([1, 2, 3], seed=7000 + i, method="linear", drafter=drafter, k="adaptive",
                             max_new_tokens=LAW_TOKENS, temperature=1.0, top_k=3))
        if i % 4 == 0:
            e.submit([6, 5], method="linear", drafter=toy.drafters["ngram"], k=2, max_new_tokens=7)
            e.submit([4], seed=i, method="linear", drafter=toy.drafters["model"], k=3, max_new_tokens=5,
                     temperature=1.0)
    res = e.run()
    _engine_samples.last = [res[i] for i in ours]
    return np.array([res[i].tokens for i in ours])


@pytest.fixture(scope="module")
def engine_law(toy):
    return ex.sequence_law(toy.target, [1, 2, 3], LAW_TOKENS, SamplingParams(temperature=1.0, top_k=3))


def test_adaptive_requests_follow_the_target_law(toy, engine_law):
    """600 requests whose K the engine chose (0 included), in batches with other requests: the target's law over
    the 81 cells of 4 tokens (top-k 3)."""
    samples = _engine_samples(toy, 600)
    assert len({k for r in _engine_samples.last for k in r.ks}) > 2  # K varied
    assert ex.gof_test(np.bincount(ex.cell_index(samples, 8), minlength=engine_law.size), engine_law,
                       seed=1).pvalue > ALPHA


def test_engine_law_catches_the_neighbour_logits_mutant(toy, engine_law):
    samples = _engine_samples(toy, 600, engine=mu.NeighbourLogitsEngine)
    assert ex.gof_test(np.bincount(ex.cell_index(samples, 8), minlength=engine_law.size), engine_law,
                       seed=1).pvalue < ALPHA


def test_rows_asked_first_follow_the_target_law(toy, engine_law):
    """The same 600 requests drafting without a model (:class:`_Repeating`), whose proposals the engine asks for before
    K and cuts to it (``Engine._cut``): the target's law, with cuts shorter than the proposal on many steps (else the
    mutant below would test nothing)."""
    samples = _engine_samples(toy, 600, drafter="repeating", costs=STEEP_COSTS)
    assert sum(_engine_samples.cut) > 50, sum(_engine_samples.cut)
    assert ex.gof_test(np.bincount(ex.cell_index(samples, 8), minlength=engine_law.size), engine_law,
                       seed=1).pvalue > ALPHA


def test_engine_law_catches_the_misaligned_cut_mutant(toy, engine_law):
    samples = _engine_samples(toy, 600, engine=mu.MisalignedCutEngine, drafter="repeating", costs=STEEP_COSTS)
    assert ex.gof_test(np.bincount(ex.cell_index(samples, 8), minlength=engine_law.size), engine_law,
                       seed=1).pvalue < ALPHA


# -- drafter state ------------------------------------------------------------------------------------------
def test_each_request_has_its_own_drafter_state(toy16):
    """The engine forks the submitted drafter per request (the pair's stays untouched); two live streams on one
    drafter are refused with an error that says what to do."""
    d = toy16.drafters["model"]
    before = d.lm
    _serve(toy16, PROMPTS[:3], [dict(method="linear", drafter=d, k=3)] * 3, 0.0, 3, max_new_tokens=10)
    assert d.lm is before
    a = sd.stream(toy16.target, [1, 2], drafter=d, method="linear", k=3, max_new_tokens=12)
    b = sd.stream(toy16.target, [3, 4], drafter=d, method="linear", k=3, max_new_tokens=12)
    next(a), next(b), next(b)
    with pytest.raises(RuntimeError, match="another decode"):
        next(a)
    twin = sd.stream(toy16.target, [1, 2], drafter=d.fork(), method="linear", k=3, max_new_tokens=12)
    assert sum(list(twin), []) == sd.generate(toy16.target, [1, 2], max_new_tokens=12).tokens


def test_a_finished_decode_frees_its_fork_without_a_garbage_collection(toy16, without_cyclic_gc):
    """A drafter holds the decode that claimed it weakly, so a decode's phases and their fork form no cycle: once the
    stream is done and dropped, the fork (a model drafter's, with its own draft cache) is freed at once, with the
    cyclic collector off (the engine forks one per request). The mutant, the owner held strongly, keeps it."""
    import weakref

    def fork_outlives(strong=False):
        twin = toy16.drafters["model"].fork()
        out = sd.stream(toy16.target, [1, 2], drafter=twin, method="linear", k=3, max_new_tokens=8)
        chunks = [next(out)]
        assert twin.lm is not None and twin._owner() is not None  # claimed and drafting
        if strong:
            twin.keep = twin._owner()  # the mutant: the cycle back
        chunks += list(out)
        assert len(sum(chunks, [])) == 8
        gone = weakref.ref(twin)
        del twin, out
        return gone() is not None

    assert not fork_outlives()
    assert fork_outlives(strong=True)


def test_suffix_memory_is_shared_across_requests(toy16):
    """Forks of one suffix drafter share its memory of finished requests: the engine's outputs teach it."""
    s = sd.SuffixDrafter()
    _serve(toy16, PROMPTS[:3], [dict(method="linear", drafter=s, k=4)] * 3, 0.0, 2, max_new_tokens=16)
    assert len(s.cached) == 3
    s.forget()


# -- measures ---------------------------------------------------------------------------------------------
def test_request_metrics_share_a_steps_gap_among_its_tokens():
    m = request_metrics([0.5, 0.7, 0.7, 0.7, 1.0])
    assert m["ttft"] == 0.5 and m["e2e"] == 1.0 and m["tpot"] == pytest.approx(0.125)
    assert m["itl"] == pytest.approx([0.2 / 3] * 3 + [0.3])  # vLLM's per-token ITL, not one gap of 0.2 and two of 0
    assert math.isnan(request_metrics([0.3])["tpot"])


def test_arrivals_have_the_asked_rate_and_burstiness():
    """Poisson: inter-arrival gaps with mean 1/rate and coefficient of variation 1; gamma(burstiness b): CV 1/√b."""
    for b in (1.0, 0.25, 4.0):
        t = np.array(arrivals(20000, rate=5.0, burstiness=b, seed=3))
        gaps = np.diff(np.concatenate([[0.0], t]))
        assert gaps.mean() == pytest.approx(0.2, rel=0.03) and gaps.std() / gaps.mean() == pytest.approx(b ** -0.5,
                                                                                                         rel=0.05)
    assert arrivals(3, rate=2.0, seed=1) == arrivals(3, rate=2.0, seed=1) != arrivals(3, rate=2.0, seed=2)
    assert arrivals(4, rate=math.inf) == [0.0] * 4


def test_summarize_counts_goodput_and_classes(toy16):
    res = _serve(toy16, PROMPTS[:4], [dict()] * 4, 0.0, 2, max_new_tokens=8)
    s = summarize(res, slo=dict(ttft=math.inf, tpot=math.inf))
    assert s["requests"] == 4 and s["failed"] == 0 and s["goodput"] == pytest.approx(s["request_rate"])
    none = summarize(res, slo=dict(e2e=0.0))
    assert none["goodput"] == 0.0
    by = summarize(res, classes=["a", "b", "a", "b"])["by_class"]
    assert set(by) == {"a", "b"} and by["a"]["requests"] == 2
    with pytest.raises(ValueError, match="slo"):
        summarize(res, slo=dict(itl=1.0))


def test_token_times_count_from_arrival(toy16):
    """A request that arrives later waits for its row: its time to first token counts from its arrival."""
    e = Engine(toy16.target, max_batch=1)
    e.submit([1, 2], max_new_tokens=20)
    e.submit([3, 4], arrival_s=0.0, max_new_tokens=5)
    first, second = e.run()
    assert second.admitted_s >= first.finished_s - 1e-9
    assert second.stats.token_times[0] >= second.admitted_s - second.arrival_s


def test_closed_loop_keeps_concurrency(toy16):
    """concurrency=2: at most two requests in the system; each new one arrives when one finishes."""
    e = Engine(toy16.target, max_batch=4)
    for p in PROMPTS[:5]:
        e.submit(p, arrival_s=100.0, max_new_tokens=6)  # ignored in a closed loop
    res = e.run(concurrency=2)
    assert [r.tokens for r in res] == [sd.generate(toy16.target, p, max_new_tokens=6).tokens for p in PROMPTS[:5]]
    spans = sorted((r.arrival_s, r.finished_s) for r in res)
    assert all(sum(a <= t < f for a, f in spans) <= 2 for t, _ in spans)



def test_a_run_freezes_what_was_alive_before_it_and_only_that(toy16):
    """While ``run`` decodes, the objects alive when it started sit in the garbage collector's permanent generation
    (a full collection of a loaded model's process scans some 450 k of them, 150-200 ms a pause on 2 cores, and
    would land in a step); afterwards they are back, and a caller's own freeze is left as it was. The engine
    without the freeze fails the first check."""
    seen = []
    e = Engine(toy16.target, max_batch=2)
    for p in PROMPTS[:3]:
        e.submit(p, max_new_tokens=4)
    assert gc.get_freeze_count() == 0
    e.run(progress=lambda i: seen.append(gc.get_freeze_count()))
    assert len(seen) == 3 and min(seen) > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        held = gc.get_freeze_count()
        e.submit(PROMPTS[3], max_new_tokens=4)
        e.run()
        assert gc.get_freeze_count() >= held
    finally:
        gc.unfreeze()

# -- bad input ----------------------------------------------------------------------------------------------
def test_bad_input_fails_at_submit(toy16):
    e = Engine(toy16.target, max_batch=2)
    for bad in (-1.0, float("nan"), "soon", True):
        with pytest.raises(ValueError, match="arrival_s"):
            e.submit([1, 2], arrival_s=bad)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="max_batch"):
            Engine(toy16.target, max_batch=bad)
    with pytest.raises(ValueError, match="KV cache"):
        Engine(toy16.target, cache_len=8).submit([1, 2, 3], max_new_tokens=20)
    max_pos = toy16.target.config.max_position_embeddings
    with pytest.raises(ValueError, match="model's"):
        e.submit([1, 2], max_new_tokens=max_pos)
    with pytest.raises(ValueError, match="supports methods"):
        e.submit([1, 2], method="tree", drafter=toy16.drafters["model"])
    with pytest.raises(ValueError, match="speculative method"):
        e.submit([1, 2], k="adaptive")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        e.submit([1, 99])
    assert e.requests == []  # nothing bad was queued


def test_a_failing_request_loses_no_other_result(toy16):
    """A drafter that raises mid-run fails its own request; the others finish exactly."""
    class Broken(sd.NGramDrafter):
        def propose(self, context, k, params, generator, confidence=None):
            if len(context) > 6:
                raise RuntimeError("broken drafter")
            return super().propose(context, k, params, generator, confidence)

    specs = [dict(), dict(method="linear", drafter=Broken(), k=2), dict(method="linear",
                                                                        drafter=toy16.drafters["model"], k=2)]
    res = _serve(toy16, PROMPTS[:3], specs, 0.0, 3, max_new_tokens=12)
    assert isinstance(res[1].error, RuntimeError) and "broken drafter" in str(res[1].error)
    for i in (0, 2):
        assert res[i].error is None and res[i].tokens == sd.generate(toy16.target, PROMPTS[i], max_new_tokens=12).tokens


def test_rows_sharing_a_draft_model_draft_together_and_a_subclass_alone(toy16):
    """Requests given one model drafter run its passes together (about K a step for the batch, the catch-up of each
    new prompt aside), each row still the decode ``generate`` makes; a subclass of it (here one that counts its
    proposals) is never replaced by the batched form: each of its requests drafts alone, by its own code."""
    class Counting(sd.ModelDrafter):
        calls = 0

        def propose(self, *a, **kw):
            Counting.calls += 1
            return super().propose(*a, **kw)

    def served(drafter):
        passes = []
        hook = drafter.model.register_forward_pre_hook(lambda *_: passes.append(1))
        try:
            e = Engine(toy16.target, max_batch=4)
            for p in PROMPTS[:4]:
                e.submit(p, method="linear", drafter=drafter, k=3, max_new_tokens=20)
            res = e.run()
        finally:
            hook.remove()
        assert [r.tokens for r in res] == [sd.generate(toy16.target, p, max_new_tokens=20).tokens for p in PROMPTS[:4]]
        return len(passes), e.counts["steps"]

    passes, steps = served(toy16.drafters["model"])
    assert passes <= 3 * steps + 4
    passes, steps = served(Counting(toy16.drafters["model"].model))
    assert Counting.calls >= steps and passes > 3 * steps + 4


def test_goodput_verdicts_are_paired_and_decide_only_with_their_interval():
    """Synthetic runs (20 requests, one round): a policy equal to autoregressive decoding request for request has ratio
    1 in every paired draw (an unpaired bootstrap would spread it); one that meets every SLO where another meets half
    holds against it; one that misses half of what autoregressive meets fails; 4 requests decide nothing."""
    import pandas as pd

    from specdec_core.study import load as ld

    def runs(n, miss):  # policy → the requests (indices) that miss the TPOT limit
        return pd.DataFrame([dict(round=0, load=0.5, policy=p, request=j, arrival_s=float(j), error=None, ttft=0.1,
                                  tpot=1.0 if j in bad else 0.01, e2e=1.0)
                             for p, bad in miss.items() for j in range(n)])

    slo = dict(ttft=0.5, tpot=0.1)
    v = ld.goodput_verdicts(runs(20, {"load-adaptive": set(), "autoregressive": set(), "n-gram": set(range(0, 20, 2))}),
                            slo).set_index("other")
    assert v.loc["autoregressive", ["ratio", "lo", "hi"]].tolist() == [1.0, 1.0, 1.0]
    assert v.loc["autoregressive", "verdict"] == "holds" and v.loc["n-gram", "verdict"] == "holds"
    assert v.loc["n-gram", "ratio"] == 2.0 and v.loc["n-gram", "lo"] > 1.2
    assert v.loc["n-gram", ["policy_met", "other_met", "requests"]].tolist() == [20, 10, 20]  # met every SLO, of all
    v = ld.goodput_verdicts(runs(20, {"load-adaptive": set(range(0, 20, 2)), "autoregressive": set()}), slo)
    assert v.verdict.tolist() == ["fails"] and v.hi.iloc[0] < 1
    v = ld.goodput_verdicts(runs(4, {"load-adaptive": set(), "autoregressive": {1}}), slo)
    assert v.verdict.iloc[0].startswith("cannot tell")


def test_replayed_requests_do_not_narrow_the_goodput_interval():
    """12 distinct requests replayed in 40 rounds (the defect: replays counted as requests): the interval is about
    as wide as one round of the same 12 requests, and n_units says 12 (the size rule reads those). Resampling each
    round's requests on their own, as before, narrowed it about √40-fold."""
    import pandas as pd

    from specdec_core.study import load as ld

    miss_rate = np.random.default_rng(0).uniform(size=12)  # each request's own chance to miss the SLO under n-gram

    def runs(rounds):
        rng = np.random.default_rng(1)
        return pd.DataFrame([dict(round=r, load=0.5, policy=p, request=j, arrival_s=float(j), error=None, ttft=0.1,
                                  tpot=1.0 if p == "n-gram" and miss_rate[j] > 0.5 else 0.01 * (1 + rng.uniform()),
                                  e2e=1.0)
                             for r in range(rounds) for p in ("load-adaptive", "autoregressive", "n-gram")
                             for j in range(12)])

    slo = dict(ttft=0.5, tpot=0.1)
    one = ld.goodput_verdicts(runs(1), slo).set_index("other").loc["n-gram"]
    many = ld.goodput_verdicts(runs(40), slo).set_index("other").loc["n-gram"]
    assert many.n_units == 12 and many.requests == 480
    assert (many.hi - many.lo) == pytest.approx(one.hi - one.lo, rel=0.35)


def test_tpot_ratios_are_paired_by_request_and_decide_only_with_their_interval():
    """Synthetic runs (2 rounds × 15 requests whose TPOTs spread over two decades): a policy 1.05× faster than
    another on every request has ratio 1.05 in every paired draw (an unpaired bootstrap spreads it over about 0.4 to
    2.8, and fails the first check); the class filter and a failed request are honoured; 2 requests decide nothing."""
    import pandas as pd

    from specdec_core.study import load as ld

    tpot = np.geomspace(0.01, 1.0, 15)
    rows = [dict(round=r, load=0.1, policy=p, request=j, cls="chat" if j % 3 else "grounded",
                 tpot=tpot[j] * f * (1 + r), error=None)
            for r in range(2) for p, f in (("adaptive", 1.0), ("n-gram", 1.05), ("ar", 2.0)) for j in range(15)]
    runs = pd.DataFrame(rows)
    v = ld.tpot_ratio(runs, 0.1, "adaptive", "n-gram", goal=0.95)
    assert v["ratio"] == pytest.approx(1.05) and v["lo"] == pytest.approx(1.05) and v["hi"] == pytest.approx(1.05)
    assert v["verdict"] == "holds" and v["requests"] == 30 and v["n_units"] == 15
    assert ld.tpot_ratio(runs, 0.1, "adaptive", "ar", goal=2.5)["verdict"] == "fails"
    assert ld.tpot_ratio(runs, 0.1, "adaptive", "ar", cls="grounded")["requests"] == 10
    runs.loc[(runs.policy == "n-gram") & (runs.request == 0), "tpot"] = np.nan  # failed under one policy
    assert ld.tpot_ratio(runs, 0.1, "adaptive", "n-gram")["requests"] == 28
    two = runs[runs.request < 2]
    assert ld.tpot_ratio(two[two["round"] == 0], 0.1, "adaptive", "ar")["verdict"].startswith("cannot tell")
    with pytest.raises(ValueError, match="no requests of"):
        ld.tpot_ratio(runs, 0.1, "adaptive", "suffix")

@pytest.mark.parametrize("cache_len", [None, 40])
def test_a_long_row_beside_a_long_draft_fits_the_cache(toy16, cache_len):
    """A pass pads every row to its longest feed: a long prompt near its end beside a row drafting 12 tokens needs the
    largest step's headroom on every row (the default cache), or K cut to fit (a cache_len set by hand that leaves
    less). Before, the pass overflowed the cache (found by the full chapter 9)."""
    long, short = list(range(16)) * 2, [1, 2]
    e = Engine(toy16.target, max_batch=2, cache_len=cache_len)
    e.submit(long, max_new_tokens=4)
    e.submit(short, method="linear", drafter=toy16.drafters["model"], k=12, max_new_tokens=20)
    res = e.run()
    assert [r.error for r in res] == [None, None]
    assert [r.tokens for r in res] == [sd.generate(toy16.target, p, max_new_tokens=n).tokens
                                       for p, n in ((long, 4), (short, 20))]
    assert (max(res[1].ks) < 12) == (cache_len is not None)


def _sure_beside_doubtful():
    """One row whose span of 16 is accepted whole every step, and three whose first draft token is always rejected."""
    return [_row(16, 16, allowed=16)] + [_row(0, 4, allowed=4)] * 3


def _expected(cost, rows, ks, packed=True):
    """A step's seconds (the verify pass, packed or padded, and 0.01 s per drafted token) and the tokens each row is
    expected to add, when the rows draft ``ks``."""
    n, drafted = len(ks), sum(ks)
    T = (drafted + n) / n if packed else max(ks) + 1
    return cost.t(n, T) + 0.01 * drafted, cost.gains(rows)[np.arange(n), ks]


def test_each_row_gets_its_own_k_when_the_pass_packs():
    """One row whose draft is nearly sure (a span of 16 accepted whole every step) beside three whose first draft
    token is always rejected: with a packed pass (each drafted token costs what it adds to the pass) the sure row
    drafts its span and the others nothing. One K for every row (``best_k``, the padded pass's rule and the mutant
    here) either makes the three pay for drafts that are rejected or the sure row give up its span; the per-row
    choice's expected rate is the higher (tokens per second: the throughput objective; the default one is tested
    below)."""
    cost = StepCost(COSTS, draft_cost=0.01, objective="throughput")
    rows = _sure_beside_doubtful()
    ks = cost.best_ks(rows)
    assert ks[0] >= 12 and ks[1:] == [0, 0, 0], ks

    def rate(ks, packed=True):
        seconds, added = _expected(cost, rows, ks, packed)
        return added.sum() / seconds
    one = cost.best_k(rows)
    assert rate(ks) > 1.2 * rate([one] * 4), (ks, one)
    padded = cost.best_ks(rows, packed=False)  # every row pays the longest feed: the doubtful rows' drafts are free
    assert rate(padded, packed=False) >= rate([one] * 4, packed=False) - 1e-12


def test_the_latency_objective_keeps_the_rows_that_do_not_draft_from_paying_for_the_one_that_does():
    """Tokens per second count a row's 17 tokens 17 times; a request's TPOT counts once. Beside three rows whose
    first draft token is always rejected, the sure row's longest span buys the most tokens per second but makes every
    step, so every other row's tokens, slower: the default objective ("latency", the rows' geometric-mean time per
    token) drafts it shorter, and its choice has the lower mean time per token, the throughput one the higher tokens
    per second (the mutant: a latency rule that scores tokens per second chooses the throughput K and is caught by
    the strict inequality). With one row the two objectives are the same rule."""
    latency, throughput = Stationary(COSTS, draft_cost=0.01), Stationary(COSTS, draft_cost=0.01, objective="throughput")
    assert latency.objective == "latency"
    rows = _sure_beside_doubtful()
    lat, thr = latency.best_ks(rows), throughput.best_ks(rows)

    def mean_time_per_token(ks):  # the rows' geometric mean
        seconds, added = _expected(latency, rows, ks)
        return float(np.exp(np.mean(np.log(seconds / added))))

    def tokens_per_s(ks):
        seconds, added = _expected(latency, rows, ks)
        return added.sum() / seconds
    assert lat[1:] == thr[1:] == [0, 0, 0] and 0 < lat[0] < thr[0], (lat, thr)
    assert mean_time_per_token(lat) < mean_time_per_token(thr) and tokens_per_s(thr) > tokens_per_s(lat)
    for a in (0, 4, 12, 16):
        one = [_row(a, 16, allowed=16)]
        assert latency.best_ks(one) == throughput.best_ks(one), a
    with pytest.raises(ValueError, match="objective"):
        StepCost(COSTS, objective="goodput")


def test_a_bootstrap_interval_with_infinite_draws_is_infinite_not_nan():
    """protocol.interval (the goodput and TPOT intervals' quantiles): where both neighbours of a quantile are infinite ratios (the other policy met no goal in
    those draws), the interval's end is inf, silently, where plain interpolation warns and gives NaN."""
    import warnings

    import numpy as np

    from specdec_core.study.protocol import interval

    boot = np.array([1.0, 2.0, 3.0] + [np.inf] * 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lo, hi = interval(boot, 0.9)
    assert np.isfinite(lo) and hi == np.inf
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.quantile(boot, 0.95))  # the mutant: plain interpolation


def test_the_traffic_policies_leave_out_per_class_only_when_asked():
    """Chapter 9's full run serves four policies (``engine_per_class: false``): the flag drops exactly "per class",
    and the load-adaptive policy still drafts with the suffix drafter on grounded requests and prompt lookup on chat."""
    from specdec_core.study import load as ld

    ngram, suffix = object(), object()
    full = ld.traffic_policies(ngram, suffix, 4, 32)
    four = ld.traffic_policies(ngram, suffix, 4, 32, per_class=False)
    assert list(full) == ["autoregressive", "n-gram, K = 4", "suffix, K ≤ 32", "per class", "load-adaptive"]
    assert list(four) == [p for p in full if p != "per class"]
    assert full["per class"]("grounded")["drafter"] is suffix and full["per class"]("chat")["drafter"] is ngram
    assert four["load-adaptive"]("grounded")["drafter"] is suffix and four["load-adaptive"]("chat")["k"] == "adaptive"
