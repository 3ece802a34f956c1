"""Execute the book: every ``book/NN_*.py`` notebook, in order, with papermill.

    python scripts/run_book.py --params ci --out build/book-ci --jobs 2   # what `make test` runs
    python scripts/run_book.py --params full --out build/book --html      # what `make reproduce` runs

``<out>/timings.csv`` records each notebook's seconds and status with the run's commit (``+changes`` when the
working tree differs from it), machine and date: ``scripts/collect_reference.py`` keeps a reference whose rows
all come from one run.

Parameters come from ``book/params/<name>.yaml``: one section per notebook (keyed by file stem); each
notebook also receives ``out_dir`` (its own folder under ``--out`` for figures and tables) and, if its parameters
cell has one, ``params_name`` (the file's name, for the banner the chapter opens with). A failing
notebook is named together with the failing cell; the others still run, and the run exits 1.

``--jobs N`` runs N notebooks at a time, longest first (by the last run's ``timings.csv`` in ``--out``, else the
reference run's), each kernel on cores/N torch threads. Chapters time themselves, and chapters that share the
cores time each other's load: that is for a check that the book runs (CI), never for numbers a reader is shown,
so ``--html`` and ``--params full`` refuse it. Chapters named by ``--alone`` (those whose asserts are about the
machine's own speed, like chapter 1's roofline) run after the others, one at a time on every core.

A pair of one's own (``make reproduce TARGET=… DRAFT=… DEVICE=… DTYPE=…``, or ``PAIR=<file.yaml>`` holding the
same keys in lower case): ``--target``, ``--draft``, ``--device``, ``--dtype`` and ``--pair`` reach every chapter
whose parameters cell has the matching name (``model``, ``draft``, ``device``, ``dtype``), and a chapter that loads
the pair (a ``model`` parameter) without the parameter for a given setting is refused before any runs; without
``--out`` the run's folder is named after the pair and device (``<build>/book-<target>+<draft>-<device>-<dtype>``,
``<build>`` being ``--build``, ``build`` by default: make's ``BUILD``), so runs of different pairs never overwrite
each other.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
REFERENCE_TIMINGS = ROOT / "data" / "reference" / "book" / "timings.csv"


TIMINGS_HEADER = "notebook,seconds,status,commit,machine,date"
OLD_TIMINGS_HEADER = "notebook,seconds,status"  # before runs recorded where they ran: read, never written


class Timing(NamedTuple):
    """One notebook's row of ``timings.csv``: seconds, status, and the run it came from (commit, machine, date)."""
    seconds: float
    status: str
    commit: str = ""
    machine: str = ""
    date: str = ""


class Result(NamedTuple):
    """One notebook's run: its stem, seconds, "ok" or "failed", and the line that reports it."""
    stem: str
    seconds: float
    status: str
    message: str


def named(stem: str, prefixes) -> bool:
    """Whether a notebook's stem starts with one of ``prefixes`` (``--only``, ``--alone``)."""
    return any(stem.startswith(p) for p in prefixes)


def notebooks(only: list[str] | None) -> list[Path]:
    found = sorted(p for p in BOOK.glob("[0-9][0-9]_*.py"))
    return [p for p in found if named(p.stem, only)] if only else found


def read_timings(path: Path) -> dict[str, Timing]:
    """A ``timings.csv`` this script wrote: notebook -> :class:`Timing`; any other file is refused by name."""
    header, *lines = path.read_text().splitlines()
    if header not in (TIMINGS_HEADER, OLD_TIMINGS_HEADER):
        raise ValueError(f"{path}: unexpected timings header {header!r} (run_book.py writes {TIMINGS_HEADER})")
    rows = {}
    for line in filter(None, lines):
        stem, seconds, status, *where = next(csv.reader([line]))
        rows[stem] = Timing(float(seconds), status, *where)
    return rows


