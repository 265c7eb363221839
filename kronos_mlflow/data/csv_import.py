"""Turn K-line CSV files (daily or 1- to 60-minute bars) into a Qlib provider directory:
``kronos-mlflow import-csv``. The columns and timestamps it accepts, how the frequency is inferred
and what is refused or dropped: docs/data.md#your-own-csv-files and docs/hostile-input.md.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..config.features import amount_from_ohlcv
from ..config.names import ascii_digits
from . import provider as pv
from .prepare import DataWarning

DATE_COLUMNS = ("timestamps", "date", "datetime")
INDEX_NAMES = ("index",)  # a first column of times under this name is the date column too
PRICE_COLUMNS = ("open", "high", "low", "close", "volume")
EXPECTED = "timestamps (or date), open, high, low, close, volume, optional amount and symbol"


def _expand(files: Iterable) -> list[Path]:
    out: list[Path] = []
    for f in files:
        p = Path(f).expanduser()
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.suffix.lower() == ".csv" and q.is_file())
            if not found:
                raise DataError(f"directory '{p}' holds no .csv files; expected K-line CSV files")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise DataError(f"CSV file '{p}' does not exist; expected K-line CSV files ({EXPECTED})")
    if not out:
        raise DataError(f"no CSV files given; expected K-line CSV files ({EXPECTED})")
    return out


def _read_one(path: Path, time_unit: str | None = None):
    """-> list of (symbol, timestamps datetime64[s] in file order, {column: float64 array}, what
    the summary line says of how the dates were read)."""
    import pandas as pd

    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise DataError(f"'{path}' is empty; expected a CSV file with columns {EXPECTED}") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"'{path}' is not a readable CSV file ({first}); expected columns {EXPECTED}") from None
    df.columns = [str(c).strip().lower() for c in df.columns]
    date_col = next((c for c in DATE_COLUMNS if c in df.columns), None) or _index_dates(df, path, time_unit)
    missing = ([] if date_col else ["timestamps (or date)"]) + [c for c in PRICE_COLUMNS if c not in df.columns]
    if missing:
        have = ", ".join(df.columns) or "none"
        raise DataError(f"'{path}' lacks column(s) {', '.join(missing)}; it has {have}; expected {EXPECTED}")
    if len(df) == 0:
        raise DataError(f"'{path}' has a header but no rows; expected one row per symbol and day")

    raw_dates = df[date_col].astype(str).str.strip()
    raw_dates, clock = _one_clock(path, raw_dates, date_col)
    days = parse_times(raw_dates, f"'{path}'", date_col, time_unit)
    said = tuple(note for note in (date_column_note(date_col), clock) if note)

    values: dict[str, np.ndarray] = {}
    for col in PRICE_COLUMNS + (("amount",) if "amount" in df.columns else ()):
        text = df[col].astype(str).str.strip()
        num = pd.to_numeric(text.where(text != "", None), errors="coerce").to_numpy(dtype=np.float64)
        bad = np.isnan(num) & (text != "").to_numpy() & ~text.str.lower().isin(["nan", "na", "null", "none"]).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"'{path}' row {i + 2}: '{text.iloc[i]}' in column {col} is not a number; expected numbers")
        values[col] = num
    if "amount" not in values:
        with np.errstate(all="ignore"):
            values["amount"] = amount_from_ohlcv(values["open"], values["high"], values["low"], values["close"],
                                                 values["volume"])

    if "symbol" in df.columns:
        syms = df["symbol"].astype(str).str.strip().to_numpy()
        if (syms == "").any():
            i = int(np.flatnonzero(syms == "")[0])
            raise DataError(f"'{path}' row {i + 2}: the symbol column is empty; expected a symbol on every row")
        names = list(dict.fromkeys(syms))
        groups = [(s, np.flatnonzero(syms == s)) for s in names]
        kind = f"symbol in '{path}'"
    else:
        name = path.name[:-4] if path.name.lower().endswith(".csv") else path.stem
        groups = [(name, np.arange(len(df)))]
        kind = f"symbol (from file name '{path.name}')"
    out = []
    for sym, rows in groups:
        pv.check_name(kind, sym)
        d = days[rows]
        step = np.diff(d.astype(np.int64))
        if (step == 0).any():
            i = int(np.flatnonzero(step == 0)[0])
            raise DataError(f"'{path}' row {rows[i + 1] + 2}: symbol {sym} has a duplicated timestamp {_show(d[i])}; "
                            "expected one row per symbol and bar")
        if (step < 0).any():
            i = int(np.flatnonzero(step < 0)[0])
            raise DataError(f"'{path}' row {rows[i + 1] + 2}: symbol {sym}'s timestamp {_show(d[i + 1])} comes before "
                            f"the previous row's {_show(d[i])}; expected rows sorted by time")
        out.append((sym, d, _drop_bad_bars(path, sym, {k: v[rows] for k, v in values.items()}, rows), said))
    return out


def _index_dates(df, path: Path, time_unit: str | None) -> str | None:
    """The first column when it is an index that holds times (what ``DataFrame.to_csv()`` writes
    for a frame indexed by date: a column with no name, which pandas reads as ``Unnamed: 0``, or
    one named ``index``); None otherwise."""
    if not len(df.columns) or not len(df):
        return None
    first = df.columns[0]
    if not (first == "" or first.startswith("unnamed: ") or first in INDEX_NAMES):
        return None
    try:
        parse_times(_without_offsets(df[first].astype(str).str.strip()), f"'{path}'", first, time_unit)
    except DataError:  # an index of row numbers, not times: the usual refusal names what is missing
        return None
    return first


def date_column_note(column: str) -> str:
    """How the summary line names a date column found by :func:`_index_dates` ('' otherwise)."""
    if column in DATE_COLUMNS:
        return ""
    shown = "the unnamed first column" if column == "" or column.startswith("unnamed: ") else f"column {column}"
    return f"dates: {shown} (an index written by DataFrame.to_csv())"


# A timestamp's UTC offset: after a time of day, Z or +HH:MM / -HHMM / +HH.
_ZONE_RE = r"[0-9]{1,2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?\s*(Z|[+-][0-9]{2}(?::?[0-9]{2})?)$"
_FLOAT32_MAX = float(np.finfo(np.float32).max)


# A time of day and its UTC offset; replaced by group 1, the offset is gone.
_TIME_AND_ZONE = r"([0-9]{1,2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?)\s*(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)$"


def _without_offsets(raw_dates):
    """The timestamps' local clock times: each UTC offset after a time of day dropped."""
    return raw_dates.str.replace(_TIME_AND_ZONE, r"\1", regex=True)


