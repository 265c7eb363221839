"""Whether a forecast's probabilities can be traded on: the quantiles, PIT and probability of a rise
of each forecaster, one distribution per (origin, step) held as ``levels`` ``(n, 13, H)`` at
:data:`QLEVELS`, ``pit`` ``(n, H)``, ``p_up`` ``(n,)`` and ``crps_steps`` ``(n, H)`` (NaN where the
forecaster has none), and the historical-volatility baseline ``histvol`` (docs/calibration.md).
"""

from __future__ import annotations

import math

import numpy as np

from ..serving.forecasting.quantiles import (
    CLOSE, COVERAGES, DECILES, HISTVOL_RETURNS, INTERVALS, MEDIAN, QLEVELS, histvol_sigma, path_quantiles,
)

__all__ = ["CLOSE", "COVERAGES", "DECILES", "HISTVOL_RETURNS", "INTERVALS", "MEDIAN", "QLEVELS", "QUANTILE_COLUMNS",
           "brier", "column", "coverage", "from_paths", "histvol", "histvol_sigma", "ks_distance", "lognormal_crps",
           "outcome_up", "pit_from_quantiles", "reliability", "uniforms"]

RELIABILITY_BINS = 10


def column(level: float) -> str:
    """``q0.05``, ``q0.1``, ...: the forecasts table's column of a quantile level."""
    return f"q{level:g}"


QUANTILE_COLUMNS = [column(level) for level in QLEVELS]


