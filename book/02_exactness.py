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
# # 2 · Exactness: the same output law, checked by tests that could fail
#
# **The question.** A speculative decoder lets a cheap draft guess tokens, and the target only checks them. Is the
# output still exactly what the target alone would produce, or only something close to it?
#
# **The answer.** It is exactly the same. With greedy decoding, every method emits the tokens of plain greedy
# decoding, one for one. With sampling, an accept rule keeps each drafted token with probability min(1, p/q).
# Here p is the target's next-token law and q the draft's ([notation](notation.md)). A rejected token is replaced
# by a draw from a residual law. The token that comes out then follows p, provided q is the law the draft really
# sampled from. The chapter proves this in a few lines, then tests every method against a toy model's exact law.
# Each test that does not reject states its power: the chance it would have caught a known bug. This run's
# verdicts and powers are in the summary at the end.
#
# The step under test is the one pictured in [chapter 0](00_quickstart.ipynb). The draft proposes K tokens, K
# being the draft length ([notation](notation.md)). One target pass checks them. The step keeps the accepted ones
# plus one token of the target's own.

# %% tags=["parameters"]
out_dir = "../build/book/02_exactness"  # figures and tables land here
params_name = None  # the parameter file's name, injected by scripts/run_book.py (banner)
alpha = 0.01                 # family-wise level (Holm) of each exactness gate; level of each negative control
borderline_factor = 3.0      # a p-value within this factor of its threshold (either side) is reported as borderline
threads = 1                  # torch threads: tiny models run fastest (and machine-independently) on one
# the toy pair and its enumerated law
vocab_size = 8
toy_seed = 0
draft_noise = 0.6            # how far the toy draft's logits stray from the target's (α printed below)
prompt = [4, 3, 1, 4, 7]
seq_len = 3                  # n: continuations of n tokens, V**n cells
min_expected = 5.0           # cells with a smaller expected count are pooled
# the goodness-of-fit family: method:drafter × setting × k ("@θ": generate(..., confidence=θ), an adaptive stop;
# "hybrid": prompt lookup, else the model draft; "adaptive": lookup or the model, from past acceptance; "jacobi":
# the target's own outputs on the last guess, tests/test_jacobi.py checks its law over longer continuations)
methods = ["autoregressive", "linear:model", "linear:ngram", "tree:model", "tree:ngram", "parallel:block",
           "linear:jacobi", "linear:hybrid", "linear:adaptive", "linear:model@0.6", "parallel:block@0.6", "tree:model@0.3"]
settings = [{"temperature": 1.0},  # each named by its knobs (ex.setting_name)
            {"temperature": 0.7, "top_k": 4},
            {"temperature": 1.0, "top_p": 0.8}]
ks = [1, 2]                  # draft lengths (tree depth, block size); k 1 makes the bonus count at n 3. A step
                             # drafts at most room − 1 tokens, so at n 3 a k 2 step drafts one, as k 1 does (its
                             # stops included); n 4 tests k 2 (V**4 cells: tests/test_adaptive.py's stop mutant)
n_family = 4000              # continuations per (method, setting, k)
seed0 = 0
own_seeds = {"linear:hybrid": 10**6}  # spec -> seed offset: its own seed stream (section 2 says why)
shared_check_n = 200         # seeds on which the hybrid is also run on the shared stream, to show what it would repeat
# the exact sampler repeated: per-repetition p-values (calibration), pooled samples (equivalence)
exact_spec = "linear:model"
exact_setting = {"temperature": 0.7, "top_k": 4}
exact_len = 2
exact_reps = 200
exact_n = 320                # continuations per repetition; the TV bound pools all exact_reps × exact_n
epsilon = 0.01               # equivalence margin: the notebook asserts TV(sampled law, p) < ε
calibration_sims = 2000      # multinomial repetitions under the exact law (the test's own calibration)
power_tvs = [0.01, 0.02]     # TVs for the power analysis
power_target = 0.99
power_check_tv = 0.05       # the analytic power is checked by simulation at this TV ...
power_check_power = 0.8     # ... at the N where the analytic power is this ...
power_check_runs = 400      # ... over this many simulated samples ...
power_check_tolerance = 0.1  # ... and simulation and analysis must agree within this
interval_confidence = 0.99  # confidence of the binomial intervals the acceptance and calibration checks use
second_level = 0.05         # the calibration checks this nominal level beside alpha
min_calibration_runs = 200  # the calibration needs at least this many runs of each source
min_power_reps = 10         # from this many mutant_reps on, the analytic power must reach power_target too
power_goal = 0.8            # the power a non-rejection should have against each named control at its Holm level
# negative controls (specdec_core.study.mutants.CONTROLS)
mutants = ["residual_from_p", "no_bonus", "bonus_wrong_row", "raw_logits_q", "no_min_residual",
           "accept_with_p", "typical_acceptance", "no_bonus_literal", "no_min_literal"]
n_mutant = 400               # continuations per control run (the CI size)
mutant_reps = 40             # independent runs per lossy control: power at the CI size
mutant_k = 1
# the embedded target
real_model = "smollm2-135m"
real_text = "one, two, three. one, two,"  # short, with repeats for the n-gram drafter
real_methods = ["linear:ngram", "linear:model", "tree:ngram", "tree:model", "parallel:block"]  # those the pair has run
real_setting = {"temperature": 1.0, "top_k": 4}
real_len = 3
real_k = 2
real_n = 600
# greedy
greedy_prompts = [[4, 3, 1, 4, 7], [1, 2, 3], [0]]
greedy_len = 24
greedy_ks = [1, 2, 4]
greedy_real_texts = ["What is the capital of France?", "Write a haiku about autumn leaves."]
greedy_real_len = 32
near_tie = 1e-3              # float32: a divergence is excused only where the top-2 logits differ by less
# section 8, auditing any decoder: transformers' generate, assisted generation and prompt lookup beside ours
audit_settings = [{"temperature": 1.0},
                  {"temperature": 0.7, "top_k": 4},  # a top-k that cuts V 8
                  {"temperature": 1.0, "top_p": 0.9}]
audit_prompt = [4, 3, 1, 4, 7]  # sections 2–5's: a repeated 4, so prompt lookup drafts within 3 tokens
audit_len = 3                # with k 2: a step's drafts and its bonus, or a rollback and the next step, fit inside
audit_k = 2                  # draft length of every speculative decoder audited
audit_n = 400                # toy pair: continuations per (decoder, setting)
audit_real_n = 100           # embedded target: continuations per (decoder, setting), and of the target's reference
audit_calibration = 1000     # simulated families under the exact law: the audit's false-positive rate
audit_real_mutant = "residual from p"  # the negative control run on the embedded target too (its power there)

# %% tags=["hide-input"]
import textwrap
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from IPython.display import Markdown, display
from scipy import stats

import specdec_core as sd
from specdec_core.sampling import SamplingParams, process_logits
from specdec_core.study import peers, report
from specdec_core.tools import book
from specdec_core.study import exactness as ex
from specdec_core.study import mutants as mu
from specdec_core.verify import overlap, speculative_sample

display(book.banner(params_name))
ch = book.setup(out_dir, threads=threads)  # no model yet: the toy pair first, the embedded target in section 4
t_start = time.perf_counter()
toy = sd.toy_pair(vocab_size=vocab_size, seed=toy_seed, draft_noise=draft_noise)
V = vocab_size
palette = sns.color_palette("colorblind")
run_specs = [spec for spec in methods if ex.unavailable(toy, spec) is None]
print(f"{len(run_specs)} of {len(methods)} methods run on the toy pair:")
print(textwrap.fill(", ".join(run_specs), 110))
for spec in methods:
    if spec not in run_specs:
        print(f"{spec:16s} SKIPPED: {ex.unavailable(toy, spec)}")

# %% [markdown]
# ## 1 · What "exact" means
#
# "Exact" is a claim about the output, and it comes in two forms.
#
# - **Greedy decoding** (temperature 0): every method emits the same tokens as autoregressive greedy decoding.
# - **Sampling**: every method's output follows the target's law p, as if the target had sampled each token itself.
#   This holds when the q used by the accept rule is exactly the law the draft sampled from.
#
# Greedy decoding is checked by comparing tokens (section 4). Sampling needs statistics. A sample can never prove
# two laws equal; it can only fail to see a difference. So every test below says how large a difference it could
# see: its power.
#
# Most tests run on a toy pair: a tiny target and draft over V = 8 tokens (`sd.toy_pair`). With so few tokens, the
# exact probability of every short continuation can be listed. Every sample comes from `sd.generate`, the code
# the rest of the book times, with seed `seed0 + i` for continuation i.

# %% [markdown]
# ## 2 · The accept rule, and why it gives p
#
# The draft proposes a token x drawn from q. The target accepts it with probability $\min\!\big(1, p(x)/q(x)\big)$.
# On a rejection, it draws a token from the **residual** law r instead:
#
# $$r = \frac{\max(0,\, p - q)}{\sum_y \max(0,\, p - q)(y)}.$$
#
# If all K drafts pass, the target adds a **bonus** token, a plain sample of p at the next position.
# For one position, the emitted token y then has probability:
#
# $$P(\text{emit } y) = q(y)\min\!\Big(1, \frac{p(y)}{q(y)}\Big) + P(\text{reject})\, r(y)
#   = \min(p, q)(y) + \Big(1 - \sum_z \min(p, q)(z)\Big)\, r(y).$$
#
# The rejection probability equals the residual's normalizer: $\sum \max(0, p - q) = 1 - \sum \min(p, q)$.
# So the second term is $\max(0, p - q)(y)$, and $\min(p, q) + \max(0, p - q) = p$.
# The next step starts from everything accepted so far. The chain rule then carries the argument to whole sequences.
#
# The same sum gives the acceptance rate α ([notation](notation.md)). It is the chance that a drafted token is
# kept: $\alpha = \sum_x \min(p, q)(x) = 1 - \mathrm{TV}(p, q)$. TV is the total variation distance between two
# laws, half their summed absolute difference ([notation](notation.md)).
#
# The proof needs one thing: the q in the rule must be the law the draft really sampled from. A draft that samples
# from one law and reports another breaks it (Going deeper catches such a bug, `raw_logits_q`).
#
# Here are p and q of the toy pair right after the prompt, at temperature 1.

