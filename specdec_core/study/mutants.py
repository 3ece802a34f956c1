"""Negative controls: deliberately wrong acceptance rules and drafters. Never use them to decode.

The exactness tests (``tests/test_exactness.py``, ``book/02_exactness.py``) must *fail* on each of these;
a statistic that passes a known-lossy sampler proves nothing. Each rule has the signature of
:func:`specdec_core.verify.speculative_sample` and is run through the real loop as its accept rule
(``generate(..., rule=mutants.RULES[name])``).

Some bugs are harmless when written literally, so each is given the form it takes in real code:

- **residual from p** (:func:`residual_from_p`): at a rejection, sample p instead of norm(max(0, p − q)).
- **missing bonus token.** Literally dropping the bonus while keeping the loop's bookkeeping consistent
  (:func:`no_bonus_literal`) only wastes it: the next step samples p anyway. In a loop written for the
  bonus (ours, gpt-fast) the last accepted draft is already in the target's cache, so dropping the bonus
  feeds it twice (:func:`no_bonus`); the other common form is an off-by-one that draws the bonus from
  the last draft position's row p_{K-1} instead of p_K (:func:`bonus_wrong_row`).
- **acceptance without min(1, ·).** ``u < p/q`` equals ``u < min(1, p/q)`` for u ∈ [0, 1)
  (:func:`no_min_literal`, bit-identical outputs). The uncapped ratio does harm where it is reused: the
  residual written as p − a·q with a = p/q instead of min(1, p/q) vanishes on q's support
  (:func:`no_min_residual`); forgetting the ratio altogether accepts with probability p(x) (:func:`accept_with_p`).
- **Medusa-style typical acceptance** (:func:`typical_acceptance`): accept x if p(x) > min(ε, δ·e^{−H(p)}).
- **q from raw logits while sampling from processed ones** (:class:`RawLogitsQ`, a drafter wrapper;
  transformers issues #32867, #47932).
- **q from a full-precision head while sampling from the fast path's rounded one** (:class:`FullPrecisionHeadQ`:
  the draft's head is packed in float16 by ``models/draft_step.py``; q must be the law of those logits). Its gap is
  about 10⁻³ in probability, out of any sample's reach: :func:`~specdec_core.study.exactness.reported_law_gap`
  recomputes the law and catches it exactly.
- **a Jacobi iterate reporting the target's soft law as q** (:class:`JacobiSoftQ`): the tokens are the last verify
  pass's argmax, chosen deterministically, but q claims the softmax of that pass's logits.
- **a deterministic draft reporting the law it was ranked by** (:class:`SuffixFrequencyQ`): the suffix drafter's
  empirical continuation frequencies as q, instead of the one-hot on the token it chose.

Notation: p = target law, q = draft law.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..adaptive.suffix import SuffixDrafter
from ..adaptive.jacobi import JacobiDrafter
from ..drafters import Draft, Drafter, ModelDrafter
from ..lm import CachedLM
from ..serving import Engine
from ..sampling import PROB_DTYPE, choose, process_logits, sample
from ..tree import Tree, TreeDraft
from ..verify import residual as _residual, speculative_sample


def _accept(x, draft_probs, target_probs, generator):
    """The correct acceptance step: (n accepted, K)."""
    K = x.numel()
    if not K:
        return 0, 0
    rows = torch.arange(K)
    px, qx = target_probs[rows, x], draft_probs[rows, x]
    u = torch.rand(K, generator=generator, dtype=target_probs.dtype)
    return int((u * qx < px).to(torch.int64).cumprod(0).sum()), K


def _last(n, K, draft_probs, target_probs, generator):
    """The correct last token: residual sample at a rejection, bonus sample of p_K otherwise."""
    law = _residual(target_probs[n], draft_probs[n]) if n < K else target_probs[K]
    return sample(law, generator)


def residual_from_p(draft_tokens, draft_probs, target_probs, generator):
    """MUTANT: at the first rejection emit a sample of p_n instead of norm(max(0, p_n − q_n))."""
    n, K = _accept(draft_tokens, draft_probs, target_probs, generator)
    last = sample(target_probs[min(n, K)], generator)
    return torch.cat([draft_tokens[:n], last.view(1)]), n


def no_bonus(draft_tokens, draft_probs, target_probs, generator):
    """MUTANT: when all K drafts are accepted return them without a bonus token (n = K); the loop then
    treats the last draft as not yet seen by the target and feeds it a second time."""
    x = draft_tokens
    n, K = _accept(x, draft_probs, target_probs, generator)
    if K and n == K:
        return x.clone(), K
    last = _last(n, K, draft_probs, target_probs, generator)
    return torch.cat([x[:n], last.view(1)]), n


def no_bonus_literal(draft_tokens, draft_probs, target_probs, generator):
    """HARMLESS literal form: no bonus, but report n = K − 1 so the last draft plays the 'last token'.
    The bonus is wasted, the emitted law is still p."""
    x = draft_tokens
    n, K = _accept(x, draft_probs, target_probs, generator)
    if K and n == K:
        return x.clone(), K - 1
    last = _last(n, K, draft_probs, target_probs, generator)
    return torch.cat([x[:n], last.view(1)]), n


def bonus_wrong_row(draft_tokens, draft_probs, target_probs, generator):
    """MUTANT (off by one): the bonus is drawn from p_{K-1}, the last draft position's row, not p_K."""
    x = draft_tokens
    n, K = _accept(x, draft_probs, target_probs, generator)
    if n == K:
        last = sample(target_probs[max(K - 1, 0)], generator)
    else:
        last = _last(n, K, draft_probs, target_probs, generator)
    return torch.cat([x[:n], last.view(1)]), n


