"""Durable file writes: fsync a file or a directory entry (after a rename), best effort for
directories (some filesystems refuse to open or sync them)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file's data to disk."""
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def fsync_dir(directory: str | os.PathLike) -> None:
    """Flush a directory's entries (renames, new files) to disk; silently skipped where the
    platform or filesystem does not allow it."""
    try:
        fd = os.open(Path(directory), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory, fsynced and
    renamed over the old file: a reader sees the old content or the new one, never half."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
