"""Reading a Qlib provider directory: the series of an instrument's symbols through Qlib's
``D.features``, in chunks of symbols, membership spans applied (:func:`read_qlib`), for
:mod:`kronos_mlflow.data.prepare`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

from ..config.core import time_bounds
from ..errors import DataError
from . import provider as pv

QLIB_FIELDS = ("$open", "$high", "$low", "$close", "$volume")
# Above this many symbols Qlib's own process pool pays off; below it forking costs more than
# it saves (measured: 60 symbols read in 0.2 s in-process, 0.36-1.1 s with 2 workers).
_PARALLEL_SYMBOLS = 400



def _init_qlib(path: Path, n_symbols: int) -> None:
    """``qlib.init`` quietly (WARNING level), without caches, restoring the excepthook it sets."""
    hook = sys.excepthook
    try:
        import qlib
        from qlib.config import NUM_USABLE_CPU
        from qlib.constant import REG_CN

        kernels = 1 if n_symbols <= _PARALLEL_SYMBOLS else max(1, min(NUM_USABLE_CPU, 8))
        qlib.init(provider_uri=str(path), region=REG_CN, logging_level=logging.WARNING, kernels=kernels,
                  expression_cache=None, dataset_cache=None)
    finally:
        sys.excepthook = hook


def _date_range_indices(calendar: np.ndarray, begin: str, end: str, lookback: int, predict: int, path: Path,
                        span: str = ""):
    """Upstream's read range: begin - lookback bars .. end + predict bars, clipped to the calendar."""
    b, e = time_bounds(begin, end)
    cal = calendar.astype("datetime64[s]")
    start = int(np.searchsorted(cal, b, side="left"))
    stop = int(np.searchsorted(cal, e, side="right")) - 1  # last bar <= end
    if start > stop:
        raise DataError(
            f"{span or f'dataset_begin_time..dataset_end_time {begin}..{end}'} holds no trading day of '{path}' "
            f"(its calendar covers {calendar[0]}..{calendar[-1]}); choose dates inside it"
        )
    return calendar[max(start - lookback, 0)], calendar[min(stop + predict, len(calendar) - 1)], \
        min(stop + predict, len(calendar) - 1) - max(start - lookback, 0) + 1


# At most this many bars are asked of Qlib at once (symbols x calendar bars): a chunk's
# DataFrame stays around 100 MB whatever the market's size or frequency.
_CHUNK_BARS = 2_000_000


def _drop_qlib_feature_cache() -> None:
    """Qlib keeps the last 500 series it loaded in memory (``H["f"]``, ``mem_cache_size_limit``):
    at minute scale that is gigabytes. Each chunk is read once, so the cache only costs."""
    try:
        from qlib.data.cache import H

        H["f"].clear()
    except Exception:  # pragma: no cover - a Qlib without that cache
        pass


def merge_spans(spans, calendar_days: np.ndarray) -> list[tuple[np.datetime64, np.datetime64]]:
    """One symbol's membership spans (``(start, end)`` pairs of anything ``numpy.datetime64``
    accepts) as day ranges, sorted, with spans merged when no trading day of ``calendar_days``
    (sorted ``datetime64[D]``) lies strictly between them (touching or overlapping spans)."""
    days = sorted((np.datetime64(str(a)[:10], "D"), np.datetime64(str(b)[:10], "D")) for a, b in spans)
    out: list[list[np.datetime64]] = []
    for a, b in days:
        if out:
            between = int(np.searchsorted(calendar_days, a, side="left")) - \
                int(np.searchsorted(calendar_days, out[-1][1], side="right"))
            if between <= 0:
                out[-1][1] = max(out[-1][1], b)
                continue
        out.append([a, b])
    return [(a, b) for a, b in out]


