"""``scripts/run_book.py``: the order of a parallel run, and the runs it refuses."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from specdec_core.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "run_book.py"


def _module():
    spec = importlib.util.spec_from_file_location("run_book", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parallel_runs_start_with_the_longest_chapter_by_the_runs_own_times(tmp_path):
    rb = _module()
    ref = tmp_path / "reference.csv"
    ref.write_text("notebook,seconds,status\n00_a,10,ok\n01_b,300,ok\n02_c,200,ok\n")
    srcs = [Path(f"book/{s}.py") for s in ("00_a", "01_b", "02_c", "03_new")]
    assert [p.stem for p in rb.longest_first(srcs, tmp_path / "out", ref)] == ["01_b", "02_c", "00_a", "03_new"]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "timings.csv").write_text("notebook,seconds,status\n00_a,500,ok\n02_c,20,failed\n")
    assert [p.stem for p in rb.longest_first(srcs, tmp_path / "out", ref)] == ["00_a", "01_b", "02_c", "03_new"]


def test_a_parallel_run_of_numbers_a_reader_sees_is_refused():
    for args in (["--params", "full"], ["--params", "ci", "--html"]):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "2", *args], capture_output=True, text=True)
        assert proc.returncode == 2 and "shares the cores between chapters that time themselves" in proc.stderr, args
    proc = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--jobs must be at least 1, got 0" in proc.stderr
