"""Targets and drafts: the embedded SmolLM2 target, any Hugging Face model, toy pairs (``hub``); the draft
models (``draft``: the shipped model draft; ``block``: the block draft of parallel drafting); the shipped
drafts with their checksums (``shipped``)."""
from .hub import EMBEDDED, CorruptModelCache, Pair, embedded_path, load_pair, resolve_device, sha256_file, toy_pair

__all__ = ["EMBEDDED", "CorruptModelCache", "Pair", "embedded_path", "load_pair",
           "resolve_device", "sha256_file", "toy_pair"]
