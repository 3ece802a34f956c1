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
# # 4 · Tree speculative decoding
#
# A chain of K guesses is wasted from the first wrong one on, even when the draft's *second* choice was
# right. A **tree** lets one target pass check several alternatives: the draft proposes its top tokens
# at a node, the best continuations of each, and so on; the target verifies every node at once, and we
# keep the longest path it agrees with. Same four phases as chapter 3:
#
# 1. **draft**  the draft model grows the tree one depth per pass (all nodes of a depth in one pass);
# 2. **verify** one target pass over [last token, all N nodes]: node i sits at position `L + depth(i)`
#    and a 4D attention mask lets it see the committed prefix and its own ancestors only;
# 3. **accept** greedy: descend from the root while a child equals the target's argmax, then add the
#    target's own token. Sampling: *recursive rejection sampling* (below);
# 4. **commit** copy the accepted path's KV entries down to contiguous slots (an index copy in the
#    preallocated cache, in the target and in the draft); every other branch is simply forgotten.
#
# **Which sampling rule, and why it is exact.** At a node with target law p whose children
# x₁…x_m were drawn from q₁…q_m: r ← p; for each child in turn, accept it with probability
# min(1, r(x_j)/q_j(x_j)) and descend; otherwise r ← norm((r − q_j)⁺). If none is accepted, draw from r.
# This is SpecInfer's multi-step speculative sampling, with the draft's siblings drawn **without
# replacement** (q_j = q with x₁…x_{j−1} removed and renormalized) as in Jeon et al. 2024 and Sequoia:
# no node is spent on a duplicate sibling, and at temperature → 0 the siblings become the draft's top-m
# tokens, which greedy uses. Each sibling step is one ordinary speculative-sampling step against the
# current residual r_j: it emits min(q_j, r_j) + (r_j − q_j)⁺ = r_j, because r_{j+1} is fixed *before*
# x_j is drawn. So the node emits exactly p, and one level down the same holds given the accepted path.
# The proof needs one thing from the drafter: a node's number of children must be fixed before they
# are drawn (`specdec_core.tree.Dynamic` scores candidates with the parent's sorted law for that reason).
# `tests/test_tree.py` checks the law with χ² tests and kills two mutants (residual not updated, sibling
# law not updated).
#
# Notation: p = target law, q = draft law.

# %% tags=["parameters"]
params_name = None  # the parameter file's name, injected by scripts/run_book.py (banner)
model = "smollm2-135m"     # embedded name, Hugging Face id or path
draft = None               # optional Hugging Face id/path of a draft; default: the shipped draft model
per_task = 2               # prompts per task from the evaluation mix
tasks = None               # None: all six tasks; or a list, e.g. ["qa", "summarization"]
prompt_file = None         # None: the shipped mix; or a Spec-Bench question.jsonl
search_prompts = 6         # held-out training prompts the tree shape is searched on (the eval mix only times it)
max_new_tokens = 64        # tokens decoded per prompt
depth = 4                  # tree depth k, and the linear K compared at the same depth
max_depth = 7              # deepest tree (and longest chain) the search may choose
sizes = [4, 8, 12, 16, 24, 32]  # node budgets of the searched (Sequoia-optimal) and the dynamic trees
dynamic_sizes = [8, 16]    # node budgets of the dynamic (EAGLE-2-style) trees that are decoded
decode_sizes = None        # node budgets of the searched trees also decoded, to check the replay (None: all sizes)
top_ranks = 8              # draft ranks shown in the rank profile
cost_repeats = 5           # interleaved rounds when timing single passes
repeats = 2                # interleaved rounds of the tokens/s comparison
replay_steps_tol = 0.02    # the rank replay's target passes must match decoding's within this fraction ...
replay_steps_slack = 1     # ... plus this many passes
replay_accept_tol = 0.1    # ... and its accepted tokens per pass within this many tokens
threads = 0                # CPU threads (0: torch's default, every core, as in chapters 3 and 6): a verify
                           # pass over a tree's nodes is a few-row product that MKL spreads over the cores
                           # (chapter 1, section 4b measures what one thread costs instead)
device = "cpu"
dtype = "float32"  # the pair's dtype: "float32", "bfloat16", "float16" or "float64"
out_dir = "../build/book/04_tree"  # figures and CSVs land here

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from IPython.display import Markdown, display

