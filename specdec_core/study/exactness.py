"""Exactness statistics: does a decoder emit the target's law p? Tests that could fail.

Every sample goes through the real code path, :func:`specdec_core.generate`, with seeds
``seed0, seed0 + 1, …`` (one per continuation). The reference is exact: for a toy target the law of
every length-``n`` continuation is enumerated with the same :func:`~specdec_core.sampling.process_logits`.

- :func:`sequence_law`      exact law of all ``V**n`` continuations (one batched target pass).
- :func:`sample_sequences`  ``N`` continuations through ``generate`` (plus the acceptance record).
- :func:`gof_test`          Pearson (or G) goodness of fit, small expected counts pooled.
- :func:`holm`              Holm's step-down adjustment across a family of tests.
- :func:`p_verdict`         a test's verdict with its numbers, "borderline" near its threshold (:func:`borderline`).
- :func:`tv_upper_bound`    an upper confidence bound on TV(law sampled, p): equivalence, not only non-rejection.
- :func:`power`, :func:`samples_needed`, :func:`least_favourable`: power analysis for a given TV.
- :func:`power_against`, :func:`samples_for_power`, :func:`power_phrase`: the power a non-rejection had against a
  mutant's measured divergence, the n that would reach a goal, and the one way the book says a pass.
- :func:`homogeneity_test`, :func:`conditional_counts`, :func:`next_token_laws`: checks on a real target.

Notation: p = target law, q = draft law. Cells are continuations indexed lexicographically,
``index(x) = Σ_t x_t · V**(n-1-t)``.
"""
from __future__ import annotations

import functools
import itertools
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from scipy import optimize, stats

from ..decode import METHODS, generate
from ..lm import CachedLM
from ..sampling import SamplingParams, process_logits
from ..verify import speculative_sample
from . import mutants


# -- exact laws --------------------------------------------------------------------------------
@torch.inference_mode()
def next_token_laws(target, ids, params: SamplingParams) -> torch.Tensor:
    """One target pass over ``ids [S]`` → ``[S, V]`` processed next-token laws (row t: p(· | ids[:t+1]))."""
    ids = torch.as_tensor(ids, dtype=torch.long).view(1, -1).to(next(target.parameters()).device)
    return process_logits(target(input_ids=ids).logits[0], params).cpu()


@torch.inference_mode()
def sequence_law(target, prompt, n: int, params: SamplingParams) -> np.ndarray:
    """Exact law ``[V**n]`` (float64) of the ``n`` tokens generated after ``prompt`` under ``params``.

    All ``V**(n-1)`` prefixes run in one batched pass (causal: position t sees only its prefix);
    P(x) = Π_t p(x_t | prompt, x_<t), each factor from :func:`process_logits`.
    """
    V = target.config.get_text_config().vocab_size
    if n < 1 or V ** n > 2 ** 20:
        raise ValueError(f"cannot enumerate {V}**{n} continuations: need n >= 1 and V**n <= 2**20")
    prompt = torch.as_tensor(prompt, dtype=torch.long).view(-1)
    L = prompt.numel()
    prefixes = torch.tensor(list(itertools.product(range(V), repeat=n - 1)), dtype=torch.long).view(-1, n - 1)
    M = prefixes.shape[0]
    ids = torch.cat([prompt.expand(M, L), prefixes], 1).to(next(target.parameters()).device)
    p = process_logits(target(input_ids=ids).logits[:, L - 1:], params).cpu()  # [M, n, V]
    prefix_prob = torch.ones(M, dtype=p.dtype)
    for t in range(n - 1):
        prefix_prob *= p[torch.arange(M), t, prefixes[:, t]]
    law = (prefix_prob[:, None] * p[:, n - 1]).reshape(-1).numpy()
    assert abs(law.sum() - 1.0) < 1e-9, "sequence law does not sum to 1"
    return law


def cell_index(tokens: np.ndarray, V: int) -> np.ndarray:
    """Continuations ``[N, n]`` → lexicographic cell indices ``[N]``."""
    tokens = np.asarray(tokens, dtype=np.int64)
    return tokens @ (V ** np.arange(tokens.shape[1] - 1, -1, -1, dtype=np.int64))


# -- sampling through the real code path --------------------------------------------------------
@contextmanager
def torch_threads(n: int | None):
    """Run with ``n`` intra-op threads (tiny toy models are fastest, and machine-independent, on one)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@dataclass
class Samples:
    """``tokens [N, n]``; per speculative step: ``accepted`` / ``proposed`` lengths and, for the linear
    loop, ``overlap``: the step's mean Σ min(p, q) over its draft positions (steps with a draft only)."""

    tokens: np.ndarray
    accepted: np.ndarray
    proposed: np.ndarray
    overlap: np.ndarray

    def counts(self, V: int) -> np.ndarray:
        return np.bincount(cell_index(self.tokens, V), minlength=V ** self.tokens.shape[1])


def sample_sequences(target, prompt, n: int, N: int, params: SamplingParams, method: str = "autoregressive",
                     drafter=None, k: int = 2, seed0: int = 0, tree=None, threads: int | None = None,
                     rule=None, confidence: float | None = None) -> Samples:
    """``N`` continuations of ``n`` tokens, ``generate(..., seed=seed0 + i)`` for i < N (``rule``: an accept
    rule for ``generate``, e.g. a negative control of :mod:`specdec_core.study.mutants`; ``confidence``:
    ``generate``'s draft stop)."""
    toks, acc, prop, ov = [], [], [], []
    with torch_threads(threads):
        for i in range(N):
            res = generate(target, prompt, drafter=drafter, method=method, k=k, max_new_tokens=n,
                           temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                           seed=seed0 + i, tree=tree, rule=rule, confidence=confidence)
            if len(res.tokens) != n:
                raise RuntimeError(f"seed {seed0 + i}: {method} returned {len(res.tokens)} tokens, expected {n}")
            toks.append(res.tokens)
            acc += res.stats["accepted_lengths"]
            prop += res.stats["proposed"]
            ov += res.stats["accept_probs"]
    return Samples(np.array(toks, dtype=np.int64), np.array(acc), np.array(prop), np.array(ov))