def _one_clock(path: Path, raw_dates, column: str):
    """``(dates, note)``: the file's timestamps on one clock, the exchange's local one, as Qlib
    stores bars. Offsets are dropped on import, so every timestamp must carry the same UTC offset
    (or none), or else offsets that change only where one time zone's daylight saving does (what
    yfinance's ``Ticker.history().to_csv()`` writes: ``-05:00`` in winter, ``-04:00`` in summer,
    each the local clock's offset at that time): their local clock times are kept, their offsets
    dropped, and ``note`` says so for the summary line. Two clocks in one file (offsets of two
    zones, or some with an offset and some without) would interleave wrongly: a DataError."""
    zones = raw_dates.str.extract(_ZONE_RE, expand=False).fillna("").to_numpy()
    if not len(zones) or (zones == zones[0]).all():
        return raw_dates, ""
    if (zones != "").all():
        local = _without_offsets(raw_dates)
        wall = parse_times(local, f"'{path}'", column)
        if _daylight_saving_zone(wall, np.array([_offset_seconds(z) for z in zones], dtype=np.int64)):
            shown = ", ".join(sorted(set(zones), key=_offset_seconds))
            return local, f"times: the exchange's local clock (UTC offsets {shown} dropped: daylight saving)"
    i = int(np.flatnonzero(zones != zones[0])[0])
    a, b = zones[0] or "no offset", zones[i] or "no offset"
    raise DataError(f"'{path}' rows 2 and {i + 2}: timestamps '{raw_dates.iloc[0]}' and '{raw_dates.iloc[i]}' "
                    f"are in different time zones ({a}, {b}); expected one UTC offset (or none) for the whole "
                    "file, or offsets that change only at one time zone's daylight saving: convert the timestamps "
                    "to the exchange's local time")


