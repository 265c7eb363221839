"""Dates and time ranges of the config: how they are written (``START:END``, ISO 8601
intervals, dates or date-times) and the instants they cover. Every error is a one-line
:class:`~kronos_mlflow.errors.ConfigError` naming the key."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

from . import checks
from ..errors import ConfigError


def parse_date(key: str, value: Any) -> str:
    """Validate a YYYY-MM-DD date (or a YYYY-MM-DDTHH:MM[:SS] date-time) and return it normalised."""
    text = str(value).strip()
    try:
        return _dt.date.fromisoformat(text).isoformat()
    except ValueError:
        pass
    try:
        moment = _dt.datetime.fromisoformat(text.replace(" ", "T", 1)) if len(text) > 10 else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is not None:
        raise ConfigError(f"{key}: '{checks.shown(value)}' is not a date; expected YYYY-MM-DD or YYYY-MM-DDTHH:MM") from None
    return moment.isoformat(timespec="seconds" if moment.second else "minutes")


def time_bounds(start: str, end: str):
    """``(first, last)`` inclusive bounds as ``numpy.datetime64[s]`` of a time range's two ends:
    a date starts at its midnight and ends at its last second (it covers every bar of that day)."""
    import numpy as np

    a = np.datetime64(start, "s")
    b = np.datetime64(end, "s")
    if len(end) == 10:
        b = b + np.timedelta64(86399, "s")
    return a, b


def format_time_range(value) -> str:
    """A time range as its parameter text: ``START:END`` for dates, ``START/END`` (ISO 8601
    interval) when either end carries a time."""
    start, end = value
    return f"{start}/{end}" if "T" in start or "T" in end else f"{start}:{end}"


def parse_time_range(key: str, value: Any) -> list[str]:
    """Accept ``START:END`` (MLproject format, dates), ``START/END`` (ISO 8601 interval, dates or
    date-times such as ``2024-06-18T09:30/2024-08-29T15:00``), ``[START, END]`` or ``START,END``."""
    if isinstance(value, str):
        text = value.strip()
        if "/" in text:  # ISO 8601 interval
            parts = text.split("/")
        elif "," in text:
            parts = text.split(",")
        elif re.search(r"[0-9][T ][0-9]", text):  # date-times hold ':' themselves: only START/END is unambiguous
            parts = [text]
        else:
            parts = text.split(":") if text else []
        parts = [p.strip() for p in parts]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = []
    if len(parts) != 2:
        raise ConfigError(f"{key}: '{checks.shown(value)}' is not a time range; expected START:END as YYYY-MM-DD:YYYY-MM-DD "
                          "or an ISO 8601 interval YYYY-MM-DDTHH:MM/YYYY-MM-DDTHH:MM")
    start, end = parse_date(key, parts[0]), parse_date(key, parts[1])
    if time_bounds(start, start)[0] > time_bounds(end, end)[1]:
        raise ConfigError(f"{key}: start {start} is after end {end}; expected START <= END")
    return [start, end]


# ---- the dates read from the market: dataset_begin_time / dataset_end_time ----------------------

AUTO = "auto"
#: The ranges whose span ``auto`` reads (an empty backtest range is the test range's part).
SPAN_RANGE_KEYS = ("train_time_range", "val_time_range", "test_time_range", "backtest_time_range")


def parse_date_or_auto(key: str, value: Any) -> str:
    """``auto`` (the split ranges' span, :func:`data_span`) or a date as :func:`parse_date` takes it."""
    if str(value).strip().lower() == AUTO:
        return AUTO
    try:
        return parse_date(key, value)
    except ConfigError:
        raise ConfigError(f"{key}: '{checks.shown(value)}' is not a date; expected YYYY-MM-DD, YYYY-MM-DDTHH:MM or "
                          "auto (from the earliest start to the latest end of the time ranges)") from None


def data_span(config) -> tuple[str, str]:
    """``(begin, end)`` of what is read from the market: ``dataset_begin_time`` and
    ``dataset_end_time``, each ``auto`` one the earliest start / latest end of the time ranges
    (train, val, test and a given backtest range). Upstream's default splits span its
    2011-01-01..2025-06-05."""
    ranges = [config[k] for k in SPAN_RANGE_KEYS if config.get(k)]
    begin, end = config.get("dataset_begin_time", AUTO), config.get("dataset_end_time", AUTO)
    if begin == AUTO:
        begin = min((r[0] for r in ranges), key=lambda d: time_bounds(d, d)[0])
    if end == AUTO:
        end = max((r[1] for r in ranges), key=lambda d: time_bounds(d, d)[1])
    return begin, end


def check_data_span(config) -> None:
    """A begin after the end is refused in one line."""
    begin, end = data_span(config)
    if time_bounds(begin, begin)[0] > time_bounds(end, end)[1]:
        raise ConfigError(f"dataset_begin_time {begin} is after dataset_end_time {end}; expected begin <= end "
                          "(auto: from the earliest start to the latest end of the time ranges)")


def span_text(config) -> str:
    """The read span as a message names it: the keys when set, ``auto`` when they follow the ranges."""
    begin, end = data_span(config)
    given = [k for k in ("dataset_begin_time", "dataset_end_time") if config.get(k, AUTO) != AUTO]
    if not given:
        return f"the time ranges' span {begin}..{end} (dataset_begin_time/dataset_end_time auto)"
    return f"dataset_begin_time..dataset_end_time {begin}..{end}"


def cut_by_span(config, key: str) -> str:
    """``'; dataset_begin_time 2011-01-01 cuts it (...)'`` when an explicit read span starts after
    or ends before the range ``key``, else ''."""
    begin, end = data_span(config)
    start, stop = config[key]
    cuts = []
    if config.get("dataset_begin_time", AUTO) != AUTO and time_bounds(begin, begin)[0] > time_bounds(start, start)[0]:
        cuts.append(f"dataset_begin_time {begin} starts after it")
    if config.get("dataset_end_time", AUTO) != AUTO and time_bounds(end, end)[1] < time_bounds(stop, stop)[1]:
        cuts.append(f"dataset_end_time {end} ends before it")
    if not cuts:
        return ""
    return f"; {' and '.join(cuts)} (set them to auto to read the ranges' span)"
