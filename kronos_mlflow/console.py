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


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def install_warning_format() -> None:
    """Warnings this package raises (a dropped bar, an empty validation split) print as one line,
    ``[kronos] warning: ...``, instead of Python's two (file, line and the source line). Other
    libraries' warnings keep Python's format."""
    if getattr(warnings.showwarning, "_kronos", False):
        return
    default = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if os.path.abspath(str(filename)).startswith(_PACKAGE_DIR + os.sep):
            import sys

            stream = file if file is not None else sys.stderr
            try:
                stream.write(f"[kronos] warning: {' '.join(str(message).split())}\n")
            except (OSError, ValueError):
                pass
            return
        default(message, category, filename, lineno, file, line)

    showwarning._kronos = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning
