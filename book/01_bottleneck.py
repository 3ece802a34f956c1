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
# # 1 · The bottleneck: does checking several tokens cost about as much as one?
#
# **The question.** A speculative step drafts a few tokens, and the target checks them all in one pass. Speculation
# pays only if that pass costs about as much as a pass over a single token. Does it?
#
# **The answer.** Yes, for a handful of tokens: a target pass over up to about 8 tokens costs about one pass. A
# decode pass spends its time reading the model's weights from memory. One read serves every token in the pass, so
# a few more tokens add little. Past a point, the *knee*, each extra token adds its own arithmetic, and the cost
# climbs. This run's verdict is the first result below, under the first figure.
#
# [Chapter 0](00_quickstart.ipynb) pictured a step as a few cheap draft passes and one verify pass. This chapter
# prices that verify pass.

# %% tags=["parameters"]
device = "cpu"            # "cpu", "cuda" or "auto"
dtype = "float32"         # the model's dtype; the FLOP ceiling is measured in it
model = "smollm2-135m"    # the embedded target, a Hugging Face id or a local path
token_counts = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256]  # T: new tokens per pass (2..small_t: the verdict's)
context_lengths = [128, 1024]                      # S: tokens already in the KV cache
repeats = 5               # timed runs per configuration, interleaved
warmup = 1                # untimed runs first
threads = [1, 2]          # CPU thread counts compared; the fastest for a one-token pass is kept
copy_mib = 512            # copy-bandwidth buffer (MiB); well above the last-level cache
gemm_n = 2048             # square matmul for the FLOP ceiling (a GPU uses at least 8192)
prompt_len = 128          # prefill-vs-decode staircase: prompt tokens
decode_len = 32           # ... and generated tokens
blas_token_counts = [1, 2, 3, 5, 9, 17, 25]  # T compared under the MKL default, MKL_CBWR AUTO and the library kernel (CPU only)
scale_models = ["0.5b", "1b"]  # random-weight Llama shapes (profiling.LLAMA_SHAPES); "3b", "8b" on a GPU
scale_token_counts = [1, 4, 16, 64, 256]
scale_repeats = 3
knee_tolerance = 2.0      # a knee prediction "holds" if within this factor of the measured knee
one_pass = 1.25           # "about one pass": a T-token pass costs at most this many one-token passes (the verdict)
small_t = 8               # the verdict covers T from 2 up to this: the handful of tokens a verify pass checks
floor_share = 0.5         # bare matmuls faster than this share of the copy-bandwidth time mean a timing under load
profiler_factor = 2.0     # the profiler's matmul time and the bare matmuls agree within this factor
erosion = 0.05            # the plateau eroded if t(2)/t(1) at the longest context exceeds the shortest's by this share
loose_rise = 2.0          # a GPU knee is loosely determined where t(T_max)/t(1) rose less than this
out_dir = "../build/book/01_bottleneck"  # figures and CSVs land here
params_name = None        # the parameter file's name, injected by scripts/run_book.py (banner)

# %% tags=["hide-input"]
import contextlib
import gc
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from IPython.display import Markdown, display

from specdec_core import kernels
from specdec_core.lm import CachedLM
from specdec_core.study import blas, hardware, report
from specdec_core.tools import book
from specdec_core.study import profiling as pf

display(book.banner(params_name))
ch = book.setup(out_dir, model, device=device, dtype=dtype, reference=True)  # CSVs tagged with the device
dev, dt, tag, target = ch.device, ch.dtype, ch.tag, ch.target
b = torch.finfo(dt).bits // 8  # bytes per element
if dev.type == "cpu":  # always with every core: the setting chapters 3-6 decode with
    n_cores = len(os.sched_getaffinity(0))
    thread_counts = sorted({n for n in threads if 1 <= n <= n_cores} | {n_cores})
else:
    thread_counts = [torch.get_num_threads()]  # host threads barely matter to a GPU pass
if not thread_counts:
    raise ValueError(f"no usable thread count in {threads}")
n_threads = max(thread_counts)  # every core, as the rest of the book decodes (Going deeper compares the others)
torch.set_num_threads(n_threads)
S0, T_max = min(context_lengths), max(token_counts)
if 1 not in token_counts:
    raise ValueError("token_counts must include 1: every ratio is taken against t(1)")
cfg = target.config
arch = pf.Arch.from_config(cfg)
P_params = sum(p.numel() for p in target.parameters())
assert P_params == pf.param_count(cfg), "the accounting's parameter count must match the model"
lm = CachedLM(target, max(context_lengths) + max(T_max, prompt_len + decode_len))
weights = pf.model_linears(target)  # the model's own matrices, for bare-matmul timings
lin_flops_tok = 2 * sum(w.numel() for w in weights)  # FLOPs of the model's matmuls per token
palette = sns.color_palette("colorblind")
print(f"{model}: {P_params / 1e6:.1f} M parameters ({P_params * b / 1e6:.0f} MB in {dtype}); device {dev} ({tag})")
print(f"torch {torch.__version__}, {n_threads} thread(s), matmuls on the {kernels.path_of(target)} path")

# %% [markdown]
# ## 1. What a pass over T tokens costs
#
# A pass over T new tokens (T: the tokens the model reads in one pass; [notation](notation.md)) takes a time t(T)
# (its wall time; [notation](notation.md)). The ratio t(T)/t(1) is its cost in one-token passes. A verify pass checks
# K drafted tokens (K: the draft length; [notation](notation.md)), so T = K + 1. Its ratio is the *verify ratio*
# ([notation](notation.md)).
#
# Every pass runs after S tokens already in the KV cache (S: the context length; [notation](notation.md)). The
# code below times every T of `token_counts` at each S of `context_lengths`. The runs are interleaved, and each
# time is the median of `repeats` runs. A timed pass commits nothing, so every run sees the same cache.

# %%
samples = []
for S in context_lengths:
    pf.at_context(lm, S)  # S positions in the cache, filled by pointer
    passes_over = {T: pf.pass_fn(lm, T, arch.V) for T in token_counts}  # one pass over T tokens each
    samples.append(pf.time_interleaved(passes_over, repeats=repeats, warmup=warmup, device=dev).assign(S=S))

# %% [markdown]
# The figure plots t(T)/t(1) on linear axes. The shaded band holds the sizes a verify pass takes. The dashed line is
# the chapter's bar for "about one pass": `one_pass` one-token passes. A pass whose tokens shared nothing would cost
# T passes, far off the top of the plot.

# %% tags=["hide-input"]
samples = pd.concat(samples).rename(columns={"name": "T"})
ch.save(samples, "pass_samples")
# the model's matmuls alone, M = T input rows, through the modules the pass calls (the CPU kernel where installed)
mm_curve = pf.summarize(pf.time_interleaved({T: pf.linear_chain(target, T) for T in token_counts},
                                            repeats=repeats, warmup=warmup, device=dev))
mm_curve = mm_curve.rename(columns={"name": "T"}).sort_values("T").reset_index(drop=True)
mm_curve["ratio"] = mm_curve["median"] / mm_curve["median"].iloc[0]
mm_curve["gflops"] = lin_flops_tok * mm_curve["T"] / mm_curve["median"] / 1e9
mm_curve["gflops_best"] = lin_flops_tok * mm_curve["T"] / mm_curve["min"] / 1e9
ch.save(mm_curve, "bare_matmul_times")
passes = pf.summarize(samples, ["S", "T"]).sort_values(["S", "T"]).reset_index(drop=True)
passes["t1"] = passes.groupby("S")["median"].transform("first")
passes["ratio"] = passes["median"] / passes["t1"]
# the thesis, settled from this run's numbers: "about one pass" = t(T)/t(1) at most `one_pass` (a stated bar)
p0s = passes[passes.S == S0].set_index("T")
small = [T for T in p0s.index if 1 < T <= small_t]
holds = [T for T in small if p0s.loc[T, "ratio"] <= one_pass]
flat_to = max([T for T in small if all(u in holds for u in small if u <= T)], default=1)  # all within up to here
# the verdict per T, saved for the setting line of every decoding chapter (book.CHAPTER1_VERDICT, Chapter.setting)
verdict = pd.DataFrame([dict(threads=n_threads, S=S0, T=int(T), ratio=float(p0s.loc[T, "ratio"]), one_pass=one_pass)
                        for T in [1, *small]])
verdict.to_csv(ch.out / Path(book.CHAPTER1_VERDICT).name, index=False)

