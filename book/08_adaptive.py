# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 8 · Adaptive speculation: draft only where the draft is sure
#
# A fixed K spends draft passes on positions the draft will get wrong, and stops short on easy runs where it
# would have been right. Three cheap adaptations need no training:
#
# - **a confidence stop**: draft up to K tokens, but stop before the first position (after the first) whose
#   draft law q has its largest probability below θ: `sd.generate(..., k=K_max, confidence=θ)`. Greedy decoding
#   reads the draft's softmax at temperature 1 (transformers' `assistant_confidence_threshold` does the same).
#   For trees (`method="tree"`) the same argument prunes: a node whose score (the draft's probability of
#   reaching it, as in EAGLE-2) is below θ gets no children. `confidence="auto"` uses the θ stored with the
#   draft, chosen on training prompts;
# - **a hybrid drafter**, `pair.drafters["hybrid"]`: prompt lookup where the context's last n-gram recurs (free:
#   no model pass), else the draft model;
# - **a chooser**, `pair.drafters["adaptive"]`: lookup or the model, whichever the sequence's past verdicts
#   predict commits more tokens per unit of time (each drafter's α estimated from its own accepted and rejected
#   tokens so far, Theorem 3.8's expected tokens, the model's K draft passes at cost c).
#
# All three stay exact for one reason: speculative sampling is lossless for any proposal law q, as long as q is the
# law the token was drawn from and the choice of q (which drafter, how many tokens) is made from the committed
# context and the draft's own draws. The stop reads q at a position before the target has seen it; the hybrid's
# test reads the context only; the chooser reads the context and the verdicts of *past* steps, committed before
# this step's draft exists; a lookup proposal is deterministic given the context, so its law is the one-hot on
# the token, whose accept rule min(1, p(x)/1) and residual ∝ p with x removed give back p. Chapter 2's family
# tests them all (specs `linear:hybrid`, `linear:adaptive`, `linear:model@0.6`, `parallel:block@0.6`,
# `tree:model@0.3`); a stop that peeks at the target's law (`mutants.PeekingStop`) and a chooser that swaps drafters
# where the target disfavours the drawn token (`mutants.PeekingChooser`) are caught by the same family test in
# `tests/test_adaptive.py`.
#
# Every setting is chosen on held-out *training* prompts first (the draft's recipe holds them out, built from the
# same templates as its training data), then the evaluation mix is measured once, in one interleaved run per
# temperature.

# %% tags=["parameters"]
model = "smollm2-135m"        # embedded name, Hugging Face id or path
draft = None                  # optional draft id/path (default: the shipped draft)
tune_prompts = 6              # held-out training prompts for choosing K and θ
per_task = 1                  # evaluation prompts per task
tasks = None                  # None: all six tasks; or a list of them, e.g. ["qa", "rag"]
max_new_tokens = 64
tune_repeats = 1              # interleaved repeats while tuning
repeats = 2                   # interleaved repeats of the evaluation run
temperatures = [0.0, 1.0]     # evaluation runs; 0 means greedy (tuning is greedy)
fixed_ks = [1, 2, 3, 4]       # the model draft's fixed K: the baseline the adaptive methods are compared with
thetas = [0.3, 0.5, 0.7, 0.9]  # confidence thresholds tried
k_max = 6                     # the most a confidence-stopped step drafts
k_ngram = 4                   # prompt lookup's K (chapter 6's setting)
device = "cpu"
dtype = "float32"  # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
out_dir = "../build/book/08_adaptive"
params_name = None            # the parameter file's name, injected by scripts/run_book.py (banner)

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from specdec_core.study import calibrate
from specdec_core.study import bench, report
from specdec_core.data.prompts import sweep_prompts
from specdec_core.tools import book
from specdec_core.study import figures
from specdec_core.study import exactness as ex

display(book.banner(params_name))
ch = book.setup(out_dir, model, draft=draft, device=device, dtype=dtype, per_task=per_task, tasks=tasks,
                need=("model", "ngram", "hybrid", "adaptive"))
