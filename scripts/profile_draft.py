"""Where the shipped draft's pass goes, and what each cut of c would buy (issue 16's "cheaper draft pass").

    python scripts/profile_draft.py --out data/reference/draft_profile.json     # about 2 minutes, alone

1. Operator profile (``torch.profiler``, :func:`specdec_core.study.profiling.profile_ops`) of one draft pass and
   one target pass over 1 token at a typical context (the median eval prompt plus 32 decoded tokens), grouped
   into matmuls, attention, the draft head's full-vocabulary scatter, and the rest (Python, HF module glue,
   norms, rotary, cache writes).
2. One interleaved timing (:func:`~specdec_core.study.profiling.time_interleaved`) of the target pass and of
   draft variants built from the shipped draft's own weights: as shipped (its trunk, 8192-token head, full
   vocabulary out), the same with the head's logits returned over the draft vocabulary only (no scatter), one
   trunk layer (the same as shipped for a 1-layer draft), and a 4096-token head (every other token of its vocabulary: the time, not the choice, matters). c = draft ÷ target (1 token), medians with IQR. α of the variants is not
   measured here (the learning curve, ``scripts/draft_curve.py``, trains 1-layer drafts); this is what each cut
   saves, not whether it pays.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from specdec_core.lm import CachedLM
from specdec_core.models import shipped
from specdec_core.models.draft import DraftModel
from specdec_core.models.hub import load_pair
from specdec_core.study import bench, profiling
from specdec_core.data.prompts import encode, load_prompts


def groups(df) -> dict:
    """Self time per call (ms) by coarse group."""
    def kind(op: str) -> str:
        if op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
            return "matmul"
        if "attention" in op or "sdpa" in op:
            return "attention"
        if op in ("aten::index_copy_", "aten::index_copy", "aten::full", "aten::new_full", "aten::fill_"):
            return "head scatter and fills"
        return "other (norms, rotary, copies, glue)"
    out = df.assign(group=df.op.map(kind)).groupby("group").self_s.sum() * 1e3
    return {k: round(float(v), 3) for k, v in out.items()} | {"wall_ms": round(df.attrs["wall_s"] * 1e3, 3)}


class SubVocab(torch.nn.Module):
    """A draft variant returning logits over its own vocabulary (what a drafter could sample from directly)."""

    def __init__(self, draft: DraftModel):
        super().__init__()
        self.draft, self.config = draft, draft.config

    def forward(self, **kw):
        return self.draft(**kw, full_vocab=False)


def variant(draft: DraftModel, target, layers: int | None = None, head: int | None = None) -> DraftModel:
    """The shipped draft's weights with the trunk cut to ``layers`` layers and/or the head to ``head`` of its
    tokens (evenly spaced over its ascending vocabulary: a pass's time does not depend on which)."""
    vocab = draft.vocab if head is None else draft.vocab[:: draft.vocab.numel() // head][:head]
    d = DraftModel.from_target(target, list(range(layers or len(draft.trunk.layers))), vocab)
    with torch.no_grad():
        for i in range(len(d.trunk.layers)):
            d.trunk.layers[i].load_state_dict(draft.trunk.layers[i].state_dict())
        d.trunk.norm.load_state_dict(draft.trunk.norm.state_dict())
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--decoded", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path("data/reference/draft_profile.json"))
    args = ap.parse_args()
    pair = load_pair("smollm2-135m")
    draft = shipped.load_model_draft(pair.target)
    ids = bench.median_length([(None, encode(pair, p)) for p in load_prompts()])
    S = ids.numel() + args.decoded
    models = {"target": pair.target, "draft (shipped)": draft, "draft, head logits only": SubVocab(draft),
              "draft, 1 layer": variant(draft, pair.target, layers=1),
              "draft, 4096-token head": variant(draft, pair.target, head=4096)}
    fns = {}
    for name, m in models.items():
        lm = CachedLM(m, S + 2)
        profiling.at_context(lm, S)
        fns[name] = profiling.pass_fn(lm, 1)
    prof = {name: groups(profiling.profile_ops(fns[name], repeats=10)) for name in ("target", "draft (shipped)")}
    t = profiling.summarize(profiling.time_interleaved(fns, repeats=args.repeats, warmup=3)).set_index("name")
    t1 = t.loc["target", "median"]
    timing = {n: dict(ms=round(r["median"] * 1e3, 3), q25_ms=round(r.q25 * 1e3, 3), q75_ms=round(r.q75 * 1e3, 3),
                      c=round(r["median"] / t1, 4)) for n, r in t.iterrows()}
    report = dict(script="scripts/profile_draft.py", context=S, threads=torch.get_num_threads(),
                  profile_ms=prof, timing=timing)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for n, g in prof.items():
        print(n, g)
    for n, r in timing.items():
        print(f"{n:28s} {r['ms']:7.2f} ms (IQR {r['q25_ms']:.2f}–{r['q75_ms']:.2f})  c = {r['c']:.3f}")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
