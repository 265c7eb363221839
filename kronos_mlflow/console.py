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

    def lines(self, texts) -> None:
        """Each of ``texts`` as its own line."""
        for text in texts:
            self.print(text)

    def warn(self, text: str) -> None:
        if self.enabled:
            warnings.warn(text, stacklevel=2)

    def progress(self, iterable, total: int, desc: str):
        """A tqdm bar on rank 0 when its output is a terminal (off with ``TQDM_DISABLE=1``); the
        plain iterable elsewhere: a log file gets the epoch's line, not the bar's redraws."""
        from tqdm.auto import tqdm

        enabled = self.enabled and os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true", "yes")
        return tqdm(iterable, total=total, desc=desc, disable=None if enabled else True, leave=False,
                    dynamic_ncols=True)


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


def terminal_only_bars() -> None:
    """Progress bars go to a terminal only: this package's bars check it themselves (tqdm's
    ``disable=None``); MLflow's artifact bars are switched off when stderr is not a terminal
    (unless ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` says otherwise), so a log file holds lines,
    not a bar's redraws."""
    import sys

    if not sys.stderr.isatty():
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