near = passes[passes["T"] <= 4 * small_t].assign(context="S = " + passes["S"].astype(str))
top = 1.15 * max(near.ratio.max(), one_pass)
fig, ax = plt.subplots(figsize=(7, 4.2))
ax.axvspan(1, small_t, color=palette[7], alpha=0.15, label=f"T ≤ {small_t}: a verify pass's size")
sns.lineplot(data=near, x="T", y="ratio", hue="context", marker="o", palette=palette[:len(context_lengths)], ax=ax)
ax.axhline(one_pass, color=palette[3], ls="--", lw=1.2, label=f"the bar: {one_pass:g}× one pass")
ax.set(xlim=(0, near["T"].max() + 1), ylim=(0, top), xlabel="new tokens per pass T", ylabel="t(T) / t(1)")
ax.set_title(f"A pass over up to {flat_to} tokens costs about one pass ({tag})" if flat_to > 1 else
             f"Even a 2-token pass costs more than {one_pass:g}× one pass here ({tag})", fontsize=11)
ax.legend(fontsize=8, loc="lower right")
ch.savefig(fig, "ratio")

# %% tags=["hide-input"]
if small:
    lo_r, hi_r = min(p0s.loc[T, "ratio"] for T in small), max(p0s.loc[T, "ratio"] for T in small)
    above = [T for T in small if T not in holds]
    said = (f"Every one of them is within the {one_pass:g}× bar." if not above else
            f"None of them is within the {one_pass:g}× bar." if not holds else
            f"T = {', '.join(map(str, holds))} are within the {one_pass:g}× bar; T = {', '.join(map(str, above))} "
            "are above it.")
    display(Markdown(
        f"**This run's verdict.** At S = {S0} cached tokens, on {n_threads} thread(s), a pass over 2 to {max(small)} "
        f"tokens costs {lo_r:.2f} to {hi_r:.2f} one-token passes. {said} A pass over {T_max} tokens costs "
        f"{p0s.loc[T_max, 'ratio']:.1f} passes: far from free, and far below the {T_max} passes of nothing shared."))
    display(pd.DataFrame({"t(T)/t(1)": [f"{p0s.loc[T, 'ratio']:.2f}" for T in small],
                          f"within {one_pass:g}×": ["yes" if T in holds else "no" for T in small]},
                         index=pd.Index(small, name="T")).T)
else:
    print(f"token_counts holds no T in 2..{small_t}: the verdict needs them")

# %% [markdown]
# ## 2. Why: one read of the weights serves every token
#
# A pass reads every weight once, whatever T is. It also does about two floating-point operations (FLOPs) per
# weight and token. The *roofline* turns these two counts into a lower bound on the pass's time:
#
# $$ t_{\text{roof}}(T) = \max\!\left(\frac{B(T)}{BW},\ \frac{F(T)}{P}\right). $$
#
# B(T) is the bytes the pass moves ([notation](notation.md)), and F(T) its FLOPs. BW is the memory bandwidth, in
# bytes per second. P is the peak compute rate, in FLOPs per second ([notation](notation.md)). For small T the bytes
# term is larger: the pass is *memory-bound*, and its time barely grows with T. The FLOPs term grows with T and
# overtakes it at the *knee*. There the pass's arithmetic intensity, F/B, reaches the *ridge point* P/BW.
#
# We measure BW by copying a large buffer. P is the best FLOP rate any matmul reached in this run: a large square
# matmul, or the model's own matmuls over many rows. `profiling.pass_cost` counts B(T) and F(T), and
# `tests/test_profiling.py` checks its formulas against hand counts.

# %% tags=["hide-input"]
# does attention read the grouped K/V heads as stored, or copy them out to every query head? observed, not assumed
import transformers.integrations.sdpa_attention as sdpa_mod

seen = []
_orig = sdpa_mod.use_gqa_in_sdpa


def _spy(mask, key):
    used = _orig(mask, key)
    seen.append(used)
    return used


sdpa_mod.use_gqa_in_sdpa = _spy
try:
    gqa_native = {}
    for T in (1, 2):
        pf.at_context(lm, S0)
        seen.clear()
        pf.pass_fn(lm, T, arch.V)()
        gqa_native[T] = all(seen) if seen else True  # no call: this attention has no GQA repeat to skip
finally:
    sdpa_mod.use_gqa_in_sdpa = _orig
expanded = {T: not v for T, v in gqa_native.items()}


def cost(T, S, logits="all", config=cfg):
    """Accounting as implemented: the K/V heads are copied out to nh heads when T > 1 (if observed)."""
    return pf.pass_cost(config, T, S, b, logits, gqa_expanded=expanded[min(T, 2)])


c1 = cost(1, S0)
acc = pd.DataFrame([dict(T=T, S=S, **{k: v for k, v in cost(T, S).items() if k not in ("T", "S")})
                    for S in context_lengths for T in token_counts])
passes = passes.merge(acc, on=["S", "T"])

# the ceilings, at every thread count compared: a large copy; MKL's square matmul; the model's own matmuls over
# T_max rows on the pass's path. Each is the fastest run (as STREAM reports it), the median beside it.
rows = []
for n in book.progress(thread_counts, desc="ceilings"):
    torch.set_num_threads(n)
    cb = pf.copy_bandwidth(copy_mib << 20, dev, dt, repeats=max(3, repeats))
    mp = pf.matmul_peak(gemm_n if dev.type == "cpu" else max(gemm_n, 8192), dev, dt, repeats=max(3, repeats))
    lc = pf.time_interleaved({"linears": pf.linear_chain(target, T_max)}, repeats=max(3, repeats), warmup=warmup,
                             device=dev)["seconds"]
    rows.append(dict(threads=n, copy_gbps=cb["gbps_best"], copy_gbps_median=cb["gbps_median"],
                     gemm_gflops=mp["gflops_best"], gemm_gflops_median=mp["gflops_median"], gemm_n=mp["n"],
                     linear_gflops=lin_flops_tok * T_max / lc.min() / 1e9,
                     linear_gflops_median=lin_flops_tok * T_max / lc.median() / 1e9, linear_rows=T_max))
torch.set_num_threads(n_threads)
ceilings = pd.DataFrame(rows)
# the compute ceiling is the highest rate any path reached in this run: at the thread count in use, section 1's
# passes and bare matmuls (their fastest runs) count too
run_best = max((passes["flops"] / passes["min"]).max(), (lin_flops_tok * mm_curve["T"] / mm_curve["min"]).max()) / 1e9
ceilings["peak_gflops"] = ceilings[["gemm_gflops", "linear_gflops"]].max(axis=1)
at_n = ceilings.threads == n_threads
ceilings.loc[at_n, "peak_gflops"] = np.maximum(ceilings.loc[at_n, "peak_gflops"], run_best)
ceilings["ridge_flop_per_byte"] = ceilings["peak_gflops"] / ceilings["copy_gbps"]
ch.save(ceilings, "ceilings")
# the ceilings are the machine's: the fastest copy and matmul at any thread count compared (on a shared machine
# every core may run slower than fewer; a bound taken from that slower run would be no bound)
BW, PEAK = ceilings.copy_gbps.max() * 1e9, ceilings.peak_gflops.max() * 1e9
peak_by = {"MKL's square matmul": ceilings.gemm_gflops.max(), f"the model's matmuls over {T_max} rows":
           ceilings.linear_gflops.max(), "a pass or the bare matmuls of section 1": run_best}
peak_from = max(peak_by, key=peak_by.get)

passes["roof_s"] = [pf.roofline_time(r, BW, PEAK) for r in passes[["bytes", "flops"]].to_dict("records")]
passes["roof_ratio"] = passes["roof_s"] / passes.groupby("S")["roof_s"].transform("first")
passes["achieved_gbps"] = passes["bytes"] / passes["median"] / 1e9
passes["achieved_gflops"] = passes["flops"] / passes["median"] / 1e9
passes["model"] = model
ch.save(passes, "pass_times")

# the knee: the roofline's (ridge point in tokens) against the one fitted to the measured curve, max(a, s·T)
knee_ideal = {S: pf.roofline_knee(cfg, S, b, BW, PEAK, gqa_expanded=expanded[2]) for S in context_lengths}
t_mmT = mm_curve["median"].iloc[-1]
rows = []
for S in context_lengths:
    p = passes[passes.S == S]
    fit = pf.fit_roofline(p["T"], p["median"])
    floor = cost(1, S)["bytes"] / BW
    m = p["t1"].iloc[0] / floor
    c = (t_mmT / T_max) / (lin_flops_tok / PEAK)
    rows.append(dict(S=S, knee_ideal=knee_ideal[S], knee_measured=fit["knee"], resolved=fit["resolved"],
                     fit_rms_log=fit["rms_log"], plateau_ms=1e3 * fit["plateau"], ms_per_token=1e3 * fit["slope"],
                     floor_ms=1e3 * floor, m=m, c=c, knee_corrected=knee_ideal[S] * m / c))
knees = pd.DataFrame(rows)
knees["ideal_over_measured"] = knees.knee_ideal / knees.knee_measured
knees["corrected_over_measured"] = knees.knee_corrected / knees.knee_measured
ch.save(knees, "knees")
k0 = knees.set_index("S").loc[S0]
floor = c1["bytes"] / BW

