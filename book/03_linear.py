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
# # 3 · Linear speculative decoding
#
# **The question.** A cheap draft guesses K tokens (K is the draft length; [notation](notation.md)), and the target
# checks them in one pass. How fast is that, and what sets the speed?
#
# **The answer.** Two numbers set it. The acceptance rate α is the fraction of tested draft tokens the target
# keeps ([notation](notation.md)). The draft's cost c is one draft pass over one target pass. A step of K guesses
# then emits on average (1 − α^{K+1}) / (1 − α) tokens, and costs about K·c plus one verify pass. Leviathan et
# al.'s theory turns these into a predicted speedup. This chapter measures α per task and temperature, and c and
# the verify pass on this machine. It then times the speedup for several K and sets it beside the prediction.
# Which K is fastest here, and how close the theory comes, are this run's findings: they are in the speedup table
# and the summary at the end.
#
# This chapter builds on [chapter 0](00_quickstart.ipynb)'s picture of a step, now with sampling instead of
# greedy decoding.
#
# ## The four phases of a step
#
# The symbols are those of the [notation page](notation.md). p is the target's law (its probabilities for the next
# token) and q the draft's. Every step runs four phases:
#
# 1. **draft**: the draft proposes x₁…x_K, each drawn from its law q_i;
# 2. **verify**: one target pass over [last token, x₁…x_K] gives the target's laws p₁…p_{K+1};
# 3. **accept**: keep $x_i$ with probability $\min\!\big(1, p_i(x_i)/q_i(x_i)\big)$, left to right. At the first
#    rejection, draw a correction from $\mathrm{norm}\big(\max(0, p_i - q_i)\big)$ and stop. If all K pass, draw a
#    bonus token from $p_{K+1}$;
# 4. **commit**: roll the caches back over the rejected tokens (a pointer move) and append the new ones.
#
# The emitted tokens follow exactly the law p: [chapter 2](02_exactness.ipynb) proves it and tests it. The draft
# here is the book's own, trained for SmolLM2-135M-Instruct by `make models` (its model card is in
# `data/drafts/`). The n-gram drafter, which needs no training, is measured beside it.

# %% tags=["parameters"]
model = "smollm2-135m"       # embedded name, Hugging Face id or path
draft = None                 # optional Hugging Face id/path of a draft (default: the shipped draft)
per_task = 2                 # prompts per task from the evaluation mix
tasks = None                 # None: all six tasks; or a list of them, e.g. ["qa", "rag"]
max_new_tokens = 64          # tokens decoded per prompt
k_default = 4                # draft length for the acceptance study
ks = [1, 2, 3, 4, 6, 8]      # draft lengths for the speedup-vs-K study
temperatures = [0.0, 1.0]    # 0 means greedy
repeats = 2                  # interleaved timing repeats
prompt_file = None           # None: the shipped mix; or a Spec-Bench question.jsonl
alpha_target = 0.45          # the project's target for its draft: eval-mix greedy α of at least this
flattening = 0.5             # a learning curve flattens when its last doubling gains under this share of its first
extrapolate = 10             # the learning curve's fit is extrapolated to this many times the largest size measured
equal_spread = 0.10          # two drafters' spreads of α across tasks are about equal within this fraction
copy_tasks = ["summarization", "rag"]  # the mix's copy-heavy tasks (the answer reuses the prompt's text)
device = "cpu"
dtype = "float32"  # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
out_dir = "../build/book/03_linear"
params_name = None           # the parameter file's name, injected by scripts/run_book.py (banner)

# %% tags=["hide-input"]
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from IPython.display import Markdown, display

import specdec_core as sd
from specdec_core.lm import CachedLM
from specdec_core.sampling import SamplingParams, process_logits
from specdec_core.study import bench, report, theory
from specdec_core.models import shipped
from specdec_core.tools import book
from specdec_core.study import exactness as ex

display(book.banner(params_name))
ch = book.setup(out_dir, model, draft=draft, device=device, dtype=dtype, per_task=per_task, tasks=tasks,
                prompt_file=prompt_file, need=("model",))
pair, encoded = ch.pair, ch.encoded
drafters = {name: pair.drafters[name] for name in ("model", "ngram")}
palette = sns.color_palette("colorblind")
print(ch)

# %% [markdown]
# ## One step, by hand
# The library's loop hides nothing we cannot write in a few lines. The cell below samples at temperature 1. It
# drafts K tokens, runs the target once over them, and applies the accept rule token by token.

