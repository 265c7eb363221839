"""Qlib provider directories on disk (what ``qlib.init(provider_uri=...)`` reads: ``calendars/<freq>.txt``,
``instruments/<name>.txt``, ``features/<symbol lowercase>/<field>.<freq>.bin`` of little-endian
float32, NaN = no trade): written without Qlib's ``dump_bin.py``, checked before Qlib sees a user's
directory (docs/hostile-input.md#qlib-provider-directories), fingerprinted for the split cache.
Nothing here imports qlib, torch or pandas at module level.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..runtime.fsutil import fsync_dir
from ..runtime.runlock import Busy
from ..config.checks import NAME_RE  # symbols and universe names become file names

CALENDAR_FILE = Path("calendars") / "day.txt"
INSTRUMENTS_DIR = Path("instruments")
FEATURES_DIR = Path("features")
FREQ = "day"



@dataclass
class SymbolSeries:
    """One symbol's stored series: calendar index of the first value, then one value a day."""

    symbol: str
    start: int  # calendar index of values[0]
    fields: dict[str, np.ndarray] = field(default_factory=dict)  # field -> float32 (n_days,)

    @property
    def end(self) -> int:
        n = len(next(iter(self.fields.values()))) if self.fields else 0
        return self.start + n - 1


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise DataError(
            f"{kind} '{name}' is not a valid name; expected letters, digits, '_', '.' or '-' "
            "(starting with a letter or digit)"
        )
    return name


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def calendar_file(freq: str = FREQ) -> Path:
    """``calendars/<freq>.txt`` (Qlib's name for a frequency's calendar)."""
    return Path("calendars") / f"{freq}.txt"


def available_freqs(path: Path) -> list[str]:
    """The frequencies a provider directory holds a calendar for (``calendars/*.txt``)."""
    try:
        return sorted(p.stem for p in (Path(path) / "calendars").glob("*.txt") if p.is_file())
    except OSError:
        return []


def write_calendar(root: Path, dates: Sequence[str], freq: str = FREQ) -> None:
    path = root / calendar_file(freq)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{d}\n" for d in dates), encoding="utf-8")


def write_instruments(root: Path, name: str, spans: Iterable[tuple[str, str, str]]) -> None:
    """``spans``: (symbol, first date, last date) triples, written in the order given."""
    check_name("instrument", name)
    path = root / INSTRUMENTS_DIR / f"{name.lower()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{s}\t{a}\t{b}\n" for s, a, b in spans), encoding="utf-8")


def write_series(root: Path, series: SymbolSeries, freq: str = FREQ) -> None:
    """One ``<field>.day.bin`` per field, in Qlib's format (start index, then the values)."""
    folder = root / FEATURES_DIR / series.symbol.lower()
    folder.mkdir(parents=True, exist_ok=True)
    for name, values in series.fields.items():
        out = np.empty(len(values) + 1, dtype="<f4")
        out[0] = series.start
        out[1:] = values
        out.tofile(folder / f"{name.lower()}.{freq}.bin")


def read_series(root: Path, symbol: str, name: str, freq: str = FREQ) -> tuple[int, np.ndarray]:
    """Read back one bin file: (start calendar index, float32 values)."""
    raw = np.fromfile(Path(root) / FEATURES_DIR / symbol.lower() / f"{name}.{freq}.bin", dtype="<f4")
    return int(raw[0]), raw[1:]


# ----------------------------------------------------------------------------------------------
# Atomic directories and locks
# ----------------------------------------------------------------------------------------------

def _is_nonempty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and any(path.iterdir())
    except OSError:
        return False


#: What a writer of an output folder keeps inside it while it writes: its scratch folder (the new
#: content, ``.kronos-write-<pid>-*``) and, under ``--force``, the old content moved aside.
SCRATCH_PREFIX = ".kronos-write-"
OLD_PREFIX = ".kronos-old-"
#: What an empty file system's root holds (ext4's ``lost+found``): a mount point holding only it is empty.
_MOUNT_ENTRIES = ("lost+found",)


def _content(final: Path) -> list[Path]:
    """The entries of the folder ``final`` that are content: not a writer's scratch or old folder,
    nor, at a mount point, the file system's own ``lost+found``."""
    mount = os.path.ismount(final)
    return [p for p in final.iterdir()
            if not p.name.startswith((SCRATCH_PREFIX, OLD_PREFIX)) and not (mount and p.name in _MOUNT_ENTRIES)]


