"""One writer at a time: a lock file (``flock``) that a process holds only as long as it lives, for a
training's run directory (``.writer.lock``) and a pipeline's steps (``{save_path}/.claims/``): the
kernel drops it however the process ends, so no stale lock is left behind. The file names its holder
(pid, host, start time) for the refusal's line; docs/reliability.md#who-may-write-a-run.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError

WRITER_LOCK = ".writer.lock"


class Busy(UserError):
    """Another live process holds the lock."""


def _describe(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode("utf-8") or "{}")
        return f"pid {int(info['pid'])} on {str(info['host'])[:64]}, since {str(info['since'])[:32]}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


class Lock:
    """A held lock; :meth:`release` (or the process ending) lets the next holder in."""

    def __init__(self, path: Path, fd: int, created: list[Path]):
        self.path, self._fd, self.created = path, fd, created

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def abandon(self) -> None:
        """Release, and remove what taking the lock created (its file, and folders that were
        not there before and are empty again): a refusal right after taking it leaves nothing."""
        self.release()
        try:
            self.path.unlink()
        except OSError:
            pass
        for folder in reversed(self.created):
            try:
                folder.rmdir()
            except OSError:
                break

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _try_lock(fd: int, patience_s: float) -> None:
    """``flock`` without blocking, tried again for ``patience_s`` (a :func:`holder` probe holds
    it for a moment); BlockingIOError when it stays taken."""
    import fcntl

    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def hold(path: str | os.PathLike, what: str, *, wait: bool = False,
         on_wait: Callable[[str], None] | None = None, advice: str = "") -> Lock:
    """Take the lock file ``path`` (its folders created). Held by another live process: with
    ``wait``, say so through ``on_wait(holder)`` and block until it is free; else raise
    :class:`Busy` naming ``what`` and the holder (``advice`` ends the line)."""
    import fcntl

    path = Path(path)
    created = []
    for folder in reversed(path.parents):
        if not folder.exists():
            created.append(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            _try_lock(fd, 0.0 if wait else 1.0)
        except BlockingIOError:
            holder = _describe(fd)
            if not wait:
                raise Busy(f"{what} is being written by another process ({holder}); "
                           + (advice or "wait for it to end")) from None
            if on_wait is not None:
                on_wait(holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "argv": [os.path.basename(sys.argv[0] if sys.argv else "")]}
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(info).encode("utf-8"))
    except BaseException:
        os.close(fd)
        raise
    return Lock(path, fd, created)


def holder(path: str | os.PathLike) -> str | None:
    """Who holds the lock file ``path`` now (None: nobody, or no such file); changes nothing."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
