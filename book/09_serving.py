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
# # 9 · Serving: batches, load, and what a streaming reader sees
#
# **The question.** A server decodes many requests at once, and they arrive whenever users send them. Does
# speculative decoding still pay there, and at which batch size or load does it stop?
#
# **The answer.** Batching and speculation live off the same spare capacity of a pass. A batch turns one pass into
# one token for each of its rows. Speculation turns one pass into several tokens of one row. In a batch the two
# compete: once the verify pass over all rows' drafts stops being nearly free, the drafts cost more than they save.
# Where that happens is a property of the machine and the model pair. This chapter measures it and predicts it from
# pass costs alone. Then it serves arriving requests with a policy that picks each row's draft length from the
# load. In the reference run on the book's 2-core CPU, speculation's gain shrinks as the batch grows, as the pass
# costs predict. Under arriving traffic there, the load-adaptive policy served more requests within their latency
# targets than autoregressive decoding once the load was moderate. This run's numbers are in the tables under each finding and in the summary at the end.
#
# Each row of a batch runs the step pictured in [chapter 0](00_quickstart.ipynb): draft, verify in one pass, accept.

# %% tags=["parameters"]
model = "smollm2-135m"         # embedded name, Hugging Face id, or local path
draft = None                   # optional draft id/path (default: the shipped draft)
device = "cpu"                 # "cpu", "cuda" or "auto"
dtype = "float32"              # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
per_task = 2                   # evaluation prompts per task; a batch of B takes B of them, cycling
batch_sizes = [1, 2, 4, 8, 16, 32]
max_new_tokens = 48            # per row
batches = 3                    # distinct batches at each B, from one prompt pool: the units of every batch ratio
repeats = 1                    # interleaved rounds over the same batches (timing noise, not new units)
k_ngram = 4                    # prompt lookup's K (chapter 6's setting, fixed before any measurement)
k_model = 3                    # the model draft's K (its model card's sweep on held-out training prompts)
pass_repeats = 5               # rounds timing the single-sequence passes t(T) of the cost model
stream_prompts = 3             # prompts decoded one at a time for the streaming section
check_batch = 8                # the batch size whose autoregressive speed is set against B 1 and its requests one by one
trend_p = 0.05                 # the rank correlation's p-value under which speculation's ratio has a direction in B
engine_requests = 48           # distinct evaluation requests the engine serves at each load: the units of its verdicts
engine_per_task = 6            # evaluation prompts per task in the engine's pools (chat and input-grounded)
engine_train_requests = 24     # distinct training requests, a training traffic mix, that the engine's constants are
                               # chosen on (never the evaluation requests)
engine_tune_loads = [0.6, 1.2]  # the loads the constants are chosen at, on the training mix
engine_decays = [0.5, 0.7, 0.9]  # candidates for StepCost.DECAY, the weight of a row's earlier drafting steps
engine_floors = [0, 1]         # candidates for StepCost.HELD_FLOOR, the draft tokens a held proposal always verifies
engine_priors = [1, 4]         # candidates for StepCost.PRIOR_TESTS, the pseudo-tests an octave's rates shrink with
engine_share = 0.5             # their input-grounded share (0: the chat mix alone)
engine_loads = [0.15, 0.6, 1.2]  # arrival rates as fractions of autoregressive decoding's saturation throughput
engine_per_class = True        # serve the "per class" policy too (suffix on grounded requests, prompt lookup on chat)
engine_max_batch = 8           # the engine's rows (vLLM's max_num_seqs)
engine_max_new_tokens = 96     # per request
engine_repeats = 1             # rounds of the load sweep (each draws new schedules, replayed for every policy):
                               # replays are not new requests; every interval resamples distinct requests
k_suffix = 32                  # the cap on a suffix step's length (chapter 11's)
slo_ttft = 4.0                 # goodput's SLOs, as multiples of autoregressive decoding's median at the lowest load
slo_tpot = 1.5
out_dir = "../build/book/09_serving"
params_name = None  # the parameter file's name, injected by scripts/run_book.py (banner)

# %% tags=["hide-input"]
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import Markdown, display


import specdec_core as sd
from specdec_core.study import report
from specdec_core.tools import book
from specdec_core.study import exactness as ex
from specdec_core.study import profiling as pf
from specdec_core.study import serving as sv

display(book.banner(params_name))
ch = book.setup(out_dir, model, draft=draft, device=device, dtype=dtype, per_task=per_task, need=("model", "ngram"))
pair, out = ch.pair, ch.out
encoded = [ids for _, ids in ch.encoded]
sns.set_palette("colorblind")
print(textwrap.fill(str(ch), 120))


def cell(said: str) -> str:
    """A verdict already put through the rule (``report.judged``) as a table cell: the word, or
    ``report.NO_VERDICT`` where the sample is too small (the table's footnote says so, once)."""
    return report.NO_VERDICT if said.startswith(report.UNRESOLVED) else said


def footnote(table: pd.DataFrame, columns=("verdict",), sample: str = "batches") -> str:
    """The caveat of a table, said once: only where a cell of its verdict columns is ``report.NO_VERDICT``."""
    if not (table[list(columns)] == report.NO_VERDICT).any().any():
        return ""
    return (f" A verdict of {report.NO_VERDICT} is {report.UNRESOLVED}: fewer than {report.MIN_PAIRS} {sample} "
            "([the verdict rule](notation.md)).")


def caption(text: str) -> None:
    """A table's caption, for a table that times nothing (a speed table goes through ``book.show``)."""
    display(Markdown(f"*{text.strip()}*"))

# %% [markdown]
# ## One pass, many rows
# A server stacks the requests of many users into one *batch*. The batch size B (the number of requests decoded
# together; [notation](notation.md)) is the number of rows. One pass over the weights then serves every row.
#
# On most hardware a pass over a few tokens costs about as much as a pass over one. Write t(T) for the pass time:
# the time of one forward pass over T new tokens ([notation](notation.md)). It stays nearly flat up to a knee, which
# chapter 1 found. So a batch of B rows yields B tokens for about the price of one.
#
# Speculation spends the same spare room. A step drafts K tokens (the draft length K; [notation](notation.md)) and
# verifies K + 1 of them in one pass. A speculative step over B rows is therefore a pass over up to B·(K + 1) tokens.
# Once that pass is past the knee, the drafted tokens cost more than the accepted ones save. Somewhere in B,
# speculation stops paying, if it paid at B = 1.
#
# The methods are fixed before measuring. Autoregressive decoding is the baseline. Linear speculative decoding runs
# with prompt lookup (the n-gram drafter, no model) and with the shipped draft model, each at a K chosen earlier.
# Two more runners check the batch path itself; the section "Going deeper" reads them.

# %% tags=["hide-input"]
K = {"linear, n-gram": k_ngram, "linear, model draft": k_model}
counts = sorted({1, k_ngram + 1} | set(batch_sizes) | {B * (k + 1) for B in batch_sizes for k in K.values()})
context = int(np.median([ids.numel() for ids in encoded])) + max_new_tokens // 2
cost = sv.pass_cost_curve(pair.target, counts, context, repeats=pass_repeats, draft=pair.drafters["model"].model)
ch.save(cost, "pass_costs")
t_target = cost[cost.who == "target"].set_index("T")["seconds"]
display(ch.setting(k_ngram, float(t_target[k_ngram + 1] / t_target[1])))

