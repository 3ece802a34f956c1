"""One logits-processing function shared by every strategy.

The baseline, every drafter and the verifier turn logits into a next-token law with
:func:`process_logits`. A draft's ``q`` is therefore *exactly* the law it sampled from, and the
target's ``p`` goes through the same temperature → top-k → top-p pipeline (the bug class of
transformers issues #32867 / #47932 cannot occur by construction).

Notation used across the package (as in Leviathan et al. 2023 and Chen et al. 2023):
**p = target law, q = draft law**.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

PROB_DTYPE = torch.float64  # probability algebra (p/q ratios, residuals) runs in float64


@dataclass(frozen=True)
class SamplingParams:
    """Decoding knobs. ``temperature == 0`` means greedy (the law is one-hot on the argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1.0 disables top-p

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ``ValueError`` naming the bad sampling parameter."""
    if not isinstance(temperature, (int, float)) or temperature != temperature or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1] (1 disables it), got {top_p!r}")


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits ``[..., V]`` → probabilities ``[..., V]`` (float64), temperature → top-k → top-p.

    Greedy (temperature 0) returns the one-hot law on ``argmax`` (first index on exact ties, as ``torch.argmax``
    and transformers' greedy search do)."""
    if params.greedy:
        out = torch.zeros(logits.shape, dtype=PROB_DTYPE, device=logits.device)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    x = logits.to(PROB_DTYPE) / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = mass_before >= params.top_p  # keep the smallest prefix reaching top_p (never empty)
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``probs [..., V]`` (weights >= 0) → ``[...]``: a uniform inverts the cumulative sum (weight 0,
    an empty interval, is never drawn; capped at the last weighted index): one cumulative sum and one binary search
    per row."""
    cum = probs.cumsum(-1)
    tot = cum[..., -1:].contiguous()
    u = torch.rand((*probs.shape[:-1], 1), dtype=cum.dtype, device=probs.device, generator=generator)
    return torch.minimum(torch.searchsorted(cum, u * tot, right=True), torch.searchsorted(cum, tot)).squeeze(-1)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None):
    """Process ``logits [V]`` and pick a token: returns ``(token: int, probs [V] | None)``.

    Greedy takes the argmax and returns ``probs=None`` (the law is the one-hot on that token; the greedy verifier
    needs only tokens), so greedy runs consume no randomness."""
    if params.greedy:
        return int(logits.argmax(-1)), None
    probs = process_logits(logits, params)
    return int(sample(probs, generator)), probs


def confidence(logits: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    """The draft's confidence at a position (or per row): the largest probability of the law it draws from
    (greedy, where that law is one-hot: of ``softmax(logits)``, as transformers' ``assistant_confidence_threshold``)."""
    return (probs if probs is not None else torch.softmax(logits.to(PROB_DTYPE), -1)).amax(-1)


class OneHotLaws:
    """The laws of a deterministic proposal, row i one-hot on ``tokens[i]``, kept as the tokens: what a dense
    ``[K, V]`` float64 one-hot holds, without allocating it (12 MB at K = 32, V = 49 152). Indexing reads what the
    accept rules read: ``q[i]`` a dense row ``[V]``, ``q[rows, x]`` the probabilities of tokens ``x``, ``q[a:b]``."""

    def __init__(self, tokens: torch.Tensor, vocab_size: int):
        self.tokens = torch.as_tensor(tokens, dtype=torch.long)
        self.vocab_size = vocab_size
        self.shape = (self.tokens.numel(), vocab_size)

    def __len__(self) -> int:
        return self.tokens.numel()

    def to(self, device) -> OneHotLaws:
        return OneHotLaws(self.tokens.to(device), self.vocab_size)

    def dense(self) -> torch.Tensor:
        return torch.nn.functional.one_hot(self.tokens, self.vocab_size).to(PROB_DTYPE)

    def __getitem__(self, index):
        if isinstance(index, tuple):  # (rows, tokens): q_rows(tokens)
            rows, x = index
            return (self.tokens[rows].to(x.device) == x).to(PROB_DTYPE)
        if isinstance(index, slice):
            return OneHotLaws(self.tokens[index], self.vocab_size)
        row = torch.zeros(self.vocab_size, dtype=PROB_DTYPE, device=self.tokens.device)
        return row.index_fill_(0, self.tokens[int(index)].view(1), 1.0)


def make_generator(device: torch.device | str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed))
