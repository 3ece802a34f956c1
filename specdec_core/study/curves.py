"""Speedup curves across acceptance: a controlled draft on the real target (chapter 10).

The book's own drafts agree with the target on α ≈ 0.35–0.5 of the evaluation mix, which is not where
speculation earns the 2–3× the field reports. :class:`ControlledDrafter` sets the agreement instead of
training it: at every step it proposes the target's own greedy continuation, each position kept with
probability α (Leviathan et al.'s i.i.d. model, made true by construction), and everything else is real: the
target, its verify passes, the decode loop, and optionally the real draft's passes (``cost``). What is left to
measure is the decoder's own efficiency at each α, against Theorem 3.8 with pass costs measured in the same run.

    from specdec_core.study import curves
    ref = curves.greedy_reference(pair.target, ids, max_new_tokens=64)
    res = sd.generate(pair.target, ids, drafter=curves.ControlledDrafter(ref, 0.9), method="linear", k=4,
                      max_new_tokens=64)

The rest of the module turns an interleaved run of such runners (:func:`grid_runners`, timed with
:func:`~specdec_core.study.bench.run_interleaved`) into the chapter's tables: measured curve against the theory
(:func:`curve_table`), the step's time budget in target passes (:func:`step_budget`), the best K per α and the α at
which each K starts to pay (:func:`best_k_table`, :func:`crossings`), and the α a draft would need for a speedup
(:func:`alpha_needed`). Every call of a grid draws from its own seed (:func:`cell_seed`), so each cell's α̂ is a
binomial sample of its own: :func:`curve_table` gives its Clopper–Pearson interval, :func:`nominal_check` counts
the cells whose nominal α falls outside, :func:`shared_draws` compares the draws of calls that differ only in
cost, and crossings are read on the measured α̂ (:func:`read_crossing`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.stats import binom

from ..decode import generate
from ..drafters import Draft, Drafter
from .bench import decode_runner, paired_ratios, pooled_alpha, theory_check
from .exactness import binomial_interval
from .theory import speedup


def _as_ids(reference) -> list[int]:
    """A 1-D LongTensor or list of ints → list of ints; anything else is refused by name."""
    if isinstance(reference, torch.Tensor):
        if reference.dim() != 1:
            raise ValueError(f"reference must be 1-D (the prompt followed by the target's greedy tokens), got shape "
                             f"{tuple(reference.shape)}")
        if reference.dtype.is_floating_point or reference.dtype.is_complex or reference.dtype == torch.bool:
            raise ValueError(f"reference must hold integer token ids, got dtype {reference.dtype}")
        ids = reference.tolist()
    else:
        ids = [x.item() if isinstance(x, torch.Tensor) and x.dim() == 0 else x for x in reference]
        bad = [x for x in ids if isinstance(x, bool) or not isinstance(x, (int, np.integer))]
        if bad:
            raise ValueError(f"reference must hold integer token ids, got {bad[0]!r}")
        ids = [int(x) for x in ids]
    if not ids:
        raise ValueError("empty reference: it must hold the prompt and the target's greedy continuation")
    if min(ids) < 0:
        raise ValueError(f"reference holds a negative token id ({min(ids)})")
    return ids


def greedy_reference(target, input_ids, max_new_tokens: int) -> list[int]:
    """The prompt followed by the target's own greedy continuation (``sd.generate``, autoregressive): what
    :class:`ControlledDrafter` proposes from."""
    ids = torch.as_tensor(input_ids).view(-1)
    return ids.tolist() + generate(target, ids, max_new_tokens=max_new_tokens).tokens


class ControlledDrafter(Drafter):
    """A drafter whose acceptance rate is set: α per tested position, i.i.d., on the real target (greedy only).

    At a step whose context is the first n tokens of ``reference`` it proposes ``reference[n], reference[n+1], …``
    (up to K; fewer where the reference ends), each position kept with probability ``alpha`` by its own
    generator (seeded by ``seed`` at every :meth:`reset`, so a call is reproducible and independent of the
    loop's generator). Calls meant to be independent need distinct seeds: two drafters with one seed draw the
    same uniforms, whatever their α, K, prompt or cost (:func:`cell_seed` gives each call of a grid its own).
    At the first position not kept it proposes a token that is not the reference's, and the
    reference's tokens after it (never tested: a greedy verifier stops at the first mismatch), so the verify pass
    always spans K + 1 tokens, as with a real draft. Since the reference is the target's greedy output, a kept
    token is the target's argmax and is accepted; a changed one is rejected: acceptance per tested position is
    Bernoulli(α). The verifier still decides every token, so the output is the target's greedy output whatever α.

    ``cost``: ``None``, proposals are free (no draft pass). A :class:`Drafter` (e.g. ``pair.drafter``): at every
    step that drafter's own proposal for the same context and K is computed and discarded, so the step pays its
    passes, time and cache work. Its cache must hold a prefix of what was *committed*, not its discarded
    proposals: after the verdict it keeps its own first j proposed tokens, j = how many of them equal the
    committed ones (``cost.accept(own, j)``), and the rest of the committed tokens are fed to it at the start of its
    next proposal, in one pass. Beside the real drafter's own steps that costs nothing where its proposals agree
    with the committed tokens and one wider first pass where they do not (it reads n + 1 tokens instead of 1);
    chapter 10 measures the draft phase of both.
    """

    name = "controlled"

    def __init__(self, reference, alpha: float, cost: Drafter | None = None, seed: int = 0):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)) or not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
        if cost is not None and not isinstance(cost, Drafter):
            raise ValueError(f"cost must be None (free proposals) or a Drafter whose passes each step pays, "
                             f"got {type(cost).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.reference = _as_ids(reference)
        self.alpha, self.cost, self.seed = float(alpha), cost, int(seed)
        self.vocab_size = cost.vocab_size if cost is not None else None
        self.name = "controlled" if cost is None else f"controlled+{cost.name}"
        self._rng = torch.Generator().manual_seed(self.seed)

    def bind(self, target) -> None:
        vocab = target.config.get_text_config().vocab_size
        if self.cost is not None:
            self.cost.bind(target)
        if max(self.reference) >= vocab:
            raise ValueError(f"reference holds token id {max(self.reference)}, outside the target's vocabulary of "
                             f"{vocab}: a reference for another model?")
        self.vocab_size = vocab

    def _check_prefix(self, context: list[int]) -> None:
        n, ref = len(context), self.reference
        if n > len(ref) or context != ref[:n]:
            at = next((i for i, (a, b) in enumerate(zip(context, ref)) if a != b), min(n, len(ref)))
            found = f"the context has {context[at]} where the reference has {ref[at]}" if at < min(n, len(ref)) else \
                f"the context ({n} tokens) runs past the reference ({len(ref)} tokens)"
            raise ValueError(f"context is not a prefix of the reference at position {at}: {found}. A controlled draft "
                             "proposes the target's greedy continuation: give the prompt followed by "
                             "greedy_reference()'s tokens for this prompt and decode greedily (a float near-tie where "
                             "the verify pass's argmax differs from the one-token pass's shows up here too)")

    def reset(self, prompt, capacity) -> None:
        self._check_prefix(torch.as_tensor(prompt).view(-1).tolist())
        self._rng.manual_seed(self.seed)
        if self.cost is not None:
            self.cost.reset(prompt, capacity)

    def propose(self, context, k, params, generator, confidence=None) -> Draft:
        if not params.greedy:
            raise ValueError("ControlledDrafter is for greedy decoding (temperature 0): a sampled run leaves the "
                             "greedy reference it proposes from")
        if confidence is not None:
            raise ValueError("ControlledDrafter sets its own acceptance: a confidence stop does not apply")
        self._check_prefix(context)
        n, ref = len(context), self.reference
        passes, own = 0, None
        if self.cost is not None:  # the real draft's work for this context and K, discarded
            own = self.cost.propose(context, k, params, generator)
            passes = own.passes
        tokens = ref[n:n + k]
        kept = (torch.rand(len(tokens), generator=self._rng) < self.alpha).tolist()
        if False in kept:
            miss = kept.index(False)
            vocab = self.vocab_size or max(self.reference) + 2  # bound by generate(); unbound: any other id
            tokens[miss] = (tokens[miss] + 1) % vocab  # any token but the target's argmax
        return Draft(torch.tensor(tokens, dtype=torch.long), None, passes=passes, state={"own": own})

    def accept(self, draft, n) -> None:
        own = draft.state["own"]  # the cost drafter's own proposal for this step
        if own is not None:
            committed, mine, j = draft.tokens[:n].tolist(), own.tokens.tolist(), 0
            while j < min(n, len(mine)) and mine[j] == committed[j]:
                j += 1
            self.cost.accept(own, j)


# -- a grid of runners and what the chapter reads from its run ------------------------------------------------
def cell_seed(base: int, *indices: int) -> int:
    """The seed of one controlled call: numpy's ``SeedSequence(base, spawn_key=indices)``, the top 52 bits of its
    first 64-bit word (an int a float64 column holds exactly, as a run table's does beside autoregressive rows).
    :func:`controlled_runner` passes the indices (prompt, α, K, cost, call): the prompt's place in ``references``, α's, K's and the cost's places in :func:`grid_runners`' lists,
    and how many calls that runner made on that prompt before (warm-ups included, so a repeat draws anew).
    Distinct indices give distinct, statistically independent streams, and the same indices the same stream."""
    for i in (base, *indices):
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
            raise ValueError(f"cell_seed takes non-negative integers (a base seed and indices), got {i!r}")
    state = np.random.SeedSequence(int(base), spawn_key=tuple(int(i) for i in indices)).generate_state(1, np.uint64)
    return int(state[0]) >> 12


def runner_name(alpha: float, k: int, cost: str) -> str:
    """``"controlled|<α>|<K>|<cost>"``: the name :func:`parse_names` reads back."""
    return f"controlled|{alpha:g}|{k}|{cost}"


def parse_names(df: pd.DataFrame, column: str = "runner") -> pd.DataFrame:
    """Add ``alpha``, ``K`` and ``cost`` columns to the controlled rows of a table keyed by :func:`runner_name`."""
    d = df[df[column].str.startswith("controlled|")].copy()
    parts = d[column].str.split("|")
    d["alpha"], d["K"], d["cost"] = parts.str[1].astype(float), parts.str[2].astype(int), parts.str[3]
    return d


def controlled_runner(target, references: dict[tuple, list[int]], alpha: float, k: int, max_new_tokens: int,
                      cost: Drafter | None = None, seed: int = 0, cell: tuple[int, ...] = (),
                      outputs: dict | None = None, keep_steps: bool = False, drafter: type | None = None):
    """A :func:`~specdec_core.study.bench.decode_runner`-style runner (phase times, steps, counts) decoding with a
    fresh :class:`ControlledDrafter` built from the prompt's reference (``references[tuple(ids)]``), seeded by
    ``cell_seed(seed, prompt, *cell, call)``: ``prompt`` is the prompt's place in ``references``, ``call`` how many
    calls this runner made on it before, so no two calls share a stream unless their indices are equal. Its row
    also says whether the output equals the reference's continuation (``identical``) and the call's ``seed``;
    ``keep_steps`` keeps the per-step accepted lengths (``accepted_lengths``), the draws a call's tests saw;
    ``drafter``: the class built per call (default :class:`ControlledDrafter`; a subclass, e.g. a test's mutant)."""
    drafter = ControlledDrafter if drafter is None else drafter
    place = {key: i for i, key in enumerate(references)}
    calls: dict[tuple, int] = {}

    def run(ids):
        key = tuple(torch.as_tensor(ids).view(-1).tolist())
        if key not in place:
            raise ValueError(f"no reference for this prompt ({len(key)} tokens): references must hold the prompt "
                             "followed by greedy_reference()'s tokens for every prompt the runner decodes")
        n = calls[key] = calls.get(key, -1) + 1
        call_seed = cell_seed(seed, place[key], *cell, n)
        d = drafter(references[key], alpha, cost=cost, seed=call_seed)
        row = decode_runner(target, max_new_tokens, method="linear", drafter=d, k=k, outputs=outputs,
                            keep_steps=keep_steps)(ids)
        row["identical"] = row["tokens"] == references[key][len(key):len(key) + len(row["tokens"])]
        row["seed"] = call_seed
        return row
    return run


def grid_runners(target, references: dict[tuple, list[int]], alphas, ks, costs: dict[str, Drafter | None],
                 max_new_tokens: int, seed: int = 0, keep_steps: bool = False, drafter: type | None = None) -> dict:
    """One runner per (α, K, cost) of the grid (``costs``: name → cost drafter, ``None`` for free proposals), each
    call drawing from its own stream: ``cell_seed(seed, prompt, α's place in alphas, K's in ks, the cost's in
    costs, call)`` (:func:`controlled_runner`, which also says what ``keep_steps`` and ``drafter`` do)."""
    return {runner_name(a, k, c): controlled_runner(target, references, a, k, max_new_tokens, cost=d, seed=seed,
                                                    cell=(ia, ik, ic), keep_steps=keep_steps, drafter=drafter)
            for ic, (c, d) in enumerate(costs.items()) for ik, k in enumerate(ks) for ia, a in enumerate(alphas)}


def shared_draws(runs: pd.DataFrame) -> pd.DataFrame:
    """Whether calls that differ only in their proposals' cost drew the same acceptances: per (prompt, repeat, α,
    K) with more than one cost, ``identical`` is True where every cost's per-step accepted lengths are equal (the
    runs must keep their steps: :func:`grid_runners` with ``keep_steps``). With one stream for every call they are
    all equal; with independent streams equality is chance, rare unless α is near 0 or 1 or the call is short."""
    ctl = parse_names(runs)
    if "accepted_lengths" not in ctl:
        raise ValueError("shared_draws needs the per-step accepted lengths: run grid_runners with keep_steps=True")
    rows = []
    for (pid, rep, a, k), g in ctl.groupby(["id", "repeat", "alpha", "K"]):
        if g.cost.nunique() > 1:
            seqs = [tuple(x) for x in g.accepted_lengths]
            rows.append(dict(id=pid, repeat=rep, alpha=a, K=k, costs=g.cost.nunique(),
                             steps=min(len(x) for x in seqs), identical=len(set(seqs)) == 1))
    return pd.DataFrame(rows, columns=["id", "repeat", "alpha", "K", "costs", "steps", "identical"])


def curve_table(runs: pd.DataFrame, c: dict[str, float], verify_ratio: dict[int, float],
                baseline: str = "autoregressive", level: float = 0.99) -> pd.DataFrame:
    """One row per (cost, K, α) of a grid run: the paired speedup over ``baseline`` (tokens/s, prefill
    included: ``median``, ``q25``, ``q75``, ``n``), the decode loops' speedup and Theorem 3.8's prediction
    (:func:`~specdec_core.study.bench.theory_check`: each call from its own α̂, ``c[cost]`` and the verify ratio
    measured in the run; medians over calls, ``rel_error``), the prediction at the nominal α
    (``predicted_nominal``), the pooled α̂ over its ``tests`` (accepted + rejections, every call), its
    Clopper–Pearson interval at ``level`` (``alpha_lo``, ``alpha_hi``, ``alpha_level``), whether the nominal α
    lies inside (``nominal_inside``), and whether every output equalled the reference."""
    ctl = parse_names(runs)
    ratios = parse_names(paired_ratios(runs, baseline))
    alpha_hat = pooled_alpha(ctl)
    rows = []
    for r in ratios.itertuples():
        _, th = theory_check(runs, r.runner, baseline, r.K, c[r.cost], verify_ratio[r.K])
        calls = ctl[ctl.runner == r.runner]
        acc, tests = int(calls.accepted.sum()), int(calls.accepted.sum() + calls.rejections.sum())
        lo, hi = binomial_interval(acc, tests, level) if tests else (float("nan"), float("nan"))
        rows.append(dict(cost=r.cost, K=r.K, alpha=r.alpha, median=r.median, q25=r.q25, q75=r.q75, n=r.n,
                         p=r.p, sigma=r.sigma, power=r.power, n_tell=r.n_tell, alpha_hat=float(alpha_hat[r.runner]), tests=tests, alpha_lo=lo, alpha_hi=hi,
                         alpha_level=level, nominal_inside=bool(lo <= r.alpha <= hi),
                         decode_measured=th["measured_median"],
                         predicted=th["predicted_median"], rel_error=(th["measured_median"] - th["predicted_median"])
                         / th["predicted_median"], predicted_nominal=float(speedup(r.alpha, r.K, c[r.cost],
                                                                                  verify_ratio[r.K])),
                         identical=bool(calls.identical.all()), calls=len(calls)))
    return pd.DataFrame(rows).sort_values(["cost", "K", "alpha"]).reset_index(drop=True)


def step_budget(runs: pd.DataFrame, c: dict[str, float], verify_ratio: dict[int, float],
                baseline: str = "autoregressive") -> pd.DataFrame:
    """Where a speculative step's time goes, in units of the baseline's decode step (one target pass and its
    loop: median over the same prompts), per (cost, K), pooled over α: the theory's draft (K·c) and verify
    (verify ratio) terms beside the measured draft and verify phases, accept + commit, and the rest of the loop
    (decode time not in any phase: the EOS/budget cut, the record, the generator's hand-over). ``missing`` is
    measured − modelled: the per-step overhead Theorem 3.8 does not carry."""
    base = runs[runs.runner == baseline]
    t1 = float((base.decode_s / base.decode_tokens.clip(lower=1)).median())
    ctl = parse_names(runs)
    ctl = ctl[ctl.steps > 0]
    per = lambda col: ctl[col] / ctl.steps / t1  # noqa: E731
    d = pd.DataFrame({"cost": ctl.cost, "K": ctl.K, "draft": per("draft_s"), "verify": per("verify_s"),
                      "accept_commit": (ctl.accept_s + ctl.commit_s) / ctl.steps / t1,
                      "loop": (ctl.decode_s - ctl.draft_s - ctl.verify_s - ctl.accept_s - ctl.commit_s)
                      / ctl.steps / t1, "step": per("decode_s")})
    out = d.groupby(["cost", "K"]).median().reset_index()
    out["model_draft"] = [o.K * c[o.cost] for o in out.itertuples()]
    out["model_verify"] = [verify_ratio[o.K] for o in out.itertuples()]
    out["model_step"] = out.model_draft + out.model_verify
    out["missing"] = out.step - out.model_step
    return out


def alpha_needed(target_speedup: float, k: int, c: float, verify_ratio: float, tol: float = 1e-6) -> float:
    """The α at which Theorem 3.8 (with the verify ratio) reaches ``target_speedup`` at this K (bisection: the
    speedup rises with α); ``nan`` where even α = 1 falls short."""
    if float(speedup(1.0, k, c, verify_ratio)) < target_speedup:
        return float("nan")
    if float(speedup(0.0, k, c, verify_ratio)) >= target_speedup:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(speedup(mid, k, c, verify_ratio)) < target_speedup else (lo, mid)
    return hi


def crossing(alphas, values, level: float = 1.0) -> float:
    """The α where a measured curve (``values`` at increasing ``alphas``) first reaches ``level``, interpolated
    linearly between the grid points around it; ``nan`` if it never does, the first α if it starts there."""
    a, v = np.asarray(alphas, dtype=float), np.asarray(values, dtype=float)
    above = np.nonzero(v >= level)[0]
    if not above.size:
        return float("nan")
    i = int(above[0])
    if i == 0:
        return float(a[0])
    return float(a[i - 1] + (level - v[i - 1]) * (a[i] - a[i - 1]) / (v[i] - v[i - 1]))


def read_crossing(g: pd.DataFrame, level: float, on: str = "alpha_hat", values: str = "median") -> float:
    """:func:`crossing` of one (cost, K) curve's ``values`` read against column ``on``: ``"alpha_hat"``, the α̂
    each point measured (points sorted by it), or ``"alpha"``, the nominal α the grid set."""
    g = g.sort_values([on, "alpha"])
    return crossing(g[on], g[values], level)


def crossings(curve: pd.DataFrame, c: dict[str, float], verify_ratio: dict[int, float],
              level: float = 1.0) -> pd.DataFrame:
    """Per (cost, K): the α at which the measured median paired speedup (``median``: tokens/s, prefill included)
    first reaches ``level``, interpolated between grid points on the measured α̂ (``measured_alpha``; ``grid_low``
    and ``grid_high``: the α̂ it spans) and on the nominal α (``nominal_alpha``), and the α Theorem 3.8 predicts
    for it (``predicted_alpha``)."""
    rows = []
    for (cost, k), g in curve.groupby(["cost", "K"]):
        rows.append(dict(cost=cost, K=k, level=level, measured_alpha=read_crossing(g, level),
                         nominal_alpha=read_crossing(g, level, on="alpha"),
                         predicted_alpha=alpha_needed(level, k, c[cost], verify_ratio[k]),
                         grid_low=float(g.alpha_hat.min()), grid_high=float(g.alpha_hat.max()),
                         n=int(g.n.min())))
    return pd.DataFrame(rows)


def nominal_check(curve: pd.DataFrame, level: float = 0.99) -> dict:
    """How the grid's cells hold their nominal α (``curve_table``'s ``nominal_inside`` at ``level``): ``cells``,
    ``outside``, the ``expected`` count outside by chance (each cell's Clopper–Pearson interval misses a true α
    with probability at most 1 − level; with independent draws the cells are independent) and ``p``, the chance
    of at least that many outside (binomial tail: an upper bound, the interval being conservative), ``tests_min``
    and ``tests_max`` per cell."""
    cells, outside = len(curve), int((~curve.nominal_inside.astype(bool)).sum())
    return dict(cells=cells, outside=outside, expected=cells * (1 - level), level=level,
                p=float(binom.sf(outside - 1, cells, 1 - level)), tests_min=int(curve.tests.min()),
                tests_max=int(curve.tests.max()))


def best_k_table(curve: pd.DataFrame) -> pd.DataFrame:
    """Per (cost, α): the K with the highest measured median speedup and the K the theory predicts (the highest
    ``predicted_nominal`` among the K measured), with both speedups."""
    rows = []
    for (cost, a), g in curve.groupby(["cost", "alpha"]):
        m, p = g.loc[g["median"].idxmax()], g.loc[g.predicted_nominal.idxmax()]
        rows.append(dict(cost=cost, alpha=a, measured_best_k=int(m.K), measured_speedup=float(m["median"]),
                         predicted_best_k=int(p.K), predicted_speedup=float(p.predicted_nominal),
                         measured_at_predicted_k=float(g.loc[g.K == p.K, "median"].iloc[0])))
    return pd.DataFrame(rows)


def theory_lines(alphas, ks, costs: dict[str, tuple[float, dict]]) -> pd.DataFrame:
    """Theorem 3.8 (with verify ratios) on a fine α grid, per source of pass costs ``{source: (c, {K: ratio})}``
    and K (a source without a ratio at some K draws no line there): the curves the chapter overlays."""
    rows = [dict(source=src, K=k, alpha=float(a), speedup=float(speedup(a, k, c, vr[k])))
            for src, (c, vr) in costs.items() for k in ks if k in vr for a in alphas]
    return pd.DataFrame(rows)

