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
# # 6 · How much faster? Theory against measurement, every method, every task
#
# **The question.** How much faster than autoregressive decoding is each way of speculating, on each kind of task?
# And does the theory predict what we measure?
#
# **The answer.** In the book's reference run on a CPU, the drafters that copy text from the prompt gain the most.
# They gain on the tasks whose answers reuse the prompt's words. The small draft model gains on few tasks here and
# loses time on most. Two costs explain why: a pass over several tokens costs more than one pass on a CPU, and
# the draft is not much cheaper than so small a target. Leviathan et al.'s theory predicts the measurement once both
# costs are measured. This run's numbers are in the headline figure, the table under it and the summary at the end.
#
# Every method here runs [chapter 0](00_quickstart.ipynb)'s step: draft a few tokens, verify them in one target
# pass, keep the prefix the target agrees with.
#
# Chapters 3–5 built three ways to spend a target pass on several tokens. A chain of draft tokens is *linear*, a
# tree of alternatives is *tree*, and a block drafted in one pass is *parallel*. Chapter 8 adapts the chain to the
# draft's confidence, with a threshold θ (the draft stops where its confidence falls below θ;
# [notation](notation.md)). Here θ is the one stored with the draft, chosen on training prompts before this run.
# The decoders of the transformers library run beside them as peers.
#
# The protocol (`specdec_core.study.bench`) fixes the prompts before any tuning. Every runner decodes the same
# prompts in one run, interleaved in rotating order, after a warm-up. Each speed is a *paired* ratio: tokens per
# second against our autoregressive decoder on the same prompt. We report the median and the interquartile range
# (IQR, the middle half of the ratios; [notation](notation.md)).

# %% tags=["parameters"]
params_name = None  # the parameter file's name, injected by scripts/run_book.py (banner)
model = "smollm2-135m"        # embedded name, Hugging Face id or path
draft = None                  # optional draft id/path (default: the shipped drafts)
prompt_file = None            # None: the shipped mix; or a Spec-Bench question.jsonl
per_task = 3                  # prompts per task
tasks = None                  # None: all six tasks; or a list of them, e.g. ["qa", "rag"]
max_new_tokens = 64
repeats = 2                   # interleaved repeats of the headline run
warmup = 1                    # untimed calls of every runner on the first prompt (K sweep and headline run)
temperatures = [0.0, 1.0]     # headline runs; 0 means greedy
# headline methods: name -> generate() arguments (drafter is a key of pair.drafters; tree: "default" or a Dynamic
# spec; confidence "auto": chapter 8's stop with the θ stored with the draft, chosen on training prompts, the K here
# its cap; k "auto": the best fixed K stored with the draft, chosen on the same training prompts; a method named in
# `choose_k` runs at the K this chapter chooses on held-out training prompts, the K written here being its fallback)
methods = {
    "linear (draft model)": {"method": "linear", "drafter": "model", "k": "auto"},
    "linear (n-gram)": {"method": "linear", "drafter": "ngram", "k": 4},
    "tree (draft model)": {"method": "tree", "drafter": "model", "k": 4, "tree": "default"},
    "parallel (block)": {"method": "parallel", "drafter": "block", "k": 6},
    "linear (draft model, θ auto)": {"method": "linear", "drafter": "model", "k": 6, "confidence": "auto"},
    "linear (hybrid, θ auto)": {"method": "linear", "drafter": "hybrid", "k": 6, "confidence": "auto"},
    "linear (adaptive, θ auto)": {"method": "linear", "drafter": "adaptive", "k": 6, "confidence": "auto"},
}
# runners decoded at the temperatures after the first (None: all): the four drafting families; the θ rows were tuned
# greedy, and transformers' peers are compared greedy
later_temperatures = ["linear (draft model)", "linear (n-gram)", "tree (draft model)", "parallel (block)"]
hf_peers = True               # transformers' generate, assisted generation and prompt lookup in the same run
sweep_n = 6                   # held-out training prompts of the K sweep (round-robin over tasks; never the eval mix)
sweep = {                     # name -> (generate() arguments, list of K), greedy, on the held-out training prompts
    "linear (draft model)": [{"method": "linear", "drafter": "model"}, [1, 2, 3, 4, 6, 8]],
    "linear (n-gram)": [{"method": "linear", "drafter": "ngram"}, [2, 4, 8]],
    "tree (draft model)": [{"method": "tree", "drafter": "model", "tree": "default"}, [2, 3, 4, 5]],
    "parallel (block)": [{"method": "parallel", "drafter": "block"}, [1, 2, 4, 6, 8]],
}
# headline methods with no K stored with their draft whose K is the sweep's best (highest median) on those prompts
choose_k = ["linear (n-gram)", "tree (draft model)", "parallel (block)"]
# a pair with nothing stored with its draft (a pair of one's own): K and θ chosen again on held-out training
# prompts, as scripts/calibrate_confidence.py chose the shipped draft's (chapter 8's procedure)
choose_prompts = 6            # held-out training prompts
choose_ks = [1, 2, 3, 4]      # fixed K candidates
choose_thetas = [0.5, 0.7]    # θ candidates, each with up to choose_k_max tokens a step
choose_k_max = 6
choose_tokens = 64            # tokens decoded per prompt while choosing
theory_tolerance = 0.10       # linear SD: |measured − predicted| / predicted should stay below this
finest_tolerance = 0.25       # a theory_tolerance above this checks nothing finer than a bug (the summary says so)
assert_theory = False         # True: a disagreement beyond the tolerance stops the notebook (else it is reported)
anchors = "../data/anchors.csv"  # published speedups (fixed citations with their sources) set beside this run's
device = "cpu"
dtype = "float32"  # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
out_dir = "../build/book/06_speedup"

