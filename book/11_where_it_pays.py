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
# **The question.** Chapters 3–10 measured speculation on chat-like requests, where the answer is new text. Many
# real requests are different: their output repeats their input. Does speculation pay more there, and which
# drafter should a server use for which request?
#
# **The answer.** A drafter that copies from the request proposes long runs of tokens at almost no cost. Where the
# output repeats the input, the target accepts much of each run, so one verify pass commits many tokens. On a chat
# turn the same drafter finds little to copy and drafts little. This chapter measures both kinds of request on the
# same target, in one run. This run's numbers are in the two speed tables below and in the summary at the end.
#
# Every method here is the step of [chapter 0](00_quickstart.ipynb) with a different drafter: only how much of each
# verify pass is accepted changes.

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

# %% tags=["hide-input"]
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
sns.set_palette("colorblind")  # after setup, whose theme resets the palette
print(str(ch).replace("; device", "\ndevice"))
display(Markdown(f"*Prompts of each kind. {len(predictions)} input-grounded requests carry a prediction (tasks "
                 f"{', '.join(prediction_tasks)}). Input-grounded evaluation tasks: "
                 f"{', '.join(sorted({p.task for p in g_eval}))}.*"))
display(pd.DataFrame({"evaluation": [len(grounded_eval), len(chat_eval)],
                      "training (choices)": [len(grounded_train), len(chat_train_prompts)],
                      "training (memory)": [len(g_memory), 0]}, index=["input-grounded", "chat"]))

# %% [markdown]
# ## The requests and the drafters
# An input-grounded request carries the text its answer is built from. Four tasks stand for them: a paragraph to
# correct (edit), a passage to quote or summarise (quote), a document to extract into a fixed schema (extract),
# and an earlier answer to revise (revise). Their outputs repeat their inputs.
#
# The drafters compared:
#
# - **Our n-gram drafter** (chapter 3): where the last tokens occurred before in the context, it copies what
#   followed, up to K tokens (the draft length; [notation](notation.md)).
# - **Transformers' prompt lookup** at its defaults (10 tokens, n-gram size 2): the peer a reader already knows.
# - **The suffix drafter** (`sd.SuffixDrafter`, after SuffixDecoding, arXiv 2411.04975). It keeps suffix tries
#   over the request and over earlier requests' outputs. Its draft grows with the length of the match.
#   *Cold*, it remembers no earlier request. *Warm*, it holds a memory of training requests' outputs, then frozen.
#   It runs as a chain and as a token tree.
# - **Predicted outputs** (`sd.generate(..., prediction=ids)`, as in OpenAI's Predicted Outputs). The passage the
#   request is built on is the draft, resumed after each divergence. It runs alone and with the warm suffix
#   drafter behind it.
# - **The model draft** at its stored K: the method that needs nothing to copy.
#
# Every one of them keeps the target's distribution. A deterministic draft's law is one-hot on its tokens, and
# verification keeps the target's law whatever was drafted (chapter 2).
#
# ## One request, watched
# An edit request from the training prompts, decoded greedily with the n-gram drafter and with its prediction.
# These calls are the whole use of the library.

# %%
meta, ids = grounded_train[0]
copied = sd.generate(target, ids, drafter=pair.drafters["ngram"], method="linear", k=ngram_ks[-1],
                     max_new_tokens=max_new_tokens)
pred = predictions.get(tuple(ids.tolist()))
predicted = None if pred is None else sd.generate(target, ids, method="linear", k=suffix_k, prediction=pred,
                                                    max_new_tokens=max_new_tokens)

# %% tags=["hide-input"]
watched = {f"n-gram drafter, K = {ngram_ks[-1]}": copied, f"prediction, K ≤ {suffix_k}": predicted}
display(Markdown(f"*One {meta['task']} request ({meta['id']}), greedy. Autoregressive decoding needs one target pass "
                 "per token; each speculative step is one target pass.*"))
display(pd.DataFrame([{"drafter": name, "target passes": r.stats.target_passes, "tokens": len(r.tokens),
                         "drafted": sum(r.stats.drafted), "accepted": sum(r.stats.accepted_lengths),
                         "accepted per step": " ".join(map(str, r.stats.accepted_lengths))}
                      for name, r in watched.items() if r is not None]).set_index("drafter"))

