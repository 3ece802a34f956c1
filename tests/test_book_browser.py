"""The rendered CI book in a real browser: every page opened in headless Chromium (``tools/browser.py``).

`make test` renders the CI book (``build/book-ci/index.html``) and then runs this file. A page fails on a broken
image, a figure its notebook holds but the page does not show, or a line cut off at the edge of the page or of a
text block. Without Chromium (`make browser` installs Debian's where it can) every test here skips and says why;
without a rendered book the book test skips, except under ``SPECDEC_REQUIRE_BOOK=1`` (set by `make test` after
rendering), where it fails.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from specdec_core.tools import browser

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "build" / "book-ci"
CHROMIUM = browser.find_browser()
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine: `make browser` installs "
                                   "Debian's package where it can (root and a package registry)")


@needs_browser
def test_the_check_catches_a_broken_image_a_missing_figure_and_a_cut_off_line(tmp_path):
    """The probe itself, on planted pages: each defect found, and a clean page passes."""
    import base64
    import json

    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
    (tmp_path / "ok.png").write_bytes(png)
    (tmp_path / "notebooks").mkdir()
    figure = {"output_type": "display_data", "data": {"image/png": "x"}, "metadata": {}}
    (tmp_path / "notebooks" / "ch.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "code", "outputs": [figure, figure]}]}))
    long = "x" * 400
    pages = {
        "index.html": "<p>front</p><img src='ok.png'>",
        "ch.html": f"<img src='missing.png'><div class='cell_output'><pre style='width:400px;overflow:auto'>{long}\n"
                   + "y" * 150 + "</pre></div><div class='cell_output'><pre style='width:400px;overflow:auto'>" + "z" * 150
                   + "</pre></div><div class='cell_input'><pre style='width:400px;overflow:auto'>code " + long + "</pre></div>",
    }
    for name, body in pages.items():
        (tmp_path / name).write_text(f"<html><body>{body}</body></html>")
    problems = browser.check_book(tmp_path, CHROMIUM)
    assert any("broken image missing.png" in p for p in problems), problems
    assert any("shows 1 images, its notebook has 2 figures" in p for p in problems), problems
    assert [p for p in problems if "cut off" in p] == [f"ch.html: a line cut off at the edge: {long[:120]!r}"], problems
    assert not [p for p in problems if p.startswith("index.html")], problems
    assert not list(tmp_path.glob(".*.html")), "the probe's copies are removed"


@needs_browser
@pytest.mark.skipif(not (BOOK / "index.html").is_file() and os.environ.get("SPECDEC_REQUIRE_BOOK") != "1",
                    reason=f"no rendered CI book in {BOOK} (make test renders it)")
def test_every_page_of_the_ci_book_reads_clean():
    assert (BOOK / "index.html").is_file(), f"no rendered CI book in {BOOK}"
    problems = browser.check_book(BOOK, CHROMIUM)
    assert not problems, "\n".join(problems)
