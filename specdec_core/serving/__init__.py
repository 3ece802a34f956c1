"""Serving-shaped decoding on top of the core: continuous batching (``Engine``: requests arrive, join a running
batch, each with its own method, drafter and K, and leave when done), a batch of prompts decoded together with
ragged acceptance (``generate_batch``, a cache with one length per row), arrival schedules and vLLM's serving
metrics (:mod:`.metrics`). Streaming a single sequence is the core's own ``sd.stream`` /
``generate(..., streamer=)``: the decode loop is a generator of steps."""
from .batch import BATCH_METHODS, BatchResult, generate_batch
from .cache import BatchKVCache, BatchLM
from .engine import Engine, EngineResult, StepCost
from .metrics import arrivals, request_metrics, summarize

__all__ = ["Engine", "EngineResult", "StepCost", "arrivals", "request_metrics", "summarize", "generate_batch",
           "BatchResult", "BATCH_METHODS", "BatchKVCache", "BatchLM"]
