"""The package's own settings from the environment, ``KRONOS_MLFLOW_*``: each parsed here, and a
malformed value refused in one line at the start of every command (:func:`check_environment`),
never replaced by its default (docs/configuration.md#settings-from-the-environment). Nothing here
imports more than the standard library.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import checks

HOME = "KRONOS_MLFLOW_HOME"
SPOOL_DIR = "KRONOS_MLFLOW_SPOOL_DIR"
HTTP_TIMEOUT_S = "KRONOS_MLFLOW_HTTP_TIMEOUT_S"
FINALIZE_WAIT_S = "KRONOS_MLFLOW_FINALIZE_WAIT_S"

DEFAULT_HOME = "~/.cache/kronos_mlflow"
#: name -> (default, low, high, low open): the settings that are a number of seconds.
SECONDS = {HTTP_TIMEOUT_S: (10.0, 0.0, 3600.0, True), FINALIZE_WAIT_S: (30.0, 0.0, 86400.0, False)}
NAMES = (HOME, SPOOL_DIR, HTTP_TIMEOUT_S, FINALIZE_WAIT_S)


def _raw(name: str) -> str:
    """The variable's text, '' when unset or blank."""
    return os.environ.get(name, "").strip()


def seconds(name: str) -> float:
    """The number of seconds ``name`` (one of :data:`SECONDS`) sets, or its default."""
    default, low, high, low_open = SECONDS[name]
    text = _raw(name)
    if not text:
        return default
    return checks.number(name, text, low, high, low_open=low_open,
                         what=f"environment variable {name} (seconds)")


def http_timeout_s() -> float:
    return seconds(HTTP_TIMEOUT_S)


def finalize_wait_s() -> float:
    return seconds(FINALIZE_WAIT_S)


def _directory(name: str, default: str) -> Path:
    text = _raw(name)
    if not text:
        return Path(default).expanduser()
    return checks.directory(name, text, what=f"environment variable {name}")


def home() -> Path:
    """``$KRONOS_MLFLOW_HOME`` or ``~/.cache/kronos_mlflow``: the demo market's cache, the spools."""
    return _directory(HOME, DEFAULT_HOME)


def spool_dir() -> Path:
    """``$KRONOS_MLFLOW_SPOOL_DIR``, else ``$KRONOS_MLFLOW_HOME/spool``."""
    root = home()
    return _directory(SPOOL_DIR, str(root / "spool"))


def check_environment() -> None:
    """Every ``KRONOS_MLFLOW_*`` setting parsed; the first malformed one raises a
    :class:`~kronos_mlflow.errors.ConfigError` naming it."""
    home()
    spool_dir()
    for name in SECONDS:
        seconds(name)
