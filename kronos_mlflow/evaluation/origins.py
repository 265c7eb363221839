"""Forecast origins on the test split: where every forecaster of the scorecard forecasts from (and,
for ``objective: val_skill`` and calibration, the same construction on the validation split).
Origins are calendar positions chosen from the data and config only (no seed):
docs/forecast-evaluation.md#origins.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..config.core import time_bounds
from ..config.keys import DATA, EVALUATION
from ..config.sections import as_section, sections, sections_type
from ..data import QlibDataset
from ..data.prepare import resolve_qlib_path
from .windows import evenly_spaced

CLOSE = 3  # the close column of the six features


def settings_of(config: Any) -> Any:
    """Every section of ``config`` (:func:`~kronos_mlflow.config.sections.sections`): the origins
    read the data, evaluation, training and backtest sections; a caller may hand them built, or
    the whole config."""
    return config if isinstance(config, sections_type()) else sections(config)


def eval_stride(evaluation: Any, data: Any = None) -> int:
    """``eval_stride``, or ``predict_window`` when it is 0. ``evaluation``, ``data``: the
    config's evaluation and data sections, or the whole config as ``evaluation``."""
    data = evaluation if data is None else data
    return int(as_section(evaluation, EVALUATION).eval_stride or 0) or int(as_section(data, DATA).predict_window)


SPLITS = ("test", "val")


def calendar_of_range(data: Any, split: str = "test") -> np.ndarray:
    """The provider's calendar bars inside the split's time range (``test_time_range`` or
    ``val_time_range``; ``datetime64[s]``, ascending). ``data``: the config's data section, or
    the whole config."""
    data = as_section(data, DATA)
    path = resolve_qlib_path(data) / "calendars" / f"{data.freq or 'day'}.txt"
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    calendar = np.array(lines, dtype="datetime64[s]")
    a, b = time_bounds(*getattr(data, f"{split}_time_range"))
    return calendar[(calendar >= a) & (calendar <= b)]


def calendar_of_test_range(data: Any) -> np.ndarray:
    """The provider's calendar bars inside ``test_time_range`` (``data``: as :func:`calendar_of_range`)."""
    return calendar_of_range(data, "test")


def thin_dates(dates: np.ndarray, limit: int) -> np.ndarray:
    """A boolean mask over origins (given by their dates, ascending) keeping whole dates: the
    largest number ``k`` of dates, evenly spaced (``floor(i * D / k)`` of the ``D`` dates), whose
    origins number at most ``limit`` (a single date with more symbols keeps its first ``limit``
    series). Every symbol of a kept date stays, so the per-date correlations (IC) see the whole
    cross-section. No seed enters."""
    dates = np.asarray(dates)
    if len(dates) <= limit:
        return np.ones(len(dates), dtype=bool)
    unique, counts = np.unique(dates, return_counts=True)
    for k in range(min(len(unique), int(limit)), 0, -1):
        chosen = evenly_spaced(len(unique), k)
        if counts[chosen].sum() <= limit:
            return np.isin(dates, unique[chosen])
    first = np.flatnonzero(dates == unique[0])[: int(limit)]
    mask = np.zeros(len(dates), dtype=bool)
    mask[first] = True
    return mask


