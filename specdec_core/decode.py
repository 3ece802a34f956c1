"""``generate`` and ``stream``: one entry point for every decoding method; their options written once
(:class:`DecodeOptions`, which ``generate_batch`` shares) and checked in one place.

``generate`` returns the whole answer and its record; ``generate(..., streamer=s)`` also hands each step's
tokens to ``s.put`` (the prompt first, then ``s.end()``), the protocol of transformers' streamers, so a
``TextStreamer`` prints the answer as it is decoded; ``stream`` yields each step's tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterator

import torch

from .graphs import step_mode
from .drafters import PredictionDrafter
from .loop import Autoregressive, Linear, Parallel, Run, TreeDecoding, decode_steps
from .record import Result, Stats
from .sampling import SamplingParams, make_generator
from .tree import resolve_shape, tree_size

METHODS = ("autoregressive", "linear", "tree", "parallel")


def eos_ids(model) -> set[int]:
    """``model``'s end-of-text token ids: its generation config's, else its config's (none: an empty set)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = model.config.get_text_config().eos_token_id if eos is None else eos
    return set() if eos is None else {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


def _prompt_tensor(input_ids, vocab_size: int, name: str = "input_ids") -> torch.Tensor:
    """``input_ids`` (or another argument of token ids, ``name``) as a 1-D LongTensor on the CPU, checked."""
    try:
        raw = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{name} must be a list or tensor of integer token ids: {e}") from None
    if raw.numel() and (raw.dtype == torch.bool or raw.is_floating_point() or raw.is_complex()):  # [] is float
        bad = raw.flatten()[0].item()
        raise ValueError(f"{name} must be integer token ids, got {raw.dtype} values (e.g. {bad!r}); "
                         "a float is refused rather than truncated to an id")
    ids = raw.to(torch.long).cpu()
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"{name} must be a 1-D list or tensor of token ids, got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("empty prompt: input_ids has no tokens" if name == "input_ids" else f"{name} holds no tokens")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab_size})")
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


@dataclass(frozen=True)
class DecodeOptions:
    """Every decoding option, written once: :func:`generate`, :func:`stream` and ``generate_batch`` take these
    names as keyword arguments (with these defaults: ``tests/test_layout.py`` compares them), build one object
    (:meth:`of`) and check it in one place (:meth:`check`). :func:`generate` documents each option."""

    method: str = "autoregressive"
    k: int = 4
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    cache_len: int | None = None
    tree: object = None
    rule: object = None
    confidence: float | str | None = None
    graphs: bool | str = "auto"
    prediction: object = None

    @classmethod
    def of(cls, arguments: dict) -> DecodeOptions:
        """The options among a call's arguments (an entry point's ``locals()``): the fields it names."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})

    def check(self, target, drafter, methods: tuple[str, ...] = METHODS, caller: str = "generate"):
        """Each failure a ``ValueError`` naming the option: the sampling knobs, ``method`` (one of ``methods``),
        ``max_new_tokens``, ``k``, ``confidence``, ``graphs``, the drafter a speculative method needs and its
        vocabulary (the drafter is bound to the target), the prediction's ids. Returns what it resolved:
        ``(params, θ, step_mode, drafter)``, the :class:`SamplingParams`, θ (``"auto"`` read from the drafter;
        None without one), how the steps run (:func:`~specdec_core.graphs.step_mode`) and the drafter to decode
        with (with a ``prediction``, a :class:`~specdec_core.drafters.PredictionDrafter` in front of ``drafter``)."""
        params = SamplingParams(self.temperature, self.top_k, self.top_p)
        if self.method not in methods:
            if self.method in METHODS:  # a method of generate's that this caller does not run
                raise ValueError(f"{caller} supports methods {methods}, got {self.method!r}")
            raise ValueError(f"unknown method {self.method!r}; choose one of {methods}")
        if not _is_count(self.max_new_tokens):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not _is_count(self.k):
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")
        theta = _checked_confidence(self.confidence, drafter, self.method)
        mode = step_mode(self.graphs, next(target.parameters()).device)
        if self.prediction is not None:
            if self.method == "autoregressive":
                raise ValueError("prediction needs a speculative method (method='linear', 'tree' or 'parallel')")
            vocab_size = target.config.get_text_config().vocab_size
            drafter = PredictionDrafter(_prompt_tensor(self.prediction, vocab_size, "prediction").tolist(), drafter)
        if self.method != "autoregressive":
            if drafter is None:
                raise ValueError(f"method {self.method!r} needs a drafter (e.g. pair.drafter or "
                                 "pair.drafters['ngram'])")
            drafter.bind(target)
        return params, theta, mode, drafter


def check_prompts(target, prompts: list) -> list[torch.Tensor]:
    """Every prompt as a 1-D LongTensor on the CPU, its ids inside the target's vocabulary (else a ``ValueError``)."""
    vocab_size = target.config.get_text_config().vocab_size
    return [_prompt_tensor(ids, vocab_size) for ids in prompts]