# %% [markdown]
# ## How the settings are fixed
# The n-gram drafter's K, the suffix drafter's setting and a per-request rule are all fixed on *training* prompts.
# No evaluation prompt shares their passages. Then every runner decodes the evaluation prompts, interleaved, after
# a warm-up. "Going deeper" shows the training tables.

# %% tags=["hide-input"]
costs = bench.pass_costs(target, None, bench.median_length(grounded_eval), ks=(4, 8, 16, 24, 32), repeats=7,
                         decoded=max_new_tokens // 2)


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
display(Markdown(f"Chosen on training prompts: the n-gram drafter at **K = {k_ngram}**, and the suffix drafter's "
                 f"**{setting}** setting."))

# %% [markdown]
# The warm suffix drafter first decodes `memory_per_task` more training prompts of each task, and keeps their
# outputs. Then its memory is frozen, so it never learns the answers it is timed on.

# %%
warm = sd.SuffixDrafter(**suffix_settings[setting], max_cached_requests=max(1, len(g_memory)))
held = grounded.build_memory(target, warm, [sd.prompts.encode(pair, p) for p in g_memory], max_new_tokens, suffix_k)
print(f"warm memory: {held} outputs of training requests ({sum(len(o) for o in warm.cached)} tokens), frozen")

# %% tags=["hide-input"]
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
# A server knows two things about a request before it decodes it: whether it carries a prediction, and whether it
# is input-grounded or a chat turn. The per-request rule picks, for each of these classes, the runner with the
# highest median on that class's *training* prompts. If none beats autoregressive decoding there, it picks that.

# %% tags=["hide-input"]
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
CLASS = {"prediction": "requests with a prediction", "grounded": "other input-grounded requests", "chat": "chat"}
display(Markdown("The rule fixed on training prompts: " + "; ".join(f"{CLASS[c]} → **{r}**" for c, r in rule.items())
                 + "."))

# %% tags=["hide-input"]
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
# ## Speed on each kind of request
# Each speedup is a tokens/s ratio over autoregressive decoding on the same prompt and repeat. The tables also give
# the acceptance rate α, the fraction of tested draft tokens the target kept. τ is the number of tokens one target
# pass yields. The IQR is the interquartile range, the middle half of the paired ratios; the verdict column reads a paired test.
# All three are defined in the [notation](notation.md). The setting line says what a long verify pass costs on this
# machine.

# %% tags=["hide-input"]
display(ch.setting(16, costs["verify_ratio"][16]))
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


def said(r, word: str = "") -> str:
    """One plain finding: the median ratio, and the verdict its table gave it where the test gave one (the table's
    footnote says, once, why a row has none)."""
    word = "" if word.startswith(("cannot", report.NO_VERDICT)) else word
    return f"{r['median']:.2f}× autoregressive decoding's speed" + (f" ({word})" if word else "")


def family_table(rows, caption: str) -> pd.Series:
    """Speed rows as a verdict table (median, IQR, n, verdict, α, τ), highest median first: shown under
    ``caption``, computed first so the sentence above it quotes its verdicts (runner → verdict)."""
    rows = rows.sort_values("median", ascending=False)
    table, note = report.verdict_table([{"runner": r.runner, "median": r["median"], "q25": r.q25, "q75": r.q75,
                                         "n": r.n, **report.test_of(r),
                                         "α": "—" if r.alpha != r.alpha else f"{r.alpha:.2f}",
                                         "τ": "—" if r.tau != r.tau else f"{r.tau:.2f}"} for _, r in rows.iterrows()])
    return table.set_index("runner"), caption + note


g0 = ratios[ratios.temperature == 0.0]
family_verdict = {}  # (family, runner) -> the verdict of the family's table: sentences quote it
for fam, what in (("input-grounded", "Input-grounded requests"), ("chat", "Chat requests")):
    rows = g0[g0.family == fam]
    top = rows.loc[rows["median"].idxmax()]
    table, caption = family_table(rows, f"{what}, greedy: speedup over autoregressive decoding.")
    family_verdict |= {(fam, r): v for r, v in table.verdict.items()}
    display(Markdown(f"{what}, greedy: the highest median is {top.runner}'s, "
                     f"{said(top, family_verdict[(fam, top.runner)])}."))
    book.show(table[[c for c in table if c not in ("α", "τ")] + ["α", "τ"]], caption, prefill=True, digits=None)

# %% tags=["hide-input"]
g0_task = per_task[(per_task.temperature == 0.0) & (per_task.family == "input-grounded")]
groups = {"drafters that copy": ["hf prompt lookup", f"n-gram K={k_ngram}", "suffix cold", "suffix warm",
                                 "suffix warm tree"],
          "a prediction, or a draft model": ["prediction", "prediction + suffix"]
          + ([f"model draft K={model_spec['k']}"] if model_spec is not None else [])}
fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), sharey=True)
for ax, (title, names) in zip(axes, groups.items()):
    sns.barplot(data=g0_task[g0_task.runner.isin(names)], x="task", y="median", hue="runner", hue_order=names,
                palette="colorblind", ax=ax)
    ax.axhline(1.0, color="k", lw=1)
    ax.set(title=title, xlabel="input-grounded task", ylabel="speedup over autoregressive (median, paired)")
    ax.legend(fontsize=8)