def setting_params(setting: dict) -> SamplingParams:
    """A setting ``{"name": ..., "temperature": ..., "top_k": ..., "top_p": ...}`` → :class:`SamplingParams`."""
    return SamplingParams(float(setting.get("temperature", 1.0)), int(setting.get("top_k", 0)),
                          float(setting.get("top_p", 1.0)))


def setting_name(setting: dict) -> str:
    """A setting's ``"name"``, or without one its knobs: ``{"temperature": 0.7, "top_k": 4}`` → ``"T=0.7, top-k=4"``
    (top-k and top-p named only where they cut)."""
    if "name" in setting:
        return str(setting["name"])
    p = setting_params(setting)
    return ", ".join([f"T={p.temperature:g}"] + ([f"top-k={p.top_k}"] if p.top_k > 0 else [])
                     + ([f"top-p={p.top_p:g}"] if p.top_p < 1.0 else []))


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"linear:model"`` → ("linear", "model"); ``"autoregressive"`` → ("autoregressive", None); a confidence
    stop, ``"linear:model@0.5"``, is read by :func:`spec_confidence`."""
    method, _, drafter = spec.partition(":")
    return method, (drafter.partition("@")[0] or None)


def spec_confidence(spec: str) -> float | None:
    """θ of a spec with a confidence stop: ``"linear:model@0.5"`` → 0.5; None without one."""
    _, at, theta = spec.partition("@")
    if not at:
        return None
    try:
        return float(theta)
    except ValueError:
        raise ValueError(f"spec {spec!r}: the confidence after '@' must be a number, got {theta!r}") from None


def unavailable(pair, spec: str) -> str | None:
    """Why ``spec`` cannot run on ``pair`` (None when it can): an unknown method, no drafter named, or a
    drafter the pair lacks."""

    method, drafter = parse_spec(spec)
    if method not in METHODS:
        return f"unknown method {method!r} (sd.METHODS = {METHODS})"
    if method != "autoregressive" and drafter is None:
        return f"{spec!r} names no drafter (write method:drafter, e.g. 'linear:model')"
    if drafter is not None and drafter not in pair.drafters:
        return f"the pair {pair.name!r} has no {drafter!r} drafter (it has {sorted(pair.drafters)})"
    return None


# -- goodness of fit ---------------------------------------------------------------------------
def pool_cells(probs: np.ndarray, N: int, min_expected: float = 5.0) -> tuple[np.ndarray, bool]:
    """Bin label per cell: cells with ``N·p >= min_expected`` stay alone, the rest share bin 0
    (grown by the smallest singletons until it too reaches ``min_expected``); ``-1`` marks p = 0.
    Returns (labels, whether bin 0 is a pooled bin)."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.full(probs.shape, -1, dtype=np.int64)
    support = np.flatnonzero(probs > 0)
    order = support[np.argsort(probs[support], kind="stable")]  # ascending
    expected = N * probs[order]
    big = expected >= min_expected
    n_rare = int((~big).sum())
    if 0 < n_rare:
        while n_rare < len(order) and expected[:n_rare].sum() < min_expected:
            n_rare += 1  # the rare bin is still too small: absorb the next-smallest cell
    labels[order[:n_rare]] = 0
    labels[order[n_rare:]] = np.arange(len(order) - n_rare) + (1 if n_rare else 0)
    return labels, n_rare > 0


@dataclass
class Gof:
    statistic: float
    df: int
    pvalue: float  # Monte Carlo under the exact law (exactly calibrated); asymptotic if mc = 0
    pvalue_asymptotic: float  # scipy's χ²(df) approximation
    bins: int
    rare_mass: float  # p-mass of the pooled bin
    impossible: int  # samples in cells with p = 0 (any one rejects outright)
    N: int


def _divergence(obs: np.ndarray, exp: np.ndarray, lambda_: str) -> np.ndarray:
    """Pearson X² or G = 2 Σ o log(o / e) along the last axis (the same arithmetic for data and null)."""
    if lambda_ == "pearson":
        return ((obs - exp) ** 2 / exp).sum(-1)
    if lambda_ == "log-likelihood":
        with np.errstate(divide="ignore", invalid="ignore"):
            return 2 * np.where(obs > 0, obs * np.log(obs / exp), 0.0).sum(-1)
    raise ValueError(f"lambda_ must be 'pearson' or 'log-likelihood', got {lambda_!r}")


@functools.lru_cache(maxsize=32)
def _null(bin_probs: tuple, N: int, B: int, seed: int, lambda_: str) -> np.ndarray:
    """B statistics of multinomial(N, bin_probs) samples: the exact null distribution, simulated."""
    p = np.array(bin_probs)
    draws = np.random.default_rng(seed).multinomial(N, p, size=B)
    return np.round(_divergence(draws, N * p, lambda_), 9)


