"""The served forecaster's quantiles (:data:`QLEVELS`) and probability of a rise, and its
:class:`Calibrator` (JSON, never pickle): numpy only, read by the pyfunc
(:mod:`kronos_mlflow.serving.forecasting.pyfunc`) and by the scorecard
(:mod:`kronos_mlflow.evaluation.calibration`, where the method is described); docs/calibration.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


QLEVELS = np.array([0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95])
DECILES = np.array([i for i, level in enumerate(QLEVELS) if round(level * 10, 9) == round(level * 10)])
MEDIAN = int(np.flatnonzero(QLEVELS == 0.5)[0])
#: central intervals: nominal coverage -> the (lower, upper) indices into QLEVELS
COVERAGES = {50: (3, 9), 80: (1, 11), 90: (0, 12)}
#: the central intervals the calibrated forecaster widens, outermost first: (lower, upper) indices
INTERVALS = ((0, 12), (1, 11), (2, 10), (3, 9), (4, 8), (5, 7))
HISTVOL_RETURNS = 20
#: the fewest closes that give the volatility a calibrator scales by (two log returns, one
#: degree of freedom): a shorter lookback, or closes not all positive, gets no calibrated answer
MIN_CALIBRATED_LOOKBACK = 3
CLOSE = 3  # the close column of the six features (open, high, low, close, volume, amount)
FORMAT = "kronos-mlflow calibrator"
VERSION = 1
SIGMA_FLOOR = 1e-4


def path_quantiles(paths: np.ndarray, last_close: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(levels (n, 13, H), p_up (n,))`` of close sample paths ``(n, S, H)``: numpy's
    linear-interpolation quantiles at :data:`QLEVELS` and the share of paths whose last close is
    above ``last_close`` (NaN for a single path, which states no probability)."""
    paths = np.asarray(paths, dtype=np.float64)
    levels = np.moveaxis(np.quantile(paths, QLEVELS, axis=1), 0, 1)
    p_up = (paths[:, :, -1] > np.asarray(last_close, dtype=np.float64)[:, None]).mean(axis=1)
    if paths.shape[1] < 2:
        p_up = np.full(len(paths), np.nan)
    return levels, p_up


def histvol_sigma(history_close: np.ndarray) -> np.ndarray:
    """Per origin: the sample std (ddof 1) of the last :data:`HISTVOL_RETURNS` log returns of
    the close ending at the origin (NaN with fewer than two returns or a non-positive close)."""
    c = np.asarray(history_close, dtype=np.float64)
    tail = c[:, -(HISTVOL_RETURNS + 1):]
    if tail.shape[1] < MIN_CALIBRATED_LOOKBACK:
        return np.full(len(c), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        returns = np.diff(np.log(tail), axis=1)
        sigma = returns.std(axis=1, ddof=1)
    return np.where(np.isfinite(sigma) & (tail > 0).all(axis=1), sigma, np.nan)


def uncalibrated(history_close: np.ndarray) -> np.ndarray:
    """Per series of lookback closes ``(B, L)``: why its calibrated answer cannot be given ('' where
    it can): no volatility for the calibrator to scale by (:func:`histvol_sigma` is NaN) because
    the lookback is shorter than :data:`MIN_CALIBRATED_LOOKBACK` bars or its closes are not all
    positive and finite."""
    c = np.asarray(history_close, dtype=np.float64)
    if c.shape[1] < MIN_CALIBRATED_LOOKBACK:
        why = (f"a lookback of {c.shape[1]} bars gives no volatility for the calibrator to scale by (the std of the "
               f"close's log returns needs at least {MIN_CALIBRATED_LOOKBACK} bars): answered raw; send at least "
               f"{MIN_CALIBRATED_LOOKBACK} bars, {HISTVOL_RETURNS + 1} for the full {HISTVOL_RETURNS} returns")
        return np.full(len(c), why)
    why = ("the lookback's last closes are not all positive, so they give no volatility for the calibrator to scale "
           "by (the std of the close's log returns): answered raw")
    return np.where(np.isfinite(histvol_sigma(c)), "", why)


def floored(sigma: np.ndarray) -> np.ndarray:
    """``sigma`` with NaN and values under :data:`SIGMA_FLOOR` replaced by it."""
    sigma = np.asarray(sigma, dtype=np.float64)
    return np.where(np.isfinite(sigma) & (sigma > SIGMA_FLOOR), sigma, SIGMA_FLOOR)


def ordered(q: np.ndarray) -> np.ndarray:
    """Quantiles ``(n, 13, H)`` in order with the median kept: the lower ones clipped to at most
    the median and the upper to at least, then each side sorted."""
    m = MEDIAN
    median = q[:, m:m + 1]
    lower = np.sort(np.minimum(q[:, :m], median), axis=1)
    upper = np.sort(np.maximum(q[:, m + 1:], median), axis=1)
    return np.concatenate([lower, median, upper], axis=1)


@dataclass
class Calibrator:
    """What calibration learned (:mod:`kronos_mlflow.evaluation.calibration`, docs/calibration.md), as
    JSON (never pickle), and how it applies."""

    score_quantiles: np.ndarray  # (len(INTERVALS), H): s_hat per central interval and step
    up_x: np.ndarray  # isotonic thresholds of p_up
    up_y: np.ndarray
    origins: int
    base_rate: float  # the share of calibration origins whose close rose by the last step
    time_range: tuple[str, str] = ("", "")  # the calibration origins' first and last forecast bars
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def horizon(self) -> int:
        return int(self.score_quantiles.shape[1])

    def steps(self, horizon: int) -> np.ndarray:
        """``s_hat`` ``(len(INTERVALS), horizon)``: steps past the fitted horizon scaled by ``sqrt(h / H)``."""
        fitted = self.horizon
        if horizon <= fitted:
            return self.score_quantiles[:, :horizon]
        h = np.arange(fitted + 1, horizon + 1)
        extra = self.score_quantiles[:, -1:] * np.sqrt(h / fitted)[None, :]
        return np.concatenate([self.score_quantiles, extra], axis=1)

    def quantiles(self, levels: np.ndarray, last_close: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """Calibrated quantiles ``(n, 13, H)`` of raw ``levels`` (at QLEVELS)."""
        q = np.array(levels, dtype=np.float64, copy=True)
        width = (np.asarray(last_close, dtype=np.float64) * floored(sigma))[:, None]  # (n, 1)
        s_hat = self.steps(q.shape[2])
        for j, (lo, hi) in enumerate(INTERVALS):
            q[:, lo] = levels[:, lo] - s_hat[j][None, :] * width
            q[:, hi] = levels[:, hi] + s_hat[j][None, :] * width
        return ordered(q)

    def p_up(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        if not len(self.up_x):
            return np.full_like(p, self.base_rate)
        return np.clip(np.interp(p, self.up_x, self.up_y), 0.0, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION,
                "method": "normalised conformalised quantile regression per step and central interval; "
                          "p_up: isotonic regression",
                "levels": [float(v) for v in QLEVELS],
                "intervals": [[float(QLEVELS[lo]), float(QLEVELS[hi])] for lo, hi in INTERVALS],
                "score_quantiles": [[float(v) for v in row] for row in self.score_quantiles],
                "sigma_returns": HISTVOL_RETURNS, "sigma_floor": SIGMA_FLOOR,
                "p_up": {"x": [float(v) for v in self.up_x], "y": [float(v) for v in self.up_y]},
                "origins": int(self.origins), "base_rate": float(self.base_rate),
                "time_range": list(self.time_range), **self.extra}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True, allow_nan=False)