def _offset_seconds(zone: str) -> int:
    """``Z``, ``+08``, ``-0500``, ``+05:30`` as seconds east of UTC."""
    if zone == "Z":
        return 0
    digits = zone[1:].replace(":", "")
    return (-1 if zone[0] == "-" else 1) * (int(digits[:2]) * 3600 + int(digits[2:4] or 0) * 60)


_ZONES: list | None = None  # the time zone database's zones, read once


def _daylight_saving_zone(wall: np.ndarray, offsets: np.ndarray) -> str | None:
    """A time zone (of the system's database) in which each local clock time ``wall`` with its
    UTC offset ``offsets`` (seconds) is the offset that zone has at that moment; None if none."""
    import datetime as _dt
    import zoneinfo

    import pandas as pd

    global _ZONES
    if _ZONES is None:
        _ZONES = []
        for name in sorted(zoneinfo.available_timezones()):
            try:
                _ZONES.append(zoneinfo.ZoneInfo(name))
            except (OSError, ValueError):
                continue
    pairs = np.unique(np.stack([wall.astype(np.int64) - offsets, offsets], axis=1), axis=0)  # (UTC, offset)
    instants, offsets = pairs[:, 0], pairs[:, 1]
    probes = [int(np.flatnonzero(offsets == off)[0]) for off in dict.fromkeys(offsets.tolist())]

    def offset_at(zone, t: int) -> float | None:
        try:
            return _dt.datetime.fromtimestamp(int(instants[t]), zone).utcoffset().total_seconds()
        except (OverflowError, OSError, ValueError):
            return None

    utc = pd.DatetimeIndex(instants.astype("datetime64[s]"))
    for zone in _ZONES:
        if all(offset_at(zone, t) == offsets[t] for t in probes):
            try:
                local = utc.tz_localize("UTC").tz_convert(str(zone.key)).tz_localize(None)
            except (KeyError, ValueError, OverflowError):  # a zone pandas does not read, times beyond it
                continue
            if ((local - utc).total_seconds().to_numpy() == offsets).all():
                return str(zone.key)
    return None


# Epoch timestamps, as exchanges export them: whole seconds, milliseconds, microseconds or
# nanoseconds since 1970-01-01 UTC.
TIME_UNITS = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}  # per second
UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
_EXAMPLE_S = 1704067200  # 2024-01-01 00:00:00 UTC
# Without --time-unit the unit is the one in which the number is a time from 1971 to 2262;
# those ranges do not overlap (seconds end at 9.2e9, milliseconds start at 3.2e10), and no
# YYYYMMDD date (at most 29991231) reaches 1971 in seconds (31536000).
_AUTO_FIRST_S = 31_536_000  # 1971-01-01 00:00:00 UTC
_FIRST_S, _LAST_S = -9_223_372_036, 9_223_372_036  # pandas' first and last datetimes (1677, 2262), in seconds
_INTEGER = r"[+-]?[0-9]+"  # ASCII digits: "٣" is not a number a file holds


def check_time_unit(time_unit: str | None) -> None:
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise DataError(f"--time-unit {time_unit!r} is not a unit; expected {', '.join(TIME_UNITS)} (epoch seconds, "
                        "milliseconds, microseconds or nanoseconds), or no --time-unit to detect it")


