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
# **The question.** A fixed draft length K (the tokens drafted per step; [notation](notation.md)) wastes draft
# passes where the draft will be wrong. It also stops short on easy runs where the draft would have been right.
# Can the drafter decide, step by step, how far to draft, and still decode exactly?
#
# **The answer.** Yes, in three cheap ways that need no training. A confidence stop ends the draft where the draft
# model is unsure. A hybrid drafter copies from the context where it repeats itself. A chooser picks the drafter
# whose past steps in this sequence went best. Each choice reads only the committed text and the draft's own draws,
# so the output keeps the target's distribution. Whether they beat the best fixed K is measured here: this run's
# numbers are in the evaluation table and in the summary at the end.
#
# This chapter changes the *draft* half of the step pictured in [chapter 0](00_quickstart.ipynb); the verify half
# stays the same.

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

# %% tags=["hide-input"]
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from IPython.display import Markdown, display

import specdec_core as sd
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
sns.set_palette("colorblind")  # after setup, whose theme resets the palette
print(str(ch).replace("; device", "\ndevice"))


# %% [markdown]
# ## Three ways to adapt the draft
#
# - **A confidence stop.** The draft proposes up to K tokens. It stops before the first position (after the first)
#   where its next-token law q has its largest probability below a threshold θ (the confidence threshold;
#   [notation](notation.md)). In code: `sd.generate(..., k=K_max, confidence=θ)`.
# - **A hybrid drafter**, `pair.drafters["hybrid"]`. Where the context's last n-gram occurred before, it copies
#   what followed (prompt lookup, no model pass). Elsewhere it asks the draft model.
# - **A chooser**, `pair.drafters["adaptive"]`. It picks lookup or the model, whichever this sequence's past steps
#   predict will commit more tokens per unit of time.
#
# The chooser estimates each drafter's acceptance rate α (the fraction of drafted tokens the target keeps;
# [notation](notation.md)) from its own past steps. It weighs the model's draft passes at their cost c (one draft
# pass ÷ one target pass; [notation](notation.md)).
#
# All three stay exact because no choice reads the target's verdict on the current step. "Going deeper" gives the
# argument, and chapter 2's tests check it.
#
# ## One prompt, watched
# The model draft at a fixed K and with a confidence stop, greedy, on the first evaluation prompt. The two calls
# below are the whole use of the library; the table after them shows each step.

