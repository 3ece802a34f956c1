"""``generate`` and ``stream``: one entry point for every decoding method, with input validation
(:func:`check_arguments`, which ``generate_batch`` shares).

``generate`` returns the whole answer and its record; ``generate(..., streamer=s)`` also hands each step's
tokens to ``s.put`` (the prompt first, then ``s.end()``), the protocol of transformers' streamers, so a
``TextStreamer`` prints the answer as it is decoded; ``stream`` yields each step's tokens.
"""
from __future__ import annotations

import torch

from typing import Iterator

from .graphs import step_mode
from .loop import Autoregressive, Linear, Run, TreeSearch, steps
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
    try:
        raw = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"input_ids must be a list or tensor of integer token ids: {e}") from None
    if raw.numel() and (raw.dtype == torch.bool or raw.is_floating_point() or raw.is_complex()):  # [] is float
        bad = raw.flatten()[0].item()
        raise ValueError(f"input_ids must be integer token ids, got {raw.dtype} values (e.g. {bad!r}); "
                         "a float is refused rather than truncated to an id")
    ids = raw.to(torch.long).cpu()
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
    """Cache slots one step may write beyond the committed tokens: the last token and what it drafts."""
    if method == "autoregressive":
        return 1
    if method == "tree":
        return tree_size(tree, k) + 1
    return k + 1


def _is_count(x) -> bool:
    """An integer >= 1 (``True`` is not a count)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _checked_confidence(confidence, drafter, method: str) -> float | None:
    """``confidence`` as θ: None, or a number in (0, 1] for a speculative method; ``"auto"`` reads the θ
    calibrated on training prompts and stored with the draft, for this method (``drafter.calibrated``)."""
    if confidence is None:
        return None
    calibrated = getattr(drafter, "calibrated", {})
    if confidence == "auto" and method in calibrated:
        confidence = calibrated[method]
    is_theta = isinstance(confidence, (int, float)) and not isinstance(confidence, bool) and 0 < confidence <= 1
    if method == "autoregressive" or not is_theta:
        shown = "'auto' (no θ calibrated for this drafter)" if confidence == "auto" else confidence
        raise ValueError(f"confidence must be in (0, 1] or 'auto' (scripts/calibrate_confidence.py stores θ with a "
                         f"draft), with a speculative method; got {shown} with {method!r}")
    return confidence


def check_arguments(target, prompts: list, drafter, method: str, k, max_new_tokens, temperature, top_k, top_p,
                    confidence=None, methods: tuple[str, ...] = METHODS, caller: str = "generate"):
    """The checks :func:`generate`, :func:`stream` and ``generate_batch`` share, each failure a ``ValueError``
    naming the argument: the sampling knobs, ``method`` (one of ``methods``), ``max_new_tokens``, ``k``,
    ``confidence``, the drafter a speculative method needs, every prompt (1-D token ids inside the target's
    vocabulary), and the drafter's vocabulary (bound to the target).

    Returns ``(params, prompt tensors, θ)``: the :class:`SamplingParams`, each prompt as a 1-D LongTensor on
    the CPU, and the confidence with ``"auto"`` resolved (None without one)."""
    params = SamplingParams(temperature, top_k, top_p)
    if method not in methods:
        if method in METHODS:  # a method of generate's that this caller does not run
            raise ValueError(f"{caller} supports methods {methods}, got {method!r}")
        raise ValueError(f"unknown method {method!r}; choose one of {methods}")
    if not _is_count(max_new_tokens):
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not _is_count(k):
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    theta = _checked_confidence(confidence, drafter, method)
    if method != "autoregressive" and drafter is None:
        raise ValueError(f"method {method!r} needs a drafter (e.g. pair.drafter or pair.drafters['ngram'])")
    vocab_size = target.config.get_text_config().vocab_size
    prompt_tensors = [_prompt_tensor(ids, vocab_size) for ids in prompts]
    if method != "autoregressive":
        drafter.bind(target)
    return params, prompt_tensors, theta


def generate(target, input_ids, drafter=None, method: str = "autoregressive", k: int = 4,
             max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, cache_len: int | None = None, tree=None, rule=None, streamer=None,
             confidence: float | None = None, graphs="auto") -> Result:
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
    ``graphs``: on a CUDA device, ``"auto"`` and True capture the target's and the draft's steps in CUDA graphs,
    one per step shape (static shapes over the preallocated cache, :mod:`specdec_core.graphs`; the prefill runs
    eager), False runs every pass eager. On another device, ``"auto"`` and False run eager and True runs the
    static-shape steps uncaptured (what a capture records; same tokens and record).
    Returns a :class:`Result` (``.tokens`` new tokens only, ``.stats`` a :class:`~specdec_core.record.Stats`).
    """
    run = _prepare(target, input_ids, drafter=drafter, method=method, k=k, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, cache_len=cache_len, tree=tree,
                   rule=rule, confidence=confidence, graphs=graphs)
    tokens = []
    if streamer is not None:
        streamer.put(run.prompt.view(1, -1))
    for new in steps(run):
        tokens += new
        if streamer is not None and new:
            streamer.put(torch.tensor(new, dtype=torch.long))
    if streamer is not None:
        streamer.end()
    return Result(tokens, run.stats)


