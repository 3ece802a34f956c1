"""The book on a GPU: one prepared run (``scripts/gpu_reference.py``, ``make gpu-reference``) in six stages.

The run is built and tested on CPU (``--device cpu --smoke``: every stage at tiny sizes, in a test) and executed in
one go on a GPU machine, which may have no package registry: it needs the working tree and nothing else.

1. :func:`stage_core`: the core's CUDA path. Greedy identity in float64 on a toy pair (every method's tokens
   equal autoregressive decoding on the device, and the CPU's); a short chi-square family (sampled sequences
   against the exact law); KV-cache rollback and tree compaction against a fresh pass.
2. :func:`stage_bottleneck`: chapter 1 on the device: copy bandwidth, the bf16 matmul peak, t(T)/t(1) for
   random-weight Llamas of the embedded target's shape, ~1B and ~8B, and the measured knee against the ridge point.
3. :func:`stage_pair_costs`: the embedded pair's shapes (random target, the shipped draft's trunk): c and the
   verify cost, and the speedup per K they predict with the α measured on CPU (α belongs to the weights, not
   the hardware).
4. :func:`stage_steps`: eager against graph-captured (and compiled) static-shape steps
   (:mod:`specdec_core.study.compiled`) for the target and draft shapes, per token; greedy identity first.
5. :func:`stage_graphs`: the library's own decoders with CUDA graphs (``sd.generate(..., graphs=True)``) against
   eager (``graphs=False``), interleaved, for chapter 6's headline methods on the embedded pair: tokens/s ratios
   against autoregressive, α, greedy identity.
6. :func:`stage_embedded`: the real embedded pair's measured speedups, when its weights are on the machine.

Stages 5 and 6 need the embedded pair's weights: the converted cache, or the GGUF file given with ``--gguf``, which
also takes the manifest of its parts (:func:`split_file`, :func:`join_parts`: the file moved in pieces, each checked).

Outputs (:data:`FILES`, at most 8 files): ``summary.md`` and one CSV per
table (the graphs stage's table shares ``embedded.csv``, a ``table`` column telling them apart: :data:`SHARED`).
Each stage runs under a deadline and its own ``try``: a failed or skipped stage is recorded in ``summary.md`` and
the others still run.
"""
from __future__ import annotations

import ast
import hashlib
import json
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import specdec_core as sd
from ..adaptive import hybrid_of
from ..data.prompts import encode, load_prompts
from ..lm import CachedLM, sized
from ..models import calibration, hub, shipped
from ..models.draft import DraftModel
from ..models.shipped import load_model_draft
from ..paths import REFERENCE_DIR, REPO_ROOT, rel
from ..study import bench, peers, profiling as pf
from ..study.compiled import StaticLM, chained_steps, greedy_decode, static_runner
from ..study.exactness import gof_family
from ..study.theory import speedup
from ..tree import Tree

FILES = ("summary.md", "core.csv", "ceilings.csv", "pass_times.csv", "knees.csv", "pair_costs.csv", "steps.csv",
         "embedded.csv")
SHARED = {"graphs": "embedded"}  # tables written into another table's file (with a `table` column): FILES is capped

# SmolLM2-135M-Instruct's shapes (data/models/smollm2-135m/config.json; tests check them against it): the GPU
# machine has no converted weights, so the embedded target's shape is timed with random weights.
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
                    rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=4096)


