"""The draft's decoding pass in one kernel call a layer, its head's rows in float16.

A draft is worth running only if its pass is far cheaper than the target's (the book calls the ratio c). The
shipped draft has two layers, so its pass is short, and most of its time went to what surrounds the arithmetic:
transformers' module calls, its mask construction, three products where one would do. :func:`trunk` runs each
layer as one call of the rows kernel (``rows.layer``, :mod:`specdec_core.kernels`), in this order:

    x ─ input norm ─ one product for q, k and v ─ rotary positions ─ cache write ─ attention ─ o ─ + x
      ─ post-attention norm ─ one product for gate and up ─ silu(gate) · up ─ down ─ + x

The products and the attention are the kernel's row-invariant ones; the weights are packed in float16 where they
are float16 numbers (the shipped trunk is stored so: the same products from half the bytes). The norms sum in
another order than torch's, so the hidden states match the module path's to float32 rounding, not to the bit
(``tests/test_draft_step.py``). The head's rows are rounded to float16 (:func:`head`): a slightly different draft,
whose q is exactly the law of the logits it samples from, as for any draft.

It runs where the module path would run the kernel: the draft routed through it (``kernels.path_of``), a float32 CPU
pass over at most ``kernels.MAX_ROWS`` tokens with no gradient, after a single sequence's :class:`KVCache` in its
eager mode, causal (no tree mask), after the prefill (the module path runs a prefill, once a decode, through
torch's attention). Anything else returns ``None`` and the caller takes the module path.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers.modeling_outputs import BaseModelOutputWithPast

from .. import kernels
from ..kvcache import CacheFullError, KVCache

_OFF = ContextVar("specdec_draft_step_off", default=False)


@contextmanager
def module_path():
    """Within it, drafts run transformers' modules and their float32 head: the path before this module, timed
    beside it (``study.bench.draft_pass_parts``). Their laws differ only by rounding; q stays the law sampled."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


HEAD_HALF = True  # the head's rows rounded to float16 when packed (the layers' weights only where that is exact)


def packed(owner: torch.nn.Module, key: str, weights: tuple[torch.Tensor, ...], half: bool = False) -> torch.Tensor:
    """The kernel's packed copy of ``weights`` stacked by rows (a fused product), kept on ``owner`` under ``key``
    and packed again when any of them changes (its storage, version or shape), as ``RowsLinear`` does.

    Packed in float16 where every weight is a float16 number (a draft stored in float16: the same products, bit for
    bit, from half the bytes), or where ``half`` asks for it and no weight overflows (the head, :data:`HEAD_HALF`:
    then the logits are those of the rounded weights, and q is their law); else in float32."""
    stamp = tuple((w.data_ptr(), w._version, tuple(w.shape)) for w in weights)
    store = owner.__dict__.setdefault("_specdec_packs", {})
    hit = store.get(key)
    if hit is None or hit[0] != stamp:
        w = (weights[0] if len(weights) == 1 else torch.cat(weights)).detach()
        h = w.to(torch.float16)
        exact = torch.equal(h.float(), w)
        hit = store[key] = (stamp, kernels._module.pack(h if exact or (half and bool(h.isfinite().all())) else w))
    return hit[1]


def _takes(model, x: torch.Tensor) -> bool:
    """Whether the kernel takes the product of ``x`` on ``model``'s behalf (as ``RowsLinear`` decides)."""
    rows = x.numel() // x.shape[-1] if x.dim() else 0
    return (not _OFF.get() and kernels.path_of(model) == "rows" and kernels._module is not None
            and 0 < rows <= kernels.MAX_ROWS and x.dtype == torch.float32 and x.device.type == "cpu"
            and not torch.is_grad_enabled())


def head(draft, h: torch.Tensor) -> torch.Tensor | None:
    """``h [..., H]`` through the draft's head ``[N, H]`` (logits ``[..., N]``) in one kernel call, or ``None``
    where the kernel does not take it."""
    if not (_takes(draft, h) and draft.head.dtype == torch.float32):
        return None
    return kernels._module.linear(h, packed(draft, "head", (draft.head,), half=HEAD_HALF), draft.head.shape[0], None)


def rope(draft, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[T, head size]`` at ``position_ids``, read from a table the trunk's own rotary embedding
    computed once for positions ``[0, n)`` (each entry is one product and one cos or sin: the bits it gives at any
    single position). The table doubles when a position runs past it."""
    need = int(position_ids.max()) + 1
    table = draft.__dict__.get("_specdec_rope")
    if table is None or table[0].shape[0] < need:
        n = max(need, 2 * table[0].shape[0] if table is not None else 512)
        probe = draft.head.new_zeros(1)
        cos, sin = draft.trunk.rotary_emb(probe, torch.arange(n, device=probe.device).view(1, n))
        table = draft.__dict__["_specdec_rope"] = (cos[0].contiguous(), sin[0].contiguous())
    at = position_ids.reshape(-1)
    return table[0][at], table[1][at]


def trunk(draft, emb: torch.Tensor, position_ids=None, past_key_values=None, attention_mask=None,
          output_hidden_states=None, **rest) -> BaseModelOutputWithPast | None:
    """The trunk's pass over ``emb [1, T, H]`` (the module path's arguments), or ``None`` where it does not apply
    (the module docstring): then the caller runs ``draft.trunk``."""
    cache = past_key_values
    cfg = draft.trunk.config
    rest.pop("cache_position", None)  # the slots are the cache's [length, length + T): what the cache writes
    rest.pop("use_cache", None)
    if (rest or attention_mask is not None or output_hidden_states or position_ids is None
            or type(cache) is not KVCache or cache.slots is not None or emb.dim() != 3 or emb.shape[0] != 1
            or not _takes(draft, emb) or cfg._attn_implementation != kernels.ROWS_ATTENTION
            or cfg.head_dim % kernels._module.LANES or draft.trunk.training
            or cfg.attention_bias or getattr(cfg, "mlp_bias", False) or cfg.hidden_act != "silu"):
        return None
    T, L = emb.shape[1], cache.length
    if L == 0 and T > 1:
        return None  # a prefill, once a decode: the module path runs it through torch's attention
    if L + T > cache.capacity:
        raise CacheFullError(f"KV cache full: writing positions [{L}, {L + T}) into a cache of {cache.capacity}")
    cos, sin = rope(draft, position_ids)
    x = emb[0].contiguous()
    for i, layer in enumerate(draft.trunk.layers):
        a, m = layer.self_attn, layer.mlp
        slab = cache.layers[i]
        x = kernels._module.layer(
            x, layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
            float(layer.input_layernorm.variance_epsilon),
            packed(layer, "qkv", (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)),
            cfg.num_attention_heads, cfg.num_key_value_heads, packed(layer, "o", (a.o_proj.weight,)),
            packed(layer, "gate_up", (m.gate_proj.weight, m.up_proj.weight)), m.gate_proj.weight.shape[0],
            packed(layer, "down", (m.down_proj.weight,)), cos, sin, slab.keys, slab.values, L, float(a.scaling))
    return BaseModelOutputWithPast(last_hidden_state=draft.trunk.norm(x.view(1, T, -1)), past_key_values=cache)
