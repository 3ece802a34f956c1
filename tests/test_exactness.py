"""Statistical exactness (issue 5): speculative decoding emits the target's law, and the tests can tell.

Parameters are the notebook's own (``book/02_exactness.py``'s parameters cell with the ``02_exactness``
section of ``book/params/ci.yaml`` applied, as papermill does); seeds are offset by ``SEED`` so that these
runs are independent of the notebook's.

False-positive rates. Every assertion that a correct sampler passes is a level-α test, α = 0.01 (the
goodness-of-fit family and the real-model family are Holm-corrected, so each *family* has α): for a seed
drawn at random it would fail with probability ≤ 1% although the code is exact. Calibration tests check a
rejection count against its binomial 99% interval (≤ 1% each). The seeds are fixed, so every outcome is
deterministic: these rates say how lucky a seed would have to be, not how often CI flakes.

Negative controls (``specdec_core.study.mutants``) must be rejected at the same α; their power at these sizes
(≥ 0.99) is estimated by repetition in the notebook's full run.

Tests marked ``chapter2`` are the checks the notebook itself asserts at the same CI sizes, here with independent
seeds: ``make test`` executes the notebook and leaves these copies out (``-m "not chapter2"``), so each statistical
check runs once there; ``pytest tests`` runs them all, ``make test-fast`` (no notebook) those on toy pairs.
"""
from __future__ import annotations

import functools
from pathlib import Path

import jupytext
import numpy as np
import pytest
import torch
import yaml
from scipy import stats

import specdec_core as sd
from specdec_core.study import exactness as ex
from specdec_core.study import mutants as mu
from specdec_core.sampling import SamplingParams, process_logits
from specdec_core.verify import overlap, speculative_sample

ROOT = Path(__file__).resolve().parent.parent
SEED = 10_000  # offset from the notebook's seeds
CHAPTER2 = pytest.mark.chapter2  # asserted by book/02_exactness.py at CI size too (module docstring)


def book_params(name: str = "02_exactness", params_file: str = "ci") -> dict:
    """The notebook's parameters cell, executed, then overridden by its section of book/params/<file>.yaml."""
    nb = jupytext.read(ROOT / "book" / f"{name}.py")
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    ns: dict = {}
    exec(cell.source, ns)
    params = {k: v for k, v in ns.items() if not k.startswith("__")}
    params.update(yaml.safe_load((ROOT / "book" / "params" / f"{params_file}.yaml").read_text())[name] or {})
    return params


P = book_params()
ALPHA = P["alpha"]
T = P["threads"]


@functools.lru_cache(maxsize=None)
def _pair():
    return sd.toy_pair(vocab_size=P["vocab_size"], seed=P["toy_seed"], draft_noise=P["draft_noise"])


@pytest.fixture(scope="module")
def pair():
    return _pair()


@pytest.fixture(autouse=True, scope="module")
def torch_threads():
    """Tiny models on a shared machine: one intra-op thread is fastest and machine-independent."""
    with ex.torch_threads(T):
        yield


# -- the machinery ---------------------------------------------------------------------------------
def test_params_are_sane():
    assert 0 < ALPHA <= 0.05 and P["exact_reps"] >= 200 and P["n_mutant"] >= 100
    assert set(P["mutants"]) <= set(mu.CONTROLS) and set(mu.LOSSY) <= set(P["mutants"])


def test_sequence_law_is_the_chain_rule(pair):
    prompt, params = P["prompt"], SamplingParams(0.7, top_k=4)
    law = ex.sequence_law(pair.target, prompt, 3, params)
    assert law.shape == (P["vocab_size"] ** 3,) and abs(law.sum() - 1) < 1e-12
    for x in [(0, 1, 2), (4, 4, 4), (7, 3, 1)]:
        rows = ex.next_token_laws(pair.target, list(prompt) + list(x[:-1]), params)[len(prompt) - 1:]
        want = float(np.prod([rows[t, x[t]] for t in range(3)]))
        assert law[ex.cell_index(np.array([x]), P["vocab_size"])[0]] == pytest.approx(want, abs=1e-12)
    assert (law == 0).sum() == 8 ** 3 - 4 ** 3  # top-k = 4 at each of 3 positions