# %% tags=["hide-input"]
params1 = SamplingParams(1.0)
ids = torch.tensor(prompt)
with torch.inference_mode():
    p0 = process_logits(toy.target(ids[None]).logits[0, -1], params1)
    q0 = process_logits(toy.drafters["model"].model(ids[None]).logits[0, -1], params1)
resid = (p0 - q0).clamp_min(0)
alpha0 = float(overlap(p0, q0))
law_df = pd.DataFrame({"token": np.arange(V), "p (target)": p0.numpy(), "q (draft)": q0.numpy(),
                       "min(p, q)": torch.minimum(p0, q0).numpy(), "residual": (resid / resid.sum()).numpy()})
fig, ax = plt.subplots(figsize=(9, 3.2))
law_df.melt("token", var_name="law", value_name="probability").pipe(
    lambda d: sns.barplot(d, x="token", y="probability", hue="law", palette=palette[:4], ax=ax))
ax.set_title(f"the draft keeps min(p, q); the residual refills the rest of p (α = {alpha0:.3f}, TV = {1 - alpha0:.3f})")
fig.tight_layout()
ch.savefig(fig, "theory_laws")

# %% [markdown]
# **The rule, by hand**. The rule is a plain function of the drafts, q and p. We call it many times on this one
# position, with one drafted token each time. The share of drafts it keeps must match α. The tokens it emits must
# follow p, which a Pearson X² test of their counts checks.

# %%
n_rule = 20000
gen = torch.Generator().manual_seed(seed0)
drafts = torch.multinomial(q0, n_rule, replacement=True, generator=gen)  # x ~ q
P2 = torch.stack([p0, p0])  # [K+1, V] with K = 1: the bonus row is p again (fine for the first token)
emitted, accepted = np.zeros(n_rule, dtype=np.int64), np.zeros(n_rule, dtype=bool)
for i in range(n_rule):
    toks, n_acc = speculative_sample(drafts[i:i + 1], q0[None], P2, gen)
    emitted[i], accepted[i] = int(toks[0]), n_acc == 1

# %% tags=["hide-input"]
rule_gof = ex.gof_test(np.bincount(emitted, minlength=V), p0.numpy(), min_expected)
lo, hi = ex.binomial_interval(int(accepted.sum()), n_rule, interval_confidence)
rule_acc = (float(accepted.mean()), lo, hi)  # for the summary (lo, hi are reused below)
display(Markdown(
    f"The rule kept {accepted.mean():.4f} of {n_rule:,} drafts. "
    f"The predicted α = Σ min(p, q) is {alpha0:.4f}, "
    + ("inside" if lo <= alpha0 <= hi else "OUTSIDE") + f" the measured {interval_confidence:.0%} interval {lo:.4f}–{hi:.4f}. "
    f"The emitted tokens against p (X² = {rule_gof.statistic:.1f}, df = {rule_gof.df}): "
    + ex.p_verdict(rule_gof.pvalue, alpha, borderline_factor) + "."))
assert lo <= alpha0 <= hi, "measured acceptance disagrees with α = Σ min(p, q)"
assert rule_gof.pvalue > alpha, "the rule's emitted token does not follow p"

# %% [markdown]
# ## 3 · The key test: every method against the exact law of whole continuations
#
# One position is not enough. A bug can hide in the bookkeeping between steps: the bonus token, a rollback, the
# next step's first draft. So the key test looks at whole continuations of n tokens (`seq_len`).
#
# For the toy target we list the exact probability of each of the Vⁿ continuations. Each method then samples N of
# them (`n_family`) with `sd.generate`. Pearson's X² compares the counts with the listed probabilities. Its p-value
# ranks X² among statistics simulated under the exact law, so it is valid at any N.
#
# The family runs every method under several sampling settings and draft lengths. The methods are linear, tree and
# parallel drafts, each with its drafters. A name with `@θ` stops drafting early once the draft's confidence falls
# below a threshold θ ([notation](notation.md)). Holm's correction keeps the chance of any false rejection, over
# the whole family, at the level `alpha` (0.01).

# %%
laws = {ex.setting_name(s): ex.sequence_law(toy.target, prompt, seq_len, ex.setting_params(s)) for s in settings}
t0 = time.perf_counter()
rows, family_samples = ex.gof_family(toy, prompt, run_specs, settings, ks, n_family, seq_len, seed0=seed0,
                                     min_expected=min_expected, threads=threads, seed_offsets=own_seeds)
family = pd.DataFrame(rows)
family_s = time.perf_counter() - t0

# %% tags=["hide-input"]
ch.save(family, "gof_family")
family_ok = bool((family.p_holm > alpha).all())
family["config"] = family.spec + " k=" + family.k.astype(str)
first_threshold = alpha / len(family)
fig, ax = plt.subplots(figsize=(9, 3.8))
sns.stripplot(family, x="pvalue", y="config", hue="setting", palette=palette[:len(settings)], ax=ax, size=8,
              jitter=False)
ax.set_xscale("log")
ax.axvline(first_threshold, color="crimson", ls="--", label=f"Holm's first threshold {alpha}/{len(family)} = {first_threshold:.1e}")
ax.set_xlim(min(1e-4, first_threshold / 2), 1.05)
crossed = int((family.pvalue <= first_threshold).sum())
ax.set_title("every p-value sits right of Holm's threshold: no method is rejected" if not crossed else
             f"{crossed} p-value(s) cross Holm's first threshold", fontsize=11)
ax.set(xlabel="p-value (log scale)", ylabel="")
ax.legend(fontsize=8, loc="lower left")
fig.tight_layout()
ch.savefig(fig, "gof_family_pvalues")
assert family_ok, family[family.p_holm <= alpha]

# %% [markdown]
# **Could the test have failed?** A test that does not reject proves little unless it could have rejected. Its
# power is the chance it rejects a known bug at this sample size. The library keeps a set of deliberately wrong
# samplers, the negative controls or *mutants* (`specdec_core.study.mutants`). The next cell runs each one and
# measures how far its law strays from p. The noncentral χ² law turns that distance into the family's power
# against it. Going deeper shows the controls one by one.

# %% tags=["hide-input"]
# the negative controls: each once at n_mutant (section "Negative controls" below prints them)
ctrl_rows, ctrl_samples = [], {}
t0 = time.perf_counter()
for name in mutants:
    c = mu.CONTROLS[name]
    g, s = ex.run_control(toy, prompt, name, n_mutant, seq_len, k=mutant_k, seed0=seed0, min_expected=min_expected,
                          threads=threads)
    ctrl_samples[name] = s
    harmless = name in mu.HARMLESS
    ctrl_rows.append(dict(mutant=name, bug=c["bug"], setting=ex.setting_name(c["setting"]), statistic=g.statistic,
                          df=g.df, impossible=g.impossible, pvalue=g.pvalue, pvalue_asymptotic=g.pvalue_asymptotic,
                          caught=g.pvalue < alpha, expected="pass" if harmless else "caught"))
ctrl = pd.DataFrame(ctrl_rows)
ctrl_s = time.perf_counter() - t0
ch.save(ctrl, "mutants")
literal_notes = []  # what the literal (harmless) forms did, printed with the controls below
ref = None  # the correct rule on the same seeds, when a literal control needs it
if "no_min_literal" in ctrl_samples:
    ref = ex.sample_sequences(toy.target, prompt, seq_len, n_mutant, ex.setting_params(mu.CONTROLS["no_min_literal"]["setting"]),
                              "linear", toy.drafters["model"], k=mutant_k, seed0=seed0, threads=threads)
    same = bool((ref.tokens == ctrl_samples["no_min_literal"].tokens).all())
    literal_notes.append(f"no_min_literal: outputs bit-identical to the correct rule on all {n_mutant} seeds: {same}")
    assert same
if "no_bonus_literal" in ctrl_samples:
    s = ctrl_samples["no_bonus_literal"]
    literal_notes.append(
        f"no_bonus_literal: {len(s.accepted)} steps for {n_mutant} continuations"
        + (f", against {len(ref.accepted)} for the correct rule on the same seeds" if ref is not None else "")
        + " (a step that discards its bonus token needs more steps)")
    literal_notes.append(f"no_bonus_literal: its law is still p: p-value {ctrl.set_index('mutant').pvalue['no_bonus_literal']:.3f}")
lossy = ctrl[ctrl.expected == "caught"]
harmless = ctrl[ctrl.expected == "pass"]
ctrl_border = ctrl[[ex.borderline(p_, alpha, borderline_factor) for p_ in ctrl.pvalue]]
assert lossy.caught.all(), f"mutants survived: {list(lossy[~lossy.caught].mutant)}"
assert not harmless.caught.any(), f"a harmless literal form was rejected: {list(harmless[harmless.caught].mutant)}"

