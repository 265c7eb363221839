"""The scorecard's probabilistic skill and fev's summaries, recomputed by hand: WQL, the 10-90%
coverage, fev's geometric-mean skill and win rate, MASE by horizon and the direction baseline
from ``evaluation/forecasts.parquet`` plus the lookback closes read from the raw Qlib files;
the fair CRPS against a direct double loop; a date bootstrap against an origin bootstrap on a
constructed case; no test origin forecasting validation's bars."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_forecast_eval import _raw_origins, _tiny_pair

from kronos_mlflow.evaluation import scores as sc

LEVELS = [round(0.1 * i, 1) for i in range(1, 10)]
QCOLS = [f"q{level:.1f}" for level in LEVELS]
ALL_LEVELS = [0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95]
ALL_QCOLS = [f"q{level:g}" for level in ALL_LEVELS]


@pytest.fixture(scope="module")
def scored(tmp_path_factory, monkeypatch_module):
    """A scorecard of two different tiny pairs on the demo market, its artifacts written."""
    from kronos_mlflow.data import provide_qlib_data
    from kronos_mlflow.evaluation.scorecard import score_forecasters, write_artifacts
    from tiny_runs import isolated_vars, tiny_config

    tmp = tmp_path_factory.mktemp("scorecard")
    for name, value in isolated_vars(tmp).items():
        monkeypatch_module.setenv(name, value)
    # the calibrator on 60 validation origins (calibration_min_origins: 30)
    config = tiny_config(tmp, n_eval_windows=400, inference_sample_count=4, eval_horizons="1,3,5",
                         n_val_skill_windows=60)
    provide_qlib_data(config)
    card = score_forecasters(config, {"finetuned": _tiny_pair(1), "zeroshot": _tiny_pair(2)})
    write_artifacts(card, tmp / "evaluation")
    return config, card, pd.read_parquet(tmp / "evaluation" / "forecasts.parquet")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _by_forecaster(frame: pd.DataFrame, config) -> dict[str, dict[str, np.ndarray]]:
    """Per forecaster: actual, mean, deciles as (origins, steps[, 9]) arrays, in origin order,
    with the lookback closes of each origin from the raw Qlib files."""
    horizon = config["predict_window"]
    raw = {(s, str(d)): past for s, d, past, _ in _raw_origins(config)}
    out = {}
    for name, rows in frame.groupby("forecaster", sort=False):
        rows = rows.sort_values(["datetime", "instrument", "step"], kind="stable")
        keys = rows[rows["step"] == 1][["instrument", "datetime"]]
        past = np.stack([raw[(s, str(pd.Timestamp(d).date()))] for s, d in keys.itertuples(index=False)])
        out[name] = {"actual": rows["actual"].to_numpy().reshape(-1, horizon),
                     "mean": rows["mean"].to_numpy().reshape(-1, horizon),
                     "q": rows[QCOLS].to_numpy().reshape(-1, horizon, 9), "past": past,
                     "dates": keys["datetime"].to_numpy()}
    return out


def test_forecasts_parquet_has_a_row_per_origin_forecaster_and_step(scored):
    config, card, frame = scored
    n, horizon = int(card.metrics["eval_origins"]), config["predict_window"]
    assert list(frame.columns[:7]) == ["datetime", "instrument", "forecaster", "step", "actual", "mean", "median"]
    assert list(frame.columns[7:]) == ALL_QCOLS + ["pit", "p_up"]
    assert set(frame["forecaster"]) == {"finetuned", "zeroshot", "persistence", "histvol", "finetuned_calibrated",
                                        "ensemble", "aci"}
    assert len(frame) == 7 * n * horizon and set(frame["step"]) == set(range(1, horizon + 1))
    assert (frame["median"] == frame["q0.5"]).all()
    naive = frame[frame["forecaster"] == "persistence"]
    assert (naive[QCOLS].to_numpy() == naive[["mean"]].to_numpy()).all(), "persistence's deciles are its forecast"
    assert (np.diff(frame[ALL_QCOLS].to_numpy(), axis=1) >= -1e-9).all(), "quantiles ascend"


def test_every_new_number_is_recomputed_from_the_saved_forecasts(scored):
    config, card, frame = scored
    m = card.metrics
    per = _by_forecaster(frame, config)
    mase = {}
    for name, prefix in (("finetuned", "test_"), ("zeroshot", "zeroshot_test_"), ("persistence", "persistence_test_")):
        f = per[name]
        y, q, past = f["actual"], f["q"], f["past"]
        scale = np.abs(np.diff(past, axis=1)).mean(axis=1)
        levels = np.array(LEVELS)
        diff = y[:, :, None] - q
        wql = np.mean([2 * np.maximum(lv * diff[..., i], (lv - 1) * diff[..., i]).sum() / np.abs(y).sum()
                       for i, lv in enumerate(levels)])
        assert m[f"{prefix}wql_close"] == pytest.approx(wql, rel=1e-9)
        covered = ((y >= q[..., 0]) & (y <= q[..., -1])).mean()
        assert m[f"{prefix}coverage_80"] == pytest.approx(covered, rel=1e-12)
        step_err = np.abs(f["mean"] - y) / scale[:, None]
        for k in (1, 3, 5):
            assert m[f"{prefix}mase_close_h{k}"] == pytest.approx(step_err[:, k - 1].mean(), rel=1e-9)
        mase[name] = step_err.mean(axis=1)
        assert m[f"{prefix}mase_close"] == pytest.approx(mase[name].mean(), rel=1e-9)
    for base in ("zeroshot", "persistence"):
        ratio = np.clip(mase["finetuned"] / mase[base], 0.01, 100)
        assert m[f"gm_skill_vs_{base}"] == pytest.approx(1 - np.exp(np.log(ratio).mean()), rel=1e-9)
        wins = (mase["finetuned"] < mase[base]).mean() + 0.5 * (mase["finetuned"] == mase[base]).mean()
        assert m[f"win_rate_vs_{base}"] == pytest.approx(wins, rel=1e-12)
        assert m[f"wql_skill_vs_{base}"] == pytest.approx(1 - m["test_wql_close"] / m[f"{'zeroshot_' if base == 'zeroshot' else 'persistence_'}test_wql_close"], rel=1e-9)
        for kind in ("skill", "wql_skill", "gm_skill"):
            name = f"{kind}_vs_{base}"
            assert m[f"{name}_ci_low"] <= m[name] + 1e-12 and m[name] <= m[f"{name}_ci_high"] + 1e-12, name
        assert card.tags[f"verdict_wql_vs_{base}"] in ("better", "worse", "inconclusive")
    actual_sign = np.sign(per["persistence"]["actual"][:, -1] - per["persistence"]["past"][:, -1])
    actual_sign = actual_sign[actual_sign != 0]
    assert m["direction_baseline"] == pytest.approx(max((actual_sign > 0).mean(), (actual_sign < 0).mean()))
    assert m["test_direction_accuracy_ci_low"] <= m["test_direction_accuracy"] <= m["test_direction_accuracy_ci_high"]
    assert "test_rank_icir" in m or "test_rank_ic" not in m


def test_no_test_origin_forecasts_a_bar_of_validation(scored):
    """``lookback_window: 20`` on the demo market: test_time_range starts inside validation,
    so some origins are left out, and none that stays forecasts a validation bar."""
    config, card, frame = scored
    val_end = pd.Timestamp(config["val_time_range"][1])
    from kronos_mlflow.evaluation.origins import forecast_origins

    origins = forecast_origins({**config, "n_eval_windows": 10**6})
    _, future = origins.times(np.arange(len(origins)))
    assert (future[:, 0] > np.datetime64(val_end)).all()
    assert origins.in_validation > 0 and "left out" in card.description


def test_fair_crps_is_the_direct_double_sum():
    rng = np.random.default_rng(3)
    paths, history, actual = rng.normal(10, 1, (7, 5, 4)), rng.normal(10, 1, (7, 12)), rng.normal(10, 1, (7, 4))
    got = sc.origin_scores(paths, history, actual)["crps"]
    for o in range(7):
        steps = []
        for h in range(4):
            x, y, s = paths[o, :, h], actual[o, h], paths.shape[1]
            spread = sum(abs(x[i] - x[j]) for i in range(s) for j in range(s) if i != j) / (2 * s * (s - 1))
            steps.append(np.mean(np.abs(x - y)) - spread)
        assert got[o] == pytest.approx(np.mean(steps) / (history[o].std() + 1e-5), rel=1e-12)
    one = sc.origin_scores(paths[:, :1], history, actual)["crps"]  # one path: the absolute error
    assert one == pytest.approx(np.abs(paths[:, 0] - actual).mean(axis=1) / (history.std(axis=1) + 1e-5))


def test_a_date_bootstrap_is_wider_than_an_origin_bootstrap_when_a_date_moves_together():
    """50 dates x 20 symbols; each date's errors share one shock. Resampling origins treats
    1,000 draws as independent and gives a far narrower interval than resampling dates."""
    rng = np.random.default_rng(0)
    dates = np.repeat(np.arange(50), 20)
    shock = rng.normal(0, 0.5, 50)[dates]
    model = np.exp(shock + rng.normal(0, 0.05, dates.size))
    base = np.exp(rng.normal(0, 0.05, dates.size)) * 1.05
    by_origin, by_date = sc.skill(model, base), sc.skill(model, base, dates)
    assert by_origin[0] == pytest.approx(by_date[0])
    width = lambda s: s[2] - s[1]  # noqa: E731
    assert width(by_date) > 2 * width(by_origin)
    # every origin its own group: the same interval as the origin bootstrap
    same = sc.skill(model, base, np.arange(dates.size))
    assert same[1] == pytest.approx(by_origin[1], rel=1e-9) and same[2] == pytest.approx(by_origin[2], rel=1e-9)
    low, high = sc.mean_interval(shock, dates)
    narrow = sc.mean_interval(shock)
    assert (high - low) > 2 * (narrow[1] - narrow[0]) and math.isfinite(low)


def test_a_test_range_inside_validation_is_refused_in_one_line_before_any_forecast(scored, capsys):
    """Every test origin forecasting validation's bars: the check every front door makes before
    forecasting (``kronos-mlflow evaluate`` and its ``--check``, a predictor run, the pipeline)
    refuses, naming why."""
    from kronos_mlflow.errors import UserError
    from kronos_mlflow.training.preflight import check_scorecard

    config, _, _ = scored
    inside = {**config, "val_time_range": [config["val_time_range"][0], config["test_time_range"][1]]}
    with pytest.raises(UserError, match="inside val_time_range .* which chose the checkpoint"):
        check_scorecard(inside)


def test_the_backtest_signal_is_forecast_on_its_own_days(scored):
    """``backtest_signal_stride`` k: the pairs forecast every symbol on every k-th day of the
    test range (all of them, beside the scorecard's thinned origins); greedy forecasts of an
    origin both share are the same; 0 keeps the scorecard's origins."""
    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.evaluation.origins import forecast_origins, signal_origins
    from kronos_mlflow.evaluation.scorecard import score_forecasters

    base, _, _ = scored
    # the first half of the test range: every origin of it is forecast once more below
    test_range = [base["test_time_range"][0], "2024-12-31"]
    config = load_config({**base, "backtest_signal_stride": 20, "eval_stride": 20, "inference_top_k": 1, "inference_sample_count": 1,
                          "n_eval_windows": 60, "calibration": "off", "test_time_range": test_range})
    card = score_forecasters(config, {"finetuned": _tiny_pair(1), "zeroshot": _tiny_pair(2)})
    daily, origins = signal_origins(config), forecast_origins(config)
    signal = card.signals["finetuned"]
    assert len(signal) == len(daily) == card.metrics["backtest_signal_origins"] > len(origins)
    assert set(daily.positions % 20) == {0} and len(np.unique(daily.positions)) > len(np.unique(origins.positions))
    assert signal.index.equals(daily.index()) and set(card.signal_seconds) == {"finetuned", "zeroshot"}
    assert card.signal_description.startswith(f"{len(daily):,} origins on ")
    # the scorecard's origins are among the signal's (eval_stride 20) and are not forecast again
    assert card.metrics["backtest_signal_forecasts"] == len(daily) - len(origins)
    assert card.signal_description.endswith(f", {len(daily) - len(origins):,} forecast for it")
    own = card.origins.set_index(["datetime", "instrument"])["finetuned_forecast_return"]
    shared = own.index.intersection(signal.index)
    assert len(shared) > 0
    np.testing.assert_allclose(signal.loc[shared, "score"].to_numpy(), own.loc[shared].to_numpy(), rtol=1e-6)
    # greedy forecasts: an origin forecast for the signal alone equals the scorecard's forecast of it
    alone = load_config({**config, "n_eval_windows": 10**6})
    full = score_forecasters(alone, {"finetuned": _tiny_pair(1)})
    every = full.origins.set_index(["datetime", "instrument"])["finetuned_forecast_return"]
    np.testing.assert_allclose(signal["score"].to_numpy(), every.loc[signal.index].to_numpy(), rtol=1e-5, atol=1e-7)
    same = score_forecasters(load_config({**config, "backtest_signal_stride": 0}), {"finetuned": _tiny_pair(1)})
    assert same.signals["finetuned"].index.equals(forecast_origins(config).index())
    assert not same.signal_description and "backtest_signal_origins" not in same.metrics


def test_coverage_pit_brier_and_histvol_are_recomputed_from_the_saved_forecasts(scored):
    """Coverage at 50/80/90 (and by step), the PIT's KS distance, the Brier score of p_up and
    its skill against the base rate, for each forecaster, from ``forecasts.parquet``; histvol's
    quantiles and mean from the raw Qlib closes alone (sigma of the last 20 log returns)."""
    from scipy.stats import kstest, norm

    config, card, frame = scored
    m = card.metrics
    horizon = config["predict_window"]
    raw = {(s, str(d)): past for s, d, past, _ in _raw_origins(config)}
    prefixes = {"finetuned": "test_", "zeroshot": "zeroshot_test_", "histvol": "histvol_test_",
                "finetuned_calibrated": "calibrated_test_", "persistence": "persistence_test_",
                "ensemble": "ensemble_test_", "aci": "aci_test_"}
    for name, prefix in prefixes.items():
        rows = frame[frame["forecaster"] == name].sort_values(["datetime", "instrument", "step"], kind="stable")
        y = rows["actual"].to_numpy().reshape(-1, horizon)
        q = rows[ALL_QCOLS].to_numpy().reshape(-1, horizon, len(ALL_QCOLS))
        for nominal, (lo, hi) in {50: (3, 9), 80: (1, 11), 90: (0, 12)}.items():
            inside = (y >= q[..., lo]) & (y <= q[..., hi])
            assert m[f"{prefix}coverage_{nominal}"] == pytest.approx(inside.mean(), rel=1e-12), (name, nominal)
            if nominal == 80:
                for k in (1, 3, 5):
                    assert m[f"{prefix}coverage_80_h{k}"] == pytest.approx(inside[:, k - 1].mean(), rel=1e-12)
        pit = rows["pit"].to_numpy()
        assert ((pit >= 0) & (pit <= 1)).all()
        assert m[f"{prefix}pit_ks"] == pytest.approx(kstest(pit, "uniform").statistic, rel=1e-12)
        keys = rows[rows["step"] == 1][["instrument", "datetime"]]
        last = np.array([raw[(s, str(pd.Timestamp(d).date()))][-1] for s, d in keys.itertuples(index=False)])
        up = (y[:, -1] > last).astype(float)
        p_up = rows[rows["step"] == 1]["p_up"].to_numpy()
        if name == "persistence":
            assert np.isnan(p_up).all() and f"{prefix}brier_up" not in m, "one path states no probability"
            continue
        brier = np.mean((p_up - up) ** 2)
        assert m[f"{prefix}brier_up"] == pytest.approx(brier, rel=1e-12)
        reference = np.mean((m["base_rate_up"] - up) ** 2)
        assert m["base_rate_test_brier_up"] == pytest.approx(reference, rel=1e-12)
        assert m[f"{prefix}brier_skill_up"] == pytest.approx(1 - brier / reference, rel=1e-9)
    # histvol from the raw closes: log-normal around the origin's close, sigma of 20 log returns
    rows = frame[frame["forecaster"] == "histvol"].sort_values(["datetime", "instrument", "step"], kind="stable")
    keys = rows[rows["step"] == 1][["instrument", "datetime"]]
    past = np.stack([raw[(s, str(pd.Timestamp(d).date()))] for s, d in keys.itertuples(index=False)])
    sigma = np.diff(np.log(past[:, -21:]), axis=1).std(axis=1, ddof=1)
    h = np.arange(1, horizon + 1)
    z = norm.ppf(ALL_LEVELS)
    expected = past[:, -1, None, None] * np.exp(sigma[:, None, None] * np.sqrt(h)[None, :, None] * z[None, None, :])
    got = rows[ALL_QCOLS].to_numpy().reshape(-1, horizon, len(ALL_QCOLS))
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    mean = past[:, -1, None] * np.exp(sigma[:, None] ** 2 * h[None, :] / 2)
    np.testing.assert_allclose(rows["mean"].to_numpy().reshape(-1, horizon), mean, rtol=1e-9)
    assert card.tags["verdict_wql_vs_histvol"] in ("better", "worse", "inconclusive")
    assert m["wql_skill_vs_histvol"] == pytest.approx(1 - m["test_wql_close"] / m["histvol_test_wql_close"], rel=1e-9)


def test_histvol_crps_is_the_closed_form_log_normal_crps():
    """The closed form against scoringrules' reference and against a Monte Carlo estimate."""
    import scoringrules

    from kronos_mlflow.evaluation.probabilistic import lognormal_crps

    rng = np.random.default_rng(3)
    y, mu, s = rng.lognormal(0.0, 0.3, 50), rng.normal(0.0, 0.1, 50), rng.uniform(0.01, 0.5, 50)
    np.testing.assert_allclose(lognormal_crps(y, mu, s), scoringrules.crps_lognormal(y, mu, s), rtol=1e-9)
    draws = np.exp(mu[0] + s[0] * rng.standard_normal(200_000))
    mc = np.abs(draws - y[0]).mean() - 0.5 * np.abs(draws - rng.permutation(draws)).mean()
    assert lognormal_crps(y[:1], mu[:1], s[:1])[0] == pytest.approx(mc, rel=0.02)


def test_the_pictures_and_the_calibrator_are_written(scored, tmp_path):
    import json

    from kronos_mlflow.evaluation.calibration import Calibrator
    from kronos_mlflow.evaluation.scorecard import write_artifacts

    _, card, _ = scored
    written = {p.name for p in write_artifacts(card, tmp_path)}
    assert {"pit.png", "reliability.png", "calibrator.json", "ensemble.json", "ensemble.png", "coverage.png"} <= written
    for name in ("pit.png", "reliability.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "calibrator.json").read_text())
    assert data["origins"] == card.metrics["calibration_origins"] >= 30
    from kronos_mlflow.serving.forecasting import calibrator_file

    again = calibrator_file.from_json(data)
    np.testing.assert_array_equal(again.score_quantiles, card.calibrator.score_quantiles)


def test_the_scorecard_says_origins_done_of_total_per_forecaster(scored, capsys, monkeypatch):
    """A log file (stderr not a terminal) gets, per Kronos forecaster, its start and origins done
    of total with a rate and an ETA (a line each KRONOS_PROGRESS_SECONDS: here every batch)."""
    import re

    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.runtime.console import Console
    from kronos_mlflow.evaluation.scorecard import score_forecasters

    base, _, _ = scored
    config = load_config({**base, "n_eval_windows": 60, "inference_sample_count": 1, "calibration": "off",
                          "backtest_signal_stride": 0, "batch_size": 16})
    monkeypatch.setenv("KRONOS_PROGRESS_SECONDS", "1e-9")
    capsys.readouterr()
    card = score_forecasters(config, {"finetuned": _tiny_pair(1), "zeroshot": _tiny_pair(2)}, console=Console(True))
    out = capsys.readouterr().out
    n = int(card.metrics["eval_origins"])
    for name in ("finetuned", "zeroshot"):
        assert f"[kronos] scorecard: {name}: forecasting {n:,} origins\n" in out
        done = [int(d) for d, total in re.findall(rf"^\[kronos\] scorecard: {name}: (\d+)/(\d+) origins, \S+ "
                                                  r"origins/s, ETA \S+$", out, flags=re.MULTILINE) if int(total) == n]
        assert done == [min(k, n) for k in range(16, n + 16, 16)], out


def test_the_ensemble_is_fit_on_validation_alone_and_judged_against_each_member(scored):
    """The ensemble's weights (greedy selection on the calibration origins) sum to 1, its
    validation WQL is no worse than its best member's, it is scored on test with a verdict against
    every other forecaster; then every test outcome is changed: the test score changes, every
    fitted weight and the ensemble's calibrator stay the same."""
    from test_forecast_eval import _tiny_pair

    from kronos_mlflow.evaluation import ensemble as en, probabilistic as pr
    from kronos_mlflow.evaluation.origins import CLOSE, forecast_origins
    from kronos_mlflow.evaluation.scorecard import PREFIXES, _calibrate

    config, card, _ = scored
    m = card.metrics
    weights = {name: m[f"ensemble_weight_{name}"] for name in en.MEMBERS}
    assert weights == card.ensemble.weights and sum(weights.values()) == pytest.approx(1.0)
    assert all(round(w * m["ensemble_rounds"]) == pytest.approx(w * m["ensemble_rounds"]) for w in weights.values())
    assert m["validation_wql_ensemble"] <= min(m[f"validation_wql_{name}"] for name in en.MEMBERS) * (1 + 1e-9)
    for name in ("finetuned", "zeroshot", "persistence", "histvol", "finetuned_calibrated"):
        assert card.tags[f"verdict_wql_ensemble_vs_{name}"] in ("better", "worse", "inconclusive")
        assert m[f"wql_skill_ensemble_vs_{name}"] == pytest.approx(
            1 - m["ensemble_test_wql_close"] / m[f"{PREFIXES[name]}wql_close"], rel=1e-9)
    origins = forecast_origins(config)
    every = np.arange(len(origins))
    history, actual = origins.history(every)[..., CLOSE], origins.future(every)[..., CLOSE]
    u = pr.uniforms(int(config["seed"]), actual.shape)
    paths = history[:, -1, None, None] * np.exp(np.random.default_rng(0).normal(0, 0.01, (len(origins), 4,
                                                                                        actual.shape[1])))
    fitted = []
    for outcome in (actual, actual[::-1] * 1.5):
        per = {"finetuned": sc.origin_scores(paths, history, outcome, u)}
        out, _ = _calibrate(config, {"finetuned": _tiny_pair(1)}, origins, per, history, outcome, u, rank=0,
                            world_size=1, console=None)
        fitted.append((out["ensemble"], sc.wql(per["ensemble"])))
    (first, wql_a), (second, wql_b) = fitted
    assert wql_a != pytest.approx(wql_b), "the test outcome changed the test score"
    assert first.weights == second.weights == card.ensemble.weights
    np.testing.assert_array_equal(first.calibrator.score_quantiles, second.calibrator.score_quantiles)
    np.testing.assert_array_equal(first.calibrator.score_quantiles, card.ensemble.calibrator.score_quantiles)


def test_a_logged_models_calibrator_and_ensemble_are_scored_as_given(scored):
    """As ``evaluate`` scores a logged model: its own calibrator and ensemble (fit before the test
    range), the ensemble scored and judged, ACI on the validation scores the ensemble kept."""
    from dataclasses import replace

    from test_forecast_eval import _tiny_pair

    from kronos_mlflow.evaluation.origins import forecast_origins
    from kronos_mlflow.evaluation.scorecard import score_forecasters

    config, card, _ = scored
    test = forecast_origins(config)
    keep = np.arange(len(test)) < 20
    part = replace(test, rows=test.rows[keep], series=test.series[keep], positions=test.positions[keep],
                   dates=test.dates[keep], candidates=int(keep.sum()))
    given = score_forecasters(config, {"finetuned": _tiny_pair(1)}, origins=part, calibrator=card.calibrator,
                              ensemble=card.ensemble)
    assert given.tags["calibration"] == "model"
    assert {"ensemble_test_wql_close", "aci_test_wql_close", "calibrated_test_coverage_80"} <= set(given.metrics)
    assert given.tags["verdict_wql_ensemble_vs_histvol"] in ("better", "worse", "inconclusive")
    assert given.ensemble is card.ensemble