def test_pooling_and_impossible_samples():
    probs = np.array([0.5, 0.3, 0.1, 0.06, 0.04, 0.0])
    labels, pooled = ex.pool_cells(probs, 100)
    assert pooled and labels[-1] == -1 and labels[3] == labels[4] == 0 and len(set(labels[:3])) == 3
    assert ex.gof_test([50, 30, 10, 6, 4, 0], probs).pvalue > 0.9
    g = ex.gof_test([50, 30, 10, 5, 4, 1], probs)
    assert g.impossible == 1 and g.pvalue == 0.0  # a sample where p = 0 rejects outright


def test_borderline_verdicts_name_the_threshold():
    assert ex.p_verdict(0.52, 0.01) == "passes (p = 0.52 > 0.01)"
    assert ex.p_verdict(1e-7, 0.01) == "rejected (p = 1e-07 ≤ 0.01)"
    assert ex.p_verdict(0.016, 0.01) == "borderline (p = 0.016, threshold 0.01): passes"
    assert ex.p_verdict(0.005, 0.01).startswith("borderline (p = 0.005, threshold 0.01): rejected")
    assert ex.borderline(0.03, 0.01) and not ex.borderline(0.031, 0.01) and not ex.borderline(0.0033, 0.01)
    assert not ex.borderline(0.016, 0.01, factor=1.5)


def test_own_seed_stream(pair):
    """A spec in seed_offsets samples from seeds of its own; the others keep seed0 + i (common random numbers)."""
    kw = dict(N=40, n=2, seed0=SEED, min_expected=P["min_expected"], threads=T)
    setting = [{"name": "T=1", "temperature": 1.0}]
    _, shared = ex.gof_family(pair, P["prompt"], ["linear:ngram"], setting, [1], **kw)
    _, own = ex.gof_family(pair, P["prompt"], ["linear:ngram"], setting, [1], seed_offsets={"linear:ngram": 40}, **kw)
    _, later = ex.gof_family(pair, P["prompt"], ["linear:ngram"], setting, [1], **{**kw, "seed0": SEED + 40})
    key = ("linear:ngram", "T=1", 1)
    assert (own[key].tokens == later[key].tokens).all() and not (own[key].tokens == shared[key].tokens).all()


def test_holm():
    adj = ex.holm([0.01, 0.04, 0.03, 0.5])
    np.testing.assert_allclose(adj, [0.04, 0.09, 0.09, 0.5])


def test_gof_is_calibrated_under_the_exact_law(pair):
    """p-values of multinomial samples of the exact law, at the family's N: the rejection counts at
    α and at 0.05 lie in their binomial 99% intervals (FPR of this check ≤ 2%)."""
    law = ex.sequence_law(pair.target, P["prompt"], P["seq_len"], SamplingParams(1.0))
    R = 1000
    pv = ex.simulate_pvalues(law, law, P["n_family"], R, SEED)
    for a in (ALPHA, 0.05):
        lo, hi = stats.binom.interval(0.99, R, a)
        assert lo <= (pv < a).sum() <= hi, (a, (pv < a).sum())


def test_power_formula_matches_simulation(pair):
    law = ex.sequence_law(pair.target, P["prompt"], 2, SamplingParams(1.0))
    q = ex.least_favourable(law, 0.05)
    assert 0.5 * np.abs(q - law).sum() == pytest.approx(0.05)
    N = 1500
    analytic = ex.power(0.05, N, ex.pooled_df(law, N), ALPHA)
    simulated = (ex.simulate_pvalues(law, q, N, 400, SEED) < ALPHA).mean()
    assert abs(analytic - simulated) < 0.1  # binomial sd of the simulation ≤ 0.025
    assert ex.samples_needed(0.01, law, ALPHA) > ex.samples_needed(0.02, law, ALPHA) > 1000