def read_qlib(path: Path, instrument: str, begin: str, end: str, lookback: int, predict: int,
              progress: bool = False, freq: str = "day", membership_gaps: str = "split", span: str = ""):
    """Yield ``(symbol, times, values float32 (n, 5))`` series of ``instrument`` (open, high, low,
    close, volume) read through ``D.features(..., freq=freq)``, membership spans applied.

    ``times`` is ``datetime64[D]`` for daily bars, ``datetime64[s]`` for intraday ones. With
    ``membership_gaps="split"`` each membership span of a symbol is its own series (a symbol that
    left the index and came back yields two); with ``"join"`` the bars of all its spans are one
    series (upstream: mask to the spans, then ``dropna``). Qlib's exceptions become one-line
    DataErrors, which name the dates read as ``span`` says (default: the two keys and dates).
    """
    unit = "D" if freq == "day" else "s"
    try:
        _init_qlib(path, len(pv.read_instrument_file(path, instrument)))
        import pandas as pd
        from qlib.data import D

        calendar = np.asarray(D.calendar(freq=freq), dtype=f"datetime64[{unit}]")
        if len(calendar) == 0:
            raise DataError(f"qlib_data_path '{path}': calendars/{freq}.txt holds no dates; expected one date a line")
        lo, hi, n_bars = _date_range_indices(calendar, begin, end, lookback, predict, path, span)
        lo_s, hi_s = str(pd.Timestamp(lo)), str(pd.Timestamp(hi))
        spans = D.list_instruments(D.instruments(instrument), start_time=lo_s, end_time=hi_s, as_list=False,
                                   freq=freq)
        symbols = sorted(spans)
    except DataError:
        raise
    except Exception as exc:  # Qlib's errors carry paths and tracebacks; keep one line
        raise DataError(f"Qlib cannot read '{path}' (instrument '{instrument}'): {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}; check the directory's format") from None
    if not symbols:
        raise DataError(
            f"instrument '{instrument}' in '{path}' lists no symbol trading between {lo_s} and {hi_s} "
            f"({span or f'dataset_begin_time..dataset_end_time {begin}..{end}'}); choose another instrument or "
            "other time ranges"
        )
    calendar_days = np.unique(calendar.astype("datetime64[D]"))
    chunk = 25 if len(symbols) <= _PARALLEL_SYMBOLS else 400
    chunk = max(1, min(chunk, _CHUNK_BARS // max(1, n_bars)))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(symbols), desc=f"reading {instrument} ({freq})", unit="symbol",
                   disable=None)  # a terminal only: no redraws in a log file
    try:
        for i in range(0, len(symbols), chunk):
            names = symbols[i : i + chunk]
            try:
                df = D.features(names, list(QLIB_FIELDS), start_time=lo_s, end_time=hi_s, freq=freq)
            except Exception as exc:
                raise DataError(f"Qlib cannot read symbols {names[0]}..{names[-1]} of '{path}': "
                                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
                                "a file may be truncated or not in Qlib's format") from None
            _drop_qlib_feature_cache()
            if len(df):
                inst = df.index.get_level_values(0).to_numpy()
                dates = df.index.get_level_values(1).to_numpy().astype(f"datetime64[{unit}]")
                values = df[list(QLIB_FIELDS)].to_numpy(dtype=np.float32)
                del df
                bounds = np.flatnonzero(inst[1:] != inst[:-1]) + 1
                for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(inst)]):
                    sym = str(inst[a])
                    d = dates[a:b]
                    day = d.astype("datetime64[D]")
                    # Qlib applies spans only to market configs: mask here, one span at a time.
                    masks = [(day >= s0) & (day <= s1) for s0, s1 in merge_spans(spans.get(sym, []), calendar_days)]
                    if membership_gaps == "join" and masks:
                        masks = [np.logical_or.reduce(masks)]
                    for keep in masks:
                        if keep.any():
                            yield sym, d[keep], values[a:b][keep]
            if bar is not None:
                bar.update(len(names))
    finally:
        if bar is not None:
            bar.close()
