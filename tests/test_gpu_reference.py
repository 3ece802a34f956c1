"""The GPU reference run and the static-shape step it times, kept alive on CPU.

The run (``scripts/gpu_reference.py``) executes on a GPU machine; here it runs every stage at smoke sizes
on CPU, so it cannot rot while no GPU is at hand. The static step (``study/compiled.py``) must decode exactly what
``sd.generate`` decodes, in every mode this machine has; the CUDA-graph mode is checked where CUDA is."""
import resource
import runpy
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

import specdec_core as sd
from specdec_core.lm import CachedLM
from specdec_core.paths import REPO_ROOT
from specdec_core.study import hardware
from specdec_core.tools import gpu_reference as gpu
from specdec_core.study.compiled import MODES, StaticLM, chained_steps, greedy_decode
from conftest import requires_cuda

COLUMNS = {
    "core.csv": {"check", "what", "passed"},
    "ceilings.csv": {"source", "dtype", "copy_gbps", "gemm_gflops", "ridge_flop_per_byte"},
    "pass_times.csv": {"model", "params", "T", "median_ms", "ratio", "S"},
    "knees.csv": {"source", "model", "t1_ms", "floor_ms", "knee_ideal", "knee_measured", "knee_resolved"},
    "pair_costs.csv": {"source", "mode", "K", "alpha_source", "alpha", "c", "verify_ratio", "predicted_speedup"},
    "steps.csv": {"model", "mode", "T", "ms_per_step", "ms_per_token", "of_core", "of_eager", "toy_identical"},
    "embedded.csv": {"runner", "median", "greedy_equal"},
}
PROMPTS = [torch.tensor([1, 5, 3, 7, 2]), torch.tensor([9, 9, 4]), torch.tensor([0, 15, 2, 2, 8, 11, 6])]


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-reference")
    t, cpu = time.perf_counter(), _cpu_seconds()
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gpu_reference.py"), "--device", "cpu",
                           "--smoke", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    return out, proc, time.perf_counter() - t, _cpu_seconds() - cpu


def test_smoke_run_passes_every_stage_within_a_minute(smoke_run):
    """Under a minute of the machine: the run's own CPU time (one thread), which other work on a shared machine
    does not inflate as it does the wall time (about 20 s on an idle 2-core machine)."""
    out, proc, wall, cpu = smoke_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    for name, _ in gpu.STAGES:
        assert f"**{name}**: ok" in summary, summary
    assert cpu < 60, f"the smoke run took {cpu:.0f} s of CPU time ({wall:.0f} s of wall time)"


def test_smoke_run_writes_every_table(smoke_run):
    out = smoke_run[0]
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu.FILES)
    assert len(gpu.FILES) <= 8  # what one device call brings back
    for name, cols in COLUMNS.items():
        df = pd.read_csv(out / name)
        assert len(df) and cols <= set(df.columns), (name, sorted(df.columns))
    core = pd.read_csv(out / "core.csv")
    assert core.passed.all() and {"greedy identity", "chi-square", "kv cache"} <= set(core.check)
    steps = pd.read_csv(out / "steps.csv")
    assert {"core", "eager", "compile"} <= set(steps["mode"]) and steps.toy_identical.dropna().all()
    costs = pd.read_csv(out / "pair_costs.csv")
    assert {"cpu (reference)"} < set(costs.source) and (costs.predicted_speedup > 0).all()


def test_smoke_run_decodes_the_headline_methods_with_and_without_graphs(smoke_run):
    """The graphs stage's rows (in embedded.csv, beside the embedded stage's): every headline method of chapter 6
    the toy pair can run, with graphs and eager, α and ratios measured, greedy tokens identical (float64)."""
    out = smoke_run[0]
    both = pd.read_csv(out / "embedded.csv")
    assert set(both.table) == {"graphs", "embedded"}
    g = both[both.table == "graphs"]
    headline = {"autoregressive"} | set(gpu.chapter_methods())  # chapter 6's methods, read from its parameters cell
    assert set(g.method) == headline and g.graphs.astype(bool).sum() == len(headline)
    assert (g.greedy_equal == 1).all() and (g.same_as_eager == 1).all()
    assert (g.tokens_per_s > 0).all() and (g["median"] > 0).all() and (g.graphs_gain > 0).all()
    assert g[g.method != "autoregressive"].alpha.between(0, 1).all()
    assert "sd.generate with CUDA graphs" in (out / "summary.md").read_text()


