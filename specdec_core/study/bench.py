"""Side-by-side timing: every method on the same prompts, interleaved, in one run.

Protocol (what every benchmark in the book uses):

1. warm-up: each runner decodes the first prompt ``warmup`` times, untimed;
2. for each repeat, for each prompt, run every runner once, rotating the runner order per prompt so no
   runner always goes first; CUDA is synchronized around each timed call;
3. report per-call tokens/s, and *paired* ratios against a baseline runner (same prompt, same repeat),
   summarized by median and interquartile range.

Absolute times are never compared across runs, only ratios within one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from ..decode import generate
from ..drafters import Drafter
from ..lm import CachedLM
from ..models import draft_step
from ..record import PHASES, Timer, acceptance_rate
from ..sampling import SamplingParams
from ..serving.metrics import per_token_gaps
from ..tree import Dynamic
from . import protocol
from .profiling import at_context, pass_fn, progress_bar as tqdm, summarize, time_interleaved
from .theory import speedup

Runner = Callable[[torch.Tensor], dict]  # prompt ids -> {"tokens": list[int], ...extra stats}


def run_interleaved(runners: dict[str, Runner], prompts: list[tuple[dict, torch.Tensor]], repeats: int = 3,
                    warmup: int = 2, progress: bool = True) -> pd.DataFrame:
    """Time every runner on every ``(meta, ids)`` prompt. Returns one row per call.

    The decode-level counterpart of :func:`~specdec_core.study.profiling.time_interleaved` (which times
    zero-argument callables): here every call also returns tokens and stats, and the order rotates per
    prompt so each runner meets each prompt in every position."""
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            runners[name](prompts[0][1])
    rows, timer = [], Timer(None)  # None: the current CUDA device, if any (a runner may run anywhere)
    total = repeats * len(prompts) * len(names)
    bar = tqdm(total=total, desc="benchmark", disable=not progress)
    for rep in range(repeats):
        for i, (meta, ids) in enumerate(prompts):
            order = names[(i + rep) % len(names):] + names[: (i + rep) % len(names)]
            for name in order:
                out, dt = timer.time(runners[name], ids)
                n = len(out["tokens"])
                extra = {k: v for k, v in out.items() if k != "tokens" and not isinstance(v, dict)}
                rows.append(dict(meta, runner=name, repeat=rep, new_tokens=n, seconds=dt,
                                 tokens_per_s=n / dt, **extra))
                bar.update()
    bar.close()
    return pd.DataFrame(rows)


def _call_row(r, keep_steps: bool) -> dict:
    """The row every decode runner reports for one call's :class:`~specdec_core.record.Result`."""
    s = r.stats
    acc, prop = s.accepted_lengths, s.proposed
    row = {"tokens": r.tokens, "tau": s.tau, "accepted": sum(acc), "proposed": sum(prop),
           "rejections": sum(1 for a, p in zip(acc, prop) if a < p), "target_passes": s.target_passes,
           "decode_s": s.decode_s, "decode_tokens": max(0, len(r.tokens) - 1), **latency_percentiles(s.token_times)}
    if keep_steps:
        row["accepted_lengths"], row["drafted_lengths"] = acc, list(s.drafted)
    return row


def generate_runner(target, max_new_tokens: int, temperature: float = 0.0, keep_steps: bool = False,
                    **generate_kwargs) -> Runner:
    """A runner calling :func:`specdec_core.generate`; its row carries the speculative counts (accepted,
    rejections, proposed, τ), the decode-loop time and tokens (prefill excluded) and latency percentiles;
    ``keep_steps`` also keeps the per-step accepted lengths and the tokens (or tree nodes) each step drafted."""

    def run(ids):
        return _call_row(generate(target, ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=0,
                                  **generate_kwargs), keep_steps)
    return run