fig.suptitle("Greedy speedup per input-grounded task: bars above 1 decode more tokens per second than "
             "autoregressive decoding")
fig.tight_layout()
ch.savefig(fig, "speedup_by_task")

# %% [markdown]
# ## Exact, call by call
# Every greedy call of a speculative runner must return the autoregressive call's tokens on the same prompt. With
# the library's CPU kernel (row-invariant logits, chapter 1) they are the same bit for bit. On a path without that
# property, a float32 near-tie can flip a token, and the count below would show it.

# %% tags=["hide-input"]
ident = grounded.greedy_identity(outputs, AR)
ch.save(ident, "greedy_identity")
n_calls, n_diff = int(ident.calls.sum()), int(ident.differ.sum())
print(f"greedy identity: {n_calls - n_diff} of {n_calls} speculative calls equal autoregressive decoding"
      + (f"; {n_diff} differ: " + ", ".join(f"{r.runner} {r.differ}" for r in ident[ident.differ > 0].itertuples())
         if n_diff else ""))
book.show(ident.set_index("runner"), "Greedy calls whose tokens equal autoregressive decoding's on the same prompt.",
          prefill=False)

# %% [markdown]
# ## One method per request, and a traffic mix
# The rule fixed on training prompts makes one call per request: the chosen runner's call, read from the
# evaluation run. A benchmark made only of predictable completions overstates what a mixed product gains. So the
# figure draws the speedup of a mix in which a share s of the requests is input-grounded and the rest chat.

# %% tags=["hide-input"]
g_all = runs[runs.temperature == 0.0]
chooser = grounded.chosen_calls(g_all[g_all["class"].isin(rule)], rule)
ch_r = bench.paired_ratios(pd.concat([g_all, chooser]), AR, by=["family"])
ch_r = ch_r[ch_r.runner == "chooser"]
ch.save(pd.DataFrame([rule]), "rule")
ch.save(ch_r, "rule_eval")  # the rule fixed on training prompts, evaluated once: the headline reports it
table, note = report.verdict_table([{"family": r.family, "median": r["median"], "q25": r.q25, "q75": r.q75, "n": r.n,
                                     **report.test_of(r)} for _, r in ch_r.iterrows()])
rule_verdict = table.set_index("family").verdict
display(Markdown(" ".join(f"On {r.family} requests the rule's calls ran at {said(r, rule_verdict[r.family])}."
                          for _, r in ch_r.iterrows())))
book.show(table.set_index("family"), "The per-request rule on the evaluation prompts: speedup over autoregressive "
          "decoding, greedy." + note, prefill=True, digits=None)

chat_ids = [m["id"] for m, _ in chat_eval]
g_ids = [m["id"] for m, _ in grounded_eval]
both = g_all[g_all.runner.isin(c_runs.runner.unique())]
both = both[both.repeat < min(repeats, chat_repeats)]
mix = grounded.mix_speedup(pd.concat([both, chooser[chooser.repeat < min(repeats, chat_repeats)]]), AR, chat_ids,
                           g_ids, shares, seeds=mix_seeds)
