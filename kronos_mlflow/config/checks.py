"""One validator per kind of value, used wherever a value enters (config keys, flags of every
subcommand, the sweep's own flags, environment variables, spool files): each raises a
:class:`~kronos_mlflow.errors.UserError` (``error`` picks the subclass) whose one line names the
value and what is accepted (docs/hostile-input.md). Nothing here imports torch, mlflow or pandas.
"""

from __future__ import annotations

import math
import numbers
import os
import posixpath
import re
import urllib.parse
from pathlib import Path
from typing import Any

from ..errors import ConfigError, UserError
from .secrets import redact_uri

#: Symbols and universe names become file names: a portable set, never a path.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

#: Seeds every library of the run accepts (numpy's legacy seeding and Optuna's samplers: 32 bits).
SEED_MAX = 2**32 - 1
#: Numbers as a user types them, in ASCII digits only: a whole number, a decimal with an exponent.
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:_[0-9]+)*(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def beyond_every_range(text: str) -> bool:
    """Whether ``text`` is a number, in ASCII digits, that no range of this project holds: more
    than 30 digits (``int`` reads up to 4,300, and a message would echo them) or a decimal that
    overflows a float (``1e400``)."""
    text = text.strip()
    if _INTEGER_TEXT.fullmatch(text):
        return len(text.lstrip("+-").lstrip("0_")) > 30
    return bool(_FLOAT_TEXT.fullmatch(text)) and math.isinf(float(text))


def shown(value: Any, limit: int = 80) -> str:
    try:
        text = str(value)
    except ValueError:  # an int of more digits than Python converts to text (4,300)
        text = f"an integer of about {int(abs(value).bit_length() * 0.30103) + 1:,} digits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def limit_text(limit: float) -> str:
    """``10,000`` for ints, ``1e+30`` / ``0.1`` for floats: a range's end as a message shows it."""
    return f"{limit:,}" if isinstance(limit, int) else f"{limit:g}"


def number_text(key: str, value: Any, text: str, high: float, *, error: type[UserError] = ConfigError) -> None:
    """``text`` (``value`` as typed) is ASCII (``"٣"``: Python reads 3, a user would not) and
    within reach of a range (not thousands of digits, not ``1e400``): else one line naming it
    and the range's end ``high``."""
    if not text.isascii():
        raise error(f"{key}: '{shown(value)}' is not a number; expected digits 0-9")
    if beyond_every_range(text):
        raise error(f"{key}: '{shown(value)}' is out of range; expected at most {limit_text(high)}")


def integer(key: str, value: Any, low: int, high: int, *, error: type[UserError] = ConfigError,
            what: str | None = None) -> int:
    """``value`` (an int, an integral float such as ``1e5``, or their text in ASCII digits) as an
    int in ``[low, high]``. Other scripts' digits (``"٣"``, which ``int`` reads as 3) are not a
    number; a number too long for any type (thousands of digits, ``1e400``) is out of range."""
    name = what or key
    expected = f"expected an integer from {low:,} to {high:,}"
    if isinstance(value, bool):
        raise error(f"{name}: '{value}' is not an integer; {expected}")
    if isinstance(value, numbers.Integral):
        number: Any = int(value)
    else:
        text = str(value).strip()
        if not text.isascii():
            raise error(f"{name}: '{shown(value)}' is not an integer (digits are 0-9); {expected}")
        if beyond_every_range(text):  # thousands of digits, 1e400: a number, beyond any range
            raise error(f"{name}: {shown(value)} is out of range; {expected}")
        try:
            number = int(text)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                raise error(f"{name}: '{shown(value)}' is not an integer; {expected}") from None
            if not math.isfinite(as_float) or as_float != int(as_float):
                raise error(f"{name}: '{shown(value)}' is not an integer; {expected}") from None
            number = int(as_float)
    if not low <= number <= high:
        raise error(f"{name}: {shown(value)} is out of range; {expected}")
    return number


def number(key: str, value: Any, low: float | None = None, high: float | None = None, *,
           low_open: bool = False, error: type[UserError] = ConfigError, what: str | None = None) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    name = what or key
    if low is not None and high is not None:
        expected = f"a number {'>' if low_open else '>='} {low:g} and <= {high:g}"
    elif low is not None:
        expected = f"a number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        expected = f"a number <= {high:g}"
    else:
        expected = "a finite number"
    if isinstance(value, bool):
        raise error(f"{name}: '{value}' is not a number; expected {expected}")
    if not isinstance(value, numbers.Real) and not str(value).strip().isascii():
        raise error(f"{name}: '{shown(value)}' is not a number (digits are 0-9); expected {expected}")
    try:
        result = float(value) if isinstance(value, numbers.Real) else float(str(value).strip())
    except OverflowError:  # an int beyond any float
        raise error(f"{name}: {shown(value)} is out of range; expected {expected}") from None
    except ValueError:
        raise error(f"{name}: '{shown(value)}' is not a number; expected {expected}") from None
    if math.isinf(result) and beyond_every_range(str(value)):  # 1e400: a number, beyond any range
        raise error(f"{name}: {shown(value)} is out of range; expected {expected}")
    if not math.isfinite(result):
        raise error(f"{name}: '{shown(value)}' is not a finite number; expected {expected}")
    if low is not None and (result <= low if low_open else result < low) or high is not None and result > high:
        raise error(f"{name}: {shown(value)} is out of range; expected {expected}")
    return result


def seed(key: str, value: Any, *, error: type[UserError] = ConfigError, what: str | None = None) -> int:
    return integer(key, value, 0, SEED_MAX, error=error, what=what)


def child_name(key: str, value: Any, parent: str, *, error: type[UserError] = ConfigError,
               what: str | None = None, max_length: int = 255) -> str:
    """A name that becomes one entry directly inside ``parent`` (a folder, a file stem): no
    separator, not ``.`` or ``..``, not absolute, no control character, at most 255 bytes.

    The one check of every user-given name that becomes a file or folder name (the save folder
    names, the sweep's study name); names that only identify something in MLflow or Optuna
    (experiment, run and registered-model names) have their own checks below."""
    name = what or key
    text = str(value)
    expected = f"a single file or folder name inside {parent} (no '/', '\\', '..' or leading '.')"
    if not text.strip() or text != text.strip():
        raise error(f"{name}: '{shown(text)}' is empty or starts or ends with a space; expected {expected}")
    if "/" in text or "\\" in text or text.startswith(".") or os.path.isabs(text):
        raise error(f"{name}: '{shown(text)}' would not stay inside {parent}; expected {expected}")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise error(f"{name}: '{shown(text)}' holds a control character; expected {expected}")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_length:
        raise error(f"{name}: '{shown(text)}' is {size:,} bytes long; expected {expected}, at most {max_length} bytes")
    return text


def _first_existing(path: Path) -> Path:
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def directory(key: str, value: Any, *, error: type[UserError] = ConfigError, what: str | None = None,
              must_exist: bool = False) -> Path:
    """A path that is a directory, or that can be made one: refused when it (or a folder above
    it) is a regular file, or when it (an existing directory, unless ``must_exist``: one to read)
    or the nearest existing folder above it is not writable."""
    name = what or key
    text = str(value).strip()
    if not text or "\0" in text:
        raise error(f"{name}: '{shown(text)}' is not a path; expected a directory path")
    try:
        return _directory(name, text, error, must_exist)
    except UserError:
        raise
    except (OSError, ValueError) as exc:  # a name longer than the file system takes, a loop of links
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise error(f"{name}: '{shown(text)}' cannot be used as a path ({why}); expected a directory path") from None


def _why_not(path: Path) -> str:
    """`` (a read-only file system)`` when ``path`` lies on one, else ''."""
    try:
        return " (a read-only file system)" if os.statvfs(path).f_flag & os.ST_RDONLY else ""
    except (OSError, AttributeError):
        return ""


def _directory(name: str, text: str, error: type[UserError], must_exist: bool) -> Path:
    path = Path(os.path.expanduser(text))
    if path.exists():
        if not path.is_dir():
            raise error(f"{name}: '{shown(text, 200)}' is a file, not a directory; expected a directory path")
        # the kernel's answer, for root too: a read-only mount or an immutable folder is not writable
        if not must_exist and not os.access(path, os.W_OK | os.X_OK):
            raise error(f"{name}: directory '{shown(text, 200)}' is not writable{_why_not(path)}; "
                        "expected a writable directory path")
        return path
    if must_exist:
        raise error(f"{name}: directory '{shown(text, 200)}' does not exist")
    above = _first_existing(path.absolute())
    if not above.is_dir():
        raise error(f"{name}: '{shown(text, 200)}' lies under '{above}', which is a file, not a directory; "
                    "expected a directory path")
    if not os.access(above, os.W_OK | os.X_OK):
        raise error(f"{name}: '{shown(text, 200)}' cannot be created ('{above}' is not writable); "
                    "expected a writable directory path")
    return path


# ------------------------------------------------------------------------------------------ MLflow

# The name columns of MLflow's database schema (mlflow/store/*/dbmodels/models.py): PostgreSQL
# and MySQL refuse a longer name at the first write (sqlite would store it), and MLflow's own
# checks allow experiment names up to 500 characters, so a name that worked on a laptop's sqlite
# store would fail on a team's server. The shortest column wins.
EXPERIMENT_NAME_MAX = 256  # experiments.name
MODEL_NAME_MAX = 256  # registered_models.name
RUN_NAME_MAX = 250  # runs.name


def mlflow_model_name(key: str, value: Any, *, error: type[UserError] = ConfigError) -> str:
    """A registered-model name MLflow's registry accepts (checked as ``register_model`` checks
    it: no '/' or ':', no path that normalises to another name, at most 256 characters)."""
    text = str(value)
    if not text:
        return text
    norm = posixpath.normpath(text)
    if (not text.strip() or "/" in text or ":" in text or norm != text or norm in (".", "..")
            or norm.startswith(("..", "/")) or len(text) > MODEL_NAME_MAX
            or any(ord(c) < 32 for c in text)):
        raise error(f"{key}: '{shown(text)}' is not a name MLflow's model registry accepts; expected at most "
                    f"{MODEL_NAME_MAX} characters without '/', ':' or control characters, e.g. kronos-tokenizer")
    return text


def mlflow_experiment_name(key: str, value: Any, *, error: type[UserError] = ConfigError) -> str:
    """An experiment name every MLflow store accepts (not blank, at most 256 characters); '' means none."""
    text = str(value)
    if not text:
        return text
    if not text.strip() or len(text) > EXPERIMENT_NAME_MAX or any(ord(c) < 32 for c in text):
        raise error(f"{key}: '{shown(text)}' is not an experiment name MLflow accepts; expected 1 to "
                    f"{EXPERIMENT_NAME_MAX} characters, no control characters")
    return text


def mlflow_run_name(key: str, value: Any, *, error: type[UserError] = ConfigError) -> str:
    text = str(value)
    if len(text) > RUN_NAME_MAX or any(ord(c) < 32 for c in text):
        raise error(f"{key}: '{shown(text)}' is not a run name MLflow shows; expected at most {RUN_NAME_MAX} "
                    "characters, no control characters")
    return text


# The schemes some MLflow tracking store serves (mlflow.tracking._tracking_service.utils registers
# them; checked against it in the tests). A database scheme may carry a driver: postgresql+psycopg2.
TRACKING_SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks",
                    "databricks-uc", "uc")
