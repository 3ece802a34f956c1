"""``scripts/collect_reference.py``: a run of some chapters updates their rows of the reference timings and keeps
the rest; a table it copies replaces the reference's."""
from __future__ import annotations

import subprocess
import sys

from specdec_core.paths import REPO_ROOT


def collect(build, dest):
    return subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "collect_reference.py"), "--build", str(build),
                           "--dest", str(dest)], capture_output=True, text=True)


def test_a_partial_run_updates_its_chapters_timings_and_keeps_the_others(tmp_path):
    build, dest = tmp_path / "build", tmp_path / "ref"
    (build / "03_linear").mkdir(parents=True)
    dest.mkdir()
    (dest / "timings.csv").write_text("notebook,seconds,status\n00_quickstart,39.1,ok\n03_linear,425.0,ok\n")
    (build / "timings.csv").write_text("notebook,seconds,status\n03_linear,907.7,ok\n05_parallel,710.5,ok\n")
    (build / "03_linear" / "pass_costs.csv").write_text("K,verify_ratio\n1,0.9\n")
    proc = collect(build, dest)
    assert proc.returncode == 0, proc.stderr
    assert (dest / "timings.csv").read_text().splitlines() == [
        "notebook,seconds,status", "00_quickstart,39.1,ok", "03_linear,907.7,ok", "05_parallel,710.5,ok"]
    assert "00_quickstart kept" in proc.stdout
    assert (dest / "03_linear" / "pass_costs.csv").read_text() == "K,verify_ratio\n1,0.9\n"


def test_timings_of_another_shape_are_refused_by_name(tmp_path):
    build, dest = tmp_path / "build", tmp_path / "ref"
    build.mkdir()
    dest.mkdir()
    (dest / "timings.csv").write_text("notebook,seconds\n00_quickstart,39.1\n")
    (build / "timings.csv").write_text("notebook,seconds,status\n03_linear,907.7,ok\n")
    proc = collect(build, dest)
    assert proc.returncode != 0 and "unexpected timings header" in proc.stderr
    assert (dest / "timings.csv").read_text() == "notebook,seconds\n00_quickstart,39.1\n"  # nothing overwritten