def decode_runner(target, max_new_tokens: int, temperature: float = 0.0, keep_steps: bool = False,
                  outputs: dict | None = None, per_prompt: Callable[[torch.Tensor], dict] | None = None,
                  **generate_kwargs) -> Runner:
    """A runner calling :func:`specdec_core.generate` whose row holds everything :func:`generate_runner`'s
    does, plus the step counts (``steps``, ``draft_passes``), the per-step means ``accepted_per_step`` and
    ``drafted_per_step`` (tokens or tree nodes in a verify pass) and the four phases' seconds
    (``draft_s``, ``verify_s``, ``accept_s``, ``commit_s``). ``outputs``: a dict that receives every call's
    tokens under the prompt's ids (``tuple(ids.tolist())``), for checking greedy outputs afterwards.
    ``per_prompt``: a function of the prompt's ids returning :func:`~specdec_core.generate` arguments for that
    call, over the runner's own (a request's ``prediction``, say, or ``method="autoregressive"`` where it has none)."""

    def run(ids):
        r = generate(target, ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=0,
                     **(generate_kwargs | (per_prompt(ids) if per_prompt is not None else {})))
        s = r.stats
        if outputs is not None:
            outputs[tuple(torch.as_tensor(ids).view(-1).tolist())] = r.tokens
        return {**_call_row(r, keep_steps), "steps": len(s.accepted_lengths), "draft_passes": s.draft_passes,
                "prediction_accepted": s.prediction_accepted, "prediction_rejected": s.prediction_rejected,
                "drafting_steps": sum(d > 0 for d in s.drafted),  # a last step with room 1 drafts nothing
                "accepted_per_step": float(np.mean(s.accepted_lengths)) if s.accepted_lengths else float("nan"),
                "drafted_per_step": float(np.mean(s.drafted)) if s.drafted else float("nan"),
                **{f"{ph}_s": getattr(s, f"{ph}_s") for ph in PHASES}}
    return run


def method_kwargs(pair, spec: dict, k: int | None = None) -> dict:
    """A method as the book's parameters write it → :func:`specdec_core.generate` arguments.

    ``spec``: ``{"method": ..., "drafter": <key of pair.drafters>, "k": ..., "tree": "default" | {Dynamic
    arguments}}`` (drafter and tree optional); ``k`` overrides the spec's. A drafter the pair lacks raises
    ``KeyError`` (check with ``spec["drafter"] in pair.drafters``)."""

    kw = {key: v for key, v in spec.items() if key not in ("drafter", "tree")}
    if spec.get("drafter") is not None:
        kw["drafter"] = pair.drafters[spec["drafter"]]
    if k is not None:
        kw["k"] = k
    if spec.get("tree") not in (None, "default"):
        kw["tree"] = Dynamic(**spec["tree"])
    return kw


def unrunnable(pair, spec: dict) -> str | None:
    """Why a method as the book's parameters write it (:func:`method_kwargs`) cannot run on ``pair``, or None when
    it can: a drafter the pair lacks, or a θ / K "auto" with nothing stored with the draft."""
    drafter = pair.drafters.get(spec.get("drafter")) if spec.get("drafter") is not None else None
    if spec.get("drafter") is not None and drafter is None:
        return f"no {spec['drafter']!r} drafter"
    if spec.get("confidence") == "auto" and spec["method"] not in getattr(drafter, "calibrated", {}):
        return "no θ stored with the draft (scripts/calibrate_confidence.py)"
    if spec.get("k") == "auto" and getattr(drafter, "calibration", None) is None:
        return "no K stored with the draft (scripts/calibrate_confidence.py)"
    return None


def stored_k(pair, spec: dict) -> dict:
    """``spec`` with ``"k": "auto"`` replaced by the fixed K stored with its drafter (``fixed_k`` of the model
    draft's ``confidence.json``: the best fixed K on held-out training prompts, ``scripts/calibrate_confidence.py``);
    other specs unchanged. Raises ``ValueError`` when nothing is stored."""
    if spec.get("k") != "auto":
        return spec
    rec = getattr(pair.drafters.get(spec["drafter"]), "calibration", None)
    if rec is None:
        raise ValueError(f'"k": "auto" reads the fixed K stored with the {spec["drafter"]!r} drafter, and this pair '
                         "has none (scripts/calibrate_confidence.py writes it for the model draft); give a number instead")
    return dict(spec, k=int(rec["fixed_k"]))


