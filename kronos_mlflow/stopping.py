"""SIGTERM and SIGINT (Ctrl-C) stop a training run cleanly.

:func:`install` (main thread, once per process) turns the first SIGTERM or SIGINT into
:class:`TrainingStopped`, raised wherever the process is; ``train.main`` catches it, ends the
run KILLED with a ``stop_reason`` and lets it propagate, and the command line prints one line
and exits ``128 + signal``. Later signals are ignored while the run is being ended (the
training state on disk is the last finished epoch's; it is written atomically, so a stop never
damages it). Under torchrun the launcher forwards SIGTERM to every worker, and each stops the
same way (only rank 0 prints).
"""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: int | None = None


class TrainingStopped(BaseException):
    """A stop signal arrived. A BaseException, so ``except Exception`` blocks let it through."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")


def _handler(signum, frame):  # noqa: ARG001 - signal API
    global _received
    if _received is not None:
        return  # the run is already being ended
    _received = int(signum)
    raise TrainingStopped(signum)


def install() -> bool:
    """Handle SIGTERM and SIGINT from now on (only possible in the main thread)."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        return False
    _received = None
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)
    return True


def received() -> int | None:
    """The stop signal that arrived, if any (an exception raised by a collective whose peer
    stopped is then a stop too, not a failure)."""
    return _received


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal number (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + int(signum)


def stop_reason(signum: int, root) -> str:
    """The ``stop_reason`` of a run stopped by a signal."""
    where = f" in {root / 'checkpoints' / 'last'}" if root is not None else ""
    return (f"stopped by {signal.Signals(signum).name}; the training state after the last finished epoch is "
            f"kept{where}: the same command resumes from it")
