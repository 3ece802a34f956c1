"""The confidence calibration stored with a draft: ``data/drafts/<draft>/confidence.json``.

``generate(..., confidence="auto")`` reads ``drafter.calibrated[method]``; for the shipped draft that θ comes from
this file, written by ``scripts/calibrate_confidence.py`` (the tuning procedure is
:mod:`specdec_core.study.calibrate`, run on held-out training prompts) and listed in the draft's ``SHA256SUMS``, so
an edited threshold fails the checksum like edited weights. This module owns the file's format: where it lives,
loading and checking it, and attaching its θ and cost to a pair's drafters.
"""
from __future__ import annotations

import json
from pathlib import Path

CALIBRATION = "confidence.json"


def save(folder: Path, rec: dict) -> Path:
    path = Path(folder) / CALIBRATION
    path.write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    return path


def load(folder: Path) -> dict | None:
    """The calibration stored in ``folder`` (None when there is none); a file without θ per drafter is an
    error naming the file."""
    path = Path(folder) / CALIBRATION
    if not path.exists():
        return None
    rec = json.loads(path.read_text())
    theta = rec.get("theta")
    if rec.get("method") != "linear" or not isinstance(theta, dict) or not all(
            isinstance(v, (int, float)) and 0 < v <= 1 for v in theta.values()):
        raise ValueError(f"{path}: a calibration needs method 'linear' and θ in (0, 1] per drafter, got {rec!r:.200}")
    return rec


def attach(drafters: dict, rec: dict | None) -> None:
    """Give each drafter of ``drafters`` whose family ``rec`` calibrated its ``calibrated`` θ (``"auto"``), and
    the model draft the record itself (the chooser reads its cost from it)."""
    if rec is None:
        return
    if "model" in drafters:
        drafters["model"].calibration = rec
    for name, d in drafters.items():
        if name in rec["theta"]:
            d.calibrated = {rec["method"]: float(rec["theta"][name])}
