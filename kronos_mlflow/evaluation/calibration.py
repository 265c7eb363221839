"""The calibrated forecaster: the fine-tuned pair's quantiles (normalised conformalised quantile
regression) and probability of a rise (isotonic regression), fit on forecasts of validation
origins and applied unchanged to the test origins and to what the logged model serves; the
method, its guarantee and why isotonic: docs/calibration.md#the-calibrated-forecaster-finetuned_calibrated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..config.keys import DATA, EVALUATION
from ..config.sections import as_section
from ..errors import UserError
from ..serving.forecasting.quantiles import MIN_CALIBRATED_LOOKBACK, Calibrator, floored
from . import probabilistic as pr

CALIBRATED = "finetuned_calibrated"


def score_quantile(scores: np.ndarray, coverage: float) -> float:
    """The conformal quantile of the finite scores: the ``ceil((n + 1) coverage)``-th smallest
    (the ``(1 - alpha)(1 + 1/n)`` empirical quantile), the largest when that exceeds ``n``; NaN
    with none."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    s = s[np.isfinite(s)]
    if not s.size:
        return float("nan")
    rank = int(np.ceil((s.size + 1) * coverage - 1e-9))
    return float(s[min(max(rank, 1), s.size) - 1])


def fit(levels: np.ndarray, last_close: np.ndarray, sigma: np.ndarray, actual: np.ndarray, p_up: np.ndarray,
        time_range: tuple[str, str] = ("", "")) -> Calibrator:
    """A calibrator from the calibration origins' raw quantiles ``(n, 13, H)``, closes, sigmas,
    actual closes ``(n, H)`` and raw ``p_up`` ``(n,)`` (docs/calibration.md#the-calibrated-forecaster-finetuned_calibrated)."""
    from sklearn.isotonic import IsotonicRegression  # lazy: scikit-learn

    y = np.asarray(actual, dtype=np.float64)
    width = (np.asarray(last_close, dtype=np.float64) * floored(sigma))[:, None]
    table = np.empty((len(pr.INTERVALS), y.shape[1]), dtype=np.float64)
    for j, (lo, hi) in enumerate(pr.INTERVALS):
        scores = np.maximum(levels[:, lo] - y, y - levels[:, hi]) / width  # (n, H)
        coverage = float(pr.QLEVELS[hi] - pr.QLEVELS[lo])
        table[j] = [score_quantile(scores[:, h], coverage) for h in range(y.shape[1])]
    table = np.where(np.isfinite(table), table, 0.0)
    up = pr.outcome_up(last_close, y)
    p = np.asarray(p_up, dtype=np.float64)
    ok = np.isfinite(p)
    base = float(up.mean()) if len(up) else 0.5
    if ok.sum() >= 2 and len(np.unique(p[ok])) > 1:
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(p[ok], up[ok])
        x_thr, y_thr = np.asarray(iso.X_thresholds_, dtype=np.float64), np.asarray(iso.y_thresholds_, dtype=np.float64)
    else:  # one value of p_up: the base rate whatever it is
        x_thr, y_thr = np.empty(0), np.empty(0)
    return Calibrator(table, x_thr, y_thr, int(len(y)), base, time_range)


def calibrated(cal: Calibrator, raw: Mapping[str, np.ndarray], last_close: np.ndarray, sigma: np.ndarray,
               actual: np.ndarray, u: np.ndarray) -> dict[str, np.ndarray]:
    """The calibrated forecaster's distribution from the raw one's (``levels``, ``mean``,
    ``p_up``): calibrated quantiles and ``p_up``, the raw mean, the PIT from the calibrated
    quantiles (:func:`~kronos_mlflow.evaluation.probabilistic.pit_from_quantiles`), no CRPS."""
    levels = cal.quantiles(raw["levels"], last_close, sigma)
    return {"levels": levels, "mean": np.asarray(raw["mean"], dtype=np.float64),
            "crps_steps": np.full(np.asarray(actual).shape, np.nan), "pit": pr.pit_from_quantiles(levels, actual, u),
            "p_up": cal.p_up(raw["p_up"])}


def origins_for(config: Mapping[str, Any], test) -> Any:
    """The calibration origins for the test origins ``test``: the validation split's forecast origins
    (at most ``n_val_skill_windows``), keeping only those whose last forecast bar lies before the
    first test forecast bar, so that no test bar is ever used (docs/calibration.md#calibration-origins)."""
    from .origins import forecast_origins  # lazy: the data package (qlib, torch)

    val = forecast_origins(config, "val")
    if not len(val) or not len(test):
        return val
    first_test = test.times(np.arange(len(test)))[1][:, 0].min()
    last_bar = val.times(np.arange(len(val)))[1][:, -1]
    keep = last_bar < first_test
    if keep.all():
        return val
    return replace(val, rows=val.rows[keep], series=val.series[keep], positions=val.positions[keep],
                   dates=val.dates[keep], candidates=int(keep.sum()))


def base_rate(origins) -> float | None:
    """The share of ``origins`` whose close rose by the last forecast step (None without origins)."""
    if not len(origins):
        return None
    every = np.arange(len(origins))
    close = origins.history(every)[:, -1, pr.CLOSE]
    return float(pr.outcome_up(close, origins.future(every)[..., pr.CLOSE]).mean())


def before(cal: Calibrator, test) -> bool:
    """Whether ``cal`` was fit on forecast bars that all end before the first test forecast bar."""
    if not len(test) or not cal.time_range[1]:
        return False
    first_test = test.times(np.arange(len(test)))[1][:, 0].min()
    return np.datetime64(cal.time_range[1]) < first_test


def time_range(origins) -> tuple[str, str]:
    """The first and the last forecast bar of ``origins`` (ISO dates; empty without origins)."""
    if not len(origins):
        return ("", "")
    future = origins.times(np.arange(len(origins)))[1]
    return (str(future.min())[:19], str(future.max())[:19])


def too_few(n: int, evaluation: Any, data: Any = None) -> str:
    """Why ``n`` calibration origins are refused ('' when enough), or a lookback too short for
    the volatility the calibrator scales by (fewer than
    :data:`~kronos_mlflow.serving.forecasting.quantiles.MIN_CALIBRATED_LOOKBACK` bars).
    ``evaluation``, ``data``: the config's evaluation and data sections, or the whole config as
    ``evaluation`` (so too in :func:`check_enough` and :func:`skipped`)."""
    data = as_section(evaluation if data is None else data, DATA)
    evaluation = as_section(evaluation, EVALUATION)
    lookback = int(data.lookback_window or 0)
    if lookback < MIN_CALIBRATED_LOOKBACK:
        return (f"calibration on: lookback_window {lookback} gives no volatility for the calibrator to scale by (the "
                f"std of the close's log returns needs at least {MIN_CALIBRATED_LOOKBACK} bars); raise lookback_window "
                f"to {MIN_CALIBRATED_LOOKBACK} or more, or set calibration off")
    need = int(evaluation.calibration_min_origins or 1)
    if n >= need:
        return ""
    return (f"calibration on: {n:,} calibration origins in val_time_range {':'.join(data.val_time_range)} "
            f"(validation forecast origins forecasting bars after train_time_range and before the first test "
            f"forecast bar), fewer than calibration_min_origins {need}; widen val_time_range, lower "
            "calibration_min_origins, or set calibration off")


def check_enough(n: int, evaluation: Any, data: Any = None) -> None:
    """Refuse too few calibration origins (:func:`too_few`) with ``calibration: on``; with
    ``auto`` the run goes on without calibration (:func:`skipped` says why)."""
    reason = too_few(n, evaluation, data)
    if reason and mode(evaluation) == "on":
        raise UserError(reason)


def mode(evaluation: Any) -> str:
    """``calibration``: ``auto`` (the default), ``on`` or ``off``. ``evaluation``: the config's
    evaluation section, or the whole config."""
    return str(as_section(evaluation, EVALUATION).calibration)


def is_on(evaluation: Any) -> bool:
    """Whether calibration is asked for: ``on``, or ``auto`` (then only with enough origins)."""
    return mode(evaluation) in ("on", "auto")


def skipped(n: int, evaluation: Any, data: Any = None) -> str:
    """With ``calibration: auto`` and too few of the ``n`` calibration origins (or a lookback too
    short), the one line saying that the run goes on without calibration, why and how to get it;
    '' otherwise."""
    reason = too_few(n, evaluation, data)
    if not reason or mode(evaluation) != "auto":
        return ""
    why = reason.removeprefix("calibration on: ").split("; ")[0]
    return (f"calibration auto: {why}: going on without calibration (no finetuned_calibrated, ensemble or aci, "
            "and the model carries no calibrator); to get it, widen val_time_range, lower calibration_min_origins "
            "or raise lookback_window as the case needs (calibration on refuses instead)")

