"""``Engine``: continuous batching. Requests arrive, wait, join the running batch, decode with their own method,
drafter and K, and leave as soon as they are done; every step verifies all live rows in one target pass.

How the pieces map onto vLLM's scheduler (v1, ``vllm/v1/core/sched/scheduler.py``) and Orca's iteration-level
scheduling:

- **Waiting queue and admission.** ``submit`` puts a request in the queue with its arrival time; at each step the
  requests that have arrived by the wall clock are admitted in arrival order while a row of the batch is free
  (``max_batch`` is vLLM's ``max_num_seqs``). Admission is the request's *prefill*: one single-sequence pass over
  its prompt, the very pass ``generate`` makes, whose keys and values are copied into the free row
  (:meth:`~specdec_core.serving.cache.BatchKVCache.place`). vLLM chunks long prefills and mixes them into decode
  steps under a token budget; here a prefill runs whole, between two decode steps, and the rows that are decoding
  wait for it (their inter-token gap shows it).
- **Running batch.** Live rows are kept first in one preallocated cache, one length per row (vLLM's persistent
  batch, condensed when a request leaves: the last live row moves into the freed one). A step drafts for every
  row with that row's own phases (:mod:`specdec_core.loop`: the row's drafter, K, sampling and generator; rows
  whose requests share a draft model run its passes together, :mod:`specdec_core.serving.drafters`), runs **one**
  target pass over every row's ``[last token, draft…]``, and gives each row its own logits to *accept* with the
  core's rule. The pass is *packed* as vLLM flattens its batch: the rows' feeds run back to back as one sequence,
  so a row drafting 16 tokens beside seven decoding ones costs a pass over 24 tokens, not 8 × 17 padded slots
  (:meth:`~specdec_core.serving.cache.BatchLM.verify`; CUDA-graph step modes keep padded shapes). Each row then keeps its own accepted tokens (a pointer move,
  :class:`~specdec_core.serving.cache.BatchKVCache`): acceptance is ragged and rows never re-pad.
- **Retirement.** A row whose request reached EOS or its ``max_new_tokens`` leaves before the next step; its drafter
  is told (``finish``), and a waiting request can take the row at once. vLLM frees the request's KV blocks; here
  the row's slots are simply overwritten by the next occupant.
- **Speculation per request and by load.** vLLM applies one speculative method and one ``num_speculative_tokens``
  to the whole batch (its batch-size table, ``num_speculative_tokens_per_batch_size``, by batch size); here each
  request carries its own, and ``k="adaptive"`` lets the engine choose each row's own K each step, 0 included,
  from a step-cost model and the rows' running acceptance (:class:`StepCost`: SmartSpec's rule, per row, weighing
  each request's time per token rather than the batch's tokens per second). The step right
  after an admission does not speculate for adaptive rows: the decoding rows have already waited a prefill for
  it, their longest inter-token gaps are those steps, and a draft and a longer verify pass would add to exactly
  those (vLLM's chunked prefill bounds the same tail by spreading the prefill over steps instead).
- **Drafts asked first.** An adaptive row whose drafter proposes without a model pass (``Drafter.previews``:
  prompt lookup, the suffix drafter) is asked for its longest draft *before* its K is chosen, and the draft is then
  cut to K. Such a drafter proposes on some steps and not on others, and asking costs microseconds, so the cost
  model prices what the row will feed, not a fill rate, and a row that holds a proposal verifies at least its first
  token (:attr:`StepCost.HELD_FLOOR`: at a full batch the per-step objective leaves short matches undrafted, which
  load sweeps of chapter 9's traffic mix past saturation measured as goodput lost; its exercise 7 measures it).
  Cutting stays exact: each token of such a draft is a function of the committed context alone, so its first K
  tokens are a draft like any.

- **Garbage collection.** vLLM freezes the objects alive after its start-up (``gc.freeze()``) so that Python's
  full collections stop scanning them. A process with a model, transformers and pandas loaded tracks some 450 k
  objects; a full collection of them pauses for 150-200 ms on 2 CPU cores, and it lands in whichever step is
  running. In a step's gap that pause is noise in every policy's tail latency. In the drafting window it inflates
  the running time per drafted token that adaptive K is priced by (50× for one such step, seen once). ``run``
  freezes what is alive when it starts and unfreezes it when it ends (unless the caller has frozen objects, which
  it leaves as they are); both are constant-time list moves, and no collection runs at either.

Exactness is the core's: each row is drafted, accepted and cut by the single-sequence phases with its own
generator, and reads only its own cache row. A greedy request's output equals ``generate``'s, whatever its
neighbours and arrival (up to the rounding of a batched pass in float32, bit for bit on float64 pairs); a sampled
request follows the target's law (the rows share passes, never random numbers or decisions). When its K depends
on the neighbours (``k="adaptive"``), a sampled row's draws differ from ``generate``'s, its law does not.

Times: ``stats.token_times`` count from the request's *arrival*, so the first is the time to first token (queueing
and prefill included); :func:`~specdec_core.serving.metrics.summarize` turns them into vLLM's serving metrics.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..decode import DecodeOptions, cache_capacity, check_prompts, eos_ids, headroom
from ..drafters import Draft
from ..lm import CachedLM
from ..loop import Autoregressive, Linear, Method, Parallel, settle
from ..record import Result, Stats, Timer
from ..sampling import choose, make_generator
from .cache import BatchLM
from .drafters import BATCHED, RowDraft, RowDrafts

ENGINE_METHODS = ("autoregressive", "linear", "parallel")
# generate's options that the engine has no form of, and why
ENGINE_REFUSES = {"tree": "trees are single-sequence only (method 'tree')",
                  "cache_len": "the engine sizes its cache (Engine(cache_len=...))"}


@dataclass
class EngineResult(Result):
    """A request's :class:`~specdec_core.record.Result`, and where it stood in the run: ``arrival_s`` (seconds from
    the run's start), ``admitted_s`` (its prefill began), ``finished_s``; ``error``: what stopped it (None: it
    finished). ``stats.token_times`` count from ``arrival_s``."""

    arrival_s: float = 0.0
    admitted_s: float = float("nan")
    finished_s: float = float("nan")
    error: Exception | None = None
    ks: list[int] = field(default_factory=list)  # the K each decode step allowed (adaptive requests: the chosen)
    rows: list[int] = field(default_factory=list)  # the live rows of each decode step (the batch it shared)


@dataclass
class _Request:
    index: int
    prompt: list[int]
    arrival_s: float
    options: DecodeOptions
    method: Method
    eos: set[int]
    adaptive: bool
    k_max: int
    result: EngineResult
    pool: tuple  # (method, drafter given): the rows whose acceptance is this row's prior (StepCost, pools)
    seq: list[int] = field(default_factory=list)
    done: bool = False


class _Row:
    """Row ``r`` of a batch cache as the core's commit phase sees a single sequence's model: ``lm.cache.rollback``."""

    def __init__(self, batch_cache, r: int):
        self.batch_cache, self.r = batch_cache, r

    @property
    def cache(self) -> _Row:
        return self

    def rollback(self, n: int) -> None:
        self.batch_cache.rollback_row(self.r, n)


def _is_time(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


class Engine:
    """Continuous batching over ``target`` (module docstring): ``submit`` requests, then ``run`` them.

    ``max_batch``: the most requests decoding at once. ``cache_len``: positions per row (default: what the
    submitted requests need: the longest prompt and answer + the largest step's headroom, since a pass pads every
    row to its longest feed; a ``cache_len`` set by hand that leaves less cuts a step's K to fit). ``step_cost``: the
    :class:`StepCost` that ``k="adaptive"`` requests are chosen by (default: measured on ``target`` at the first
    run that has one, at its requests' :meth:`StepCost.typical_context`). ``step_mode``: how the batch's verify and
    draft passes run (:mod:`specdec_core.graphs`; default eager, one pass shape per step), each request's prefill
    runs eager. ``commit_rule``: how many of its verified tokens each row's cache keeps, from the step's verdicts
    (None: each row its own accepted + 1, as ``generate``; the tests' negative controls pass a wrong one).

    ``speculate_after_prefill`` (a class attribute, False): whether adaptive rows may speculate on the step right
    after an admission (module docstring); the law tests set it on an instance to see K vary on every step."""

    speculate_after_prefill = False

    def __init__(self, target, max_batch: int = 8, cache_len: int | None = None, step_cost=None,
                 step_mode: str = "eager", commit_rule=None):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if cache_len is not None and (isinstance(cache_len, bool) or not isinstance(cache_len, int) or cache_len < 2):
            raise ValueError(f"cache_len must be an integer >= 2 or None, got {cache_len!r}")
        self.target, self.max_batch, self.cache_len, self.step_cost = target, max_batch, cache_len, step_cost
        self.step_mode = step_mode  # how the batch's passes run (specdec_core.graphs); each prefill runs eager
        self.commit_rule = commit_rule  # None: each row keeps its own accepted + 1 (negative controls pass another)
        self.counts: dict = {}  # the last run's steps, token slots of its verify passes and those that held a token
        self.requests: list[_Request] = []
        self.device = next(target.parameters()).device
        self.vocab_size = target.config.get_text_config().vocab_size

    # -- submit ---------------------------------------------------------------------------------------------
    def submit(self, input_ids, arrival_s: float = 0.0, drafter=None, method: str = "autoregressive", k=4,
               max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int = 0, rule=None, confidence: float | None = None, prediction=None) -> int:
        """Queue one request (``generate``'s arguments) arriving ``arrival_s`` seconds after the run starts; returns
        its index in :meth:`run`'s results. ``k="adaptive"``: a speculative request whose K the engine chooses each
        step (at most :data:`StepCost.K_MAX`, 0 allowed). ``drafter`` is forked (:meth:`~specdec_core.drafters.
        Drafter.fork`): each request has its own drafter state, sharing what the drafter shares across requests.
        Every check is made here, so a bad request fails at ``submit``, never in the middle of a run."""
        if not _is_time(arrival_s):
            raise ValueError(f"arrival_s must be a finite number of seconds >= 0, got {arrival_s!r}")
        adaptive = k == "adaptive"
        if adaptive and method == "autoregressive":
            raise ValueError("k='adaptive' needs a speculative method (method='linear' or 'parallel')")
        options = DecodeOptions(method=method, k=StepCost.K_MAX if adaptive else k, max_new_tokens=max_new_tokens,
                                temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, cache_len=self.cache_len,
                                rule=rule, confidence=confidence, graphs=False, prediction=prediction)
        params, theta, _, drafter = options.check(self.target, drafter, methods=ENGINE_METHODS, caller="Engine")
        [prompt] = check_prompts(self.target, [input_ids])
        cache_capacity(self.target, prompt.numel(), options)  # refuses what cannot fit the cache or the model
        generator = make_generator(self.device, seed)
        k_max = 0 if method == "autoregressive" else options.k  # the most a step of this request drafts
        if method == "autoregressive":
            phases = Autoregressive(params, generator)
        else:
            kind = Parallel if method == "parallel" else Linear
            batched = type(drafter) in BATCHED and theta is None  # drafted with its neighbours' rows
            phases = kind(params, generator, RowDraft(drafter) if batched else drafter.fork(), k_max, confidence=theta,
                          **({} if rule is None else {"rule": rule}))
        i = len(self.requests)
        self.requests.append(_Request(i, prompt.tolist(), float(arrival_s), options, phases, eos_ids(self.target),
                                      adaptive, k_max, EngineResult([], Stats(method), arrival_s=float(arrival_s)),
                                      (method, drafter)))
        return i

    # -- run ------------------------------------------------------------------------------------------------
    def run(self, concurrency: int | None = None, progress=None) -> list[EngineResult]:
        """Decode every submitted request; one :class:`EngineResult` per request, in submission order (a request
        that failed carries its ``error``; the others are unaffected). Arrivals are replayed on the wall clock
        from the run's start. ``concurrency``: a closed loop instead (at most that many requests in the system:
        each one that finishes releases the next, whose arrival is then; submission times are ignored).
        ``progress``: a callable told each finished request's index (a progress bar's ``update``)."""
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                        or concurrency < 1):
            raise ValueError(f"concurrency must be an integer >= 1 or None, got {concurrency!r}")
        todo = [q for q in self.requests if not q.done]
        if not todo:
            return [q.result for q in self.requests]
        freeze = gc.get_freeze_count() == 0  # a caller's own freeze is left as it was
        if freeze:  # module docstring: no full collection of what exists now pauses a step of this run
            gc.freeze()
        try:
            self._run(todo, concurrency, progress)
        finally:
            if freeze:
                gc.unfreeze()
        return [q.result for q in self.requests]

    def _run(self, todo: list[_Request], concurrency: int | None, progress) -> None:
        # a pass is as long as its longest row's feed, so every row needs the largest step's headroom, not only its own
        capacity = self.cache_len or (max(len(q.prompt) + q.options.max_new_tokens for q in todo)
                                      + max(headroom(q.options.method, q.options.k) for q in todo))
        if any(q.adaptive for q in todo) and self.step_cost is None:
            context = StepCost.typical_context(self.target, [(len(q.prompt), q.options.max_new_tokens) for q in todo])
            self.step_cost = StepCost.measure(self.target, max_rows=self.max_batch, context=context)
        lm = BatchLM(self.target, self.max_batch, capacity, self.step_mode)
        one = CachedLM(self.target, capacity)  # the prefill's single-sequence pass, as generate's
        groups: dict[int, RowDrafts] = {}  # one per draft model that requests share (id of the drafter given)
        for q in todo:
            d = q.method.drafter
            if isinstance(d, RowDraft):
                if id(d.base) not in groups:
                    groups[id(d.base)] = BATCHED[type(d.base)](d.base, self.max_batch, capacity, self.step_mode)
                d.rows = groups[id(d.base)]
        self.counts = dict(steps=0, slots=0, used=0, prefills=0)
        clock = Timer(self.device)
        t0 = clock.now()
        now = lambda: clock.now() - t0  # noqa: E731
        waiting = sorted(todo, key=lambda q: (q.arrival_s, q.index))
        if concurrency is not None:
            for j, q in enumerate(waiting):
                q.arrival_s = 0.0 if j < concurrency else math.inf  # released as earlier ones finish
                q.result.arrival_s = q.arrival_s
        live: list[_Request] = []
        while waiting or live:
            # admit: arrived requests into free rows, each prefilled alone
            t, stalled = now(), False
            while waiting and len(live) < self.max_batch and waiting[0].arrival_s <= t:
                stalled = stalled or bool(live)  # rows already decoding wait for this prefill
                q = waiting.pop(0)
                for g in groups.values():
                    g.clear(len(live))
                self._admit(q, lm, one, len(live), now)
                if q.done:
                    self._retire(q, q.result.error, now, waiting, concurrency, progress)
                else:
                    live.append(q)
                t = now()
            if not live:
                if waiting:  # idle until the next arrival
                    time.sleep(max(0.0, waiting[0].arrival_s - now()))
                continue
            self._step(live, lm, now, groups, stalled)
            for r in reversed(range(len(live))):  # retire finished rows; the last live row fills the gap
                q = live[r]
                if q.done:
                    last = len(live) - 1
                    if r != last:
                        lm.cache.move(last, r)
                        for g in groups.values():
                            g.move(last, r)
                        live[r] = live[last]
                    live.pop()
                    self._retire(q, q.result.error, now, waiting, concurrency, progress)

    def _admit(self, q: _Request, lm: BatchLM, one: CachedLM, row: int, now) -> None:
        """The request's prefill (the single-sequence pass ``generate`` makes), its first token, and its row."""
        res = q.result
        res.admitted_s = now()
        try:
            q.method.start(torch.tensor(q.prompt), lm.cache.capacity)
            one.cache.reset()
            logits = one.forward(torch.tensor(q.prompt), logits_to_keep=1)[-1]
            tok, _ = choose(logits, q.method.params, q.method.generator)
            lm.cache.place(row, one.cache, len(q.prompt))
        except Exception as e:  # noqa: BLE001 -- the request fails, the run goes on
            res.error, q.done = e, True
            return
        self.counts["prefills"] += 1
        t = now()
        res.stats.target_passes = res.stats.new_tokens = 1
        res.stats.prefill_s = t - res.admitted_s
        res.stats.token_times = [t - q.arrival_s]
        res.tokens = [tok]
        q.seq = q.prompt + [tok]
        q.done = tok in q.eos or q.options.max_new_tokens <= 1

    def _logits(self, logits: list[torch.Tensor], r: int, n: int) -> torch.Tensor:
        """Row r's verify logits (its first n positions)."""
        return logits[r][:n]

    def _step(self, live: list[_Request], lm: BatchLM, now, groups: dict, stalled: bool = False) -> None:
        """One decode step for every live row: draft (each its own, rows sharing a draft model together), one
        verify pass, accept, commit. ``stalled``: decoding rows waited for a prefill just before this step."""
        t_choose = now()
        held = self._previews(live, stalled)
        t_held = now()
        ks = self._choose_ks(live, stalled, lm.packs, held)
        if self.cache_len is not None:  # the pass writes max(lengths) + its longest feed: cut K to what is left
            room_left = lm.cache.capacity - int(lm.cache._allocated()[1][:len(live)].max()) - 1
            ks = [min(k, room_left) for k in ks]
        t_draft = now()
        steps = []  # [request, phases, draft, room]
        asks: dict[int, dict] = {}  # batched drafts: group → row → (context, k, params, generator)
        for r, q in enumerate(live):
            room = q.options.max_new_tokens - len(q.result.tokens)
            k = min(ks[r], room - 1)
            phases = q.method.phases(room) if k >= 1 else Autoregressive(q.method.params, q.method.generator)
            if q.adaptive and k >= 1:
                phases.k = k
            draft = None
            if isinstance(held.get(r), Exception):  # its drafter failed when asked first
                q.result.error, q.done, phases = held[r], True, None
            elif r in held:
                draft = self._cut(held[r], k) if k >= 1 else None
            elif k >= 1 and isinstance(phases.drafter, RowDraft):
                asks.setdefault(id(phases.drafter.rows), {})[r] = (q.seq, k, phases.params, phases.generator)
            else:
                try:
                    draft = phases.draft(q.seq, room - 1)
                except Exception as e:  # noqa: BLE001
                    q.result.error, q.done, phases = e, True, None
            q.result.ks.append(k)
            q.result.rows.append(len(live))
            steps.append([q, phases, draft, room])
        for g in groups.values():
            if id(g) in asks:
                try:
                    for r, draft in g.propose(len(live), asks[id(g)]).items():
                        steps[r][2] = draft
                except Exception as e:  # noqa: BLE001 -- every row of the failed batched draft fails
                    for r in asks[id(g)]:
                        steps[r][0].result.error, steps[r][0].done, steps[r][1] = e, True, None
        feeds = [q.seq[-1:] + (draft.tokens.tolist() if draft is not None else []) for q, _, draft, _ in steps]
        lm.cache.live(len(live))
        t_verify = now()
        logits = lm.verify(feeds, commit=[len(f) for f in feeds])  # row r's [len(feeds[r]), V]
        t_accept = now()
        verdicts = [None] * len(steps)
        for r, (q, phases, draft, room) in enumerate(steps):
            if phases is None:
                continue
            try:
                verdicts[r] = verdict = phases.accept(draft, self._logits(logits, r, len(feeds[r])))
                phases.commit(_Row(lm.cache, r), draft, verdict)
                new, q.done = settle(q.result.stats, draft, verdict, room, q.eos)
            except Exception as e:  # noqa: BLE001
                q.result.error, q.done = e, True
                continue
            q.seq += new
            q.result.tokens += new
        if self.commit_rule is not None:  # a negative control's bookkeeping in place of each row's own
            kept = torch.tensor([0 if v is None else v.accepted + 1 for v in verdicts])
            keep = torch.tensor(self.commit_rule(verdicts))
            if bool((keep > kept).any()) or bool((keep < 0).any()):
                raise ValueError(f"commit_rule may keep 0 to accepted + 1 tokens a row: {keep.tolist()} for "
                                 f"{kept.tolist()}")
            lm.cache.rollback(kept - keep)
        t_end = now()
        self.counts["steps"] += 1
        self.counts["slots"] += sum(map(len, feeds)) if lm.packs else len(feeds) * max(map(len, feeds))
        self.counts["used"] += sum(map(len, feeds))
        # the drafters' time per drafted token, over the steps that asked for a draft or made one: choosing K is
        # not drafting, and a step where no row drafts would raise the price of a token without adding one (after
        # which no row would draft again); a row asked first drafted its whole proposal
        drafted = sum(len(f) - 1 for r, f in enumerate(feeds) if r not in held)
        drafted += sum(len(d.tokens) for d in held.values() if isinstance(d, Draft))
        if self.step_cost is not None and (drafted or any(q.result.ks[-1] for q, *_ in steps)):
            self.step_cost.observe_draft(t_held - t_choose + t_verify - t_draft, drafted)
        for q, phases, *_ in steps:
            s = q.result.stats
            s.draft_s += t_verify - t_choose
            s.verify_s += t_accept - t_verify
            s.accept_s += t_end - t_accept
            if phases is not None:
                s.token_times += [t_end - q.arrival_s] * (len(q.result.tokens) - len(s.token_times))
                s.decode_s = s.token_times[-1] - s.token_times[0]

    def _previews(self, live: list[_Request], stalled: bool = False) -> dict:
        """Row → its longest draft this step, for the adaptive rows whose drafter proposes without a model pass
        (``Drafter.previews``: prompt lookup, the suffix drafter), asked before K is chosen (module docstring); a
        drafter's error in place of its draft. Empty on a step whose adaptive rows do not speculate."""
        if stalled and not self.speculate_after_prefill:
            return {}
        held = {}
        for r, q in enumerate(live):
            room = q.options.max_new_tokens - len(q.result.tokens)
            if q.adaptive and room > 1 and q.method.drafter.previews:
                q.method.k = q.k_max  # the last step cut it to that step's K
                try:
                    held[r] = q.method.draft(q.seq, room - 1)
                except Exception as e:  # noqa: BLE001 -- the request fails at this step, the others go on
                    held[r] = e
        return held

    def _cut(self, draft: Draft, k: int) -> Draft:
        """The first ``k`` tokens of a draft asked first, with their laws: a drafter without a model draws each
        token from the committed context alone, so its cut draft is as exact as one proposed at ``k``."""
        return replace(draft, tokens=draft.tokens[:k], q=None if draft.q is None else draft.q[:k])

    def _choose_ks(self, live: list[_Request], stalled: bool = False, packed: bool = True,
                   held: dict | None = None) -> list[int]:
        """Each row's K this step: fixed requests their own; adaptive ones the K the step-cost model predicts best
        (:meth:`run` measures the model whenever a request is adaptive), or 0 on a ``stalled`` step (module
        docstring: the rows have just waited for a prefill). ``held``: the drafts asked first (:meth:`_previews`),
        whose lengths the model then knows (:meth:`StepCost.best_ks`)."""
        if not any(q.adaptive for q in live):
            return [q.k_max for q in live]
        if stalled and not self.speculate_after_prefill:
            return [0 if q.adaptive else q.k_max for q in live]
        held = held or {}
        proposals = [len(d.tokens) if isinstance(d, Draft) else None for d in map(held.get, range(len(live)))]
        return self.step_cost.best_ks([(q.result.stats, q.result.ks, None if q.adaptive else q.k_max) for q in live],
                                      packed=packed, pools=[q.pool for q in live], proposals=proposals)

    def _retire(self, q: _Request, error, now, waiting, concurrency, progress) -> None:
        q.done = True
        q.result.finished_s = now()
        if error is None:
            q.method.finish(q.prompt, q.result.tokens)
        if concurrency is not None:  # closed loop: the next waiting request arrives now
            for w in waiting:
                if math.isinf(w.arrival_s):
                    w.arrival_s = w.result.arrival_s = q.result.finished_s
                    break
        if progress is not None:
            progress(q.index)


class StepCost:
    """What one engine step costs, and the K of each row that serves the live rows best (SmartSpec, arXiv
    2406.14066, with a K per row).

    ``objective``: what a step's choice maximizes. ``"throughput"`` (SmartSpec's): the batch's expected tokens per
    second, Σ_r tokens_r / seconds. ``"latency"`` (the default): the rows' expected rates multiplied together,
    Σ_r log(tokens_r / seconds), that is the lowest geometric mean of the rows' times per token. Tokens per second
    count a row that adds 17 tokens 17 times, so they buy its span with a longer step that every other row waits
    for; a request's TPOT, and whether it meets an SLO, counts once, whatever its drafter. Under the latency
    objective a row drafts only while its own relative gain outweighs the relative delay of the n rows sharing the
    step (proportional fairness). With one row, or rows alike, the two are the same rule.

    ``verify[(B, T)]``: seconds of one target pass over B rows of T tokens, measured on this machine
    (:meth:`measure`) and interpolated linearly between the measured B and T. A step with n rows feeding N tokens
    in all (1 + the draft tokens each proposes) costs ``t(n, N / n) + d · drafted`` when the pass packs them (a pass
    over N tokens), or ``t(n, longest feed) + d · drafted`` when it pads them (the longest expected feed), where d
    is ``draft_cost`` (seconds per drafted token), or by default the running draft time per drafted token of this
    engine's steps (one step's outlier capped, :meth:`observe_draft`). K = 0 (no speculation) is one of the choices
    (:meth:`best_ks`; :meth:`best_k`: one K for every row).

    A row allowed K draft tokens feeds only those its drafter proposes: ``F_1 + … + F_K`` of them on average, F_i
    the chance of an i-th proposal when allowed one (:meth:`fill`), or exactly ``min(K, d)`` for a row that already
    holds a proposal of d tokens (``proposals`` of :meth:`best_ks`). A model draft proposes all K; a drafter without a
    model proposes only where it finds a match (prompt lookup on a chat request, say, on one step in three), and
    costs nothing in the pass where it finds none, so its K is priced by what it feeds, not by what it is allowed.
    Such a drafter feeds all of its K or nothing, and where each token added to a pass costs more the longer the
    pass already is (a CPU past its few-token knee), the time of the mean feed is below the mean time: a step is
    priced at its expected time over the rows' feeds (:meth:`verify_time`).

    A row drafting K adds ``1 + P_1 + … + P_K`` tokens, P_i the chance that its i-th draft token is accepted,
    estimated per position from the row's own steps (:meth:`acceptance`): how often its drafter proposed an i-th
    token when allowed one (fill), and how often an i-th token was accepted once tested. A geometric α (P_i = α^i)
    is the special case of one rate at every position; a drafter that copies a span (the suffix drafter on an
    input-grounded request) is accepted all or nothing, so its first token is the doubtful one and the later ones
    are nearly sure, which one α would price as if each were as doubtful as the first. Positions are pooled in
    octaves (1, 2, 3-4, 5-8, …) and weighed by recency (each drafting step's tallies ``DECAY`` times the next's: a
    request's acceptance drifts as it decodes, prompt lookup finding more of an answer that repeats itself, a copy
    running in spans, so rates that weigh every step alike lag behind and price the row's next draft too low). Each
    octave's rates are shrunk with ``PRIOR_TESTS`` pseudo-tests towards those pooled over the live rows of the row's
    pool, those towards the octave before (fill 1 and acceptance 0.5 before any step). A pool is the rows that were
    submitted with one drafter and method (``pools``; a request with a prediction has its own), since a chat
    request's prompt lookup says little of what a grounded request's copy will do."""

    K_MAX = 32
    HELD_FLOOR = 1  # the fewest draft tokens of a proposal a row already holds that it verifies (best_ks)
    PRIOR_TESTS = 4
    DECAY = 0.9  # the weight of a row's earlier drafting steps against each later one's
    ROWS = (1, 2, 4, 8, 16, 32)
    TOKENS = (1, 2, 3, 5, 9, 17, 33)
    LONGEST_FEED = 2 * TOKENS[-1] - 1  # the longest row :meth:`measure` times (:meth:`feeds`)

    OBJECTIVES = ("latency", "throughput")
    SETTLED, OUTLIER = 16, 10.0  # a drafting step counts at most OUTLIER × the last SETTLED steps' median price
    PRICES = np.concatenate([[0.0], np.geomspace(1e-3, 1.0, 40)])  # λ, tokens of gain per draft token (best_ks)

    def __init__(self, verify: dict[tuple[int, int], float], draft_cost: float | None = None,
                 objective: str = "latency"):
        if not verify:
            raise ValueError("StepCost needs at least one measured (rows, tokens) pass time")
        if objective not in self.OBJECTIVES:
            raise ValueError(f"objective must be one of {self.OBJECTIVES}, got {objective!r}")
        if draft_cost is not None and not (isinstance(draft_cost, (int, float)) and 0 <= draft_cost < math.inf):
            raise ValueError(f"draft_cost must be seconds per drafted token >= 0, or None (measured), "
                             f"got {draft_cost!r}")
        self.verify = dict(verify)
        self.rows = sorted({b for b, _ in verify})
        self.tokens = sorted({t for _, t in verify})
        self.draft_cost = draft_cost  # None: the running draft time per drafted token of the engine's steps
        self.objective = objective  # what a step's choice maximizes (class docstring)
        self.draft_s, self.drafted = 0.0, 0
        self._recent: deque[float] = deque(maxlen=self.SETTLED)  # the last steps' seconds per drafted token
        self._octave_of = np.array([self.octave(i) for i in range(1, self.K_MAX + 1)])  # position i's pool
        self._curves: dict[int, np.ndarray] = {}  # rows -> seconds at each measured T (t)
        self._tallies: dict[int, list] = {}  # id(stats) -> [stats, steps read, tallies] of the live rows (counts)

    @classmethod
    def measure(cls, target, max_rows: int = 8, context: int = 64, repeats: int = 3,
                objective: str = "latency", timer: Timer | None = None) -> StepCost:
        """Median seconds of a step's verify pass over B rows of T tokens each on average after ``context``
        committed ones, for B up to ``max_rows`` (and max_rows itself) and T in :attr:`TOKENS`, timed as the engine
        runs it (:meth:`~specdec_core.serving.cache.BatchLM.verify`, rows of :meth:`feeds`): one warm-up pass per
        shape, then ``repeats`` rounds over the T of each B. ``context``: the committed tokens a row attends, each
        drafted token's price rising with it (the requests' typical length is the one to give). ``timer``: what
        times each pass (default a :class:`~specdec_core.record.Timer` on the target's device)."""
        rows = sorted({b for b in cls.ROWS if b < max_rows} | {max_rows})
        lm = BatchLM(target, max(rows), context + cls.LONGEST_FEED)
        gen = torch.Generator().manual_seed(0)
        V = target.config.get_text_config().vocab_size
        lm.prefill(torch.randint(V, (max(rows), context), generator=gen).tolist())
        timer, out = timer or Timer(next(target.parameters()).device), {}
        for B in rows:
            lm.cache.live(B)
            feeds = {T: [torch.randint(V, (n,), generator=gen).tolist() for n in cls.feeds(B, T)] for T in cls.TOKENS}
            for ids in feeds.values():
                lm.verify(ids)
            times = {T: [] for T in cls.TOKENS}
            for _ in range(repeats):  # interleaved: a drift (the first passes after a prefill, say) hits every T
                for T, ids in feeds.items():
                    times[T].append(timer.time(lm.verify, ids)[1])
            out.update({(B, T): float(np.median(ts)) for T, ts in times.items()})
        return cls(out, objective=objective)

    @classmethod
    def typical_context(cls, target, requests: list[tuple[int, int]]) -> int:
        """The context to :meth:`measure` at for ``requests`` of (prompt tokens, max_new_tokens): the median of
        prompt + half the answer, within what ``target``'s positions leave beside the longest measured feed."""
        context = int(np.median([prompt + new // 2 for prompt, new in requests]))
        positions = getattr(target.config.get_text_config(), "max_position_embeddings", None) or math.inf
        return int(max(1, min(context, positions - cls.LONGEST_FEED)))

    @staticmethod
    def feeds(rows: int, tokens: int) -> list[int]:
        """The rows' feed lengths that :meth:`measure` times for ``rows`` rows of ``tokens`` tokens on average: as
        they are for one row or one token each; otherwise alternately 1 and 2T − 1 (the last row of an odd count
        what makes the mean T). A speculative step's rows feed different counts (a drafting row beside decoding
        ones, each its own K and fill), so its pass is packed, and a packed pass need not cost what a padded one of
        the same tokens does: torch's attention takes the longer rows one call each (on the book's CPU, 4 rows after
        200 tokens, 12 tokens cost 1.20 one-token passes packed and 1.12 padded, before the rows kernel took a
        packed pass in one call)."""
        if rows == 1 or tokens == 1:
            return [tokens] * rows
        ns = [1 if r % 2 == 0 else 2 * tokens - 1 for r in range(rows)]
        ns[-1] += rows * tokens - sum(ns)
        return ns

    def t(self, rows: int, tokens):
        """Seconds of a pass over ``rows`` rows of ``tokens`` tokens (one count or an array of them): bilinear
        between the measured ones, the nearest measured ones outside their range, and proportional to the rows
        beyond the largest."""
        scale = rows / self.rows[-1] if rows > self.rows[-1] else 1.0
        curve = self._curves.get(rows)
        if curve is None:
            curve = self._curves[rows] = np.array([np.interp(rows, self.rows, [self.verify[(b, t)] for b in self.rows])
                                                   for t in self.tokens])
        out = scale * np.interp(tokens, self.tokens, curve)
        return float(out) if np.ndim(out) == 0 else out

    def observe_draft(self, seconds: float, drafted: int) -> None:
        """Add one drafting step: ``seconds`` of drafting that proposed ``drafted`` tokens. Once ``SETTLED`` steps
        have been seen, a step counts at most ``OUTLIER`` times the median price per token of the last ``SETTLED``
        steps (for at least one token): a pause that lands in one step's drafting window (the OS, a garbage
        collection) would otherwise raise the price of every later token, and a price so high that no row drafts
        is never observed again. A drafter that is truly dearer takes over the median within ``SETTLED // 2 + 1``
        steps, and then its own time counts in full."""
        recent = self._recent
        if len(recent) == recent.maxlen:
            # statistics, not numpy: this runs once a step, on 16 floats
            seconds = min(seconds, self.OUTLIER * statistics.median(recent) * max(drafted, 1))
        recent.append(seconds / max(drafted, 1))
        self.draft_s += seconds
        self.drafted += drafted

    @classmethod
    def octave(cls, i: int) -> int:
        """Position i's pool: 0 for 1, 1 for 2, 2 for 3-4, 3 for 5-8, …"""
        return (i - 1).bit_length()

    def counts(self, stats: Stats, ks: list[int]) -> np.ndarray:
        """A row's tallies per octave, ``[allowed, proposed, tested, accepted]`` × octave, from its steps so far
        (kept between calls: a step is read once), each drafting step weighing :attr:`DECAY` times the next."""
        rec = self._tallies.get(id(stats))
        if rec is None or rec[0] is not stats:
            rec = self._tallies[id(stats)] = [stats, 0, np.zeros((4, self.octave(self.K_MAX) + 1))]
        _, seen, c = rec
        for k, d, a in zip(ks[seen:], stats.drafted[seen:], stats.accepted_lengths[seen:]):
            if k:  # a drafting step: what came before weighs DECAY as much (class docstring)
                c *= self.DECAY
            for i in range(1, min(k, self.K_MAX) + 1):
                o = self.octave(i)
                c[0, o] += 1
                c[1, o] += d >= i
                c[2, o] += d >= i and a >= i - 1
                c[3, o] += a >= i
        rec[1] = min(len(ks), len(stats.drafted))
        return c

    def acceptance(self, c: np.ndarray, pooled: np.ndarray) -> np.ndarray:
        """P_1 … P_K_MAX for a row with tallies ``c`` beside the live rows' ``pooled`` ones (class docstring)."""
        fill, accepted = self._rates(c, pooled)
        return fill * accepted

    def fill(self, c: np.ndarray, pooled: np.ndarray) -> np.ndarray:
        """F_1 … F_K_MAX: the chance that a row with tallies ``c`` (beside the live rows' ``pooled`` ones) proposes an
        i-th draft token when allowed one, so that it drafts ``F_1 + … + F_K`` tokens at K, on average."""
        return self._rates(c, pooled)[0]

    def _rates(self, c: np.ndarray, pooled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position: the fill, and the chance that every draft token up to it is accepted once tested (P_i is
        their product; :meth:`acceptance` and :meth:`fill` read them, the step's choice computes them once a row)."""
        n = self.PRIOR_TESTS
        (allowed, proposed, tested, accepted), pool = c.tolist(), pooled.tolist()  # Python floats: a step's hot loop
        fill, rate = [], []
        prior_fill, prior_rate = 1.0, 0.5
        for o in range(len(allowed)):
            prior_fill = (pool[1][o] + n * prior_fill) / (pool[0][o] + n)
            prior_rate = (pool[3][o] + n * prior_rate) / (pool[2][o] + n)
            fill.append((proposed[o] + n * prior_fill) / (allowed[o] + n))
            rate.append(min((accepted[o] + n * prior_rate) / (tested[o] + n), 0.999))
        at = self._octave_of  # an i-th proposal needs an (i-1)-th, an i-th acceptance too
        return np.minimum.accumulate(np.array(fill)[at]), np.cumprod(np.array(rate)[at])

    def gains(self, rows: list[tuple[Stats, list[int], int | None]], pools: list | None = None) -> np.ndarray:
        """``[rows, K_MAX + 1]``: the tokens each live row is expected to add at each K, ``1 + P_1 + … + P_K``.
        ``rows``: each live row's record, the K it was allowed at each step so far, and its own fixed K (0:
        autoregressive) or None for an adaptive row. ``pools``: each row's pool (any hashable; rows with equal ones
        share their prior, class docstring), or None for one pool of every row."""
        return self._expected(rows, pools)[0]

    def _expected(self, rows, pools=None, proposals=None) -> tuple[np.ndarray, np.ndarray]:
        """``[rows, K_MAX + 1]``: the tokens each row is expected to add at each K (:meth:`gains`); ``[rows,
        K_MAX]``: its fills F (:meth:`fill`, or 1 up to the length of a proposal it holds, :meth:`best_ks`), from
        which its expected feed follows (:meth:`_upto_k`)."""
        self._per_row(rows, pools, "pools", "one pool")
        pools = [0] * len(rows) if pools is None else pools
        tallies = [self.counts(s, ks) for s, ks, _ in rows]
        live = {id(s) for s, _, _ in rows}  # a finished row's tallies are not read again: keep the live rows' only
        self._tallies = {i: rec for i, rec in self._tallies.items() if i in live}
        pooled: dict = {}
        for pool, c in zip(pools, tallies):
            pooled[pool] = pooled.get(pool, 0) + c
        F, A = map(np.array, zip(*(self._rates(c, pooled[p]) for c, p in zip(tallies, pools))))  # [rows, K_MAX] each
        for r, d in enumerate(proposals or []):
            if d is not None:  # the row's feed is known: its proposal, as far as K allows
                F[r] = np.arange(1, self.K_MAX + 1) <= d
        return 1.0 + self._upto_k(F * A), F  # K = 0: one token

    @staticmethod
    def _per_row(rows, values, name: str, each: str) -> None:
        """Refuse ``values`` (``pools``, ``proposals``) that are not None and do not give ``each`` per row."""
        if values is not None and len(values) != len(rows):
            raise ValueError(f"{name} must give {each} per row ({len(rows)}), got {len(values)}")

    @staticmethod
    def _upto_k(x: np.ndarray) -> np.ndarray:
        """``[rows, K_MAX + 1]``: ``x_1 + … + x_K`` at each K (0 at K = 0) of per-position ``x`` (``[rows, K_MAX]``):
        of the fills F, the draft tokens a row is expected to feed; of F · A, the tokens it adds past one."""
        return np.hstack([np.zeros((len(x), 1)), np.cumsum(x, axis=1)])

    def best_ks(self, rows: list[tuple[Stats, list[int], int | None]], packed: bool = True,
                pools: list | None = None, proposals: list[int | None] | None = None) -> list[int]:
        """Each live row's K this step (``rows`` and ``pools`` as :meth:`gains`; fixed rows keep theirs): the choice
        that maximizes the :attr:`objective` (class docstring). ``packed``: the verify pass costs what its tokens
        cost (:meth:`~specdec_core.serving.cache.BatchLM.verify`, ``t(n, tokens / n)``); else every row pays the
        longest feed, ``t(n, max K + 1)``. The choices tried: one K for every adaptive row (0 to K_MAX), and for each
        price λ of a drafted token, each row's K maximizing its own ``gain(K) − λ K`` (the throughput objective's
        frontier) and ``log gain(K) − λ K`` (the latency one's), so a row whose draft is nearly sure drafts long
        while its neighbours, whose next token is a coin toss, draft little or nothing.

        ``proposals``: per row, the length of the draft it already holds (None: none asked). The engine asks a
        drafter without a model first (``Drafter.previews``), so such a row's feed is known, not a fill rate, and
        its drafting is already paid; and a row holding a proposal drafts at least :attr:`HELD_FLOOR` of it and at
        most all of it (its K counts what it verifies: past the proposal's length a K adds nothing, and costs
        nothing). Where that leaves no row a choice (each fixed, or holding an empty proposal or one of ``HELD_FLOOR``
        tokens, as on the steps where a lone chat request's prompt lookup finds no match), the answer is given without
        evaluating the model: such a step's K costs nothing to choose."""
        return self._best(rows, packed, per_row=True, pools=pools, proposals=proposals).tolist()

    def best_k(self, rows: list[tuple[Stats, list[int], int | None]], pools: list | None = None) -> int:
        """One K for every adaptive row (``rows`` and ``pools`` as :meth:`gains`), every row paying the longest feed:
        the rule of a padded pass, and of vLLM's one K per batch size (0 when no row is adaptive)."""
        ks = self._best(rows, packed=False, per_row=False, pools=pools)
        return next((int(k) for k, (_, _, fixed) in zip(ks, rows) if fixed is None), 0)

    def _best(self, rows, packed: bool, per_row: bool, pools=None, proposals=None) -> np.ndarray:
        """The K of every row (:meth:`best_ks`), among one K for all adaptive rows and, ``per_row``, the per-price
        choices."""
        self._per_row(rows, proposals, "proposals", "one length or None")
        self._per_row(rows, pools, "pools", "one pool")
        n = len(rows)
        fixed = np.array([k is not None for _, _, k in rows])
        proposals = proposals or [None] * n
        held = np.array([d is not None for d in proposals])
        floor = np.array([min(d or 0, self.HELD_FLOOR) for d in proposals])  # at least its first token
        cap = np.array([self.K_MAX if d is None else d for d in proposals])  # at most what it holds
        own = np.array([min(k, self.K_MAX) if k is not None else 0 for _, _, k in rows])
        if (fixed | (floor == cap)).all():  # no choice left (best_ks): the model is not needed
            return np.where(fixed, own, floor)
        G, F = self._expected(rows, pools, proposals)
        steps = np.arange(self.K_MAX + 1)
        choices = [steps[:, None].repeat(n, axis=1)]  # one K for every adaptive row
        if per_row and n > 1:  # each row's own K at each price λ of an allowed draft token (one row: K's above)
            lam = self.PRICES[:, None, None]
            each = [np.argmax(value - lam * steps, axis=2) for value in (G, np.log(G))]  # [prices, rows] twice
            choices.append(np.stack(each, axis=1).reshape(-1, n))  # at each price, gain's choice then log gain's
        ks = np.where(fixed, own, np.clip(np.concatenate(choices), floor, cap))  # [choices, rows]
        added = G[np.arange(n), ks]  # [choices, rows]: the tokens each row is expected to add
        drafted = (self._upto_k(F)[np.arange(n), ks] * ~held).sum(axis=1)  # [choices]: the draft tokens yet to draft
        seconds = self.verify_time(n, ks, F, packed) + self.draft_time() * drafted
        if self.objective == "throughput":
            score = added.sum(axis=1) / seconds
        else:  # the rows' geometric-mean time per token, lowest first: Σ log(added) − n log(seconds)
            score = np.log(added).sum(axis=1) - n * np.log(seconds)
        return ks[int(np.argmax(score))]

    # nodes and weights of a standard normal (Gauss-Hermite, probabilists'): a packed step's expected time
    _Z, _W = np.polynomial.hermite_e.hermegauss(7)
    _W = _W / _W.sum()

    def verify_time(self, n: int, ks: np.ndarray, F: np.ndarray, packed: bool = True) -> np.ndarray:
        """The expected seconds of the verify pass of each choice (``ks``: ``[choices, n]``, each row's K) of n rows
        with fills ``F`` (``[n, K_MAX]``: P(a row proposes an i-th token)). A row at K feeds d = min(K, proposal)
        tokens: P(d ≥ i) = F_i for i ≤ K. A drafter without a model feeds all or nothing (a lookup that matches
        proposes the whole K), so where the pass time is convex in its tokens (each added token dearer than the
        last, as on a CPU past its knee) the time of the mean feed prices a long K below what it costs on average.
        Packed, one or two rows: the exact expectation over the rows' feeds; more rows: the summed feed
        taken as normal (the rows' means and variances added), t(n, (n + S) / n) averaged at 7 Gauss-Hermite
        nodes. Padded: t(n, the largest expected feed + 1)."""
        rows, J = np.arange(n), np.arange(self.K_MAX + 1)
        D = self._upto_k(F)  # E[d] at each K
        if not packed:
            return self.t(n, D[rows, ks].max(axis=1) + 1)
        if n <= 2:  # P(d = j) at each row's K: F_j − F_{j+1} below K, F_K at K
            Fx = np.hstack([np.ones((n, 1)), F])  # P(d ≥ j), j = 0..K_MAX
            drop = Fx - np.hstack([Fx[:, 1:], np.zeros((n, 1))])
            K = ks[:, :, None]
            P = np.where(J < K, drop, np.where(J == K, Fx, 0.0))  # [choices, n, J]
            if n == 1:
                return P[:, 0] @ self.t(1, 1 + J)
            return np.einsum("cj,ck,jk->c", P[:, 0], P[:, 1], self.t(2, (2 + J[:, None] + J[None, :]) / 2))
        M2 = self._upto_k((2 * J[1:] - 1) * F)  # E[d²] at each K: Σ_{i ≤ K} (2i − 1) F_i
        mean = D[rows, ks].sum(axis=1)
        var = np.maximum(M2[rows, ks] - D[rows, ks] ** 2, 0.0).sum(axis=1)
        S = np.maximum(mean[:, None] + np.sqrt(var)[:, None] * self._Z, 0.0)  # [choices, nodes]
        return (self.t(n, (n + S) / n) * self._W).sum(axis=1)

    def draft_time(self) -> float:
        """Seconds per drafted token: ``draft_cost``, or the engine's running figure (0 before any draft)."""
        return self.draft_cost if self.draft_cost is not None else self.draft_s / self.drafted if self.drafted else 0.0
