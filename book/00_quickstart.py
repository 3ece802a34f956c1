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
# # 0 · The whole idea in one picture
#
# **The question.** Why does a language model write one token at a time, and how can a small draft model
# make it faster without changing a single token?
#
# **The answer.** Each new token costs one full pass of the model, and that pass reads every weight.
# A draft model guesses a few tokens ahead, cheaply. The real model, the *target*, then checks all the
# guesses in one pass. It keeps the guesses it agrees with and adds one token of its own. With greedy
# decoding the output is identical, token for token. Whether this is faster depends on two numbers: how often
# the draft is right, and what a guess costs. This chapter runs both loops on one real prompt and shows
# each step.
#
# Think of a scout and a traveller crossing a river on stepping stones. The scout runs ahead and points at
# the next few stones. The traveller tests them all at once, walks as far as the scout was right, and
# takes one step of their own choosing. The traveller never steps on a stone they would not have chosen alone.
# The symbols the book uses for all this are collected on the [notation page](notation.md).

# %% tags=["parameters"]
model = "smollm2-135m"   # embedded name, Hugging Face id, or local path
draft = None             # a draft model's Hugging Face id or folder (None: the target's shipped drafts)
prompt = "Explain in two sentences why the sky is blue."
max_new_tokens = 96      # tokens to decode
k = 4                    # draft tokens per step (the book's usual K)
shown_steps = 6          # steps drawn token by token
temperature = 0.0        # 0 means greedy (the Going deeper section's generate call)
device = "cpu"           # "cpu", "cuda" or "auto"
dtype = "float32"        # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
out_dir = "../build/book/00_quickstart"  # figures and tables land here
params_name = None       # the parameter file's name, injected by scripts/run_book.py (banner)

# %% tags=["hide-input"]
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import display

import specdec_core as sd
from specdec_core.decode import eos_ids
from specdec_core.lm import CachedLM
from specdec_core.sampling import SamplingParams
from specdec_core.tools import book
from specdec_core.verify import greedy_accept

display(book.banner(params_name))
ch = book.setup(out_dir, model, draft=draft, device=device, dtype=dtype)
pair, out = ch.pair, ch.out
# the draft model; a pair without one drafts by prompt lookup (n-gram), which needs no model
drafter_name = "model" if "model" in pair.drafters else "ngram"
target, draft_model = pair.target, pair.drafters[drafter_name]
ids = pair.encode_chat(prompt)
eos = eos_ids(target)  # the end-of-text token(s): decoding stops there, as generate does


def through_eos(tokens):
    """The tokens up to and including the first end-of-text token."""
    ends = [i for i, t in enumerate(tokens) if t in eos]
    return tokens[:ends[0] + 1] if ends else tokens


print(ch)
print(f"{ids.numel()} prompt tokens: {prompt!r}")

# %% [markdown]
# The book's target is **SmolLM2-135M-Instruct**, a small chat model whose weights ship inside a Python
# package. Its draft is a two-layer model that this project trained to imitate it. Both run on this CPU.
#
# ## One token at a time
#
# Here is plain decoding, written with the library's `CachedLM`: a model bound to its key–value cache, which
# remembers the tokens already seen. The first pass reads the whole prompt. Every later pass reads one token
# and yields the next one. Greedy decoding picks the most likely token each time.

# %%
def autoregressive(prompt, n):
    lm = CachedLM(target, prompt.numel() + n)
    out = [int(lm.forward(prompt)[-1].argmax())]          # prefill: the whole prompt, one pass
    while len(out) < n and out[-1] not in eos:            # until n tokens, or the end-of-text token
        logits = lm.forward(torch.tensor(out[-1:]))          # one pass over one token ...
        out.append(int(logits[-1].argmax()))                 # ... gives one new token
    return out