@dataclass
class Origins:
    """The origins (docs/forecast-evaluation.md#origins), in (calendar position, series) order.

    ``rows`` index the test split's arrays (the origin's own bar); :meth:`history`,
    :meth:`future` and :meth:`times` read the bars and timestamps around each origin.
    """

    rows: np.ndarray  # (n,) int64, the origin bar's row in the split's arrays
    series: np.ndarray  # (n,) int64, the series (index into ``symbols``)
    positions: np.ndarray  # (n,) int64, the origin's calendar position k
    dates: np.ndarray  # (n,) datetime64[s], the origin bar's time
    symbols: list[str]
    x: np.ndarray  # the split's raw features (rows x 6)
    bar_times: np.ndarray  # the split's bar times, datetime64[s]
    lookback: int
    horizon: int
    stride: int
    candidates: int  # origins before the n_eval_windows limit
    data_key: str
    in_validation: int = 0  # test origins left out: their first forecast bar lies inside val_time_range

    def __len__(self) -> int:
        return int(len(self.rows))

    def _take(self, positions, offsets) -> np.ndarray:
        rows = self.rows[np.asarray(positions, dtype=np.int64)]
        return rows[:, None] + np.asarray(offsets, dtype=np.int64)

    def history(self, positions) -> np.ndarray:
        """Raw lookback bars, float64 ``(len(positions), lookback, 6)`` (the origin last)."""
        return np.asarray(self.x[self._take(positions, np.arange(1 - self.lookback, 1))], dtype=np.float64)

    def future(self, positions) -> np.ndarray:
        """Raw bars after the origin, float64 ``(len(positions), horizon, 6)``."""
        return np.asarray(self.x[self._take(positions, np.arange(1, self.horizon + 1))], dtype=np.float64)

    def times(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """The lookback bars' and the future bars' times (``datetime64[s]``)."""
        past = self.bar_times[self._take(positions, np.arange(1 - self.lookback, 1))]
        return past, self.bar_times[self._take(positions, np.arange(1, self.horizon + 1))]

    def shard(self, rank: int, world_size: int) -> np.ndarray:
        """The positions one rank forecasts: a contiguous block (each origin on one rank)."""
        return np.array_split(np.arange(len(self), dtype=np.int64), max(1, int(world_size)))[int(rank)]

    @property
    def instruments(self) -> list[str]:
        return [self.symbols[int(j)] for j in self.series]

    def index(self) -> pd.MultiIndex:
        """``(datetime, instrument)`` of every origin, Qlib's index of a signal."""
        return pd.MultiIndex.from_arrays([pd.DatetimeIndex(self.dates), self.instruments],
                                         names=["datetime", "instrument"])

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of what decides the origins: data key, sizes, stride and the rows."""
        h = hashlib.sha256(f"{self.data_key}|{self.lookback}|{self.horizon}|{self.stride}|".encode())
        h.update(np.ascontiguousarray(self.rows, dtype="<i8").tobytes())
        return h.hexdigest()

    def describe(self) -> str:
        shown = f"{len(self):,}" if len(self) == self.candidates else f"{len(self):,} of {self.candidates:,}"
        dates = len(np.unique(self.dates)) if len(self) else 0
        left = (f"; {self.in_validation:,} left out, their first forecast bar inside val_time_range"
                if self.in_validation else "")
        return f"{shown} origins on {dates:,} dates (stride {self.stride}){left}"


def forecast_origins(config: Any, split: str = "test", *, stride: int | None = None,
                     limit: int | None = None) -> Origins:
    """The origins of ``config``'s test split (``split="val"``: of its validation split, keeping
    only origins whose forecast bars all lie after ``train_time_range``, since the validation
    range overlaps training to give its first windows a lookback, and at most
    ``n_val_skill_windows`` of them), prepared on first use. ``stride`` and ``limit`` replace
    ``eval_stride`` and the split's origin limit (:func:`signal_origins`). ``config``: as
    :func:`settings_of` takes it."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    settings = settings_of(config)
    data = settings.data
    lookback, horizon = int(data.lookback_window), int(data.predict_window)
    stride = int(stride) if stride else eval_stride(settings.evaluation, data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an empty split is reported once, by the caller
        ds = QlibDataset(split, data, progress=False, job=settings.job, training=settings.training,
                         backtest=settings.backtest)
    bar_times = np.load(ds.cache_dir / f"{split}_dates.npy", allow_pickle=False).astype("datetime64[s]")
    calendar = calendar_of_range(data, split)
    # nothing forecast is a bar the split before saw: validation's forecasts start after
    # training's range, the test's after validation's (which chose the checkpoint)
    after = time_bounds(*(data.train_time_range if split == "val" else data.val_time_range))[1]
    rows, series, positions, inside = [], [], [], 0
    for j in range(len(ds.symbols)):
        first, end = int(ds.offsets[j]), int(ds.offsets[j + 1])
        r = np.arange(first + lookback - 1, end - horizon, dtype=np.int64)
        if not len(r):
            continue
        k = np.searchsorted(calendar, bar_times[r])
        on_calendar = (k < len(calendar)) & (calendar[np.minimum(k, len(calendar) - 1)] == bar_times[r])
        keep = on_calendar & (k % stride == 0)
        inside += int((keep & (bar_times[r + 1] <= after)).sum())
        keep &= bar_times[r + 1] > after
        rows.append(r[keep])
        positions.append(k[keep])
        series.append(np.full(int(keep.sum()), j, dtype=np.int64))
    rows_a = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
    series_a = np.concatenate(series) if series else np.empty(0, dtype=np.int64)
    pos_a = np.concatenate(positions) if positions else np.empty(0, dtype=np.int64)
    order = np.lexsort((series_a, pos_a))
    rows_a, series_a, pos_a = rows_a[order], series_a[order], pos_a[order]
    if limit is None:
        limit = settings.evaluation.n_eval_windows if split == "test" else settings.training.n_val_skill_windows
    keep = thin_dates(pos_a, int(limit))
    return Origins(rows=rows_a[keep], series=series_a[keep], positions=pos_a[keep], dates=bar_times[rows_a[keep]],
                   symbols=list(ds.symbols), x=ds.x, bar_times=bar_times, lookback=lookback, horizon=horizon,
                   stride=stride, candidates=int(len(rows_a)),
                   data_key=ds.cache_dir.name if split == "test" else f"{ds.cache_dir.name}/{split}",
                   in_validation=inside if split == "test" else 0)


def signal_origins(config: Any) -> Origins:
    """The origins the backtest's signal is forecast from: those of the test split (the same
    rules) at every ``backtest_signal_stride``-th calendar bar, all of them. ``config``: as
    :func:`settings_of` takes it."""
    settings = settings_of(config)
    return forecast_origins(settings, stride=int(settings.backtest.backtest_signal_stride or 1), limit=1 << 62)


def no_origins_reason(origins: Origins, data: Any) -> str:
    """Why the test split has no origin to score, in the words of one line. ``data``: the
    config's data section, or the whole config."""
    data = as_section(data, DATA)
    test = ":".join(data.test_time_range)
    if origins.in_validation:
        return (f"every one of the {origins.in_validation:,} forecast origins of test_time_range {test} forecasts bars "
                f"inside val_time_range (to {data.val_time_range[1]}), which chose the checkpoint; expected "
                "test_time_range to reach past val_time_range's end by lookback_window + predict_window bars")
    return (f"no forecast origins in test_time_range {test} (each needs lookback_window {data.lookback_window} + "
            f"predict_window {data.predict_window} bars of a series inside it); widen test_time_range or shorten "
            "the windows")
