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
# **The question.** A chain of K guesses (K is the draft length; [notation](notation.md)) is wasted from its first
# wrong token on, even when the draft's *second* choice was right. Can one target pass check several alternatives
# at once, and does that make decoding faster?
#
# **The answer.** One pass can check a whole tree of guesses. Each node sits at its own position, and a 4D
# attention mask lets it see only the prefix and its own ancestors. The step keeps the longest path the target
# agrees with. A tree that contains the chain accepts at least as many tokens per pass. On a CPU, though, a verify
# pass over more nodes costs more. So the tree's shape is chosen for this machine, from measured costs, on held-out prompts. Whether
# the chosen tree is faster than a chain here is this run's finding: the speed table and the summary give it.
#
# In [chapter 0](00_quickstart.ipynb)'s picture of a step, the draft proposes one row of guesses. Here it proposes
# a tree, and one target pass checks every branch.
#
# ## A tree, and the mask that verifies it in one pass
#
# The symbols are those of the [notation page](notation.md): p is the target's law and q the draft's. K, the
# draft length of chapter 3, becomes the tree's depth. N is the number of nodes, the root excluded. A step has the
# same four phases as in [chapter 3](03_linear.ipynb):
#
# 1. **draft**: the draft model grows the tree one depth per pass, all nodes of a depth in one pass;
# 2. **verify**: one target pass over [last token, all N nodes]. Node i sits at position `L + depth(i)`, and a 4D
#    attention mask lets it see the committed prefix and its own ancestors only;
# 3. **accept**: with greedy decoding, descend from the root while a child equals the target's argmax. Then add
#    the target's own token. Sampling uses *recursive rejection sampling* (Going deeper);
# 4. **commit**: copy the accepted path's cache entries down to contiguous slots, in the target and in the draft.
#    Every other branch is simply forgotten.
#
# A static tree is a list of index paths. Each index is a rank among the parent's children: 0 is the draft's first
# choice. `Tree` converts the paths once into parents, depths (the position offsets), the ancestor mask and the
# retrieve paths. The library's default tree for depth k is the first-choice chain plus the second choice at every
# depth. It adds the third choice at the root and the first child of the second. The figure draws it beside its
# attention mask.

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

# %% tags=["hide-input"]
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from IPython.display import HTML, Markdown, display

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
palette = sns.color_palette("colorblind")
print(ch, "| draft:", "the shipped draft model" if draft is None else draft)
search = sd.prompts.sweep_prompts(pair, search_prompts)  # (meta, ids) of held-out training prompts
where = (f"the tree shape is searched on {len(search)} held-out training prompts ("
         + ", ".join(m["id"] for m, _ in search) + f") and timed on {len(encoded)} prompts of the eval mix ("
         + ", ".join(p_.id for p_, _ in encoded) + ")")
display(Markdown(f"The tree shape is searched on {len(search)} held-out training prompts: "
                 + ", ".join(m["id"] for m, _ in search) + f". It is timed on {len(encoded)} prompts of the eval mix: "
                 + ", ".join(p_.id for p_, _ in encoded) + "."))

# %% tags=["hide-input"]
shape = T.default_tree(depth)
print(f"{shape}:")
print("each node is named by its path of sibling ranks from the root (0 = the draft's top choice)")
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw=dict(width_ratios=[1, 1.1]))
book.draw_tree(axes[0], shape, title=f"default tree, depth {depth}: node label = rank among siblings")
names = ["root"] + ["".join(map(str, p)) for p in shape.paths]
sns.heatmap(pd.DataFrame(shape.mask.int().numpy(), index=names, columns=names), cbar=False, square=True,
            linewidths=0.5, linecolor="0.85", cmap="Blues", ax=axes[1])
axes[1].set(title="attention mask: row attends to column (and to the whole prefix)", xlabel="key node",
            ylabel="query node (path)")
fig.suptitle("One pass verifies the whole tree: each node sees the prefix and its own ancestors only")
fig.tight_layout()
ch.savefig(fig, "tree_and_mask")
plt.show()
ch.save(pd.DataFrame({"node": range(shape.n + 1), "path": names, "parent": shape.parents.tolist(),
                      "depth (position offset)": shape.depths.tolist()}), "default_tree").set_index("node")