# power by repetition at the CI size (mutant_reps > 0: the full run)
pw_rows, rep_counts = [], {}  # rep_counts: each control's samples pooled over its repetitions
t0 = time.perf_counter()
for name in (lossy.mutant if mutant_reps else []):
    params_m = ex.setting_params(mu.CONTROLS[name]["setting"])
    law = ex.sequence_law(toy.target, prompt, seq_len, params_m)
    pvals, pooled, imp = [], np.zeros(V ** seq_len), 0
    for r in range(mutant_reps):
        g, s = ex.run_control(toy, prompt, name, n_mutant, seq_len, k=mutant_k,
                              seed0=seed0 + 10**8 + r * n_mutant, min_expected=min_expected, threads=threads)
        pvals.append(g.pvalue)
        pooled += s.counts(V)
        imp += g.impossible
    pvals = np.array(pvals)
    rep_counts[name] = pooled
    labels, _ = ex.pool_cells(law, n_mutant, min_expected)
    keep = labels >= 0
    f = np.bincount(labels[keep], weights=pooled[keep]) / pooled.sum()
    e = np.bincount(labels[keep], weights=law[keep])
    div = max(float(((f - e) ** 2 / e).sum() - (len(e) - 1) / pooled.sum()), 0.0)
    df_m = len(e) - 1
    p_chi = float(stats.ncx2.sf(stats.chi2.isf(alpha, df_m), df_m, n_mutant * div)) if div > 0 else alpha
    imp_rate = imp / pooled.sum()
    p_imp = 1 - (1 - imp_rate) ** n_mutant
    caught = int((pvals < alpha).sum())
    lo, _ = ex.binomial_interval(caught, mutant_reps, 0.95)
    pw_rows.append(dict(mutant=name, reps=mutant_reps, caught=caught, power=caught / mutant_reps, power_lo95=lo,
                        median_p=float(np.median(pvals)), chi2_divergence=div, analytic_power=p_chi,
                        impossible_rate=imp_rate, analytic_power_with_impossible=1 - (1 - p_chi) * (1 - p_imp)))
power_mut = pd.DataFrame(pw_rows, columns=["mutant", "reps", "caught", "power", "power_lo95", "median_p",
                                           "chi2_divergence", "analytic_power", "impossible_rate",
                                           "analytic_power_with_impossible"])
reps_s = time.perf_counter() - t0
ch.save(power_mut, "mutant_power")
assert (power_mut.caught == power_mut.reps).all(), power_mut[power_mut.caught < power_mut.reps]
if mutant_reps >= min_power_reps:  # the full run: the analytic power at the CI size must reach the target too
    assert (power_mut.analytic_power_with_impossible >= power_target).all(), power_mut

# what the family could see: its power against each lossy control at Holm's strictest level
fam_level = alpha / len(family)
fp_rows = []
for name in lossy.mutant:
    law = ex.sequence_law(toy.target, prompt, seq_len, ex.setting_params(mu.CONTROLS[name]["setting"]))
    counts = ctrl_samples[name].counts(V) + rep_counts.get(name, 0)
    imp = float(counts[law == 0].sum() / counts.sum())
    div = ex.chi2_divergence(np.where(law > 0, counts, 0), law, min_expected, bins_n=n_family)
    df_f = max(ex.pooled_df(law, n_family, min_expected), 1)
    fp_rows.append(dict(mutant=name, setting=ex.setting_name(mu.CONTROLS[name]["setting"]), samples=int(counts.sum()),
                        N=n_family, df=df_f, level=fam_level, divergence=div, impossible_rate=imp,
                        power=ex.power_against(div, n_family, df_f, fam_level, imp),
                        N_for_goal=ex.samples_for_power(div, df_f, fam_level, power_goal, imp)))
family_power = pd.DataFrame(fp_rows).sort_values("power", ignore_index=True)
ch.save(family_power, "family_power")
weak = family_power.iloc[0]
family_verdict = ex.power_phrase(weak.power, weak.mutant, weak.divergence, n_family, fam_level)
family_goal = (f"at or above the goal {power_goal} against every control" if weak.power >= power_goal else
               f"below the goal {power_goal}: N = {weak.N_for_goal:.0f} continuations per test would reach it against "
               f"{weak.mutant}")

# %% [markdown]
# **The verdict**. The finding below gives the family's smallest p-value and its power against the weakest
# control. The table gives its power against each lossy control.

# %% tags=["hide-input"]
display(Markdown(
    f"The family ran {len(family)} tests of {n_family} continuations each, in {family_s:.0f} s. "
    f"Its smallest Holm-adjusted p-value is {family.p_holm.min():.3g}, "
    + ("above" if family_ok else "AT OR BELOW") + f" the level {alpha}. "
    f"The verdict: {family_verdict}. "
    f"Against that control the power is {family_goal}."))
display(family_power.set_index("mutant")[["setting", "divergence", "power", "N_for_goal"]].assign(
    divergence=family_power.divergence.map("{:.3g}".format).values, power=family_power.power.map("{:.2f}".format).values,
    N_for_goal=family_power.N_for_goal.map(lambda x: "—" if x != x or x is None else f"{x:.0f}").values)
    .rename(columns={"N_for_goal": f"N for power {power_goal}"}))

# %% [markdown]
# ## 4 · Greedy decoding: identical tokens
#
# At temperature 0 there is nothing to test statistically. Every method must emit the very tokens of
# autoregressive greedy decoding. The toy pair computes in float64, so its tokens must match everywhere. The
# embedded target, SmolLM2-135M, computes in float32. There a different summation order may flip the argmax where
# the top two logits nearly tie. So a divergence is excused only at such a near-tie, a logit gap below `near_tie`.

# %%
greedy_rows = []
for pr in greedy_prompts:
    ref = sd.generate(toy.target, pr, max_new_tokens=greedy_len).tokens  # autoregressive greedy
    for spec in run_specs:
        m, d = ex.parse_spec(spec)
        if m == "autoregressive":
            continue
        for kk in greedy_ks:
            got = sd.generate(toy.target, pr, drafter=toy.drafters[d], method=m, k=kk, max_new_tokens=greedy_len).tokens
            greedy_rows.append(dict(model="toy (float64)", spec=spec, k=kk, prompt=str(pr), equal=got == ref,
                                    divergence=None, gap=None))

# %% tags=["hide-input"]
real = sd.load_pair(real_model)  # the embedded target: greedy here, sampling in Going deeper
tok = real.tokenizer
real_ids = tok(real_text, return_tensors="pt").input_ids[0]
real_params = ex.setting_params(real_setting)
real_run = [s for s in real_methods if ex.unavailable(real, s) is None]
print(f"methods run on {real_model}: {', '.join(real_run)}")
if len(real_run) < len(real_methods):  # a drafter the pair lacks: said, and caught by tests/test_book_outputs.py
    print("skipped: " + "; ".join(f"{s} ({ex.unavailable(real, s)})" for s in real_methods if s not in real_run))
for text in greedy_real_texts:
    ids_g = real.encode_chat(text)
    ref = sd.generate(real.target, ids_g, max_new_tokens=greedy_real_len).tokens
    for spec in real_run:
        m, d = ex.parse_spec(spec)
        got = sd.generate(real.target, ids_g, drafter=real.drafters[d], method=m, k=4, max_new_tokens=greedy_real_len).tokens
        i, gap = ex.first_divergence(real.target, ids_g, got, ref)
        greedy_rows.append(dict(model=f"{real_model} (float32)", spec=spec, k=4, prompt=text, equal=got == ref,
                                divergence=i, gap=gap, excused=ex.excused(i, gap, near_tie)))
greedy = pd.DataFrame(greedy_rows)
ch.save(greedy, "greedy")
toy_ok = bool(greedy[greedy.model.str.startswith("toy")].equal.all())
real_g = greedy[~greedy.model.str.startswith("toy")]
real_ok = bool(real_g.excused.all())
n_div = int((~real_g.equal).sum())
toy_g = greedy[greedy.model.str.startswith("toy")]
display(Markdown(
    f"{int(greedy.equal.sum())} of {len(greedy)} greedy runs emit the tokens of autoregressive greedy decoding. "
    f"On the toy pair, {int(toy_g.equal.sum())} of {len(toy_g)} do. "
    f"On {real_model}, {int(real_g.equal.sum())} of {len(real_g)} do, "
    f"with {report.count(n_div, 'float32 near-tie divergence')}."))
display(greedy.groupby(["model", "spec"]).equal.agg(["sum", "count"]).rename(
    columns={"sum": "identical", "count": "runs"}))
if not real_g.equal.all():
    print("float32 divergences (near-ties: the top-2 logit gap at the first differing position):")
    print(real_g[~real_g.equal][["spec", "prompt", "divergence", "gap"]].to_string(index=False))
assert toy_ok and real_ok, greedy[~greedy.equal]

# %% [markdown]
# ## Going deeper
#
# The main path showed the rule, the key test with its power, and greedy decoding. This part holds the statistical
# machinery behind them and the longer checks:
#
# - The family's runs in detail, the hybrid's own seeds, and acceptance against α in the loop.
# - Equivalence: an upper bound on the distance between the sampled law and p.
# - The tests' power curves and their calibration, that is, their false-positive rate.
# - The negative controls one by one, and their power by repetition.
# - The embedded target, sampled.
# - An audit of other implementations with the same tests.

# %% [markdown]
# ### The family's runs
#
# The most likely continuations of the first setting, the cells each setting allows, and every run's p-value.
# Cells whose expected count is below `min_expected` share one bin. A sample in a cell of probability 0 (outside
# top-k or top-p) rejects outright.

# %% tags=["hide-input"]
setting0 = ex.setting_name(settings[0])  # the first setting's name
top = np.argsort(-laws[setting0])[:6]
print(f"most likely continuations at {setting0}: " + ", ".join(
    f"{' '.join(str(int(t)) for t in np.unravel_index(i, (V,) * seq_len))} ({laws[setting0][i]:.3f})" for i in top))
print("cells with p > 0: " + ", ".join(f"{name} {int((law > 0).sum())}" for name, law in laws.items()))
print(f"{len(family)} runs × {n_family} continuations in {family_s:.0f} s; every run's statistic, df, Holm p and TV "
      "bound are in gof_family.csv.")
print(f"Smallest p {family.pvalue.min():.3g} ({family.loc[family.pvalue.idxmin(), 'spec']}, "
      f"{family.loc[family.pvalue.idxmin(), 'setting']}); smallest Holm-adjusted p {family.p_holm.min():.3g}; "
      f"impossible samples {int(family.impossible.sum())}.")
print("The p-value of every run (rows: method and draft length k; columns: sampling setting):")
family.pivot_table(index=["spec", "k"], columns="setting", values="pvalue", sort=False).round(3)

