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
# # 9 · Serving: batches, and what a streaming reader sees
#
# A server does not decode one request at a time. It stacks the requests of many users into one batch,
# so that one pass over the weights serves every row: on hardware where a pass over a few tokens costs
# about as much as a pass over one, a batch of B rows yields B tokens for the price of one. Speculative
# decoding lives off the same spare capacity: it verifies K + 1 tokens in one pass. In a batch the two
# compete. A speculative step over B rows is a pass over up to B·(K + 1) tokens, and once that pass is no longer
# nearly free the extra tokens cost more than the accepted drafts save. Somewhere in B speculation stops
# paying, if it paid at B = 1. This chapter measures whether and where, predicts it from pass costs alone,
# checks the prediction, and reads the trend of speculation's ratio over B whichever way it goes: on a machine
# where a pass has a large fixed cost, a larger batch can also help speculation (the section on the trend says why).
#
# The batch runs on `sd.generate_batch` (`specdec_core/serving/`), the engine of the last section with every prompt
# submitted at once: one preallocated cache with a length per row, so rows that accept different numbers of tokens
# are never re-padded, and a row leaves the batch as soon as it is done. Each row's *accept* phase is the
# single-sequence one with the row's own generator, so every row is exactly the decode of its prompt alone
# (the tests check it bit for bit on float64 toy pairs; here, in float32, greedy rows are compared with
# autoregressive decoding below).
#
# Speculation also changes how an answer arrives. Tokens come in bursts whenever a verify pass accepts drafts,
# and a server that times its stream *per chunk* reports one long gap where the reader received several tokens.
# The streaming section measures both.
#
# No server waits for a whole batch to arrive, though: requests arrive, wait for a row, and leave when done. The section
# on continuous batching serves a traffic mix of chat and input-grounded requests through `sd.serving.Engine` at
# loads from light to past saturation, and asks at which load each way of speculating stops paying, against goodput
# and tail latency, and whether choosing K each step from the load keeps the best of both.

# %% tags=["parameters"]
model = "smollm2-135m"         # embedded name, Hugging Face id, or local path
draft = None                   # optional draft id/path (default: the shipped draft)
device = "cpu"                 # "cpu", "cuda" or "auto"
dtype = "float32"              # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
per_task = 2                   # evaluation prompts per task; a batch of B takes B of them, cycling
batch_sizes = [1, 2, 4, 8, 16, 32]
max_new_tokens = 48            # per row
repeats = 2                    # interleaved rounds over every (method, B)
k_ngram = 4                    # prompt lookup's K (chapter 6's setting, fixed before any measurement)
k_model = 3                    # the model draft's K (its model card's sweep on held-out training prompts)
pass_repeats = 5               # rounds timing the single-sequence passes t(T) of the cost model
stream_prompts = 3             # prompts decoded one at a time for the streaming section
check_batch = 8                # the batch size whose autoregressive speed is set against B 1 and its requests one by one
trend_p = 0.05                 # the rank correlation's p-value under which speculation's ratio has a direction in B
engine_requests = 12           # requests of the traffic mix the engine serves at each load
engine_share = 0.5             # their input-grounded share (0: the chat mix alone)
engine_loads = [0.15, 0.6, 1.2]  # arrival rates as fractions of autoregressive decoding's saturation throughput
engine_max_batch = 8           # the engine's rows (vLLM's max_num_seqs)
engine_max_new_tokens = 96     # per request
engine_repeats = 1             # rounds of the load sweep (each draws new schedules, replayed for every policy):
                               # one number, or one per load (the loaded points decide more with more rounds)
k_suffix = 32                  # the cap on a suffix step's length (chapter 11's)
slo_ttft = 4.0                 # goodput's SLOs, as multiples of autoregressive decoding's median at the lowest load
slo_tpot = 1.5
out_dir = "../build/book/09_serving"
params_name = None  # the parameter file's name, injected by scripts/run_book.py (banner)

# %%
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
print(ch)

# %% [markdown]
# ## The methods, fixed before measuring
# Autoregressive decoding, linear speculative decoding with prompt lookup (the n-gram drafter, no model)
# and with the shipped draft model, each at a K chosen before this chapter ran. A fourth runner decodes
# one prompt with the single-sequence `sd.generate`, to see what the batch path costs at B = 1, and, when
# `check_batch` (8) is one of `batch_sizes`, a fifth serves the requests of that batch one after another, to see
# what the batch buys. The single-sequence pass costs t(T) that the prediction below needs are timed first; the
# setting line reads the verify cost of prompt lookup's K from them, t(K + 1)/t(1).

# %%
K = {"linear, n-gram": k_ngram, "linear, model draft": k_model}
counts = sorted({1, k_ngram + 1} | set(batch_sizes) | {B * (k + 1) for B in batch_sizes for k in K.values()})
context = int(np.median([ids.numel() for ids in encoded])) + max_new_tokens // 2
cost = sv.pass_cost_curve(pair.target, counts, context, repeats=pass_repeats, draft=pair.drafters["model"].model)
ch.save(cost, "pass_costs")
t_target = cost[cost.who == "target"].set_index("T")["seconds"]
display(ch.setting(k_ngram, float(t_target[k_ngram + 1] / t_target[1])))

