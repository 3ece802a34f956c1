"""Evaluating the shipped model draft of SmolLM2-135M-Instruct: acceptance, cost, speed, best K, and its
model card (the command line: ``scripts/eval_draft.py``).

Stages (all decoding through ``sd.generate``; timing with :mod:`specdec_core.study.bench`'s interleaved
protocol), each a function, run in order by :func:`evaluate`:

1. **K sweep** (:func:`k_sweep`) on the *held-out training prompts* (the slice the recipe holds out; the
   eval mix is never used to choose anything): autoregressive and linear SD at each K, interleaved; best K =
   the largest median paired speedup.
2. **Cost** (:func:`cost`) c = draft pass / target pass (one token each, at the first eval prompt's context)
   and the verify-pass ratio, side by side (:func:`bench.pass_costs`).
3. **Speed** (:func:`speed`) on the eval mix with the best K, greedy: autoregressive vs linear, interleaved,
   paired tokens/s ratios per task (median, IQR, range); greedy outputs compared token by token.
4. **Acceptance** (:func:`acceptance`) on the eval mix with the best K: greedy (from stage 3's runs) and
   temperature 1; α = accepted ÷ (accepted + rejections) (:func:`specdec_core.record.acceptance_rate`) per task and per
   category; acceptance by draft position, P(position i accepted | positions < i accepted).

Writes ``draft_ksweep.jsonl``, ``draft_speed.jsonl``, ``draft_alpha.jsonl``, ``draft_cost.csv`` and
``draft_summary.jsonl`` (everything the model card and the book quote) to ``data/reference/`` or the folder
given; :func:`write_card` turns a summary into the draft's ``MODEL_CARD.md``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from ..models import calibration
from ..data.prompts import encode, load_prompts, sweep_prompts
from ..decode import generate
from ..models import shipped
from ..models.hub import load_pair
from ..paths import REFERENCE_DIR
from ..record import acceptance_rate
from ..study import bench, blas, protocol, report, theory

REF = REFERENCE_DIR


class NoModelDraft(RuntimeError):
    """The pair has no shipped model draft to evaluate (``make models`` trains it)."""


def runner(pair, method, drafter, k, n, temperature=0.0, keep=None):
    """A :func:`bench.run_interleaved` runner; ``keep[id]`` receives each run's tokens and step lists."""

    def run(ids):
        r = generate(pair.target, ids, drafter=drafter, method=method, k=k, max_new_tokens=n,
                        temperature=temperature, seed=0)
        if keep is not None:
            keep.append(dict(tokens=r.tokens, accepted_lengths=r.stats["accepted_lengths"],
                             proposed=r.stats["proposed"]))
        return {"tokens": r.tokens, "tau": r.stats["tau"]}

    return run


def by_position(accepted_lengths, proposed, kmax: int) -> list[float]:
    """P(draft token i accepted | tokens 1..i-1 accepted), i = 1..kmax (NaN where never reached)."""
    out = []
    for i in range(1, kmax + 1):
        reached = sum(1 for n, k in zip(accepted_lengths, proposed) if n >= i - 1 and k >= i)
        hit = sum(1 for n, k in zip(accepted_lengths, proposed) if n >= i and k >= i)
        out.append(hit / reached if reached else float("nan"))
    return out


def pooled(rows: pd.DataFrame, key: str) -> dict:
    """α (MLE) pooled over the steps of every run in each ``key`` group."""
    return {g: acceptance_rate(d.accepted_lengths.sum(), d.proposed.sum()) for g, d in rows.groupby(key)}


def timed(pair, drafter, prompts, ks, n, repeats, keep):
    keep["ar"] = []
    runners = {"autoregressive": runner(pair, "autoregressive", None, 1, n, keep=keep["ar"])}
    for k in ks:
        keep[k] = []
        runners[f"linear-K{k}"] = runner(pair, "linear", drafter, k, n, keep=keep[k])
    return bench.run_interleaved(runners, prompts, repeats=repeats, warmup=1)


