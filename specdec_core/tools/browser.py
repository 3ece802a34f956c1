"""The rendered book, looked at in a real browser: every page opened in headless Chromium, and what a reader
would meet there checked.

    problems = browser.check_book("build/book-ci")          # [] when every page reads clean
    python -m specdec_core.tools.browser build/book-ci      # the same, printed; exit 1 on a problem

For each HTML page of a rendered book (:mod:`specdec_core.tools.render`) a copy is written beside it with a small
script that runs after the page has loaded and laid itself out; Chromium's ``--dump-dom`` prints the page with
the script's findings. What fails a page:

- a broken image (an ``<img>`` that did not load, or loaded empty);
- a missing figure (a chapter's notebook holds an image output that its page does not show);
- a page wider than its window, or printed output whose block scrolls sideways for a line over :data:`LONG_LINE`
  characters: a reader sees half of it. Code cells and tables are left alone (they scroll in any rendered notebook).

The browser is Debian's ``chromium`` (``apt-get install chromium``); :func:`find_browser` says where it is, or
None, and the test that calls this module then skips, saying why.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

LONG_LINE = 160  # a printed line longer than this is cut off at the page's edge (../shared readability's measure)
WINDOW = (1400, 1000)  # the window every page is laid out in, in CSS pixels: a laptop's browser
MARKER = "specdec-browser-check"
# runs after load: what a reader would see go wrong, as JSON in a <div id=MARKER>
PROBE = """
<script>
window.addEventListener("load", () => {
  const out = {images: 0, broken: [], wide: [], page: [document.documentElement.scrollWidth, window.innerWidth]};
  for (const img of document.images) {
    out.images += 1;
    if (!img.complete || img.naturalWidth === 0) out.broken.push(img.getAttribute("src"));
  }
  for (const el of document.querySelectorAll(".cell_output pre")) {
    if (el.scrollWidth > el.clientWidth + 2 && el.clientWidth > 0) {
      const text = (el.innerText || "").split("\\n").reduce((a, b) => (b.length > a.length ? b : a), "");
      if (text.length > %d) out.wide.push(text.slice(0, 120));
    }
  }
  const found = document.createElement("div");
  found.id = "%s";
  found.textContent = JSON.stringify(out);
  document.body.appendChild(found);
});
</script>
""" % (LONG_LINE, MARKER)


def find_browser() -> str | None:
    """The path of a Chromium executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def probe(page: Path, browser: str, timeout: float = 60.0) -> dict:
    """Open ``page`` in headless ``browser`` and return what the probe found: ``images`` (count), ``broken``
    (their sources), ``wide`` (the longest line of each text block cut off at its edge) and ``page`` (the
    document's width and the window's)."""
    page = Path(page).resolve()
    html = page.read_text(encoding="utf-8")
    if "</body>" not in html:
        raise ValueError(f"{page}: not an HTML page with a <body>")
    copy = page.with_name(f".{page.stem}.{MARKER}.html")  # beside the page: its relative links still resolve
    copy.write_text(html.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
    try:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--allow-file-access-from-files",
               f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=30000", "--dump-dom", copy.as_uri()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        copy.unlink(missing_ok=True)
    m = re.search(rf'<div id="{MARKER}"[^>]*>(.*?)</div>', done.stdout, re.S)
    if m is None:
        raise RuntimeError(f"{page.name}: the browser returned no findings (exit {done.returncode}): "
                           f"{done.stderr.strip()[-300:]}")
    import html as html_lib

    return json.loads(html_lib.unescape(m.group(1)))


def expected_images(book: Path, stem: str) -> int:
    """Image outputs in the executed notebook behind page ``stem`` (0 when there is none)."""
    nb = Path(book) / "notebooks" / f"{stem}.ipynb"
    if not nb.is_file():
        return 0
    cells = json.loads(nb.read_text()).get("cells", [])
    return sum(any(k.startswith("image/") for k in o.get("data", {})) for c in cells for o in c.get("outputs", []))


def check_page(page: Path, browser: str, book: Path | None = None) -> list[str]:
    """What is wrong with one page, one sentence a problem ([] when nothing is)."""
    found = probe(page, browser)
    problems = [f"{page.name}: broken image {src}" for src in found["broken"]]
    width, window = found["page"]
    if width > window + 2:
        problems.append(f"{page.name}: the page is {width} px wide in a {window} px window")
    problems += [f"{page.name}: a line cut off at the edge: {line!r}" for line in found["wide"]]
    if book is not None:
        want = expected_images(book, page.stem)
        if found["images"] < want:
            problems.append(f"{page.name}: shows {found['images']} images, its notebook has {want} figures")
    return problems


def pages(book: Path) -> list[Path]:
    """The book's pages: its front page, chapters and appendix (not the search page or Sphinx's own)."""
    book = Path(book)
    return [p for p in sorted(book.glob("*.html")) if p.name not in ("search.html", "genindex.html")
            and not p.name.startswith(".")]


def check_book(book, browser: str | None = None) -> list[str]:
    """Every page of the rendered book in ``book`` (its ``index.html`` and chapters) checked; the problems found."""
    book = Path(book)
    if not (book / "index.html").is_file():
        raise FileNotFoundError(f"no rendered book in {book} (render it: python -m specdec_core.tools.render {book})")
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium on this machine (apt-get install chromium)")
    problems = []
    for page in pages(book):
        problems += check_page(page, browser, book)
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("book", help="a rendered book's folder (its index.html)")
    args = ap.parse_args(argv)
    problems = check_book(args.book)
    print("\n".join(problems) if problems else f"{len(pages(Path(args.book)))} pages read clean")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
