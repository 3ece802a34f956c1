"""Verification: pure functions on tokens and probability tensors.

Notation (declared once, used everywhere): **p = target law, q = draft law**, both produced by
:func:`specdec_core.sampling.process_logits` with the same parameters. K draft tokens are checked
against K + 1 target positions (the last one yields the bonus token).
"""
from __future__ import annotations

import torch

from .sampling import sample


def greedy_accept(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Greedy rule. draft_tokens ``[K]``, target_argmax ``[K+1]`` → (tokens ``[n+1]``, n).

    Accept the longest prefix equal to the target's argmax, then append the target's own token.
    """
    K = draft_tokens.numel()
    match = (draft_tokens.to(target_argmax.device) == target_argmax[:K]).to(torch.int64)
    n = int(match.cumprod(0).sum()) if K else 0
    return target_argmax[: n + 1].clone(), n


def speculative_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, int]:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    draft_tokens ``[K]`` sampled from draft_probs ``[K, V]`` (q); target_probs ``[K+1, V]`` (p).
    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a sample of
    norm(max(0, p_i − q_i)) and stop; if all K are accepted emit a bonus sample of p_K.
    Returns (tokens ``[n+1]``: the accepted prefix plus one corrected or bonus token, n accepted).

    Why the emitted token has law p_i: P(x) = q(x)·min(1, p(x)/q(x)) + (1 − Σ_y min(p, q)) · r(x) with
    r = (p − q)^+ / Σ(p − q)^+; since Σ(p − q)^+ = 1 − Σ min(p, q), P(x) = min(p, q)(x) + (p − q)^+(x) = p(x).
    """
    K = draft_tokens.numel()
    dev = target_probs.device
    x = draft_tokens.to(dev)
    if K:
        rows = torch.arange(K, device=dev)
        px, qx = target_probs[rows, x], draft_probs.to(dev)[rows, x]
        if bool((qx <= 0).any()):
            raise ValueError("a draft token has q(x) = 0: q is not the law the draft sampled from")
        u = torch.rand(K, generator=generator, device=dev, dtype=target_probs.dtype)
        accepted = (u * qx < px).to(torch.int64)  # u < p/q without dividing (no NaN/inf when p = q = 0)
        n = int(accepted.cumprod(0).sum())
    else:
        n = 0
    if n < K:
        residual = (target_probs[n] - draft_probs[n].to(dev)).clamp_min(0.0)
        total = residual.sum()
        # total == 0 only if p == q on the support, where rejection has probability 0; guard rounding anyway
        law = residual / total if total > 0 else target_probs[n]
        last = sample(law, generator)
    else:
        last = sample(target_probs[K], generator)
    return torch.cat([x[:n], last.view(1)]), n


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Σ_x min(p, q) = 1 − TV(p, q) per row: the acceptance probability of a draft token. ``[..., V]`` → ``[...]``."""
    return torch.minimum(p, q).sum(-1)
