"""Decode steps as CUDA graphs: a static-shape pass captured once per shape, then replayed by one call.

A decode step of a small model on a GPU launches hundreds of small kernels from Python, and launching them can take
longer than the GPU takes to run them; a CUDA graph replays the whole step's recorded kernels with one call
(gpt-fast and vLLM capture the step whole in a CUDA graph). This path has not yet run on CUDA (no committed CUDA run
of it: data/reference/cuda-*/ says what has). A capture records fixed kernels on fixed addresses, so the step must
have static shapes: the T new tokens are written at cache slots held in a device tensor, attention reads the whole
preallocated slab under an additive mask, and the ids, position ids, slots and mask are input buffers, filled before
each replay (:class:`~specdec_core.lm.CachedLM`; ``serving.cache.BatchLM`` for a batch).

How the passes after the prefill run (:data:`STEP_MODES`; the prefill, of any length, always runs eager):

- ``"eager"``: the library's dynamic pass (the cache window ``[0, length + T)``, transformers' own causal mask);
- ``"static"``: the static-shape pass run as it is: what a capture records, on any device (the CPU proves it
  computes what the eager pass computes);
- ``"graph"``: the static pass captured in a ``torch.cuda.CUDAGraph`` at its first use per shape (warm-up on a
  side stream, as PyTorch's recipe does), then replayed.

``generate``'s ``graphs`` argument picks one (:func:`step_mode`). A model whose forward synchronizes with the host
(reads a value on the GPU, as the block draft does when it checks its ids) cannot be captured: its passes run static
and uncaptured, with a warning saying why (:attr:`StepGraphs.uncaptured`).
"""
from __future__ import annotations

import warnings

import torch

STEP_MODES = ("eager", "static", "graph")


def step_mode(graphs, device) -> str:
    """``graphs`` (``"auto"``, True or False) → how steps run on ``device``: on CUDA, ``"graph"`` unless False; on
    any other device, ``"eager"`` for "auto" and False (the library's path, unchanged) and ``"static"`` for True
    (the static-shape step without capture: what a CPU can check)."""
    if not (graphs is True or graphs is False or (isinstance(graphs, str) and graphs == "auto")):
        raise ValueError(f"graphs must be 'auto', True or False, got {graphs!r}")
    if graphs is False:
        return "eager"
    if torch.device(device).type == "cuda":
        return "graph"
    return "static" if graphs is True else "eager"


class StepGraphs:
    """The steps of one model over one cache, by shape: :meth:`run` returns ``fn()``'s tensor, from a CUDA graph
    captured at the first call with that key in mode ``"graph"``, by calling ``fn`` otherwise.

    ``fn`` must read and write only fixed buffers (the key's inputs, the cache, the weights): a graph replays its
    kernels on the addresses they had at capture."""

    WARMUPS = 2  # passes on a side stream before the capture (lazy initializations happen outside the graph)
    cuda = torch.cuda  # the CUDA calls a capture makes: streams, the sync-debug mode, graphs (a test hands a stand-in)

    def __init__(self, mode: str, device):
        if mode not in STEP_MODES:
            raise ValueError(f"unknown step mode {mode!r}: use one of {STEP_MODES}")
        self.mode = mode
        self.device = torch.device(device)
        if mode == "graph" and self.device.type != "cuda":
            raise ValueError(f"step mode 'graph' captures CUDA graphs: it needs a CUDA model, not {self.device}")
        self.captured: dict = {}  # key → (graph, its output tensor, rewritten at each replay)
        self.uncaptured: dict = {}  # key → why it could not be captured (it runs uncaptured)

    def run(self, key, fn) -> torch.Tensor:
        if self.mode != "graph" or key in self.uncaptured:
            return fn()
        if key not in self.captured and not self._capture(key, fn):
            return fn()
        graph, out = self.captured[key]
        graph.replay()
        return out.clone()  # a tensor of its own, as an eager pass returns: the next replay rewrites `out`

    def clear(self) -> None:
        """Forget every capture (the weights or the cache moved)."""
        self.captured.clear()
        self.uncaptured.clear()

    def _capture(self, key, fn) -> bool:
        """Warm up on a side stream with host synchronization refused (the warm-ups compute this very step: they
        write the same entries at the same slots), then capture. False, with the reason kept, if it cannot."""
        here = self.cuda.current_stream(self.device)
        side = self.cuda.Stream(self.device)
        side.wait_stream(here)
        before = self.cuda.get_sync_debug_mode()
        try:
            with self.cuda.stream(side):
                self.cuda.set_sync_debug_mode("error")
                for _ in range(self.WARMUPS):
                    fn()
                self.cuda.set_sync_debug_mode(before)
            here.wait_stream(side)
            graph = self.cuda.CUDAGraph()
            with self.cuda.graph(graph):
                out = fn()
        except RuntimeError as e:  # a host synchronization refused, or a capture failed: the key runs uncaptured
            self.uncaptured[key] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            warnings.warn(f"a model's steps are not captured in CUDA graphs (they run static, uncaptured): "
                          f"{self.uncaptured[key]}", stacklevel=4)
            return False
        finally:  # also after any other error, which propagates: the process leaves sync-debug mode as it found it
            self.cuda.set_sync_debug_mode(before)
            here.wait_stream(side)
        self.captured[key] = (graph, out)
        return True
