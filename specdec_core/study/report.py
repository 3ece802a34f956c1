"""Saying a comparison the same way everywhere: a ratio, its spread, and the verdict its test allows.

    report.ratio_phrase(ratios, units=prompt_ids)   # '1.21× (IQR 1.05–1.31, 12 prompts): faster'
    report.verdict_of(row)                          # 'faster' | 'slower' | 'ties' | 'cannot tell at this size (…)'
    report.rivals(table, chosen)                    # rows whose IQR reaches the chosen row's: a choice not resolved

**The verdict rule** (one place for the whole book, :mod:`~specdec_core.study.protocol`): the IQR shows the
spread; the verdict comes from a test. "faster" or "slower" is said only where the exact Wilcoxon signed-rank
test over distinct prompts rejects "no change" at a 5 % false-positive rate, Holm-adjusted over the table's rows.
"ties" is said only where the test had at least even odds of seeing a 10 % change, and saw none. Anything else
reads "cannot tell at this size", with the number of prompts that would tell. The CI book, run on a handful of
prompts, therefore exercises every finding's code without claiming any of them; ``tests/test_book_outputs.py``
checks that no verdict word sits beside "cannot tell".

:func:`judged` gates verdicts that are not a paired test (theory against measurement, a winner by task) by the
sample's size alone: at least ``MIN_PAIRS`` distinct prompts.

    report.judged("agree", n=3)                   # 'cannot tell at this size (n = 3, fewer than 6)'
    report.verdict_table(rows)                    # findings as a table, the test and its caveats in one footnote
    report.caption("Speedup over autoregressive decoding.", prefill=True)   # + ' Times include the prefill.'

Chapters render their findings from these strings, so the words always match the numbers beside them.
"""
from __future__ import annotations

import re

import numpy as np

from . import protocol

MIN_PAIRS = 6  # the smallest sample of distinct prompts a verdict that is not a test may read (:func:`judged`)
UNRESOLVED = protocol.CANNOT_TELL  # "cannot tell at this size"
# words that state a finding: none of them may share a sentence with UNRESOLVED (tests/test_book_outputs.py)
VERDICT_WORDS = re.compile(r"\b(faster|slower|ties|agrees?|disagrees?|AGREE|DISAGREE|wins?|loses|pays|beats?)\b")
PREFILL_COUNTED = "Times include the prefill (the prompt's pass)."
PREFILL_EXCLUDED = "Times exclude the prefill: the decode loop alone."


def unresolved(n: int, min_n: int = MIN_PAIRS) -> str:
    """What a sample too small for a verdict prints instead of one."""
    return f"{UNRESOLVED} (n = {int(n)}, fewer than {int(min_n)})"


def judged(word: str, n: int, min_n: int = MIN_PAIRS) -> str:
    """``word`` (a verdict) for a sample of ``n`` pairs, prompts or calls, if ``n >= min_n``; else
    :func:`unresolved`. The rule every printed verdict goes through."""
    return word if int(n) >= int(min_n) else unresolved(n, min_n)


def caption(text: str, prefill: bool) -> str:
    """A speed table's caption: ``text`` and whether its times count the prefill (every speed table says which)."""
    return f"{text.rstrip()} {PREFILL_COUNTED if prefill else PREFILL_EXCLUDED}"