def no_min_literal(draft_tokens, draft_probs, target_probs, generator):
    """HARMLESS literal form: accept iff u < p/q, uncapped. For u ∈ [0, 1), u < p/q ⇔ u < min(1, p/q):
    same decisions, same random stream, bit-identical outputs."""
    x = draft_tokens
    K = x.numel()
    n = 0
    if K:
        rows = torch.arange(K)
        ratio = target_probs[rows, x] / draft_probs[rows, x]  # no min(1, ·)
        u = torch.rand(K, generator=generator, dtype=target_probs.dtype)
        n = int((u < ratio).to(torch.int64).cumprod(0).sum())
    last = _last(n, K, draft_probs, target_probs, generator)
    return torch.cat([x[:n], last.view(1)]), n


def no_min_residual(draft_tokens, draft_probs, target_probs, generator):
    """MUTANT: the residual written as p − a·q with the uncapped a = p/q (instead of min(1, p/q), which
    gives max(0, p − q)). It vanishes on q's support; the same zero-mass guard as
    :func:`~specdec_core.verify.speculative_sample` then falls back to p."""
    x = draft_tokens
    n, K = _accept(x, draft_probs, target_probs, generator)
    if n < K:
        p, q = target_probs[n], draft_probs[n]
        a = torch.where(q > 0, p / q.clamp_min(1e-300), torch.zeros_like(p))  # no min(1, ·)
        r = (p - a * q).clamp_min(0.0)
        last = sample(r / r.sum() if r.sum() > 1e-12 else p, generator)
    else:
        last = sample(target_probs[K], generator)
    return torch.cat([x[:n], last.view(1)]), n


def accept_with_p(draft_tokens, draft_probs, target_probs, generator):
    """MUTANT: accept x with probability p(x) (the ratio's q forgotten), correct residual and bonus."""
    x = draft_tokens
    K = x.numel()
    n = 0
    if K:
        u = torch.rand(K, generator=generator, dtype=target_probs.dtype)
        n = int((u < target_probs[torch.arange(K), x]).to(torch.int64).cumprod(0).sum())
    last = _last(n, K, draft_probs, target_probs, generator)
    return torch.cat([x[:n], last.view(1)]), n


def typical_acceptance(draft_tokens, draft_probs, target_probs, generator, epsilon: float = 0.09,
                       delta: float = 0.3):
    """MUTANT (lossy by design): Medusa's typical acceptance (defaults posterior_threshold = 0.09,
    posterior_alpha = 0.3). Accept x_i while p_i(x_i) > min(ε, δ·exp(−H(p_i))); then sample p_n."""
    x = draft_tokens
    K = x.numel()
    n = 0
    if K:
        p = target_probs[:K]
        entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)
        threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
        n = int((p[torch.arange(K), x] > threshold).to(torch.int64).cumprod(0).sum())
    last = sample(target_probs[n], generator)
    return torch.cat([x[:n], last.view(1)]), n


T1 = {"name": "T=1", "temperature": 1.0}
T07_K4 = {"name": "T=0.7, top-k=4", "temperature": 0.7, "top_k": 4}
T05_K3 = {"name": "T=0.5, top-k=3", "temperature": 0.5, "top_k": 3}

RULES = {
    "residual_from_p": residual_from_p,
    "no_bonus": no_bonus,
    "bonus_wrong_row": bonus_wrong_row,
    "no_min_residual": no_min_residual,
    "accept_with_p": accept_with_p,
    "typical_acceptance": typical_acceptance,
    "no_bonus_literal": no_bonus_literal,
    "no_min_literal": no_min_literal,
}
HARMLESS = ("no_bonus_literal", "no_min_literal")

