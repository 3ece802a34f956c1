"""The book's appendix pages (``book/notation.md``, ``book/solutions.md``) in the rendered book.

A tiny run (test_render's three executed notebooks) is rendered with the repository's README, so the real pages of
``book/`` are staged: they build without a warning beside any set of chapters (they link to none), follow the last
chapter in prev/next, and the front page lists them. A render without a README stages none (test_render's books).
The solutions page answers every chapter's exercises: one section per chapter with an Exercises list, one numbered
solution per exercise."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from specdec_core.tools.render import APPENDIX, render_book, with_appendix
from test_render import MACHINE, Page, make_run

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    run = make_run(tmp_path_factory.mktemp("run"))
    render_book(run, params_name="ci", readme=ROOT / "README.md", info=MACHINE)
    return run


def test_pages_rendered_listed_and_after_the_last_chapter(book):
    stems = [Path(p).stem for p in APPENDIX]
    for stem in stems:
        assert (book / f"{stem}.html").is_file(), stem
    front = Page(book / "index.html")
    hrefs = [a["href"] for a in front.anchors]
    assert all(f"{stem}.html" in hrefs for stem in stems), hrefs
    text = " ".join(" ".join(front.text).split())
    assert "Appendix" in text and text.index("Appendix") < text.index("This run")
    order = ["06_speedup", *stems]     # the tiny run's last chapter, then the pages
    for a, b in zip(order, order[1:]):
        assert Page(book / f"{a}.html").links.get("next") == f"{b}.html", a
        assert Page(book / f"{b}.html").links.get("prev") == f"{a}.html", b
    assert "next" not in Page(book / f"{stems[-1]}.html").links


def test_notation_page_defines_the_books_terms(book):
    text = " ".join(" ".join(Page(book / "notation.html").text).split())
    for term in ("accepted ÷ (accepted + rejections)", "accepted ÷ drafted", "num_draft_tokens", "MIN_PAIRS",
                 "cannot tell at this size", "Wilcoxon signed-rank", "Holm", "Times include the prefill",
                 "record.acceptance_rate", "pass_costs"):
        assert term in text, term


def exercise_counts() -> dict[int, int]:
    """Chapter number → the number of exercises its ``## Exercises`` cell lists."""
    counts = {}
    for src in sorted(BOOK.glob("[0-9][0-9]_*.py")):
        m = re.search(r"^# ## Exercises\n(.*?)(?=^# %%|\Z)", src.read_text(), re.M | re.S)
        if m:
            counts[int(src.name[:2])] = len(re.findall(r"^#\s+(\d+)\.\s", m.group(1), re.M))
    return counts


def test_solutions_answer_every_exercise():
    text = (BOOK / "solutions.md").read_text()
    sections = dict(re.findall(r"^## Chapter (\d+) · .*?\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    counts = exercise_counts()
    assert counts, "no chapter lists exercises"
    for chapter, n in counts.items():
        assert str(chapter) in sections, f"solutions.md has no section for chapter {chapter}"
        numbers = [int(x) for x in re.findall(r"^\*\*(\d+)\.", sections[str(chapter)], re.M)]
        assert numbers == list(range(1, n + 1)), (chapter, numbers, n)


def test_no_readme_no_appendix(tmp_path):
    index = "# Book\n\n## This run\n\ntext\n"
    assert with_appendix(index, tmp_path, None) == index
    assert with_appendix(index, tmp_path, tmp_path / "nowhere") == index
    assert not list(tmp_path.iterdir())
