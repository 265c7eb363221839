"""The package's own settings from the environment, ``KRONOS_*``: each declared once in
:data:`SETTINGS` (its type, its bounds, what unset means), parsed here, and a malformed value
refused in one line naming the variable, the value and what it accepts, at the start of every
command (:func:`check_environment`), never replaced by its default
(docs/configuration.md#settings-from-the-environment). The package's processes hand each other
a few more variables (:data:`HANDED_OVER`): set by the package, not by users. Nothing here imports
more than the standard library and ``runtime``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..runtime import console
from . import checks

HOME = "KRONOS_MLFLOW_HOME"
SPOOL_DIR = "KRONOS_MLFLOW_SPOOL_DIR"
HTTP_TIMEOUT_S = "KRONOS_MLFLOW_HTTP_TIMEOUT_S"
FINALIZE_WAIT_S = "KRONOS_MLFLOW_FINALIZE_WAIT_S"
PROGRESS_SECONDS = console.PROGRESS_SECONDS_ENV  # KRONOS_PROGRESS_SECONDS

DEFAULT_HOME = "~/.cache/kronos_mlflow"


@dataclass(frozen=True)
class Setting:
    """One environment setting: ``kind`` ``seconds`` (a finite number in ``[low, high]``,
    ``(low, high]`` with ``low_open``) or ``directory`` (a directory, or a path where one can be
    made); ``default``: what unset or blank means."""

    name: str
    kind: str
    default: float | str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    @property
    def what(self) -> str:
        """How a refusal names it."""
        return f"environment variable {self.name}" + (" (seconds)" if self.kind == "seconds" else "")

    def parse(self, text: str):
        """``text`` (stripped, not empty) as the setting's value; else a one-line ConfigError."""
        if self.kind == "seconds":
            return checks.number(self.name, text, self.low, self.high, low_open=self.low_open, what=self.what)
        return checks.directory(self.name, text, what=self.what)


#: Every setting a user may set, in the order :func:`check_environment` reads them.
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting(HOME, "directory", DEFAULT_HOME),
    Setting(SPOOL_DIR, "directory", None),  # unset: $KRONOS_MLFLOW_HOME/spool
    Setting(HTTP_TIMEOUT_S, "seconds", 10.0, 0.0, 3600.0, low_open=True),
    Setting(FINALIZE_WAIT_S, "seconds", 30.0, 0.0, 86400.0),
    Setting(PROGRESS_SECONDS, "seconds", console.DEFAULT_PROGRESS_SECONDS, 0.0, 86400.0, low_open=True),
)}
NAMES = tuple(SETTINGS)
#: name -> (default, low, high, low open): the settings that are a number of seconds.
SECONDS = {s.name: (s.default, s.low, s.high, s.low_open) for s in SETTINGS.values() if s.kind == "seconds"}
#: What the package's processes set for their own children (a stop already reported, a trial's
#: study, a handed-over run's token): not settings, never read from a user.
HANDED_OVER = ("KRONOS_STOP_REPORTED_BY_PARENT", "KRONOS_OPTUNA_STORAGE", "KRONOS_OPTUNA_STUDY",
               "KRONOS_OPTUNA_TRIAL_ID", "KRONOS_OPTUNA_PRUNER", "KRONOS_MLFLOW_HANDOVER_TOKEN")


def _raw(name: str) -> str:
    """The variable's text, '' when unset or blank."""
    return os.environ.get(name, "").strip()


def value(name: str):
    """Setting ``name`` as :data:`SETTINGS` declares it: parsed, or its default when unset or
    blank; a malformed value raises a :class:`~kronos_mlflow.errors.ConfigError` naming it."""
    setting = SETTINGS[name]
    text = _raw(name)
    return setting.parse(text) if text else setting.default


def seconds(name: str) -> float:
    """The number of seconds ``name`` (one of :data:`SECONDS`) sets, or its default."""
    return float(value(name))


def http_timeout_s() -> float:
    return seconds(HTTP_TIMEOUT_S)


def finalize_wait_s() -> float:
    return seconds(FINALIZE_WAIT_S)


def progress_seconds() -> float:
    """Seconds between progress lines at most (:mod:`kronos_mlflow.runtime.console` reads it here)."""
    return seconds(PROGRESS_SECONDS)


def home() -> Path:
    """``$KRONOS_MLFLOW_HOME`` or ``~/.cache/kronos_mlflow``: the demo market's cache, the spools."""
    found = value(HOME)
    return found if isinstance(found, Path) else Path(found).expanduser()


def spool_dir() -> Path:
    """``$KRONOS_MLFLOW_SPOOL_DIR``, else ``$KRONOS_MLFLOW_HOME/spool``."""
    root = home()
    return value(SPOOL_DIR) if _raw(SPOOL_DIR) else root / "spool"


def check_environment() -> None:
    """Every setting of :data:`SETTINGS` parsed; the first malformed one raises a
    :class:`~kronos_mlflow.errors.ConfigError` naming it, its value and what it accepts."""
    for name in SETTINGS:
        value(name)


console.progress_setting = progress_seconds  # the console's progress lines read the declared setting