# %%
ids, theta_demo = ch.encoded[0][1], thetas[len(thetas) // 2]
fixed = sd.generate(pair.target, ids, drafter=pair.drafters["model"], method="linear", k=k_max,
                    max_new_tokens=max_new_tokens)
stopped = sd.generate(pair.target, ids, drafter=pair.drafters["model"], method="linear", k=k_max,
                      confidence=theta_demo, max_new_tokens=max_new_tokens)

# %% tags=["hide-input"]
display(Markdown(f"*The model draft on one prompt, greedy: at a fixed K = {k_max}, and stopped at θ = {theta_demo}. "
                 "Each step is one target pass. The two outputs are "
                 f"{'the same' if fixed.tokens == stopped.tokens else 'different'} tokens.*"))
display(pd.DataFrame([{"draft": name, "steps": len(r.stats.drafted), "drafted": sum(r.stats.drafted),
                       "accepted": sum(r.stats.accepted_lengths),
                       "drafted per step": " ".join(map(str, r.stats.drafted)),
                       "accepted per step": " ".join(map(str, r.stats.accepted_lengths))}
                      for name, r in ((f"fixed K = {k_max}", fixed), (f"stop at θ = {theta_demo}", stopped))])
        .set_index("draft"))

# %% [markdown]
# ## Choosing θ on training prompts
# Every setting is tried first on held-out *training* prompts, greedy, in one interleaved run. The candidates are
# the model draft at each fixed K, and each θ with the model draft, the hybrid and the chooser. The best of each
# family by median speedup is kept; the evaluation prompts play no part in the choice.
#
# The tables give each speedup as a median with its IQR, the interquartile range: the middle half of the paired
# ratios ([notation](notation.md)). The verdict column reads a paired test over the prompts, under the book's verdict rule.

# %% tags=["hide-input"]
display(ch.setting(k_max))  # the longest verify pass a confidence-stopped step makes, timed on the median prompt
tune_set = sweep_prompts(pair, tune_prompts)
cand = calibrate.candidates(fixed_ks, thetas, k_max)
tune, tr = calibrate.tune(pair, tune_set, cand, max_new_tokens, repeats=tune_repeats)
ch.save(tune, "tune_runs")
ch.save(tr.reset_index(), "tuning")
chosen = calibrate.choose(tr)


def said(row, word: str = "") -> str:
    """One plain finding: the median ratio, and the verdict its table gave it, where the test gave one (a table's
    footnote says, once, why a row has none)."""
    word = "" if word.startswith(("cannot", report.NO_VERDICT)) else word
    return f"{row['median']:.2f}× autoregressive decoding's speed" + (f" ({word})" if word else "")


# each chosen setting is the best of its role's candidates on these training prompts: its test says so (Bonferroni)
picked = [{"role": role, "setting": name, "median": tr.loc[name, "median"], "q25": tr.loc[name, "q25"],
           "q75": tr.loc[name, "q75"], "n": tr.loc[name, "n"], **report.test_of(tr.loc[name]),
           "selected_from": int(tr.index.str.startswith(calibrate.ROLES[role]).sum()),
           "α": f"{tr.loc[name, 'alpha']:.2f}"} for role, name in chosen.items()]
table, note = report.verdict_table(picked)
table = table[[c for c in table if c != "α"] + ["α"]]
display(Markdown("Chosen on training prompts: " + "; ".join(f"{r['role']} → **{r['setting']}**" for r in picked)
                 + "."))
book.show(table.set_index("role"), f"Each family's chosen setting on {len(tune_set)} training prompts: speedup over "
          "autoregressive decoding, paired by prompt." + note, prefill=True, digits=None)

# %% tags=["hide-input"]
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
axes[0].set_title("speedup against θ (dashed: the best fixed K)")
axes[1].set_title("acceptance rate α against θ")
fig.suptitle("How the threshold θ trades draft length for acceptance (training prompts, greedy)")
fig.tight_layout()
ch.savefig(fig, "tuning")

# %% [markdown]
# ## The evaluation mix, measured once
# The chosen settings, autoregressive decoding, prompt lookup alone (K = `k_ngram`) and the model draft at its best
# fixed K run on the evaluation prompts. Each temperature is one interleaved run. A speedup is a tokens/s ratio over
# autoregressive decoding on the same prompt and repeat.

# %% tags=["hide-input"]
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
ov = overall.set_index(["temperature", "runner"])
table, note = report.verdict_table([{"T": f"{t:g}", "runner": r, "median": x["median"], "q25": x.q25, "q75": x.q75,
                                     "n": x.n, **report.test_of(x), "α": f"{x.alpha:.2f}"}
                                    for (t, r), x in ov.iterrows()])
eval_verdict = table.set_index(["T", "runner"]).verdict  # one family: sentences quote the table's verdicts
display(Markdown("\n".join(
    f"- At temperature {t:g}, the highest median is {o['median'].idxmax()}'s: "
    f"{said(o.loc[o['median'].idxmax()], eval_verdict[(f'{t:g}', o['median'].idxmax())])}."
    for t, o in ((t, ov.loc[t]) for t in temperatures))))
table = table[[c for c in table if c != "α"] + ["α"]]
book.show(table.set_index(["T", "runner"]),
          f"The evaluation mix ({len(ch.prompts)} prompts × {report.count(repeats, 'repeat')}): speedup over "
          "autoregressive decoding at each temperature T, and α pooled over the calls." + note, prefill=True,
          digits=None)

# %% tags=["hide-input"]
fig = figures.speedup_by_task(by_task, y="median", hue="runner")
fig.figure.suptitle("Which tasks each method speeds up (median of paired calls)", y=1.03)
ch.savefig(fig, "eval_by_task")

# %% [markdown]
# Greedy outputs: every method must decode the autoregressive text. A divergence is excused only at a near-tie of
# the target's two best logits in float32, as in chapter 2.

# %% tags=["hide-input"]
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
# ## Going deeper
#
# ### Why each adaptation stays exact
# Speculative sampling is lossless for any proposal law q, under two conditions. The token must be drawn from q.
# The choice of q (which drafter, how many tokens) must be made from the committed context and the draft's own draws.
#
# - The stop reads q at a position before the target has seen it.
# - The hybrid's test reads the context only.
# - The chooser reads the context and the verdicts of *past* steps, committed before this step's draft exists.
# - A lookup proposal is deterministic given the context, so its law is one-hot on the token. Its accept rule
#   min(1, p(x)/1) and its residual ∝ p with x removed give back the target's law p.
#
# Chapter 2's family tests cover them all: specs `linear:hybrid`, `linear:adaptive`, `linear:model@0.6`,
# `parallel:block@0.6` and `tree:model@0.3`. Two lossy controls are caught by the same family test in
# `tests/test_adaptive.py`. One is a stop that peeks at the target's law (`mutants.PeekingStop`). The other is a
# chooser that swaps drafters where the target disfavours the drawn token (`mutants.PeekingChooser`).
#
# ### Details of the three adaptations
# Greedy decoding reads the draft's softmax at temperature 1 for the stop; transformers'
# `assistant_confidence_threshold` does the same. For trees (`method="tree"`) θ prunes instead. A node whose score
# (the draft's probability of reaching it, as in EAGLE-2) is below θ gets no children. `confidence="auto"` uses
# the θ stored with the draft, chosen on training prompts. The chooser scores each drafter with Theorem 3.8's
# expected tokens, from its own α, against its cost: the model's K draft passes at c each.
#
# The training prompts are held out by the draft's recipe, built from the same templates as its training data.
# The tuning run is what `scripts/calibrate_confidence.py` runs, at its own size, to store the θ that
# `confidence="auto"` reads (`specdec_core.study.calibrate`).
#
# ### The whole tuning table
# Every candidate's paired speedup on the training prompts, with its α and drafted tokens per step. A choice by
# median is not settled where a rival's interquartile range (IQR, the middle half of the ratios;
# [notation](notation.md)) reaches it.

# %% tags=["hide-input"]
def resolved(prefix: str, name: str) -> str:
    """The rivals whose IQR reaches the chosen setting's (a choice by median that these prompts leave open)."""
    rivals = report.rivals(tr[tr.index.str.startswith(prefix)], name)
    return f"its IQR overlaps {', '.join(f'“{r}”' for r in rivals)}" if rivals else "no rival's IQR reaches it"


def stored_line(stored: dict | None) -> str:
    """The θ stored with the draft (what `confidence="auto"` uses) against this run's choices."""
    if not stored:
        return "- Stored with the draft: none (no `confidence.json`, so `confidence=\"auto\"` is unavailable)."
    mine = {calibrate.ROLES[r].split(",")[0]: calibrate.theta_of(n) for r, n in chosen.items() if "θ=" in n}
    differ = [f"{f} (stored {t}, here {mine[f]})" for f, t in stored["theta"].items() if f in mine and mine[f] != t]
    return (f"- Stored with the draft (`confidence=\"auto\"`, from {stored.get('prompts', '?')} training prompts): θ "
            + ", ".join(f"{f} {t}" for f, t in stored["theta"].items())
            + (f". This run chose differently for {', '.join(differ)}." if differ else ". This run chose the same θ."))


display(Markdown("\n".join(f"- {role.capitalize()} (“{name}”): {resolved(calibrate.ROLES[role], name)}."
                           for role, name in chosen.items())
                 + "\n" + stored_line(getattr(pair.drafters["model"], "calibration", None))))
book.show(tr.drop(columns=["family", "setting"]),
          f"Tuning on {len(tune_set)} held-out training prompts, greedy: each candidate's paired tokens/s ratio over "
          "autoregressive decoding (median, q25, q75 over n prompts), its α and drafted tokens per step.", prefill=True)

# %% [markdown]
# ### Against the best fixed K, and the order of the methods
# A confidence stop's speed divided by the best fixed K's, on the same prompt and repeat. A ratio between two
# runners says nothing about either against autoregressive decoding, so the main table sits beside it.

# %% tags=["hide-input"]
fk = next(n for n in final if n.startswith("fixed K"))
mc = next(n for n in final if n.startswith("model + confidence"))
vs_fixed = []
for t in temperatures:
    d = runs[runs.temperature == t]
    speed = d.set_index(["id", "repeat"]).groupby("runner").tokens_per_s
    r_ = (speed.get_group(mc) / speed.get_group(fk)).dropna()
    vs_fixed.append({"T": f"{t:g}", "ratios": r_, "units": r_.index.get_level_values("id"),
                     "both below 1 by median": "yes" if max(ov.loc[[(t, mc), (t, fk)], "median"]) < 1 else "no"})
table, note = report.verdict_table(vs_fixed)
table = table[[c for c in table if c != "both below 1 by median"] + ["both below 1 by median"]]
book.show(table.set_index("T"), f"Speed of {mc} ÷ speed of {fk}, paired by prompt and repeat." + note,
          prefill=True, digits=None)

lines = []
for t in temperatures:
    o = ov.loc[t].sort_values("median", ascending=False)
    n_t = int(o.n.min())
    top = o.index[0]
    below = [m for m in o.index if eval_verdict[(f"{t:g}", m)] == "slower"]  # the table's test finds it slower
    close = report.rivals(o, top)
    lines.append(f"- T = {t:g}: the highest median is {top}, {o.loc[top, 'median']:.2f}×.")
    lines.append(f"  Its IQR overlaps {', '.join(close)}, so the medians give no order." if close else
                 "  Its IQR is clear of the others': " + report.judged("the best method of this run", n_t)
                 + " (picked on these same prompts).")
    lines.append("  The test finds " + ", ".join(below) + " slower than autoregressive decoding." if below else
                 "  The test finds no method slower than autoregressive decoding.")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ### From training prompts to the evaluation mix, and task by task
# A setting chosen on training prompts can lose speed on the evaluation mix. The table sets the two medians side
# by side (greedy), and then each method's weakest task.

# %% tags=["hide-input"]
shift = pd.DataFrame([{"role": role, "setting": name, "training": tr.loc[name, "median"],
                       "evaluation": ov.loc[(0.0, f"{role} ({name})"), "median"],
                       "α training": tr.loc[name, "alpha"], "α evaluation": ov.loc[(0.0, f"{role} ({name})"), "alpha"]}
                      for role, name in chosen.items() if (0.0, f"{role} ({name})") in ov.index])
if len(shift):
    book.show(shift.set_index("role"), "Greedy median speedup over autoregressive decoding on the training prompts "
              "and on the evaluation mix, with α on each.", prefill=True, digits=2)
bt = by_task.reset_index(drop=True)
worst = bt.loc[bt.groupby(["runner", "temperature"])["median"].idxmin()]
book.show(worst[worst.temperature == 0.0].set_index("runner")[["task", "median"]].rename(columns={"median": "speedup"}),
          f"Each method's weakest task, greedy ({report.count(bt.n.min(), 'prompt', bt.n.max())} per task): "
          "its median speedup over autoregressive decoding there.", prefill=True, digits=2)
book.show(by_task.pivot_table(index=["temperature", "task"], columns="runner", values="median"),
          "Median paired tokens/s ratio over autoregressive decoding per task "
          f"({report.count(bt.n.min(), 'prompt', bt.n.max())} per task and method).", prefill=True, digits=2)

# %% [markdown]
# ## Summary
# - A confidence stop trades draft passes that would have been rejected for verify passes that come sooner. It pays
#   where the draft's confidence tracks the target's agreement. Each stop costs one wasted draft pass, the one that
#   revealed the low confidence.
# - The hybrid's lookup is free where the context repeats itself, and it falls back to the model elsewhere.

# %% tags=["hide-input"]
g0 = ov.loc[temperatures[0]]
top0 = g0["median"].idxmax()
display(Markdown("\n".join([
    "- On training prompts this run chose " + ", ".join(f"“{name}” ({role})" for role, name in chosen.items()) + ".",
    f"- On the evaluation mix at temperature {temperatures[0]:g}, the highest median was {top0}'s: "
    f"{said(g0.loc[top0], eval_verdict[(f'{temperatures[0]:g}', top0)])}.",
    f"- {checked} greedy decodes were checked against autoregressive decoding, with {len(ties)} near-ties.",
])))

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
