"""The fold table: each fold's training, validation and test periods on the market's calendar.

A fold's *test period* is the bars it forecasts. The ``folds`` test periods are consecutive and
disjoint and end at the last calendar bar on or before ``walkforward_end`` (default: the end of
``test_time_range``); each is ``fold_length`` long: a calendar span (``3M``, ``6W``, ``90D``,
``1Y``: the bars after the period before it, up to and including its last day) or a number of
bars (``60``). Fold ``k`` = 1 is the earliest.

Before a fold's test period come, in time order:

- its *validation period* (``val_length``, default one ``fold_length``), ending ``embargo`` bars
  before the test period starts (default ``predict_window``: no validation window's forecast
  reaches a bar next to the test period);
- its *training period*, ending the bar before validation starts: from the start of
  ``train_time_range`` (``walkforward_mode: expanding``) or ``train_length`` long (``rolling``).

A fold's config ranges are these periods with ``lookback_window`` bars of context in front of
the validation and test periods (a window's lookback is observed, not forecast):
``test_time_range`` starts ``lookback_window`` bars before the test period, so its first origin
is the bar before the test period and every bar it forecasts lies in the test period, after the
fold's training, validation and embargo. A fold that cannot be built (too few bars for a
period, or context before the calendar's first bar) is refused in one line naming the fold.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...tracking import handover as hv
from ...config import names, checks
from ...config.core import format_time_range, parse_date, time_bounds
from ...config.sections import as_section
from ...errors import UserError

MODES = ("expanding", "rolling")
RETRAIN = ("predictor", "both")
_UNITS = {"D": "days", "W": "weeks", "M": "months", "Y": "years"}
#: The longest length: 200 years in each unit, or 10 million bars (200 years of 5-minute bars
#: hold fewer). pandas holds times from 1677 to 2262 only, and no market's calendar is longer.
MAX_SPAN = {"D": 73_000, "W": 10_400, "M": 2_400, "Y": 200}
MAX_BARS = 10**7
LENGTH_ACCEPTED = ("a number of bars (60) or a calendar span: a count and D, W, M or Y (90D, 6W, 3M, 1Y), at most "
                   "10,000,000 bars or 200 years")
_SPAN = re.compile(r"^\s*([0-9]+)\s*([DWMY])\s*$", re.IGNORECASE | re.ASCII)
#: The longest walk-forward: more folds than this is a typo, not a plan.
MAX_FOLDS = 100


@dataclass(frozen=True)
class Length:
    """``fold_length``, ``val_length`` or ``train_length``: ``bars`` bars or ``count`` units."""

    text: str
    bars: int = 0
    count: int = 0
    unit: str = ""

    def offset(self) -> pd.DateOffset:
        return pd.DateOffset(**{_UNITS[self.unit]: self.count})


def parse_length(name: str, value: Any) -> Length:
    """``"3M"`` -> 3 months, ``"60"`` -> 60 bars; anything else one UserError naming ``name``."""
    text = str(value).strip()
    if re.fullmatch(r"[0-9]+", text):
        bars = checks.integer(name, text, 1, MAX_BARS, what=name, error=UserError)
        return Length(text, bars=bars)
    match = _SPAN.match(text)
    digits = match.group(1).lstrip("0") if match else ""
    if not digits:  # not a length, or a count of 0
        raise UserError(f"{name}: '{checks.shown(value)}' is not a length; expected {LENGTH_ACCEPTED}")
    unit = match.group(2).upper()
    if len(digits) > 6 or int(digits) > MAX_SPAN[unit]:
        spans = ", ".join(f"{n:,}{u}" for u, n in MAX_SPAN.items())
        raise UserError(f"{name}: '{checks.shown(value)}' is longer than 200 years; expected a span of at most "
                        f"200 years ({spans}) or at most {MAX_BARS:,} bars")
    return Length(text.upper(), count=int(digits), unit=unit)


@dataclass(frozen=True)
class Settings:
    """The walk-forward's own settings (flags and MLproject parameters, not config keys)."""

    folds: int = 4
    fold_length: str = "3M"
    mode: str = "expanding"
    train_length: str = ""
    embargo: int | None = None  # None: predict_window
    val_length: str = ""  # empty: one fold_length
    end: str = ""  # empty: test_time_range's end
    retrain: str = "predictor"

    @classmethod
    def checked(cls, *, folds, fold_length, mode, train_length, embargo, val_length, end, retrain) -> Settings:
        """Every value checked, one UserError naming the first bad one and what is accepted."""
        n = checks.integer("folds", folds, 1, MAX_FOLDS, what="folds", error=UserError)
        parse_length("fold_length", fold_length)
        mode = str(mode).strip().lower()
        if mode not in MODES:
            raise UserError(f"walkforward_mode: '{checks.shown(mode)}' is not one of {', '.join(MODES)}")
        train_length = str(train_length or "").strip()
        if mode == "rolling" and not train_length:
            raise UserError("walkforward_mode rolling keeps train_length bars of training per fold, and train_length "
                            f"is empty; expected {LENGTH_ACCEPTED}, or walkforward_mode expanding")
        if train_length:
            parse_length("train_length", train_length)
        text = str(embargo if embargo is not None else "").strip()
        gap = None if text in ("", "-1") else checks.integer("embargo", text, 0, 10**6, what="embargo", error=UserError)
        val_length = str(val_length or "").strip()
        if val_length:
            parse_length("val_length", val_length)
        end = str(end or "").strip()
        if end:
            end = parse_date("walkforward_end", end)
        retrain = str(retrain).strip().lower()
        if retrain not in RETRAIN:
            raise UserError(f"walkforward_retrain: '{checks.shown(retrain)}' is not one of {', '.join(RETRAIN)}")
        return cls(n, str(fold_length).strip(), mode, train_length, gap, val_length, end, retrain)


