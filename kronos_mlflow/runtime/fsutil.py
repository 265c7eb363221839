"""Durable file writes: fsync a file or a directory entry (after a rename), best effort for
directories (some filesystems refuse to open or sync them); and the one bounded reader of a small
JSON file that someone may have handed over or damaged (:func:`load_json`), which the config and
state files (:func:`read_json`), the handed-over files (:mod:`kronos_mlflow.tracking.handover`)
and the spool (:mod:`kronos_mlflow.tracking.spool`) read through."""

from __future__ import annotations

import json
import os
import stat
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


class JsonFileError(Exception):
    """Why :func:`read_bounded` or :func:`parse_json` refused a file: ``kind`` (``missing``,
    ``not-regular``, ``too-large``, ``unreadable``, ``not-utf8``, ``not-json``, ``unaccepted``),
    ``detail`` (the words that follow the file's name, e.g. ``is not UTF-8 text (bad byte at
    offset 3)``) and ``values`` (the numbers and reasons in them, for a caller that words it
    otherwise)."""

    def __init__(self, kind: str, detail: str, **values: Any):
        super().__init__(detail)
        self.kind, self.detail, self.values = kind, detail, values


def read_bounded(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (checked on the open file:
    a FIFO is never waited on, a device never read endlessly, a file that grows is cut at
    ``max_bytes + 1`` and refused); else :class:`JsonFileError`."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise JsonFileError("missing", "is missing") from None
    except IsADirectoryError:
        raise JsonFileError("not-regular", "is not a regular file", directory=True) from None
    except OSError as exc:
        raise JsonFileError("unreadable", f"cannot be read ({short_reason(exc, 120)})", reason=exc) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise JsonFileError("not-regular", "is not a regular file", directory=stat.S_ISDIR(info.st_mode))
        if info.st_size > max_bytes:
            raise JsonFileError("too-large", f"is {info.st_size:,} bytes, more than the {max_bytes:,} such a file "
                                "may have", size=info.st_size, max_bytes=max_bytes)
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        raw = b"".join(chunks)
    except OSError as exc:
        raise JsonFileError("unreadable", f"cannot be read ({short_reason(exc, 120)})", reason=exc) from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise JsonFileError("too-large", f"is more than the {max_bytes:,} bytes such a file may have",
                            size=len(raw), max_bytes=max_bytes)
    return raw


def parse_json(raw: bytes | str) -> Any:
    """The JSON value of ``raw`` (UTF-8 bytes or text); else :class:`JsonFileError`: not UTF-8,
    not JSON, or JSON Python does not take (an integer of more digits than it converts, nesting
    deeper than its recursion limit)."""
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except UnicodeDecodeError as exc:
        raise JsonFileError("not-utf8", f"is not UTF-8 text (bad byte at offset {exc.start})", offset=exc.start) from None
    except json.JSONDecodeError as exc:
        raise JsonFileError("not-json", f"is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})",
                            where=f"line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise JsonFileError("unaccepted", "is not JSON this reader accepts (nested too deeply)",
                            reason="nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        reason = short_reason(exc, 120)
        raise JsonFileError("unaccepted", f"is not JSON this reader accepts ({reason})", reason=reason) from None


def load_json(path: str | os.PathLike, max_bytes: int) -> Any:
    """The JSON value of ``path`` (:func:`read_bounded`, then :func:`parse_json`): the one reader
    of a small JSON file someone may have handed over or damaged; every refusal a
    :class:`JsonFileError` its caller words."""
    return parse_json(read_bounded(path, max_bytes))


def read_json(path: Path, *, what: str, max_bytes: int, advice: str, error: type[Exception]) -> Any:
    """The JSON value in ``path`` (:func:`load_json`); every way the file can be wrong
    (unreadable, not a regular file, too large, not UTF-8, not JSON, nested too deeply) raises
    ``error`` with one line naming ``what`` and the path, ending in ``advice``. A missing file
    raises FileNotFoundError (callers word that case)."""
    label = f"{what} '{path}'"
    try:
        return load_json(path, max_bytes)
    except JsonFileError as exc:
        kind, values = exc.kind, exc.values
        if kind == "missing":
            raise FileNotFoundError(2, "No such file or directory", str(path)) from None
        if kind == "unreadable":
            raise error(f"{label} {exc.detail}") from None
        if kind == "too-large":
            raise error(f"{label} is {values['size']:,} bytes, too large; {advice}") from None
        if kind == "not-json":
            raise error(f"{label} is not valid JSON ({values['where']}); {advice}") from None
        if kind == "unaccepted" and values["reason"] == "nested too deeply":
            raise error(f"{label} is not valid JSON (nested too deeply); {advice}") from None
        raise error(f"{label} {exc.detail}; {advice}") from None