# %% tags=["hide-input"]
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from IPython.display import Markdown, display

import specdec_core as sd
from specdec_core.study import figures
from specdec_core.study import bench, calibrate, hardware, peers, protocol, report, theory
from specdec_core.tools import book

display(book.banner(params_name))
ch = book.setup(out_dir, model, draft=draft, device=device, dtype=dtype, per_task=per_task, tasks=tasks,
                prompt_file=prompt_file)
sns.set_palette("colorblind")
pair, encoded = ch.pair, ch.bench_prompts
wants_stored = any("auto" in (spec.get("k"), spec.get("confidence")) for spec in methods.values())
if wants_stored and "model" in pair.drafters and getattr(pair.drafters["model"], "calibration", None) is None:
    rec, took = calibrate.calibrate_pair(pair, sd.prompts.sweep_prompts(pair, choose_prompts), choose_ks, choose_thetas,
                                         choose_k_max, choose_tokens)
    print(f"nothing stored with this pair's draft: chose fixed K = {rec['fixed_k']} and θ "
          + ", ".join(f"{d} {v}" for d, v in rec["theta"].items()))
    print(f"  on {choose_prompts} held-out training prompts in {took:.0f} s (chapter 8's procedure)")
for name in [n for n, spec in methods.items() if bench.unrunnable(pair, spec)]:
    ch.skip(name, bench.unrunnable(pair, methods.pop(name)))
methods = {name: bench.stored_k(pair, spec) for name, spec in methods.items()}  # "k": "auto" → the stored K
sweep = {name: v for name, v in sweep.items() if v[0]["drafter"] in pair.drafters}
choose_k = [name for name in choose_k if name in methods and name in sweep]
# the headline figure's panels: each method's family, by the drafter that proposes its tokens
FAMILY = {"model": "a small draft model proposes", "ngram": "proposals copied from the context",
          "hybrid": "proposals copied from the context", "adaptive": "proposals copied from the context",
          "block": "one pass proposes a block"}
family = {name: FAMILY.get(spec["drafter"], spec["drafter"]) for name, spec in methods.items()}
family |= {"hf assisted": FAMILY["model"], "hf prompt lookup": FAMILY["ngram"],
           "hf generate": "no speculation (transformers' generate)"}


for line in textwrap.wrap(str(ch), 120, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False):
    print(line)  # the set-up in lines a page shows whole

# %% [markdown]
# ## Theory first
# Leviathan et al. (2023) give two formulas. Three quantities enter them. The acceptance rate α is the fraction of
# tested draft tokens that the target keeps ([notation](notation.md)). K is the draft length, the tokens drafted
# per step ([notation](notation.md)). c is the draft's cost: one draft pass divided by one target pass
# ([notation](notation.md)).
#
# Their Eq. 1 gives the expected tokens per target pass. Their Theorem 3.8 divides it by a step's cost in target
# passes, K·c + 1:
#
# $$E[\text{tokens per pass}] = \frac{1 - \alpha^{K+1}}{1 - \alpha}, \qquad
#   \text{speedup} = \frac{1 - \alpha^{K+1}}{(1 - \alpha)(K c + 1)}.$$
#
# The star marks the paper's T5-XXL / T5-small point (α = 0.75, γ = K = 7, 3.4× measured on a TPU).

# %% tags=["hide-input"]
ks = np.arange(1, 13)
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for a in (0.5, 0.6, 0.7, 0.8, 0.9):
    axes[0].plot(ks, theory.expected_tokens(a, ks), marker=".", label=f"α = {a}")
    axes[1].plot(ks, theory.speedup(a, ks, 0.05), marker=".", label=f"α = {a}")
axes[0].set(xlabel="K", ylabel="E[tokens per target pass]", title="Eq. 1: a higher α keeps more of a long draft")
axes[1].set(xlabel="K", ylabel="expected speedup", title="Theorem 3.8, c = 0.05: each α has a best K")
axes[1].plot([7], [3.4], "k*", ms=14, label="T5-XXL/T5-small (paper)")
for ax in axes:
    ax.legend(fontsize=8)
fig.tight_layout()
ch.savefig(fig, "theory")

# %% [markdown]
# ## The pass costs on this machine
# On a GPU a verify pass over K + 1 tokens costs about one pass. On a CPU it can cost more. So the theory here takes
# a third measured quantity: the verify ratio, a pass over K + 1 tokens divided by a pass over one
# ([notation](notation.md)). We time c and the verify ratio side by side at a typical context. That is the
# median-length prompt plus half the decode budget, where a decode loop spends its passes on average.

