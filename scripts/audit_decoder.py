"""Audit a decoder of your own with chapter 2's exactness gate: does it sample the target's law?

    python scripts/audit_decoder.py my_module:make_runner               # toy pair, exact law, three settings
    python scripts/audit_decoder.py my_module:make_runner --pair smollm2-135m --n 200 --prompt "one, two,"
    python scripts/audit_decoder.py specdec_core.study.exactness:example_runner   # this library's linear decoder

``module:function`` names a runner factory, ``function(pair, length) -> runner``, and the runner is any decoder:
``runner(ids, setting, seed) -> list[int]`` (``ids`` a 1-D LongTensor, ``setting`` a dict such as
``{"name": "T=0.7, top-k=50", "temperature": 0.7, "top_k": 50}``, ``seed`` one per continuation; it returns the tokens
it committed, the first ``--length`` of which are read). ``pair`` is a :class:`specdec_core.Pair`: its ``target`` is
the model whose law the decoder must sample. The module is imported from the current folder or ``PYTHONPATH``.

On the toy pair (``--pair toy``: a float64 Llama with 8 tokens) the law of every continuation is enumerated and
Pearson's test compares the decoder's continuations with it; on a real pair the reference is the target's own sampled
continuations (a two-sample test). Holm's correction runs over the table; a correct decoder fails the whole table with
probability at most ``--alpha``. Prints the table (:func:`specdec_core.study.exactness.audit`); exits 1 if a row fails.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SETTINGS = [{"name": "T=1", "temperature": 1.0},
            {"name": "T=0.7, top-k=50", "temperature": 0.7, "top_k": 50},
            {"name": "top-p=0.9", "temperature": 1.0, "top_p": 0.9}]
TOY_PROMPT = [4, 3, 1, 4, 7]


def load_factory(spec: str):
    """``"module:function"`` → the function; a clear error for each way the name can be wrong."""
    module, sep, func = spec.partition(":")
    if not sep or not module or not func:
        raise SystemExit(f"audit_decoder: give module:function (e.g. my_decoder:make_runner), got {spec!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise SystemExit(f"audit_decoder: cannot import module {module!r}: {e}") from None
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise SystemExit(f"audit_decoder: module {module!r} has no function {func!r}")
    return fn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runner", help="module:function, a factory function(pair, length) -> runner")
    ap.add_argument("--pair", default="toy", help="'toy' (exact law) or a model for sd.load_pair")
    ap.add_argument("--n", type=int, default=400, help="continuations per prompt and setting")
    ap.add_argument("--length", type=int, default=2, help="tokens per continuation that are tested")
    ap.add_argument("--prompt", action="append", help="a prompt (real pair: text, chat-templated; toy: ids 'a b c')")
    ap.add_argument("--alpha", type=float, default=0.01, help="family-wise level of the table")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import pandas as pd

    import specdec_core as sd
    from specdec_core.study import exactness as ex

    factory = load_factory(args.runner)
    if args.pair == "toy":
        pair = sd.toy_pair(vocab_size=8, seed=0, draft_noise=0.6)
        prompts = [[int(t) for t in p.split()] for p in args.prompt] if args.prompt else [TOY_PROMPT]
    else:
        pair = sd.load_pair(args.pair)
        prompts = [pair.encode_chat(t) for t in (args.prompt or ["Count: one, two, three."])]
    runner = factory(pair, args.length)
    with ex.torch_threads(1):
        table = ex.audit(runner, pair, prompts, SETTINGS, args.n, length=args.length, seed=args.seed,
                         alpha=args.alpha, name=args.runner)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(table.drop(columns=["runner"]).round(4).to_string(index=False))
    failed = int((~table.passed).sum())
    print(f"{args.runner} on {pair.name or args.pair}: " + (
        f"every row passes at family-wise level {args.alpha} (n = {args.n} per row)" if not failed else
        f"{failed} of {len(table)} rows FAIL at family-wise level {args.alpha}: this decoder does not sample the "
        "target's law there"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
