"""A batch of sequences in one preallocated KV cache: one length per row, O(1) per-row rollback.

    keys[l], values[l] : [B, n_kv_heads, capacity, head_dim]      (allocated once)

Row r's committed entries are the slots ``[starts[r], lengths[r])``. A pass over T tokens per row writes row
r's tokens at ``[lengths[r], lengths[r] + T)`` (one scatter per layer) and attends through a 4D mask in
which row r's query t sees its own committed slots and its own new tokens up to t; everything else in the
``[0, max(lengths) + T)`` window (other rows' longer tails, stale entries past a row's length, the prompt's
left padding) is masked. Rows therefore never need re-padding when they accept different numbers of
tokens: committing n tokens is ``lengths[r] += n`` and rolling back is ``lengths[r] -= n``, pointer moves.

The first pass (:meth:`BatchLM.prefill`) left-pads the rows so their last tokens align (or, when that would
be mostly padding, prefills each row alone into its slots); ``starts[r]`` is row r's padding, and rotary positions are ``slot - starts[r]``, so each row sees exactly the positions it
would see alone. The cost of this layout: a pass attends over the longest row's window (masked slots are
computed and discarded). Rows that come and go (:class:`~specdec_core.serving.engine.Engine`) are placed, moved and
narrowed to the live ones (:meth:`BatchKVCache.live`, :meth:`~BatchKVCache.place`, :meth:`~BatchKVCache.move`).

Verify passes over rows of different lengths are *packed* (:meth:`BatchLM.verify`): the rows' tokens run back to
back as one sequence ``[1, N]``, each written at its own row and slot, and each query attends its own row's keys
(:class:`_Packing`: the rows kernel in one call, torch's attention a call per longer row), so the linear layers
and the LM head see no padding (vLLM's flattened batch). The cache layout is the same.

Static steps (:mod:`specdec_core.graphs`): a :class:`BatchLM` in mode ``"static"`` or ``"graph"`` runs its passes
after the prefill with static shapes: the ids, positions, slots ``[B, T]`` and mask ``[B, 1, T, capacity]`` are
input buffers filled from the lengths before the pass, the cache scatters at the slots, and attention reads the
whole slab under the same mask as the eager window's (every slot past it blocked); ``"graph"`` replays each
``(B, T)`` shape from its CUDA graph.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import torch
from transformers.cache_utils import Cache

from ..graphs import StepGraphs
from ..kernels import GQA_SDPA, PACKED_ATTENTION, ROWS_ATTENTION, _configs, takes_packed, use_gqa_sdpa
from ..kvcache import _SlabLayer
from ..lm import MAX_STEP, CachedLM, StepInputs



class _BatchSlab(_SlabLayer):
    """One layer's ``[B, H, capacity, D]`` slab; writes each row at its own length (one scatter)."""

    def update(self, key_states, value_states, cache_kwargs: Optional[dict[str, Any]] = None):
        if self.owner.packed_pass is not None:  # a packed pass: token n of [1, H, N, D] to row rows[n], slot slots[n]
            rows, slots, end = self.owner.packed_pass
            self.keys[rows, :, slots] = key_states[0].transpose(0, 1)
            self.values[rows, :, slots] = value_states[0].transpose(0, 1)
            return self.keys[:, :, :end], self.values[:, :, :end]
        if self.owner.slots is not None:  # a static-shape pass: its slots, the whole slab attended (masked)
            idx, end = self.owner.slots, self.owner.capacity
        elif self.owner.eager_pass is not None:  # an eager pass: where it writes, computed once for every layer
            idx, end, start = self.owner.eager_pass
            if start is not None:  # every row writes at the same slots: one slice, no scatter
                T = key_states.shape[-2]
                self.keys[:, :, start:start + T] = key_states
                self.values[:, :, start:start + T] = value_states
                return self.keys[:, :, :end], self.values[:, :, :end]
        else:
            idx, end = self.owner.write_index(key_states.shape[-2])
        idx = idx[:, None, :, None].expand_as(key_states)
        self.keys.scatter_(2, idx, key_states)
        self.values.scatter_(2, idx, value_states)
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query) -> tuple[int, int]:  # transformers 4.x: cache_position ([B, T] here); 5.x: T
        return int(self.owner.lengths.max()) + (query if isinstance(query, int) else query.shape[-1]), 0

    def get_seq_length(self) -> int:
        return int(self.owner.lengths.max())


