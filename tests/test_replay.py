"""study.replay: a rule for K replayed on a recorded greedy decode must be the engine's decode, step for step.

Deterministic (greedy toy pair, a fixed cost curve, no timing): the engine and the replay are compared exactly,
and two wrong replays (one feeding the whole K whatever the lookup proposes, one accepting a token more than the
target would) are shown to differ from the engine, so the comparison can fail."""
import pytest

import specdec_core as sd
from specdec_core.serving import Engine, StepCost
from specdec_core.study import replay as rp

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 4, 4, 4, 9], [5, 6, 7, 8, 5, 6, 7], [7, 1, 7, 1, 7]]
CURVE = {(1, t): 1e-3 * (1.0 + 0.04 * (t - 1)) for t in StepCost.TOKENS}  # seconds of a one-row pass of t tokens
STEEP = {(1, t): 1e-3 * (1.0 + 0.4 * (t - 1)) for t in StepCost.TOKENS}  # a draft token costs 0.4 of a pass
N = 40


def _engine(pair, prompt, k, curve=CURVE):
    e = Engine(pair.target, max_batch=1, step_cost=StepCost(curve, draft_cost=0.0))
    e.submit(prompt, max_new_tokens=N, method="linear", drafter=pair.drafters["ngram"], k=k)
    [r] = e.run()
    assert r.error is None
    return r


@pytest.mark.parametrize("k, curve", [("adaptive", CURVE), ("adaptive", STEEP), (3, CURVE)])
def test_a_replay_decodes_as_the_engine_does(toy16, k, curve):
    """On each prompt: the engine's K, feed and acceptance at every step are the replay's, from the greedy text and
    the lookups alone; the adaptive rule varies its K (on the steep curve it also chooses 0, a step the record must
    hold too) and the lookups are accepted at some steps (else the comparison would be empty)."""
    ngram, seen_ks, accepted = toy16.drafters["ngram"], set(), 0
    for prompt in PROMPTS:
        r = _engine(toy16, prompt, k, curve)
        trace = rp.lookup_trace(ngram, prompt, r.tokens)
        got = rp.replay(trace, k, StepCost(curve, draft_cost=0.0), N)
        assert r.tokens == sd.generate(toy16.target, prompt, max_new_tokens=N).tokens
        assert (got.ks, got.fed, got.accepted) == (r.ks, r.stats.drafted, r.stats.accepted_lengths)
        assert [got.stats.proposed, got.stats.drafted, got.stats.accepted_lengths] == \
            [r.stats.proposed, r.stats.drafted, r.stats.accepted_lengths]  # the record the adaptive rule reads
        assert got.tokens == len(r.tokens) - 1
        seen_ks |= set(got.ks)
        accepted += sum(got.accepted)
    assert accepted > 0 and (k != "adaptive" or len(seen_ks) > 1) and (curve is not STEEP or 0 in seen_ks)


def test_wrong_replays_are_caught(toy16):
    """A replay that feeds every allowed token (not what the lookup proposes) and one that accepts one token more
    than the target would both differ from the engine on some prompt."""
    ngram = toy16.drafters["ngram"]
    feeds_all = accepts_more = False
    for prompt in PROMPTS:
        r = _engine(toy16, prompt, 3)
        trace = rp.lookup_trace(ngram, prompt, r.tokens)
        engine = (r.ks, r.stats.drafted, r.stats.accepted_lengths)
        full = rp.replay([(StepCost.K_MAX, m) for _, m in trace], 3, StepCost(CURVE, draft_cost=0.0), N)
        more = rp.replay([(n, min(m + 1, n)) for n, m in trace], 3, StepCost(CURVE, draft_cost=0.0), N)
        feeds_all |= (full.ks, full.fed, full.accepted) != engine
        accepts_more |= (more.ks, more.fed, more.accepted) != engine
    assert feeds_all and accepts_more


def test_replay_prices_steps_on_the_curve(toy16):
    """K = 0 is autoregressive decoding: one one-token pass a token, speedup 1; a fixed K's seconds are its steps'
    t(1, 1 + fed)."""
    prompt = PROMPTS[0]
    tokens = sd.generate(toy16.target, prompt, max_new_tokens=N).tokens
    trace = rp.lookup_trace(toy16.drafters["ngram"], prompt, tokens)
    cost = StepCost(CURVE, draft_cost=0.0)
    assert rp.replay(trace, 0, cost, N).speedup == pytest.approx(1.0)
    got = rp.replay(trace, 4, cost, N)
    assert got.seconds == pytest.approx(sum(cost.t(1, 1 + d) for d in got.fed))
    assert got.speedup > 1  # a prompt that repeats itself: lookup pays here


def test_bad_input_is_refused(toy16):
    with pytest.raises(TypeError, match="lookup"):
        rp.lookup_trace(toy16.drafters["model"], [1, 2], [3, 4])
    for rule in (-1, "fast", True, 2.5):
        with pytest.raises(ValueError, match="rule"):
            rp.replay([(0, 0)], rule, StepCost(CURVE), N)
