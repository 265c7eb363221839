"""The scorecard's metrics on ``close``, per origin (:func:`origin_scores`) and over origins
(:func:`summary`; ``ic`` / ``rank_ic`` per date with at least ``MIN_SYMBOLS`` symbols, as Qlib's
signal analysis computes them). Everything here takes arrays, never a model; the formulas:
docs/forecast-evaluation.md#metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from . import probabilistic as pr
from .verdict import group_sums, grouped_bootstrap, paired_bootstrap, resampled_groups

NORM_EPS = 1e-5
MIN_SYMBOLS = 5
LEVELS = np.round(np.arange(1, 10) / 10.0, 1)  # the nine deciles the quantile metrics read
GM_CLIP = (0.01, 100.0)  # fev's clipping of each relative error before the geometric mean


def origin_scores(paths: np.ndarray, history_close: np.ndarray, actual_close: np.ndarray,
                  u: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per origin (:func:`distribution_scores`) of sample paths ``(n, S, H)``, ``history_close``
    (n, L), ``actual_close`` (n, H); ``u``: the PIT's uniforms ``(n, H)`` (default: from seed 0).
    The CRPS is the fair ensemble estimator ``mean_i |P_i - y| - sum_ij |P_i - P_j| / (2 S (S - 1))``
    (Ferro 2014; ``S = 1``: the absolute error)."""
    paths = np.asarray(paths, dtype=np.float64)
    c = np.asarray(history_close, dtype=np.float64)
    y = np.asarray(actual_close, dtype=np.float64)
    u = pr.uniforms(0, y.shape) if u is None else u
    n_paths = paths.shape[1]
    pairs = np.abs(paths[:, :, None, :] - paths[:, None, :, :]).sum(axis=(1, 2))  # (n, H)
    spread = pairs / (2.0 * n_paths * (n_paths - 1)) if n_paths > 1 else np.zeros_like(pairs)
    dist = pr.from_paths(paths, c[:, -1], y, u)
    dist.update(mean=paths.mean(axis=1), crps_steps=np.abs(paths - y[:, None, :]).mean(axis=1) - spread)
    return distribution_scores(dist, c, y)