pair = ch.pair
print(ch)


# %% [markdown]
# ## 1. Choosing K and θ on training prompts
# Greedy, one interleaved run over held-out training prompts: every candidate's speedup over autoregressive
# decoding (paired by prompt and repeat): the model draft at each fixed K, and each θ with the model draft, the
# hybrid and the chooser (`pair.drafters["adaptive"]`, lookup or the model from the acceptance each has had in
# the sequence so far). The best of each family is taken from this table and nothing else. This is what
# `scripts/calibrate_confidence.py` runs, at its own size, to store the θ that `confidence="auto"` reads
# (`specdec_core.study.calibrate`).

# %%
display(ch.setting(k_max))  # the longest verify pass a confidence-stopped step makes, timed on the median prompt
tune_set = sweep_prompts(pair, tune_prompts)
cand = calibrate.candidates(fixed_ks, thetas, k_max)
tune, tr = calibrate.tune(pair, tune_set, cand, max_new_tokens, repeats=tune_repeats)
ch.save(tune, "tune_runs")
ch.save(tr.reset_index(), "tuning")
chosen = calibrate.choose(tr)


def phrase(row) -> str:
    return report.ratio_phrase_median(row["median"], row.q25, row.q75, n=int(row.n))


def resolved(prefix: str, name: str) -> str:
    """Whether the choice by median is clear of its rivals' IQRs (else a tie the chosen setting wins by median)."""
    rivals = report.rivals(tr[tr.index.str.startswith(prefix)], name)
    return (f"; chosen by median, its IQR overlaps {'; '.join(f'“{r}”' for r in rivals)}: not resolved at this size"
            if rivals else "")


def stored_line(stored: dict | None) -> str:
    """The θ stored with the draft (what `confidence="auto"` uses) against this run's choices."""
    if not stored:
        return "- **Stored with the draft**: none (no `confidence.json`: `confidence=\"auto\"` is unavailable)."
    mine = {calibrate.ROLES[r].split(",")[0]: calibrate.theta_of(n) for r, n in chosen.items() if "θ=" in n}
    differ = [f"{f} (stored {t}, here {mine[f]})" for f, t in stored["theta"].items() if f in mine and mine[f] != t]
    return (f"- **Stored with the draft** (`confidence=\"auto\"`, `scripts/calibrate_confidence.py` on "
            f"{stored.get('prompts', '?')} training prompts): θ " + ", ".join(f"{f} {t}" for f, t in stored["theta"].items())
            + (f"; this run chose differently for {', '.join(differ)}." if differ else "; this run chose the same θ."))


display(Markdown("\n".join(f"- **{role}**: “{name}”, on training prompts against autoregressive decoding "
                           f"{phrase(tr.loc[name])}, α = {tr.loc[name, 'alpha']:.2f}"
                           f"{resolved(calibrate.ROLES[role], name)}"
                           for role, name in chosen.items())
                 + "\n" + stored_line(getattr(pair.drafters["model"], "calibration", None))))
book.show(tr.drop(columns=["family", "setting"]),
          f"Tuning on {len(tune_set)} held-out training prompts, greedy: each candidate's paired tokens/s ratio over "
          "autoregressive decoding (median, q25, q75 over n calls), its α and drafted tokens per step.", prefill=True)

# %% [markdown]
# Speedup and α against θ on the training prompts; the dashed line is the best fixed K.

# %%
sw = tr[tr.index.str.contains("θ=")].assign(theta=lambda d: d.setting.str.removeprefix("θ=").astype(float))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for ax, col, lab in ((axes[0], "median", "speedup over autoregressive"), (axes[1], "alpha", "α")):
    for i, (fam, g) in enumerate(sw.groupby("family", sort=False)):
        g = g.sort_values("theta")
        if col == "median":
            ax.errorbar(g.theta, g["median"], yerr=[g["median"] - g.q25, g.q75 - g["median"]], marker="o",
                        capsize=3, color=f"C{i}", label=fam)
        else:
            ax.plot(g.theta, g[col], marker="o", color=f"C{i}", label=fam)
    ax.set(xlabel="confidence threshold θ", ylabel=lab)