def test_tv_upper_bound_covers_the_true_tv(pair):
    """Coverage of the 95% bound under a law at TV = 0.05 from p (the least favourable one): the bound
    falls below the true TV in at most the binomial 99% upper count of 5% of 300 runs."""
    law = ex.sequence_law(pair.target, P["prompt"], 2, SamplingParams(0.7, top_k=4))
    q = ex.least_favourable(law, 0.05)
    rng = np.random.default_rng(SEED)
    misses = sum(ex.tv_upper_bound(c, law).tv_upper < 0.05 for c in rng.multinomial(2000, q, size=300))
    assert misses <= stats.binom.interval(0.99, 300, 0.05)[1]


def test_power_against_a_measured_divergence(pair):
    """The power a verdict carries: the noncentral χ² at λ = n · divergence, matched by simulation against a law at
    that divergence; samples outside p's support add their own chance of an outright rejection; samples_for_power
    finds the n that reaches a goal; the phrase names power, mutant, divergence and n."""
    law = ex.sequence_law(pair.target, P["prompt"], 2, SamplingParams(1.0))
    q = ex.least_favourable(law, 0.05)
    N, level = 1500, ALPHA / 10
    div = ex.chi2_divergence(np.round(q * 10**6).astype(np.int64), law, bins_n=N)
    df = ex.pooled_df(law, N)
    analytic = ex.power_against(div, N, df, level)
    simulated = (ex.simulate_pvalues(law, q, N, 300, SEED) < level).mean()
    assert 0.2 < analytic < 0.95 and abs(analytic - simulated) < 0.12, (analytic, simulated)
    assert ex.power_against(div, N, df, level, impossible_rate=0.01) == pytest.approx(1 - (1 - analytic) * 0.99 ** N)
    n = ex.samples_for_power(div, df, level, 0.8)
    assert ex.power_against(div, n, df, level) >= 0.8 > ex.power_against(div, int(n * 0.98), df, level)
    assert ex.samples_for_power(0.0, df, level) is None and np.isnan(ex.power_against(float("nan"), N, df, level))
    assert ex.power_phrase(0.8412, "no_bonus", 0.04671, 1000, 1.9e-4) == (
        "no rejection; power 0.84 against mutant no_bonus (divergence 0.0467) at n = 1000, level 0.00019")


def test_acceptance_z_where_every_acceptance_was_certain():
    """α_i ∈ {0, 1} at every step (a one-hot draft where p is 0 or 1): z is 0 when the steps did as certain, ±inf
    when one did not, never a NaN that drops the run from the check."""
    one = np.ones(4, dtype=np.int64)
    ok = ex.Samples(np.zeros((4, 1), np.int64), one, one, np.ones(4))
    bad = ex.Samples(np.zeros((4, 1), np.int64), np.array([1, 1, 0, 1]), one, np.ones(4))
    assert ex.acceptance_z(ok) == 0.0 and ex.acceptance_z(bad) == -np.inf


def test_confidence_stops_run_only_where_they_can_stop():
    assert ex.family_ks("linear:model@0.6", [1, 2]) == [2] and ex.family_ks("linear:model", [1, 2]) == [1, 2]
    assert ex.family_ks("autoregressive", [1, 2]) == [1] and ex.family_ks("tree:model@0.3", [1]) == [1]


# -- the rule, as a pure function ------------------------------------------------------------------
def _one_position(pair, params=SamplingParams(1.0)):
    ids = torch.tensor(P["prompt"])[None]
    with torch.inference_mode():
        p = process_logits(pair.target(ids).logits[0, -1], params)
        q = process_logits(pair.drafters["model"].model(ids).logits[0, -1], params)
    return p, q


def _rule_draws(rule, p, q, n, seed):
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q, n, replacement=True, generator=gen)
    out, acc = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    for i in range(n):
        toks, k = rule(drafts[i:i + 1], q[None], torch.stack([p, p]), gen)
        out[i], acc[i] = int(toks[0]), k == 1
    return out, acc