# %% [markdown]
# **Why the hybrid samples with seeds of its own**. Every method samples continuation i with seed `seed0 + i`,
# except those named in `own_seeds`. These are common random numbers.
#
# The hybrid drafts by prompt lookup whenever the context already holds its last token. On this toy prompt over
# V = 8 tokens, that is almost always. There it *is* the n-gram drafter. It makes the same one-hot proposal q = δ_x
# and draws the same uniforms from the same seed. So it makes the same accept/reject decision: accept with
# probability p(x), else draw from p with x removed. It emits the same tokens.
#
# It departs only where the lookup finds nothing. The n-gram drafter then proposes nothing, and the step emits the
# target's own sample. The hybrid drafts with the model instead, which consumes other random numbers. Those steps
# also make the two rows' acceptance differ.
#
# On shared seeds, the hybrid's sample would largely copy the n-gram row's, continuation for continuation. Its test
# would then add little evidence of its own. On a stream of its own, it is an independent sample of its own law.
# The next cell reruns the hybrid on the shared seeds, for the first `shared_check_n` continuations of each cell.
# It counts how many it would have copied.

# %% tags=["hide-input"]
def same_rows(a, b):
    """The share of continuations two samples hold identically, row by row."""
    m = min(len(a), len(b))
    return float((a[:m] == b[:m]).all(axis=1).mean())


pair_ = ("linear:hybrid", "linear:ngram")
if all(s_ in run_specs for s_ in pair_):
    m_chk = min(shared_check_n, n_family)
    rows_ = []
    for st in settings:
        st_name = ex.setting_name(st)
        for kk in ks:
            ng = family_samples[("linear:ngram", st_name, kk)].tokens
            shared = ex.sample_sequences(toy.target, prompt, seq_len, m_chk, ex.setting_params(st), "linear",
                                         toy.drafters["hybrid"], k=kk, seed0=seed0, threads=threads)
            rows_.append(dict(setting=st_name, k=kk, shared=same_rows(shared.tokens, ng),
                              own=same_rows(family_samples[("linear:hybrid", st_name, kk)].tokens, ng),
                              chance=float((laws[st_name] ** 2).sum())))
    hyb = pd.DataFrame(rows_)
    ch.save(hyb, "hybrid_vs_ngram_samples")
    own_ = own_seeds.get("linear:hybrid")
    print(f"linear:hybrid against linear:ngram, {len(hyb)} cells.")
    print(f"On the shared seeds (the first {m_chk} of each cell), the hybrid would emit the n-gram row's continuation "
          f"token for token in {hyb.shared.mean():.0%} of them ({hyb.shared.min():.0%}–{hyb.shared.max():.0%} by cell).")
    if own_:
        print(f"On its own stream (seeds seed0 + {own_}), its family sample matches the n-gram row's in "
              f"{hyb.own.mean():.0%} of continuations,")
        print(f"as two independent samples of these laws would by chance (Σ p² = {hyb.chance.mean():.0%}). "
              "The two rows' samples are " + ("identical" if (hyb.own == 1).all() else "not identical")
              + " in this run.")
    else:
        print("It shares their stream in this run, so its row repeats most of the n-gram row's sample.")

# %% [markdown]
# **α against measured acceptance, in the loop**. With one-token drafts, every linear step accepts with probability
# α_i = Σ min(p_i, q_i). The loop records it (`stats["accept_probs"]`). The standardized sum of (accepted − α_i)
# must then look like a draw of N(0, 1).

# %% tags=["hide-input"]
acc = family[family.acceptance_z.notna()][["spec", "setting", "k", "acceptance", "predicted_alpha", "acceptance_z"]]
ch.save(acc, "acceptance_vs_alpha")
print(acc.round(4).to_string(index=False))
if any("@" in s_ for s_ in run_specs):
    print("(the family runs a confidence stop (@θ) only at k > 1: with one drafted token it has nothing to stop,")
    print(" and its run would repeat its drafter's fixed-k run token for token)")
z_crit = stats.norm.isf(alpha / 2 / max(len(acc), 1))
acc_p = None
if len(acc):  # the same check as two-sided p-values against Bonferroni's α/m
    p_z = 2 * stats.norm.sf(acc.acceptance_z.abs())
    acc_p = float(p_z.min())
    print(f"acceptance against α, smallest two-sided p of {len(acc)} ({acc.spec.iloc[p_z.argmin()]}, "
          f"{acc.setting.iloc[p_z.argmin()]}): " + ex.p_verdict(p_z.min(), alpha / len(acc), borderline_factor))
assert (acc.acceptance_z.abs() < z_crit).all(), "measured acceptance disagrees with α = Σ min(p, q)"

# %% [markdown]
# ### Equivalence: TV(sampled law, p) < ε
#
# Not rejecting is not the same as being equal. An equivalence claim needs an upper bound on the distance between
# the sampled law Q and p, below a margin ε (`epsilon`).
#
# We repeat the exact sampler (`exact_spec`) `exact_reps` times on disjoint seeds and pool the samples. Its
# continuations are short (`exact_len` tokens), so that few cells carry the law.
#
# Pearson's X² is roughly noncentral χ²(df, λ), with λ = N·χ²(Q‖p). Inverting it gives an upper confidence bound
# λ_up. Cauchy–Schwarz then gives TV(Q, p) ≤ ½·√(χ²(Q‖p)) ≤ ½·√(λ_up/N). The bound is tight for the least
# favourable Q, which tilts p up on half its mass and down on the other half. Pooled rare cells add at most their
# p-mass. Mass outside p's support is bounded by Clopper–Pearson, for 95% confidence overall. The figure follows the
# bound as the pooled sample grows.

# %% tags=["hide-input"]
exact_params = ex.setting_params(exact_setting)
exact_name = ex.setting_name(exact_setting)
exact_law = ex.sequence_law(toy.target, prompt, exact_len, exact_params)
e_method, e_drafter = ex.parse_spec(exact_spec)
t0 = time.perf_counter()
exact_all = ex.sample_sequences(toy.target, prompt, exact_len, exact_reps * exact_n, exact_params, e_method,
                                toy.drafters[e_drafter], k=1, seed0=seed0 + 10**7, threads=threads)
exact_cells = ex.cell_index(exact_all.tokens, V).reshape(exact_reps, exact_n)
print(f"{exact_reps} × {exact_n} continuations of the exact sampler in {time.perf_counter() - t0:.0f} s")
pooled_counts = np.bincount(exact_cells.ravel(), minlength=V ** exact_len)
bound = ex.tv_upper_bound(pooled_counts, exact_law, 0.95, min_expected)
tv_sampler = f"{exact_spec} (k = 1), {exact_name}, continuations of {exact_len} tokens"
print(f"{tv_sampler}, N = {bound.N}:")
print(f"  TV(Q, p) ≤ {bound.tv_upper:.4f} with 95% confidence, margin ε = {epsilon}")
print(f"  (pooled law ≤ {bound.pooled_upper:.4f}, pooled p-mass {bound.rare_mass:.4f}, "
      f"mass outside support ≤ {bound.zero_upper:.5f}); the bound holds for this sampler and setting only")

grid = np.unique(np.geomspace(max(50, exact_n), bound.N, 12).astype(int))
curve = pd.DataFrame([dict(N=int(m), bound=ex.tv_upper_bound(np.bincount(exact_cells.ravel()[:m], minlength=V ** exact_len),
                                                             exact_law, 0.95, min_expected).tv_upper) for m in grid])
df_e = ex.pooled_df(exact_law, bound.N, min_expected)
typical = 0.5 * np.sqrt(ex._lambda_upper(stats.chi2.median(df_e), df_e, 0.025) / curve.N)
fig, ax = plt.subplots(figsize=(7, 3.6))
ax.plot(curve.N, curve.bound, "o-", color=palette[0], label="95% upper bound from the first N samples")
ax.plot(curve.N, typical, ":", color="gray", label="the bound when X² sits at its median")
ax.axhline(epsilon, color="crimson", ls="--", label=f"ε = {epsilon}")
ax.set(xscale="log", yscale="log", xlabel="N continuations", ylabel="TV upper bound",
       title=(f"the TV bound falls {'below' if bound.tv_upper < epsilon else 'short of'} ε = {epsilon} at "
              f"N = {bound.N} ({exact_spec}, {exact_name})"))
ax.legend(fontsize=8)
fig.tight_layout()
ch.savefig(fig, "tv_bound")
ch.save(curve, "tv_bound")
print(f"TV upper bounds of the family runs (n = {seq_len}, N = {n_family}): {family.tv_upper.min():.3f} to "
      f"{family.tv_upper.max():.3f}")
assert bound.tv_upper < epsilon, f"could not show TV < {epsilon} (bound {bound.tv_upper:.4f})"

# %% [markdown]
# ### Power and calibration
#
# **Power**. Take the least favourable law at TV = ε. Its noncentrality is λ = 4ε²N. The samples needed for a given
# power then follow from the noncentral χ² law. The pooled degrees of freedom grow with N. The figure draws the
# power curves and marks the family's and the equivalence run's N. It checks one point by simulation (the star).

# %% tags=["hide-input"]
power_rows = []
for name, law in [*laws.items(), (f"{exact_name}, n={exact_len}", exact_law)]:
    for tv in power_tvs:
        power_rows.append(dict(law=name, tv=tv, N_needed=ex.samples_needed(tv, law, alpha, power_target, min_expected)))
power_df = pd.DataFrame(power_rows)
ch.save(power_df, "samples_needed")
print(f"samples for power {power_target} at level {alpha} (least favourable direction):")
print(power_df.pivot(index="law", columns="tv", values="N_needed").to_string())

Ns = np.unique(np.geomspace(100, 3e5, 60).astype(int))
curves = []
for tv in sorted({*power_tvs, power_check_tv}):
    for name, law in [(f"{setting0}, n={seq_len}", laws[setting0]),
                      (f"{exact_name}, n={exact_len}", exact_law)]:
        for m in Ns:
            curves.append(dict(N=m, tv=f"TV = {tv}", law=name,
                               power=ex.power(tv, m, max(ex.pooled_df(law, m, min_expected), 1), alpha)))