def parse_times(raw, where: str, column: str, time_unit: str | None = None) -> np.ndarray:
    """The time column ``raw`` (a Series of stripped strings) as ``datetime64[s]``, never through
    pandas' per-value guessing (and its "Could not infer format" warning):

    - whole numbers: epoch times in ``time_unit``, or without it in the unit their magnitude
      says (one unit for the whole file), unless every value is an eight-digit YYYYMMDD date;
    - text: ISO 8601 dates and times (any layout), else every value in the format of the first.

    Offsets are dropped (bars keep their local clock time, see ``_one_clock``); epoch times
    are UTC. The first value that is none of these is a one-line ``DataError`` naming its row."""
    check_time_unit(time_unit)
    text = raw.to_numpy(dtype=object)
    integer = raw.str.fullmatch(_INTEGER).to_numpy(dtype=bool)
    if time_unit is not None:
        per, name = TIME_UNITS[time_unit], UNIT_NAMES[time_unit]
        if not integer.all():
            i = int(np.flatnonzero(~integer)[0])
            raise DataError(f"{where} row {i + 2}: '{text[i]}' in column {column} is not a whole number of {name}; "
                            f"--time-unit {time_unit} expects epoch {name} such as {_EXAMPLE_S * per}")
        numbers = _int64(text, where, column, f"epoch {name} (--time-unit {time_unit})",
                         f"epoch {name} such as {_EXAMPLE_S * per}")
        outside = (numbers < _FIRST_S * per) | (numbers > _LAST_S * per)
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise DataError(f"{where} row {i + 2}: '{text[i]}' in column {column} is outside the times pandas holds "
                            f"(1677 to 2262) as epoch {name} (--time-unit {time_unit}); expected epoch {name} such "
                            f"as {_EXAMPLE_S * per}")
        return numbers.astype(f"datetime64[{time_unit}]").astype("datetime64[s]")
    if len(text) and integer.all():
        if all(len(t) == 8 and ascii_digits(t) for t in text):
            import pandas as pd

            days = pd.to_datetime(raw, format="%Y%m%d", errors="coerce")
            if not pd.isna(days.iloc[0]):  # a YYYYMMDD file: every value must be one
                return _as_seconds(days, text, where, column, "%Y%m%d")
        return _epoch_times(text, where, column)
    return _text_times(raw, text, integer, where, column)


def _int64(text, where: str, column: str, what: str, expected: str) -> np.ndarray:
    numbers = [int(t) if len(t) <= 25 else 2**64 for t in text]  # longer: beyond int64 (int() reads 4,300 digits)
    big = next((i for i, n in enumerate(numbers) if not -(2**63) < n < 2**63), None)
    if big is not None:
        raise DataError(f"{where} row {big + 2}: '{text[big]}' in column {column} is too large for {what}; "
                        f"expected {expected}")
    return np.array(numbers, dtype=np.int64)


def _epoch_times(text, where: str, column: str) -> np.ndarray:
    """Whole numbers in the one unit (s, ms, us, ns) where each is a time from 1971 to 2262."""
    numbers = _int64(text, where, column, "an epoch time",
                     f"dates such as 2024-01-31 or epoch seconds such as {_EXAMPLE_S}")
    units = list(TIME_UNITS)
    unit = np.full(len(numbers), -1)
    for k, per in enumerate(TIME_UNITS.values()):
        unit[(numbers >= _AUTO_FIRST_S * per) & (numbers <= _LAST_S * per)] = k
    if (unit < 0).any():
        i = int(np.flatnonzero(unit < 0)[0])
        raise DataError(f"{where} row {i + 2}: '{text[i]}' in column {column} is neither a time from 1971 to 2262 in "
                        "epoch seconds, milliseconds, microseconds or nanoseconds nor a YYYYMMDD date; expected "
                        f"dates such as 2024-01-31 or epoch seconds such as {_EXAMPLE_S} (--time-unit s|ms|us|ns "
                        "names the unit)")
    if (unit != unit[0]).any():
        i = int(np.flatnonzero(unit != unit[0])[0])
        a, b = UNIT_NAMES[units[unit[0]]], UNIT_NAMES[units[unit[i]]]
        raise DataError(f"{where} rows 2 and {i + 2}: '{text[0]}' and '{text[i]}' in column {column} are epoch {a} "
                        f"and epoch {b} by their sizes: mixed units; expected one unit for the whole file "
                        "(--time-unit s|ms|us|ns names it)")
    return numbers.astype(f"datetime64[{units[unit[0]]}]").astype("datetime64[s]")


