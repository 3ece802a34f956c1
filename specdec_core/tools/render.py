"""The rendered book: a run's *executed* notebooks as a static HTML book (Sphinx, myst-nb, sphinx-book-theme).

    python scripts/run_book.py --params ci --out build/book --html    # executes, then calls render_book
    python -m specdec_core.tools.render build/book                    # renders an earlier run again

Nothing is executed here: the notebooks of ``<run>/notebooks/`` are read as they are. The book is written
into the run folder itself, beside the notebooks, figures and tables: ``<run>/index.html`` is the front page
(what the book is, the run, its machine, the headline table and figure of chapter 6 read from that run's
files, and the chapters with title, one-line summary and run time), ``<run>/NN_name.html`` a chapter (the
run's parameters on top, prev/next at the bottom), ``<run>/search.html`` the full-text search. Math is
typeset by a MathJax 3 copied into the book (``sphinx-mathjax-offline``): the pages load nothing from the
network. Sphinx works in ``<run>/.site/`` (its sources, doctrees and the book before it is published).

Loud failures (:class:`BookError`) rather than a partial book: a chapter that failed (the stale front page
of an earlier render is removed), a notebook that cannot be read or holds an error output, a headline
chapter without its figure, and every Sphinx warning (a missing image, a broken cross-reference, a
document outside the table of contents). Only MyST's heading-level notice is tolerated (the chapters are
written for Jupyter, where a skipped heading level is harmless).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path

import nbformat

from ..paths import REPO_ROOT
from ..study.bench import paired_ratios
from ..study.report import PREFILL_COUNTED
from .headline import provenance

HEADLINE = "06_speedup"          # the chapter whose files make the front page's headline
HEADLINE_FIGURE = "speedup_by_task.png"
TITLE = "specdec: speculative and parallel decoding, executed"
ABOUT = (
    "Decoding a language model reads every weight to produce one token. **Speculative decoding** lets a cheap "
    "draft guess several tokens and the real model (the *target*) check them all in one pass, and, done right, "
    "the output follows *exactly* the target's distribution. This book measures and proves every claim it "
    "makes on the machine that runs it: the chapters below are the notebooks of `book/`, executed by "
    "`scripts/run_book.py`, with every figure and table as this run produced it. The library they import is "
    "`specdec_core/`; the tests that would fail if the claims were false are in `tests/`.")
# Sphinx warnings that do not make a book wrong: MyST's note on skipped heading levels.
TOLERATED_WARNINGS = ["myst.header"]
# What a render publishes at the top of the run folder (removed before the next publication).
SITE_ENTRIES = ("_static", "_images", "_sources", "searchindex.js", "objects.inv", ".buildinfo", ".buildinfo.bak")


class BookError(RuntimeError):
    """The book cannot be rendered as a whole; the message names what is wrong and where."""


@dataclass
class Chapter:
    stem: str
    path: Path
    nb: nbformat.NotebookNode
    title: str
    summary: str
    seconds: float | None
    params: list[tuple[str, str, bool]] = field(default_factory=list)  # (name, value, set by the params file)


# -- reading a run -----------------------------------------------------------------------------------
def chapter_notebooks(run_dir: Path) -> list[Path]:
    """``<run>/notebooks/NN_name.ipynb``, in order (papermill's ``.input`` copies excluded)."""
    return sorted(p for p in (Path(run_dir) / "notebooks").glob("[0-9][0-9]_*.ipynb")
                  if not p.name.endswith(".input.ipynb"))


def title_of(nb) -> tuple[int, str]:
    """The index of the first Markdown cell with a heading, and that heading's text (a chapter's title)."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            m = re.search(r"^#{1,6}\s+(.+?)\s*#*\s*$", cell.source, re.M)
            if m:
                return i, m.group(1).strip()
    raise BookError("no Markdown heading: a chapter's title is its first heading")


def readme_summaries(readme: Path | None) -> dict[str, str]:
    """The one-line summaries of the README's chapter table (``| `book/NN_name.py` | summary |``)."""
    if readme is None or not Path(readme).is_file():
        return {}
    rows = re.findall(r"^\|\s*`book/(\d\d_\w+)\.py`\s*\|\s*(.+?)\s*\|\s*$", Path(readme).read_text(), re.M)
    return dict(rows)


def first_sentence(nb, title_cell: int) -> str:
    """The chapter's first sentence after its title: the summary where the README has none."""
    text = re.sub(r"^#.*$", "", nb.cells[title_cell].source, flags=re.M).strip()
    para = " ".join(text.split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return (m.group(1) if m else para)[:200]


def check_notebook(stem: str, nb) -> None:
    """A chapter is rendered only as papermill left it after a complete run: no exception, no error output."""
    pm = nb.metadata.get("papermill", {})
    if pm.get("exception"):
        raise BookError(f"{stem}: papermill recorded an exception: the chapter did not run to its end")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                raise BookError(f"{stem}, cell {i}: an error output ({out.get('ename')}: {out.get('evalue')})")


def _values(source: str) -> dict[str, str]:
    """``name = value`` assignments of a parameters cell, each value as its source text."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = " ".join(ast.get_source_segment(source, node.value).split())
    return out


def run_parameters(nb) -> list[tuple[str, str, bool]]:
    """What the chapter ran with: its parameters cell's defaults, overridden by the values papermill injected."""
    defaults = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            defaults.update(_values(cell.source))
    injected = nb.metadata.get("papermill", {}).get("parameters", {}) or {}
    rows = []
    for name in [*defaults, *(k for k in injected if k not in defaults)]:
        if name in injected:
            value = injected[name]   # out_dir, an absolute path, is shown relative to the repository
            rows.append((name, _relative(Path(value)) if name == "out_dir" else repr(value), True))
        else:
            rows.append((name, defaults[name], False))
    return rows


def _link(p: Path, run_dir: Path) -> str:
    """A link from the front page (``<run_dir>/index.html``) to a file of the run, relative to the book's folder:
    a copied or moved book keeps its links (an absolute build path would not)."""
    rel = Path(os.path.relpath(Path(p).resolve(), Path(run_dir).resolve())).as_posix()
    return f'<a href="{rel}"><code>{rel}</code></a>'


def run_origin(run_dir: Path) -> str:
    """The run's commit, machine and dates, from its ``timings.csv`` (``scripts/run_book.py`` writes them)."""
    import pandas as pd

    f = run_dir / "timings.csv"
    if not f.is_file():
        return ""
    commits, machines, dates = provenance(pd.read_csv(f, dtype=str))
    if not (commits or machines or dates):
        return ""
    span = f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else (dates[0] if dates else "")
    return (f"commit `{', '.join(commits) or 'not recorded'}`, on {'; '.join(machines) or 'a machine not recorded'}"
            + (f", {span}" if span else ""))


def _relative(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def read_chapters(notebooks: list[Path], readme: Path | None) -> list[Chapter]:
    summaries = readme_summaries(readme)
    chapters = []
    for path in notebooks:
        stem = path.stem
        try:
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
        except Exception as e:  # noqa: BLE001 - any unreadable notebook stops the book, named
            raise BookError(f"{stem}: not a readable notebook ({type(e).__name__}: {e})") from e
        check_notebook(stem, nb)
        try:
            i, title = title_of(nb)
        except BookError as e:
            raise BookError(f"{stem}: {e}") from None
        seconds = nb.metadata.get("papermill", {}).get("duration")
        chapters.append(Chapter(stem, path, nb, title, summaries.get(stem) or first_sentence(nb, i),
                                seconds, run_parameters(nb)))
    return chapters


def machine() -> dict[str, str]:
    """The machine, as far as the standard library tells it (the book is rendered where it ran)."""
    info = {"CPU": platform.processor() or platform.machine()}
    try:
        names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if names:
            info["CPU"] = names[0].strip()
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info["cores"] = f"{cores} usable of {os.cpu_count()}"
    try:
        kb = int(re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text(), re.M).group(1))
        info["memory"] = f"{kb / 2**20:.0f} GiB"
    except (OSError, AttributeError):
        pass
    info["system"] = platform.platform()
    info["Python"] = platform.python_version()
    for pkg in ("torch", "transformers"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return info


# -- the headline ------------------------------------------------------------------------------------
def headline_table(folder: Path, run_dir: Path | None = None) -> str:
    """Chapter 6's headline as a Markdown table, from the run's ``headline_runs.csv``: each method's paired
    speedup over the autoregressive decoder (median and IQR over calls), α pooled over calls (accepted ÷
    (accepted + rejections)) and τ (new tokens ÷ target passes), per temperature. A run folder with only
    ``summary.csv`` (per task) gives that table instead."""
    import pandas as pd

    runs_csv, summary_csv = folder / "headline_runs.csv", folder / "summary.csv"
    if runs_csv.is_file():

        runs = pd.read_csv(runs_csv)
        temps = sorted(runs.temperature.unique())
        cols, rows = ["method"], {}
        for t in temps:
            label = "greedy" if t == 0 else f"temperature {t:g}"
            cols += [label, "α", "τ"]
            r = runs[runs.temperature == t]
            rat = paired_ratios(r, "autoregressive").set_index("runner")
            for name in [n for n in pd.unique(r.runner) if n in rat.index]:   # the chapter's order
                g = r[r.runner == name]
                cells = [f"{rat.loc[name, 'median']:.2f}× ({rat.loc[name, 'q25']:.2f}–{rat.loc[name, 'q75']:.2f})"]
                if {"accepted", "rejections"} <= set(g) and g.accepted.notna().any():
                    acc, rej = g.accepted.sum(), g.rejections.sum()
                    cells.append(f"{acc / max(1, acc + rej):.2f}")
                    cells.append(f"{g.new_tokens.sum() / g.target_passes.sum():.2f}"
                                 if "target_passes" in g and g.target_passes.sum() > 0 else "")
                else:
                    cells += ["", ""]
                rows.setdefault(name, {})[t] = cells
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for name, per_t in rows.items():
            cells = [c for t in temps for c in per_t.get(t, ["", "", ""])]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        n = int(runs[runs.runner == "autoregressive"].shape[0] / max(1, len(temps)))
        caption = (f"Tokens/s ÷ the autoregressive decoder's on the same prompt and repeat: median (IQR) over "
                   f"{n} paired calls per temperature; α and τ pooled over the calls; {PREFILL_COUNTED} "
                   f"({_link(runs_csv, run_dir or folder.parent)}).")
        return caption + "\n\n" + "\n".join(lines)
    if summary_csv.is_file():
        s = pd.read_csv(summary_csv)
        s = s[s.temperature == s.temperature.min()]
        p = s.pivot_table(index="task", columns="method", values="speedup")
        lines = ["| task | " + " | ".join(p.columns) + " |", "|" + "---|" * (len(p.columns) + 1)]
        lines += [f"| {task} | " + " | ".join(f"{v:.2f}×" for v in row) + " |" for task, row in p.iterrows()]
        return (f"Median paired speedup over the autoregressive decoder per task, greedy "
                f"({_link(summary_csv, run_dir or folder.parent)}).\n\n" + "\n".join(lines))
    raise BookError(f"{HEADLINE} ran but wrote neither headline_runs.csv nor summary.csv in {folder}")


def theory_sentence(folder: Path, run_dir: Path | None = None) -> str:
    f = folder / "theory_check.csv"
    if not f.is_file():
        return ""
    import pandas as pd

    rows = pd.read_csv(f)
    parts = [f"{r.runner}, K = {r.k}: predicted **{r.predicted_median:.3f}×**, measured **{r.measured_median:.3f}×** "
             f"({100 * r.rel_error:.1f}% apart; c = {r.c:.3f}, verify pass = {r.verify_ratio:.2f} one-token passes)"
             for r in rows.itertuples()]
    return ("Leviathan et al.'s Theorem 3.8 against the measured decode loop, each call predicted from its own α̂ "
            "(median over calls): " + "; ".join(parts) + f" ({_link(f, run_dir or folder.parent)}).")


# -- writing the Sphinx project ---------------------------------------------------------------------
def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def run_cell(ch: Chapter, params_name: str | None) -> nbformat.NotebookNode:
    """The Markdown cell put under a chapter's title: how it ran, and every parameter it ran with."""
    pm = ch.nb.metadata.get("papermill", {})
    when = pm.get("end_time", "")[:16].replace("T", " ")
    source = f"`book/params/{params_name}.yaml`" if params_name else "the run's parameter file"
    changed = [f"`{n} = {_md_escape(v)}`" for n, v, set_ in ch.params if set_ and n != "out_dir"]
    lines = ["```{admonition} This run", ":class: note",
             f"Executed{f' in {ch.seconds:.0f} s' if ch.seconds is not None else ''}"
             f"{f', finished {when} (UTC)' if when else ''}, with {source}"
             + (": " + ", ".join(changed) + "." if changed else " (no parameter changed)."),
             "", "<details><summary>All parameters of this run</summary>", "",
             "| parameter | value | set by |", "|---|---|---|"]
    for n, v, set_ in ch.params:
        lines.append(f"| `{n}` | `{_md_escape(v)}` | {'the run' if set_ else 'chapter default'} |")
    lines += ["", "</details>", "```"]
    return nbformat.v4.new_markdown_cell("\n".join(lines))


CHAPTER_LINK = re.compile(r"\[([^\]]+)\]\((\d\d_[\w]+)\.ipynb\)")


def unlink_absent(nb: nbformat.NotebookNode, present: set[str]) -> nbformat.NotebookNode:
    """Links in markdown cells to chapters that are not in this run (a run of some chapters, a pair that leaves one
    out) become their plain text: a page links only to pages the book has. Links to present chapters stay."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = CHAPTER_LINK.sub(lambda m: m.group(0) if m.group(2) in present else m.group(1), cell.source)
    return nb


def stage_notebook(ch: Chapter, params_name: str | None) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(json.loads(json.dumps(ch.nb)))  # a copy: the run's notebook stays as it is
    i, _ = title_of(nb)
    for cell in nb.cells:  # papermill's injected cell: its values are in the table above
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.metadata["tags"] = [*cell.metadata["tags"], "remove-cell"]
    nb.cells.insert(i + 1, run_cell(ch, params_name))
    return nb


def pair_rows(chapters: list[Chapter]) -> dict[str, str]:
    """The pair and device the chapters ran with, from their own parameters (injected or default): target, draft,
    dtype, device; several values where chapters differ (chapter 2 decodes a toy pair of its own)."""
    names = {"model": "target", "draft": "draft", "dtype": "dtype", "device": "device"}
    rows = {}
    for name, label in names.items():
        values = sorted({v.strip("'\"") for c in chapters for n, v, _ in c.params if n == name})
        if values:
            shown = ["the shipped drafts" if name == "draft" and v == "None" else v for v in values]
            rows[f"{label} (the chapters' parameter)"] = ", ".join(shown)
    return rows


def front_page(chapters: list[Chapter], run_dir: Path, params_name: str | None, src: Path,
               info: dict[str, str], skipped: dict[str, str] | None = None) -> str:
    """index.md: what the book is, chapter 6's headline (table, figure, theory check), the chapters (title,
    one-line summary, run time) and the run with its machine."""
    out = [f"# {TITLE}", "", ABOUT, "", "## The headline", ""]
    head = next((c for c in chapters if c.stem == HEADLINE), None)
    if head is None:
        out += [f"Chapter `{HEADLINE}` was not part of this run: no headline."]
    else:
        folder = run_dir / HEADLINE
        fig = folder / HEADLINE_FIGURE
        if not fig.is_file():
            raise BookError(f"{HEADLINE} ran but its figure {fig} is missing")
        (src / "_run").mkdir(exist_ok=True)
        shutil.copy2(fig, src / "_run" / fig.name)
        out += [f"Every method against our autoregressive decoder, as this run measured it in {{doc}}`{HEADLINE}`.",
                "", headline_table(folder, run_dir), "",
                f"```{{figure}} _run/{fig.name}", ":alt: speedup over autoregressive decoding per task",
                ":width: 100%", "", f"Paired speedup per task and temperature ({_link(fig, run_dir)}).", "```"]
        theory = theory_sentence(folder, run_dir)
        if theory:
            out += ["", theory]
    out += ["", "## Chapters", "", "| chapter | what it measures or proves | run time |", "|---|---|---|"]
    for c in chapters:
        t = f"{c.seconds:.0f} s" if c.seconds is not None else ""
        out.append(f"| {{doc}}`{c.stem}` | {_md_escape(c.summary)} | {t} |")
    if skipped:
        out += ["", "Not run for this pair: " + "; ".join(f"`{stem}` ({why})" for stem, why in sorted(skipped.items()))
                + "."]
    total = sum(c.seconds or 0 for c in chapters)
    ends = [c.nb.metadata.get("papermill", {}).get("end_time", "") for c in chapters]
    when = max(ends)[:16].replace("T", " ") if any(ends) else datetime.now().strftime("%Y-%m-%d %H:%M")
    params = f"`book/params/{params_name}.yaml`" if params_name else "its parameter file"
    out += ["", "## This run", "",
            f"{len(chapters)} chapters executed with {params} in {total / 60:.1f} min of notebook time, "
            f"finished {when} (UTC), into this book's folder (`{_relative(run_dir)}/`; executed notebooks in "
            "`notebooks/`, each chapter's figures and tables in a folder of its name)"
            + (f"; from {origin}" if (origin := run_origin(run_dir)) else "")
            + f" ({_link(run_dir / 'timings.csv', run_dir)}). The machine:", "",
            "| machine | |", "|---|---|"]
    info = {**pair_rows(chapters), **info}
    out += [f"| {k} | {_md_escape(v)} |" for k, v in info.items()]
    out += ["", "```{toctree}", ":hidden:", ":maxdepth: 1", "", *[c.stem for c in chapters], "```", ""]
    return "\n".join(out)


# -- the appendix: Markdown pages of book/ after the chapters ---------------------------------------
APPENDIX = ("notation.md", "solutions.md")  # pages of the repository's book/ (MyST), in order, after the last chapter


def with_appendix(index_md: str, src: Path, folder: Path | None) -> str:
    """Stage the :data:`APPENDIX` pages of ``folder`` that exist (None: none) into the Sphinx sources ``src`` and
    return ``index_md`` with them: an "Appendix" list (each page by its title) before the front page's "This run"
    section (else at its end), and a table of contents after the chapters' own, so the pages follow the last
    chapter in the sidebar and in prev/next. A page must build without warnings on its own: it cannot link to a
    chapter the run may lack."""
    pages = [Path(folder) / name for name in APPENDIX if folder is not None and (Path(folder) / name).is_file()]
    if not pages:
        return index_md
    for page in pages:
        shutil.copy2(page, src / page.name)
    listed = "\n".join(f"- {{doc}}`{p.stem}`" for p in pages)
    section = f"## Appendix\n\n{listed}\n\n"
    marker = "\n## This run\n"
    index_md = index_md.replace(marker, f"\n{section}## This run\n", 1) if marker in index_md \
        else f"{index_md.rstrip()}\n\n{section}"
    toc = ["```{toctree}", ":hidden:", ":maxdepth: 1", ":caption: Appendix", "", *(p.stem for p in pages), "```"]
    return index_md.rstrip() + "\n\n" + "\n".join(toc) + "\n"


CONF = '''\
# Written by specdec_core/tools/render.py for one render; edit that module, not this file.
project = "specdec"
author = "the specdec authors"
html_show_copyright = False
extensions = ["myst_nb", "sphinx-mathjax-offline"]   # MathJax 3, copied into the book: no CDN
nb_execution_mode = "off"                            # the run executed the notebooks; nothing runs here
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_dmath_double_inline = True
suppress_warnings = {suppress!r}
exclude_patterns = ["jupyter_execute", "**.ipynb_checkpoints"]
html_theme = "sphinx_book_theme"
html_title = {title!r}
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {{
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "navigation_with_keys": True,
}}
'''


def sphinx_build(src: Path, html: Path, doctrees: Path) -> float:
    """Build ``src`` into ``html``; every warning is an error (all reported, then the build fails)."""
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", "-E",
           "-d", str(doctrees), str(src), str(html)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=src)
    if r.returncode != 0:
        raise BookError("the HTML build failed; Sphinx said (about the copies staged in " f"{src}, where a "
                        "chapter's cell numbers count one more cell, the added 'This run' note):\n"
                        + (r.stderr or r.stdout).strip())
    return time.perf_counter() - t


def publish(html: Path, run_dir: Path) -> None:
    """Replace the previous book in ``run_dir`` with the one just built in ``html``."""
    for name in SITE_ENTRIES:
        p = run_dir / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    for p in run_dir.glob("*.html"):
        p.unlink()
    old = run_dir / "html"   # the single-page-per-notebook render this module replaced
    if old.is_dir() and all(f.suffix == ".html" for f in old.iterdir()):
        shutil.rmtree(old)
    shutil.copytree(html, run_dir, dirs_exist_ok=True)


def render_book(run_dir: Path | str, notebooks: list[Path] | None = None, *, params_name: str | None = None,
                failed: list[str] | tuple = (), readme: Path | None = REPO_ROOT / "README.md",
                info: dict[str, str] | None = None, skipped: dict[str, str] | None = None) -> Path:
    """Render the executed ``notebooks`` (default: every chapter in ``<run_dir>/notebooks/``) into a book at
    ``<run_dir>/index.html``; returns that path. ``failed``: chapters that did not run: the book is then not
    rendered rather than rendered without them. ``params_name``: the parameter file's name the run used
    (``ci``, ``full``), shown on every page. ``info``: the machine's description (default :func:`machine`).
    ``skipped``: chapters the run left out for its pair, with the reason (named on the front page).
    Raises :class:`BookError`; the front page of an earlier render is then removed, so that no book in
    ``run_dir`` passes for this run's."""
    run_dir = Path(run_dir).resolve()
    try:
        if failed:
            raise BookError(f"not rendered: {len(failed)} chapter(s) failed ({', '.join(failed)})")
        return _render(run_dir, notebooks, params_name, readme, info, skipped or {})
    except BookError as e:
        stale = run_dir / "index.html"
        if stale.is_file():
            stale.unlink()
            raise BookError(f"{e}\n(removed the previous render's front page {stale})") from None
        raise


def _render(run_dir: Path, notebooks, params_name, readme, info, skipped: dict[str, str]) -> Path:
    notebooks = chapter_notebooks(run_dir) if notebooks is None else [Path(p) for p in notebooks]
    if not notebooks:
        raise BookError(f"no executed notebooks in {run_dir / 'notebooks'}")
    chapters = read_chapters(notebooks, readme)
    site = run_dir / ".site"
    src, html = site / "src", site / "html"
    for d in (src, html, site / "jupyter_execute"):
        shutil.rmtree(d, ignore_errors=True)
    src.mkdir(parents=True)
    present = {ch.stem for ch in chapters}
    for ch in chapters:
        nbformat.write(unlink_absent(stage_notebook(ch, params_name), present), src / f"{ch.stem}.ipynb")
    index_md = front_page(chapters, run_dir, params_name, src, info or machine(), skipped)
    # the appendix: the pages of book/ beside the README the summaries come from (no README, no appendix)
    appendix = Path(readme).parent / "book" if readme is not None else None
    (src / "index.md").write_text(with_appendix(index_md, src, appendix), encoding="utf-8")
    (src / "conf.py").write_text(CONF.format(suppress=TOLERATED_WARNINGS, title=TITLE), encoding="utf-8")
    sphinx_build(src, html, site / "doctrees")
    missing = [p for p in ["index.html", "search.html", "searchindex.js", *(f"{c.stem}.html" for c in chapters)]
               if not (html / p).is_file()]
    if missing:
        raise BookError(f"the HTML build left out {missing}")
    publish(html, run_dir)
    shutil.rmtree(html)   # published; .site/src keeps what it was built from
    return run_dir / "index.html"


def reference_info(timings: Path) -> dict[str, str]:
    """The front page's description of a committed run, read from its ``timings.csv`` (commit, machine and date of
    each chapter's row) rather than from the machine that renders it."""
    import csv

    with open(timings, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "commit" not in rows[0]:
        raise BookError(f"{timings}: no commit, machine and date per chapter: not a reference run's timings")
    def one(key):
        return ", ".join(sorted({r[key] for r in rows if r.get(key)})) or "not recorded"
    return {"run": f"the reference run of commit {one('commit')}", "machine": one("machine"), "date": one("date")}


def render_reference(ref: Path | str = REPO_ROOT / "data" / "reference" / "book",
                     dest: Path | str = REPO_ROOT / "build" / "book-reference") -> Path:
    """The committed reference run (its executed chapters, ``<ref>/notebooks/``, and its tables and figures) copied to
    ``dest`` and rendered there, nothing executed: a book to read on a fresh clone (`make book`). The front page
    names the run (:func:`reference_info`), not the machine that renders it."""
    ref, dest = Path(ref), Path(dest)
    if not any((ref / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        raise BookError(f"no executed chapters in {ref / 'notebooks'}: `make reproduce` then "
                        "`scripts/collect_reference.py` commit them; `make reproduce PARAMS=ci` renders a small run")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ref, dest)
    return render_book(dest, params_name="full", info=reference_info(ref / "timings.csv"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", help="a run folder of scripts/run_book.py (holds notebooks/)")
    ap.add_argument("--params", default=None, help="the parameter file the run used (ci, full), for the pages")
    ap.add_argument("--reference", action="store_true",
                    help="render the committed reference run into build/book-reference/ (make book)")
    args = ap.parse_args(argv)
    if not args.reference and not args.run_dir:
        ap.error("give a run folder, or --reference")
    t = time.perf_counter()
    try:
        index = render_reference() if args.reference else render_book(args.run_dir, params_name=args.params)
    except BookError as e:
        print(f"[book] HTML: {e}", file=sys.stderr)
        return 1
    print(f"[book] HTML: {index} ({time.perf_counter() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