# %% [markdown]
# ## Guess, then check
#
# The speculative loop adds a draft. Each step has four phases, and every method in the book has the same
# four: **draft** K tokens with the small model; **verify** them in one target pass over K + 1 tokens;
# **accept** the longest prefix the target agrees with, plus the target's own next token; **commit**, that is,
# forget what was rejected. K is the draft length, here 4.

# %%
def speculative(prompt, n, k):
    lm = CachedLM(target, prompt.numel() + n + k)
    draft = draft_model
    draft.reset(prompt, prompt.numel() + n + k)
    out = [int(lm.forward(prompt)[-1].argmax())]               # prefill, as before
    steps = []
    while len(out) < n and not eos.intersection(out):
        seq = prompt.tolist() + out
        guess = draft.propose(seq, k, SamplingParams(), None)     # 1. draft: k cheap guesses
        t_verify = time.perf_counter()
        feed = torch.cat([torch.tensor(out[-1:]), guess.tokens])
        logits = lm.forward(feed)                                 # 2. verify: one pass over k + 1 tokens
        new, kept = greedy_accept(guess.tokens, logits.argmax(-1))  # 3. accept: agreeing prefix + one token
        lm.cache.rollback(guess.tokens.numel() - kept)            # 4. commit: forget the rejected guesses
        draft.accept(guess, kept)
        out += new.tolist()
        steps.append(dict(context=seq, drafted=guess.tokens.tolist(), accepted=kept, target=int(new[-1]),
                          t_verify=t_verify, t_end=time.perf_counter()))
    return through_eos(out[:n]), steps

# %% [markdown]
# Both loops run on the same prompt. Each is timed pass by pass, so we can draw them later. The check under
# them is the book's first promise: the two outputs are the same tokens.

# %% tags=["hide-input"]
def timed(fn, *args):
    """Run fn, recording when each target or draft pass started and ended (for the timeline)."""
    passes = []
    real_forward = CachedLM.forward

    def forward(self, tokens, *a, **kw):
        t0 = time.perf_counter()
        result = real_forward(self, tokens, *a, **kw)
        passes.append(dict(model="target" if self.model is target else "draft", tokens=tokens.numel(),
                           start=t0, end=time.perf_counter()))
        return result
    CachedLM.forward = forward
    try:
        t0 = time.perf_counter()
        result = fn(*args)
    finally:
        CachedLM.forward = real_forward
    frame = pd.DataFrame(passes)
    frame[["start", "end"]] = (frame[["start", "end"]] - t0) * 1e3
    return result, frame


autoregressive(ids, 2), speculative(ids, 2, k)  # warm-up: the first passes of a process are slow
plain, ar_passes = timed(autoregressive, ids, max_new_tokens)
(guessed, steps), sd_passes = timed(speculative, ids, max_new_tokens, k)
assert guessed == plain, "greedy speculative decoding must give the autoregressive tokens"
print(pair.tokenizer.decode(plain))
print(f"\nSame {len(plain)} tokens both ways: {guessed == plain}.")

# %% [markdown]
# ## What the draft proposed, step by step
#
# Each row below is one step. Grey text is what came before. Coloured tokens are the draft's four guesses and
# the target's verdict on each. The token in brackets is the target's own. Every step adds at least that one
# token, so a step never does worse than plain decoding in tokens, only in time.

# %% tags=["hide-input"]
display(book.steps_table(pair.tokenizer, steps[:shown_steps]))
kept = np.array([s["accepted"] for s in steps])
print(f"Over all {len(steps)} steps, the target kept {kept.mean():.2f} of {k} guesses on average, "
      f"so a step added {kept.mean() + 1:.2f} tokens.")
print(f"Every guess kept: {(kept == k).sum()} steps. None kept: {(kept == 0).sum()} steps.")

# %% [markdown]
# ## The timeline: one pass per token, against guess-then-check
#
# The figure draws every model pass of the two runs above on one time axis. The top lane is plain decoding:
# one target pass per token. The bottom lane is speculative decoding: a few short draft passes, then one
# target pass that checks them all.

