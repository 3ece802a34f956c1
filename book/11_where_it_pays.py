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
# # 11 · Where speculation pays: input-grounded requests, drafters that remember, predicted outputs
#
# Chapters 3–10 measured speculation on one kind of request, the chat-like evaluation mix, where the answer is new
# text and a drafter without a model finds little to copy. Many real requests are not like that: a paragraph to
# correct, a passage to quote or summarise, a document to extract into a fixed schema, an earlier answer to revise.
# Their output repeats their input, and a drafter that copies can propose long runs the target accepts. This
# chapter measures that regime beside the chat mix, on the same target, in one run:
#
# - **our n-gram drafter** (chapter 3) at a K chosen here on training prompts, and **transformers' prompt lookup** at
#   its defaults (10 tokens, n-gram size 2), the peer a reader already knows;
# - the **suffix drafter** (`sd.SuffixDrafter`, after SuffixDecoding, arXiv 2411.04975): suffix tries over the
#   request and over earlier requests' outputs, drafting up to `max_spec_factor` × the match length; *cold* (no
#   memory of earlier requests) and *warm* (a memory built from training requests, then frozen), as a chain and as a
#   token tree;
# - **predicted outputs** (`sd.generate(..., prediction=ids)`, OpenAI's Predicted Outputs): the passage the request
#   is built on is the draft, resumed after each divergence, alone and with the warm suffix drafter behind it;
# - the **model draft** at its stored K, the method that needs no copying.
#
# Every one of them is exact: a deterministic draft's law is one-hot on its tokens, and verification keeps the
# target's distribution whatever was drafted (chapter 2); the greedy outputs are compared with autoregressive
# decoding call by call below. What changes between requests is only how much of each verify pass is accepted.
#
# Protocol as in chapter 6 (`specdec_core.study.bench`): settings (K, the suffix drafter's setting, the per-request
# rule) are fixed on training prompts, whose passages no evaluation prompt shares, before the evaluation prompts are
# timed; every runner decodes the same prompts, interleaved, after a warm-up; ratios are paired against our
# autoregressive decoder. A mix's speedup is its throughput ratio (summed times), computed from the same calls.

# %% tags=["parameters"]
params_name = None  # the parameter file's name, injected by scripts/run_book.py (banner)
model = "smollm2-135m"        # embedded name, Hugging Face id or path
draft = None                  # optional draft id/path (default: the shipped drafts)
grounded_per_task = 3         # input-grounded eval prompts per task (edit, quote, extract, revise)
chat_per_task = 2             # chat eval-mix prompts per task (the six tasks of chapter 6)
chat_tasks = None             # None: all six tasks; or a list of them
train_per_task = 2            # input-grounded training prompts per task on which K and the setting are chosen
chat_train = 6                # held-out chat training prompts for the per-request rule
memory_per_task = 6           # further input-grounded training prompts whose outputs warm the suffix memory
max_new_tokens = 160          # an edited paragraph is 80-150 tokens
chat_max_new_tokens = 64      # the chat mix's budget, as chapter 6's
repeats = 2                   # interleaved repeats of the grounded greedy run
chat_repeats = 1              # interleaved repeats of the chat greedy run and of the temperature-1 run
warmup = 1                    # untimed calls of every runner on the first prompt
ngram_ks = [8, 16, 24, 32]    # the n-gram drafter's K candidates (greedy, training prompts)
suffix_k = 32                 # the cap on a suffix or prediction step's length
suffix_settings = {           # name -> SuffixDrafter arguments; the best on training prompts is used (cold there)
    "vLLM defaults": {},
    "deep": {"max_tree_depth": 64, "max_spec_factor": 2.0},
    "deeper": {"max_tree_depth": 128, "max_spec_factor": 4.0},
}
model_k = "auto"              # the model draft's K ("auto": stored with the draft)
prediction_tasks = ["edit", "quote", "revise"]   # grounded tasks whose request carries its passage as a prediction
t1 = True                     # also decode the grounded prompts at temperature 1 (a subset of runners)
shares = [0.0, 0.1, 0.25, 0.5, 0.75, 1.0]   # input-grounded shares of the traffic mix
mix_seeds = [0, 1, 2, 3]      # draws of the mix at each share
anchors = "../data/anchors_grounded.csv"  # published model-free speedups (fixed citations) set beside this run's
device = "cpu"
dtype = "float32"  # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
out_dir = "../build/book/11_where_it_pays"

