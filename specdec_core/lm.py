"""``CachedLM``: a transformers causal LM bound to its preallocated :class:`~specdec_core.kvcache.KVCache`.

Only the model's public forward is used: ``input_ids``, ``position_ids``, ``cache_position``,
``past_key_values`` and, for trees, a 4D additive ``attention_mask``.

Steps (:mod:`specdec_core.graphs`): in mode ``"static"`` or ``"graph"``, a pass after the first (the prefill) over
at most ``max_step`` tokens has static shapes. Its ids, position ids, slots and mask ``[1, 1, T, capacity]`` are
input buffers, one set per step shape; the cache writes the T entries at the slots and attention reads the whole
slab, the mask blocking every slot the eager pass would not read (the causal mask from the slots, or the caller's
tree mask with every later slot blocked). Mode ``"graph"`` replays each shape from its CUDA graph.
:func:`borrowed` lends a decode a ``CachedLM`` whose captured steps outlive the call.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .graphs import StepGraphs
from .kvcache import KVCache

MAX_STEP = 64  # longer passes run eager, as the prefill does (a long catch-up: a shape seldom seen twice)
CAPACITY_STEP = 256  # borrowed static caches come in multiples of this: decodes of nearby lengths share one
IDLE_MAX = 4  # static CachedLMs kept per model between decodes (the most recently used)


@dataclass
class StepInputs:
    """One step shape's input buffers: fixed addresses, refilled before each pass (a graph reads them at replay)."""

    ids: torch.Tensor  # [1, T] token ids ([B, T] for a batch, serving.cache.BatchLM)
    positions: torch.Tensor  # [1, T] rotary positions ([B, T])
    slots: torch.Tensor  # [T] the cache slots written, also the pass's cache_position ([B, T])
    mask: torch.Tensor  # [1, 1, T, capacity] additive: 0 = attend, dtype-min = blocked ([B, 1, T, capacity])


