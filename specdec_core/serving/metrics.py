"""Load and its measures, with the definitions of vLLM's serving benchmark (``vllm bench serve``).

- :func:`arrivals`: request arrival times of a Poisson process (``burstiness`` 1) or of a gamma process with the same
  mean rate (shape ``burstiness``, scale ``1 / (rate · burstiness)``: below 1 burstier, above 1 steadier), as vLLM
  draws its inter-arrival gaps; seeded, so every policy replays the same schedule.
- :func:`request_metrics`: one request's latencies from ``stats.token_times`` (seconds since its *arrival*, as the
  engine stamps them): TTFT (the first token: queueing and prefill included), E2E (the last token), TPOT
  = (E2E − TTFT) / (tokens − 1), and the per-token ITL: a step that commits n tokens shares its gap among them
  (n gaps of gap / n), so a speculative step's burst is not counted as one slow gap and n − 1 free ones (the
  per-chunk ITL that SGLang and vLLM corrected for speculative decoding).
- :func:`summarize`: a run's percentiles (p50, p90, p99) of each, throughput (output tokens per second of the run)
  and goodput (requests per second that met every stated SLO), over all requests or one class.
"""
from __future__ import annotations

import math

import numpy as np

PERCENTILES = (50, 90, 99)


def arrivals(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """``n`` arrival times in seconds (the first after one gap; ``rate`` = inf: all at 0), ``rate`` requests per
    second on average."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
        raise ValueError(f"rate must be a number of requests per second > 0 (inf: all at once), got {rate!r}")
    if not isinstance(burstiness, (int, float)) or isinstance(burstiness, bool) or not 0 < burstiness < math.inf:
        raise ValueError(f"burstiness must be a finite number > 0 (1: Poisson), got {burstiness!r}")
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps).tolist()


def per_token_gaps(token_times) -> np.ndarray:
    """Seconds per token: the first token's time (TTFT), then each step's gap shared among the tokens it committed
    (tokens of one step share a time). Chapter 6's per-token latency is this in ms."""
    t = np.asarray(token_times, dtype=float)
    if t.size == 0:
        return t
    times, counts = np.unique(t, return_counts=True)
    gaps = np.diff(np.concatenate([[0.0], times]))
    return np.repeat(gaps / counts, counts)


def request_metrics(token_times: list[float]) -> dict:
    """``ttft``, ``e2e``, ``tpot`` (NaN for one token) and ``itl`` (one entry per token after the first) of one
    request, from its token times (seconds since its arrival; tokens of one step share a time)."""
    if not len(token_times):
        raise ValueError("a request without tokens has no latencies")
    t = token_times
    tpot = (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else float("nan")
    return dict(ttft=t[0], e2e=t[-1], tpot=tpot, itl=per_token_gaps(t)[1:].tolist(), tokens=len(t))


def meets(metrics: dict, slo: dict) -> bool:
    """Whether one request's :func:`request_metrics` meet every limit of ``slo`` (a NaN measure meets any)."""
    return all(metrics[key] <= limit for key, limit in slo.items() if not math.isnan(metrics[key]))


def _pcts(values) -> dict:
    v = [x for x in values if not math.isnan(x)]
    return {p: (float(np.percentile(v, p)) if v else float("nan")) for p in PERCENTILES}


def summarize_metrics(per: list[dict], requests: int, duration_s: float, slo: dict | None = None) -> dict:
    """The measures of ``requests`` requests over ``duration_s`` seconds, ``per`` holding the
    :func:`request_metrics` of those that finished (see :func:`summarize`)."""
    slo = dict(slo or {})
    unknown = set(slo) - {"ttft", "tpot", "e2e"}
    if unknown:
        raise ValueError(f"slo limits are on 'ttft', 'tpot' and 'e2e'; got {sorted(unknown)}")
    rate = (lambda n: n / duration_s) if duration_s else (lambda n: float("nan"))  # noqa: E731
    return dict(requests=requests, failed=requests - len(per), duration_s=duration_s,
                throughput=rate(sum(m["tokens"] for m in per)), request_rate=rate(len(per)),
                goodput=rate(sum(meets(m, slo) for m in per)) if slo else None,
                ttft=_pcts(m["ttft"] for m in per), tpot=_pcts(m["tpot"] for m in per),
                itl=_pcts(x for m in per for x in m["itl"]), e2e=_pcts(m["e2e"] for m in per))


def summarize(results, duration_s: float | None = None, slo: dict | None = None, classes=None) -> dict:
    """The run's measures. ``results``: the engine's results (each with ``stats.token_times`` since its arrival,
    ``arrival_s`` and ``error``); ``duration_s``: the run's wall time (default: the last token's time since the run
    began); ``slo``: limits in seconds on ``ttft``, ``tpot`` and ``e2e`` (any of them) for goodput; ``classes``:
    one label per result, to summarize each class apart (``by_class``). Failed requests count in ``failed`` and in
    nothing else. Returns ``requests``, ``failed``, ``throughput`` (tokens/s), ``request_rate`` (finished/s),
    ``goodput`` (requests/s meeting every SLO; None without one) and ``ttft``/``tpot``/``itl``/``e2e`` each as
    ``{50: …, 90: …, 99: …}``, in seconds."""
    results = list(results)
    if classes is not None and len(classes) != len(results):
        raise ValueError(f"classes needs one label per result: {len(classes)} for {len(results)}")
    ok = [r for r in results if r.error is None and r.stats.token_times]
    per = [request_metrics(r.stats.token_times) for r in ok]
    if duration_s is None:
        duration_s = max((r.arrival_s + m["e2e"] for r, m in zip(ok, per)), default=0.0)
    out = summarize_metrics(per, len(results), duration_s, slo)
    if classes is not None:
        out["by_class"] = {c: summarize([r for r, k in zip(results, classes) if k == c], duration_s, slo)
                           for c in dict.fromkeys(classes)}
    return out
