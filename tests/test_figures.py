"""The shared figures (specdec_core.study.figures): what each draws, counted on the returned figure, and the
tables each refuses."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from specdec_core.study import figures  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def by_task() -> pd.DataFrame:
    rows = [dict(runner=r, task=t, temperature=T, median=m)
            for T in (0.0, 1.0) for r, m in (("linear", 1.2), ("tree", 0.9), ("ngram", 1.0))
            for t in ("qa", "rag", "math")]
    return pd.DataFrame(rows)


def sweep() -> pd.DataFrame:
    rows = [dict(method=m, K=k, median=1 + 0.1 * k + d, q25=0.9 + 0.1 * k + d, q75=1.1 + 0.1 * k + d)
            for d, m in ((0.0, "linear"), (0.05, "parallel")) for k in (4, 1, 2)]  # K out of order on purpose
    return pd.DataFrame(rows)


def test_speedup_by_task_draws_a_panel_per_temperature_and_a_bar_per_task_and_method():
    g = figures.speedup_by_task(by_task())
    axes = list(g.axes.flat)
    assert len(axes) == 2  # temperatures 0 and 1
    for ax in axes:
        bars = [p for p in ax.patches if p.get_height() > 0]
        assert len(bars) == 3 * 3  # tasks × methods
        assert sorted(round(p.get_height(), 6) for p in bars) == [0.9] * 3 + [1.0] * 3 + [1.2] * 3
        ones = [ln for ln in ax.get_lines() if np.allclose(ln.get_ydata(), 1.0)]
        assert ones, "no break-even line at 1"
        assert all(t.get_rotation() == 25 for t in ax.get_xticklabels())
    assert axes[0].get_ylabel() == figures.SPEEDUP_LABEL
    assert {t.get_text() for t in g.legend.texts} == {"linear", "tree", "ngram"}


def test_speedup_by_task_reads_the_named_columns():
    d = by_task().rename(columns={"runner": "method", "median": "speedup"})
    g = figures.speedup_by_task(d, y="speedup", hue="method")
    assert len(list(g.axes.flat)) == 2
    with pytest.raises(ValueError, match="temperature"):
        figures.speedup_by_task(by_task().drop(columns="temperature"))
    with pytest.raises(ValueError, match="speedup"):
        figures.speedup_by_task(by_task(), y="speedup")


def test_median_iqr_one_series_per_group_with_its_bars_and_no_line():
    fig = figures.median_iqr(sweep(), "method", label="{} draft", baseline=1, title="t", xlabel="K")
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    series = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(series) == 2
    assert [t.get_text() for t in ax.get_legend().texts] == ["linear draft", "parallel draft"]
    for i, c in enumerate(series):
        line, _, (bars,) = c
        assert line.get_linestyle() == "None" and line.get_marker() == "o"  # markers only
        assert to_rgba(line.get_color()) == to_rgba(f"C{i}")
        assert list(line.get_xdata()) == [1, 2, 4]  # sorted by K within the group
        segs = bars.get_segments()
        assert len(segs) == 3
        d = sweep()[sweep().method == ["linear", "parallel"][i]].sort_values("K")
        assert np.allclose([s[0][1] for s in segs], d.q25) and np.allclose([s[1][1] for s in segs], d.q75)
    drawn = [ln for ln in ax.get_lines() if ln.get_linestyle() != "None"]  # not the markers, not the caps
    assert len(drawn) == 1 and np.allclose(drawn[0].get_ydata(), 1)  # the baseline
    assert ax.get_title() == "t" and ax.get_xlabel() == "K"


def test_median_iqr_dodge_order_and_labels():
    d = sweep().sort_values(["K", "method"])  # reversed below: parallel K=4 comes first
    fig = figures.median_iqr(d.iloc[::-1], "method", dodge=0.08, sort=False, label=str.upper, legend_fontsize=8)
    ax = fig.axes[0]
    series = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    # order of appearance: parallel first (the table was reversed), shifted by 0 and linear by 0.08
    assert [t.get_text() for t in ax.get_legend().texts] == ["PARALLEL", "LINEAR"]
    assert np.allclose(series[0][0].get_xdata(), [1, 2, 4])
    assert np.allclose(series[1][0].get_xdata(), [1.08, 2.08, 4.08])
    assert ax.get_legend().texts[0].get_fontsize() == 8
    assert not [ln for ln in ax.get_lines() if ln.get_linestyle() != "None"]  # no baseline asked


def test_median_iqr_refuses_a_table_without_its_columns_or_rows():
    with pytest.raises(ValueError, match="q75"):
        figures.median_iqr(sweep().drop(columns="q75"), "method")
    with pytest.raises(ValueError, match="drafter"):
        figures.median_iqr(sweep(), "drafter")
    with pytest.raises(ValueError, match="empty"):
        figures.median_iqr(sweep().iloc[:0], "method")


def test_speedup_by_family_draws_a_panel_per_family_and_a_row_per_method():
    """One panel per family in the family map's order, methods it leaves out in a last panel "other"; one y-tick per
    method; one scatter series per task (at most the palette's six); an empty table or a missing column refused."""
    import pandas as pd
    import pytest

    rows = [dict(method=m, task=t, speedup=s) for m, s0 in [("linear", 0.9), ("tree", 1.1), ("ngram", 1.2),
                                                             ("mystery", 1.0)]
            for t, s in zip(["qa", "rag", "math"], [s0, s0 + 0.1, s0 - 0.1])]
    d = pd.DataFrame(rows)
    fig = figures.speedup_by_family(d, {"linear": "draft model", "tree": "draft model", "ngram": "copied"})
    axes = fig.axes
    assert [ax.get_title(loc="left") for ax in axes] == ["draft model", "copied", "other"]
    assert [[t.get_text() for t in ax.get_yticklabels()] for ax in axes] == [["linear", "tree"], ["ngram"], ["mystery"]]
    assert all(len(ax.collections) == 3 for ax in axes)
    with pytest.raises(ValueError, match="empty"):
        figures.speedup_by_family(d.iloc[:0], {})
    with pytest.raises(ValueError):
        figures.speedup_by_family(d.drop(columns="task"), {})
