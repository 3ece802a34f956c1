"""``scripts/run_book.py``: the order of a parallel run, the runs it refuses, and a pair of one's own."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_pair_reaches_the_chapters_that_take_it_and_names_the_run_folder(tmp_path):
    rb = _module()
    assert rb.pair_folder({}) == "build/book"  # the book's own pair: the default folder, unchanged
    pair = tmp_path / "pair.yaml"
    pair.write_text("target: /models/My-Target\ndraft: org/tiny-draft\ndevice: cpu\n")
    s = rb.pair_settings(str(pair), dtype="bfloat16", device=None)  # flags given win; None flags are ignored
    assert s == {"target": "/models/My-Target", "draft": "org/tiny-draft", "device": "cpu", "dtype": "bfloat16"}
    assert rb.pair_folder(s) == "build/book-my-target+tiny-draft-cpu-bfloat16"
    assert rb.pair_parameters(s, {"model", "draft", "device", "out_dir"}) == dict(
        model="/models/My-Target", draft="org/tiny-draft", device="cpu")  # no dtype parameter: not injected
    assert rb.pair_parameters({"draft": "none"}, {"draft"}) == {"draft": None}
    names = rb.chapter_parameters(REPO_ROOT / "book" / "03_linear.py")
    assert {"model", "draft", "device"} <= names


def test_a_bad_pair_setting_is_refused_before_any_chapter_runs(tmp_path):
    rb = _module()
    for kw, match in [(dict(dtype="float8"), "dtype 'float8'"), (dict(device="tpu"), "device 'tpu'")]:
        with pytest.raises(ValueError, match=match):
            rb.pair_settings(None, **kw)
    bad = tmp_path / "pair.yaml"
    bad.write_text("target: x\nmodel: y\n")
    with pytest.raises(ValueError, match="keys must be among"):
        rb.pair_settings(str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        rb.pair_settings(str(tmp_path / "missing.yaml"))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dtype", "float8", "--only", "00"], capture_output=True,
                          text=True, cwd=REPO_ROOT)
    assert proc.returncode == 2 and "dtype 'float8'" in proc.stderr


def test_a_chapter_about_the_block_draft_is_left_out_for_a_pair_of_ones_own():
    rb = _module()
    names = rb.chapter_parameters(REPO_ROOT / "book" / "05_parallel.py")
    assert "block draft" in rb.unrunnable_for({"target": "/my/target"}, names)
    assert rb.unrunnable_for({}, names) is None and rb.unrunnable_for({"device": "cpu"}, names) is None
    assert rb.unrunnable_for({"target": "/my/target"}, rb.chapter_parameters(REPO_ROOT / "book" / "06_speedup.py")) is None


def test_every_chapter_that_loads_the_pair_takes_and_passes_each_setting():
    """DTYPE= (and TARGET=, DRAFT=, DEVICE=) reach every chapter with a ``model`` parameter: it declares ``dtype``
    and ``device`` (``draft`` where it takes a model draft), and its ``book.setup`` call passes them on; a chapter
    that loads the pair without one of them is refused before the run (shown on a planted one)."""
    import re

    rb = _module()
    loading = {}
    for src in sorted((REPO_ROOT / "book").glob("[0-9][0-9]_*.py")):
        names = rb.chapter_parameters(src)
        if "model" not in names:
            continue
        loading[src.stem] = names
        assert {"model", "device", "dtype"} <= names, (src.name, sorted(names))
        call = re.search(r"book\.setup\((.*?)\)\s*(?:#.*)?$", src.read_text(), re.M | re.S)
        assert call and "dtype=dtype" in call.group(1) and "device=device" in call.group(1), src.name
        settings = {"dtype": "bfloat16", "device": "cpu", "target": "/my/target"}
        assert rb.pair_parameters(settings, names) == {"dtype": "bfloat16", "device": "cpu", "model": "/my/target"}
        assert rb.unhonoured(settings, names) == []
    assert {"00_quickstart", "01_bottleneck", "03_linear", "06_speedup", "09_serving", "10_curves"} <= set(loading)
    planted = {"model", "device", "out_dir"}                          # a chapter that loads the pair, no dtype
    assert rb.unhonoured({"dtype": "bfloat16", "device": "cpu", "draft": "x"}, planted) == ["dtype"]
    assert rb.unhonoured({"draft": "x"}, planted) == []  # a draft is for the chapters that take one
    assert rb.unhonoured({"dtype": "bfloat16"}, {"threads", "out_dir"}) == []   # loads no pair: nothing to honour


def test_make_reproduce_puts_a_pairs_run_in_build(tmp_path):
    """``make reproduce BUILD=dir TARGET=…`` runs in ``dir/book-<pair>``, as the default pair's runs in ``dir/book``:
    the folder run_book.py computes, the flag make passes, and the folder a run (of no chapter) writes."""
    rb = _module()
    s = {"target": "/models/My-Target", "draft": "org/tiny-draft", "device": "cpu", "dtype": "bfloat16"}
    assert rb.pair_folder(s, "elsewhere") == "elsewhere/book-my-target+tiny-draft-cpu-bfloat16"
    assert rb.pair_folder({}, "elsewhere") == "elsewhere/book"
    make = ["make", "-n", "-C", str(REPO_ROOT), "reproduce", f"BUILD={tmp_path}"]
    pair_run = subprocess.run([*make, "TARGET=my-target"], capture_output=True, text=True)
    own_run = subprocess.run(make, capture_output=True, text=True)
    assert pair_run.returncode == 0 and own_run.returncode == 0, pair_run.stderr + own_run.stderr
    assert f"--target my-target --build {tmp_path} --html" in pair_run.stdout
    assert f"--out {tmp_path}/book --html" in own_run.stdout
    proc = subprocess.run([sys.executable, str(SCRIPT), "--params", "ci", "--only", "no-such-chapter",
                           "--target", "my-target", "--build", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "book-my-target+none-cpu-float32" / "timings.csv").exists()


def test_the_injected_parameters_cell_is_kept_out_of_the_rendered_book(tmp_path):
    """hide_injected tags papermill's cell remove-input (once), and leaves the chapter's own parameters cell shown."""
    import nbformat

    hide_injected = _module().hide_injected
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("k = 4", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("k = 2", metadata={"tags": ["injected-parameters"]})]
    path = tmp_path / "ch.ipynb"
    nbformat.write(nb, path)
    hide_injected(path)
    hide_injected(path)
    tags = [c.metadata.get("tags") for c in nbformat.read(path, as_version=4).cells]
    assert tags == [["parameters"], ["injected-parameters", "remove-input"]]