print(f"Copy bandwidth BW = {BW / 1e9:.1f} GB/s. Compute ceiling P = {PEAK / 1e9:.0f} GFLOP/s, from {peak_from}.")
print(f"Ridge point P/BW = {PEAK / BW:.1f} FLOP per byte; a one-token pass does {c1['intensity']:.2f}.")
print(f"At S = {S0}, a one-token pass moves {c1['bytes'] / 1e6:.0f} MB: {1e3 * floor:.1f} ms at BW. "
      f"It took {1e3 * p0s.loc[1, 'median']:.1f} ms.")
print(f"The roofline puts the knee at {k0.knee_ideal:.1f} tokens; "
      + (f"the measured curve bends at {k0.knee_measured:.1f}." if k0.resolved else
         f"the measured curve is still flat at T = {T_max}."))

# %% [markdown]
# The figure places each measured pass by its arithmetic intensity (x) and the FLOP rate it reached (y). The
# slanted red line is the bandwidth ceiling, the flat one the compute ceiling. A pass on the line would run as fast
# as the hardware allows.

# %% tags=["hide-input"]
Ix = np.logspace(np.log10(passes.intensity.min() / 2), np.log10(max(passes.intensity.max(), PEAK / BW) * 4), 200)
shown_p = passes.assign(context="S = " + passes["S"].astype(str))
left_of_ridge = bool((passes[passes["T"] <= small_t].intensity < PEAK / BW).all())
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.plot(Ix, np.minimum(PEAK, Ix * BW) / 1e9, color="crimson", label="roofline (this run's ceilings)")
sns.scatterplot(data=shown_p, x="intensity", y="achieved_gflops", hue="context", size="T", sizes=(20, 160),
                palette=palette[:len(context_lengths)], ax=ax)
ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)", ylabel="achieved GFLOP/s")
ax.set_title(f"Passes over T ≤ {small_t} tokens sit left of the ridge: bound by memory" if left_of_ridge
             else "Measured passes against the roofline", fontsize=11)
ax.legend(fontsize=7, loc="lower right")
ch.savefig(fig, "roofline")

# %% [markdown]
# ## 3. Prefill versus decode
#
# A prompt can go through the model in one pass, the *prefill*: every weight is read once for all its tokens.
# Generation cannot do that, since each new token needs the one before it. So decoding pays one pass per token.
# The staircase feeds `prompt_len` prompt tokens and `decode_len` generated ones both ways, and plots the
# cumulative time. Each pass counts with the median of its `repeats` timings. Speculative decoding tries to
# flatten the second half of the staircase.

# %% tags=["hide-input"]
gen = torch.Generator().manual_seed(0)
prompt = torch.randint(0, arch.V, (prompt_len,), generator=gen)
tail = [torch.randint(0, arch.V, (1,), generator=gen) for _ in range(decode_len)]
modes = {"prefill, then one pass per token": [prompt] + tail,
         "one pass per token throughout": list(prompt.split(1)) + tail}
# each pass timed `warmup + repeats` times, the modes interleaved; a pass's time is the median of the timed ones
step_s = {mode: [[] for _ in steps] for mode, steps in modes.items()}
for rep in book.progress(range(warmup + repeats), desc="staircase"):
    for mode, steps in modes.items():
        pf.at_context(lm, 0)
        for j, x in enumerate(steps):
            pf.sync(dev)
            t = time.perf_counter()
            lm.forward(x, logits_to_keep=1)
            pf.sync(dev)
            if rep >= warmup:
                step_s[mode][j].append(time.perf_counter() - t)
stair = []
for mode, steps in modes.items():
    stair.append(dict(mode=mode, tokens=0, seconds=0.0))
    clock, done = 0.0, 0
    for x, ts in zip(steps, step_s[mode]):
        clock += float(np.median(ts))
        done += x.numel()
        stair.append(dict(mode=mode, tokens=done, seconds=clock))
stair = ch.save(pd.DataFrame(stair), "staircase")
tp = {m: d[d.tokens <= prompt_len].seconds.max() for m, d in stair.groupby("mode")}
one, each = tp["prefill, then one pass per token"], tp["one pass per token throughout"]
fig, ax = plt.subplots(figsize=(7, 4))
for (mode, d), col in zip(stair.groupby("mode"), palette):
    ax.step(d.tokens, d.seconds, where="post", label=mode, color=col)
ax.axvline(prompt_len, color="grey", ls=":", lw=1)
ax.set(xlabel="tokens processed (prompt, then generated)", ylabel="cumulative seconds")
ax.set_title(f"The {prompt_len}-token prompt in one pass: {each / one:.0f}× cheaper than token by token",
             fontsize=11)
ax.legend()
ch.savefig(fig, "staircase")
print(f"The prompt in one pass: {one:.2f} s; token by token: {each:.2f} s ({each / one:.1f}×).")
assert one < each, "a prefill pass should beat feeding the prompt token by token"

# %% [markdown]
# ## 4. Where the claim weakens
#
# The plateau ends at the knee, and two things bring the cost of extra tokens sooner. A long context adds bytes and
# FLOPs: every pass reads the whole KV cache, and attention's work grows with T·S. Implementation copies add bytes
# that a one-token pass does not pay. The table sets t(2)/t(1) at each context beside the roofline's prediction.
# It also gives the share of a pass's bytes that are not weights.

# %% tags=["hide-input"]
fails = passes[passes["T"].isin([1, 2])].pivot(index="S", columns="T", values="median")
fails.columns = ["t1_s", "t2_s"]
fails["t2_over_t1"] = fails.t2_s / fails.t1_s
fails["non_weight_share_T1"] = [1 - cost(1, S)["weight_bytes"] / cost(1, S)["bytes"] for S in fails.index]
fails["non_weight_share_T2"] = [1 - cost(2, S)["weight_bytes"] / cost(2, S)["bytes"] for S in fails.index]
fails["roof_t2_over_t1"] = [pf.roofline_time(cost(2, S), BW, PEAK) / pf.roofline_time(cost(1, S), BW, PEAK)
                            for S in fails.index]
ch.save(fails.reset_index(), "long_context")
lo, hi = fails.index.min(), fails.index.max()
eroded = fails.t2_over_t1[hi] > fails.t2_over_t1[lo] * (1 + erosion)
print(f"t(2)/t(1) was {fails.t2_over_t1[lo]:.2f} at S = {lo} and {fails.t2_over_t1[hi]:.2f} at S = {hi}; "
      f"the roofline says {fails.roof_t2_over_t1[lo]:.2f} and {fails.roof_t2_over_t1[hi]:.2f}.")
print("The plateau eroded from the shortest context to the longest in this run." if eroded else
      f"No erosion beyond {erosion:.0%} over the contexts this run measured.")
if (fails.t2_over_t1 < 1).any():
    print("A ratio below 1 means a two-row pass timed faster than a one-row pass: a kernel switch (Going deeper, D).")
fails[["t2_over_t1", "roof_t2_over_t1", "non_weight_share_T1", "non_weight_share_T2"]].round(3)

# %% [markdown]
# ## Going deeper
#
# The sections below hold the machinery behind the main path: every other measurement the chapter makes, with its
# tables and its checks. They are labelled A to I.
#
# ### A. Thread counts, and the ceilings in full
#
# The chapter runs on every core, as the rest of the book decodes. More threads are not always faster, though. A
# parallel operator waits for its slowest thread. On a machine shared with other work, one descheduled worker
# thread stalls every parallel region. The matmuls and the full pass can react differently. The matmul library may
# run a small problem on one thread, while attention and elementwise operators split theirs.
#
# The first table gives the ceilings at each thread count, in GB/s and GFLOP/s. The second times a one-token pass,
# and the model's matmuls alone, at each count (medians in ms). A difference inside the spread of t(1) chooses
# nothing. So the spread comes last: the median and the IQR (the interquartile range; [notation](notation.md)).

# %% tags=["hide-input"]
rows = []
for n in book.progress(thread_counts, desc="threads"):
    torch.set_num_threads(n)
    pf.at_context(lm, S0)
    s = pf.time_interleaved({"t(1)": pf.pass_fn(lm, 1, arch.V), "bare matmuls M=1": pf.linear_chain(target, 1)},
                            repeats=max(3, repeats), warmup=warmup, device=dev)
    for r in pf.summarize(s).itertuples():
        rows.append(dict(threads=n, what=r.name, median_ms=1e3 * r.median, q25_ms=1e3 * r.q25, q75_ms=1e3 * r.q75))
