"""``generate`` and ``stream``: one entry point for every decoding method, with input validation.

``generate`` returns the whole answer and its record; ``generate(..., streamer=s)`` also hands each step's
tokens to ``s.put`` (the prompt first, then ``s.end()``), the protocol of transformers' streamers, so a
``TextStreamer`` prints the answer as it is decoded; ``stream`` yields each step's tokens.
"""
from __future__ import annotations

import torch

from typing import Iterator

from .loop import Autoregressive, Linear, TreeSearch, steps
from .record import Result, Stats
from .sampling import SamplingParams, make_generator
from .tree import resolve_shape, tree_size

METHODS = ("autoregressive", "linear", "tree", "parallel")


def eos_ids(model) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = model.config.get_text_config().eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


def _prompt_tensor(input_ids, vocab_size: int) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long).cpu()
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"input_ids must be a 1-D list or tensor of token ids, got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("empty prompt: input_ids has no tokens")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"input_ids hold ids outside the vocabulary [0, {vocab_size})")
    return ids


def headroom(method: str, k: int, tree=None) -> int:
    """Extra cache slots a step may write beyond the committed tokens."""
    if method == "tree":
        return tree_size(tree, k) + 1
    return k + 1


def generate(target, input_ids, drafter=None, method: str = "autoregressive", k: int = 4,
             max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, cache_len: int | None = None, tree=None, rule=None, streamer=None,
             confidence: float | None = None) -> Result:
    """Decode ``max_new_tokens`` after ``input_ids`` (``[S]`` ids, already chat-templated).

    method: ``"autoregressive"``, ``"linear"``, ``"tree"`` or ``"parallel"``; ``k`` is the draft length /
    tree depth / block size. ``temperature=0`` is greedy. ``cache_len`` caps the KV cache (default: prompt +
    max_new_tokens + what one speculative step may write). ``tree``: the tree shape (method ``"tree"``, see
    :func:`specdec_core.tree.resolve_shape`). ``rule``: the accept rule for sampling (default
    :func:`~specdec_core.verify.speculative_sample`, or :func:`~specdec_core.verify.tree_speculative_sample`
    for trees); the negative controls of chapter 2 pass theirs. ``streamer``: an object with ``put(ids)`` and
    ``end()`` (transformers' ``TextStreamer`` works): it receives the prompt, then each step's new tokens.
    ``confidence``: θ in (0, 1]. Linear and parallel: ``k`` becomes the most a step drafts, and drafting stops
    before the first position after the first whose draft law's largest probability is below θ. Trees: a node
    whose score (the draft's probability of reaching it) is below θ gets no children. ``"auto"``: the drafter's
    θ for this method, calibrated on training prompts (``drafter.calibrated``).
    Returns a :class:`Result` (``.tokens`` new tokens only, ``.stats`` a :class:`~specdec_core.record.Stats`).
    """
    run = _prepare(target, input_ids, drafter, method, k, max_new_tokens, temperature, top_k, top_p, seed,
                   cache_len, tree, rule, confidence)
    stats, tokens = run[-1], []
    if streamer is not None:
        streamer.put(run[2].view(1, -1))
    for new in steps(*run):
        tokens += new
        if streamer is not None and new:
            streamer.put(torch.tensor(new, dtype=torch.long))
    if streamer is not None:
        streamer.end()
    return Result(tokens, stats)


def stream(target, input_ids, drafter=None, method: str = "autoregressive", k: int = 4, max_new_tokens: int = 64,
           temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, cache_len: int | None = None,
           tree=None, rule=None, confidence: float | None = None) -> Iterator[list[int]]:
    """:func:`generate`'s arguments; yields the tokens each step commits, as it commits them (the first list is
    the prefill's one token). The lists joined are ``generate(...).tokens``. Arguments are checked at the call,
    before the first step."""
    return steps(*_prepare(target, input_ids, drafter, method, k, max_new_tokens, temperature, top_k, top_p, seed,
                           cache_len, tree, rule, confidence))


def _prepare(target, input_ids, drafter, method, k, max_new_tokens, temperature, top_k, top_p, seed, cache_len,
             tree, rule, confidence=None):
    """Validate the arguments; return what :func:`~specdec_core.loop.steps` takes."""
    params = SamplingParams(temperature, top_k, top_p)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if confidence == "auto":  # the θ calibrated on training prompts and stored with the draft, for this method
        confidence = getattr(drafter, "calibrated", {}).get(method, "'auto' (no θ calibrated for this drafter)")
    if confidence is not None and (method == "autoregressive" or isinstance(confidence, bool)
                                   or not isinstance(confidence, (int, float)) or not 0 < confidence <= 1):
        raise ValueError(f"confidence must be in (0, 1] or 'auto' (scripts/calibrate_confidence.py stores θ with a "
                         f"draft), with a speculative method; got {confidence} with {method!r}")
    cfg = target.config.get_text_config()
    prompt = _prompt_tensor(input_ids, cfg.vocab_size)
    if method != "autoregressive":
        if drafter is None:
            raise ValueError(f"method {method!r} needs a drafter (e.g. pair.drafter or pair.drafters['ngram'])")
        drafter.bind(target)
    extra = 1 if method == "autoregressive" else headroom(method, k, tree)
    need = prompt.numel() + max_new_tokens + extra
    capacity = need if cache_len is None else int(cache_len)
    if prompt.numel() + extra > capacity:
        raise ValueError(f"prompt of {prompt.numel()} tokens is longer than the KV cache of {capacity} positions")
    if capacity < need:
        raise ValueError(f"prompt ({prompt.numel()}) + max_new_tokens ({max_new_tokens}) + step headroom ({extra}) "
                         f"exceed the KV cache of {capacity} positions")
    max_pos = getattr(cfg, "max_position_embeddings", None)
    if max_pos is not None and prompt.numel() + max_new_tokens > max_pos:
        raise ValueError(f"prompt ({prompt.numel()}) + max_new_tokens ({max_new_tokens}) exceed the model's "
                         f"{max_pos} positions")
    gen = make_generator(next(target.parameters()).device, seed)
    if method == "autoregressive":
        spec = Autoregressive(params, gen)
    elif method == "tree":
        shape = resolve_shape(tree, k)
        spec = TreeSearch(params, gen, drafter, k, shape, confidence=confidence, **({"rule": rule} if rule else {}))
    else:
        spec = Linear(params, gen, drafter, k, name=method, confidence=confidence, **({"rule": rule} if rule else {}))
    return spec, target, prompt, max_new_tokens, eos_ids(target), capacity, Stats(method)