# %%
params = SamplingParams(temperature=1.0)
gen = torch.Generator().manual_seed(0)
d0 = pair.drafter
ids = encoded[0][1]
lm = CachedLM(pair.target, ids.numel() + k_default + 2)
logits = lm.forward(ids, logits_to_keep=1)[-1]                         # prefill: the prompt in one pass
tok = int(torch.multinomial(process_logits(logits, params), 1, generator=gen))
context = ids.tolist() + [tok]
d0.bind(pair.target)
d0.reset(ids, ids.numel() + k_default + 2)
draft_out = d0.propose(context, k_default, params, gen)                 # 1. draft: K tokens and their laws q
drafted, q = draft_out.tokens.tolist(), draft_out.q
p = process_logits(lm.forward(torch.cat([torch.tensor([tok]), draft_out.tokens])), params)  # 2. verify: p
accepted = 0
for i, x in enumerate(drafted):                                         # 3. accept, left to right
    if torch.rand(1, generator=gen) >= min(1.0, float(p[i, x] / q[i, x])):
        break                                                           # the first rejection ends the step
    accepted += 1
rest = (p[accepted] - q[accepted]).clamp(min=0) if accepted < len(drafted) else p[accepted]
target_token = int(torch.multinomial(rest, 1, generator=gen))          # correction from (p − q)⁺, or bonus
lm.cache.rollback(len(drafted) - accepted)                              # 4. commit: forget the rejected
d0.accept(draft_out, accepted)

# %% [markdown]
# Here is that step in its sentence, as in [chapter 0](00_quickstart.ipynb). Grey text is the end of the context.
# The table under it gives each draft token's p(x), q(x) and acceptance probability min(1, p/q).

# %% tags=["hide-input"]
fates = book.step_parts(drafted, accepted, target_token)
word = (lambda t: repr(pair.tokenizer.decode([t]))) if pair.tokenizer else str
if pair.tokenizer is not None:
    display(book.steps_table(pair.tokenizer, [dict(context=context, drafted=drafted, accepted=accepted,
                                                   target=target_token)], context_chars=80))
rows = []
for i, x in enumerate(drafted):
    px, qx = float(p[i, x]), float(q[i, x])
    rows.append({"position": i + 1, "draft token": word(x), "fate": fates[i][1], "p(x)": px, "q(x)": qx,
                 "accept prob min(1,p/q)": min(1.0, px / qx),
                 "Σ min(p,q) = 1−TV": float(torch.minimum(p[i], q[i]).sum())})
how = "a correction drawn from (p − q)⁺" if accepted < len(drafted) else "a bonus drawn from p at position K + 1"
display(Markdown(f"The target kept {accepted} of {len(drafted)} draft tokens. It then added {word(target_token)}, "
                 f"{how}."))
pd.DataFrame(rows).round(4)

# %% [markdown]
# The last column, Σ min(p, q), is the chance that *a fresh draw* from q at that position is accepted. TV is the
# total variation distance between p and q, and Σ min(p, q) = 1 − TV. Averaged over positions, this chance is the
# acceptance rate α ([notation](notation.md)). α alone sets the expected tokens per target pass,
# $(1 - \alpha^{K+1}) / (1 - \alpha)$.
#
# ## Acceptance per task and temperature
# Both drafters decode every prompt at K = `k_default`, greedy and sampled. T is the temperature here, and T = 0
# means greedy ([notation](notation.md)). α is pooled over each
# cell's steps: accepted ÷ (accepted + rejections). The figure shows α per task.

# %% tags=["hide-input"]
records, step_tables = [], []
ar_tokens = {}
for temp in temperatures:
    for p_, ids in book.progress(encoded, desc=f"T={temp}"):
        if temp == 0:
            ar_tokens[p_.id] = sd.generate(pair.target, ids, max_new_tokens=max_new_tokens).tokens
        for name, d in drafters.items():
            r = sd.generate(pair.target, ids, drafter=d, method="linear", k=k_default,
                            max_new_tokens=max_new_tokens, temperature=temp, seed=0)
            s = r.stats
            records.append(dict(id=p_.id, task=p_.task, drafter=name, temperature=temp, tokens=r.tokens,
                                alpha=s["alpha"], alpha_predicted=s["alpha_predicted"], tau=s["tau"],
                                accepted_lengths=s["accepted_lengths"], proposed=s["proposed"]))
            step_tables.append(bench.step_table(s, id=p_.id, task=p_.task, drafter=name, temperature=temp))