# %% [markdown]
# The batches run on `sd.generate_batch` (`specdec_core/serving/`). It keeps one preallocated cache with a length
# per row, so rows that accept different numbers of tokens are never re-padded. A row leaves the batch as soon as
# it is done. Each method below is timed at every batch size, in interleaved rounds:

# %%
methods = {
    "autoregressive": dict(method="autoregressive"),
    "linear, n-gram": dict(method="linear", drafter=pair.drafters["ngram"], k=k_ngram),
    "linear, model draft": dict(method="linear", drafter=pair.drafters["model"], k=k_model),
    "generate (one sequence)": dict(method="autoregressive", single=True),  # the batch path's cost at B = 1
    # the same B = check_batch requests without a batch: generate on each in turn (a server without batching)
    "generate, one request at a time": dict(method="autoregressive", one_at_a_time=True, at=[check_batch]),
}
runs = sv.time_batches(pair.target, encoded, methods, batch_sizes, max_new_tokens, repeats=repeats, batches=batches,
                       progress=book.progress)

# %% [markdown]
# ### Every row is the autoregressive answer
# Speed means something only if every method decodes the same text. Each row's *accept* phase is the
# single-sequence one, with the row's own generator. So every row should be exactly the decode of its prompt alone.
# The tests check this bit for bit on float64 toy pairs. Here, in float32, each row is compared token by token with
# `sd.generate` on its prompt. A divergence is excused only at a near-tie: where the target's two best logits lie
# within `ex.NEAR_TIE`, batched arithmetic may round either way.

# %% tags=["hide-input"]
ch.save(runs.drop(columns="outputs"), "batch_runs")
used = sorted({j for r in runs.itertuples() for j in sv.batch_indices(len(encoded), r.B, r.batch)})
reference = {j: sd.generate(pair.target, encoded[j], max_new_tokens=max_new_tokens).tokens for j in used}
checked, ties, by_method = 0, [], {}
for r in runs.itertuples():
    by_method[r.method] = by_method.get(r.method, 0) + len(r.outputs)
    for i, (toks, j) in enumerate(zip(r.outputs, sv.batch_indices(len(encoded), r.B, r.batch))):
        pos, gap = ex.first_divergence(pair.target, encoded[j], toks, reference[j])
        assert ex.excused(pos, gap), f"{r.method}, B={r.B}, row {i}: diverges at token {pos} (top-2 gap {gap})"
        checked += 1
        if pos is not None:
            ties.append((r.method, r.B, i, pos, gap))
print(f"{checked} rows equal autoregressive decoding" + (f"; near-ties: {len(ties)}" if ties else ""))
for t in ties:
    print(f"  near-tie: {t[0]}, B = {t[1]}, row {t[2]}, token {t[3]}, top-2 gap {t[4]}")

# %% [markdown]
# ## Where speculation stops paying: measured and predicted
# *Measured*: the speedup of each speculative method over autoregressive decoding *at the same B*, paired by
# batch: the same B prompts under both. Each B has `batches` distinct batches from one pool of prompts, so B = 1
# is several prompts decoded alone, not one. Batches of one size share prompts with those of another. *Predicted*: from single-sequence pass costs alone, timed before the batches ran.
#
# Autoregressive decoding spends one pass over B tokens, t(B), for B tokens. A speculative step spends K draft
# passes over B tokens, t_d(B) (the draft model's pass time; [notation](notation.md); nothing for prompt lookup).
# It then spends one verify pass over B·f(B) tokens. Here f(B) is a row's mean *feed*: its last token plus the
# draft its drafter found, at most K + 1. The step yields τ(B) tokens per row (τ, the tokens per target pass;
# [notation](notation.md)). Both f(B) and τ(B) are read from the runs above:
#
# $$\text{speedup}(B) = \frac{\tau(B) \, t(B)}{K\, t_d(B) + t\big(B f(B)\big)}
#   = \frac{\tau(B)}{v(B) + d(B)}, \qquad v(B) = \frac{t\big(B f(B)\big)}{t(B)}, \quad d(B) = \frac{K\, t_d(B)}{t(B)}$$
#
# The second form counts a step's cost in autoregressive steps at the same B. The verify ratio v(B) is the verify
# pass's cost ([notation](notation.md)), and d(B) is the draft's share (0 for prompt lookup). While t(T) is flat,
# v(B) stays near 1 and speculation keeps its gain from B = 1. Once B·f(B) tokens are past the knee and B tokens
# are not, v(B) grows toward f(B) and the speedup falls. The *crossover* is the smallest B whose speedup falls
# below 1.

# %% tags=["hide-input"]
def paired(a: str, b: str, Ba: int, Bb: int, col: str = "tokens_per_s") -> pd.Series:
    """``col`` (tokens/s) of (a, Ba) ÷ (b, Bb), paired by batch and repeat, then one ratio per batch (the median
    over its repeats): the units are distinct batches."""
    x = runs[(runs.method == a) & (runs.B == Ba)].set_index(["batch", "repeat"])[col]
    y = runs[(runs.method == b) & (runs.B == Bb)].set_index(["batch", "repeat"])[col]
    return (x / y).dropna().groupby(level="batch").median()


rows = []
t_draft = cost[cost.who == "draft"].set_index("T")["seconds"]
for name, k in K.items():
    drafted = "model" in name
    for B in batch_sizes:
        r = paired(name, "autoregressive", B, B)
        at = runs[(runs.method == name) & (runs.B == B)]
        tau, fed = float(at.tau.mean()), float(at.fed.mean())
        rows.append(dict(method=name, B=B, K=k, tau=tau, fed=fed, measured=r.median(), q25=r.quantile(0.25),
                         q75=r.quantile(0.75), n=r.size,
                         verify_ratio=sv.pass_time(cost, B * fed) / float(t_target[B]),
                         draft_share=float(k * t_draft[B] / t_target[B]) if drafted else 0.0,
                         ar_ms_per_token=float(t_target[B] / B * 1e3),
                         predicted=sv.predict_speedup(cost, B, k, tau, drafted=drafted, fed=fed)))
speed = pd.DataFrame(rows)

# %% [markdown]
# The prediction by hand, for prompt lookup at the largest batch (no draft pass, so d(B) = 0):

# %%
B = max(batch_sizes)
at = speed.set_index(["method", "B"]).loc[("linear, n-gram", B)]
v = sv.pass_time(cost, B * at.fed) / float(t_target[B])  # v(B) = t(B·f(B)) / t(B), between measured T
print(f"B = {B}: τ = {at.tau:.2f} tokens per row and pass, f = {at.fed:.2f} tokens fed per row, v = {v:.2f}")
print(f"predicted speedup τ / v = {at.tau / v:.2f}×; measured {at.measured:.2f}×")

# %% [markdown]
# The figure sets the measured medians, with their interquartile ranges (IQR, the middle half of the batches;
# [notation](notation.md)), beside the prediction. Below the dashed line at 1, speculation loses.

