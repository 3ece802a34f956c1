"""The figures more than one chapter draws, so that each is drawn one way.

- :func:`speedup_by_task`: each method's paired speedup per task, one panel per temperature (chapters 8 and 11);
- :func:`speedup_by_family`: each method's speedup per task as dots, one panel per family of methods (chapter 6's
  headline figure);
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


def speedup_by_family(data: pd.DataFrame, family: dict, y: str = "speedup", hue: str = "method",
                      overall: pd.DataFrame | None = None, title: str = "") -> plt.Figure:
    """Each method's speedup per task as dots on the method's own row, one panel per family of methods.

    ``data``: one row per (``hue``, ``task``) with ``y``. ``family``: ``{method: family name}``; panels and rows in
    its order, a method it leaves out in a last panel, ``"other"``. Colour = task (seaborn's colour-blind palette),
    so a panel has one series per task and the methods are named on the axis, not in a legend. ``overall``
    (optional, indexed by method, column ``median``): each row's pooled median written at its right. The line at 1
    is break-even: a dot left of it is a task where the method lost time."""
    _need(data, ["task", y, hue], "speedup_by_family")
    if data.empty:
        raise ValueError("speedup_by_family: the table is empty")
    present = list(pd.unique(data[hue]))
    fam = {m: family.get(m, "other") for m in present}
    panels = [f for f in dict.fromkeys([*family.values(), "other"]) if f in fam.values()]
    rows = {f: [m for m in dict.fromkeys([*family, *present]) if m in fam and fam[m] == f] for f in panels}
    tasks = sorted(data.task.unique())
    colours = dict(zip(tasks, sns.color_palette("colorblind", len(tasks))))
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False, layout="constrained",
                             figsize=(8.5, 1.4 + 0.42 * len(present) + 0.45 * len(panels)),
                             gridspec_kw={"height_ratios": [len(rows[f]) for f in panels]})
    step = 0.5 / max(len(tasks), 1)  # tasks spread a little around their method's row, so no dot hides another
    lo, hi = min(float(data[y].min()), 1.0), max(float(data[y].max()), 1.0)
    lo, hi = lo - 0.05 * (hi - lo + 0.1), hi + 0.05 * (hi - lo + 0.1)
    by_task = data.set_index(["task", hue])[y]
    for ax, f in zip(axes[:, 0], panels):
        names = rows[f]
        for j, t in enumerate(tasks):
            x = [by_task.get((t, m), float("nan")) for m in names]
            ax.scatter(x, [i + (j - (len(tasks) - 1) / 2) * step for i in range(len(names))], color=colours[t],
                       s=36, label=t, zorder=3, edgecolor="white", linewidth=0.5)
        ax.axvline(1.0, color="k", lw=1, zorder=2)
        ax.axvspan(lo, 1.0, color="0.5", alpha=0.12, lw=0, zorder=0)  # left of 1: the method lost time
        ax.set_xlim(lo, hi)
        ax.set_yticks(range(len(names)), names)
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.set_title(f, loc="left", fontsize=10, fontweight="bold")
        if overall is not None:
            for i, m in enumerate(names):
                if m in overall.index:
                    ax.annotate(f"{overall.loc[m, 'median']:.2f}×", xy=(1.0, i), xycoords=("axes fraction", "data"),
                                xytext=(6, 0), textcoords="offset points", va="center", fontsize=9)
    if overall is not None:
        axes[0, 0].annotate("all\nprompts", xy=(1.0, 1.0), xycoords="axes fraction", xytext=(6, 4),
                            textcoords="offset points", va="bottom", fontsize=8)
    axes[-1, 0].set_xlabel(f"{SPEEDUP_LABEL}; shaded: below 1, slower than autoregressive")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, title="task", loc="outside lower center", ncol=min(len(tasks), 6), fontsize=8,
               title_fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


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