curves = pd.DataFrame(curves)
# check one point by simulation: multinomial samples from the least favourable law
tv_chk = power_check_tv
N_chk = ex.samples_needed(tv_chk, exact_law, alpha, power_check_power, min_expected)  # analytic power ≈ power_check_power
lf = ex.least_favourable(exact_law, tv_chk)
sim_power = float((ex.simulate_pvalues(exact_law, lf, N_chk, power_check_runs, seed0, min_expected) < alpha).mean())
ana_power = ex.power(tv_chk, N_chk, ex.pooled_df(exact_law, N_chk, min_expected), alpha)
print(f"check: TV = {tv_chk}, N = {N_chk}: analytic power {ana_power:.3f}, simulated {sim_power:.3f} ({power_check_runs} runs)")
fig, ax = plt.subplots(figsize=(8, 3.8))
sns.lineplot(curves, x="N", y="power", hue="tv", style="law", palette=palette[:curves.tv.nunique()], ax=ax)
ax.axhline(power_target, color="gray", ls=":")
for m, lab in [(n_family, "family N"), (exact_reps * exact_n, "equivalence N")]:
    ax.axvline(m, color="k", alpha=0.3)
    ax.text(m, 0.03, lab, rotation=90, fontsize=8)
ax.plot([N_chk], [sim_power], "k*", ms=12, label="simulated")
ax.set(xscale="log", xlabel="N continuations",
       title=f"a smaller TV needs more samples: power of the level-{alpha} test")
ax.legend(fontsize=7, loc="upper left")
fig.tight_layout()
ch.savefig(fig, "power_curves")
assert abs(sim_power - ana_power) < power_check_tolerance, "the noncentral χ² power disagrees with simulation"

# %% [markdown]
# **Calibration**. A test is only as honest as its false-positive rate. Two checks run here.
#
# - The family's test, on multinomial samples of the exact law at the family's N.
# - The same test on each of the `exact_reps` repetitions of the real exact sampler above.
#
# Under the null, the p-values are uniform. The rejection rate at a nominal level must then fall inside that
# level's binomial 99% interval. The p-values come from a parametric bootstrap: X² is ranked among 99 999
# statistics simulated under the exact law, ties broken at random. This is exact at any N. Scipy's asymptotic χ²
# p-value is shown beside it. With many bins of small expected count, the χ² approximation can drift from its
# nominal level. The table says whether it did in this run. The histograms show the p-values of each source.

# %% tags=["hide-input"]
cal_rows, pv_sets = [], {}
for name, law in laws.items():
    pv_sets[f"exact law, {name}, N={n_family}"] = ex.simulate_pvalues(law, law, n_family, calibration_sims, seed0,
                                                                     min_expected)
    pv_sets[f"exact law, {name}, N={n_family} (asymptotic χ²)"] = ex.simulate_pvalues(
        law, law, n_family, calibration_sims, seed0, min_expected, asymptotic=True)
pv_sets[f"{exact_spec} sampler, {exact_name}, N={exact_n}"] = np.array(
    [ex.gof_test(np.bincount(c, minlength=V ** exact_len), exact_law, min_expected, seed=seed0 + r).pvalue
     for r, c in enumerate(exact_cells)])
levels = sorted({alpha, second_level})  # nominal levels checked against their binomial intervals
for name, pv in pv_sets.items():
    for a in levels:
        k_rej = int((pv < a).sum())
        lo_r, hi_r = stats.binom.interval(interval_confidence, len(pv), a)
        cal_rows.append(dict(source=name, runs=len(pv), level=a, rejections=k_rej, rate=k_rej / len(pv),
                             lo=lo_r / len(pv), hi=hi_r / len(pv), inside=bool(lo_r <= k_rej <= hi_r),
                             asymptotic="asymptotic" in name))
cal = pd.DataFrame(cal_rows)
ch.save(cal, "calibration")
print(cal.drop(columns="asymptotic").round(4).to_string(index=False))
shown = {k: v for k, v in pv_sets.items() if "asymptotic" not in k}
fig, axes = plt.subplots(1, len(shown), figsize=(3.3 * len(shown), 3), sharey=False)
for ax, (name, pv) in zip(np.atleast_1d(axes), shown.items()):
    ax.hist(pv, bins=20, range=(0, 1), color=palette[0], edgecolor="white")
    ax.axhline(len(pv) / 20, color="k", ls=":")
    ax.set_title(name, fontsize=8)
    ax.set_xlabel("p-value")
calibrated = cal[~cal.asymptotic]
fig.suptitle("correct samplers give flat p-values: the test is calibrated (dotted: the uniform height)"
             if calibrated.inside.all() else "p-values of correct samplers (dotted: the uniform height)")
fig.tight_layout()
ch.savefig(fig, "calibration_pvalues")
assert calibration_sims >= min_calibration_runs and len(exact_cells) >= min_calibration_runs, (
    f"calibration needs ≥ {min_calibration_runs} runs")
assert calibrated.inside.all(), calibrated[~calibrated.inside]

# %% [markdown]
# ### Negative controls: the test must catch real bugs
#
# `specdec_core.study.mutants` holds deliberately wrong variants of the accept rule, with the signature of
# `speculative_sample`. The linear loop takes one as its rule: `sd.generate(..., rule=mu.RULES[name])`. One more
# control is a drafter that samples from processed logits but reports q from raw ones. Two bugs are harmless
# when written literally, and the table shows it.
#
# - **No min(1, ·).** The event u < p/q, with u in [0, 1), is the same as u < min(1, p/q). The literal mutant
#   consumes the same random numbers and gives *bit-identical* output. The cap matters where the ratio is reused.
#   Written as p − a·q with the uncapped a = p/q, the residual vanishes on q's support (`no_min_residual`).
#   Forgetting the ratio altogether accepts with probability p(x) (`accept_with_p`).
# - **No bonus.** Suppose the loop's bookkeeping stays consistent: the last accepted draft plays the "last token".
#   Then the next step samples that position from p anyway, and the bonus is only wasted (`no_bonus_literal`).
#   In a loop written for the bonus, the last draft is already in the target's cache and gets fed twice
#   (`no_bonus`). The other real form is an off-by-one row (`bonus_wrong_row`).
#
# Each control runs where its bug bites; raw-logits q, for one, is harmless at temperature 1 without truncation.
# A control is caught when its p-value is below the level `alpha`.

# %% tags=["hide-input"]
print(f"{len(mutants)} controls × {n_mutant} continuations in {ctrl_s:.0f} s")
print("(Monte Carlo p-values: a statistic beyond all 99 999 simulations gets u / 100 000, u the tie-break's uniform,")
print(" one value per seed. Such mutants share one p-value that says only 'beyond every simulation'; the asymptotic")
print(" χ² p-value shows how far past it a mutant is.)")
print("(p = 0: the run drew a sequence the exact law gives probability 0, the 'impossible' column, and is rejected")
print(" outright, whatever its statistic.)")
display(ctrl[["mutant", "bug", "setting", "statistic", "df", "impossible", "pvalue", "pvalue_asymptotic", "caught"]]
        .set_index("mutant").assign(statistic=ctrl.statistic.map("{:.1f}".format).values,
                                    pvalue=ctrl.pvalue.map("{:.2g}".format).values,
                                    pvalue_asymptotic=ctrl.pvalue_asymptotic.map("{:.2g}".format).values))
for note in literal_notes:
    print(note)
print("controls within a factor of " + f"{borderline_factor:g} of the level {alpha}: "
      + ("; ".join(f"{r.mutant} " + ex.p_verdict(r.pvalue, alpha, borderline_factor, passed="passes", rejected="caught")
                   for r in ctrl_border.itertuples()) if len(ctrl_border) else "none (no verdict is borderline)"))

# %% [markdown]
# **Power at the CI size**. One caught run could be luck. When `mutant_reps` > 0, each lossy control is rerun
# `mutant_reps` times on disjoint seeds at the CI size. The run says when it is 0. The caught fraction estimates
# the power, with a Clopper–Pearson bound. The pooled runs also estimate the mutant's divergence on the CI bins.
# The noncentral χ² law turns it into an analytic power. A sample in a cell where p = 0 rejects outright (the
# `impossible rate`). The figure shows how far past the level each control's single run above landed.

# %% tags=["hide-input"]
if not mutant_reps:
    print("mutant_reps = 0: power by repetition is estimated in the full run (book/params/full.yaml)")
else:
    print(f"{mutant_reps} repetitions per lossy control in {reps_s:.0f} s")
    print(power_mut.to_string(index=False, float_format="{:.3g}".format))
fig, ax = plt.subplots(figsize=(8, 3.4))
plot = ctrl.assign(neglog=-np.log10(ctrl.pvalue_asymptotic.clip(lower=1e-300)))
sns.barplot(plot, y="mutant", x="neglog", hue="expected", dodge=False, palette=palette[:plot.expected.nunique()],
            ax=ax)  # expected: caught / pass
ax.axvline(-np.log10(alpha), color="crimson", ls="--", label=f"level {alpha}")
ax.set(xscale="symlog", xlabel="−log10 p (asymptotic χ²; 300 = a sample where p = 0)", ylabel="",
       title=f"every lossy control lands past the level; the harmless forms stay short (n = {n_mutant})"
       if lossy.caught.all() and not harmless.caught.any() else f"negative controls: one run of {n_mutant} each")
ax.legend(fontsize=8)
fig.tight_layout()
ch.savefig(fig, "mutants")

# %% [markdown]
# **What the family could see**. The family of section 3 did not reject, and what that says depends on its size.
# Each lossy control's measured law gives its χ²-divergence: its run above, pooled with its repetitions when there
# are any. The divergence is taken on the bins that a family test of N = `n_family` continuations uses in the
# control's setting, on p's support. Its rate of samples where p = 0 counts too, since any one of them rejects
# outright.
#
# The noncentral χ² law then gives the power such a test has against the control at Holm's strictest level: the
# level `alpha` divided by the number of family tests. It also gives the N at which that power would reach
# `power_goal`. That N uses the bins of N = `n_family`; finer bins at a larger N see at least this divergence.