# %%
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from IPython.display import Markdown, display

import specdec_core as sd
from specdec_core.study import bench, figures, grounded, peers, report
from specdec_core.tools import book

display(book.banner(params_name))
ch = book.setup(out_dir, model, draft=draft, device=device, dtype=dtype, per_task=chat_per_task, tasks=chat_tasks)
pair, target, tok = ch.pair, ch.pair.target, ch.pair.tokenizer
AR = "autoregressive"


g_eval = sd.prompts.load_grounded("eval", per_task=grounded_per_task)
g_train_all = sd.prompts.load_grounded("train")
by_task = {t: [p for p in g_train_all if p.task == t] for t in sd.prompts.GROUNDED_TASKS}
g_train = [p for ps in by_task.values() for p in ps[:train_per_task]]
g_memory = [p for ps in by_task.values() for p in ps[train_per_task:train_per_task + memory_per_task]]


def encoded(prompts):
    """``(meta, ids)`` per grounded prompt; its class: "prediction" where the request carries its passage, else
    "grounded"."""
    return [(dict(id=p.id, task=p.task, **{"class": "prediction" if p.task in prediction_tasks else "grounded"}),
             sd.prompts.encode(pair, p)) for p in prompts]


grounded_eval, grounded_train = encoded(g_eval), encoded(g_train)
chat_eval = [(dict(m, **{"class": "chat"}), ids) for m, ids in ch.bench_prompts]
chat_train_prompts = [(dict(m, **{"class": "chat"}), ids) for m, ids in sd.prompts.sweep_prompts(pair, chat_train)]
predictions = {tuple(ids.tolist()): grounded.prediction_ids(tok, p)
               for p, (_, ids) in zip(g_eval + g_train, grounded_eval + grounded_train) if p.task in prediction_tasks}


def with_prediction(ids, alone=True):
    """The request's prediction; a request without one decodes without it (alone: autoregressively)."""
    pred = predictions.get(tuple(ids.tolist()))
    return {"prediction": pred} if pred is not None else {"method": "autoregressive"} if alone else {}


model_spec = bench.stored_k(pair, {"method": "linear", "drafter": "model", "k": model_k}) \
    if "model" in pair.drafters and not bench.unrunnable(pair, {"method": "linear", "drafter": "model", "k": model_k}) \
    else None
if model_spec is None:
    ch.skip("the model draft", "this pair has no draft model with a stored K (give model_k a number)")
print(ch)
print(f"input-grounded: {len(grounded_eval)} eval prompts ({', '.join(sorted({p.task for p in g_eval}))}), "
      f"{len(grounded_train)} training prompts to choose on, {len(g_memory)} more to warm the memory; "
      f"chat: {len(chat_eval)} eval prompts, {len(chat_train_prompts)} held-out training prompts; "
      f"{len(predictions)} requests carry a prediction (tasks {', '.join(prediction_tasks)})")

# %% [markdown]
# ## What a long verify pass costs here
# A copying drafter proposes long chains, so the verify pass it pays for is a pass over up to K + 1 = 33 tokens. Its
# cost in one-token passes, timed side by side at the median grounded prompt's context (chapter 1 explains why it
# is not 1 on a CPU, and which kernel path the library runs here):