def card_table(summary: dict) -> list[str]:
    a, sp = summary["alpha"], summary["speed"]
    lines = ["| task | α greedy | α T=1 | speedup median | IQR | range |", "|---|---|---|---|---|---|"]
    for task, s in sp["per_task"].items():
        lines.append(f"| {task} | {a['greedy'][task]:.3f} | {a['t1'][task]:.3f} | {s['median']:.2f}× | "
                     f"{s['q25']:.2f}–{s['q75']:.2f} | {s['min']:.2f}–{s['max']:.2f} |")
    s = sp["all"]
    lines.append(f"| **all** | **{a['greedy_all']:.3f}** | **{a['t1_all']:.3f}** | **{s['median']:.2f}×** | "
                 f"{s['q25']:.2f}–{s['q75']:.2f} | {s['min']:.2f}–{s['max']:.2f} |")
    return lines


def feature_draft_lines() -> list[str]:
    """The Limitations bullet on the EAGLE-style experiment, from ``scripts/feature_draft.py``'s reference file."""
    path = REF / "feature_draft.json"
    if not path.exists():
        return []
    r = json.loads(path.read_text())
    labels = {"with_features": "1-layer feature draft",
              "two_step": "the same trained on its own first-step output (EAGLE-3's training-time test)",
              "features_zeroed": "features zeroed"}
    chain = lambda x: x["alpha_1"] * (1 + x["alpha_2_given_1"])  # expected accepted of the first two positions
    sh = r["shipped"]
    parts = [f"{label} {r[k]['alpha_1']:.2f} / {r[k]['alpha_2_given_1']:.2f}"
             for k, label in {"shipped": "the token-only draft shipped when it ran", **labels}.items() if k in r]
    best = max((r[k] for k in ("with_features", "two_step") if k in r), key=chain, default=sh)
    return [
        "- Would the target's own features help, as in EAGLE? `scripts/feature_draft.py` trains a draft that reads "
        "the target's final hidden state beside the next token (same records, optimiser, steps and seed; "
        "`data/reference/feature_draft.json`). Held-out training prompts, teacher-forced, first draft token α₁ / "
        f"second given the first α₂|₁: {'; '.join(parts)}. Expected accepted tokens over the first two positions "
        f"(α₁(1 + α₂|₁)): token-only {chain(sh):.2f}, the best feature draft {chain(best):.2f}. On a 135M target the "
        "features buy a few points on the first token; none of these is near α 0.6.",
    ]


SPEED_WORDS = {"faster": "is faster than", "slower": "is slower than", "ties": "ties with",
               "not measured": "was not timed against"}


def speed_words(s: dict) -> str:
    """The verdict on a speed summary (``median`` and the test's ``p``, ``power``, ``n_tell`` over ``prompts``) as
    words before "autoregressive decoding"; a summary without a test (an older report) says so."""
    word = report.verdict_of(dict(s, n=s.get("prompts", s.get("n", 0))))
    if not word:
        return "was compared, without a test, with"
    return SPEED_WORDS.get(word, "cannot be told apart, at this size, from")


def data_line(rec: dict, tr: dict) -> str:
    """The card's data bullet for the recipe's teacher set (``first`` or ``wide``)."""
    tail = (f"{tr['train_records']} training records, {tr['train_tokens']} response tokens; {rec['val_frac']:.0%} of "
            "the prompts held out for model selection")
    if rec.get("teacher", "first") == "first":
        return (f"- data: `data/prompts/train.jsonl` ({tr['plan']['modes'][0][2] + tr['plan']['modes'][1][2]} of its "
                "prompts; built by `scripts/make_train_prompts.py` from the project's own templates × topics, disjoint "
                f"from the eval mix); the target answers {rec['greedy_prompts']} greedily and {rec['sample_prompts']} "
                f"others at temperature 1, up to {rec['max_new_tokens']} tokens: {tail}")
    st = tr["stages"]
    part = lambda i: (f"{i['plan']['modes'][0][2]} greedily and {i['plan']['modes'][1][2]} at temperature 1, up to "
                      f"{i['plan']['max_new_tokens']} tokens")
    return ("- data: the wide teacher set (`scripts/make_teacher_data.py`, `data/prompts/README.md`), disjoint from the "
            f"eval mix: the target answers the writing requests of `train_writing.jsonl` ({part(st['writing'])}), whose "
            "cleaned answers are the passages of `train_wide.jsonl`'s summaries, questions, rewrites and translations, "
            f"then every prompt of `train.jsonl`, `train_more.jsonl` and `train_wide.jsonl` ({part(st['answers'])}): "
            + tail)


