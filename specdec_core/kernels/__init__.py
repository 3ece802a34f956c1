"""A CPU path for passes over a few tokens: the target's linear layers through a kernel compiled for this machine.

Speculative decoding rests on a pass over T new tokens costing about one pass over one token, because both read
every weight once. With Intel MKL on some CPUs (the 2-core Intel Xeon with AVX-512 of chapter 1's measurements
among them) a float32 product with a few input rows costs far more than one with a single row: MKL packs the
operands into panels on every call and picks tile shapes for large products, so t(8)/t(1) of the bare matmuls
is about 2 where the memory traffic says about 1. ``rows.cpp`` is a product built for this shape: the weights are
packed once, when the model is set up, each thread streams its share of them once for all rows, and the
multiply-adds run while the stream is in flight. It has a second property: every output is one accumulator over k
in a fixed order, so a row's result does not depend on how many rows share the call (row invariance): a position
verified with 31 others gets the same logits, bit for bit, as one decoded alone.

- :func:`load` compiles ``rows.cpp`` once per source, CPU and torch version (``torch.utils.cpp_extension``, about
  half a minute; cached under ``build/kernels/``), or returns ``None`` with a one-line notice where it cannot (no
  compiler, no AVX2).
- :func:`install` points a model's ``nn.Linear`` layers (the tied LM head included) at the kernel for inputs of up
  to ``max_rows`` rows (verify passes, the engine's packed passes, prompts' prefills up to :data:`MAX_ROWS`
  tokens); longer inputs and anything not float32 on CPU or needing gradients keep torch's path.
- :func:`install` also lets attention over the cache read grouped key/value heads as they are (:func:`gqa_sdpa`):
  transformers copies them out to every query head in each pass over more than one token.
- :func:`calibrate` times both paths on the model's own layers and keeps the kernel only where it wins; the verdict
  is cached beside the build and printed once (:func:`choose`, which :func:`~specdec_core.models.load_pair` calls
  for CPU float32 targets).

``SPECDEC_CPU_KERNEL``: ``auto`` (default: calibrate), ``rows`` (always the kernel), ``torch`` (never).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import sys
import time
import warnings
from contextvars import ContextVar
from pathlib import Path

import torch
import torch.nn.functional as F

from ..paths import BUILD, rel

SOURCE = Path(__file__).with_name("rows.cpp")
ENV = "SPECDEC_CPU_KERNEL"
CHOICES = ("auto", "rows", "torch")
MAX_ROWS = 512  # the longest input the kernel takes: a verify pass (K + 1 tokens or tree nodes), the engine's packed
# pass over all its rows' feeds (8 rows of 9 tokens are 72), a prompt's prefill; the calibration times both paths
# up to this many rows on the machine (CALIBRATION_COUNTS), and chapter 1 reports what it found
CALIBRATION_COUNTS = (1, 2, 5, 9, 17, 25, 33, 49, 64, 96, 128, 256, 512)  # the row counts calibrate() times

_module = None  # the compiled extension, once loaded
_failure: str | None = None  # why it could not be, once tried
_announced: set[str] = set()


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (falls back to ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_key() -> str:
    """What a build and a calibration depend on: the source, the CPU, torch and Python."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{cpu_name()}|{platform.machine()}|{torch.__version__}|{sys.version_info[:2]}".encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    return BUILD / "kernels" / machine_key()


def load(verbose: bool = False):
    """The compiled ``rows`` extension, building it on first use; ``None`` (and :func:`failure` says why) where this
    machine cannot build or run it."""
    global _module, _failure
    if _module is None and _failure is None:
        _module, _failure = build(verbose=verbose)
    return _module