methods = {
    "autoregressive": dict(method="autoregressive"),
    "linear, n-gram": dict(method="linear", drafter=pair.drafters["ngram"], k=k_ngram),
    "linear, model draft": dict(method="linear", drafter=pair.drafters["model"], k=k_model),
    "generate (one sequence)": dict(method="autoregressive", single=True),
    # the same B = check_batch requests without a batch: generate on each in turn (a server without batching)
    "generate, one request at a time": dict(method="autoregressive", one_at_a_time=True, at=[check_batch]),
}
runs = sv.time_batches(pair.target, encoded, methods, batch_sizes, max_new_tokens, repeats=repeats,
                       progress=book.progress)
ch.save(runs.drop(columns="outputs"), "batch_runs")
book.show(runs.groupby(["method", "B"]).tokens_per_s.median().unstack("B"),
          f"Tokens per second of the whole call, all rows, per method (rows) and batch size B (columns): median over "
          f"{report.count(repeats, 'repeat')}.", prefill=True, digits=1)

# %% [markdown]
# ## Every row is the autoregressive answer
# The speed below means something only if every method decodes the same text. Each row of each batch is
# compared with the single-sequence autoregressive decode of the same prompt (`sd.generate`), token by token; a
# float32 divergence
# is excused only where the target's two best logits lie within `ex.NEAR_TIE` (a near-tie, where batched
# arithmetic may round either way).

# %%
used = range(min(len(encoded), max(batch_sizes)))  # the distinct prompts the batches took
reference = {j: sd.generate(pair.target, encoded[j], max_new_tokens=max_new_tokens).tokens for j in used}
checked, ties, by_method = 0, [], {}
for r in runs.itertuples():
    by_method[r.method] = by_method.get(r.method, 0) + len(r.outputs)
    for i, toks in enumerate(r.outputs):
        j = i % len(encoded)
        pos, gap = ex.first_divergence(pair.target, encoded[j], toks, reference[j])
        assert ex.excused(pos, gap), f"{r.method}, B={r.B}, row {i}: diverges at token {pos} (top-2 gap {gap})"
        checked += 1
        if pos is not None:
            ties.append((r.method, r.B, i, pos, gap))
print(f"{checked} rows equal autoregressive decoding" + (f"; near-ties: {ties}" if ties else ""))

# %% [markdown]
# ## Throughput against batch size
# Total tokens per second of the whole batch, median over the repeats with the interquartile range as the
# error bar. Batch sizes are powers of two, so the axis is logarithmic.

# %%
fig, ax = plt.subplots(figsize=(7, 4))
batched = runs[~runs.method.str.startswith("generate")]
sns.lineplot(data=batched, x="B", y="tokens_per_s", hue="method", estimator="median",
             errorbar=("pi", 50), marker="o", ax=ax)
ax.set(xscale="log", xlabel="batch size B", ylabel="tokens/s, all rows", title="throughput against batch size")
ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
ax.xaxis.set_minor_locator(plt.NullLocator())
ch.savefig(fig, "throughput_vs_batch")

# %% [markdown]
# Up to three numbers of this run decide whether batching works here at all: the batch path at B = 1 against
# the single-sequence decoder (the cost of the per-row bookkeeping and the 4D mask), and, when B = `check_batch` (8)
# ran, autoregressive decoding at that B against B = 1 and against the same requests served one at a time (what
# a batch buys before any speculation). Tokens per second count every token of every row over the whole call,
# prefill included; the decode loop alone (the tokens after each row's first, over the time after the prefill)
# is printed beside them, so the prefill's share of each ratio can be read off.

# %%
def paired(a: str, b: str, Ba: int, Bb: int, col: str = "tokens_per_s") -> pd.Series:
    """``col`` (tokens/s) of (a, Ba) ÷ (b, Bb), paired by repeat."""
    x = runs[(runs.method == a) & (runs.B == Ba)].set_index("repeat")[col]
    y = runs[(runs.method == b) & (runs.B == Bb)].set_index("repeat")[col]
    return (x / y).dropna()


checks = {"batch path ÷ generate, B = 1": ("autoregressive", "generate (one sequence)", 1, 1)}
if check_batch in batch_sizes:
    checks[f"autoregressive B = {check_batch} ÷ B = 1"] = ("autoregressive", "autoregressive", check_batch, 1)
    checks[f"autoregressive B = {check_batch} ÷ the same {check_batch} requests one at a time"] = (
        "autoregressive", "generate, one request at a time", check_batch, check_batch)
display(Markdown("\n".join(f"- {name}: {report.ratio_phrase(paired(*c))}; decode loop alone "
                            f"{report.ratio_phrase(paired(*c, col='decode_tokens_per_s'))}"
                            for name, c in checks.items())))

