"""The run record every strategy returns, the one timer, and the phase clock that fills the record.

One step of any method is *draft → verify → accept → commit* (autoregressive decoding drafts nothing).
The loop (:mod:`specdec_core.loop`) calls :meth:`Stats.record_step` once per step; the definitions below
hold for every method:

- ``proposed[i]``      draft tokens the verifier *tested* on the path it walked at step i: the accepted ones
                       plus the first rejected depth, if any (a chain's tokens after a rejection, or a tree's
                       other branches, are never tested). Autoregressive steps: 0. The core's one name for
                       this count is *proposed* (``Verdict.proposed``, :func:`~specdec_core.verify.chain_tests`).
- ``accepted_lengths[i]`` draft tokens accepted at step i (the verifier's own token comes on top).
- ``drafted[i]``       draft tokens (a chain) or nodes (a tree, root excluded) in step i's verify pass;
                       ``nodes_per_pass`` is the same list under the trees' name.
- ``accept_probs``     one entry per acceptance test the verifier ran: the probability that the test
                       accepts, given everything drafted and rejected before it (Σ min(r, q), r = the target
                       law p or, after rejected siblings, the residual; greedy: 1 if the token matched).
- ``alpha``   = Σ accepted / Σ proposed = accepted ÷ (accepted + rejections): the per-token acceptance rate
                (the maximum-likelihood α of Leviathan et al.'s i.i.d. model).
- ``alpha_predicted`` = Σ accept_probs / Σ proposed: the same rate predicted from the laws (tests accept
                with these probabilities, so its expectation is ``alpha``'s).
- ``tv_alpha``, ``alpha_tv``: deprecated keys of ``accept_probs`` and ``alpha_predicted``, still read (with a
                ``DeprecationWarning``).
- ``tau``     = new tokens / target passes (the prefill counts as a pass).
- ``<phase>_s`` wall time of prefill, decode, and of each step phase; ``token_times[j]`` seconds from the
                start at which new token j became known (tokens committed by one step share a time).
"""
from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch

PHASES = ("draft", "verify", "accept", "commit")


def acceptance_rate(accepted, proposed) -> float:
    """α = accepted ÷ proposed = accepted ÷ (accepted + rejections), NaN when nothing was tested: the book's one α
    (``Stats.alpha``, and every table pooling calls or steps). Each argument is a count or per-step counts (summed).

    Under Leviathan et al.'s i.i.d. model a step that tests its K proposals accepts n (a truncated geometric) and
    contributes n successes and one failure unless n = K: this ratio is the maximum-likelihood α. vLLM and
    transformers report accepted ÷ drafted instead, which counts the untested drafts after a rejection."""
    a = sum(accepted) if hasattr(accepted, "__iter__") else accepted
    p = sum(proposed) if hasattr(proposed, "__iter__") else proposed
    return float(a / p) if p else float("nan")


@dataclass
class Stats:
    """Typed run record; ``stats["alpha"]`` and ``stats.alpha`` read the same field (see the module docstring)."""

    method: str
    target_passes: int = 0
    draft_passes: int = 0
    proposed: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accept_probs: list[float] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    new_tokens: int = 0
    prediction_accepted: int = 0  # predicted-output tokens accepted (generate(..., prediction=))
    prediction_rejected: int = 0  # predicted-output tokens drafted and not accepted (OpenAI's rejected_prediction_tokens)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    accept_s: float = 0.0
    commit_s: float = 0.0

    def record_step(self, proposed: int, accepted: int, drafted: int, accept_probs: list[float],
                    draft_passes: int, predicted: bool = False) -> None:
        """One draft → verify → accept → commit step (one target pass); ``accept_probs``: the step's tests;
        ``predicted``: the draft was the caller's predicted output."""
        if predicted:
            self.prediction_accepted += accepted
            self.prediction_rejected += drafted - accepted
        self.target_passes += 1
        self.draft_passes += draft_passes
        self.proposed.append(proposed)
        self.accepted_lengths.append(accepted)
        self.drafted.append(drafted)
        self.accept_probs.extend(accept_probs)

    @property
    def nodes_per_pass(self) -> list[int]:
        return self.drafted

    @property
    def alpha(self) -> float:
        return acceptance_rate(self.accepted_lengths, self.proposed)

    @property
    def alpha_predicted(self) -> float:
        prop = sum(self.proposed)
        return sum(self.accept_probs) / prop if prop else float("nan")

    @property
    def tau(self) -> float:
        return self.new_tokens / self.target_passes if self.target_passes else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / (self.prefill_s + self.decode_s) if self.new_tokens else 0.0

    # -- mapping view: stats["alpha"], stats.get("nodes_per_pass"), dict(stats.items()) --------------
    DERIVED = ("alpha", "alpha_predicted", "tau", "tokens_per_s", "nodes_per_pass")

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)] + list(self.DERIVED)

    DEPRECATED = {"tv_alpha": "accept_probs", "alpha_tv": "alpha_predicted"}  # old key → its name now

    def __getitem__(self, key: str):
        if key in self.DEPRECATED:
            warnings.warn(f"stats[{key!r}] is deprecated: read stats[{self.DEPRECATED[key]!r}]", DeprecationWarning,
                          stacklevel=2)
            key = self.DEPRECATED[key]
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key) -> bool:
        return key in self.keys() or key in self.DEPRECATED

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def items(self):
        return [(k, self[k]) for k in self.keys()]


@dataclass
class Result:
    """``tokens``: the new tokens only. ``stats``: a :class:`Stats`."""

    tokens: list[int]
    stats: Stats


def sync(device: torch.device | str | None = None) -> None:
    """Wait for the work queued on ``device``: CUDA kernels run asynchronously, so a host clock read before they
    finish would time their launch, not their work. A no-op on CPU; ``None``: the current CUDA device, if any."""
    if device is None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    elif torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """The one timer: host wall time (``time.perf_counter``) read after synchronizing ``device``. Every time the
    library and the study report (the decode loop's phases, benchmarks, pass and proposal timings) is a difference
    of two :meth:`now` readings, so a sample is the time a caller waits for the work, launch overheads included."""

    def __init__(self, device: torch.device | str | None = "cpu"):
        self.device = device

    def now(self) -> float:
        sync(self.device)
        return time.perf_counter()

    def time(self, fn, *args, **kwargs):
        """``(fn(*args, **kwargs), seconds)``: one call between two synchronized readings."""
        t = self.now()
        out = fn(*args, **kwargs)
        return out, self.now() - t


class Clock(Timer):
    """A run's :class:`Timer`: accumulates the wall time of each phase into ``stats.<name>_s`` and stamps tokens."""

    def __init__(self, stats: Stats, device: torch.device):
        super().__init__(device)
        self.stats = stats
        self.t0 = self.now()

    @contextmanager
    def phase(self, name: str):
        t = self.now()
        try:
            yield
        finally:
            setattr(self.stats, f"{name}_s", getattr(self.stats, f"{name}_s") + self.now() - t)

    def mark_tokens(self, n: int) -> None:
        """Record that ``n`` more tokens are known now (for per-token latency)."""
        self.stats.token_times.extend([self.now() - self.t0] * n)
