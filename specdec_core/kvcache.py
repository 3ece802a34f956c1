"""A preallocated KV cache with O(1) rollback and index-copy compaction.

``KVCache`` plugs into any transformers decoder through the public ``Cache`` interface
(``past_key_values=cache``). All buffers are allocated once, at construction:

    keys[l], values[l] : [1, n_kv_heads, capacity, head_dim]   (model dtype, model device)

Contract (positions are absolute token positions in the sequence):

- ``length``     number of committed positions; entries ``[0, length)`` are what attention sees.
- a forward pass over ``T`` new tokens writes them at ``[length, length + T)`` and returns keys/values
  ``[0, length + T)`` to the attention layer; :meth:`advance` (called by the owner after the pass)
  then makes them committed.
- :meth:`rollback` ``(n)`` forgets the last ``n`` positions: a pointer move, no copy, no free.
  Stale entries beyond ``length`` are never read (every pass slices ``[:length + T]``) and are
  overwritten by the next write.
- :meth:`compact` ``(slots, start)`` copies the entries at positions ``slots`` to ``[start, start + len(slots))``
  (one ``index_select`` + ``copy_`` per layer) and sets ``length = start + len(slots)``; :meth:`retain` keeps
  them there by a pointer move when they already are in place, else by :meth:`compact`: trees use it to keep
  only the accepted path.
- :meth:`reset` empties the cache for a new sequence. Nothing outside this module sets ``length``.
- a *static-shape* pass (:mod:`specdec_core.graphs`) sets :attr:`slots` (a device tensor ``[T]``) for its duration:
  the T entries are written at those slots and attention gets the whole slab ``[0, capacity)``, masked by the pass;
  the contract above is unchanged (the slots are ``[length, length + T)``; ``advance`` still commits them).
"""
from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class CacheFullError(RuntimeError):
    pass


class _SlabLayer(CacheLayerMixin):
    """One layer's slab; reads the write position from the owning :class:`KVCache`."""

    is_sliding = False
    is_compileable = False

    def __init__(self, owner: "KVCache", keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.owner = weakref.proxy(owner)  # not a cycle: a dropped cache frees its slabs at once, not at a full gc
        self.keys, self.values = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states=None):  # buffers exist from the start
        pass

    def update(self, key_states, value_states, cache_kwargs: dict | None = None):
        slots = self.owner.slots
        if slots is not None:  # a static-shape pass: fixed shapes and addresses, whatever the length
            self.keys.index_copy_(2, slots, key_states)
            self.values.index_copy_(2, slots, value_states)
            return self.keys, self.values
        start = self.owner.length
        end = start + key_states.shape[-2]
        if end > self.owner.capacity:
            raise CacheFullError(f"KV cache full: writing positions [{start}, {end}) into a cache of "
                                 f"{self.owner.capacity}")
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query) -> tuple[int, int]:  # transformers 4.x: cache_position [T]; 5.x: T
        return self.owner.length + (query if isinstance(query, int) else query.shape[0]), 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.capacity

    get_max_cache_shape = get_max_length  # the name in transformers 4.x

    def reset(self) -> None:
        self.owner.reset()


class KVCache(Cache):
    """Preallocated cache for batch size 1. See the module docstring for the contract."""

    def __init__(self, config, capacity: int, dtype: torch.dtype, device: torch.device | str):
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        n_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.capacity = int(capacity)
        self.length = 0
        self.slots: torch.Tensor | None = None  # set by a static-shape pass while it runs
        shape = (1, n_kv, self.capacity, head_dim)
        new = lambda: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        super().__init__(layers=[_SlabLayer(self, new(), new()) for _ in range(config.num_hidden_layers)])

    # -- the contract ------------------------------------------------------------------------
    def advance(self, n: int) -> None:
        """Commit the ``n`` positions just written by a forward pass."""
        if self.length + n > self.capacity:
            raise CacheFullError(f"advance({n}) past capacity {self.capacity} (length {self.length})")
        self.length += n

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` committed positions. O(1): a pointer move."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot roll back {n} of {self.length} positions")
        self.length -= n

    def compact(self, slots, start: int) -> None:
        """Copy the entries at absolute positions ``slots`` (a list or LongTensor ``[n]``) to ``[start, start + n)``
        (one ``index_select`` + ``copy_`` per layer) and set ``length = start + n``."""
        slots = torch.as_tensor(slots, dtype=torch.long).flatten()
        n = int(slots.numel())
        if n and bool((slots < 0).any() | (slots >= self.capacity).any()):
            raise ValueError(f"cannot compact slots {slots.tolist()}: the cache has {self.capacity} positions")
        if n:
            slots = slots.to(self.layers[0].keys.device)
            for layer in self.layers:
                for buf in (layer.keys, layer.values):
                    buf[:, :, start:start + n].copy_(buf.index_select(2, slots))
        self.length = start + n

    def retain(self, slots: list[int], start: int) -> None:
        """Keep the entries at ``slots`` as ``[start, start + len(slots))``: a pointer move when they already are
        there, else :meth:`compact`. Nothing is reallocated."""
        if slots == list(range(start, start + len(slots))):
            if start + len(slots) > self.length:
                raise ValueError(f"cannot keep slots up to {start + len(slots)}: only {self.length} are written")
            self.length = start + len(slots)
        else:
            self.compact(slots, start)

    def reset(self) -> None:
        """Forget every position (a new sequence); the buffers stay allocated."""
        self.length = 0

    def nbytes(self) -> int:
        return sum(l.keys.nbytes + l.values.nbytes for l in self.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def __repr__(self):
        return f"KVCache(length={self.length}, capacity={self.capacity}, layers={len(self.layers)})"
