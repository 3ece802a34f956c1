"""Saying a comparison the same way everywhere: a ratio, its spread, and the verdict the spread allows.

    report.ratio_phrase(paired_ratios)            # '1.21× (IQR 1.05–1.31, 12 pairs): faster'
    report.verdict(median, q25, q75)              # 'faster' | 'slower' | 'ties'
    report.rivals(table, chosen)                  # rows whose IQR reaches the chosen row's: a choice not resolved

The verdict reads the interquartile range, not the median alone: a ratio whose IQR straddles 1 *ties*, and a
single pair (no spread at all) gets no verdict.
Chapters render their findings from these strings, so the words always match the numbers beside them.
"""
from __future__ import annotations

import numpy as np


def verdict(median: float, q25: float, q75: float, better: str = "faster", worse: str = "slower") -> str:
    """``better`` if the whole IQR lies above 1, ``worse`` if below, else ``"ties"`` (NaN: ``"not measured"``)."""
    if any(np.isnan(x) for x in (median, q25, q75)):
        return "not measured"
    return better if q25 > 1 else worse if q75 < 1 else "ties"


def ratio_phrase_median(median: float, q25: float, q75: float, n: int | None = None, min_n: int | None = None,
                        **words) -> str:
    """``'1.21× (IQR 1.05–1.31, 12 pairs): faster'`` from a median and quartiles; with ``min_n``, a sample of fewer
    than ``min_n`` pairs gets no verdict word: ``'unresolved at this size (n = 3)'``."""
    if n == 1:  # one pair has no spread: no IQR, no verdict
        return f"{median:.2f}× (one pair, no verdict)"
    pairs = f", {n} pairs" if n is not None else ""
    said = verdict(median, q25, q75, **words)
    if min_n is not None and n is not None and n < min_n:
        said = f"unresolved at this size (n = {n}, fewer than {min_n})"
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