torch.set_num_threads(n_threads)
by_threads = pd.DataFrame(rows).merge(ceilings[["threads", "copy_gbps", "gemm_gflops"]], on="threads")
ch.save(by_threads, "threads")
n_fastest = int(by_threads[by_threads.what == "t(1)"].sort_values("median_ms").threads.iloc[0])
tt = by_threads[by_threads.what == "t(1)"].set_index("threads")
display(ceilings.set_index("threads")[["copy_gbps", "gemm_gflops", "linear_gflops", "peak_gflops",
                                       "ridge_flop_per_byte"]].round(2))
display(by_threads.pivot(index="what", columns="threads", values="median_ms").round(1))
print(f"MKL_CBWR={os.environ.get('MKL_CBWR') or '(MKL default)'}. t(1) by thread count, median (IQR) in ms:")
for n, r in tt.iterrows():
    print(f"  {n} thread(s): {r.median_ms:.1f} ({r.q25_ms:.1f}–{r.q75_ms:.1f})")
if n_fastest != n_threads:
    lo_f, hi_a = tt.loc[n_fastest, "q75_ms"], tt.loc[n_threads, "q25_ms"]
    n_timed = max(3, repeats)  # timings per thread count: the sample the verdict rule reads
    print(f"The lowest median is at {n_fastest} thread(s). "
          + ("Its IQR overlaps every core's: no order between them." if lo_f >= hi_a else
             f"Its IQR lies below every core's ({n_timed} timings each): "
             + report.judged(f"faster than every core here, so the curves above, on {n_threads}, are slower than "
                             "they need be", n_timed) + "."))

# %% [markdown]
# ### B. What one pass moves and computes
#
# `profiling.pass_cost` counts, for T new tokens after S cached ones:
#
# - Every weight, read once, the LM head included.
# - The KV cache, read (S + T positions) and written (T positions).
# - The inputs and outputs of every matmul (the activations).
# - The FLOPs of the matmuls (about two per parameter and token) and of attention (QKᵀ and PV).
#
# One detail matters at long context. With grouped-query attention the cache holds fewer key/value heads than
# query heads. An attention kernel may read them as stored, or first copy them out to every query head. Section 2
# observed which one this run does, rather than assume it.

# %% tags=["hide-input"]
print("Attention reads the K/V heads as stored, without a copy to every query head: "
      + "; ".join(f"T = {T}: {'yes' if v else 'no (copied)'}" for T, v in gqa_native.items()) + ".")
print(f"{model}: {arch}")
print(f"T = 1, S = {S0}: {c1['flops'] / 1e6:.0f} MFLOP over {c1['bytes'] / 1e6:.0f} MB, "
      f"an intensity of {c1['intensity']:.3f} FLOP/byte (ridge point {PEAK / BW:.2f}).")
breakdown = pd.DataFrame({
    "MB": {k: c1[k] / 1e6 for k in ("weight_bytes", "kv_read_bytes", "kv_write_bytes", "act_bytes", "bytes")},
})
breakdown.round(2)

# %% [markdown]
# The next figure sets every pass's arithmetic intensity against the ridge point, by context length. Where a curve
# crosses the red line, the roofline says the pass turns compute-bound: that T is the predicted knee.

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(6.5, 4))
sns.lineplot(data=acc.assign(context="S = " + acc["S"].astype(str)), x="T", y="intensity", hue="context",
             marker="o", palette=palette[:len(context_lengths)], ax=ax)
ax.axhline(PEAK / BW, color="crimson", ls="--", label=f"ridge point {PEAK / BW:.2f} FLOP/B")
ax.set(xscale="log", yscale="log", xlabel="new tokens per pass T", ylabel="FLOP per byte moved")
ax.set_title(f"A pass's intensity crosses the ridge point near T = {knee_ideal[S0]:.0f} (S = {S0})", fontsize=11)
ax.legend()
ch.savefig(fig, "intensity")
print("Knee predicted from the ridge point: " + ", ".join(f"{k:.1f} tokens at S = {S}" for S, k in knee_ideal.items()))

# %% [markdown]
# ### C. The pass times in full
#
# The table holds every timed pass: its median and quartiles in seconds, its ratio, the roofline's ratio and the
# rates it reached. The log–log figure adds the roofline's prediction at S = `S0` and the model's matmuls alone.
# Those run with M = T input rows through the modules the pass calls, without the rest of the pass.

# %% tags=["hide-input"]
long = pd.concat([passes.assign(curve="measured, S = " + passes["S"].astype(str), y=passes["ratio"]),
                  passes[passes.S == S0].assign(curve=f"roofline (ceilings), S = {S0}", y=lambda d: d["roof_ratio"])])
fig, ax = plt.subplots(figsize=(7, 4.5))
sns.lineplot(data=long, x="T", y="y", hue="curve", marker="o", palette=palette[:long.curve.nunique()], ax=ax)
ax.plot(mm_curve["T"], mm_curve["ratio"], color="black", marker="x", lw=1, label="bare matmuls, M = T")
ax.plot(token_counts, token_counts, color="grey", lw=0.8, ls=":", label="t ∝ T (no sharing)")
ax.axhline(1, color="black", lw=0.8)
ax.set(xscale="log", yscale="log", xlabel="new tokens per pass T", ylabel="t(T) / t(1)")
ax.set_title(f"On log axes: flat up to the knee, then a climb toward t ∝ T ({model}, {tag})", fontsize=10)
ax.legend(fontsize=8)
ch.savefig(fig, "ratio_loglog")


def bumps(T, t):
    """Token counts whose time exceeds that of a larger T (as text): kernels worse than their neighbours."""
    T, t = list(T), list(t)
    return ", ".join(str(T[i]) for i in range(len(T) - 1) if t[i] > min(t[i + 1:])) or "none"


print("T whose median pass timed slower than a pass over more tokens (a kernel switch, or noise where IQRs overlap):")
for S, d in passes.groupby("S"):
    print(f"  the model at S = {S}: T = {bumps(d['T'], d['median'])}")
print(f"  the bare matmuls: T = {bumps(mm_curve['T'], mm_curve['median'])}")
passes[["S", "T", "median", "q25", "q75", "ratio", "roof_ratio", "achieved_gbps", "achieved_gflops"]].round(4)

# %% [markdown]
# ### D. The matmul library decides the verify cost
#
# On x86 CPUs, torch hands float32 matrix products to Intel MKL, which decides how to run each one. With its
# default choices, MKL may run a product with a few input rows on one thread, however many are allowed. A few rows
# (M = 2 to 16) is the shape of every verification pass. Then a 2-row product costs about two matrix–vector
# products. `MKL_CBWR=AUTO` is MKL's reproducible mode: the best path for this CPU, with a fixed summation order.
# It can spread those products over the threads instead. `import specdec_core` sets it, unless the variable is
# already set (`MKL_CBWR=` keeps MKL's default).
#
# Even then, a general matrix-multiply library is built for large products. On every call it copies both operands
# into panels shaped for its inner kernel. It picks a tile shape and a split over threads from the three
# dimensions. With M = 4 the panels and tiles are mostly empty. On some CPUs a 5-token pass then costs well over one
# pass, though it reads the same weights. The 2-core Intel Xeon with AVX-512 this chapter was written on is one.
#
# The library's CPU kernel (`specdec_core/kernels/rows.cpp`) is built for exactly this shape. The weights are packed
# once, when the model loads, into column blocks that each thread streams front to back. A tile of up to 14 token
# rows (AVX-512) keeps its partial sums in registers. So the weights are read once for all rows, while the
# multiply–adds run in the shadow of the memory stream. Attention runs each query over the keys its mask leaves
# open, in a fixed order.
#
# Every output is one accumulator in a fixed order. So a position's logits do not depend on how many positions
# share the pass: row invariance, tested in `tests/test_kernels.py`. At its first load on a machine, the library
# times both paths on the target's own layers (`kernels.decide`, cached in `build/kernels/`). It keeps the kernel
# where it saves time over the few-token passes taken together. `SPECDEC_CPU_KERNEL=rows|torch` overrides the
# choice, and the whole book runs on the path it chose.
#
# MKL reads its variable once per process, so each setting is timed in a fresh subprocess
# (`blas.compare_paths`). The settings run one after the other, at every thread count of section A. The figure
# shows t(T)/t(1) under each, for the model's passes and for its matmuls alone.

# %% tags=["hide-input"]
if dev.type == "cpu" and "mkl" in torch.__config__.show().lower():
    blas_df = blas.compare_paths(model, token_counts=blas_token_counts, context=S0, repeats=repeats,
                                 threads=thread_counts)
    ch.save(blas_df, "blas_paths")
    g = sns.relplot(data=blas_df, x="T", y="ratio", hue="setting", style="threads", col="what", kind="line",
                    marker="o", height=3.6, aspect=1.25, palette=palette[:blas_df.setting.nunique()])
    g.set(xlabel="new tokens per pass T", ylabel="t(T) / t(1)", xticks=sorted(blas_df["T"].unique()))
    g.set_titles("{col_name}")
    for ax in g.axes.flat:
        ax.axhline(1, color="black", lw=0.8)
    g.fig.suptitle(f"The CPU path decides what a pass over T tokens costs ({model}, {tag})", y=1.04)
    ch.savefig(g.fig, "blas_paths")
    print("A pass over T tokens in one-token passes, by thread count and setting:")
    display(blas_df[blas_df.what == "pass"].pivot_table(index="T", columns=["threads", "setting"],
                                                        values="ratio").round(2))
