"""Execute the book: every ``book/NN_*.py`` notebook, in order, with papermill.

    python scripts/run_book.py --params ci --out build/book-ci          # what `make test` runs
    python scripts/run_book.py --params full --out build/book --html    # what `make reproduce` runs

Parameters come from ``book/params/<name>.yaml``: one section per notebook (keyed by file stem); each
notebook also receives ``out_dir`` (its own folder under ``--out`` for figures and tables). A failing
notebook is named together with the failing cell; the others still run, and the run exits 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
import papermill as pm
import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"


def notebooks(only: list[str] | None) -> list[Path]:
    found = sorted(p for p in BOOK.glob("[0-9][0-9]_*.py"))
    if only:
        found = [p for p in found if any(p.stem.startswith(o) for o in only)]
    return found


def main() -> int:
    os.environ["SPECDEC_PROGRESS"] = "0"  # the kernels inherit it: no progress bars in the saved outputs
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="full", help="book/params/<name>.yaml (full or ci)")
    ap.add_argument("--out", default="build/book", help="folder for executed notebooks, figures, tables")
    ap.add_argument("--only", nargs="*", help="run only notebooks whose name starts with these prefixes")
    ap.add_argument("--html", action="store_true", help="render the executed notebooks as a book, <out>/index.html")
    args = ap.parse_args()

    params_file = BOOK / "params" / f"{args.params}.yaml"
    all_params = yaml.safe_load(params_file.read_text()) or {}
    out = (ROOT / args.out).resolve()
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    executed, failed, timings, t_all = [], [], [], time.perf_counter()
    for src in notebooks(args.only):
        nb = jupytext.read(src)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        raw = out / "notebooks" / f"{src.stem}.input.ipynb"
        done = out / "notebooks" / f"{src.stem}.ipynb"
        nbformat.write(nb, raw)
        params = dict(all_params.get(src.stem) or {})
        params["out_dir"] = str(out / src.stem)
        (out / src.stem).mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        print(f"[book] {src.name} with {params_file.name} ...", flush=True)
        try:
            pm.execute_notebook(str(raw), str(done), parameters=params, cwd=str(BOOK), kernel_name="python3",
                                progress_bar=False)
        except pm.PapermillExecutionError as e:
            print(f"[book] FAILED: {src.name}, cell {e.cell_index} (execution count {e.exec_count}): "
                  f"{e.ename}: {e.evalue}", file=sys.stderr)
            print(f"[book] the executed notebook with the traceback: {done}", file=sys.stderr)
            failed.append(src.name)
            timings.append((src.stem, time.perf_counter() - t, "failed"))
            continue
        finally:
            raw.unlink(missing_ok=True)
        executed.append(done)
        timings.append((src.stem, time.perf_counter() - t, "ok"))
        print(f"[book] {src.name} done in {time.perf_counter() - t:.0f} s", flush=True)
    print(f"[book] {len(executed)} notebooks in {time.perf_counter() - t_all:.0f} s -> {out}")
    (out / "timings.csv").write_text("notebook,seconds,status\n" + "".join(
        f"{name},{sec:.1f},{status}\n" for name, sec, status in timings))
    html_failed = False
    if args.html:  # the executed notebooks, as they are, into a static book at <out>/index.html
        from specdec_core.study.render import BookError, render_book

        t = time.perf_counter()
        try:
            index = render_book(out, executed, params_name=args.params, failed=failed)
            print(f"[book] HTML: {index} (rendered in {time.perf_counter() - t:.0f} s)")
        except BookError as e:
            print(f"[book] HTML FAILED: {e}", file=sys.stderr)
            html_failed = True
    if failed:
        print(f"[book] FAILED notebooks: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or html_failed else 0


if __name__ == "__main__":
    sys.exit(main())
