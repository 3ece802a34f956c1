"""Drafts shipped in ``data/drafts/`` for the embedded target (see their model cards).

Each draft folder holds its files and ``SHA256SUMS`` (``sha256sum`` format). A draft is attached to
the pair only when every listed file exists and matches; a file that fails its checksum raises
:class:`CorruptDraft` naming the file (a silently wrong draft would still be lossless, but every speed
and acceptance figure in the book would be wrong).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..drafters import BlockDrafter, ModelDrafter
from ..paths import DRAFTS_DIR, rel
from . import calibration

MODEL_DRAFT = DRAFTS_DIR / "smollm2-135m-draft"
BLOCK_DRAFT = DRAFTS_DIR / "smollm2-135m-block"  # the block drafter (specdec_core.drafters)
SUMS = "SHA256SUMS"
REQUIRED = ("config.json", "model.safetensors")


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 4 MiB chunks (model caches, shipped drafts, training inputs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class CorruptDraft(RuntimeError):
    """A shipped draft file is missing or fails its SHA-256 checksum."""


def write_sums(folder: Path, names=REQUIRED) -> dict[str, str]:
    """Write ``folder/SHA256SUMS`` for ``names``; returns ``{name: digest}``."""
    folder = Path(folder)
    sums = {n: sha256_file(folder / n) for n in names}
    (folder / SUMS).write_text("".join(f"{d}  {n}\n" for n, d in sums.items()))
    return sums


def read_sums(folder: Path) -> dict[str, str]:
    folder = Path(folder)
    if not (folder / SUMS).exists():
        raise CorruptDraft(f"shipped draft {folder} has no {SUMS} file")
    sums = {}
    for line in (folder / SUMS).read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    missing = [n for n in REQUIRED if n not in sums]
    if missing:
        raise CorruptDraft(f"{folder / SUMS} lists no checksum for {missing}")
    return sums


def verify(folder: Path) -> dict[str, str]:
    """Raise :class:`CorruptDraft` naming the first missing or mismatching file; returns the sums."""
    folder = Path(folder)
    sums = read_sums(folder)
    for name, digest in sums.items():
        f = folder / name
        if not f.exists():
            raise CorruptDraft(f"shipped draft file {f} is missing")
        got = sha256_file(f)
        if got != digest:
            raise CorruptDraft(f"shipped draft file {f} fails its SHA-256 checksum (expected {digest[:12]}…, "
                               f"got {got[:12]}…): restore it with `git checkout -- {rel(f)}` "
                               "or retrain with `make models FORCE=1`")
    return sums


def is_present(folder: Path | None = None) -> bool:
    """True if the draft folder (default: the model draft's) has weights, valid or not."""
    return (Path(folder or MODEL_DRAFT) / "model.safetensors").exists()


def load_model_draft(target, dtype=None, device=None, folder: Path | None = None):
    """The shipped model draft (or the one in ``folder``) on top of ``target``, after checking its checksums."""
    from .draft import load_draft  # deferred: it imports transformers' Llama modelling (1.5 s)

    folder = Path(folder or MODEL_DRAFT)
    verify(folder)
    return load_draft(folder, target, dtype=dtype, device=device)


def load_shipped_drafters(target, dtype, device) -> dict:
    """Return ``{name: drafter}`` for every shipped draft whose weights are present and valid.

    ``{"model": ModelDrafter(draft)}`` (with its calibrated θ, :mod:`specdec_core.models.calibration`) when ``data/drafts/smollm2-135m-draft`` is there, ``"block"``
    (:class:`~specdec_core.drafters.BlockDrafter`) when ``data/drafts/smollm2-135m-block`` is; a draft that
    fails its checksum raises :class:`CorruptDraft`; an absent one is skipped (``make models`` trains it).
    """
    out = {}
    if is_present():
        out["model"] = ModelDrafter(load_model_draft(target, dtype=dtype, device=device))
        # θ for confidence="auto", when calibrated for these weights (a retrained draft's sums no longer list it)
        calibration.attach(out, calibration.load(MODEL_DRAFT) if calibration.CALIBRATION in read_sums(MODEL_DRAFT) else None)
    if is_present(BLOCK_DRAFT):
        from .block import load_block  # deferred: it imports transformers' Llama modelling (1.5 s)

        verify(BLOCK_DRAFT)
        out["block"] = BlockDrafter(load_block(BLOCK_DRAFT, target, dtype=dtype, device=device))
    return out


def drafted_point(folder: Path = MODEL_DRAFT) -> tuple[int, int]:
    """Where the draft in ``folder`` sits on the learning curve: (trunk layers, training response tokens), read
    from its config (recipe and training log)."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    return len(cfg["recipe"]["layers"]), cfg["training"]["train_tokens"]
