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
# # 7 · The KV cache: memory, rollback, trees, and a run of rejections
#
# **The question.** A speculative step writes keys and values for tokens the target may reject. A tree step
# writes whole branches and keeps one. What does that ask of the KV cache, and what does it cost?
#
# **The answer.** Very little, when the cache is allocated once and only pointers move. Rolling back a rejected
# draft moves one pointer, so its cost does not grow with the number of positions dropped. A long run of
# rejections leaves the buffers where they are and memory flat. A tree borrows slots the cache already reserved.
# What does grow is memory itself: it is linear in context and batch. Past a crossover context, each pass reads
# more cache than weights. This run's numbers are in the summary at the end.
#
# In [chapter 0](00_quickstart.ipynb)'s picture of a step, the target checks the drafted tokens in one pass and
# keeps the ones it agrees with. This chapter follows the cache behind that picture.

# %% tags=["parameters"]
device = "cpu"            # "cpu", "cuda" or "auto"
dtype = "float32"
model = "smollm2-135m"    # the model whose cache is exercised
shapes = ["0.5b", "1b", "8b"]  # Llama shapes (profiling.LLAMA_SHAPES) sized from their configs only
context_lengths = [512, 2048, 8192, 32768, 131072]
batches = [1, 8, 32]
rollback_lengths = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]
base_length = 512         # committed positions left after each rollback
op_repeats = 30           # rounds timing the bare rollback (each round: 1000 rollbacks per length)
pass_repeats = 5          # rounds timing rollback + the next verification pass
k = 4                     # draft length of the verification passes
tree_sizes = [1, 8, 32, 64]
rejection_steps = 200     # steps of an always-rejected speculative loop
flat_tolerance = 0.2      # "flat": long rollbacks cost within this fraction of the median of short ones
noise_mb = 16.0           # memory in use may vary by this many MB without a leak (allocator, process) ...
noise_share = 0.1         # ... or by this share of the cache, whichever is larger
loop_caches = 8           # the library's always-rejected loop may grow memory in use by this many caches + noise_mb
wrong_alpha = 0.05        # an always-wrong drafter's acceptance stays below this ...
wrong_passes = 0.9        # ... and its loop makes at least this many target passes per new token
threads = 1               # CPU threads (0: torch's default). Nothing here needs speed, and one thread is
                          # immune to the thread-wake-up stalls of a shared machine (see chapter 1)
out_dir = "../build/book/07_kv_cache"  # figures and CSVs land here
params_name = None        # the parameter file's name, injected by scripts/run_book.py (banner)

# %% tags=["hide-input"]
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from IPython.display import Markdown, display

import specdec_core as sd
from specdec_core.drafters import Draft, Drafter
from specdec_core.kvcache import KVCache
from specdec_core.lm import CachedLM
from specdec_core.tools import book
from specdec_core.study import profiling as pf
from specdec_core.tree import attention_bias

display(book.banner(params_name))
ch = book.setup(out_dir, model, device=device, dtype=dtype, threads=threads, reference=True)  # CSVs tagged
sns.set_palette("colorblind")
dev, dt, tag, target = ch.device, ch.dtype, ch.tag, ch.target
b = torch.finfo(dt).bits // 8
cfg = target.config
print(ch)