def uniforms(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The PIT's tie-breaking uniforms: numpy's generator seeded with the run's seed."""
    return np.random.default_rng(int(seed)).random(shape)


def from_paths(paths: np.ndarray, last_close: np.ndarray, actual: np.ndarray, u: np.ndarray) -> dict[str, np.ndarray]:
    """The distribution of sample paths ``P`` ``(n, S, H)``: numpy's linear-interpolation quantiles
    at :data:`QLEVELS` (the nine deciles WQL reads and the ends of the 50% and 90% central
    intervals), the randomized PIT ``u = (#{P < y} + U (#{P = y} + 1)) / (S + 1)`` (``U``: one
    uniform per (origin, step) from the run's seed) and ``p_up = #{P_H > c_L} / S``."""
    paths = np.asarray(paths, dtype=np.float64)
    y = np.asarray(actual, dtype=np.float64)
    levels, p_up = path_quantiles(paths, last_close)
    below = (paths < y[:, None, :]).sum(axis=1)
    ties = (paths == y[:, None, :]).sum(axis=1)
    pit = (below + u * (ties + 1)) / (paths.shape[1] + 1)
    return {"levels": levels, "pit": pit, "p_up": p_up}


def pit_from_quantiles(levels: np.ndarray, actual: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The PIT of ``actual`` ``(n, H)`` under quantiles ``(n, 13, H)`` at :data:`QLEVELS`: the
    levels linear between the quantiles, uniform in the tails beyond the outer ones (``U * 0.05``
    below ``q0.05``, ``0.95 + U * 0.05`` above ``q0.95``), uniform over a run of equal quantiles."""
    q = np.moveaxis(np.asarray(levels, dtype=np.float64), 1, -1)  # (n, H, 13)
    y = np.asarray(actual, dtype=np.float64)
    low_level = np.where(y < q[..., 0], 0.0, QLEVELS[0])
    high_level = np.where(y > q[..., -1], 1.0, QLEVELS[-1])
    # the levels whose quantiles sit at or below y (lo) and at or above it (hi)
    at_or_below = q <= y[..., None]
    at_or_above = q >= y[..., None]
    idx_lo = np.where(at_or_below.any(-1), at_or_below.shape[-1] - 1 - np.argmax(at_or_below[..., ::-1], -1), -1)
    idx_hi = np.where(at_or_above.any(-1), np.argmax(at_or_above, -1), len(QLEVELS))
    lo = np.where(idx_lo >= 0, QLEVELS[np.clip(idx_lo, 0, None)], 0.0)
    hi = np.where(idx_hi < len(QLEVELS), QLEVELS[np.clip(idx_hi, None, len(QLEVELS) - 1)], 1.0)
    q_lo = np.take_along_axis(q, np.clip(idx_lo, 0, None)[..., None], -1)[..., 0]
    q_hi = np.take_along_axis(q, np.clip(idx_hi, None, len(QLEVELS) - 1)[..., None], -1)[..., 0]
    inside = (idx_lo >= 0) & (idx_hi < len(QLEVELS)) & (q_hi > q_lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        linear = lo + (hi - lo) * (y - q_lo) / (q_hi - q_lo)
    tail_or_tie = np.where(y < q[..., 0], u * low_level, np.where(y > q[..., -1], high_level + u * (1.0 - high_level),
                                                                  lo + u * (hi - lo)))
    return np.where(inside, linear, tail_or_tie)


def ks_distance(pit: np.ndarray) -> float:
    """The Kolmogorov-Smirnov distance of the finite PIT values to U(0, 1) (NaN with none)."""
    from scipy.stats import kstest  # lazy: scipy

    values = np.asarray(pit, dtype=np.float64).reshape(-1)
    values = values[np.isfinite(values)]
    return float(kstest(values, "uniform").statistic) if values.size else float("nan")


def outcome_up(last_close: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """1.0 where the close at the last step is above the origin's close, else 0.0."""
    return (np.asarray(actual, dtype=np.float64)[:, -1] > np.asarray(last_close, dtype=np.float64)).astype(np.float64)


def brier(p: np.ndarray, outcome: np.ndarray) -> float:
    """The mean squared difference of the probabilities and the 0/1 outcomes (finite pairs)."""
    p, o = np.asarray(p, dtype=np.float64), np.asarray(outcome, dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(o)
    return float(np.mean((p[ok] - o[ok]) ** 2)) if ok.any() else float("nan")


def reliability(p: np.ndarray, outcome: np.ndarray, bins: int = RELIABILITY_BINS):
    """Per bin of ``p`` (``bins`` equal bins of [0, 1], the last closed): the mean probability,
    the observed frequency and the count (bins with no forecast left out)."""
    p, o = np.asarray(p, dtype=np.float64), np.asarray(outcome, dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(o)
    p, o = p[ok], o[ok]
    which = np.minimum((p * bins).astype(int), bins - 1)
    rows = []
    for b in range(bins):
        inside = which == b
        if inside.any():
            rows.append((float(p[inside].mean()), float(o[inside].mean()), int(inside.sum())))
    return rows


def coverage(levels: np.ndarray, actual: np.ndarray, nominal: int) -> np.ndarray:
    """``(n, H)``: 1.0 where the actual close lies inside the central ``nominal``% interval."""
    lo, hi = COVERAGES[nominal]
    q = np.asarray(levels, dtype=np.float64)
    y = np.asarray(actual, dtype=np.float64)
    return ((y >= q[:, lo]) & (y <= q[:, hi])).astype(np.float64)


# ---------------------------------------------------------------------- the volatility baseline

def _norm_ppf(p):
    from scipy.stats import norm  # lazy: scipy

    return norm.ppf(p)


def lognormal_crps(y: np.ndarray, mu: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The CRPS of LogNormal(mu, s) at ``y`` (Baran & Lerch 2015):
    ``y (2 Phi(z) - 1) - 2 exp(mu + s^2/2) (Phi(z - s) + Phi(s / sqrt 2) - 1)``, ``z = (log y - mu) / s``;
    ``s = 0``: the absolute error ``|y - exp(mu)|``."""
    from scipy.stats import norm  # lazy: scipy

    y, mu, s = (np.asarray(a, dtype=np.float64) for a in np.broadcast_arrays(y, mu, s))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.log(y) - mu) / s
        value = y * (2 * norm.cdf(z) - 1) - 2 * np.exp(mu + s * s / 2) * (norm.cdf(z - s) + norm.cdf(s / math.sqrt(2))
                                                                         - 1)
    return np.where(s > 0, value, np.abs(y - np.exp(mu)))


def histvol(history_close: np.ndarray, actual: np.ndarray, u: np.ndarray) -> dict[str, np.ndarray] | None:
    """The volatility baseline's distribution with its ``mean`` ``(n, H)`` and ``crps_steps``;
    None when no origin has a sigma (a lookback of under three bars). The close at step ``h`` is
    log-normal around the origin's close ``c_L``, ``log(c_h / c_L) ~ N(0, sigma^2 h)``: quantiles
    ``c_L exp(sigma sqrt(h) z_l)``, mean ``c_L exp(sigma^2 h / 2)``, PIT its exact CDF, ``p_up`` 1/2,
    CRPS in closed form (:func:`lognormal_crps`); docs/calibration.md#the-volatility-baseline-histvol."""
    from scipy.stats import norm  # lazy: scipy

    c = np.asarray(history_close, dtype=np.float64)
    y = np.asarray(actual, dtype=np.float64)
    sigma = histvol_sigma(c)
    if not np.isfinite(sigma).any():
        return None
    last = c[:, -1]
    horizon = y.shape[1]
    spread = sigma[:, None] * np.sqrt(np.arange(1, horizon + 1))[None, :]  # (n, H)
    z = _norm_ppf(QLEVELS)
    levels = last[:, None, None] * np.exp(spread[:, None, :] * z[None, :, None])
    mean = last[:, None] * np.exp(spread ** 2 / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        standard = np.log(y / last[:, None]) / spread
        pit = np.where(spread > 0, norm.cdf(standard), np.where(y > last[:, None], 1.0, np.where(
            y < last[:, None], 0.0, u)))
    p_up = np.where(sigma > 0, 0.5, 0.0)
    crps_steps = lognormal_crps(y, np.log(last)[:, None], spread)
    bad = ~np.isfinite(sigma)
    for array in (levels, mean, pit, crps_steps):
        array[bad] = np.nan
    p_up = np.where(bad, np.nan, p_up)
    return {"levels": levels, "pit": pit, "p_up": p_up, "mean": mean, "crps_steps": crps_steps, "sigma": sigma}
