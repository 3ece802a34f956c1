"""A static-shape decode step: preallocated cache, fixed token count, ready for ``torch.compile`` and CUDA graphs.

gpt-fast's lesson (Llama-7B on an A100: 25.5 → 107 tokens/s): a small model's decode step is bound by kernel
launches and Python, not by memory, until the step is captured whole. Capture needs every shape fixed:

- :class:`StaticKV` is the core's :class:`~specdec_core.kvcache.KVCache` (same buffers, same ``advance`` /
  ``rollback`` / ``keep`` contract, one owner of the length) whose layers write the T new entries at the slots
  held in the device tensor ``pos`` (``index_copy_``) and hand attention the *whole* slab ``[0, capacity)``;
- the pass builds its own additive mask ``[1, 1, T, capacity]`` from ``pos`` (slot j is seen by query t iff
  ``j <= pos[t]``): committed entries and the pass's own causal prefix are seen, everything past is blocked,
  so stale entries of rejected drafts are never read (and are overwritten by the next write);
- :class:`StaticLM` runs a pass over ``T`` tokens from fixed buffers (``ids [1, T]``, ``pos [T]``), one per
  T: ``T = 1`` for a decode step, ``T = K + 1`` for a verification.

Modes (:data:`MODES`): ``eager`` (the same function, not compiled), ``compile`` (``torch.compile``, Inductor:
fused kernels, on CPU a C++ kernel per fused group), ``reduce-overhead`` (``torch.compile(mode="reduce-overhead")``:
Inductor plus CUDA graphs; on CPU the same as ``compile``), ``graph`` (``torch.cuda.CUDAGraph`` capturing the
eager step: every launch replayed by one call, CUDA only). Prefill (a prompt of any length) always runs eager.

Everything here goes through the model's public forward only (``input_ids``, ``position_ids``,
``cache_position``, a 4D ``attention_mask``, ``past_key_values``), under transformers 4.57 and 5.x alike.
"""
from __future__ import annotations

import torch

from ..decode import eos_ids
from ..kvcache import KVCache, _SlabLayer

MODES = ("eager", "compile", "reduce-overhead", "graph")


class _StaticSlab(_SlabLayer):
    """One layer of a :class:`StaticKV`: writes at the owner's ``pos`` and returns the whole slab."""

    is_compileable = True

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys.index_copy_(2, self.owner.pos, key_states)
        self.values.index_copy_(2, self.owner.pos, value_states)
        return self.keys, self.values


class StaticKV(KVCache):
    """A :class:`KVCache` whose passes have static shapes: writes at ``pos``, reads ``[0, capacity)`` (masked)."""

    def __init__(self, config, capacity: int, dtype: torch.dtype, device):
        super().__init__(config, capacity, dtype, device)
        self.layers = [_StaticSlab(self, l.keys, l.values) for l in self.layers]
        self.pos = torch.zeros(1, dtype=torch.long, device=device)

    @property
    def is_compileable(self) -> bool:
        return True


