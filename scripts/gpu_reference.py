"""The book on a GPU, in one command: the core's CUDA path, chapter 1's measurements, the embedded pair's costs and
the speedups they predict, eager against graph-captured decode steps, sd.generate with CUDA graphs against eager, and
the real pair when its weights are there.

    python scripts/gpu_reference.py                       # on a GPU machine: data/reference/cuda-<device>/
    python scripts/gpu_reference.py --device cpu --smoke  # every stage at tiny sizes, in under a minute (a test)
    python scripts/gpu_reference.py --gguf .gguf/SmolLM2-135M-Instruct.Q4_1.gguf.parts.json   # the real pair, in parts

The stages and outputs are described in data/reference/README.md and specdec_core/tools/gpu_reference.py. Each stage runs
under the deadline (--budget) and its own try: one that fails or does not fit is reported in summary.md and
the others still run. The exit status is 1 if a stage failed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from specdec_core.paths import BUILD
from specdec_core.study import profiling
from specdec_core.tools import gpu_reference as gpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: every stage in under a minute")
    ap.add_argument("--out", help="output folder (default: data/reference/<device>/ on a GPU, build/gpu-reference/"
                                  "<device>[-smoke]/ otherwise)")
    ap.add_argument("--root", help="write to ROOT/<device>/ instead (e.g. a folder that is copied back)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run; stages that no longer fit are skipped (default 450 on a GPU)")
    ap.add_argument("--only", nargs="+", choices=[n for n, _ in gpu.STAGES], help="run only these stages")
    ap.add_argument("--compile", nargs="*", default=None, choices=["compile", "reduce-overhead"],
                    help="torch.compile modes timed beside eager (default: compile on CPU, reduce-overhead on a GPU)")
    ap.add_argument("--gguf", help="the embedded target's GGUF file, for the graphs and embedded stages when no "
                                   "converted cache is there; or the manifest of its parts (scripts/split_file.py), "
                                   "joined and checked first")
    ap.add_argument("--threads", type=int, help="CPU threads (default: torch's; 1 for a smoke run, whose timings "
                                                "mean nothing and whose threads would only contend with others)")
    args = ap.parse_args(argv)

    try:
        gguf = str(gpu.gguf_file(args.gguf)) if args.gguf else None
    except ValueError as e:
        ap.error(str(e))
    device = torch.device(args.device)
    threads = args.threads or (1 if args.smoke and device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    tag = profiling.device_tag(device)
    if args.out:
        out = Path(args.out)
    elif args.root:
        out = Path(args.root) / tag
    elif device.type == "cuda" and not args.smoke:
        out = profiling.reference_dir(tag)
    else:
        out = BUILD / "gpu-reference" / (tag + ("-smoke" if args.smoke else ""))
    budget = args.budget if args.budget is not None else (450.0 if device.type == "cuda" else float("inf"))
    modes = args.compile if args.compile is not None else (
        ["reduce-overhead"] if device.type == "cuda" else ["compile"])
    run = gpu.Run(device=device, out=out, sizes=gpu.Sizes.for_run(device, args.smoke), smoke=args.smoke,
                  deadline=time.perf_counter() + budget, compile_modes=tuple(modes), gguf=gguf,
                  # smoke: Dynamo traces the step as Inductor would, without Inductor's minute of code generation
                  compile_backend="aot_eager" if args.smoke else "inductor")
    print(f"{tag}: torch {torch.__version__}, writing {out}", flush=True)
    gpu.run_all(run, only=args.only)
    print((out / "summary.md").read_text())
    return 1 if any(v.startswith("FAILED") for v in run.status.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
