"""``generate_batch`` now (on the engine) against ``generate_batch`` of an earlier revision, paired, on the embedded pair.

    .venv/bin/python scripts/bench_generate_batch.py --against 805b90e [--batch 1 4 8] [--repeats 3]

The earlier revision's ``serving/batch.py`` and ``serving/drafters.py`` are read from git (``git show REV:...``)
into a private package beside this checkout's core, so both run in one process on the same model: chapter 9's
methods (autoregressive, prompt lookup K = 8, the model draft K = 4), greedy, 48 new tokens, B prompts of the chat
mix, the two implementations interleaved (which runs first alternates), after a warm-up. Prints, per method and B,
the median and IQR of the paired tokens/s ratios now ÷ then, and whether every output is identical. Writes
``--out`` (a CSV of every call). Timings: run it alone (idle OpenMP threads spin).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

import specdec_core as sd
from specdec_core.record import Timer

ROOT = Path(__file__).resolve().parent.parent


def lockstep(rev: str):
    """The revision's ``generate_batch``, imported as ``_then.batch`` (its relative imports made absolute)."""
    pkg = Path(tempfile.mkdtemp()) / "_then"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("batch", "drafters"):
        src = subprocess.run(["git", "show", f"{rev}:specdec_core/serving/{name}.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        src = src.replace("from ..", "from specdec_core.").replace("from .cache", "from specdec_core.serving.cache")
        (pkg / f"{name}.py").write_text(src.replace("from .drafters", "from _then.drafters"))
    spec = importlib.util.spec_from_file_location("_then", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    sys.modules["_then"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["_then"])
    return importlib.import_module("_then.batch").generate_batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True, help="the revision whose generate_batch is the baseline")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default="build/bench_generate_batch.csv")
    args = ap.parse_args()
    then = lockstep(args.against)
    pair = sd.load_pair("smollm2-135m")
    prompts = [sd.prompts.encode(pair, p) for p in sd.load_prompts(per_task=2)]
    methods = {"autoregressive": dict(method="autoregressive"),
               "linear, n-gram": dict(method="linear", drafter=pair.drafters["ngram"], k=8),
               "linear, model draft": dict(method="linear", drafter=pair.drafters["model"], k=4)}
    fns = {"now": sd.generate_batch, "then": then}
    timer = Timer(None)

    def call(who, B, kw, start):
        batch = [prompts[(start + i) % len(prompts)] for i in range(B)]
        t = timer.now()
        res = fns[who](pair.target, batch, max_new_tokens=args.max_new_tokens, **kw)
        return sum(map(len, res.tokens)) / (timer.now() - t), res.tokens

    for kw in methods.values():  # warm-up
        for who in fns:
            call(who, 2, kw, 0)
    rows = []
    for rnd in range(args.repeats):
        for B in args.batch:
            for name, kw in methods.items():
                order = ["now", "then"] if (rnd + B) % 2 == 0 else ["then", "now"]
                for who in order:
                    tps, toks = call(who, B, kw, rnd * B)
                    rows.append(dict(round=rnd, B=B, method=name, who=who, tokens_per_s=tps, tokens=toks))
                print(f"round {rnd} B {B} {name}: " + ", ".join(f"{r['who']} {r['tokens_per_s']:.1f}"
                                                                for r in rows[-2:]), flush=True)
    df = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df.drop(columns="tokens").to_csv(args.out, index=False)
    wide = df.pivot_table(index=["round", "B", "method"], columns="who", values="tokens_per_s").reset_index()
    wide["ratio"] = wide.now / wide.then
    same = df.pivot_table(index=["round", "B", "method"], columns="who", values="tokens", aggfunc="first")
    q = wide.groupby(["method", "B"]).ratio.quantile([0.25, 0.5, 0.75]).unstack()
    print("generate_batch now ÷ then, tokens/s (paired; median and IQR):")
    print(q.round(3).to_string())
    print(f"overall median {wide.ratio.median():.3f}; identical outputs: {int((same.now == same.then).sum())} "
          f"of {len(same)} pairs")


if __name__ == "__main__":
    main()