acc = pd.DataFrame(records)
ch.save(acc.drop(columns=["tokens", "accepted_lengths", "proposed"]), "acceptance_runs")
table = bench.pooled_steps(acc, ["drafter", "temperature", "task"])  # α pooled over each cell's steps
ch.save(table, "alpha_by_task")
label = {"model": "trained draft", "ngram": "n-gram"}
fig, ax = plt.subplots(figsize=(9, 3.8))
hue = table.drafter.map(label) + ", T=" + table.temperature.astype(str)
sns.barplot(data=table, x="task", y="alpha", hue=hue, palette=palette[:hue.nunique()], ax=ax)
top = table.loc[table.alpha.idxmax()]
ax.set(ylim=(0, 1), xlabel="", ylabel="α (accepted / tested)",
       title=f"α per task at K = {k_default}: {table.alpha.min():.2f} to {table.alpha.max():.2f} "
             f"(highest: {label[top.drafter]} on {top.task})")
ax.legend(fontsize=8, title="drafter, temperature", title_fontsize=8)
plt.xticks(rotation=20)
ch.savefig(fig, "alpha_by_task")
plt.show()
table.pivot_table(index="task", columns=["drafter", "temperature"], values="alpha").round(3)

# %% [markdown]
# The n-gram drafter needs no model pass: it looks its guesses up in the context. So it can only propose text
# that already occurred. The check below asks whether it leads only on the copy-heavy tasks, where the answer
# reuses the prompt's text (`copy_tasks`). Each task's α comes from that task's prompts alone, so the verdict
# needs at least six prompts per task.

# %% tags=["hide-input"]
per_task_n = pd.Series([p_.task for p_, _ in encoded]).value_counts()
run_tasks = sorted(per_task_n.index)
copy = [t for t in copy_tasks if t in run_tasks]  # the copy-heavy tasks this run's task set holds
n_task = int(per_task_n.min())  # the verdict reads each task's α: its sample is the prompts of one task


def cell(word_, n):
    """A verdict cell: the word if the sample allows one (report.judged), else the table's dash."""
    said = report.judged(word_, n)
    return report.NO_VERDICT if said.startswith(report.UNRESOLVED) else said


ng_rows, ng_ahead_by_t = [], {}
for temp_ in temperatures:
    a0 = table[table.temperature == temp_].pivot(index="task", columns="drafter", values="alpha")
    if not {"ngram", "model"} <= set(a0.columns):
        continue
    ng_ahead = [t for t in a0.index if a0.loc[t, "ngram"] > a0.loc[t, "model"]]
    ng_ahead_by_t[temp_] = ng_ahead
    sd_ = a0.std()
    steady = (f"about equal (within {equal_spread:.0%} of each other)" if max(sd_) <= (1 + equal_spread) * min(sd_)
              else f"the {'trained draft' if sd_['model'] < sd_['ngram'] else 'n-gram drafter'} is the steadier here")
    only_copy = bool(ng_ahead) and set(ng_ahead) <= set(copy)
    ng_rows.append({"T": temp_, "n-gram α higher on": ", ".join(ng_ahead) or "no task",
                    "only on copy-heavy tasks?": (cell("yes, in this run" if only_copy else "no, in this run", n_task)
                                                  if copy else "not testable"),
                    "prompts per task": report.count(per_task_n.min(), "prompt", per_task_n.max()),
                    "SD of α, trained": sd_["model"], "SD of α, n-gram": sd_["ngram"],
                    "spread across tasks": cell(steady, len(a0))})
ng_table = pd.DataFrame(ng_rows).set_index("T")
small = [n for n in (n_task, len(a0)) if n < report.MIN_PAIRS]
foot = (f" A dash ({report.NO_VERDICT}) in a verdict column means {report.UNRESOLVED}. The copy-heavy column needs "
        f"{report.MIN_PAIRS} prompts per task, and the spread {report.MIN_PAIRS} tasks ([the verdict rule](notation.md))."
        if small else "")
ask = ("Is the n-gram drafter ahead only on the copy-heavy tasks"
       + (f" ({', '.join(copy)} here)?" if copy else
          f"? Not testable in this run: its tasks ({', '.join(run_tasks)}) hold none of {', '.join(copy_tasks)}."))
display(Markdown(f"{ask} The table gives the tasks where its α is higher, per temperature. Its last columns give "
                 f"the standard deviation (SD) of α across the {len(a0)} tasks." + foot))
report.shown(ng_table)

# %% [markdown]
# ## What a pass costs: c and the verify pass
# Three passes are timed side by side, interleaved, and their medians kept: one target pass over 1 token, one over
# K + 1 tokens, and one draft pass. Their ratios are the draft's cost c and the verify ratio ([notation](notation.md)):
# a target pass over K + 1 tokens divided by one over 1 token. Theorem 3.8 of Leviathan et al. assumes the verify
# pass costs one ordinary pass, and this measures how true that is.