import specdec_core as sd
from specdec_core import tree as T
from specdec_core.lm import CachedLM
from specdec_core.sampling import SamplingParams
from specdec_core.study import bench, report
from specdec_core.tools import book
from specdec_core.study import exactness as ex
from specdec_core.study import profiling as pf
from specdec_core.study import treesearch as ts
from specdec_core.verify import greedy_tree_accept

display(book.banner(params_name))
ch = book.setup(out_dir, model, draft=draft, device=device, dtype=dtype, threads=threads, per_task=per_task,
                tasks=tasks, prompt_file=prompt_file, need=("model",))
pair, encoded, drafter = ch.pair, ch.encoded, ch.drafters["model"]
drafter.bind(pair.target)
print(ch, "| draft:", "the shipped draft model" if draft is None else draft)
search = sd.prompts.sweep_prompts(pair, search_prompts)  # (meta, ids) of held-out training prompts
where = (f"the tree shape is searched on {len(search)} held-out training prompts ("
         + ", ".join(m["id"] for m, _ in search) + f") and timed on {len(encoded)} prompts of the eval mix ("
         + ", ".join(p_.id for p_, _ in encoded) + ")")
print(where[0].upper() + where[1:])

# %% [markdown]
# ## Trees as data
# A static tree is a list of index paths; each index is a rank among the parent's children (0 = the
# draft's first choice). `Tree` converts the paths once into parents, depths (the position offsets), the
# ancestor mask and the retrieve paths. The library's default tree for depth k is the first-choice chain
# plus the second choice at every depth, the third at the root, and the first child of the second. The
# figure draws it beside its attention mask:

# %%
shape = T.default_tree(depth)
print(f"{shape}: each node is named by its path of sibling ranks from the root (0 = the draft's top choice)")
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw=dict(width_ratios=[1, 1.1]))
book.draw_tree(axes[0], shape, title=f"default tree, depth {depth}: node label = rank among siblings")
names = ["root"] + ["".join(map(str, p)) for p in shape.paths]
sns.heatmap(pd.DataFrame(shape.mask.int().numpy(), index=names, columns=names), cbar=False, square=True,
            linewidths=0.5, linecolor="0.85", cmap="Blues", ax=axes[1])
axes[1].set(title="attention mask: row attends to column (and to the whole prefix)", xlabel="key node",
            ylabel="query node (path)")
fig.tight_layout()
ch.savefig(fig, "tree_and_mask")
ch.save(pd.DataFrame({"node": range(shape.n + 1), "path": names, "parent": shape.parents.tolist(),
                      "depth (position offset)": shape.depths.tolist()}), "default_tree").set_index("node")

# %% [markdown]
# ## One step, by hand
# Draft the default tree after a prompt (the first whose first step keeps a node), verify all its nodes in one
# target pass through the tree mask, and walk down the tree with the greedy rule. The red path is what the step
# keeps (a step can keep no node: then it emits the target's own token alone, as autoregressive decoding would).

# %%
greedy = SamplingParams()
for demo, ids in encoded:  # the first prompt whose first step keeps a drafted node (else the last prompt's step)
    cap = ids.numel() + T.tree_size(shape, depth) + 2
    lm = CachedLM(pair.target, cap)
    tok = int(lm.forward(ids, logits_to_keep=1)[-1].argmax())                      # prefill: first token
    drafter.reset(ids, cap)
    d = drafter.propose_tree(ids.tolist() + [tok], shape, depth, greedy, None)  # 1. draft
    L = lm.length
    logits = lm.forward(torch.cat([torch.tensor([tok]), d.tokens]), positions=L + d.tree.depths,
                        mask=d.tree.bias(L, lm.dtype, lm.device))                # 2. verify: [N+1, V]
    path, new = greedy_tree_accept(d.tree, d.tokens, logits.argmax(-1))         # 3. accept
    ptrs = [l.keys.data_ptr() for l in lm.cache.layers]
    lm.cache.retain([L + i for i in path], start=L + 1)                           # 4. commit
    assert [l.keys.data_ptr() for l in lm.cache.layers] == ptrs and lm.length == L + 1 + len(path)
    if path:
        break
show = (lambda t: repr(pair.tokenizer.decode([t]))) if pair.tokenizer else str
fig, ax = plt.subplots(figsize=(10, 4.5))
book.draw_tree(ax, d.tree, labels=[show(t) for t in d.tokens.tolist()], path=path,
               title=f"drafted tree after {show(tok)}: " + ("accepted path in red" if path else "no node accepted"))
