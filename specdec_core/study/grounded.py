"""Where speculation pays (chapter 11): input-grounded requests, drafters that remember, predicted outputs.

    ids = grounded.prediction_ids(pair.tokenizer, prompt)        # the passage a request is built on, as token ids
    n = grounded.build_memory(target, drafter, train_ids, ...)   # a suffix drafter warmed on training requests, frozen
    grounded.greedy_identity(outputs, "autoregressive")           # greedy calls whose tokens differ from the baseline
    grounded.choose(train_ratios, classes)                        # the method per request class, fixed on training
    grounded.mix_speedup(runs, "autoregressive", chat, grounded_ids, shares)   # a traffic mix's speedup per share

The timing protocol is :mod:`specdec_core.study.bench`'s (interleaved, paired, one run); what is new here is what a
chapter on grounded requests needs around it: a memory that is built from training requests only and then frozen,
so that warm-ups and interleaved repeats cannot teach a drafter the answers it is timed on, and the speedup of a
*mix* of requests, which is a ratio of summed times (a mix's throughput), not a median of per-request ratios.
"""
from __future__ import annotations

import numbers

import pandas as pd
import torch

from ..data.prompts import passage_of, traffic_mix
from ..decode import generate
from .profiling import progress_bar as tqdm


def prediction_ids(tokenizer, prompt) -> list[int]:
    """The token ids of the passage ``prompt`` is built on (:func:`~specdec_core.data.prompts.passage_of`), without
    special tokens: the prediction a caller who edits, quotes or revises that passage can pass (``prediction=``)."""
    return tokenizer(passage_of(prompt), add_special_tokens=False)["input_ids"]


def build_memory(target, drafter, prompts: list[torch.Tensor], max_new_tokens: int, k: int,
                 progress: bool = True) -> int:
    """Warm ``drafter`` (a :class:`~specdec_core.adaptive.suffix.SuffixDrafter`) on training requests, then freeze it.

    Each prompt is decoded greedily with the drafter (linear, ``k``): greedy output equals autoregressive decoding,
    and ``finish`` feeds each output to the drafter's global memory. Afterwards ``drafter.learn`` is False, so the
    evaluation requests it is timed on never enter it. Returns the number of outputs the memory holds."""
    if not prompts:
        raise ValueError("build_memory needs at least one training prompt")
    drafter.learn = True
    for ids in tqdm(prompts, desc="memory", disable=not progress):
        generate(target, ids, drafter=drafter, method="linear", k=k, max_new_tokens=max_new_tokens)
    drafter.learn = False
    return len(drafter.cached)


def greedy_identity(outputs: dict[str, dict], baseline: str) -> pd.DataFrame:
    """Per runner, how many of its greedy calls returned exactly the baseline's tokens for the same prompt.

    ``outputs``: runner -> {prompt key: tokens} (what :func:`~specdec_core.study.bench.decode_runner` fills).
    Returns ``runner, calls, identical, differ``; a prompt the baseline did not decode raises ``KeyError``."""
    base = outputs[baseline]
    rows = []
    for name, got in outputs.items():
        if name == baseline:
            continue
        same = sum(base[key] == toks for key, toks in got.items())
        rows.append(dict(runner=name, calls=len(got), identical=same, differ=len(got) - same))
    return pd.DataFrame(rows, columns=["runner", "calls", "identical", "differ"])


def choose(ratios: pd.DataFrame, candidates: dict[str, list[str]]) -> dict[str, str]:
    """The method for each request class: among that class's ``candidates``, the runner with the highest median
    paired ratio in ``ratios`` (columns ``runner, class, median``; :func:`~specdec_core.study.bench.paired_ratios`
    by class on *training* prompts), or ``"autoregressive"`` when no candidate's median exceeds 1."""
    chosen = {}
    for cls, names in candidates.items():
        rows = ratios[(ratios["class"] == cls) & ratios.runner.isin(names)]
        if rows.empty:
            raise ValueError(f"no training ratios for class {cls!r} among {names}")
        best = rows.loc[rows["median"].idxmax()]
        chosen[cls] = best.runner if best["median"] > 1 else "autoregressive"
    return chosen


