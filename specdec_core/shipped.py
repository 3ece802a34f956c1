"""Drafts shipped in ``data/drafts/`` for the embedded target (see their model cards)."""
from __future__ import annotations


def load_shipped_drafters(target, dtype, device) -> dict:
    """Return ``{name: drafter}`` for every shipped draft whose weights are present and valid."""
    return {}