def test_rule_emits_p_and_accepts_with_alpha(pair):
    """Acceptance rate inside the 99% Clopper–Pearson interval around α = Σ min(p, q) and the emitted
    token's law passes Pearson's test against p (FPR ≤ 1% + 1%)."""
    p, q = _one_position(pair)
    out, acc = _rule_draws(speculative_sample, p, q, 10000, SEED)
    lo, hi = ex.binomial_interval(int(acc.sum()), len(acc), 0.99)
    a = float(overlap(p, q))
    assert lo <= a <= hi and a == pytest.approx(1 - 0.5 * float((p - q).abs().sum()))
    assert ex.gof_test(np.bincount(out, minlength=p.numel()), p.numpy()).pvalue > ALPHA


@pytest.mark.parametrize("rule", ["residual_from_p", "accept_with_p", "typical_acceptance"])
def test_rule_level_mutants_are_caught(pair, rule):
    """The same rule-level check rejects lossy rules on the same position (p < α, 10000 draws)."""
    p, q = _one_position(pair)
    out, _ = _rule_draws(mu.RULES[rule], p, q, 10000, SEED)
    assert ex.gof_test(np.bincount(out, minlength=p.numel()), p.numpy()).pvalue < ALPHA


def test_rule_argument_reaches_the_loop(pair):
    """A rule passed to ``generate`` is the one the loop calls (and only for that call): a spy rule sees every
    speculative step, and the next call without it is bit-identical to the default."""
    calls = []

    def spy(*args):
        calls.append(1)
        return speculative_sample(*args)

    kw = dict(drafter=pair.drafters["model"], method="linear", k=2, max_new_tokens=12, temperature=1.0, seed=SEED)
    with_spy = sd.generate(pair.target, P["prompt"], rule=spy, **kw)
    plain = sd.generate(pair.target, P["prompt"], **kw)
    assert len(calls) == len(with_spy.stats["accepted_lengths"]) > 0
    assert with_spy.tokens == plain.tokens and len(calls) == len(with_spy.stats["accepted_lengths"])


def test_sampling_is_deterministic(pair):
    kw = dict(params=SamplingParams(1.0), method="linear", drafter=pair.drafters["model"], k=2, seed0=SEED, threads=T)
    a = ex.sample_sequences(pair.target, P["prompt"], 3, 20, **kw)
    b = ex.sample_sequences(pair.target, P["prompt"], 3, 20, **kw)
    assert (a.tokens == b.tokens).all() and (a.accepted == b.accepted).all()


# -- sequence-level goodness of fit: the family ---------------------------------------------------
@pytest.fixture(scope="module")
def family(pair):
    specs = [s for s in P["methods"] if ex.unavailable(pair, s) is None]
    rows, _ = ex.gof_family(pair, P["prompt"], specs, P["settings"], P["ks"], P["n_family"], P["seq_len"],
                            seed0=SEED, min_expected=P["min_expected"], threads=T)
    return rows


@CHAPTER2
@pytest.mark.parametrize("spec", book_params()["methods"])
def test_sequence_law_is_exact(pair, family, spec):
    """Pearson's test of every (setting, k) of ``spec`` against the enumerated law, Holm across the whole
    family (all available methods): family-wise FPR ≤ α = 1%."""
    why = ex.unavailable(pair, spec)
    if why:
        pytest.skip(why)
    mine = [r for r in family if r["spec"] == spec]
    assert len(mine) == len(P["settings"]) * len(ex.family_ks(spec, P["ks"]))
    bad = [(r["setting"], r["k"], r["pvalue"], r["impossible"]) for r in mine if r["p_holm"] <= ALPHA]
    assert not bad, f"{spec}: emitted law differs from p: {bad}"


@CHAPTER2
def test_measured_acceptance_matches_alpha(family):
    """Linear k = 1 runs: Σ(accepted − α_i)/sqrt(Σ α_i(1 − α_i)) within the Bonferroni two-sided α band."""
    zs = [r["acceptance_z"] for r in family if not np.isnan(r["acceptance_z"])]
    assert zs
    assert max(abs(z) for z in zs) < stats.norm.isf(ALPHA / 2 / len(zs))