def sized(capacity: int, step_mode: str) -> int:
    """A cache's capacity in ``step_mode``: as asked when eager, else rounded up to :data:`CAPACITY_STEP` (a
    static cache is kept and reused by decodes of nearby lengths, with the steps it captured)."""
    return capacity if step_mode == "eager" else -(-capacity // CAPACITY_STEP) * CAPACITY_STEP


def weights_at(model) -> int:
    """Where the model's first weight lives: a captured step reads the weights there (``.to()`` moves them)."""
    return next(model.parameters()).data_ptr()


class CachedLM:
    """One sequence decoded by ``model``; a pass appends to :attr:`cache` and, by default, commits.

    Attributes: ``model``, ``cache`` (:class:`KVCache`), ``device``, ``dtype``; ``step_mode``, how the passes after
    the prefill run (``"eager"``, ``"static"`` or ``"graph"``, :mod:`specdec_core.graphs`), and ``step_graphs``, its
    :class:`~specdec_core.graphs.StepGraphs`.
    """

    def __init__(self, model, capacity: int, step_mode: str = "eager", max_step: int = MAX_STEP):
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.step_graphs = StepGraphs(step_mode, self.device)
        self.step_mode = step_mode
        self.max_step = max_step
        self.cache = KVCache(model.config, capacity, p.dtype, p.device)
        self.weights = weights_at(model)
        self._inputs: dict[tuple, StepInputs] = {}
        self._slot_ids = None if step_mode == "eager" else torch.arange(self.cache.capacity, device=self.device)

    @property
    def length(self) -> int:
        return self.cache.length

    def serves(self, model, capacity: int, step_mode: str) -> bool:
        """Whether this lm can decode with ``model`` a sequence of ``capacity`` positions in ``step_mode``."""
        return (self.model is model and self.cache.capacity >= capacity and self.step_mode == step_mode
                and self.weights == weights_at(model))

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                logits_to_keep: int = 0, commit: int | None = None, **model_kwargs) -> torch.Tensor:
        """Run ``tokens [T]`` at cache slots ``[length, length + T)``.

        positions: ``[T]`` rotary positions (default: the slots themselves; trees pass depths).
        mask: optional 4D additive mask ``[1, 1, T, length + T]`` (0 = attend, dtype-min = blocked).
        logits_to_keep: logits of the last n rows only (0: every row; transformers' argument of that name).
        commit: how many of the T entries the cache commits (default all; 0 leaves the cache as it was: the
        entries lie past ``length``, never read, overwritten next time). ``model_kwargs`` go to the model's
        forward (the block draft's ``full_vocab``). Returns logits ``[T, V]`` (or the last ``logits_to_keep`` rows).
        """
        T = tokens.numel()
        start = self.cache.length
        if start + T > self.cache.capacity:
            raise ValueError(f"sequence of {start + T} tokens does not fit the KV cache of {self.cache.capacity} "
                             "positions")
        if commit is not None and not 0 <= commit <= T:
            raise ValueError(f"commit must count entries of the pass, in [0, {T}], got {commit!r}")
        if self.step_mode != "eager" and start > 0 and T <= self.max_step:
            logits = self._step(tokens, positions, mask, logits_to_keep, model_kwargs)
        else:
            ids = tokens.to(self.device).view(1, T)
            cache_position = torch.arange(start, start + T, device=self.device)  # the slots the pass writes
            pos = cache_position if positions is None else positions.to(self.device)
            logits = self.model(input_ids=ids, position_ids=pos.view(1, T), cache_position=cache_position,
                                attention_mask=mask, past_key_values=self.cache, use_cache=True,
                                logits_to_keep=logits_to_keep, **model_kwargs).logits[0]
        self.cache.advance(T if commit is None else commit)
        return logits

    def step_inputs(self, T: int, key) -> StepInputs:
        """The input buffers of the step shape ``key`` (T tokens), made at its first use."""
        if key not in self._inputs:
            zeros = lambda *shape, dtype=torch.long: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
            self._inputs[key] = StepInputs(zeros(1, T), zeros(1, T), zeros(T),
                                           zeros(1, 1, T, self.cache.capacity, dtype=self.dtype))
        return self._inputs[key]

    def _step(self, tokens, positions, mask, logits_to_keep: int, model_kwargs: dict) -> torch.Tensor:
        """The static-shape pass over ``tokens [T]`` at slots ``[length, length + T)`` (the module docstring)."""
        if self.step_mode == "graph" and self.weights != weights_at(self.model):
            self.step_graphs.clear()  # the model moved since its steps were captured
            self.weights = weights_at(self.model)
        T = tokens.numel()
        L = self.cache.length
        key = (T, logits_to_keep, *sorted(model_kwargs.items()))
        x = self.step_inputs(T, key)
        x.ids.copy_(tokens.view(1, T))
        torch.arange(L, L + T, out=x.slots)
        x.positions.copy_(x.slots.view(1, T) if positions is None else positions.view(1, T))
        self.fill_mask(x, mask)
        self.cache.slots = x.slots
        try:
            return self.step_graphs.run(key, lambda: self.static_pass(x, logits_to_keep, **model_kwargs))
        finally:
            self.cache.slots = None

    def fill_mask(self, x: StepInputs, mask: torch.Tensor | None) -> None:
        """``x.mask`` for the pass at slots ``x.slots``: without ``mask``, causal (query t sees the slots up to its
        own); else the caller's ``[1, 1, T, L + T]`` (a tree's) over the first slots, every later slot blocked."""
        blocked = torch.finfo(self.dtype).min
        if mask is None:
            x.mask[0, 0].zero_().masked_fill_(self._slot_ids > x.slots[:, None], blocked)
        else:
            x.mask[..., : mask.shape[-1]].copy_(mask)
            x.mask[..., mask.shape[-1]:].fill_(blocked)

    def static_pass(self, x: StepInputs, logits_to_keep: int = 0, **model_kwargs) -> torch.Tensor:
        """What a capture records: the model's forward over the buffers ``x`` (the cache's ``slots`` set to
        ``x.slots``). Returns logits ``[T, V]``, or the last ``logits_to_keep`` rows."""
        out = self.model(input_ids=x.ids, position_ids=x.positions, cache_position=x.slots, attention_mask=x.mask,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=logits_to_keep, **model_kwargs)
        return out.logits[0]


_IDLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → its idle static CachedLMs


@contextmanager
def borrowed(model, capacity: int, step_mode: str = "eager"):
    """A :class:`CachedLM` of at least ``capacity`` positions for one decode, its cache empty. Eager: a new one.
    Static or graph: one kept per model and capacity (rounded up to :data:`CAPACITY_STEP`) from an earlier decode
    when there is one, so its captured steps are replayed, not captured again; it goes back on exit, and no two
    decodes hold it at once. The idle ones let go of the model (it may be freed; they go with it)."""
    if step_mode == "eager":
        yield CachedLM(model, capacity)
        return
    capacity = sized(capacity, step_mode)
    idle = [lm for lm in _IDLE.get(model, []) if lm.weights == weights_at(model)]
    lm = next((lm for lm in idle if lm.cache.capacity == capacity and lm.step_mode == step_mode), None)
    if lm is None:
        lm = CachedLM(model, capacity, step_mode)
    else:
        idle.remove(lm)
        lm.model = model
    _IDLE[model] = idle
    lm.cache.reset()
    try:
        yield lm
    finally:
        lm.model = None  # the pool must not keep the model alive
        _IDLE[model] = (_IDLE.get(model, []) + [lm])[-IDLE_MAX:]
