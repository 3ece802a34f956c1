"""What another machine's committed reference run says, and what it predicts here.

``data/reference/cuda-*/`` holds the tables of a GPU reference run (:mod:`specdec_core.tools.gpu_reference`, made
on a GPU machine). Chapters 1, 6 and 10 read them back: ratios and shapes only (a pass's cost relative to
another pass on the same device), never absolute times beside this run's, and the speedup Theorem 3.8 predicts from
those cost ratios with an α that belongs to the weights, not to the hardware.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..paths import REFERENCE_DIR
from .theory import speedup


def load_reference(root: Path | str | None = None) -> dict[str, pd.DataFrame]:
    """The tables of the committed GPU reference run, ``data/reference/cuda-*/`` (the newest folder if several),
    by name (``ceilings``, ``pass_times``, ``knees``, ``steps``, ``pair_costs``, ...) plus ``"tag"``; an empty dict if
    there is none. They come from another machine and another run: read ratios and shapes from them, never set
    their absolute times beside this run's."""
    base = (Path(root) / "data" / "reference" if root else REFERENCE_DIR)
    runs = sorted((d for d in base.glob("cuda-*") if (d / "summary.md").exists()),
                  key=lambda d: (d / "summary.md").stat().st_mtime)
    if not runs:
        return {}
    d = runs[-1]
    out = {p.stem: pd.read_csv(p) for p in sorted(d.glob("*.csv"))}
    missing = {"ceilings", "pass_times", "knees"} - set(out)
    if missing:
        raise FileNotFoundError(f"GPU reference run {d} lacks {sorted(missing)}: rerun scripts/gpu_reference.py")
    out["tag"] = d.name
    return out


def speedup_by_device(alpha: float, ks, costs: dict[str, tuple[float, dict]]) -> pd.DataFrame:
    """Theorem 3.8's speedup per K for one α and several cost sets ``{source: (c, {K: verify ratio})}`` (a source
    without a verify ratio at some K gets no row there), with each source's best K marked: what the same draft
    (α belongs to the weights) predicts on different hardware."""
    rows = [dict(source=src, K=k, c=c, verify_ratio=vr[k], predicted_speedup=float(speedup(alpha, k, c, vr[k])))
            for src, (c, vr) in costs.items() for k in ks if k in vr]
    if not rows:
        raise ValueError(f"no source has a verify ratio at any K in {list(ks)}")
    df = pd.DataFrame(rows).assign(alpha=alpha)
    df["best_k"] = df.groupby("source").predicted_speedup.transform(lambda s: s.index == s.idxmax())
    return df


def reference_costs(ref: dict[str, pd.DataFrame]) -> dict[str, tuple[float, dict]]:
    """``{"<tag> / <mode>": (c, {K: verify ratio})}`` from a reference run's ``pair_costs`` table (its own rows)."""
    if "pair_costs" not in ref:
        return {}
    d = ref["pair_costs"]
    d = d[d.source == ref["tag"]].drop_duplicates(["mode", "K"])
    return {f"{ref['tag']} / {m}": (float(g.c.iloc[0]), dict(zip(g.K.astype(int), g.verify_ratio)))
            for m, g in d.groupby("mode", sort=False)}