def gof_test(counts, probs, min_expected: float = 5.0, lambda_: str = "pearson", mc: int = 99999,
             seed: int = 0) -> Gof:
    """Goodness of fit of ``counts [C]`` to the exact law ``probs [C]``: Pearson's X² (or the G-test,
    ``lambda_="log-likelihood"``) over bins, cells with expected count < ``min_expected`` pooled
    (:func:`pool_cells`). A sample in a cell with p = 0 gives p-value 0.

    The p-value ranks the statistic among ``mc`` statistics simulated under the exact law (a parametric
    bootstrap), ties broken at random by a uniform drawn from ``seed``: uniform under the null at any N.
    The simulation is shared by all calls with the same law and N (cached), which shifts a rejection rate
    by at most ~sqrt(α/mc) (0.0003 at α = 0.01); independent samples should get different seeds.
    ``pvalue_asymptotic`` is scipy's χ²(df) approximation, slightly liberal when many bins have small
    expected counts. A statistic beyond all ``mc`` simulations gets ``u / (mc + 1)``, ``u`` the tie-break's uniform
    (one value per ``seed``): a p-value below ``1 / (mc + 1)`` says only that.
    """
    counts, probs = np.asarray(counts, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    N = int(counts.sum())
    labels, pooled = pool_cells(probs, N, min_expected)
    impossible = int(counts[labels < 0].sum())
    nb = int(labels.max()) + 1
    if nb < 2:
        raise ValueError(f"{N} samples leave fewer than 2 bins with expected count >= {min_expected}")
    obs = np.bincount(labels[labels >= 0], weights=counts[labels >= 0], minlength=nb)
    bin_p = np.bincount(labels[labels >= 0], weights=probs[labels >= 0], minlength=nb)
    bin_p /= bin_p.sum()
    n_ok = int(obs.sum())
    rare = float(bin_p[0]) if pooled else 0.0
    _, pv_asym = stats.power_divergence(obs, bin_p * n_ok, lambda_=lambda_)
    stat = round(float(_divergence(obs, bin_p * n_ok, lambda_)), 9)
    pv = float(pv_asym)
    if mc:
        null = _null(tuple(bin_p.tolist()), n_ok, int(mc), 0, lambda_)
        u = np.random.default_rng([int(seed), 7]).random()
        pv = float(((null > stat).sum() + u * ((null == stat).sum() + 1)) / (mc + 1))
    if impossible:
        pv = pv_asym = 0.0
    return Gof(stat, nb - 1, pv, float(pv_asym), nb, rare, impossible, N)


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values: reject test i at family-wise level α iff adjusted[i] < α."""
    p = np.asarray(pvalues, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order]).clip(max=1.0)
    out = np.empty_like(adj)
    out[order] = adj
    return out


def borderline(p: float, threshold: float, factor: float = 3.0) -> bool:
    """Whether a p-value lies within ``factor`` of its threshold, on either side (``threshold / factor <= p <=
    threshold * factor``): a pass or a rejection that another seed could have turned round."""
    return threshold / factor <= float(p) <= threshold * factor


def p_verdict(p: float, threshold: float, factor: float = 3.0, passed: str = "passes",
              rejected: str = "rejected") -> str:
    """A test's verdict with its numbers: ``'passes (p = 0.52 > 0.01)'``, ``'rejected (p = 1e-07 ≤ 0.01)'``, or,
    where :func:`borderline`, ``'borderline (p = 0.016, threshold 0.01): passes'`` instead of a flat one."""
    ok = float(p) > threshold
    word = passed if ok else rejected
    if borderline(p, threshold, factor):
        return f"borderline (p = {p:.3g}, threshold {threshold:.3g}): {word}"
    return f"{word} (p = {p:.2g} {'>' if ok else '≤'} {threshold:.3g})"


def binomial_interval(successes: int, trials: int, conf: float = 0.99) -> tuple[float, float]:
    """Clopper–Pearson interval for a proportion."""
    a = 1 - conf
    lo = stats.beta.ppf(a / 2, successes, trials - successes + 1) if successes else 0.0
    hi = stats.beta.ppf(1 - a / 2, successes + 1, trials - successes) if successes < trials else 1.0
    return float(lo), float(hi)


def acceptance_z(samples: Samples) -> float:
    """z-score of the measured acceptance against α = Σ min(p, q), for single-token drafts (k = 1):
    step i accepts with probability α_i, so Σ (accepted_i − α_i) / sqrt(Σ α_i (1 − α_i)) ≈ N(0, 1)."""
    drafted = samples.proposed > 0
    if not (samples.proposed[drafted] == 1).all() or drafted.sum() != len(samples.overlap):
        raise ValueError("acceptance_z needs linear runs with single-token drafts (k = 1)")
    a, acc = samples.overlap, samples.accepted[drafted]
    var = float((a * (1 - a)).sum())
    if var == 0:  # every step's acceptance was certain (α_i 0 or 1): it either matched them all or it did not
        gap = float((acc - a).sum())
        return 0.0 if gap == 0 else float(np.copysign(np.inf, gap))
    return float((acc - a).sum() / np.sqrt(var))


# -- equivalence and power -----------------------------------------------------------------------
@dataclass
class TVBound:
    tv_upper: float  # TV(sampled law, p) <= tv_upper with confidence `conf`
    pooled_upper: float  # bound on the pooled law (½·sqrt(χ²-divergence upper bound))
    rare_mass: float  # p-mass of the pooled bin (added: TV loses at most this by pooling)
    zero_upper: float  # upper bound on the sampled mass outside p's support
    lambda_upper: float  # upper bound on the noncentrality N·χ²(Q‖p)
    conf: float
    N: int


def _lambda_upper(x2: float, df: int, tail: float) -> float:
    """Largest noncentrality λ with P(χ²(df, λ) <= x2) >= tail."""
    if stats.chi2.cdf(x2, df) <= tail:
        return 0.0
    hi = 1.0
    while stats.ncx2.cdf(x2, df, hi) > tail:
        hi *= 2
    return float(optimize.brentq(lambda lam: stats.ncx2.cdf(x2, df, lam) - tail, 0.0, hi, xtol=1e-10))


def tv_upper_bound(counts, probs, conf: float = 0.95, min_expected: float = 5.0) -> TVBound:
    """Upper confidence bound on TV(Q, p), Q the law that produced ``counts``.

    Pearson's X² on the pooled cells is ≈ χ²(df, λ) with λ = N·χ²(Q‖p); invert it for λ_up. Cauchy–Schwarz
    gives TV ≤ ½·sqrt(χ²(Q‖p)) (equality for the least favourable Q, see :func:`least_favourable`), so
    TV_pooled ≤ ½·sqrt(λ_up / N). Pooling hides at most the pooled bin's p-mass, and mass outside p's
    support is bounded by Clopper–Pearson; the two confidence statements split 1 − conf (Bonferroni).
    """
    counts, probs = np.asarray(counts, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    g = gof_test(counts, probs, min_expected, mc=0)  # the statistic only
    N = g.N
    tail = (1 - conf) / 2
    lam = _lambda_upper(g.statistic, g.df, tail)
    pooled = 0.5 * np.sqrt(lam / (N - g.impossible))
    zero = binomial_interval(g.impossible, N, 1 - 2 * tail)[1] if (probs == 0).any() else 0.0
    return TVBound(float(pooled + g.rare_mass + zero), float(pooled), g.rare_mass, zero, lam, conf, N)


def least_favourable(probs: np.ndarray, tv: float) -> np.ndarray:
    """The law Q at TV(Q, p) = tv with the smallest χ²(Q‖p) (≈ 4·tv²): p tilted up on a half of its mass
    and down on the other, Q = p + tv·(p·1_S / p(S) − p·1_Sᶜ / p(Sᶜ)) with p(S) as close to ½ as possible."""
    probs = np.asarray(probs, dtype=np.float64)
    order = np.argsort(-probs, kind="stable")
    S = np.zeros(probs.shape, dtype=bool)
    mass = 0.0
    for i in order:  # greedy balancing: put each cell on the lighter side
        if mass + probs[i] <= 0.5 or mass == 0.0:
            S[i], mass = True, mass + probs[i]
    q = probs + tv * (np.where(S, probs / mass, 0.0) - np.where(~S, probs / (1 - mass), 0.0))
    if (q < 0).any():
        raise ValueError(f"tv = {tv} is too large for a proportional tilt of p")
    return q / q.sum()


def pooled_df(probs, N: int, min_expected: float = 5.0) -> int:
    return int(pool_cells(probs, N, min_expected)[0].max())


def power(tv: float, N: int, df: int, alpha: float) -> float:
    """Power of the level-α Pearson test with ``df`` degrees of freedom against the least favourable
    law at TV = tv (noncentrality λ = 4·tv²·N)."""
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, 4 * tv * tv * N))


def samples_needed(tv: float, probs, alpha: float, target_power: float = 0.99, min_expected: float = 5.0) -> int:
    """Smallest N (to 1%) at which the pooled test detects TV = tv with ``target_power`` (df grows with N)."""
    lo, hi = 2, 2
    while power(tv, hi, max(pooled_df(probs, hi, min_expected), 1), alpha) < target_power:
        lo, hi = hi, hi * 2
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        ok = power(tv, mid, max(pooled_df(probs, mid, min_expected), 1), alpha) >= target_power
        lo, hi = (lo, mid) if ok else (mid, hi)
    return hi


def simulate_pvalues(probs, law, N: int, reps: int, seed: int, min_expected: float = 5.0,
                     asymptotic: bool = False) -> np.ndarray:
    """p-values of :func:`gof_test` against ``probs`` for ``reps`` multinomial samples of size N from ``law``
    (Monte Carlo p-values, or scipy's asymptotic ones with ``asymptotic=True``)."""
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(N, np.asarray(law) / np.sum(law), size=reps)
    gofs = [gof_test(c, probs, min_expected, mc=0 if asymptotic else 99999, seed=seed + i) for i, c in enumerate(draws)]
    return np.array([g.pvalue for g in gofs])


# -- real targets: conditional fit and two-sample homogeneity ----------------------------------------
def conditional_counts(tokens: np.ndarray, prefix) -> np.ndarray:
    """Next tokens emitted right after ``prefix`` by the rows of ``tokens [N, m]`` that start with it."""
    j = len(prefix)
    rows = (tokens[:, :j] == np.asarray(prefix, dtype=np.int64)).all(1) if j else np.ones(len(tokens), bool)
    return tokens[rows, j]


def homogeneity_test(a: np.ndarray, b: np.ndarray, min_expected: float = 5.0, mc: int = 9999, seed: int = 0):
    """Two-sample test that continuations ``a [Na, m]`` and ``b [Nb, m]`` share one law: Pearson's χ² of
    the 2 × C table of sequence counts, with a permutation p-value (``mc`` tables drawn with the observed
    margins from ``seed``, ties broken at random): exact at any N. Sequences with expected count
    < ``min_expected`` in the smaller sample share one column (if none is that common: the most frequent
    sequence against the rest). Returns (statistic, df, p-value, columns)."""
    keys = sorted({tuple(r) for r in a} | {tuple(r) for r in b})
    if len(keys) < 2:
        raise ValueError("both samples hold one and the same sequence: nothing to compare")
    idx = {kk: i for i, kk in enumerate(keys)}
    ca = np.bincount([idx[tuple(r)] for r in a], minlength=len(keys))
    cb = np.bincount([idx[tuple(r)] for r in b], minlength=len(keys))
    tot = ca + cb
    common = tot * min(len(a), len(b)) / (len(a) + len(b)) >= min_expected
    if not common.any():
        common = tot == tot.max()
        common[np.flatnonzero(common)[1:]] = False
    cols_a, cols_t = list(ca[common]), list(tot[common])
    if (~common).any():
        cols_a.append(ca[~common].sum())
        cols_t.append(tot[~common].sum())
    cols_a, cols_t = np.array(cols_a), np.array(cols_t)
    na, n = len(a), len(a) + len(b)

    def chi2(xa):  # xa [..., C] counts of sample a per column; margins fixed
        ea = cols_t * na / n
        eb = cols_t * (n - na) / n
        return np.round(((xa - ea) ** 2 / ea + (cols_t - xa - eb) ** 2 / eb).sum(-1), 9)

    stat = float(chi2(cols_a))
    rng = np.random.default_rng([int(seed), 11])
    u = rng.random()
    null = chi2(rng.multivariate_hypergeometric(cols_t, na, size=mc))
    pv = float(((null > stat).sum() + u * ((null == stat).sum() + 1)) / (mc + 1))
    return stat, len(cols_t) - 1, pv, len(cols_t)


# -- greedy ------------------------------------------------------------------------------------
NEAR_TIE = 1e-3  # a target top-2 logit gap below this excuses a float32 greedy divergence


def excused(i, gap, tol: float = NEAR_TIE) -> bool:
    """For ``first_divergence``'s result: the outputs agree (``i is None``) or first differ where the
    target's top-2 logits are within ``tol``. A length-only difference (``gap is None``) is never excused."""
    return i is None or (gap is not None and gap < tol)


@torch.inference_mode()
def first_divergence(target, prompt, tokens: list[int], reference: list[int]):
    """(index, top-2 logit gap of the target there) of the first difference between two greedy
    outputs, or (None, None) if they agree. A float32 divergence is excused only at a near-tie."""
    i = next((i for i, (x, y) in enumerate(zip(tokens, reference)) if x != y), None)
    if i is None:
        return (None, None) if len(tokens) == len(reference) else (min(len(tokens), len(reference)), None)
    ids = torch.cat([torch.as_tensor(prompt, dtype=torch.long).view(-1), torch.tensor(reference[:i], dtype=torch.long)])
    logits = target(input_ids=ids.view(1, -1).to(next(target.parameters()).device)).logits[0, -1].double()
    top = torch.topk(logits, 2).values
    return i, float(top[0] - top[1])


# -- the checks, as the book and the tests run them ------------------------------------------------
def family_ks(spec: str, ks) -> list[int]:
    """The draft lengths :func:`gof_family` runs ``spec`` at: one for autoregressive decoding (it has none); those
    above 1 for a confidence stop (with one drafted token it has nothing to stop: its run would repeat its drafter's
    fixed-k run token for token), unless ``ks`` holds no other."""
    if parse_spec(spec)[0] == "autoregressive":
        return [ks[0]]
    if spec_confidence(spec) is not None:
        return [k for k in ks if k > 1] or list(ks)
    return list(ks)


def gof_family(pair, prompt, specs, settings, ks, N: int, n: int, seed0: int = 0, min_expected: float = 5.0,
               threads: int | None = 1, skip_unavailable: bool = True, seed_offsets: dict | None = None):
    """Sequence-level goodness of fit of every available (spec, setting, k) against the exact law (k from
    :func:`family_ks`).

    Every spec samples with seeds ``seed0 + i`` (common random numbers: two specs that draft alike emit alike),
    except those in ``seed_offsets`` (spec → offset), which sample with ``seed0 + offset + i``: a seed stream of
    their own, so that their test is independent evidence.

    Returns ``(rows, samples)``: one dict per run (spec, setting, k, N, statistic, df, pvalue, p_holm
    (Holm across all rows), impossible, tv_upper, acceptance and, for linear k = 1, acceptance_z) and
    the :class:`Samples` keyed by (spec, setting name, k). Unavailable specs raise unless skipped.
    """
    V = pair.target.config.get_text_config().vocab_size
    rows, samples = [], {}
    for setting in settings:
        params = setting_params(setting)
        law = sequence_law(pair.target, prompt, n, params)
        for spec in specs:
            why = unavailable(pair, spec)
            if why:
                if skip_unavailable:
                    continue
                raise ValueError(why)
            method, dname = parse_spec(spec)
            for k in family_ks(spec, ks):
                s = sample_sequences(pair.target, prompt, n, N, params, method, pair.drafters.get(dname), k=k,
                                     seed0=seed0 + (seed_offsets or {}).get(spec, 0), threads=threads,
                                     confidence=spec_confidence(spec))
                c = s.counts(V)
                g = gof_test(c, law, min_expected, seed=seed0 + len(rows))
                z = acceptance_z(s) if method == "linear" and k == 1 and len(s.overlap) else float("nan")
                rows.append(dict(spec=spec, setting=setting_name(setting), k=k if method != "autoregressive" else 0,
                                 N=N, statistic=g.statistic, df=g.df, pvalue=g.pvalue, impossible=g.impossible,
                                 tv_upper=tv_upper_bound(c, law, min_expected=min_expected).tv_upper,
                                 acceptance=float(s.accepted.sum() / max(s.proposed.sum(), 1)),
                                 predicted_alpha=float(s.overlap.mean()) if len(s.overlap) else float("nan"),
                                 acceptance_z=z))
                samples[(spec, setting_name(setting), k)] = s
    for r, a in zip(rows, holm([r["pvalue"] for r in rows])):
        r["p_holm"] = float(a)
    return rows, samples


def run_control(pair, prompt, name: str, N: int, n: int, k: int = 1, seed0: int = 0, min_expected: float = 5.0,
                threads: int | None = 1):
    """Run the negative control ``name`` (:data:`specdec_core.study.mutants.CONTROLS`) through ``generate`` on
    ``pair`` in the setting where its bug bites; returns (:class:`Gof` against the exact law, :class:`Samples`)."""

    c = mutants.CONTROLS[name]
    params = setting_params(c["setting"])
    drafter = pair.drafters["model"]
    if c.get("drafter") == "raw_logits_q":
        drafter = mutants.RawLogitsQ(drafter)
    V = pair.target.config.get_text_config().vocab_size
    law = sequence_law(pair.target, prompt, n, params)
    s = sample_sequences(pair.target, prompt, n, N, params, "linear", drafter, k=k, seed0=seed0, threads=threads,
                         rule=c["rule"])
    return gof_test(s.counts(V), law, min_expected, seed=seed0), s


# -- auditing any decoder ----------------------------------------------------------------------------------
EXACT_CELLS = 2 ** 16  # the audit enumerates the target's law when the continuations have at most this many cells


def _knobs(setting: dict) -> dict:
    """A setting's sampling knobs as :func:`~specdec_core.generate` takes them (temperature, top_k, top_p)."""
    p = setting_params(setting)
    return dict(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p)


def _verdicts(table, alpha: float, against: dict | None):
    """Holm over the table's rows; each row's ``power`` against the known mutants of its setting (``against``: setting
    → divergence, or setting → {mutant: divergence}) at Holm's strictest level, α / rows: the smallest, with the
    mutant it is against (``against``, ``against_divergence``); ``passed`` = ``p_holm >= alpha`` (not rejected); and
    ``verdict`` (:func:`audit_verdict`): "pass" only with power at least 0.5, else "no verdict (power …)".
    A two-sample row (a real pair) has noncentrality (n / 2) · divergence, its divergence taken against the pooled
    law (:func:`audit`)."""
    table["p_holm"] = holm(table.p)
    level, nan = alpha / len(table), float("nan")
    found = []
    for r in table.itertuples():
        known = (against or {}).get(r.setting)
        known = known if isinstance(known, dict) else {} if known is None else {"weakest known": known}
        n_eff = r.n if r.reference == "exact law" else r.n / 2
        found.append(min(((power_against(d, n_eff, r.df, level), m, d) for m, d in known.items() if d == d),
                         default=(nan, "", nan)))
    table["power"] = [f[0] for f in found]
    table["against"] = [f[1] for f in found]
    table["against_divergence"] = [f[2] for f in found]
    table["passed"] = table.p_holm >= alpha
    table["verdict"] = audit_verdicts(table)
    return table


POWER_MIN = 0.5  # below this power against the weakest known mutant, a row that is not rejected has no verdict


def audit_verdict(passed: bool, power: float) -> str:
    """A row's word: ``"FAIL"`` where the test rejected; ``"pass"`` only where it did not and had power at least
    :data:`POWER_MIN` against the weakest known mutant of its setting; else ``"no verdict (power 0.008)"``: a test
    that could not have failed says nothing by not failing."""
    if not passed:
        return "FAIL"
    if power == power and power >= POWER_MIN:
        return "pass"
    return f"no verdict (power {power:.2g})" if power == power else "no verdict (power not known)"


def audit_verdicts(table) -> list[str]:
    """:func:`audit_verdict` of every row of an audit table (columns ``passed``, ``power``): call it again after
    changing a row's power."""
    return [audit_verdict(bool(r.passed), float(r.power)) for r in table.itertuples()]


def audit_counts(table) -> str:
    """``'4 of 18 rows pass, 14 have no verdict (power below 0.5), 0 fail'``: an audit table's rows by verdict."""
    v = table.verdict.astype(str)
    n_pass, n_fail = int((v == "pass").sum()), int((v == "FAIL").sum())
    return (f"{n_pass} of {len(v)} rows pass, {len(v) - n_pass - n_fail} have no verdict (power below {POWER_MIN:g}), "
            f"{n_fail} fail")


def _continuations(runner, ids: torch.Tensor, setting: dict, n: int, length: int, seed: int, name: str) -> np.ndarray:
    """``n`` continuations ``[n, length]`` from ``runner(ids, setting, seed + i)`` (a decoder that returns fewer than
    ``length`` tokens, or anything but token ids, is refused by name)."""
    rows = []
    for i in range(n):
        toks = list(runner(ids.clone(), dict(setting), seed + i))
        if len(toks) < length:
            raise ValueError(f"{name}: returned {len(toks)} token(s) for seed {seed + i} with setting {setting}, the "
                             f"audit reads the first {length} (an EOS too early? use another prompt or a shorter length)")
        bad = [t for t in toks[:length] if isinstance(t, bool) or not isinstance(t, (int, np.integer))]
        if bad:
            raise ValueError(f"{name}: returned {bad[0]!r}, not a token id (a runner returns a list of ints)")
        rows.append([int(t) for t in toks[:length]])
    return np.array(rows, dtype=np.int64)


def chi2_divergence(counts, probs, min_expected: float = 5.0, bins_n: int | None = None) -> float:
    """χ²(Q‖p) of the law Q that produced ``counts``, on the bins the goodness-of-fit test uses (:func:`pool_cells`),
    estimated without bias: Σ (f − e)² / e − (bins − 1) / N, at least 0 (mass outside p's support counts in full).
    ``bins_n``: pool the cells as a test of ``bins_n`` samples would (default: the N of ``counts``), for the power of
    a test of another size against the law that produced ``counts``."""
    counts, probs = np.asarray(counts, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    N = int(counts.sum())
    labels, _ = pool_cells(probs, bins_n or N, min_expected)
    keep = labels >= 0
    f = np.bincount(labels[keep], weights=counts[keep], minlength=int(labels.max()) + 1) / N
    e = np.bincount(labels[keep], weights=probs[keep], minlength=int(labels.max()) + 1)
    return max(float(((f - e) ** 2 / e).sum() - (len(e) - 1) / N), 0.0) + float(counts[~keep].sum()) / N


def audit(runner, pair, prompts, settings, n: int, length: int = 2, seed: int = 0, alpha: float = 0.01,
          min_expected: float = 5.0, name: str = "runner", against: dict | None = None,
          references: dict | None = None) -> "pd.DataFrame":
    """Does ``runner`` sample the target's law? One row per prompt × setting, with Holm's correction across the rows.

    ``runner(ids, setting, seed) -> list[int]``: any decoder; ``ids`` a 1-D LongTensor (the prompt), ``setting`` a dict
    such as ``{"name": "T=0.7, top-k=50", "temperature": 0.7, "top_k": 50}`` (without a name, :func:`setting_name`
    names it from its knobs), ``seed`` distinct per continuation
    (``seed``, ``seed + 1``, …); it returns the tokens it committed, of which the first ``length`` are read. ``pair``:
    its target's law is the reference. Where the continuations have at most :data:`EXACT_CELLS` cells (a toy pair)
    the law is enumerated exactly (:func:`sequence_law`) and tested by :func:`gof_test`, with an upper bound on TV
    (:func:`tv_upper_bound`) and the sampled law's χ²-divergence (:func:`chi2_divergence`); otherwise the reference is
    ``n`` of the target's own continuations (``sd.generate``, autoregressive, seeds from ``seed + 10**7``) and the test
    is :func:`homogeneity_test` (a permutation p-value, exact at any n).

    ``against``: setting name → the χ²-divergence of the weakest known lossy mutant in that setting (:func:`weakest`
    of a mutants' audit): ``power`` is then the probability that this test, at this n and at Holm's strictest level
    (α / rows), rejects that mutant; NaN without it, and on a real pair. ``passed``: ``p_holm >= alpha``.
    ``references``: a dict that keeps the real pair's reference samples between calls (:func:`audit_family` shares
    one across its runners: every runner is compared with the same continuations of the target).
    The verdict rule: the family passes when every row passes; a correct decoder fails it with probability at most
    α (Holm controls the family-wise error; :func:`calibrate_audit` checks it by simulation).
    """
    import pandas as pd

    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (continuations per prompt and setting), got {n!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not callable(runner):
        raise ValueError(f"runner must be a callable (ids, setting, seed) -> list[int], got {type(runner).__name__}")
    V = pair.target.config.get_text_config().vocab_size
    exact = V ** length <= EXACT_CELLS
    refs = {} if references is None else references
    rows = []
    for j, prompt in enumerate(prompts):
        ids = torch.as_tensor(prompt, dtype=torch.long).view(-1)
        for setting in settings:
            params = setting_params(setting)
            toks = _continuations(runner, ids, setting, n, length, seed, name)
            row = dict(runner=name, prompt=j, setting=setting_name(setting), n=n, length=length)
            if exact:
                law = sequence_law(pair.target, ids, length, params)
                counts = np.bincount(cell_index(toks, V), minlength=V ** length)
                g = gof_test(counts, law, min_expected, seed=seed + len(rows))
                row.update(reference="exact law", statistic=g.statistic, df=g.df, p=g.pvalue, impossible=g.impossible,
                           tv_upper=tv_upper_bound(counts, law, min_expected=min_expected).tv_upper,
                           divergence=chi2_divergence(counts, law, min_expected))
            else:
                key = (tuple(ids.tolist()), setting_name(setting), n, length, seed)
                if key not in refs:
                    refs[key] = sample_sequences(pair.target, ids, length, n, params, seed0=seed + 10 ** 7).tokens
                ref = refs[key]
                stat, df, pv, _ = homogeneity_test(toks, ref, min_expected, seed=seed + len(rows))
                row.update(reference=f"target's own continuations (n = {n})", statistic=stat, df=df, p=pv,
                           impossible=0, tv_upper=float("nan"), divergence=max(stat - df, 0.0) * 2 / n)
            rows.append(row)
    return _verdicts(pd.DataFrame(rows), alpha, against)


def power_against(divergence: float | None, n: int, df: int, level: float, impossible_rate: float = 0.0) -> float:
    """Power of the level-``level`` Pearson test (``df``) against a law at χ²-divergence ``divergence`` from p, with
    ``n`` samples: the noncentral χ² with λ = n · divergence (NaN without a divergence). ``impossible_rate``: the
    law's mass outside p's support, where one sample rejects outright: power 1 − (1 − P_χ²)(1 − rate)^n."""
    if divergence is None or divergence != divergence:
        return float("nan")
    p = float(stats.ncx2.sf(stats.chi2.isf(level, df), df, n * divergence)) if divergence > 0 else level
    return 1 - (1 - p) * (1 - impossible_rate) ** n


def samples_for_power(divergence: float, df: int, level: float, target: float = 0.8,
                      impossible_rate: float = 0.0, most: int = 10 ** 8) -> int | None:
    """Smallest n (to 1%) at which :func:`power_against` reaches ``target`` with these ``df`` and divergence (the
    bins of the run that measured it; finer bins at a larger n see at least that divergence); None if not by
    ``most`` or without a divergence."""
    if divergence is None or divergence != divergence or (divergence <= 0 and impossible_rate <= 0):
        return None

    def ok(n):
        return power_against(divergence, n, df, level, impossible_rate) >= target
    lo, hi = 1, 2
    while not ok(hi):
        if hi > most:
            return None
        lo, hi = hi, hi * 2
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def power_phrase(power: float, mutant: str, divergence: float, n: int, level: float | None = None) -> str:
    """A pass said with what it could see: ``'no rejection; power 0.84 against mutant no_bonus (divergence 0.047) at
    n = 1000'`` (and the level, when given). The only form in which the book states that a test did not reject."""
    at = f" at n = {n}" + (f", level {level:.2g}" if level is not None else "")
    return f"no rejection; power {power:.2f} against mutant {mutant} (divergence {divergence:.3g}){at}"


def audit_family(runners: dict, pair, prompts, settings, n: int, length: int = 2, seed: int = 0, alpha: float = 0.01,
                 min_expected: float = 5.0, against: dict | None = None, progress=None,
                 references: dict | None = None) -> "pd.DataFrame":
    """:func:`audit` of several runners (name → runner), with Holm's correction over *all* their rows: the family
    passes when every row does, and a family of correct decoders fails with probability at most ``alpha``.
    ``references``: as :func:`audit`'s, shared with another family (a mutants' one) on the same real pair."""
    import pandas as pd

    names, refs = list(runners), ({} if references is None else references)
    it = progress(names, desc="audit") if progress else names
    table = pd.concat([audit(runners[m], pair, prompts, settings, n, length, seed, alpha, min_expected, m, against,
                             refs) for m in it], ignore_index=True)
    return _verdicts(table, alpha, against)  # Holm again, now over every runner's rows


def weakest(mutant_table) -> dict:
    """Setting name → the smallest χ²-divergence among the rows of a mutants' audit table (pass only the rows where
    each mutant must be caught, :func:`lossy_settings`): what :func:`audit`'s ``against`` takes."""
    return mutant_table.groupby("setting").divergence.min().to_dict()


def divergences(mutant_table) -> dict:
    """Setting name → {mutant: its measured divergence} from a mutants' audit table (pass the rows where each mutant
    is lossy, :func:`harmless_settings` left out): :func:`audit`'s ``against``, so that each row's power is stated
    against every mutant of its setting, the weakest named."""
    return {s: dict(zip(g.runner, g.divergence)) for s, g in mutant_table.groupby("setting", sort=False)}


def calibrate_audit(pair, prompts, settings, n: int, rows_per_setting: int, length: int = 2, reps: int = 1000,
                    alpha: float = 0.01, min_expected: float = 5.0, seed: int = 0) -> dict:
    """The family's false-positive rate by simulation: ``reps`` times, every row of a family of correct decoders
    (``rows_per_setting`` runners for each prompt × setting) gets a multinomial sample of size ``n`` from the exact
    law, tested as :func:`audit` tests it; Holm across the family. Returns the rejection rate of the family, its 95%
    Clopper–Pearson interval, the rows and ``alpha``: the rate must not exceed α beyond its interval."""
    V = pair.target.config.get_text_config().vocab_size
    if V ** length > EXACT_CELLS:
        raise ValueError(f"calibration needs an enumerable law: {V}**{length} cells exceed {EXACT_CELLS}")
    laws = [sequence_law(pair.target, torch.as_tensor(pr, dtype=torch.long), length, setting_params(s))
            for pr in prompts for s in settings]
    rng = np.random.default_rng([int(seed), 13])
    rejected = 0
    for r in range(reps):
        ps = [gof_test(rng.multinomial(n, law / law.sum()), law, min_expected, seed=seed + 10 ** 6 + r * 1000 + i).pvalue
              for i, law in enumerate(laws) for _ in range(rows_per_setting)]
        rejected += bool((holm(ps) < alpha).any())
    lo, hi = binomial_interval(rejected, reps, 0.95)
    return dict(reps=reps, rows=len(laws) * rows_per_setting, rejected=rejected, rate=rejected / reps, lo95=lo,
                hi95=hi, alpha=alpha)


def reported_law_gap(drafter, model, context: list[int], k: int, params: SamplingParams, seed: int = 0) -> float:
    """The largest gap between the law a model drafter reports for its draft (q) and the law its ``model`` gives
    on the same tokens, recomputed pass by pass on a fresh cache (the library's path, as the drafter runs it): 0.0
    when q is exactly the law it sampled from, however the logits were computed (a fast path, a rounded head).
    A sampled draft's q is exact only if this is 0: a gap of 10⁻³ in probability is beyond any sample's power
    (:class:`~specdec_core.study.mutants.FullPrecisionHeadQ`)."""
    if params.greedy:
        raise ValueError("a greedy draft reports no law (q is None): give a temperature > 0")
    drafter.reset(torch.tensor(context), len(context) + k + 1)
    draft = drafter.propose(list(context), k, params, torch.Generator().manual_seed(seed))
    lm = CachedLM(model, len(context) + k + 1)
    feed = torch.tensor(context)
    gap = 0.0
    for i, t in enumerate(draft.tokens.tolist()):
        law = process_logits(lm.forward(feed, logits_to_keep=1)[-1], params)
        gap = max(gap, float((law.to(draft.q.dtype) - draft.q[i]).abs().max()))
        feed = torch.tensor([t])
    return gap


def library_runner(pair, spec: str, length: int, k: int = 2):
    """This library's decoder ``spec`` (``"linear:model"``, ``"tree:ngram"``, ``"autoregressive"``, …) as an
    :func:`audit` runner decoding ``length`` tokens with draft length / depth ``k``."""
    why = unavailable(pair, spec)
    if why:
        raise ValueError(why)
    method, dname = parse_spec(spec)
    drafter, conf = pair.drafters.get(dname), spec_confidence(spec)

    def run(ids, setting, seed):
        return generate(pair.target, ids, drafter=drafter, method=method, k=k, max_new_tokens=length, seed=seed,
                        confidence=conf, **_knobs(setting)).tokens
    return run


def example_runner(pair, length: int):
    """scripts/audit_decoder.py's example of a runner factory: this library's linear decoder with the pair's draft."""
    return library_runner(pair, "linear:model", length)


def counting_runner(runner, model, log: list):
    """``runner``, a Hugging Face decoder of ``model`` (transformers' ``generate``, assisted or prompt lookup), with
    the positions each of its forward calls feeds ``model`` counted: each continuation appends (prompt length, tokens
    returned, calls, positions fed) to ``log``, which :func:`drafted_share` reads."""

    def run(ids, setting, seed):
        fed = []

        def hook(module, args, kwargs):
            x = kwargs.get("input_ids", args[0] if args else None)
            x = kwargs.get("inputs_embeds") if x is None else x
            fed.append(int(x.shape[1]))
        handle = model.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            toks = list(runner(ids, setting, seed))
        finally:
            handle.remove()
        log.append((int(ids.numel()), len(toks), len(fed), sum(fed)))
        return toks
    return run


def drafted_share(log) -> dict:
    """What a :func:`counting_runner`'s ``log`` says the decoder speculated: a call feeds the prompt (the first) or the
    last token (the others), plus the tokens it verifies, so drafted = fed − prompt − (calls − 1); every call emits
    its accepted drafts and one token of the target's, so accepted = tokens − calls. Returns the continuations, the
    share with a draft, drafted and accepted tokens per token emitted."""
    a = np.array(log, dtype=np.int64).reshape(-1, 4)
    prompt, toks, calls, fed = a.T
    drafted = fed - prompt - (calls - 1)
    return dict(continuations=len(a), with_draft=float((drafted > 0).mean()) if len(a) else float("nan"),
                drafted=float(drafted.sum() / max(toks.sum(), 1)), accepted=float((toks - calls).sum() / max(toks.sum(), 1)))


# Lossy samplers the audit must reject, as runners (:func:`mutant_runner`), by name → the bug;
# :func:`lossy_settings` says where each must be caught.
AUDIT_MUTANTS = {
    "draft only (no verification)": "emits the draft's own samples: lossy wherever q ≠ p",
    "residual from p": "at a rejection samples p, not norm(max(0, p − q))",
    "q from raw logits": "samples the processed draft law, reports q from raw logits: lossy where processing changes it",
    "accept with p(x)": "accepts a draft token with probability p(x), not min(1, p/q)",
}


def mutant_runner(pair, name: str, length: int, k: int = 2):
    """The lossy sampler ``name`` of :data:`AUDIT_MUTANTS` as an :func:`audit` runner on ``pair`` (a pair whose
    ``"model"`` drafter wraps a Hugging Face causal LM: the toy pairs)."""

    if name not in AUDIT_MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; choose one of {sorted(AUDIT_MUTANTS)}")
    draft = pair.drafters["model"]
    rule, drafter = speculative_sample, draft
    if name == "draft only (no verification)":
        def run(ids, setting, seed):
            return generate(draft.model, ids, max_new_tokens=length, seed=seed, **_knobs(setting)).tokens
        return run
    if name == "residual from p":
        rule = mutants.residual_from_p
    elif name == "accept with p(x)":
        rule = mutants.accept_with_p
    else:
        drafter = mutants.RawLogitsQ(draft)

    def run(ids, setting, seed):
        return generate(pair.target, ids, drafter=drafter, method="linear", k=k, max_new_tokens=length, seed=seed,
                        rule=rule, **_knobs(setting)).tokens
    return run


def lossy_settings(name: str, settings) -> list[str]:
    """The settings (names) in which the audit must catch mutant ``name``: raw-logits q where a temperature other
    than 1 rescales the whole draft law; the others everywhere. (Under top-k or top-p alone raw-logits q is lossy
    too, but only through the truncated tail's mass: a divergence too small to promise a catch at the book's sizes,
    so those rows are not required to fail; they stay in the table with the power the test had against them, and
    in the power figure of the decoders: :func:`harmless_settings` names only where a mutant is exact.)"""
    if name != "q from raw logits":
        return [setting_name(s) for s in settings]
    return [setting_name(s) for s in settings if setting_params(s).temperature != 1.0]


def harmless_settings(name: str, settings) -> list[str]:
    """The settings (names) in which mutant ``name`` samples p exactly, so that no test can catch it: raw-logits q at
    temperature 1 without top-k or top-p (processing leaves the draft law as it is); none for the others."""
    if name != "q from raw logits":
        return []
    plain = [setting_params(s) for s in settings]
    return [setting_name(s) for s, p in zip(settings, plain) if p.temperature == 1.0 and p.top_k <= 0 and p.top_p >= 1.0]
