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

from ..study import report

START, END = "<!-- RESULTS:START -->", "<!-- RESULTS:END -->"
FIGURE = "06_speedup/speedup_by_task.png"


def _csv(ref: Path, rel: str) -> pd.DataFrame | None:
    p = ref / rel
    return pd.read_csv(p) if p.is_file() else None


def _ratio(r) -> str:
    return report.ratio_phrase_median(float(r["median"]), float(r.q25), float(r.q75), n=int(r.n))


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


def speed_table(ref: Path) -> list[str]:
    """Chapter 6's methods against autoregressive decoding, one column per temperature."""
    overall = _csv(ref, "06_speedup/overall.csv")
    if overall is None:
        return []
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
        said.append(f"{'greedy' if t == 0 else f'at T = {t:g}'}, the fastest median is {best.runner}: {_ratio(best)}")
    return [f"**Every method against autoregressive decoding** (chapter 6, `overall.csv`): tokens/s ÷ our "
            f"autoregressive decoder's on the same prompt, median (IQR) over up to {n} prompts, paired calls "
            f"interleaved in one run. {report.PREFILL_COUNTED}", "", *lines, "", "; ".join(said) + "."]


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
        within = v[v.ratio <= v.one_pass]
        out.append(f"Chapter 1 ({int(v.threads.iloc[0])} threads, S = {int(v.S.iloc[0])}): t(T)/t(1) = "
                   + ", ".join(f"{r.ratio:.2f} at T = {int(r.T)}" for r in v.itertuples())
                   + f"; within its “about one pass” bar ({v.one_pass.iloc[0]:g}×) for "
                   + (f"T ≤ {int(within['T'].max())}." if len(within) else "no T it timed."))
    return out


def exactness_lines(ref: Path) -> list[str]:
    p = ref / "02_exactness/summary.csv"
    if not p.is_file():
        return []
    s = pd.read_csv(p, header=None, index_col=0).iloc[:, 0].astype(str)  # rows of name,value; no header
    if "family_runs" not in s:
        return []
    return [f"**Exactness** (chapter 2, `summary.csv`): {s.family_runs} goodness-of-fit tests of every method's output "
            f"law against the target's, smallest Holm-corrected p = {float(s.family_min_p_holm):.3g}; total variation "
            f"below {float(s.tv_upper):.4f} at 95 % from {int(float(s.tv_N))} pooled continuations; "
            f"{s.get('mutants_caught', '?')} of {s.get('mutants', '?')} lossy mutants caught; "
            f"{s.get('greedy_runs', '?')} greedy runs equal autoregressive decoding."]


def curve_lines(ref: Path) -> list[str]:
    curve, need = _csv(ref, "10_curves/curve.csv"), _csv(ref, "10_curves/alpha_needed.csv")
    if curve is None:
        return []
    out = []
    for cost, g in curve.groupby("cost", sort=False):
        top = g[g.alpha == g.alpha.max()].sort_values("median", ascending=False).iloc[0]
        out.append(f"{cost} proposals at α = {top.alpha:g}, K = {int(top.K)}: {_ratio(top)}")
    line = ("**Where 2–3× lives** (chapter 10, a controlled draft on the real target): " + "; ".join(out) + ".")
    if need is not None:
        parts = []
        for sp, g in need.groupby("speedup"):
            g = g.dropna(subset=["measured_alpha"])
            if len(g):
                r = g.sort_values("measured_alpha").iloc[0]
                parts.append(f"{sp:g}× needs α ≈ {r.measured_alpha:.2f} (K = {int(r.K)}; theory {r.predicted_alpha:.2f})")
        if parts:
            line += " Measured along the curve: " + "; ".join(parts) + "."
    ident = curve.get("identical")
    if ident is not None:
        line += f" Greedy outputs equal autoregressive decoding at {int(ident.sum())} of {len(ident)} grid points."
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
            part += (f" (Spearman ρ = {t.spearman_rho:.2f}, p = {t.p_value:.2g} over {int(t.pairs)} paired ratios: "
                     f"{report.judged(way, int(t.pairs))})")
        parts.append(part)
    return ["**Under load** (chapter 9, batches decoded in lockstep; median ratio at each B, "
            f"{report.PREFILL_COUNTED.lower()[:-1]}): " + "; ".join(parts) + "."]


def adaptive_lines(ref: Path) -> list[str]:
    e = _csv(ref, "08_adaptive/eval_overall.csv")
    if e is None:
        return []
    parts = []
    for t, g in e.groupby("temperature"):
        best = g.sort_values("median", ascending=False).iloc[0]
        parts.append(f"{'greedy' if t == 0 else f'T = {t:g}'}: {best.runner} {_ratio(best)}")
    return ["**Adaptive drafting** (chapter 8, settings tuned on training prompts, timed on the eval mix): best median "
            + "; ".join(parts) + "."]


def results_block(ref: Path, where: str = "data/reference/book") -> str:
    """The README's results block for the reference run in ``ref`` (a folder laid out as ``data/reference/book``)."""
    ref = Path(ref)
    timings = pd.read_csv(ref / "timings.csv")
    out = ["## The headline: the book's reference run", "", *run_line(timings, where), ""]
    if (ref / FIGURE).is_file():
        out += [f"![speedup over autoregressive decoding per task]({where}/{FIGURE})", ""]
    for section in (speed_table, theory_lines, exactness_lines, curve_lines, adaptive_lines, serving_lines):
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