@dataclass(frozen=True)
class Fold:
    """One fold: its periods (first and last bar, ISO dates) and the config ranges they give."""

    fold: int
    train: tuple[str, str]
    val: tuple[str, str]
    embargo: int
    test: tuple[str, str]
    test_bars: int
    val_bars: int
    train_bars: int
    #: config key -> [start, end]: train_time_range, val_time_range, test_time_range
    ranges: dict[str, list[str]]

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update({k: list(v) for k, v in out.items() if isinstance(v, tuple)})
        return out


def _day(value: np.datetime64) -> str:
    text = str(np.datetime_as_string(value, unit="s"))
    return text[:10] if text.endswith("T00:00:00") else text[:16]


def _before(calendar: np.ndarray, last: int, length: Length, name: str, fold: int) -> int:
    """The first index of a period of ``length`` that ends at index ``last``."""
    if length.bars:
        first = last - length.bars + 1
    else:  # the bars after the day one span before the last: that day must be on the calendar's range
        try:
            stop = np.datetime64((pd.Timestamp(calendar[last]) - length.offset()).to_datetime64(), "s")
        except (OverflowError, pd.errors.OutOfBoundsDatetime):  # before 1677: before any calendar's first bar
            stop = calendar[0] - np.timedelta64(1, "s")
        first = int(np.searchsorted(calendar, stop, side="right")) if stop >= calendar[0] else -1
    if first < 0 or first > last:
        raise UserError(f"fold {fold}: its {name} ({length.text}) would start before the calendar's first bar "
                        f"{_day(calendar[0])}; expected fewer folds, a shorter {name}, or more data")
    return first