def verdict_of(row, better: str = "faster", worse: str = "slower") -> str:
    """The verdict of one summarised comparison (a row of :func:`~specdec_core.study.bench.paired_ratios`, or any
    mapping with ``median``, ``p`` or ``p_holm``, ``power``, ``n_tell``): :func:`protocol.decide` on its
    Holm-adjusted p-value where it has one. A row without a test, or of one prompt, has no verdict (``""``)."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    p = get("p_holm", None)
    p = get("p", None) if p is None or p != p else p
    if p is None or p != p or int(get("n", 0) or 0) < 2:
        return ""
    return protocol.decide(float(get("median")), float(p), float(get("power", 0.0)), get("n_tell", None),
                           better=better, worse=worse)


def ratio_phrase_median(median: float, q25: float, q75: float, n: int | None = None, p: float | None = None,
                        power: float = 0.0, n_tell: int | None = None, unit: str = "prompt", **words) -> str:
    """``'1.21× (IQR 1.05–1.31, 12 prompts): faster'``: a median and quartiles over ``n`` distinct units, with the
    verdict of its (Holm-adjusted) test ``p`` at ``power`` (:func:`protocol.decide`). Without ``p`` the phrase
    states the ratio and spread and no verdict; one unit has no spread and no verdict."""
    if n == 1:
        return f"{median:.2f}× (one {unit}, no verdict)"
    units = f", {count(n, unit)}" if n is not None else ""
    narrow = f"{q25:.2f}" == f"{q75:.2f}" and q25 != q75  # a spread that two decimals would hide

    def q(x):  # a quartile that rounds to 1.00 but is not 1 gets a third decimal
        return f"{x:.3f}" if narrow or (x != 1 and f"{x:.2f}" == "1.00") else f"{x:.2f}"
    said = verdict_of(dict(median=median, p=p, power=power, n_tell=n_tell, n=n or 0), **words) \
        if p is not None else ""
    return f"{median:.2f}× (IQR {q(q25)}–{q(q75)}{units})" + (f": {said}" if said else "")


def count(n: int, noun: str, hi: int | None = None) -> str:
    """``'1 repeat'``, ``'3 repeats'``; with ``hi``, a range: ``'1–2 prompts'`` (``'2 prompts'`` when ``hi == n``)."""
    n, hi = int(n), int(n if hi is None else hi)
    return f"{n if hi == n else f'{n}–{hi}'} {noun}{'s' if hi != 1 else ''}"


def overlap(a, b) -> bool:
    """Whether two rows' interquartile ranges (``q25``, ``q75``) overlap: then their medians give no order."""
    return a.q25 <= b.q75 and b.q25 <= a.q75


def ratio_phrase(ratios, units=None, family: int = 1, **words) -> str:
    """:func:`ratio_phrase_median` of a sample of paired ratios, summarised over distinct ``units`` (each unit's
    repeats collapse to their median) and tested (:func:`protocol.summarise`); ``family``: the comparisons this
    one is judged with (its p-value is Holm-adjusted as the strictest member of such a family would be)."""
    r = np.asarray(list(ratios), dtype=float)
    if r.size == 0:
        return "not measured"
    s = protocol.summarise(r, units, family=family)
    p = float(np.minimum(1.0, s["p"] * family))  # Holm's first step: the strictest a family member faces
    return ratio_phrase_median(s["median"], s["q25"], s["q75"], n=s["n"], p=p, power=s["power"],
                               n_tell=s["n_tell"], **words)


def rivals(table, chosen) -> list:
    """Index labels of the rows of ``table`` (columns ``q25``, ``q75``) other than ``chosen`` whose IQR overlaps the
    chosen row's (:func:`overlap`): a choice by median that these rows leave unresolved."""
    return [i for i, row in table.drop(index=chosen).iterrows() if overlap(row, table.loc[chosen])]


def shown(table, digits: int = 3, blank: str = "—"):
    """``table`` as text for display: each column's numbers with one number of decimals (``digits``, none where
    they are all whole), and ``blank`` where a value was not measured (NaN), e.g. a method that was not decoded at
    that size; the saved CSVs keep the numbers and NaN."""
    import pandas as pd

    def col(c):  # column by column: a table mixing text and numbers still formats its numbers
        num = pd.to_numeric(c, errors="coerce")
        whole = bool((num.dropna() % 1 == 0).all())
        text = num.map(lambda x: f"{x:.0f}" if whole else f"{x:.{digits}f}")
        return text.where(num.notna(), c)
    return table.apply(col).where(table.notna(), blank)


NO_VERDICT = "—"  # a verdict cell without a test (one unit, or a summary with no p-value)


def rule_note(ns, what: str = "its verdict") -> str:
    """The verdict rule's caveat, said once under a table: the rows whose sample sizes ``ns`` fall below
    :data:`MIN_PAIRS` show :data:`NO_VERDICT` in place of ``what``, and why; empty when none does."""
    small = sorted({int(n) for n in ns if int(n) < MIN_PAIRS})
    return (f" A {NO_VERDICT} stands in for {what}: {UNRESOLVED} (n = {', '.join(map(str, small))}, "
            f"fewer than {MIN_PAIRS}; the verdict rule, notation.md)." if small else "")


