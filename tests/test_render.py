"""The rendered book and the reader's JupyterLab.

A tiny run (three executed notebooks made here, with papermill's metadata, a figure output, an equation and
chapter 6's headline files) is rendered once with :func:`specdec_core.tools.render.render_book`; the tests
read the pages it wrote: titles in the table of contents, prev/next through every chapter, every image
present, math typeset by the book's own MathJax, the search index, the run's parameters and headline. Then
the loud failures (a failed chapter, an error output, a missing figure, a broken cross-reference), and the
JupyterLab settings set-up installs (a chapter's ``.py`` opens in jupytext's notebook view)."""
import base64
import json
import re
import struct
import tempfile
import zlib
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from specdec_core.tools.render import BookError, render_book

CHAPTERS = {  # stem -> (title, markdown of a later cell)
    "00_intro": ("0 · Introduction to the tiny book", "## Section\nPlain text about rejection sampling."),
    "03_linear": ("3 · The acceptance rule", "## Rule\nAccept x with probability\n\n"
                                             "$$ \\min\\left(1, \\frac{p(x)}{q(x)}\\right) $$\n\nand $\\alpha$ inline."),
    "06_speedup": ("6 · Speedup headline", "## Where it loses\nSome prose."),
}
MACHINE = {"CPU": "test CPU", "cores": "2 usable of 2"}