ch.save(mix, "traffic_mix")
real = ratios[(ratios.temperature == 0.0) & (ratios.family == "input-grounded") & ~ratios.runner.str.startswith("hf")]
best = real.loc[real["median"].idxmax()]
m_lo, m_hi = mix[mix.share == min(shares)], mix[mix.share == max(shares)]
shown = mix[~mix.runner.str.startswith("hf")]
top_mix = shown[shown.share == max(shares)].set_index("runner")["median"].idxmax()  # highest at the largest share
lo, hi = (m[m.runner == top_mix]["median"] for m in (m_lo, m_hi))
fig = figures.median_iqr(shown, "runner", x="share", dodge=0.006, baseline=1.0, figsize=(8, 4.5),
                         legend_fontsize=8, xlabel="input-grounded share s of the requests",
                         ylabel="mix throughput ÷ autoregressive",
                         title=f"{top_mix}: {lo.iloc[0]:.2f}× at input-grounded share {min(shares):g}, "
                               f"{hi.iloc[0]:.2f}× at share {max(shares):g} (greedy medians)")
fig.axes[0].xaxis.set_major_locator(plt.MultipleLocator(0.25))
ch.savefig(fig, "traffic_mix")
display(Markdown("\n".join(
    f"- With {'the per-request rule' if name == 'chooser' else name}, a mix ran at {a.iloc[0]['median']:.2f}× at share {min(shares):g} and "
    f"{b.iloc[0]['median']:.2f}× at share {max(shares):g} (medians)." for name in dict.fromkeys([best.runner, top_mix, "chooser"])
    for a, b in [(m_lo[m_lo.runner == name], m_hi[m_hi.runner == name])] if len(a) and len(b))))

# %% [markdown]
# ## Going deeper
#
# ### The protocol
# It is chapter 6's (`specdec_core.study.bench`). Every runner decodes the same prompts, interleaved, after a
# warm-up. Ratios are paired against our autoregressive decoder. A mix's speedup is its throughput ratio (summed
# times), computed from the same calls as the tables.
#
# ### What a long verify pass costs here
# A copying drafter proposes long chains, so it pays for a verify pass over up to K + 1 tokens. Below is that pass's
# cost in one-token passes, timed side by side at the median grounded prompt's context. Chapter 1 explains why it is
# not 1 on a CPU, and which kernel path the library runs here.

# %% tags=["hide-input"]
display(Markdown("*A target pass over K + 1 tokens ÷ a pass over one token, at the median input-grounded context.*"))
display(pd.DataFrame({"K": list(costs["verify_ratio"]), "verify pass ÷ one-token pass":
                      [f"{v:.2f}" for v in costs["verify_ratio"].values()]}).set_index("K"))

# %% [markdown]
# ### The training sweep
# Every candidate decodes the input-grounded training prompts, greedy. They are the n-gram drafter at each K of
# `ngram_ks`, and the suffix drafter cold (no memory across requests) in each setting of `suffix_settings`. The
# highest median fixes the n-gram's K and the suffix drafter's setting for everything after. A choice is settled
# only where no rival's IQR reaches the chosen one's.

# %% tags=["hide-input"]
def resolved(prefix, chosen):
    """Whether the choice among the ``prefix`` runners is resolved on these prompts (no rival's IQR reaches it)."""
    rows = tr_r[tr_r.runner.str.startswith(prefix)].set_index("runner")
    close = [r.split("|")[1] for r in report.rivals(rows, f"{prefix}{chosen}")]
    n = int(rows.loc[f"{prefix}{chosen}", "n"])
    return (report.unresolved(n) if n < report.MIN_PAIRS else
            f"not resolved on these prompts ({', '.join(close)} reach its IQR)" if close else "resolved on these prompts")


book.show(tr_r.set_index("runner"), f"Greedy speedup over autoregressive decoding on {len(grounded_train)} "
          "input-grounded training prompts (median, IQR, n prompts): the candidates K and settings are chosen from.",
          prefill=True)
status = {f"The n-gram drafter's K = {k_ngram}": resolved("n-gram|", k_ngram),
          f"The suffix drafter's {setting} setting": resolved("suffix cold|", setting)}
display(Markdown(f"The {setting} setting is "
                 f"{suffix_settings[setting] or 'max_tree_depth 24, max_spec_factor 1, min_token_prob 0.1'}.\n\n"
                 + (f"Both choices: {next(iter(status.values()))}." if len(set(status.values())) == 1 else
                    "\n".join(f"- {what}: {said_}." for what, said_ in status.items()))))