def verdict_table(rows, unit: str = "prompts"):
    """Findings as a small table, and the footnote that goes under it.

    ``rows``: ``{"finding": ..., "ratios": paired ratios, "units": their prompt ids (optional)}`` or rows of
    :func:`~specdec_core.study.bench.paired_ratios` as dicts (``median``, ``q25``, ``q75``, ``n`` and
    :func:`test_of`'s ``p``, ``sigma``, ``power``, ``n_tell``); extra keys are kept as columns. Each row gets
    ``median``, ``IQR``, ``n`` (distinct ``unit``) and ``verdict``.

    The table is one family: p-values are Holm-adjusted over its rows, and each row's power is taken at the
    strictest level a member of the family faces. A row with ``selected_from=m`` was picked as the best of ``m``
    candidates on the prompts it is judged on: its p-value is multiplied by ``m`` first (Bonferroni), and the
    footnote says so. A row the test cannot resolve reads "cannot tell (≈ N)", N the units that would tell. The
    footnote names the test and its false-positive rate, once.

        table, note = report.verdict_table([{"finding": "linear vs AR", "ratios": r1, "units": ids}, ...])
        book.show(table.set_index("finding"), "Speedup over autoregressive decoding." + note, prefill=True)
    """
    import pandas as pd

    rows = [dict(r) for r in rows]
    for row in rows:
        if "ratios" in row:
            row.update(protocol.summarise(row.pop("ratios"), row.pop("units", None), family=len(rows)))
    picked = [int(row.pop("selected_from", 1) or 1) for row in rows]
    ps = [float(np.minimum(1.0, float(r.get("p", np.nan)) * m)) for r, m in zip(rows, picked)]  # NaN stays NaN
    adjusted = protocol.holm(ps) if rows else []
    family = max(1, int(np.sum(~np.isnan(ps))))
    out = []
    for row, p_adj, m in zip(rows, adjusted, picked):
        med, q25, q75, n = (float(row.pop(k)) for k in ("median", "q25", "q75", "n"))
        test = {k: row.pop(k, None) for k in ("p", "p_holm", "sigma", "power", "n_tell")}
        if test["sigma"] is not None and n >= 1:  # power at the strictest level a member of this family faces
            level = protocol.ALPHA / family / m
            test["power"] = protocol.power(int(n), float(test["sigma"]), alpha=level)
            test["n_tell"] = protocol.n_to_tell(float(test["sigma"]), alpha=level)
        word = NO_VERDICT
        if n > 1 and p_adj == p_adj and not np.isnan(med):
            word = protocol.decide(med, float(p_adj), float(test["power"] or 0.0))
            if word == protocol.CANNOT_TELL:
                word = f"cannot tell (≈ {int(test['n_tell'])})" if test["n_tell"] else "cannot tell"
        iqr = "—" if np.isnan(q25) else re.search(r"IQR ([^,)]+)", ratio_phrase_median(med, q25, q75)).group(1)
        out.append({**row, "median": "—" if np.isnan(med) else f"{med:.2f}×", "IQR": iqr, "n": int(n),
                    "verdict": word})
    table = pd.DataFrame(out)
    words = [r["verdict"] for r in out]
    note = ""
    if any(w != NO_VERDICT for w in words):
        note += (f" Verdicts: the {protocol.TEST_NAME.replace('prompts', unit)}, at a {protocol.ALPHA:.0%} "
                 f"false-positive rate over the table's rows (Holm).")
    if any(m > 1 for m in picked):
        note += (" A row picked as the best of several on these same prompts has its test multiplied by their "
                 "number (Bonferroni).")
    if any(w.startswith("cannot tell") for w in words):
        note += (f" Where a row cannot tell, the test had less than even odds of seeing a {protocol.EFFECT - 1:.0%} "
                 f"change at this size. About N {unit} would tell (≈ N).")
    if NO_VERDICT in words:
        note += f" A {NO_VERDICT} means no test: one {unit.rstrip('s')}, or no paired sample."
    return table, note


TEST_COLUMNS = ("p", "sigma", "power", "n_tell")  # not p_holm: a verdict table adjusts over its own rows


def test_of(row) -> dict:
    """The test's columns of a summarised row (:func:`~specdec_core.study.bench.paired_ratios`), to pass on to
    :func:`verdict_table`: ``{**report.test_of(r), "finding": ..., "median": r["median"], ...}``."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    return {k: get(k, None) for k in TEST_COLUMNS if get(k, None) is not None}