def card_text(summary: dict, folder: Path = shipped.MODEL_DRAFT) -> str:
    """The model card of the draft in ``folder`` (its config and checksums) from an :func:`evaluate` summary."""
    cfg = json.loads((folder / "config.json").read_text())
    rec, tr = cfg["recipe"], cfg["training"]
    sums = shipped.read_sums(folder)
    size_mb = (folder / "model.safetensors").stat().st_size / 1e6
    a, c = summary["alpha"], summary["cost"]
    K = summary["best_k"]
    step_cost = K * c["c"] + c["verify_ratio"]
    step_yield = float(theory.expected_tokens(a["greedy_all"], K))
    cats = ", ".join(f"{k} {v:.2f}/{a['t1_by_category'][k]:.2f}" for k, v in a["greedy_by_category"].items()
                     if k not in a["greedy"])
    lines = [
        "# smollm2-135m-draft — the model draft of SmolLM2-135M-Instruct",
        "",
        f"A {cfg['num_hidden_layers']}-layer Llama trunk between SmolLM2-135M-Instruct's own token embedding and "
        f"a {cfg['draft_vocab_size']}-row slice of its tied LM head (both frozen and shared in memory with the "
        "target; neither is stored here). `sd.load_pair(\"smollm2-135m\")` attaches it as `.drafters[\"model\"]` "
        "(the default `.drafter`) once its SHA-256 checksums pass. Outside its vocabulary the draft's law q is "
        "exactly 0 (logits −inf), so speculative decoding with it stays lossless.",
        "",
        "## Files",
        f"- `model.safetensors` ({size_mb:.1f} MB): trunk layers + final norm (float16), `draft_vocab` (int64 ids)",
        f"  — SHA-256 `{sums['model.safetensors']}`",
        f"- `config.json`: architecture, the full recipe and the training log — SHA-256 `{sums['config.json']}`",
        "- `SHA256SUMS`: both digests (`cd data/drafts/smollm2-135m-draft && sha256sum -c SHA256SUMS`)",
        "",
        "## Recipe (`scripts/train_drafts.py`, `Recipe`)",
        f"- trunk: target layers {list(rec['layers'])} (in that order) + the target's final RMSNorm, all trainable "
        f"({cfg['num_hidden_layers']} × 3.5 M parameters); embedding and head frozen",
        f"- draft vocabulary: the {rec['draft_vocab']} most frequent tokens of the target's training responses "
        f"(+ EOS); they cover {tr['vocab_coverage_val']:.1%} of held-out response tokens",
        data_line(rec, tr),
        f"- loss: cross-entropy to the target's next-token law at every response position (self-distillation; "
        f"the target's top-{rec['top_k_record']} restricted to the draft vocabulary, renormalised)",
        f"- optimiser: AdamW, {json.dumps(rec['train'])}",
        f"- seed {rec['seed']}; training {tr['train_seconds']:.0f} s ({tr['train_seconds'] / 60:.0f} min, 2 CPU threads; "
        f"summed over resumed runs); teacher data {tr['teacher_seconds']:.0f} s in the run that wrote these weights "
        "(generated, or loaded from `data/train_cache/` when already there)",
        "- reproduce: `make models FORCE=1` (retrains, then reports how close it lands to this draft); "
        "evaluate: `python scripts/eval_draft.py --write-card`",
        "",
        f"## Measured — eval mix `data/prompts/eval.jsonl` ({summary['n_eval_prompts']} prompts, first turns, "
        f"{summary['max_new_tokens']} new tokens, K = {summary['best_k']}, 2 CPU threads)",
        "",
        f"Held-out training prompts, teacher-forced: greedy α {tr['val_greedy_alpha']:.3f}, "
        f"temperature-1 α ≥ {tr['val_t1_alpha']:.3f}.",
        "",
        *card_table(summary),
        "",
        "- α = accepted ÷ (accepted + rejections), the per-token acceptance rate (`specdec_core.record.acceptance_rate`); speedup = "
        "linear-SD tokens/s ÷ autoregressive tokens/s on the same prompt, interleaved in one run",
        f"- multi_turn categories (α greedy / T=1): {cats}",
        f"- acceptance by draft position, greedy: {', '.join(f'{x:.2f}' for x in a['by_position_greedy'])}; "
        f"T=1: {', '.join(f'{x:.2f}' for x in a['by_position_t1'])}",
        f"- cost c = draft pass ÷ target pass = {c['draft_ms']:.2f} ms ÷ {c['target_ms']:.2f} ms = **{c['c']:.3f}**; "
        f"verify pass over {summary['best_k'] + 1} tokens = {c['verify_ratio']:.2f} target passes",
        f"- best K on this machine: **{summary['best_k']}**, chosen on held-out training prompts (median paired "
        f"speedups {', '.join(f'K={k}: {v:.2f}×' for k, v in summary['k_sweep'].items())})",
        f"- tokens/s (medians): autoregressive {summary['speed']['ar_tokens_per_s']:.1f}, linear SD "
        f"{summary['speed']['sd_tokens_per_s']:.1f}; greedy outputs identical in {summary['speed']['equal']} of "
        f"{summary['speed']['n']} runs",
        "",
        "## Limitations (read before quoting a speedup)",
        f"- The held-out α ({tr['val_greedy_alpha']:.2f}) comes from prompts "
        + ("built by the same templates as the training set" if rec.get("teacher", "first") == "first" else
           "of the training set's own kinds") + f"; on the eval mix the draft reaches α {a['greedy_all']:.2f}"
        + (": it generalises poorly to task types the templates cover thinly (retrieval contexts, translation). "
           "Broader training prompts are the first lever." if rec.get("teacher", "first") == "first" else
           f" (lowest: {min(a['greedy'], key=a['greedy'].get)} {min(a['greedy'].values()):.2f})."),
        f"- At α = {a['greedy_all']:.2f}, linear SD {speed_words(summary['speed']['all'])} "
        f"autoregressive decoding on a 2-core CPU. A step costs K·c + v = {step_cost:.2f} target passes (K draft "
        f"passes and one verification pass over K + 1 tokens, v = {c['verify_ratio']:.2f} one-token passes with "
        f"MKL path `{c.get('blas', 'MKL default')}`, see chapter 1, Going deeper D) and must yield more than that many tokens to "
        f"win; at α = {a['greedy_all']:.2f} it yields (1 − α^(K+1)) / (1 − α) = {step_yield:.2f}.",
        *feature_draft_lines(),
        *calibration_lines(folder),
        *curve_lines(drafted=shipped.drafted_point(folder)),
        "",
        "From `scripts/eval_draft.py` → `data/reference/draft_*`. Timings depend on the machine and its load; "
        "only ratios measured within one interleaved run are quoted.",
        "",
    ]
    return "\n".join(lines)


