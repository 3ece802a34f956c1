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
continuations (a two-sample test of gross errors: at a few hundred continuations it compares the commonest ones with
the rest). Holm's correction runs over the table; a correct decoder fails the whole table with probability at most
``--alpha``. The continuations are 3 tokens long, so that a first step's drafts, its rejection or bonus, and the
next step fall inside them (and a prompt-lookup decoder finds the toy prompt's repeated token and drafts).

A pass is only as good as what the test could have seen: the lossy mutants (``--mutants``; by default every one of
:data:`~specdec_core.study.exactness.AUDIT_MUTANTS` on the toy pair, "residual from p" on a real one) are audited the
same way, and each row of the table states its power against the weakest mutant of its setting (at Holm's strictest
level, at this n), and the n at which that power would reach 0.8. Prints the table
(:func:`specdec_core.study.exactness.audit`); exits 1 if a row fails.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SETTINGS = [{"name": "T=1", "temperature": 1.0},
            {"name": "T=0.7, top-k=4", "temperature": 0.7, "top_k": 4},  # a top-k that cuts even the toy's 8 tokens
            {"name": "top-p=0.9", "temperature": 1.0, "top_p": 0.9}]
TOY_PROMPT = [4, 3, 1, 4, 7]  # a repeated 4: within 3 tokens a prompt-lookup decoder finds a match and drafts
POWER_GOAL = 0.8


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
    ap.add_argument("--length", type=int, default=3, help="tokens per continuation that are tested")
    ap.add_argument("--prompt", action="append", help="a prompt (real pair: text, chat-templated; toy: ids 'a b c')")
    ap.add_argument("--alpha", type=float, default=0.01, help="family-wise level of the table")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mutants", action="append", help="a lossy mutant to state the power against (repeatable; "
                    "'none': no power stated); default: every audit mutant on the toy pair, 'residual from p' on a "
                    "real one")
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
    names = args.mutants or (list(ex.AUDIT_MUTANTS) if args.pair == "toy" else ["residual from p"])
    names = [] if names == ["none"] else names
    unknown = [m for m in names if m not in ex.AUDIT_MUTANTS]
    if unknown:
        raise SystemExit(f"audit_decoder: unknown mutant(s) {unknown}; choose from {sorted(ex.AUDIT_MUTANTS)} or 'none'")
    with ex.torch_threads(1):
        against, refs = None, {}
        if names:  # the mutants' divergences, measured the same way: what each row's power is against
            mut = ex.audit_family({m: ex.mutant_runner(pair, m, args.length) for m in names}, pair, prompts, SETTINGS,
                                  args.n, args.length, seed=args.seed + 3 * 10 ** 8, alpha=args.alpha, references=refs)
            against = ex.divergences(mut[[s not in ex.harmless_settings(r, SETTINGS)
                                          for r, s in zip(mut.runner, mut.setting)]])
        table = ex.audit(runner, pair, prompts, SETTINGS, args.n, length=args.length, seed=args.seed,
                         alpha=args.alpha, name=args.runner, against=against, references=refs)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.drop(columns=["runner"]).round(4).to_string(index=False))
    failed = int((~table.passed).sum())
    exact = (table.reference == "exact law").all()
    level = args.alpha / len(table)
    if against is None:
        power = "power not computed (--mutants none)"
    else:
        r = table.loc[table.power.idxmin()]
        n_eff = args.n if exact else args.n / 2  # a two-sample test's noncentrality is (n / 2) · divergence
        need = ex.samples_for_power(r.against_divergence, int(r.df), level, POWER_GOAL)
        power = (ex.power_phrase(r.power, f"{r.against} at {r.setting}", r.against_divergence, args.n, level)
                 + (f"; n ≈ {need * args.n / n_eff:.0f} would reach power {POWER_GOAL}" if need else ""))
    kind = "" if exact else " (two-sample check of gross errors)"
    print(f"{args.runner} on {pair.name or args.pair}{kind}: " + (
        f"every row passes at family-wise level {args.alpha} (n = {args.n} per row): {power}" if not failed else
        f"{failed} of {len(table)} rows FAIL at family-wise level {args.alpha}: this decoder does not sample the "
        "target's law there"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
