"""Measuring the decode bottleneck: hardware ceilings, per-pass accounting, a timing protocol.

Used by the book's chapters 01 (bottleneck) and 07 (KV cache). Device-agnostic: every function takes
a ``device`` and synchronizes CUDA around its timers.

- ceilings: :func:`copy_bandwidth` (bytes read + written per second by a large tensor copy) and
  :func:`matmul_peak` (FLOP/s of a large square matmul in a given dtype);
- accounting: :class:`Arch` (the shapes of a Llama-like transformers config), :func:`param_count`,
  :func:`pass_cost` (bytes moved and FLOPs of one forward pass over ``T`` new tokens after ``S`` cached
  ones), :func:`roofline_knee` and :func:`fit_roofline`;
- timing: :func:`time_interleaved` (warm-up, interleaved repeats, medians and spread),
  :func:`profile_ops` (per-operator totals from ``torch.profiler``);
- models: :func:`random_llama` (random-weight Llama configurations at 0.5B–8B, for timing only),
  :func:`dispatch_twin` (same depth and head counts, tiny widths: measures framework overhead);
- results: :func:`device_tag`, :func:`reference_dir`, :func:`save_csv` (GPU runs also go to
  ``data/reference/<device>/`` so that readers without one can compare).
"""
from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..kernels import cpu_name  # noqa: F401  (the study names machines by it: profiling.cpu_name)
from ..paths import REFERENCE_DIR
from ..record import Timer, sync  # noqa: F401  (sync: the study's timers and chapters call it as profiling.sync)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# -- devices, dtypes, results ---------------------------------------------------------------------
def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use one of {sorted(DTYPES)}")
    return DTYPES[name]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def progress_bars() -> bool:
    """Whether long loops draw progress bars: yes, unless ``SPECDEC_PROGRESS=0`` (``scripts/run_book.py`` sets it
    for the executed book, whose saved outputs would otherwise keep every redraw of every bar)."""
    return os.environ.get("SPECDEC_PROGRESS", "1") != "0"


def progress_bar(iterable=None, **kw):
    """Plain tqdm (``tqdm.auto`` warns "IProgress not found" in a notebook) with few updates, so an interactive run
    stays readable, and none at all where :func:`progress_bars` says no (the executed book)."""
    from tqdm import tqdm

    kw.setdefault("mininterval", 10)
    kw["disable"] = kw.get("disable", False) or not progress_bars()
    return tqdm(iterable, **kw)


def device_tag(device: torch.device | str) -> str:
    """A filesystem-safe name of the hardware: ``cpu-amd-epyc``, ``cuda-nvidia-h200``, ..."""
    d = torch.device(device)
    name = torch.cuda.get_device_name(d) if d.type == "cuda" else cpu_name()
    return _slug(f"{d.type}-{name}")


def reference_dir(tag: str, root: Path | str | None = None) -> Path:
    """Where reference results of device ``tag`` live: ``<root>/data/reference/<tag>/``."""
    if not tag or _slug(tag) != tag:
        raise ValueError(f"device tag {tag!r} is not a slug (use device_tag())")
    return (Path(root) / "data" / "reference" if root else REFERENCE_DIR) / tag


def save_csv(df, name: str, out_dir: Path | str, device: torch.device | str,
             tag: str | None = None, root: Path | str | None = None) -> list[Path]:
    """Write ``df`` to ``<out_dir>/<name>.csv``; on a CUDA device also to ``reference_dir(tag)``.

    Returns the paths written. ``tag`` defaults to :func:`device_tag` of ``device``.
    """
    paths = [Path(out_dir) / f"{name}.csv"]
    if torch.device(device).type == "cuda":
        paths.append(reference_dir(tag or device_tag(device), root) / f"{name}.csv")
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(p, index=False)
    return paths