axes[0].axhline(tr.loc[chosen["fixed K"], "median"], color="k", ls="--", lw=1, label=f"best fixed: {chosen['fixed K']}")
axes[0].axhline(1, color="0.5", lw=1)
axes[0].legend(fontsize=8)
fig.suptitle("tuning on held-out training prompts (greedy)")
fig.tight_layout()
ch.savefig(fig, "tuning")

# %% [markdown]
# ## 2. The evaluation mix, measured once
# The settings chosen above, against autoregressive decoding, prompt lookup alone (K = `k_ngram`) and the model
# draft at its best fixed K, in one interleaved run per temperature.

# %%
final = {"prompt lookup": dict(method="linear", drafter="ngram", k=k_ngram)}
final |= {f"{role} ({name})": cand[name] for role, name in chosen.items()}
frames, greedy_out = [], {name: {} for name in ["autoregressive", *final]}  # greedy tokens per runner and prompt
for temp in temperatures:
    out = greedy_out if temp == 0.0 else {}
    rs = {n: bench.decode_runner(pair.target, max_new_tokens, temp, outputs=out.get(n), **bench.method_kwargs(pair, kw))
          for n, kw in {"autoregressive": dict(method="autoregressive"), **final}.items()}
    frames.append(bench.run_interleaved(rs, ch.bench_prompts, repeats=repeats).assign(temperature=temp))
runs = pd.concat(frames, ignore_index=True)
ch.save(runs, "eval_runs")
overall = pd.concat([bench.paired_ratios(runs[runs.temperature == t], "autoregressive").assign(temperature=t)
                     for t in temperatures])
by_task = pd.concat([bench.paired_ratios(runs[runs.temperature == t], "autoregressive", by=["task"])
                     .assign(temperature=t) for t in temperatures])
alphas = pd.concat([bench.pooled_alpha(runs[runs.temperature == t]).rename("alpha").reset_index().assign(temperature=t)
                    for t in temperatures])
overall = overall.merge(alphas, on=["runner", "temperature"], how="left")
ch.save(overall, "eval_overall")
ch.save(by_task, "eval_by_task")
ch.savefig(figures.speedup_by_task(by_task, y="median", hue="runner"), "eval_by_task")
book.show(overall, f"The evaluation mix ({len(ch.prompts)} prompts × {report.count(repeats, 'repeat')}), each "
          "temperature in one interleaved run: paired tokens/s ratios over autoregressive decoding (median, q25, q75 "
          "over n calls) and α pooled over the calls.", prefill=True)

# %% [markdown]
# Greedy outputs: every method decoded the autoregressive text (float32; a divergence is excused only at a
# near-tie of the target's two best logits, as in chapter 2).

# %%
ties, checked = [], 0
if 0.0 in temperatures:
    for p, ids in ch.encoded:
        key = tuple(ids.tolist())
        ref = greedy_out["autoregressive"][key]
        for name in final:
            pos, gap = ex.first_divergence(pair.target, ids, greedy_out[name][key], ref)
            assert ex.excused(pos, gap), f"{name} on {p.id}: diverges at token {pos} (top-2 gap {gap})"
            checked += 1
            if pos is not None:
                ties.append((name, p.id, pos, gap))
print(f"{checked} greedy decodes equal autoregressive decoding" + (f"; near-ties: {ties}" if ties else ""))

# %% [markdown]
# ## Summary
# The mechanisms: a confidence stop trades draft passes that would have been rejected for verify passes that
# come sooner; it pays where the draft's confidence tracks the target's agreement, and costs a wasted draft pass
# at each stop (the pass that revealed the low confidence). The hybrid's lookup is free where the context repeats
# itself and falls back to the model elsewhere. What this run measured:

