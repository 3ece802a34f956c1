"""The book's headline, written from one run's tables: the README's results block (``scripts/collect_reference.py``).

    block = headline.results_block(REFERENCE_DIR / "book")   # Markdown, every number from the run's CSVs
    headline.replace_block(README, block)                    # between the RESULTS markers

Every sentence is computed from a table a chapter saved; a table the run did not produce leaves its sentence out
(never a number from another run). Verdict words go through :mod:`~specdec_core.study.report`'s rule, so the README
says "faster" only where the chapter could. The fixed words explain what a number is, never what it came out as.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..study import curves, protocol, report

START, END = "<!-- RESULTS:START -->", "<!-- RESULTS:END -->"
FIGURE = "06_speedup/speedup_by_task.png"


def _csv(ref: Path, rel: str) -> pd.DataFrame | None:
    p = ref / rel
    return pd.read_csv(p) if p.is_file() else None


def _ratio(r, family: pd.DataFrame | None = None) -> str:
    """``1.21× (IQR 1.05–1.31, 12 prompts): faster``: the row's verdict from its test, Holm-adjusted over
    ``family`` (the rows it was judged with; the row alone without it). A table from before the chapters
    recorded a test (no ``p`` column) gives the ratio and spread without a verdict."""
    test = {}
    if "p" in r and r.p == r.p:
        ps = (family if family is not None else pd.DataFrame([r])).p.astype(float)
        adjusted = dict(zip(ps.index, protocol.holm(ps)))
        test = dict(p=float(adjusted.get(r.name, r.p)) if family is not None else float(r.p),
                    power=float(r.get("power", 0.0)), n_tell=r.get("n_tell"))
    return report.ratio_phrase_median(float(r["median"]), float(r.q25), float(r.q75), n=int(r.n), **test)


def _short(r) -> str:
    """``1.21× (1.05–1.31)``: a table cell (the verdict is in the sentence below the table)."""
    return f"{r['median']:.2f}× ({r.q25:.2f}–{r.q75:.2f})"


def provenance(timings: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """The commits, machines and dates a ``timings.csv`` records (each sorted, unrecorded ones left out); a file
    from before runs recorded them gives three empty lists. The README's block and the front page both say these."""
    def recorded(col):
        return sorted({str(v) for v in timings[col].fillna("") if str(v)}) if col in timings else []
    return recorded("commit"), recorded("machine"), recorded("date")


def run_line(timings: pd.DataFrame, where: str) -> list[str]:
    """Which run the block describes: its commit, machine and date (all rows of one run), and its time."""
    ran = timings[timings.status == "ok"]
    commits, machines, dates = provenance(timings)
    dates = [d[:10] for d in dates]
    one = len(commits) == 1 and len(machines) == 1
    origin = (f"one `make reproduce` of commit `{commits[0]}` on {machines[0]}, {dates[-1] if dates else 'date not recorded'}"
              if one else f"runs of {len(commits) or 'unrecorded'} commit(s) on {len(machines) or 'unrecorded'} machine(s)")
    per = " · ".join(f"{r.notebook[:2]} {r.seconds:.0f} s" for r in ran.itertuples())
    lines = [f"The reference results (`{where}/`) come from {origin}: {len(ran)} chapters at full size in "
             f"{ran.seconds.sum() / 60:.0f} min of notebook time ({per}; `timings.csv`)."]
    if (timings.status == "skipped").any():
        lines.append("Left out: " + ", ".join(timings[timings.status == "skipped"].notebook) + ".")
    return lines


PEERS = "hf "  # runners that are transformers' own decoders: chapter 6 sets them beside ours; the headline leaves them out
MAX_ROWS = 8  # the headline table a newcomer reads at a glance


