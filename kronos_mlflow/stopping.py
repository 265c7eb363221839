"""SIGTERM and SIGINT (Ctrl-C) stop a training run cleanly.

:func:`install` (main thread, once per process) turns the first SIGTERM or SIGINT into
:class:`TrainingStopped`, raised wherever the process is; ``train.main`` catches it, ends the
run KILLED with a ``stop_reason`` and lets it propagate, and the command line prints one line
and exits ``128 + signal``. Later signals are ignored while the run is being ended (the
training state on disk is the last finished epoch's; it is written atomically, so a stop never
damages it). Under torchrun the launcher forwards SIGTERM to every worker, and each stops the
same way (only rank 0 prints). A signal that arrives while a checkpoint is being written
(:func:`deferred`) is held until the write is done, so that a stop never leaves the training
state mid-swap.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: int | None = None
_defer_depth = 0  # > 0 while a block that must not be torn runs
_pending: int | None = None  # a stop signal held back by deferred()


class TrainingStopped(BaseException):
    """A stop signal arrived. A BaseException, so ``except Exception`` blocks let it through."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")


def _handler(signum, frame):  # noqa: ARG001 - signal API
    global _received, _pending
    if _received is not None:
        return  # the run is already being ended
    _received = int(signum)
    if _defer_depth:
        _pending = int(signum)  # raised when the deferred block ends
        return
    raise TrainingStopped(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """Run the block to its end even if a stop signal arrives meanwhile (a checkpoint being
    written); the held signal raises :class:`TrainingStopped` right after it."""
    global _defer_depth, _pending
    _defer_depth += 1
    try:
        yield
    finally:
        _defer_depth -= 1
    if _defer_depth == 0 and _pending is not None:
        signum, _pending = _pending, None
        raise TrainingStopped(signum)


def install() -> bool:
    """Handle SIGTERM and SIGINT from now on (only possible in the main thread)."""
    global _received, _pending
    if threading.current_thread() is not threading.main_thread():
        return False
    _received = _pending = None
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)
    return True


def received() -> int | None:
    """The stop signal that arrived, if any (an exception raised by a collective whose peer
    stopped is then a stop too, not a failure)."""
    return _received


def standing_for(exc: BaseException) -> TrainingStopped | None:
    """The stop that ``exc`` stands for, raised in its place: after a stop signal, an error that
    is not itself a :class:`TrainingStopped` (a collective whose peer stopped first and closed
    its connection) is that stop, so the rank ends in one line, not a traceback. None without a
    signal (a real failure) or when ``exc`` already is the stop."""
    if _received is None or isinstance(exc, TrainingStopped):
        return None
    return TrainingStopped(_received)


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal number (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + int(signum)


def stop_reason(signum: int, root) -> str:
    """The ``stop_reason`` of a run stopped by a signal."""
    where = f" in {root / 'checkpoints' / 'last'}" if root is not None else ""
    return (f"stopped by {signal.Signals(signum).name}; the training state after the last finished epoch is "
            f"kept{where}: the same command resumes from it")
