"""Where the shipped draft's one-token pass goes, and what each lever would give: one interleaved run.

    python scripts/bench_draft_pass.py [--context 60] [--repeats 60]

Times, beside the target's one-token pass on the path the library runs (``target[1]``):
- the draft's one-token pass on the library path (``CachedLM.forward``, as ``ModelDrafter.propose`` calls it);
- its parts: the trunk (two layers and the final norm, as the library runs it: ``models/draft_step.py``; and through
  transformers' modules) and the head (the tied embedding's rows for the 8,192-token draft vocabulary);
- the same head and the trunk's linear layers through the rows kernel, and as float16 and bfloat16 products.

Every time is the median of ``--repeats`` interleaved rounds (``study.profiling.time_interleaved``) and is printed
as a share of ``target[1]`` from the same run: c = draft[1] / target[1]. Nothing here changes the library: a lever
that pays is to be built in ``specdec_core`` and proven exact there. Issue 70 asks for c ≤ 0.05.
"""
from __future__ import annotations

import argparse

import torch

import specdec_core as sd
from specdec_core import kernels
from specdec_core.lm import CachedLM
from specdec_core.study.profiling import at_context, pass_fn, summarize, time_interleaved


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=60, help="cached positions before the timed pass")
    ap.add_argument("--repeats", type=int, default=60, help="interleaved rounds")
    args = ap.parse_args()
    if args.context < 1 or args.repeats < 3:
        raise SystemExit(f"need --context >= 1 and --repeats >= 3, got {args.context}, {args.repeats}")

    pair = sd.load_pair("smollm2-135m")
    if "model" not in pair.drafters:
        raise SystemExit("no shipped model draft: `make models` trains it")
    target, draft = pair.target, pair.drafters["model"].model
    t_lm, d_lm, trunk_lm = (CachedLM(m, args.context + 4) for m in (target, draft, draft))
    for lm in (t_lm, d_lm, trunk_lm):
        at_context(lm, args.context)

    one = torch.ones(1, 1, dtype=torch.long)
    at = torch.tensor([args.context])

    def trunk():  # the draft's layers and norm on one token, committing nothing (the cache's length stays)
        return draft.hidden(one, position_ids=at.view(1, 1), cache_position=at, past_key_values=trunk_lm.cache,
                            use_cache=True).last_hidden_state

    def trunk_modules():  # the same through transformers' modules (the path before models/draft_step.py)
        return draft.trunk(inputs_embeds=draft.embedding(one), position_ids=at.view(1, 1), cache_position=at,
                           past_key_values=trunk_lm.cache, use_cache=True).last_hidden_state

    head = draft.head  # [N, H]
    h = torch.randn(1, 1, head.shape[1], generator=torch.Generator().manual_seed(0))
    lins = [m for m in draft.trunk.modules() if isinstance(m, torch.nn.Linear)]
    xs = [torch.randn(1, 1, m.in_features, generator=torch.Generator().manual_seed(i)) for i, m in enumerate(lins)]
    fns = {"target[1]": pass_fn(t_lm, 1), "draft[1], library path": pass_fn(d_lm, 1),
           "trunk (layers + norm)": trunk, "trunk, transformers modules": trunk_modules,
           "head, float32 torch": lambda: h @ head.T}
    for name, dt in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        hd, xd, wd = h.to(dt), [x.to(dt) for x in xs], [m.weight.detach().to(dt) for m in lins]
        fns[f"head, {name} torch"] = lambda hd=hd, w=head.to(dt): hd @ w.T
        fns[f"trunk linears, {name} torch"] = lambda xd=xd, wd=wd: [x @ w.T for x, w in zip(xd, wd)]
    fns["trunk linears, float32 torch"] = lambda: [torch.nn.functional.linear(x, m.weight) for x, m in zip(xs, lins)]
    if kernels.load() is not None:
        packed = kernels._module.pack(head.detach())
        fns["head, rows kernel"] = lambda: kernels._module.linear(h, packed, head.shape[0], None)
        rows = [(kernels._module.pack(m.weight.detach()), m.out_features) for m in lins]
        fns["trunk linears, rows kernel"] = lambda: [kernels._module.linear(x, p, n, None)
                                                     for x, (p, n) in zip(xs, rows)]
    with torch.inference_mode():
        df = time_interleaved(fns, repeats=args.repeats, warmup=5, progress=True)
    s = summarize(df).set_index("name")
    t1 = s.loc["target[1]", "median"]
    mb = sum(m.weight.numel() * m.weight.element_size() for m in lins) / 1e6
    print(f"draft: {len(lins)} trunk linears ({mb:.1f} MB), head {tuple(head.shape)} ({head.numel() * 4 / 1e6:.1f} MB "
          f"float32); paths: target {kernels.path_of(target)}, draft {kernels.path_of(draft)}; "
          f"{torch.get_num_threads()} threads; context {args.context}; median of {args.repeats} interleaved rounds")
    for name, r in s.sort_values("median", ascending=False).iterrows():
        print(f"  {name:30s} {1e3 * r['median']:7.3f} ms (IQR {1e3 * r['q25']:.3f}–{1e3 * r['q75']:.3f})  "
              f"{r['median'] / t1:6.3f} of target[1]")
    print(f"c = draft[1] / target[1] = {s.loc['draft[1], library path', 'median'] / t1:.3f} (issue 70's bar: 0.05)")


if __name__ == "__main__":
    main()