def calibration_lines(folder: Path = shipped.MODEL_DRAFT) -> list[str]:
    """The card's section on the stored confidence threshold (none without ``confidence.json``)."""

    rec = calibration.load(folder)
    if rec is None:
        return []
    t = {r["runner"]: r for r in rec["table"]}
    fixed = t[f"model, K={rec['fixed_k']}"]
    return ["", "## Confidence threshold (`confidence=\"auto\"`)",
            f"`confidence.json` (listed in `SHA256SUMS`): the θ `generate(..., confidence=\"auto\")` uses, chosen by "
            f"`scripts/calibrate_confidence.py` on {rec['prompts']} held-out training prompts ({rec['max_new_tokens']} "
            "tokens, greedy, one interleaved run; the eval mix is not read): "
            + "; ".join(f"{d}: θ = {v} ({t[f'{d}, θ={v}']['median']:.2f}× over autoregressive, up to "
                        f"{rec['k_max']} tokens a step)" for d, v in rec["theta"].items())
            + f"; the best fixed K there: {rec['fixed_k']} ({fixed['median']:.2f}×). The chooser's c = {rec['cost']} "
            "was measured in the same run. Retraining the draft drops the file from `SHA256SUMS`: recalibrate."]


CURVE_SETS = {  # draft_curve.py --teacher (the recipe's own names are teacher.TEACHER_SETS)
    "pilot": "the recipe's own answers to `train.jsonl` plus the target's answers to `train_more.jsonl`",
    "wide": "the target's answers to every training prompt file (`train.jsonl`, `train_more.jsonl`, `train_wide.jsonl`) "
            "and to the writing requests whose answers became the passages (`scripts/make_teacher_data.py`)",
}