# %% [markdown]
# ## Where speculation stops paying: measured and predicted
# Measured: the speedup of each speculative method over autoregressive decoding *at the same B*, paired by
# repeat. Predicted: from single-sequence pass costs alone. Autoregressive decoding spends one pass over B
# tokens, t(B), per B tokens. A speculative step spends K draft passes over B tokens, t_d(B) (nothing for
# prompt lookup), and one verify pass over B·f(B) tokens, and yields τ(B) tokens per row. f(B) ≤ K + 1 is a row's
# mean feed, its last token and the draft its drafter found: the batch packs the rows' feeds into one sequence
# (the engine's packed pass, in the section on continuous batching), so a row whose prompt lookup found nothing
# adds one token, not K + 1; a model draft always drafts K. f(B) and τ(B) are taken from
# the runs above at that B (a row decodes exactly as its prompt would alone, so B changes τ only through which
# prompts its batches hold: B = 1 decodes the first prompt, larger batches the first B, cycling):
#
# $$\text{speedup}(B) = \frac{\tau(B) \, t(B)}{K\, t_d(B) + t\big(B f(B)\big)}
#   = \frac{\tau(B)}{v(B) + d(B)}, \qquad v(B) = \frac{t\big(B f(B)\big)}{t(B)}, \quad d(B) = \frac{K\, t_d(B)}{t(B)}$$
#
# The second form counts the step's cost in autoregressive steps *at the same B*: v(B) is the verify ratio, d(B)
# the draft's share (0 for prompt lookup). It says what moves the speedup along B: τ(B), and v(B) + d(B). While
# t(T) is flat (a pass over a few tokens costs about what a pass over one does), v(B) stays near 1 and speculation
# keeps what it had at B = 1; once B·f(B) tokens are past the knee of chapter 1 and B tokens are not, v(B)
# grows toward f(B) and the speedup falls. A fixed cost per pass that does not grow with its tokens (Python
# dispatch, small kernels) works the other way: it weighs less in a large pass, so v(B) and d(B) can also
# shrink as B grows. Which of the two happens is a property of the machine and the pair; the table gives τ(B),
# v(B), d(B) and the autoregressive decoder's cost per token t(B)/B as this run measured them.
# The crossover is the smallest B whose speedup falls below 1.

# %%
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
ch.save(speed, "speedup_vs_batch")
book.show(speed, "Speculation ÷ autoregressive decoding at the same B. measured: tokens/s of the whole call, "
          "paired by repeat, median and IQR (q25–q75) over n pairs; tau: tokens per row and target pass at that B; "
          "fed: tokens per row and verify pass (1 + its mean draft); verify_ratio = t(B·fed)/t(B) (between measured T, "
          "linear), draft_share = K·t_d(B)/t(B) and ar_ms_per_token = t(B)/B come from "
          "single-sequence pass costs (no prefill in them); predicted = tau ÷ (verify_ratio + draft_share).",
          prefill=True)

# %% [markdown]
# The figure sets the measured medians (with their interquartile ranges) beside the prediction; the dashed
# line is speedup 1, below which speculation loses.

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for i, (name, g) in enumerate(speed.groupby("method", sort=False)):
    ax.errorbar(g.B, g.measured, yerr=[g.measured - g.q25, g.q75 - g.measured], marker="o", capsize=3,
                color=f"C{i}", label=f"{name}: measured")
    ax.plot(g.B, g.predicted, ls=":", marker="x", color=f"C{i}", label=f"{name}: predicted")
ax.axhline(1, color="0.4", ls="--", lw=1)
ax.set(xscale="log", xlabel="batch size B", ylabel="speedup over autoregressive (same B)",
       title="speculation against batch size")
ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
ax.xaxis.set_minor_locator(plt.NullLocator())
ax.legend(fontsize=8)
ch.savefig(fig, "speedup_vs_batch")

# %%
lines = []
for name, g in speed.groupby("method", sort=False):
    m, p = sv.crossover(g.B, g.measured), sv.crossover(g.B, g.predicted)
    n_min = int(g.n.min())  # pairs at the B with fewest: what a statement about the crossover rests on

    def say(b):  # a crossover at the smallest B means speculation was below 1 from the start: say that
        if b is None:
            return f"none up to B = {max(batch_sizes)}"
        return f"none: below 1 already at B = {b}" if b == g.B.iloc[0] else f"B = {b}"
    m_never, p_never = (x is not None and x == g.B.iloc[0] for x in (m, p))  # never above 1: no crossover to compare
    if (m is None) != (p is None) or m_never != p_never:
        agree = report.judged("they disagree on whether speculation paid at all", n_min)
    elif m is None or m_never or m == p:
        agree = report.judged("they agree", n_min)
    else:  # name the batch size where the two part ways on whether speculation pays
        b = min(m, p)
        row = g.set_index("B").loc[b]
        agree = report.judged(f"the prediction crosses {'earlier' if p < m else 'later'}: at B = {b} it predicts "
                              f"{row.predicted:.3f}× where {row.measured:.3f}× was measured", n_min)
    lines.append(f"- **{name}** (K = {int(g.K.iloc[0])}, τ = {g.tau.iloc[0]:.2f} at B = {g.B.iloc[0]}): speedup at "
                 f"B = {g.B.iloc[0]}: "
                 f"{report.ratio_phrase_median(g.measured.iloc[0], g.q25.iloc[0], g.q75.iloc[0], n=int(g.n.iloc[0]))}, at B = "
                 f"{g.B.iloc[-1]}: {report.ratio_phrase_median(g.measured.iloc[-1], g.q25.iloc[-1], g.q75.iloc[-1], n=int(g.n.iloc[-1]))} "
                 f"(predicted {g.predicted.iloc[-1]:.2f}×). Crossover measured {say(m)}, predicted {say(p)}; "
                 f"whether they match: {agree}"
                 + ("; one pair per B, so the measured crossover is one noisy reading." if n_min < 2 else "."))
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## The trend in B, and why
# The crossover reads one B at a time. The trend reads them all: does speculation's ratio over autoregressive
# decoding fall as B grows (the premise above: the verify pass stops being nearly free), rise, or neither? The
# direction comes from Spearman's rank correlation between B and every paired ratio of the run, its p-value from
# permutations (`study.serving.rank_trend`: exact over every distinct arrangement of the ratios against the batch
# sizes when they can be counted, else seeded draws; a direction is named only when p is under `trend_p`, and
# only for a sample the verdict rule allows), and the ends are
# set side by side with their interquartile ranges. The why is the cost model's decomposition above, between the
# smallest and the largest B: how much τ(B) moved (the batches hold different prompts), how much the step's cost
# in autoregressive steps v(B) + d(B) moved, and how cheap a token of autoregressive decoding became, t(B)/B.

