"""What a name read from outside may be: a fold number, a run id, a file name (never a path), each
accepted in its plain form only by one function here, else refused in one line naming the value
and where it came from (docs/reliability.md#what-a-name-may-be).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import UserError

#: MLflow's run ids (``uuid4().hex``).
RUN_ID = re.compile(r"[0-9a-f]{32}")
#: A plain file or folder name: ASCII letters, digits, ``._-``, not starting with a dot.
PLAIN = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}")
#: The most folds a walk-forward may have (a fold is at least a week: 50 years of weeks).
MAX_FOLD = 2600
_ASCII_DIGITS = re.compile(r"[0-9]+")


class BadName(UserError):
    """A value read from outside is not a plain name of the kind expected."""


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as a message shows it: one line, cut to ``limit`` characters."""
    text = " ".join(repr(value).split()) if not isinstance(value, str) else " ".join(value.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ascii_digits(text: Any) -> bool:
    """True when ``text`` is a non-empty string of the digits 0-9 only (never other scripts' digits)."""
    return isinstance(text, str) and bool(_ASCII_DIGITS.fullmatch(text))


def run_id(value: Any, source: str) -> str:
    """``value`` as an MLflow run id (32 lowercase hex characters), or one line naming it and
    ``source`` (where it was read: a flag, a tag, a file)."""
    if isinstance(value, str) and RUN_ID.fullmatch(value.strip()):
        return value.strip()
    raise BadName(f"{source} '{shown(value)}' is not an MLflow run id; expected 32 hex characters "
                     "(what MLflow prints as a run id)")


def fold_number(value: Any, source: str, maximum: int = MAX_FOLD) -> int:
    """``value`` as a fold number: an integer 1..``maximum`` (a JSON int or ASCII digits; never a
    bool, a float or a path), or one line naming it and ``source``."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and ascii_digits(value) and len(value) <= 6:
        number = int(value)
    if number is None or not 1 <= number <= maximum:
        raise BadName(f"{source}: fold '{shown(value)}' is not a fold number; expected an integer from 1 to "
                         f"{maximum}")
    return number


def plain_name(value: Any, source: str, what: str = "name") -> str:
    """``value`` as one plain file or folder name (no separator, no ``..``, not hidden, ASCII
    letters, digits and ``._-``, at most 128 characters), or one line naming it and ``source``."""
    if isinstance(value, str) and PLAIN.fullmatch(value) and value not in (".", ".."):
        return value
    raise BadName(f"{source}: {what} '{shown(value)}' is not a plain name; expected letters, digits and ._- "
                     "(no folder separator, not starting with a dot)")


def inside(path: str | os.PathLike, root: str | os.PathLike, source: str) -> Path:
    """``path`` resolved (links followed), when it lies inside ``root`` (resolved too); else one
    line naming both. For a path read from outside (a cache's ref, a file's entry)."""
    real, real_root = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real == real_root or real_root in real.parents:
        return real
    raise BadName(f"{source} '{shown(str(path), 200)}' resolves to {shown(str(real), 200)}, outside "
                     f"{shown(str(real_root), 200)}; expected a path inside it")

