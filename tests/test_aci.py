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


def test_coverage_by_tercile_quarter_and_the_recovery_after_the_break():
    """weather.measure on the same break: coverage by volatility tercile and quarter recomputed
    by hand, the break found at the first date of the doubled volatility, ACI's rolling coverage
    back within 0.05 of 0.80 while split conformal's is not."""
    from kronos_mlflow.evaluation import scores as sc, weather as wx

    rng = np.random.default_rng(2)
    vh, vy, vl, _, _ = _days(rng, 60, 10, 0.01, 0)
    ch, cy, cl, cdays, cbars = _days(rng, 40, 10, 0.01, 100)  # calm test dates, then the break
    bh, by, bl, bdays, bbars = _days(rng, 60, 10, 0.025, 140)
    th, ty, tl = np.concatenate([ch, bh]), np.concatenate([cy, by]), np.concatenate([cl, bl])
    days, bars = np.concatenate([cdays, bdays]), np.concatenate([cbars, bbars])
    cal = cb.fit(vl, vh[:, -1], histvol_sigma(vh), vy, np.full(len(vy), 0.5))
    u = pr.uniforms(0, ty.shape)

    def scored(levels):
        dist = {"levels": levels, "mean": levels[:, 6], "crps_steps": np.full(ty.shape, np.nan),
                "pit": pr.pit_from_quantiles(levels, ty, u), "p_up": np.full(len(ty), 0.5)}
        return sc.distribution_scores(dist, th, ty)

    split = cal.quantiles(tl, th[:, -1], histvol_sigma(th))
    adaptive, _ = aci.run(aci.scores(vl, vh[:, -1], histvol_sigma(vh), vy), tl, th[:, -1], histvol_sigma(th), ty,
                          days, bars, step=0.05)
    per = {"finetuned_calibrated": scored(split), "aci": scored(adaptive)}
    prefixes = {"finetuned_calibrated": "calibrated_test_", "aci": "aci_test_"}
    metrics, tags, weather = wx.measure(per, days, th, ty, prefixes)
    assert tags["vol_change_date"] == str(bdays[0])[:10]
    tercile = wx.terciles(histvol_sigma(th))
    for k in (1, 2, 3):
        inside = pr.coverage(adaptive, ty, 80)[tercile == k].mean()
        assert metrics[f"aci_test_coverage_80_vol{k}"] == pytest.approx(inside, rel=1e-12)
    assert "aci_test_coverage_80_2024q2" in metrics and "calibrated_test_pit_ks_vol3" in metrics
    assert 0 <= metrics["aci_test_recovery_dates"] < 40
    assert "calibrated_test_recovery_dates" not in metrics  # split conformal never comes back
    fig = wx.coverage_figure(weather, "synthetic")
    assert len(fig.axes) == 2