class BatchKVCache(Cache):
    """Preallocated cache for ``batch`` rows; ``lengths`` and ``starts`` are LongTensors ``[B]``."""

    def __init__(self, config, batch: int, capacity: int, dtype: torch.dtype, device):
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        n_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.batch = int(batch)
        self.capacity = int(capacity)
        self.lengths = torch.zeros(self.batch, dtype=torch.long, device=device)
        self.starts = torch.zeros(self.batch, dtype=torch.long, device=device)
        self.slots: torch.Tensor | None = None  # [B, T], set by a static-shape pass while it runs
        self.eager_pass: tuple | None = None  # (slots, end, the rows' common length or None), set by an eager pass
        self.packed_pass: tuple | None = None  # (row, slot of each token [N], end), set by a packed pass
        shape = (self.batch, n_kv, self.capacity, head_dim)
        layers = [_BatchSlab(self, torch.zeros(shape, dtype=dtype, device=device),
                             torch.zeros(shape, dtype=dtype, device=device)) for _ in range(config.num_hidden_layers)]
        super().__init__(layers=layers)

    def write_index(self, T: int) -> tuple[torch.Tensor, int]:
        """Slots ``[B, T]`` a pass over T tokens per row writes, and the end of the attended window."""
        end = int(self.lengths.max()) + T
        if end > self.capacity:
            raise ValueError(f"batch KV cache full: a pass of {T} tokens needs {end} slots of {self.capacity}")
        return self.lengths[:, None] + torch.arange(T, device=self.lengths.device), end

    def mask(self, T: int, dtype: torch.dtype, end: int | None = None) -> torch.Tensor:
        """Additive 4D mask ``[B, 1, T, end]`` for the next pass (0 = attend, dtype-min = blocked); ``end``: the
        window, ``max(lengths) + T`` by default (a static pass's: the capacity)."""
        end = int(self.lengths.max()) + T if end is None else end
        j = torch.arange(end, device=self.lengths.device)[None, None, :]  # [1, 1, end]
        t = torch.arange(T, device=self.lengths.device)[None, :, None]  # [1, T, 1]
        L, S = self.lengths[:, None, None], self.starts[:, None, None]
        allowed = (j >= S) & (j <= L + t)  # committed [S, L) and the pass's own tokens up to t
        out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return out.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]

    def advance(self, n: torch.Tensor) -> None:
        """Commit ``n[r]`` positions of row r (just written by a pass)."""
        n = torch.as_tensor(n, dtype=torch.long, device=self.lengths.device)
        if bool((n < 0).any()) or bool((self.lengths + n > self.capacity).any()):
            raise ValueError(f"cannot advance rows by {n.tolist()} (lengths {self.lengths.tolist()}, "
                             f"capacity {self.capacity})")
        self.lengths += n

    def rollback(self, n: torch.Tensor) -> None:
        """Forget the last ``n[r]`` committed positions of row r: O(1), a pointer move per row."""
        n = torch.as_tensor(n, dtype=torch.long, device=self.lengths.device)
        if bool((n < 0).any()) or bool((self.lengths - n < self.starts).any()):
            raise ValueError(f"cannot roll back rows by {n.tolist()} (lengths {self.lengths.tolist()})")
        self.lengths -= n

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (cache row indices, in the order given): one gather per layer, a copy of what they
        hold. Later passes take ``len(rows)`` rows; row i of the new cache is row ``rows[i]`` of the old."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.lengths.device)
        if rows.ndim != 1 or rows.numel() == 0 or bool((rows < 0).any() | (rows >= self.batch).any()):
            raise ValueError(f"select_rows takes a non-empty list of row indices in [0, {self.batch}), got {rows.tolist()}")
        for layer in self.layers:
            layer.keys, layer.values = layer.keys[rows], layer.values[rows]
        self.lengths = self.lengths[rows]
        self.starts = self.starts[rows]
        self.batch = rows.numel()

    # -- rows that come and go (the serving engine): live rows first, views of the slabs, no copy ---------------
    def live(self, n: int) -> None:
        """Let the first ``n`` rows of the allocated ones take part in the next passes (views of the slabs and of
        the lengths: no copy). The engine keeps its live rows first, as vLLM's persistent batch condenses its own."""
        slabs, lengths, starts = self._allocated()
        if not 1 <= n <= lengths.numel():
            raise ValueError(f"live rows must be between 1 and the {lengths.numel()} allocated, got {n}")
        if n == self.batch and self.lengths.data_ptr() == lengths.data_ptr():
            return  # the views already in place (a static step's buffers stay those it was built for)
        for layer, (k, v) in zip(self.layers, slabs):
            layer.keys, layer.values = k[:n], v[:n]
        self.lengths, self.starts, self.batch = lengths[:n], starts[:n], n

    def _allocated(self):
        """Every allocated row: the full slabs per layer, lengths and starts (kept at the first call, before any
        :meth:`live` narrows the views)."""
        if not hasattr(self, "_full"):
            self._full = ([(l.keys, l.values) for l in self.layers], self.lengths, self.starts)
        return self._full

    def place(self, row: int, single, n: int) -> None:
        """Row ``row`` of the allocated rows holds exactly the first ``n`` entries of ``single``, a single sequence's
        cache (a request's prefill): they fill its slots ``[0, n)``, its length is n, and nothing of the row's
        earlier occupant is read (n = 0: the row is empty)."""
        slabs, lengths, starts = self._allocated()
        if n > self.capacity:
            raise ValueError(f"a row of {n} entries does not fit the cache's {self.capacity} positions")
        for (k, v), layer in zip(slabs, single.layers if n else []):
            k[row, :, :n] = layer.keys[0, :, :n]
            v[row, :, :n] = layer.values[0, :, :n]
        lengths[row], starts[row] = n, 0

    def rollback_row(self, row: int, n: int) -> None:
        """Forget the last ``n`` committed positions of row ``row`` alone (:meth:`rollback` for one row)."""
        if n:
            by = torch.zeros(self.batch, dtype=torch.long, device=self.lengths.device)
            by[row] = n
            self.rollback(by)

    def move(self, src: int, dst: int) -> None:
        """Row ``dst`` takes row ``src``'s entries and length (a copy of its committed slots per layer)."""
        slabs, lengths, starts = self._allocated()
        n = int(lengths[src])
        for k, v in slabs:
            k[dst, :, :n] = k[src, :, :n]
            v[dst, :, :n] = v[src, :, :n]
        lengths[dst], starts[dst] = lengths[src], starts[src]

    def reset(self, starts: torch.Tensor | None = None) -> None:
        """Empty every live row; ``starts[r]``: the slots of row r that the next (first) pass fills with padding.
        In place: the lengths stay views of the allocated ones, so a later :meth:`live` sees this reset (a new
        tensor here would leave ``live`` restoring the lengths from before it)."""
        starts = (torch.zeros_like(self.lengths) if starts is None
                  else torch.as_tensor(starts, dtype=torch.long, device=self.lengths.device))
        if starts.shape != self.lengths.shape:
            raise ValueError(f"reset takes one start per live row ({self.batch}), got {tuple(starts.shape)}")
        self.lengths.zero_()
        self.starts.copy_(starts)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.lengths.max())


