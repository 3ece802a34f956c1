"""``scripts/collect_reference.py``: a reference is one whole run of one commit on one machine; ``--partial``
merges a run of some chapters; the README's results block is written from the copied tables."""
from __future__ import annotations

import subprocess
import sys

from specdec_core.paths import REPO_ROOT

HEADER = "notebook,seconds,status,commit,machine,date\n"
STEMS = sorted(p.stem for p in (REPO_ROOT / "book").glob("[0-9][0-9]_*.py"))


def collect(build, dest, *extra, readme=""):
    return subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "collect_reference.py"), "--build", str(build),
                           "--dest", str(dest), "--readme", str(readme), *extra], capture_output=True, text=True)


def whole_run(commit="abc123", machine="AMD EPYC, 2 cores", odd=None) -> str:
    rows = [f"{s},10.0,ok,{commit if s != odd else 'def456'},\"{machine}\",2026-12-03 10:00 UTC\n" for s in STEMS]
    return HEADER + "".join(rows)


def test_a_partial_run_updates_its_chapters_timings_and_keeps_the_others(tmp_path):
    build, dest = tmp_path / "build", tmp_path / "ref"
    (build / "03_linear").mkdir(parents=True)
    dest.mkdir()
    (dest / "timings.csv").write_text("notebook,seconds,status\n00_quickstart,39.1,ok\n03_linear,425.0,ok\n")
    (build / "timings.csv").write_text(HEADER + "03_linear,907.7,ok,abc,m,d\n05_parallel,710.5,ok,abc,m,d\n")
    (build / "03_linear" / "pass_costs.csv").write_text("K,verify_ratio\n1,0.9\n")
    refused = collect(build, dest)  # without --partial: not a reference
    assert refused.returncode == 1 and "chapters not in this run" in refused.stderr
    assert (dest / "timings.csv").read_text().startswith("notebook,seconds,status\n00_quickstart")  # untouched
    proc = collect(build, dest, "--partial")
    assert proc.returncode == 0, proc.stderr
    assert (dest / "timings.csv").read_text().splitlines() == [
        HEADER.strip(), "00_quickstart,39.1,ok,,,", "03_linear,907.7,ok,abc,m,d", "05_parallel,710.5,ok,abc,m,d"]
    assert "00_quickstart kept" in proc.stdout
    assert (dest / "03_linear" / "pass_costs.csv").read_text() == "K,verify_ratio\n1,0.9\n"


def test_a_reference_is_one_run_of_one_commit(tmp_path):
    build, dest = tmp_path / "build", tmp_path / "ref"
    build.mkdir()
    for text, why in [(whole_run(odd=STEMS[1]), "commit(s)"), (whole_run(commit="abc+changes"), "uncommitted"),
                      (whole_run().replace(f"{STEMS[2]},10.0,ok", f"{STEMS[2]},10.0,failed"), "did not finish")]:
        (build / "timings.csv").write_text(text)
        proc = collect(build, dest)
        assert proc.returncode == 1 and why in proc.stderr, (why, proc.stderr)
    (build / "timings.csv").write_text(whole_run())
    proc = collect(build, dest)
    assert proc.returncode == 0, proc.stderr
    assert (dest / "timings.csv").read_text() == whole_run()


def test_the_readme_block_is_written_from_the_run(tmp_path):
    build, dest, readme = tmp_path / "build", tmp_path / "ref", tmp_path / "README.md"
    (build / "06_speedup").mkdir(parents=True)
    (build / "timings.csv").write_text(whole_run())
    (build / "06_speedup" / "overall.csv").write_text(
        "runner,median,q25,q75,n,temperature,p,power,n_tell\nlinear (n-gram),1.17,1.08,1.30,12,0.0,0.001,0.9,8\n"
        "hf generate,0.98,0.96,1.04,3,0.0,0.75,0.0,9\n")
    readme.write_text("# x\n<!-- RESULTS:START -->\nhand-written numbers\n<!-- RESULTS:END -->\nrest\n")
    proc = collect(build, dest, readme=readme)
    assert proc.returncode == 0, proc.stderr
    text = readme.read_text()
    assert "hand-written" not in text and text.endswith("<!-- RESULTS:END -->\nrest\n")
    assert "commit `abc123` on AMD EPYC, 2 cores, 2026-12-03" in text
    assert "| linear (n-gram) | 1.17× (1.08–1.30) |" in text
    assert "linear (n-gram)'s: 1.17× (IQR 1.08–1.30, 12 prompts): faster" in text  # Holm over its column: 0.001
    readme.write_text("no markers\n")
    proc = collect(build, dest, readme=readme)
    assert proc.returncode != 0 and "RESULTS:START" in proc.stderr


def test_timings_of_another_shape_are_refused_by_name(tmp_path):
    build, dest = tmp_path / "build", tmp_path / "ref"
    build.mkdir()
    dest.mkdir()
    (dest / "timings.csv").write_text("notebook,seconds\n00_quickstart,39.1\n")
    (build / "timings.csv").write_text(HEADER + "03_linear,907.7,ok,abc,m,d\n")
    proc = collect(build, dest, "--partial")
    assert proc.returncode != 0 and "unexpected timings header" in proc.stderr
    assert (dest / "timings.csv").read_text() == "notebook,seconds\n00_quickstart,39.1\n"  # nothing overwritten


def test_the_executed_chapters_are_kept_beside_the_tables_within_their_size(tmp_path):
    """A whole run's executed notebooks replace the reference's (papermill's .input copies are left out); a partial
    run replaces only its own; notebooks over the size limit are refused, naming their size."""
    build, dest = tmp_path / "build", tmp_path / "ref"
    (build / "notebooks").mkdir(parents=True)
    (dest / "notebooks").mkdir(parents=True)
    (dest / "notebooks" / "99_gone.ipynb").write_text("{}")
    (build / "timings.csv").write_text(whole_run())
    for stem in STEMS[:2]:
        (build / "notebooks" / f"{stem}.ipynb").write_text('{"cells": []}')
        (build / "notebooks" / f"{stem}.input.ipynb").write_text("{}")
    proc = collect(build, dest)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (dest / "notebooks").iterdir()) == [f"{s}.ipynb" for s in STEMS[:2]]
    (dest / "notebooks" / "99_gone.ipynb").write_text("{}")
    (build / "notebooks" / f"{STEMS[0]}.ipynb").write_text('{"cells": [1]}')
    assert collect(build, dest, "--partial").returncode == 0
    assert (dest / "notebooks" / "99_gone.ipynb").is_file()          # kept by a partial run
    assert (dest / "notebooks" / f"{STEMS[0]}.ipynb").read_text() == '{"cells": [1]}'
    (build / "notebooks" / f"{STEMS[1]}.ipynb").write_text("x" * 16_000_000)
    proc = collect(build, dest)
    assert proc.returncode != 0 and "16.0 MB, more than the 15 MB" in proc.stderr
