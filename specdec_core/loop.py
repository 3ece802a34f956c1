"""The decode loop: one scaffold, and each method as its four phases.

Every method repeats one step, *draft → verify → accept → commit*:

1. **draft**  the drafter proposes tokens (a chain, a block, or a tree) with the laws q they were drawn from.
2. **verify** one target pass over [last token, drafts…] gives the target's laws p at every draft position.
3. **accept** a rule from :mod:`specdec_core.verify` keeps a prefix (or a path) and adds the target's own token.
4. **commit** the target's cache forgets what was rejected (a pointer move or an index copy), the drafter is
   told what was kept, and the new tokens are emitted (cut at EOS and at the budget).

Autoregressive decoding is the degenerate method: it drafts nothing and verifies the last token alone.
:func:`decode_steps` owns everything the methods share (prefill, the EOS/budget cut, the run record) and is a
generator: it yields the tokens each step commits, so ``generate`` is a loop over it and a streamer is a
consumer of it.

Invariant at the top of each step: ``seq`` holds every token so far; the target's cache holds all of them
but the last (``seq[-1]``, not yet seen by the target). The phases decide from the committed context and
the draft's own draws only; the target's verdict is read in *accept*, after the draft is fixed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from .lm import CachedLM, borrowed
from .record import Clock, Stats
from .sampling import SamplingParams, choose, process_logits
from .verify import (chain_tests, greedy_accept, greedy_tree_accept, speculative_sample, tree_speculative_sample,
                     tree_tests)


@dataclass
class Verdict:
    """What *accept* decided: the new tokens (accepted drafts + the target's own) and the step's record.

    ``proposed``, ``drafted`` and ``accept_probs`` are the step's entries in the
    :class:`~specdec_core.record.Stats` fields of those names, ``accepted`` its entry in ``accepted_lengths``
    (defined in :mod:`specdec_core.record`)."""

    tokens: list[int]
    accepted: int = 0  # draft tokens kept
    proposed: int = 0  # draft tokens the verifier tested on its path (accepted + the first rejection)
    drafted: int = 0  # draft tokens / nodes in the verify pass
    accept_probs: list[float] = field(default_factory=list)  # each test's acceptance probability
    path: list[int] = field(default_factory=list)  # trees: the accepted node ids, root to leaf


class Method:
    """A decoding method: its four phases. ``params`` and ``generator`` are the run's; ``step_mode``, how the
    drafter's passes run (:mod:`specdec_core.graphs`; the run's)."""

    name = "method"
    drafter = None  # the speculative methods' drafter

    def __init__(self, params: SamplingParams, generator: torch.Generator, step_mode: str = "eager"):
        self.params = params
        self.generator = generator
        self.step_mode = step_mode

    def start(self, prompt: torch.Tensor, capacity: int) -> None:
        if self.drafter is not None:  # this decode drives its drafter now; a second live decode is refused
            self.drafter.claim(self)
            self.drafter.set_step_mode(self.step_mode)
            self.drafter.reset(prompt, capacity)

    def phases(self, room: int) -> Method:
        """The phases of a step that may add ``room`` tokens: these, or with room 1 autoregressive ones (a step
        drafts at most room − 1 tokens: the target's own token takes the last place)."""
        return self if room > 1 else Autoregressive(self.params, self.generator)

    def draft(self, seq: list[int], budget: int):
        return None

    def verify(self, lm: CachedLM, seq: list[int], draft) -> torch.Tensor:
        raise NotImplementedError

    def accept(self, draft, logits: torch.Tensor) -> Verdict:
        raise NotImplementedError

    def commit(self, lm: CachedLM, draft, verdict: Verdict) -> None:
        pass

    def finish(self, prompt: list[int], output: list[int]) -> None:
        """The decode ended: its drafter, if any, is told (:meth:`~specdec_core.drafters.Drafter.finish`)."""
        if self.drafter is not None:
            self.drafter.finish(prompt, output)


class Autoregressive(Method):
    """One target pass per token: nothing drafted, the last token verified alone."""

    name = "autoregressive"

    def verify(self, lm, seq, draft):
        return lm.forward(torch.tensor(seq[-1:]), logits_to_keep=1)

    def accept(self, draft, logits):
        token, _ = choose(logits[-1], self.params, self.generator)
        return Verdict([token])


class Linear(Method):
    """Linear speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a chain of ``k`` draft tokens."""

    name = "linear"

    def __init__(self, params, generator, drafter, k: int, rule=speculative_sample, confidence: float | None = None,
                 step_mode: str = "eager"):
        super().__init__(params, generator, step_mode)
        self.drafter = drafter
        self.k = k  # the most tokens a step drafts
        self.rule = rule  # the accept rule when sampling
        self.confidence = confidence

    def draft(self, seq, budget):  # with a confidence, the draft stops itself: k is then the most it drafts
        self.drafter.check_owner(self)
        kw = {} if self.confidence is None else {"confidence": self.confidence}
        return self.drafter.propose(seq, min(self.k, budget), self.params, self.generator, **kw)

    def verify(self, lm, seq, draft):
        return lm.forward(torch.cat([torch.tensor(seq[-1:]), draft.tokens]))  # [drafted + 1, V]

    def accept(self, draft, logits):
        drafted = draft.tokens.numel()
        if self.params.greedy:  # greedy tests compare with the target's argmax; its laws are not needed
            argmax = logits.argmax(-1)
            p = None
            new, n = greedy_accept(draft.tokens, argmax)
        else:
            argmax = None
            p = process_logits(logits, self.params)
            new, n = self.rule(draft.tokens, draft.q, p, self.generator)
        proposed = n + 1 if n < drafted else n  # the accepted tokens, and the rejected one if any
        accept_probs = chain_tests(p, draft.q, draft.tokens, argmax, proposed)
        draft.state["seen"] = logits if self.drafter.reads_verify else None  # its next proposal's (drafters.py)
        return Verdict(new.tolist(), accepted=n, proposed=proposed, drafted=drafted, accept_probs=accept_probs)

    def commit(self, lm, draft, verdict):
        lm.cache.rollback(draft.tokens.numel() - verdict.accepted)
        self.drafter.accept(draft, verdict.accepted)


class Parallel(Linear):
    """Parallel drafting (PARD-style): :class:`Linear` whose chain comes from one draft pass of a block draft
    (:class:`~specdec_core.drafters.BlockDrafter`)."""

    name = "parallel"


class TreeDecoding(Method):
    """Tree speculative decoding (SpecInfer, Medusa, EAGLE, Sequoia): a tree of depth ``k`` in one verify pass
    through a 4D mask; the accepted path's KV entries are compacted in place (:mod:`specdec_core.tree`)."""

    name = "tree"

    def __init__(self, params, generator, drafter, k: int, shape, rule=tree_speculative_sample, confidence=None,
                 step_mode: str = "eager"):
        super().__init__(params, generator, step_mode)
        self.drafter = drafter
        self.k = k  # the deepest a step's tree grows
        self.shape = shape
        self.rule = rule  # the accept rule when sampling
        self.confidence = confidence

    def draft(self, seq, budget):
        self.drafter.check_owner(self)
        return self.drafter.propose_tree(seq, self.shape, min(self.k, budget), self.params, self.generator,
                                         confidence=self.confidence)

    def verify(self, lm, seq, draft):
        L = lm.length  # the root goes to slot L, node i to slot L + i; the pass commits them all
        tokens = torch.cat([torch.tensor(seq[-1:]), draft.tokens])
        return lm.forward(tokens, positions=L + draft.tree.depths, mask=draft.tree.bias(L, lm.dtype, lm.device))

    def accept(self, draft, logits):
        tree = draft.tree
        if self.params.greedy:  # greedy tests compare with the target's argmax; its laws are not needed
            p = None
            path, new = greedy_tree_accept(tree, draft.tokens, logits.argmax(-1))
        else:
            p = process_logits(logits, self.params)
            path, new = self.rule(tree, draft.tokens, draft.q, p, self.generator)
        last = path[-1] if path else 0  # the node the walk stopped at (0: the root)
        rejected = bool(tree.children[last])  # it has children: the verifier tested them and rejected them all
        proposed = len(path) + 1 if rejected else len(path)
        accept_probs = tree_tests(tree, path, draft.q, p)
        return Verdict(new.tolist(), accepted=len(path), proposed=proposed, drafted=tree.n,
                       accept_probs=accept_probs, path=path)

    def commit(self, lm, draft, verdict):
        # verify committed the root and the tree's N nodes last, so the root's slot is N + 1 from the end
        root = lm.length - (draft.tree.n + 1)
        lm.cache.retain([root + i for i in verdict.path], start=root + 1)  # node i sits at root + i
        self.drafter.accept_path(draft, verdict.path)


def cut(new: list[int], room: int, eos: set[int]) -> tuple[list[int], bool]:
    """``new`` up to and including the first EOS, at most ``room`` tokens; True when decoding is done."""
    for i, t in enumerate(new):
        if t in eos or i + 1 >= room:
            return new[: i + 1], True
    return new, False


def settle(stats: Stats, draft, verdict: Verdict, room: int, eos: set[int]) -> tuple[list[int], bool]:
    """A step's outcome, for one sequence or one row of a batch: its new tokens (cut at EOS and at ``room``),
    whether the decode is done, and the step in the record."""
    new, done = cut(verdict.tokens, room, eos)
    passes, predicted = (0, False) if draft is None else (draft.passes, draft.source == "prediction")
    stats.record_step(verdict.proposed, verdict.accepted, verdict.drafted, verdict.accept_probs, passes, predicted)
    stats.new_tokens += len(new)
    return new, done


@dataclass
class Run:
    """One decode, its arguments checked: what :func:`decode_steps` runs (``generate`` and ``stream`` build it)."""

    method: Method  # the phases, holding the run's sampling parameters and generator
    target: torch.nn.Module  # the causal LM that verifies
    prompt: torch.Tensor  # [S] token ids
    max_new_tokens: int
    eos: set[int]  # token ids that end the answer
    capacity: int  # positions of the target's KV cache
    stats: Stats  # the run record, filled as the steps go


def decode_steps(run: Run) -> Iterator[list[int]]:
    """Prefill, then ``run.method``'s four phases per step until EOS or ``max_new_tokens``. Yields the tokens
    each step commits (the prefill's token first) and fills ``run.stats`` as it goes (``decode_s`` and
    ``token_times`` include any time the consumer spends between steps)."""
    method = run.method
    stats = run.stats
    with borrowed(run.target, run.capacity, method.step_mode) as lm:  # eager: a new CachedLM; else one kept
        clock = Clock(stats, lm.device)
        method.start(run.prompt, run.capacity)
        with clock.phase("prefill"):
            tok, _ = choose(lm.forward(run.prompt, logits_to_keep=1)[-1], method.params, method.generator)
        stats.target_passes = 1
        stats.new_tokens = 1
        clock.mark_tokens(1)
        yield [tok]
        seq = run.prompt.tolist() + [tok]
        done = tok in run.eos or run.max_new_tokens <= 1
        t_decode = clock.now()
        while not done:
            room = run.max_new_tokens - stats.new_tokens  # tokens this step may still add
            phases = method.phases(room)
            with clock.phase("draft"):
                draft = phases.draft(seq, room - 1)
            with clock.phase("verify"):
                logits = phases.verify(lm, seq, draft)
            with clock.phase("accept"):
                verdict = phases.accept(draft, logits)
            with clock.phase("commit"):
                phases.commit(lm, draft, verdict)
                new, done = settle(stats, draft, verdict, room, run.eos)
                seq += new
            clock.mark_tokens(len(new))
            stats.decode_s = clock.now() - t_decode
            yield new
        method.finish(run.prompt.tolist(), seq[run.prompt.numel():])