def model_config(name: str):
    """``"smollm2-135m"``, ``"tiny"`` (smoke runs) or a size of :data:`profiling.LLAMA_SHAPES` → a ``LlamaConfig``."""
    if name in ("smollm2-135m", "tiny"):
        from transformers import LlamaConfig

        shape = SMOLLM2_135M if name == "smollm2-135m" else TINY
        return LlamaConfig(**shape, bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    return pf.llama_config(name)


@dataclass
class Sizes:
    """How much each stage measures. :meth:`for_run` picks the device run's, a CPU run's, or the smoke run's."""

    identity_prompts: int = 3
    identity_tokens: int = 32
    gof_N: int = 600
    gof_n: int = 2
    copy_bytes: int = 2 << 30
    gemm_n: int = 8192
    ceil_repeats: int = 10
    models: tuple = ("smollm2-135m", "1b", "8b")
    token_counts: tuple = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    context: int = 512
    pass_repeats: int = 10
    target: str = "smollm2-135m"
    ks: tuple = (1, 2, 3, 4, 5, 6, 8)
    cost_context: int = 160
    cost_repeats: int = 20
    step_n: int = 32
    step_k: int = 4
    step_repeats: int = 10
    embedded_per_task: int = 1
    embedded_tokens: int = 64
    embedded_repeats: int = 2
    graphs_prompts: int = 6
    graphs_repeats: int = 1
    warmup: int = 2

    @classmethod
    def for_run(cls, device: torch.device, smoke: bool) -> "Sizes":
        if smoke:
            return cls(identity_prompts=2, identity_tokens=12, gof_N=120, copy_bytes=16 << 20, gemm_n=256,
                       ceil_repeats=3, models=("tiny",), token_counts=(1, 2, 4, 8), context=32, pass_repeats=3,
                       target="tiny", ks=(1, 2, 4), cost_context=24, cost_repeats=3, step_n=4, step_k=2,
                       step_repeats=3, embedded_tokens=8, embedded_repeats=1, graphs_prompts=2, warmup=1)
        if device.type == "cpu":
            return cls(copy_bytes=512 << 20, gemm_n=2048, ceil_repeats=5, models=("smollm2-135m",),
                       token_counts=(1, 2, 4, 8, 16, 32, 64), context=128, pass_repeats=5, cost_repeats=10,
                       step_n=16, step_repeats=5)
        return cls()


@dataclass
class Run:
    """One reference run: where it writes, its deadline, and what each stage reported."""

    device: torch.device
    out: Path
    sizes: Sizes
    smoke: bool = False
    deadline: float = math.inf
    compile_backend: str = "inductor"
    compile_modes: tuple = ()
    gguf: str | None = None
    tables: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    loaded: dict = field(default_factory=dict)  # what stages share once loaded (the embedded pair)

    @property
    def dtype(self) -> torch.dtype:
        """Timing dtype: bf16 on a GPU (its matrix units), float32 on CPU."""
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32

    def save(self, name: str, df: pd.DataFrame) -> pd.DataFrame:
        """Keep table ``name`` and write its file (a shared file: every table written to it, a ``table`` column
        naming each row's)."""
        file = SHARED.get(name, name)
        assert f"{file}.csv" in FILES, name
        df = df.assign(device=pf.device_tag(self.device))
        self.tables[name] = df
        self.out.mkdir(parents=True, exist_ok=True)
        if file in SHARED.values():
            parts = [t.assign(table=n) for n, t in self.tables.items() if SHARED.get(n, n) == file]
            pd.concat(parts, ignore_index=True).to_csv(self.out / f"{file}.csv", index=False)
        else:
            df.to_csv(self.out / f"{file}.csv", index=False)
        return df

    def left(self) -> float:
        return self.deadline - time.perf_counter()


def _sync_ms(fns: dict, run: Run, repeats: int, warmup: int | None = None) -> pd.DataFrame:
    """:func:`profiling.time_interleaved` on the run's device (synchronized), summarized in milliseconds."""
    s = pf.summarize(pf.time_interleaved(fns, repeats=repeats, warmup=run.sizes.warmup if warmup is None else warmup,
                                         device=run.device))
    for col in ("median", "q25", "q75", "min"):
        s[f"{col}_ms"] = s.pop(col) * 1e3
    return s


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- 1. the core's CUDA path ------------------------------------------------------------------------
IDENTITY_SPECS = (("linear", "model", 1), ("linear", "model", 3), ("linear", "ngram", 3), ("tree", "model", 3),
                  ("parallel", "block", 3))


@torch.inference_mode()
def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def cache_checks(pair, device) -> list[dict]:
    """Rollback and compaction on ``device``, each against a fresh pass over the sequence it should leave.

    rollback: commit four tokens, roll back two, write two others → the logits of the next pass equal a fresh
    pass's. compaction: a pass over a root and two siblings (the tree mask), :meth:`KVCache.keep` of the root and
    the second sibling → the next pass equals a fresh pass over prompt + root + sibling."""

    target = pair.target
    g = torch.Generator().manual_seed(5)
    V = target.config.get_text_config().vocab_size
    prompt, extra = torch.randint(0, V, (6,), generator=g), torch.randint(0, V, (6,), generator=g)

    def fresh(seq):
        return CachedLM(target, len(seq) + 1).forward(torch.tensor(seq))[-1]

    rows = []
    lm = CachedLM(target, 32)
    lm.forward(prompt)
    lm.forward(extra[:4])
    lm.cache.rollback(2)
    got = lm.forward(extra[4:6])[-1]
    seq = prompt.tolist() + extra[:2].tolist() + extra[4:6].tolist()
    rows.append(dict(check="rollback", rel_error=_relerr(got, fresh(seq)), length=lm.length))
    lm = CachedLM(target, 32)
    lm.forward(prompt)
    L, tree = lm.length, Tree.of([(0,), (1,)])  # root, two children at depth 1
    nodes = extra[:3]
    lm.forward(nodes, positions=L + tree.depths, mask=tree.bias(L, lm.dtype, lm.device))
    lm.cache.retain([L, L + 2], start=L)
    got = lm.forward(extra[3:4])[-1]
    seq = prompt.tolist() + [int(nodes[0]), int(nodes[2]), int(extra[3])]
    rows.append(dict(check="compaction", rel_error=_relerr(got, fresh(seq)), length=lm.length))
    for r in rows:
        r["passed"] = r["rel_error"] < 1e-9
    return rows


def stage_core(run: Run) -> None:
    sz, dev, rows = run.sizes, run.device, []
    pair = sd.toy_pair(vocab_size=16, seed=1, device=dev)  # float64
    cpu_pair = sd.toy_pair(vocab_size=16, seed=1) if dev.type != "cpu" else pair
    g = torch.Generator().manual_seed(0)
    for i in range(sz.identity_prompts):
        prompt = torch.randint(0, 16, (5 + 3 * i,), generator=g)
        ar = sd.generate(pair.target, prompt, max_new_tokens=sz.identity_tokens).tokens
        cpu = sd.generate(cpu_pair.target, prompt, max_new_tokens=sz.identity_tokens).tokens
        rows.append(dict(check="greedy identity", what="autoregressive vs CPU", prompt=i, passed=ar == cpu))
        for method, drafter, k in IDENTITY_SPECS:
            res = sd.generate(pair.target, prompt, drafter=pair.drafters[drafter], method=method, k=k,
                              max_new_tokens=sz.identity_tokens)
            rows.append(dict(check="greedy identity", what=f"{method}:{drafter} k={k}", prompt=i,
                             passed=res.tokens == ar))
    small = sd.toy_pair(vocab_size=8, seed=0, device=dev)
    settings = [{"name": "T=1", "temperature": 1.0}, {"name": "T=0.7 top-p 0.9", "temperature": 0.7, "top_p": 0.9}]
    gof, _ = gof_family(small, [1, 2, 3], ["autoregressive", "linear:model", "tree:model"], settings, [2],
                        N=sz.gof_N, n=sz.gof_n)
    for r in gof:
        rows.append(dict(check="chi-square", what=f"{r['spec']} {r['setting']} k={r['k']}", N=r["N"],
                         pvalue=r["pvalue"], p_holm=r["p_holm"], tv_upper=r["tv_upper"],
                         passed=r["p_holm"] >= 0.01 and r["impossible"] == 0))
    for r in cache_checks(pair, dev):
        rows.append(dict(check="kv cache", what=r["check"], rel_error=r["rel_error"], passed=r["passed"]))
    df = run.save("core", pd.DataFrame(rows))
    bad = df[~df.passed.astype(bool)]
    run.notes["core"] = (f"{int(df.passed.sum())}/{len(df)} checks passed"
                         + ("" if bad.empty else "; FAILED: " + ", ".join(f"{r.check} {r.what}" for r in bad.itertuples())))
    if not bad.empty:
        raise AssertionError(run.notes["core"])


# -- 2. chapter 1 on the device ---------------------------------------------------------------------
def chapter1_reference(name: str) -> pd.DataFrame:
    """Chapter 1's CPU table ``name`` (``ceilings`` or ``knees``) from ``data/reference/book/01_bottleneck/``, in
    this run's columns, for the side-by-side (empty if the reference is not there)."""
    path = REFERENCE_DIR / "book" / "01_bottleneck" / f"{name}.csv"
    if not path.exists():
        return pd.DataFrame()
    d = pd.read_csv(path)
    if name == "ceilings":
        return d.assign(source=[f"cpu (reference, chapter 1, {t} threads)" for t in d.threads],
                        dtype="float32").drop(columns=["threads", "device"])
    return d.assign(source="cpu (reference, chapter 1)", model="smollm2-135m (trained)", mode="core",
                    knee_resolved=d.resolved)[["source", "model", "mode", "S", "plateau_ms", "floor_ms", "knee_ideal", "knee_measured",
                                         "knee_resolved", "fit_rms_log"]]


def stage_bottleneck(run: Run) -> None:
    sz, dev, dt = run.sizes, run.device, run.dtype
    cb = pf.copy_bandwidth(sz.copy_bytes, dev, dt, repeats=sz.ceil_repeats)
    mp = pf.matmul_peak(sz.gemm_n, dev, dt, repeats=sz.ceil_repeats)
    bw, peak = cb["gbps_best"] * 1e9, mp["gflops_best"] * 1e9
    here = dict(source=pf.device_tag(dev), dtype=str(dt).removeprefix("torch."), copy_gbps=cb["gbps_best"],
                copy_gbps_median=cb["gbps_median"], gemm_gflops=mp["gflops_best"],
                gemm_gflops_median=mp["gflops_median"], gemm_n=mp["n"], ridge_flop_per_byte=peak / bw)
    run.save("ceilings", pd.concat([pd.DataFrame([here]), chapter1_reference("ceilings")], ignore_index=True))
    b = torch.finfo(dt).bits // 8
    times, knees = [], []
    for name in sz.models:
        if run.left() < 60 and times:
            run.notes["bottleneck"] = f"stopped before {name}: deadline"
            break
        cfg = model_config(name)
        model = pf.build_llama(cfg, dt, dev, label=f"{name} (random weights)")
        params = sum(p.numel() for p in model.parameters())
        lm = CachedLM(model, sz.context + max(sz.token_counts))
        pf.at_context(lm, sz.context)
        fns = {f"core|{T}": pf.pass_fn(lm, T, cfg.vocab_size) for T in sz.token_counts}
        static = "graph" if dev.type == "cuda" else "eager"  # on a GPU: what is left when launches cost nothing
        for T in sz.token_counts:
            g = StaticLM(model, sz.context + T, static)  # masks exactly the S + T slots the core's pass reads
            pf.at_context(g, sz.context)
            fns[f"{'static ' if static == 'eager' else ''}{static}|{T}"] = (lambda g=g, T=T: chained_steps(g, 1, T))
        s = _sync_ms(fns, run, sz.pass_repeats)
        s[["mode", "T"]] = s.name.str.split("|", expand=True)
        s["T"] = s["T"].astype(int)
        c1 = pf.pass_cost(cfg, 1, sz.context, b)
        for mode, d in s.groupby("mode", sort=False):
            d = d.sort_values("T").drop(columns="name")
            t1 = float(d[d["T"] == 1].median_ms.iloc[0]) / 1e3
            d["ratio"] = d.median_ms / (1e3 * t1)
            times.append(d.assign(model=model.label, params=params, S=sz.context))
            fit = pf.fit_roofline(d["T"], d.median_ms / 1e3)
            knees.append(dict(model=model.label, mode=mode, params=params, S=sz.context, t1_ms=1e3 * t1,
                              plateau_ms=1e3 * fit["plateau"], floor_ms=1e3 * c1["bytes"] / bw,
                              of_copy_bw=c1["bytes"] / t1 / bw, knee_ideal=pf.roofline_knee(cfg, sz.context, b, bw, peak),
                              knee_ideal_gqa_expanded=pf.roofline_knee(cfg, sz.context, b, bw, peak, gqa_expanded=True),
                              knee_measured=fit["knee"], knee_resolved=fit["resolved"], fit_rms_log=fit["rms_log"],
                              ridge_flop_per_byte=peak / bw))
        del model, lm, fns
        _free(dev)
        run.save("pass_times", pd.concat(times, ignore_index=True))
        run.save("knees", pd.concat([pd.DataFrame(knees).assign(source=pf.device_tag(dev)),
                                     chapter1_reference("knees")], ignore_index=True))


# -- 3. the embedded pair's shapes: c, the verify cost, the speedup they predict --------------------------
def cpu_alpha(root: Path | None = None) -> dict:
    """α of the shipped draft measured on CPU (``data/reference/draft_summary.jsonl``), with the CPU's c and verify
    ratios (the same file's cost row; chapter 3's ``pass_costs.csv`` per K)."""
    ref = (Path(root) / "data" / "reference" if root else REFERENCE_DIR)
    rec = json.loads((ref / "draft_summary.jsonl").read_text().splitlines()[-1])
    out = {"alpha": {"greedy": rec["alpha"]["greedy_all"], "T=1": rec["alpha"]["t1_all"]},
           "c": rec["cost"]["c"], "verify_ratio": {int(rec["cost"]["k"]): rec["cost"]["verify_ratio"]}}
    pc = ref / "book" / "03_linear" / "pass_costs.csv"
    if pc.exists():
        out["verify_ratio"].update({int(r.K): float(r.verify_ratio) for r in pd.read_csv(pc).itertuples()})
    return out


def pair_models(run: Run):
    """The embedded pair's shapes with random target weights: the 135M-shaped target and the shipped draft's trunk
    on top of it (its trunk and 8,192-token head; timing does not depend on the values). Smoke runs: a tiny
    target and a one-layer draft copied from it."""

    target = pf.build_llama(model_config(run.sizes.target), run.dtype, run.device,
                            label=f"{run.sizes.target} (random weights)")
    if run.sizes.target == "smollm2-135m":

        draft = load_model_draft(target)
    else:
        draft = DraftModel.from_target(target, layers=[0], vocab=torch.arange(0, target.config.vocab_size, 4)).eval()
    return target, draft


def stage_pair_costs(run: Run) -> None:
    sz, dev = run.sizes, run.device
    target, draft = pair_models(run)
    S = sz.cost_context
    t_lm, d_lm = CachedLM(target, S + max(sz.ks) + 2), CachedLM(draft, S + 2)
    pf.at_context(t_lm, S)
    pf.at_context(d_lm, S)
    V = target.config.vocab_size
    fns = {f"target[{T}]": pf.pass_fn(t_lm, T, V) for T in sorted({1, *[k + 1 for k in sz.ks]})}
    fns["draft[1]"] = pf.pass_fn(d_lm, 1, V)
    ms = _sync_ms(fns, run, sz.cost_repeats).set_index("name").median_ms
    t1 = float(ms["target[1]"])
    c = float(ms["draft[1]"]) / t1
    ref, rows = cpu_alpha(), []
    for mode, cost_c, vr in [("core", c, {k: float(ms[f"target[{k + 1}]"]) / t1 for k in sz.ks})] + run.notes.get(
            "graph_costs", []):  # the graph-captured steps' costs (stage steps) at their one K
        for k in vr:
            for law, a in ref["alpha"].items():
                rows.append(dict(source=pf.device_tag(dev), mode=mode, K=k, alpha_source=f"CPU, {law}", alpha=a,
                                 c=cost_c, verify_ratio=vr[k], target_1_ms=t1, draft_1_ms=cost_c * t1,
                                 predicted_speedup=float(speedup(a, k, cost_c, vr[k]))))
    for k in sz.ks:  # the CPU's own prediction, from its own costs, beside it
        if k in ref["verify_ratio"]:
            for law, a in ref["alpha"].items():
                rows.append(dict(source="cpu (reference)", mode="core", K=k, alpha_source=f"CPU, {law}", alpha=a,
                                 c=ref["c"], verify_ratio=ref["verify_ratio"][k],
                                 predicted_speedup=float(speedup(a, k, ref["c"], ref["verify_ratio"][k]))))
    run.save("pair_costs", pd.DataFrame(rows))
    run.notes["pair"] = f"c = {c:.3f}, t_target(1) = {t1:.2f} ms, t_target(K+1)/t_target(1) = " + ", ".join(
        f"K={k}: {float(ms[f'target[{k + 1}]']) / t1:.2f}" for k in sz.ks)
    del target, draft, t_lm, d_lm
    _free(dev)


# -- 4. eager against graph-captured steps --------------------------------------------------------------
def step_modes(run: Run) -> list[str]:
    """eager and, on CUDA, the captured graph; the compile modes too on CPU, and on CUDA while 4 minutes are left
    (compiling the 135M shape takes about a minute per shape: the target's T = 1 step only)."""
    if run.device.type != "cuda":
        return ["eager", *run.compile_modes]
    return ["eager", "graph", *(run.compile_modes if run.left() > 240 else ())]


def identity_rows(run: Run, modes) -> list[dict]:
    """The static step's greedy tokens against ``sd.generate`` on a float64 toy pair on the device, per mode."""

    pair, rows = sd.toy_pair(vocab_size=16, seed=1, device=run.device), []
    prompts = [torch.tensor([1, 5, 3, 7, 2]), torch.tensor([9, 9, 4])]
    n = run.sizes.identity_tokens
    for mode in modes:
        lm = StaticLM(pair.target, 16 + n, mode, backend=run.compile_backend)
        same = all(greedy_decode(lm, p, n) == sd.generate(pair.target, p, max_new_tokens=n).tokens for p in prompts)
        rows.append(dict(model="toy (float64)", mode=mode, T=1, identical=same))
    return rows


def step_shapes(run: Run, role: str, mode: str) -> tuple[int, ...]:
    """Token counts timed per (role, mode): a draft's T = 1; a target's 1 and every K + 1 (compile modes: 1 on a GPU,
    where each shape compiles for a minute; 1 and the step's K + 1 on CPU)."""
    sz = run.sizes
    if role == "draft":
        return (1,)
    if mode in ("compile", "reduce-overhead"):
        return (1,) if run.device.type == "cuda" else (1, sz.step_k + 1)
    return (1, *sorted({k + 1 for k in sz.ks}))


def stage_steps(run: Run) -> None:
    sz, dev = run.sizes, run.device
    modes = step_modes(run)
    ident = pd.DataFrame(identity_rows(run, modes))
    target, draft = pair_models(run)
    S, n, fns, setup = sz.cost_context, sz.step_n, {}, {}
    cap = S + n * (max(sz.ks) + 1) + 2
    for role, model in (("target", target), ("draft", draft)):
        core = CachedLM(model, S + max(sz.ks) + 2)  # the library's own eager pass, as sd.generate runs it
        pf.at_context(core, S)
        for T in step_shapes(run, role, "eager"):
            one = pf.pass_fn(core, T, model.config.vocab_size)
            fns[f"{role}|core|{T}"] = (lambda one=one: [one() for _ in range(n)])
        for mode in modes:
            if role == "draft" and mode in ("compile", "reduce-overhead") and dev.type == "cuda":
                continue  # compiling costs minutes of the lease: the target's shape only
            lm = StaticLM(model, cap, mode, backend=run.compile_backend)
            pf.at_context(lm, S)
            for T in step_shapes(run, role, mode):
                fns[f"{role}|{mode}|{T}"] = (lambda lm=lm, T=T: chained_steps(lm, n, T))
    for name, fn in fns.items():  # the first call captures or compiles: untimed, its seconds reported
        t0 = time.perf_counter()
        fn()
        pf.sync(dev)
        setup[name] = time.perf_counter() - t0
    s = _sync_ms(fns, run, sz.step_repeats)
    rows = []
    for r in s.itertuples():
        role, mode, T = r.name.split("|")
        rows.append(dict(model=role, mode=mode, T=int(T), steps=n, ms_per_step=r.median_ms / n,
                         ms_per_step_q25=r.q25_ms / n, ms_per_step_q75=r.q75_ms / n,
                         ms_per_token=r.median_ms / n / int(T), setup_s=setup[r.name]))
    order = {m: i for i, m in enumerate(["core", *modes])}
    df = pd.DataFrame(rows).sort_values(["model", "T", "mode"], key=lambda c: c.map(order) if c.name == "mode" else c)
    for base in ("core", "eager"):
        ref = df[df["mode"] == base].set_index(["model", "T"]).ms_per_step
        df[f"of_{base}"] = df.ms_per_step.values / ref.reindex(list(zip(df.model, df["T"]))).values
    identical = ident.set_index("mode").identical
    df["toy_identical"] = df["mode"].map(identical)
    run.save("steps", df.reset_index(drop=True))
    per = df.set_index(["mode", "model", "T"]).ms_per_step
    graph_costs = []  # (mode, c, {K: verify ratio}) of each mode that timed both roles, for stage pair
    for m in modes[1:]:
        if (m, "draft", 1) in per:
            t1 = per[(m, "target", 1)]
            graph_costs.append((m, per[(m, "draft", 1)] / t1, {k: per[(m, "target", k + 1)] / t1 for k in sz.ks
                                                                if (m, "target", k + 1) in per}))
    run.notes["graph_costs"] = graph_costs
    goal = df[(df.model == "target") & (df["T"] == 1) & ~df["mode"].isin(["core", "eager"])]
    run.notes["steps"] = "; ".join(f"{r.mode}: {r.ms_per_step:.3f} ms per target step ({r.of_core:.2f}× the core's "
                                   f"eager step)" for r in goal.itertuples())
    del target, draft, fns
    _free(dev)
    if not identical.all():
        raise AssertionError(f"static steps differ from sd.generate in modes {identical[~identical].index.tolist()}")


# -- 5. the library's decoders with and without CUDA graphs ---------------------------------------------------
def chapter_methods(path: Path = REPO_ROOT / "book" / "06_speedup.py") -> dict[str, dict]:
    """Chapter 6's headline methods, read from the ``methods`` literal of its parameters cell: one definition,
    the chapter's (the run's working tree carries ``book/``)."""
    tree = ast.parse(Path(path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "methods" for t in n.targets))
    return ast.literal_eval(node.value)


FALLBACK_K = 4  # K for a "k": "auto" method where the pair stores none (the smoke run's toy pair)


def headline_methods(pair) -> tuple[dict[str, dict], list[str]]:
    """Autoregressive decoding and :func:`chapter_methods` (read when the stage runs) as ``generate`` arguments for ``pair``, and a note for each method changed or skipped: a
    drafter the pair lacks skips the method; a θ "auto" with none stored runs without θ; a K "auto" with none
    stored runs at :data:`FALLBACK_K`."""
    methods, notes = {}, []
    for name, spec in ({"autoregressive": {"method": "autoregressive"}} | chapter_methods()).items():
        spec = dict(spec)
        if spec.get("drafter") is not None and spec["drafter"] not in pair.drafters:
            notes.append(f"{name}: skipped (no {spec['drafter']!r} drafter)")
            continue
        if spec.get("confidence") == "auto" and bench.unrunnable(pair, spec):
            del spec["confidence"]
            notes.append(f"{name}: no θ stored, run without one")
        if spec.get("k") == "auto" and bench.unrunnable(pair, spec):
            spec["k"] = FALLBACK_K
            notes.append(f"{name}: no K stored, K = {FALLBACK_K}")
        methods[name] = bench.method_kwargs(pair, bench.stored_k(pair, spec))
    return methods, notes


def graphs_table(df: pd.DataFrame, outputs: dict, methods: dict) -> pd.DataFrame:
    """One row per method and step mode from the interleaved calls ``df`` (runners ``"<method> | graphs"`` and
    ``"<method> | eager"``): tokens/s, α pooled over the calls, paired tokens/s ratios against autoregressive in
    the same mode (``median``, ``q25``, ``q75``) and against eager autoregressive (``vs_eager_ar``), graphs over
    eager for the same method (``graphs_gain``), and the share of prompts whose tokens equal eager
    autoregressive's (``greedy_equal``) and the same method's eager tokens (``same_as_eager``)."""
    alpha = bench.pooled_alpha(df)
    vs_eager_ar = bench.paired_ratios(df, baseline="autoregressive | eager").set_index("runner")
    rows = []
    for mode in ("graphs", "eager"):
        vs_ar = bench.paired_ratios(df[df.runner.str.endswith(f"| {mode}")], baseline=f"autoregressive | {mode}")
        vs_ar = vs_ar.set_index("runner")
        for name, kw in methods.items():
            runner = f"{name} | {mode}"
            eager = f"{name} | eager"
            gain = 1.0
            if mode == "graphs":
                gain = float(bench.paired_ratios(df[df.runner.isin([runner, eager])], baseline=eager)["median"].iloc[0])
            ratio = vs_ar.loc[runner] if runner in vs_ar.index else {"median": 1.0, "q25": 1.0, "q75": 1.0}
            keys = list(outputs[eager])
            same = [outputs[runner][key] == outputs[eager][key] for key in keys]
            rows.append(dict(runner=runner, method=name, graphs=mode == "graphs", k=kw.get("k"),
                             tokens_per_s=float(df[df.runner == runner].tokens_per_s.median()),
                             alpha=float(alpha.get(runner, float("nan"))), median=float(ratio["median"]),
                             q25=float(ratio["q25"]), q75=float(ratio["q75"]),
                             vs_eager_ar=float(vs_eager_ar["median"].get(runner, 1.0)), graphs_gain=gain,
                             greedy_equal=float(np.mean([outputs[runner][key] == outputs["autoregressive | eager"][key]
                                                         for key in keys])),
                             same_as_eager=float(np.mean(same))))
    return pd.DataFrame(rows)


def embedded_pair_or_skip(run: Run, stage: str):
    """:func:`embedded_pair`, or, without one, the stage's table and note saying why (and ``(None, why, [])``)."""
    pair, source, prompts = embedded_pair(run)
    if pair is None:
        run.save(stage, pd.DataFrame([dict(runner="(none)", status=f"skipped: {source}")]))
        run.notes[stage] = f"skipped: {source}"
    return pair, source, prompts


def stage_graphs(run: Run) -> None:
    sz = run.sizes
    pair, source, prompts = embedded_pair_or_skip(run, "graphs")
    if pair is None:
        return
    extra = hybrid_of(pair.drafters)  # a pair from the GGUF file has none: made and calibrated as load_pair does
    calibration.attach(extra, getattr(pair.drafters.get("model"), "calibration", None))
    pair = hub.Pair(pair.target, pair.tokenizer, {**extra, **pair.drafters}, pair.name)
    prompts = prompts[: sz.graphs_prompts]
    methods, notes = headline_methods(pair)
    n = sz.embedded_tokens
    outputs, runners = {}, {}
    for name, kw in methods.items():
        for mode, graphs in (("graphs", True), ("eager", False)):
            outputs[f"{name} | {mode}"] = {}
            runners[f"{name} | {mode}"] = bench.decode_runner(pair.target, n, outputs=outputs[f"{name} | {mode}"],
                                                              graphs=graphs, **kw)
    # a step shape is captured at its first use, per cache size: decode one prompt of each size first, untimed
    sizes = {sized(len(ids) + n + 32, "graph"): ids for _, ids in prompts}
    for ids in sizes.values():
        for r in runners.values():
            r(ids)
    df = bench.run_interleaved(runners, prompts, repeats=sz.graphs_repeats, warmup=0, progress=False)
    table = graphs_table(df, outputs, methods)
    run.save("graphs", table.assign(source=source, max_new_tokens=n, prompts=len(prompts)))
    ar = table.set_index("runner")
    best = table[table.graphs & (table.method != "autoregressive")].sort_values("median").tail(1)
    run.notes["graphs"] = (f"{source}: autoregressive {ar.graphs_gain['autoregressive | graphs']:.2f}× with graphs"
                           + "".join(f"; best with graphs: {r.method} {r.median:.2f}× AR (α {r.alpha:.2f})"
                                     for r in best.itertuples())
                           + f"; greedy identity graphs = eager: {table.same_as_eager.min():.0%} of prompts"
                           + ("; " + "; ".join(notes) if notes else ""))


# -- 6. the real embedded pair --------------------------------------------------------------------------
def embedded_pair(run: Run):
    """``(pair, source, prompts)`` for stages 5 and 6 (loaded once per run), or ``(None, why, [])``."""
    if "pair" not in run.loaded:
        run.loaded["pair"] = _load_embedded(run)
    return run.loaded["pair"]


def _load_embedded(run: Run):
    """The embedded pair from its converted cache ``data/models/smollm2-135m`` (checksums verified, never converted
    here) or from a GGUF file given with ``--gguf`` (needs the ``gguf`` package), with the evaluation prompts; smoke
    runs: a toy pair, random prompts."""

    if run.smoke:
        g = torch.Generator().manual_seed(3)
        prompts = [(dict(id=f"toy{i}", task="toy"), torch.randint(0, 16, (6 + i,), generator=g)) for i in range(2)]
        return sd.toy_pair(vocab_size=16, seed=1, device=run.device), "toy pair (smoke)", prompts
    dtype = torch.float32  # greedy identity between methods needs near-ties to stay put: float32, as on CPU
    if run.gguf:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(run.gguf)
        target = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
        target = target.to(run.device).eval()
        eos = hub.EMBEDDED["smollm2-135m"]["eos_token_id"]
        target.config.eos_token_id = target.generation_config.eos_token_id = eos
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        tok.eos_token = tok.convert_ids_to_tokens(eos)
        drafters = {"ngram": sd.NGramDrafter(), **shipped.load_shipped_drafters(target, dtype, run.device)}
        pair, source = hub.Pair(target, tok, drafters, "smollm2-135m"), "GGUF " + path.name
    else:
        cache = hub.MODELS_DIR / "smollm2-135m"
        if not cache.exists():
            return None, f"no converted weights at {rel(cache)} and no --gguf file", []
        hub.verify_cache(cache)
        pair, source = sd.load_pair("smollm2-135m", dtype=dtype, device=run.device, rebuild=False), "converted cache"
    prompts = [(dict(id=p.id, task=p.task), encode(pair, p)) for p in load_prompts(per_task=run.sizes.embedded_per_task)]
    return pair, source, prompts


def _recorded(runner, store: dict):
    """``runner`` that also keeps each call's tokens under its prompt's ids."""
    def run(ids):
        out = runner(ids)
        store[tuple(ids.tolist())] = out["tokens"]
        return out
    return run


def stage_embedded(run: Run) -> None:
    sz = run.sizes
    pair, source, prompts = embedded_pair_or_skip(run, "embedded")
    if pair is None:
        return
    n = sz.embedded_tokens
    cap = max(len(ids) for _, ids in prompts) + n + 16
    runners = {"ar": bench.generate_runner(pair.target, n), "hf generate": peers.hf_runner(pair.target, n)}
    for k in (2, 3, 4) if "model" in pair.drafters else ():
        runners[f"linear k={k}"] = bench.generate_runner(pair.target, n, method="linear", k=k,
                                                         drafter=pair.drafters["model"])
    mode = "graph" if run.device.type == "cuda" else "eager"
    runners[f"ar static {mode}"] = static_runner(pair.target, n, cap, mode)
    outputs = {name: {} for name in runners}
    runners = {name: _recorded(r, outputs[name]) for name, r in runners.items()}
    df = bench.run_interleaved(runners, prompts, repeats=sz.embedded_repeats, warmup=1, progress=False)
    ratios = bench.paired_ratios(df, baseline="ar")
    ratios["greedy_equal"] = [np.mean([outputs[r][key] == outputs["ar"][key] for key in outputs["ar"]])
                              for r in ratios.runner]
    run.save("embedded", ratios.assign(source=source, max_new_tokens=n, prompts=len(prompts)))
    run.notes["embedded"] = f"{source}: " + "; ".join(f"{r.runner} {r.median:.2f}× AR" for r in ratios.itertuples())


# -- a file in parts (the GGUF file moved in pieces, each with its checksum) -------------------------------------
MIB = 1 << 20


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def split_file(path, out_dir, parts: int | None = None, max_mib: float = 24.0) -> Path:
    """Split ``path`` into ``parts`` pieces of equal size (the last one shorter; default: as few as fit), each at
    most ``max_mib`` MiB, written to ``out_dir`` as ``<name>.part-1-of-N`` …, with the manifest ``<name>.parts.json``:
    the file's name, size and SHA-256, and each part's file name, size and SHA-256. Returns the manifest's path."""
    path, out_dir = Path(path), Path(out_dir)
    size = path.stat().st_size
    limit = int(max_mib * MIB)
    parts = parts or max(1, math.ceil(size / limit))
    step = math.ceil(size / parts)
    if step > limit:
        raise ValueError(f"{path.name} ({size / MIB:.1f} MiB) does not fit {parts} parts of at most {max_mib} MiB: "
                         f"give at least {math.ceil(size / limit)} parts")
    out_dir.mkdir(parents=True, exist_ok=True)
    listed = []
    with open(path, "rb") as f:
        for i in range(parts):
            part = out_dir / f"{path.name}.part-{i + 1}-of-{parts}"
            part.write_bytes(f.read(step))
            listed.append(dict(file=part.name, size=part.stat().st_size, sha256=_sha256(part)))
    manifest = out_dir / f"{path.name}.parts.json"
    spec = dict(name=path.name, size=size, sha256=_sha256(path), parts=listed)
    manifest.write_text(json.dumps(spec, indent=1) + "\n")
    return manifest


def join_parts(manifest, out=None) -> Path:
    """The file a manifest of :func:`split_file` describes, joined from its parts (in the manifest's folder) into
    ``out`` (default: the manifest's folder, under the file's name; kept if it is already there with the right
    checksum). Each part's size and SHA-256, then the whole's, are checked: a missing part, a part that differs or a
    joined file whose checksum differs is refused with a ``ValueError`` naming it, and nothing is left at ``out``."""
    manifest = Path(manifest)
    spec = json.loads(manifest.read_text())
    out = Path(out) if out else manifest.parent / spec["name"]
    if out.exists() and out.stat().st_size == spec["size"] and _sha256(out) == spec["sha256"]:
        return out
    for p in spec["parts"]:
        part = manifest.parent / p["file"]
        if not part.exists():
            raise ValueError(f"part {part} of {spec['name']} is missing ({len(spec['parts'])} parts in {manifest})")
        if part.stat().st_size != p["size"] or _sha256(part) != p["sha256"]:
            raise ValueError(f"part {part} of {spec['name']} differs from the manifest {manifest} (size "
                             f"{part.stat().st_size}, expected {p['size']}; SHA-256 mismatch): copy it again")
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as f:
        for p in spec["parts"]:
            f.write((manifest.parent / p["file"]).read_bytes())
    if _sha256(partial) != spec["sha256"]:
        partial.unlink()
        raise ValueError(f"{spec['name']} joined from {manifest} has the wrong SHA-256: the parts are not this file's")
    partial.replace(out)
    return out


def gguf_file(path) -> Path:
    """``--gguf``: a GGUF file as it is, or the manifest of its parts (``*.parts.json``), joined and checked."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"--gguf {path}: no such file")
    return join_parts(path) if path.name.endswith(".parts.json") else path


# -- the run -----------------------------------------------------------------------------------------------
STAGES = (("core", stage_core), ("bottleneck", stage_bottleneck), ("steps", stage_steps), ("graphs", stage_graphs),
          ("pair", stage_pair_costs), ("embedded", stage_embedded))
MIN_SECONDS = {"core": 60, "bottleneck": 90, "steps": 60, "graphs": 120, "pair": 30, "embedded": 90}


def run_all(run: Run, only: list[str] | None = None) -> Run:
    """Every stage in order (steps before pair costs: the predicted speedups then use the graph-captured costs
    too), each under the deadline and its own try; ``summary.md`` rewritten after each."""
    for name, fn in STAGES:
        if only and name not in only:
            continue
        if not run.smoke and run.left() < MIN_SECONDS[name]:
            run.status[name] = f"skipped ({run.left():.0f} s left)"
        else:
            t0 = time.perf_counter()
            try:
                fn(run)
                run.status[name] = f"ok ({time.perf_counter() - t0:.1f} s)"
            except Exception as e:  # noqa: BLE001 - a failed stage is reported, the others still run
                run.status[name] = f"FAILED ({time.perf_counter() - t0:.1f} s): {type(e).__name__}: {e}"
                run.notes[f"{name} traceback"] = traceback.format_exc(limit=6)
            print(f"[{time.perf_counter() - run.started:6.1f} s] stage {name}: {run.status[name]}", flush=True)
        write_summary(run)
    return run


def environment(device: torch.device) -> dict:
    import platform

    import transformers

    env = {"device": pf.device_tag(device), "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, multiprocessors=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                   cuda=torch.version.cuda)
    else:
        env.update(cpu=pf.cpu_name(), threads=torch.get_num_threads())
    return env


def _table(df: pd.DataFrame, cols: list[str] | None = None) -> str:
    d = df[[c for c in cols if c in df.columns]] if cols else df
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(d.columns) + " |", "|" + "---|" * len(d.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in d.itertuples(index=False)]
    return "\n".join(lines)


def write_summary(run: Run) -> Path:
    """``summary.md``: the environment, each stage's status and one-line finding, the key tables."""
    t = run.tables
    md = [f"# Reference run on {pf.device_tag(run.device)}" + (" (smoke sizes)" if run.smoke else ""), "",
          "Written by `scripts/gpu_reference.py` (`specdec_core/tools/gpu_reference.py`); see `data/reference/README.md`.", "",
          "## Environment", "", *[f"- {k}: {v}" for k, v in environment(run.device).items()],
          f"- wall time so far: {time.perf_counter() - run.started:.0f} s", "", "## Stages", ""]
    md += [f"- **{name}**: {run.status.get(name, 'not run')}" + (f" — {run.notes[name]}" if name in run.notes else "")
           for name, _ in STAGES]
    if "ceilings" in t:
        md += ["", "## Ceilings (CPU against GPU)", "",
               _table(t["ceilings"], ["source", "dtype", "copy_gbps", "gemm_gflops", "ridge_flop_per_byte"])]
    if "knees" in t:
        md += ["", "## t(T)/t(1) and the knee (CPU rows: chapter 1's, trained weights)", "",
               _table(t["knees"], ["source", "model", "mode", "S", "t1_ms", "plateau_ms", "floor_ms",
               "of_copy_bw", "knee_ideal", "knee_measured", "knee_resolved"]), "",
               _table(t["pass_times"].pivot_table(index="T", columns=["model", "mode"], values="ratio")
                      .reset_index().pipe(_flat))]
    if "steps" in t:
        d = t["steps"]
        md += ["", "## Eager against graph-captured steps", "",
               "Per step of T tokens (a T = 1 step is one decoded token). `core`: the library's eager pass "
               "(`CachedLM`, what `sd.generate` runs); `eager`: the static-shape step, not captured; `graph`: it "
               "captured in a CUDA graph; `compile` / `reduce-overhead`: `torch.compile` of it.", "",
               _table(d, ["model", "mode", "T", "ms_per_step", "ms_per_token", "of_core", "of_eager", "setup_s",
                          "toy_identical"])]
        goal = d[(d.model == "target") & (d["T"] == 1) & (d["mode"] == "graph")]
        if not goal.empty:
            r = goal.iloc[0]
            md += ["", f"Goal (graph-captured step of the target's shape ≤ 1/3 of the eager step per token): "
                       f"{r.of_core:.2f}× the core's eager step, {r.of_eager:.2f}× the static eager step — "
                       f"{'met' if max(r.of_core, r.of_eager) <= 1 / 3 else 'NOT met'}."]
    if "pair_costs" in t:
        d = t["pair_costs"]
        md += ["", "## Predicted speedup per K (α measured on CPU: α belongs to the weights, not the hardware)", "",
               _table(d.pivot_table(index=["alpha_source", "K"], columns=["source", "mode"],
                                    values="predicted_speedup").reset_index().pipe(_flat))]
    if "graphs" in t and "method" in t["graphs"]:
        md += ["", "## sd.generate with CUDA graphs against eager (chapter 6's headline methods)", "",
               "`graphs=True` against `graphs=False`, interleaved, greedy. `median` (IQR `q25`–`q75`): tokens/s ÷ "
               "autoregressive's in the same mode, paired by prompt; `vs_eager_ar`: ÷ eager autoregressive's; "
               "`graphs_gain`: ÷ the same method's eager tokens/s; α pooled over the calls; `greedy_equal`: share of "
               "prompts whose tokens equal eager autoregressive's; `same_as_eager`: equal to the method's eager "
               "tokens. On CPU `graphs=True` runs the static steps uncaptured.", "",
               _table(t["graphs"], ["method", "graphs", "k", "tokens_per_s", "alpha", "median", "q25", "q75",
                                    "vs_eager_ar", "graphs_gain", "greedy_equal", "same_as_eager"])]
    if "embedded" in t:
        md += ["", "## The real embedded pair", "", _table(t["embedded"], list(t["embedded"].columns))]
    errors = {k: v for k, v in run.notes.items() if k.endswith("traceback")}
    if errors:
        md += ["", "## Errors", ""] + [f"### {k}\n\n```\n{v}```" for k, v in errors.items()]
    run.out.mkdir(parents=True, exist_ok=True)
    path = run.out / "summary.md"
    path.write_text("\n".join(md) + "\n")
    return path


def _flat(df: pd.DataFrame) -> pd.DataFrame:
    df.columns = [" / ".join(str(x) for x in c if x != "") if isinstance(c, tuple) else c for c in df.columns]
    return df