def _text_times(raw, text, integer, where: str, column: str) -> np.ndarray:
    import pandas as pd

    try:
        from pandas.tseries.api import guess_datetime_format
    except ImportError:  # pandas < 2.2
        from pandas._libs.tslibs.parsing import guess_datetime_format

    iso = pd.to_datetime(raw, format="ISO8601", errors="coerce")
    if not iso.isna().any():
        return _as_seconds(iso, text, where, column, "ISO 8601")
    fmt = guess_datetime_format(text[0]) if not integer[0] else None
    dates = iso if fmt is None else pd.to_datetime(raw, format=fmt, errors="coerce")
    neither = (iso.isna() & dates.isna()).to_numpy()
    if neither.any():
        i = int(np.flatnonzero(neither)[0])
        if fmt is None or i == 0 or not pd.isna(iso.iloc[0]):  # no other format than ISO 8601 to name
            raise DataError(f"{where} row {i + 2}: '{text[i]}' in column {column} is not a date; expected dates such "
                            f"as 2024-01-31 or 2024-01-31 09:30 (ISO 8601), or epoch seconds such as {_EXAMPLE_S}")
        raise DataError(f"{where} row {i + 2}: '{text[i]}' in column {column} is neither an ISO 8601 date nor one in "
                        f"the format of row 2's '{text[0]}' ({fmt}); expected one date format for the whole file, "
                        "such as 2024-01-31")
    return _as_seconds(dates, text, where, column, fmt)


def _as_seconds(dates, text, where: str, column: str, fmt: str) -> np.ndarray:
    """``dates`` as naive datetime64[s]; a value ``fmt`` did not read (NaT) is refused."""
    bad = dates.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{where} row {i + 2}: '{text[i]}' in column {column} is not a date in the format of row 2's "
                        f"'{text[0]}' ({fmt}); expected one date format for the whole file (ISO 8601 dates such as "
                        "2024-01-31 may mix layouts)")
    if getattr(dates.dt, "tz", None) is not None:
        dates = dates.dt.tz_localize(None)
    return dates.to_numpy().astype("datetime64[s]")


def _drop_bad_bars(path: Path, sym: str, vals: dict, rows: np.ndarray) -> dict:
    """Damaged bars become missing bars (NaN in every field, as an empty row is), with one
    warning line for the symbol saying how many and why: a value that is infinite or beyond
    what a float32 bin holds (``inf``, ``1e39``), or a high below the low."""
    with np.errstate(all="ignore"):
        stacked = np.stack([vals[k] for k in ("open", "high", "low", "close", "volume", "amount")], axis=1)
        huge = np.isinf(stacked).any(axis=1) | (np.abs(np.nan_to_num(stacked)) > _FLOAT32_MAX).any(axis=1)
        inverted = ~huge & (vals["high"] < vals["low"])
    bad = huge | inverted
    if not bad.any():
        return vals

    reasons = [f"{int(n)} with {why}" for n, why in ((huge.sum(), "an infinite value or one beyond float32"),
                                                     (inverted.sum(), "high below low")) if n]
    n = int(bad.sum())
    first = int(rows[np.flatnonzero(bad)[0]]) + 2  # the file's row (the header is row 1)
    warnings.warn(f"{sym} in '{path}': {n} bar{'s' if n > 1 else ''} dropped ({', '.join(reasons)}; first at row "
                  f"{first}); they are stored as missing bars", DataWarning, stacklevel=3)
    out = {}
    for key, v in vals.items():
        v = v.copy()
        v[bad] = np.nan
        out[key] = v
    return out


def _show(t) -> str:
    text = str(np.datetime64(t, "s")).replace("T", " ")
    return text[:10] if text.endswith("00:00:00") else text


FREQ_MINUTES = {"1min": 1, "5min": 5, "15min": 15, "30min": 30, "60min": 60}


