"""Adaptive conformal inference, ``aci`` (Gibbs & Candes 2021), over the test origins in date
order: the split-conformal bands of the scorecard's best conformalised forecaster (the ensemble
where it was built, else the calibrated one), whose level adapts to the outcomes already known.

Per central interval ``j`` (nominal miscoverage ``a_j``) and step ``h`` the level ``a_t`` starts at
``a_j``; the band at ``a_t`` widens the base quantiles by the ``ceil((n + 1)(1 - a_t))``-th smallest
of the ``n`` validation scores (the calibrator's score: the outcome's distance outside the base
interval over the origin's close times its volatility). On each origin date, first every outcome
whose bar lies at or before that date updates the level, ``a <- a + step * mean(a_j - miss)``
over those outcomes (one update per date, ``miss`` 1 where the outcome fell outside its band),
then the date's origins are forecast with the level so reached: no origin's band reads an
outcome not yet known on its date. The step is ``aci_step``
(docs/calibration.md#bands-that-adapt-aci). The served model cannot see outcomes: it keeps the
split-conformal bands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import UserError

from ..serving.forecasting.ensemble import members, mix
from ..serving.forecasting.quantiles import INTERVALS, QLEVELS, floored, histvol_sigma, ordered
from . import probabilistic as pr

ACI = "aci"


def scores(levels: np.ndarray, last_close: np.ndarray, sigma: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """``(n, len(INTERVALS), H)``: the conformal score of each central interval and step (as the
    calibrator's fit computes it)."""
    y = np.asarray(actual, dtype=np.float64)
    width = (np.asarray(last_close, dtype=np.float64) * floored(sigma))[:, None]
    return np.stack([np.maximum(levels[:, lo] - y, y - levels[:, hi]) / width for lo, hi in INTERVALS], axis=1)


def nominal_levels(horizon: int) -> np.ndarray:
    """``(len(INTERVALS), horizon)``: each central interval's nominal miscoverage ``a_j`` at every step."""
    nominal = np.array([1.0 - float(QLEVELS[hi] - QLEVELS[lo]) for lo, hi in INTERVALS])[:, None]
    return np.repeat(nominal, horizon, axis=1).astype(np.float64)


@dataclass(frozen=True)
class Start:
    """Where a scorecard's ACI starts instead of the nominal levels: the levels ``level``
    ``(len(INTERVALS), H)`` an earlier test period ended at (a walk-forward's previous fold),
    which read outcomes up to ``known_until``; ``source`` names it (the run that wrote it)."""

    level: np.ndarray
    known_until: np.datetime64
    source: str


def run(val_scores: np.ndarray, levels: np.ndarray, last_close: np.ndarray, sigma: np.ndarray, actual: np.ndarray,
        origin_times: np.ndarray, bar_times: np.ndarray, step: float, *, start: Start | None = None,
        state: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """ACI's quantiles ``(n, 13, H)`` of base (pre-conformal) quantiles ``levels`` on the test
    origins, and the level ``a_t`` each origin's bands used ``(n, len(INTERVALS), H)``.
    ``val_scores``: the validation scores ``(n_val, len(INTERVALS), H)``; ``origin_times`` ``(n,)``
    each origin's last known bar, ``bar_times`` ``(n, H)`` each forecast bar's time. The levels
    start nominal, or at ``start``'s (refused when it read an outcome after the first origin).
    ``state``, when given, receives ``start`` and ``end`` (the levels once every outcome moved
    them, the first thing the next test period's first date would do) and ``last_outcome``."""
    base = np.asarray(levels, dtype=np.float64)
    y = np.asarray(actual, dtype=np.float64)
    n, _, horizon = base.shape
    nominal = nominal_levels(1)  # (J, 1)
    ordered_scores = np.sort(np.where(np.isfinite(val_scores), val_scores, np.inf), axis=0)  # (n_val, J, H)
    n_val = np.isfinite(ordered_scores).sum(axis=0)  # (J, H)
    width = (np.asarray(last_close, dtype=np.float64) * floored(sigma))  # (n,)
    alpha = _start_levels(start, horizon, origin_times)  # (J, H)
    started_at = alpha.copy()
    used = np.full((n, len(INTERVALS), horizon), np.nan)
    out = np.full(base.shape, np.nan)
    o_times = np.asarray(origin_times).astype("datetime64[ns]")
    b_times = np.asarray(bar_times).astype("datetime64[ns]")
    pending_rows = np.empty(0, dtype=np.int64)  # origins forecast, some outcomes not yet used
    done = np.zeros((n, horizon), dtype=bool)
    miss = np.zeros((n, len(INTERVALS), horizon))
    jj = np.arange(len(INTERVALS))[:, None]
    hh = np.arange(horizon)[None, :]
    last_outcome = None

    def update(alpha, pending_rows, until):
        """The outcomes of ``pending_rows`` known by ``until`` (None: all) move ``alpha`` once."""
        nonlocal last_outcome
        if not pending_rows.size:
            return alpha
        bars = b_times[pending_rows]
        known = ((bars <= until) if until is not None else np.ones(bars.shape, dtype=bool))
        known &= ~done[pending_rows] & np.isfinite(y[pending_rows])  # (p, H)
        if not known.any():
            return alpha
        count = known.sum(axis=0)  # (H,)
        errors = (miss[pending_rows] * known[:, None, :]).sum(axis=0)  # (J, H)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_gap = np.where(count > 0, nominal - errors / np.maximum(count, 1), 0.0)
        done[pending_rows] |= known
        latest = bars[known].max()
        last_outcome = latest if last_outcome is None else max(last_outcome, latest)
        return alpha + float(step) * mean_gap

    for date in np.unique(o_times):
        # 1. the outcomes known on this date update the levels (one step per date)
        alpha = update(alpha, pending_rows, date)
        # 2. the date's origins forecast at the levels reached
        rows = np.flatnonzero(o_times == date)
        rank = np.ceil((n_val + 1) * (1.0 - alpha) - 1e-9).astype(np.int64)  # (J, H)
        index = np.clip(rank, 1, np.maximum(n_val, 1)) - 1
        s_hat = ordered_scores[index, jj, hh]  # (J, H)
        s_hat = np.where(rank <= 0, ordered_scores[0], s_hat)  # a level of 1 or more: the smallest score
        s_hat = np.where(np.isfinite(s_hat), s_hat, 0.0)
        q = base[rows].copy()
        for j, (lo, hi) in enumerate(INTERVALS):
            q[:, lo] = base[rows, lo] - s_hat[j][None, :] * width[rows, None]
            q[:, hi] = base[rows, hi] + s_hat[j][None, :] * width[rows, None]
        q = ordered(q)
        out[rows] = q
        used[rows] = alpha[None]
        for j, (lo, hi) in enumerate(INTERVALS):
            miss[rows, j] = ((y[rows] < q[:, lo]) | (y[rows] > q[:, hi])).astype(np.float64)
        pending_rows = np.concatenate([pending_rows[~done[pending_rows].all(axis=1)], rows])
    if state is not None:  # the next period's first date: every outcome of this one known
        state.update(start=started_at, end=update(alpha, pending_rows, None), last_outcome=last_outcome)
    return out, used


def _start_levels(start: Start | None, horizon: int, origin_times: np.ndarray) -> np.ndarray:
    if start is None:
        return nominal_levels(horizon)
    level = np.asarray(start.level, dtype=np.float64)
    if level.shape != (len(INTERVALS), horizon):
        raise UserError(f"aci start {start.source}: its levels are for {level.shape[-1]} steps; this scorecard "
                        f"forecasts {horizon} (expected a previous period scored with the same predict_window)")
    first = np.asarray(origin_times).astype("datetime64[ns]").min()
    if np.datetime64(start.known_until, "ns") > first:
        raise UserError(f"aci start {start.source}: its levels read outcomes up to {start.known_until}, after this "
                        f"scorecard's first origin {first.astype('datetime64[s]')}; expected an earlier period's")
    return level.copy()


def forecast(val: Mapping[str, np.ndarray], test: Mapping[str, np.ndarray], history_close: np.ndarray,
             actual: np.ndarray, origin_times: np.ndarray, bar_times: np.ndarray, step: float,
             u: np.ndarray, *, start: Start | None = None, state: dict | None = None) -> dict[str, np.ndarray]:
    """ACI's distribution on the test origins, for
    :func:`~kronos_mlflow.evaluation.scores.distribution_scores`: ``val`` the base forecaster's
    pre-conformal ``levels`` on the calibration origins with their ``history`` and ``actual``;
    ``test`` its pre-conformal ``levels``, ``mean`` and calibrated ``p_up`` on the test origins."""

    if "scores" in val:
        v_scores = np.asarray(val["scores"], dtype=np.float64)
    else:
        vc = np.asarray(val["history"], dtype=np.float64)
        v_scores = scores(np.asarray(val["levels"]), vc[:, -1], histvol_sigma(vc), val["actual"])
    c = np.asarray(history_close, dtype=np.float64)
    levels, _ = run(v_scores, np.asarray(test["levels"]), c[:, -1], histvol_sigma(c), actual, origin_times,
                    bar_times, step, start=start, state=state)
    y = np.asarray(actual, dtype=np.float64)
    return {"levels": levels, "mean": np.asarray(test["mean"], dtype=np.float64),
            "crps_steps": np.full(y.shape, np.nan), "pit": pr.pit_from_quantiles(levels, y, u),
            "p_up": np.asarray(test["p_up"], dtype=np.float64)}


def scored_from(keep: Mapping[str, np.ndarray], ensemble, test_raw: Mapping[str, np.ndarray],
                conformal: Mapping[str, np.ndarray], history_close: np.ndarray, actual: np.ndarray, origins,
                step: float, u: np.ndarray, *, start: Start | None = None,
                state: dict | None = None) -> dict[str, np.ndarray] | None:
    """ACI's distribution over the scorecard's test ``origins``, on the base the conformalised
    forecaster ``conformal`` (the ensemble's, else the calibrated one's scores: its mean and
    ``p_up``) widens: the ensemble's mixture (``ensemble``) or the fine-tuned pair's raw quantiles;
    ``keep``: the calibration origins' raw forecasts, closes and outcomes, or, without them, the
    validation scores a logged model's ensemble kept; None with neither. ``start`` and ``state``:
    :func:`run`'s (a walk-forward fold's carried levels, in and out)."""

    fitted_here = bool(keep) and "raw" in keep
    if step <= 0 or not (fitted_here or (ensemble is not None and ensemble.scores is not None)):
        return None
    tc = np.asarray(history_close, dtype=np.float64)

    def base(raw, c):
        if ensemble is None:
            return np.asarray(raw["levels"], dtype=np.float64)
        return mix(members(raw["levels"], raw["mean"], raw["p_up"], c, histvol_sigma(c)), ensemble.weights)["levels"]

    every = np.arange(len(origins))
    past, future = origins.times(every)
    if fitted_here:
        vc = np.asarray(keep["history"], dtype=np.float64)
        val = {"levels": base(keep["raw"], vc), "history": vc, "actual": keep["actual"]}
    else:
        val = {"scores": ensemble.scores}
    return forecast(val, {"levels": base(test_raw, tc), "mean": conformal["mean"], "p_up": conformal["p_up"]},
                    tc, actual, np.asarray(past)[:, -1], future, step, u, start=start, state=state)