# %% [markdown]
# ## One step, by hand
# The cell below drafts the default tree after a prompt. It verifies all the nodes in one target pass through the
# tree mask, then walks down the tree with the greedy rule. It uses the first prompt whose first step keeps a node.
# A step can keep no node: then it emits the target's own token alone, as autoregressive decoding would.

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

# %% [markdown]
# The figure draws the drafted tree; the red path is what the step keeps. The line under it shows the step in its
# sentence, coloured as in [chapter 0](00_quickstart.ipynb): the accepted path, then the target's own token.

# %% tags=["hide-input"]
show = (lambda t: repr(pair.tokenizer.decode([t]))) if pair.tokenizer else str
fig, ax = plt.subplots(figsize=(10, 4.5))
book.draw_tree(ax, d.tree, labels=[show(t) for t in d.tokens.tolist()], path=path,
               title=f"drafted tree after {show(tok)}: " + ("accepted path in red" if path else "no node accepted"))
fig.tight_layout()
ch.savefig(fig, "one_step")
plt.show()
if pair.tokenizer is not None:
    kept_tokens = [int(d.tokens[i - 1]) for i in path]
    display(HTML(f"<p>{book.STEP_LEGEND}</p><p style='font-family:monospace'>"
                 + book.step_html(pair.tokenizer, ids.tolist() + [tok], kept_tokens, len(kept_tokens), int(new[-1]),
                                  context_chars=80) + "</p>"))
chain_len = next((i for i, r in enumerate(d.tree.paths[c - 1][-1] for c in path) if r), len(path))
ranks_kept = "-".join(map(str, d.tree.paths[path[-1] - 1])) if path else ""
display(Markdown(
    f"On {demo.id}, the first step of a tree of {d.tree.n} nodes "
    + (f"kept {len(path)} drafted node(s), along sibling ranks {ranks_kept}. Then it added the target's own token."
       if path else "kept no drafted node, only the target's own token.")
    + f" It emits {' '.join(show(t) for t in new.tolist())}. A chain of the rank-0 drafts would have kept {chain_len}."))

# %% [markdown]
# ## Where a tree's gain comes from: the draft's rank of the target's token
# Under greedy decoding the accepted path follows the target's own text. So we run the draft once over each prompt
# and its greedy continuation. For every generated token we record its **rank** in the draft's logits (0 = the
# draft's top choice). A chain accepts only runs of rank 0. A tree with a rank-1 child at some depth also survives
# a rank-1 token there.
#
# The ranks fix every greedy step of *any* static tree on these texts, without running the model.
# `treesearch.replay_greedy` replays the steps, and `tests/test_tree.py` checks the replay against decoding.
#
# Two sets of texts are kept apart. The **held-out training prompts** drive the search for a shape below: that is
# where the book chooses settings, as chapters 6 and 8 do. The **eval prompts** only check the replay, so the shape
# timed on the eval mix was never chosen on it. The figure sets the two rank profiles side by side.

# %% tags=["hide-input"]
ar_tokens = {p_.id: sd.generate(pair.target, ids, max_new_tokens=max_new_tokens).tokens
             for p_, ids in book.progress(encoded, desc="greedy text of the eval prompts")}
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
sns.barplot(data=profile, x="rank", y="P", hue="texts", palette=palette[:2], ax=ax)
ax.set(ylabel="P(target token has this draft rank)", xlabel="the draft's rank of the target's token",
       title=f"On the training prompts, the draft's top choice is the target's token {np.mean(all_ranks == 0):.0%} "
             f"of the time;\nits ranks 1–3 hold {np.mean((all_ranks >= 1) & (all_ranks <= 3)):.0%}, which a tree can use")
ax.legend(fontsize=8)
fig.tight_layout()
ch.savefig(fig, "rank_profile")
plt.show()
report.shown(pd.DataFrame([{"texts": name, "rank 0 (the draft's top choice)": np.mean(r == 0),
                            "ranks 1–3 together": np.mean((r >= 1) & (r <= 3))}
                           for name, r in (("training prompts (search)", all_ranks),
                                           ("eval prompts (check)", eval_ranks))]).set_index("texts"))

