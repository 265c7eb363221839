"""The scorecard's metrics on ``close``, per origin and over origins (formulas in
docs/forecast-evaluation.md). Everything here takes arrays, never a model.

Per origin, with ``c`` the lookback closes (the origin's close ``c[-1]`` last), ``y`` the
``H`` actual closes after it, ``P`` the ``S`` sample paths ``(S, H)`` and ``f = mean(P)``:

- ``mase = mean_h |f_h - y_h| / mean_t |c_t - c_{t-1}|`` (NaN when the lookback never moves);
- ``crps = mean_h CRPS(P[:, h], y_h) / (std(c) + 1e-5)``, with the empirical
  ``CRPS = mean_i |P_i - y| - 1/2 mean_ij |P_i - P_j|`` and the population std;
- ``direction = [sign(f_H - c[-1]) == sign(y_H - c[-1])]`` (NaN when ``y_H == c[-1]``);
- forecast return ``f_H / c[-1] - 1`` and actual return ``y_H / c[-1] - 1``.

Over origins: means (NaNs left out). ``ic`` / ``rank_ic``: per origin date with at least
``MIN_SYMBOLS`` symbols, the Pearson / Spearman correlation across symbols of the forecast and
the actual returns, then their mean over dates; ``icir`` = mean / std (ddof 1) over those dates,
as Qlib's signal analysis computes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from .verdict import BOOTSTRAP_SEED, paired_bootstrap

NORM_EPS = 1e-5
MIN_SYMBOLS = 5


def origin_scores(paths: np.ndarray, history_close: np.ndarray, actual_close: np.ndarray) -> dict[str, np.ndarray]:
    """Per origin (see the module doc): ``mase``, ``crps``, ``direction``, ``forecast_return``,
    ``actual_return``. ``paths`` (n, S, H), ``history_close`` (n, L), ``actual_close`` (n, H)."""
    paths = np.asarray(paths, dtype=np.float64)
    c = np.asarray(history_close, dtype=np.float64)
    y = np.asarray(actual_close, dtype=np.float64)
    f = paths.mean(axis=1)
    scale = np.abs(np.diff(c, axis=1)).mean(axis=1) if c.shape[1] > 1 else np.zeros(len(c))
    with np.errstate(divide="ignore", invalid="ignore"):
        mase = np.where(scale > 0, np.abs(f - y).mean(axis=1) / scale, np.nan)
    spread = np.abs(paths[:, :, None, :] - paths[:, None, :, :]).mean(axis=(1, 2))  # (n, H)
    crps_steps = np.abs(paths - y[:, None, :]).mean(axis=1) - 0.5 * spread
    crps = crps_steps.mean(axis=1) / (c.std(axis=1) + NORM_EPS)
    last = c[:, -1]
    actual_sign, forecast_sign = np.sign(y[:, -1] - last), np.sign(f[:, -1] - last)
    direction = np.where(actual_sign != 0, (actual_sign == forecast_sign).astype(np.float64), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        forecast_return, actual_return = f[:, -1] / last - 1.0, y[:, -1] / last - 1.0
    return {"mase": mase, "crps": crps, "direction": direction, "forecast_return": forecast_return,
            "actual_return": actual_return}


def daily_ic(dates, forecast_return, actual_return, min_symbols: int = MIN_SYMBOLS) -> pd.DataFrame:
    """Per origin date with at least ``min_symbols`` origins: ``ic`` (Pearson) and ``rank_ic``
    (Spearman) across symbols; dates whose correlation is undefined (a constant forecast) are
    left out."""
    frame = pd.DataFrame({"date": np.asarray(dates), "pred": np.asarray(forecast_return, dtype=np.float64),
                          "label": np.asarray(actual_return, dtype=np.float64)}).dropna()
    rows = []
    for date, group in frame.groupby("date", sort=True):
        if len(group) < min_symbols:
            continue
        rows.append({"date": date, "ic": group["pred"].corr(group["label"]),
                     "rank_ic": group["pred"].corr(group["label"], method="spearman")})
    out = pd.DataFrame(rows, columns=["date", "ic", "rank_ic"])
    return out.dropna().reset_index(drop=True)


def _mean(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def summary(scores: Mapping[str, np.ndarray], dates, *, direction: bool = True) -> dict[str, float]:
    """The metrics over origins (unprefixed): ``mase_close``, ``crps_close``, and, for a
    forecaster that forecasts a change (``direction``), ``direction_accuracy``, ``ic``,
    ``rank_ic``, ``icir`` (each only when defined)."""
    out = {"mase_close": _mean(scores["mase"]), "crps_close": _mean(scores["crps"])}
    if direction:
        out["direction_accuracy"] = _mean(scores["direction"])
        per_date = daily_ic(dates, scores["forecast_return"], scores["actual_return"])
        if len(per_date):
            out["ic"], out["rank_ic"] = float(per_date["ic"].mean()), float(per_date["rank_ic"].mean())
            std = float(per_date["ic"].std()) if len(per_date) > 1 else float("nan")
            if math.isfinite(std) and std > 0:
                out["icir"] = out["ic"] / std
    return {k: v for k, v in out.items() if math.isfinite(v)}


def skill(model_mase, base_mase) -> tuple[float, float, float]:
    """``1 - mean(model) / mean(base)`` and its 95% paired-bootstrap interval over the origins
    both score (the verdict's bootstrap: :func:`~kronos_mlflow.evaluation.verdict.paired_bootstrap`,
    whose change is ``ratio - 1``)."""
    m, b = np.asarray(model_mase, dtype=np.float64), np.asarray(base_mase, dtype=np.float64)
    both = np.isfinite(m) & np.isfinite(b)
    if not both.any():
        return float("nan"), float("nan"), float("nan")
    change, low, high = paired_bootstrap(m[both], b[both])
    return -change, -high, -low


def mean_interval(values, n_resamples: int = 1000, level: float = 0.95) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the mean of ``values`` (the verdict's seed),
    e.g. of the per-date IC; NaNs with fewer than two values."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = v[rng.integers(0, v.size, size=(n_resamples, v.size))].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)