def distribution_scores(dist: Mapping[str, np.ndarray], history_close: np.ndarray,
                        actual_close: np.ndarray) -> dict[str, np.ndarray]:
    """Per origin, of a forecaster's distribution (:mod:`~kronos_mlflow.evaluation.probabilistic`:
    ``levels``, ``mean``, ``crps_steps``, ``pit``, ``p_up``), with ``c`` the lookback closes (the
    origin's close ``c[-1]`` last), ``y`` the ``H`` actual closes and ``f`` the mean (formulas in
    docs/forecast-evaluation.md#metrics): ``mase`` (NaN when the lookback never moves) and
    ``step_mase`` ``(n, H)``; ``crps`` (over ``std(c) + 1e-5``, the population std); ``quantiles``,
    the nine deciles ``(n, 9, H)``, with ``quantile_loss`` and ``abs_actual`` (WQL over origins is
    ``sum quantile_loss / sum abs_actual``); ``direction`` (NaN when ``y_H == c[-1]``),
    ``forecast_return`` ``f_H / c[-1] - 1`` and ``actual_return``; the coverages of the 50, 80 and
    90% central intervals (``coverage_<c>`` per origin, ``coverage_steps_<c>`` per (origin, step));
    ``pit``, ``p_up`` and ``up``, whether the close rose by the last step."""
    c = np.asarray(history_close, dtype=np.float64)
    y = np.asarray(actual_close, dtype=np.float64)
    f = np.asarray(dist["mean"], dtype=np.float64)
    scale = np.abs(np.diff(c, axis=1)).mean(axis=1) if c.shape[1] > 1 else np.zeros(len(c))
    with np.errstate(divide="ignore", invalid="ignore"):
        mase = np.where(scale > 0, np.abs(f - y).mean(axis=1) / scale, np.nan)
        step_mase = np.where(scale[:, None] > 0, np.abs(f - y) / scale[:, None], np.nan)
    crps = np.asarray(dist["crps_steps"], dtype=np.float64).mean(axis=1) / (c.std(axis=1) + NORM_EPS)
    levels = np.asarray(dist["levels"], dtype=np.float64)
    q = levels[:, pr.DECILES]  # (n, 9, H)
    diff = y[:, None, :] - q
    weights = LEVELS[None, :, None]
    quantile_loss = (2.0 * np.maximum(weights * diff, (weights - 1.0) * diff)).mean(axis=1).sum(axis=1)
    last = c[:, -1]
    actual_sign, forecast_sign = np.sign(y[:, -1] - last), np.sign(f[:, -1] - last)
    direction = np.where(actual_sign != 0, (actual_sign == forecast_sign).astype(np.float64), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        forecast_return, actual_return = f[:, -1] / last - 1.0, y[:, -1] / last - 1.0
    out = {"mase": mase, "crps": crps, "direction": direction, "forecast_return": forecast_return,
           "actual_return": actual_return, "step_mase": step_mase, "quantiles": q, "levels": levels, "mean": f,
           "quantile_loss": quantile_loss, "abs_actual": np.abs(y).sum(axis=1),
           "pit": np.asarray(dist["pit"], dtype=np.float64), "p_up": np.asarray(dist["p_up"], dtype=np.float64),
           "up": pr.outcome_up(last, y)}
    for nominal in pr.COVERAGES:
        steps = pr.coverage(levels, y, nominal)
        steps[~np.isfinite(levels[:, 0])] = np.nan
        out[f"coverage_steps_{nominal}"] = steps
        out[f"coverage_{nominal}"] = steps.mean(axis=1)
    return out


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


def wql(scores: Mapping[str, np.ndarray]) -> float:
    """Weighted quantile loss over the origins: ``sum quantile_loss / sum abs_actual``."""
    loss, scale = np.asarray(scores["quantile_loss"]), np.asarray(scores["abs_actual"])
    ok = np.isfinite(loss) & np.isfinite(scale)
    return float(loss[ok].sum() / scale[ok].sum()) if ok.any() and scale[ok].sum() > 0 else float("nan")


def summary(scores: Mapping[str, np.ndarray], dates, *, direction: bool = True,
            horizons: tuple[int, ...] = ()) -> dict[str, float]:
    """The metrics over origins (unprefixed): ``mase_close``, ``crps_close``, ``wql_close``,
    ``coverage_50`` / ``_80`` / ``_90``, ``pit_ks``, ``brier_up`` (where ``p_up`` is defined),
    ``mase_close_h<k>`` and ``coverage_80_h<k>`` for each of ``horizons``, and, for a forecaster that
    forecasts a change (``direction``), ``direction_accuracy``, ``ic``, ``rank_ic``, ``icir``,
    ``rank_icir`` (each only when defined)."""
    out = {"mase_close": _mean(scores["mase"]), "crps_close": _mean(scores["crps"]), "wql_close": wql(scores)}
    for nominal in pr.COVERAGES:
        out[f"coverage_{nominal}"] = _mean(scores[f"coverage_{nominal}"])
    out["pit_ks"] = pr.ks_distance(scores["pit"])
    out["brier_up"] = pr.brier(scores["p_up"], scores["up"])
    for k in horizons:
        out[f"mase_close_h{k}"] = _mean(np.asarray(scores["step_mase"])[:, k - 1])
        out[f"coverage_80_h{k}"] = _mean(np.asarray(scores["coverage_steps_80"])[:, k - 1])
    if direction:
        out["direction_accuracy"] = _mean(scores["direction"])
        per_date = daily_ic(dates, scores["forecast_return"], scores["actual_return"])
        if len(per_date):
            out["ic"], out["rank_ic"] = float(per_date["ic"].mean()), float(per_date["rank_ic"].mean())
            for name in ("ic", "rank_ic"):
                std = float(per_date[name].std()) if len(per_date) > 1 else float("nan")
                if math.isfinite(std) and std > 0:
                    out[f"{name}ir"] = out[name] / std
    return {k: v for k, v in out.items() if math.isfinite(v)}


def direction_baseline(actual_return) -> float:
    """The share of the more frequent sign of the actual change among the origins (zero changes
    left out): the best constant guess of the direction, known only in hindsight."""
    sign = np.sign(np.asarray(actual_return, dtype=np.float64))
    sign = sign[np.isfinite(sign) & (sign != 0)]
    return float(max((sign > 0).mean(), (sign < 0).mean())) if sign.size else float("nan")


def skill(model_mase, base_mase, groups=None) -> tuple[float, float, float]:
    """``1 - mean(model) / mean(base)`` and its 95% paired-bootstrap interval over the origins
    both score (the verdict's bootstrap, whose change is ``ratio - 1``): whole ``groups``
    resampled when given (:func:`~kronos_mlflow.evaluation.verdict.grouped_bootstrap`, the
    origins' dates), else each origin alone (:func:`~kronos_mlflow.evaluation.verdict.paired_bootstrap`)."""
    m, b = np.asarray(model_mase, dtype=np.float64), np.asarray(base_mase, dtype=np.float64)
    both = np.isfinite(m) & np.isfinite(b)
    if not both.any():
        return float("nan"), float("nan"), float("nan")
    if groups is None:
        change, low, high = paired_bootstrap(m[both], b[both])
    else:
        change, low, high = grouped_bootstrap(m[both], b[both], np.asarray(groups)[both])
    return -change, -high, -low


def gm_skill(model_mase, base_mase, groups=None) -> tuple[float, float, float]:
    """fev's summary: ``1 - exp(mean log r)`` over the origins both score, ``r`` the MASE ratio
    clipped to ``GM_CLIP``; its 95% bootstrap interval (whole ``groups`` resampled when given)."""
    m, b = np.asarray(model_mase, dtype=np.float64), np.asarray(base_mase, dtype=np.float64)
    ok = np.isfinite(m) & np.isfinite(b) & (b > 0)
    if not ok.any():
        return float("nan"), float("nan"), float("nan")
    logs = np.log(np.clip(m[ok] / b[ok], *GM_CLIP))
    low, high = mean_interval(logs, np.asarray(groups)[ok] if groups is not None else None)
    return 1.0 - math.exp(float(logs.mean())), 1.0 - math.exp(high), 1.0 - math.exp(low)


def win_rate(model_mase, base_mase) -> float:
    """The share of the origins both score where the model's MASE is lower (ties count half)."""
    m, b = np.asarray(model_mase, dtype=np.float64), np.asarray(base_mase, dtype=np.float64)
    ok = np.isfinite(m) & np.isfinite(b)
    return float((m[ok] < b[ok]).mean() + 0.5 * (m[ok] == b[ok]).mean()) if ok.any() else float("nan")


def mean_interval(values, groups=None, n_resamples: int = 1000, level: float = 0.95) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the mean of ``values`` resampling whole
    ``groups`` (each value alone without them; the verdict's seed), e.g. of the per-date IC;
    NaNs with fewer than two."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    g = np.arange(v.size) if groups is None else np.asarray(groups).reshape(-1)
    ok = np.isfinite(v)
    if ok.sum() < 2:
        return float("nan"), float("nan")
    sums, counts = group_sums(v[ok], g[ok])
    means = np.empty(n_resamples, dtype=np.float64)
    for start, idx in resampled_groups(len(sums), n_resamples):
        means[start:start + len(idx)] = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)