def png(width=4, height=3, rgb=(200, 30, 30)) -> bytes:
    """A valid PNG, built with the standard library."""
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data
                                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def executed_notebook(title: str, later: str, run_dir: Path, stem: str, error: bool = False):
    """A notebook as papermill leaves it: title cell, parameters, injected parameters, a figure output."""
    v4 = nbformat.v4
    params = v4.new_code_cell('k = 4            # draft length\nmodel = "smollm2-135m"\ndraft = None\n'
                              'device = "cpu"\nout_dir = "../build/x"')
    params.metadata["tags"] = ["parameters"]
    injected = v4.new_code_cell(f'# Parameters\nk = 2\nout_dir = "{run_dir / stem}"\n')
    injected.metadata["tags"] = ["injected-parameters"]
    figure = v4.new_code_cell("plot()", outputs=[v4.new_output(
        "display_data", data={"image/png": base64.b64encode(png()).decode(), "text/plain": "<Figure>"})])
    cells = [v4.new_markdown_cell(f"# {title}\n\nWhat this chapter does, in one sentence. More."),
             params, injected, figure, v4.new_markdown_cell(later)]
    if error:
        cells.append(v4.new_code_cell("1/0", outputs=[v4.new_output(
            "error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])]))
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["papermill"] = {"parameters": {"k": 2, "out_dir": str(run_dir / stem)}, "duration": 12.5,
                                "end_time": "2026-01-02T03:04:05.000000", "exception": None}
    return nb


def make_run(run_dir: Path, error_in: str | None = None) -> Path:
    (run_dir / "notebooks").mkdir(parents=True)
    for stem, (title, later) in CHAPTERS.items():
        nbformat.write(executed_notebook(title, later, run_dir, stem, error=stem == error_in),
                       run_dir / "notebooks" / f"{stem}.ipynb")
        (run_dir / stem).mkdir()
    head = run_dir / "06_speedup"
    (head / "speedup_by_task.png").write_bytes(png(8, 6, (30, 30, 200)))
    rows = ["id,task,runner,repeat,temperature,tokens_per_s,new_tokens,accepted,rejections,target_passes"]
    for t in (0.0, 1.0):
        for i in range(2):
            rows.append(f"p{i},qa,autoregressive,0,{t},10,16,,,16")
            rows.append(f"p{i},qa,linear (n-gram),0,{t},{20 + i},16,6,2,8")   # 2.0× and 2.1×
    (head / "headline_runs.csv").write_text("\n".join(rows) + "\n")
    (head / "theory_check.csv").write_text(
        "runner,k,c,verify_ratio,calls,alpha_pooled,predicted_pooled,predicted_median,measured_median,rel_error\n"
        "linear (draft model),4,0.1,1.09,12,0.3,0.95,0.838,0.853,0.018\n")
    (run_dir / "timings.csv").write_text("notebook,seconds,status,commit,machine,date\n" + "".join(
        f'{stem},1.0,ok,abc123,"Test CPU, 2 cores",2026-12-03 10:0{i} UTC\n' for i, stem in enumerate(CHAPTERS)))
    return run_dir


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    run = make_run(tmp_path_factory.mktemp("run"))
    index = render_book(run, params_name="ci", readme=None, info=MACHINE)
    assert index == run / "index.html"
    return run


class Page(HTMLParser):
    """What a test needs of a page: links (rel, href), anchors (class, href, text), images, title."""

    def __init__(self, path: Path):
        super().__init__()
        self.links, self.anchors, self.images, self.scripts, self._a, self.text = {}, [], [], [], None, []
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "link" and a.get("rel") in ("next", "prev"):
            self.links[a["rel"]] = a["href"]
        elif tag == "a":
            self._a = {"class": a.get("class", ""), "href": a.get("href", ""), "text": ""}
            self.anchors.append(self._a)
        elif tag == "img":
            self.images.append(a["src"])
        elif tag == "script" and a.get("src"):
            self.scripts.append(a["src"])

    def handle_endtag(self, tag):
        if tag == "a":
            self._a = None

    def handle_data(self, data):
        self.text.append(data)
        if self._a is not None:
            self._a["text"] += data


def test_front_page_titled_toc_headline_and_machine(book):
    page = Page(book / "index.html")
    text = " ".join(" ".join(page.text).split())
    # the table of contents: every chapter's title (from its first heading), linked, in order
    toc = [a for a in page.anchors if "reference internal" in a["class"] and a["href"].endswith(".html")]
    titles = [title for title, _ in CHAPTERS.values()]
    linked = [a["text"].strip() for a in toc]
    for stem, title in zip(CHAPTERS, titles):
        assert any(a["href"] == f"{stem}.html" and a["text"].strip() == title for a in toc), (stem, linked)
    assert [t for t in linked if t in titles][:3] == titles
    assert "What this chapter does, in one sentence." in text      # the one-line summary (no README here)
    # the headline, read from the run's headline_runs.csv: median 2.05× (IQR 2.02–2.08), α 6/8, τ 32/16
    assert "2.05× (2.02–2.08)" in text and "0.75" in text and "2.00" in text
    assert "predicted 0.838×" in text.replace("*", "")
    assert "test CPU" in text and "book/params/ci.yaml" in text
    # the pair and device the chapters ran with, from their parameters
    for cell in ("target (the chapters", "smollm2-135m", "the shipped drafts",  # (Sphinx curls the ')
                 "device (the chapters"):
        assert cell in text, cell
    assert any(src.endswith("speedup_by_task.png") for src in page.images)
    # the run it comes from (timings.csv), and links to its tables relative to the book's folder: a copied book
    # keeps them (no absolute build path)
    assert "commit abc123" in text and "on Test CPU, 2 cores, 2026-12-03 10:00 UTC to 2026-12-03 10:02 UTC" in text
    hrefs = [a["href"] for a in page.anchors]
    for rel in ("06_speedup/headline_runs.csv", "06_speedup/theory_check.csv", "timings.csv"):
        assert rel in hrefs and (book / rel).is_file(), (rel, hrefs)
    assert not any(h.startswith("/") or str(book) in h for h in hrefs), hrefs


def test_prev_next_reach_every_chapter(book):
    order = ["index", *CHAPTERS]
    for i, name in enumerate(order):
        page = Page(book / f"{name}.html")
        if i + 1 < len(order):
            assert page.links.get("next") == f"{order[i + 1]}.html", name
            assert any("right-next" in a["class"] and a["href"] == f"{order[i + 1]}.html" for a in page.anchors)
        else:
            assert "next" not in page.links
        if i > 0:
            assert page.links.get("prev") == f"{order[i - 1]}.html", name
            assert any("left-prev" in a["class"] and a["href"] == f"{order[i - 1]}.html" for a in page.anchors)


def test_images_present_and_nothing_loaded_from_the_network(book):
    pages = sorted(book.glob("*.html"))
    images = [(p, src) for p in pages for src in Page(p).images]
    assert len(images) >= len(CHAPTERS) + 1          # each chapter's figure output, and the headline figure
    for page, src in images:
        assert (page.parent / src).is_file(), (page.name, src)
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"(https?:)?//", html), page.name


def test_equations_typeset_by_the_books_mathjax(book):
    page = Page(book / "03_linear.html")
    html = (book / "03_linear.html").read_text(encoding="utf-8")
    assert r"\frac{p(x)}{q(x)}" in html and 'class="math' in html
    mathjax = [s for s in page.scripts if "mathjax" in s.lower()]
    assert mathjax and all((book / s.split("?")[0]).is_file() for s in mathjax)


def test_search_index_holds_the_chapters_text(book):
    assert (book / "search.html").is_file()
    index = json.loads(re.search(r"Search\.setIndex\((.*)\)\s*$", (book / "searchindex.js").read_text(),
                                 re.S).group(1))
    docs = index["docnames"]
    for word in ("reject", "sampl"):                 # Sphinx indexes stems
        hits = index["terms"][word]
        hits = hits if isinstance(hits, list) else [hits]
        assert "00_intro" in [docs[h] for h in hits], word


def test_chapter_page_shows_its_parameters(book):
    text = " ".join(" ".join(Page(book / "03_linear.html").text).split())
    assert "This run" in text and "book/params/ci.yaml" in text and "k = 2" in text
    assert "# Parameters" not in text                # papermill's injected cell: its values are in the table


def test_failed_chapter_means_no_book(tmp_path):
    (tmp_path / "index.html").write_text("an earlier render")
    with pytest.raises(BookError, match="03_linear"):
        render_book(tmp_path, [], failed=["03_linear.py"], info=MACHINE)
    assert not (tmp_path / "index.html").exists()    # no stale front page passing for this run's


def test_error_output_and_missing_figure_fail(tmp_path):
    run = make_run(tmp_path / "a", error_in="03_linear")
    with pytest.raises(BookError, match="03_linear.*ZeroDivisionError"):
        render_book(run, readme=None, info=MACHINE)
    run = make_run(tmp_path / "b")
    (run / "index.html").write_text("an earlier render")
    (run / "06_speedup" / "speedup_by_task.png").unlink()
    with pytest.raises(BookError, match="speedup_by_task.png"):
        render_book(run, readme=None, info=MACHINE)
    assert not (run / "index.html").exists()


def test_broken_cross_reference_fails_the_build(tmp_path):
    run = make_run(tmp_path)
    path = run / "notebooks" / "00_intro.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("See {doc}`99_missing` and ![gone](no_such_figure.png)."))
    nbformat.write(nb, path)
    with pytest.raises(BookError, match="99_missing") as e:
        render_book(run, readme=None, info=MACHINE)
    assert "no_such_figure.png" in str(e.value)
    assert not (run / "index.html").exists()


def test_jupyterlab_opens_chapters_as_notebooks():
    """Set-up (the Makefile's venv step) installs Lab settings whose effect is jupytext's notebook view as the
    default viewer of .py files, read here the way JupyterLab's server reads them."""
    from jupyter_core.paths import jupyter_path
    from jupyterlab.labapp import LabApp
    from jupyterlab_server.settings_utils import get_settings

    app = LabApp()
    installed = Path(app.app_settings_dir) / "overrides.d" / "specdec.json"
    assert installed.is_file(), f"{installed} missing: run `make venv`"
    with tempfile.TemporaryDirectory() as user_settings:   # no user settings: the defaults a new reader gets
        result, _ = get_settings(app.app_settings_dir, app.schemas_dir, user_settings,
                                 schema_name="@jupyterlab/docmanager-extension:plugin",
                                 labextensions_path=jupyter_path("labextensions"))
    assert result["schema"]["properties"]["defaultViewers"]["default"].get("python") == "Jupytext Notebook"
    # the viewer named exists: jupytext's Lab extension registers the factory "Jupytext Notebook" for python
    ext = next(Path(p) / "jupyterlab-jupytext" for p in jupyter_path("labextensions")
               if (Path(p) / "jupyterlab-jupytext").is_dir())
    bundle = " ".join(f.read_text(errors="ignore") for f in (ext / "static").glob("*.js"))
    assert 'FACTORY="Jupytext Notebook"' in bundle and '"python"' in bundle


def test_the_committed_reference_renders_without_running_and_names_its_run(tmp_path):
    """render_reference (make book): the reference's executed chapters and tables copied and rendered, its front page
    naming the run's commit and machine from timings.csv (not the rendering machine); no notebooks: a clear error."""
    from specdec_core.tools.render import BookError, render_reference

    ref = make_run(tmp_path / "ref")
    index = render_reference(ref, tmp_path / "out")
    assert index == tmp_path / "out" / "index.html" and not (ref / "index.html").exists()
    text = " ".join(" ".join(Page(index).text).split())
    assert "the reference run of commit abc123" in text and "Test CPU, 2 cores" in text
    empty = tmp_path / "empty"
    (empty / "notebooks").mkdir(parents=True)
    with pytest.raises(BookError, match="no executed chapters"):
        render_reference(empty, tmp_path / "out2")


def test_links_to_chapters_outside_the_run_become_plain_text():
    """A run of some chapters renders: a link to a chapter it lacks is its text, a link to one it has stays."""
    from specdec_core.tools.render import unlink_absent

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("See [chapter 2](02_exactness.ipynb) and [chapter 0](00_quickstart.ipynb)."),
                nbformat.v4.new_code_cell("x = '[a](02_exactness.ipynb)'")]
    out = unlink_absent(nb, {"00_quickstart"})
    assert out.cells[0].source == "See chapter 2 and [chapter 0](00_quickstart.ipynb)."
    assert out.cells[1].source == "x = '[a](02_exactness.ipynb)'"
