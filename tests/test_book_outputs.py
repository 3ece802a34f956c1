"""The executed CI book reads clean: no warning, traceback, profiler chatter, bare empty frame or escape code.

`make test` runs pytest before it executes the notebooks, then this file again once they are written to
``build/book-ci/notebooks/``; without that folder (a fresh clone, ``make test-fast``) every test here skips,
and so does a notebook older than its chapter's source (a stale build says nothing about the chapter now). Under
``SPECDEC_REQUIRE_BOOK=1``, which `make test` sets after writing the book, a missing or stale notebook fails instead.
A chapter that leaves out a section at CI size has to say so in a way this file can see: no output may
announce a section as skipped ("skipped", "not run at this size").
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from specdec_core.study import report
from specdec_core.tools.book import BANNER, CI_BANNER, ONE_POINT

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "build" / "book-ci" / "notebooks"
NOTEBOOKS = sorted(p for p in EXECUTED.glob("[0-9][0-9]_*.ipynb") if not p.name.endswith(".input.ipynb")) \
    if EXECUTED.is_dir() else []

# what a reader must never meet in an executed chapter's outputs
FORBIDDEN = {
    "warning": re.compile(r"Warning"),
    "traceback": re.compile(r"Traceback"),
    "profiler USDT line": re.compile(r"USDT"),
    "bare empty DataFrame": re.compile(r"Empty DataFrame"),
    "ANSI escape": re.compile(r"\x1b\["),
    # Chapter.savefig's note for a series with one point (a sweep of one value at this size)
    "line through one point": re.compile(re.escape(ONE_POINT)),
}
# a section that a CI-size run passes over without running its code
SKIPPED = re.compile(r"\b(skipped|skipping|not run at this size)\b", re.IGNORECASE)


def _texts(output) -> list[str]:
    """Every text an output shows: a stream, an error, or the text/* and JSON data of a result."""
    if output.get("output_type") == "stream":
        return [output.get("text", "")]
    if output.get("output_type") == "error":
        return [output.get("ename", ""), output.get("evalue", ""), "\n".join(output.get("traceback", []))]
    out = []
    for mime, data in (output.get("data") or {}).items():
        if mime.startswith("text/") or mime.endswith("json"):
            out.append(data if isinstance(data, str) else "".join(data) if isinstance(data, list) else str(data))
    return out


# `make test` sets SPECDEC_REQUIRE_BOOK=1 after writing the CI book: there, a missing or stale book (or chapter) fails
REQUIRED = os.environ.get("SPECDEC_REQUIRE_BOOK") == "1"


def _skip_if_stale(path: Path, required: bool | None = None) -> None:
    """Skip a notebook older than its chapter's source; where the CI book was just written (``REQUIRED``), fail."""
    src = ROOT / "book" / f"{path.stem}.py"
    if src.exists() and src.stat().st_mtime > path.stat().st_mtime:
        why = f"{path.name} is older than {src.name}: rerun the CI book (make test does)"
        if REQUIRED if required is None else required:
            pytest.fail(f"{why}; SPECDEC_REQUIRE_BOOK=1 says it was just written, so it must be current")
        pytest.skip(why)


def _outputs(path: Path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            for text in _texts(output):
                yield i, text


def _hits(path: Path, patterns: dict) -> list[str]:
    hits = []
    for i, text in _outputs(path):
        for what, pat in patterns.items():
            for m in pat.finditer(text):
                line_start = text.rfind("\n", 0, m.start()) + 1
                line_end = text.find("\n", m.end())
                line = text[line_start: line_end if line_end >= 0 else None]
                hits.append(f"cell {i}: {what}: {line.strip()[:160]!r}")
                break
    return hits


# without a book these skip, except where it is required (test_the_ci_book_holds_every_chapter then fails)
needs_book = pytest.mark.skipif(not NOTEBOOKS and not REQUIRED,
                                reason=f"no executed CI book under {EXECUTED} (make test writes it)")


@pytest.mark.skipif(not REQUIRED, reason="only where the CI book was just written (make test sets SPECDEC_REQUIRE_BOOK)")
def test_the_ci_book_holds_every_chapter():
    chapters = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.py"))
    executed = [p.stem for p in NOTEBOOKS]
    assert executed, f"no executed CI book under {EXECUTED}"
    assert sorted(executed) == chapters, f"chapters not in the CI book: {sorted(set(chapters) - set(executed))}"


@needs_book
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_outputs_are_clean(path):
    _skip_if_stale(path)
    hits = _hits(path, FORBIDDEN)
    assert not hits, f"{path.name}:\n" + "\n".join(hits)


@needs_book
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_code_cell_ran_and_no_section_skipped(path):
    """Every code cell executed (papermill numbers each one it runs) and no output says a section was skipped."""
    import nbformat

    _skip_if_stale(path)
    nb = nbformat.read(path, as_version=4)
    unrun = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and c.source.strip() and c.get("execution_count") is None]
    assert not unrun, f"{path.name}: code cells {unrun} did not run"
    hits = _hits(path, {"skipped section": SKIPPED})
    assert not hits, f"{path.name}:\n" + "\n".join(hits)


# -- one story: the banner, the verdict rule, the prefill in every speed table's caption ------------------
RATIO = re.compile(r"\(IQR [^()]*?, (\d+) (?:pairs|prompts|requests)\): (\w+)")   # report.ratio_phrase's ": verdict" after the sample size
SENTENCE = re.compile(r";\s*|(?<=\.)\s+(?=[A-Z*(-])|\n|\|")       # clauses (';'), sentences, lines, table cells
# a displayed table whose columns are decode speeds: its caption (book.show) must say whether the prefill is counted
SPEED_HEADER = re.compile(r"<th[^>]*>[^<]*(speedup|tokens_per_s|tok/s|tokens/s|median ratio)[^<]*</th>", re.I)


def _cells(path: Path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and "injected-parameters" not in c.metadata.get("tags", [])]


def verdict_rule_breaches(texts) -> list[str]:
    """Sentences that print a verdict word beside "cannot tell at this size", and ratio phrases of fewer than
    ``report.MIN_PAIRS`` prompts that print a verdict at all (no outcome of so few can pass the test)."""
    found = []
    for text in texts:
        for m in RATIO.finditer(text):
            if int(m.group(1)) < report.MIN_PAIRS and m.group(2) not in ("cannot", "unresolved"):
                found.append(f"{m.group(0)!r}: a verdict for {m.group(1)} prompts")
        for sentence in SENTENCE.split(text):
            if report.UNRESOLVED in sentence and (w := report.VERDICT_WORDS.search(sentence)):
                found.append(f"{w.group(0)!r} beside {report.UNRESOLVED!r}: {sentence.strip()[:160]!r}")
    return found


# an exactness verdict: a test that did not reject, said as "no rejection" or as a bare "exact"; it must carry the power
# it had (exactness.power_phrase: "no rejection; power 0.84 against mutant … at n = …") or say it has none
EXACT_VERDICT = re.compile(r"\bno rejection\b|\b(?:is|are|was|were|proved|proven|shown|found|looks)\s+exact\b"
                           r"|\bexact\s*(?:[:!]|\.(?!\d)|$)", re.I | re.M)
POWER = re.compile(r"\bpower\s+(?:\d|\.\d|not computed|not recorded)", re.I)
CLAIM = re.compile(r"(?<=\.)\s+(?=[A-Z*(-])|\n|\|")  # sentences, lines, table cells (a ';' keeps the clauses together)


def unpowered_exactness_verdicts(texts) -> list[str]:
    """Sentences that declare a sampler exact, or a test's non-rejection, without the power that test had."""
    return [f"{sentence.strip()[:160]!r}" for text in texts for sentence in CLAIM.split(text)
            if EXACT_VERDICT.search(sentence) and not POWER.search(sentence)]


def uncaptioned_speed_tables(cells) -> list[str]:
    """Speed tables (HTML tables with a speed column) not preceded, in their cell, by a caption naming the prefill."""
    found = []
    for i, cell in cells:
        said = ""
        for output in cell.get("outputs", []):
            html = (output.get("data") or {}).get("text/html", "")
            html = "".join(html) if isinstance(html, list) else html
            if "<table" in html and SPEED_HEADER.search(html) and "prefill" not in said.lower():
                found.append(f"cell {i}: a speed table ({SPEED_HEADER.search(html).group(1)}) without a prefill caption")
            said += " ".join(_texts(output))
    return found


@needs_book
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_chapter_opens_with_its_banner(path):
    """The first output of the first code cell names the parameter file; at CI size, it says what that means."""
    _skip_if_stale(path)
    first = next((c for _, c in _cells(path) if c.get("outputs")), None)
    assert first is not None, f"{path.name}: no output at all"
    text = " ".join(_texts(first.outputs[0]))
    assert BANNER in text, f"{path.name}: the first output is not the banner: {text[:160]!r}"
    assert "ci.yaml" in text and CI_BANNER in text, f"{path.name}: the CI book's banner must say {CI_BANNER!r}"


@needs_book
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_verdicts_follow_the_rules(path):
    """No verdict where the rule says unresolved; every exactness verdict carries its power."""
    _skip_if_stale(path)
    texts = [text for _, text in _outputs(path)]
    found = verdict_rule_breaches(texts) + unpowered_exactness_verdicts(texts)
    assert not found, f"{path.name}:\n" + "\n".join(found)


@needs_book
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_speed_table_says_whether_the_prefill_is_counted(path):
    _skip_if_stale(path)
    found = uncaptioned_speed_tables(_cells(path))
    assert not found, f"{path.name}:\n" + "\n".join(found)


def test_an_exact_verdict_without_its_power_is_caught():
    """The check above, shown failing on planted verdicts without a power and passing on the book's own phrase."""
    from specdec_core.study.exactness import power_phrase

    bad = ["63 goodness-of-fit tests, smallest Holm p 0.834: the decoder is exact.",
           "Sequence law of every method: exact",
           "smallest Holm-adjusted p: no rejection (p = 0.83 > 0.01), at linear:model, T=1",
           "| linear:model | exact |"]
    assert [len(unpowered_exactness_verdicts([b])) for b in bad] == [1, 1, 1, 1]
    good = ["family of 54 tests: " + power_phrase(0.84, "no_bonus", 0.047, 1000, 1.9e-4) + ".",
            "smallest p 0.4: no rejection; power not computed here: no control runs in this section",
            "the exact law of every continuation, p = 0.52 against the exact sampler; TV ≤ 0.0104 exactly as computed"]
    assert unpowered_exactness_verdicts(good) == []


def test_the_story_checks_catch_what_they_must():
    """The three checks above, each shown failing on a planted breach and passing on its repair."""
    import nbformat

    bad = ["linear: 1.50× (IQR 1.30–1.70, 3 prompts): faster.",
           "- tree: 1.20× (IQR 1.10–1.30, 2 prompts): cannot tell at this size (n = 2, fewer than 6), so the tree wins.",
           "theory and measurement AGREE: cannot tell at this size (n = 3, fewer than 6)"]
    assert [len(verdict_rule_breaches([b])) for b in bad] == [1, 1, 1]
    good = [report.ratio_phrase([1.3, 1.5, 1.7]) + "; the n-gram draft pays nothing on this task.",
            report.ratio_phrase_median(1.5, 1.3, 1.7, n=12, p=0.001, power=0.9),
            "- **Theory**: " + report.judged("agree", 3) + "."]
    assert verdict_rule_breaches(good) == []
    table = nbformat.v4.new_output("display_data", data={"text/html": "<table><tr><th>speedup</th></tr></table>",
                                                         "text/plain": "table"})
    caption = nbformat.v4.new_output("display_data", data={"text/markdown": f"*{report.caption('x', True)}*",
                                                           "text/plain": "caption"})
    assert uncaptioned_speed_tables([(0, nbformat.v4.new_code_cell("t", outputs=[table]))])
    assert not uncaptioned_speed_tables([(0, nbformat.v4.new_code_cell("t", outputs=[caption, table]))])


def test_a_stale_notebook_fails_where_the_book_is_required(tmp_path):
    """A notebook older than its chapter skips in a plain pytest run and fails under SPECDEC_REQUIRE_BOOK=1
    (``required`` stands for the module's ``REQUIRED``, which the variable sets)."""
    import time

    src = sorted((ROOT / "book").glob("[0-9][0-9]_*.py"))[0]
    stale = tmp_path / f"{src.stem}.ipynb"
    stale.write_text("{}")
    old = src.stat().st_mtime - 60
    os.utime(stale, (old, old))
    with pytest.raises(pytest.skip.Exception, match="older than"):
        _skip_if_stale(stale, required=False)
    with pytest.raises(pytest.fail.Exception, match="must be current"):
        _skip_if_stale(stale, required=True)
    now = time.time() + 60
    os.utime(stale, (now, now))
    _skip_if_stale(stale, required=True)  # current: neither


def test_scanner_sees_what_it_must(tmp_path):
    """The scan itself: each forbidden text is found in a stream, an error and an HTML result."""
    import nbformat

    from specdec_core.tools.book import ONE_POINT_NOTE

    book_note = ONE_POINT_NOTE.format(figure="speed_vs_k", series="tree") + "\n"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("1", execution_count=1, outputs=[
            nbformat.v4.new_output("stream", name="stderr", text="x.py:1: UserWarning: careful\n")]),
        nbformat.v4.new_code_cell("2", execution_count=2, outputs=[
            nbformat.v4.new_output("execute_result", data={"text/plain": "Empty DataFrame\nColumns: []"},
                                   execution_count=2)]),
        nbformat.v4.new_code_cell("3", execution_count=3, outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="\x1b[31mred\x1b[0m USDT probe\n" + \
                                   book_note)]),
        nbformat.v4.new_code_cell("4", execution_count=4, outputs=[
            nbformat.v4.new_output("error", ename="ValueError", evalue="bad",
                                   traceback=["Traceback (most recent call last)"])]),
    ]
    p = tmp_path / "nb.ipynb"
    nbformat.write(nb, p)
    found = {h.split(": ")[1] for h in _hits(p, FORBIDDEN)}
    assert found == set(FORBIDDEN)
    clean = nbformat.v4.new_notebook()
    clean.cells = [nbformat.v4.new_code_cell("1", execution_count=1, outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="speedup 1.21× (IQR 1.05–1.31): faster\n")])]
    nbformat.write(clean, p)
    assert _hits(p, FORBIDDEN) == []


def test_one_point_lines_are_found_and_redrawn_as_markers():
    """savefig's check: a seaborn sweep of one K (a line through one point) is found, by its label, and redrawn
    as a marker; two-point lines, marker-only points and reference lines (axhline) are left as they are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    from specdec_core.tools import book

    fig, ax = plt.subplots()
    df = pd.DataFrame({"K": [4, 2, 4], "median": [1.1, 0.9, 1.0], "method": ["one", "two", "two"]})
    sns.lineplot(data=df, x="K", y="median", hue="method", ax=ax)
    ax.plot([7], [3.4], "k*", label="a point")
    ax.axhline(1, color="grey")
    ax.errorbar([1], [1.2], yerr=[[0.1], [0.1]], fmt="o-", label="one K with IQR")
    found = book.one_point_lines(fig, repair=True)
    assert sorted(found) == ["one", "one K with IQR"], found
    assert book.one_point_lines(fig) == []  # repaired: a marker, no line style
    assert all(ln.get_marker() not in ("None", "", None) for ln in ax.get_lines()
               if np.asarray(ln.get_xdata(), float).size == 1)
    text = book.ONE_POINT_NOTE.format(figure="f", series="one")
    assert FORBIDDEN["line through one point"].search(text)
    plt.close(fig)