# %%
ov = overall.set_index(["temperature", "runner"])
lines = []
for t in temperatures:
    o = ov.loc[t].sort_values("median", ascending=False)
    n_t = int(o.n.min())
    lines.append(f"- **T = {t}**: " + "; ".join(f"{r}: {phrase(x)}" for r, x in o.iterrows()) + ".")
    top, below = o.index[0], o.index[o.q75 < 1]  # below: the whole IQR under 1
    close = report.rivals(o, top)
    lines.append(f"  Highest median: {top}, {o.loc[top, 'median']:.2f}×"
                 + (f", its IQR overlapping {', '.join(close)}: the medians give no order." if close else
                    ", its IQR clear of the others': " + report.judged("the best method of this run", n_t) + ".")
                 + (" Whole IQR below 1 (" + ", ".join(below) + "): "
                    + report.judged("slower than autoregressive decoding", n_t) + "." if len(below) else
                    " No method's IQR lies below 1."))
fk = next(n for n in final if n.startswith("fixed K"))
mc = next(n for n in final if n.startswith("model + confidence"))
for t in temperatures:
    d = runs[runs.temperature == t]
    speed = d.set_index(["id", "repeat"]).groupby("runner").tokens_per_s
    x = speed.get_group(mc) / speed.get_group(fk)
    # a ratio between two runners says nothing about either against autoregressive decoding: set both beside it
    lines.append(f"- **Confidence stop against the best fixed K, T = {t}**: {report.ratio_phrase(x.dropna())}. "
                 f"Each against autoregressive decoding: {mc} {phrase(ov.loc[(t, mc)])}; {fk} {phrase(ov.loc[(t, fk)])}"
                 + (" (both medians below 1: this ratio compares two runners that each decode fewer tokens/s than "
                    "autoregressive decoding by median)" if max(ov.loc[[(t, mc), (t, fk)], "median"]) < 1 else "") + ".")
lines.append("- **From training prompts to the evaluation mix (greedy)**: " + "; ".join(
    f"{role} ({name}) {tr.loc[name, 'median']:.2f}× → {ov.loc[(0.0, f'{role} ({name})'), 'median']:.2f}×"
    for role, name in chosen.items() if (0.0, f"{role} ({name})") in ov.index)
    + f" (α on the training prompts {tr.loc[list(chosen.values()), 'alpha'].min():.2f}–"
    f"{tr.loc[list(chosen.values()), 'alpha'].max():.2f}, on the mix {ov.loc[0.0].alpha.min():.2f}–"
    f"{ov.loc[0.0].alpha.max():.2f}).")
bt = by_task.reset_index(drop=True)
worst = bt.loc[bt.groupby(["runner", "temperature"])["median"].idxmin()]
lines.append(f"- **Weakest task per method (greedy; {report.count(bt.n.min(), 'paired call', bt.n.max())} per task, the "
             "table below)**: " + "; ".join(f"{r.runner}: {r.task} {r.median:.2f}×"
                                             for r in worst[worst.temperature == 0.0].itertuples()) + ".")
display(Markdown("\n".join(lines)))
book.show(by_task.pivot_table(index=["temperature", "task"], columns="runner", values="median"),
          "Median paired tokens/s ratio over autoregressive decoding per task "
          f"({report.count(bt.n.min(), 'paired call', bt.n.max())} per task and method).", prefill=True, digits=2)

# %% [markdown]
# ## Exercises
#
# 1. Plot, per draft position, the draft's confidence against whether the target accepted the token
#    (`bench.step_table` keeps the steps). Is max q a calibrated predictor of acceptance for this draft?
# 2. Make the hybrid demand a longer match (`HybridDrafter(..., min_match=2)`). Which tasks change?
# 3. The chooser forgets nothing within a sequence. Give it a window (counts of the last 8 steps per drafter
#    only): is it still exact (what may it read?), and does it help on the tasks that switch between copying
#    and writing (multi-turn, RAG)?
# 4. Compare `method="tree", confidence=θ` with the static default tree on the training prompts: which θ, if
#    any, beats the best chain of the table above?