def _lock_dir(final: Path, what: str) -> int | None:
    """An exclusive ``flock`` on the folder ``final`` itself (no lock file: the kernel drops it
    however the process ends); the descriptor, or None where the platform or file system has no
    such lock. Held by another process: :class:`~kronos_mlflow.runtime.runlock.Busy`."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the renames stay atomic, two writers are not told apart
        return None
    while True:
        fd = os.open(final, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pids = sorted({p.name[len(SCRATCH_PREFIX):].split("-")[0] for p in _listing(final)
                           if p.name.startswith(SCRATCH_PREFIX)})
            who = f" (pid {', '.join(pids)})" if pids else ""
            raise Busy(f"{what} '{final}' is being written by another process{who}; wait for it to end, "
                       f"or choose another {what}") from None
        except OSError:  # a file system without flock on folders (some network ones)
            os.close(fd)
            return None
        try:
            if os.stat(final).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:  # the folder was removed by the writer that held it: make it again
            pass
        os.close(fd)  # the path is another folder now: lock that one
        final.mkdir(parents=True, exist_ok=True)


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


@contextlib.contextmanager
def atomic_output_dir(final: Path, force: bool = False, what: str = "--out") -> Iterator[Path]:
    """Yield a fresh scratch folder; on success its content becomes ``final``'s.

    One writer at a time: ``final`` is made (when missing) and locked (``flock`` on the folder)
    before anything is written; another writer's ``final`` is refused in one line
    (:class:`~kronos_mlflow.runtime.runlock.Busy`, exit 2), and so is a non-empty ``final`` unless
    ``force``, checked under the lock. The scratch folder lies inside ``final`` (the same file
    system, so a mount point works: it is written into, never replaced) and its entries are renamed
    into ``final`` one by one, the calendars last: a reader that finds ``calendars/`` finds
    everything. With ``force`` the old content is moved aside first (the calendars first), then
    deleted. On any error the scratch folder is removed, and ``final`` too when this call made it:
    a failed run leaves nothing half-written. Scratch folders of a writer that was killed are
    removed by the next one.
    """
    final = Path(final).expanduser().absolute()
    if final.exists() and not final.is_dir():
        raise DataError(f"{what} '{final}' exists and is not a directory; choose a directory path")
    made = [p for p in (final, *final.parents) if not p.exists()]
    try:
        final.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{what} '{final}' cannot be created ({exc.strerror or exc}); choose a writable directory") from None

    def unmake() -> None:
        for folder in made:  # the deepest first
            try:
                folder.rmdir()
            except OSError:
                break

    fd, locked = None, False
    try:
        fd = _lock_dir(final, what)
        locked = True
        for stale in _listing(final):  # a killed writer's: holding the lock, no other writer is alive
            if stale.name.startswith((SCRATCH_PREFIX, OLD_PREFIX)):
                shutil.rmtree(stale, ignore_errors=True)
        if _content(final) and not force:
            raise DataError(f"{what} '{final}' is not empty; choose a new directory or pass --force to replace it")
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=final))
        except OSError as exc:
            raise DataError(f"{what} '{final}' is not writable ({exc.strerror or exc}); choose a writable "
                            "directory") from None
        try:
            yield tmp
            _publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except BaseException:
        if locked:  # never another writer's folder
            unmake()
        raise
    finally:
        if fd is not None:
            os.close(fd)


def _calendars_last(entries: Iterable[Path]) -> list[Path]:
    return sorted(entries, key=lambda p: (p.name == "calendars", p.name))


def _publish(tmp: Path, final: Path) -> None:
    """Move ``tmp``'s entries into ``final`` (the calendars last), the content there before moved
    aside first (the calendars first) and then deleted."""
    old = None
    content = _content(final)
    if content:
        old = Path(tempfile.mkdtemp(prefix=f"{OLD_PREFIX}{os.getpid()}-", dir=final))
        for entry in reversed(_calendars_last(content)):
            os.rename(entry, old / entry.name)
    for entry in _calendars_last(tmp.iterdir()):
        os.rename(entry, final / entry.name)
    tmp.rmdir()
    fsync_dir(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[bool]:
    """An exclusive advisory lock (``fcntl.flock``) held for the ``with`` block; yields True.

    Where ``fcntl`` is missing (Windows) this yields False and locks nothing: callers still
    publish with an atomic rename, so concurrent builders only duplicate work, never corrupt it.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield False
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def build_once(final: Path, build: Callable[[Path], None], is_complete: Callable[[Path], bool],
               force: bool = False) -> bool:
    """Make ``final`` by ``build(tmp_dir)`` unless a complete one exists (or ``force``).

    Safe across processes: concurrent callers (torchrun ranks, parallel jobs) serialise on a
    lock file next to ``final``; the builder writes into a private temporary directory that is
    renamed into place, so a reader never sees a half-written ``final``. Returns True when this
    call built it.
    """
    final = Path(final)
    if not force and is_complete(final):
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final.parent / f".{final.name}.lock") as locked:
        if not force and is_complete(final):
            return False  # another process built it while we waited
        if locked:  # holding the lock, any temp dir for this name is a crashed builder's leftover
            for stale in final.parent.glob(f".{final.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            build(tmp)
            os.chmod(tmp, 0o755)
            if final.exists():  # forced rebuild, or an incomplete leftover: swap it out
                old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
                os.rename(final, old)
                os.rename(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                try:
                    os.rename(tmp, final)
                except OSError:
                    # Someone without the lock (no fcntl) published first: keep theirs.
                    if not is_complete(final):
                        raise
                    shutil.rmtree(tmp, ignore_errors=True)
                    return False
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return True


# ----------------------------------------------------------------------------------------------
# Checking a user's directory
# ----------------------------------------------------------------------------------------------

_PROVIDER_HINT = (
    "expected a Qlib provider directory (calendars/day.txt, instruments/<name>.txt, features/), "
    "'' for the built-in demo market, or one made by `kronos-mlflow import-csv`"
)


def check_provider(path: Path, key: str = "qlib_data_path", freq: str = FREQ) -> Path:
    """Raise DataError unless ``path`` looks like a Qlib provider directory with ``freq`` bars."""
    path = Path(path)
    CALENDAR_FILE = calendar_file(freq)  # noqa: N806 - the daily module constant, per frequency
    if not path.exists():
        raise DataError(f"{key} '{path}' does not exist; {_PROVIDER_HINT}")
    if not path.is_dir():
        raise DataError(f"{key} '{path}' is not a directory; {_PROVIDER_HINT}")
    if not _is_nonempty_dir(path):
        raise DataError(f"{key} '{path}' is an empty directory; {_PROVIDER_HINT}")
    cal = path / CALENDAR_FILE
    if not cal.is_file():
        have = available_freqs(path)
        if have:
            raise DataError(f"freq '{freq}': {key} '{path}' has no {freq} bars ({CALENDAR_FILE} is missing); "
                            f"it has: {', '.join(have)}")
        raise DataError(f"{key} '{path}' is not a Qlib provider directory ({CALENDAR_FILE} is missing); {_PROVIDER_HINT}")
    if cal.stat().st_size == 0:
        raise DataError(f"{key} '{path}': {CALENDAR_FILE} is empty; {_PROVIDER_HINT}")
    if not (path / INSTRUMENTS_DIR).is_dir() or not list_instruments(path):
        raise DataError(f"{key} '{path}' is not a Qlib provider directory (no instruments/*.txt); {_PROVIDER_HINT}")
    if not (path / FEATURES_DIR).is_dir():
        raise DataError(f"{key} '{path}' is not a Qlib provider directory (features/ is missing); {_PROVIDER_HINT}")
    _check_calendar(path, key, freq)
    _check_feature_files(path, key, freq)
    return path


_MAX_CALENDAR_BYTES = 16 << 20  # a century of minute bars is far less


def _check_calendar(path: Path, key: str, freq: str = FREQ) -> None:
    """``calendars/<freq>.txt`` is UTF-8 text with one date (or date-time) a line, strictly
    increasing: every bin file is indexed by its line numbers, so a repeated or misplaced line
    would shift every series after it (Qlib's own errors name no file, and it would use such a
    calendar as it is)."""
    CALENDAR_FILE = calendar_file(freq)  # noqa: N806
    cal = path / CALENDAR_FILE
    size = cal.stat().st_size
    if size > _MAX_CALENDAR_BYTES:
        raise DataError(f"{key} '{path}': {CALENDAR_FILE} is {size:,} bytes, too large for a calendar; {_PROVIDER_HINT}")
    data = cal.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(f"{key} '{path}': {CALENDAR_FILE} is not UTF-8 text (line {line}); "
                        "expected one YYYY-MM-DD date a line") from None
    numbers, items = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        item = line.strip()
        if item:
            numbers.append(number)
            items.append(item)
    try:
        stamps = np.array(items, dtype="datetime64[s]")
    except ValueError:
        stamps = None
    if stamps is None or np.isnat(stamps).any():
        for number, item in zip(numbers, items):
            try:
                if np.isnat(np.datetime64(item, "s")):
                    raise ValueError(item)
            except ValueError:
                shown = item if len(item) <= 40 else item[:37] + "..."
                raise DataError(f"{key} '{path}': {CALENDAR_FILE} line {number} '{shown}' is not a date; "
                                "expected one YYYY-MM-DD date a line") from None
    steps = np.diff(stamps.astype(np.int64))
    if (steps <= 0).any():
        i = int(np.flatnonzero(steps <= 0)[0])
        what = "repeats" if steps[i] == 0 else "comes before"
        raise DataError(
            f"{key} '{path}': {CALENDAR_FILE} line {numbers[i + 1]} '{items[i + 1]}' {what} line {numbers[i]} "
            f"'{items[i]}'; expected each trading {'day' if freq == FREQ else 'bar'} once, in increasing order "
            "(every feature file is indexed by these lines: re-import or re-download the directory)"
        )


def calendar_length(path: Path, freq: str = FREQ) -> int:
    """Lines (dates) of ``calendars/<freq>.txt``."""
    text = (Path(path) / calendar_file(freq)).read_text(encoding="utf-8")
    return sum(1 for line in text.splitlines() if line.strip())


def _check_feature_files(path: Path, key: str, freq: str = FREQ) -> None:
    """Every ``features/*/*.day.bin`` holds whole little-endian float32 values, at least the start
    index (a stat each; Qlib would fail later with no file name)."""
    features = path / FEATURES_DIR
    with os.scandir(features) as it:
        symbols = sorted(e.name for e in it if e.is_dir())
    for sym in symbols:
        with os.scandir(features / sym) as it:
            for entry in sorted(it, key=lambda e: e.name):
                if not entry.name.endswith(f".{freq}.bin"):
                    continue
                size = entry.stat().st_size
                if size < 4 or size % 4:
                    raise DataError(
                        f"{key} '{path}': {FEATURES_DIR / sym / entry.name} is {size} bytes, not whole float32 values "
                        "(truncated or not in Qlib's format); re-import or re-download that directory"
                    )


def list_instruments(path: Path) -> list[str]:
    folder = Path(path) / INSTRUMENTS_DIR
    try:
        return sorted(p.stem for p in folder.glob("*.txt") if p.is_file())
    except OSError:
        return []


def check_instrument(path: Path, instrument: str, freq: str = FREQ) -> str:
    """``instruments/<instrument>.txt`` exists directly in the provider's ``instruments/`` (the
    name is never a path), each line is ``SYMBOL<TAB>START<TAB>END`` with a valid symbol name and
    START <= END, and each listed symbol's feature files start and end inside the calendar."""
    available = list_instruments(path)
    # Qlib opens instruments/<name lowercased>.txt, whatever case the name is given in.
    if (not isinstance(instrument, str) or not NAME_RE.match(instrument)
            or not (Path(path) / INSTRUMENTS_DIR / f"{str(instrument).lower()}.txt").is_file()):
        raise DataError(
            f"instrument '{instrument}' is not in '{path / INSTRUMENTS_DIR}'; available: {', '.join(available)}"
        )
    spans = _check_instrument_file(Path(path), instrument)
    _check_series_bounds(Path(path), sorted(spans), freq)
    return instrument


def _check_instrument_file(path: Path, instrument: str) -> dict[str, list[tuple[str, str]]]:
    import datetime as _dt

    where = INSTRUMENTS_DIR / f"{instrument.lower()}.txt"
    try:
        text = (path / where).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"qlib_data_path '{path}': {where} is not UTF-8 text; expected SYMBOL<TAB>START<TAB>END "
                        "lines") from None
    out: dict[str, list[tuple[str, str]]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split("\t")]
        shown = line if len(line) <= 60 else line[:57] + "..."
        if len(parts) < 3 or not parts[0]:
            raise DataError(f"qlib_data_path '{path}': {where} line {number} '{shown}' is not SYMBOL<TAB>START<TAB>END")
        symbol, a, b = parts[:3]
        if not NAME_RE.match(symbol):
            raise DataError(f"qlib_data_path '{path}': {where} line {number}: symbol '{symbol}' is not a valid name "
                            "(its features folder would lie outside features/); expected letters, digits, '_', '.' "
                            "or '-'")
        try:
            first, last = (_dt.datetime.fromisoformat(v.replace(" ", "T", 1)) for v in (a, b))
        except ValueError:
            raise DataError(f"qlib_data_path '{path}': {where} line {number} '{shown}': START and END must be dates "
                            "(YYYY-MM-DD)") from None
        if first > last:
            raise DataError(f"qlib_data_path '{path}': {where} line {number}: symbol {symbol}'s span starts {a}, after "
                            f"its end {b}; expected START <= END")
        out.setdefault(symbol, []).append((a, b))
    return out


def _check_series_bounds(path: Path, symbols: Sequence[str], freq: str = FREQ) -> None:
    """Each ``features/<symbol>/*.<freq>.bin`` starts at a whole calendar index and ends inside
    the calendar (Qlib would read a series that starts outside it as empty, or misplace it)."""
    n_cal = calendar_length(path, freq)
    for symbol in symbols:
        folder = path / FEATURES_DIR / symbol.lower()
        try:
            entries = sorted(e for e in os.listdir(folder) if e.endswith(f".{freq}.bin"))
        except (FileNotFoundError, NotADirectoryError):
            continue  # no features: Qlib yields nothing for the symbol
        for name in entries:
            file = folder / name
            size = file.stat().st_size
            with open(file, "rb") as fh:
                head = np.frombuffer(fh.read(4), dtype="<f4")
            if len(head) < 1:
                continue  # a short file: _check_feature_files names it
            start = float(head[0])
            n_values = size // 4 - 1
            rel = FEATURES_DIR / symbol.lower() / name
            if not np.isfinite(start) or start != int(start) or start < 0 or start >= max(n_cal, 1):
                raise DataError(
                    f"qlib_data_path '{path}': {rel} starts at calendar index {start:g}, outside the calendar "
                    f"(0..{n_cal - 1}, {calendar_file(freq)}); the file is damaged or belongs to another calendar: "
                    "re-import or re-download that directory"
                )
            if int(start) + n_values > n_cal:
                raise DataError(
                    f"qlib_data_path '{path}': {rel} holds {n_values:,} values from calendar index {int(start)}, past "
                    f"the calendar's last day (index {n_cal - 1}); the file belongs to another calendar: re-import "
                    "or re-download that directory"
                )


def read_instrument_file(path: Path, instrument: str) -> dict[str, list[tuple[str, str]]]:
    """``{symbol: [(start, end), ...]}`` from ``instruments/<instrument>.txt`` (no Qlib needed)."""
    out: dict[str, list[tuple[str, str]]] = {}
    text = (Path(path) / INSTRUMENTS_DIR / f"{instrument.lower()}.txt").read_text(encoding="utf-8")
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0].strip():
            out.setdefault(parts[0].strip(), []).append((parts[1].strip(), parts[2].strip()))
    return out


# ----------------------------------------------------------------------------------------------
# Fingerprint (what keys the prepared-split cache)
# ----------------------------------------------------------------------------------------------

def provider_fingerprint(path: Path, freq: str = FREQ) -> str:
    """sha256 over the calendar and instrument files' contents and every feature file's
    name, size and mtime: any re-import, regeneration or edit changes it, while reading
    tens of thousands of bins is avoided (a stat each)."""
    root = Path(path)
    h = hashlib.sha256()
    h.update((root / calendar_file(freq)).read_bytes())
    for name in list_instruments(root):
        h.update(b"\0inst\0" + name.encode())
        h.update((root / INSTRUMENTS_DIR / f"{name}.txt").read_bytes())
    features = root / FEATURES_DIR
    with os.scandir(features) as it:
        symbols = sorted((e.name for e in it if e.is_dir()))
    for sym in symbols:
        with os.scandir(features / sym) as it:
            entries = sorted((e.name, e.stat()) for e in it if e.name.endswith(f".{freq}.bin"))
        for name, st in entries:
            h.update(f"\0{sym}/{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def digest_of(items: Mapping[str, object]) -> str:
    """A stable sha256 of a JSON-able mapping."""
    import json

    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()