# %% tags=["hide-input"]
print(family_power.to_string(index=False, float_format="{:.3g}".format))
print(f"the family ({len(family)} tests, smallest Holm-adjusted p {family.p_holm.min():.3g}): {family_verdict};")
print(f"  {family_goal}.")

# %% [markdown]
# ### The embedded target
#
# SmolLM2-135M has a vocabulary of 49 152 tokens, too many to enumerate sequences. But one target pass gives
# p(· | prompt, prefix) at every position of a prefix. Two checks run on short continuations.
#
# - **Conditional goodness of fit.** Take the sampled continuations that start with the most common path's first j
#   tokens. Their (j+1)-th token must follow p(· | prompt, path[:j]). For j ≥ 1 that token comes out of speculative
#   sampling: an accepted draft, a residual draw or a bonus.
# - **Two-sample homogeneity.** Speculative and autoregressive continuations must share one law.
#
# The figure sets the sampled next-token frequencies beside p, for the five likeliest tokens at each position.

# %% tags=["hide-input"]
t0 = time.perf_counter()
real_samples = {"autoregressive": ex.sample_sequences(real.target, real_ids, real_len, real_n, real_params,
                                                      seed0=seed0 + 1, threads=threads)}
for spec in real_run:
    m, d = ex.parse_spec(spec)
    real_samples[spec] = ex.sample_sequences(real.target, real_ids, real_len, real_n, real_params, m,
                                             real.drafters[d], k=real_k, seed0=seed0, threads=threads)
print(f"{len(real_samples)} × {real_n} continuations of {real_len} tokens in {time.perf_counter() - t0:.0f} s")

real_rows, fit_plot = [], []
for spec in real_run:
    toks = real_samples[spec].tokens
    paths, counts = np.unique(toks, axis=0, return_counts=True)
    path = paths[counts.argmax()]
    laws_r = ex.next_token_laws(real.target, torch.cat([real_ids, torch.tensor(path[:-1])]), real_params)
    for j in range(real_len):
        nxt = ex.conditional_counts(toks, path[:j])
        p_j = laws_r[real_ids.numel() - 1 + j].numpy()
        try:
            g = ex.gof_test(np.bincount(nxt, minlength=p_j.size), p_j, min_expected)
        except ValueError as e:  # too few continuations share this prefix for two bins
            print(f"{spec}, position {j + 1}: skipped ({e})")
            continue
        real_rows.append(dict(check="conditional fit", spec=spec, position=j + 1,
                              prefix=repr(tok.decode(path[:j].tolist())), N=len(nxt), statistic=g.statistic,
                              df=g.df, pvalue=g.pvalue))
        for t in np.argsort(-p_j)[:5]:
            fit_plot.append(dict(spec=spec, position=f"{j + 1} after {tok.decode(path[:j].tolist())!r}",
                                 token=repr(tok.decode([int(t)])), p=float(p_j[t]), empirical=float((nxt == t).mean())))
    chi2_, dof, pv, cols = ex.homogeneity_test(toks, real_samples["autoregressive"].tokens, min_expected)
    real_rows.append(dict(check="homogeneity vs autoregressive", spec=spec, position=0, prefix="", N=len(toks),
                          statistic=chi2_, df=dof, pvalue=pv))
real_df = pd.DataFrame(real_rows)
real_df["p_holm"] = ex.holm(real_df.pvalue)
ch.save(real_df, "real_model")
display(report.shown(real_df.set_index(["spec", "check"]), digits=4))
if fit_plot:
    fp = pd.DataFrame(fit_plot)
    g_ = sns.catplot(fp.melt(["spec", "position", "token"], var_name="law", value_name="probability"), kind="bar",
                     x="token", y="probability", hue="law", col="position", row="spec", sharex=False, height=2.8,
                     aspect=1.3, palette=palette[:2])
    g_.set_xticklabels(rotation=30)
    g_.figure.suptitle("sampled next-token frequencies sit beside p at each tested position", y=1.01)
    ch.savefig(g_, "real_conditional_fit", dpi=110)
real_min = real_df.loc[real_df.p_holm.idxmin()] if len(real_df) else None
if real_min is not None:
    print(f"smallest Holm-adjusted p of the {len(real_df)} checks: {real_min.check}, {real_min.spec}"
          + (f", position {real_min.position}" if real_min.position else "") + ".")
    print(ex.p_verdict(real_min.p_holm, alpha, borderline_factor, passed="no rejection", rejected="REJECTED")
          + "; power not computed here: no control runs in this section.")
    print("(the audit below states the power of the same two-sample test against one control on this pair)")
assert len(real_df) and (real_df.p_holm > alpha).all(), real_df[real_df.p_holm <= alpha]
# position 1 is sampled from the target's prefill logits, the same way by every method: the claim is about the
# positions after it, which the accept/reject rule decides, so every method must have been tested at one of them
fit_r = real_df[real_df.check == "conditional fit"]
spec_tested = {s: sorted(fit_r[(fit_r.spec == s) & (fit_r.position >= 2)].position.tolist()) for s in real_run}
assert all(spec_tested.values()), f"no position decided by speculative sampling was tested: {spec_tested}"

# %% [markdown]
# ### Auditing other implementations
#
# The gate above judges this library's decoders. `specdec_core.study.exactness.audit` makes it a function of any
# decoder, `runner(ids, setting, seed) -> tokens`.
#
# - On the toy pair, the reference is the enumerated law of the first `audit_len` tokens. The audit reports
#   Pearson's test, a TV bound and the sampled law's χ²-divergence.
# - On the embedded target, the reference is the target's own sampled continuations, with the two-sample test of
#   the section above.
#
# Holm's correction runs over the whole family of (decoder, setting) rows. A family of correct decoders then fails
# with probability at most the level `alpha`, and a simulation under the exact law checks that.
#
# The audit covers transformers' `generate`, the control: it does not speculate. It also covers assisted
# generation, with the toy draft as its assistant, and prompt lookup. Beside them run this library's linear, tree
# and parallel decoders. The settings are temperature 1, temperature 0.7 with a top-k that cuts the toy's 8 tokens
# to 4, and top-p 0.9.
#
# Each continuation is `audit_len` tokens long, with drafts of `audit_k` tokens. So it holds a whole first step:
# its drafts, then a rejection's residual or the bonus. After a rejection it also holds the next step's tokens past
# the rollback. The toy prompt holds a repeated token, so prompt lookup finds a match and drafts once the first
# token lands on one. The run counts the positions each of its verification passes feeds the target. It prints the
# share of drafted tokens.
#
# **Negative controls, which must fail**. There are four. One emits the draft's tokens unverified. One draws the
# residual from p. One reports q from raw logits. One accepts with probability p(x). Raw-logits q is harmless at
# temperature 1 without truncation. It is lossy wherever a temperature rescales the draft's law, which is where it
# must be caught. Under top-p alone it changes only the truncated tail's share. The test may miss that divergence
# at this n. The row stays, with the power the test had against it.
#
# The controls' χ²-divergences, measured in the same run, give each decoder row its **power**. That is the
# probability that its test, at Holm's strictest level and at this n, rejects each mutant of its setting. The row
# names the weakest.

# %% tags=["hide-input"]
t0 = time.perf_counter()
mut_runners = {m: ex.mutant_runner(toy, m, audit_len, k=audit_k) for m in ex.AUDIT_MUTANTS}
mut_table = ex.audit_family(mut_runners, toy, [audit_prompt], audit_settings, audit_n, audit_len,
                            seed=seed0 + 3 * 10**8, alpha=alpha)
mut_table["lossy_here"] = [r.setting in ex.lossy_settings(r.runner, audit_settings) for r in mut_table.itertuples()]
mut_table["harmless"] = [r.setting in ex.harmless_settings(r.runner, audit_settings) for r in mut_table.itertuples()]
# each mutant row's own power: its test (level α / rows of the mutants' table) against its measured divergence
mut_table["power"] = [np.nan if r.harmless else ex.power_against(r.divergence, r.n, r.df, alpha / len(mut_table))
                      for r in mut_table.itertuples()]  # a harmless row's divergence is noise: no power to state
mut_table["verdict"] = ex.audit_verdicts(mut_table)
against = ex.divergences(mut_table[~mut_table.harmless])
ours_specs = [s for s in ("linear:model", "tree:model", "parallel:block") if ex.unavailable(toy, s) is None]
audit_runners = {f"specdec {s}": ex.library_runner(toy, s, audit_len, k=audit_k) for s in ours_specs}
audit_runners.update(peers.audit_runners(toy, audit_len, k=audit_k))
lookup, lookup_log = "transformers prompt lookup", []
if lookup in audit_runners:
    audit_runners[lookup] = ex.counting_runner(audit_runners[lookup], toy.target, lookup_log)
toy_audit = ex.audit_family(audit_runners, toy, [audit_prompt], audit_settings, audit_n, audit_len,
                            seed=seed0 + 4 * 10**8, alpha=alpha, against=against)
toy_audit["drafted"] = np.nan  # prompt lookup's drafted tokens per token emitted, row by row (the log's order)
for i, ix in enumerate(toy_audit.index[toy_audit.runner == lookup]):
    toy_audit.loc[ix, "drafted"] = ex.drafted_share(lookup_log[i * audit_n:(i + 1) * audit_n])["drafted"]
calib = ex.calibrate_audit(toy, [audit_prompt], audit_settings, audit_n, rows_per_setting=len(audit_runners),
                           length=audit_len, reps=audit_calibration, alpha=alpha, seed=seed0)
print(f"toy pair: {len(audit_runners)} decoders and {len(mut_runners)} mutants × {len(audit_settings)} settings × "
      f"{audit_n} continuations of {audit_len} tokens in {time.perf_counter() - t0:.0f} s")