fig.tight_layout()
ch.savefig(fig, "one_step")
chain_len = next((i for i, r in enumerate(d.tree.paths[c - 1][-1] for c in path) if r), len(path))
ranks_kept = "-".join(map(str, d.tree.paths[path[-1] - 1])) if path else ""
print(f"{demo.id}, first step: " + (f"kept {len(path)} drafted node(s) along sibling ranks {ranks_kept}, then the "
      "target's own token" if path else "kept no drafted node, only the target's own token")
      + f": emits {' '.join(show(t) for t in new.tolist())}; a chain of the rank-0 drafts would have kept {chain_len}")

# %% [markdown]
# ## Greedy exactness on every prompt
# Greedy tree decoding must reproduce greedy autoregressive decoding. In float32 a tree pass and a
# one-token pass may round differently, so a divergence is allowed only at a near-tie (the target's top-2
# logits within 1e-3), and each one is reported. (The toy pairs of `tests/test_tree.py` check exact
# equality in float64, for several trees and depths.)

# %%
ar_tokens, div = {}, []
for p_, ids in book.progress(encoded, desc="greedy exactness"):
    ar_tokens[p_.id] = ar = sd.generate(pair.target, ids, max_new_tokens=max_new_tokens).tokens
    tr = sd.generate(pair.target, ids, drafter=drafter, method="tree", k=depth, max_new_tokens=max_new_tokens).tokens
    i, gap = ex.first_divergence(pair.target, ids, tr, ar)
    if i is not None:
        div.append(dict(id=p_.id, token=i, top2_gap=gap))
print(f"{len(div)} near-tie divergences in {len(encoded)} prompts")
assert all(ex.excused(x["token"], x["top2_gap"]) for x in div), f"a greedy divergence that is not a near-tie: {div}"
pd.DataFrame(div) if div else None  # the count above already says 'none'

# %% [markdown]
# ## Where a tree's gain comes from: the draft's rank of the target's token
# Under greedy decoding the accepted path follows the target's own text. Run the draft once over each
# prompt and its greedy continuation and record, for every generated token, its **rank** in the draft's
# logits (0 = the draft's top choice). A chain accepts only runs of rank 0; a tree with a rank-1 child at
# some depth also survives a rank-1 token there. The ranks fix every greedy step of *any* static tree on
# these texts, without running the model: `treesearch.replay_greedy` replays the steps (each starts after
# the previous step's accepted tokens and the target's own), and `tests/test_tree.py` checks that the replay
# equals the accepted lengths that decoding records.
#
# Two sets of texts, kept apart: the **held-out training prompts** (`search_prompts` of them, the training
# prompts the draft recipe holds out: where the book chooses settings, as chapters 6 and 8 do), whose ranks drive
# the search for a shape below, and the **eval prompts**, whose ranks only check the replay against decoding: the
# shape that is timed on the eval mix was never chosen on it. The figure sets the two rank profiles side by side.

# %%
ranks = {p_.id: ts.draft_ranks(drafter.model, ids, ar_tokens[p_.id]) for p_, ids in encoded}
search_ranks = {}
for m_, ids in book.progress(search, desc="greedy text of the training prompts"):
    search_ranks[m_["id"]] = ts.draft_ranks(drafter.model, ids,
                                            sd.generate(pair.target, ids, max_new_tokens=max_new_tokens).tokens)
all_ranks = np.concatenate([r[1:] for r in search_ranks.values()])  # token 0 comes from the prefill
eval_ranks = np.concatenate([r[1:] for r in ranks.values()])


def rank_profile(r):
    return [np.mean(r == k_) for k_ in range(top_ranks)] + [np.mean(r >= top_ranks)]


labels = [str(r) for r in range(top_ranks)] + [f"≥{top_ranks}"]
profile = pd.concat([pd.DataFrame({"rank": labels, "P": rank_profile(r), "texts": name}) for name, r in
                     ((f"training prompts: the search ({len(all_ranks)} tokens)", all_ranks),
                      (f"eval prompts: the check ({len(eval_ranks)} tokens)", eval_ranks))], ignore_index=True)