# %% tags=["hide-input"]
model_drafter = pair.drafters["model"]
costs = bench.pass_costs(pair.target, model_drafter.model, bench.median_length(encoded),
                         ks=tuple(sorted({*ks, k_default})), repeats=max(5, 5 * repeats), decoded=max_new_tokens // 2)
display(ch.setting(k_default, costs["verify_ratio"][k_default]))
cost_df = ch.save(pd.DataFrame({"K": ks, "verify_ratio": [costs["verify_ratio"][k] for k in ks]}), "pass_costs")
vr = cost_df.set_index("K").verify_ratio
display(Markdown(
    f"A draft pass costs c = {costs['c']:.3f} target passes. A verify pass over K + 1 tokens costs "
    f"{vr.min():.2f}–{vr.max():.2f} one-token passes for K = {', '.join(map(str, vr.index))}, each a median of "
    f"{max(5, 5 * repeats)} interleaved runs. "
    + ("It is not monotone in K: a longer pass timed faster than a shorter one. That is within the timing spread, "
       "or a kernel switch ([chapter 1](01_bottleneck.ipynb))." if (vr.diff().dropna() < 0).any()
       else "It grows with K.")))
display(report.shown(pd.Series(dict(sorted(costs["ms"].items())), name="median ms").to_frame().rename_axis("pass"), 2))
cost_df.round(3)

# %% [markdown]
# ### Where a draft pass goes
# A draft pays only if its pass is far cheaper than the target's. Introductions to the technique ask for a draft
# 10–50× cheaper, with well under a millisecond a token. The shipped draft has two layers and a head over 8,192
# tokens. Through transformers' modules, most of its pass went to the small operations around its products, and
# its head was a plain float32 product. This library runs each layer in one kernel call and the head's rows in
# float16 (`models/draft_step.py`). The figure times both paths beside the target's pass, in one interleaved run.

# %% tags=["hide-input"]
if not bench.takes_apart(model_drafter.model):
    display(Markdown("This pair's draft is not the library's two-part draft (a trunk and a head over the target's "
                     "embedding), so its pass is timed whole, as c above."))
else:
    parts = bench.draft_pass_parts(pair.target, model_drafter.model, bench.median_length(encoded),
                                   repeats=max(5, 5 * repeats), decoded=max_new_tokens // 2)
    ch.save(parts, "draft_pass_parts")
    t_target = parts.query("path == 'target'").ms.iloc[0]
    paths = parts.query("path != 'target'")
    wide = paths.pivot(index="path", columns="part", values="ms")[["layers", "head", "everything else"]]
    wide = wide.loc[["transformers' modules", "this library"]]
    fig, ax = plt.subplots(figsize=(8, 2.4))
    wide.plot.barh(stacked=True, ax=ax, width=0.6)
    ax.set(xlabel="milliseconds per one-token pass", ylabel="",
           title=f"The draft's pass, taken apart (the target's pass: {t_target:.1f} ms)")
    ax.legend(title="", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.45), frameon=False)
    ch.savefig(fig, "draft_pass_parts")
    plt.show()
    ms_new, ms_old = wide.sum(axis=1)["this library"], wide.sum(axis=1)["transformers' modules"]
    display(Markdown(
        f"On this library's path a draft pass takes {ms_new:.2f} ms, c = {ms_new / t_target:.3f}: "
        f"{t_target / ms_new:.0f}× cheaper than the target's pass. Through transformers' modules it took "
        f"{ms_old:.2f} ms (c = {ms_old / t_target:.3f}). The c used above is this library's."))

# %% [markdown]
# ## Speedup versus K: measurement against theory
# For each K, linear speculative decoding and the autoregressive baseline decode the same prompts, interleaved,
# greedy. The prediction uses c and the verify cost measured above. Each call is predicted from its own α̂, the
# acceptance rate measured on that call:
#
# $$\text{speedup} = \frac{1 - \alpha^{K+1}}{(1 - \alpha)\big(K c + t_\text{verify}(K+1)/t(1)\big)}.$$
#
# The theorem does not model the prefill (the prompt's pass), so the prediction is compared with the decode loops'
# speed ratio. The figure shows the measured speedups with their interquartile range (IQR, the middle half of the
# prompts) beside both predictions.

# %% tags=["hide-input"]
runners = {"autoregressive": bench.generate_runner(pair.target, max_new_tokens)}
for k in ks:
    runners[f"linear K={k}"] = bench.generate_runner(pair.target, max_new_tokens, method="linear",
                                                     drafter=model_drafter, k=k)
timing = bench.run_interleaved(runners, ch.bench_prompts, repeats=repeats)
ch.save(timing, "speedup_vs_k_runs")
ratios = bench.paired_ratios(timing, baseline="autoregressive")
ratios["K"] = ratios.runner.str.extract(r"K=(\d+)").astype(int)
checks = {k: bench.theory_check(timing, f"linear K={k}", "autoregressive", k, costs["c"],
                                costs["verify_ratio"][k]) for k in ratios.K}  # (per-call rows, summary)
ratios["alpha_hat"] = [checks[k][1]["alpha_pooled"] for k in ratios.K]
ratios["measured_decode"] = [checks[k][1]["measured_median"] for k in ratios.K]
ratios["predicted"] = [checks[k][1]["predicted_median"] for k in ratios.K]
ratios["predicted_thm38"] = [float(np.median(theory.speedup(checks[k][0].alpha_hat, k, costs["c"])))
                             for k in ratios.K]  # the same calls, a verify pass costing one pass
ratios["rel_error"] = (ratios.measured_decode - ratios.predicted).abs() / ratios.predicted
ch.save(ratios, "speedup_vs_k")
best = ratios.loc[ratios["median"].idxmax()]
fig, ax = plt.subplots(figsize=(7, 4))
ax.errorbar(ratios.K, ratios["median"], yerr=[ratios["median"] - ratios.q25, ratios.q75 - ratios["median"]],
            fmt="o", color=palette[0], label="measured (median, IQR)")
ax.plot(ratios.K, ratios.measured_decode, "x", color=palette[0], label="measured, decode loop only")
ax.plot(ratios.K, ratios.predicted, "s--", color=palette[1], label="theory, measured verify cost")
ax.plot(ratios.K, ratios.predicted_thm38, ":", color=palette[2], label="Theorem 3.8 (verify = 1 pass)")
ax.axhline(1, color="grey", lw=1)
ax.set(xlabel="K (draft length)", ylabel="speedup over autoregressive",
       title=f"Linear SD, greedy: the highest median speedup is at K = {int(best.K)}")
ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
ax.legend(fontsize=8)
ch.savefig(fig, "speedup_vs_k")
plt.show()
err = ratios.set_index("K").rel_error
display(Markdown(
    f"The highest median speedup among K = {', '.join(map(str, sorted(ratios.K)))} is at K = {int(best.K)}: "
    f"{best['median']:.2f}× autoregressive decoding, with α̂ = {best.alpha_hat:.3f}. The theory with the measured "
    f"verify cost misses the decode loop's speedup by {err.min():.0%}–{err.max():.0%}."))
k_table, k_note = report.verdict_table([
    {"finding": f"K = {int(r.K)}", "α̂": f"{r.alpha_hat:.3f}", "median": r["median"], "q25": r.q25, "q75": r.q75,
     "n": r.n, **report.test_of(r), "decode loop": f"{r.measured_decode:.2f}×", "theory": f"{r.predicted:.2f}×",
     "error": f"{r.rel_error:.0%}", "Theorem 3.8": f"{r.predicted_thm38:.2f}×"} for _, r in ratios.iterrows()])
k_table = k_table[["finding", "median", "IQR", "n", "verdict", "α̂", "decode loop", "theory", "error", "Theorem 3.8"]]
book.show(k_table.set_index("finding"),
          "Linear SD with the trained draft against autoregressive decoding, greedy: paired tokens/s ratios of "
          "whole generate calls, each prompt's repeats taken together: n counts prompts. The decode loop column is the same ratio without the prefill. The theory column is "
          "the prediction with the measured verify cost, and error its distance from the decode loop. Theorem 3.8 "
          "prices the verify pass at one pass." + k_note, prefill=True, digits=None)

# %% [markdown]
# ## Going deeper
#
# ### Greedy exactness, checked on every run above
# Greedy speculative decoding must emit the autoregressive tokens. In float32 a batched verify pass and a one-token
# pass may round differently. So a divergence is allowed only where the target's top-2 logits are within 1e-3, a
# near-tie, and each one is reported.

# %% tags=["hide-input"]
prompt_ids = {p_.id: e for p_, e in encoded}
diverged = []
for rec in acc[acc.temperature == 0].itertuples():
    i, gap = ex.first_divergence(pair.target, prompt_ids[rec.id], rec.tokens, ar_tokens[rec.id])
    if i is not None:
        diverged.append(dict(id=rec.id, drafter=rec.drafter, token=i, top2_gap=gap))
print(f"{len(diverged)} greedy divergences out of {int((acc.temperature == 0).sum())} runs")
pd.DataFrame(diverged) if diverged else None  # the count above already says 'none'

# %% tags=["hide-input"]
assert all(ex.excused(d["token"], d["top2_gap"]) for d in diverged), "a greedy divergence that is not a near-tie"

# %% [markdown]
# ### Acceptance by draft position
# Position i is reached only if positions 1…i−1 were accepted. The theory assumes acceptances are independent and
# identically distributed. Then the conditional rate P(accept i | reached i) would be flat, and the cumulative rate
# would decay geometrically. `bench.acceptance_by_position` counts both from the steps. The figure plots the
# conditional rate, and the table under it gives its values per position.

# %% tags=["hide-input"]
steps = pd.concat(step_tables, ignore_index=True)
by_pos = bench.acceptance_by_position(steps, by=["drafter", "temperature"])
by_pos = by_pos[by_pos.reached > 0].rename(columns={"conditional": "P(accept | reached)"})
ch.save(by_pos, "acceptance_by_position")
g = sns.relplot(data=by_pos.assign(drafter=by_pos.drafter.map(label)), x="position", y="P(accept | reached)",
                hue="drafter", style="temperature", kind="line", marker="o", height=3.5, aspect=1.6,
                palette=palette[:2])
g.set(ylim=(0, 1), title="Acceptance by draft position: flat if acceptances were independent")
g.ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
ch.savefig(g, "acceptance_by_position")
plt.show()
by_pos.pivot_table(index=["drafter", "temperature"], columns="position", values="P(accept | reached)").round(2)

# %% [markdown]
# ### What more data buys: the draft's learning curve
# α is a property of the draft's weights. The draft learned from the target's own answers to the project's
# training prompts. `scripts/draft_curve.py` retrains the shipped recipe on nested shares of a larger teacher set,
# at several trunk depths. The recipe stays the same: architecture, vocabulary size, optimiser and seed. The table
# gives each point's training steps and passes over its data.
#
# Each draft is measured teacher-forced, on held-out training prompts and on the evaluation mix. Greedy α compares
# the draft's argmax with the target's on the target's greedy answers. T = 1 α is Σ min(p, q), a lower bound. The
# draft's cost c is timed alone, per depth. Each point's α then predicts a speedup at its best K, with the measured
# verify cost.
#
# This section draws that committed run (`data/reference/draft_curve.json`). It took hours of CPU and is not re-run
# here. A fit of α against log₂(tokens) summarises the trend. Extrapolated, the fit is a hypothesis about more
# data, not a measurement.

# %% tags=["hide-input"]
curve_path = Path("../data/reference/draft_curve.json")
show_curve = ch.own_pair and curve_path.exists()  # the curve is the shipped recipe's, not any other pair's
if not ch.own_pair:
    ch.skip("the learning curve", "it is the shipped draft's recipe (data/reference/draft_curve.json), not this pair's")
elif not curve_path.exists():
    print(f"no learning-curve run at {curve_path}: python scripts/draft_curve.py writes it")
else:
    cj = json.loads(curve_path.read_text())
    rows = []
    for p in cj["points"]:
        for where in ("heldout", "eval"):
            for mode, key in (("greedy", "greedy_alpha"), ("T = 1", "t1_alpha")):
                rows.append(dict(layers=p["layers"], tokens=p["tokens"], where=where, mode=mode,
                                 alpha=p[where]["all"][key], predicted=p.get(f"{where}_predicted_speedup"),
                                 best_k=p.get(f"{where}_best_k")))
    lc = pd.DataFrame(rows)
    ch.save(lc, "learning_curve")
    # one row per point: its training (the first curve's report has no per-point steps: the recipe's) and α
    pts = pd.DataFrame([dict(layers=p["layers"], tokens=p["tokens"], steps=p.get("steps", cj["recipe"]["train"]["steps"]),
                             passes=p.get("epochs", np.nan), heldout_greedy=p["heldout"]["all"]["greedy_alpha"],
                             eval_greedy=p["eval"]["all"]["greedy_alpha"], eval_t1=p["eval"]["all"]["t1_alpha"],
                             predicted=p.get("eval_predicted_speedup", np.nan), best_k=p.get("eval_best_k", np.nan))
                        for p in cj["points"]]).sort_values(["layers", "tokens"])
    book.show(pts, "The committed learning curve, one row per trained draft: its training, and its teacher-forced α "
              "on held-out training prompts and on the evaluation mix. The last columns give the speedup that α "
              "predicts at its best K, from the theory with the measured verify cost: a prediction, not a timing.",
              prefill=False)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ev_ = lc[lc["where"] == "eval"].assign(depth=lambda d: d.layers.astype(str) + " layer(s)")
    depth_colours = dict(zip(sorted(ev_.depth.unique()), palette))
    # points for every measurement; a line only through a series of two or more (one point is not a trend)
    sns.scatterplot(data=ev_, x="tokens", y="alpha", hue="depth", style="mode", s=60, palette=depth_colours, ax=axes[0])
    for (d_, m_), g in ev_.groupby(["depth", "mode"]):
        if len(g) > 1:
            axes[0].plot(g.sort_values("tokens").tokens, g.sort_values("tokens").alpha, lw=1, color="0.6",
                         ls="-" if m_ == "greedy" else ":")
    sh = cj["shipped"]  # the draft shipped when the curve ran (the curve's baseline), not necessarily today's
    axes[0].plot([sh["tokens"]], [sh["eval"]["all"]["greedy_alpha"]], "k*", ms=12,
                 label="draft shipped when the curve ran (greedy)")
    axes[0].set(xscale="log", xlabel="training response tokens", ylabel="α on the evaluation mix (teacher-forced)")
    axes[0].legend(fontsize=7)
    g_ = ev_[ev_["mode"] == "greedy"]
    sns.scatterplot(data=g_, x="tokens", y="predicted", hue="depth", s=60, palette=depth_colours, ax=axes[1])
    for d_, g in g_.groupby("depth"):
        if len(g) > 1:
            axes[1].plot(g.sort_values("tokens").tokens, g.sort_values("tokens").predicted, lw=1, color="0.6")
    axes[1].axhline(1, color="grey", lw=1)
    axes[1].set(xscale="log", xlabel="training response tokens",
                ylabel="predicted speedup at the best K (greedy)")
    deep = shipped.drafted_point()[0]  # the shipped draft's depth (else the one with the most sizes)
    deep = deep if deep in set(g_.layers) else g_.groupby("layers").size().idxmax()
    dg = g_[g_.layers == deep].sort_values("tokens")
    fig.suptitle(f"More data, {deep} layer(s): eval α {dg.alpha.iloc[0]:.3f} at {dg.tokens.iloc[0] / 1e3:.0f}k "
                 f"training tokens, {dg.alpha.iloc[-1]:.3f} at {dg.tokens.iloc[-1] / 1e3:.0f}k", y=1.03)
    fig.tight_layout()
    ch.savefig(fig, "learning_curve")
    plt.show()
    per_task = pd.DataFrame([dict(layers=p["layers"], tokens=p["tokens"], task=t, greedy=v["greedy_alpha"],
                                  t1=v["t1_alpha"]) for p in cj["points"] for t, v in p["eval"].items() if t != "all"])
    ch.save(per_task, "learning_curve_by_task")
    display(per_task.pivot_table(index="task", columns=["layers", "tokens"], values="greedy").round(3))
    print(f"The committed curve holds {len(cj['points'])} point(s).")
    print(f"Depth(s): {', '.join(map(str, sorted({p['layers'] for p in cj['points']})))} layer(s).")
    print(f"Sizes: {', '.join(f'{t / 1e3:.0f}k' for t in sorted({p['tokens'] for p in cj['points']}))} "
          "response tokens.")

# %% [markdown]
# What the committed curve says, computed from its table (greedy α on the evaluation mix unless said):

# %% tags=["hide-input"]
if show_curve:
    lines = []
    for L, g in g_.groupby("layers"):
        g = g.sort_values("tokens")
        c_L = cj["costs"][str(L)]["c"]
        if len(g) < 2:
            lines.append(f"- **{L} layer(s)**: one size measured ({g.tokens.iloc[0] / 1e3:.0f}k tokens), so there is no "
                         f"trend to read. α is {g.alpha.iloc[0]:.3f} and c = {c_L:.3f}. The predicted speedup is "
                         f"{g.predicted.iloc[0]:.2f}× at K = {int(g.best_k.iloc[0])}.")
            continue
        slope, icpt = np.polyfit(np.log2(g.tokens), g.alpha, 1)
        gains = np.diff(g.alpha.values) / np.diff(np.log2(g.tokens.values))
        far = extrapolate * g.tokens.max()  # beyond the data: a hypothesis
        at_far = slope * np.log2(far) + icpt
        shape_ = (f"The first doubling gains {gains[0]:+.3f} and the last {gains[-1]:+.3f}: "
                  + ("flattening" if gains[-1] < flattening * gains[0] else "not flattening") + " over this range."
                  if len(gains) > 1 else "Two sizes give a slope, not a shape.")
        lines.append(f"- **{L} layer(s)**: α goes " + " → ".join(f"{a:.3f}" for a in g.alpha) + " at "
                     + ", ".join(f"{t / 1e3:.0f}k" for t in g.tokens) + " tokens. "
                     + f"A log-linear fit gains {slope:+.3f} per doubling. {shape_} "
                     + f"Extrapolated to {far / 1e6:.1f} M tokens, α ≈ {at_far:.2f} (a hypothesis). "
                     f"At the largest size the predicted speedup is {g.predicted.iloc[-1]:.2f}× at "
                     f"K = {int(g.best_k.iloc[-1])}, with c = {c_L:.3f}.")
    choice = cj["ship_rule_choice"]
    now_at = shipped.drafted_point()  # the draft shipped now (its config), against the rule's choice
    lines.append(f"- **The rule fixed before measuring the mix** ({cj['ship_rule']}) picks {choice['layers']} layer(s) "
                 f"on {choice['tokens'] / 1e3:.0f}k tokens. The draft shipped when the curve ran ({sh['layers']} "
                 f"layer(s), {sh['tokens'] / 1e3:.0f}k tokens) has eval α {sh['eval']['all']['greedy_alpha']:.3f}. "
                 f"The draft shipped now ({now_at[0]} layer(s), {now_at[1] / 1e3:.0f}k tokens) "
                 + ("is the rule's choice." if now_at == (choice["layers"], choice["tokens"])
                    else "is not the rule's choice: retrain with the chosen setting to follow the rule."))
    lines.append(f"- **The project's target for its draft** (eval-mix greedy α ≥ {alpha_target:g}): "
                 + ("reached at " + ", ".join(f"{r.layers} layer(s) {r.tokens / 1e3:.0f}k" for r in g_[g_.alpha >= alpha_target].itertuples())
                    if (g_.alpha >= alpha_target).any() else f"not reached on this curve (best {g_.alpha.max():.3f})") + ".")
    display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Summary
# α and c set the speedup of linear speculative decoding. What this run measured, computed from its tables:

# %% tags=["hide-input"]
by_k = ratios.set_index("K")
ahead = report.rivals(by_k, best.K)
n_best = int(best.n)
lines = [f"- **Speedup**: the highest median among K = {', '.join(map(str, sorted(ratios.K)))} is at K = "
         f"{int(best.K)}, {best['median']:.2f}× autoregressive decoding."
         + (f" Its IQR overlaps K = {', '.join(map(str, ahead))}, so the medians give no order." if ahead
            else f" Its IQR is clear of the others' ({n_best} prompts each): "
            + report.judged("the best K of this sweep", n_best) + ".")]
against = {"slower": "the test finds even the best K slower than autoregressive decoding",
           "ties": "it ties with autoregressive decoding (no 10 % change found, at power 0.5 or more)"}.get(
    report.verdict_of(best))
if against:  # where the test cannot tell, the speedup table's verdict column says so
    lines[-1] += f" Against autoregressive decoding: {against}."
lines.append(f"- **Theory**: a verify pass over K + 1 tokens cost v = {vr.min():.2f}–{vr.max():.2f} one-token passes "
             "here. Theorem 3.8 takes v = 1, which changes a step's cost by the factor (Kc + v) / (Kc + 1). "
             f"With the measured v, the theory misses the decode loop's speedup by {err.min():.0%}–{err.max():.0%}. "
             "[Chapter 1](01_bottleneck.ipynb) says where on this CPU a verify pass costs about one pass.")
lines.append("- **n-gram against the trained draft**: it needs no model pass, but it can only propose text already "
             "seen. Its α is higher on "
             + "; ".join(f"{', '.join(v) or 'no task'} at T = {t}" for t, v in ng_ahead_by_t.items())
             + " (the verdicts are in the table under the α figure).")
lines.append(f"- **Exact**: {len(diverged)} greedy divergence(s) in {int((acc.temperature == 0).sum())} greedy runs"
             + (" (each at a float32 near-tie)." if diverged else "."))
lines += [ch.skipped_summary()] if ch.skipped else []
display(Markdown("\n".join(lines)))

# %% [markdown]
#
# ## Exercises
# 1. Derive the expected number of draft passes per emitted token and check it against `stats`.
# 2. Raise the temperature to 1.5. Which drafter suffers more, and why (look at Σ min(p, q))?
# 3. With c = 0.1, what α makes K = 8 better than K = 4?