# -- timing -----------------------------------------------------------------------------------------
def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1,
                     device: torch.device | str = "cpu", seed: int = 0, progress: bool = False):
    """Time several zero-argument callables against each other.

    Protocol:
    1. warm-up: every callable runs ``warmup`` times (allocator, caches, kernel selection), untimed;
    2. ``repeats`` rounds; in each round every callable runs once, in an order shuffled per round
       (seeded), so slow drifts and bursts of background load fall on all of them alike;
    3. each run is timed by :class:`~specdec_core.record.Timer` (``time.perf_counter`` between two device synchronizations
       (CUDA: ``torch.cuda.synchronize``; CPU: none needed), so a sample is the wall time a caller
       waits, launch overheads included.

    Returns a long-form DataFrame ``name, repeat, seconds`` (one row per run); :func:`summarize`
    turns it into median, quartiles and minimum per name. The book reports medians for what a
    workload costs and the minimum (the fastest run) for a hardware ceiling.
    """
    import pandas as pd

    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    sync(device)
    rng, rows, timer = random.Random(seed), [], Timer(device)
    for r in progress_bar(range(repeats), desc="timing rounds", leave=False, disable=not progress):
        order = names[:]
        rng.shuffle(order)
        for n in order:
            _, seconds = timer.time(fns[n])
            rows.append((n, r, seconds))
    return pd.DataFrame(rows, columns=["name", "repeat", "seconds"])


def at_context(lm, S: int) -> None:
    """Make ``lm``'s cache hold ``S`` committed positions (pointer moves through the cache contract; a pass's
    time depends on how many entries it reads, not on their values)."""
    lm.cache.rollback(lm.length)
    lm.cache.advance(S)


def pass_fn(lm, T: int, vocab: int | None = None, seed: int = 0) -> Callable[[], Any]:
    """A timed callable: one forward pass of ``lm`` over ``T`` tokens (seeded random ids, or ones if ``vocab``
    is None) after its committed positions, committing nothing (``CachedLM.forward(commit=0)``): the
    cache is the same before and after, so the callable can run any number of times."""
    toks = (torch.ones(T, dtype=torch.long) if vocab is None
            else torch.randint(0, vocab, (T,), generator=torch.Generator().manual_seed(seed)))
    return lambda: lm.forward(toks, commit=0)


def summarize(samples, by: str | list[str] = "name"):
    """Median, quartiles, minimum and number of runs of ``seconds`` per ``by`` group."""
    g = samples.groupby(by, sort=False)["seconds"]
    out = g.agg(median="median", q25=lambda s: s.quantile(0.25), q75=lambda s: s.quantile(0.75),
                min="min", runs="count")
    return out.reset_index()


# -- ceilings ---------------------------------------------------------------------------------------
def copy_bandwidth(nbytes: int = 512 << 20, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32, repeats: int = 7) -> dict:
    """Copy one ``nbytes`` buffer into another; bandwidth counts bytes read + bytes written.

    Returns ``gbps_best`` (from the fastest run: the ceiling), ``gbps_median`` and the sizes.
    """
    n = nbytes // (torch.finfo(dtype).bits // 8)
    src = torch.ones(n, dtype=dtype, device=device)
    dst = torch.zeros_like(src)  # both touched before timing (first-touch page faults are not copies)
    s = time_interleaved({"copy": lambda: dst.copy_(src)}, repeats=repeats, warmup=1, device=device)
    moved = 2 * src.nbytes
    t = s["seconds"]
    return dict(bytes_moved=moved, gbps_best=moved / t.min() / 1e9, gbps_median=moved / t.median() / 1e9,
                seconds_median=float(t.median()))


def check_ceiling(rates, ceiling: float, unit: str = "GFLOP/s"):
    """Assert that no measured rate exceeds ``ceiling``: a ceiling below a measurement is no ceiling (take the best
    measured rate as the ceiling instead). ``rates``: a table with columns ``what`` and ``gflops`` (or (what, rate)
    pairs); returns it as a table with ``of_ceiling``, each rate's share of the ceiling."""
    import pandas as pd

    table = rates if isinstance(rates, pd.DataFrame) else pd.DataFrame(list(rates), columns=["what", "gflops"])
    table = table.assign(of_ceiling=table.gflops / ceiling)
    beyond = table[table.gflops > ceiling * (1 + 1e-9)]
    if len(beyond):
        raise AssertionError(f"measured rates above the ceiling ({ceiling:.0f} {unit}): "
                             + "; ".join(f"{r.what} {r.gflops:.0f}" for r in beyond.itertuples()))
    return table


def matmul_peak(n: int = 2048, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                repeats: int = 5) -> dict:
    """``C = A @ B`` with square ``n × n`` operands in ``dtype``: ``2 n³`` FLOPs per run.

    Returns ``gflops_best`` (the ceiling), ``gflops_median`` and ``n``.
    """
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    s = time_interleaved({"mm": lambda: torch.mm(a, b, out=c)}, repeats=repeats, warmup=1, device=device)
    flops, t = 2 * n ** 3, s["seconds"]
    return dict(n=n, flops=flops, gflops_best=flops / t.min() / 1e9, gflops_median=flops / t.median() / 1e9)