# %% [markdown]
# ## Choosing a tree for this machine
# A bigger tree accepts more, but its verify pass costs more. The search weighs the two with measured numbers, in
# the spirit of Sequoia's hardware-aware trees. It works in three stages, all on the held-out training prompts:
#
# 1. **Shapes.** Several families are compared at depth k. They are the chain (linear SD), a spine with side leaves,
#    a wide root and the default tree. For each node budget n, there is also the tree that Sequoia's positional
#    model rates best. In that model, the child of rank r is the accepted one with probability P(rank r)
#    (`treesearch.optimal_tree`).
# 2. **Accepted length.** The replay from the ranks gives every static shape's accepted draft tokens per step.
# 3. **Cost.** A step costs one draft pass per depth plus one verify pass over N + 1 tokens, each timed here.
#
# The predicted throughput is then accepted tokens per step over the step's cost. The chains are in the same
# search, so the best linear K is chosen by the same rule. Going deeper draws each stage.

# %% tags=["hide-input"]
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

# pass costs, timed side by side (interleaved rounds): the target over T = N + 1 tokens, the draft over F nodes
static_nodes = {int(shape_df.nodes[s]) for s in shape_df.index[~dyn]}
verify_T = sorted({1} | {n + 1 for n in static_nodes} | {int(round(n)) + 1 for n in shape_df.nodes[dyn]})
draft_F = sorted({1, 2, 3, 4, 6, 8, 12, 16} | {max(2, n // depth) for n in dynamic_sizes})
cost_context = bench.median_length(search).numel()  # a training prompt's length: the search's own setting
cost = ch.save(ts.pass_cost_curves(pair.target, drafter.model, cost_context, verify_T, draft_F,
                                   repeats=cost_repeats), "pass_costs")
tc, dc = (cost[cost.model == m].set_index("tokens") for m in ("target", "draft"))

# the predicted throughput of every static shape, from the training prompts' replay and the measured costs
static = shape_df[~dyn].copy()
static = static.join(ts.predicted_throughput({s: shapes[s][1] for s in static.index}, static.search_accept, cost))
ch.save(static.reset_index(), "predicted_throughput")
best_tree = static[static.branching].predicted_tokens_per_s.idxmax()  # a tree, not a chain in disguise
best_chain = static[static.family == "chain"].predicted_tokens_per_s.idxmax()
display(Markdown(
    f"The search chose **{best_tree}** among the trees: {int(static.nodes[best_tree])} nodes, widths "
    f"{static.widths[best_tree]}, a predicted {static.predicted_tokens_per_s[best_tree]:.3g} tokens/s. The best "
    f"chain is **{best_chain}**, at a predicted {static.predicted_tokens_per_s[best_chain]:.3g} tokens/s."))

# %% [markdown]
# ## The chosen tree, measured
# Now we **measure**, on the eval prompts the search never saw. Autoregressive decoding, linear SD at depth k and at
# the best chain's K, the default tree and the searched tree decode the same prompts, interleaved, in one run. Each
# call is a whole `generate` call, prefill included (`bench.decode_runner`). The ratios are paired call by call:
# same prompt, same repeat. τ is the tokens per target pass ([notation](notation.md)). IQR is the interquartile
# range of the paired ratios, their middle half.
#
# Two baselines matter. Autoregressive decoding is what speculation must beat to be worth it. Linear SD at its best
# K is what a tree must beat to be worth its nodes. The figure shows every call's tokens/s, coloured by task.

# %% tags=["hide-input"]
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
tps, tps_ar = ratios.set_index("runner"), ratios_ar.set_index("runner")
fig, ax = plt.subplots(figsize=(9, 3.8))
sns.boxplot(data=timing, y="runner", x="tokens_per_s", color="0.9", ax=ax)
sns.stripplot(data=timing, y="runner", x="tokens_per_s", hue="task", ax=ax, size=4,
              palette=dict(zip(sorted(timing.task.unique()), palette)))
ax.set(title=f"Greedy tokens/s: the searched tree at {tps['median'][best_run]:.2f}× {base} (median), "
             f"{len(encoded)} prompts × {repeats} repeat(s)", ylabel="", xlabel="tokens/s (whole generate calls)")
ax.legend(fontsize=7, title="task", title_fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
fig.tight_layout()
ch.savefig(fig, "tokens_per_s")
plt.show()
summary = timing.groupby("runner").agg(tokens_per_s=("tokens_per_s", "median"), tau=("tau", "mean"),
                                       accepted=("accepted_per_step", "mean"), nodes=("drafted_per_step", "mean"))
display(Markdown(
    f"The searched tree ({best_tree}) decodes at {tps['median'][best_run]:.2f}× the tokens per second of linear SD "
    f"at its best K ({base}). Against autoregressive decoding it runs at {tps_ar['median'][best_run]:.2f}×. Both are "
    f"medians of the paired ratios. It emits {tps_ar.tau_ratio[best_run]:.2f}× the tokens per target pass of autoregressive "
    "decoding."))
speed_table, speed_note = report.verdict_table(
    [{"runner": r, "against": b_, "median": t_["median"][r], "q25": t_.q25[r], "q75": t_.q75[r], "n": t_.n[r],
      **report.test_of(t_.loc[r]), "τ ratio": f"{t_.tau_ratio[r]:.2f}×"} for b_, t_ in ((AR, tps_ar), (base, tps))
     for r in t_.index])
speed_table = speed_table[["against", "runner", "median", "IQR", "n", "verdict", "τ ratio"]]
book.show(speed_table.set_index(["against", "runner"]),
          f"Paired tokens/s ratios over {len(encoded)} eval prompts × {report.count(repeats, 'repeat')}: median, IQR "
          "and n prompts (each prompt's repeats taken together). The τ ratio is the runner's tokens per target pass over the baseline's."
          + speed_note, prefill=True, digits=None)

# %% [markdown]
# ## Going deeper
#
# ### The sampling rule, and why it is exact
# Take a node with target law p whose children x₁…x_m were drawn from q₁…q_m. Start with r ← p. For each child in
# turn, accept it with probability min(1, r(x_j)/q_j(x_j)) and descend. Otherwise set r ← norm((r − q_j)⁺) and
# try the next child. If no child is accepted, draw from r.
#
# This is SpecInfer's multi-step speculative sampling. The draft's siblings are drawn **without replacement**:
# q_j is q with x₁…x_{j−1} removed and renormalized, as in Jeon et al. 2024 and Sequoia. So no node is spent on a
# duplicate sibling. At temperature → 0 the siblings become the draft's top-m tokens, which greedy uses.
#
# Each sibling step is one ordinary speculative-sampling step against the current residual r_j. It emits
# min(q_j, r_j) + (r_j − q_j)⁺ = r_j, because r_{j+1} is fixed *before* x_j is drawn. So the node emits exactly p.
# One level down, the same holds given the accepted path.
#
# The proof needs one thing from the drafter: a node's number of children must be fixed before they are drawn.
# `specdec_core.tree.Dynamic` scores candidates with the parent's sorted law for that reason. `tests/test_tree.py`
# checks the law with χ² tests. It kills two mutants: one that does not update the residual, and one that does not
# update the sibling law.
#
# ### Greedy exactness on every prompt
# Greedy tree decoding must reproduce greedy autoregressive decoding. In float32 a tree pass and a one-token pass may
# round differently. So a divergence is allowed only at a near-tie, where the target's top-2 logits are within
# 1e-3, and each one is reported. The toy pairs of `tests/test_tree.py` check exact equality in float64, for
# several trees and depths.

# %% tags=["hide-input"]
div = []
for p_, ids in book.progress(encoded, desc="greedy exactness"):
    tr = sd.generate(pair.target, ids, drafter=drafter, method="tree", k=depth, max_new_tokens=max_new_tokens).tokens
    i, gap = ex.first_divergence(pair.target, ids, tr, ar_tokens[p_.id])
    if i is not None:
        div.append(dict(id=p_.id, token=i, top2_gap=gap))
print(f"{len(div)} near-tie divergences in {len(encoded)} prompts")
assert all(ex.excused(x["token"], x["top2_gap"]) for x in div), f"a greedy divergence that is not a near-tie: {div}"
pd.DataFrame(div) if div else None  # the count above already says 'none'

# %% [markdown]
# ### Accepted length against tree size and shape
# Every static shape's accepted length comes from the replay (`treesearch.replayed_accept`). Each text's last step
# is left out: it may accept drafts past an end-of-sequence token, which the text lacks. The table gives it on the
# training prompts (`search_accept`, what the search reads) and on the eval prompts (`predicted_accept`).
#
# A subset of shapes is decoded on the eval prompts to check the latter (`measured_accept`). Dynamic trees are
# decoded too. Their shape follows the draft's probabilities at every step (`tree.Dynamic`, EAGLE-2 style), so
# they can only be measured.

# %% tags=["hide-input"]
report.shown(shape_df.drop(columns="measured_nodes"))

# %% [markdown]
# ### What a pass costs
# The costs are timed side by side in interleaved rounds (`treesearch.pass_cost_curves`). A target pass runs over
# T = N + 1 tokens, after a context of the median training prompt's length. A draft pass runs over F nodes. The mask
# changes which scores are kept, not the arithmetic of a pass, so plain passes of the same sizes stand in for them.
#
# A pass over more tokens does at least the arithmetic of a smaller one. Yet a larger T can *time* faster, where the
# matmul library switches kernels ([chapter 1](01_bottleneck.ipynb), section 4b). The cost model should not reward a
# tree for reaching a faster kernel by accident of size. So the medians are smoothed by isotonic (non-decreasing)
# regression, which pools such a dip with its neighbours. The figure puts acceptance against tree size (left)
# beside what a pass costs (right).

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
# points, not lines: a family may have one size at a small run, and the sizes between were not measured
fam = sorted(shape_df.family.unique())
sns.scatterplot(data=shape_df.reset_index().melt(id_vars=["shape", "family", "nodes"], value_vars=["search_accept",
                "predicted_accept", "measured_accept"], var_name="how", value_name="accepted"), x="nodes", y="accepted",
                hue="family", hue_order=fam, palette=dict(zip(fam, palette)), style="how", s=60, ax=axes[0])
axes[0].set(xlabel="nodes per tree (N)", ylabel="accepted draft tokens per pass", title="acceptance vs tree size")
axes[0].legend(fontsize=7)
for c_, name, m, colour in ((tc, "target pass", "o", palette[0]), (dc, "draft pass", "s", palette[1])):
    axes[1].errorbar(c_.index, c_["median"], yerr=[c_["median"] - c_.q25, c_.q75 - c_["median"]], fmt=m,
                     color=colour, label=name)
    axes[1].plot(c_.index, c_.fitted, "-", color=colour)
axes[1].set(xlabel="tokens in the pass (N + 1 for a verify pass)", ylabel="ms (median, IQR; line: isotonic fit)",
            title="what a pass costs")
axes[1].legend()
fig.suptitle(f"What a bigger tree buys, and what it costs: a verify pass over T = {tc.index[-1]} tokens costs "
             f"{tc.fitted.iloc[-1] / tc.fitted.iloc[0]:.2f}× one over T = {tc.index[0]} (fitted)")
fig.tight_layout()
ch.savefig(fig, "accept_and_cost_vs_size")
plt.show()
print(f"Target pass after {cost_context} tokens (isotonic fit):")
print(textwrap.fill(", ".join(f"T = {T_}: {v:.1f} ms" for T_, v in tc.fitted.items()), 120))

# %% [markdown]
# ### The search's prediction
# A step emits (accepted + 1) tokens. It costs one draft pass per depth, each over that depth's nodes, plus one
# verify pass over N + 1 tokens. With the measured costs and the accepted lengths replayed on the training prompts,
# every static shape gets a predicted throughput:
#
# $$\text{tokens/s} \approx \frac{\sum_\text{steps} (\text{accepted} + 1)}{\text{steps} \cdot \big(\sum_\text{depths}
# t_\text{draft}(\text{width}) + t_\text{target}(N + 1)\big)}.$$
#
# The eval texts take no part in the choice (`treesearch.predicted_throughput`; a step's cost is
# `treesearch.step_ms`). The figure plots every static shape's predicted tokens/s against its size.

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(8, 4))
sns.scatterplot(data=static.reset_index(), x="nodes", y="predicted_tokens_per_s", hue="family", style="family",
                hue_order=[f for f in fam if f in set(static.family)],
                palette=dict(zip(fam, palette)), s=70, ax=ax)
for s in (best_tree, best_chain):
    ax.annotate(s, (static.nodes[s], static.predicted_tokens_per_s[s]), textcoords="offset points", xytext=(5, 5))
ax.set(xlabel="nodes per tree (N)", ylabel="predicted tokens/s",
       title=f"Predicted on {len(search)} training prompts: best tree {best_tree}, best chain {best_chain}")
fig.tight_layout()
ch.savefig(fig, "predicted_throughput")
plt.show()
print(f"Chosen on the training prompts: best tree {best_tree} {shapes[best_tree][1]}; best chain {best_chain}")
book.show(static.sort_values("predicted_tokens_per_s", ascending=False)[
    ["family", "nodes", "widths", "search_accept", "step_ms", "predicted_tokens_per_s"]],
    f"Predicted tokens/s of every static shape: accepted drafts per step replayed on the {len(search)} held-out "
    "training prompts (search_accept), step cost from the measured pass costs (step_ms).", prefill=False, digits=2)

# %% [markdown]
# ### Each runner's speed, τ and step
# The table gives each runner's tokens/s (median over calls), its tokens per target pass τ, and what a step
# accepted and drafted. Those two are each timed call's mean, averaged over calls, its last, length-capped step
# included. The acceptance table above and the conclusions pool the steps of the decode-per-shape run, without each
# text's last step. So the two differ where short texts end on a short step.

# %% tags=["hide-input"]
book.show(summary.rename(columns={"accepted": "accepted/step (mean of calls)", "nodes": "nodes/step (mean of calls)"}),
          "Tokens/s per runner (median over calls), tokens per target pass (tau) and what a step accepted and "
          "drafted.", prefill=True)

# %% [markdown]
# ### Memory of tree branches in the cache
# A tree of N nodes needs N + 1 slots of headroom past the committed tokens. They are reserved once, when the cache
# is built: `generate` sizes it with `tree.tree_size`, and [chapter 7](07_kv_cache.ipynb) measures this in general.
# After each pass only the accepted path survives. Its entries are copied down by one `index_select` per layer, and
# the rest is forgotten by moving the length. No buffer is ever reallocated.

# %% tags=["hide-input"]
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
print(f"{len(seen)} passes over {len(buffers)} caches, each on one buffer.")
print(f"KV per slot: target {bt / 1e3:.1f} kB, draft {bd / 1e3:.1f} kB.")
mem.round(1)

# %% [markdown]
# ### Conclusions, checked
# The cell below asserts what the chapter claims. A tree that contains the depth-k chain accepts at least as much.
# The largest tree needs fewer target passes than the chain. The replay reproduces decoding, and a verify pass gets
# dearer with the tree.

# %% tags=["hide-input"]
chain_k = shape_df.loc[f"chain k={depth}"]


def accepted(s):
    """A shape's accepted drafts per pass, decoded on the eval prompts (steps pooled, each text's last left out)."""
    v = shape_df.measured_accept.get(s, np.nan)
    return f"{v:.2f}" if v == v else f"not decoded (the replay predicts {shape_df.predicted_accept[s]:.2f})"


accept_line = f"chain k={depth} {accepted(f'chain k={depth}')}, default tree {accepted('default')}, " \
    f"{best_tree} {accepted(best_tree)}"
print("Accepted per pass (steps pooled, each text's last left out):")
print(accept_line)
for b_, t_ in ((AR, tps_ar), (base, tps)):
    for r in t_.index:
        print(f"{r} / {b_}: tau {t_.tau_ratio[r]:.3f}×, tokens/s median {t_['median'][r]:.3f}× "
              f"(IQR {t_.q25[r]:.3f}–{t_.q75[r]:.3f}, {int(t_.n[r])} prompts)")
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
# One target pass verifies a whole tree through a 4D mask and per-node positions. Only the accepted path's cache
# entries survive, and nothing is reallocated. Sampling stays exact with recursive rejection sampling. What this run
# measured, computed from its tables:

# %% tags=["hide-input"]
r_best, r_best_ar = tps.loc[best_run], tps_ar.loc[best_run]
pred = static.predicted_tokens_per_s[best_tree] / static.predicted_tokens_per_s[best_chain]
lines = [
    f"- **Where the shape was chosen**: {where}.",
    f"- **The searched tree ({best_tree})** decodes at {r_best_ar['median']:.2f}× autoregressive decoding and "
    f"{r_best['median']:.2f}× linear SD at its best K ({base}), medians of the paired ratios. The search predicted "
    f"{pred:.2f}× against that chain on the training prompts, "
    + ("inside" if r_best.q25 <= pred <= r_best.q75 else "outside") + " the IQR measured on the eval prompts. "
    "The verdicts are in the speed table.",
    f"- **Accepted tokens per pass** (decoding the eval prompts, greedy): {accept_line}.",
    f"- **The rank profile predicts decoding**: the largest |predicted − measured| accepted length is "
    f"{(chk.predicted_accept - chk.measured_accept).abs().max():.3f} over {len(chk)} shapes.",
    f"- **Verify cost**: a pass over the largest tree costs {tc.fitted.iloc[-1] / tc.fitted.iloc[0]:.2f}× the "
    "smallest one's (fitted). That is what bounds the best tree on this machine.",
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
