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


def test_levels_carried_from_one_period_to_the_next_are_the_levels_of_one_run_over_both():
    """A walk-forward's folds (docs/walk-forward.md#aci-across-folds): ACI over a first period
    then a second, the second starting at the levels the first ended at, gives the bands of one
    ACI over both periods; started nominal, the second period's first bands differ."""
    rng = np.random.default_rng(3)
    vh, vy, vl, _, _ = _days(rng, 30, 5, 0.01, 0)
    ah, ay, al, adays, abars = _days(rng, 30, 5, 0.02, 100)
    bh, by, bl, bdays, bbars = _days(rng, 30, 5, 0.02, 130 + H)  # its first origin: every outcome of the first known
    v_scores = aci.scores(vl, vh[:, -1], histvol_sigma(vh), vy)
    both, used = aci.run(v_scores, *(np.concatenate(p) for p in ((al, bl), (ah[:, -1], bh[:, -1]))),
                         histvol_sigma(np.concatenate([ah, bh])), np.concatenate([ay, by]),
                         np.concatenate([adays, bdays]), np.concatenate([abars, bbars]), step=0.05)
    state: dict = {}
    first, _ = aci.run(v_scores, al, ah[:, -1], histvol_sigma(ah), ay, adays, abars, step=0.05, state=state)
    np.testing.assert_allclose(state["start"], aci.nominal_levels(H))
    assert state["last_outcome"] == abars.max()
    start = aci.Start(level=state["end"], known_until=state["last_outcome"], source="--aci-start-run r1")
    carried, carried_used = aci.run(v_scores, bl, bh[:, -1], histvol_sigma(bh), by, bdays, bbars, step=0.05,
                                    start=start)
    np.testing.assert_allclose(np.concatenate([first, carried]), both, rtol=1e-12)
    np.testing.assert_allclose(carried_used[0], state["end"], rtol=1e-12)
    assert not np.allclose(state["end"], aci.nominal_levels(H))  # the doubled volatility moved the levels
    nominal, _ = aci.run(v_scores, bl, bh[:, -1], histvol_sigma(bh), by, bdays, bbars, step=0.05)
    assert not np.allclose(nominal[bdays == bdays[0]], carried[bdays == bdays[0]])
    # levels that read an outcome after this period's first origin, or of another horizon, are refused
    from kronos_mlflow.errors import UserError

    late = aci.Start(level=state["end"], known_until=bbars.max(), source="--aci-start-run r1")
    with pytest.raises(UserError, match="read outcomes up to .* after this scorecard's first origin"):
        aci.run(v_scores, bl, bh[:, -1], histvol_sigma(bh), by, bdays, bbars, step=0.05, start=late)
    short = aci.Start(level=state["end"][:, :2], known_until=state["last_outcome"], source="--aci-start-run r1")
    with pytest.raises(UserError, match="levels are for 2 steps; this scorecard forecasts 3"):
        aci.run(v_scores, bl, bh[:, -1], histvol_sigma(bh), by, bdays, bbars, step=0.05, start=short)


def test_the_carried_state_file_is_the_runs_own_or_refused(tracking_env, tmp_path):
    """``evaluation/aci_state.json`` on a real MLflow run: read back as written; a file naming
    another run, another test range, a damaged field or an unfinished run is one line naming it."""
    import json

    from mlflow import MlflowClient

    from kronos_mlflow.errors import UserError
    from kronos_mlflow.evaluation import aci_carry

    client = MlflowClient()
    state = {"start": aci.nominal_levels(H), "end": aci.nominal_levels(H) + 0.01,
             "last_outcome": np.datetime64("2025-02-04T00:00:00")}

    def logged(status="FINISHED", **change):
        run = client.create_run("0")
        rid = run.info.run_id
        client.log_param(rid, "test_time_range", "2024-12-04:2025-02-04")
        data = aci_carry.as_json(state, run_id=rid, test_time_range="2024-12-04:2025-02-04", step=0.01,
                                 start=aci_carry.NOMINAL)
        data.update(change)
        path = tmp_path / rid / aci_carry.FILE
        path.parent.mkdir()
        path.write_text(json.dumps(data))
        client.log_artifact(rid, str(path), "evaluation")
        client.set_terminated(rid, status)
        return rid

    good = logged()
    start = aci_carry.start_from(client, good, tmp_path)
    np.testing.assert_allclose(start.level, state["end"])
    assert start.known_until == np.datetime64("2025-02-04") and aci_carry.describe(start) == good
    assert aci_carry.describe(None) == "nominal"
    for change, needle in (({"run_id": "0" * 32}, "names the run '0000"),
                           ({"test_time_range": "2025-01-01:2025-02-04"}, "says test_time_range '2025-01-01"),
                           ({"end_level": [[0.1] * H] * 5}, "end_level is a list; expected 6 rows"),
                           ({"end_level": [[0.1] * H] * 5 + [["x"] * H]}, r"end_level\[5\]\[0\] is 'x'"),
                           ({"version": 2}, "version is '2'"),
                           ({"last_outcome": "soon"}, "last_outcome is 'soon'")):
        with pytest.raises(UserError, match=needle):
            aci_carry.start_from(client, logged(**change), tmp_path)
    with pytest.raises(UserError, match="the run is FAILED; expected a FINISHED evaluation run"):
        aci_carry.start_from(client, logged("FAILED"), tmp_path)
    with pytest.raises(UserError, match="--aci-start-run"):
        aci_carry.start_from(client, "not-a-run", tmp_path)
    metrics = aci_carry.metrics(state)
    assert metrics == pytest.approx({"aci_start_level_80": 0.2, "aci_end_level_80": 0.21})