def generate(target, input_ids, drafter=None, method: str = "autoregressive", k: int = 4,
             max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, cache_len: int | None = None, tree=None, rule=None, streamer=None,
             confidence: float | None = None, graphs="auto", prediction=None) -> Result:
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
    ``prediction``: token ids of the answer the caller expects (the text being edited, say): a speculative method
    drafts from it first, from where the output's tail resumes in it, and ``drafter`` (optional then) covers the
    steps where it has no match (:class:`~specdec_core.drafters.PredictionDrafter`); ``stats`` counts
    ``prediction_accepted`` and ``prediction_rejected`` tokens. Exact whatever the prediction.
    Returns a :class:`Result` (``.tokens`` new tokens only, ``.stats`` a :class:`~specdec_core.record.Stats`).
    """
    run = _prepare(target, input_ids, drafter, DecodeOptions.of(locals()))
    tokens = []
    if streamer is not None:
        streamer.put(run.prompt.view(1, -1))
    for new in decode_steps(run):
        tokens += new
        if streamer is not None and new:
            streamer.put(torch.tensor(new, dtype=torch.long))
    if streamer is not None:
        streamer.end()
    return Result(tokens, run.stats)


def stream(target, input_ids, drafter=None, method: str = "autoregressive", k: int = 4, max_new_tokens: int = 64,
           temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, cache_len: int | None = None,
           tree=None, rule=None, confidence: float | None = None, graphs="auto",
           prediction=None) -> Iterator[list[int]]:
    """:func:`generate`'s arguments; yields the tokens each step commits, as it commits them (the first list is
    the prefill's one token). The lists joined are ``generate(...).tokens``. Arguments are checked at the call,
    before the first step."""
    return decode_steps(_prepare(target, input_ids, drafter, DecodeOptions.of(locals())))


def cache_capacity(target, prompt_len: int, options: DecodeOptions) -> int:
    """The target's KV cache positions for a prompt of ``prompt_len`` tokens (a batch: its longest):
    ``options.cache_len``, checked to hold the prompt, the answer and one step's headroom (default: exactly that);
    the answer must also fit the model's positions."""
    o = options
    extra = headroom(o.method, o.k, o.tree)
    need = prompt_len + o.max_new_tokens + extra
    capacity = need if o.cache_len is None else int(o.cache_len)
    if prompt_len + extra > capacity:
        raise ValueError(f"prompt of {prompt_len} tokens is longer than the KV cache of {capacity} positions")
    if capacity < need:
        raise ValueError(f"prompt ({prompt_len}) + max_new_tokens ({o.max_new_tokens}) + step headroom ({extra}) "
                         f"exceed the KV cache of {capacity} positions")
    max_pos = getattr(target.config.get_text_config(), "max_position_embeddings", None)
    if max_pos is not None and prompt_len + o.max_new_tokens > max_pos:
        raise ValueError(f"prompt ({prompt_len}) + max_new_tokens ({o.max_new_tokens}) exceed the model's "
                         f"{max_pos} positions")
    return capacity


def _prepare(target, input_ids, drafter, options: DecodeOptions) -> Run:
    """Check the arguments; return the :class:`~specdec_core.loop.Run` that :func:`~specdec_core.loop.decode_steps`
    decodes."""
    o = options
    params, theta, mode, drafter = o.check(target, drafter)
    [prompt] = check_prompts(target, [input_ids])
    capacity = cache_capacity(target, prompt.numel(), o)
    generator = make_generator(next(target.parameters()).device, o.seed)
    rule = {} if o.rule is None else {"rule": o.rule}  # else each method's default rule
    if o.method == "autoregressive":
        phases = Autoregressive(params, generator, step_mode=mode)
    elif o.method == "tree":
        shape = resolve_shape(o.tree, o.k)
        phases = TreeDecoding(params, generator, drafter, o.k, shape, confidence=theta, step_mode=mode, **rule)
    else:
        method = Parallel if o.method == "parallel" else Linear
        phases = method(params, generator, drafter, o.k, confidence=theta, step_mode=mode, **rule)
    return Run(phases, target, prompt, o.max_new_tokens, eos_ids(target), capacity, Stats(o.method))