def flatness(x, y) -> float:
    """How much more the longer rollbacks cost than the shorter ones, as a fraction of the median.

    The lengths are split at their median into a short and a long half; the statistic is the gap
    between the halves' medians. A cost that grows with n (a copy, a reallocation) opens this gap by
    multiples; a pointer move leaves only timing noise, and one disturbed point cannot move a median
    of three or more (a least-squares line through log-spaced lengths is tilted by its last point alone).
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    y = y[np.argsort(x)]
    h = len(y) // 2
    return abs(np.median(y[-h:]) - np.median(y[:h])) / float(np.median(y))


# %% [markdown]
# ## The cache in one speculative step
#
# Every pass reads the keys and values of all earlier positions from the KV cache. The book's
# `specdec_core.KVCache` follows one rule: **allocate once, then move pointers**.
#
# Each layer holds two buffers, one for keys and one for values, allocated when the cache is built. Their shape
# is `[1, nkv, capacity, head_dim]`. A counter, `length`, says how many positions are committed. Three operations
# serve a speculative step:
#
# - `advance(n)` commits the n positions a pass just wrote.
# - `rollback(n)` forgets the last n positions by moving `length` back. Entries past `length` are never read,
#   and the next pass overwrites them.
# - `compact(keep, start)` copies a tree's kept path down to the end of the committed prefix (an index copy).
#
# A verify pass over K drafted tokens writes K + 1 positions, where K is the draft length (the tokens drafted per
# step; [notation](notation.md)). If the target keeps j drafted tokens, the step commits j + 1 positions and rolls
# back the other K − j. The sections below measure what each part of this costs.

# %% [markdown]
# ## 1. Bytes per token per layer
#
# One token stores a key vector and a value vector for each key/value head in every layer. That is
# `2 · nkv · head_dim · b` bytes per layer. Here nkv is the number of key/value heads, head_dim the size of one
# head, and b the bytes per number (4 in float32).
#
# Grouped-query attention lets several query heads share one key/value head (nkv below nh, the number of query
# heads). That is what keeps the cache small. The table checks the formula against the bytes the cache really
# allocates. The larger shapes are built on the `meta` device, which gives them a shape but no memory.

# %% tags=["hide-input"]
configs = {f"{model} (this model)": cfg} | {f"llama-{s} shape": pf.llama_config(s) for s in shapes}
rows = []
for name, c in configs.items():
    a = pf.Arch.from_config(c)
    cap = 1000
    allocated = KVCache(c, cap, dt, dev if c is cfg else "meta").nbytes()
    per_layer = pf.kv_bytes_per_token(c, b, per_layer=True)
    assert allocated == cap * pf.kv_bytes_per_token(c, b), f"{name}: cache allocates {allocated} bytes"
    rows.append(dict(model=name, layers=a.L, q_heads=a.nh, kv_heads=a.nkv, head_dim=a.hd,
                     bytes_per_token_per_layer=per_layer, kb_per_token=per_layer * a.L / 1e3,
                     weights_gb=pf.param_count(c) * b / 1e9,
                     without_gqa_kb=2 * a.nh * a.hd * b * a.L / 1e3))
per_token = ch.save(pd.DataFrame(rows), "kv_bytes_per_token")
print("The formula equals the bytes the cache allocates, for every shape.")
print("Units are decimal: 1 kB = 1000 bytes.")
per_token.drop(columns="device").set_index("model").round(2)

# %% [markdown]
# ## 2. Cache memory against context length and batch
#
# A cache for B sequences of S positions holds B · S times the bytes per token. Here S is the context length
# (the tokens already in the cache) and B the batch size (the sequences decoded together; both on the
# [notation](notation.md) page).
#
# The dashed line in the figure is the model's weights. Past it, **each pass reads more KV cache than weights**.
# Chapter 1's argument, that one pass costs about one read of the weights, then no longer holds.

# %% tags=["hide-input"]
rows = []
for name, c in configs.items():
    per_tok = pf.kv_bytes_per_token(c, b)
    for S in context_lengths:
        for B in batches:
            rows.append(dict(model=name, S=S, batch=B, kv_gb=B * S * per_tok / 1e9,
                             weights_gb=pf.param_count(c) * b / 1e9))
mem = ch.save(pd.DataFrame(rows), "kv_memory")
g = sns.relplot(data=mem, x="S", y="kv_gb", hue="batch", col="model", kind="line", marker="o",
                col_wrap=2, height=3, aspect=1.3, palette="colorblind", facet_kws=dict(sharey=False))
for ax, (name, d) in zip(g.axes.flat, mem.groupby("model", sort=False)):
    ax.axhline(d.weights_gb.iloc[0], color="black", ls="--", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="context length S", ylabel=f"KV cache GB ({dtype})")
g.set_titles("{col_name}")
g.figure.suptitle("The cache grows with context and batch, and overtakes the weights (dashed)", y=1.02)
ch.savefig(g.figure, "kv_memory")
cross = pd.DataFrame([dict(model=n, **{f"batch {B}": int(pf.param_count(c) / (B * pf.kv_bytes_per_token(c, 1)))
                                      for B in batches}) for n, c in configs.items()])
this_cross = cross.iloc[0]
display(Markdown(f"At batch {batches[0]}, this model's cache equals its weights at S = "
                 f"{this_cross[f'batch {batches[0]}']:,} tokens. At batch {batches[-1]} that context falls to "
                 f"{this_cross[f'batch {batches[-1]}']:,}. The table gives the crossover context for each shape."))
cross.set_index("model")

# %% [markdown]
# ## 3. Rollback cost against the number of positions rolled back
#
# A rejected draft is rolled back. If rollback is a pointer move, its cost should not depend on n, the number of
# positions dropped. Two timings, each over several n:
#
# 1. the bare operation: `advance(n)` then `rollback(n)`, 1000 times per timed run;
# 2. what a decoder sees: roll back n positions, then run the next verify pass over K + 1 tokens, not committed.
#
# The verify pass always starts from the same `base_length` positions, so any change with n would be the
# rollback's. The code below is what is timed.

# %%
lm = CachedLM(target, base_length + max(rollback_lengths) + max(tree_sizes) + k + 1)
lm.forward(torch.randint(0, cfg.vocab_size, (base_length,), generator=torch.Generator().manual_seed(0)))
cache = lm.cache
ptrs = [l.keys.data_ptr() for l in cache.layers]
toks = torch.randint(0, cfg.vocab_size, (k + 1,), generator=torch.Generator().manual_seed(1))


def op_fn(n, reps=1000):
    def run():
        for _ in range(reps):
            cache.advance(n)
            cache.rollback(n)
    return run


def step_fn(n):
    def run():
        cache.advance(n)          # pretend n drafted positions were written and committed
        cache.rollback(n)         # ... and rejected
        lm.forward(toks, commit=0)  # the next verification pass, from base_length positions
    return run


# %% tags=["hide-input"]
ops = pf.time_interleaved({n: op_fn(n) for n in rollback_lengths}, repeats=op_repeats, warmup=1, device=dev)
ops = pf.summarize(ops).rename(columns={"name": "n"}).sort_values("n")
# The bare op is a few Python statements: noise can only add to it, so its cost is the fastest run
# (timeit's convention); the decoder-side measurement below reports medians, as everywhere else.
ops["ns_per_rollback"] = 1e9 * ops["min"] / 1000 / 2  # the pair, halved: about one pointer move each
assert cache.length == base_length
steps = pf.summarize(pf.time_interleaved({n: step_fn(n) for n in rollback_lengths}, repeats=pass_repeats,
                                         warmup=1, device=dev)).rename(columns={"name": "n"}).sort_values("n")
assert [l.keys.data_ptr() for l in cache.layers] == ptrs, "rollback must not reallocate"
rb = pd.concat([ops.assign(what="rollback op (ns)", value=ops.ns_per_rollback),
                steps.assign(what="rollback + next pass (ms)", value=1e3 * steps["median"])])
ch.save(rb, "rollback_cost")
flat = {w: flatness(d.n, d.value) for w, d in rb.groupby("what", sort=False)}
all_flat = all(f <= flat_tolerance for f in flat.values())
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for ax, (w, d) in zip(axes, rb.groupby("what", sort=False)):
    sns.lineplot(data=d, x="n", y="value", marker="o", ax=ax)
    ax.set_xscale("symlog", linthresh=1)
    ax.set(xlim=(0, 1.3 * max(rollback_lengths)), ylim=(0, 1.3 * d.value.max()), xlabel="positions rolled back n",
           ylabel=w, title=f"{w}: long vs short {flat[w]:.1%}")
fig.suptitle("Rollback costs the same whatever n: a pointer move" if all_flat else
             "Rollback cost changes with n", y=1.03)
ch.savefig(fig, "rollback_cost")
h = sorted(rollback_lengths)
short_n, long_n = f"{h[0]}–{h[len(h) // 2 - 1]}", f"{h[-(len(h) // 2)]}–{h[-1]}"
display(Markdown(f"A bare rollback took {ops.ns_per_rollback.min():.0f}–{ops.ns_per_rollback.max():.0f} ns for "
                 f"every n from {h[0]} to {h[-1]}. The table compares long rollbacks ({long_n} positions) with short "
                 f"ones ({short_n}); flat means at most {flat_tolerance:.0%} apart."))
display(pd.DataFrame([dict(timing=w, short_n=short_n, long_n=long_n, gap=f"{f:.1%} of the median")
                      for w, f in flat.items()]).set_index("timing"))
for w, f in flat.items():
    assert f <= flat_tolerance, f"{w} is not flat: long and short rollbacks {f:.1%} apart > {flat_tolerance:.0%}"

# %% [markdown]
# ## 4. A run of rejections
#
# The worst case for a speculative decoder is a drafter that is always wrong. Every step writes K + 1 positions,
# keeps one, and rolls back K. A cache that grew with each write, or moved on rollback, would leak here.
#
# The loop below runs `rejection_steps` such steps directly on the cache. It records the cache length, the buffer
# addresses and the memory in use. On CUDA, "memory" is the allocated device memory (`profiling.memory_in_use`).

# %%
lm2 = CachedLM(target, base_length + rejection_steps + k + 1)
lm2.forward(torch.randint(0, cfg.vocab_size, (base_length,)))
ptrs2, nbytes2 = [l.keys.data_ptr() for l in lm2.cache.layers], lm2.cache.nbytes()
trace, gen = [], torch.Generator().manual_seed(2)
for step in book.progress(range(rejection_steps), desc="rejected steps"):
    lm2.forward(torch.randint(0, cfg.vocab_size, (k + 1,), generator=gen))  # verify k drafts
    lm2.cache.rollback(k)                                                    # reject all k
    trace.append(dict(step=step, length=lm2.length, mem_mb=pf.memory_in_use(dev) / 1e6,
                      same_buffers=[l.keys.data_ptr() for l in lm2.cache.layers] == ptrs2,
                      cache_mb=lm2.cache.nbytes() / 1e6))

# %% tags=["hide-input"]
trace = ch.save(pd.DataFrame(trace), "rejection_run")
settled = trace[trace.step >= min(10, rejection_steps // 4)]
growth_mb = settled.mem_mb.max() - settled.mem_mb.min()
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
sns.lineplot(data=trace, x="step", y="mem_mb", ax=axes[0])
axes[0].set(ylabel="memory in use (MB)", title="memory during always-rejected steps")
axes[0].set_ylim(0, 1.2 * trace.mem_mb.max())
sns.lineplot(data=trace, x="step", y="length", ax=axes[1])
axes[1].axhline(lm2.cache.capacity, color=sns.color_palette("colorblind")[3], ls="--", label="capacity (allocated once)")
axes[1].set(ylabel="committed positions", title="cache length: +1 per step")
axes[1].legend()
fig.suptitle("Always-rejected steps: the cache gains one position a step, and memory stays put", y=1.03)
ch.savefig(fig, "rejection_run")
display(Markdown(f"Over {rejection_steps} rejected steps the buffers "
                 f"{'never moved' if trace.same_buffers.all() else 'MOVED'}, and the cache stayed at "
                 f"{nbytes2 / 1e6:.1f} MB. Memory in use varied by {growth_mb:.1f} MB after warm-up."))
assert trace.same_buffers.all() and (trace.cache_mb == nbytes2 / 1e6).all()
assert list(trace.length) == list(range(base_length + 1, base_length + rejection_steps + 1))
assert growth_mb < max(noise_mb, noise_share * nbytes2 / 1e6), f"memory in use grew by {growth_mb:.1f} MB"

# %% [markdown]
# The same test through the library: `sd.generate` with a drafter that always proposes the vocabulary's last
# token, which the greedy target (almost) never picks. Its acceptance rate α (the fraction of tested draft tokens
# the target keeps; [notation](notation.md)) should be near zero.


# %%
class AlwaysWrong(Drafter):
    """Proposes k copies of the vocabulary's last id, which the greedy target (almost) never picks."""

    name = "always-wrong"

    def propose(self, context, k, params, generator):
        return Draft(torch.full((k,), cfg.vocab_size - 1, dtype=torch.long), None, passes=0)