# %% [markdown]
# ### The memory and the runners
# The memory's outputs are the target's own greedy answers, since greedy speculation equals autoregressive
# decoding. Frozen (`learn = False`), it learns nothing from the warm-up or the interleaved repeats. What it can
# carry over is what recurs across requests: the extraction schema's keys and punctuation, an edit's phrasing.
#
# The suffix drafter drafts up to `max_spec_factor` × the match length, capped by K. Its tree is best-first by path
# probability, at most the default tree's size at depth K. A request without a prediction decodes
# autoregressively under "prediction", and with the warm suffix drafter alone under "prediction + suffix".
#
# ### Temperature 1, and task by task
# At temperature 1 a subset of the runners decodes the grounded prompts again. The per-task table gives each
# runner's greedy median on each task.

# %% tags=["hide-input"]
if t1:
    family_table(ratios[ratios.temperature == 1.0], "Input-grounded requests, temperature 1: speedup over "
                 "autoregressive decoding.")
book.show(per_task[per_task.temperature == 0.0].pivot_table(index="runner", columns="task", values="median"),
          "Greedy speedup per task (median of paired ratios).", prefill=True, digits=2)

# %% [markdown]
# ### How long the drafts are, and what drafting costs
# The suffix drafter's length follows the match. The n-gram drafter drafts K whenever it finds a match. The
# prediction drafts as far as the passage goes. The draft phase's share of the decode loop is the price of
# proposing without a model.

# %% tags=["hide-input"]
steps = grounded.lengths(runs[(runs.temperature == 0.0) & (runs.family == "input-grounded")
                              & runs.runner.isin([f"n-gram K={k_ngram}", "suffix cold", "suffix warm",
                                                  "prediction", "prediction + suffix"])])
fig, ax = plt.subplots(figsize=(8, 4))
sns.histplot(data=steps, x="length", hue="runner", element="step", stat="probability", common_norm=False,
             discrete=True, ax=ax)
ax.set(xlabel="tokens drafted in a step", ylabel="share of steps",
       title="Tokens drafted per step: none where a copying drafter finds no match (input-grounded, greedy)")
ch.savefig(fig, "draft_lengths")
free = [n for n in ratios.runner.unique() if not n.startswith(("model", "hf"))]
share = pd.DataFrame({t: grounded.share_of(runs[(runs.temperature == t) & runs.runner.isin(free)], "draft_s")
                      for t in sorted(runs.temperature.unique())})
share.columns = [f"draft share, T = {t:g}" for t in share.columns]
ch.save(share.reset_index(), "draft_share")
book.show(share, f"The draft phase's share of the decode loop (median over calls), model-free drafters, K ≤ {suffix_k}.",
          prefill=False)
worst = share.max()
display(Markdown("The draft phase's largest share of the decode loop: " + "; ".join(
    f"{v:.1%} at {c.split(', ')[1]} ({share[c].idxmax()})" for c, v in worst.items()) + "."))

# %% [markdown]
# ### More findings
# Predicted outputs on the edit task alone, and the best method here against transformers' prompt lookup on the
# same calls. Then the chat requests, where there is little to copy, and the rows the test finds slower.

# %% tags=["hide-input"]
found = []
edits = per_task[(per_task.temperature == 0.0) & (per_task.task == "edit") & (per_task.runner == "prediction")]
if len(edits):
    e = edits.iloc[0]
    found.append({"finding": "prediction, edit task", "median": e["median"], "q25": e.q25, "q75": e.q75, "n": e.n,
                  **report.test_of(e)})
pl = per_task[(per_task.temperature == 0.0) & (per_task.family == "input-grounded")].pivot_table(
    index="task", columns="runner", values="median")
if "hf prompt lookup" in pl.columns:
    ours = g_all[(g_all.family == "input-grounded")]
    vs = bench.paired_ratios(ours[ours.runner.isin([best.runner, "hf prompt lookup"])], "hf prompt lookup",
                             by=["task"])
    overall_vs = bench.paired_ratios(ours[ours.runner.isin([best.runner, "hf prompt lookup"])], "hf prompt lookup")
    o = overall_vs.iloc[0]
    found.append({"finding": f"{best.runner} ÷ hf prompt lookup (best of {len(real)} on these prompts)",
                  "median": o["median"], "q25": o.q25, "q75": o.q75, "n": o.n, **report.test_of(o),
                  "selected_from": len(real)})
table, note = report.verdict_table(found)
book.show(table.set_index("finding"), "Greedy, input-grounded: paired speed ratios (the first over autoregressive "
          "decoding, the second over transformers' prompt lookup)." + note, prefill=True, digits=None)