# %% tags=["hide-input"]
model_drafter = pair.drafters.get("model")
cost_ks = sorted({k for _, v in sweep.items() for k in v[1]} | {s["k"] for s in methods.values()})
costs = bench.pass_costs(pair.target, model_drafter.model if model_drafter else None, bench.median_length(encoded),
                         ks=tuple(cost_ks), repeats=10, decoded=max_new_tokens // 2)
print(f"c = {costs['c']:.3f}; verify pass over K + 1 tokens ÷ one-token pass:")
print("  " + ", ".join(f"K = {k}: {v:.2f}" for k, v in costs["verify_ratio"].items()))
k_main = methods["linear (draft model)"]["k"] if "linear (draft model)" in methods else next(
    (s["k"] for s in methods.values()), cost_ks[0])
display(ch.setting(k_main, costs["verify_ratio"].get(k_main)))

# %% [markdown]
# With these costs, the theory says what a draft of each α would buy on this machine:

# %%
for a in (0.4, 0.6, 0.8):
    s = theory.speedup(a, k_main, costs["c"], costs["verify_ratio"][k_main])
    print(f"α = {a}, K = {k_main}: predicted speedup {s:.2f}×")

# %% [markdown]
# ## Choosing K on held-out training prompts
# Each method needs a K. We choose it before the headline run, on held-out training prompts, never on the
# evaluation mix. The n-gram, tree and block methods take the K with the highest median there. The model draft
# keeps the K stored with it, chosen the same way before this run. The sweep's figure and table are in
# Going deeper, below.

# %% tags=["hide-input"]
sweep_prompts = sd.prompts.sweep_prompts(pair, sweep_n)
sweep_runners = {"autoregressive": bench.generate_runner(pair.target, max_new_tokens, 0.0, keep_steps=True,
                                                         method="autoregressive")}
for name, (spec, klist) in sweep.items():
    for k in klist:
        sweep_runners[f"{name}|{k}"] = bench.generate_runner(pair.target, max_new_tokens, 0.0, keep_steps=True,
                                                             **bench.method_kwargs(pair, spec, k))
sr, chosen = None, {}  # the sweep's paired ratios (read again by the GPU section) and the K chosen per method
sweep_said = []        # the sweep's finding per method, shown in Going deeper
if len(sweep_runners) == 1:
    print("no usable method in `sweep` (missing drafters): no K sweep; every method keeps its K")
else:
    sw = bench.run_interleaved(sweep_runners, sweep_prompts, repeats=1, warmup=warmup)
    ch.save(sw.drop(columns=["accepted_lengths", "drafted_lengths"], errors="ignore"), "sweep_runs")
    sr = bench.paired_ratios(sw, "autoregressive")
    sr["method"] = sr.runner.str.split("|").str[0]
    sr["K"] = sr.runner.str.split("|").str[1].astype(int)
    a_hat = bench.pooled_alpha(sw[sw.runner != "autoregressive"])
    sr["alpha_hat"] = sr.runner.map(a_hat)
    lin = sr.method == "linear (draft model)"
    for i in sr.index[lin]:  # theory per call (each call's own α̂), decode loops: see "Does the theory hold?"
        k = sr.at[i, "K"]
        _, th = bench.theory_check(sw, sr.at[i, "runner"], "autoregressive", k, costs["c"], costs["verify_ratio"][k])
        sr.loc[i, ["predicted", "measured_decode"]] = th["predicted_median"], th["measured_median"]
    ch.save(sr, "speedup_vs_k")
    for name in sweep:
        rows = sr[sr.method == name].set_index("K")
        best_k = int(rows["median"].idxmax())
        close = [int(k) for k in report.rivals(rows, best_k)]
        if name in choose_k:
            chosen[name] = best_k
            methods[name] = dict(methods[name], k=best_k)
        elif name not in methods:
            continue
        b = rows.loc[best_k]
        n_b = int(b.n)
        sweep_said.append({
            "method": name, "K in the headline run": methods[name]["k"],
            "how": "chosen here" if name in choose_k else "stored with the draft or fixed in `methods`",
            "highest median at K": best_k, "median": f"{b['median']:.2f}×", "IQR": f"{b.q25:.2f}–{b.q75:.2f}",
            "n": n_b, "other K reaching its IQR": ", ".join(map(str, close)) or "none",
            "best K": (report.NO_VERDICT if n_b < report.MIN_PAIRS else "not resolved" if close else "resolved")})
        # the IQR overlap orders the candidates descriptively; the choice is made here, on training prompts
display(Markdown("*The headline methods and the K each runs with (θ rows: the most a step drafts).*"))
display(pd.DataFrame([{"method": name, "K": spec["k"], "θ cap": "yes" if "confidence" in spec else "",
                       "K chosen above": "yes" if name in chosen else ""} for name, spec in methods.items()])
        .set_index("method"))

# %% [markdown]
# ## The headline run: every method on every task
# Every method runs at the K fixed above, against our autoregressive decoder. Three decoders of the transformers
# library run in the same interleaved run. They are its plain `generate`, assisted generation at the model draft's
# K, and prompt lookup at the n-gram drafter's K. Greedy decoding comes first. The temperatures after the first run
# the runners of `later_temperatures` only.

# %% tags=["hide-input"]
peer_k = {"hf assisted": methods.get("linear (draft model)", {}).get("k"),
          "hf prompt lookup": methods.get("linear (n-gram)", {}).get("k", 4)}
frames = []
for i, temp in enumerate(temperatures):
    runners = {"autoregressive": bench.generate_runner(pair.target, max_new_tokens, temp, keep_steps=True,
                                                       method="autoregressive")}
    for name, spec in methods.items():
        runners[name] = bench.generate_runner(pair.target, max_new_tokens, temp, keep_steps=True,
                                              **bench.method_kwargs(pair, spec))
    if hf_peers:
        runners["hf generate"] = peers.hf_runner(pair.target, max_new_tokens, temp)
        if model_drafter is not None and "linear (draft model)" in methods:
            assistant = peers.hf_assistant(model_drafter.model, pair.target)
            runners["hf assisted"] = peers.assisted_runner(pair.target, assistant, peer_k["hf assisted"],
                                                           max_new_tokens, temp)
        runners["hf prompt lookup"] = peers.prompt_lookup_runner(pair.target, peer_k["hf prompt lookup"],
                                                                 max_new_tokens, temperature=temp)
    if i > 0 and later_temperatures is not None:
        runners = {n: r for n, r in runners.items() if n == "autoregressive" or n in later_temperatures}
    df = bench.run_interleaved(runners, encoded, repeats=repeats, warmup=warmup)
    df["temperature"] = temp
    frames.append(df)
runs = pd.concat(frames, ignore_index=True)
ch.save(runs.drop(columns=["accepted_lengths", "drafted_lengths"], errors="ignore"), "headline_runs")
_ = bench.write_jsonl(runs.drop(columns=["accepted_lengths", "drafted_lengths"], errors="ignore"),
                      ch.out / "headline_runs.jsonl")
k_of = {name: spec["k"] for name, spec in methods.items()} | {n: k for n, k in peer_k.items() if k is not None}

# %% [markdown]
# The figure gives one row per method, grouped by where its draft tokens come from. Each dot is one task's median
# speedup. The number at the right pools every prompt. A dot left of the line at 1 is a task where the method lost
# time against autoregressive decoding.

# %% tags=["hide-input"]
rat = pd.concat([bench.paired_ratios(runs[runs.temperature == t], "autoregressive", by=["task"]).assign(temperature=t)
                 for t in temperatures])
overall = pd.concat([bench.paired_ratios(runs[runs.temperature == t], "autoregressive").assign(temperature=t)
                     for t in temperatures])
overall.insert(1, "K", overall.runner.map(k_of))  # the K each row ran with (θ rows: the cap; hf generate: none)
ch.save(overall, "overall")
spec_runs = runs[runs.runner.isin(methods)]
alpha = bench.pooled_alpha(spec_runs, ["runner", "temperature", "task"]).rename("alpha")
tau = spec_runs.groupby(["runner", "temperature", "task"]).tau.median()
summary = rat.set_index(["runner", "temperature", "task"]).join(alpha).join(tau).reset_index()
summary = summary.rename(columns={"runner": "method", "median": "speedup", "q25": "speedup_q25", "q75": "speedup_q75"})
ch.save(summary, "summary")


def family_figure(t):
    """The headline figure at temperature ``t``: a panel per family, a dot per task, its message in the title."""
    s_t, o_t = summary[summary.temperature == t], overall[overall.temperature == t].set_index("runner")
    top = o_t["median"].idxmax()
    spec = s_t[s_t.method != "hf generate"]  # plain generate does not speculate: it cannot lose by speculating
    below = int((spec.speedup < 1).sum())
    when = "greedy" if t == 0 else f"temperature {t:g}"
    title = (f"Speedup per task, {when}: {top} has the highest pooled median ({o_t.loc[top, 'median']:.2f}×)\n"
             f"{below} of {int(spec.speedup.notna().sum())} speculative task medians lie below 1, where speculation "
             "lost time")
    return figures.speedup_by_family(s_t, family, y="speedup", hue="method", overall=o_t, title=title)


ch.savefig(family_figure(temperatures[0]), "speedup_by_task")
plt.show()
o0 = overall[overall.temperature == temperatures[0]].sort_values("median", ascending=False)
display(Markdown(f"At {'greedy decoding' if temperatures[0] == 0 else f'temperature {temperatures[0]:g}'}, "
                 f"**{o0.runner.iloc[0]}** has the highest median speedup, {o0['median'].iloc[0]:.2f}×; "
                 f"**{o0.runner.iloc[-1]}** has the lowest, {o0['median'].iloc[-1]:.2f}×."))
headline, head_note = report.verdict_table([{"finding": r.runner, "temperature": r.temperature, "K": r.K,
                                              "median": r.median, "q25": r.q25, "q75": r.q75, "n": r.n,
                                              **report.test_of(r)} for r in overall.itertuples()])
book.show(headline.rename(columns={"finding": "method"}).set_index(["temperature", "method"]),
          f"Every method against our autoregressive decoder: the tokens/s ratio on the same prompt and repeat. "
          f"Median and IQR over n prompts ({report.count(repeats, 'repeat')} each, taken together; "
          f"{max_new_tokens} new tokens). K: the draft length (θ rows: its cap)." + head_note,
          prefill=True)

# %% [markdown]
# ## Where speculation loses
# A method can lose time on a prompt: the draft's tokens are rejected, and the step paid for them anyway. We count
# the (speculative method, prompt, temperature) cases whose median paired ratio is below 1. The table gives each
# method's count and its largest loss. transformers' plain `generate` does not speculate, so it is left out here.

# %% tags=["hide-input"]
base = runs[runs.runner == "autoregressive"].set_index(["id", "repeat", "temperature"]).tokens_per_s
per_prompt = runs[~runs.runner.isin(["autoregressive", "hf generate"])].copy()
per_prompt["ratio"] = per_prompt.tokens_per_s.values / base.loc[
    list(zip(per_prompt["id"], per_prompt["repeat"], per_prompt["temperature"]))].values
losses = per_prompt.groupby(["runner", "temperature", "task", "id"]).ratio.median().reset_index()
losses = losses[losses.ratio < 1].sort_values("ratio")
n_cases = per_prompt.groupby(["runner", "temperature", "id"]).ngroups
display(Markdown(f"Speculation lost time in **{len(losses)} of {n_cases}** (method, prompt, temperature) cases: "
                 f"their median ratio over {report.count(repeats, 'repeat')} is below 1."
                 + (" With one run each, a ratio near 1 is as likely noise as a loss." if repeats == 1 else "")))
cases = per_prompt.groupby(["runner", "temperature"]).id.nunique()
worst = losses.groupby(["runner", "temperature"]).first()
book.show(pd.DataFrame({"cases": cases, "losses": losses.groupby(["runner", "temperature"]).size()}).fillna(0)
          .astype(int).join(worst[["task", "id", "ratio"]].rename(
              columns={"ratio": "worst ratio", "task": "worst task", "id": "worst prompt"})),
          "Losses per method: prompts whose median tokens/s ratio against autoregressive is below 1, and the "
          "smallest ratio.", prefill=True)

# %% [markdown]
# ## Does the theory hold?
# We test the theory on linear speculation with the draft model, greedy. Each call of the headline run gets its own
# prediction, from its own α̂: accepted ÷ (accepted + rejections) over its steps. The prediction also takes c and the
# verify ratio measured above. It is compared with the call's measured speedup in the decode loop alone, since
# Theorem 3.8 models the loop and not the prefill (the prompt's pass).
#
# Why per call? α differs from prompt to prompt, and the speedup is not linear in α. One pooled α̂ predicts the
# speedup at the average α, which no prompt has. The agreement reported is between the median prediction and the
# median measurement.

# %% tags=["hide-input"]
if "linear (draft model)" in methods:
    k0 = methods["linear (draft model)"]["k"]
    g0 = runs[runs.temperature == 0.0]
    calls, th = bench.theory_check(g0, "linear (draft model)", "autoregressive", k0, costs["c"],
                                   costs["verify_ratio"][k0])
    rel = th["rel_error"]
    ch.save(pd.DataFrame([th]), "theory_check")
    ch.save(calls, "theory_calls")
    word = "AGREE" if rel < theory_tolerance else "DISAGREE"
    n_calls = int(calls["id"].nunique())  # the distinct prompts behind the calls
    verdict = report.judged(word, n_calls)  # a verdict on medians over n_calls prompts: the size rule
    mq = calls.measured.quantile([0.25, 0.75])
    loop = report.verdict_of(protocol.summarise(calls.measured, units=calls["id"])) or report.NO_VERDICT
    display(Markdown(f"The theory predicts **{th['predicted_median']:.2f}×** and the decode loop measures "
                     f"**{th['measured_median']:.2f}×**: a relative error of {rel:.1%}, against a tolerance of "
                     f"{theory_tolerance:.0%}."))
    book.show(pd.DataFrame({"value": {
        "K": f"{k0}", "c": f"{th['c']:.3f}", "verify ratio": f"{th['verify_ratio']:.3f}", "calls": f"{th['calls']}",
        "pooled α̂": f"{th['alpha_pooled']:.3f}", "predicted, median over calls": f"{th['predicted_median']:.3f}×",
        "measured, median over calls": f"{th['measured_median']:.3f}× (IQR {mq[0.25]:.2f}–{mq[0.75]:.2f})",
        "the decode loop against autoregressive": loop,
        "relative error of the medians": f"{rel:.1%} (tolerance {theory_tolerance:.0%})",
        "theory and measurement": verdict if verdict == word else report.NO_VERDICT,
        "median per-call |error|": f"{th['per_call_abs_error_median']:.1%}",
        "one pooled α̂ would predict": f"{th['predicted_pooled']:.3f}×"}}),
        "Theorem 3.8 against the measurement, linear SD with the draft model, greedy." + report.rule_note([n_calls]),
        prefill=False, digits=None)
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    sns.scatterplot(data=calls, x="predicted", y="measured", hue="task", ax=ax)
    lim = [min(calls.predicted.min(), calls.measured.min()) * 0.95,
           max(calls.predicted.max(), calls.measured.max()) * 1.05]
    ax.plot(lim, lim, "k--", lw=1, label="measured = predicted")
    ax.set(xlim=lim, ylim=lim, xlabel="predicted speedup (call's α̂, c, verify cost)",
           ylabel="measured speedup (decode loop)",
           title=f"Per call, the theory misses by {th['per_call_abs_error_median']:.0%} (median)\n"
                 f"(linear SD, K = {k0}, greedy; on the dashed line, prediction = measurement)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    ch.savefig(fig, "theory_calls")
    if assert_theory:
        assert rel < theory_tolerance, f"theory and measurement disagree by {rel:.1%}"

# %% [markdown]
# ## Beside the field
# The papers report speedups of up to two or three times. The table sets each beside this run's greedy speedup
# of the nearest method (fixed citations in `data/anchors.csv`, each with its hardware, models and source).
# They measure different regimes, and the gap is mechanical:
#
# - Those targets have 7–70 B parameters on a GPU. A decode step reads gigabytes of weights and leaves the compute
#   units idle. So a verify pass over K + 1 tokens costs about one pass.
# - Their drafts are 10–100× smaller than the target, so a draft pass costs a few per cent of a target pass
#   (c ≈ 0.01–0.05).
# - Here the target has 135 M parameters on a CPU. A pass is short, and compute takes a larger part of it. So the
#   verify pass can cost well above one token's ([chapter 1](01_bottleneck.ipynb); this run's ratio is in the
#   setting line).
# - A draft of a few layers is not a hundred times cheaper than so small a target (c, measured above).
# - The decode loop's fixed work per step (sampling, bookkeeping, Python) weighs more against a pass of a few
#   milliseconds.
# - Their drafts (EAGLE, Medusa) were trained on far more data for far larger targets, so they accept more tokens
#   per step. The `tau` column is τ, the mean tokens per target pass with the target's own token included
#   ([notation](notation.md)).
# - Prompt lookup and n-gram drafting copy from the prompt. They move with the share of copy-heavy tasks in the
#   mix, not with the hardware alone.

# %% tags=["hide-input"]
field = pd.read_csv(anchors)
g0_over = overall[overall.temperature == 0.0].set_index("runner") if 0.0 in temperatures else pd.DataFrame()
tau_run = runs[runs.temperature == 0.0].groupby("runner").tau.median()
ours = []
for r in field.itertuples():
    if r.nearest in g0_over.index:
        x = g0_over.loc[r.nearest]
        ours.append(dict(this_run=f"{x['median']:.2f}× ({x.q25:.2f}–{x.q75:.2f}, n = {int(x.n)})",
                         this_run_tau=tau_run.get(r.nearest, np.nan) if r.nearest in methods else np.nan))
    else:
        ours.append(dict(this_run="not run", this_run_tau=np.nan))
field = pd.concat([field, pd.DataFrame(ours)], axis=1)
ch.save(field, "beside_the_field")
book.show(field.drop(columns=["url"]).rename(columns={"speedup": "published speedup", "tau": "published τ",
                                                      "nearest": "nearest method here", "this_run": "this run (greedy)",
                                                      "this_run_tau": "this run's τ"}).set_index(["source", "published_method"]),
          "Published speedups, each over its paper's own autoregressive baseline (greedy unless the setting says "
          "otherwise). Beside each: this run's greedy speedup of the nearest method, median and IQR over "
          f"{len(encoded)} prompts. τ: tokens per target pass. Sources: " + "; ".join(
              f"{s_} <{u}>" for s_, u in field.drop_duplicates("source")[["source", "url"]].values) + ".",
          prefill=True, digits=2)

# %% [markdown]
# ## Going deeper
#
# ### Speedup versus K on the held-out training prompts
# Every method of `sweep` ran at each of its K, greedy, in one interleaved run on `sweep_n` held-out training
# prompts (`sd.prompts.sweep_prompts`). These are the prompts the draft's stored K and θ were chosen on, never the
# evaluation mix. The figure draws the paired speedups against K. For linear SD with the draft model it adds the
# theory's prediction, from each call's α̂ and the measured pass costs.

# %% tags=["hide-input"]
if sr is not None:
    # markers and IQR bars, no lines: the sweep measured these K only, and a line would invent the ones between
    fig = figures.median_iqr(sr.sort_values("K"), "method", sort=False, dodge=0.08, label="{} (median, IQR)",
                             figsize=(8, 4.5), ylabel="speedup over autoregressive (greedy)",
                             title=f"Each method's speedup against K, {len(sweep_prompts)} held-out training prompts")
    ax = fig.axes[0]
    if lin.any():  # the theory beside the linear draft's measurement
        ax.plot(sr[lin].K, sr[lin].predicted, "ks", mfc="none", label="theory (linear, measured α, c, verify cost)")
        ax.plot(sr[lin].K, sr[lin].measured_decode, "kx", label="measured (linear, decode loop only)")
    ax.axhline(1, color="grey", lw=1)  # drawn last: matplotlib then keeps the y-range the series set
    ax.legend(fontsize=8)
    fig.tight_layout()
    ch.savefig(fig, "speedup_vs_k")
    plt.show()
    book.show(sr.drop(columns=["runner"]).set_index(["method", "K"]),
              f"Speedup versus K on {len(sweep_prompts)} held-out training prompts, greedy: tokens/s ÷ autoregressive "
              "(median, IQR, n prompts), and the pooled α̂. For linear SD with the draft model: the theory's prediction "
              "and the decode loop's measured ratio.", prefill=True)
    book.show(pd.DataFrame(sweep_said).set_index("method"),
              "The K of each method in the headline run, and the sweep's highest median. The column “best K” says "
              "whether another K's IQR reaches the highest median's."
              + report.rule_note([r["n"] for r in sweep_said], "“best K”"), prefill=True, digits=None)

# %% [markdown]
# ### The same K on training prompts and on the evaluation mix
# The K sweep and the headline run measured some settings twice, greedy both times. Here is where a K chosen on
# training prompts lands on the evaluation mix.

# %% tags=["hide-input"]
head0 = overall[overall.temperature == temperatures[0]].set_index("runner")
twice = []
for r in (sr.itertuples() if sr is not None else []):
    h = head0.loc[r.method] if r.method in head0.index and methods[r.method]["k"] == r.K else None
    if h is None or "confidence" in methods[r.method]:
        continue
    both = "yes" if report.overlap(r, h) else "no: the level differs between the prompt sets"
    twice += [{"finding": f"{r.method}, K = {r.K}", "prompts": "training", "median": r.median, "q25": r.q25,
               "q75": r.q75, "n": r.n, "IQRs overlap": both},
              {"finding": f"{r.method}, K = {r.K}", "prompts": "evaluation mix", "median": h["median"], "q25": h.q25,
               "q75": h.q75, "n": h.n, **report.test_of(h), "IQRs overlap": both}]
    twice[-2] |= report.test_of(r._asdict())
if twice:
    tw, tw_note = report.verdict_table(twice)
    book.show(tw.set_index(["finding", "prompts"]), "The same settings on both prompt sets: tokens/s ÷ autoregressive "
              "(median, IQR, n prompts)." + tw_note, prefill=True, digits=None)
else:
    display(Markdown("No setting was measured in both runs."))

# %% [markdown]
# ### Every method by task, and each temperature
# The speedup of each method on each task, then the pooled α, greedy first. α and τ of each cell are saved in
# `summary.csv`.

# %% tags=["hide-input"]
book.show(summary.pivot_table(index=["temperature", "task"], columns="method", values="speedup"),
          "Speedup per task: tokens/s ÷ autoregressive, median over the task's prompts.", prefill=True, digits=2)
display(Markdown("*α per task, pooled over the task's calls.*"))
display(summary.pivot_table(index=["temperature", "task"], columns="method", values="alpha").round(2))
s0 = summary[summary.temperature == temperatures[0]]
by_task_alpha = []
for m in [m for m in methods if "n-gram" not in m and m in set(s0.method)]:
    a = s0[s0.method == m].set_index("task").alpha.dropna()
    if len(a):
        by_task_alpha.append({"method": m, "highest α on": a.idxmax(), "highest α": a.max(),
                              "lowest α on": a.idxmin(), "lowest α": a.min()})
if by_task_alpha:
    display(Markdown("*Where each method's α is highest and lowest, first temperature.*"))
    display(report.shown(pd.DataFrame(by_task_alpha).set_index("method"), 2))
for t in temperatures[1:]:
    ch.savefig(family_figure(t), f"speedup_by_task_t{t:g}")
    plt.show()

# %% [markdown]
# ### Accepted lengths and latency
# The histograms count accepted draft tokens per target pass, greedy, one panel per family of methods. The table
# gives per-token latency percentiles. TTFT, the time to the first token, includes the prefill. For a model drafter
# it also includes the draft's own prefill, inside the first draft.

# %% tags=["hide-input"]
hist = []
for r in spec_runs[spec_runs.temperature == temperatures[0]].itertuples():
    hist += [dict(method=r.runner, family=family.get(r.runner, "other"), accepted=a) for a in r.accepted_lengths]
hist = pd.DataFrame(hist)
g = sns.displot(data=hist, x="accepted", hue="method", col="family", multiple="dodge", discrete=True,
                stat="probability", common_norm=False, height=3.2, aspect=1.2, shrink=0.8, palette="colorblind",
                facet_kws={"sharey": False})
g.set_titles("{col_name}")
g.figure.suptitle(f"Accepted draft tokens per target pass: {(hist.accepted == 0).mean():.0%} of all steps keep none",
                  y=1.04)
ch.savefig(g, "accepted_length_hist")
plt.show()
lat = runs[runs.runner.isin(["autoregressive", *methods])].groupby(["runner", "temperature"])[
    ["ttft_ms", "p50_ms", "p95_ms", "p99_ms"]].median()
lat.to_csv(ch.out / "latency.csv")
book.show(lat, "Latency, median over calls: time to the first token (TTFT) and per-token latency percentiles, in ms.",
          prefill=True, digits=1)

# %% [markdown]
# ### The same draft on a GPU: the best K its costs predict
# α belongs to the weights; c and the verify cost belong to the hardware. So this run's α goes into Theorem 3.8 with
# three cost sets. The α is linear SD's with the draft model, greedy, pooled over the headline run. The cost sets
# are this run's and the committed GPU reference run's (`data/reference/cuda-*/`, `make gpu-reference`). The GPU run
# measured its costs with the library's eager passes (`core`) and with the same passes in CUDA graphs (`graph`).
# These are predictions only. The GPU run had random weights of the same shapes, and no trained pair was decoded
# there.

# %% tags=["hide-input"]
gref = hardware.load_reference()
g0_lin = runs[(runs.temperature == 0.0) & (runs.runner == "linear (draft model)")]
if not gref or g0_lin.empty:
    print("skipped:", "no GPU reference run under data/reference/cuda-*/" if not gref
          else "no greedy linear run with the draft model in `methods`")
else:
    alpha_run = float(bench.pooled_alpha(g0_lin).iloc[0])
    by_device = hardware.speedup_by_device(alpha_run, range(1, 9), {f"{ch.tag} (this run) / core": (
        costs["c"], costs["verify_ratio"]), **hardware.reference_costs(gref)})
    ch.save(by_device, "gpu_predicted_k")
    best = by_device[by_device.best_k]
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(data=by_device, x="K", y="predicted_speedup", hue="source", marker="o", ax=ax)
    ax.axhline(1, color="grey", lw=1)
    ax.set(ylabel="predicted speedup (Theorem 3.8)",
           title=f"The same draft (α = {alpha_run:.2f}) on each machine's costs: each peak is a best K")
    ax.legend(fontsize=7)
    ch.savefig(fig, "gpu_predicted_k")
    plt.show()
    gpu_rows, gpu_n = [], []
    for r in best.itertuples():
        row = {"source": r.source, "c": f"{r.c:.3f}", "best K": r.K, "t(K+1)/t(1)": f"{r.verify_ratio:.2f}",
               "predicted": f"{r.predicted_speedup:.3f}×",
               "speculation": "predicted to pay" if r.predicted_speedup > 1 else "predicted not to pay"}
        # this machine's row: the K sweep's measurement at that K, when the sweep ran it (a prediction is not one)
        at_k = sr[(sr.method == "linear (draft model)") & (sr.K == r.K)] if sr is not None else []
        if "(this run)" in r.source and len(at_k):
            m = at_k.iloc[0]
            gpu_n.append(int(m.n))
            row |= {"measured in the sweep": f"{m['median']:.2f}× (IQR {m.q25:.2f}–{m.q75:.2f}, n = {int(m.n)})",
                    "its verdict": report.verdict_of(m) or report.NO_VERDICT,
                    "prediction vs measured IQR": ("above" if r.predicted_speedup > m.q75 else
                                                   "below" if r.predicted_speedup < m.q25 else "within"),
                    "sweep's per-call prediction": f"{m.predicted:.3f}×" if m.predicted == m.predicted else ""}
        gpu_rows.append(row)
    book.show(pd.DataFrame(gpu_rows).set_index("source").fillna(""),
              "The best K each machine's costs predict for this draft (Theorem 3.8, pooled α). Beside it: this "
              "machine's measurement at that K in the K sweep." + report.rule_note(gpu_n, "“its verdict”"),
              prefill=True, digits=None)

# %% [markdown]
# ## Summary
# Every method's speedup is set by α and by what a step costs, the verify pass over K + 1 tokens included. The theory
# predicts the measurement once that cost is measured and each prompt keeps its own α. The speedup is not linear in
# α, so one pooled α predicts it too high where the curve is concave over the prompts' α, and too low where it is
# convex. An n-gram drafter can only propose text that already occurred; its bullet tests whether it does best on
# the tasks that copy from the prompt (summarization, RAG).
#
# What this run measured, computed from its tables (greedy unless said):

# %% tags=["hide-input"]
t0_ = temperatures[0]
lines = []
for t_ in temperatures:
    o = overall[overall.temperature == t_].sort_values("median", ascending=False)
    lines.append(f"- **Speed at temperature {t_:g}**: {o.runner.iloc[0]} has the highest median, "
                 f"{o['median'].iloc[0]:.2f}×, and {o.runner.iloc[-1]} the lowest, {o['median'].iloc[-1]:.2f}×. "
                 "Every method's ratio and verdict is in the table under the headline figure.")
if "linear (draft model)" in methods:
    pooled, per_call, meas = th["predicted_pooled"], th["predicted_median"], th["measured_median"]
    direction = "over" if pooled > meas else "under"
    lines.append(f"- **Theory, linear SD with the draft model (K = {k0})**: the per-call prediction is {per_call:.3f}×, "
                 f"and the decode loops measure {meas:.3f}× (relative error {rel:.1%}). "
                 + (f"Within a tolerance of {theory_tolerance:.0%}, theory and measurement: "
                    f"{report.judged('agree' if rel < theory_tolerance else 'disagree', th['calls'])}. "
                    if theory_tolerance <= finest_tolerance else
                    f"A tolerance of {theory_tolerance:.0%} checks nothing finer than a bug at this size. ")
                 + f"One pooled α̂ = {th['alpha_pooled']:.3f} predicts {pooled:.3f}×, {direction}-predicting the "
                 "measurement.")
if "linear (n-gram)" in set(s0.method):
    ng = s0[s0.method == "linear (n-gram)"].set_index("task")
    best_task = ng.speedup.idxmax()
    copy = [t for t in ("summarization", "rag") if t in ng.index]
    others = ng.drop(index=copy)
    if copy and len(others):
        holds = ng.loc[copy].speedup.min() > others.speedup.max()
        n_copy = int(ng.loc[copy].n.sum())  # the prompts behind the copy-heavy tasks' medians
        trend = ("Copy-heavy tasks favour it in this run" if holds else "Copy-heavy tasks do not stand out in this run")
        copy_txt = (f" It reaches {', '.join(f'{t} {ng.speedup[t]:.2f}×' for t in copy)} on the copy-heavy tasks, "
                    f"against {others.speedup.min():.2f}–{others.speedup.max():.2f}× elsewhere. "
                    + (trend if n_copy >= report.MIN_PAIRS else
                       f"Whether copy-heavy tasks favour it is {report.unresolved(n_copy)}") + ".")
    else:
        copy_txt = " No copy-heavy task is in this run's mix."
    ref_csv = Path("../data/reference/book/06_speedup/summary.csv")
    if ch.own_pair and ref_csv.exists():  # the last full run, for comparison
        ref = pd.read_csv(ref_csv)
        rn = ref[(ref.temperature == 0.0) & (ref.method == "linear (n-gram)")].set_index("task")
        if len(rn):
            copy_txt += (f" The full reference run's n-gram drafter gained most on {rn.speedup.idxmax()} "
                         f"({rn.speedup.max():.2f}×): " + ("the same task." if rn.speedup.idxmax() == best_task
                                                          else f"another task than {best_task}."))
    lines.append(f"- **The n-gram drafter** gains most on {best_task} ({ng.speedup.max():.2f}×, "
                 f"α = {ng.alpha[best_task]:.2f})." + copy_txt)
if len(temperatures) > 1:
    a_t = summary.groupby(["method", "temperature"]).alpha.mean().unstack()
    lower = [m for m in a_t.index if a_t.loc[m].notna().all() and a_t.loc[m].iloc[-1] < a_t.loc[m].iloc[0]]
    lines.append(f"- **Temperature {temperatures[-1]} against {t0_}**: the mean α is lower for {len(lower)} of "
                 f"{int(a_t.notna().all(axis=1).sum())} methods ({', '.join(lower) or 'none'}).")
lines.append(f"- **Losses**: in {len(losses)} of {n_cases} (speculative method, prompt, temperature) cases the median "
             f"ratio over {report.count(repeats, 'repeat')} is below 1 (the losses table, per method).")
lines += [ch.skipped_summary()] if ch.skipped else []
display(Markdown("\n".join(lines)))

# %% [markdown]
#
# ## Exercises
# 1. Re-run with `temperatures = [1.5]`. Which method degrades most?
# 2. Point `prompt_file` at Spec-Bench's `question.jsonl`. Do the per-task rankings hold?
# 3. On a GPU (`device = "cuda"`), is the verify ratio closer to 1? Predict the new best K, then measure it.