# -- accounting -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    """The shapes of a Llama-like decoder (transformers ``LlamaConfig`` field names in brackets).

    L layers [num_hidden_layers], H hidden [hidden_size], I MLP width [intermediate_size],
    nh query heads, nkv key/value heads, hd head dim, V vocabulary; ``tied``: the LM head is the
    embedding matrix.
    """

    L: int
    H: int
    I: int
    nh: int
    nkv: int
    hd: int
    V: int
    tied: bool

    @classmethod
    def from_config(cls, config) -> "Arch":
        c = config.get_text_config() if hasattr(config, "get_text_config") else config
        nkv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
            raise ValueError("the accounting assumes bias-free linears (Llama); this config has biases")
        return cls(L=c.num_hidden_layers, H=c.hidden_size, I=c.intermediate_size, nh=c.num_attention_heads,
                   nkv=nkv, hd=hd, V=c.vocab_size, tied=bool(c.tie_word_embeddings))

    def layer_linears(self) -> list[tuple[str, int, int]]:
        """``(name, out_features, in_features)`` of the seven linears of one decoder layer."""
        H, q, kv = self.H, self.nh * self.hd, self.nkv * self.hd
        return [("q_proj", q, H), ("k_proj", kv, H), ("v_proj", kv, H), ("o_proj", H, q),
                ("gate_proj", self.I, H), ("up_proj", self.I, H), ("down_proj", H, self.I)]

    @property
    def layer_linear_params(self) -> int:
        return sum(o * i for _, o, i in self.layer_linears())

    @property
    def kv_per_token_per_layer(self) -> int:
        """Elements of K and V stored per token per layer: ``2 · nkv · hd``."""
        return 2 * self.nkv * self.hd


def param_count(config) -> int:
    """Number of distinct parameters: embedding, L × (7 linears + 2 norms), final norm, untied LM head."""
    a = Arch.from_config(config)
    return a.V * a.H + a.L * (a.layer_linear_params + 2 * a.H) + a.H + (0 if a.tied else a.V * a.H)


def kv_bytes_per_token(config, dtype_bytes: int, per_layer: bool = False) -> int:
    """KV-cache bytes one token occupies: ``2 · nkv · hd · b`` per layer (times L unless ``per_layer``)."""
    a = Arch.from_config(config)
    return a.kv_per_token_per_layer * dtype_bytes * (1 if per_layer else a.L)


def kv_bytes_per_slot(model) -> int:
    """KV-cache bytes one cache slot of ``model`` takes, in the model's own dtype (all layers, K and V): what a
    :class:`~specdec_core.kvcache.KVCache` allocates per position of capacity, and what each drafted token
    or tree node borrows from the headroom. Reads the shapes as the cache does (any attention config)."""
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    nkv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * nkv * hd * next(model.parameters()).element_size()


def memory_in_use(device: torch.device | str = "cpu") -> int:
    """Bytes in use where a cache lives: allocated device memory on CUDA, else the process's resident memory
    (``/proc/self/statm``)."""
    import os

    d = torch.device(device)
    if d.type == "cuda":
        return torch.cuda.memory_allocated(d)
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pass_cost(config, T: int, S: int, dtype_bytes: int, logits: str = "all", batch: int = 1,
              gqa_expanded: bool = False) -> dict:
    """Bytes moved and FLOPs of one forward pass over ``T`` new tokens after ``S`` cached ones.

    Counted (``b`` bytes per element, ``n_out`` = T logit rows if ``logits == "all"``, else 1):

    - ``weight_bytes``: every weight read once — L × (7 linears + 2 norms) + final norm + the LM head
      (V × H) — plus the T embedding rows gathered;
    - ``kv_read_bytes``: each layer reads K and V for all S + T positions: ``L · 2 nkv hd (S+T) · b``;
      with ``gqa_expanded`` (what transformers' SDPA path does when it passes a mask) the nkv heads are
      first copied out to nh heads, and attention reads those: ``L · 2 (S+T) hd (nkv + 2 nh) · b``;
    - ``kv_write_bytes``: the T new positions written into the cache: ``L · 2 nkv hd T · b``;
    - ``act_bytes``: the input read and the output written by every matmul (``T · (in + out)`` per
      linear, ``n_out · (H + V)`` for the LM head) — elementwise ops (norms, rotary, SiLU) are not counted;
    - ``linear_flops``: ``2 · T · L · (linear params per layer) + 2 · n_out · V · H`` (≈ 2·P·T);
    - ``attn_flops``: QKᵀ and PV over the full T × (S+T) rectangle: ``4 · L · nh · hd · T · (S+T)``.

    Everything scales with ``batch`` except the weights. Returns a dict of these plus ``bytes``,
    ``flops`` and ``intensity`` (FLOP per byte).
    """
    if T < 1 or S < 0 or batch < 1:
        raise ValueError(f"need T >= 1, S >= 0, batch >= 1; got T={T}, S={S}, batch={batch}")
    if logits not in ("all", "last"):
        raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
    a, b = Arch.from_config(config), dtype_bytes
    n_out = T if logits == "all" else 1
    weight = b * (a.L * (a.layer_linear_params + 2 * a.H) + a.H + a.V * a.H + T * a.H)
    if gqa_expanded:
        kv_read = b * batch * a.L * 2 * (S + T) * a.hd * (a.nkv + 2 * a.nh)
    else:
        kv_read = b * batch * a.L * a.kv_per_token_per_layer * (S + T)
    kv_write = b * batch * a.L * a.kv_per_token_per_layer * T
    act = b * batch * (T * a.L * sum(o + i for _, o, i in a.layer_linears()) + n_out * (a.H + a.V))
    linear_flops = 2 * batch * (T * a.L * a.layer_linear_params + n_out * a.V * a.H)
    attn_flops = 4 * batch * a.L * a.nh * a.hd * T * (S + T)
    out = dict(T=T, S=S, batch=batch, weight_bytes=weight, kv_read_bytes=kv_read, kv_write_bytes=kv_write,
               act_bytes=act, linear_flops=linear_flops, attn_flops=attn_flops)
    out["bytes"] = weight + kv_read + kv_write + act
    out["flops"] = linear_flops + attn_flops
    out["intensity"] = out["flops"] / out["bytes"]
    return out


def roofline_time(cost: dict, bw: float, peak: float) -> float:
    """Roofline lower bound on a pass: ``max(bytes / bw, flops / peak)`` (bw in B/s, peak in FLOP/s)."""
    return max(cost["bytes"] / bw, cost["flops"] / peak)


def roofline_knee(config, S: int, dtype_bytes: int, bw: float, peak: float, logits: str = "all",
                  t_max: float = 1 << 16, **kw) -> float:
    """The (real-valued) T at which compute time ``flops/peak`` overtakes memory time ``bytes/bw``.

    Below it a pass costs about as much as a one-token pass; the ridge point ``peak / bw`` is the
    arithmetic intensity at which this happens. Found by bisection; 1.0 if compute-bound at T = 1.
    """
    def f(T: float) -> float:
        # pass_cost is polynomial in T; evaluate it at real T by linear interpolation between integers
        lo = int(T)
        c0, c1 = pass_cost(config, lo, S, dtype_bytes, logits, **kw), pass_cost(config, lo + 1, S, dtype_bytes, logits, **kw)
        w = T - lo
        flops = (1 - w) * c0["flops"] + w * c1["flops"]
        nbytes = (1 - w) * c0["bytes"] + w * c1["bytes"]
        return flops / peak - nbytes / bw

    if f(1.0) >= 0:
        return 1.0
    lo, hi = 1.0, 2.0
    while f(hi) < 0:
        lo, hi = hi, hi * 2
        if hi > t_max:
            raise ValueError("no knee below t_max: the pass stays memory-bound")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def fit_roofline(T, t, grid: int = 400) -> dict:
    """Fit a measured curve ``t(T)`` with the roofline shape ``max(a, s·T)``; its knee is ``a / s``.

    Least squares on ``log t`` (every point weighs the same whatever its size): for each candidate
    knee K on a log grid from 1 to 4·max(T), ``log s`` is the mean of ``log t − log max(K, T)``; the K
    with the smallest residual wins. Returns ``knee``, ``plateau`` a (seconds), ``slope`` s (seconds
    per token above the knee), ``rms_log`` (the fit's residual) and ``resolved`` (False when the
    knee lies beyond the largest T measured: the curve is still flat there).
    """
    import numpy as np

    T, t = np.asarray(T, dtype=float), np.asarray(t, dtype=float)
    if T.size < 3 or (t <= 0).any():
        raise ValueError("fit_roofline needs at least 3 points with positive times")
    lt, best = np.log(t), None
    for K in np.exp(np.linspace(0.0, np.log(4 * T.max()), grid)):
        r = lt - np.log(np.maximum(K, T))
        ls = r.mean()
        rms = float(np.sqrt(np.mean((r - ls) ** 2)))
        if best is None or rms < best[0]:
            best = (rms, float(K), float(ls))
    rms, K, ls = best
    s = float(np.exp(ls))
    return dict(knee=K, plateau=s * K, slope=s, rms_log=rms, resolved=bool(K < T.max()))


# -- models for timing ------------------------------------------------------------------------------
# Shapes of public models, as Llama configs (bias-free). Random weights: for timing only.
LLAMA_SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, head_dim=64, vocab_size=151936, tie_word_embeddings=True),   # Qwen2.5-0.5B
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True),     # Llama-3.2-1B
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=True),    # Llama-3.2-3B
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False),  # Llama-3.1-8B
}


def llama_config(size: str, **overrides):
    """A ``LlamaConfig`` with the shapes of ``LLAMA_SHAPES[size]``."""
    from transformers import LlamaConfig

    if size not in LLAMA_SHAPES:
        raise ValueError(f"unknown size {size!r}: use one of {sorted(LLAMA_SHAPES)}")
    kw = dict(LLAMA_SHAPES[size], max_position_embeddings=131072, rope_theta=500000.0, bos_token_id=None,
              eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    kw.update(overrides)
    return LlamaConfig(**kw)


@torch.no_grad()
def _fill(model: torch.nn.Module, seed: int) -> None:
    """Fill every parameter with a tiled block of N(0, 0.02²) values (cheap; no NaNs or denormals)."""
    p0 = next(model.parameters())
    tile = (torch.randn(1 << 20, generator=torch.Generator().manual_seed(seed)) * 0.02).to(p0.device, p0.dtype)
    for p in model.parameters():
        flat = p.view(-1)
        for i in range(0, flat.numel(), tile.numel()):
            n = min(tile.numel(), flat.numel() - i)
            flat[i:i + n].copy_(tile[:n])
        if p.dim() == 1:  # norm weights: ones, as a trained model's would be of order one
            p.fill_(1.0)


def build_llama(config, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0, label: str = ""):
    """A ``LlamaForCausalLM`` of ``config`` with random weights, built directly on ``device``.

    Skips transformers' weight initialization (slow at 1B+) and fills the weights with a tiled random
    block instead. ``model.label`` says what it is.
    """
    from transformers import LlamaForCausalLM
    try:
        from transformers.modeling_utils import no_init_weights
    except ImportError:  # transformers 5.x
        from transformers.initialization import no_init_weights

    with torch.device(device), no_init_weights():
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.tie_weights()
    _fill(model, seed)
    model.label = label or "random weights"
    return model.eval()


def random_llama(size: str, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0):
    """A random-weight Llama with the shapes of ``LLAMA_SHAPES[size]`` — labelled as such.

    Timing does not depend on weight values, so these stand in for trained models of that size.
    """
    return build_llama(llama_config(size), dtype, device, seed, label=f"llama-{size} (random weights)")


def dispatch_twin(config, dtype: torch.dtype = torch.float32, device="cpu", head_dim: int = 4):
    """Same depth and head counts as ``config`` but every width tiny (head dim ``head_dim``, hidden 16, vocab 64).

    Its matmuls cost almost nothing, so the time of a pass is the framework's own: Python, module
    calls, mask and cache bookkeeping, kernel dispatch of the same number of operators. ``head_dim``: a twin
    whose attention should take the same kernel as the model's needs a head dim that kernel takes (the CPU
    kernel's attention wants a multiple of its vector width, ``kernels`` ``LANES``).
    """
    from transformers import LlamaConfig

    if not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    a = Arch.from_config(config)
    twin = LlamaConfig(hidden_size=16, intermediate_size=16, num_hidden_layers=a.L, num_attention_heads=a.nh,
                       num_key_value_heads=a.nkv, head_dim=head_dim, vocab_size=64, tie_word_embeddings=a.tied,
                       max_position_embeddings=131072, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       attn_implementation="sdpa")
    return build_llama(twin, dtype, device, label=f"dispatch twin ({a.L} layers, tiny widths)")


# -- operator-level measurements ------------------------------------------------------------------
def model_linears(model) -> list[torch.Tensor]:
    """The weight matrices of every ``nn.Linear`` in ``model`` (the LM head included), in call order."""
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]


def matmul_chain(weights: list[torch.Tensor], M: int, transposed: bool = False) -> Callable[[], None]:
    """A callable running ``x @ Wᵀ`` for every weight, with ``M`` input rows: the model's matmuls, bare.

    ``transposed=False`` calls ``F.linear(x, W)`` on the weights as stored ``[out, in]`` (what the model
    does); ``transposed=True`` expects weights stored ``[in, out]`` and calls ``x @ W``.
    """
    w0 = weights[0]
    ins = sorted({w.shape[0 if transposed else 1] for w in weights})
    xs = {i: torch.randn(M, i, generator=torch.Generator().manual_seed(i)).to(w0.device, w0.dtype) for i in ins}
    F = torch.nn.functional

    if transposed:
        def run():
            for w in weights:
                xs[w.shape[0]] @ w
    else:
        def run():
            for w in weights:
                F.linear(xs[w.shape[1]], w)
    return run


def linear_chain(model, M: int) -> Callable[[], None]:
    """A callable running every ``nn.Linear`` of ``model`` (the LM head included) on ``M`` input rows, through the
    modules themselves: the path the model's passes take (torch's matmul, or the CPU kernel where
    :mod:`specdec_core.kernels` installed it), without the rest of the pass."""
    mods = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    p = mods[0].weight
    xs = {m.in_features: torch.randn(M, m.in_features, generator=torch.Generator().manual_seed(m.in_features))
          .to(p.device, p.dtype) for m in mods}

    def run():
        with torch.no_grad():
            for m in mods:
                m(xs[m.in_features])
    return run


MODULES_RANGE = "linear layers (forward)"  # profile_ops' default name for the range of the modules it marks


def profile_ops(fn: Callable[[], Any], device: torch.device | str = "cpu", repeats: int = 3, modules=(),
                label: str = MODULES_RANGE):
    """Per-operator times of ``fn`` from ``torch.profiler``, averaged over ``repeats`` calls.

    Returns a DataFrame ``op, calls, self_s, total_s`` (seconds per call of ``fn``; ``total_s``
    includes the operator's children — on CUDA both are device times, so kernels appear under their
    own names and ``aten::mm``'s kernels count in its ``total_s``), sorted by ``self_s``; and the wall
    time per call measured around the profiled runs (``df.attrs["wall_s"]``).

    ``modules``: modules whose every forward call is recorded as one range named ``label`` (a row of the table;
    its ``calls`` count the forward calls). The profiler sees torch's operators only: a compiled kernel called
    from Python, such as the CPU kernel of :mod:`specdec_core.kernels` that the model's linear layers run, shows
    up nowhere, and its time falls outside every operator. Inside the range it counts: the range's ``total_s``
    is the time spent in those modules, on whatever path they run.
    """
    import pandas as pd
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    sync(device)
    open_ranges, handles = [], []

    def enter(module, args):
        r = record_function(label)
        r.__enter__()
        open_ranges.append(r)

    def leave(module, args, output):
        open_ranges.pop().__exit__(None, None, None)

    try:
        for m in modules:
            handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
        with profile(activities=acts) as prof:
            timer = Timer(device)
            t0 = timer.now()
            for _ in range(repeats):
                fn()
            wall = (timer.now() - t0) / repeats
    finally:
        for h in handles:
            h.remove()
        while open_ranges:  # a forward that raised leaves its range open
            open_ranges.pop().__exit__(None, None, None)
    rows = []
    for e in prof.key_averages():
        self_us = e.self_device_time_total if cuda else e.self_cpu_time_total
        total_us = e.device_time_total if cuda else e.cpu_time_total
        if self_us > 0 or total_us > 0:
            rows.append((e.key, e.count / repeats, self_us / 1e6 / repeats, total_us / 1e6 / repeats))
    df = pd.DataFrame(rows, columns=["op", "calls", "self_s", "total_s"]).sort_values("self_s", ascending=False)
    df = df.reset_index(drop=True)
    df.attrs["wall_s"] = wall
    return df
