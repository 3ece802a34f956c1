"""A static-shape decode step: preallocated cache, fixed token count, ready for ``torch.compile`` and CUDA graphs.

gpt-fast's lesson (Llama-7B on an A100: 25.5 → 107 tokens/s): a small model's decode step is bound by kernel
launches and Python, not by memory, until the step is captured whole. Capture needs every shape fixed. The library
has that step (:mod:`specdec_core.graphs`, ``CachedLM(model, capacity, step_mode="static" | "graph")``, what
``sd.generate(..., graphs=True)`` runs): the cache writes the T new entries at slots held in a device tensor and
hands attention the *whole* slab ``[0, capacity)``, under an additive mask ``[1, 1, T, capacity]`` built from the
slots (slot j is seen by query t iff ``j <= slot[t]``), so stale entries of rejected drafts are never read; ids,
positions, slots and mask are input buffers, one set per T. :class:`StaticLM` is that ``CachedLM`` with the study's
modes and a committed :meth:`~StaticLM.step`: ``T = 1`` for a decode step, ``T = K + 1`` for a verification. The
committed GPU run (``data/reference/cuda-*/``) timed an earlier version of this step; this one, like the library's
decoders with CUDA graphs, is not yet run on CUDA.

Modes (:data:`MODES`): ``eager`` (the static step, not compiled), ``compile`` (``torch.compile``, Inductor:
fused kernels, on CPU a C++ kernel per fused group), ``reduce-overhead`` (``torch.compile(mode="reduce-overhead")``:
Inductor plus CUDA graphs; on CPU the same as ``compile``), ``graph`` (the library's CUDA graph of the static step:
every launch replayed by one call, CUDA only). Prefill (a prompt of any length) always runs eager.

Everything here goes through the model's public forward only (``input_ids``, ``position_ids``,
``cache_position``, a 4D ``attention_mask``, ``past_key_values``), under transformers 4.57 and 5.x alike.
"""
from __future__ import annotations

import torch

from ..decode import eos_ids
from ..lm import CachedLM, StepInputs

MODES = ("eager", "compile", "reduce-overhead", "graph")


class StaticLM(CachedLM):
    """``model`` bound to a static-step :class:`~specdec_core.lm.CachedLM` of ``capacity`` positions; :meth:`step`
    runs ``T`` tokens at slots ``[length, length + T)`` and commits them (roll back with ``lm.cache.rollback``),
    through the library's static step in ``mode``.

    ``lm.step(tokens)`` returns logits ``[T, V]``. ``backend``: ``torch.compile``'s (``"inductor"``; the smoke run
    traces with ``"aot_eager"``, which skips code generation)."""

    def __init__(self, model, capacity: int, mode: str = "eager", backend: str = "inductor"):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: use one of {MODES}")
        if mode == "graph" and next(model.parameters()).device.type != "cuda":
            raise ValueError("mode 'graph' captures a CUDA graph: it needs a CUDA model")
        super().__init__(model, capacity, step_mode="graph" if mode == "graph" else "static", max_step=capacity)
        self.mode = mode
        self.compiled = None
        if mode in ("compile", "reduce-overhead"):
            if self.device.type == "cuda":
                for layer in self.cache.layers:  # mutated in place every step: fixed addresses for CUDA graphs
                    torch._dynamo.mark_static_address(layer.keys)
                    torch._dynamo.mark_static_address(layer.values)
            self.compiled = torch.compile(super().static_pass, mode=None if mode == "compile" else mode,
                                          dynamic=False, backend=backend)

    def static_pass(self, x: StepInputs, keep: int = 0, **model_kwargs) -> torch.Tensor:
        """The library's static pass, compiled in the compile modes."""
        if self.compiled is None:
            return super().static_pass(x, keep, **model_kwargs)
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(x, keep, **model_kwargs)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """The library's pass over ``tokens [S]`` (any S; eager into an empty cache), committed: logits ``[S, V]``."""
        return self.forward(tokens)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """A fixed-shape pass over ``tokens [T]`` (a device tensor keeps the step free of host syncs), committed."""
        return self.forward(tokens)


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
