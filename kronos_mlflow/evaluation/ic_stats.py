"""The rank IC read as evidence: its Newey-West t over the per-date series and the rank IC at each
forecast step (``test_rank_ic_nw_t``, ``test_rank_ic_h<k>``), and the validation rank IC that
``objective: val_ic`` ranks epochs and trials by (docs/objectives.md).

Origins ``H`` bars ahead overlap: consecutive dates' forecasts share ``H - 1`` of their bars, so
the daily ICs are autocorrelated and their plain t (mean / (std / sqrt(n))) overstates the
evidence. The Newey-West t uses Bartlett weights up to ``lag = H - 1`` dates (at least 0, at most
``n - 1``), which covers the overlap of daily origins; sparser origins overlap less and the lag
is then conservative.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from . import scores as sc


def newey_west_t(values, lag: int) -> float:
    """``mean / se`` of ``values`` with the Newey-West (Bartlett kernel) standard error of the
    mean at ``lag`` (clipped to ``[0, n - 1]``); NaN with fewer than two finite values or no
    spread."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    n = v.size
    if n < 2:
        return math.nan
    d = v - v.mean()
    lag = int(max(0, min(int(lag), n - 1)))
    var = float(d @ d) / n
    for j in range(1, lag + 1):
        var += 2.0 * (1.0 - j / (lag + 1.0)) * float(d[j:] @ d[:-j]) / n
    if not var > 0:
        return math.nan
    return float(v.mean() / math.sqrt(var / n))


def nw_lag(horizon: int) -> int:
    """The Newey-West lag of a horizon's per-date IC: ``horizon - 1`` (the origins' overlap)."""
    return max(0, int(horizon) - 1)


def step_rank_ic(dates, mean: np.ndarray, last_close: np.ndarray, actual: np.ndarray, step: int) -> float:
    """Mean per-date rank IC of the forecast return at ``step`` (1-based) against the actual one."""
    last = np.asarray(last_close, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.asarray(mean, dtype=np.float64)[:, step - 1] / last - 1.0
        y = np.asarray(actual, dtype=np.float64)[:, step - 1] / last - 1.0
    daily = sc.daily_ic(dates, f, y)
    return float(daily["rank_ic"].mean()) if len(daily) else math.nan


def rank_ic_metrics(per: Mapping[str, Mapping[str, np.ndarray]], dates, last_close: np.ndarray, actual: np.ndarray,
                    steps: Iterable[int], prefixes: Mapping[str, str], signals: Iterable[str]) -> dict[str, float]:
    """For each forecaster of ``signals`` in ``per``: ``<prefix>rank_ic_nw_t`` (lag from the
    horizon, :func:`nw_lag`) and ``<prefix>rank_ic_h<k>`` for each of ``steps``; finite values only."""
    horizon = int(np.asarray(actual).shape[1])
    out: dict[str, float] = {}
    for name in signals:
        if name not in per:
            continue
        scores, prefix = per[name], prefixes[name]
        daily = sc.daily_ic(dates, scores["forecast_return"], scores["actual_return"])
        out[f"{prefix}rank_ic_nw_t"] = newey_west_t(daily["rank_ic"], nw_lag(horizon))
        for k in steps:
            out[f"{prefix}rank_ic_h{k}"] = step_rank_ic(dates, scores["mean"], last_close, actual, int(k))
    return {k: float(v) for k, v in out.items() if math.isfinite(v)}


def rank_ic_summary(dates, forecast_return, actual_return, horizon: int, groups=None) -> dict[str, float]:
    """The mean per-date rank IC of a signal with its 95% bootstrap interval over dates and its
    Newey-West t: ``rank_ic``, ``rank_ic_ci_low``, ``rank_ic_ci_high``, ``rank_ic_nw_t``,
    ``ic_dates`` (finite values only)."""
    daily = sc.daily_ic(dates, forecast_return, actual_return)
    if not len(daily):
        return {}
    low, high = sc.mean_interval(daily["rank_ic"])
    out = {"rank_ic": float(daily["rank_ic"].mean()), "rank_ic_ci_low": low, "rank_ic_ci_high": high,
           "rank_ic_nw_t": newey_west_t(daily["rank_ic"], nw_lag(horizon)), "ic_dates": float(len(daily))}
    return {k: float(v) for k, v in out.items() if math.isfinite(float(v))}
