"""The figures more than one chapter draws, so that each is drawn one way.

- :func:`speedup_by_task`: each method's paired speedup per task, one panel per temperature (chapters 6 and 8);
- :func:`median_iqr`: medians with interquartile bars against K (or any x), one series per group, markers only
  (chapters 5 and 6: draft cost and speedup against K).

Each function takes a table as the chapters save it (the columns are named in its docstring), returns the figure
for ``Chapter.savefig`` and leaves the saved names to the chapter. A table without the named columns raises
``ValueError``.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

SPEEDUP_LABEL = "speedup over autoregressive (median, paired)"


def _need(data: pd.DataFrame, columns, what: str) -> None:
    """Raise ``ValueError`` naming the columns of ``columns`` that ``data`` lacks."""
    missing = [c for c in columns if c not in data.columns]
    if missing:
        raise ValueError(f"{what} needs column(s) {missing}; the table has {list(data.columns)}")


def speedup_by_task(data: pd.DataFrame, y: str = "median", hue: str = "runner") -> sns.FacetGrid:
    """Bars of ``y`` per ``task`` and ``hue``, a panel per ``temperature``, the break-even line at 1."""
    _need(data, ["task", y, hue, "temperature"], "speedup_by_task")
    g = sns.catplot(data=data, x="task", y=y, hue=hue, col="temperature", kind="bar", height=4, aspect=1.5,
                    errorbar=None)
    for ax in g.axes.flat:
        ax.axhline(1.0, color="k", lw=1)
        ax.tick_params(axis="x", rotation=25)
    g.set_axis_labels("", SPEEDUP_LABEL)
    return g


def median_iqr(data: pd.DataFrame, by: str, x: str = "K", *,
               label="{}",                   # a format string, or a function of the group's key
               dodge: float = 0.0,           # group i shifted right by i × dodge, so bars at one x stay apart
               sort: bool = True,            # groups in sorted order, else in order of appearance
               baseline: float | None = None,  # a grey line at this y (1: break-even)
               figsize=(7, 4), legend_fontsize=None,
               **axes_set) -> plt.Figure:    # axes_set: passed to Axes.set (labels, title, limits)
    """``median`` against ``x`` with ``q25``–``q75`` bars, one marker series (colour Ci) per ``by`` group."""
    _need(data, [by, x, "median", "q25", "q75"], "median_iqr")
    if data.empty:
        raise ValueError("median_iqr: the table is empty")
    fig, ax = plt.subplots(figsize=figsize)
    for i, (key, g) in enumerate(data.groupby(by, sort=sort)):
        g = g.sort_values(x)
        # markers only: a line would invent the x between the measured ones
        ax.errorbar(g[x] + dodge * i if dodge else g[x], g["median"], yerr=[g["median"] - g.q25, g.q75 - g["median"]],
                    fmt="o", capsize=3, color=f"C{i}", label=label(key) if callable(label) else label.format(key))
    if baseline is not None:
        ax.axhline(baseline, color="grey", lw=1)
    ax.set(**axes_set)
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.legend(**({} if legend_fontsize is None else {"fontsize": legend_fontsize}))
    fig.tight_layout()
    return fig
