"""Dates and time ranges of the config: how they are written (``START:END``, ISO 8601
intervals, dates or date-times) and the instants they cover. Every error is a one-line
:class:`~kronos_mlflow.errors.ConfigError` naming the key."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

from . import validate as checks
from .errors import ConfigError


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
