"""A Hugging Face hub cache holding "published" checkpoints written by the test: the layout
``huggingface_hub`` reads offline (``models--OWNER--NAME/refs/main`` naming a snapshot folder
that holds ``config.json`` and ``model.safetensors``), so ``auto`` finds them with no network."""

from __future__ import annotations

import hashlib
from pathlib import Path


def write_published(cache: Path, hub_id: str, model) -> Path:
    """``model`` saved (``save_pretrained``: the upstream format) as ``hub_id``'s main revision
    in the hub cache ``cache``; returns the snapshot folder."""
    owner, name = hub_id.split("/")
    repo = Path(cache) / f"models--{owner}--{name}"
    commit = hashlib.sha1(hub_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    model.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