def plan(data: Any, settings: Settings, calendar: np.ndarray) -> list[Fold]:
    """The fold table of ``settings`` on ``calendar`` (the provider's bars, ascending), with the
    data section's windows (``lookback_window``, ``predict_window``) and ranges (the start of
    ``train_time_range``, the end of ``test_time_range``); ``data``: the config's data section
    (or the whole config). One UserError names a fold that cannot be built."""
    data = as_section(data, "data")
    calendar = np.asarray(calendar, dtype="datetime64[s]")
    lookback, horizon = int(data.lookback_window), int(data.predict_window)
    embargo = horizon if settings.embargo is None else int(settings.embargo)
    end = settings.end or data.test_time_range[1]
    last = int(np.searchsorted(calendar, time_bounds(end, end)[1], side="right")) - 1
    if last < 0:
        raise UserError(f"walkforward_end {end} is before the calendar's first bar {_day(calendar[0])}")
    fold_length = parse_length("fold_length", settings.fold_length)
    val_length = parse_length("val_length", settings.val_length or settings.fold_length)
    train_first = int(np.searchsorted(calendar, time_bounds(*data.train_time_range)[0], side="left"))
    out: list[Fold] = []
    for k in range(settings.folds, 0, -1):  # the last fold first: each ends the bar before the next starts
        t0 = _before(calendar, last, fold_length, "test period", k)
        v1 = t0 - embargo - 1
        if v1 < 0:
            raise UserError(f"fold {k}: its validation would end before the calendar's first bar (embargo {embargo})")
        v0 = _before(calendar, v1, val_length, "validation period", k)
        tr1 = v0 - 1
        tr0 = train_first if settings.mode == "expanding" else _before(
            calendar, tr1, parse_length("train_length", settings.train_length), "training period", k)
        out.append(_fold(k, calendar, (tr0, tr1), (v0, v1), (t0, last), embargo, lookback, horizon))
        last = t0 - 1
    return out[::-1]


def _fold(k, calendar, train, val, test, embargo, lookback, horizon) -> Fold:
    (tr0, tr1), (v0, v1), (t0, t1) = train, val, test
    need = lookback + horizon
    for name, (a, b) in (("training", train), ("validation", val), ("test", test)):
        if b - a + 1 < (need if name == "training" else 1):
            raise UserError(f"fold {k}: its {name} period {_day(calendar[max(a, 0)])}..{_day(calendar[max(b, 0)])} "
                            f"has {max(b - a + 1, 0)} bars; expected at least {need if name == 'training' else 1} "
                            f"(lookback_window + predict_window for training): fewer folds, shorter periods or an "
                            "earlier train_time_range start")
    for name, first in (("validation", v0), ("test", t0)):
        if first - lookback < 0:
            raise UserError(f"fold {k}: its {name} period starts at {_day(calendar[first])}, fewer than "
                            f"lookback_window {lookback} bars after the calendar's first bar; expected fewer folds "
                            "or shorter periods")
    ranges = {"train_time_range": [_day(calendar[tr0]), _day(calendar[tr1])],
              "val_time_range": [_day(calendar[v0 - lookback]), _day(calendar[v1])],
              "test_time_range": [_day(calendar[t0 - lookback]), _day(calendar[t1])]}
    return Fold(k, (_day(calendar[tr0]), _day(calendar[tr1])), (_day(calendar[v0]), _day(calendar[v1])), embargo,
                (_day(calendar[t0]), _day(calendar[t1])), t1 - t0 + 1, v1 - v0 + 1, tr1 - tr0 + 1, ranges)


def stage_ranges(folds: list[Fold], settings: Settings, fold: Fold, every_fold: bool) -> dict[str, list[str]]:
    """A training step's ranges for ``fold``: its own when the stage is retrained in every fold
    (``every_fold``, or ``walkforward_retrain: both``), else the first fold's (under the default
    ``predictor``: one tokenizer, fine-tuned on data that ends before every fold's test period,
    shared by all folds)."""
    return dict(fold.ranges if every_fold or settings.retrain == "both" else folds[0].ranges)


def table(folds: list[Fold]) -> str:
    """The fold table as the console shows it."""
    head = ("fold", "train", "validation", "embargo", "test (the bars it forecasts)")
    rows = [(str(f.fold), f"{f.train[0]}..{f.train[1]} ({f.train_bars} bars)",
             f"{f.val[0]}..{f.val[1]} ({f.val_bars})", f"{f.embargo} bars", f"{f.test[0]}..{f.test[1]} ({f.test_bars})")
            for f in folds]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in [head, *rows])


def as_json(folds: list[Fold], settings: Settings) -> dict[str, Any]:
    """``walkforward/folds.json``: the settings and every fold's periods and config ranges."""
    return {"settings": asdict(settings), "folds": [f.as_json() for f in folds]}


