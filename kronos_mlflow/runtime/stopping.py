"""SIGTERM and SIGINT (Ctrl-C) stop a training run cleanly: :func:`install` turns the first signal into
:class:`TrainingStopped`, the run ends KILLED with a ``stop_reason``, a checkpoint being written
finishes first (:func:`deferred`), and a command's child processes get the stop forwarded
(:func:`forwarding_to`); docs/configuration.md#stopping.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Set in the environment of a command's child processes: the command prints the stop's line.
REPORTED_BY_PARENT = "KRONOS_STOP_REPORTED_BY_PARENT"
_received: int | None = None
_defer_depth = 0  # > 0 while a block that must not be torn runs
_pending: int | None = None  # a stop signal held back by deferred()
_children: list = []  # child processes (subprocess.Popen) being waited for: a stop is forwarded to them


class TrainingStopped(BaseException):
    """A stop signal arrived. A BaseException, so ``except Exception`` blocks let it through."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        self.after: str | None = None  # the phase a run had completed after its training (stop_reason)
        super().__init__(f"stopped by {self.name}")


class TrainingPruned(Exception):
    """The sweep's pruner stopped this trial after an epoch; its metrics stay logged."""


def _handler(signum, frame):  # noqa: ARG001 - signal API
    global _received, _pending
    if _received is not None:
        return  # the run is already being ended
    _received = int(signum)
    if _children:  # the children stop, end their runs and exit; their waiter raises the stop after
        for proc in _children:
            _forward(proc)
        return
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
    """Handle SIGTERM and SIGINT from now on (only possible in the main thread): the first raises
    :class:`TrainingStopped` wherever the process is; later signals are ignored while the run is
    being ended."""
    global _received, _pending
    if threading.current_thread() is not threading.main_thread():
        return False
    _received = _pending = None
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)
    return True


def _forward(proc) -> None:
    if proc.returncode is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # it has just exited


@contextmanager
def forwarding_to(proc) -> Iterator[None]:
    """While the block waits for ``proc`` (a ``subprocess.Popen``), a stop signal is sent on to
    it (as SIGTERM, which also ends quietly a child that has not installed these handlers yet,
    where SIGINT would print a ``KeyboardInterrupt`` traceback) instead of raising here; one that
    came before the block is sent on as it starts."""
    _children.append(proc)
    try:
        if _received is not None:
            _forward(proc)
        yield
    finally:
        _children.remove(proc)


def report(line: str) -> None:
    """Print a stop's one line on stderr, unless this process is a command's child
    (:data:`REPORTED_BY_PARENT`): the command then says it once for all of its processes."""
    if not os.environ.get(REPORTED_BY_PARENT):
        print(line, file=sys.stderr, flush=True)


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


def stop_reason(signum: int, root, after: str | None = None) -> str:
    """The ``stop_reason`` of a run stopped by a signal; ``after``: the phase it completed after
    its last epoch (``trained``, ``verdict``...: docs/reliability.md#a-stop-after-the-last-epoch),
    None while it trains."""
    where = f" in {root / 'checkpoints'}" if root is not None else ""
    name = signal.Signals(signum).name
    if after is not None:
        return (f"stopped by {name} after its training (phase reached: {after}); the training state and the best "
                f"checkpoint are kept{where}: the same command continues from there without training again")
    where = f" in {root / 'checkpoints' / 'last'}" if root is not None else ""
    return (f"stopped by {name}; the training state after the last finished epoch is "
            f"kept{where}: the same command resumes from it")


# ---- under `mlflow run`: the run it handed over stays KILLED ----------------------------------


def alive(pid: int) -> bool:
    """Running (a zombie has exited: its parent just has not collected it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def mlflow_run_pid() -> int | None:
    """The ``mlflow run`` process among this process's ancestors (it runs the MLproject's
    command through bash), or None."""
    pid = os.getppid()
    for _ in range(4):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if any(a.endswith(b"mlflow") for a in args) and b"run" in args:
                return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def keep_killed_status(pid: int | None, helper: Callable[[str, int], Sequence[str]]) -> None:
    """A stop reaches ``mlflow run`` too, and it marks the run it handed over (``MLFLOW_RUN_ID``)
    FAILED once this process has exited, after this process has ended it KILLED with a
    ``stop_reason``. A detached helper (no terminal, no signals), whose command line
    ``helper(run_id, pid)`` builds (the command layer's: ``kronos_mlflow.launch``'s ``keep_killed``,
    :mod:`kronos_mlflow.cli.commands`), waits for ``mlflow run`` (``pid``) to exit, then puts KILLED back."""
    run_id = os.environ.get("MLFLOW_RUN_ID", "").strip()
    if not run_id or not pid:
        return
    import subprocess  # lazy: only after a stop under mlflow run

    subprocess.Popen(list(helper(run_id, pid)),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