both = pd.concat([toy_audit.assign(kind="decoder"), mut_table.assign(kind="mutant")], ignore_index=True)
ch.save(both, "audit_toy")
ch.save(pd.DataFrame([calib]), "audit_calibration")
show = both  # "pass" only with power 0.5 or more against the weakest mutant of its setting (ex.audit_verdict)
display(show.pivot_table(index=["kind", "runner"], columns="setting", values="verdict", aggfunc="first", sort=False))
print(f"power of each row's test at Holm's strictest level (decoders {alpha}/{len(toy_audit)}, mutants {alpha}/{len(mut_table)}), "
      f"n = {audit_n}:")
print("a decoder row against the weakest mutant of its setting, a mutant row against its own measured divergence")
display(report.shown(both.pivot_table(index=["kind", "runner"], columns="setting", values="power", sort=False)))
weakest_by_setting = toy_audit.drop_duplicates("setting")[["setting", "against", "against_divergence", "power"]]
print("the weakest mutant of each setting:")
for r in weakest_by_setting.itertuples():
    print(f"  {r.setting}: {r.against} (divergence {r.against_divergence:.3g}), power {r.power:.2f}")
if lookup_log:
    share = ex.drafted_share(lookup_log)
    print(f"{lookup}: {share['with_draft']:.0%} of its {share['continuations']} continuations drafted;")
    print(f"  drafted tokens per token emitted {share['drafted']:.2f}, accepted drafts per token emitted "
          f"{share['accepted']:.2f}")
fig, ax = plt.subplots(figsize=(8, 0.45 * both.runner.nunique() + 1.2))
heat = both.assign(neglog=-np.log10(both.p_holm.clip(lower=1e-6))).pivot_table(
    index="runner", columns="setting", values="neglog", sort=False)
sns.heatmap(heat, annot=True, fmt=".1f", cmap="rocket_r", vmin=0, vmax=6, cbar_kws={"label": "−log10 p (Holm)"},
            ax=ax)
ax.set(title=f"the decoders pass and the mutants fail (n = {audit_n}; a row fails above {-np.log10(alpha):.0f})"
       if toy_audit.passed.all() and not mut_table[mut_table.lossy_here].passed.any()
       else f"audit on the toy pair, n = {audit_n}: a row fails above {-np.log10(alpha):.0f}", xlabel="", ylabel="")
fig.tight_layout()
ch.savefig(fig, "audit_toy")

# %% [markdown]
# The same decoders run on the embedded target. Its sampled continuations are the reference. The draft serves as
# transformers' assistant in its closest runnable form (`study.peers.hf_assistant`). One negative control,
# `audit_real_mutant`, runs there too.
#
# This is a two-sample test of few samples. Its columns are the continuations common enough to expect
# `min_expected` in each sample. So at this n it compares the modal continuation or two against the rest (df = 1
# or 2). Its power against the control uses the control's two-sample divergence: χ² against the pooled law,
# estimated as (X² − df)·2/n. A row reads "pass" only where that power is at least 0.5. Where the test could not
# have caught the control, a row that is not rejected reads "no verdict", with its power: it says nothing. The toy
# pair, with its exact law, is where the subtle errors are caught.

# %% tags=["hide-input"]
t0 = time.perf_counter()
real_refs = {}  # the target's own continuations, shared by the control and the decoders
real_mut = ex.audit_family({audit_real_mutant: ex.mutant_runner(real, audit_real_mutant, audit_len, k=audit_k)}, real,
                           [real_ids], audit_settings, audit_real_n, audit_len, seed=seed0 + 5 * 10**8, alpha=alpha,
                           references=real_refs)
real_mut["power"] = [ex.power_against(r.divergence, r.n / 2, r.df, alpha / len(real_mut)) for r in real_mut.itertuples()]
real_mut["verdict"] = ex.audit_verdicts(real_mut)
real_specs = [s for s in ("linear:model", "tree:model", "parallel:block") if ex.unavailable(real, s) is None]
real_runners = {f"specdec {s}": ex.library_runner(real, s, audit_len, k=audit_k) for s in real_specs}
real_runners.update(peers.audit_runners(real, audit_len, k=audit_k))
real_audit = ex.audit_family(real_runners, real, [real_ids], audit_settings, audit_real_n, audit_len,
                             seed=seed0 + 5 * 10**8, alpha=alpha, against=ex.divergences(real_mut), references=real_refs)
print(f"{real_model}: {len(real_runners)} decoders and 1 control × {len(audit_settings)} settings × {audit_real_n} "
      f"continuations of {audit_len} tokens in {time.perf_counter() - t0:.0f} s")
real_both = pd.concat([real_audit.assign(kind="decoder"), real_mut.assign(kind="mutant")], ignore_index=True)
ch.save(real_both, "audit_real")
display(real_both.pivot_table(
    index=["kind", "runner"], columns="setting", values="verdict", aggfunc="first", sort=False))
print(f"degrees of freedom of the {len(real_audit)} decoder rows: {sorted(set(real_audit.df.astype(int)))}")
print(f"power against {audit_real_mutant} by setting:")
for r in real_audit.drop_duplicates("setting").itertuples():
    print(f"  {r.setting}: {r.power:.2f} (two-sample divergence {r.against_divergence:.3g})")

# %% [markdown]
# **The audit's findings**. The toy rows and the embedded target's rows are reported apart: the second are a
# gross-error check of few samples. Each verdict names its power against the weakest mutant of its setting.

# %% tags=["hide-input"]
lossy_rows = mut_table[mut_table.lossy_here]
weak_rows = mut_table[~mut_table.lossy_here & ~mut_table.harmless]  # lossy, not required to fail at this n
failed_peers = pd.concat([toy_audit, real_audit])
failed_peers = failed_peers[~failed_peers.passed]


def smallest(table):
    """A family's smallest Holm-adjusted p against the level, with the row it came from (the verdict words come with
    power)."""
    r = table.loc[table.p_holm.idxmin()]
    return f"{r.p_holm:.3g} ({'>' if r.p_holm >= alpha else '≤'} the level {alpha}), at {r.runner}, {r.setting}"


def weakest_phrase(table, n_eff, level):
    """The power phrase of a table's weakest row: its power against the mutant it names, and the n that reaches the
    goal at that mutant's divergence."""
    r = table.loc[table.power.idxmin()]
    need = ex.samples_for_power(r.against_divergence, int(r.df), level, power_goal)
    return (ex.power_phrase(r.power, f"{r.against} at {r.setting}", r.against_divergence, table.n.iloc[0], level)
            + (f" (n ≈ {need * table.n.iloc[0] / n_eff:.0f} would reach {power_goal})" if need else ""))


toy_level, real_level = alpha / len(toy_audit), alpha / len(real_audit)
audit_toy_verdict = weakest_phrase(toy_audit, audit_n, toy_level)
audit_real_verdict = weakest_phrase(real_audit, audit_real_n / 2, real_level)
audit_border = pd.concat([toy_audit, real_audit, lossy_rows])
audit_border = audit_border[[ex.borderline(p_, alpha, borderline_factor) for p_ in audit_border.p_holm]]
real_dfs = "–".join(map(str, sorted({int(real_audit.df.min()), int(real_audit.df.max())})))
lookup_rows = toy_audit[toy_audit.runner == lookup]
lines = [
    f"- **Toy pair** (exact law, n = {audit_n}, continuations of {audit_len} tokens), (decoder, setting) rows at "
    f"family-wise level {alpha}: {ex.audit_counts(toy_audit)}.",
    f"- Its smallest Holm-adjusted p-value is {smallest(toy_audit)}.",
    f"- Its weakest row: {audit_toy_verdict}.",
    f"- **{real_model}** (two-sample gross-error check, n = {audit_real_n}, df {real_dfs}): "
    f"{ex.audit_counts(real_audit)}.",
    f"- Its smallest Holm-adjusted p-value is {smallest(real_audit)}.",
    f"- Its weakest row: {audit_real_verdict}.",
    "- These rows are not counted with the toy rows: they compare the modal continuation against the rest.",
    f"- **Borderline rows** (Holm-adjusted p within a factor of {borderline_factor:g} of the level): "
    + ("; ".join(f"{r.runner}, {r.setting}: " + ex.p_verdict(r.p_holm, alpha, borderline_factor)
                 for r in audit_border.itertuples()) if len(audit_border) else "none") + ".",
    f"- **Negative controls**: {int((~lossy_rows.passed).sum())} of {len(lossy_rows)} (mutant, setting) rows where "
    "the bug must be caught fail.",
    *([f"- Not required to fail at this n: {r.runner} at {r.setting}, {'caught' if not r.passed else 'not caught'} "
       f"(χ²-divergence {r.divergence:.4f}, power {r.power:.2f})." for r in weak_rows.itertuples()]
      or ["- Lossy rows not required to fail at this n: none."]),
    f"- The control {audit_real_mutant} on {real_model}: {int((~real_mut.passed).sum())} of {len(real_mut)} rows "
    "caught (power " + ", ".join(f"{p_:.2f}" for p_ in real_mut.power) + ").",
    "- **Prompt lookup** drafts on the toy prompt. Drafted tokens per token emitted: "
    + ", ".join(f"{r.setting} {r.drafted:.2f}" for r in lookup_rows.itertuples()) + ".",
    f"- **False-positive rate of the family** ({calib['rows']} rows), by {calib['reps']} simulations under the exact "
    f"law: {calib['rate']:.3f} (95% interval {calib['lo95']:.3f}–{calib['hi95']:.3f}), "
    + (f"consistent with the level {alpha}." if calib["lo95"] <= alpha else f"ABOVE the level {alpha}.")]
for r in failed_peers.itertuples():
    lines.append(f"- **{r.runner} fails** at {r.setting} (prompt {r.prompt}, n = {r.n}): p_holm = {r.p_holm:.3g}"
                 + (f", χ²-divergence {r.divergence:.3f}, TV ≤ {r.tv_upper:.3f}" if r.tv_upper == r.tv_upper
                    else "") + ".")
