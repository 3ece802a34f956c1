"""Saying a comparison the same way everywhere: a ratio, its spread, and the verdict the spread allows.

    report.ratio_phrase(paired_ratios)            # '1.21× (IQR 1.05–1.31, 12 pairs): faster'
    report.verdict(median, q25, q75)              # 'faster' | 'slower' | 'ties'
    report.rivals(table, chosen)                  # rows whose IQR reaches the chosen row's: a choice not resolved

The verdict reads the interquartile range, not the median alone: a ratio whose IQR straddles 1 *ties*, and a
single pair (no spread at all) gets no verdict.

**The verdict rule** (one place for the whole book): a verdict word ("faster", "slower", "ties", "agree", ...)
is printed only for a sample of at least ``MIN_PAIRS`` pairs (prompts, calls); a smaller sample prints
``"unresolved at this size (n = 3, fewer than 6)"`` instead, whatever its interval says. :func:`judged` applies
the same rule to any other verdict (theory against measurement, a winner by task). The CI book, run on a
handful of prompts, therefore exercises every finding's code without claiming any of them;
``tests/test_book_outputs.py`` checks that no verdict word sits beside "unresolved".

    report.judged("agree", n=3)                   # 'unresolved at this size (n = 3, fewer than 6)'
    report.verdict_table(rows)                    # findings as a table: one "—" per unresolved row, one footnote
    report.caption("Speedup over autoregressive decoding.", prefill=True)   # + ' Times include the prefill.'

Chapters render their findings from these strings, so the words always match the numbers beside them.
"""
from __future__ import annotations

import re

import numpy as np

MIN_PAIRS = 6  # the smallest sample whose interval a verdict word may read (the full book has 6–12 prompts)
UNRESOLVED = "unresolved at this size"
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


def verdict(median: float, q25: float, q75: float, better: str = "faster", worse: str = "slower") -> str:
    """``better`` if the whole IQR lies above 1, ``worse`` if below, else ``"ties"`` (NaN: ``"not measured"``)."""
    if any(np.isnan(x) for x in (median, q25, q75)):
        return "not measured"
    return better if q25 > 1 else worse if q75 < 1 else "ties"


def ratio_phrase_median(median: float, q25: float, q75: float, n: int | None = None, min_n: int = MIN_PAIRS,
                        **words) -> str:
    """``'1.21× (IQR 1.05–1.31, 12 pairs): faster'`` from a median and quartiles; a sample of fewer than ``min_n``
    pairs (the verdict rule, :data:`MIN_PAIRS`) gets no verdict word: ``'unresolved at this size (n = 3, fewer
    than 6)'``. Without ``n`` (a ratio that is not a sample of pairs) the interval alone decides."""
    if n == 1:  # one pair has no spread: no IQR, no verdict
        return f"{median:.2f}× (one pair, no verdict)"
    pairs = f", {n} pairs" if n is not None else ""
    said = verdict(median, q25, q75, **words)
    if n is not None and n < min_n:
        said = unresolved(n, min_n)
    narrow = f"{q25:.2f}" == f"{q75:.2f}" and q25 != q75  # a spread that two decimals would hide

    def q(x):  # a quartile that rounds to 1.00 but is not 1 gets a third decimal: the verdict reads it exactly
        return f"{x:.3f}" if narrow or (x != 1 and f"{x:.2f}" == "1.00") else f"{x:.2f}"
    return f"{median:.2f}× (IQR {q(q25)}–{q(q75)}{pairs}): {said}"


def count(n: int, noun: str, hi: int | None = None) -> str:
    """``'1 repeat'``, ``'3 repeats'``; with ``hi``, a range: ``'1–2 prompts'`` (``'2 prompts'`` when ``hi == n``)."""
    n, hi = int(n), int(n if hi is None else hi)
    return f"{n if hi == n else f'{n}–{hi}'} {noun}{'s' if hi != 1 else ''}"


def overlap(a, b) -> bool:
    """Whether two rows' interquartile ranges (``q25``, ``q75``) overlap: then their medians give no order."""
    return a.q25 <= b.q75 and b.q25 <= a.q75


def ratio_phrase(ratios, **words) -> str:
    """:func:`ratio_phrase_median` of a sample of paired ratios."""
    r = np.asarray(list(ratios), dtype=float)
    if r.size == 0:
        return "not measured"
    q25, med, q75 = np.percentile(r, [25, 50, 75])
    return ratio_phrase_median(float(med), float(q25), float(q75), n=int(r.size), **words)


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


NO_VERDICT = "—"  # a verdict cell of a table whose sample is below the rule's size: the footnote says why, once


def verdict_table(rows, min_n: int = MIN_PAIRS):
    """Findings as a small table, and the footnote that goes under it (``""`` when none is needed).

    ``rows``: ``{"finding": ..., "ratios": paired ratios}`` or ``{"finding": ..., "median", "q25", "q75", "n"}``
    dicts, extra keys kept as columns. Each row gets ``median``, ``IQR``, ``n`` and ``verdict``; a row with fewer
    than ``min_n`` pairs gets :data:`NO_VERDICT`, and the footnote says once, for the whole table, that such rows
    are unresolved at this size: the caveat is a column and a footnote, not a phrase in every sentence.

        table, note = report.verdict_table([{"finding": "linear vs AR", "ratios": r1}, ...])
        book.show(table.set_index("finding"), "Speedup over autoregressive decoding." + note, prefill=True)
    """
    import pandas as pd

    out = []
    for row in rows:
        row = dict(row)
        if "ratios" in row:
            r = np.asarray(list(row.pop("ratios")), dtype=float)
            q25, med, q75 = np.percentile(r, [25, 50, 75]) if r.size else (np.nan,) * 3
            row.update(median=med, q25=q25, q75=q75, n=int(r.size))
        med, q25, q75, n = (float(row.pop(k)) for k in ("median", "q25", "q75", "n"))
        word = verdict(med, q25, q75) if int(n) >= int(min_n) and n > 1 else NO_VERDICT
        iqr = "—" if np.isnan(q25) else re.search(r"IQR ([^)]+)\)", ratio_phrase_median(med, q25, q75)).group(1)
        out.append({**row, "median": "—" if np.isnan(med) else f"{med:.2f}×", "IQR": iqr, "n": int(n),
                    "verdict": word})
    table = pd.DataFrame(out)
    small = [r["n"] for r in out if r["verdict"] == NO_VERDICT]
    note = (f" A {NO_VERDICT} in the verdict column means {UNRESOLVED}: fewer than {min_n} pairs (the verdict "
            "rule, notation.md)." if small else "")
    return table, note
