"""Tuning the confidence threshold θ on held-out *training* prompts, for storing with the draft.

``generate(..., confidence="auto")`` reads ``drafter.calibrated[method]``; for the shipped draft those values
come from ``data/drafts/<draft>/confidence.json``, written by ``scripts/calibrate_confidence.py`` (listed in
the draft's ``SHA256SUMS``, so an edited threshold fails the checksum like edited weights). The choice is the
same one chapter 8 makes: every candidate setting against autoregressive decoding in one interleaved, greedy
run over held-out training prompts; the highest median speedup per family wins. The evaluation mix is never
read here.

The file's format (where it lives, loading, checking and attaching it to drafters) is
:mod:`specdec_core.models.calibration`'s; this module is the tuning procedure that fills it. The file::

    {"method": "linear", "k_max": 6, "theta": {"model": 0.5, "hybrid": 0.7, "adaptive": 0.7},
     "fixed_k": 1, "cost": 0.11, "prompts": 6, "max_new_tokens": 64, "table": [...one row per candidate...]}
"""
from __future__ import annotations

import json

from ..models.calibration import attach
from ..record import Timer
from . import bench

FAMILIES = ("model", "hybrid", "adaptive")  # drafters whose θ is tuned (a θ= candidate per family and θ)
ROLES = {"fixed K": "model, K=", "model + confidence": "model, θ=", "hybrid + confidence": "hybrid, θ=",
         "adaptive + confidence": "adaptive, θ="}


def candidates(fixed_ks, thetas, k_max: int, families=FAMILIES) -> dict[str, dict]:
    """Every setting tried: the model draft at each fixed K, and each θ with each drafter of ``families``
    (up to ``k_max`` tokens a step). Names read "model, K=2", "hybrid, θ=0.5"."""
    c = {f"model, K={k}": dict(method="linear", drafter="model", k=k) for k in fixed_ks}
    for th in thetas:
        c |= {f"{f}, θ={th}": dict(method="linear", drafter=f, k=k_max, confidence=th) for f in families}
    return c


def draft_cost(runs, runner: str, baseline: str = "autoregressive") -> float:
    """c of a model-draft runner, the cost of one draft pass in one-token target passes (Theorem 3.8's c): median
    over its calls of (draft seconds per draft pass) ÷ (``baseline``'s verify seconds per step on the same prompt
    and repeat, an autoregressive step being one one-token target pass). Not the runner's own verify pass, which
    reads K + 1 tokens and so costs more than a one-token pass for K > 1."""
    r = runs[runs.runner == runner].set_index(["id", "repeat"])
    base = runs[runs.runner == baseline].set_index(["id", "repeat"])
    if r.empty or base.empty:
        raise ValueError(f"draft_cost needs calls of {runner!r} and of the baseline {baseline!r} in the same run")
    per_pass = (r.draft_s / r.draft_passes) / (base.verify_s / base.steps).reindex(r.index)
    if per_pass.isna().all():
        raise ValueError(f"no call of {runner!r} has a {baseline!r} call on the same prompt and repeat")
    return float(per_pass.median())


def tune(pair, prompts, cands: dict[str, dict], max_new_tokens: int, repeats: int = 1):
    """Run every candidate and autoregressive decoding (greedy, interleaved) on ``prompts``; returns the raw runs
    and a table indexed by candidate: paired speedup (median, q25, q75, n), α, drafted tokens per step,
    ``family`` and ``setting``."""

    def runner(kw):
        return bench.decode_runner(pair.target, max_new_tokens, 0.0, **bench.method_kwargs(pair, kw))

    runs = bench.run_interleaved({"autoregressive": runner(dict(method="autoregressive"))}
                                 | {name: runner(kw) for name, kw in cands.items()}, prompts, repeats=repeats)
    tr = bench.paired_ratios(runs, "autoregressive").set_index("runner")
    tr["alpha"] = bench.pooled_alpha(runs)
    tr["drafted_per_step"] = runs.groupby("runner").drafted_per_step.mean()
    tr["family"] = tr.index.str.split(",").str[0]
    tr["setting"] = tr.index.str.split(", ").str[1]
    return runs, tr


def choose(table) -> dict[str, str]:
    """The candidate with the highest median speedup in each family present: ``{role: candidate name}``."""
    out = {}
    for role, prefix in ROLES.items():
        rows = table[table.index.str.startswith(prefix)]
        if len(rows):
            out[role] = rows["median"].idxmax()
    return out


def theta_of(name: str) -> float:
    return float(name.split("θ=")[1])


def record(table, chosen: dict[str, str], cost: float, k_max: int, **meta) -> dict:
    """The calibration file's content from a tuning table and its choices."""
    theta = {ROLES[role].split(",")[0]: theta_of(name) for role, name in chosen.items() if "θ=" in name}
    return dict(method="linear", k_max=k_max, theta=theta, fixed_k=int(chosen["fixed K"].split("K=")[1]),
                cost=round(cost, 4), **meta,
                table=json.loads(table.reset_index().round(4).to_json(orient="records", force_ascii=False)))


def calibration(pair, prompts, fixed_ks, thetas, k_max: int, max_new_tokens: int, repeats: int = 1,
                **meta) -> tuple:
    """The whole procedure: :func:`tune` every candidate on ``prompts``, :func:`choose` per family, and the
    calibration file's content (:func:`record`, with its sizes, ``repeats`` and ``thetas``, and ``meta``). Returns
    (record, tuning table, choices)."""
    runs, table = tune(pair, prompts, candidates(fixed_ks, thetas, k_max), max_new_tokens, repeats=repeats)
    chosen = choose(table)
    rec = record(table, chosen, draft_cost(runs, chosen["fixed K"]), k_max, prompts=len(prompts),
                 max_new_tokens=max_new_tokens, repeats=repeats, thetas=list(thetas), **meta)
    return rec, table, chosen


def calibrate_pair(pair, prompts, fixed_ks, thetas, k_max: int, max_new_tokens: int, repeats: int = 1) -> tuple[dict, float]:
    """For a pair with nothing stored with its draft (a pair of one's own): choose the fixed K and each family's θ on
    ``prompts`` (held-out *training* prompts, :func:`specdec_core.data.prompts.sweep_prompts`) as
    ``scripts/calibrate_confidence.py`` does for the shipped draft, and attach the choice to ``pair.drafters`` in
    memory (``"k": "auto"`` and ``confidence="auto"`` then read it; nothing is written). Returns the record and
    the seconds the choice took."""
    if "model" not in pair.drafters:
        raise ValueError("choosing K and θ needs a model draft: this pair has none (load_pair(..., draft=...))")
    timer = Timer(None)
    t0 = timer.now()
    rec, _, _ = calibration(pair, prompts, fixed_ks, thetas, k_max, max_new_tokens, repeats)
    attach(pair.drafters, rec)
    if hasattr(pair.drafters.get("adaptive"), "cost"):
        pair.drafters["adaptive"].cost = rec["cost"]
    return rec, timer.now() - t0