# %% tags=["hide-input"]
ch.save(speed, "speedup_vs_batch")
pal = sns.color_palette("colorblind")
fig, ax = plt.subplots(figsize=(7, 4))
for i, (name, g) in enumerate(speed.groupby("method", sort=False)):
    ax.errorbar(g.B, g.measured, yerr=[g.measured - g.q25, g.q75 - g.measured], marker="o", capsize=3,
                color=pal[i], label=f"{name}: measured")
    ax.plot(g.B, g.predicted, ls=":", marker="x", color=pal[i], label=f"{name}: predicted")
ax.axhline(1, color="0.4", ls="--", lw=1)
ax.set(xscale="log", xlabel="batch size B (rows decoded together)",
       ylabel="speedup over autoregressive (same B)",
       title="Speculation's gain as the batch grows: measured against predicted")
ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
ax.xaxis.set_minor_locator(plt.NullLocator())
ax.legend(fontsize=8)
ch.savefig(fig, "speedup_vs_batch")

# %% tags=["hide-input"]
def say(b, first) -> str:
    """A crossover in words; one at the smallest B means speculation was below 1 from the start."""
    if b is None:
        return f"none up to B = {max(batch_sizes)}"
    return f"none (below 1 from B = {b})" if b == first else f"B = {b}"


lines, ends, crossings = [], [], []
for name, g in speed.groupby("method", sort=False):
    m, p = sv.crossover(g.B, g.measured), sv.crossover(g.B, g.predicted)
    n_min = int(g.n.min())  # batches at the B with fewest: what a statement about the crossover rests on
    first = g.B.iloc[0]
    m_never, p_never = (x is not None and x == first for x in (m, p))  # never above 1: no crossover to compare
    if (m is None) != (p is None) or m_never != p_never:
        match = report.judged("they disagree on whether speculation paid at all", n_min)
    elif m is None or m_never or m == p:
        match = report.judged("they agree", n_min)
    else:  # name the batch size where the two part ways on whether speculation pays
        b = min(m, p)
        row = g.set_index("B").loc[b]
        match = report.judged(f"predicted crossover {'earlier' if p < m else 'later'}: at B = {b}, "
                              f"{row.predicted:.3f}× predicted, {row.measured:.3f}× measured", n_min)
    lines.append(f"- **{name}** (K = {int(g.K.iloc[0])}): the measured crossover is {say(m, first)}, "
                 f"the predicted one {say(p, first)}.")
    crossings.append(dict(method=name, K=int(g.K.iloc[0]), measured=say(m, first), predicted=say(p, first),
                          batches=n_min, match=cell(match)))
    for _, r in g.iloc[[0, -1]].iterrows():
        ends.append(dict(method=name, B=int(r.B), tau=r.tau, predicted=f"{r.predicted:.2f}×",
                         ratios=paired(name, "autoregressive", int(r.B), int(r.B))))
display(Markdown("\n".join(lines)))
end_table, end_note = report.verdict_table(ends, unit="batches")
book.show(end_table.set_index(["method", "B"]), "Speedup over autoregressive decoding at the smallest and largest B, "
          "over n distinct batches." + end_note, prefill=True, digits=2)
crossing = pd.DataFrame(crossings).set_index("method")
one_pair = " One batch per B makes each measured crossover one noisy reading." if crossing.batches.min() < 2 else ""
caption("Crossover, measured and predicted. The match column compares them over the fewest batches at any B."
        + one_pair + footnote(crossing, ["match"]))
display(crossing)

# %% [markdown]
# ## Continuous batching under load
# The batches above start together and run until their last row ends. A server's requests arrive at any time,
# wait for a free row, join the running batch and leave when they are done. `sd.serving.Engine` schedules this way,
# one iteration at a time, as Orca and vLLM do. Each step has four parts:
#
# 1. **Retire and admit.** Finished rows leave. Requests that have arrived are prefilled alone and given a free row.
# 2. **Draft.** Every row drafts with its own method, drafter and K.
# 3. **Verify.** All rows are verified in **one** target pass, *packed*: the rows' feeds run back to back.
# 4. **Accept.** Each row keeps its tokens by the core's own rule, as in [chapter 0](00_quickstart.ipynb).
#
# Packing lets each row have its own K: a row that is nearly sure can draft far, and only drafted tokens are paid
# for. The engine's file, `specdec_core/serving/engine.py`, maps each piece onto vLLM's scheduler.
#
# Load is a fraction of autoregressive decoding's *saturation* throughput: its requests per second with every
# request waiting from the start. Each load draws one Poisson arrival schedule, replayed for every policy on the
# same requests. The requests mix chat prompts with input-grounded ones (chapter 11's family): `engine_requests`
# distinct evaluation prompts, each served once per policy and load. Every interval below resamples those requests.
#
# Up to five policies serve the same traffic:
# - **Autoregressive** decoding, the baseline.
# - **Prompt lookup** at chapter 6's K.
# - **The suffix drafter**, its steps capped at `k_suffix`.
# - **Per class**: suffix for input-grounded requests, prompt lookup for chat. The full run leaves it out to fit
#   its time (`engine_per_class`).
# - **Load-adaptive**: the same drafters, but the engine chooses each row's K every step, 0 included.
#
# The load-adaptive choice reads a measured cost model of the step and the row's running acceptance. The section
# "Going deeper" explains the rule.
#
# The measures are vLLM's (`specdec_core/serving/metrics.py`), timed from each request's *arrival*:
# - **TTFT**, time to first token, which includes the wait for a row;
# - **TPOT**, time per output token after the first: (E2E − TTFT) / (tokens − 1);
# - **ITL**, inter-token latency: a step's gap shared among the tokens it revealed;
# - **E2E**, the whole request's latency;
# - **goodput**, the requests per second that met every service-level objective (SLO) on TTFT and TPOT.

# %% tags=["hide-input"]
from specdec_core.serving import StepCost
from specdec_core.study import load as ld

chat_pool = [sd.prompts.encode(pair, p) for p in sd.prompts.load_prompts(per_task=engine_per_task)]
grounded_ids = [sd.prompts.encode(pair, p) for p in sd.prompts.load_grounded("eval", per_task=engine_per_task)]
mix = sd.prompts.traffic_mix([("chat", ids) for ids in chat_pool], [("grounded", ids) for ids in grounded_ids],
                             engine_share, engine_requests, seed=0)
