"""The scorecard's forecasters, each giving sample paths of ``close`` on the same origins: a Kronos
pair (forecasting exactly as ``KronosPredictor.predict`` does), persistence and, intraday,
seasonal naive (docs/forecast-evaluation.md#forecasters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..config.sections import as_section
from ..runtime.distributed import all_reduce_sum_
from .origins import CLOSE, Origins


def sampling(evaluation: Any) -> dict[str, Any]:
    """The sampling settings of the evaluation section's inference keys (or the whole config's)."""
    evaluation = as_section(evaluation, "evaluation")
    return {"T": float(evaluation.inference_T), "top_k": int(evaluation.inference_top_k),
            "top_p": float(evaluation.inference_top_p), "sample_count": int(evaluation.inference_sample_count)}


def kronos_paths(predictor, origins: Origins, config: Mapping[str, Any], *, rank: int = 0, world_size: int = 1,
                 progress: Callable | None = None, desc: str = "") -> np.ndarray:
    """Close sample paths ``(len(origins), sample_count, horizon)`` float64 of a Kronos pair,
    over every rank (a collective when ``world_size > 1``: each rank forecasts its block of origins
    and the paths are summed over ranks, each origin filled by exactly one rank). The forecast is
    :func:`kronos_mlflow.serving.forecasting.pyfunc.forecast`, the logged forecaster's own function;
    batch ``b`` is drawn from torch's generator seeded with ``seed + (its first origin's position)``.
    ``progress`` is :meth:`~kronos_mlflow.runtime.console.Console.progress` (or None): it counts this
    rank's origins."""
    from ..serving.forecasting.pyfunc import forecast  # lazy: mlflow

    settings = sampling(config)
    seed, batch_size = int(as_section(config, "job").seed), int(as_section(config, "training").batch_size)
    table = torch.zeros(len(origins), settings["sample_count"], origins.horizon, dtype=torch.float64)
    positions = origins.shard(rank, world_size)
    chunks = [positions[i:i + batch_size] for i in range(0, len(positions), batch_size)]
    if progress is not None:  # Console.progress: origins done (this rank's) of total, an ETA
        chunks = progress(chunks, len(positions), desc, unit="origins", size=len)
    for chunk in chunks:
        past, future = origins.times(chunk)
        stamps = np.concatenate([past, future], axis=1).astype("datetime64[s]").astype(np.int64)
        out = forecast(predictor, {"bars": origins.history(chunk).astype(np.float32), "timestamps": stamps},
                       origins.horizon, seed=seed + int(chunk[0]), **settings)
        table[torch.from_numpy(chunk)] = torch.from_numpy(out["paths"][..., CLOSE].astype(np.float64))
    all_reduce_sum_(table)
    return table.numpy()


def persistence_paths(origins: Origins) -> np.ndarray:
    """``(n, 1, horizon)``: the last observed close at every step."""
    last = origins.history(np.arange(len(origins)))[:, -1, CLOSE]
    return np.repeat(last[:, None, None], origins.horizon, axis=2)


def bars_per_session(calendar: np.ndarray) -> int:
    """The most common number of calendar bars per day (1 for daily data)."""
    if not len(calendar):
        return 1
    _, counts = np.unique(np.asarray(calendar).astype("datetime64[D]"), return_counts=True)
    values, freq = np.unique(counts, return_counts=True)
    return int(values[np.argmax(freq)])


def seasonal_lags(horizon: int, period: int) -> np.ndarray:
    """Rows back from each future bar (``h = 1 .. horizon``) to the same bar of the latest
    observed session: ``period * ceil(h / period)``."""
    h = np.arange(1, int(horizon) + 1)
    return int(period) * np.ceil(h / int(period)).astype(np.int64)


def seasonal_naive_paths(origins: Origins, period: int) -> np.ndarray | None:
    """``(n, 1, horizon)`` seasonal naive closes, or None when one session does not fit in the
    lookback (``period > lookback_window``) or the data is daily (``period`` 1)."""
    if period <= 1 or period > origins.lookback:
        return None
    offsets = np.arange(1, origins.horizon + 1) - seasonal_lags(origins.horizon, period)  # <= 0: observed bars
    rows = origins.rows[:, None] + offsets[None, :]
    closes = np.asarray(origins.x[rows][..., CLOSE], dtype=np.float64)
    return closes[:, None, :]


def describe_cost(seconds: float, n_origins: int) -> str:
    """``1.23 s per origin`` (or ms) of a forecaster's wall time."""
    if not n_origins:
        return "no origin"
    per = seconds / n_origins
    return f"{per * 1000:.1f} ms per origin" if per < 1 else f"{per:.2f} s per origin"
