"""Where the repository keeps things: the one place that knows the folder layout.

Every module that reads or writes under ``data/`` or ``build/`` takes its folder from here, so a moved folder
is changed once. Nothing here touches the disk on import.
"""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / "data"
MODELS_DIR = DATA / "models"  # converted embedded targets (built by ``make models``, not in git)
DRAFTS_DIR = DATA / "drafts"  # the shipped drafts, with their checksums and calibration
PROMPTS_DIR = DATA / "prompts"  # the eval mix and the training prompt sets
REFERENCE_DIR = DATA / "reference"  # committed reference results (CPU book run, GPU runs, draft curve)
TRAIN_CACHE = DATA / "train_cache"  # teacher data and training checkpoints (resumable, not in git)
BUILD = REPO_ROOT / "build"  # executed notebooks, rendered book, local benchmark output


def rel(path) -> Path:
    """``path`` relative to the repository root when it lies inside it (for messages and stored records)."""
    path = Path(path)
    return path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