# %%
def iqr_text(r) -> str:
    """A measured ratio with its IQR (none for a single pair)."""
    spread = f"IQR {r.q25:.2f}–{r.q75:.2f}, " if r.n > 1 else ""
    return f"{r.measured:.2f}× ({spread}{report.count(r.n, 'pair')})"


trend_rows, trend_lines = [], []
for name, k in K.items():
    pairs = pd.concat([paired(name, "autoregressive", B, B).rename(B) for B in batch_sizes], axis=1).melt(
        var_name="B", value_name="ratio").dropna()
    n = len(pairs)
    tr = sv.rank_trend(pairs.B.to_numpy(), pairs.ratio.to_numpy())  # a permutation p, exact where countable
    rho, pval = tr["rho"], tr["p"]
    word = ("rising" if rho > 0 else "falling") if pval < trend_p else f"no direction (p ≥ {trend_p:g})"
    g = speed[speed.method == name].set_index("B")
    lo, hi = g.loc[min(batch_sizes)], g.loc[max(batch_sizes)]
    ends = ("one pair at an end, so no interval to compare" if min(lo.n, hi.n) < 2 else "the two IQRs: " + report.judged(
        "disjoint" if hi.q25 > lo.q75 or hi.q75 < lo.q25 else "overlapping", min(int(lo.n), int(hi.n))))
    cost_lo, cost_hi = lo.verify_ratio + lo.draft_share, hi.verify_ratio + hi.draft_share
    f_tau, f_cost = hi.tau / lo.tau, cost_hi / cost_lo
    larger = "the step's cost" if abs(np.log(f_cost)) > abs(np.log(f_tau)) else "τ"
    same_way = np.sign(hi.predicted - lo.predicted) == np.sign(hi.measured - lo.measured)
    trend_rows.append(dict(method=name, pairs=n, spearman_rho=rho, p_value=pval, p_method=tr["p_method"],
                           ratio_B_min=lo.measured, ratio_B_max=hi.measured, tau_factor=f_tau, cost_factor=f_cost,
                           predicted_B_min=lo.predicted, predicted_B_max=hi.predicted))
    trend_lines.append(
        f"- **Trend, {name}**: the ratio's direction in B: {report.judged(word, n)} (Spearman ρ = {rho:.2f}, "
        f"p = {pval:.2g}, {tr['p_method']}, over {report.count(n, 'pair')}); from {iqr_text(lo)} at B = {lo.name} "
        f"to {iqr_text(hi)} at B = {hi.name}, {ends}. Why, from the pass costs: the step costs {cost_lo:.2f} autoregressive steps at B = {lo.name} "
        f"and {cost_hi:.2f} at B = {hi.name} (verify ratio {lo.verify_ratio:.2f} → {hi.verify_ratio:.2f}"
        + (f", draft share {lo.draft_share:.2f} → {hi.draft_share:.2f}" if "model" in name else "")
        + f"), τ goes {lo.tau:.2f} → {hi.tau:.2f}, so the cost model moves the ratio ×{f_tau / f_cost:.2f} "
        f"({lo.predicted:.2f}× → {hi.predicted:.2f}×), mostly through {larger}; the measured ratio moved "
        f"×{hi.measured / lo.measured:.2f}, its direction against the prediction's: "
        + report.judged("the same" if same_way else "opposite", min(int(lo.n), int(hi.n)))
        + f". Meanwhile a token of autoregressive decoding costs {lo.ar_ms_per_token:.1f} ms of pass time at "
        f"B = {lo.name} and {hi.ar_ms_per_token:.1f} ms at B = {hi.name}: the baseline speculation must beat.")
trend = pd.DataFrame(trend_rows)
ch.save(trend, "trend_vs_batch")
display(Markdown("\n".join(trend_lines)))

# %% [markdown]
# ## Latency per request
# Batching can buy throughput with latency: every request waits for the batch's passes, and a pass over B rows
# costs more than a one-row pass once B is past the knee of chapter 1. The median time at which a row's last
# token was known, per method and B (the table under the figure):

# %%
fig, ax = plt.subplots(figsize=(7, 4))
sns.lineplot(data=batched, x="B", y="latency_s", hue="method", estimator="median", errorbar=("pi", 50),
             marker="o", ax=ax)
