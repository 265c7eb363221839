"""What one process prints: rank 0 speaks, every other rank is silent (decided once, where the
process's tracking is built, so the training loop never asks its rank)."""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

PROGRESS_SECONDS_ENV = "KRONOS_PROGRESS_SECONDS"
DEFAULT_PROGRESS_SECONDS = 30.0


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

    def progress(self, iterable, total: int, desc: str, *, every: int = 0, unit: str = "batches",
                 size: Callable[[Any], int] | None = None) -> Ticker:
        """``iterable`` with its progress shown on rank 0 (:class:`Ticker`): a tqdm bar when
        stderr is a terminal (unless ``TQDM_DISABLE=1``), else a line every ``every`` items (0:
        none) or every :func:`progress_seconds`, whichever comes first. ``total`` counts
        ``unit``; ``size(item)`` is how many of them an item holds (1 by default)."""
        return Ticker(self, iterable, total, desc, every=every, unit=unit, size=size)


#: The reader of ``KRONOS_PROGRESS_SECONDS`` as ``config/settings.py`` declares it (it installs
#: itself there: the config layer sits above this one).
progress_setting: Callable[[], float] | None = None


def progress_seconds() -> float:
    """Seconds between progress lines at most (while items finish): ``KRONOS_PROGRESS_SECONDS``,
    30 by default; a malformed value is a ConfigError naming it (every command refuses it at its
    start: :func:`kronos_mlflow.config.settings.check_environment`), never the default."""
    return progress_setting() if progress_setting is not None else DEFAULT_PROGRESS_SECONDS


def duration(seconds: float) -> str:
    """``42s``, ``4m05s``, ``1h02m``."""
    if not math.isfinite(seconds):
        return "?"
    s = round(max(seconds, 0.0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _bars_wanted() -> bool:
    if os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes"):
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


class Ticker:
    """A long loop's progress on rank 0, as :meth:`Console.progress` builds it: iterate it as
    the loop's iterable. On a terminal a tqdm bar; otherwise (a log file) lines
    ``[kronos] <desc>: <done>/<total> <unit>[, <note>], <rate> <unit>/s, ETA <left>``, one
    each ``every`` items and one whenever :func:`progress_seconds` passed since the last line;
    nothing on other ranks. :meth:`note` sets what the line (or the bar) adds, e.g. the loss."""

    def __init__(self, console: Console, iterable, total: int, desc: str, *, every: int = 0,
                 unit: str = "batches", size: Callable[[Any], int] | None = None):
        self.iterable, self.total, self.desc = iterable, int(total), desc
        self.every, self.unit, self.size = max(int(every or 0), 0), unit, size
        self.console = console
        self.bar = console.enabled and _bars_wanted()
        self.lines = console.enabled and not self.bar
        self.seconds = progress_seconds()
        self.done = 0
        self._note = ""
        self._tqdm = None

    def __len__(self) -> int:
        return len(self.iterable)

    def note(self, text: str) -> None:
        self._note = text
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(text, refresh=False)

    def line(self, elapsed: float) -> str:
        rate = self.done / elapsed if elapsed > 0 else math.inf
        left = (self.total - self.done) / rate if rate > 0 and self.total >= self.done else math.nan
        note = f", {self._note}" if self._note else ""
        shown = "?" if not math.isfinite(rate) else f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"
        return f"{self.desc}: {self.done}/{self.total} {self.unit}{note}, {shown} {self.unit}/s, ETA {duration(left)}"

    def __iter__(self):
        if self.bar:
            yield from self._with_bar()
        elif not self.lines:
            yield from self.iterable
        else:
            yield from self._with_lines()

    def _with_bar(self):
        from tqdm.auto import tqdm  # lazy: tqdm only for a terminal

        self._tqdm = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False, dynamic_ncols=True)
        try:
            for item in self.iterable:
                yield item
                n = self.size(item) if self.size is not None else 1
                self.done += n
                self._tqdm.update(n)
        finally:
            self._tqdm.close()
            self._tqdm = None

    def _with_lines(self):
        start = last = time.monotonic()
        for index, item in enumerate(self.iterable, 1):
            yield item
            self.done += self.size(item) if self.size is not None else 1
            now = time.monotonic()
            if (self.every and index % self.every == 0) or now - last >= self.seconds:
                self.console.print(self.line(now - start))
                last = now


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kronos_mlflow/


def install_warning_format() -> None:
    """Warnings this package raises (a dropped bar, an empty validation split) print as one line,
    ``[kronos] warning: ...``, instead of Python's two (file, line and the source line). Other
    libraries' warnings keep Python's format."""
    if getattr(warnings.showwarning, "_kronos", False):
        return
    default = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if os.path.abspath(str(filename)).startswith(_PACKAGE_DIR + os.sep):
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
    """Progress bars go to a terminal only: this package's bars check it themselves
    (:class:`Ticker`, tqdm's ``disable=None``); MLflow's artifact bars are switched off when stderr is not a terminal
    (unless ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` says otherwise), so a log file holds lines,
    not a bar's redraws."""
    if not sys.stderr.isatty():
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