# -- negative controls ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def control(name: str):
    return ex.run_control(_pair(), P["prompt"], name, P["n_mutant"], P["seq_len"], k=P["mutant_k"], seed0=SEED,
                          min_expected=P["min_expected"], threads=T)


@CHAPTER2
@pytest.mark.parametrize("name", mu.LOSSY)
def test_negative_control_is_caught(name):
    g, _ = control(name)
    assert g.pvalue < ALPHA, f"mutant {name} ({mu.CONTROLS[name]['bug']}) survived: p = {g.pvalue:.3g}"


def test_issue3_residual_mutant_fails_where_the_correct_rule_passes():
    """Issue 3: Pearson's test against the exactly enumerated law passes for the correct rule (FPR 1%) and
    fails for the rule that resamples from p instead of max(0, p − q), same seeds, same setting."""
    pair = _pair()
    setting = mu.CONTROLS["residual_from_p"]["setting"]
    params = ex.setting_params(setting)
    law = ex.sequence_law(pair.target, P["prompt"], P["seq_len"], params)
    ok = ex.sample_sequences(pair.target, P["prompt"], P["seq_len"], P["n_mutant"], params, "linear",
                             pair.drafters["model"], k=P["mutant_k"], seed0=SEED, threads=T)
    assert ex.gof_test(ok.counts(P["vocab_size"]), law).pvalue > ALPHA
    assert control("residual_from_p")[0].pvalue < ALPHA


@CHAPTER2
def test_harmless_literal_forms_pass():
    """u < p/q without min(1, ·) is the same event for u ∈ [0, 1): bit-identical output. Dropping the bonus
    with consistent bookkeeping only wastes it: the law stays p (FPR 1%)."""
    pair = _pair()
    params = ex.setting_params(mu.CONTROLS["no_min_literal"]["setting"])
    ref = ex.sample_sequences(pair.target, P["prompt"], P["seq_len"], 60, params, "linear", pair.drafters["model"],
                              k=P["mutant_k"], seed0=SEED, threads=T)
    lit = ex.sample_sequences(pair.target, P["prompt"], P["seq_len"], 60, params, "linear", pair.drafters["model"],
                              k=P["mutant_k"], seed0=SEED, threads=T, rule=mu.RULES["no_min_literal"])
    assert (ref.tokens == lit.tokens).all()
    assert control("no_bonus_literal")[0].pvalue > ALPHA


# -- equivalence and the exact sampler's calibration ----------------------------------------------------
@pytest.fixture(scope="module")
def exact_runs(pair):
    params = ex.setting_params(P["exact_setting"])
    law = ex.sequence_law(pair.target, P["prompt"], P["exact_len"], params)
    m, d = ex.parse_spec(P["exact_spec"])
    s = ex.sample_sequences(pair.target, P["prompt"], P["exact_len"], P["exact_reps"] * P["exact_n"], params, m,
                            pair.drafters[d], k=1, seed0=SEED + 10**7, threads=T)
    return law, ex.cell_index(s.tokens, P["vocab_size"]).reshape(P["exact_reps"], P["exact_n"])


@CHAPTER2
def test_equivalence_tv_below_epsilon(exact_runs):
    """The 95% upper bound on TV(sampled law, p) from all pooled runs is below ε (CI: 0.05; full book: 0.01).
    Fails for an exact sampler with probability ≤ 5% at a random seed (less: the bound has slack at this N)."""
    law, cells = exact_runs
    b = ex.tv_upper_bound(np.bincount(cells.ravel(), minlength=law.size), law, 0.95, P["min_expected"])
    assert b.tv_upper < P["epsilon"], b


@CHAPTER2
def test_exact_sampler_is_calibrated(exact_runs):
    """≥ 200 runs of the real exact sampler: rejections at α and at 0.05 inside their binomial 99% intervals."""
    law, cells = exact_runs
    pv = np.array([ex.gof_test(np.bincount(c, minlength=law.size), law, P["min_expected"], seed=SEED + r).pvalue
                   for r, c in enumerate(cells)])
    assert len(pv) >= 200
    for a in (ALPHA, 0.05):
        lo, hi = stats.binom.interval(0.99, len(pv), a)
        assert lo <= (pv < a).sum() <= hi, (a, int((pv < a).sum()))