else:
    blas_df = None
    print(f"{tag}: torch's matmuls here do not go through MKL on a CPU; nothing to compare")
print(f"The library runs this target on: {kernels.path_of(target)} "
      f"({'the CPU kernel' if kernels.path_of(target) == 'rows' else 'torch'}'s matmuls for passes of few tokens).")

# %% [markdown]
# The table below gives each path's costs at the thread count the chapter uses. It sets each path's one-token pass
# beside the time to read the weights once at the copy bandwidth of section 2.

# %% tags=["hide-input"]
if blas_df is not None:
    bp = blas_df[(blas_df.what == "pass") & (blas_df.threads == n_threads)]
    cmp_ = bp.pivot_table(index="T", columns="setting", values="ratio")
    t1_paths = bp[bp["T"] == 1].set_index("setting")["median"]
    floor_s = c1["weight_bytes"] / BW
    paths = cmp_[cmp_.index > 1].T.rename(columns=lambda T: f"T = {T}").rename_axis(columns=None)
    paths["t(1) ms"] = 1e3 * t1_paths
    paths["t(1) ÷ weights' read"] = t1_paths / floor_s
    display(paths.round(2))
    best = {T: cmp_.loc[T].idxmin() for T in cmp_.index if T > 1}
    print(f"The weights' read at the copy bandwidth takes {1e3 * floor_s:.1f} ms. The cheapest path for each T:")
    for T, name in best.items():
        print(f"  T = {T}: {name}")
else:
    cmp_ = None
    print("no MKL on this device: nothing to compare")

# %% [markdown]
# Chapters 3–6 decode by default on every core, with `MKL_CBWR=AUTO`, on the CPU path the calibration chose. Rerun
# one with `SPECDEC_CPU_KERNEL=torch` (or `MKL_CBWR=`) in the environment to see its speedups on the other path.

# %% [markdown]
# ### E. The knee: predicted versus measured
#
# *Predicted*: the T at which the roofline's compute time overtakes its memory time (the ridge point, expressed in
# tokens). *Measured*: the knee of the shape `max(a, s·T)` fitted to the measured curve, by least squares on log t
# (`profiling.fit_roofline`). Here `a` is the plateau, `s` the cost of one more token above the knee, and the knee
# is `a/s`.
#
# The ideal prediction assumes the pass runs *at* both ceilings. It does not, on either side, and the two shortfalls
# move the knee in opposite directions:
#
# - Memory side, `m = t(1) / (B(1)/BW)`: how far the one-token pass sits above its weight-streaming floor (section F
#   takes this apart). A higher plateau pushes the knee **right**;
# - Compute side, `c = s_mm / (F₁/P)`: the model's matmuls alone, at M = max(T) rows, per token, against the compute
#   ceiling. Slower large-T matmuls pull the knee **left**. (This `c` is not the draft's cost c of later chapters.)
#
# Both are measured apart from the fit. So the *corrected* prediction, `knee_ideal · m / c`, is a real test of the
# explanation.

# %% tags=["hide-input"]
display(knees.round(2))


def within(ratio):
    return 1 / knee_tolerance <= ratio <= knee_tolerance


print(f"S = {S0}: knee predicted from the ridge point {k0.knee_ideal:.1f} tokens, measured {k0.knee_measured:.1f} "
      f"(fit residual {k0.fit_rms_log:.2f} in log t).")
print(f"  The ideal prediction is within ×{knee_tolerance:g}: {within(k0.ideal_over_measured)} "
      f"(ratio {k0.ideal_over_measured:.2f}).")
print(f"  Memory side m = {k0.m:.2f} (t(1) against its floor of {k0.floor_ms:.1f} ms); compute side c = {k0.c:.2f}.")
print(f"  The corrected prediction is {k0.knee_corrected:.1f} tokens (ratio {k0.corrected_over_measured:.2f}).")
off = lambda r: abs(np.log(r))  # distance from the measured knee, either way
closer = [int(S) for S, r in knees.set_index("S").iterrows()
          if off(r.corrected_over_measured) < off(r.ideal_over_measured)]
further = [int(S) for S in knees.S if int(S) not in closer]
print("  The correction moved the prediction closer to the measured knee at S = "
      f"{', '.join(map(str, closer)) or 'none'}.")
if further:
    print(f"  It moved it further at S = {', '.join(map(str, further))}: "
          "there the two shortfalls do not explain the knee.")


def knee_claim(holds: bool, failure: str) -> None:
    """The roofline's claim about the knee: asserted for the book's own target (where the chapter makes it);
    for a pair of one's own, a miss is this model's finding, printed, not an error."""
    if ch.own_pair:
        assert holds, failure
    elif not holds:
        print(f"  for this model the roofline misses: {failure}")


if k0.resolved:
    knee_claim(within(k0.ideal_over_measured) or within(k0.corrected_over_measured),
               f"neither the ridge-point knee ({k0.knee_ideal:.1f}) nor the corrected one ({k0.knee_corrected:.1f}) is "
               f"within x{knee_tolerance} of the measured knee ({k0.knee_measured:.1f})")
else:  # flat through the largest T measured: the knee lies beyond it, and a prediction must say so too
    print(f"  The measured curve is still flat at T = {T_max}: the knee lies beyond the range measured.")
    knee_claim(max(k0.knee_ideal, k0.knee_corrected) >= T_max / knee_tolerance,
               f"the curve is flat through T={T_max} but both predictions put the knee well below it")

# %% [markdown]
# ### F. Why the one-token pass sits above its floor
#
# The floor is B(1)/BW: the bytes of a one-token pass at the measured copy bandwidth. The measured t(1) sits above
# it. Six measurements at the thread count in use take the difference apart:
#
# 1. **The model's matmuls alone, on the pass's path.** Every linear layer (7 per layer and the LM head) is called
#    on a one-row input, through the modules the pass calls. That is the library's CPU kernel, where it is installed.
# 2. The same matrices through torch's `F.linear`, as stored (`[out, in]`): another kernel path for the same bytes.
# 3. The same matrices **stored transposed** (`x @ W` on `[in, out]`): a third path.
# 4. A **dispatch twin**: the same architecture with tiny widths, on the same path, so every kernel is nearly free.
#    What remains is Python, module calls, mask and cache bookkeeping, and per-operator dispatch.
# 5. The twin's linear layers alone: the cost of calling the modules, which item 1 also pays.
# 6. The **profiler**: per-operator self time of a real one-token pass. It cannot see inside the CPU kernel, so the
#    linear layers are marked as one range (`profiling.profile_ops(..., modules=...)`).
#
# The bar splits t(1) into two parts that sum to it: the matmuls' own work (item 1 less item 5), and the rest. The
# rest is the framework's dispatch and the other operators. The chapter asserts that neither part is negative. The
# twin (item 4) then says how much of the rest is dispatch alone. What remains, the other operators at full size, is
# small. Its spread over the timing rounds is printed beside it, since it can be too small to tell from zero.
#
# The floor is drawn as a line, not as a part of the bar. It is a guide, not a bound: a copy also writes, and on
# some CPUs a stream that only reads (as a matmul reads its weights) runs faster than a copy.

# %% tags=["hide-input"]
weights_T = [w.t().contiguous() for w in weights]  # a second copy, laid out [in, out]
on_rows = kernels.path_of(target) == "rows"
twin = pf.dispatch_twin(cfg, dt, dev, head_dim=kernels.load().LANES if on_rows else 4)
if on_rows:  # the twin takes the pass's path: its linear layers and its attention through the kernel
    kernels.install(twin, max(m.max_rows for m in kernels.linears(target) if isinstance(m, kernels.RowsLinear)))
lm_twin = CachedLM(twin, S0 + 8)
pf.at_context(lm_twin, S0)
pf.at_context(lm, S0)
g_samples = pf.time_interleaved({
    "t(1)": pf.pass_fn(lm, 1, arch.V),
    "bare matmuls, the pass's path": pf.linear_chain(target, 1),
    "bare matmuls, F.linear [out,in]": pf.matmul_chain(weights, 1),
    "bare matmuls, x @ W [in,out]": pf.matmul_chain(weights_T, 1, transposed=True),
    "dispatch twin t(1)": pf.pass_fn(lm_twin, 1, twin.config.vocab_size),
    "dispatch twin, its linears alone": pf.linear_chain(twin, 1),
}, repeats=max(5, repeats), warmup=warmup, device=dev)
g = pf.summarize(g_samples).set_index("name")
del weights_T
t1_sec6 = 1e3 * g.loc["t(1)", ["median", "q25", "q75"]].to_numpy(dtype=float)