def build(builder=None, verbose: bool = False):
    """Compile ``rows.cpp`` (``builder``: ``torch.utils.cpp_extension.load``'s signature, the default); returns
    ``(module, None)``, or ``(None, why)`` where it cannot: no compiler, no ninja, no AVX2, not x86-64."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None, f"the kernel is written for x86-64 CPUs, this one is {platform.machine()}"
    try:
        if builder is None:
            from torch.utils.cpp_extension import load as builder
        out = build_dir()
        out.mkdir(parents=True, exist_ok=True)
        fresh = not any(out.glob("*.so"))
        if fresh:
            print(f"specdec: compiling the CPU verify kernel for this machine (once, about 30 s) in {rel(out)}",
                  file=sys.stderr, flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = builder(f"specdec_rows_{machine_key()}", [str(SOURCE)], build_directory=str(out),
                             extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                             verbose=verbose)
    except Exception as e:  # no compiler, no ninja, no AVX2: torch's path stays, with the reason
        last = [line for line in str(e).strip().splitlines() if line.strip()][-1:] or [type(e).__name__]
        return None, f"{type(e).__name__}: {last[0][:200]}"
    return module, None


def failure() -> str | None:
    """Why :func:`load` returned ``None`` (``None`` before it was tried or when it worked)."""
    return _failure


class RowsLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose inputs of up to ``max_rows`` rows go through the packed kernel (CPU, float32, no
    gradient); everything else, and every parameter, state dict and hook, is ``nn.Linear``'s. The packed copy of the
    weight is rebuilt when the weight changes (its version counter or storage)."""

    max_rows: int = MAX_ROWS
    _packed = None
    _packed_of = None

    def packed(self) -> torch.Tensor:
        w = self.weight
        key = (w.data_ptr(), w._version, tuple(w.shape))
        if self._packed_of != key:
            self._packed = _module.pack(w.detach())
            self._packed_of = key
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = x.numel() // x.shape[-1] if x.dim() else 0
        if (0 < rows <= self.max_rows and x.dtype == torch.float32 and w.dtype == torch.float32
                and x.device.type == "cpu" and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return _module.linear(x, self.packed(), w.shape[0], self.bias)
        return F.linear(x, w, self.bias)


def linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def install(model: torch.nn.Module, max_rows: int = MAX_ROWS) -> int:
    """Route ``model``'s linear layers through the kernel for inputs of up to ``max_rows`` rows. Returns how many
    layers it covers. Raises ``RuntimeError`` where the kernel cannot be built (see :func:`failure`)."""
    if not isinstance(max_rows, int) or not 1 <= max_rows <= MAX_ROWS:
        raise ValueError(f"max_rows must be an int in 1..{MAX_ROWS}, got {max_rows!r}")
    if load() is None:
        raise RuntimeError(f"the CPU verify kernel is not available here: {_failure}")
    layers = linears(model)
    for m in layers:
        if type(m) is torch.nn.Linear:
            m.__class__ = RowsLinear
        if isinstance(m, RowsLinear):
            m.max_rows = max_rows
            m.packed()
    for cfg in _configs(model):  # the model's and any submodule's (a draft's trunk keeps its own config)
        if cfg._attn_implementation in ("sdpa", GQA_SDPA):
            register_gqa_sdpa()
            cfg._attn_implementation = ROWS_ATTENTION
    model._specdec_kernel = "rows"
    return len(layers)


def _configs(model: torch.nn.Module) -> list:
    """The distinct configs of ``model`` and its submodules (each module's ``config`` attribute, where it has one)."""
    seen = {}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


def uninstall(model: torch.nn.Module) -> None:
    """Back to torch's path (the packed copies are dropped)."""
    for m in linears(model):
        if type(m) is RowsLinear:
            m.__class__ = torch.nn.Linear
            for attr in ("_packed", "_packed_of", "max_rows"):
                m.__dict__.pop(attr, None)
    for cfg in _configs(model):
        if cfg._attn_implementation == ROWS_ATTENTION:
            cfg._attn_implementation = "sdpa"
    model._specdec_kernel = "torch"


def path_of(model: torch.nn.Module) -> str:
    """``"rows"`` where :func:`install` routed the model's few-row passes through the kernel, else ``"torch"``."""
    return getattr(model, "_specdec_kernel", "torch")


def _chain(weights, M: int, fn):
    xs = {}
    for w, p in weights:
        xs.setdefault(w.shape[1], torch.randn(M, w.shape[1], generator=torch.Generator().manual_seed(M)))

    def run():
        for w, p in weights:
            fn(xs[w.shape[1]], w, p)
    return run


def calibrate(model: torch.nn.Module, token_counts=CALIBRATION_COUNTS, repeats: int = 9) -> dict:
    """Time the model's linear layers as one chain under both paths at each row count, interleaved, median of
    ``repeats``; returns ``{"torch": {T: s}, "rows": {T: s}, "choice": "rows"|"torch", "max_rows": int, ...}``,
    the choice made by :func:`decide` from the timings."""
    if load() is None:
        return dict(choice="torch", reason=_failure)
    token_counts = sorted(set(token_counts) | {1})
    weights = []
    seen = set()
    for m in linears(model):
        if id(m.weight) not in seen and m.weight.dtype == torch.float32:
            seen.add(id(m.weight))
            weights.append((m.weight.detach(), _module.pack(m.weight.detach())))
    fns = {}
    for T in token_counts:
        fns["torch", T] = _chain(weights, T, lambda x, w, p: F.linear(x, w))
        fns["rows", T] = _chain(weights, T, lambda x, w, p: _module.linear(x, p, w.shape[0], None))
    samples = {k: [] for k in fns}
    with torch.no_grad():
        for f in fns.values():
            f()
        for _ in range(repeats):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                samples[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in samples.items()}
    out = {path: {T: med[path, T] for T in token_counts} for path in ("torch", "rows")}
    out.update(decide(out["torch"], out["rows"]))
    out.update(isa=_module.ISA, layers=len(weights), repeats=repeats, cpu=cpu_name())
    return out


ONE_ROW_SLACK = 1.05  # the kernel may be this much slower at one row (a decoded token) and still be chosen:
# the calibration's noise there (the embedded target's two paths measured 0.92-1.04 of each other across clones
# of one machine, chapter 1's whole passes 0.97)
ROW_SLACK = 1.2  # ... and this much slower at any count it takes (MKL's 2-row product is as fast as its 1-row
# one, the kernel's flat from 1 to 5 rows): one path for every count keeps a pass's logits row-invariant


def decide(torch_s: dict, rows_s: dict) -> dict:
    """The path a calibration's timings (row count → seconds, for torch and the kernel) choose: ``{"choice":
    "rows", "max_rows": T}`` or ``{"choice": "torch", "max_rows": 0, "reason": ...}``.

    The kernel takes every row count up to ``max_rows``: the largest measured count it is faster at, before the
    first one where it is more than ``ROW_SLACK`` slower (the kernel's limit if it never is). It is chosen when it
    is no more than ``ONE_ROW_SLACK`` slower at one row, covers more than one row and saves time over the counts
    it takes, summed. A loss at one count is not a veto: on MKL a product of 2 rows can cost no more than 1 row
    (its 1-row path is a different routine), so a kernel a few per cent behind at 2 rows and 40 % ahead at 5 to
    9 -- the verify passes -- was refused by a rule that required a win at 2 rows."""
    counts = sorted(set(torch_s) & set(rows_s))
    if 1 not in counts:
        raise ValueError(f"a calibration needs a one-row timing, got row counts {counts}")
    if rows_s[1] > ONE_ROW_SLACK * torch_s[1]:
        return dict(choice="torch", max_rows=0, reason="slower at one row")
    bad = next((T for T in counts if rows_s[T] > ROW_SLACK * torch_s[T]), None)
    taken = [T for T in counts if bad is None or T < bad]
    wins = [T for T in taken if rows_s[T] < torch_s[T]]
    max_rows = MAX_ROWS if bad is None and wins and wins[-1] == counts[-1] else max(wins, default=1)
    taken = [T for T in taken if T <= max_rows]
    if max_rows < 2 or sum(rows_s[T] for T in taken) >= sum(torch_s[T] for T in taken):
        return dict(choice="torch", max_rows=0, reason="no faster at a few rows")
    return dict(choice="rows", max_rows=max_rows)


def _signature(model) -> str:
    shapes = sorted({tuple(m.weight.shape) for m in linears(model)})  # and what a calibration measures
    return hashlib.sha256(repr((shapes, CALIBRATION_COUNTS, MAX_ROWS)).encode()).hexdigest()[:12]


def summary(cal: dict) -> str:
    """One line: what the calibration measured and chose."""
    if "rows" not in cal:
        return f"torch's matmul (the kernel is unavailable: {cal.get('reason')})"
    ts = sorted(cal["torch"])
    T = max(t for t in ts if t <= 9)
    r_t = cal["torch"][T] / cal["torch"][1]
    r_k = cal["rows"][T] / cal["rows"][1]
    one = cal["rows"][1] / cal["torch"][1]
    what = (f"the rows kernel ({cal['isa']}) for passes of up to {cal['max_rows']} tokens"
            if cal["choice"] == "rows" else f"torch's matmul ({cal['reason']})")
    return (f"{what}; linear layers t({T})/t(1) {r_k:.2f} with the kernel, {r_t:.2f} with torch; "
            f"t(1) kernel/torch {one:.2f}")


def choose(model: torch.nn.Module, mode: str | None = None, quiet: bool = False, built=None) -> str:
    """Pick the path for a CPU float32 model and apply it; returns ``"rows"`` or ``"torch"``.

    ``mode`` (default: ``$SPECDEC_CPU_KERNEL`` or ``"auto"``): ``"auto"`` runs :func:`calibrate` once per machine,
    source and model shape (cached in ``build/kernels/``) and follows it; ``"rows"`` installs the kernel (an error
    where it cannot be built); ``"torch"`` leaves the model as it is. The choice is printed once per process.
    ``built``: the ``(module, failure)`` pair of :func:`build` to judge by (default: this process's :func:`load`)."""
    mode = (mode or os.environ.get(ENV) or "auto").lower()
    if mode not in CHOICES:
        raise ValueError(f"{ENV} must be one of {CHOICES}, got {mode!r}")
    first = next(model.parameters(), None)
    if mode == "torch" or first is None or first.device.type != "cpu" or first.dtype != torch.float32:
        return "torch"
    if mode == "rows":
        install(model)
        return "rows"
    module, why = built if built is not None else (load(), _failure)
    if module is None:
        _say(f"specdec: CPU verify path: torch's matmul ({why})", quiet)
        return "torch"
    cache = build_dir() / f"calibration-{_signature(model)}.json"
    try:
        cal = json.loads(cache.read_text())
        cal["torch"] = {int(k): v for k, v in cal["torch"].items()}
        cal["rows"] = {int(k): v for k, v in cal["rows"].items()}
        cal.pop("reason", None)
        cal.update(decide(cal["torch"], cal["rows"]))  # the timings are cached, the rule is today's
        fresh = False
    except (OSError, ValueError, KeyError):
        cal = calibrate(model)
        cache.write_text(json.dumps(cal, indent=1))
        fresh = True
    _say(f"specdec: CPU verify path: {summary(cal)} "
         f"({'calibrated now' if fresh else 'calibration cached'} in {rel(cache)}; {ENV}=rows|torch overrides)",
         quiet)
    if cal["choice"] == "rows":
        install(model, cal["max_rows"])
    return cal["choice"]


# -- attention over the cache ------------------------------------------------------------------------------------
GQA_SDPA = "specdec_gqa_sdpa"

# A pass that packs several sequences' tokens into one (serving.cache.BatchLM: every row's feed back to back, no
# padding) sets this to the function that attends each row's queries to that row's keys; the two attention
# functions below hand it their call, and it calls them back with this unset: the kernel's once, packed
# (takes_packed), sdpa's unpacked (every row's first queries at once, then each longer row's others). Unset, they
# are what they say.
PACKED_ATTENTION: ContextVar = ContextVar("specdec_packed_attention", default=None)


def _packable(attend):
    @functools.wraps(attend)
    def attention(*args, **kwargs):
        packed = PACKED_ATTENTION.get()
        return attend(*args, **kwargs) if packed is None else packed(attend, *args, **kwargs)
    return attention


@_packable
def gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' ``sdpa`` attention, except that grouped key/value heads go to the kernel as they are
    (``enable_gqa``) also under a mask: transformers copies them out to every query head whenever a mask is given
    (every pass over more than one token after a cache, and every batch pass), 3x the keys and values of every
    layer for the embedded target. The same kernel computes the same numbers (tests/test_kernels.py)."""
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    if is_causal is None:  # as transformers decides it: an unmasked pass over several tokens is a causal prefill
        is_causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=is_causal, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


ROWS_ATTENTION = "specdec_rows_attention"


@_packable
def rows_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, queries=None,
                   **kwargs):
    """Attention through the kernel's ``attention`` (each query row over the keys its mask leaves open, in a fixed
    order: row-invariant) for float32 CPU passes that bring a mask or hold one query; anything else (a prefill
    from an empty cache, which transformers runs unmasked as causal; dropout; another dtype) goes to
    :func:`gqa_sdpa`. ``queries`` (int64 ``[B]``, the kernel's path only, :func:`takes_packed`): a packed call,
    ``query`` ``[1, heads, N, head_dim]`` holding row b's ``queries[b]`` queries back to back, the mask that of the
    rows padded to the longest; the output is ``[1, N, heads, head_dim]``."""
    if not _kernel_takes(query, attention_mask, dropout):
        if queries is not None:
            raise ValueError("rows_attention: a packed call (queries) needs the kernel's path (takes_packed)")
        return gqa_sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return _module.attention(query, key, value, attention_mask, float(scale), queries), None


def _kernel_takes(query, attention_mask, dropout) -> bool:
    return not (query.dtype != torch.float32 or query.device.type != "cpu" or dropout or _module is None
                or query.shape[-1] % _module.LANES != 0 or (attention_mask is None and query.shape[2] > 1))


def takes_packed(attend, query, attention_mask, dropout=0.0) -> bool:
    """Whether ``attend`` (the attention function a packed call was handed, :data:`PACKED_ATTENTION`) takes all of
    a packed pass's rows in one call, their queries as they are (``queries``: each row's count): the rows kernel's
    path, which gives each query the same bits as any other call would."""
    return attend is rows_attention.__wrapped__ and _kernel_takes(query, attention_mask, dropout)


@functools.cache
def use_gqa_sdpa(model: torch.nn.Module) -> None:
    """Every config of ``model`` set to ``sdpa`` runs :func:`gqa_sdpa` from now on (the same kernel, the same
    numbers, without transformers' copies of the key/value heads under a mask); any other attention implementation,
    the rows kernel's included, is left alone. Set once, when a batch is bound to the model
    (:class:`~specdec_core.serving.cache.BatchLM`), never toggled around a pass: a model shared by the single-sequence
    and the batched paths keeps one attention setting."""
    for cfg in _configs(model):
        if cfg._attn_implementation == "sdpa":
            register_gqa_sdpa()
            cfg._attn_implementation = GQA_SDPA


def register_gqa_sdpa() -> None:
    """Register :func:`gqa_sdpa` with transformers as ``GQA_SDPA`` (once, at first use: importing the library
    stays light)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(GQA_SDPA, gqa_sdpa)
    AttentionInterface.register(ROWS_ATTENTION, rows_attention)
    for name in (GQA_SDPA, ROWS_ATTENTION):
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)  # the masks transformers builds for sdpa


def announce(paths: dict[str, str]) -> None:
    """One line for a loaded pair: each model's CPU verify path (``{"target": "rows", "model": "torch"}``), printed once
    per process; the calibration behind it is in ``build/kernels/`` (:func:`choose` prints it when not quiet)."""
    if paths:
        by = {}
        for name, path in paths.items():
            by.setdefault("rows kernel" if path == "rows" else "torch", []).append(name)
        said = "; ".join(f"{path} for {', '.join(names)}" for path, names in by.items())
        _say(f"specdec: CPU verify path: {said} ({ENV}=rows|torch overrides)", False)


def _say(line: str, quiet: bool) -> None:
    if not quiet and line not in _announced:
        _announced.add(line)
        print(line, file=sys.stderr, flush=True)