ax.set(xscale="log", xlabel="batch size B", ylabel="seconds to the last token (median row)",
       title="per-request latency against batch size")
ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
ax.xaxis.set_minor_locator(plt.NullLocator())
ch.savefig(fig, "latency_vs_batch")
book.show(batched.groupby(["method", "B"]).latency_s.median().unstack("B"),
          "Seconds from the call's start to a row's last token, median row and repeat, per method (rows) and batch "
          "size B (columns).", prefill=True, digits=2)

# %% [markdown]
# ## Streaming: what the reader sees
# One request at a time, through `sd.stream` (the decode loop is a generator of steps: each step yields
# the tokens it committed), timed as a reader receives them: the synchronized timer is read just before the call
# and at each yield, and that reading stamps every token the yield carried. Time to first token is the prefill
# (the target's, and with a model drafter the draft's too; it varies more from prompt to prompt than from method
# to method). After it, the per-token latency shares a step's gap among the tokens it revealed; the per-chunk
# latency counts one gap per step, as a server that times its stream chunks would.

# %%
stream_rows, arrivals = [], []
timer = pf.Timer(pair.target.device)
for name in ("autoregressive", "linear, n-gram", "linear, model draft"):
    kw = {key: v for key, v in methods[name].items()}
    for j, ids in enumerate(encoded[:stream_prompts]):
        received, t0 = [], timer.now()  # seconds from the request to each token's arrival at the reader
        for new in sd.stream(pair.target, ids, max_new_tokens=max_new_tokens, **kw):
            received += [timer.now() - t0] * len(new)
        stream_rows.append(dict(method=name, prompt=j, **sv.chunk_latencies(received)))
        if j == 0:
            arrivals += [dict(method=name, token=i + 1, seconds=t) for i, t in enumerate(received)]
stream = pd.DataFrame(stream_rows)
ch.save(stream, "streaming_latency")
book.show(stream.groupby("method", sort=False).median(numeric_only=True).drop(columns=["prompt", "ttft_ms"]),
          f"Streaming one request at a time: tokens, chunks (steps that revealed tokens) and inter-token latency "
          f"percentiles in ms, per token and per chunk, median over {report.count(stream_prompts, 'prompt')} (the "
          f"time to first token, the prefill, is in the lines below).", prefill=False, digits=1)

# %% [markdown]
# The arrival pattern of the first prompt's answer: autoregressive tokens arrive one per pass, speculative
# ones in a burst whenever a verify pass accepts drafts (the table above counts chunks against tokens).

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for i, (name, g) in enumerate(pd.DataFrame(arrivals).groupby("method", sort=False)):
    ax.step(g.seconds, g.token, where="post", color=f"C{i}", label=name)
    ax.plot(g.seconds, g.token, ".", color=f"C{i}", ms=4)
ax.set(xlabel="seconds since the request", ylabel="tokens received", title="when the tokens arrive (prompt 0)")
ax.legend(fontsize=8)
ch.savefig(fig, "arrivals")

# %%
med = stream.groupby("method", sort=False).median(numeric_only=True)
display(Markdown("\n".join(
    f"- **{name}**: {int(r.tokens)} tokens in {int(r.chunks)} chunks; time to first token {r.ttft_ms:.0f} ms; "
    f"inter-token latency p50 / p90 / p99 {r.token_p50_ms:.0f} / {r.token_p90_ms:.0f} / {r.token_p99_ms:.0f} ms "
    f"per token, {r.chunk_p50_ms:.0f} / {r.chunk_p90_ms:.0f} / {r.chunk_p99_ms:.0f} ms per chunk"
    for name, r in med.iterrows())))