ch.save(profile, "rank_profile")
fig, ax = plt.subplots(figsize=(8, 3.2))
sns.barplot(data=profile, x="rank", y="P", hue="texts", ax=ax)
ax.set(ylabel="P(target token has this draft rank)", title="rank profile of the target's greedy tokens")
ax.legend(fontsize=8)
fig.tight_layout()
ch.savefig(fig, "rank_profile")
for name, r in (("training prompts (search)", all_ranks), ("eval prompts (check)", eval_ranks)):
    print(f"{name}: share of the target's tokens at draft rank 0 (the draft's own top choice) {np.mean(r == 0):.3f}; "
          f"at ranks 1-3 together {np.mean((r >= 1) & (r <= 3)):.3f}")

# %% [markdown]
# ## Accepted length and pass cost versus tree size and shape
# Shape families at depth k: the chain (linear SD); the spine with side leaves (ranks 1..s at every
# depth); a wide root (b chains); the default tree; and, for each node budget n, the tree that maximizes
# the expected accepted length under the training prompts' rank profile — **Sequoia's positional model**, in
# which the child of rank r is the accepted one with probability P(rank r) (`treesearch.optimal_tree`, depth ≤
# `max_depth`). Every static shape's accepted length comes from the replay (`treesearch.replayed_accept`,
# each text's last step left out: it may accept drafts past an EOS, which the text lacks): on the training
# prompts (`search_accept`, what the search reads) and on the eval prompts (`predicted_accept`); a subset is
# decoded on the eval prompts to check the latter, together with dynamic trees, whose shape follows the draft's
# probabilities at every step (`tree.Dynamic`, EAGLE-2 style) and so can only be measured.

# %%
rank_p = [float(np.mean(all_ranks == r)) for r in range(max(sizes))]
shapes = {f"chain k={k_}": ("chain", T.Tree.chain(k_)) for k_ in range(1, max_depth + 1)}
shapes.update({f"spine+{s} sides": ("spine+sides", T.Tree.of([(0,) * (d_ - 1) + (r,) for d_ in range(1, depth + 1)
                                                           for r in range(s + 1)])) for s in (1, 2)})