def infer_freq(series, freq: str | None = None) -> str:
    """The Qlib frequency of ``series`` (``(symbol, timestamps, ...)`` from the files, each
    sorted): ``day`` when no symbol has two bars on one date, otherwise the spacing of bars within
    a day, which must be 1, 5, 15, 30 or 60 minutes (gaps of whole bars allowed: missing bars).
    ``freq`` (``--freq``) overrides the inference and is checked against the timestamps."""
    counts: dict[int, int] = {}
    where: dict[int, tuple] = {}
    for path, sym, d in series:
        days = d.astype("datetime64[D]")
        same = days[1:] == days[:-1]
        if not same.any():
            continue
        values, n = np.unique(np.diff(d.astype(np.int64))[same], return_counts=True)
        for v, c in zip(values.tolist(), n.tolist()):
            counts[v] = counts.get(v, 0) + c
            where.setdefault(v, (path, sym))
    # The spacing most bars have (missing bars make some steps longer, never shorter).
    smallest = max(counts, key=lambda v: (counts[v], -v)) if counts else None
    where = where.get(smallest)
    if freq is None:
        if smallest is None:
            return "day"
        names = [n for n, m in FREQ_MINUTES.items() if m * 60 == smallest]
        if not names:
            path, sym = where
            raise DataError(f"'{path}': symbol {sym}'s bars are {smallest // 60 if smallest % 60 == 0 else smallest / 60:g} "
                            f"minute(s) apart, which is not a Qlib frequency; expected 1, 5, 15, 30 or 60 minutes, "
                            "or pass --freq")
        freq = names[0]
    if freq == "day":
        if smallest is not None:
            path, sym = where
            raise DataError(f"'{path}': symbol {sym} has several bars on one day, but --freq is day; "
                            "expected one row per symbol and day, or an intraday --freq")
        return freq
    if freq not in FREQ_MINUTES:
        raise DataError(f"--freq '{freq}' is not a Qlib frequency; expected day, {', '.join(FREQ_MINUTES)}")
    unit = FREQ_MINUTES[freq] * 60
    for path, sym, d in series:
        days = d.astype("datetime64[D]")
        same = days[1:] == days[:-1]
        steps = np.diff(d.astype(np.int64))[same]
        bad = steps % unit != 0
        if bad.any():
            i = int(np.flatnonzero(same)[np.flatnonzero(bad)[0]])
            raise DataError(f"'{path}': symbol {sym}'s bars at {_show(d[i])} and {_show(d[i + 1])} are "
                            f"{steps[bad][0] / 60:g} minutes apart, not a multiple of {freq}: mixed spacings; "
                            "expected bars of one frequency (1, 5, 15, 30 or 60 minutes)")
    for path, sym, d in series:
        days = d.astype("datetime64[D]")
        if len(d) > 1 and not (days[1:] == days[:-1]).any() and (d.astype(np.int64) % 86400 == 0).all():
            raise DataError(f"'{path}': symbol {sym} has daily bars while other bars are {freq} apart: mixed "
                            "spacings; import daily and intraday files separately")
    return freq