_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI (None for in-memory or not sqlite)."""
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme.split("+", 1)[0] != "sqlite":
        return None
    rest = uri.split(":///", 1)[1] if ":///" in uri else ""
    rest = rest.split("?", 1)[0]
    if not rest or rest == ":memory:":
        return None
    return Path(urllib.parse.unquote(rest))


def tracking_uri(uri: str, source: str, *, error: type[UserError] = UserError,
                 schemes: tuple[str, ...] = TRACKING_SCHEMES, kind: str = "MLflow tracking URI") -> str:
    """A URI some store serves: its scheme known, a sqlite database's folder present, a local
    store's path not under a regular file. ``source`` says where it came from
    (``MLFLOW_TRACKING_URI``, ``--tracking-uri``). The password of a URI is never shown."""
    text = str(uri).strip()
    safe = redact_uri(text)
    if "\0" in text:
        raise error(f"{source}: '{shown(safe)}' is not a URI")
    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    base = scheme.split("+", 1)[0] if scheme.split("+", 1)[0] in _DB_SCHEMES else scheme
    if len(scheme) == 1 and os.name == "nt":  # C:\path
        base = ""
    if base not in schemes:
        served = ", ".join(s + "://" for s in schemes if s)
        raise error(f"{source}: {kind} '{shown(safe, 200)}' has scheme '{scheme}', which no store serves; expected "
                    f"one of {served} or a local path")
    if base == "sqlite":
        db = sqlite_path(text)
        if db is None and ":///" not in text:
            raise error(f"{source}: {kind} '{shown(safe, 200)}' names no database file; expected sqlite:///PATH")
        if db is not None:
            if db.exists() and not db.is_file():
                raise error(f"{source}: sqlite database '{db}' is not a file; expected sqlite:///PATH/TO/FILE.db")
            if not db.exists():
                folder = db.parent
                if not folder.is_dir():
                    raise error(f"{source}: the folder of sqlite database '{db}' does not exist; create it or "
                                "choose another sqlite:///PATH")
                if not os.access(folder, os.W_OK | os.X_OK):
                    raise error(f"{source}: sqlite database '{db}' cannot be created ('{folder}' is not writable)")
    elif base in ("", "file"):
        path = urllib.parse.unquote(parts.path) if scheme == "file" else text
        if path:
            p = Path(os.path.expanduser(path))
            if p.exists() and not p.is_dir():
                raise error(f"{source}: local MLflow store '{path}' is a file, not a directory")
            if not p.exists():
                above = _first_existing(p.absolute())
                if not above.is_dir():
                    raise error(f"{source}: local MLflow store '{path}' lies under '{above}', which is a file")
    elif base in ("http", "https") and not parts.netloc.rpartition("@")[2]:
        raise error(f"{source}: {kind} '{shown(safe, 200)}' names no host; expected {scheme}://HOST:PORT")
    return text


OPTUNA_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "oracle")


def storage_url(url: str, source: str = "--storage", *, error: type[UserError] = UserError) -> str:
    """An Optuna RDB storage URL (a SQLAlchemy URL of a database Optuna supports)."""
    return tracking_uri(url, source, error=error, schemes=OPTUNA_SCHEMES, kind="Optuna storage URL")