shapes.update({f"wide root b={b}": ("wide root", T.Tree.from_branching([b] + [1] * (depth - 1))) for b in (2, 3)})
shapes["default"] = ("default", T.default_tree(depth))
shapes.update({f"optimal n={n}": ("optimal", ts.optimal_tree(rank_p, n, max_depth)) for n in sizes})
shapes.update({f"dynamic n={n}": ("dynamic", T.Dynamic(budget=n, width=max(2, n // depth), topk=max(2, n // depth)))
               for n in dynamic_sizes})
decoded = ([f"chain k={depth}", "default"] + [f"optimal n={n}" for n in sizes if decode_sizes is None or n in decode_sizes]
           + [f"dynamic n={n}" for n in dynamic_sizes])
for name in [n for n in decoded if isinstance(shapes[n][1], T.Tree) and shapes[n][1].n == 0]:
    decoded.remove(name)  # a draft whose ranks never match gives every node zero value: nothing worth drafting
    ch.skip(f"decoding {name}", "the training prompts' rank profile gives every node zero value, so the tree is empty")

rows = []
for name, (family, sh) in shapes.items():
    static = isinstance(sh, T.Tree)
    acc, steps = ts.replayed_accept(sh, ranks.values()) if static else (np.nan, np.nan)
    rows.append(dict(shape=name, family=family, nodes=float(sh.n if static else T.tree_size(sh, depth)),
                     depth=sh.depth if static else depth, widths=str(sh.widths) if static else "dynamic",
                     search_accept=ts.replayed_accept(sh, search_ranks.values())[0] if static else np.nan,
                     predicted_accept=acc, predicted_steps=steps))
shape_df = pd.DataFrame(rows).set_index("shape")
runs = []
for name in book.progress(decoded, desc="decode per shape"):
    sh = shapes[name][1]
    k_ = sh.depth if isinstance(sh, T.Tree) else depth
    for p_, ids in encoded:
        s = sd.generate(pair.target, ids, drafter=drafter, method="tree", k=k_, tree=sh,
                        max_new_tokens=max_new_tokens).stats
        runs.append(bench.step_table(s, shape=name, id=p_.id, task=p_.task).rename(columns={"drafted": "nodes"}))
runs = ch.save(pd.concat(runs, ignore_index=True), "decode_per_shape")
meas = runs[~runs["last"]].groupby("shape").agg(measured_accept=("accepted", "mean"), measured_nodes=("nodes", "mean"))
meas["measured_steps"] = runs.groupby("shape").size()
shape_df = shape_df.join(meas)
dyn = shape_df.family == "dynamic"
shape_df.loc[dyn, "nodes"] = shape_df.measured_nodes[dyn]  # dynamic trees: the mean size actually drafted
ch.save(shape_df.reset_index(), "accept_vs_shape")
report.shown(shape_df.drop(columns="measured_nodes"))

# %% [markdown]
# Pass costs, timed side by side (`treesearch.pass_cost_curves`, interleaved rounds): a target pass over
# T = N + 1 tokens after a context of the median training prompt's length, and a draft pass over F nodes. The mask does not change the
# arithmetic of a pass, only which scores are kept, so plain passes of the same sizes stand in for them.
# A pass over more tokens does at least the arithmetic of a smaller one, yet a larger T can *time* faster where
# the matmul library switches kernels (chapter 1, section 4b). The cost model should not reward a tree for
# reaching a faster kernel by accident of size, so the medians are smoothed by isotonic (non-decreasing)
# regression, which pools such a dip with its neighbours, before they enter the cost model. The figure puts
# acceptance against tree size (left) beside what a pass costs (right).

# %%
static_nodes = {int(shape_df.nodes[s]) for s in shape_df.index[~dyn]}
verify_T = sorted({1} | {n + 1 for n in static_nodes} | {int(round(n)) + 1 for n in shape_df.nodes[dyn]})
draft_F = sorted({1, 2, 3, 4, 6, 8, 12, 16} | {max(2, n // depth) for n in dynamic_sizes})
cost_context = bench.median_length(search).numel()  # a training prompt's length: the search's own setting
cost = ch.save(ts.pass_cost_curves(pair.target, drafter.model, cost_context, verify_T, draft_F,
                                   repeats=cost_repeats), "pass_costs")
tc, dc = (cost[cost.model == m].set_index("tokens") for m in ("target", "draft"))
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
# points, not lines: a family may have one size at a small run, and the sizes between were not measured
sns.scatterplot(data=shape_df.reset_index().melt(id_vars=["shape", "family", "nodes"], value_vars=["search_accept",
                "predicted_accept", "measured_accept"], var_name="how", value_name="accepted"), x="nodes", y="accepted", hue="family",
                style="how", s=60, ax=axes[0])
axes[0].set(xlabel="nodes per tree (N)", ylabel="accepted draft tokens per pass", title="acceptance vs tree size")
for c_, name, m in ((tc, "target pass", "o"), (dc, "draft pass", "s")):
    axes[1].errorbar(c_.index, c_["median"], yerr=[c_["median"] - c_.q25, c_.q75 - c_["median"]], fmt=m, label=name)
    axes[1].plot(c_.index, c_.fitted, "-", color=axes[1].lines[-1].get_color())
axes[1].set(xlabel="tokens in the pass (N + 1 for a verify pass)", ylabel="ms (median, IQR; line: isotonic fit)",
            title="what a pass costs")
axes[1].legend()
fig.tight_layout()
ch.savefig(fig, "accept_and_cost_vs_size")
print(f"target pass after {cost_context} tokens (isotonic fit): "
      + ", ".join(f"T = {T}: {v:.1f} ms" for T, v in tc.fitted.items()))

# %% [markdown]
# ## The best tree for this machine, chosen on the training prompts
# In the spirit of Sequoia's hardware-aware trees: a step emits (accepted + 1) tokens and costs one draft
# pass per depth (each over that depth's nodes) plus one verify pass over N + 1 tokens. With the measured
# costs and the accepted lengths replayed on the held-out training prompts (`search_accept`: the eval texts
# take no part in the choice), the predicted throughput of every static shape is
#
#   tokens/s ≈ Σ_steps (accepted + 1) / (steps · (Σ_depths t_draft(width) + t_target(N + 1))),
#
# and the chains are in the same search, so the best linear K is chosen by the same rule
# (`treesearch.predicted_throughput`; a step's cost is `treesearch.step_ms`). The figure plots every static
# shape's predicted tokens/s against its size.

# %%
static = shape_df[~dyn].copy()
static = static.join(ts.predicted_throughput({s: shapes[s][1] for s in static.index}, static.search_accept, cost))
ch.save(static.reset_index(), "predicted_throughput")
best_tree = static[static.branching].predicted_tokens_per_s.idxmax()  # a tree, not a chain in disguise
best_chain = static[static.family == "chain"].predicted_tokens_per_s.idxmax()
fig, ax = plt.subplots(figsize=(8, 4))
sns.scatterplot(data=static.reset_index(), x="nodes", y="predicted_tokens_per_s", hue="family", style="family",
                s=70, ax=ax)
for s in (best_tree, best_chain):
    ax.annotate(s, (static.nodes[s], static.predicted_tokens_per_s[s]), textcoords="offset points", xytext=(5, 5))
ax.set(xlabel="nodes per tree (N)", ylabel="predicted tokens/s",
       title=f"hardware-aware choice (prediction, {len(search)} training prompts)")
fig.tight_layout()
ch.savefig(fig, "predicted_throughput")
print(f"chosen on the training prompts: best tree {best_tree} {shapes[best_tree][1]}; best chain {best_chain}")
book.show(static.sort_values("predicted_tokens_per_s", ascending=False)[
    ["family", "nodes", "widths", "search_accept", "step_ms", "predicted_tokens_per_s"]],
    f"Predicted tokens/s of every static shape: accepted drafts per step replayed on the {len(search)} held-out "
    "training prompts (search_accept), step cost from the measured pass costs (step_ms).", prefill=False, digits=2)

# %% [markdown]
# Then we **measure**, on the eval prompts the search never saw: autoregressive decoding, linear SD at depth k and
# at the best chain's K, the default tree and the searched tree decode the same prompts, interleaved, in one run
# (`bench.decode_runner`, which times whole `generate` calls: prefill included). The figure shows every call's
# tokens/s per runner, coloured by task; the ratios are paired call by call (same prompt, same repeat), against
# autoregressive decoding (what speculation must beat to be worth it) and against linear SD at its best K (what a
# tree must beat to be worth its nodes).

# %%
k_best = shapes[best_chain][1].depth
best_sh = shapes[best_tree][1]
settings = {f"linear K={depth}": dict(method="linear", k=depth)}  # runner -> generate() arguments
if k_best != depth:
    settings[f"linear K={k_best}"] = dict(method="linear", k=k_best)
settings["tree default"] = dict(method="tree", k=depth)
if best_tree != "default":
    settings[f"tree {best_tree}"] = dict(method="tree", k=best_sh.depth, tree=best_sh)
AR = "autoregressive"
runners = {AR: bench.decode_runner(pair.target, max_new_tokens)}
runners.update({name: bench.decode_runner(pair.target, max_new_tokens, drafter=drafter, **kw)
                for name, kw in settings.items()})
best_run = f"tree {best_tree}" if best_tree != "default" else "tree default"
verify_ratio = float(tc["median"][depth + 1] / tc["median"][1]) if depth + 1 in tc.index else None
display(ch.setting(depth, verify_ratio))
timing = ch.save(bench.run_interleaved(runners, ch.bench_prompts, repeats=repeats), "speed_runs")
base = f"linear K={k_best}"
tau = timing.groupby("runner").tau.mean()
ratios = bench.paired_ratios(timing[timing.runner != AR], baseline=base)
ratios["tau_ratio"] = ratios.runner.map(tau / tau[base])
ratios_ar = bench.paired_ratios(timing, baseline=AR)
ratios_ar["tau_ratio"] = ratios_ar.runner.map(tau / tau[AR])
ch.save(pd.concat([ratios_ar.assign(baseline=AR), ratios.assign(baseline=base)], ignore_index=True), "speed_ratios")
fig, ax = plt.subplots(figsize=(9, 3.8))
sns.boxplot(data=timing, y="runner", x="tokens_per_s", color="0.9", ax=ax)
sns.stripplot(data=timing, y="runner", x="tokens_per_s", hue="task", ax=ax, size=4)
ax.set(title=f"greedy tokens/s, {len(encoded)} prompts × {repeats} interleaved repeats", ylabel="")
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()
ch.savefig(fig, "tokens_per_s")
summary = timing.groupby("runner").agg(tokens_per_s=("tokens_per_s", "median"), tau=("tau", "mean"),
                                       accepted=("accepted_per_step", "mean"), nodes=("drafted_per_step", "mean"))
for name, tab in ((AR, ratios_ar), (base, ratios)):
    book.show(tab.set_index("runner"), f"Paired tokens/s ratios against {name} (median and IQR over "
              f"{report.count(int(tab.n.max()), 'paired call')}; tau_ratio: tokens per step ÷ {name}'s), "
              f"{len(encoded)} eval prompts × {report.count(repeats, 'repeat')}.", prefill=True)
print("accepted and drafted per step below: each timed call's mean, averaged over calls (its last, length-capped "
      "step included); the acceptance table above and the conclusions pool the steps of the decode-per-shape run "
      "without each text's last step, so the two differ where short texts end on a short step")
book.show(summary.rename(columns={"accepted": "accepted/step (mean of calls)", "nodes": "nodes/step (mean of calls)"}),
          "Tokens/s per runner (median over calls), tokens per target pass (tau) and what a step accepted and "
          "drafted.", prefill=True)

# %% [markdown]
# ## Memory of tree branches in the cache
# A tree of N nodes needs N + 1 slots of headroom past the committed tokens, reserved once when the
# cache is built (`generate` sizes it with `tree.tree_size`); chapter 7 measures this in general. After
# each pass only the accepted path survives: its entries are copied down by one `index_select` per layer,
# and the rest is forgotten by moving the length. No buffer is ever reallocated.

# %%
bt, bd = pf.kv_bytes_per_slot(pair.target), pf.kv_bytes_per_slot(drafter.model)
reserved = {s: T.tree_size(shapes[s][1], depth) for s in decoded}  # a dynamic tree reserves its whole budget
mem = ch.save(pd.DataFrame([dict(shape=s, nodes_reserved=reserved[s], nodes_drafted=shape_df.measured_nodes[s],
                                 target_headroom_kb=(reserved[s] + 1) * bt / 1e3,
                                 draft_headroom_kb=reserved[s] * bd / 1e3,
                                 copied_per_step_kb=shape_df.measured_accept.get(s, np.nan) * (bt + bd) / 1e3)
                            for s in decoded]), "tree_memory")
seen = []  # (cache, address of its first key buffer) at every pass of the target and the draft


def record(module, args, kwargs):
    cache = kwargs["past_key_values"]
    seen.append((id(cache), cache.layers[0].keys.data_ptr()))


hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for m in (pair.target, drafter.model)]
try:
    res = sd.generate(pair.target, encoded[0][1], drafter=drafter, method="tree", k=best_sh.depth, tree=best_sh,
                      max_new_tokens=max_new_tokens)
finally:
    for h in hooks:
        h.remove()
buffers = {cache: {p for c, p in seen if c == cache} for cache, _ in seen}
assert all(len(v) == 1 for v in buffers.values()), "a cache buffer moved during decoding"
print(f"{len(seen)} passes over {len(buffers)} caches, each on one buffer; KV per slot: target {bt / 1e3:.1f} kB, "
      f"draft {bd / 1e3:.1f} kB")
mem.round(1)

# %% [markdown]
# ## Conclusions, checked

# %%
chain_k = shape_df.loc[f"chain k={depth}"]


def accepted(s):
    """A shape's accepted drafts per pass, decoded on the eval prompts (steps pooled, each text's last left out)."""
    v = shape_df.measured_accept.get(s, np.nan)
    return f"{v:.2f}" if v == v else f"not decoded (the replay predicts {shape_df.predicted_accept[s]:.2f})"


accept_line = f"chain k={depth} {accepted(f'chain k={depth}')}, default tree {accepted('default')}, " \
    f"{best_tree} {accepted(best_tree)}"
print(f"accepted per pass (steps pooled, each text's last left out): {accept_line}")
tps, tps_ar = ratios.set_index("runner"), ratios_ar.set_index("runner")
for b_, t_ in ((AR, tps_ar), (base, tps)):
    for r in t_.index:
        print(f"{r} / {b_}: tau {t_.tau_ratio[r]:.3f}×, tokens/s median {t_['median'][r]:.3f}× "
              f"(IQR {t_.q25[r]:.3f}–{t_.q75[r]:.3f}, {int(t_.n[r])} paired calls)")
# a tree that contains the depth-k chain accepts at least as much at every position of the text
assert all(a >= b for r in ranks.values() for a, b in zip(ts.greedy_accept_lengths(shapes["default"][1], r),
                                                           ts.greedy_accept_lengths(shapes[f"chain k={depth}"][1], r)))
# ... and, measured by decoding, the largest tree needs fewer target passes than the depth-k chain
# (a draft that accepted nothing, as a random pair's, leaves every shape at one token a pass: equal, not fewer)
largest = f"optimal n={max(sizes)}"
if largest in decoded and chain_k.measured_accept > 0:
    assert shape_df.measured_steps[largest] < chain_k.measured_steps
# the replay from the draft's ranks reproduces what decoding measures: the number of target passes and the
# accepted lengths (float32 only: a near-tie in the draft's logits may flip a rank)
chk = shape_df.dropna(subset=["predicted_accept", "measured_accept"])
display(chk[["predicted_steps", "measured_steps", "predicted_accept", "measured_accept"]].round(3))
assert ((chk.predicted_steps - chk.measured_steps).abs() <= replay_steps_tol * chk.measured_steps
        + replay_steps_slack).all()
assert (chk.predicted_accept - chk.measured_accept).abs().max() < replay_accept_tol
# a verify pass gets dearer with the tree: that is what bounds the best tree on this machine
assert tc.fitted.iloc[-1] > tc.fitted.iloc[0]

# %% [markdown]
# ## Summary
# - A tree is data: index paths → parents, position offsets, ancestor mask, retrieve paths, converted
#   once; one target pass verifies every node through a 4D mask and per-node positions.
# - Greedy acceptance follows the target's text, so the draft's **rank profile** predicts the accepted
#   length of any static tree per position (exactly, but for float32 near-ties that can flip a rank);
#   Sequoia's positional model turns it into the best tree for each node budget under that model.
# - On a CPU a verify pass costs more as the tree grows (the fitted pass-cost curve above), so the search
#   trades acceptance against pass cost with measured numbers; whether and by how
#   much a tree wins depends on the draft and on that verify-cost curve (chapter 1, section 4b), and the
#   interleaved run measures it, against autoregressive decoding and against linear SD (this run's verdicts below).
# - The shape is chosen on held-out training prompts and timed on the eval mix, so the measured speed-up is not
#   flattered by a shape fitted to the very texts it is timed on.
# - Sampling stays exact with recursive rejection sampling over siblings drawn without replacement.
# - Only the accepted path's KV entries survive, copied down by one index copy; nothing is reallocated.
#
# %%
r_best, r_best_ar = tps.loc[best_run], tps_ar.loc[best_run]
pred = static.predicted_tokens_per_s[best_tree] / static.predicted_tokens_per_s[best_chain]


def phrase(t_, r):
    return report.ratio_phrase_median(t_["median"][r], t_.q25[r], t_.q75[r], n=int(t_.n[r]))


lines = [
    f"- **Where the shape was chosen**: {where}.",
    f"- **The searched tree ({best_tree}) against autoregressive decoding**: {phrase(tps_ar, best_run)}, emitting "
    f"{r_best_ar.tau_ratio:.2f}× its tokens per target pass; linear SD at its best K ({base}): {phrase(tps_ar, base)}.",
    f"- **Accepted tokens per pass** (decoding the eval prompts, greedy): {accept_line}.",
    f"- **Rank-profile prediction against decoding**: largest |predicted − measured| accepted length "
    f"{(chk.predicted_accept - chk.measured_accept).abs().max():.3f} over {len(chk)} shapes.",
    f"- **Verify cost**: a pass over the largest tree costs {tc.fitted.iloc[-1] / tc.fitted.iloc[0]:.2f}× the "
    "smallest one's (fitted).",
    f"- **The searched tree ({best_tree}) against linear SD at the best chain's K ({base})**: "
    + phrase(tps, best_run) + f"; the search predicted {pred:.2f}× on the training prompts"
    + (" (inside the IQR measured on the eval prompts)." if r_best.q25 <= pred <= r_best.q75
       else " (outside the IQR measured on the eval prompts)."),
    *(f"- **Every timed runner against {b_}**: " + "; ".join(
        f"{r}: {phrase(t_, r)}, emitting {t_.tau_ratio[r]:.2f}× its tokens per step" for r in t_.index) + "."
      for b_, t_ in ((AR, tps_ar), (base, tps))),
]
lines += [ch.skipped_summary()] if ch.skipped else []
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Exercises
# 1. Use the rank profile to compute the expected accepted length of `Tree.from_branching([2, 2, 2])` by
#    hand under the positional model, and compare with `predicted_accept`.
# 2. Sample at temperature 1 with the default tree and with the chain: how does τ change, and why do
#    siblings drawn without replacement matter more when q is peaked?
# 3. Double the cost of a verify token in `step_ms` (a slower machine): which tree wins now? On a GPU,
#    where a pass over 64 tokens costs about one over 1, which would?
# 4. Why may the number of children of a node depend on the parent's law but not on the children's
#    own tokens? Build a shape that breaks this and find it with the χ² test of `tests/test_tree.py`.