def plan_digest(folds: list[Fold], settings: Settings) -> str:
    """What names one walk-forward: its settings and fold table (a parent run's tag)."""
    text = json.dumps(as_json(folds, settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def describe(folds: list[Fold]) -> str:
    """``3 folds, 2024-07-01..2025-06-05``."""
    return f"{len(folds)} fold{'s' if len(folds) != 1 else ''}, {folds[0].test[0]}..{folds[-1].test[1]}" if folds else ""


# ----------------------------------------------------------------------------- folds.json, read back

#: ``walkforward/folds.json`` (:func:`as_json`): its settings with their kinds, each fold's keys,
#: each fold's config ranges
_SETTINGS = {"folds": int, "fold_length": str, "mode": str, "train_length": str, "embargo": (int, None),
             "val_length": str, "end": str, "retrain": str}
_FOLD = ("fold", "train", "val", "embargo", "test", "test_bars", "val_bars", "train_bars", "ranges")
_RANGES = ("train_time_range", "val_time_range", "test_time_range")


def read_folds_json(path: str | os.PathLike, source: str):
    """``(Settings, [Fold, ...])`` of a ``walkforward/folds.json`` (see the module doc), or one
    UserError line naming ``source``."""
    table = hv.json_value(Path(path), source, "the fold table a walk-forward command logged")
    table = hv.keys_of(table, ("settings", "folds"), source, "the file")
    given = hv.keys_of(table["settings"], tuple(_SETTINGS), source, "settings")
    for key, kind in _SETTINGS.items():
        value = given[key]
        if kind is int:
            hv.integer(value, source, f"settings.{key}", 1, MAX_FOLDS)
        elif kind == (int, None):
            if value is not None:
                hv.integer(value, source, f"settings.{key}", 0, hv.MAX_EMBARGO)
        else:
            hv.text(value, source, f"settings.{key}")
    try:
        Settings.checked(folds=given["folds"], fold_length=given["fold_length"], mode=given["mode"],
                         train_length=given["train_length"], embargo=given["embargo"],
                         val_length=given["val_length"], end=given["end"], retrain=given["retrain"])
    except UserError as exc:
        raise UserError(f"{source}: settings: {exc}") from None
    settings = Settings(**given)
    rows = table["folds"]
    if not isinstance(rows, list) or not 1 <= len(rows) <= MAX_FOLDS:
        raise UserError(f"{source}: folds is {hv.kind_of(rows)}" + (f" of {len(rows)}" if isinstance(rows, list) else "")
                        + f"; expected a list of 1 to {MAX_FOLDS} folds")
    if len(rows) != settings.folds:
        raise UserError(f"{source}: folds lists {len(rows)} folds and settings.folds says {settings.folds}; expected "
                        "one entry per fold")
    folds = [_fold_read(row, k, source) for k, row in enumerate(rows, start=1)]
    return settings, folds


def _fold_read(row: Any, k: int, source: str):
    """Fold ``k`` (1-based) of the table: its number, periods, bar counts and config ranges."""
    where = f"folds[{k - 1}]"
    row = hv.keys_of(row, _FOLD, source, where)
    number = names.fold_number(row["fold"], source, maximum=MAX_FOLDS)
    if number != k:
        raise UserError(f"{source}: {where} is fold {number}; expected the folds in order, fold {k} here")
    periods = {name: hv.period(row[name], source, f"{where}.{name}") for name in ("train", "val", "test")}
    counts = {name: hv.integer(row[name], source, f"{where}.{name}", 1, hv.MAX_BARS)
              for name in ("test_bars", "val_bars", "train_bars")}
    embargo = hv.integer(row["embargo"], source, f"{where}.embargo", 0, hv.MAX_EMBARGO)
    ranges = hv.keys_of(row["ranges"], _RANGES, source, f"{where}.ranges")
    ranges = {name: list(hv.period(ranges[name], source, f"{where}.ranges.{name}")) for name in _RANGES}
    return Fold(number, periods["train"], periods["val"], embargo, periods["test"], counts["test_bars"],
                counts["val_bars"], counts["train_bars"], ranges)


__all__ = ["Fold", "Length", "Settings", "as_json", "describe", "format_time_range", "parse_length", "plan",
           "plan_digest", "read_folds_json", "stage_ranges", "table"]
