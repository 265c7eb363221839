"""Errors a user can fix by changing what they typed or pointed at.

Every ``UserError`` carries one sentence that names the bad value and what would be
accepted. Command-line entry points print it on one line to stderr and exit with code 2
(``EXIT_USAGE``), never with a traceback.
"""

from __future__ import annotations

import os

EXIT_USAGE = 2
RANK_0_SPEAKS_SECONDS = 20.0  # how long a silent rank leaves rank 0 to print a shared refusal


class UserError(Exception):
    """Bad input: a config value, a path, a file. The message is one line for the user."""

    def __init__(self, message: str):
        # Keep messages on one line whatever the caller passed.
        super().__init__(" ".join(str(message).split()))


class ConfigError(UserError, ValueError):
    """A configuration key or value is unknown or invalid."""


class CheckpointError(UserError, ValueError):
    """A tokenizer checkpoint directory or file is missing, malformed or inconsistent."""


class DataError(UserError, ValueError):
    """A Qlib directory, CSV file or data split cannot be used."""


class ArgumentTypeError(UserError, TypeError):
    """An argument of the Python API is of the wrong kind: a path or hub id where a loaded model
    is needed, the predictor and the tokenizer swapped, an array where a tensor is needed."""


class MemoryBudgetError(ConfigError):
    """A forecast would need more memory than its device has free (estimated before anything is
    allocated): too many series or sample paths for one call."""


def short_reason(exc: BaseException, limit: int = 200) -> str:
    """``Type: message`` of an exception on one line, cut to ``limit`` characters, for the
    parenthesis of a one-line user message."""
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def same_on_every_rank(exc: UserError) -> UserError:
    """Mark a refusal every process of a torchrun group reaches alike (a flag, the config, a file
    all ranks read, an answer rank 0 broadcast): only rank 0 prints it. Returns ``exc``."""
    exc.same_on_every_rank = True  # type: ignore[attr-defined]
    return exc


def leave_the_line_to_rank_0() -> None:
    """Called by a silent rank (not 0) of a torchrun group on its way out of a refusal every rank
    reaches alike. torchrun stops every other worker as soon as one exits non-zero, so a silent
    rank that left first could stop rank 0 before its line is out. Under torchrun, wait (at
    most ``RANK_0_SPEAKS_SECONDS``) for the launcher's SIGTERM, which follows rank 0's own exit;
    it ends this process quietly with exit code 2 (atexit handlers run). Outside torchrun, return
    at once."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return
    import signal  # lazy: only a refusing rank needs it
    import time  # lazy: as above

    def leave(signum, frame):  # noqa: ARG001 - signal API
        raise SystemExit(EXIT_USAGE)

    try:
        signal.signal(signal.SIGTERM, leave)  # exit 2 quietly, not through a stop handler
    except ValueError:  # not the main thread: keep the handler it has
        pass
    time.sleep(RANK_0_SPEAKS_SECONDS)
