"""What one process prints: rank 0 speaks, every other rank is silent (decided once, where the
process's tracking is built, so the training loop never asks its rank)."""

from __future__ import annotations

import os
import warnings


class Console:
    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)

    def print(self, text: str) -> None:
        if self.enabled:
            print(f"[kronos] {text}", flush=True)

    def warn(self, text: str) -> None:
        if self.enabled:
            warnings.warn(text, stacklevel=2)

    def progress(self, iterable, total: int, desc: str):
        """A tqdm bar on rank 0 (off with ``TQDM_DISABLE=1``); the plain iterable elsewhere."""
        from tqdm.auto import tqdm

        enabled = self.enabled and os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true", "yes")
        return tqdm(iterable, total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)
