"""The CPU matmul library's code path, and what it does to the cost of a verification pass.

On x86 CPUs, torch sends float32 matrix products to Intel MKL, which decides how to run each one. On
some CPUs (the AMD EPYC this book was first run on among them) its default choice runs a product with a
few input rows (M = 2-16, exactly the shape of a speculative verification pass) on one thread however
many are allowed, so a few-token pass costs much more than a one-token pass on several threads. Setting
``MKL_CBWR=AUTO`` (MKL's *conditional numerical reproducibility*: the best path for this CPU, with a fixed
summation order) spreads those products over the threads. Chapter 1 (Going deeper, D) times both settings side
by side on the reader's machine; ``data/reference/`` keeps our run.

MKL reads the variable at its first call, so it must be set before the first matmul of the process.
``import specdec_core`` sets it to ``AUTO`` (in ``specdec_core/__init__.py``) unless it is already set
(``MKL_CBWR=`` — empty — keeps MKL's default dispatch); :func:`compare_paths` measures both paths in
subprocesses, side by side. GPUs and non-MKL builds of torch are unaffected.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .. import kernels
from ..lm import CachedLM
from ..models import load_pair
from . import profiling as pf

VAR = "MKL_CBWR"
DEFAULT = "AUTO"
KERNEL = "rows kernel"  # compare_paths' label for the library's CPU verify kernel


def mode() -> str:
    """The setting this process runs with: ``"AUTO"``, another MKL_CBWR value, or ``"MKL default"``."""
    return os.environ.get(VAR) or "MKL default"


def _pass_times(model: str, token_counts: list[int], context: int, repeats: int, threads: list[int]) -> list[dict]:
    """In this process: median time of one pass over T new tokens after ``context`` cached ones, at each thread
    count in turn (0: torch's default). One process for them all: its start and the model's load cost more than
    the timings at a small size."""
    import torch

    target = load_pair(model).target  # on the path $SPECDEC_CPU_KERNEL names (compare_paths sets it)
    lm = CachedLM(target, context + max(token_counts))
    pf.at_context(lm, context)
    fns = {("pass", T): pf.pass_fn(lm, T, target.config.vocab_size) for T in token_counts}
    fns |= {("bare matmuls", T): pf.linear_chain(target, T) for T in token_counts}
    rows, default = [], torch.get_num_threads()
    for n in threads:
        torch.set_num_threads(n or default)
        s = pf.summarize(pf.time_interleaved(fns, repeats=repeats, warmup=1, device=target.device))
        rows += [dict(what=r.name[0], T=r.name[1], median=r.median, q25=r.q25, q75=r.q75, threads=n)
                 for r in s.itertuples()]
    return rows


def compare_paths(model: str = "smollm2-135m", token_counts=(1, 2, 3, 5, 8, 16), context: int = 128,
                  repeats: int = 5, threads: int | list[int] = 0, settings: dict | None = None, timeout: float = 900,
                  run=subprocess.run):
    """Time passes and the bare matmuls under each path, one fresh subprocess per setting.

    ``settings``: label -> value of ``MKL_CBWR`` (``""`` = MKL's default dispatch; torch's matmul, not the
    library's CPU kernel) or a dict of environment variables (the default's third setting, the kernel of
    :mod:`specdec_core.kernels`: ``MKL_CBWR=AUTO`` and ``SPECDEC_CPU_KERNEL=rows``; left out where it cannot
    be built here); ``threads``: a torch thread
    count or a list of them, timed one after the other in each setting's subprocess (0: torch's default).
    Returns a long DataFrame ``setting, what, T, median, q25, q75, ratio, threads`` (ratio = median / the median at
    T = 1 of the same setting, kind and thread count). The subprocesses run one after the other, never at the same
    time (``run``: the subprocess launcher, ``subprocess.run``'s signature; tests pass a canned one).
    """
    import pandas as pd

    if settings is None:
        settings = {"MKL default": "", f"{VAR}={DEFAULT}": DEFAULT}
        if kernels.load() is not None:
            settings[KERNEL] = {VAR: DEFAULT, kernels.ENV: "rows"}
    token_counts = sorted(set(token_counts) | {1})
    threads = [threads] if isinstance(threads, int) else list(threads)
    if not threads or any(not isinstance(n, int) or n < 0 for n in threads):
        raise ValueError(f"threads must be a count >= 0 (0: torch's default) or a list of them, got {threads}")
    rows = []
    for label, value in settings.items():
        extra = value if isinstance(value, dict) else {VAR: value, kernels.ENV: "torch"}
        env = dict(os.environ, **extra)
        args = json.dumps(dict(model=model, token_counts=token_counts, context=context, repeats=repeats,
                               threads=threads))
        res = run([sys.executable, "-m", "specdec_core.study.blas", args], env=env, capture_output=True,
                  text=True, timeout=timeout)
        if res.returncode != 0:
            said = " ".join(f"{k}={v!r}" for k, v in extra.items())
            raise RuntimeError(f"timing under {said} failed:\n{res.stderr[-2000:]}")
        rows += [dict(r, setting=label) for r in json.loads(res.stdout.strip().splitlines()[-1])]
    df = pd.DataFrame(rows)
    key = ["setting", "what", "threads"]
    t1 = df[df["T"] == 1].set_index(key)["median"]
    df["ratio"] = df["median"] / [t1[k] for k in zip(*(df[c] for c in key))]
    return df[["setting", "what", "T", "median", "q25", "q75", "ratio", "threads"]]


if __name__ == "__main__":  # the subprocess of compare_paths: one JSON line on stdout
    print(json.dumps(_pass_times(**json.loads(sys.argv[1]))))