# -- a file in parts ---------------------------------------------------------------------------------------------
def test_split_and_join_give_the_file_back(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 1000 + b"tail")
    manifest = gpu.split_file(src, tmp_path / "parts", max_mib=0.1)
    parts = sorted((tmp_path / "parts").glob("model.gguf.part-*"))
    assert len(parts) == 3 and all(p.stat().st_size <= 0.1 * 2**20 for p in parts)
    assert gpu.join_parts(manifest, tmp_path / "joined.gguf").read_bytes() == src.read_bytes()
    assert gpu.gguf_file(manifest) == tmp_path / "parts" / "model.gguf"  # --gguf takes the manifest
    assert gpu.gguf_file(src) == src
    two = gpu.split_file(src, tmp_path / "two", parts=2, max_mib=1)
    assert gpu.join_parts(two).read_bytes() == src.read_bytes()
    with pytest.raises(ValueError, match="at least 3 parts"):
        gpu.split_file(src, tmp_path / "x", parts=2, max_mib=0.1)


def test_join_refuses_a_part_that_differs(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(b"0123456789" * 30000)
    manifest = gpu.split_file(src, tmp_path / "parts", parts=3, max_mib=1)
    part = tmp_path / "parts" / "model.gguf.part-2-of-3"
    part.write_bytes(b"X" + part.read_bytes()[1:])  # same size, one byte changed
    with pytest.raises(ValueError, match=r"part .*part-2-of-3 .*differs"):
        gpu.join_parts(manifest, tmp_path / "joined.gguf")
    assert not (tmp_path / "joined.gguf").exists()
    part.unlink()
    with pytest.raises(ValueError, match=r"part-2-of-3 .*missing"):
        gpu.join_parts(manifest)


def test_split_file_script_round_trip(tmp_path, capsys):
    script = runpy.run_path(str(REPO_ROOT / "scripts" / "split_file.py"))
    src = tmp_path / "f.bin"
    src.write_bytes(b"abc" * 100000)
    assert script["main"](["split", str(src), "--out", str(tmp_path / "p"), "--parts", "2", "--max-mib", "1"]) == 0
    manifest = tmp_path / "p" / "f.bin.parts.json"
    assert script["main"](["join", str(manifest), "--out", str(tmp_path / "back.bin")]) == 0
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    (tmp_path / "p" / "f.bin.part-1-of-2").write_bytes(b"short")
    assert script["main"](["join", str(manifest), "--out", str(tmp_path / "again.bin")]) == 1
    assert "differs from the manifest" in capsys.readouterr().err


def test_smollm2_shape_is_the_embedded_targets():
    cfg = REPO_ROOT / "data" / "models" / "smollm2-135m" / "config.json"
    if not cfg.exists():
        pytest.skip("the embedded target is not converted yet")
    import json

    real = json.loads(cfg.read_text())
    for key, value in gpu.SMOLLM2_135M.items():
        assert real[key] == pytest.approx(value), key


def test_alpha_and_cpu_costs_come_from_the_reference():
    ref = gpu.cpu_alpha()
    assert 0 < ref["alpha"]["greedy"] < 1 and 0 < ref["alpha"]["T=1"] < 1
    assert 0 < ref["c"] < 1 and ref["verify_ratio"]


def test_cache_checks_pass_on_cpu(toy16):
    rows = gpu.cache_checks(toy16, torch.device("cpu"))
    assert [r["check"] for r in rows] == ["rollback", "compaction"] and all(r["passed"] for r in rows)


# -- the static step ---------------------------------------------------------------------------------------------
def _reference(pair, prompt, n):
    return sd.generate(pair.target, prompt, max_new_tokens=n).tokens


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_static_step_decodes_what_generate_decodes(toy16, mode):
    """Dynamo traces the step as Inductor would (``aot_eager`` skips the code generation; the Inductor run is
    the slow test below)."""
    lm = StaticLM(toy16.target, 48, mode, backend="aot_eager")
    for prompt in PROMPTS:
        assert greedy_decode(lm, prompt, 24) == _reference(toy16, prompt, 24)


@pytest.mark.slow
def test_inductor_compiled_step_decodes_what_generate_decodes(toy16):
    """The real compilation (Inductor's C++ kernels on CPU; about a minute on a cold cache): same greedy tokens."""
    lm = StaticLM(toy16.target, 48, "compile")
    for prompt in PROMPTS[:2]:
        assert greedy_decode(lm, prompt, 16) == _reference(toy16, prompt, 16)


def test_greedy_decode_stops_at_eos(toy16):
    lm, prompt = StaticLM(toy16.target, 48), PROMPTS[0]
    full = _reference(toy16, prompt, 20)
    eos = full[5]
    cut = full[: full.index(eos) + 1]
    assert greedy_decode(lm, prompt, 20, eos={eos}) == cut


def test_static_step_never_reads_rejected_entries(toy16):
    """A verify-shaped step over K + 1 tokens, K - 1 of them rolled back, then one more step: the logits equal a
    fresh pass over the kept sequence (the stale entries past the length are masked, then overwritten)."""
    lm = StaticLM(toy16.target, 32)
    prompt = PROMPTS[2]
    lm.prefill(prompt)
    lm.step(torch.tensor([3, 1, 4, 1, 5]))
    lm.cache.rollback(3)
    got = lm.step(torch.tensor([9]))[-1]
    seq = prompt.tolist() + [3, 1, 9]
    want = CachedLM(toy16.target, len(seq)).forward(torch.tensor(seq))[-1]
    assert torch.allclose(got, want, atol=1e-10, rtol=0)


def test_chained_steps_leave_the_cache_as_it_was(toy16):
    lm = StaticLM(toy16.target, 40)
    lm.prefill(PROMPTS[0])
    before = lm.length
    chained_steps(lm, 6, T=3)
    assert lm.length == before


def test_static_step_checks_its_arguments(toy16):
    with pytest.raises(ValueError, match="unknown mode"):
        StaticLM(toy16.target, 8, "fast")
    with pytest.raises(ValueError, match="CUDA"):
        StaticLM(toy16.target, 8, "graph")
    lm = StaticLM(toy16.target, 8)
    with pytest.raises(ValueError, match="does not fit"):
        lm.prefill(torch.arange(9) % 16)
    assert set(MODES) == {"eager", "compile", "reduce-overhead", "graph"}


@requires_cuda
@pytest.mark.parametrize("mode", ["graph", "reduce-overhead"])
def test_captured_step_decodes_what_generate_decodes(mode):
    pair = sd.toy_pair(vocab_size=16, seed=1, device="cuda")
    lm = StaticLM(pair.target, 48, mode)
    for prompt in PROMPTS:
        assert greedy_decode(lm, prompt, 24) == _reference(pair, prompt, 24)


def test_committed_gpu_reference_reads_back_with_its_columns():
    """Chapters 1 and 6 read the committed run; every table they use has the columns they use."""
    ref = hardware.load_reference()
    if not ref:
        pytest.skip("no data/reference/cuda-*/ committed")
    for name in ("ceilings", "pass_times", "knees", "pair_costs"):
        assert COLUMNS[f"{name}.csv"] <= set(ref[name].columns), name
    assert ref["tag"].startswith("cuda-") and (ref["knees"].source == ref["tag"]).any()
    costs = hardware.reference_costs(ref)
    assert costs and all(0 < c < 1 and all(v >= 0.5 for v in vr.values()) for c, vr in costs.values())


def test_load_reference_names_a_missing_table(tmp_path):
    d = tmp_path / "data" / "reference" / "cuda-fake"
    d.mkdir(parents=True)
    assert hardware.load_reference(tmp_path) == {}  # no summary.md: not a run
    (d / "summary.md").write_text("# run\n")
    pd.DataFrame({"source": ["cuda-fake"]}).to_csv(d / "ceilings.csv", index=False)
    with pytest.raises(FileNotFoundError, match="knees"):
        hardware.load_reference(tmp_path)


def test_speedup_by_device_marks_each_sources_argmax():
    """Cheap verification moves the best K right; a source's best K is its own argmax (not the global one)."""
    flat = {k: 1.0 for k in range(1, 9)}
    steep = {k: 1.0 + 0.3 * k for k in range(1, 9)}
    df = hardware.speedup_by_device(0.8, range(1, 9), {"free verify": (0.05, flat), "costly verify": (0.05, steep)})
    best = df[df.best_k].set_index("source")
    assert best.K["free verify"] > best.K["costly verify"]
    for src, g in df.groupby("source"):
        assert g.best_k.sum() == 1 and g.loc[g.best_k, "predicted_speedup"].item() == g.predicted_speedup.max()
    with pytest.raises(ValueError, match="no source"):
        hardware.speedup_by_device(0.8, [20], {"x": (0.1, flat)})
