"""A full disk, or a folder that stopped being writable, met while a command writes: one line
naming the folder (:class:`DiskError`, exit 2) instead of a traceback; the write it interrupted
left nothing half-written, so the same command runs again once it is fixed (a training resumes
from its last saved epoch). docs/reliability.md#full-disks-and-read-only-folders.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import UserError

#: No space: the device is full, or the user's quota is.
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: Not writable: a read-only file system (or mount), permissions, an immutable folder.
DENIED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
#: safetensors' writer reports the OS error in its own words: "... (os error 28) ..." or "Os { code: 28, ...".
_RUST_CODE = re.compile(r"os error (\d+)|\bcode: (\d+)")
AGAIN = "then run the same command again (a training resumes from its last saved epoch)"


class DiskError(UserError):
    """A write failed for want of space or of permission to write."""


def os_error_code(exc: BaseException) -> int | None:
    """The ``errno`` of ``exc``: an OSError's, or the one safetensors' ``SafetensorError`` wraps."""
    if isinstance(exc, OSError):
        return exc.errno
    if type(exc).__name__ == "SafetensorError":
        found = _RUST_CODE.search(str(exc))
        if found:
            return int(found.group(1) or found.group(2))
    return None


def disk_error(exc: BaseException, path: str | os.PathLike | None = None) -> DiskError | None:
    """``exc`` as one line naming ``path``, the folder being written (else the file the error
    names), when it is a full disk or a folder that cannot be written; None for any other error
    (a permission error that names no file is not said to be a disk's)."""
    code = os_error_code(exc)
    if code not in FULL and code not in DENIED:
        return None
    where = os.fspath(path) if path is not None else getattr(exc, "filename", None)
    if code in FULL:
        shown = f"'{where}'" if where else "a file"
        return DiskError(f"no space left on the device writing {shown} ({os.strerror(code)}); free space there, "
                         f"{AGAIN}")
    if where is None:
        return None
    if path is not None:
        return DiskError(f"'{where}' is not writable ({os.strerror(code)}); make it writable, {AGAIN}")
    return DiskError(f"'{where}' cannot be written or read ({os.strerror(code)}); check its permissions and the "
                     f"file system's (a read-only mount), {AGAIN}")


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Within the block, a full disk or an unwritable folder is :class:`DiskError` naming ``path``."""
    try:
        yield
    except Exception as exc:
        error = disk_error(exc, path)
        if error is None:
            raise
        raise error from None