def stream(target, input_ids, drafter=None, method: str = "autoregressive", k: int = 4, max_new_tokens: int = 64,
           temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, cache_len: int | None = None,
           tree=None, rule=None, confidence: float | None = None, graphs="auto") -> Iterator[list[int]]:
    """:func:`generate`'s arguments; yields the tokens each step commits, as it commits them (the first list is
    the prefill's one token). The lists joined are ``generate(...).tokens``. Arguments are checked at the call,
    before the first step."""
    run = _prepare(target, input_ids, drafter=drafter, method=method, k=k, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, cache_len=cache_len, tree=tree,
                   rule=rule, confidence=confidence, graphs=graphs)
    return steps(run)


def _cache_capacity(target, prompt: torch.Tensor, method: str, k: int, max_new_tokens: int, cache_len, tree) -> int:
    """The target's KV cache positions: ``cache_len``, checked to hold the prompt, the answer and one step's
    headroom (default: exactly that); the answer must also fit the model's positions."""
    extra = headroom(method, k, tree)
    need = prompt.numel() + max_new_tokens + extra
    capacity = need if cache_len is None else int(cache_len)
    if prompt.numel() + extra > capacity:
        raise ValueError(f"prompt of {prompt.numel()} tokens is longer than the KV cache of {capacity} positions")
    if capacity < need:
        raise ValueError(f"prompt ({prompt.numel()}) + max_new_tokens ({max_new_tokens}) + step headroom ({extra}) "
                         f"exceed the KV cache of {capacity} positions")
    max_pos = getattr(target.config.get_text_config(), "max_position_embeddings", None)
    if max_pos is not None and prompt.numel() + max_new_tokens > max_pos:
        raise ValueError(f"prompt ({prompt.numel()}) + max_new_tokens ({max_new_tokens}) exceed the model's "
                         f"{max_pos} positions")
    return capacity


def _prepare(target, input_ids, drafter, method, k, max_new_tokens, temperature, top_k, top_p, seed, cache_len,
             tree, rule, confidence, graphs) -> Run:
    """Check the arguments; return the :class:`~specdec_core.loop.Run` that :func:`~specdec_core.loop.steps` decodes."""
    params, [prompt], theta = check_arguments(target, [input_ids], drafter, method, k, max_new_tokens,
                                              temperature, top_k, top_p, confidence)
    device = next(target.parameters()).device
    mode = step_mode(graphs, device)
    capacity = _cache_capacity(target, prompt, method, k, max_new_tokens, cache_len, tree)
    generator = make_generator(device, seed)
    rule_kw = {} if rule is None else {"rule": rule}  # else each method's default rule
    if method == "autoregressive":
        phases = Autoregressive(params, generator, step_mode=mode)
    elif method == "tree":
        shape = resolve_shape(tree, k)
        phases = TreeSearch(params, generator, drafter, k, shape, confidence=theta, step_mode=mode, **rule_kw)
    else:
        phases = Linear(params, generator, drafter, k, name=method, confidence=theta, step_mode=mode, **rule_kw)
    return Run(phases, target, prompt, max_new_tokens, eos_ids(target), capacity, Stats(method))