def chosen_calls(runs: pd.DataFrame, rule: dict[str, str], name: str = "chooser") -> pd.DataFrame:
    """The calls of a per-request chooser, taken from runs already timed: for each request, the row of the runner
    ``rule`` assigns to its class (column ``class``), renamed ``name``. The choice depends on the class alone, which
    is known before decoding, so these are the calls the chooser would have made."""
    pick = runs[runs.runner == runs["class"].map(rule)].copy()
    missing = set(runs["class"]) - set(pick["class"])
    if missing:
        raise ValueError(f"rule {rule} picks no timed runner for class(es) {sorted(missing)}")
    pick["runner"] = name
    return pick


def mix_speedup(runs: pd.DataFrame, baseline: str, chat_ids: list, grounded_ids: list, shares, n: int | None = None,
                seeds=(0,)) -> pd.DataFrame:
    """The speedup of each runner on a traffic mix, against the input-grounded share.

    For each share and seed, :func:`~specdec_core.data.prompts.traffic_mix` draws ``n`` requests (default: as many
    as the smaller pool allows at every share) from the prompt ids ``chat_ids`` and ``grounded_ids``; the mix's
    speedup in each repeat is the baseline's summed seconds over those requests ÷ the runner's (the mix's
    throughput ratio: both decode the same tokens greedily). ``runs``: one row per call, columns ``id, runner,
    repeat, seconds``, every runner having decoded every request of both pools. Returns ``share, runner, median,
    q25, q75, n`` over repeats × seeds, ``n`` the number of those."""
    shares = list(shares)
    if not shares or any(isinstance(s, bool) or not isinstance(s, numbers.Real) or not 0 <= s <= 1 for s in shares):
        raise ValueError(f"shares must be numbers in [0, 1], got {shares!r}")
    n = n or min(len(chat_ids), len(grounded_ids))
    t = runs.pivot_table(index=["id", "repeat"], columns="runner", values="seconds", aggfunc="first")
    if baseline not in t.columns:
        raise ValueError(f"no calls of the baseline {baseline!r}")
    rows = []
    for share in shares:
        for seed in seeds:
            drawn = traffic_mix(chat_ids, grounded_ids, share, n, seed=seed)
            sub = t[t.index.get_level_values("id").isin(drawn)]
            per_rep = sub.groupby(level="repeat").sum(min_count=1)
            for name in t.columns.drop(baseline):
                for ratio in (per_rep[baseline] / per_rep[name]).dropna():
                    rows.append(dict(share=share, runner=name, ratio=ratio))
    d = pd.DataFrame(rows)
    q = d.groupby(["share", "runner"])["ratio"]
    return pd.DataFrame({"median": q.median(), "q25": q.quantile(0.25), "q75": q.quantile(0.75),
                         "n": q.size()}).reset_index()


def share_of(runs: pd.DataFrame, part: str, whole: str = "decode_s") -> pd.Series:
    """Per runner, the median over calls of ``part`` ÷ ``whole`` (e.g. the draft phase's share of the decode loop)."""
    d = runs[runs[whole] > 0]
    return (d[part] / d[whole]).groupby(d.runner).median()


def lengths(runs: pd.DataFrame, column: str = "drafted_lengths") -> pd.DataFrame:
    """One row per step: ``runner`` and the step's ``length`` from a list column kept by ``keep_steps``."""
    d = runs[["runner", column]].explode(column).dropna()
    return pd.DataFrame({"runner": d.runner.values, "length": d[column].astype(int).values})


__all__ = ["build_memory", "choose", "chosen_calls", "greedy_identity", "lengths", "mix_speedup", "prediction_ids",
           "share_of"]