def import_csv(files, out, *, instrument: str | None = None, force: bool = False, progress: bool = False,
               freq: str | None = None, time_unit: str | None = None, notes: list[str] | None = None) -> Path:
    """Write the CSV files' K-lines as a Qlib directory at ``out``; return its absolute path.
    ``notes``, when given, receives what the summary line should say of how the files were read
    (a date column found as an index).

    The frequency is inferred from the timestamps (:func:`infer_freq`) unless ``freq`` is given;
    epoch timestamps are in ``time_unit`` (s, ms, us, ns), or the unit their size says
    (:func:`parse_times`). ``calendars/<freq>.txt`` is the union of all timestamps, in
    ``dump_bin.py``'s formats. The directory is written to a temporary directory and renamed; a
    non-empty ``out`` is refused unless ``force``."""
    check_time_unit(time_unit)
    paths = _expand([files] if isinstance(files, (str, Path)) else files)
    if instrument is not None:
        pv.check_name("--instrument", instrument)
    it = paths
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(paths, desc="reading CSV", unit="file", leave=False, disable=None)
    series: dict[str, tuple[Path, np.ndarray, dict]] = {}
    seen: dict[str, str] = {}
    for path in it:
        for sym, d, vals, said in _read_one(path, time_unit):
            if notes is not None:
                notes.extend(note for note in said if note not in notes)
            low = sym.lower()
            if low in seen:
                prev = series[seen[low]][0]
                raise DataError(f"symbol {sym} appears twice ('{prev}' and '{path}', case-insensitively); "
                                "give each symbol in one place only")
            seen[low] = sym
            series[sym] = (path, d, vals)

    freq = infer_freq([(p, sym, d) for sym, (p, d, _) in series.items()], freq)
    if freq == "day":
        series = {sym: (p, d.astype("datetime64[D]"), v) for sym, (p, d, v) in series.items()}
    calendar = np.unique(np.concatenate([d for _, d, _ in series.values()]))
    # Qlib's dump_bin.py formats: YYYY-MM-DD for days, YYYY-MM-DD HH:MM:SS for intraday bars.
    cal_text = [str(x) if freq == "day" else str(x).replace("T", " ") for x in calendar]
    symbols = sorted(series)
    spans = []
    final = Path(out).expanduser().absolute()
    with pv.atomic_output_dir(final, force=force) as tmp:
        pv.write_calendar(tmp, cal_text, freq)
        for sym in symbols:
            _, d, vals = series[sym]
            pos = np.searchsorted(calendar, d)
            a, b = int(pos[0]), int(pos[-1])
            n = b - a + 1
            fields = {}
            for name in ("open", "high", "low", "close", "volume", "amount"):
                col = np.full(n, np.nan, dtype=np.float32)
                col[pos - a] = vals[name]
                fields[name] = col
            with np.errstate(divide="ignore", invalid="ignore"):
                vwap = np.where(fields["volume"] > 0, fields["amount"] / fields["volume"], np.nan)
            fields["vwap"] = vwap.astype(np.float32)
            factor = np.full(n, np.nan, dtype=np.float32)
            factor[pos - a] = 1.0
            fields["factor"] = factor
            pv.write_series(tmp, pv.SymbolSeries(sym, a, fields), freq)
            spans.append((sym, cal_text[a], cal_text[b]))
        pv.write_instruments(tmp, "all", spans)
        if instrument is not None and instrument.lower() != "all":
            pv.write_instruments(tmp, instrument, spans)
    return final


# ----------------------------------------------------------------------------------------------
# kronos-mlflow import-csv
# ----------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="CSV files (or directories of .csv files): one per symbol, or long files with a "
                             "symbol column; columns timestamps|date, open, high, low, close, volume[, amount]")
    parser.add_argument("--out", required=True, help="Qlib directory to write (must be missing or empty)")
    parser.add_argument("--instrument", default=None,
                        help="also write instruments/NAME.txt listing every imported symbol")
    parser.add_argument("--freq", default=None,
                        help="bar frequency (day, 1min, 5min, 15min, 30min, 60min); default: inferred from "
                             "the timestamps")
    parser.add_argument("--time-unit", default=None, choices=list(TIME_UNITS),
                        help="the unit of epoch timestamps in the time column (s, ms, us, ns); default: "
                             "detected from their size (dates such as 2024-01-31 need none)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")


def run(args: argparse.Namespace) -> int:
    notes: list[str] = []
    out = import_csv(args.files, args.out, instrument=args.instrument, force=args.force, progress=True,
                     freq=args.freq, time_unit=args.time_unit, notes=notes)
    syms = pv.read_instrument_file(out, "all")
    freq = pv.available_freqs(out)[0]
    cal = (out / pv.calendar_file(freq)).read_text(encoding="utf-8").splitlines()
    names = "all" + (f", {args.instrument}" if args.instrument and args.instrument.lower() != "all" else "")
    unit = "days" if freq == "day" else f"{freq} bars"
    print(f"imported {len(syms)} symbol(s), {len(cal)} {unit} ({cal[0]}..{cal[-1]}) into {out}; "
          f"instruments: {names}; freq: {freq}" + "".join(f"; {note}" for note in notes))
    return 0