# %%
costs = bench.pass_costs(target, None, bench.median_length(grounded_eval), ks=(4, 8, 16, 24, 32), repeats=7,
                         decoded=max_new_tokens // 2)
print("verify pass over K + 1 tokens ÷ one-token pass: "
      + ", ".join(f"K = {k}: {v:.2f}" for k, v in costs["verify_ratio"].items()))
display(ch.setting(16, costs["verify_ratio"][16]))

# %% [markdown]
# ## Settings fixed on training prompts
# Every candidate, greedy, on the input-grounded *training* prompts (and the chat mix's held-out training prompts for
# the rule below): the n-gram drafter at each K of `ngram_ks`, the suffix drafter (cold: a fresh drafter with no
# memory across requests) in each setting of `suffix_settings`, the prediction where the request has one. The highest
# median fixes the n-gram's K and the suffix drafter's setting for everything after.

# %%
def runner(temp=0.0, outputs=None, tokens=max_new_tokens, **kw):
    return bench.decode_runner(target, tokens, temp, keep_steps=True, outputs=outputs, **kw)


def cold(setting):
    return sd.SuffixDrafter(**suffix_settings[setting], max_cached_requests=0)


ngram = pair.drafters["ngram"]
train_runners = {AR: runner(method="autoregressive")}
train_runners |= {f"n-gram|{k}": runner(method="linear", drafter=ngram, k=k) for k in ngram_ks}
train_runners |= {f"suffix cold|{s}": runner(method="linear", drafter=cold(s), k=suffix_k) for s in suffix_settings}
train_runners["prediction"] = runner(method="linear", k=suffix_k, per_prompt=with_prediction)
tr = bench.run_interleaved(train_runners, grounded_train, repeats=1, warmup=warmup)
tr_r = bench.paired_ratios(tr[tr.runner != "prediction"], AR)
ch.save(tr_r, "training_sweep")
k_ngram = int(tr_r[tr_r.runner.str.startswith("n-gram|")].set_index("runner")["median"].idxmax().split("|")[1])
setting = tr_r[tr_r.runner.str.startswith("suffix cold|")].set_index("runner")["median"].idxmax().split("|")[1]
book.show(tr_r.set_index("runner"), f"Greedy speedup over autoregressive decoding on {len(grounded_train)} "
          "input-grounded training prompts (median, IQR, n pairs): the candidates K and settings are chosen from.",
          prefill=True)
def resolved(prefix, chosen):
    """Whether the choice among the ``prefix`` runners is resolved on these prompts (no rival's IQR reaches it)."""
    rows = tr_r[tr_r.runner.str.startswith(prefix)].set_index("runner")
    close = [r.split("|")[1] for r in report.rivals(rows, f"{prefix}{chosen}")]
    n = int(rows.loc[f"{prefix}{chosen}", "n"])
    return (report.unresolved(n) if n < report.MIN_PAIRS else
            f"not resolved on these prompts ({', '.join(close)} reach its IQR)" if close else "resolved on these prompts")


display(Markdown(f"Chosen on training prompts: the n-gram drafter at **K = {k_ngram}** ({resolved('n-gram|', k_ngram)}), "
                 f"the suffix drafter's **{setting}** setting "
                 f"({suffix_settings[setting] or 'max_tree_depth 24, max_spec_factor 1, min_token_prob 0.1'}; "
                 f"{resolved('suffix cold|', setting)})."))

# %% [markdown]
# ## A memory built from training requests
# The warm suffix drafter decodes `memory_per_task` further training prompts of each task (their outputs are the
# target's own greedy answers, since greedy speculation equals autoregressive decoding) and keeps those outputs in
# its global trie; then its memory is frozen (`learn = False`), so neither the warm-up nor the interleaved repeats
# can teach it the answers it is timed on. What it can learn is what recurs across requests: the extraction schema's
# keys and punctuation, an edit's phrasing.

# %%
warm = sd.SuffixDrafter(**suffix_settings[setting], max_cached_requests=max(1, len(g_memory)))
held = grounded.build_memory(target, warm, [sd.prompts.encode(pair, p) for p in g_memory], max_new_tokens, suffix_k)
print(f"warm memory: {held} outputs of training requests ({sum(len(o) for o in warm.cached)} tokens), frozen")

# %% [markdown]
# ## The runners
# Every method as it is timed below: the n-gram drafter at the K chosen above, the suffix drafter cold (a fresh one,
# no memory) and warm (the frozen memory), as a chain and as its token tree (best-first by path probability, at most
# the default tree's size at depth K), the prediction alone (a request without one decodes autoregressively) and
# with the warm suffix drafter behind it, the model draft, and transformers' prompt lookup at its defaults.

# %%
outputs = {}


def out(name):
    return outputs.setdefault(name, {})


def eval_runners(temp, names=None, tokens=max_new_tokens, prediction=True, outputs=True):
    """The runners at temperature ``temp`` (``names``: a subset; greedy runners record their tokens in
    ``outputs`` for the identity check, unless ``outputs`` is False)."""
    o = (lambda n: out(n) if temp == 0 and outputs else None)
    r = {AR: runner(temp, o(AR), tokens, method="autoregressive")}
    r[f"n-gram K={k_ngram}"] = runner(temp, o(f"n-gram K={k_ngram}"), tokens, method="linear", drafter=ngram, k=k_ngram)
    r["suffix cold"] = runner(temp, o("suffix cold"), tokens, method="linear", drafter=cold(setting), k=suffix_k)
    r["suffix warm"] = runner(temp, o("suffix warm"), tokens, method="linear", drafter=warm, k=suffix_k)
    r["suffix warm tree"] = runner(temp, o("suffix warm tree"), tokens, method="tree", drafter=warm, k=suffix_k)
    if prediction:
        r["prediction"] = runner(temp, o("prediction"), tokens, method="linear", k=suffix_k, per_prompt=with_prediction)
        r["prediction + suffix"] = runner(temp, o("prediction + suffix"), tokens, method="linear", drafter=warm,
                                          k=suffix_k, per_prompt=lambda ids: with_prediction(ids, alone=False))
    if model_spec is not None:
        r[f"model draft K={model_spec['k']}"] = runner(temp, o(f"model draft K={model_spec['k']}"), tokens,
                                                       **bench.method_kwargs(pair, model_spec))
    if temp == 0:
        r["hf prompt lookup"] = peers.prompt_lookup_runner(target, 10, tokens, max_ngram=2)
    return {n: f for n, f in r.items() if names is None or n == AR or n in names}


# %% [markdown]
# ## One method per request, chosen before decoding
# What a server knows before it decodes: whether the request carries a prediction, and whether it is an
# input-grounded request or a chat turn. The rule: for each class, the runner with the highest median on that class's
# *training* prompts (autoregressive decoding if none beats it). Its evaluation calls are the chosen runner's calls on
# each request, taken from the evaluation run below (the rule is fixed here, before that run).

# %%
train_cls = {"prediction": ["prediction", "prediction + suffix", "suffix warm", f"n-gram K={k_ngram}"],
             "grounded": ["suffix warm", "suffix warm tree", f"n-gram K={k_ngram}"],
             "chat": ["suffix warm", f"n-gram K={k_ngram}"] + ([f"model draft K={model_spec['k']}"] if model_spec else [])}
swept = {f"n-gram|{k_ngram}": f"n-gram K={k_ngram}", "prediction": "prediction"}  # timed in the sweep already
more = {n: f for n, f in eval_runners(0.0, outputs=False).items()
        if n == AR or (n not in swept.values() and any(n in v for c, v in train_cls.items() if c != "chat"))}
chat_more = {n: f for n, f in eval_runners(0.0, tokens=chat_max_new_tokens, prediction=False, outputs=False).items()
             if n == AR or n in train_cls["chat"]}
train_ratios = pd.concat([
    bench.paired_ratios(tr[tr.runner.isin([AR, *swept])].replace({"runner": swept}), AR, by=["class"]),
    bench.paired_ratios(bench.run_interleaved(more, grounded_train, repeats=1, warmup=0), AR, by=["class"]),
    bench.paired_ratios(bench.run_interleaved(chat_more, chat_train_prompts, repeats=1, warmup=0), AR, by=["class"]),
], ignore_index=True)
ch.save(train_ratios, "rule_training")
rule = grounded.choose(train_ratios, {c: v for c, v in train_cls.items() if c in set(train_ratios["class"])})
display(Markdown("The rule fixed on training prompts: " + "; ".join(f"{c} → **{r}**" for c, r in rule.items())
                 + " (its calls on the evaluation prompts are read from the run below)."))

# %% [markdown]
# ## The evaluation run
# Greedy, every runner on every input-grounded eval prompt (`repeats` interleaved repeats), then the chat mix's eval
# prompts with every runner that needs no prediction; then, if `t1`, the grounded prompts at temperature 1 with a
# subset of the runners.

# %%
g_runs = bench.run_interleaved(eval_runners(0.0), grounded_eval, repeats=repeats, warmup=warmup)
c_runs = bench.run_interleaved(eval_runners(0.0, tokens=chat_max_new_tokens, prediction=False), chat_eval,
                               repeats=chat_repeats, warmup=warmup)
runs = pd.concat([g_runs.assign(family="input-grounded"), c_runs.assign(family="chat")], ignore_index=True)
runs["temperature"] = 0.0
if t1:
    t1_names = [f"n-gram K={k_ngram}", "suffix warm", "prediction + suffix"] + (
        [f"model draft K={model_spec['k']}"] if model_spec is not None else [])
    t1_runs = bench.run_interleaved(eval_runners(1.0, t1_names), grounded_eval, repeats=chat_repeats, warmup=warmup)
    runs = pd.concat([runs, t1_runs.assign(family="input-grounded", temperature=1.0)], ignore_index=True)
_ = ch.save(runs.drop(columns=["accepted_lengths", "drafted_lengths"], errors="ignore"), "runs")

# %% [markdown]
# ## Speed by family and by task
# Paired ratios against autoregressive decoding on the same prompt and repeat; α is the share of tested draft
# tokens the target accepted, τ the tokens a target pass yields.

# %%
ratios = pd.concat([bench.paired_ratios(g, AR, by=["family"]).assign(temperature=t)
                    for t, g in runs.groupby("temperature")], ignore_index=True)
per_task = pd.concat([bench.paired_ratios(g, AR, by=["family", "task"]).assign(temperature=t)
                      for t, g in runs.groupby("temperature")], ignore_index=True)
spec = runs[(runs.runner != AR) & runs.proposed.notna()]
alpha = bench.pooled_alpha(spec, by=["temperature", "family", "runner"])
tau = spec.groupby(["temperature", "family", "runner"]).tau.median()
ratios = ratios.join(alpha.rename("alpha"), on=["temperature", "family", "runner"]).join(
    tau.rename("tau"), on=["temperature", "family", "runner"])
ch.save(ratios, "speedup")
ch.save(per_task, "speedup_by_task")
book.show(ratios.set_index(["temperature", "family", "runner"]),
          "Speedup over autoregressive decoding (tokens/s ratio, median, IQR, n pairs), α and median τ, per family.",
          prefill=True)
g0 = per_task[per_task.temperature == 0.0]
fig = figures.speedup_by_task(g0.assign(temperature="greedy"), hue="runner")
fig.set_axis_labels("task", "speedup over autoregressive (median of pairs)")
ch.savefig(fig, "speedup_by_task")
book.show(g0.pivot_table(index="runner", columns="task", values="median"),
          "Greedy speedup per task (median of paired ratios).", prefill=True)

# %% [markdown]
# ## Exact, call by call
# Every greedy call of a speculative runner against the autoregressive call on the same prompt: the tokens must be
# the same. With the library's CPU kernel (row-invariant logits, chapter 1) they are the same bit for bit; on a path
# without that property a float32 near-tie can flip a token, and the count below would show it.

# %%
ident = grounded.greedy_identity(outputs, AR)
ch.save(ident, "greedy_identity")
book.show(ident.set_index("runner"), "Greedy calls whose tokens equal autoregressive decoding's on the same prompt.",
          prefill=False)
n_calls, n_diff = int(ident.calls.sum()), int(ident.differ.sum())
print(f"greedy identity: {n_calls - n_diff} of {n_calls} speculative calls equal autoregressive decoding"
      + (f"; {n_diff} differ: " + ", ".join(f"{r.runner} {r.differ}" for r in ident[ident.differ > 0].itertuples())
         if n_diff else ""))

# %% [markdown]
# ## How long the drafts are, and what drafting costs
# The suffix drafter's length follows the match (up to `max_spec_factor` × its length, capped by K); the n-gram
# drafter's is K whenever it finds a match; the prediction drafts as far as the passage goes. The figure shows the
# distribution of tokens drafted per step on the input-grounded prompts (greedy). The draft phase's share of the
# decode loop is the price of proposing without a model.

# %%
steps = grounded.lengths(runs[(runs.temperature == 0.0) & (runs.family == "input-grounded")
                              & runs.runner.isin([f"n-gram K={k_ngram}", "suffix cold", "suffix warm",
                                                  "prediction", "prediction + suffix"])])
fig, ax = plt.subplots(figsize=(8, 4))
sns.histplot(data=steps, x="length", hue="runner", element="step", stat="probability", common_norm=False,
             discrete=True, ax=ax)
ax.set(xlabel="tokens drafted in a step", ylabel="share of steps", title="draft length per step, input-grounded")
ch.savefig(fig, "draft_lengths")
free = [n for n in ratios.runner.unique() if not n.startswith(("model", "hf"))]
share = pd.DataFrame({t: grounded.share_of(runs[(runs.temperature == t) & runs.runner.isin(free)], "draft_s")
                      for t in sorted(runs.temperature.unique())})
share.columns = [f"draft share, T = {t:g}" for t in share.columns]
ch.save(share.reset_index(), "draft_share")
book.show(share, f"The draft phase's share of the decode loop (median over calls), model-free drafters, K ≤ {suffix_k}.",
          prefill=False)

# %% [markdown]
# ## The per-request rule on the evaluation prompts
# The calls the rule fixed above would have made: on each request, the chosen runner's call.

# %%
g_all = runs[runs.temperature == 0.0]
chooser = grounded.chosen_calls(g_all[g_all["class"].isin(rule)], rule)
ch_r = bench.paired_ratios(pd.concat([g_all, chooser]), AR, by=["family"])
ch_r = ch_r[ch_r.runner == "chooser"]
ch.save(pd.DataFrame([rule]), "rule")
display(Markdown("The rule on the evaluation prompts: " + "; ".join(
                     f"{r.family} {report.ratio_phrase_median(r['median'], r.q25, r.q75, n=int(r.n))}"
                     for _, r in ch_r.iterrows()) + "."))

# %% [markdown]
# ## A traffic mix
# A benchmark made only of predictable completions overstates what a mixed product gains. The speedup of a mix in
# which a share s of the requests is input-grounded and the rest chat, drawn by `sd.prompts.traffic_mix` (the same
# requests for every runner, `mix_seeds` draws per share): the autoregressive decoder's summed time over the mix ÷
# the runner's, in each repeat of the greedy run.

# %%
chat_ids = [m["id"] for m, _ in chat_eval]
g_ids = [m["id"] for m, _ in grounded_eval]
both = g_all[g_all.runner.isin(c_runs.runner.unique())]
both = both[both.repeat < min(repeats, chat_repeats)]
mix = grounded.mix_speedup(pd.concat([both, chooser[chooser.repeat < min(repeats, chat_repeats)]]), AR, chat_ids,
                           g_ids, shares, seeds=mix_seeds)
ch.save(mix, "traffic_mix")
shown = mix[~mix.runner.str.startswith("hf")]
fig = figures.median_iqr(shown, "runner", x="share", dodge=0.006, baseline=1.0, figsize=(8, 4.5),
                         legend_fontsize=8, xlabel="input-grounded share of the requests",
                         ylabel="mix throughput ÷ autoregressive", title="speedup of a traffic mix (greedy)")
fig.axes[0].xaxis.set_major_locator(plt.MultipleLocator(0.25))
ch.savefig(fig, "traffic_mix")
book.show(mix.pivot_table(index="runner", columns="share", values="median"),
          "A traffic mix's throughput over autoregressive decoding's, by input-grounded share (median over draws and "
          "repeats).", prefill=True)

# %% [markdown]
# ## Beside the field
# Published speedups of drafters without a model on requests that repeat their input (fixed citations in
# `data/anchors_grounded.csv`, each with its setting and source), next to this run's greedy input-grounded speedup of
# the nearest method here. Those targets are 7–70 B models on GPUs, where a verify pass over many tokens costs about
# one pass and a 135 M target on 2 CPU cores does not (the setting line above); they also copy far more faithfully,
# so each drafted token is accepted more often.

# %%
field = pd.read_csv(anchors)
g_over = ratios[(ratios.temperature == 0.0) & (ratios.family == "input-grounded")].set_index("runner")
field["this run (greedy, input-grounded)"] = [
    f"{g_over.loc[n, 'median']:.2f}× ({g_over.loc[n, 'q25']:.2f}–{g_over.loc[n, 'q75']:.2f}, n = {int(g_over.loc[n, 'n'])})"
    if n in g_over.index else "not run" for n in field.nearest]
ch.save(field, "beside_the_field")
book.show(field.drop(columns=["url"]).set_index(["source", "published_method"]),
          "Published speedups over each source's own baseline beside this run's nearest method (median, IQR, n pairs). "
          "Sources: " + "; ".join(f"{a} <{u}>" for a, u in field[["source", "url"]].values) + ".", prefill=True, digits=2)

# %% [markdown]
# ## Summary
# The mechanisms: a draft pays when the verify pass it costs yields more tokens than it costs passes. A copying
# drafter's proposal is free to make, and on a request whose output repeats its input most of it is accepted, so
# long drafts pay despite a verify pass that costs more than one token's pass; on a chat turn the same drafter
# rarely finds a match and drafts nothing, so it should cost next to nothing there. A memory of earlier outputs adds
# what recurs across requests; a prediction adds the passage even where the output has not yet quoted it. What this
# run measured, computed from its tables:

# %%
def phrase(family, name, temp=0.0):
    r = ratios[(ratios.family == family) & (ratios.runner == name) & (ratios.temperature == temp)]
    if r.empty:
        return "not run"
    r = r.iloc[0]
    return report.ratio_phrase_median(r["median"], r.q25, r.q75, n=int(r.n)) + (
        f", α {r.alpha:.2f}" if r.alpha == r.alpha else "")


real = ratios[(ratios.temperature == 0.0) & (ratios.family == "input-grounded") & ~ratios.runner.str.startswith("hf")]
best = real.loc[real["median"].idxmax()]
lines = [f"- **Input-grounded, greedy**: best method {best.runner}, "
         + report.ratio_phrase_median(best["median"], best.q25, best.q75, n=int(best.n)) + "; "
         + "; ".join(f"{n}: {phrase('input-grounded', n)}" for n in real.runner if n != best.runner) + "."]
lines.append(f"- **Chat mix, greedy**: " + "; ".join(
    f"{n}: {phrase('chat', n)}" for n in ratios[(ratios.family == "chat")].runner) + ".")
edits = per_task[(per_task.temperature == 0.0) & (per_task.task == "edit") & (per_task.runner == "prediction")]
if len(edits):
    e = edits.iloc[0]
    lines.append("- **Predicted outputs on the edit tasks**: "
                 + report.ratio_phrase_median(e["median"], e.q25, e.q75, n=int(e.n)) + ".")
pl = per_task[(per_task.temperature == 0.0) & (per_task.family == "input-grounded")].pivot_table(
    index="task", columns="runner", values="median")
if "hf prompt lookup" in pl.columns:
    ours = g_all[(g_all.family == "input-grounded")]
    vs = bench.paired_ratios(ours[ours.runner.isin([best.runner, "hf prompt lookup"])], "hf prompt lookup",
                             by=["task"])
    overall_vs = bench.paired_ratios(ours[ours.runner.isin([best.runner, "hf prompt lookup"])], "hf prompt lookup")
    o = overall_vs.iloc[0]
    lines.append(f"- **Against transformers' prompt lookup (defaults)**: {best.runner} over it "
                 + report.ratio_phrase_median(o["median"], o.q25, o.q75, n=int(o.n)) + "; per task "
                 + ", ".join(f"{r.task} {r['median']:.2f}×" for _, r in vs.iterrows()) + ".")
if t1:
    lines.append("- **Input-grounded, T = 1**: " + "; ".join(
        f"{n}: {phrase('input-grounded', n, 1.0)}" for n in ratios[ratios.temperature == 1.0].runner) + ".")
sw, sc, ng = (ratios[(ratios.family == "chat") & (ratios.runner == n)] for n in
              ("suffix warm", "suffix cold", f"n-gram K={k_ngram}"))
if len(sw) and len(ng):
    lines.append(f"- **Where there is nothing to copy (chat)**: the warm suffix drafter {sw.iloc[0]['median']:.2f}× "
                 f"against the n-gram drafter's {ng.iloc[0]['median']:.2f}× at K = {k_ngram} (medians).")
lines.append(f"- **Exact**: {n_calls - n_diff} of {n_calls} greedy speculative calls return autoregressive "
             "decoding's tokens" + (f"; {n_diff} differ (see the identity table)." if n_diff else "."))
worst = share.max()
lines.append("- **Draft phase**: at most " + ", ".join(f"{v:.1%} ({c.split(', ')[1]}, {share[c].idxmax()})"
                                                        for c, v in worst.items()) + " of the decode loop.")
m_lo, m_hi = mix[mix.share == min(shares)], mix[mix.share == max(shares)]
for name in [best.runner, "chooser"]:
    a, b = m_lo[m_lo.runner == name], m_hi[m_hi.runner == name]
    if len(a) and len(b):
        lines.append(f"- **Traffic mix, {name}**: {a.iloc[0]['median']:.2f}× at share {min(shares):g}, "
                     f"{b.iloc[0]['median']:.2f}× at share {max(shares):g}.")
losing = ratios[(ratios.runner != AR) & (ratios.q75 < 1)]
lines.append(f"- **Losses**: {len(losing)} (runner, family, temperature) rows with the whole IQR below 1"
             + (": " + ", ".join(f"{r.runner} ({r.family}, T = {r.temperature:g})" for r in losing.itertuples())
                if len(losing) else "") + ".")
lines.append("- **Not run here**: SuffixDecoding's own implementation (ArcticInference) as a peer drafter; its "
             "package builds CUDA extensions and a vLLM plugin, and the chapter does not install it.")
lines += [ch.skipped_summary()] if ch.skipped else []
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Exercises
# 1. Set `prediction_tasks = []`: how much of the edit tasks' gain was the prediction's, how much the suffix
#    drafter's?
# 2. Set `memory_per_task = 0` (a cold memory only): which task loses most, and why that one?
# 3. Raise `suffix_k` to 64: does a longer cap pay on this machine's verify cost (the setting line), or does the
#    verify pass over 65 tokens eat the gain?