def step_table(stats, **meta) -> pd.DataFrame:
    """One row per decoding step of a run (:class:`~specdec_core.record.Stats`): ``step``, ``accepted``,
    ``proposed`` (tokens the verifier tested), ``drafted`` (tokens or nodes in the verify pass), ``last``
    (the run's final step, which the budget or an EOS may cut), and the ``meta`` columns."""
    n = len(stats.accepted_lengths)
    return pd.DataFrame(dict(meta, step=range(n), accepted=stats.accepted_lengths, proposed=stats.proposed,
                             drafted=stats.drafted, last=[i == n - 1 for i in range(n)]))


def acceptance_by_position(steps: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """Acceptance by draft position from a table of steps (:func:`step_table`: ``accepted``, ``proposed``,
    ``drafted``), per ``by`` group.

    A chain's position i is *drafted* when the step drafted at least i tokens, *reached* (tested) when the
    i − 1 before it were accepted, and accepted when the step accepted at least i. Per position: ``steps``
    (drafted), ``reached``, ``conditional`` = P(accept i | reached i), which i.i.d. acceptance (the theory's
    model) would keep flat, and ``cumulative`` = P(accept ≥ i) over the steps that drafted i."""
    by = list(by or [])
    rows = []
    for key, g in (steps.groupby(by, sort=True) if by else [((), steps)]):
        key = key if isinstance(key, tuple) else (key,)
        for i in range(1, int(g.drafted.max()) + 1 if len(g) else 1):
            drafted, reached, accepted = (g.drafted >= i).sum(), (g.proposed >= i).sum(), (g.accepted >= i).sum()
            rows.append(dict(zip(by, key), position=i, steps=int(drafted), reached=int(reached),
                             conditional=accepted / reached if reached else np.nan,
                             cumulative=accepted / drafted if drafted else np.nan))
    return pd.DataFrame(rows, columns=by + ["position", "steps", "reached", "conditional", "cumulative"])


def theory_check(df: pd.DataFrame, runner: str, baseline: str, k: int, c: float, verify_ratio: float,
                 min_tokens: int = 8) -> tuple[pd.DataFrame, dict]:
    """Leviathan et al.'s prediction against the measurement, call by call.

    For each (prompt, repeat) where both runners decoded at least ``min_tokens`` tokens: α̂ from that
    call's own steps (:func:`~specdec_core.record.acceptance_rate`), the predicted speedup :func:`theory.speedup` (α̂, K, c,
    verify ratio), and the measured one — the decode loops' tokens/s ratio (prefill, the same for both,
    is not what the theorem models). α varies from prompt to prompt, and the speedup is not linear in α,
    so each call is predicted from its own α̂ rather than from one pooled α.

    Returns the per-call table and a summary: median predicted, median measured, and the relative error
    between those medians (the agreement the book reports).
    """

    key = ["id", "repeat"]
    rate = lambda d: d.decode_tokens / d.decode_s  # noqa: E731
    base = df[df.runner == baseline].set_index(key)
    d = df[df.runner == runner].set_index(key)
    d = d[(d.decode_tokens >= min_tokens) & (base.loc[d.index].decode_tokens >= min_tokens).values]
    rows = d.reset_index()[key + [c_ for c_ in ("task",) if c_ in d.columns]].copy()
    a = d.accepted / (d.accepted + d.rejections)
    pooled = d.accepted.sum() / (d.accepted.sum() + d.rejections.sum())
    rows["alpha_hat"] = a.values
    rows["predicted"] = speedup(a.values, k, c, verify_ratio)
    rows["measured"] = (rate(d) / rate(base.loc[d.index])).values
    rows["rel_error"] = (rows.measured - rows.predicted) / rows.predicted
    pm, mm = float(rows.predicted.median()), float(rows.measured.median())
    summary = {"runner": runner, "k": k, "c": c, "verify_ratio": verify_ratio, "calls": len(rows),
               "alpha_pooled": float(pooled), "predicted_pooled": float(speedup(pooled, k, c, verify_ratio)),
               "predicted_median": pm, "measured_median": mm, "rel_error": abs(mm - pm) / pm,
               "per_call_abs_error_median": float(rows.rel_error.abs().median())}
    return rows, summary


def pooled_alpha(df: pd.DataFrame, by="runner") -> pd.Series:
    """α per group of a run table, pooled over its calls: :func:`~specdec_core.record.acceptance_rate` of
    Σ accepted and Σ (accepted + rejections) (NaN for a group that tested nothing, e.g. autoregressive)."""
    return df.groupby(by).apply(lambda g: acceptance_rate(g.accepted.sum(), g.accepted.sum() + g.rejections.sum()),
                                include_groups=False)


def paired_ratios(df: pd.DataFrame, baseline: str, by: list[str] | None = None) -> pd.DataFrame:
    """tokens/s of each runner ÷ the baseline's on the same prompt and repeat, summarised per group over distinct
    prompts (:mod:`~specdec_core.study.protocol`): each prompt's repeats collapse to their median first, so ``n``
    counts prompts, not calls. Per group: ``median``, ``q25``, ``q75``, ``n``, the exact Wilcoxon ``p``, ``sigma``
    (the spread of the prompts' log ratios), ``p_holm``
    (Holm-adjusted over the groups of this call: one table's family), ``power`` against a 10 % change and
    ``n_tell``, the prompts that would tell."""
    key = ["id", "repeat"]
    base = df[df.runner == baseline].set_index(key)["tokens_per_s"]
    d = df[df.runner != baseline].copy()
    d["ratio"] = d.tokens_per_s.values / base.loc[list(zip(d["id"], d["repeat"]))].values
    groups = ["runner"] + (by or [])
    family = d.groupby(groups).ngroups
    rows = [{**dict(zip(groups, k if isinstance(k, tuple) else (k,))),
             **protocol.summarise(g.ratio, units=g["id"], family=family)}
            for k, g in d.groupby(groups)]
    out = pd.DataFrame(rows, columns=groups + ["median", "q25", "q75", "n", "p", "sigma", "power", "n_tell"])
    out.insert(out.columns.get_loc("p") + 1, "p_holm", protocol.holm(out.p))
    return out


def per_token_latency(token_times: list[float]) -> np.ndarray:
    """Amortized per-token latency (ms): a pass that took Δ and revealed m tokens gives each Δ / m.

    The first token's latency is the time to first token (prefill included).
    """
    return 1e3 * per_token_gaps(token_times)


def latency_percentiles(token_times: list[float]) -> dict:
    """p50/p95/p99 of :func:`per_token_latency` over decode tokens (the first token, TTFT, reported apart)."""
    lat = per_token_latency(token_times)
    out = {"ttft_ms": float(lat[0]) if lat.size else float("nan")}
    rest = lat[1:] if lat.size > 1 else lat
    out.update({f"p{p}_ms": float(np.percentile(rest, p)) for p in (50, 95, 99)})
    return out


def median_length(prompts: list[tuple[dict, torch.Tensor]]) -> torch.Tensor:
    """The prompt of median length (where :func:`pass_costs` times passes for a whole prompt set)."""
    return sorted((ids for _, ids in prompts), key=len)[len(prompts) // 2]


def write_jsonl(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for rec in df.to_dict(orient="records"):
            f.write(json.dumps(rec, default=float) + "\n")
    return path


def pass_costs(target, draft_model, ids: torch.Tensor, ks=(1, 2, 4, 8), repeats: int = 15,
               decoded: int = 0) -> dict:
    """Measure, side by side, one target pass over 1 token, over K + 1 tokens, and one draft pass over 1 token
    at the context of ``ids`` followed by ``decoded`` more tokens (half the decode budget puts the context
    where a decode loop spends it on average). Returns medians (ms) and ``c`` = draft / target(1),
    ``verify_ratio[K]``."""

    ids = torch.as_tensor(ids).view(-1)
    S = ids.numel() + decoded
    t_lm = CachedLM(target, S + max(ks) + 2)
    at_context(t_lm, S)
    fns = {f"target[{n}]": pass_fn(t_lm, n) for n in sorted({1, *[k + 1 for k in ks]})}
    if draft_model is not None:
        d_lm = CachedLM(draft_model, S + 2)
        at_context(d_lm, S)
        fns["draft[1]"] = pass_fn(d_lm, 1)
    df = time_interleaved(fns, repeats=repeats, warmup=3)
    s = summarize(df).set_index("name")
    med = s["median"] * 1e3
    out = {"ms": med.to_dict(), "spread_ms": ((s["q75"] - s["q25"]) * 1e3).to_dict()}
    t1 = med["target[1]"]
    out["c"] = float(med["draft[1]"] / t1) if draft_model is not None else float("nan")
    out["verify_ratio"] = {k: float(med[f"target[{k + 1}]"] / t1) for k in ks}
    return out


def takes_apart(draft_model) -> bool:
    """Whether :func:`draft_pass_parts` can take ``draft_model``'s pass apart: this library's draft (a trunk and a
    head, :class:`~specdec_core.models.draft.DraftModel`), not any causal LM."""
    return all(hasattr(draft_model, a) for a in ("hidden", "sub_logits", "head"))


def draft_pass_parts(target, draft_model, ids: torch.Tensor, repeats: int = 15, decoded: int = 0):
    """The draft's one-token pass taken apart, beside the target's, at the context of ``ids`` plus ``decoded``
    tokens, timed side by side (interleaved, medians in ms): on this library's path
    (:mod:`specdec_core.models.draft_step`) and on the path before it (transformers' modules, a float32 head;
    :func:`~specdec_core.models.draft_step.module_path`). Returns a frame of ``path``, ``part`` ("layers", "head",
    "everything else": embedding, output and the library's calls) and ``ms``, with the target's pass as
    ``path`` "target"; ``c`` = the pass over the target's is the sum of a path's parts over the target's."""
    if not takes_apart(draft_model):
        raise ValueError(f"draft_pass_parts takes apart this library's DraftModel, got {type(draft_model).__name__}")
    ids = torch.as_tensor(ids).view(-1)
    S = ids.numel() + decoded
    t_lm, d_lm, h_lm = CachedLM(target, S + 2), CachedLM(draft_model, S + 2), CachedLM(draft_model, S + 2)
    for lm in (t_lm, d_lm, h_lm):
        at_context(lm, S)
    one, at = torch.ones(1, 1, dtype=torch.long), torch.tensor([S])

    def layers():  # the trunk over one token, committing nothing
        return draft_model.hidden(one, position_ids=at.view(1, 1), cache_position=at, past_key_values=h_lm.cache,
                                  use_cache=True).last_hidden_state

    def old(fn):
        def run():
            with draft_step.module_path():
                return fn()
        return run

    with torch.inference_mode():
        h = layers()
    head = draft_model.head
    fns = {("target", "pass"): pass_fn(t_lm, 1),
           ("this library", "pass"): pass_fn(d_lm, 1), ("this library", "layers"): layers,
           ("this library", "head"): lambda: draft_model.sub_logits(h),
           ("transformers' modules", "pass"): old(pass_fn(d_lm, 1)), ("transformers' modules", "layers"): old(layers),
           ("transformers' modules", "head"): lambda: h @ head.T}
    with torch.inference_mode():
        df = time_interleaved({f"{a}|{b}": f for (a, b), f in fns.items()}, repeats=repeats, warmup=3)
    med = summarize(df).set_index("name")["median"] * 1e3
    rows = [dict(path="target", part="pass", ms=med["target|pass"])]
    for path in ("transformers' modules", "this library"):
        parts = {part: med[f"{path}|{part}"] for part in ("layers", "head")}
        parts["everything else"] = max(0.0, med[f"{path}|pass"] - sum(parts.values()))
        rows += [dict(path=path, part=part, ms=ms) for part, ms in parts.items()]
    return pd.DataFrame(rows)


# -- measuring: the draft phase alone ----------------------------------------------------------------
def proposal_timer(drafter: Drafter, context: list[int], params: SamplingParams = SamplingParams()):
    """A callable ``k -> seconds`` timing one ``propose(context, k)`` with exactly one unseen token.

    The draft phase of a step that follows a full rejection, the same for every K and every cached drafter
    (anything with an ``lm``: :class:`BlockDrafter`, :class:`~specdec_core.drafters.ModelDrafter`). The
    drafter's cache is set up once and rolled back after each call (a pointer move)."""
    base = len(context) - 1
    drafter.reset(torch.tensor(context), len(context) + 2 * getattr(drafter, "max_block", 16) + 2)
    drafter.accept(drafter.propose(context[:-1], 1, params, None), 0)
    timer = Timer(drafter.lm.device)

    def timed(k: int) -> float:
        drafter.lm.cache.rollback(drafter.lm.length - base)
        g = torch.Generator().manual_seed(k)
        d, dt = timer.time(drafter.propose, context, k, params, g)
        drafter.accept(d, 0)
        return dt

    return timed


class TimedDrafter(Drafter):
    """Any drafter with the wall time of each proposal recorded, unchanged otherwise (same tokens, laws and
    generator draws). ``records``: one dict per proposal: ``k`` asked, ``unseen`` committed tokens the draft
    had not seen (its ``lm`` cache, if any), ``seconds``, ``first`` (the proposal that also reads the prompt)."""

    def __init__(self, inner: Drafter):
        self.inner, self.name, self.vocab_size = inner, inner.name, inner.vocab_size
        self.reads_verify = inner.reads_verify  # the verify pass's logits reach the inner drafter in draft.state
        self.records: list[dict] = []
        self._first = True

    def bind(self, target):
        self.inner.bind(target)
        self.vocab_size = self.inner.vocab_size

    def reset(self, prompt, capacity):
        self.inner.reset(prompt, capacity)
        self._first = True

    def _timed(self, fn, context, k):
        lm = getattr(self.inner, "lm", None)
        unseen = len(context) - (lm.length if lm is not None else 0)
        out, seconds = Timer(lm.device if lm is not None else "cpu").time(fn)
        self.records.append(dict(k=k, unseen=unseen, seconds=seconds, first=self._first))
        self._first = False
        return out

    def propose(self, context, k, params, generator, confidence=None):
        kw = {} if confidence is None else {"confidence": confidence}
        return self._timed(lambda: self.inner.propose(context, k, params, generator, **kw), context, k)

    def propose_tree(self, context, shape, k, params, generator, confidence=None):
        kw = {} if confidence is None else {"confidence": confidence}
        return self._timed(lambda: self.inner.propose_tree(context, shape, k, params, generator, **kw), context, k)

    def accept(self, draft, n):
        self.inner.accept(draft, n)

    def accept_path(self, draft, path):
        self.inner.accept_path(draft, path)


# -- pooling runs that keep their steps ---------------------------------------------------------------
def pooled_steps(runs: pd.DataFrame, by: list[str], means=("alpha_predicted", "tau")) -> pd.DataFrame:
    """One row per ``by`` group of runs that keep their steps (``accepted_lengths`` and ``proposed``, a list per run):
    ``alpha`` pooled over every step of the group (:func:`~specdec_core.record.acceptance_rate`), the mean of each
    column in ``means`` and ``n``, the number of runs."""
    def pooled(g):
        return pd.Series({"alpha": acceptance_rate(g.accepted_lengths.sum(), g.proposed.sum()),
                          **{c: g[c].mean() for c in means}, "n": len(g)})
    return runs.groupby(by).apply(pooled, include_groups=False).reset_index()
