"""Serving-shaped decoding on top of the core: a batch of prompts decoded together with ragged acceptance
(``generate_batch``, a cache with one length per row). Streaming a single sequence is the core's own
``sd.stream`` / ``generate(..., streamer=)``: the decode loop is a generator of steps."""
from .batch import BATCH_METHODS, BatchResult, generate_batch
from .cache import BatchKVCache, BatchLM

__all__ = ["generate_batch", "BatchResult", "BATCH_METHODS", "BatchKVCache", "BatchLM"]