@contextlib.contextmanager
def quiet_fds():
    """Kineto, the torch profiler's back end, writes 'USDT: ... profiler_start/stop' lines from C++ straight to
    the process's file descriptors: no logger or warning filter reaches them, so the profiled call mutes fds 1-2
    (Python's own prints go through the notebook's streams, not these descriptors)."""
    saved = [os.dup(fd) for fd in (1, 2)]
    with open(os.devnull, "w") as null:
        for fd in (1, 2):
            os.dup2(null.fileno(), fd)
        try:
            yield
        finally:
            for fd, s in zip((1, 2), saved):
                os.dup2(s, fd)
                os.close(s)


with quiet_fds():  # the linear layers marked as one range: the profiler sees the kernel's matmuls through it
    prof = pf.profile_ops(pf.pass_fn(lm, 1, arch.V), dev, repeats=3, modules=kernels.linears(target))
prof_mm = float(prof.set_index("op").total_s.get(pf.MODULES_RANGE, 0.0))  # time inside the linear layers
ch.save(prof.head(25), "profile_t1")
prof.head(12).round(5)  # self time: the operator's own work, children excluded

# %% tags=["hide-input"]
t1 = g.loc["t(1)", "median"]
t_mm = g.loc["bare matmuls, the pass's path", "median"]
t_lin = g.loc["bare matmuls, F.linear [out,in]", "median"]
t_call = g.loc["dispatch twin, its linears alone", "median"]
t_twin = g.loc["dispatch twin t(1)", "median"]
w_bytes = sum(w.numel() for w in weights) * b
w_floor = w_bytes / BW  # the matmuls' share of the floor: their weights at the copy bandwidth
t_work = t_mm - t_call  # the matmuls' own work: calling the modules is in the twin's pass
gap = pd.DataFrame([
    ("the matmuls' own work", t_work),
    ("dispatch and the other operators", t1 - t_work),
], columns=["part", "seconds"])
gap["ms"] = 1e3 * gap.seconds
gap["share"] = gap.seconds / t1
ch.save(gap, "gap_t1")
assert np.isclose(gap.seconds.sum(), t1, rtol=1e-9, atol=0), "the parts of t(1) must sum to t(1)"
negative = gap[gap.seconds < 0]
assert negative.empty, ("a part of t(1) came out negative, so these timings do not take the pass apart: "
                        + "; ".join(f"{r.part} {r.ms:.2f} ms" for r in negative.itertuples())
                        + " (timed under load? run the chapter alone)")
print(f"t(1) = {1e3 * t1:.1f} ms; floor {1e3 * floor:.1f} ms ({c1['bytes'] / 1e6:.0f} MB at {BW / 1e9:.1f} GB/s).")
print(f"Achieved bandwidth at T = 1: {c1['bytes'] / t1 / 1e9:.1f} GB/s, "
      f"{c1['bytes'] / t1 / BW:.0%} of the copy bandwidth.")
print(f"Bare matmuls stream their weights at {w_bytes / t_mm / 1e9:.1f} GB/s on the pass's path, "
      f"{w_bytes / t_lin / 1e9:.1f} GB/s through F.linear, "
      f"{w_bytes / g.loc['bare matmuls, x @ W [in,out]', 'median'] / 1e9:.1f} GB/s transposed.")
print(f"Profiler: {1e3 * prof_mm:.1f} ms inside the linear layers, of a {1e3 * prof.attrs['wall_s']:.1f} ms pass "
      f"({prof_mm / prof.attrs['wall_s']:.0%}); bare matmuls on the pass's path {1e3 * t_mm:.1f} ms.")
print(f"Calling the linear layers alone (the twin's) costs {1e3 * t_call:.2f} ms.")
# the third part split with the dispatch twin: what is left for the other operators at full size, round by round
by_round = g_samples.pivot(index="repeat", columns="name", values="seconds")
work_by_round = by_round["bare matmuls, the pass's path"] - by_round["dispatch twin, its linears alone"]
full_ops = 1e3 * (by_round["t(1)"] - work_by_round - by_round["dispatch twin t(1)"])
rest_split = pd.DataFrame([
    dict(part="framework dispatch (tiny twin)", ms=1e3 * t_twin,
         q25_ms=1e3 * g.loc["dispatch twin t(1)", "q25"], q75_ms=1e3 * g.loc["dispatch twin t(1)", "q75"]),
    dict(part="other operators at full size", ms=full_ops.median(),
         q25_ms=full_ops.quantile(0.25), q75_ms=full_ops.quantile(0.75))])
ch.save(rest_split, "gap_t1_rest")
print(f"Of the rest's {gap.ms.iloc[1]:.1f} ms, the dispatch twin's whole pass takes {1e3 * t_twin:.1f} ms.")
print(f"The other operators at full size add {full_ops.median():.1f} ms a round "
      f"(IQR {full_ops.quantile(0.25):.1f} to {full_ops.quantile(0.75):.1f} over {len(full_ops)} rounds)"
      + (": not resolved from zero." if full_ops.quantile(0.25) <= 0 <= full_ops.quantile(0.75) else "."))
gap[["part", "ms", "share"]].round(3)

# %% [markdown]
# The decomposition as one bar (left), beside the profiler's top operators by self time (right).

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw=dict(width_ratios=[1.1, 1], wspace=0.45))
left = 0.0
for (part, ms), col in zip(gap[["part", "ms"]].itertuples(index=False), palette):
    axes[0].barh(["t(1)"], [ms], left=left, color=col, label=f"{part}: {ms:.1f} ms")
    left += ms
axes[0].axvline(1e3 * floor, color="crimson", ls="--", label=f"weight-streaming floor B(1)/BW: {1e3 * floor:.1f} ms")
axes[0].set(xlabel="ms", xlim=(0, 1.05 * 1e3 * max(t1, floor)))
axes[0].set_title(f"t(1) = {1e3 * t1:.1f} ms is {t1 / floor:.1f}× its floor: where it goes", fontsize=10)
axes[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))
top = prof.head(10).assign(ms=lambda d: 1e3 * d.self_s, op=lambda d: d.op.str.removeprefix("aten::").str.lstrip("_").str.slice(0, 24))
sns.barplot(data=top, y="op", x="ms", ax=axes[1], color=palette[0])
axes[1].set(xscale="log", ylabel="", xlabel="ms (log)")
axes[1].set_title("Profiler: self time per pass, top operators", fontsize=10)
ch.savefig(fig, "gap_t1")

# %% [markdown]
# Which matrices are slow? Each of the model's shapes is timed as a chain over all layers, through the modules the
# pass calls, against the copy bandwidth. A shape whose matrices, all layers together, fit in the last-level cache
# need not come from memory. It could beat the copy bandwidth; the table's last column says whether any did.

# %% tags=["hide-input"]
by_shape = {}
for name, mod in target.named_modules():
    if isinstance(mod, torch.nn.Linear):
        by_shape.setdefault(name.split(".")[-1], []).append(mod)
shape_t = pf.summarize(pf.time_interleaved({k: pf.linear_chain(torch.nn.ModuleList(v), 1) for k, v in by_shape.items()},
                                           repeats=3 * max(3, repeats), warmup=warmup, device=dev))
shape_t["shape"] = [tuple(by_shape[k][0].weight.shape) for k in shape_t.name]
shape_t["MB"] = [sum(m.weight.nbytes for m in by_shape[k]) / 1e6 for k in shape_t.name]
shape_t["gbps"] = shape_t.MB / 1e3 / shape_t["median"]
shape_t["of_copy_bw"] = shape_t.gbps / (BW / 1e9)
ch.save(shape_t, "matmul_shapes_m1")
slowest = shape_t.sort_values("gbps").name.iloc[0]
fig, ax = plt.subplots(figsize=(6.5, 3.5))
sns.barplot(data=shape_t, x="name", y="gbps", color=palette[0], ax=ax)
ax.axhline(BW / 1e9, color="crimson", ls="--", label="copy bandwidth")
ax.set(xlabel="", ylabel="GB/s at M = 1")
ax.set_title(f"Weight-streaming rate of each shape at one row: {slowest} is the slowest", fontsize=10)
ax.tick_params(axis="x", rotation=30)
ax.legend()
ch.savefig(fig, "matmul_shapes")
shape_t[["name", "shape", "MB", "median", "gbps", "of_copy_bw"]].round(3)

