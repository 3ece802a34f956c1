"""The expected-speedup algebra of Leviathan et al. (2023), with the book's measured refinements.

α: probability that a draft token is accepted (assumed i.i.d. per position, as in the paper);
K: draft length (the paper's γ); c: cost of one draft pass ÷ cost of one target pass.
"""
from __future__ import annotations

import numpy as np


def expected_tokens(alpha, k):
    """E[tokens per target pass] = (1 − α^{K+1}) / (1 − α)  (Leviathan et al., Eq. 1)."""
    alpha = np.asarray(alpha, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (1 - alpha ** (k + 1)) / (1 - alpha)
    return np.where(np.isclose(alpha, 1.0), k + 1.0, out)


def speedup(alpha, k, c, verify_ratio=1.0):
    """Expected wall-time speedup over autoregressive decoding.

    Theorem 3.8 is the case ``verify_ratio = 1`` (a pass over K + 1 tokens costs one ordinary pass):
    (1 − α^{K+1}) / ((1 − α)(K c + 1)). With ``verify_ratio`` = t_target(K + 1 tokens) / t_target(1 token)
    measured, the denominator becomes K c + verify_ratio.
    """
    return expected_tokens(alpha, k) / (k * np.asarray(c, dtype=float) + verify_ratio)


def best_k(alpha: float, c: float, verify_ratio=None, k_max: int = 16) -> int:
    """The K in 1..k_max maximizing :func:`speedup` (``verify_ratio``: a callable K → ratio, or None for 1)."""
    ks = np.arange(1, k_max + 1)
    vr = np.array([verify_ratio(k) if verify_ratio else 1.0 for k in ks])
    return int(ks[np.argmax(speedup(alpha, ks, c, vr))])
