"""Serving under load: the same requests and arrival schedules replayed through the engine for every policy.

- A *policy* says how each request is decoded: a function from the request's class (``"chat"``, ``"grounded"``)
  to :meth:`~specdec_core.serving.Engine.submit` keyword arguments (``method``, ``drafter``, ``k``; ``k="adaptive"``
  lets the engine choose each step's K). Fixed policies decode every request alike; a per-class policy chooses by
  what is known before decoding; the load-adaptive one leaves K to the engine.
- :func:`saturation`: autoregressive decoding's throughput with every request waiting from the start (requests
  per second at ``max_batch`` rows): the load axis is a fraction of it.
- :func:`load_sweep`: at each load, one seeded arrival schedule (Poisson or gamma, vLLM's draws), the same for
  every policy; policies interleaved in a rotating order within each round. One row per request: its class,
  latencies (TTFT, TPOT, E2E, its per-token ITL), tokens, the K each step allowed and the rows it shared.
- :func:`summary`: per (policy, load): throughput, goodput under SLOs, latency percentiles, and per class.
- :func:`goodput_verdicts`: the load-adaptive policy's goodput against each other policy's at each load, a ratio with
  a paired bootstrap interval over requests and a verdict against the share it must keep; :func:`tpot_ratio`: the
  same for two policies' median TPOT at one load (one class, or all).
- :func:`crossover`: the lowest load at which a policy's goodput (or throughput) falls below autoregressive
  decoding's; :func:`k_table`: the K the load-adaptive policy chose at each batch size, as vLLM's
  ``num_speculative_tokens_per_batch_size`` setting.
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from ..decode import generate
from ..record import Timer
from ..serving import Engine, arrivals, request_metrics
from ..serving.metrics import PERCENTILES, meets, summarize_metrics
from . import exactness as ex
from . import protocol, report


def _engine_run(target, requests, policy, times, max_batch, max_new_tokens, step_cost=None, concurrency=None):
    """Serve ``requests`` ((class, ids) pairs) arriving at ``times`` under ``policy``; the results and the wall time."""
    e = Engine(target, max_batch=max_batch, step_cost=step_cost)
    for (cls, ids), t in zip(requests, times):
        e.submit(ids, arrival_s=t, max_new_tokens=max_new_tokens, **policy(cls))
    timer = Timer(None)
    t0 = timer.now()
    res = e.run(concurrency=concurrency)
    return res, timer.now() - t0, e.step_cost


def saturation(target, requests, max_batch: int, max_new_tokens: int) -> float:
    """Autoregressive decoding's requests per second with every request waiting at t = 0 (``max_batch`` rows busy
    while any wait): the most this engine serves without speculation."""
    res, wall, _ = _engine_run(target, requests, lambda cls: {}, [0.0] * len(requests), max_batch, max_new_tokens)
    failed = [r.error for r in res if r.error is not None]
    if failed:
        raise RuntimeError(f"the saturation run failed: {failed[0]!r}")
    return len(res) / wall


def load_sweep(target, requests, policies: dict, loads, rate_at_saturation: float, max_batch: int,
               max_new_tokens: int, repeats: int = 1, burstiness: float = 1.0, seed: int = 0,
               step_cost=None, progress=None) -> pd.DataFrame:
    """One row per (round, load, policy, request). ``requests``: (class, ids) pairs; ``policies``: name → policy
    (a function of the class); ``loads``: fractions of ``rate_at_saturation`` (requests per second); ``repeats``:
    rounds, one number or one per load (the loaded points, where the policies differ, can take more rounds than
    the light ones, whose time the arrivals set). Each (round, load) draws one arrival schedule (seed
    ``seed + 1000·round + index of the load``), replayed for every policy in a rotating order. ``step_cost``: the
    engine's :class:`~specdec_core.serving.StepCost` for adaptive requests (measured once and shared, so every
    adaptive run chooses from the same model)."""
    names = list(policies)
    rounds = list(repeats) if isinstance(repeats, (list, tuple)) else [repeats] * len(loads)
    if len(rounds) != len(loads) or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in rounds):
        raise ValueError(f"repeats must be an integer >= 1 or one per load ({len(loads)}), got {repeats!r}")
    rows = []
    bar = progress(total=sum(rounds) * len(names), desc="load sweep") if progress else None
    for rnd in range(max(rounds)):
        for li, load in enumerate(loads):
            if rnd >= rounds[li]:
                continue
            rate = load * rate_at_saturation
            times = arrivals(len(requests), rate, burstiness, seed=seed + 1000 * rnd + li)
            shift = (rnd * len(loads) + li) % len(names)
            for name in names[shift:] + names[:shift]:
                res, wall, step_cost = _engine_run(target, requests, policies[name], times, max_batch,
                                                   max_new_tokens, step_cost)
                for j, ((cls, _), r) in enumerate(zip(requests, res)):
                    row = dict(round=rnd, load=load, rate=rate, policy=name, request=j, cls=cls, wall_s=wall,
                               arrival_s=r.arrival_s, error=None if r.error is None else repr(r.error),
                               tokens=r.tokens, ks=r.ks, batch_rows=r.rows, alpha=r.stats.alpha)
                    if r.error is None:
                        m = request_metrics(r.stats.token_times)
                        row.update(ttft=m["ttft"], tpot=m["tpot"], e2e=m["e2e"], itl=m["itl"], n_tokens=m["tokens"])
                    rows.append(row)
                if bar:
                    bar.update(1)
    if bar:
        bar.close()
    return pd.DataFrame(rows)


def summary(runs: pd.DataFrame, slo: dict, by=("policy", "load")) -> pd.DataFrame:
    """Per group (and round, then the median over rounds): requests/s, tokens/s and goodput (requests/s meeting
    every SLO in ``slo``: limits in seconds on ``ttft``, ``tpot``, ``e2e``) over the span from the first arrival to
    the last token (:func:`~specdec_core.serving.metrics.summarize_metrics`), and the p50/p90/p99 of TTFT, TPOT,
    E2E and per-token ITL (ms)."""
    out = []
    for key, g in runs.groupby(list(by) + ["round"], sort=False):
        ok = g[g.error.isna()]
        per = [dict(ttft=r.ttft, tpot=r.tpot, e2e=r.e2e, itl=r.itl, tokens=r.n_tokens) for r in ok.itertuples()]
        span = float((ok.arrival_s + ok.e2e).max() - g.arrival_s.min()) if len(ok) else float("nan")
        m = summarize_metrics(per, len(g), span, slo)
        row = dict(zip(list(by) + ["round"], key if isinstance(key, tuple) else (key,)))
        row.update(requests=m["requests"], failed=m["failed"], request_rate=m["request_rate"],
                   tokens_per_s=m["throughput"], goodput=m["goodput"])
        row.update({f"{name}_p{p}_ms": 1e3 * m[name][p] for name in ("ttft", "tpot", "e2e", "itl") for p in PERCENTILES})
        out.append(row)
    df = pd.DataFrame(out)
    return df.groupby(list(by), sort=False).median(numeric_only=True).drop(columns="round").reset_index()


def best_per_request(runs: pd.DataFrame, load: float, measure: str = "tpot") -> pd.Series:
    """At ``load``, each (round, request)'s lowest ``measure`` over every policy: what a chooser that knew, for each
    request, which of these policies serves it best would get (a bound on choosing among them, per request)."""
    at = runs[(runs.load == load) & runs.error.isna()]
    return at.groupby(["round", "request"])[measure].min()


def traffic_policies(ngram, suffix, k_ngram: int, k_suffix: int, per_class: bool = True) -> dict:
    """Chapter 9's policies for a chat + input-grounded mix (name → function of the request's class): autoregressive;
    prompt lookup at ``k_ngram``; the suffix drafter capped at ``k_suffix``; per class (suffix for grounded requests,
    prompt lookup for chat; left out when ``per_class`` is false); load-adaptive (the same drafters,
    ``k="adaptive"``)."""
    lookup = dict(method="linear", drafter=ngram, k=k_ngram)
    copying = dict(method="linear", drafter=suffix, k=k_suffix)
    policies = {"autoregressive": lambda cls: {},
                f"n-gram, K = {k_ngram}": lambda cls: lookup,
                f"suffix, K ≤ {k_suffix}": lambda cls: copying,
                "per class": lambda cls: copying if cls == "grounded" else lookup,
                "load-adaptive": lambda cls: dict(method="linear", drafter=suffix if cls == "grounded" else ngram,
                                                  k="adaptive")}
    if not per_class:
        del policies["per class"]
    return policies


def greedy_identity(target, requests, runs: pd.DataFrame, max_new_tokens: int) -> list[tuple]:
    """Assert that every request of ``runs`` decoded the text of ``generate`` alone on its prompt (a float32
    divergence excused only at a near-tie, :func:`~specdec_core.study.exactness.excused`); the excused ones, as
    (policy, load, request, position, top-2 gap)."""
    refs = {j: generate(target, ids, max_new_tokens=max_new_tokens).tokens for j, (_, ids) in enumerate(requests)}
    ties = []
    for r in runs.itertuples():
        assert r.error is None, f"{r.policy} at load {r.load}, request {r.request}: {r.error}"
        pos, gap = ex.first_divergence(target, requests[r.request][1], r.tokens, refs[r.request])
        assert ex.excused(pos, gap), f"{r.policy} at load {r.load}, request {r.request}: diverges at {pos} ({gap})"
        if pos is not None:
            ties.append((r.policy, r.load, r.request, pos, gap))
    return ties


ENGINE_CONSTANTS = ("DECAY", "HELD_FLOOR", "PRIOR_TESTS")  # StepCost's constants the load-adaptive rule reads


def with_constants(step_cost, **constants):
    """A copy of ``step_cost`` (its measured pass times) with some of :data:`ENGINE_CONSTANTS` set, e.g.
    ``with_constants(sc, DECAY=0.7)``; the original is left as it was."""
    unknown = set(constants) - set(ENGINE_CONSTANTS)
    if unknown:
        raise ValueError(f"with_constants: {sorted(unknown)} are not engine constants ({', '.join(ENGINE_CONSTANTS)})")
    sc = copy.deepcopy(step_cost)
    for name, value in constants.items():
        setattr(sc, name, value)
    return sc


def tune_constants(target, requests, policies: dict, grid: list[dict], loads, rate_at_saturation: float,
                   max_batch: int, max_new_tokens: int, step_cost, slo: tuple[float, float], seed: int = 10_000,
                   policy: str = "load-adaptive", progress=None) -> tuple[pd.DataFrame, dict, dict]:
    """Choose the engine's constants on a *training* traffic mix: ``policy`` serves ``requests`` at each of
    ``loads`` with every setting of ``grid`` (dicts of :data:`ENGINE_CONSTANTS`), on the same seeded schedules
    (``seed``: not the evaluation's), and the setting with the highest mean goodput wins (the first in ``grid`` on a
    tie). The SLOs are ``slo`` = (TTFT, TPOT) multiples of autoregressive decoding's medians on this mix at the
    lowest of ``loads`` (:func:`slo_from`). Returns the table (one row per setting: goodput at each load and their
    mean), the chosen setting, and the SLOs in seconds."""
    if not grid:
        raise ValueError("tune_constants: an empty grid chooses nothing")
    base = load_sweep(target, requests, {"autoregressive": policies["autoregressive"]}, loads, rate_at_saturation,
                      max_batch, max_new_tokens, seed=seed)
    slo_s = slo_from(base, *slo)
    rows = []
    bar = progress(total=len(grid), desc="tuning on the training mix") if progress else None
    for constants in grid:
        runs = load_sweep(target, requests, {policy: policies[policy]}, loads, rate_at_saturation, max_batch,
                          max_new_tokens, seed=seed, step_cost=with_constants(step_cost, **constants))
        t = summary(runs, slo_s).set_index("load").goodput
        rows.append({**constants, **{f"goodput at {x:g}": float(t[x]) for x in t.index},
                     "mean goodput": float(t.mean())})
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    table = pd.DataFrame(rows)
    return table, dict(grid[int(table["mean goodput"].to_numpy().argmax())]), slo_s


def slo_from(runs: pd.DataFrame, ttft: float, tpot: float, baseline: str = "autoregressive") -> dict:
    """Goodput's SLOs as multiples of ``baseline``'s median TTFT and TPOT at the lowest load (seconds)."""
    low = runs[(runs.policy == baseline) & (runs.load == runs.load.min())]
    return dict(ttft=ttft * float(low.ttft.median()), tpot=tpot * float(low.tpot.median()))


def goodput_verdicts(runs: pd.DataFrame, slo: dict, policy: str = "load-adaptive", baseline: str = "autoregressive",
                     share: float = 0.95, level: float = 0.9, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """At each load, ``policy``'s goodput ÷ each other policy's, pooled over rounds (requests meeting every SLO ÷
    the rounds' summed spans, as :func:`summary` counts them), with a ``level`` bootstrap interval over distinct
    requests: a request is resampled with all its rounds (a cluster, :func:`~specdec_core.study.protocol.
    cluster_resamples`), the same draw for both policies (they served the same requests on the same
    schedule), each round's span kept. Replaying a request in more rounds does not narrow the interval as more
    distinct requests would. The verdict against ``share`` (``baseline``: against 1, at least its goodput):
    ``"holds"`` when the interval's low end reaches it, ``"fails"`` when its high end stays below, else
    ``"undecided"``; :func:`~specdec_core.study.report.judged` on the distinct requests (``n_units``; ``requests``
    counts every served one). ``policy_met`` and ``other_met``: how many served requests met every SLO under each
    (where both met it for the same requests, the ratio is only their spans', and a goal of 1 can stay undecided at
    equal goodput)."""
    rows = []
    for load, at in runs.groupby("load", sort=True):
        met, span = {}, {}
        for name, g in at.groupby("policy", sort=False):
            g = g.sort_values(["round", "request"])
            ok = g.error.isna()
            met[name] = np.array([bool(o) and meets(dict(ttft=r.ttft, tpot=r.tpot, e2e=r.e2e), slo)
                                  for o, r in zip(ok, g.itertuples())], dtype=float).reshape(g["round"].nunique(), -1)
            done = g[ok]
            span[name] = sum(float((d.arrival_s + d.e2e).max() - h.arrival_s.min())
                             for (_, d), (_, h) in zip(done.groupby("round"), g.groupby("round")))
        if policy not in met:
            continue
        rounds, n = met[policy].shape
        # distinct requests, each with all its rounds (its SLOs met, summed over them), the same draws for both
        draws = np.array(list(protocol.cluster_resamples(range(n), n_boot, seed)))
        pick = lambda m: m.sum(axis=0)[draws].sum(axis=1)  # noqa: E731
        for other in [p for p in met if p != policy]:
            goal = 1.0 if other == baseline else share
            a, b = met[policy].sum() / span[policy], met[other].sum() / span[other]
            with np.errstate(divide="ignore", invalid="ignore"):
                boot = (pick(met[policy]) / span[policy]) / (pick(met[other]) / span[other])
            boot = boot[~np.isnan(boot)]
            lo, hi = protocol.interval(boot, level) if boot.size else (np.nan, np.nan)
            rows.append(dict(load=load, other=other, goal=goal, policy_goodput=a, other_goodput=b,
                             ratio=a / b if b else (np.inf if a else np.nan), lo=lo, hi=hi, requests=rounds * n,
                             n_units=n, policy_met=int(met[policy].sum()), other_met=int(met[other].sum()),
                             verdict=_verdict(lo, hi, goal, n)))
    return pd.DataFrame(rows)


def tpot_ratio(runs: pd.DataFrame, load: float, policy: str, other: str, cls: str | None = None, goal: float = 1.0,
               level: float = 0.9, n_boot: int = 2000, seed: int = 0) -> dict:
    """At ``load`` (requests of class ``cls``, or all): ``other``'s median TPOT ÷ ``policy``'s (above 1: ``policy``
    is that many times faster per token), pooled over rounds, with a ``level`` bootstrap interval over distinct
    requests (each resampled with all its rounds), the same draw for both policies (they served the same requests
    on the same schedule), and its verdict against ``goal`` over the distinct requests: ``"holds"`` when the
    interval's low end reaches it, ``"fails"`` when its high end stays below, else ``"undecided"``. A request that
    failed under either policy is left out of both."""
    at = runs[(runs.load == load) & (runs.policy.isin([policy, other]))]
    if cls is not None:
        at = at[at.cls == cls]
    t = at.pivot_table(index=["round", "request"], columns="policy", values="tpot", aggfunc="first")
    if policy not in t or other not in t:
        raise ValueError(f"tpot_ratio: no requests of {policy!r} and {other!r} at load {load!r}")
    t = t[[policy, other]].dropna()
    if not len(t):
        raise ValueError(f"tpot_ratio: no request at load {load!r} finished under both {policy!r} and {other!r}")
    ids = t.index.get_level_values("request").to_numpy()  # each distinct request is a cluster of its rounds
    t = t.to_numpy()
    lo, hi = protocol.cluster_bootstrap(t, ids, stat=lambda r: np.median(r[:, 1]) / np.median(r[:, 0]),
                                        resamples=n_boot, level=level, seed=seed)
    n_units = len(set(ids.tolist()))
    return dict(ratio=float(np.median(t[:, 1]) / np.median(t[:, 0])), lo=float(lo), hi=float(hi), requests=len(t),
                n_units=n_units, verdict=_verdict(lo, hi, goal, n_units))


def _verdict(lo: float, hi: float, goal: float, n: int) -> str:
    """A ratio's verdict against ``goal`` from its interval ``lo``–``hi`` over ``n`` distinct requests: ``"holds"`` when the
    low end reaches the goal, ``"fails"`` when the high end stays below, else ``"undecided"`` (``"not measured"``
    without an interval); :func:`~specdec_core.study.report.judged` on ``n``."""
    word = ("not measured" if np.isnan(lo) else "holds" if lo >= goal else "fails" if hi < goal else "undecided")
    return report.judged(word, n)


def against(verdicts: pd.DataFrame, baseline: str = "autoregressive"):
    """Per load of :func:`goodput_verdicts`: (load, the row against ``baseline``, the row against the other policy
    with the highest goodput)."""
    for load, v in verdicts.groupby("load"):
        yield load, v[v.other == baseline].iloc[0], v[v.other != baseline].sort_values("other_goodput").iloc[-1]


def crossover(table: pd.DataFrame, policy: str, baseline: str = "autoregressive", measure: str = "goodput"):
    """The lowest load at which ``policy``'s ``measure`` falls below ``baseline``'s (None: none in the sweep)."""
    t = table.set_index(["policy", "load"])[measure]
    for load in sorted(table.load.unique()):
        if (policy, load) in t and (baseline, load) in t and t[(policy, load)] < t[(baseline, load)]:
            return float(load)
    return None


def k_table(runs: pd.DataFrame, policy: str) -> pd.DataFrame:
    """The K the engine chose for ``policy``'s requests, per batch size (live rows of the step): steps, median and
    mean K, and the share of steps with K = 0; the median per batch size is the ``num_speculative_tokens`` a
    vLLM batch-size table (``num_speculative_tokens_per_batch_size``) would hold for this pair and machine."""
    r = runs[(runs.policy == policy) & runs.error.isna()]
    steps = pd.DataFrame([(b, k) for ks, bs in zip(r.ks, r.batch_rows) for k, b in zip(ks, bs)],
                         columns=["batch_size", "k"])
    if steps.empty:
        return pd.DataFrame(columns=["batch_size", "steps", "k_median", "k_mean", "k0_share"])
    g = steps.groupby("batch_size").k
    return pd.DataFrame({"steps": g.size(), "k_median": g.median(), "k_mean": g.mean(),
                         "k0_share": g.apply(lambda k: float((k == 0).mean()))}).reset_index()


def vllm_k_setting(table: pd.DataFrame) -> dict[int, int]:
    """``{batch size: K}`` from :func:`k_table` (its medians, rounded down): the dictionary a vLLM user could set."""
    return {int(b): int(k) for b, k in zip(table.batch_size, table.k_median)}
