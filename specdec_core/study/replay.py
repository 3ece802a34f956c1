"""Replaying a rule for K on recorded greedy decodes, without the model.

Under greedy decoding the target's text does not depend on K, and prompt lookup
(:class:`~specdec_core.drafters.NGramDrafter`) is deterministic with the prefix property: ``lookup(context, k)`` is
the first k tokens of ``lookup(context, K_MAX)``. So one greedy decode gives, for every position of the answer, how
long the unbounded proposal is and how many of its leading tokens the target would accept (:func:`lookup_trace`).
From that, any rule for K replays step by step (:func:`replay`): a step at K feeds ``min(K, proposal)`` draft tokens
and accepts ``min(matched, feed)``, exactly as the engine would, and is priced with a
:class:`~specdec_core.serving.StepCost` curve. A one-request engine run and its replay choose the same K at every
step (``tests/test_replay.py``), and a replay costs no target pass, so two rules can be set side by side on many
requests without timing noise (what the rule predicts against what it gets). What the replay leaves out is what
the cost curve leaves out: the engine's own time per step, and the neighbours of a batch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..record import Stats
from ..serving import StepCost


def lookup_trace(drafter, prompt: list[int], tokens: list[int], k_max: int = StepCost.K_MAX) -> list[tuple[int, int]]:
    """``tokens``: a greedy answer to ``prompt`` (its first token from the prefill). For each position p = 1 …
    len(tokens) − 1 where a decode step can start: (the length of ``drafter.lookup(prompt + tokens[:p], k_max)``,
    how many of its leading tokens equal ``tokens[p:]``)."""
    if not callable(getattr(drafter, "lookup", None)):
        raise TypeError(f"lookup_trace needs a deterministic drafter with lookup(context, k) (prompt lookup), "
                        f"got {type(drafter).__name__}")
    trace = []
    for p in range(1, len(tokens)):
        proposal = drafter.lookup(list(prompt) + list(tokens[:p]), k_max)
        matched = 0
        while matched < len(proposal) and p + matched < len(tokens) and proposal[matched] == tokens[p + matched]:
            matched += 1
        trace.append((len(proposal), matched))
    return trace


@dataclass
class Replay:
    """One request replayed: the K each step allowed, the record (what each step fed and accepted), the seconds the
    cost curve gives its steps, and those of one one-token pass."""

    ks: list[int]
    stats: Stats
    seconds: float
    tokens: int  # tokens after the prefill's
    one_pass: float  # cost.t(1, 1)

    @property
    def fed(self) -> list[int]:
        return self.stats.drafted

    @property
    def accepted(self) -> list[int]:
        return self.stats.accepted_lengths

    @property
    def speedup(self) -> float:
        """Against autoregressive decoding on the same cost curve (one one-token pass per token)."""
        return self.tokens * self.one_pass / self.seconds if self.seconds else float("nan")


def replay(trace: list[tuple[int, int]], rule, cost: StepCost, max_new_tokens: int) -> Replay:
    """Decode one request's ``trace`` (:func:`lookup_trace`) at B = 1. ``rule``: a fixed K (int), or
    ``"adaptive"`` (``cost.best_ks``, which learns from the replayed steps as it does in the engine, and knows each
    step's proposal as the engine does, which asks prompt lookup first), or a callable ``(stats, ks) -> K``. Each
    step's K is cut to the room left (``max_new_tokens`` − tokens so far − 1), as the engine cuts it; the step costs
    ``cost.t(1, 1 + fed) + cost.draft_time() · fed``."""
    if isinstance(rule, int) and not isinstance(rule, bool) and rule >= 0:
        choose = lambda stats, ks, held: rule  # noqa: E731
    elif rule == "adaptive":
        choose = lambda stats, ks, held: cost.best_ks([(stats, ks, None)], proposals=[held])[0]  # noqa: E731
    elif callable(rule):
        choose = lambda stats, ks, held: rule(stats, ks)  # noqa: E731
    else:
        raise ValueError(f"rule must be a K >= 0, 'adaptive' or a callable (stats, ks) -> K, got {rule!r}")
    stats, ks = Stats("linear"), []
    p, seconds, end = 1, 0.0, len(trace) + 1
    while p < end:
        proposal, matched = trace[p - 1]
        room = max_new_tokens - p - 1  # the most a step may draft: the target's own token takes the last place
        k = min(int(choose(stats, ks, min(proposal, room) if room >= 1 else None)), room)
        d = min(k, proposal)
        a = min(matched, d)
        stats.record_step(min(d, a + 1), a, d, [], 0)
        ks.append(k)
        seconds += cost.t(1, 1 + d) + cost.draft_time() * d
        p += a + 1
    return Replay(ks, stats, seconds, end - 1, cost.t(1, 1))