# %% tags=["hide-input"]
lanes = {"one token at a time": ar_passes, "guess, then check": sd_passes}
colours = {"target": "C0", "draft": "C1"}  # the first two colours of the book's colour-blind palette
fig, ax = plt.subplots(figsize=(9, 2.8))
for y, (lane, frame) in enumerate(lanes.items()):
    for row in frame.itertuples():
        ax.barh(y, row.end - row.start, left=row.start, height=0.6, color=colours[row.model],
                edgecolor="white", linewidth=0.4)
    ax.text(frame.end.max(), y, f"  {len(plain)} tokens at {frame.end.max():.0f} ms", va="center", fontsize=9)
ax.set(yticks=range(len(lanes)), yticklabels=list(lanes), xlabel="time since the first pass (ms)",
       title="The same tokens, two ways: each box is one model pass")
ax.invert_yaxis()
ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()],
          labels=["target pass", "draft pass"], loc="upper right", bbox_to_anchor=(1, -0.35), ncol=2, frameon=False)
ax.set_xlim(0, max(f.end.max() for f in lanes.values()) * 1.25)
ch.savefig(fig, "timeline")
plt.show()

cost = pd.DataFrame([dict(lane=lane, model=m, passes=int((f.model == m).sum()),
                          median_ms=f.loc[f.model == m, "end"].sub(f.loc[f.model == m, "start"]).iloc[1:].median())
                     for lane, f in lanes.items() for m in ("target", "draft") if (f.model == m).any()])
ch.save(cost, "passes")
t_ar, t_sd = ar_passes.end.max(), sd_passes.end.max()
print(f"Plain decoding took {t_ar:.0f} ms and guess-then-check {t_sd:.0f} ms: a ratio of {t_ar / t_sd:.2f}.")
if (cost.model == "draft").any():
    c = cost.query("model == 'draft'").median_ms.iloc[0] / cost.query("lane == 'one token at a time'").median_ms.iloc[0]
    print(f"A draft pass cost {c:.2f} of a target pass (the book calls this c).")
else:
    print(f"The {drafter_name} drafter makes no model pass: its guesses cost almost no time.")
display(book.report.shown(cost.set_index(["lane", "model"]), 2))

# %% [markdown]
# The ratio above is one prompt, timed once: it is a picture, not a measurement. Two numbers decide the
# real speed-up. The first is the acceptance rate α: the fraction of tested guesses the target keeps. The
# second is the draft's cost c: one draft pass over one target pass. A step of K guesses costs about K·c + 1
# target passes and adds on average more than one token. Speculation pays when the tokens gained outweigh
# the K·c spent. Chapter 3 measures α and c; chapter 6 times every method on many prompts, with an interval.
#
# ## What "exact" means
#
# With greedy decoding, exact means the same tokens: the assert above checks it. With sampling, each token is
# random, so no two runs match. There, exact means the output follows the target's own probability law,
# whatever the draft proposed. The accept rule achieves this: it keeps a guess with probability min(1, p/q),
# where p is the target's probability of the guess and q the draft's. After a rejection it samples from the
# leftover part of p. [Chapter 2](02_exactness.ipynb) proves it, then tests it until a wrong rule would fail.
#
# ## The same in one call
#
# The library runs these four phases for every method. Two lines decode the prompt both ways:

# %%
ar = sd.generate(target, ids, max_new_tokens=max_new_tokens, temperature=temperature)
spec = sd.generate(target, ids, drafter=draft_model, method="linear", k=k, max_new_tokens=max_new_tokens,
                   temperature=temperature)

# %% tags=["hide-input"]
if temperature == 0:
    assert spec.tokens == ar.tokens == plain, "generate must give the hand loop's tokens"
print(f"α = {spec.stats['alpha']:.2f} (accepted ÷ tested guesses); "
      f"τ = {spec.stats['tau']:.2f} tokens per target pass, against 1 for plain decoding.")

