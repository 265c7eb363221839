"""Coverage in every weather: each forecaster's coverage at 50/80/90%, WQL and PIT KS by
volatility tercile of the origin (histvol's sigma: the std of the last 20 log returns ending at
it) and by calendar quarter of the test origins; the 80% coverage over test time (rolling over
origin dates, ``coverage.png``) and, after the largest change of realised volatility, how many
origin dates each forecaster's rolling coverage needs to come back within 0.05 of 0.80
(docs/calibration.md#coverage-in-every-weather).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..serving.forecasting.quantiles import histvol_sigma
from . import probabilistic as pr, scores as sc
from .figures import COLORS
from .plots import new_figure

#: origin dates a rolling coverage and the change of realised volatility are measured over
WINDOW = 10
TOLERANCE = 0.05


@dataclass
class Weather:
    """What ``coverage.png`` draws: per forecaster the rolling 80% coverage by origin date, and
    the date of the largest change of realised volatility."""

    dates: np.ndarray = field(default_factory=lambda: np.empty(0, dtype="datetime64[ns]"))
    rolling: dict[str, np.ndarray] = field(default_factory=dict)
    volatility: np.ndarray = field(default_factory=lambda: np.empty(0))
    change: int = -1  # index into dates of the largest change (-1: none)


def terciles(sigma: np.ndarray) -> np.ndarray:
    """``1``, ``2``, ``3``: the volatility tercile of each origin (0 where sigma is NaN)."""
    s = np.asarray(sigma, dtype=np.float64)
    ok = np.isfinite(s)
    out = np.zeros(len(s), dtype=np.int64)
    if ok.sum() >= 3:
        low, high = np.quantile(s[ok], [1 / 3, 2 / 3])
        out[ok] = 1 + (s[ok] > low).astype(np.int64) + (s[ok] > high).astype(np.int64)
    return out


def quarters(dates) -> np.ndarray:
    """``2024q2``, ...: the calendar quarter of each origin date."""
    index = pd.DatetimeIndex(np.asarray(dates))
    return np.array([f"{y}q{q}" for y, q in zip(index.year, index.quarter)])


def _subset(scores: Mapping[str, np.ndarray], keep: np.ndarray) -> dict[str, float]:
    out = {}
    for nominal in pr.COVERAGES:
        values = np.asarray(scores[f"coverage_{nominal}"])[keep]
        values = values[np.isfinite(values)]
        if values.size:
            out[f"coverage_{nominal}"] = float(values.mean())
    out["wql_close"] = sc.wql({"quantile_loss": np.asarray(scores["quantile_loss"])[keep],
                               "abs_actual": np.asarray(scores["abs_actual"])[keep]})
    out["pit_ks"] = pr.ks_distance(np.asarray(scores["pit"])[keep])
    return {k: v for k, v in out.items() if math.isfinite(v)}


def realised_volatility(history_close: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Per origin: the root mean square of the log returns over its forecast bars."""
    c = np.asarray(history_close, dtype=np.float64)
    path = np.concatenate([c[:, -1:], np.asarray(actual, dtype=np.float64)], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(np.nanmean(np.diff(np.log(path), axis=1) ** 2, axis=1))


def largest_change(per_date: np.ndarray, window: int = WINDOW) -> int:
    """The index of the first date after the largest change of the mean over ``window`` dates
    (the mean of the ``window`` dates from it against the ``window`` before it); -1 with too few."""
    v = np.asarray(per_date, dtype=np.float64)
    if len(v) < 2 * window:
        return -1
    gaps = [abs(np.nanmean(v[t:t + window]) - np.nanmean(v[t - window:t])) for t in range(window, len(v) - window + 1)]
    return int(window + int(np.nanargmax(gaps)))


def recovery(rolling: np.ndarray, change: int, nominal: float = 0.8, tolerance: float = TOLERANCE) -> float:
    """Origin dates from ``change`` until the trailing rolling coverage lies within ``tolerance``
    of ``nominal`` again and stays so for the next date too (0 when it never left); NaN when it
    never comes back."""
    r = np.asarray(rolling, dtype=np.float64)
    inside = np.abs(r - nominal) <= tolerance
    for k in range(change, len(r)):
        if inside[k] and (k + 1 >= len(r) or inside[k + 1]):
            return float(k - change)
    return float("nan")


def measure(per: Mapping[str, Mapping[str, np.ndarray]], dates, history_close: np.ndarray, actual: np.ndarray,
            prefixes: Mapping[str, str]) -> tuple[dict[str, float], dict[str, str], Weather]:
    """The metrics (``<prefix>coverage_80_vol<k>``, ``<prefix>wql_close_vol<k>``,
    ``<prefix>pit_ks_vol<k>``, ``<prefix>coverage_80_<year>q<n>`` ..., ``<prefix>recovery_dates``,
    ``vol_tercile_<k>_sigma_max``), the tag ``vol_change_date`` and the rolling coverage."""
    sigma = histvol_sigma(history_close)
    tercile = terciles(sigma)
    quarter = quarters(dates)
    metrics: dict[str, float] = {}
    for k in (1, 2, 3):
        if (tercile == k).any():
            metrics[f"vol_tercile_{k}_sigma_max"] = float(np.nanmax(sigma[tercile == k]))
    day = np.asarray(dates).astype("datetime64[ns]")
    unique = np.unique(day)
    where = np.searchsorted(unique, day)
    rv = realised_volatility(history_close, actual)
    rv_date = np.bincount(where, weights=np.nan_to_num(rv), minlength=len(unique)) / np.maximum(
        np.bincount(where, weights=np.isfinite(rv).astype(float), minlength=len(unique)), 1)
    change = largest_change(rv_date)
    weather = Weather(dates=unique, volatility=rv_date, change=change)
    for name, scores in per.items():
        prefix = prefixes.get(name)
        if prefix is None or not np.isfinite(np.asarray(scores["levels"])).any():
            continue
        for k in (1, 2, 3):
            keep = tercile == k
            if keep.any():
                metrics.update({f"{prefix}{m}_vol{k}": v for m, v in _subset(scores, keep).items()})
        for q in np.unique(quarter):
            keep = quarter == q
            metrics.update({f"{prefix}{m}_{q}": v for m, v in _subset(scores, keep).items() if m.startswith("cov")})
        cov = np.asarray(scores["coverage_80"], dtype=np.float64)
        ok = np.isfinite(cov)
        sums = np.bincount(where[ok], weights=cov[ok], minlength=len(unique))
        counts = np.bincount(where[ok], minlength=len(unique)).astype(float)
        kernel = np.ones(WINDOW)
        rolled_sum = np.convolve(sums, kernel)[:len(unique)]
        rolled_n = np.convolve(counts, kernel)[:len(unique)]
        with np.errstate(invalid="ignore", divide="ignore"):
            rolling = np.where(rolled_n > 0, rolled_sum / rolled_n, np.nan)
        weather.rolling[name] = rolling
        if change >= 0:
            value = recovery(rolling, change)
            if math.isfinite(value):
                metrics[f"{prefix}recovery_dates"] = value
    tags = {"vol_change_date": str(unique[change])[:10]} if change >= 0 else {}
    return metrics, tags, weather


def coverage_figure(weather: Weather, description: str = ""):
    """The 80% coverage over test time per forecaster (trailing mean over ``WINDOW`` origin
    dates), the nominal 0.80 with its +-0.05 band, the realised volatility (right axis) and the
    date of its largest change."""

    fig = new_figure(9.0, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    x = weather.dates
    for name, values in weather.rolling.items():
        ax.plot(x, values, lw=1.2, color=COLORS.get(name, {"ensemble": "#d62728", "aci": "#8c564b"}.get(name, "k")),
                label=name)
    ax.axhspan(0.8 - TOLERANCE, 0.8 + TOLERANCE, color="#cccccc", alpha=0.4, lw=0)
    ax.axhline(0.8, color="k", lw=0.8, ls="--")
    if weather.change >= 0:
        ax.axvline(x[weather.change], color="#d62728", lw=0.8, ls=":", label="largest change of realised volatility")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel(f"80% coverage, trailing {WINDOW} origin dates")
    right = ax.twinx()
    right.plot(x, weather.volatility, color="#7f7f7f", lw=0.8, alpha=0.6)
    right.set_ylabel("realised volatility (per bar)", color="#7f7f7f")
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    ax.set_title(f"coverage over test time: {description}", fontsize=8)
    return fig