ids = torch.randint(0, cfg.vocab_size, (32,), generator=torch.Generator().manual_seed(3))
n_new = max(8, rejection_steps // 4)
sd.generate(target, ids, drafter=AlwaysWrong(), method="linear", k=k, max_new_tokens=4)  # warm-up
before = pf.memory_in_use(dev)
res = sd.generate(target, ids, drafter=AlwaysWrong(), method="linear", k=k, max_new_tokens=n_new)
grown = (pf.memory_in_use(dev) - before) / 1e6

# %% tags=["hide-input"]
cache_mb = KVCache(cfg, ids.numel() + n_new + k + 1, dt, "meta").nbytes() / 1e6
st = res.stats
display(Markdown(f"The library's loop made {st['new_tokens']} tokens in {st['target_passes']} target passes, "
                 f"with α = {st['alpha']:.3f}. Memory in use grew by {grown:.1f} MB; its cache holds "
                 f"{cache_mb:.1f} MB."))
assert st["alpha"] < wrong_alpha and st["target_passes"] >= wrong_passes * st["new_tokens"]
assert grown < loop_caches * cache_mb + noise_mb, f"the library's loop grew memory in use by {grown:.1f} MB"

# %% [markdown]
# ## Going deeper
#
# ### How "flat" is judged
#
# The rollback lengths are split at their median into a short half and a long half. The statistic is the gap
# between the two halves' medians, as a share of the overall median (`flatness` in the set-up cell).
#
# A cost that grows with n, such as a copy or a reallocation, opens this gap by multiples. A pointer move leaves
# only timing noise. One disturbed point cannot move a median of three or more, whereas a least-squares line
# through log-spaced lengths is tilted by its last point alone.
#
# ### Tree-branch memory
#
# A tree of N draft nodes is verified in one pass (chapter 4). Its nodes go to N consecutive slots past `length`.
# Each node attends to the prefix and to its own ancestors, through a 4D mask.
#
# No second buffer exists: the tree borrows headroom reserved when the cache was built. After acceptance,
# `compact` copies the accepted path (d nodes) down to the end of the prefix. The other N − d slots are left
# behind.
#
# The alternative is one sequence per branch, as a batch. It needs a copy of the prefix for each extra branch.
# Below, a star tree (N siblings at depth 1) and a chain of depth N go through the real model. The table records
# the buffers before and after, and the memory each layout needs *beyond* the one cache of the prefix. The tree
# needs N slots, and a batch of branches `(branches − 1) · S + N` slots.

# %% tags=["hide-input"]
per_tok = pf.kv_bytes_per_slot(target)
rows = []
nbytes0 = cache.nbytes()
for N in tree_sizes:
    for shape in ("star", "chain"):
        # node i sees the prefix, itself and its ancestors: a star's nodes only themselves, a chain's all before
        allowed = torch.eye(N, dtype=torch.bool) if shape == "star" else torch.ones(N, N, dtype=torch.bool).tril()
        depth = 1 if shape == "star" else N
        depths = torch.zeros(N, dtype=torch.long) if shape == "star" else torch.arange(N)
        S = cache.length
        lm.forward(torch.randint(0, cfg.vocab_size, (N,)), positions=S + depths,
                   mask=attention_bias(allowed, S, dt, dev))
        path = torch.arange(S, S + depth) if shape == "chain" else torch.tensor([S])  # accepted path
        pf.sync(dev)
        t = time.perf_counter()
        cache.compact(path, start=S)
        pf.sync(dev)
        t_compact = time.perf_counter() - t
        assert cache.length == S + len(path)
        assert [l.keys.data_ptr() for l in cache.layers] == ptrs and cache.nbytes() == nbytes0
        branches = N if shape == "star" else 1
        rows.append(dict(N=N, tree=shape, depth=depth, branches=branches, prefix=S,
                         extra_kb_tree=N * per_tok / 1e3,
                         extra_kb_batch_of_branches=((branches - 1) * S + N) * per_tok / 1e3,
                         compact_positions=len(path), compact_us=1e6 * t_compact))
        cache.rollback(len(path))
trees = ch.save(pd.DataFrame(rows), "tree_memory")
print(f"cache buffers: {nbytes0 / 1e6:.1f} MB before and after every tree pass, same addresses")
trees.drop(columns="device").round(1)

# %% [markdown]
# The figure compares the two layouts' memory beyond the prefix for the star trees. The tree takes N slots in the
# one cache; one sequence per branch copies the prefix for each extra branch.

# %% tags=["hide-input"]
long = trees[trees.tree == "star"].melt(id_vars="N", value_vars=["extra_kb_tree", "extra_kb_batch_of_branches"],
                                        var_name="layout", value_name="kB")
long["layout"] = long.layout.map({"extra_kb_tree": "tree in one cache",
                                  "extra_kb_batch_of_branches": "one sequence per branch"})
fig, ax = plt.subplots(figsize=(6.5, 3.8))
sns.lineplot(data=long, x="N", y="kB", hue="layout", marker="o", ax=ax, palette="colorblind")
ax.set(xscale="log", yscale="log", xlabel="branches N (star tree)", ylabel="KV memory beyond the prefix (kB)",
       title=f"A tree in one cache needs far less memory than a batch of branches\n(prefix {base_length})")
ch.savefig(fig, "tree_memory")

# %% [markdown]
# ## Summary

# %% tags=["hide-input"]
this = per_token.iloc[0]
ratio_ = round(this.without_gqa_kb / this.kb_per_token)
share_word = {1: "all", 2: "half", 3: "a third", 4: "a quarter"}.get(ratio_, f"1/{ratio_}")
n_top = trees.N.max()
plain = {"rollback op (ns)": "alone", "rollback + next pass (ms)": "with the next pass"}
lines = [
    "- **Memory per token.** Keys and values cost `2 · nkv · head_dim · b` bytes per layer. "
    f"The model here, {model}, stores {this.kb_per_token:.1f} kB per token over {int(this.layers)} layers, "
    f"{share_word} of what it would without grouped-query attention. "
    "The formula equalled the allocated bytes for every shape.",
    "- **Memory grows with context and batch.** Past the crossover context a pass reads more cache than weights, "
    "which weakens chapter 1's premise. "
    f"At batch {batches[0]} the cache equals the weights at " + ", ".join(
        f"S = {r[f'batch {batches[0]}']:,} for {r.model}" for _, r in cross.iterrows()) + ".",
    f"- **Rollback is a pointer move.** One took {ops.ns_per_rollback.min():.0f}–{ops.ns_per_rollback.max():.0f} ns "
    f"over n = {min(rollback_lengths)}–{max(rollback_lengths)}. "
    "Long and short rollbacks were " + " and ".join(f"{f:.1%} apart {plain.get(w, w)}" for w, f in flat.items())
    + f"; flat means at most {flat_tolerance:.0%}.",
    f"- **Rejections leak nothing.** Over {rejection_steps} rejected steps the buffers "
    f"{'never moved' if trace.same_buffers.all() else 'moved'}, and memory in use varied by {growth_mb:.1f} MB "
    f"after warm-up. The library's loop with an always-wrong drafter (α = {st['alpha']:.3f}) grew memory in use by "
    f"{grown:.1f} MB, against its {cache_mb:.1f} MB cache.",
    f"- **Trees borrow headroom.** N = {n_top} nodes took {trees.extra_kb_tree.max() / 1e3:.1f} MB beyond the prefix "
    f"in the one cache, against {trees[trees.N == n_top].extra_kb_batch_of_branches.max() / 1e3:.1f} MB for one "
    f"sequence per branch. The buffers kept their {nbytes0 / 1e6:.1f} MB and addresses. `compact` took "
    f"{trees.compact_us.min():.0f}–{trees.compact_us.max():.0f} µs (one timing each, copying "
    f"{trees.compact_positions.min()}–{trees.compact_positions.max()} positions).",
]
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Exercises
#
# 1. With `dtype="bfloat16"`, how do the crossover contexts of section 2 move? And for an 8-bit KV cache?
# 2. Llama-3.1-8B has nkv = 8 and nh = 32. At 32k context and batch 8, how much memory would
#    the cache take without grouped-query attention?
# 3. Replace the star tree by a binary tree of depth 4. How many slots does it take, and what does
#    `compact` copy if the accepted path has length 3?
# 4. Write a cache that *does* reallocate (`torch.cat` on every write, slicing on rollback) and rerun
#    section 3. Which measurement changes, and how does it scale with the context length?