class _Packing:
    """Where a packed pass's tokens sit: row r's ``ns[r]`` tokens back to back from ``offsets[r]``, after its
    ``lengths[r]`` committed ones. :meth:`attend` is what the attention functions hand a packed call to
    (:data:`~specdec_core.kernels.PACKED_ATTENTION`). Where the attention is the rows kernel's
    (:func:`~specdec_core.kernels.takes_packed`), every row's queries attend in one call, packed as they are, each over
    its own row's keys; otherwise the first ``min(ns)`` queries of every row attend in one batched call, as a padded
    pass of that length would, and each longer row's other queries attend its own keys alone. Either way no query is
    padding, and each row's window ends at its own last token. On the book's CPU the one call took a packed pass after
    about 200 tokens over 8 rows of 1 to 5 tokens (24 in all) from 35.7 to 32.6 ms, over rows of 1 and 5 in turn from
    34.2 to 31.7 (8 rows of 3, padded: 31.6)."""

    def __init__(self, ns: list[int], lengths: list[int], device):
        self.ns, self.lengths, self.device = ns, lengths, device
        self.offsets = [sum(ns[:r]) for r in range(len(ns))]

    def attend(self, attend, module, query, key, value, mask, **kwargs):
        token = PACKED_ATTENTION.set(None)  # the calls below are unpacked
        try:
            if takes_packed(attend, query, mask, kwargs.get("dropout", 0.0)):
                T, end = max(self.ns), max(self.lengths) + max(self.ns)
                return attend(module, query, key[:, :, :end], value[:, :, :end], mask[:, :, :T, :end],
                              queries=self.counts, **kwargs)
            return self._attend_by_rows(attend, module, query, key, value, mask, **kwargs)
        finally:
            PACKED_ATTENTION.reset(token)

    @functools.cached_property
    def counts(self) -> torch.Tensor:
        """The rows' query counts, once a pass for every layer (the kernel's packed call)."""
        return torch.tensor(self.ns, device=self.device)

    @functools.cached_property
    def head(self) -> torch.Tensor:
        """Where every row's first ``min(ns)`` queries sit, once a pass for every layer (the unpacked calls)."""
        return torch.tensor([o + t for o in self.offsets for t in range(min(self.ns))], device=self.device)

    def _attend_by_rows(self, attend, module, query, key, value, mask, **kwargs):
        """Every row's first ``min(ns)`` queries in one batched call, then each longer row's others alone."""
        B, T0 = len(self.ns), min(self.ns)
        out = query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])  # [1, N, heads, head_dim]
        end = max(self.lengths) + T0
        q = query[0][:, self.head].unflatten(1, (B, T0)).transpose(0, 1)  # [B, heads, T0, head_dim]
        o, _ = attend(module, q, key[:, :, :end], value[:, :, :end], mask[:, :, :T0, :end], **kwargs)
        out[0, self.head] = o.flatten(0, 1)
        for r in [r for r, n in enumerate(self.ns) if n > T0]:
            a, n, end = self.offsets[r], self.ns[r], self.lengths[r] + self.ns[r]
            o, _ = attend(module, query[:, :, a + T0:a + n], key[r:r + 1, :, :end], value[r:r + 1, :, :end],
                          mask[r:r + 1, :, T0:n, :end], **kwargs)
            out[0, a + T0:a + n] = o[0]
        return out, None


