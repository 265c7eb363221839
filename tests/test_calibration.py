"""The calibrated forecaster (docs/calibration.md): conformal quantiles fit on calibration
origins restore the nominal coverage of a forecaster whose paths are half as wide as the truth,
leave an already calibrated one's width alone, recalibrate an overconfident ``p_up``; the
calibrator is JSON and a bad one is refused in one line; calibration origins never reach the test
range, even with adjacent ranges; too few of them is a refusal before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kronos_mlflow.errors import UserError
from kronos_mlflow.evaluation import calibration as cb, probabilistic as pr
from kronos_mlflow.serving.forecasting import calibrator_file
from kronos_mlflow.serving.forecasting.quantiles import Calibrator, histvol_sigma

H, LOOKBACK, PATHS = 5, 30, 40


def _market(rng, n: int, width: float):
    """``n`` exchangeable origins: a lookback random walk of per-origin volatility ``sigma``, the
    truth ``log(y_h / c_L) ~ N(0, sigma^2 h)``, and ``PATHS`` sample paths drawn with volatility
    ``width * sigma`` (a slight upward drift of both, so that p_up carries some signal)."""
    sigma = rng.uniform(0.005, 0.03, n)
    steps = rng.standard_normal((n, LOOKBACK - 1)) * sigma[:, None]
    history = 100.0 * np.exp(np.concatenate([np.zeros((n, 1)), np.cumsum(steps, axis=1)], axis=1))
    last = history[:, -1]
    drift = rng.normal(0.0, 1.0, n) * sigma  # known to the forecaster: p_up has signal
    h = np.arange(1, H + 1)
    truth = last[:, None] * np.exp(drift[:, None] * h + np.cumsum(rng.standard_normal((n, H)), axis=1) * sigma[:, None])
    noise = np.cumsum(rng.standard_normal((n, PATHS, H)), axis=2) * (width * sigma)[:, None, None]
    paths = last[:, None, None] * np.exp(drift[:, None, None] * h + noise)
    return history, truth, paths


def _fit_and_apply(width: float, seed: int = 0, n: int = 3000):
    rng = np.random.default_rng(seed)
    cal_h, cal_y, cal_p = _market(rng, n, width)
    test_h, test_y, test_p = _market(rng, n, width)
    u_cal, u_test = pr.uniforms(1, cal_y.shape), pr.uniforms(2, test_y.shape)
    raw_cal = pr.from_paths(cal_p, cal_h[:, -1], cal_y, u_cal)
    cal = cb.fit(raw_cal["levels"], cal_h[:, -1], histvol_sigma(cal_h), cal_y, raw_cal["p_up"])
    raw = pr.from_paths(test_p, test_h[:, -1], test_y, u_test)
    raw["mean"] = test_p.mean(axis=1)
    out = cb.calibrated(cal, raw, test_h[:, -1], histvol_sigma(test_h), test_y, u_test)
    return cal, raw, out, test_h, test_y


def test_paths_half_as_wide_as_the_truth_cover_each_nominal_level_after_calibration():
    _, raw, out, test_h, y = _fit_and_apply(width=0.5)
    for nominal in (50, 80, 90):
        before = pr.coverage(raw["levels"], y, nominal).mean()
        after = pr.coverage(out["levels"], y, nominal).mean()
        assert before < nominal / 100 - 0.15, (nominal, before)
        assert abs(after - nominal / 100) <= 0.05, (nominal, after)
    # the median is kept, the quantiles stay in order, the PIT becomes close to uniform
    np.testing.assert_array_equal(out["levels"][:, pr.MEDIAN], raw["levels"][:, pr.MEDIAN])
    assert (np.diff(out["levels"], axis=1) >= 0).all()
    assert pr.ks_distance(out["pit"]) < 0.08 and pr.ks_distance(raw["pit"]) > 0.15


def test_an_already_calibrated_forecaster_keeps_its_width_within_ten_percent():
    _, raw, out, _, y = _fit_and_apply(width=1.0, seed=1)
    lo, hi = pr.COVERAGES[80]
    before = (raw["levels"][:, hi] - raw["levels"][:, lo]).mean()
    after = (out["levels"][:, hi] - out["levels"][:, lo]).mean()
    assert abs(after / before - 1) <= 0.10, after / before
    assert abs(pr.coverage(out["levels"], y, 80).mean() - 0.8) <= 0.05


def test_an_overconfident_p_up_is_recalibrated_by_isotonic_regression():
    """A p_up pushed to the extremes (the true probability's logit tripled) gets a lower Brier
    score on fresh origins after calibration, and keeps its order."""
    rng = np.random.default_rng(5)

    def draw(n):
        truth = rng.uniform(0.05, 0.95, n)
        logit = np.log(truth / (1 - truth)) * 3
        return 1 / (1 + np.exp(-logit)), (rng.random(n) < truth).astype(float)

    p_cal, up_cal = draw(4000)
    p_test, up_test = draw(4000)
    n = len(p_cal)
    last = np.full(n, 100.0)
    y = np.where(up_cal[:, None] > 0, 101.0, 99.0) * np.ones((n, H))
    levels = np.repeat(y[:, None, :], len(pr.QLEVELS), axis=1)
    cal = cb.fit(levels, last, np.full(n, 0.01), y, p_cal)
    after = cal.p_up(p_test)
    assert pr.brier(after, up_test) < pr.brier(p_test, up_test) - 0.01
    order = np.argsort(p_test)
    assert (np.diff(after[order]) >= -1e-12).all(), "isotonic keeps the order"


def test_the_calibrator_is_json_and_a_bad_one_is_refused_in_one_line():
    cal, *_ = _fit_and_apply(width=0.5, n=300)
    text = cal.dumps()
    again = calibrator_file.from_json(json.loads(text))
    np.testing.assert_array_equal(again.score_quantiles, cal.score_quantiles)
    np.testing.assert_array_equal(again.up_x, cal.up_x)
    assert again.origins == 300
    for bad in ({}, {**json.loads(text), "score_quantiles": [[1.0]]}, {**json.loads(text), "version": 99},
                {**json.loads(text), "p_up": {"x": [0.1], "y": []}}):
        with pytest.raises(UserError) as err:
            calibrator_file.from_json(bad, source="calibrator.json")
        assert "\n" not in str(err.value) and "calibrator.json" in str(err.value)
    # steps past the fitted horizon grow with sqrt(h / H)
    wide = cal.steps(2 * H)
    np.testing.assert_allclose(wide[:, -1], cal.score_quantiles[:, -1] * np.sqrt(2.0))


def test_the_finite_sample_quantile_is_the_conformal_order_statistic():
    scores = np.arange(1.0, 20.0)  # n = 19: the ceil(0.9 * 20) = 18th smallest
    assert cb.score_quantile(scores, 0.9) == 18.0
    assert cb.score_quantile(np.arange(1.0, 5.0), 0.9) == 4.0  # n too small: the largest


def test_calibration_origins_never_reach_the_test_range_with_adjacent_ranges(tmp_path, monkeypatch):
    """Validation ending the trading day before the test range starts: every calibration
    origin's forecast bars end before the first test forecast bar and before the test range."""
    from tiny_runs import isolated_vars, tiny_config

    from kronos_mlflow.data import provide_qlib_data
    from kronos_mlflow.evaluation.origins import forecast_origins

    for name, value in isolated_vars(tmp_path).items():
        monkeypatch.setenv(name, value)
    base = tiny_config(tmp_path)
    config = {**base, "val_time_range": [base["val_time_range"][0], "2024-03-29"],
              "test_time_range": ["2024-04-01", base["test_time_range"][1]]}
    provide_qlib_data(config)
    test = forecast_origins(config)
    origins = cb.origins_for(config, test)
    assert len(origins) and len(test)
    last_cal = origins.times(np.arange(len(origins)))[1].max()
    first_test = test.times(np.arange(len(test)))[1][:, 0].min()
    assert last_cal < first_test and last_cal < np.datetime64("2024-04-01")
    start, end = cb.time_range(origins)
    assert np.datetime64(end) == last_cal
    # paths already drawn for these origins (objective val_skill's) are fit on, nothing forecast
    from kronos_mlflow.evaluation.scorecard import fit_calibrator

    every = np.arange(len(origins))
    history, actual = origins.history(every)[..., pr.CLOSE], origins.future(every)[..., pr.CLOSE]
    paths = actual[:, None, :] * np.exp(np.random.default_rng(0).normal(0, 0.01, (len(origins), 6, actual.shape[1])))
    fitted = fit_calibrator(None, origins, config, paths=paths)
    raw = pr.from_paths(paths, history[:, -1], actual, pr.uniforms(config["seed"], actual.shape))
    expected = cb.fit(raw["levels"], history[:, -1], histvol_sigma(history), actual, raw["p_up"])
    np.testing.assert_array_equal(fitted.score_quantiles, expected.score_quantiles)


def test_too_few_calibration_origins_is_a_refusal_before_any_forecast(tmp_path, monkeypatch):
    from tiny_runs import isolated_vars, tiny_config

    from kronos_mlflow.data import provide_qlib_data
    from kronos_mlflow.training.preflight import check_scorecard

    for name, value in isolated_vars(tmp_path).items():
        monkeypatch.setenv(name, value)
    config = tiny_config(tmp_path, calibration_min_origins=10**6, calibration="on")
    provide_qlib_data(config)
    with pytest.raises(UserError) as err:
        check_scorecard(config)
    line = str(err.value)
    assert "\n" not in line and "calibration_min_origins 1000000" in line and "calibration off" in line


def test_calibration_auto_with_too_few_origins_goes_on_without_in_one_line(tmp_path, monkeypatch):
    """The default, ``calibration: auto``: the same too few origins pass the check, and the
    scorecard goes on without calibration, in one line saying why and how to get it."""
    from tiny_runs import isolated_vars, tiny_config

    from kronos_mlflow.config.keys import KEY
    from kronos_mlflow.data import provide_qlib_data
    from kronos_mlflow.evaluation.origins import forecast_origins
    from kronos_mlflow.evaluation.scorecard import _calibrate
    from kronos_mlflow.training.preflight import check_scorecard

    assert KEY["calibration"].default == "auto"
    for name, value in isolated_vars(tmp_path).items():
        monkeypatch.setenv(name, value)
    config = tiny_config(tmp_path, calibration_min_origins=10**6, calibration="auto")
    provide_qlib_data(config)
    assert check_scorecard(config) > 0
    origins = forecast_origins(config)
    lines = []

    class Console:
        print = staticmethod(lines.append)

    never = object()  # a predictor that must not be called
    out, seconds = _calibrate(config, {"finetuned": never}, origins, {}, None, None, None, rank=0, world_size=1,
                              console=Console())
    assert out["status"] == "skipped" and out["calibrator"] is None and seconds is None
    (line,) = lines
    assert line.startswith("calibration auto: ") and "fewer than calibration_min_origins 1000000" in line
    assert "going on without calibration" in line and "calibration on refuses" in line and "\n" not in line
    assert check_scorecard({**config, "calibration": "off"}) > 0