# %% [markdown]
# ## Continuous batching under load
# The batches above start together and run until their last row ends. A server's requests arrive, wait, join
# a running batch and leave when they are done: `sd.serving.Engine` schedules at the iteration level, as Orca and
# vLLM do. Each step it retires finished rows, admits the requests that have arrived (each prefilled alone, then
# placed into a free row of one preallocated cache), drafts every row with the row's own method, drafter and K,
# verifies all rows in **one** target pass, and accepts each row with the core's own rule
# (`specdec_core/serving/engine.py` maps each piece onto vLLM's scheduler). Every token is stamped with its time
# since the request's *arrival*, so the time to first token includes the wait for a row.
#
# The verify pass is *packed*, as vLLM flattens its batch (the lockstep batches above ran on the same engine): the
# rows' feeds (each row's last token and its draft) run back to back as one sequence, each token written at its own
# row of the cache and attending only that row. Padded to the longest feed, one row drafting 16 tokens would make
# seven rows of one token cost 8 × 17 slots; packed, that step is a pass over 24 tokens. Packing is what lets each row have its
# own K: a row whose draft is nearly sure can draft far while its neighbours draft little or nothing, and only the
# drafted tokens are paid for. The step-cost model prices a packed step over n rows and N tokens as
# t(n, N / n), the measured pass over n rows of N / n tokens each on average. It is timed as the engine runs it:
# packed, the rows feeding different counts (1 and 2T − 1 in turn), since a packed pass need not cost what a
# padded one of the same tokens does (the rows kernel attends a packed pass in one call, torch's attention takes
# its longer rows one call each), and after as many committed tokens as the mix's requests typically hold, since
# each drafted token attends all of them. A row allowed K tokens feeds only those its drafter proposes: a model
# draft all K, prompt lookup or the suffix drafter only where they find a match, so the model prices a row's K by
# the tokens it is expected to feed (how often each position was filled so far), not by K. Where it need not guess,
# it does not: a drafter without a model costs microseconds to ask, so an adaptive row's is asked for its longest
# draft before K is chosen (the engine then cuts the draft to K, which stays exact: each of its tokens depends on the
# committed context alone), and the row's feed is known.
# A lookup that matches proposes all of its K and one that does not proposes nothing; where each token added to a
# pass costs more than the last (a CPU past its knee), the time of the mean feed is below the mean time, so a step is
# priced at its expected time over what the rows may feed.
#
# Load is a fraction of autoregressive decoding's saturation throughput (every request waiting at t = 0); each load
# draws one Poisson schedule (`sd.serving.arrivals`, vLLM's draws), replayed for every policy on the same requests: a
# traffic mix of chat prompts and input-grounded ones (chapter 11's family; `engine_share` of them). The policies:
# autoregressive; prompt lookup at chapter 6's K; the suffix drafter capped at `k_suffix` (no memory across
# requests: every policy and round replays the same requests); *per class* (suffix for input-grounded requests,
# prompt lookup for chat, chosen from what is known before decoding); and *load-adaptive*, the same drafters with
# `k="adaptive"`: each step the engine chooses each adaptive row's own K, 0 included, from a step-cost model
# t(rows, tokens) measured first, each row's running acceptance at each draft position (its recent steps weighing
# more, since a request's acceptance drifts as it decodes: prompt lookup finds more of an answer that repeats
# itself, copies come in spans; a row with few steps yet borrows from the live rows of its own drafter, since a chat
# row's prompt lookup says little of a grounded row's copies),
# and the drafters' running time per drafted token (SmartSpec's rule with a K per row,
# `sd.serving.StepCost.best_ks`). What it maximizes is
# not the batch's tokens per second, SmartSpec's objective, but the product of the rows' expected rates: the lowest
# geometric mean of the rows' times per token. Goodput counts requests, each once, whether its TPOT meets the SLO;
# tokens per second count a row that adds 17 tokens 17 times, and buy its span with a longer step that every row
# waits for. So a row drafts only while its own relative gain outweighs the relative delay of all the rows sharing
# the step (`StepCost(objective="throughput")` is SmartSpec's rule; with one row the two are the same), but for
# one floor: a row that holds a proposal verifies at least its first token (`StepCost.HELD_FLOOR`). That is a rule,
# not a consequence of the objective: a per-step objective weighs one token's delay to every row of the step, while
# an SLO counts a request once, and at a full batch the objective alone often refuses a short match (the last
# exercise measures the floor's worth on your machine). The
# adaptive rows do not speculate on the step right after an admission: the rows decoding then have just waited for
# a prefill, so their gap is already the longest. The measures are vLLM's (`specdec_core/serving/metrics.py`):
# TTFT, TPOT = (E2E − TTFT)/(tokens − 1), per-token ITL (a step's gap shared among its tokens), E2E, and goodput,
# the requests per second that met every SLO.

# %%
from specdec_core.serving import StepCost
from specdec_core.study import load as ld

grounded_ids = [sd.prompts.encode(pair, p) for p in sd.prompts.load_grounded("eval", per_task=3)]
mix = sd.prompts.traffic_mix([("chat", ids) for ids in encoded], [("grounded", ids) for ids in grounded_ids],
                             engine_share, engine_requests, seed=0)
step_context = StepCost.typical_context(pair.target, [(len(ids), engine_max_new_tokens) for _, ids in mix])
step_cost = StepCost.measure(pair.target, max_rows=engine_max_batch, context=step_context)
sc = pd.Series(step_cost.verify).unstack()
ch.save(sc.rename_axis(index="rows", columns="tokens").reset_index(), "step_costs")
book.show(sc / step_cost.t(1, 1), f"The step-cost model: a verify pass over B rows (rows) of T tokens each on average "
          f"(columns; rows of 1 and 2T − 1 tokens in turn, packed), in one-row one-token passes, timed here after "
          f"{step_context} committed tokens (the mix's median prompt and half answer).", prefill=False, digits=2)

policies = ld.traffic_policies(pair.drafters["ngram"], sd.SuffixDrafter(learn=False), k_ngram, k_suffix)
saturation = ld.saturation(pair.target, mix, engine_max_batch, engine_max_new_tokens)
engine_rounds = engine_repeats if isinstance(engine_repeats, list) else [engine_repeats] * len(engine_loads)
load_runs = ld.load_sweep(pair.target, mix, policies, engine_loads, saturation, engine_max_batch,
                          engine_max_new_tokens, repeats=engine_repeats, step_cost=step_cost, progress=book.progress)
n_classes = pd.Series([c for c, _ in mix]).value_counts().to_dict()
print(f"{len(mix)} requests ({', '.join(f'{n} {c}' for c, n in n_classes.items())}); autoregressive saturation "
      f"{saturation:.2f} requests/s at {engine_max_batch} rows; loads {engine_loads} of it")

# %% [markdown]
# Every request of every policy and load is compared with `sd.generate` on its prompt alone, greedy, whatever its
# neighbours and arrival (a float32 divergence excused only at a near-tie, as above):

