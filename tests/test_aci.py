"""Adaptive conformal inference (docs/calibration.md#bands-that-adapt-aci): after the volatility
doubles, split-conformal bands fit on calm validation under-cover while ACI's come back to the
nominal coverage; its levels on a date read only outcomes known by that date."""

from __future__ import annotations

import numpy as np
import pytest

from kronos_mlflow.evaluation import aci, calibration as cb, probabilistic as pr
from kronos_mlflow.serving.forecasting.quantiles import histvol_sigma

H = 3


def _days(rng, n_days: int, per_day: int, sigma: float, start: int):
    n = n_days * per_day
    history = 100.0 * np.exp(np.cumsum(rng.normal(0, 0.01, (n, 30)), axis=1))  # a calm lookback
    last = history[:, -1]
    truth = last[:, None] * np.exp(np.cumsum(rng.normal(0, sigma, (n, H)), axis=1))
    z = np.array([-1.645, -1.282, -0.842, -0.674, -0.524, -0.253, 0.0, 0.253, 0.524, 0.674, 0.842, 1.282, 1.645])
    levels = last[:, None, None] * np.exp(0.01 * z[None, :, None] * np.sqrt(np.arange(1, H + 1))[None, None, :])
    days = np.datetime64("2024-01-01") + np.repeat(np.arange(start, start + n_days), per_day).astype("timedelta64[D]")
    bars = days[:, None] + np.arange(1, H + 1)[None, :].astype("timedelta64[D]")
    return history, truth, levels, days, bars


def test_aci_recovers_the_coverage_split_conformal_loses_after_a_break():
    rng = np.random.default_rng(0)
    vh, vy, vl, _, _ = _days(rng, 60, 10, 0.01, 0)
    th, ty, tl, days, bars = _days(rng, 200, 10, 0.02, 100)  # the volatility doubled
    cal = cb.fit(vl, vh[:, -1], histvol_sigma(vh), vy, np.full(len(vy), 0.5))
    split = cal.quantiles(tl, th[:, -1], histvol_sigma(th))
    v_scores = aci.scores(vl, vh[:, -1], histvol_sigma(vh), vy)
    levels, used = aci.run(v_scores, tl, th[:, -1], histvol_sigma(th), ty, days, bars, step=0.05)
    late = days >= days[len(days) // 2]
    split_80, aci_80 = pr.coverage(split, ty, 80), pr.coverage(levels, ty, 80)
    assert split_80[late].mean() < 0.6
    assert abs(aci_80[late].mean() - 0.8) < 0.05, aci_80[late].mean()
    # the first date's bands use the nominal levels: nothing was known yet
    first = days == days[0]
    np.testing.assert_allclose(used[first][:, 1], 0.2, atol=1e-12)
    np.testing.assert_allclose(levels[first], split[first], rtol=1e-12)


def test_a_level_reads_only_outcomes_known_by_its_date():
    """Changing the outcomes of every bar after a date leaves the bands of that date's origins
    and of every earlier one unchanged."""
    rng = np.random.default_rng(1)
    vh, vy, vl, _, _ = _days(rng, 30, 5, 0.01, 0)
    th, ty, tl, days, bars = _days(rng, 40, 5, 0.02, 100)
    v_scores = aci.scores(vl, vh[:, -1], histvol_sigma(vh), vy)
    cut = days[len(days) // 2]
    changed = np.where(bars > cut, ty * 3.0, ty)
    a, _ = aci.run(v_scores, tl, th[:, -1], histvol_sigma(th), ty, days, bars, step=0.05)
    b, _ = aci.run(v_scores, tl, th[:, -1], histvol_sigma(th), changed, days, bars, step=0.05)
    upto = days <= cut
    np.testing.assert_array_equal(a[upto], b[upto])
    assert not np.allclose(a[~upto], b[~upto])
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(a, b)