class StaticLM:
    """``model`` bound to a :class:`StaticKV`; :meth:`step` runs ``T`` tokens at slots ``[length, length + T)``
    and commits them (roll back with ``lm.cache.rollback``), through fixed buffers in ``mode``.

    ``lm.step(tokens)`` returns logits ``[T, V]``: a view of a static output in the graph modes, valid until
    the next step (take what you need, e.g. ``argmax``, before stepping again). ``backend``: ``torch.compile``'s
    (``"inductor"``; the smoke run traces with ``"aot_eager"``, which skips code generation)."""

    def __init__(self, model, capacity: int, mode: str = "eager", backend: str = "inductor"):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: use one of {MODES}")
        p = next(model.parameters())
        self.model, self.device, self.dtype, self.mode = model, p.device, p.dtype, mode
        if mode == "graph" and self.device.type != "cuda":
            raise ValueError("mode 'graph' captures a CUDA graph: it needs a CUDA model")
        self.cache = StaticKV(model.config, capacity, p.dtype, p.device)
        self.slots = torch.arange(self.cache.capacity, device=self.device)
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.compiled = None
        if mode in ("compile", "reduce-overhead"):
            if self.device.type == "cuda":
                for layer in self.cache.layers:  # mutated in place every step: fixed addresses for CUDA graphs
                    torch._dynamo.mark_static_address(layer.keys)
                    torch._dynamo.mark_static_address(layer.values)
            self.compiled = torch.compile(self._pass, mode=None if mode == "compile" else mode, dynamic=False,
                                          backend=backend)

    @property
    def length(self) -> int:
        return self.cache.length

    def _pass(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The static-shape pass: ``ids [1, T]`` at slots ``pos [T]`` → logits ``[T, V]``."""
        self.cache.pos = pos
        blocked = self.slots[None, :] > pos[:, None]  # [T, capacity]
        mask = torch.zeros(blocked.shape, dtype=self.dtype, device=self.device)
        mask = mask.masked_fill(blocked, torch.finfo(self.dtype).min)[None, None]
        out = self.model(input_ids=ids, position_ids=pos[None], cache_position=pos, attention_mask=mask,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[0]

    def _check(self, T: int) -> None:
        if self.cache.length + T > self.cache.capacity:
            raise ValueError(f"sequence of {self.cache.length + T} tokens does not fit the static cache of "
                             f"{self.cache.capacity} positions")

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """An eager pass over ``tokens [S]`` (any S), committed; returns logits ``[S, V]``."""
        S = tokens.numel()
        self._check(S)
        pos = torch.arange(self.cache.length, self.cache.length + S, device=self.device)
        logits = self._pass(tokens.to(self.device).view(1, S), pos)
        self.cache.advance(S)
        return logits

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """A fixed-shape pass over ``tokens [T]`` (a device tensor keeps the step free of host syncs), committed."""
        T = tokens.numel()
        self._check(T)
        if T not in self.buffers:
            self.buffers[T] = (torch.zeros(1, T, dtype=torch.long, device=self.device),
                               torch.zeros(T, dtype=torch.long, device=self.device))
        ids, pos = self.buffers[T]
        ids.copy_(tokens.view(1, T))
        torch.arange(self.cache.length, self.cache.length + T, out=pos)
        if self.mode == "graph":
            logits = self._replay(T, ids, pos)
        elif self.compiled is not None:
            if self.mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            logits = self.compiled(ids, pos)
        else:
            logits = self._pass(ids, pos)
        self.cache.advance(T)
        return logits

    def _replay(self, T: int, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Capture the eager pass over the buffers of T at its first use (warm-up on a side stream, as
        PyTorch's CUDA-graph recipe does; the warm-ups compute this very step), then replay it."""
        if T not in self.graphs:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(3):
                    self._pass(ids, pos)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._pass(ids, pos)
            self.graphs[T] = (graph, out)
        graph, out = self.graphs[T]
        graph.replay()
        return out


@torch.inference_mode()
def greedy_decode(lm: StaticLM, prompt, max_new_tokens: int, eos: set[int] = frozenset()) -> list[int]:
    """Greedy autoregressive decoding with ``lm``'s static steps: an eager prefill, then one ``T = 1`` step per
    token, cut at the first EOS and at ``max_new_tokens`` (``sd.generate(method="autoregressive")``'s output)."""
    lm.cache.reset()
    prompt = torch.as_tensor(prompt, dtype=torch.long).view(-1)
    tok = int(lm.prefill(prompt)[-1].argmax())
    out = [tok]
    while len(out) < max_new_tokens and tok not in eos:
        tok = int(lm.step(torch.tensor([tok])).argmax(-1)[-1])
        out.append(tok)
    return out


@torch.inference_mode()
def chained_steps(lm: StaticLM, n: int, T: int = 1) -> torch.Tensor:
    """``n`` steps of ``T`` tokens, each fed the previous step's greedy tokens on the device (no host sync
    between steps), then rolled back: the cache is as before. What a decode step costs, launches included."""
    tok = torch.zeros(T, dtype=torch.long, device=lm.device)
    for _ in range(n):
        tok = lm.step(tok).argmax(-1)
    lm.cache.rollback(n * T)
    return tok


def static_runner(target, max_new_tokens: int, capacity: int, mode: str = "compile", backend: str = "inductor"):
    """A runner for :func:`~specdec_core.study.bench.run_interleaved`: :func:`greedy_decode` over one
    :class:`StaticLM` built once (compiled at its first call) and reset per prompt."""

    lm, eos = StaticLM(target, capacity, mode, backend), eos_ids(target)

    def run(ids):
        return {"tokens": greedy_decode(lm, ids, max_new_tokens, eos)}

    run.lm = lm
    return run