# %%
engine_ties = ld.greedy_identity(pair.target, mix, load_runs, engine_max_new_tokens)
identity_line = (f"{len(load_runs)} requests ({len(policies)} policies × {len(mix)} requests × "
                 f"{sum(engine_rounds)} rounds over {report.count(len(engine_loads), 'load')}) "
                 f"decoded the text of `generate` alone" + (f"; near-ties excused: {len(engine_ties)}" if engine_ties else ""))
print(identity_line)

# %%
slo = ld.slo_from(load_runs, slo_ttft, slo_tpot)
load_table = ld.summary(load_runs, slo)
class_table = ld.summary(load_runs, slo, by=("policy", "load", "cls"))
ch.save(load_runs.drop(columns=["tokens", "itl"]), "load_runs")
ch.save(load_table, "load_summary")
ch.save(class_table, "load_summary_by_class")
book.show(load_table.set_index(["policy", "load"])[["request_rate", "tokens_per_s", "goodput", "ttft_p50_ms",
                                                    "tpot_p50_ms", "itl_p99_ms", "e2e_p99_ms"]],
          f"Each policy (rows) at each load (a fraction of autoregressive saturation): finished requests/s, tokens/s, "
          f"goodput (requests/s with TTFT ≤ {1e3 * slo['ttft']:.0f} ms and TPOT ≤ {1e3 * slo['tpot']:.1f} ms), and "
          f"latencies in ms (TTFT and E2E from each request's arrival); median over the rounds ("
          + ", ".join(f"{report.count(n, 'round')} at {x:g}" for x, n in zip(engine_loads, engine_rounds)) + ").",
          prefill=True, digits=2)

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, (col, label) in zip(axes, (("goodput", "goodput (requests/s within SLO)"), ("itl_p99_ms", "p99 per-token ITL (ms)"))):
    sns.lineplot(data=load_table, x="load", y=col, hue="policy", marker="o", ax=ax)
    ax.set(xlabel="load (fraction of autoregressive saturation)", ylabel=label)
axes[1].get_legend().remove()
fig.suptitle("serving a traffic mix under load")
ch.savefig(fig, "load_sweep")

# %% [markdown]
# Per class: what each policy gives the requests it helps, and what it costs the ones it does not (median TPOT and
# E2E in ms):

# %%
book.show(class_table.pivot_table(index=["cls", "policy"], columns="load", values="tpot_p50_ms"),
          "Median TPOT (ms) per request class and policy (rows) at each load (columns).", prefill=False, digits=1)

k_tab = ld.k_table(load_runs, "load-adaptive")
ch.save(k_tab, "k_by_batch_size")
display(Markdown("*The K the load-adaptive policy chose, per batch size (live rows of the step): steps, median and "
                 "mean K, and the share of steps that did not speculate.*"))
display(report.shown(k_tab.set_index("batch_size"), 2))
vllm_k = ld.vllm_k_setting(k_tab)
print(f"num_speculative_tokens_per_batch_size = {vllm_k}  # vLLM's batch-size table for this pair and machine")

# %% [markdown]
# Does choosing K from the load keep the best of both? At each load, the load-adaptive policy's goodput divided by
# each other policy's, pooled over rounds, with a 90 % bootstrap interval (the requests of a round resampled, the
# same draw for both policies: they served the same requests on the same schedule). It should keep at least 0.95 of
# every other policy's goodput and all of autoregressive decoding's; the verdict says whether the interval
# decides that (`holds`, `fails`) or not (`undecided`). The two latency questions below, TPOT at the lightest load
# against autoregressive decoding (goal 1.5×) and against the fixed policy fastest on the chat requests (goal 0.95),
# get the same paired interval (`ld.tpot_ratio`). The fastest fixed policy is picked on the same run, so the chat
# comparison leans against load-adaptive.

# %%
verdicts = ld.goodput_verdicts(load_runs, slo)
ch.save(verdicts, "goodput_verdicts")
book.show(verdicts.set_index(["load", "other"])[["goal", "policy_goodput", "other_goodput", "ratio", "lo", "hi",
                                                 "requests", "policy_met", "other_met", "verdict"]],
          "Load-adaptive goodput ÷ each other policy's (rows) at each load: requests/s within SLO of both, the ratio "
          "and its 90 % paired bootstrap interval (lo–hi) over the requests, how many of them met every SLO under "
          "each (policy_met: load-adaptive), and the verdict against the goal.", prefill=True, digits=2)

# %%
g = load_table.set_index(["policy", "load"])
engine_lines = [f"- **Continuous batching**: {identity_line}."]
for load, base, best in ld.against(verdicts):
    engine_lines.append(
        f"- Load {load:g}: load-adaptive goodput {base.policy_goodput:.2f} requests/s; ÷ autoregressive "
        f"{base.ratio:.2f} ({base.lo:.2f}–{base.hi:.2f}: {base.verdict} at ≥ 1), ÷ the best other policy "
        f"({best.other}, {best.other_goodput:.2f}) {best.ratio:.2f} ({best.lo:.2f}–{best.hi:.2f}: {best.verdict} at "
        f"≥ {best.goal:g}); over {report.count(int(best.requests), 'request')} per policy, of which "
        f"{base.policy_met} met every SLO under load-adaptive, {base.other_met} under autoregressive decoding and "
        f"{best.other_met} under {best.other}.")