lines = []
if "hf prompt lookup" in pl.columns:
    lines.append(f"- {best.runner} over prompt lookup, per task: "
                 + ", ".join(f"{r.task} {r['median']:.2f}×" for _, r in vs.iterrows()) + ".")
sw, ng = (ratios[(ratios.family == "chat") & (ratios.runner == n)] for n in ("suffix warm", f"n-gram K={k_ngram}"))
if len(sw) and len(ng):
    lines.append(f"- Chat, where there is little to copy: the warm suffix drafter {sw.iloc[0]['median']:.2f}×, "
                 f"the n-gram drafter {ng.iloc[0]['median']:.2f}× at K = {k_ngram} (medians).")
every_row, _ = report.verdict_table([{"runner": r.runner, "family": r.family, "temperature": r.temperature,
                                      "median": r["median"], "q25": r.q25, "q75": r.q75, "n": r.n,
                                      **report.test_of(r)} for _, r in ratios[ratios.runner != AR].iterrows()])
losing = every_row[every_row.verdict == "slower"]
lines.append(f"- Rows the test finds slower than autoregressive decoding, Holm over all {len(every_row)} speed rows of "
             f"the chapter: {len(losing)}"
             + (" (" + ", ".join(f"{r.runner}, {r.family}, T = {r.temperature:g}" for r in losing.itertuples()) + ")"
                if len(losing) else "") + ".")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ### Beside the field
# Published speedups of drafters without a model on requests that repeat their input sit next to this run's
# nearest method (fixed citations in `data/anchors_grounded.csv`). Those targets are 7–70 B models on GPUs. There,
# a verify pass over many tokens costs about one pass, and a 135 M target on 2 CPU cores does not (the setting
# line). They also copy far more faithfully, so each drafted token is accepted more often. SuffixDecoding's own
# implementation (ArcticInference) is not run here as a peer drafter. Its package builds CUDA extensions and a
# vLLM plugin, and the chapter does not install it.

# %% tags=["hide-input"]
field = pd.read_csv(anchors)
g_over = ratios[(ratios.temperature == 0.0) & (ratios.family == "input-grounded")].set_index("runner")
field["this run (greedy, input-grounded)"] = [
    f"{g_over.loc[n, 'median']:.2f}× ({g_over.loc[n, 'q25']:.2f}–{g_over.loc[n, 'q75']:.2f}, n = {int(g_over.loc[n, 'n'])})"
    if n in g_over.index else "not run" for n in field.nearest]
ch.save(field, "beside_the_field")
book.show(field.drop(columns=["url"]).set_index(["source", "published_method"]),
          "Published speedups over each source's own baseline beside this run's nearest method (median, IQR, n prompts). "
          "Sources: " + "; ".join(f"{a} <{u}>" for a, u in field[["source", "url"]].values) + ".", prefill=True, digits=2)

# %% [markdown]
# ## Summary
# - A draft pays when its verify pass yields more tokens than it costs passes.
# - A copying drafter's proposal is free to make. Where the output repeats the input, most of it is accepted, so
#   long drafts pay despite a verify pass that costs more than one token's pass.
# - On a chat turn the same drafter rarely finds a match, so it drafts little and should cost little.

# %% tags=["hide-input"]
c0 = g0[g0.family == "chat"]
top_c = c0.loc[c0["median"].idxmax()]
lines = [f"- Input-grounded requests had their highest median with {best.runner}: "
         f"{said(best, family_verdict[('input-grounded', best.runner)])}.",
         f"- Chat requests had theirs with {top_c.runner}: {said(top_c, family_verdict[('chat', top_c.runner)])}.",
         "- The per-request rule chose " + "; ".join(f"{r} for {CLASS[c]}" for c, r in rule.items()) + ".",
         f"- {n_calls - n_diff} of {n_calls} greedy speculative calls returned autoregressive decoding's tokens."]
lines += [ch.skipped_summary()] if ch.skipped else []
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Exercises
# 1. Set `prediction_tasks = []`: how much of the edit tasks' gain was the prediction's, how much the suffix
#    drafter's?
# 2. Set `memory_per_task = 0` (a cold memory only): which task loses most, and why that one?
# 3. Raise `suffix_k` to 64: does a longer cap pay on this machine's verify cost (the setting line), or does the
#    verify pass over 65 tokens eat the gain?