# %% tags=["hide-input"]
# Two consistency checks between measurements of this run, reported rather than asserted: both fail when another
# process shares the cores during one of the measurements (the reader's remedy: run the chapter alone)
floor_ratio = t_work / w_floor
print(f"The matmuls' work at M = 1 takes {floor_ratio:.2f}× the time the copy bandwidth allows for their weights.")
print("A matmul streams its weights no faster than a copy here." if floor_ratio >= 1 else
      "The matmuls read their weights faster than a copy moves them: a copy also writes, so a read-only stream "
      "can beat it." if floor_ratio > floor_share else
      "INCONSISTENT, far faster than a copy: the bandwidth or the matmuls were timed under load; rerun alone.")
if dev.type == "cpu":  # on CUDA the profiler reports kernel time, the bare matmuls wall time (launches)
    agree = 1 / profiler_factor < prof_mm / t_mm < profiler_factor  # a consistency check, not a verdict
    print(f"The profiler's time in the linear layers is {1e3 * prof_mm:.1f} ms; "
          f"the bare matmuls took {1e3 * t_mm:.1f} ms.")
    print(f"They are within a factor {profiler_factor:g}: consistent." if agree else
          f"They differ by more than a factor {profiler_factor:g}: INCONSISTENT. Timed under load? Rerun alone.")

# %% [markdown]
# ### G. Scale: the same curves on larger random-weight models
#
# Timing does not depend on weight values. So random-weight Llama models with the *shapes* of public models stand
# in for trained ones (`profiling.LLAMA_SHAPES`; labelled "random weights" everywhere). Their weights are a tiled
# random block: no NaNs, and no denormals, which would slow a CPU. They run on torch's matmuls. The figure sets
# t(T)/t(1) of every size side by side.

# %% tags=["hide-input"]
scale_rows = []
p0 = passes[passes.S == S0]
for T, t in zip(p0["T"], p0["median"]):
    scale_rows.append(dict(model=f"{model} (trained)", params=P_params, T=T, median=t))
for size in scale_models:  # one line per model below; no outer bar, which would nest the timing bar
    t0 = time.perf_counter()
    big = pf.random_llama(size, dt, dev)
    n_par = sum(p.numel() for p in big.parameters())
    lm_big = CachedLM(big, S0 + max(scale_token_counts))
    pf.at_context(lm_big, S0)
    s = pf.summarize(pf.time_interleaved({T: pf.pass_fn(lm_big, T, big.config.vocab_size) for T in scale_token_counts},
                                         repeats=scale_repeats, warmup=warmup, device=dev, progress=True))
    for r in s.itertuples():
        scale_rows.append(dict(model=big.label, params=n_par, T=r.name, median=r.median))
    print(f"{big.label}: {n_par / 1e9:.2f} B parameters, built and timed in {time.perf_counter() - t0:.0f} s")
    del big, lm_big
    gc.collect()
scale = pd.DataFrame(scale_rows)
rows = []
for name, d in scale.groupby("model", sort=False):
    size = name.split()[0].removeprefix("llama-")
    c_cfg = cfg if "trained" in name else pf.llama_config(size)
    ck = pf.pass_cost(c_cfg, 1, S0, b)
    t1m = d[d["T"] == 1]["median"].iloc[0]
    fit = pf.fit_roofline(d["T"], d["median"]) if len(d) >= 3 else dict(knee=np.nan, resolved=False)
    rows.append(dict(model=name, params=d.params.iloc[0], t1_ms=1e3 * t1m, floor_ms=1e3 * ck["bytes"] / BW,
                     achieved_gbps_t1=ck["bytes"] / t1m / 1e9, of_copy_bw=ck["bytes"] / t1m / BW,
                     knee_ideal=pf.roofline_knee(c_cfg, S0, b, BW, PEAK, gqa_expanded=expanded[2]),
                     knee_measured=fit["knee"], knee_resolved=fit["resolved"]))
scale_summary = ch.save(pd.DataFrame(rows), "scale_summary")
scale = scale.sort_values(["params", "T"]).reset_index(drop=True)
scale["ratio"] = scale["median"] / scale["model"].map(scale[scale["T"] == 1].set_index("model")["median"])
ch.save(scale, "scale_times")
fig, ax = plt.subplots(figsize=(7, 4.5))
sns.lineplot(data=scale, x="T", y="ratio", hue="model", marker="o", palette=palette[:scale.model.nunique()], ax=ax)
ax.plot(token_counts, token_counts, color="grey", lw=0.8, ls=":", label="t ∝ T")
ax.set(xscale="log", yscale="log", xlabel="new tokens per pass T", ylabel="t(T) / t(1)")
ax.set_title(f"Larger models stay flat as far or further ({tag}, S = {S0})", fontsize=11)
ax.legend(fontsize=8)
ch.savefig(fig, "scale")
scale_summary.round(3)

# %% [markdown]
# ### H. The same curves on a GPU (the committed reference run)
#
# `make gpu-reference` runs this chapter's measurements on a GPU in one command (`data/reference/README.md`). Its
# tables are committed under `data/reference/cuda-<device>/`. They come from another machine and another run. So
# only what is dimensionless is set beside this run's: the ridge point (FLOP per byte) and t(T)/t(1).
#
# On a GPU a small model's eager pass can be bound by kernel launches and Python rather than by memory (gpt-fast's
# lesson). The `graph` rows replay the same pass as one captured CUDA graph, timed in `data/reference/cuda-nvidia-h200/steps.csv`
# (the library's own graph path is not yet run on CUDA). The `core` rows are the library's eager pass, each pass timed alone on random weights of the
# model's shapes. The table says where each measured knee fell, and how far each t(1) sits above its
# weight-streaming floor.

# %% tags=["hide-input"]
gref = hardware.load_reference()
if not gref:
    print("no GPU reference run under data/reference/cuda-*/: run `make gpu-reference` on a GPU machine")