# Each control runs through the linear loop with the model drafter, in a setting where its bug bites
# (e.g. raw-logits q changes nothing at temperature 1 without truncation). ``bug`` names the class.
CONTROLS = {
    "residual_from_p": dict(bug="residual from p, not max(0, p − q)", rule=residual_from_p, setting=T05_K3),
    "no_bonus": dict(bug="missing bonus token", rule=no_bonus, setting=T07_K4),
    "bonus_wrong_row": dict(bug="missing bonus token (off-by-one row)", rule=bonus_wrong_row, setting=T07_K4),
    "raw_logits_q": dict(bug="q from raw logits, sampled from processed", rule=speculative_sample,
                         drafter="raw_logits_q", setting=T05_K3),
    "no_min_residual": dict(bug="acceptance without min(1, ·) (reused in the residual)", rule=no_min_residual,
                            setting=T07_K4),
    "accept_with_p": dict(bug="acceptance without the ratio: probability p(x)", rule=accept_with_p, setting=T1),
    "typical_acceptance": dict(bug="Medusa-style typical acceptance", rule=typical_acceptance, setting=T1),
    "no_bonus_literal": dict(bug="missing bonus token, literal (harmless)", rule=no_bonus_literal, setting=T1),
    "no_min_literal": dict(bug="acceptance without min(1, ·), literal (harmless)", rule=no_min_literal, setting=T1),
}
LOSSY = tuple(c for c in CONTROLS if c not in HARMLESS)


class RawLogitsQ(ModelDrafter):
    """MUTANT drafter: samples from the *processed* draft law but reports q = softmax(raw logits).

    Wraps a :class:`~specdec_core.drafters.ModelDrafter` (same model, its own cache). Harmless at
    temperature 1 without top-k/top-p; lossy as soon as processing changes the law.
    """

    name = "model-rawq"

    def __init__(self, drafter: ModelDrafter):
        super().__init__(drafter.model)

    def propose(self, context, k, params, generator):
        lm = self.lm
        logits = lm.forward(torch.tensor(context[lm.length:], dtype=torch.long), logits_to_keep=1)[-1]
        tokens, qs = [], []
        for i in range(k):
            t, _ = choose(logits, params, generator)  # sampled from the processed law ...
            tokens.append(t)
            qs.append(torch.softmax(logits.to(PROB_DTYPE), -1))  # ... but q reported from raw logits
            if i + 1 < k:
                logits = lm.forward(torch.tensor([t]), logits_to_keep=1)[-1]
        q = None if params.greedy else torch.stack(qs)
        return Draft(torch.tensor(tokens, dtype=torch.long), q, passes=k, state={"base": len(context)})