def curve_lines(path: Path = REF / "draft_curve.json", drafted: tuple[int, int] | None = None) -> list[str]:
    """The card's learning-curve table (``scripts/draft_curve.py``); none before that run. ``drafted``: the
    card's draft as (trunk layers, training response tokens), to say whether it is the rule's choice."""
    if not Path(path).exists():
        return []
    cj = json.loads(Path(path).read_text())
    rows = [f"| {p['layers']} | {p['tokens'] / 1e3:.0f}k | {p['heldout']['all']['greedy_alpha']:.3f} | "
            f"{p['eval']['all']['greedy_alpha']:.3f} | {p['eval']['all']['t1_alpha']:.3f} | "
            f"{p.get('eval_predicted_speedup', float('nan')):.2f}× (K = {p.get('eval_best_k')}) |"
            for p in sorted(cj["points"], key=lambda p: (p["layers"], p["tokens"]))]
    choice = cj["ship_rule_choice"]
    teacher = cj.get("teacher", {}).get("set", "pilot")  # the first curve's report has no "set" key
    if drafted is None:
        verdict = ""
    elif tuple(drafted) == (choice["layers"], choice["tokens"]):
        verdict = " The draft this card describes is that choice."
    else:
        verdict = (f" The draft this card describes ({drafted[0]} layer(s), {drafted[1] / 1e3:.0f}k tokens) is not "
                   "that choice.")
    return ["", "## Learning curve (`scripts/draft_curve.py`, `data/reference/draft_curve.json`; chapter 3)",
            f"The recipe on nested shares of {CURVE_SETS[teacher]}, teacher-forced α (greedy; T = 1 a lower bound) "
            "and the speedup Theorem 3.8 predicts from eval α with c and the verify cost measured per depth:", "",
            "| layers | response tokens | held-out greedy α | eval greedy α | eval T = 1 α | predicted (eval α) |",
            "|---|---|---|---|---|---|", *rows, "",
            f"The rule fixed beforehand ({cj['ship_rule']}) picks {choice['layers']} layer(s) on "
            f"{choice['tokens'] / 1e3:.0f}k tokens.{verdict}"]


def write_card(summary: dict, folder: Path = shipped.MODEL_DRAFT) -> Path:
    """(Re)write ``folder/MODEL_CARD.md`` from an :func:`evaluate` summary."""
    path = Path(folder) / "MODEL_CARD.md"
    path.write_text(card_text(summary, folder))
    return path




def _quiet(line: str) -> None:
    pass


# -- the stages -----------------------------------------------------------------------------------------
def k_sweep(pair, drafter, prompts, ks, n: int, out: Path, log=_quiet) -> tuple[int, dict]:
    """Stage 1: autoregressive and linear SD at each K, interleaved; writes ``draft_ksweep.jsonl``. Returns
    (best K, {K: median paired speedup})."""
    log(f"K sweep: {len(prompts)} held-out training prompts, K in {ks}")
    df = timed(pair, drafter, prompts, ks, n, 1, {})
    bench.write_jsonl(df, out / "draft_ksweep.jsonl")
    ratios = bench.paired_ratios(df, baseline="autoregressive")
    k_med = {int(r.runner.removeprefix("linear-K")): float(r["median"]) for _, r in ratios.iterrows()}
    best_k = max(k_med, key=k_med.get)
    log(f"median speedup by K: { {k: round(v, 3) for k, v in sorted(k_med.items())} } -> best K {best_k}")
    return best_k, k_med


