"""Durable file writes: fsync a file or a directory entry (after a rename), best effort for
directories (some filesystems refuse to open or sync them); and the strict reading of a small
JSON file that someone may have handed over or damaged."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import short_reason


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


def read_json(path: Path, *, what: str, max_bytes: int, advice: str, error: type[Exception]) -> Any:
    """The JSON value in ``path``; every way the file can be wrong (unreadable, too large, not
    UTF-8, not JSON, nested too deeply) raises ``error`` with one line naming ``what`` and the
    path, ending in ``advice``. A missing file raises FileNotFoundError (callers word that case)."""
    label = f"{what} '{path}'"
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{label} is {size:,} bytes, too large; {advice}")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"{label} cannot be read ({short_reason(exc)})") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{label} is not UTF-8 text (bad byte at offset {exc.start}); {advice}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{label} is not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); {advice}") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise error(f"{label} is not JSON this reader accepts ({short_reason(exc, 120)}); {advice}") from None
    except RecursionError:
        raise error(f"{label} is not valid JSON (nested too deeply); {advice}") from None