# %% [markdown]
# τ, the tokens per target pass, is the number a speculative method raises. Plain decoding has τ = 1.
#
# ## Going deeper
#
# ### The stats record
# Every method returns the same record: the new tokens plus `stats`. For plain decoding there is one target
# pass per token, and the prefill pass yields the first one, so τ is 1. Rates over draft tokens (α) have no
# value without a draft: the table says so instead of printing NaN.

# %% tags=["hide-input"]
s = ar.stats
scalars = {name: v for name, v in s.items() if not isinstance(v, list)}
book.show(pd.Series({name: "— (no draft tokens)" if isinstance(v, float) and v != v else v
                     for name, v in scalars.items()}).to_frame("value"),
          "The stats record of plain decoding: seconds per phase, counts, and tokens_per_s = new tokens ÷ "
          "(prefill_s + decode_s).", prefill=True, digits=None)
assert s["target_passes"] == len(ar.tokens), "the baseline makes one pass per token"
assert s["tau"] == 1.0

# %% [markdown]
# ### Per-token latency
# `token_times` holds the moment each token became known. The first includes the prefill, one pass over the
# whole prompt: that is the time to first token (TTFT). The rest are one decode pass each. The figure plots
# each token's latency. A busy machine, or the first passes of a fresh process, scatter them.

# %% tags=["hide-input"]
times = np.asarray(s["token_times"])
lat = np.diff(np.concatenate([[0.0], times])) * 1e3
df = ch.save(pd.DataFrame({"token": np.arange(1, len(lat) + 1), "latency_ms": lat,
                           "kind": ["prefill (TTFT)"] + ["decode"] * (len(lat) - 1)}), "token_latency")
fig, ax = plt.subplots(figsize=(8, 3))
for kind, part in df.groupby("kind", sort=False):
    ax.scatter(part.token, part.latency_ms, s=18, label=kind)
ax.legend(title="kind")
ax.set(xlabel="generated token", ylabel="latency (ms)", title="One target pass per token, at a steady cost")
ch.savefig(fig, "token_latency")
plt.show()
decode = lat[1:]
print(f"TTFT {lat[0]:.1f} ms for {ids.numel()} prompt tokens.")
print(f"Decode: p50 {np.median(decode):.1f} ms, p95 {np.percentile(decode, 95):.1f} ms, "
      f"so {1e3 / np.median(decode):.1f} tokens/s.")
print(f"The prefill cost {lat[0] / np.median(decode):.1f} decode steps, "
      f"{lat[0] / np.median(decode) / ids.numel():.2f} of a step per prompt token.")
print(f"{int((decode > lat[0]).sum())} of {len(decode)} decode passes took longer than the prefill; "
      f"p95 / p50 = {np.percentile(decode, 95) / np.median(decode):.2f}.")
print(f"Mean speed over the call, prefill included: {len(lat) / times[-1]:.1f} tokens/s.")

# %% [markdown]
# If a pass were dominated by reading the weights, the prefill over the whole prompt would cost about one
# decode step. If it were dominated by arithmetic per token, it would cost about one step per prompt token.
# Where this machine sits between the two is what [chapter 1](01_bottleneck.ipynb) measures. Chapters 3–6
# rely on it when they spend one pass checking several guessed tokens.
#
# ## Summary
# - Plain decoding makes one target pass per token, and each pass reads every weight.
# - Speculative decoding repeats four phases: draft, verify, accept, commit.
# - One verify pass checks K guesses, keeps the agreeing prefix, and adds the target's own token.
# - Greedy speculative output equals plain output, token for token; sampled output follows the target's law.
# - `sd.generate(..., drafter=..., method="linear", k=4)` runs it; `stats` reports α and τ.
#
# ## Exercises
# 1. Set `temperature = 0.8` and re-run the `sd.generate` cell twice: is the output the same? Why (look at `seed`)?
# 2. Make the prompt 10× longer. How do TTFT and the decode latency change?