class FullPrecisionHeadQ(ModelDrafter):
    """MUTANT drafter: samples from the draft's own logits on the library's path (its head rounded to float16 by
    :mod:`specdec_core.models.draft_step`) but reports q from the float32 head at the same hidden state. Wraps a
    :class:`~specdec_core.drafters.ModelDrafter` whose model is a :class:`~specdec_core.models.draft.DraftModel`."""

    name = "model-fp32q"

    def __init__(self, drafter: ModelDrafter):
        super().__init__(drafter.model)

    def _pass(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over ``tokens`` after the cache: (the library path's logits, the float32 head's) at the last."""
        model, cache = self.model, self.lm.cache
        L, T = cache.length, tokens.numel()
        at = torch.arange(L, L + T)
        with torch.inference_mode():
            h = model.hidden(tokens.view(1, T), position_ids=at.view(1, T), cache_position=at, past_key_values=cache,
                             use_cache=True).last_hidden_state[0, -1]
            cache.advance(T)
            full = lambda sub: sub.new_full((model.config.vocab_size,), float("-inf")).index_copy_(  # noqa: E731
                0, model.vocab, sub)
            return full(model.sub_logits(h)), full(h @ model.head.T)

    def propose(self, context, k, params, generator, confidence=None):
        fast, exact = self._pass(torch.tensor(context[self.lm.length:], dtype=torch.long))
        tokens, qs = [], []
        for i in range(k):
            t, _ = choose(fast, params, generator)  # sampled from the fast path's law ...
            tokens.append(t)
            qs.append(None if params.greedy else process_logits(exact, params))  # ... q from the float32 head's
            if i + 1 < k:
                fast, exact = self._pass(torch.tensor([t]))
        q = None if params.greedy else torch.stack(qs)
        return Draft(torch.tensor(tokens, dtype=torch.long), q, passes=k, state={"base": len(context)})


class PeekingStop(Drafter):
    """MUTANT drafter: an adaptive stop that reads the target. It drafts ``k`` tokens with ``drafter``, then asks
    the target for its laws p at the drafted positions and cuts the draft before the first token after the first
    that p gives less probability than q did (a token "at risk" of rejection): the stop now depends on the
    target's verdict for the current token, which no real drafter can know.

    Lossy: a cut token is replaced by a fresh draw from p, while tokens that survive are the ones p favours, so
    the tokens after the first follow a mixture tilted toward where p ≥ q (greedy decoding is unaffected:
    there the verdict is the argmax, and this mutant leaves greedy drafts alone)."""

    name = "peeking-stop"

    def __init__(self, drafter: ModelDrafter, target):
        self.inner, self.target, self.vocab_size = drafter, target, drafter.vocab_size

    def bind(self, target):
        self.inner.bind(target)

    def reset(self, prompt, capacity):
        self.inner.reset(prompt, capacity)

    def propose(self, context, k, params, generator, confidence=None):
        d = self.inner.propose(context, k, params, generator)
        if params.greedy or d.tokens.numel() < 2:
            return d
        lm = CachedLM(self.target, len(context) + d.tokens.numel())
        logits = lm.forward(torch.cat([torch.tensor(context, dtype=torch.long), d.tokens[:-1]]))[-d.tokens.numel():]
        p = process_logits(logits, params)
        i = torch.arange(d.tokens.numel())
        risky = (p[i, d.tokens] < d.q[i, d.tokens])[1:].nonzero()
        n = 1 + int(risky[0]) if len(risky) else d.tokens.numel()
        return Draft(d.tokens[:n], d.q[:n], d.passes, state=d.state)

    def accept(self, draft, n):
        self.inner.accept(draft, n)


class PeekingChooser(PeekingStop):
    """MUTANT chooser: picks between the model draft and prompt lookup by reading the target. It draws the
    model's proposal, asks the target for p at its first token, and drafts with lookup instead (where lookup has
    a continuation) when p gives that token less probability than q did: the choice now depends on the target's
    verdict on a drawn token. Lossy: the model proposals that survive are tilted toward tokens p favours, while
    the verifier still believes they came from q. (A choice that reads p at the *next* position alone would be
    harmless: p there is a function of the committed context, like the lookup's own test.)"""

    name = "peeking-chooser"

    def __init__(self, drafter: ModelDrafter, target, ngram):
        super().__init__(drafter, target)
        self.ngram = ngram

    def bind(self, target):
        super().bind(target)
        self.ngram.bind(target)

    def propose(self, context, k, params, generator, confidence=None):
        d = self.inner.propose(context, k, params, generator)
        if params.greedy:
            return d
        lm = CachedLM(self.target, len(context))
        p = process_logits(lm.forward(torch.tensor(context, dtype=torch.long), logits_to_keep=1)[-1], params)
        x = int(d.tokens[0])
        look = self.ngram.propose(context, k, params, generator)
        if p[x] < d.q[0, x] and look.tokens.numel():
            self.inner.accept(d, 0)  # the model's cache forgets its proposal; it catches up on the context next time
            look.state["by"] = self.ngram
            return look
        return d

    def accept(self, draft, n):
        draft.state.get("by", self.inner).accept(draft, n)


class JacobiSoftQ(JacobiDrafter):
    """MUTANT drafter: a Jacobi drafter that reports, at each position its last verify pass reached beyond the
    first rejection, that pass's law there (a softmax) instead of the one-hot on the token it proposes, whether that
    token came from the iterate or the pool. Lossy wherever that law is not one-hot on the token: the verifier
    accepts with min(1, p/q) ≠ p and resamples max(p − q, 0). Positions past the last pass keep one-hot rows."""

    name = "jacobi-soft-q"

    def reset(self, prompt, capacity):
        super().reset(prompt, capacity)
        self.soft: list[torch.Tensor] = []

    def accept(self, draft, n):
        super().accept(draft, n)
        if draft.state.get("seen") is not None:
            self.soft = list(torch.softmax(draft.state["seen"][n + 1:].to(PROB_DTYPE), -1))

    def propose(self, context, k, params, generator, confidence=None):
        d = super().propose(context, k, params, generator)
        if d.q is None:
            return d
        fresh = len(context) == self.at
        rows = [self.soft[i] if fresh and i < len(self.soft) else d.q[i] for i in range(len(d.tokens))]
        return replace(d, q=torch.stack(rows) if rows else torch.zeros(0, self.vocab_size, dtype=PROB_DTYPE))


class SuffixFrequencyQ(SuffixDrafter):
    """MUTANT drafter: a suffix drafter that reports as each token's q the empirical law of the trie node it
    continues (that node's children's counts, normalized) instead of the one-hot on the token it chose.

    The token is the most frequent continuation, chosen deterministically: the law it was drawn from is the one-hot;
    the frequencies are only what it was ranked by. Lossy wherever the node has more than one continuation: the
    verifier accepts x with probability min(1, p(x)/q(x)) > p(x) and, at a rejection, resamples max(p − q, 0),
    which takes mass from the other continuations too. Trees: every sibling reports its parent's frequencies."""

    name = "suffix-frequency-q"

    def frequencies(self, node) -> torch.Tensor:
        """``[V]`` float64: the continuations of trie node ``node``, by count."""
        q = torch.zeros(self.vocab_size, dtype=PROB_DTYPE)
        total = sum(c.count for c in node.children.values())
        for t, c in node.children.items():
            q[t] = c.count / total
        return q

    def _laws(self, parents) -> torch.Tensor:
        rows = [self.frequencies(u) for u in parents]
        return torch.stack(rows) if rows else torch.zeros(0, self.vocab_size, dtype=PROB_DTYPE)

    def propose(self, context, k, params, generator, confidence=None):
        start, nodes, _ = self.chain(context, k)
        toks = torch.tensor([c.token for c in nodes], dtype=torch.long)
        parents = [start] + nodes[:-1] if nodes else []
        return Draft(toks, None if params.greedy else self._laws(parents), passes=0)

    def propose_tree(self, context, shape, k, params, generator, confidence=None):
        start, nodes = self.token_tree(context, shape, k)
        tree = Tree.of(list(nodes))
        toks = torch.tensor([nodes[p].token for p in tree.paths], dtype=torch.long)
        q = None if params.greedy else self._laws([nodes[p[:-1]] if len(p) > 1 else start for p in tree.paths])
        return TreeDraft(tree, toks, q, passes=0)


__all__ = list(RULES) + ["RULES", "HARMLESS", "CONTROLS", "LOSSY", "RawLogitsQ", "PeekingStop", "PeekingChooser",
                         "SuffixFrequencyQ", "JacobiSoftQ", "FullPrecisionHeadQ", "speculative_sample", "batch_smallest_commit", "NeighbourLogitsEngine",
                         "MisalignedCutEngine"]


def batch_smallest_commit(verdicts):
    """MUTANT batch commit (for ``generate_batch(..., commit_rule=...)``): every row's cache keeps the batch's
    smallest accepted length + 1, the bookkeeping of a batch that rolls back in lockstep while each row
    still emits its own tokens. Caught by greedy identity and by the batched law test."""
    live = [v.accepted for v in verdicts if v is not None]
    return [0 if v is None else min(live) + 1 for v in verdicts]


def accept_untested(draft_tokens, draft_probs, target_probs, generator):
    """MUTANT: every draft token accepted without a test against p (a predicted output taken on trust), then the
    target's own token from p after them. Lossy whenever a draft token is not the target's choice."""
    K = len(draft_tokens)
    last = int(sample(target_probs[K], generator))
    return torch.cat([draft_tokens, torch.tensor([last], dtype=torch.long)]), K


class MisalignedCutEngine(Engine):
    """MUTANT engine (:class:`~specdec_core.serving.Engine`): a draft asked before K (a drafter without a model) is
    cut to its first K tokens with the laws of its *last* K, the slip of a slice taken from the wrong end. Where the
    cut is shorter than the proposal, tokens are tested against other tokens' laws. Caught by the engine's law test
    on prompt lookup rows (greedy rows compare tokens only, so greedy identity cannot see it)."""

    def _cut(self, draft, k):
        return replace(draft, tokens=draft.tokens[:k], q=None if draft.q is None else draft.q[len(draft.tokens) - k:])


class NeighbourLogitsEngine(Engine):
    """MUTANT engine (:class:`~specdec_core.serving.Engine`): row r accepts its draft against the logits of row
    r + 1 (mod the live rows), the slip of an off-by-one in a batch's row bookkeeping. With one live row it is the
    engine itself. Caught by greedy identity and by the engine's law test."""

    def _logits(self, logits, r, n):
        other = logits[(r + 1) % len(logits)][:n]  # as many as the neighbour has, then the row's own
        return torch.cat([other, logits[r][len(other):n]])