def cost(pair, drafter, ids, k: int, out: Path, log=_quiet) -> dict:
    """Stage 2: c and the verify ratio at K, side by side; writes ``draft_cost.csv``."""
    costs = bench.pass_costs(pair.target, drafter.model, ids, ks=(k,), repeats=40)
    c = dict(c=costs["c"], draft_ms=costs["ms"]["draft[1]"], target_ms=costs["ms"]["target[1]"],
             verify_ratio=costs["verify_ratio"][k], k=k, blas=blas.mode())
    pd.DataFrame([c]).to_csv(out / "draft_cost.csv", index=False)
    log(f"c = {c['draft_ms']:.2f} ms / {c['target_ms']:.2f} ms = {c['c']:.3f}; "
        f"verify({k + 1} tokens) = {c['verify_ratio']:.2f} target passes")
    return c


def spread(x: pd.Series) -> dict:
    return dict(median=float(x.median()), q25=float(x.quantile(.25)), q75=float(x.quantile(.75)),
                min=float(x.min()), max=float(x.max()), n=int(x.size))


def speed(pair, drafter, encoded, k: int, n: int, repeats: int, log=_quiet):
    """Stage 3: autoregressive vs linear SD at K on the eval mix (greedy), interleaved. Returns the linear
    runs (with their tokens, per-step counts, equality with autoregressive and paired speedup), the
    autoregressive runs and the speed summary."""
    log(f"speed: {len(encoded)} eval prompts × {repeats} repeats, K={k}")
    keep = {}
    df = timed(pair, drafter, encoded, [k], n, repeats, keep)
    # each runner's kept runs are in the order of its rows in df, after one warm-up run
    lin = df[df.runner == f"linear-K{k}"].reset_index(drop=True)
    lin = lin.assign(**{key: [r[key] for r in keep[k][1:]] for key in ("tokens", "accepted_lengths", "proposed")},
                     temperature=0.0)
    ar = df[df.runner == "autoregressive"].reset_index(drop=True).assign(tokens=[r["tokens"] for r in keep["ar"][1:]])
    ar_tokens = {(r.id, r.repeat): r.tokens for r in ar.itertuples()}
    lin["equal"] = [t == ar_tokens[(i, rep)] for i, rep, t in zip(lin["id"], lin["repeat"], lin["tokens"])]
    base = ar.set_index(["id", "repeat"]).tokens_per_s
    lin["speedup"] = lin.tokens_per_s.values / base.loc[list(zip(lin["id"], lin["repeat"]))].values
    test = protocol.summarise(lin.speedup, units=lin["id"])  # over distinct prompts: the verdict's sample
    sp = dict(per_task={t: spread(g.speedup) for t, g in lin.groupby("task", sort=False)},
              all=spread(lin.speedup) | {k: test[k] for k in ("p", "power", "n_tell")} | {"prompts": test["n"]},
              ar_tokens_per_s=float(ar.tokens_per_s.median()), sd_tokens_per_s=float(lin.tokens_per_s.median()),
              equal=int(lin.equal.sum()), n=len(lin))
    for t, s in [*sp["per_task"].items(), ("all", sp["all"])]:
        log(f"  {t:15s} speedup median {s['median']:.2f}×  IQR {s['q25']:.2f}–{s['q75']:.2f}  "
            f"range {s['min']:.2f}–{s['max']:.2f}")
    log(f"  greedy outputs identical to autoregressive in {sp['equal']}/{sp['n']} runs")
    return lin, ar, sp