low, high = min(engine_loads), max(engine_loads)
tp = ld.tpot_ratio(load_runs, low, "load-adaptive", "autoregressive", goal=1.5)
engine_lines.append(
    f"- At load {low:g}, median TPOT: load-adaptive {g.loc[('load-adaptive', low), 'tpot_p50_ms']:.1f} ms against "
    f"autoregressive {g.loc[('autoregressive', low), 'tpot_p50_ms']:.1f} ms (per round; pooled over the rounds "
    f"{tp['ratio']:.2f}× better, {tp['lo']:.2f}–{tp['hi']:.2f} over {report.count(tp['requests'], 'request')}: "
    f"{tp['verdict']} at ≥ 1.5); at load {high:g}, p99 per-token ITL {g.loc[('load-adaptive', high), 'itl_p99_ms']:.1f} "
    f"ms against {g.loc[('autoregressive', high), 'itl_p99_ms']:.1f} ms.")
oracle = ld.best_per_request(load_runs, low)
engine_lines.append(
    f"- The most choosing among these policies could give at load {low:g}: each request's lowest TPOT over all "
    f"{len(policies)} policies, median {1e3 * oracle.median():.1f} ms, "
    f"{g.loc[('autoregressive', low), 'tpot_p50_ms'] / (1e3 * oracle.median()):.2f}× better than autoregressive "
    f"decoding's median.")
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
        f"- Chat requests at load {low:g} (mean live rows {rows_seen:.1f}): load-adaptive median TPOT "
        f"{chat_ratio:.2f}× better than autoregressive; the best single method at B = 1 above ({best_name}, decode "
        f"loop alone) {best_b1:.2f}×, so load-adaptive keeps {chat_ratio / best_b1:.3f} of it.")
    # the same question side by side: the fixed policies served these chat requests on the same schedules
    fixed = [p for p in policies if p not in ("autoregressive", "load-adaptive", "per class")]
    best_fixed = min(fixed, key=lambda p: chat.loc[p, "tpot_p50_ms"])
    kept = ld.tpot_ratio(load_runs, low, "load-adaptive", best_fixed, cls="chat", goal=0.95)
    engine_lines.append(
        f"- Side by side on the same chat requests and schedules at load {low:g}, against the fixed policy fastest on "
        f"them ({best_fixed}): load-adaptive keeps {kept['ratio']:.3f} of its speed per token (median TPOT ratio "
        f"pooled over the rounds, {kept['lo']:.2f}–{kept['hi']:.2f} over {report.count(kept['requests'], 'request')}: "
        f"{kept['verdict']} at ≥ 0.95).")
for p in [p for p in policies if p not in ("autoregressive", "load-adaptive")]:
    x = ld.crossover(load_table, p)
    engine_lines.append(f"- {p}: goodput below autoregressive decoding's "
                        + (f"from load {x:g}." if x is not None else "at no load of the sweep."))
display(Markdown("\n".join(engine_lines)))

# %% [markdown]
# ## Summary
# What this run measured (every number above comes from it; the reference run on the book's 2-core CPU
# is in `data/reference/book/09_serving/`):

# %%
summary = [f"- All {checked} rows ({'; '.join(f'{m}: {n}' for m, n in by_method.items())}) decoded the autoregressive text"
           + (f" (near-ties excused: {len(ties)})." if ties else ".")]
summary += [f"- {name}: {report.ratio_phrase(paired(*c))}; the decode loop alone "
            f"{report.ratio_phrase(paired(*c, col='decode_tokens_per_s'))}." for name, c in checks.items()]
summary += lines + trend_lines + engine_lines
summary += [f"- **Streaming, {name}** ({'medians over ' + str(stream_prompts) + ' prompts' if stream_prompts > 1 else 'one prompt'}): {int(r.tokens)} tokens in {int(r.chunks)} "
            f"chunks; per-token p50 {r.token_p50_ms:.0f} ms (autoregressive {med.loc['autoregressive', 'token_p50_ms']:.0f}), "
            f"per-chunk p50 {r.chunk_p50_ms:.0f} ms." for name, r in med.iterrows() if name != "autoregressive"]
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
# 7. The floor: serve the sweep's highest load again with a load-adaptive policy whose cost model has no floor (a
#    subclass of `StepCost` with `HELD_FLOOR = 0`, passed as `step_cost`, beside the default on the same schedules)
#    and compare goodput with `ld.goodput_verdicts`. Which class of requests gains or loses, and at how many live rows
#    does the floor bind (the steps where a row holding a proposal would otherwise take K = 0)?
# 8. Tiles: chapter 1's rows kernel multiplies up to `kernels.load().ROWS_PER_TILE` token rows (14 with AVX-512) in
#    one sweep over a block of weights, so a pass over one token more than a tile sweeps them twice. Time
#    `BatchLM.verify` over 8 rows feeding 8 to 48 tokens in all: where does the time jump, and how far does the
#    step-cost model's linear interpolation between its measured T miss it? Give the model the tile boundaries (a
#    `StepCost` whose `t` interpolates in total tokens) and serve the highest load with both, as in exercise 7. (Where
#    the target runs through torch, chapter 1's line says so, look for the steps of the library's own kernels.)