def speed_table(ref: Path) -> list[str]:
    """Chapter 6's methods against autoregressive decoding, one column per temperature: the library's own methods,
    at most :data:`MAX_ROWS` (transformers' decoders, chapter 6's peers, are named in one sentence instead)."""
    overall = _csv(ref, "06_speedup/overall.csv")
    if overall is None:
        return []
    peers = sorted(r for r in pd.unique(overall.runner) if str(r).startswith(PEERS))
    overall = overall[~overall.runner.astype(str).str.startswith(PEERS)]
    if overall.runner.nunique() > MAX_ROWS:
        raise ValueError(f"{overall.runner.nunique()} methods in 06_speedup/overall.csv: the headline shows at most "
                         f"{MAX_ROWS}")
    temps = sorted(overall.temperature.unique())
    has_k = "K" in overall
    head = ["method", *(["K"] if has_k else []), *[("greedy" if t == 0 else f"T = {t:g}") for t in temps]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for runner in pd.unique(overall.runner):
        rows = overall[overall.runner == runner].set_index("temperature")
        k = rows.K.dropna().iloc[0] if has_k and rows.K.notna().any() else None
        cells = [runner, *([f"{k:g}" if isinstance(k, (int, float, np.number)) else str(k or "")] if has_k else [])]
        cells += [_short(rows.loc[t]) if t in rows.index else "" for t in temps]
        lines.append("| " + " | ".join(cells) + " |")
    n = int(overall.n.max())
    said = []
    for t in temps:
        o = overall[overall.temperature == t].sort_values("median", ascending=False)
        best = o.iloc[0]
        said.append(f"{'greedy' if t == 0 else f'at T = {t:g}'}, the highest median is {best.runner}'s: "
                    f"{_ratio(best, o)}")
    return [f"**Every method against autoregressive decoding** (chapter 6, `overall.csv`): tokens/s ÷ our "
            f"autoregressive decoder's on the same prompt, median (IQR) over up to {n} prompts, paired calls "
            f"interleaved in one run; each K fixed on training prompts. {report.PREFILL_COUNTED}", "", *lines, "",
            "; ".join(said) + ". The highest median is picked on the evaluation prompts themselves, so its verdict "
            f"is Holm-adjusted over every method of its column ({protocol.TEST_NAME}, 5 % false positives)."
            + (f" Transformers' own decoders ({', '.join(peers)}) stand beside these in chapter 6." if peers else "")]


def theory_lines(ref: Path) -> list[str]:
    th, verdict = _csv(ref, "06_speedup/theory_check.csv"), _csv(ref, "01_bottleneck/verdict.csv")
    out = []
    if th is not None and len(th):
        r = th.iloc[0]
        out.append(f"**Why**: a K = {int(r.k)} step of the model draft costs {int(r.k)}c + verify({int(r.k) + 1})/verify(1) "
                   f"= {int(r.k)} × {r.c:.3f} + {r.verify_ratio:.2f} target passes (chapter 6, timed in the run); "
                   f"Leviathan et al.'s prediction from each call's α̂: {r.predicted_median:.3f}× predicted, "
                   f"{r.measured_median:.3f}× measured ({100 * abs(r.rel_error):.1f}% apart over {int(r.calls)} calls).")
    if verdict is not None and len(verdict):
        v = verdict[verdict["T"] > 1]
        out.append(f"Chapter 1 ({int(v.threads.iloc[0])} threads, S = {int(v.S.iloc[0])}): t(T)/t(1) = "
                   + ", ".join(f"{r.ratio:.2f} at T = {int(r.T)}" for r in v.itertuples())
                   + f"; {bar_verdict(v)}.")
    return out


def bar_verdict(v: pd.DataFrame) -> str:
    """Which T of chapter 1's verdict table (columns ``T``, ``ratio``, ``one_pass``) are within the “about one
    pass” bar and which are above it, each T by name (never a range: a T above the bar can sit between two within)."""
    within = v[v.ratio <= v.one_pass]["T"].astype(int).tolist()
    above = v[v.ratio > v.one_pass]["T"].astype(int).tolist()
    bar = f"its “about one pass” bar ({v.one_pass.iloc[0]:g}×)"
    said = f"within {bar} at T = {', '.join(map(str, within))}" if within else f"within {bar} at no T it timed"
    return said + (f", above it at T = {', '.join(map(str, above))}" if above else "")


def exactness_lines(ref: Path) -> list[str]:
    p = ref / "02_exactness/summary.csv"
    if not p.is_file():
        return []
    s = pd.read_csv(p, header=None, index_col=0).iloc[:, 0].astype(str)  # rows of name,value; no header
    if "family_runs" not in s:
        return []
    from ..study.exactness import power_phrase  # deferred: exactness loads torch

    def powered(prefix):  # a non-rejection with the power the run recorded for it, or a plain note that it did not
        keys = [f"{prefix}_power", f"{prefix}_power_mutant", f"{prefix}_power_divergence"]
        if not all(k in s for k in keys):
            return "no rejection, its power not recorded by this run"
        n = s.get("family_N" if prefix == "family" else f"{prefix}_n")
        level = s.get(f"{prefix}_level")
        return power_phrase(float(s[keys[0]]), s[keys[1]], float(s[keys[2]]), int(float(n)) if n else "?",
                            float(level) if level else None)

    eps = f", margin ε = {float(s.epsilon):g}" if "epsilon" in s else ""
    sampler = f" of one sampler ({s.tv_sampler})" if "tv_sampler" in s else " of one sampler"
    out = (f"**Exactness** (chapter 2, `summary.csv`): {s.family_runs} goodness-of-fit tests of every method's output "
           f"law against the target's, smallest Holm-corrected p = {float(s.family_min_p_holm):.3g}: "
           f"{powered('family')}; total variation below {float(s.tv_upper):.4f} at 95 % from {int(float(s.tv_N))} "
           f"pooled continuations{sampler}{eps}; {s.get('mutants_caught', '?')} of {s.get('mutants', '?')} lossy "
           f"mutants caught; {s.get('greedy_runs', '?')} greedy runs equal autoregressive decoding.")
    if "audit_real_power" in s:  # the audit's two kinds of rows, each with its own power
        def rows(prefix):  # a pass counts only with power ≥ 0.5 (exactness.audit_verdict); older runs did not say
            n, passed = int(float(s[f"{prefix}_rows"])), int(float(s[f"{prefix}_passed"]))
            if f"{prefix}_failed" not in s:
                return f"{passed} of {n} rows not rejected ({powered(prefix)})"
            failed = int(float(s[f"{prefix}_failed"]))
            return (f"{passed} of {n} rows pass, {n - passed - failed} have no verdict (power below 0.5), {failed} "
                    f"fail ({powered(prefix)})")
        out += (f" The audit of transformers' decoders beside ours: on the toy pair {rows('audit')}; on the embedded "
                f"target, a two-sample gross-error check (df ≤ {s.audit_real_df}), {rows('audit_real')}.")
    return [out]


def _alpha_hat(r) -> str:
    """`` (α̂ 0.948, 130 tests, 99 % interval 0.87–0.98)`` for a row of chapter 10's ``curve.csv``; a table from
    before the chapter saved tests and intervals gives α̂ alone, one without α̂ nothing."""
    if "alpha_hat" not in r or r.alpha_hat != r.alpha_hat:
        return ""
    if "tests" not in r or "alpha_lo" not in r:
        return f" (α̂ {r.alpha_hat:.3f})"
    level = f"{float(r.alpha_level):.0%}" if "alpha_level" in r else "the chapter's"
    return f" (α̂ {r.alpha_hat:.3f} over {int(r.tests)} tests, {level} interval {r.alpha_lo:.2f}–{r.alpha_hi:.2f})"


def needed_on_alpha_hat(curve: pd.DataFrame, need: pd.DataFrame | None) -> tuple[pd.DataFrame | None, str]:
    """Chapter 10's ``alpha_needed.csv`` with ``measured_alpha`` read on the measured α̂, and what it is read on
    (``"alpha_hat"`` or ``"alpha"``). A table the chapter read on α̂ (it has ``nominal_alpha``) is returned as it
    is; an older one (read on the nominal α) is read again from ``curve.csv``'s draft-cost rows on their α̂ with
    :func:`~specdec_core.study.curves.read_crossing`, its old column kept as ``nominal_alpha``; without α̂ in
    ``curve.csv`` the nominal reading is all there is (``"alpha"``)."""
    if need is None or "nominal_alpha" in need:
        return need, "alpha_hat"
    if "alpha_hat" not in curve:
        return need, "alpha"
    rows = []
    for r in need.itertuples():
        g = curve[(curve.cost == "draft") & (curve.K == r.K)]
        rows.append(dict(speedup=r.speedup, K=r.K, predicted_alpha=r.predicted_alpha,
                         measured_alpha=curves.read_crossing(g, r.speedup) if len(g) else float("nan"),
                         nominal_alpha=r.measured_alpha))
    return pd.DataFrame(rows), "alpha_hat"


def curve_lines(ref: Path) -> list[str]:
    """Chapter 10: the controlled proposals' best point at the grid's highest α (with its measured α̂), the
    shipped draft's own measured point beside it (``real_drafters.csv``), and the α each speedup needs along the
    measured curve, read on the measured α̂ (:func:`needed_on_alpha_hat`)."""
    curve, need = _csv(ref, "10_curves/curve.csv"), _csv(ref, "10_curves/alpha_needed.csv")
    real = _csv(ref, "10_curves/real_drafters.csv")
    if curve is None:
        return []
    out = []
    for cost, g in curve.groupby("cost", sort=False):
        top = g[g.alpha == g.alpha.max()].sort_values("median", ascending=False).iloc[0]
        what = "free" if cost == "free" else "paying the shipped draft's passes" if cost == "draft" else cost
        out.append(f"{what} at α = {top.alpha:g}{_alpha_hat(top)}, K = {int(top.K)}: {_ratio(top)}")
    line = ("**Where 2–3× lives** (chapter 10, *controlled proposals* on the real target: the target's own greedy "
            "continuation, each position kept with probability α, not a draft model's proposals): "
            + "; ".join(out) + ".")
    shipped = real[real.runner.str.contains("(draft model)", regex=False)] if real is not None else None
    if shipped is not None and len(shipped):
        line += (" The shipped draft in the same run (`real_drafters.csv`): "
                 + "; ".join(f"{r.runner} at α̂ = {r.alpha_hat:.2f}: {_ratio(r)}" for _, r in shipped.iterrows())
                 + ".")
    need, on = needed_on_alpha_hat(curve, need)
    if need is not None:
        parts = []
        for sp, g in need.groupby("speedup"):
            g = g.dropna(subset=["measured_alpha"])
            if len(g):
                r = g.sort_values("measured_alpha").iloc[0]
                nominal = (f"; on the nominal α {r.nominal_alpha:.2f}" if on == "alpha_hat" and "nominal_alpha" in r
                           and r.nominal_alpha == r.nominal_alpha else "")
                theory = (f"; theory {r.predicted_alpha:.2f}" if "predicted_alpha" in r
                          and r.predicted_alpha == r.predicted_alpha else "")
                parts.append(f"{sp:g}× needs {'α̂' if on == 'alpha_hat' else 'α'} ≈ {r.measured_alpha:.2f} "
                             f"(K = {int(r.K)}{nominal}{theory})")
        if parts:
            line += (" Measured along the curve with the draft's cost, "
                     + ("on the measured α̂: " if on == "alpha_hat" else
                        "on the nominal α (the run's tables carry no measured α̂): ") + "; ".join(parts) + ".")
    ident = curve.get("identical")
    if ident is not None:  # the controlled draft checks its context at every step: a departure stops the run
        line += (f" Greedy identity with autoregressive decoding is checked at every step of all {len(ident)} grid "
                 "points (a departure stops the run, so a finished run has none)." if ident.all() else
                 f" Greedy outputs differ from autoregressive decoding at {int((~ident.astype(bool)).sum())} of "
                 f"{len(ident)} grid points.")
    return [line]


def serving_lines(ref: Path, trend_p: float = 0.05) -> list[str]:
    """Chapter 9: speculation's ratio at the smallest and largest batch, and its trend over B (Spearman's rank
    correlation over every paired ratio, chapter 9's ``trend_vs_batch.csv``), the direction through the rule."""
    b, trend = _csv(ref, "09_serving/speedup_vs_batch.csv"), _csv(ref, "09_serving/trend_vs_batch.csv")
    if b is None:
        return []
    parts = []
    for m, g in b.groupby("method", sort=False):
        g = g.sort_values("B")
        lo, hi = g.iloc[0], g.iloc[-1]
        part = f"{m}: {lo.measured:.2f}× at B = {int(lo.B)}, {hi.measured:.2f}× at B = {int(hi.B)}"
        t = trend[trend.method == m] if trend is not None else []
        if len(t):
            t = t.iloc[0]
            way = ("rising" if t.spearman_rho > 0 else "falling") if t.p_value < trend_p else "no direction"
            units = int(t.batches) if "batches" in t else int(t.pairs)  # older tables counted replays as pairs
            noun = "distinct batches" if "batches" in t else "paired ratios"
            part += (f" (Spearman ρ = {t.spearman_rho:.2f}, p = {t.p_value:.2g}, {trend_p_method(t)}, over "
                     f"{units} {noun}: {report.judged(way, units)})")
        parts.append(part)
    return ["**Under load** (chapter 9, batches of B prompts started together; median ratio at each B, "
            f"{report.PREFILL_COUNTED.lower()[:-1]}): " + "; ".join(parts) + "."]


def engine_lines(ref: Path) -> list[str]:
    """Chapter 9's continuous batching: at each load of the sweep, the load-adaptive policy's goodput against
    autoregressive decoding's and the best other policy's, with the chapter's interval and verdict
    (``goodput_verdicts.csv``), and each fixed policy's crossover load (``load_summary.csv``)."""
    t, v = _csv(ref, "09_serving/load_summary.csv"), _csv(ref, "09_serving/goodput_verdicts.csv")
    if t is None or v is None or "load-adaptive" not in set(t.policy):
        return []
    from ..study import load as sweep  # deferred, as exactness above: it loads the engine and torch

    parts = []
    for load, base, best in sweep.against(v):
        parts.append(f"load {load:g}: {base.policy_goodput:.2f}, ÷ autoregressive {base.ratio:.2f} "
                     f"({base.lo:.2f}–{base.hi:.2f}, {base.verdict} at ≥ 1), ÷ the best other ({best.other}) "
                     f"{best.ratio:.2f} ({best.lo:.2f}–{best.hi:.2f}, {best.verdict} at ≥ {best.goal:g})")
    cross = []
    for p in [p for p in dict.fromkeys(t.policy) if p not in ("load-adaptive", "autoregressive")]:
        x = sweep.crossover(t, p)
        cross.append(f"{p} from load {x:g}" if x is not None else f"{p} at no load")
    return ["**Continuous batching** (chapter 9: `sd.serving.Engine` serving a traffic mix of chat and input-grounded "
            f"requests, Poisson arrivals at fractions of autoregressive saturation, "
            + (f"{_span(v.n_units)} distinct requests per policy and load; 90 % paired bootstrap intervals over "
               "them)" if "n_units" in v else f"{_span(v.requests)} requests per policy and load, replays counted; "
               "90 % paired bootstrap intervals)") + ": load-adaptive K's goodput (requests/s within the "
            "chapter's SLOs) " + "; ".join(parts) + ". Goodput below autoregressive decoding's: " + "; ".join(cross)
            + "."]


def _span(counts) -> str:
    """``24`` or ``24–72``: the fewest and most of ``counts``."""
    lo, hi = int(min(counts)), int(max(counts))
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def grounded_lines(ref: Path) -> list[str]:
    """Chapter 11: the best method's median ratio on the input-grounded family beside the chat mix's, greedy."""
    t = _csv(ref, "11_where_it_pays/speedup.csv")
    if t is None:
        return []
    t = t[t.temperature == 0]
    parts = []
    rule, chosen = _csv(ref, "11_where_it_pays/rule.csv"), _csv(ref, "11_where_it_pays/rule_eval.csv")
    fixed = []
    if rule is not None and chosen is not None and len(chosen):
        picks = "; ".join(f"{c} → {v}" for c, v in rule.iloc[0].items() if isinstance(v, str))
        fixed = [f"the per-request rule fixed on training prompts ({picks}), evaluated once: "
                 + "; ".join(f"{r.family} {_ratio(r, chosen)}" for _, r in chosen.iterrows())]
    for family in ("input-grounded", "chat"):
        g = t[t.family == family].sort_values("median", ascending=False)
        if len(g):
            parts.append(f"{family} {g.iloc[0].runner} {_ratio(g.iloc[0], g)}")
    if not parts and not fixed:
        return []
    best = ("The highest median on the evaluation prompts, picked there and so Holm-adjusted over every method of "
            "its family: " + "; ".join(parts)) if parts else ""
    return ["**Where speculation pays** (chapter 11, greedy; median paired ratio against autoregressive decoding): "
            + ". ".join(x for x in ("; ".join(fixed), best) if x) + "."]


def trend_p_method(row) -> str:
    """How chapter 9's trend p was computed: the table's ``p_method``; a table without that column holds scipy's
    ``spearmanr`` p, a t-approximation (with few ratios and ties it can fall below any p the arrangements allow)."""
    method = row.get("p_method")
    return str(method) if isinstance(method, str) and method else "t-approximation"


def adaptive_lines(ref: Path) -> list[str]:
    e = _csv(ref, "08_adaptive/eval_overall.csv")
    if e is None:
        return []
    parts = []
    for t, g in e.groupby("temperature"):  # every runner of chapter 8's evaluation is a setting fixed before it
        g = g[~g.runner.astype(str).str.startswith(PEERS)]
        parts.append(f"{'greedy' if t == 0 else f'T = {t:g}'}: "
                     + ", ".join(f"{r.runner} {_ratio(r, g)}" for _, r in g.iterrows()))
    return ["**Adaptive drafting** (chapter 8: every setting chosen on training prompts, evaluated once on the eval "
            "mix; verdicts Holm-adjusted over each temperature's settings): " + "; ".join(parts) + "."]


def results_block(ref: Path, where: str = "data/reference/book") -> str:
    """The README's results block for the reference run in ``ref`` (a folder laid out as ``data/reference/book``)."""
    ref = Path(ref)
    timings = pd.read_csv(ref / "timings.csv")
    out = ["## The headline: the book's reference run", "", *run_line(timings, where), ""]
    if (ref / FIGURE).is_file():
        out += [f"![speedup over autoregressive decoding per task]({where}/{FIGURE})", ""]
    for section in (speed_table, theory_lines, exactness_lines, curve_lines, adaptive_lines, grounded_lines,
                    serving_lines, engine_lines):
        lines = section(ref)
        if lines:
            out += [*lines, ""]
    out.append("Every number above is computed by `scripts/collect_reference.py` from the tables of that run; "
               "`make reproduce` reruns it on the reader's machine, and the rendered book (`build/book/index.html`) "
               "shows each chapter's own findings.")
    return "\n".join(out)


def replace_block(path: Path, block: str) -> None:
    """Put ``block`` between the RESULTS markers of ``path`` (both must be there, once, in order)."""
    text = Path(path).read_text(encoding="utf-8")
    i, j = text.find(START), text.find(END)
    if i < 0 or j < i or text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"{path}: needs one {START} and one {END} line, in that order")
    Path(path).write_text(text[:i + len(START)] + "\n" + block.rstrip() + "\n\n" + text[j:], encoding="utf-8")