def acceptance(pair, drafter, encoded, lin: pd.DataFrame, k: int, n: int, log=_quiet) -> tuple[pd.DataFrame, dict]:
    """Stage 4: greedy acceptance from stage 3's linear runs, temperature 1 decoded now. Returns one row per
    run (without tokens: what ``draft_alpha.jsonl`` holds) and α per task, category and draft position."""
    t1 = []
    for meta, ids in encoded:
        r = generate(pair.target, ids, drafter=drafter, method="linear", k=k, max_new_tokens=n,
                     temperature=1.0, seed=0)
        t1.append(dict(meta, temperature=1.0, tokens=r.tokens, accepted_lengths=r.stats["accepted_lengths"],
                       proposed=r.stats["proposed"], new_tokens=len(r.tokens)))
    cat = {m["id"]: m["category"] for m, _ in encoded}
    acc = pd.concat([lin.assign(category=lin["id"].map(cat))[["id", "task", "category", "temperature", "tokens",
                                                              "accepted_lengths", "proposed", "new_tokens"]],
                     pd.DataFrame(t1)], ignore_index=True)
    g, s1 = acc[acc.temperature == 0.0], acc[acc.temperature == 1.0]
    alpha = dict(greedy=pooled(g, "task"), t1=pooled(s1, "task"),
                 greedy_by_category=pooled(g, "category"), t1_by_category=pooled(s1, "category"),
                 greedy_all=acceptance_rate(g.accepted_lengths.sum(), g.proposed.sum()),
                 t1_all=acceptance_rate(s1.accepted_lengths.sum(), s1.proposed.sum()),
                 by_position_greedy=by_position(sum(g.accepted_lengths, []), sum(g.proposed, []), k),
                 by_position_t1=by_position(sum(s1.accepted_lengths, []), sum(s1.proposed, []), k))
    log(f"α greedy: { {t: round(v, 3) for t, v in alpha['greedy'].items()} } all {round(alpha['greedy_all'], 3)}")
    log(f"α T=1   : { {t: round(v, 3) for t, v in alpha['t1'].items()} } all {round(alpha['t1_all'], 3)}")
    log(f"acceptance by position, greedy: {[round(x, 3) for x in alpha['by_position_greedy']]} "
        f"T=1: {[round(x, 3) for x in alpha['by_position_t1']]}")
    return acc.drop(columns=["tokens"]), alpha


def evaluate(out: Path = REF, max_new_tokens: int = 128, ks=(2, 3, 4, 5, 6, 8), k: int | None = None,
             n_sweep: int = 12, repeats: int = 1, per_task: int | None = None,
             log: Callable[[str], None] = _quiet) -> dict:
    """Every stage on the shipped model draft (``k`` given: no sweep, that K); writes the ``draft_*`` files to
    ``out`` and returns the summary (what ``draft_summary.jsonl`` holds and :func:`write_card` reads)."""
    t0 = time.perf_counter()
    pair = load_pair("smollm2-135m")
    if "model" not in pair.drafters:
        raise NoModelDraft("no shipped model draft in data/drafts/smollm2-135m-draft: run `make models` first")
    drafter, n = pair.drafters["model"], max_new_tokens
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if k is None:
        best_k, k_med = k_sweep(pair, drafter, sweep_prompts(pair, n_sweep), list(ks), n, out, log)
    else:
        best_k, k_med = k, {}
    encoded = [(dict(id=p.id, task=p.task, category=p.category), encode(pair, p))
               for p in load_prompts(per_task=per_task)]
    c = cost(pair, drafter, encoded[0][1], best_k, out, log)
    lin, ar, sp = speed(pair, drafter, encoded, best_k, n, repeats, log)
    acc, alpha = acceptance(pair, drafter, encoded, lin, best_k, n, log)
    bench.write_jsonl(acc, out / "draft_alpha.jsonl")
    bench.write_jsonl(pd.concat([ar.drop(columns=["tokens"]), lin.drop(columns=["tokens", "accepted_lengths",
                                                                                   "proposed"])]),
                      out / "draft_speed.jsonl")
    summary = dict(max_new_tokens=n, best_k=best_k, k_sweep=k_med, cost=c, alpha=alpha, speed=sp,
                   n_eval_prompts=len(encoded), seconds=round(time.perf_counter() - t0, 1),
                   draft_sha256=shipped.read_sums(shipped.MODEL_DRAFT)["model.safetensors"])
    (out / "draft_summary.jsonl").write_text(json.dumps(summary) + "\n")
    return summary


def last_summary(out: Path = REF) -> dict:
    """The summary of the last :func:`evaluate` run into ``out``."""
    return json.loads((Path(out) / "draft_summary.jsonl").read_text().splitlines()[-1])