# -- greedy -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [s for s in book_params()["methods"] if s != "autoregressive"])
def test_greedy_equals_autoregressive_on_toys(pair, spec):
    why = ex.unavailable(pair, spec)
    if why:
        pytest.skip(why)
    m, d = ex.parse_spec(spec)
    for prompt in P["greedy_prompts"]:
        ref = sd.generate(pair.target, prompt, max_new_tokens=P["greedy_len"]).tokens
        for k in P["greedy_ks"]:
            got = sd.generate(pair.target, prompt, drafter=pair.drafters[d], method=m, k=k,
                              max_new_tokens=P["greedy_len"], confidence=ex.spec_confidence(spec)).tokens
            assert got == ref, (spec, prompt, k)


# -- the embedded target ------------------------------------------------------------------------------------
@CHAPTER2
@pytest.mark.slow
def test_embedded_target_conditional_fit_and_homogeneity(smol):
    """Conditional fit of each position after the modal path's prefix, and speculative vs autoregressive
    two-sample homogeneity; Holm across the family, FPR ≤ 1%."""
    ids = smol.tokenizer(P["real_text"], return_tensors="pt").input_ids[0]
    params = ex.setting_params(P["real_setting"])
    n, L = P["real_n"], P["real_len"]
    with ex.torch_threads(T):
        ar = ex.sample_sequences(smol.target, ids, L, n, params, seed0=SEED + 1, threads=T)
        pvals = []
        for spec in P["real_methods"]:
            if ex.unavailable(smol, spec):
                continue
            m, d = ex.parse_spec(spec)
            s = ex.sample_sequences(smol.target, ids, L, n, params, m, smol.drafters[d], k=P["real_k"], seed0=SEED,
                                    threads=T)
            paths, counts = np.unique(s.tokens, axis=0, return_counts=True)
            path = paths[counts.argmax()]
            laws = ex.next_token_laws(smol.target, torch.cat([ids, torch.tensor(path[:-1])]), params)
            for j in range(L):
                p_j = laws[ids.numel() - 1 + j].numpy()
                nxt = ex.conditional_counts(s.tokens, path[:j])
                try:
                    pvals.append(ex.gof_test(np.bincount(nxt, minlength=p_j.size), p_j, P["min_expected"]).pvalue)
                except ValueError:  # too few samples share this prefix for two bins
                    continue
            pvals.append(ex.homogeneity_test(s.tokens, ar.tokens, P["min_expected"])[2])
    assert pvals and (ex.holm(pvals) > ALPHA).all(), pvals


@CHAPTER2
@pytest.mark.slow
def test_embedded_target_greedy_equal_up_to_near_ties(smol):
    for text in P["greedy_real_texts"]:
        ids = smol.encode_chat(text)
        ref = sd.generate(smol.target, ids, max_new_tokens=P["greedy_real_len"]).tokens
        for spec in P["real_methods"]:
            if ex.unavailable(smol, spec):
                continue
            m, d = ex.parse_spec(spec)
            got = sd.generate(smol.target, ids, drafter=smol.drafters[d], method=m, k=4,
                              max_new_tokens=P["greedy_real_len"]).tokens
            i, gap = ex.first_divergence(smol.target, ids, got, ref)
            assert ex.excused(i, gap, P["near_tie"]), (spec, text, i, gap)


def test_excused_only_agreement_or_a_near_tie():
    assert ex.excused(None, None)                      # identical outputs
    assert ex.excused(7, 0.5 * ex.NEAR_TIE)            # differ at a near-tie
    assert not ex.excused(7, 2 * ex.NEAR_TIE)          # differ where the target was sure
    assert not ex.excused(12, None)                    # one output is a prefix of the other
    assert ex.excused(7, 0.05, tol=0.1)