class BatchLM:
    """A model bound to a :class:`BatchKVCache`; rows hold token lists of different lengths."""

    MAX_PADDING = 0.25  # the share of padding above which :meth:`prefill` prefills row by row

    def __init__(self, model, batch: int, capacity: int, step_mode: str = "eager"):
        use_gqa_sdpa(model)  # once, for every pass of every path (kernels.use_gqa_sdpa): no per-pass switch
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.step_graphs = StepGraphs(step_mode, self.device)
        self.step_mode = step_mode  # how the passes after the prefill run (specdec_core.graphs)
        self.cache = BatchKVCache(model.config, batch, capacity, p.dtype, p.device)
        self._inputs: dict[tuple, StepInputs] = {}
        self._slab = self.cache.layers[0].keys  # the slab captured steps write (select_rows gathers new ones)
        self._configs = _configs(model)
        self.pack = step_mode == "eager"  # whether verify packs ragged rows, where the attention can (:attr:`packs`)

    @property
    def packs(self) -> bool:
        """Whether :meth:`verify` packs ragged rows: eager passes (:attr:`pack`) through one of the library's
        attention functions, which can take a packed call (:func:`~specdec_core.kernels.gqa_sdpa`, which binding
        sets for ``sdpa``, or the rows kernel's; read at each pass, since installing the kernel switches them)."""
        return self.pack and all(c._attn_implementation in (GQA_SDPA, ROWS_ATTENTION) for c in self._configs)

    @packs.setter
    def packs(self, value: bool) -> None:
        self.pack = bool(value)

    @torch.inference_mode()
    def _pass(self, ids: torch.Tensor, logits_to_keep: int = 0, **model_kwargs) -> torch.Tensor:
        T = ids.shape[1]
        slots, end = self.cache.write_index(T)  # [B, T]: what the pass writes, also its cache_position (_static_pass)
        pos = (slots - self.cache.starts[:, None]).clamp_min(0)
        lengths = self.cache.lengths
        common = int(lengths[0]) if bool((lengths == lengths[0]).all()) else None
        self.cache.eager_pass = (slots, end, common)
        try:
            out = self.model(input_ids=ids.to(self.device), position_ids=pos, cache_position=slots,
                             attention_mask=self.cache.mask(T, self.dtype), past_key_values=self.cache, use_cache=True,
                             logits_to_keep=logits_to_keep, **model_kwargs)
        finally:
            self.cache.eager_pass = None
        return out.logits

    @torch.inference_mode()
    def _step(self, ids: torch.Tensor, **model_kwargs) -> torch.Tensor:
        """The static-shape pass over ``ids [B, T]``: row r's tokens at slots ``[lengths[r], lengths[r] + T)``, the
        eager pass's positions and mask (every slot past its window blocked), attention over the whole slab."""
        B, T = ids.shape
        self.cache.write_index(T)  # refuses a pass past the capacity, as the eager pass does
        if self.cache.layers[0].keys is not self._slab:  # cache.select_rows gathered new slabs: forget the old captures
            self.step_graphs.clear()
            self._inputs.clear()
            self._slab = self.cache.layers[0].keys
        key = (B, T, *sorted(model_kwargs.items()))
        if key not in self._inputs:
            zeros = lambda *shape, dtype=torch.long: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
            self._inputs[key] = StepInputs(zeros(B, T), zeros(B, T), zeros(B, T),
                                           zeros(B, 1, T, self.cache.capacity, dtype=self.dtype))
        x = self._inputs[key]
        x.ids.copy_(ids)
        torch.add(self.cache.lengths[:, None], torch.arange(T, device=self.device), out=x.slots)
        x.positions.copy_((x.slots - self.cache.starts[:, None]).clamp_min(0))
        x.mask.copy_(self.cache.mask(T, self.dtype, end=self.cache.capacity))
        self.cache.slots = x.slots
        try:
            return self.step_graphs.run(key, lambda: self._static_pass(x, **model_kwargs))
        finally:
            self.cache.slots = None

    def _static_pass(self, x: StepInputs, **model_kwargs) -> torch.Tensor:
        """What a capture records: the model's forward over the buffers ``x``.

        ``cache_position`` is the slots the cache writes, row by row (``x.slots [B, T]``; the eager pass passes the
        same): transformers documents a 1-D ``[T]`` for one sequence, and no 1-D tensor names every row's slots when
        rows have different lengths. transformers (4.57's Llama-family forward) reads it in three places, none of
        which needs it 1-D here: the default position ids (``position_ids`` is given), the mask (a given 4D mask is
        used as it is) and each layer's cache write (this cache writes at these slots, :meth:`BatchKVCache.write_index`,
        and reads no ``cache_kwargs``)."""
        out = self.model(input_ids=x.ids, position_ids=x.positions, cache_position=x.slots,
                         attention_mask=x.mask, past_key_values=self.cache, use_cache=True, **model_kwargs)
        return out.logits

    def prefill(self, rows: list[list[int]], logits_to_keep: int = 1, uncommitted_tail: int = 0, **model_kwargs):
        """The first pass: rows left-padded to a common length (their last tokens aligned), the last
        ``logits_to_keep`` rows of logits returned ``[B, logits_to_keep, V]``; all but ``uncommitted_tail`` tokens
        commit.

        When padding would exceed :attr:`MAX_PADDING` of the padded pass's tokens, each row is instead prefilled
        alone (a single-sequence pass, exactly the one ``generate`` makes) and its keys and values are copied
        into its slots: B short passes cost less than one pass that is mostly padding."""
        if logits_to_keep < 1 or logits_to_keep > min(map(len, rows)):
            raise ValueError(f"prefill returns the last logits_to_keep = {logits_to_keep} logits of every row: at "
                             f"least 1 and at most the shortest row's {min(map(len, rows))} tokens")
        T = max(len(r) for r in rows)
        starts = [T - len(r) for r in rows]
        self.cache.reset(torch.tensor(starts))
        if sum(starts) <= self.MAX_PADDING * T * len(rows):
            ids = torch.tensor([[0] * s + list(r) for s, r in zip(starts, rows)], dtype=torch.long)
            logits = self._pass(ids, logits_to_keep, **model_kwargs)
        else:
            one = CachedLM(self.model, T)  # each row alone, then copied into its slots
            out = []
            for r, (s, row) in enumerate(zip(starts, rows)):
                one.cache.reset()
                out.append(one.forward(torch.tensor(row, dtype=torch.long), logits_to_keep=logits_to_keep,
                                       **model_kwargs))
                for dst, src in zip(self.cache.layers, one.cache.layers):
                    dst.keys[r, :, s:T] = src.keys[0, :, :len(row)]
                    dst.values[r, :, s:T] = src.values[0, :, :len(row)]
            logits = torch.stack(out)
        self.cache.advance(torch.full((len(rows),), T - uncommitted_tail))
        return logits

    def verify(self, rows: list[list[int]], commit: list[int] | None = None) -> list[torch.Tensor]:
        """Row r's tokens after its committed ones, in one pass; returns row r's logits ``[len(rows[r]), V]`` for each
        row, and commits ``commit[r]`` of its tokens (default none). Rows of different lengths are *packed*
        (:attr:`packs`: eager passes whose attention can take it): their tokens run back to back as one sequence, so
        the pass's linear layers and LM head see only real tokens, and each query attends its own row's keys
        (:class:`_Packing`). A pass with one row of 1 token and seven of 33 costs what 232 tokens cost, not 264, and
        one with a row of 33 and seven of 1 what 40 cost, not 264. Otherwise the rows are right-padded to the
        longest (:meth:`forward`). Either way the cache keeps the padded layout: each row writes at its own length,
        and the largest step's headroom is reserved as for a padded pass."""
        ns = [len(r) for r in rows]
        if not self.packs or min(ns) == max(ns) or min(ns) < 1:
            logits = self.forward(rows, commit)
            return [logits[r, :n] for r, n in enumerate(ns)]
        logits = self._packed_pass(rows, ns)[0]
        if commit is not None:
            self.cache.advance(torch.tensor(commit))
        return [logits[o:o + n] for o, n in zip(self._packing.offsets, ns)]

    @torch.inference_mode()
    def _packed_pass(self, rows: list[list[int]], ns: list[int]) -> torch.Tensor:
        T = max(ns)
        _, end = self.cache.write_index(T)  # refuses a pass past the capacity, as a padded pass of T would
        B = len(rows)
        which = torch.repeat_interleave(torch.arange(B, device=self.device), torch.tensor(ns, device=self.device))
        t = torch.cat([torch.arange(n, device=self.device) for n in ns])
        slots = self.cache.lengths[which] + t
        pos = (slots - self.cache.starts[which]).clamp_min(0)
        self._packing = _Packing(ns, self.cache.lengths.tolist(), self.device)
        ids = torch.tensor([[tok for r in rows for tok in r]], dtype=torch.long, device=self.device)
        self.cache.packed_pass = (which, slots, end)
        token = PACKED_ATTENTION.set(self._packing.attend)
        try:
            out = self.model(input_ids=ids, position_ids=pos[None], cache_position=slots,
                             attention_mask=self.cache.mask(T, self.dtype), past_key_values=self.cache, use_cache=True)
        finally:
            PACKED_ATTENTION.reset(token)
            self.cache.packed_pass = None
        return out.logits

    def forward(self, rows: list[list[int]], commit: list[int] | None = None, **model_kwargs) -> torch.Tensor:
        """Row r's tokens after its committed ones (rows right-padded to a common T); commits ``commit[r]``
        of them (default none: the caller advances or rolls back after reading the logits ``[B, T, V]``)."""
        T = max(1, max(len(r) for r in rows))
        ids = torch.tensor([list(r) + [0] * (T - len(r)) for r in rows], dtype=torch.long)
        if self.step_mode != "eager" and T <= MAX_STEP:
            logits = self._step(ids, **model_kwargs)
        else:
            logits = self._pass(ids, 0, **model_kwargs)
        if commit is not None:
            self.cache.advance(torch.tensor(commit))
        return logits