# the training traffic mix: held-out training prompts only, for every choice the engine's policies make
train_chat = [ids for _, ids in sd.prompts.sweep_prompts(pair, engine_train_requests)]
train_grounded = [sd.prompts.encode(pair, p) for p in sd.prompts.load_grounded(
    "train", per_task=-(-engine_train_requests // len(sd.prompts.GROUNDED_TASKS)))]
train_mix = sd.prompts.traffic_mix([("chat", ids) for ids in train_chat], [("grounded", ids) for ids in train_grounded],
                                   engine_share, engine_train_requests, seed=1)
step_context = StepCost.typical_context(pair.target, [(len(ids), engine_max_new_tokens) for _, ids in train_mix])
step_cost = StepCost.measure(pair.target, max_rows=engine_max_batch, context=step_context)
sc = pd.Series(step_cost.verify).unstack()
ch.save(sc.rename_axis(index="rows", columns="tokens").reset_index(), "step_costs")
saturation = ld.saturation(pair.target, mix, engine_max_batch, engine_max_new_tokens)
engine_rounds = engine_repeats if isinstance(engine_repeats, list) else [engine_repeats] * len(engine_loads)
n_classes = pd.Series([c for c, _ in mix]).value_counts().to_dict()
print(f"{len(mix)} distinct evaluation requests: {', '.join(f'{n} {c}' for c, n in n_classes.items())}; "
      f"{len(train_mix)} training requests for the engine's constants")
print(f"autoregressive saturation: {saturation:.2f} requests/s at {engine_max_batch} rows; loads {engine_loads} of it")

# %% [markdown]
# The load-adaptive rule has three constants, explained in "Going deeper". `DECAY` sets how fast a row forgets its
# early steps. `HELD_FLOOR` is how many draft tokens of a held proposal a row always verifies. `PRIOR_TESTS` sets how
# strongly a row's few steps lean on its neighbours'. They are chosen here on the training mix, at
# `engine_tune_loads`, by the highest mean goodput. The evaluation requests are never used for this.

# %% tags=["hide-input"]
import itertools

policies = ld.traffic_policies(pair.drafters["ngram"], sd.SuffixDrafter(learn=False), k_ngram, k_suffix,
                               per_class=engine_per_class)
train_saturation = ld.saturation(pair.target, train_mix, engine_max_batch, engine_max_new_tokens)
grid = [dict(DECAY=d, HELD_FLOOR=f, PRIOR_TESTS=p)
        for d, f, p in itertools.product(engine_decays, engine_floors, engine_priors)]
tuning, constants, train_slo = ld.tune_constants(
    pair.target, train_mix, policies, grid, engine_tune_loads, train_saturation, engine_max_batch,
    engine_max_new_tokens, step_cost, (slo_ttft, slo_tpot), progress=book.progress)
ch.save(tuning, "engine_tuning")
step_cost = ld.with_constants(step_cost, **constants)
ch.save(pd.DataFrame([constants | dict(chosen_on=f"{len(train_mix)} training requests",
                                       loads=" ".join(f"{x:g}" for x in engine_tune_loads))]), "engine_constants")
book.show(tuning.sort_values("mean goodput", ascending=False, kind="stable").set_index(list(constants)).head(6),
          f"Goodput of the load-adaptive policy on the training mix ({len(train_mix)} requests), per setting of the "
          "engine's constants, best first. The first row is used below.", prefill=True, digits=3)
display(Markdown("Chosen on the training mix: " + ", ".join(f"`{k}` = {v:g}" for k, v in constants.items()) + "."))

# %% [markdown]
# The sweep itself: every policy serves the same requests on the same schedules.

# %%
load_runs = ld.load_sweep(pair.target, mix, policies, engine_loads, saturation, engine_max_batch,
                          engine_max_new_tokens, repeats=engine_repeats, step_cost=step_cost, progress=book.progress)

# %% [markdown]
# Every request of every policy and load is compared with `sd.generate` on its prompt alone, greedy, whatever its
# neighbours and arrival. As above, a float32 divergence is excused only at a near-tie.

# %% tags=["hide-input"]
engine_ties = ld.greedy_identity(pair.target, mix, load_runs, engine_max_new_tokens)
identity_line = (f"{len(load_runs)} requests ({len(policies)} policies × {len(mix)} distinct requests × "
                 f"{sum(engine_rounds)} rounds over {report.count(len(engine_loads), 'load')}) "
                 f"decoded the text of `generate` alone" + (f"; near-ties excused: {len(engine_ties)}" if engine_ties else ""))
slo = ld.slo_from(load_runs, slo_ttft, slo_tpot)
load_table = ld.summary(load_runs, slo)
class_table = ld.summary(load_runs, slo, by=("policy", "load", "cls"))
ch.save(load_runs.drop(columns=["tokens", "itl"]), "load_runs")
ch.save(load_table, "load_summary")
ch.save(class_table, "load_summary_by_class")
print(identity_line)

# %% [markdown]
# Goodput as the load grows, and the tail of the per-token latency. Goodput's SLOs are set from autoregressive
# decoding at the lowest load: TTFT within `slo_ttft` times its median, and TPOT within `slo_tpot` times its median.

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, (col, label) in zip(axes, (("goodput", "goodput (requests/s within SLO)"),
                                   ("itl_p99_ms", "p99 per-token ITL (ms)"))):
    sns.lineplot(data=load_table, x="load", y=col, hue="policy", marker="o", ax=ax, palette="colorblind")
    ax.set(xlabel="load (fraction of autoregressive saturation)", ylabel=label)
axes[1].get_legend().remove()
fig.suptitle("Goodput and tail latency of each policy as the load grows")
ch.savefig(fig, "load_sweep")

# %% [markdown]
# Does choosing K from the load keep the best of both? At each load, the load-adaptive policy's goodput is divided
# by each other policy's. Its 90 % bootstrap interval is paired and over distinct requests: it resamples the
# requests, each with all its rounds, with the same draw for both policies. It should keep at least 0.95 of every other policy's
# goodput, and all of autoregressive decoding's. The verdict says whether the interval decides that (`holds`,
# `fails`) or not (`undecided`).

# %% tags=["hide-input"]
verdicts = ld.goodput_verdicts(load_runs, slo)
ch.save(verdicts, "goodput_verdicts")
found, kept_rows = [], []
for load, base, best in ld.against(verdicts):
    found.append(f"- At load {load:g}, load-adaptive serves {base.policy_goodput:.2f} requests/s within SLO. "
                 f"Autoregressive decoding serves {base.other_goodput:.2f}; the best other policy ({best.other}) "
                 f"serves {best.other_goodput:.2f}.")
    for v in (base, best):
        kept_rows.append(dict(load=f"{load:g}", against=v.other, ratio=f"{v.ratio:.2f}",
                              interval=f"{v.lo:.2f}–{v.hi:.2f}", goal=f"≥ {v.goal:g}",
                              requests=int(v.n_units), verdict=cell(v.verdict)))
display(Markdown("\n".join(found)))
kept = pd.DataFrame(kept_rows).set_index(["load", "against"])
book.show(kept, "Load-adaptive goodput ÷ another policy's, with its 90 % paired bootstrap interval over the "
          "distinct requests (one-sided, a 5 % false-positive rate against its goal). Each load sets it against autoregressive decoding and against the best other policy."
          + footnote(kept, sample="requests"), prefill=True, digits=None)

# %% [markdown]
# ## Going deeper
#
# ### Throughput, and what a batch buys
# Throughput counts every token of every row over the whole call, prefill included. The decode loop alone counts
# the tokens after each row's first, over the time after the prefill. Batch sizes are powers of two, so the figure's
# axis is logarithmic; its error bars are the IQR over the batches.

# %% tags=["hide-input"]
def grow(df: pd.DataFrame, col: str) -> float:
    """Autoregressive decoding's median ``col`` at the largest B ÷ at the smallest: a figure's message."""
    m = df[df.method == "autoregressive"].groupby("B")[col].median()
    return float(m[max(batch_sizes)] / m[min(batch_sizes)])


book.show(runs.groupby(["method", "B"]).tokens_per_s.median().unstack("B"),
          f"Tokens per second of the whole call, all rows, per method (rows) and batch size B (columns). "
          f"Median over {report.count(batches, 'batch')} × {report.count(repeats, 'repeat')}.", prefill=True, digits=1)
batched = runs[~runs.method.str.startswith("generate")]


def against_b(y: str, ylabel: str, what: str, name: str) -> None:
    """The median of ``y`` per method against B, with its middle half shaded; the title states its growth."""
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(data=batched, x="B", y=y, hue="method", estimator="median", errorbar=("pi", 50), marker="o", ax=ax)
    ax.set(xscale="log", xlabel="batch size B", ylabel=ylabel,
           title=f"Autoregressive {what}, B = {min(batch_sizes)} to B = {max(batch_sizes)}: ×{grow(batched, y):.1f}")
    ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ch.savefig(fig, name)


against_b("tokens_per_s", "tokens/s, all rows", "tokens/s", "throughput_vs_batch")

# %% [markdown]
# Up to three ratios decide whether batching works here at all:
# - The batch path at B = 1 against the single-sequence decoder: the cost of the per-row bookkeeping and 4D mask.
# - Autoregressive decoding at B = `check_batch` against B = 1, when that B ran.
# - The same batch against its requests served one at a time: what a batch buys before any speculation.
#
# Each is timed over the whole call and over the decode loop alone, so the prefill's share can be read off.

# %% tags=["hide-input"]
checks = {"batch path ÷ generate, B = 1": ("autoregressive", "generate (one sequence)", 1, 1)}
if check_batch in batch_sizes:
    checks[f"autoregressive B = {check_batch} ÷ B = 1"] = ("autoregressive", "autoregressive", check_batch, 1)
    checks[f"autoregressive B = {check_batch} ÷ the same {check_batch} requests one at a time"] = (
        "autoregressive", "generate, one request at a time", check_batch, check_batch)
check_table, check_note = report.verdict_table(
    [dict(check=name, timed=timed, ratios=paired(*c, col=col)) for name, c in checks.items()
     for timed, col in (("whole call", "tokens_per_s"), ("decode loop", "decode_tokens_per_s"))], unit="batches")
book.show(check_table.set_index(["check", "timed"]), "Tokens per second of one runner ÷ another's, paired by "
          "batch." + check_note, prefill=True, digits=None)

# %% [markdown]
# ### The cost model, term by term
# A row decodes exactly as its prompt would alone. So B changes τ only through which prompts its batches hold:
# B = 1 decodes the first prompt, larger batches the first B, cycling. The feed f(B) depends on the drafter. The
# batch packs the rows' feeds into one sequence, so a row whose prompt lookup found nothing adds one token, not
# K + 1. A model draft always drafts K.
#
# The knee is not the only force. A fixed cost per pass that does not grow with its tokens (Python dispatch, small
# kernels) works the other way. It weighs less in a large pass, so v(B) and d(B) can also shrink as B grows. Which
# of the two wins is a property of the machine and the pair. The table gives every term as this run measured it.

# %% tags=["hide-input"]
book.show(speed, "Speculation ÷ autoregressive decoding at the same B. The measured column is the median of the "
          "paired tokens/s ratios, with their IQR (q25–q75) over n distinct batches. Column tau counts tokens per row and target "
          "pass, and fed the tokens per row and verify pass. The verify ratio is t(B·fed)/t(B), linear between "
          "measured T. The draft share is K·t_d(B)/t(B), and ar_ms_per_token is t(B)/B. Those three come from "
          "single-sequence pass costs, with no prefill in them. The predicted column is "
          "tau ÷ (verify_ratio + draft_share).", prefill=True)

# %% [markdown]
# ### The trend in B, and why
# The crossover reads one B at a time. The trend reads them all: does speculation's ratio fall as B grows, rise,
# or neither? The direction comes from Spearman's rank correlation ρ between B and the ratio of every distinct
# batch. Its p-value comes from permutations of those batches (`study.serving.rank_trend`), exact where the
# arrangements can be counted. A direction is named only when p is under `trend_p`, and only for a sample the
# verdict rule allows.
#
# The why is the cost model's decomposition, between the smallest and the largest B. It shows how much τ(B) moved,
# how much the step's cost v(B) + d(B) moved, and how cheap a token of autoregressive decoding became, t(B)/B.

# %% tags=["hide-input"]
def iqr_text(r) -> str:
    """A measured ratio with its IQR (none for a single batch)."""
    spread = f"IQR {r.q25:.2f}–{r.q75:.2f}, " if r.n > 1 else ""
    return f"{r.measured:.2f}× ({spread}{report.count(r.n, 'batch')})"


trend_rows, trend_shown, why_shown, trend_lines = [], [], [], []
for name, k in K.items():
    pairs = pd.concat([paired(name, "autoregressive", B, B).rename(B) for B in batch_sizes], axis=1).melt(
        var_name="B", value_name="ratio").dropna()
    n = len(pairs)
    tr = sv.rank_trend(pairs.B.to_numpy(), pairs.ratio.to_numpy())  # a permutation p, exact where countable
    rho, pval = tr["rho"], tr["p"]
    word = ("rising" if rho > 0 else "falling") if pval < trend_p else f"no direction (p ≥ {trend_p:g})"
    g = speed[speed.method == name].set_index("B")
    lo, hi = g.loc[min(batch_sizes)], g.loc[max(batch_sizes)]
    ends = ("one batch at an end" if min(lo.n, hi.n) < 2 else cell(report.judged(
        "disjoint" if hi.q25 > lo.q75 or hi.q75 < lo.q25 else "overlapping", min(int(lo.n), int(hi.n)))))
    cost_lo, cost_hi = lo.verify_ratio + lo.draft_share, hi.verify_ratio + hi.draft_share
    f_tau, f_cost = hi.tau / lo.tau, cost_hi / cost_lo
    larger = "the step's cost" if abs(np.log(f_cost)) > abs(np.log(f_tau)) else "τ"
    same_way = np.sign(hi.predicted - lo.predicted) == np.sign(hi.measured - lo.measured)
    trend_rows.append(dict(method=name, batches=n, spearman_rho=rho, p_value=pval, p_method=tr["p_method"],
                           ratio_B_min=lo.measured, ratio_B_max=hi.measured, tau_factor=f_tau, cost_factor=f_cost,
                           predicted_B_min=lo.predicted, predicted_B_max=hi.predicted))
    trend_shown.append({"method": name, "batches": n, "ρ": f"{rho:.2f}", "p": f"{pval:.2g}", "p from": tr["p_method"],
                        "direction": cell(report.judged(word, n)), f"at B = {lo.name}": iqr_text(lo),
                        f"at B = {hi.name}": iqr_text(hi), "the two IQRs": ends})
    why_shown.append({"method": name, "step cost": f"{cost_lo:.2f} → {cost_hi:.2f}",
                      "verify ratio": f"{lo.verify_ratio:.2f} → {hi.verify_ratio:.2f}",
                      "draft share": f"{lo.draft_share:.2f} → {hi.draft_share:.2f}" if "model" in name else "—",
                      "τ": f"{lo.tau:.2f} → {hi.tau:.2f}",
                      "predicted": f"{lo.predicted:.2f}× → {hi.predicted:.2f}×",
                      "mostly through": larger,
                      "measured": f"×{hi.measured / lo.measured:.2f}",
                      "direction vs predicted": cell(report.judged("the same" if same_way else "opposite",
                                                                   min(int(lo.n), int(hi.n))))})
    trend_lines.append(f"- **{name}**: from B = {lo.name} to B = {hi.name}, the cost model moves the ratio "
                       f"×{f_tau / f_cost:.2f}, mostly through {larger}. The measured ratio moved "
                       f"×{hi.measured / lo.measured:.2f}.")
trend = pd.DataFrame(trend_rows)
ch.save(trend, "trend_vs_batch")
trend_lines.append(f"- The baseline to beat: a token of autoregressive decoding costs {lo.ar_ms_per_token:.1f} ms "
                   f"of pass time at B = {lo.name}, {hi.ar_ms_per_token:.1f} ms at B = {hi.name}.")
display(Markdown("\n".join(trend_lines)))
trend_table = pd.DataFrame(trend_shown).set_index("method")
caption("The ratio's direction in B, from Spearman's ρ over every distinct batch, and its two ends. Disjoint IQRs at "
        "the ends "
        "separate them." + footnote(trend_table, ["direction", "the two IQRs"]))
display(trend_table)
why_table = pd.DataFrame(why_shown).set_index("method")
caption("Why, from the pass costs, between the smallest and largest B. The step cost is in autoregressive steps, "
        "v(B) + d(B)." + footnote(why_table, ["direction vs predicted"]))
display(why_table)

# %% [markdown]
# ### Latency per request
# Batching can buy throughput with latency. Every request waits for the batch's passes, and a pass over B rows
# costs more than a one-row pass once B is past the knee. The figure and the table give the median time at which
# a row's last token was known.

# %% tags=["hide-input"]
against_b("latency_s", "seconds to the last token (median row)", "time to the last token", "latency_vs_batch")
book.show(batched.groupby(["method", "B"]).latency_s.median().unstack("B"),
          "Seconds from the call's start to a row's last token, per method (rows) and batch size B (columns). "
          "Median row and repeat.", prefill=True, digits=2)

# %% [markdown]
# ### Streaming: what the reader sees
# Speculation also changes how an answer arrives. Tokens come in bursts whenever a verify pass accepts drafts. A
# server that times its stream *per chunk* reports one long gap where the reader received several tokens.
#
# Here one request at a time goes through `sd.stream`, whose decode loop yields the tokens each step committed. A
# timer is read just before the call and at each yield, and that reading stamps every token the yield carried.
# TTFT is the prefill: the target's, and with a model drafter the draft's too. After it, the per-token ITL shares a
# step's gap among the tokens it revealed. The per-chunk latency counts one gap per step.

# %%
stream_rows, arrivals = [], []
timer = pf.Timer(pair.target.device)
for name in ("autoregressive", "linear, n-gram", "linear, model draft"):
    for j, ids in enumerate(encoded[:stream_prompts]):
        received, t0 = [], timer.now()  # seconds from the request to each token's arrival at the reader
        for new in sd.stream(pair.target, ids, max_new_tokens=max_new_tokens, **methods[name]):
            received += [timer.now() - t0] * len(new)
        stream_rows.append(dict(method=name, prompt=j, **sv.chunk_latencies(received)))
        if j == 0:
            arrivals += [dict(method=name, token=i + 1, seconds=t) for i, t in enumerate(received)]
stream = pd.DataFrame(stream_rows)

# %% tags=["hide-input"]
ch.save(stream, "streaming_latency")
med = stream.groupby("method", sort=False).median(numeric_only=True)
display(Markdown("\n".join(
    f"- **{name}**: TTFT {r.ttft_ms:.0f} ms. In all, {int(r.tokens)} tokens arrive in {int(r.chunks)} chunks, "
    f"with a p50 gap of {r.chunk_p50_ms:.0f} ms per chunk and {r.token_p50_ms:.0f} ms per token."
    for name, r in med.iterrows())))
book.show(med.drop(columns=["prompt", "ttft_ms"]), f"Streaming one request at a time: tokens, chunks (steps that "
          f"revealed tokens), and ITL percentiles in ms, per token and per chunk. Median over "
          f"{report.count(stream_prompts, 'prompt')}.", prefill=False, digits=1)

fig, ax = plt.subplots(figsize=(7, 4))
for i, (name, g) in enumerate(pd.DataFrame(arrivals).groupby("method", sort=False)):
    ax.step(g.seconds, g.token, where="post", color=pal[i], label=name)
    ax.plot(g.seconds, g.token, ".", color=pal[i], ms=4)
ax.set(xlabel="seconds since the request", ylabel="tokens received",
       title="Speculative tokens arrive in bursts (prompt 0)")
ax.legend(fontsize=8)
ch.savefig(fig, "arrivals")

# %% [markdown]
# ### Inside the engine: packing and the step-cost model
# The verify pass is *packed*, as vLLM flattens its batch; the lockstep batches above ran on the same engine. The
# rows' feeds (each row's last token and its draft) run back to back as one sequence. Each token is written at its
# own row of the cache and attends only that row.
#
# Padding would waste the pass. Padded to the longest feed, one row drafting 16 tokens would make seven rows of one
# token cost 8 × 17 slots. Packed, that step is a pass over 24 tokens.
#
# The step-cost model prices a packed step over n rows and N tokens as t(n, N / n). That is the measured pass over
# n rows of N / n tokens each, on average. It is timed as the engine runs it, packed, with the rows feeding 1 and
# 2T − 1 tokens in turn. A packed pass need not cost what a padded one of the same tokens does. The rows kernel
# attends a packed pass in one call; torch's attention takes its longer rows one call each. The passes are timed after
# as many committed tokens as the mix's requests typically hold, since each drafted token attends all of them.
#
# A row allowed K tokens feeds only those its drafter proposes. A model draft feeds all K; prompt lookup and the
# suffix drafter feed tokens only where they find a match. So the model prices a row's K by the tokens it is
# expected to feed, not by K itself. That expectation is how often each position was filled so far.
#
# Where the model need not guess, it does not. A drafter without a model costs microseconds to ask. So an adaptive
# row's drafter is asked for its longest draft before K is chosen, and the row's feed is known. The engine then cuts
# the draft to K. That stays exact, because each drafted token depends on the committed context alone.
#
# A lookup that matches proposes all of its K; one that does not proposes nothing. Past a CPU's knee, each token
# added to a pass costs more than the last. There the time of the mean feed is below the mean time. So a step is
# priced at its expected time over what the rows may feed.

# %% tags=["hide-input"]
book.show(sc / step_cost.t(1, 1), f"The step-cost model: a verify pass over B rows (rows) of T tokens each on average "
          f"(columns), in one-row one-token passes. Rows feed 1 and 2T − 1 tokens in turn, packed. Timed after "
          f"{step_context} committed tokens (the mix's median prompt and half answer).", prefill=False, digits=2)

# %% [markdown]
# ### How the load-adaptive policy chooses K
# Each step, the engine chooses each adaptive row's own K, 0 included. It reads three things measured as it runs:
# - The step-cost model t(rows, tokens) above.
# - Each row's running acceptance at each draft position.
# - The drafters' running time per drafted token.
#
# This is SmartSpec's rule with a K per row (`sd.serving.StepCost.best_ks`). A row's recent steps weigh more,
# since a request's acceptance drifts as it decodes. Prompt lookup finds more of an answer that repeats itself,
# and copies come in spans. A row with few steps yet borrows from the live rows of its own drafter. A chat row's
# prompt lookup says little of a grounded row's copies.
#
# What the rule maximizes differs from SmartSpec's. SmartSpec maximizes the batch's tokens per second. This engine
# maximizes the product of the rows' expected rates: the lowest geometric mean of the rows' times per token. The
# reason is goodput. Goodput counts each request once, whether its TPOT meets the SLO. Tokens per second count a
# row that adds 17 tokens 17 times, and buy its span with a longer step that every row waits for. So a row drafts
# only while its own relative gain outweighs the relative delay of all the rows sharing the step. With one row the
# two objectives are the same; `StepCost(objective="throughput")` is SmartSpec's.
#
# One floor can override the objective: a row that holds a proposal verifies at least its first `HELD_FLOOR`
# tokens. That is a rule, not a consequence of the objective. A per-step objective weighs one token's delay to every
# row of the step, while an SLO counts a request once, so at a full batch the objective alone often refuses a short
# match. Whether the floor pays (1) or not (0) was chosen on the training mix above, with `DECAY` and
# `PRIOR_TESTS`. The table `engine_tuning.csv` holds every setting's goodput there.
#
# Last, the adaptive rows do not speculate on the step right after an admission. The rows decoding then have just
# waited for a prefill, so their gap is already the longest.

# %% tags=["hide-input"]
rounds_said = ", ".join(f"{report.count(n, 'round')} at {x:g}" for x, n in zip(engine_loads, engine_rounds))
book.show(load_table.set_index(["policy", "load"])[["request_rate", "tokens_per_s", "goodput", "ttft_p50_ms",
                                                    "tpot_p50_ms", "itl_p99_ms", "e2e_p99_ms"]],
          f"Each policy (rows) at each load, a fraction of autoregressive saturation. Columns: finished requests/s, "
          f"tokens/s, goodput, and latencies in ms, with TTFT and E2E from each request's arrival. Goodput counts "
          f"requests/s with TTFT ≤ {1e3 * slo['ttft']:.0f} ms and TPOT ≤ {1e3 * slo['tpot']:.1f} ms. "
          f"Median over the rounds ({rounds_said}).", prefill=True, digits=2)
book.show(class_table.pivot_table(index=["cls", "policy"], columns="load", values="tpot_p50_ms"),
          "Median TPOT (ms) per request class and policy (rows) at each load (columns). It shows what each policy "
          "gives the requests it helps, and what it costs the others.", prefill=False, digits=1)

k_tab = ld.k_table(load_runs, "load-adaptive")
ch.save(k_tab, "k_by_batch_size")
caption("The K the load-adaptive policy chose, per batch size (the live rows of a step). Columns: steps, median "
        "and mean K, and the share of steps that did not speculate.")
display(report.shown(k_tab.set_index("batch_size"), 2))
vllm_k = ld.vllm_k_setting(k_tab)
print(f"num_speculative_tokens_per_batch_size = {vllm_k}  # vLLM's batch-size table for this pair and machine")

# %% [markdown]
# The goodput comparison in full, and three latency questions. Two of them get the same paired bootstrap interval
# as goodput (`ld.tpot_ratio`). First, TPOT at the lightest load against autoregressive decoding (goal 1.5×).
# Second, TPOT on the chat requests against the fixed policy fastest on them (goal 0.95). That policy is picked on
# the same run, so the comparison leans against load-adaptive. The third is the most that choosing among these
# policies could give: each request's lowest TPOT over all of them.

# %% tags=["hide-input"]
book.show(verdicts.set_index(["load", "other"])[["goal", "policy_goodput", "other_goodput", "ratio", "lo", "hi",
                                                 "requests", "policy_met", "other_met"]],
          "Load-adaptive goodput ÷ each other policy's (rows) at each load, in requests/s within SLO. The ratio has "
          "a 90 % paired bootstrap interval (lo–hi) over the requests. The met columns count the requests that met "
          "every SLO under each (policy_met: load-adaptive). The verdicts are in the table of the main section.",
          prefill=True, digits=2)

g = load_table.set_index(["policy", "load"])
low, high = min(engine_loads), max(engine_loads)
tp = ld.tpot_ratio(load_runs, low, "load-adaptive", "autoregressive", goal=1.5)
oracle = ld.best_per_request(load_runs, low)
engine_lines = [
    f"- At load {low:g}, median TPOT is {g.loc[('load-adaptive', low), 'tpot_p50_ms']:.1f} ms under load-adaptive "
    f"and {g.loc[('autoregressive', low), 'tpot_p50_ms']:.1f} ms under autoregressive decoding (per round).",
    f"- At load {high:g}, p99 per-token ITL is {g.loc[('load-adaptive', high), 'itl_p99_ms']:.1f} ms under "
    f"load-adaptive and {g.loc[('autoregressive', high), 'itl_p99_ms']:.1f} ms under autoregressive decoding.",
    f"- Choosing the best of the {len(policies)} policies for each request would give a median TPOT of "
    f"{1e3 * oracle.median():.1f} ms at load {low:g}. That is "
    f"{g.loc[('autoregressive', low), 'tpot_p50_ms'] / (1e3 * oracle.median()):.2f}× better than autoregressive "
    f"decoding's median."]
tpot_rows = [dict(question=f"TPOT, all requests, load {low:g}", against="autoregressive", ratio=f"{tp['ratio']:.2f}×",
                  interval=f"{tp['lo']:.2f}–{tp['hi']:.2f}", goal="≥ 1.5", requests=tp["n_units"],
                  verdict=cell(tp["verdict"]))]
chat = class_table[(class_table.cls == "chat") & (class_table.load == low)].set_index("policy")
if 1 in batch_sizes and {"autoregressive", "load-adaptive"} <= set(chat.index):
    # the chat requests of the mix at the lowest load (few rows overlap) beside chapter 6's question at B = 1: the
    # best single method on chat prompts decoded alone (autoregressive itself, 1×, when nothing beats it)
    b1 = {name: float(paired(name, "autoregressive", 1, 1, col="decode_tokens_per_s").median()) for name in K}
    best_name, best_b1 = max([("autoregressive", 1.0)] + list(b1.items()), key=lambda x: x[1])
    chat_ratio = chat.loc["autoregressive", "tpot_p50_ms"] / chat.loc["load-adaptive", "tpot_p50_ms"]
    live = load_runs[(load_runs.policy == "load-adaptive") & (load_runs.load == low) & (load_runs.cls == "chat")]
    rows_seen = float(np.mean([b for bs in live.batch_rows for b in bs])) if len(live) else float("nan")
    engine_lines.append(
        f"- Chat requests at load {low:g} ran in steps of {rows_seen:.1f} live rows on average. Their median "
        f"TPOT under load-adaptive is {chat_ratio:.2f}× better than under autoregressive decoding.")
    engine_lines.append(
        f"- The best single method on chat prompts at B = 1 above ({best_name}, decode loop alone) gave "
        f"{best_b1:.2f}×. So load-adaptive keeps {chat_ratio / best_b1:.3f} of it.")
    # the same question side by side: the fixed policies served these chat requests on the same schedules
    fixed = [p for p in policies if p not in ("autoregressive", "load-adaptive", "per class")]
    best_fixed = min(fixed, key=lambda p: chat.loc[p, "tpot_p50_ms"])
    kept_chat = ld.tpot_ratio(load_runs, low, "load-adaptive", best_fixed, cls="chat", goal=0.95)
    tpot_rows.append(dict(question=f"TPOT, chat requests, load {low:g}", against=best_fixed,
                          ratio=f"{kept_chat['ratio']:.3f}×", interval=f"{kept_chat['lo']:.2f}–{kept_chat['hi']:.2f}",
                          goal="≥ 0.95", requests=kept_chat["n_units"], verdict=cell(kept_chat["verdict"])))
crossed = {p: ld.crossover(load_table, p) for p in policies if p not in ("autoregressive", "load-adaptive")}
engine_lines += [f"- **{p}**: goodput below autoregressive decoding's "
                 + (f"from load {x:g}." if x is not None else "at no load of the sweep.") for p, x in crossed.items()]
display(Markdown("\n".join(engine_lines)))
tpot_table = pd.DataFrame(tpot_rows).set_index("question")
book.show(tpot_table, "Median TPOT of the other policy ÷ load-adaptive's, pooled over the rounds, with its 90 % "
          "paired bootstrap interval over the distinct requests." + footnote(tpot_table, sample="requests"),
          prefill=False, digits=None)

# %% [markdown]
# ## Summary
# What this run measured. The reference run on the book's 2-core CPU is in `data/reference/book/09_serving/`.

# %% tags=["hide-input"]
summary = [
    f"- Every batch row ({checked}) and every engine request ({len(load_runs)}) decoded the autoregressive text"
    + (f", near-ties excused: {len(ties) + len(engine_ties)}." if ties or engine_ties else "."),
    "- Crossover in B, measured / predicted: " + "; ".join(
        f"{r.Index} {r.measured} / {r.predicted}" for r in crossing.itertuples()) + ".",
    "- From the smallest to the largest B, the measured ratio moved " + "; ".join(
        f"×{r.ratio_B_max / r.ratio_B_min:.2f} for {r.method}" for r in trend.itertuples()) + ".",
    "- Load-adaptive goodput ÷ autoregressive decoding's: " + "; ".join(
        f"{base.ratio:.2f} at load {load:g}" for load, base, _ in ld.against(verdicts)) + ".",
    "- Streaming, per-chunk against per-token p50 gap: " + "; ".join(
        f"{r.chunk_p50_ms:.0f} against {r.token_p50_ms:.0f} ms for {name}" for name, r in med.iterrows()
        if name != "autoregressive") + "."]
display(Markdown("\n".join(summary)))

# %% [markdown]
# ## Exercises
# 1. From `pass_costs.csv` alone, predict the crossover B of a model draft with K = 1 and of one with K = 6 (τ from
#    Leviathan et al.'s (1 − α^{K+1})/(1 − α) with the α of chapter 3). Does the longer K cross at a smaller B, and
#    why would it? Rerun with `k_model` set to each and compare.
# 2. τ(B) changes with B only through the prompts a batch holds (B = 1 decodes the first prompt alone). Predict
#    the speedup at every B with one pooled τ (the mean of `tau` over the B of a method) instead of τ(B): does the
#    predicted trend keep its direction? How much of the measured trend came from the prompt mix, and how much
#    from the pass costs (compare the trend lines' τ and cost factors)?
# 3. A server that speculates only while the batch is small: write the rule "speculate if predicted speedup(B) > 1"
#    with `sv.predict_speedup` and this run's `pass_costs.csv`. What does it decide at each B here, and what on a GPU,
#    where t(T) stays flat to a few hundred tokens (chapter 1's GPU knees)?
# 4. Streaming: from `streaming_latency.csv`, how many tokens does an n-gram chunk carry on average, and what
#    per-chunk p50 would a server report for a draft with τ = 3 at the same step cost? Why is the per-token
#    latency the number a reader feels?
# 5. Padding: in a speculative step rows feed different numbers of tokens. The eager engine packs them (every slot
#    a real token); the CUDA-graph step modes pad each row to the longest, since a graph replays fixed shapes.
#    Decode one batch of B = 8 with `sd.generate_batch(..., method="linear", drafter=pair.drafters["ngram"], k=4,
#    graphs=True)` and read `.stats["slot_use"]`, the fraction of the verify passes' token slots that carried a real
#    token. How does it change with K and B? Time the same batch with `graphs=False` (packed): what did padding cost
#    on this machine, and why would it cost less on a GPU whose pass time stays flat over the padded tokens?
# 6. Load-adaptive K: from `step_costs.csv` and the α of each class (`load_runs.csv`), compute by hand the K that
#    `StepCost.best_k` would choose for 1, 4 and 8 live rows of grounded requests alone. Where does K fall to 0,
#    and how does that compare with `k_by_batch_size.csv`? Rerun the sweep with `engine_share = 0` (chat alone):
#    does the load-adaptive policy still match the best fixed one at every load?
# 7. The floor: serve the sweep's highest load again with a load-adaptive policy whose cost model has no floor. Use a
#    subclass of `StepCost` with `HELD_FLOOR = 0`, passed as `step_cost` beside the default on the same schedules,
#    and compare goodput with `ld.goodput_verdicts`. Which class of requests gains or loses, and at how many live rows
#    does the floor bind (the steps where a row holding a proposal would otherwise take K = 0)?
# 8. Tiles: chapter 1's rows kernel multiplies up to `kernels.load().ROWS_PER_TILE` token rows (14 with AVX-512) in
#    one sweep over a block of weights, so a pass over one token more than a tile sweeps them twice. Time
#    `BatchLM.verify` over 8 rows feeding 8 to 48 tokens in all: where does the time jump, and how far does the
#    step-cost model's linear interpolation between its measured T miss it? Give the model the tile boundaries (a
#    `StepCost` whose `t` interpolates in total tokens) and serve the highest load with both, as in exercise 7. (Where
#    the target runs through torch, chapter 1's line says so, look for the steps of the library's own kernels.)