display(Markdown("\n".join(lines)))
assert (~lossy_rows.passed).all(), lossy_rows[lossy_rows.passed]
assert toy_audit[toy_audit.runner.str.startswith("specdec") | (toy_audit.runner == "transformers generate")].passed.all()
assert calib["lo95"] <= alpha, calib
assert not lookup_log or (toy_audit[toy_audit.runner == lookup].drafted > 0).all(), "prompt lookup never drafted"

# %% [markdown]
# ## Summary
#
# Every verdict below is computed from this run. A p-value within a factor `borderline_factor` of its threshold,
# on either side, is reported as borderline, with both numbers. The asserts of each section stop the chapter on a
# failure, so what is left to tell is how close each check came.

# %% tags=["hide-input"]
weak_toy, weak_real = toy_audit.loc[toy_audit.power.idxmin()], real_audit.loc[real_audit.power.idxmin()]
# every verdict with the power it had: n, the Holm level, the weakest named mutant, its divergence
summary = dict(family_runs=len(family), family_min_p_holm=float(family.p_holm.min()), family_N=n_family,
               family_level=fam_level, family_power=float(weak.power), family_power_mutant=weak.mutant,
               family_power_divergence=float(weak.divergence), family_N_for_goal=weak.N_for_goal, power_goal=power_goal,
               tv_upper=bound.tv_upper, epsilon=epsilon, tv_N=bound.N, tv_sampler=tv_sampler,
               calibration_inside=bool(calibrated.inside.all()), mutants_caught=int(lossy.caught.sum()), mutants=len(lossy),
               harmless_passed=int((~harmless.caught).sum()), real_checks=len(real_df),
               greedy_runs=len(greedy), audit_rows=len(toy_audit), audit_passed=int((toy_audit.verdict == "pass").sum()),
               audit_failed=int((toy_audit.verdict == "FAIL").sum()),
               audit_n=audit_n, audit_length=audit_len, audit_level=toy_level, audit_power=float(weak_toy.power),
               audit_power_mutant=f"{weak_toy.against} at {weak_toy.setting}",
               audit_power_divergence=float(weak_toy.against_divergence),
               audit_real_rows=len(real_audit), audit_real_passed=int((real_audit.verdict == "pass").sum()),
               audit_real_failed=int((real_audit.verdict == "FAIL").sum()), audit_real_n=audit_real_n,
               audit_real_df=int(real_audit.df.max()), audit_real_level=real_level,
               audit_real_power=float(weak_real.power), audit_real_power_mutant=f"{weak_real.against} at {weak_real.setting}",
               audit_real_power_divergence=float(weak_real.against_divergence),
               audit_lookup_drafted=float(toy_audit[toy_audit.runner == lookup].drafted.min()),
               audit_mutant_rows_failed=int((~lossy_rows.passed).sum()), audit_mutant_rows=len(lossy_rows),
               audit_false_positive_rate=calib["rate"])
pd.Series(summary).to_csv(ch.out / "summary.csv", header=False)  # deterministic: no timings in the tables
vp = lambda p_, thr=alpha, **w: ex.p_verdict(p_, thr, borderline_factor, **w)  # noqa: E731
n_inside = int(calibrated.inside.sum())
by_positions = {}  # methods grouped by the positions tested: "position 2 for every method" reads better than a list
for s_, v in spec_tested.items():
    by_positions.setdefault(", ".join(map(str, v)), []).append(s_)
tested = "; ".join(f"position{'s' if ',' in pos else ''} {pos} for "
                   + ("every method" if len(by_positions) == 1 else ", ".join(ms)) for pos, ms in by_positions.items())
below = "below" if bound.tv_upper < epsilon else "NOT below"
display(Markdown("\n".join([
    f"- **The accept rule** emits the target's law p. This run kept {rule_acc[0]:.4f} of the drafts, against "
    f"α = Σ min(p, q) = {alpha0:.4f}; the test of the emitted tokens against p: {vp(rule_gof.pvalue)}.",
    f"- **Every method's sequence law**, {len(family)} runs: smallest Holm-adjusted p-value "
    f"{family.p_holm.min():.3g}. Verdict: {family_verdict}.",
    f"- **Greedy decoding**: {int(greedy.equal.sum())} of {len(greedy)} runs emit identical tokens, with "
    f"{report.count(n_div, 'near-tie divergence')}.",
    f"- **Equivalence**: TV(sampled law, p) ≤ {bound.tv_upper:.4f} with 95% confidence, {below} ε = {epsilon}, for "
    f"one sampler ({exact_spec}).",
    f"- **The tests can fail**: {int(lossy.caught.sum())} of {len(lossy)} lossy controls are caught, and "
    f"{int((~harmless.caught).sum())} of {len(harmless)} harmless literal forms pass.",
])))

# %% [markdown]
# The table gives every check of the chapter with the numbers this run found.

# %% tags=["hide-input"]
power_needed = ", ".join(f"TV = {tv}: {int(g.N_needed.min())}–{int(g.N_needed.max())}"
                         for tv, g in power_df.groupby("tv"))
ctrl_line = (f"{int(lossy.caught.sum())} of {len(lossy)} lossy controls caught at n = {n_mutant}; "
             f"{int((~harmless.caught).sum())} of {len(harmless)} harmless literal forms pass; borderline: "
             + ("; ".join(f"{r.mutant} {vp(r.pvalue, passed='passes', rejected='caught')}"
                          for r in ctrl_border.itertuples()) if len(ctrl_border) else "none")
             + (f"; power by repetition ({mutant_reps} runs each): every lossy control caught in "
                f"{int(power_mut.caught.min())}–{int(power_mut.caught.max())} of {mutant_reps} runs (95% lower bound "
                f"{power_mut.power_lo95.min():.2f}); analytic power at n = {n_mutant} at least "
                f"{power_mut.analytic_power_with_impossible.min():.3f} (target {power_target})"
                if len(power_mut) else "; power by repetition: mutant_reps = 0 in this run (the full book repeats "
                                       "each control)"))
checks = [
    ("The accept rule", "2", f"measured acceptance {rule_acc[0]:.4f} against α = Σ min(p, q) = {alpha0:.4f} "
     f"({interval_confidence:.0%} interval {rule_acc[1]:.4f}–{rule_acc[2]:.4f}); emitted token against p: "
     f"{vp(rule_gof.pvalue)}" + (f"; in the loop (k = 1), acceptance against α_i, smallest of {len(acc)} two-sided p "
                                 f"against the level/m: {vp(acc_p, alpha / len(acc))}" if acc_p is not None else "")),
    ("Sequence law of every method", "3", f"{len(family)} runs (method × setting × k, {n_family} continuations each); "
     f"smallest Holm-adjusted p {family.p_holm.min():.3g}: {family_verdict}; {family_goal}"),
    ("Greedy", "4", f"{int(greedy.equal.sum())} of {len(greedy)} runs identical: {len(greedy) - len(real_g)} on the toy "
     f"pair (float64), {len(real_g)} on {real_model} with {report.count(n_div, 'float32 near-tie divergence')}"),
    ("Equivalence", "Going deeper", f"{tv_sampler}: TV(sampled law, p) ≤ {bound.tv_upper:.4f} with 95% confidence from "
     f"{bound.N} continuations, {below} ε = {epsilon} ({bound.tv_upper / epsilon:.0%} of it); the family's own bounds "
     f"are {family.tv_upper.min():.3f}–{family.tv_upper.max():.3f} ({n_family} continuations a run, sized to run every "
     "method under every setting, not to bound TV)"),
    ("Calibration and power", "Going deeper", f"{n_inside} of {len(calibrated)} rejection counts (source × level) inside "
     f"their {interval_confidence:.0%} binomial intervals; samples needed for power {power_target}: {power_needed}; "
     f"analytic power at TV = {tv_chk} {ana_power:.3f} against simulation {sim_power:.3f}"),
    ("Negative controls", "Going deeper", ctrl_line),
    (real_model, "Going deeper", f"{len(real_df)} checks; smallest Holm-adjusted p {real_min.p_holm:.3g} "
     f"({'>' if real_min.p_holm > alpha else '≤'} the level {alpha}), each check with Holm p > {alpha}; conditional "
     f"fits at positions {', '.join(map(str, sorted(set(fit_r.position))))} ({tested} decided by speculative "
     "sampling); a check of few samples with no control beside it: power not computed here (the audit states the "
     "power of the same two-sample test against one); no verdict on its own, the toy pair's exact law is where "
     "errors are caught"),
    ("Audit", "Going deeper", f"toy pair, (decoder, setting) rows: {ex.audit_counts(toy_audit)}; the weakest: "
     f"{audit_toy_verdict}; {real_model}, a two-sample gross-error check (df ≤ {int(real_audit.df.max())}): "
     f"{ex.audit_counts(real_audit)}; the weakest: {audit_real_verdict}; "
     f"{int((~lossy_rows.passed).sum())} of {len(lossy_rows)} mutant rows that must fail do; false-positive rate of "
     f"the family {calib['rate']:.3f} against the level {alpha}"),
]
display(Markdown("| check | section | this run |\n|---|---|---|\n"
                 + "\n".join(f"| {c} | {s} | {t} |" for c, s, t in checks)))
print(f"summary.csv written ({time.perf_counter() - t_start:.0f} s for the chapter)")
assert family_ok and bound.tv_upper < epsilon and calibrated.inside.all() and lossy.caught.all() and toy_ok and real_ok

# %% [markdown]
# **Exercises.**
#
# - (1) Find the smallest `draft_noise` at which `residual_from_p` is still caught at N = `n_mutant`. Why does the
#   bug vanish both when q ≈ p and when q and p are disjoint?
# - (2) Write the "bonus from q" mutant and predict in which setting it is hardest to catch.
# - (3) How many samples would the family need to show TV < 0.01 on the n = 3 law at temperature 1? Why is the
#   answer much larger than for `exact_setting`?