else:
    g_ceil = gref["ceilings"].iloc[0]
    ridge_here = PEAK / BW
    print(f"Ridge point: {gref['tag']} ({g_ceil['dtype']}) {g_ceil.ridge_flop_per_byte:.0f} FLOP/B; this run "
          f"({tag}, {dtype}) {ridge_here:.1f} FLOP/B: {g_ceil.ridge_flop_per_byte / ridge_here:.0f}× further right.")
    here = passes[passes.S == S0][["T", "ratio"]].assign(source=f"{tag} (this run), {model}, S={S0}")
    there = gref["pass_times"][gref["pass_times"]["mode"] == "graph"]  # eager GPU rows: launch-bound, in the table
    there = there.assign(source=gref["tag"] + ", " + there.model + ", graph, S=" + there.S.astype(str))
    there = there[["T", "ratio", "source"]]
    curves = pd.concat([here, there], ignore_index=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sns.lineplot(data=curves, x="T", y="ratio", hue="source", marker="o", palette=palette[:curves.source.nunique()],
                 ax=ax)
    ax.plot([1, curves["T"].max()], [1, curves["T"].max()], color="grey", lw=0.8, ls=":", label="t ∝ T")
    ax.set(xscale="log", yscale="log", xlabel="new tokens per pass T", ylabel="t(T) / t(1)",
           ylim=(0.8, 1.5 * curves.ratio.max()))
    ax.set_title("A GPU stays flat to hundreds of tokens, this CPU to a few", fontsize=11)
    ax.legend(fontsize=7)
    ch.savefig(fig, "gpu_side_by_side")
    t_top = int(gref["pass_times"]["T"].max())
    gk = gref["knees"][gref["knees"].source == gref["tag"]]
    gk = gk[["model", "mode", "t1_ms", "floor_ms", "of_copy_bw", "knee_ideal", "knee_measured", "knee_resolved"]]
    ch.save(gk, "gpu_knees")
    pt = gref["pass_times"]
    rise = pt[pt["T"] == t_top].set_index(["model", "mode"]).ratio  # t(T_max)/t(1): how much the curve rose at all
    shown_gk = gk.assign(**{f"t({t_top})/t(1)": [rise.get((r.model, r.mode), np.nan) for r in gk.itertuples()]})
    shown_gk["loose knee"] = shown_gk[f"t({t_top})/t(1)"] < loose_rise
    display(shown_gk.set_index(["model", "mode"]).round(3))
    display(Markdown(f"A knee is *loose* where t({t_top})/t(1) rose less than {loose_rise:g}×. The fit searches a "
                     "grid of 400 knees, so two such curves can land on the same one. A knee not resolved lies "
                     f"beyond T = {t_top}."))
    print(f"This run ({tag}): knee at the ridge point {k0.knee_ideal:.1f} tokens, measured {k0.knee_measured:.1f} "
          f"(S = {S0}).")

# %% [markdown]
# ### I. How repeatable the verdict is, and the ceilings checked
#
# This run timed t(1) three times: in section A's thread table, in section 1 and in section F. Their spread is the
# scale of any difference this chapter can resolve. Section D timed the verdict's setting once more, in its own
# process. The lines below say whether that second timing puts any T on the other side of the bar.
#
# Then the ceilings are checked. The compute ceiling P is the best rate any path reached, so no rate this run
# measured may exceed it. The chapter asserts that over every rate it measured: MKL's, the model's matmuls, every
# pass, section D's paths and section G's larger models.

# %% tags=["hide-input"]
t1_sections = {"section A": tt.loc[n_threads, ["median_ms", "q25_ms", "q75_ms"]].to_numpy(dtype=float),
               "section 1": 1e3 * p0s.loc[1, ["median", "q25", "q75"]].to_numpy(dtype=float),
               "section F": t1_sec6}
spread = max(v[0] for v in t1_sections.values()) / min(v[0] for v in t1_sections.values())
near_bar = [T for T in small if abs(p0s.loc[T, "ratio"] - one_pass) < spread - 1]
print("t(1) measured three times in this run, median (IQR) in ms:")
for k, v in t1_sections.items():
    print(f"  {k}: {v[0]:.1f} ({v[1]:.1f}–{v[2]:.1f})")
print(f"The medians differ by up to {100 * (spread - 1):.0f}%: the scale of any difference this chapter can resolve.")
if near_bar:
    print(f"T = {', '.join(map(str, near_bar))} lie{'s' if len(near_bar) == 1 else ''} that close to the bar.")
# the same setting timed again by section D, in its own process: the path this process runs
this_setting = (blas.KERNEL if kernels.path_of(target) == "rows" else
                f"{blas.VAR}={os.environ[blas.VAR]}" if os.environ.get(blas.VAR) else "MKL default")
ab = cmp_[this_setting] if cmp_ is not None and this_setting in cmp_.columns else None
if ab is None:
    print(f"Section D did not time this process's setting ({this_setting}) at {n_threads} thread(s).")
else:
    off_bar = {int(T): float(ab[T]) for T in holds if T in ab.index and ab[T] > one_pass}
    extra = {int(T): float(ab[T]) for T in ab.index if 1 < T <= small_t and T not in small}
    print(f"Section D timed the same setting ({this_setting}) again: "
          + ", ".join(f"T = {int(T)}: {ab[T]:.2f}" for T in ab.index if 1 < T <= small_t) + ".")
    if off_bar:  # the same setting timed twice: say so when the two disagree about the bar
        print(f"There T = {', '.join(map(str, off_bar))} came out above the bar. For these T the verdict depends on "
              "which of the two timings one takes: their spread is this run's repeatability.")
    else:
        print("No T that section 1 put within the bar came out above it there.")
    if extra:
        print("Section D also timed " + ", ".join(
            f"T = {T}: {r:.2f} ({'within' if r <= one_pass else 'above'} the bar)" for T, r in extra.items())
              + "; section 1 did not time these T.")

# every rate this run measured, against the compute ceiling (issue: a ceiling below a measured rate is no ceiling)
rates = [("MKL square matmul, best run", ceilings.gemm_gflops.max()),
         (f"the model's matmuls over {T_max} rows, best run", ceilings.linear_gflops.max())]
rates += [(f"pass, S = {r.S}, T = {r.T}", r.achieved_gflops) for r in passes.itertuples()]
rates += [(f"bare matmuls, T = {r.T}", r.gflops) for r in mm_curve.itertuples()]
if blas_df is not None:
    flops_of = {"pass": lambda T: cost(T, S0)["flops"], "bare matmuls": lambda T: lin_flops_tok * T}
    rates += [(f"{r.setting}, {r.what}, {r.threads} thread(s), T = {r.T}", flops_of[r.what](r.T) / r.median / 1e9)
              for r in blas_df.itertuples()]
for r in scale.itertuples():
    s_cfg = cfg if "trained" in r.model else pf.llama_config(r.model.split()[0].removeprefix("llama-"))
    rates.append((f"{r.model}, T = {r.T}", pf.pass_cost(s_cfg, int(r.T), S0, b)["flops"] / r.median / 1e9))
measured_rates = ch.save(pf.check_ceiling(rates, PEAK / 1e9), "measured_rates")  # raises on a rate above it
fastest = measured_rates.sort_values("gflops").iloc[-1]
print(f"No measured rate exceeds the compute ceiling of {PEAK / 1e9:.0f} GFLOP/s.")
print(f"The fastest: {fastest.what}, {fastest.gflops:.0f} GFLOP/s ({len(measured_rates)} rates checked).")
fast_pass = passes.sort_values("achieved_gbps").iloc[-1]
print(f"The pass that moved bytes fastest (S = {fast_pass.S}, T = {fast_pass['T']}) reached "
      f"{fast_pass.achieved_gbps:.1f} GB/s, {fast_pass.achieved_gbps / (BW / 1e9):.0%} of the copy bandwidth.")

# %% [markdown]
# This run in numbers:

# %% tags=["hide-input"]
g1 = gap.set_index("part")["ms"]
print(f"Device {tag}, {dtype}, {n_threads} thread(s).")
print(f"Ceilings: copy {BW / 1e9:.1f} GB/s (read + write), compute {PEAK / 1e9:.1f} GFLOP/s, "
      f"ridge point {PEAK / BW:.2f} FLOP/B.")
print(f"t(1) at S = {S0}: {1e3 * t1:.1f} ms; weight-streaming floor {1e3 * floor:.1f} ms; achieved "
      f"{c1['bytes'] / t1 / 1e9:.1f} GB/s = {c1['bytes'] / t1 / BW:.0%} of the copy bandwidth.")
print("Decomposition of t(1), ms:")
for k, v in g1.items():
    print(f"  {k}: {v:.1f}")
for r in rest_split.itertuples():
    print(f"    of the rest, {r.part}: {r.ms:.1f} (IQR {r.q25_ms:.1f} to {r.q75_ms:.1f})")
print(f"Knee at S = {S0}: ridge-point prediction {k0.knee_ideal:.1f}, measured {k0.knee_measured:.1f}, "
      f"corrected for the measured shortfalls {k0.knee_corrected:.1f} (tolerance ×{knee_tolerance:g}).")
print(f"t(T)/t(1) at T = {T_max}: {p0s.loc[T_max, 'ratio']:.1f} (no sharing would be {T_max}).")

# %% [markdown]
# ## Summary
#
# The numbers are this run's. `out_dir` holds the CSVs and figures; on a GPU the CSVs also go under
# `data/reference/<device>/`.

# %% tags=["hide-input"]
within_all = bool(small) and len(holds) == len(small)
summary = [
    (f"- **{'A verify pass costs about one pass' if within_all else 'The verdict'}.** A pass over 2 to {max(small)} "
     f"tokens cost {lo_r:.2f} to {hi_r:.2f} "
     f"one-token passes at S = {S0}: " + ("all within" if within_all else f"{len(holds)} of {len(small)} T within")
     + f" the {one_pass:g}× bar. The other chapters read this from `verdict.csv`.") if small else
    f"- **No verdict**: `token_counts` held no T from 2 to {small_t}.",
    f"- **Why.** A one-token pass reads about {c1['bytes'] / 1e6:.0f} MB. It took {k0.m:.1f}× the time the copy "
    "bandwidth allows for them, and one read serves every token of the pass. Section F shows where the rest goes.",
    f"- **The knee.** The roofline put it at {k0.knee_ideal:.0f} tokens at S = {S0}; "
    + (f"the measured curve bent at {k0.knee_measured:.0f}." if k0.resolved else
       f"the measured curve was still flat at T = {T_max}."),
    f"- **Prefill against decode.** Feeding the {prompt_len}-token prompt token by token cost {each / one:.0f}× its "
    "one-pass prefill: decoding pays one pass per token.",
    f"- **Long contexts.** t(2)/t(1) went from {fails.t2_over_t1[lo]:.2f} at S = {lo} to {fails.t2_over_t1[hi]:.2f} at "
    f"S = {hi}: " + ("the plateau eroded." if eroded else f"no erosion beyond {erosion:.0%} in this run."),
]
display(Markdown("\n".join(summary)))

# %% [markdown]
# ## Exercises
#
# 1. Run the chapter while another program loads the CPU, then again with `OMP_WAIT_POLICY=PASSIVE`
#    set in the environment of `make reproduce` (idle OpenMP workers sleep instead of spinning). How
#    do the two-thread rows of the thread table change? Which operator in the profile moves most?
# 2. Use `dtype="bfloat16"`. The weights halve; does t(1) halve? Measure the GEMM ceiling in bf16 on
#    this CPU and predict the new knee before running.
# 3. From `pass_cost`, derive the context length S at which the KV cache read equals the weight read
#    for SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B shapes. Why does grouped-query attention matter?
# 4. On a GPU (`device="cuda"`, `scale_models=["1b", "3b", "8b"]`), compare your CSVs with those under
#    `data/reference/`. Where does the knee move, and why is it so much further right?
# 5. The dispatch twin measures framework overhead. Wrap the model in `torch.compile` and rerun
#    section F: which slices of the bar shrink?