def write_timings(path: Path, rows: dict[str, Timing]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(TIMINGS_HEADER.split(","))
        for stem, t in sorted(rows.items()):
            w.writerow([stem, f"{t.seconds:.1f}", t.status, t.commit, t.machine, t.date])


def git_commit() -> str:
    """The commit the book runs from (short hash), ``+changes`` when tracked files differ from it; "" outside git."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        return head + ("+changes" if head and git("status", "--porcelain", "--untracked-files=no") else "")
    except OSError:
        return ""


def machine_name() -> str:
    """The CPU model and the cores this process may use, e.g. ``AMD EPYC 7B13, 2 cores``."""
    cpu = platform.processor() or platform.machine()
    try:
        found = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = found[0].strip() if found else cpu
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores"


def longest_first(srcs: list[Path], out: Path, reference: Path = REFERENCE_TIMINGS) -> list[Path]:
    """``srcs`` by their last recorded time, longest first: this run's earlier ``timings.csv`` where there is one
    (the same parameters), else the ``reference`` run's (full size, but the order is what matters); unknown last."""
    seconds = {stem: sec for path in (reference, out / "timings.csv") if path.exists()  # the run's own times win
               for stem, (sec, *_) in read_timings(path).items()}
    return sorted(srcs, key=lambda p: -seconds.get(p.stem, -1.0))


PAIR_KEYS = {"target": "model", "draft": "draft", "device": "device", "dtype": "dtype"}  # setting -> parameter
DTYPES = ("float32", "bfloat16", "float16", "float64")
DEVICES = ("cpu", "cuda", "auto", "mps")


def pair_settings(pair_file: str | None, **given) -> dict[str, str]:
    """The pair a run is pointed at: ``pair_file``'s keys (target, draft, device, dtype), then the flags given
    (non-empty ones win). Unknown keys, devices and dtypes are refused by name, before any chapter runs."""
    settings: dict[str, str] = {}
    if pair_file:
        path = Path(pair_file)
        if not path.is_file():
            raise ValueError(f"pair file {pair_file} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict) or set(loaded) - set(PAIR_KEYS):
            raise ValueError(f"pair file {pair_file}: keys must be among {sorted(PAIR_KEYS)}, got "
                             f"{sorted(loaded) if isinstance(loaded, dict) else type(loaded).__name__}")
        settings.update({k: str(v) for k, v in loaded.items() if v is not None})
    settings.update({k: str(v) for k, v in given.items() if v})
    for key in ("target", "draft"):  # chapters run in book/: a folder given relative to here must still be found
        if key in settings and Path(settings[key]).expanduser().exists():
            settings[key] = str(Path(settings[key]).expanduser().resolve())
    if settings.get("dtype", "float32") not in DTYPES:
        raise ValueError(f"dtype {settings['dtype']!r}: use one of {DTYPES}")
    if settings.get("device", "cpu").split(":")[0] not in DEVICES:
        raise ValueError(f"device {settings['device']!r}: use one of {DEVICES} (or cuda:N)")
    return settings


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "-" for c in text.rstrip("/").split("/")[-1].lower())


def pair_folder(settings: dict[str, str], build: str = "build") -> str:
    """The run folder for a pair, in ``build``: ``<build>/book`` for the book's own pair, else named after the pair
    and device."""
    if not settings:
        return f"{build}/book"
    target, draft = settings.get("target", "smollm2-135m"), settings.get("draft", "none")
    return (f"{build}/book-{_slug(target)}+{_slug(draft)}-{_slug(settings.get('device', 'cpu'))}-"
            f"{settings.get('dtype', 'float32')}")


def chapter_parameters(src: Path) -> set[str]:
    """The names a chapter's parameters cell defines (what papermill can inject without a warning)."""
    import jupytext
    from papermill.translators import PythonTranslator

    cell = next((c for c in jupytext.read(src).cells if "parameters" in c.metadata.get("tags", [])), None)
    return set() if cell is None else {p.name for p in PythonTranslator.inspect(cell)}


def pair_parameters(settings: dict[str, str], names: set[str]) -> dict:
    """A chapter's share of the pair settings: each one whose parameter the chapter has (``draft: none``: no
    model draft beyond the target's own defaults, ``None``)."""
    out = {}
    for key, value in settings.items():
        name = PAIR_KEYS[key]
        if name in names:
            out[name] = None if key == "draft" and value.lower() == "none" else value
    return out


def unrunnable_for(settings: dict[str, str], names: set[str]) -> str | None:
    """Why a chapter cannot run on a pair of one's own, or None: a chapter with a ``block`` parameter studies the
    block draft, which only the embedded target ships (``data/drafts/smollm2-135m-block``, ``scripts/train_block.py``)."""
    if settings.get("target") and "block" in names:
        return "it studies the block draft, which only the embedded target ships (data/drafts/smollm2-135m-block)"
    return None


def unhonoured(settings: dict[str, str], names: set[str]) -> list[str]:
    """The settings among target, device and dtype that a chapter loading the pair (it has a ``model`` parameter)
    has no parameter for: it would run with its own value (float32, say) in a folder named after the run's
    (``…-bfloat16``). A draft is the business of the chapters that take a ``draft``."""
    return [key for key in ("target", "device", "dtype") if key in settings and PAIR_KEYS[key] not in names] \
        if "model" in names else []


def run_one(src: Path, out: Path, params: dict, params_name: str) -> Result:
    """Execute one notebook into ``out/notebooks``."""
    import jupytext
    import nbformat
    import papermill as pm

    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    raw = out / "notebooks" / f"{src.stem}.input.ipynb"
    done = out / "notebooks" / f"{src.stem}.ipynb"
    nbformat.write(nb, raw)
    (out / src.stem).mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    print(f"[book] {src.name} with {params_name} ...", flush=True)
    try:
        # the last cell has written every file by the time it returns: the kernel is stopped at once, not
        # left to tear its interpreter down (2-3 s of freeing a loaded model, per chapter)
        pm.execute_notebook(str(raw), str(done), parameters=params, cwd=str(BOOK), kernel_name="python3",
                            progress_bar=False, shutdown_kernel="immediate")
    except pm.PapermillExecutionError as e:
        return Result(src.stem, time.perf_counter() - t, "failed",
                      f"[book] FAILED: {src.name}, cell {e.cell_index} (execution count {e.exec_count}): "
                      f"{e.ename}: {e.evalue}\n[book] the executed notebook with the traceback: {done}")
    finally:
        raw.unlink(missing_ok=True)
    sec = time.perf_counter() - t
    hide_injected(done)
    return Result(src.stem, sec, "ok", f"[book] {src.name} done in {sec:.0f} s")


def hide_injected(path: Path) -> None:
    """Papermill's injected-parameters cell out of the rendered book (``remove-input``): the chapter's own parameters
    cell stays on show, and each page's "This run" note lists every parameter the run used."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-input" not in tags:
            cell.metadata["tags"] = [*tags, "remove-input"]
    nbformat.write(nb, path)


def _kernel_threads(jobs: int) -> None:
    """A pool worker: its kernels inherit an even share of the cores (torch reads these when it starts)."""
    share = str(max(1, (os.cpu_count() or 1) // jobs))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = share


def main() -> int:
    os.environ["SPECDEC_PROGRESS"] = "0"  # the kernels inherit it: no progress bars in the saved outputs
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="full", help="book/params/<name>.yaml (full or ci)")
    ap.add_argument("--out", help="folder for executed notebooks, figures, tables (default: <build>/book, or a folder "
                                  "named after the pair when one is given, in <build>)")
    ap.add_argument("--build", default="build",
                    help="without --out, the folder the run's folder is made in (default: build; make's BUILD)")
    ap.add_argument("--only", nargs="*", help="run only notebooks whose name starts with these prefixes")
    ap.add_argument("--html", action="store_true", help="render the executed notebooks as a book, <out>/index.html")
    ap.add_argument("--jobs", type=int, default=1,
                    help="notebooks run at a time (default 1); more only to check that the book runs, see above")
    ap.add_argument("--target", help="the target: an embedded name, a Hugging Face id or a folder (default: the book's)")
    ap.add_argument("--draft", help="a draft model's Hugging Face id or folder, or 'none' (default: the book's drafts)")
    ap.add_argument("--device", help=f"one of {DEVICES} or cuda:N (default: each chapter's, cpu)")
    ap.add_argument("--dtype", help=f"one of {DTYPES} (default: each chapter's, float32)")
    ap.add_argument("--pair", help="a YAML file with keys target, draft, device, dtype (flags given win)")
    ap.add_argument("--alone", nargs="*", default=[],
                    help="with --jobs: notebooks (name prefixes) that run after the others, one at a time, on every core")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.jobs > 1 and (args.html or args.params == "full"):
        ap.error(f"--jobs {args.jobs} shares the cores between chapters that time themselves: their numbers would "
                 "be each other's load; the full book and the rendered book run one chapter at a time")

    try:
        pair = pair_settings(args.pair, target=args.target, draft=args.draft, device=args.device, dtype=args.dtype)
    except ValueError as e:
        ap.error(str(e))
    params_file = BOOK / "params" / f"{args.params}.yaml"
    all_params = yaml.safe_load(params_file.read_text()) or {}
    out = (ROOT / (args.out or pair_folder(pair, args.build))).resolve()
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    srcs = notebooks(args.only)
    if args.jobs > 1:
        srcs = longest_first(srcs, out)
    skipped: dict[str, str] = {}
    if pair:
        print(f"[book] pair: {', '.join(f'{k} {v}' for k, v in pair.items())} -> {out}", flush=True)
        for src in list(srcs):
            why = unrunnable_for(pair, chapter_parameters(src))
            if why:
                srcs.remove(src)
                skipped[src.stem] = why
                print(f"[book] skipped {src.name} for this pair: {why}", flush=True)
            elif missing := unhonoured(pair, chapter_parameters(src)):
                ap.error(f"{src.name} loads the pair but has no parameter for {', '.join(missing)}: it cannot honour "
                         "this setting (add the parameter to its parameters cell and pass it to book.setup)")
    def parameters(src: Path) -> dict:  # the file's section, the pair's settings, the run folder, the file's name
        names = chapter_parameters(src)
        return dict(all_params.get(src.stem) or {}, **(pair_parameters(pair, names) if pair else {}),
                    out_dir=str(out / src.stem), **({"params_name": args.params} if "params_name" in names else {}))

    jobs = [(src, out, parameters(src), params_file.name) for src in srcs]
    t_all, results = time.perf_counter(), []
    commit, host = git_commit(), machine_name()
    ended: dict[str, str] = {}

    def report(r: Result):
        results.append(r)
        ended[r.stem] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        print(r.message, file=sys.stderr if r.status == "failed" else sys.stdout, flush=True)

    def on_every_core(job) -> bool:  # serial runs, and the chapters named by --alone
        return args.jobs == 1 or named(job[0].stem, args.alone)

    alone = [j for j in jobs if on_every_core(j)]
    shared = [j for j in jobs if not on_every_core(j)]
    if shared:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        print(f"[book] {len(shared)} notebooks, {args.jobs} at a time: {', '.join(j[0].stem for j in shared)}"
              + (f"; then alone: {', '.join(j[0].stem for j in alone)}" if alone else ""), flush=True)
        with ProcessPoolExecutor(args.jobs, initializer=_kernel_threads, initargs=(args.jobs,)) as pool:
            for fut in as_completed([pool.submit(run_one, *job) for job in shared]):
                report(fut.result())
    for job in alone:
        report(run_one(*job))
    results.sort()
    executed = [out / "notebooks" / f"{r.stem}.ipynb" for r in results if r.status == "ok"]
    failed = [f"{r.stem}.py" for r in results if r.status == "failed"]
    print(f"[book] {len(executed)} notebooks in {time.perf_counter() - t_all:.0f} s -> {out}")
    write_timings(out / "timings.csv", {r.stem: Timing(r.seconds, r.status, commit, host, ended[r.stem]) for r in results}
                  | {stem: Timing(0.0, "skipped", commit, host, "") for stem in skipped})
    html_failed = False
    if args.html:  # the executed notebooks, as they are, into a static book at <out>/index.html
        from specdec_core.tools.render import BookError, render_book

        t = time.perf_counter()
        try:
            index = render_book(out, executed, params_name=args.params, failed=failed, skipped=skipped)
            print(f"[book] HTML: {index} (rendered in {time.perf_counter() - t:.0f} s)")
        except BookError as e:
            print(f"[book] HTML FAILED: {e}", file=sys.stderr)
            html_failed = True
    if failed:
        print(f"[book] FAILED notebooks: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or html_failed else 0


if __name__ == "__main__":
    sys.exit(main())
