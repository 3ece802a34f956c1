"""The book's evaluation protocol: what counts as one piece of evidence, and how a verdict is reached.

Every chapter that compares two ways of decoding goes through this module, so that one rule holds everywhere.

- **Units.** The unit of evidence is a distinct prompt (or a distinct request). Repeats of one prompt are
  summarised within the prompt first (:func:`by_unit`), or resampled together as one cluster
  (:func:`cluster_bootstrap`). A prompt timed 40 times is still one prompt.
- **Test.** A verdict comes from the exact two-sided Wilcoxon signed-rank test over the units' log ratios
  (:func:`wilcoxon_p`): "faster" or "slower" only when the test rejects "no difference" at a family-wise
  false-positive rate of :data:`ALPHA`, with Holm's correction over the comparisons of one table (:func:`holm`).
- **Power.** Where the test would find a change of :data:`EFFECT` (10 %) less than half the time at this size and
  spread (:func:`power`), the verdict is "cannot tell at this size", with the number of prompts that would tell
  (:func:`n_to_tell`). "ties" means the test had that power and found no change.
- **Splits and sizes** are the chapters' part: every choice on training prompts, evaluated once; sample sizes in
  the params files, fixed before the run.

    s = protocol.summarise(ratios, units=prompt_ids)    # median, IQR, n (distinct units), p, power, n_tell
    protocol.decide(s["median"], p_adjusted, s["power"], s["n_tell"])   # 'faster' | 'slower' | 'ties' | 'cannot ...'
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

ALPHA = 0.05  # the family-wise false-positive rate of a table's verdicts (two-sided)
EFFECT = 1.10  # the change in speed a verdict must be able to see: 10 %, the smallest a reader would act on
POWER_MIN = 0.5  # below this power against EFFECT, the verdict is "cannot tell at this size"
SIMULATIONS = 2000  # Monte Carlo samples behind each power estimate (fixed seed: the same data, the same power)
CANNOT_TELL = "cannot tell at this size"
TEST_NAME = "exact two-sided Wilcoxon signed-rank test over distinct prompts"


def by_unit(values, units=None) -> np.ndarray:
    """One value per distinct unit: the median of each unit's values (its repeats), in order of first appearance.
    Without ``units``, every value is its own unit."""
    v = np.asarray(list(values), dtype=float)
    if units is None:
        return v
    u = np.asarray(list(units), dtype=object)
    if u.shape != v.shape:
        raise ValueError(f"by_unit: {v.size} values but {u.size} unit labels")
    order = list(dict.fromkeys(u.tolist()))
    return np.array([np.median(v[u == k]) for k in order], dtype=float)


@lru_cache(maxsize=None)
def _null_counts(doubled_ranks: tuple[int, ...]) -> np.ndarray:
    """How many of the 2^n sign patterns give each value of 2·W+ (W+: the sum of the positive ranks)."""
    counts = np.zeros(sum(doubled_ranks) + 1)
    counts[0] = 1.0
    for r in doubled_ranks:
        counts[r:] = counts[r:] + counts[:-r].copy() if r else counts * 2
    return counts


def _ranks(a: np.ndarray) -> np.ndarray:
    """Ranks of ``a`` from 1, ties given their mean rank."""
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(a.size)
    ranks[order] = np.arange(1, a.size + 1)
    for v in np.unique(a):
        tied = a == v
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def wilcoxon_p(ratios) -> float:
    """The exact two-sided p-value of the Wilcoxon signed-rank test of ``log(ratios)`` against 0 (no change).

    Exact for any n, ties included (mean ranks, enumerated by counting); a ratio of exactly 1 carries no sign and
    is dropped (Wilcoxon's convention). With fewer than one non-zero unit the p-value is 1."""
    r = np.asarray(list(ratios), dtype=float)
    if not (r > 0).all():
        raise ValueError("wilcoxon_p: a ratio is NaN or not positive")
    x = np.log(r)
    x = x[x != 0]
    if x.size == 0:
        return 1.0
    doubled = np.rint(2 * _ranks(np.abs(x))).astype(int)
    counts = _null_counts(tuple(sorted(doubled.tolist())))
    w = int(doubled[x > 0].sum())
    total = counts.sum()
    lower, upper = counts[: w + 1].sum() / total, counts[w:].sum() / total
    return float(min(1.0, 2 * min(lower, upper)))


def spread(log_ratios) -> float:
    """A robust standard deviation of the units' log ratios: 1.4826 × their median absolute deviation (the
    standard deviation where they are normal), or their standard deviation where half of them are equal."""
    x = np.asarray(log_ratios, dtype=float)
    if x.size < 2:
        return math.nan
    mad = 1.4826 * np.median(np.abs(x - np.median(x)))
    return float(mad if mad > 0 else x.std(ddof=1))


@lru_cache(maxsize=None)
def _critical_p(n: int) -> np.ndarray:
    """The exact two-sided p-value of every W+ from 0 to n(n+1)/2 for n untied, non-zero units."""
    counts = _null_counts(tuple(2 * r for r in range(1, n + 1)))[::2]
    total = counts.sum()
    low, high = np.cumsum(counts) / total, np.cumsum(counts[::-1])[::-1] / total
    return np.minimum(1.0, 2 * np.minimum(low, high))


def power(n: int, sigma: float, effect: float = EFFECT, alpha: float = ALPHA, seed: int = 0,
          simulations: int = SIMULATIONS) -> float:
    """How often the test rejects at level ``alpha`` when every unit's log ratio is normal around
    ``log(effect)`` with standard deviation ``sigma`` (Monte Carlo, fixed seed). 0 where no outcome of n units
    can reach ``alpha`` (n = 5: the smallest two-sided p is 1/16)."""
    if n < 1 or not np.isfinite(sigma):
        return 0.0
    p_of = _critical_p(n)
    if p_of.min() > alpha:
        return 0.0
    if sigma == 0:
        return 1.0
    x = np.random.default_rng(seed).normal(math.log(effect), sigma, size=(simulations, n))
    ranks = np.argsort(np.argsort(np.abs(x), axis=1), axis=1) + 1
    w = (ranks * (x > 0)).sum(axis=1)
    return float((p_of[w] <= alpha).mean())


def n_to_tell(sigma: float, effect: float = EFFECT, alpha: float = ALPHA) -> int:
    """About how many units the test needs to see ``effect`` half the time at this spread: from the normal
    approximation n = (z · σ / log effect)² ÷ (3/π) (the signed-rank test's efficiency) and the smallest n whose
    best outcome reaches ``alpha``, the first n at which :func:`power` reaches :data:`POWER_MIN` (searched up to
    60 units; beyond, the approximation alone)."""
    from statistics import NormalDist

    smallest = next(n for n in range(1, 64) if 2 / 2 ** n <= alpha)
    if not np.isfinite(sigma):
        return smallest
    z = NormalDist().inv_cdf(1 - alpha / 2)
    n = max(smallest, math.ceil((z * sigma / math.log(effect)) ** 2 * math.pi / 3))
    while n <= 60 and power(n, sigma, effect, alpha) < POWER_MIN:
        n += 1
    return n


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment: reject where the adjusted p-value is at most the family's level. It keeps the
    family-wise false-positive rate at that level for any dependence between the tests."""
    p = np.asarray(list(pvalues), dtype=float)
    out = np.full(p.size, np.nan)
    ok = ~np.isnan(p)
    q = p[ok]
    order = np.argsort(q)
    adj = np.maximum.accumulate((q.size - np.arange(q.size)) * q[order])
    res = np.empty(q.size)
    res[order] = np.minimum(1.0, adj)
    out[ok] = res
    return out


def summarise(ratios, units=None, family: int = 1, effect: float = EFFECT, alpha: float = ALPHA) -> dict:
    """A paired comparison summarised over distinct units: ``median``, ``q25``, ``q75``, ``n`` (units), ``p``
    (:func:`wilcoxon_p`), ``sigma`` (:func:`spread` of the units' log ratios), ``power`` against ``effect`` at level ``alpha / family`` (Holm's first step: the
    strictest a member of a family of ``family`` comparisons may face) and ``n_tell`` (:func:`n_to_tell`)."""
    r = by_unit(ratios, units)
    if r.size == 0:
        return dict(median=math.nan, q25=math.nan, q75=math.nan, n=0, p=math.nan, sigma=math.nan, power=0.0,
                    n_tell=0)
    q25, med, q75 = np.percentile(r, [25, 50, 75])
    sigma = spread(np.log(r))
    level = alpha / max(1, family)
    return dict(median=float(med), q25=float(q25), q75=float(q75), n=int(r.size), p=wilcoxon_p(r), sigma=sigma,
                power=power(r.size, sigma, effect, level), n_tell=n_to_tell(sigma, effect, level))


def decide(median: float, p_adjusted: float, power_: float, n_tell: int | None = None, alpha: float = ALPHA,
           better: str = "faster", worse: str = "slower") -> str:
    """The verdict: ``better`` or ``worse`` where the (Holm-adjusted) test rejects at ``alpha``; else ``"ties"``
    where the test had power ``POWER_MIN`` against the effect of interest; else :data:`CANNOT_TELL`, naming the
    number of units that would tell."""
    if p_adjusted != p_adjusted or median != median:
        return "not measured"
    if p_adjusted <= alpha and median != 1:
        return better if median > 1 else worse
    if power_ >= POWER_MIN:
        return "ties"
    return CANNOT_TELL + (f" (about {int(n_tell)} prompts would tell)" if n_tell else "")


def cluster_resamples(clusters, resamples: int = 2000, seed: int = 0):
    """Row indices of ``resamples`` bootstrap draws that resample whole clusters (a request with all its replays, a
    prompt with all its repeats), one array a draw: the rows of each drawn cluster, clusters in order of first
    appearance. Every interval over clusters in the book draws through here."""
    c = np.asarray(list(clusters), dtype=object)
    members = [np.flatnonzero(c == k) for k in dict.fromkeys(c.tolist())]
    rng = np.random.default_rng(seed)
    for _ in range(resamples):
        yield np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])


def interval(draws, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap draws, some of which may be infinite (a ratio whose
    denominator was 0 in a draw): between two infinite draws the quantile is infinite, where interpolation would
    give inf − inf = NaN."""
    with np.errstate(invalid="ignore"):
        q = np.quantile(np.asarray(draws, dtype=float), [(1 - level) / 2, (1 + level) / 2])
    lo, hi = (np.inf if np.isnan(x) else float(x) for x in q)
    return lo, hi


def cluster_bootstrap(values, clusters, stat=np.median, resamples: int = 2000, level: float = 0.95,
                      seed: int = 0) -> tuple[float, float]:
    """A percentile interval for ``stat(values)`` that resamples whole clusters (:func:`cluster_resamples`): the
    interval measures how units differ, not how replays of one unit do. ``values`` may be 2-D (one row per value,
    ``stat`` a function of the drawn rows, for a paired statistic)."""
    v = np.asarray(values, dtype=float)
    return interval([stat(v[rows]) for rows in cluster_resamples(clusters, resamples, seed)], level)
