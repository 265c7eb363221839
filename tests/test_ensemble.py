"""The ensemble forecaster (docs/calibration.md#the-ensemble-forecaster-ensemble): greedy
selection with replacement picks the member that fits validation, never ends worse on
validation than its best member, mixes quantiles in order; the fitted ensemble is JSON, read
back exactly, and a damaged one is one line naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kronos_mlflow.errors import UserError
from kronos_mlflow.evaluation import ensemble as en, probabilistic as pr
from kronos_mlflow.serving.forecasting import ensemble as served

H, LOOKBACK, PATHS = 5, 30, 16


def _market(rng, n: int, width: float):
    sigma = rng.uniform(0.005, 0.03, n)
    steps = rng.standard_normal((n, LOOKBACK - 1)) * sigma[:, None]
    history = 100.0 * np.exp(np.concatenate([np.zeros((n, 1)), np.cumsum(steps, axis=1)], axis=1))
    last = history[:, -1]
    truth = last[:, None] * np.exp(np.cumsum(rng.standard_normal((n, H)), axis=1) * sigma[:, None])
    paths = last[:, None, None] * np.exp(np.cumsum(rng.standard_normal((n, PATHS, H)), axis=2)
                                         * (width * sigma)[:, None, None])
    raw = pr.from_paths(paths, last, truth, pr.uniforms(0, truth.shape))
    raw["mean"] = paths.mean(axis=1)
    return history, truth, raw


def test_greedy_selection_prefers_the_member_that_fits_and_is_no_worse_than_the_best():
    rng = np.random.default_rng(0)
    history, truth, raw = _market(rng, 800, width=0.2)  # the pair's paths a fifth as wide as the truth
    ensemble, losses = en.fit(raw, history, truth, rounds=20)
    assert sum(ensemble.weights.values()) == pytest.approx(1.0)
    assert ensemble.weights["histvol"] > ensemble.weights["finetuned"]
    assert losses["validation_wql_ensemble"] <= min(losses[f"validation_wql_{m}"] for m in served.MEMBERS) + 1e-12
    # applied to fresh origins: quantiles in order, the 80% band near its nominal coverage
    t_hist, t_truth, t_raw = _market(rng, 800, width=0.2)
    out = en.forecast(ensemble, t_raw, t_hist, t_truth, pr.uniforms(1, t_truth.shape))
    assert (np.diff(out["levels"], axis=1) >= -1e-12).all()
    assert abs(pr.coverage(out["levels"], t_truth, 80).mean() - 0.8) < 0.05


def test_one_round_is_the_best_single_member_and_weights_are_shares_of_rounds():
    levels = {"a": np.full((4, 13, 2), 1.0), "b": np.full((4, 13, 2), 2.0), "c": np.full((4, 13, 2), 3.0)}
    actual = np.full((4, 2), 2.0)
    assert en.select(levels, actual, 1) == {"a": 0.0, "b": 1.0, "c": 0.0}
    weights = en.select(levels, np.full((4, 2), 1.6), 5)  # 0.4 a + 0.6 b is exact
    assert weights == {"a": 0.4, "b": 0.6, "c": 0.0}


def test_the_ensemble_is_json_read_back_exactly_and_a_damaged_field_is_one_line(tmp_path):
    rng = np.random.default_rng(1)
    history, truth, raw = _market(rng, 200, width=0.5)
    ensemble, losses = en.fit(raw, history, truth, rounds=10, time_range=("2023-01-02T00:00:00", "2023-03-31T00:00:00"))
    written = en.write_artifacts(ensemble, losses, tmp_path)
    assert {p.name for p in written} == {"ensemble.json", "ensemble.png"}
    assert (tmp_path / "ensemble.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = served.read(str(tmp_path / "ensemble.json"))
    assert again.weights == ensemble.weights and again.rounds == 10
    np.testing.assert_array_equal(again.calibrator.score_quantiles, ensemble.calibrator.score_quantiles)
    assert again.scores.shape == (200, 6, H)  # the mixture's validation scores, for ACI on the logged model
    np.testing.assert_array_equal(again.scores, ensemble.scores)
    data = json.loads((tmp_path / "ensemble.json").read_text())
    for edit, needle in ((lambda d: d["weights"].update(histvol=2.0), "weights.histvol"),
                         (lambda d: d["weights"].update(finetuned=0.0, histvol=0.0, persistence=0.5), "sum to 0.5"),
                         (lambda d: d.update(rounds=0), "rounds"), (lambda d: d.update(format="x"), "format"),
                         (lambda d: d["calibrator"].update(base_rate=5), "calibrator: base_rate"),
                         (lambda d: d["validation_scores"][3][2].append(1.0), "validation_scores"),
                         (lambda d: d["validation_scores"][0][0].__setitem__(0, "x"), "validation_scores")):
        bad = json.loads(json.dumps(data))
        edit(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(UserError) as err:
            served.read(str(tmp_path / "bad.json"), "the model's ensemble/ensemble.json")
        assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_aci_on_a_logged_ensemble_reads_its_kept_validation_scores():
    """Scoring a logged model (no validation forecasts at hand), ACI widens by the validation
    scores its ensemble.json kept: the same bands as where the scorecard fit the ensemble itself."""
    from dataclasses import dataclass

    from kronos_mlflow.evaluation import aci

    rng = np.random.default_rng(4)
    history, truth, raw = _market(rng, 300, width=0.3)
    ensemble, _ = en.fit(raw, history, truth, rounds=10)
    t_hist, t_truth, t_raw = _market(rng, 200, width=0.3)
    days = np.datetime64("2024-01-01") + np.repeat(np.arange(40), 5).astype("timedelta64[D]")

    @dataclass
    class Origins:  # the two things scored_from reads of the scorecard's origins
        def __len__(self):
            return len(days)

        def times(self, rows):
            bars = days[:, None] + np.arange(1, H + 1)[None, :].astype("timedelta64[D]")
            return days[:, None], bars

    u = pr.uniforms(3, t_truth.shape)
    conformal = en.forecast(ensemble, t_raw, t_hist, t_truth, u)
    keep = {"raw": raw, "history": history, "actual": truth}
    here = aci.scored_from(keep, ensemble, t_raw, conformal, t_hist, t_truth, Origins(), 0.05, u)
    again = served.from_json(json.loads(ensemble.dumps()), "ensemble.json")
    logged = aci.scored_from({}, again, t_raw, conformal, t_hist, t_truth, Origins(), 0.05, u)
    np.testing.assert_allclose(logged["levels"], here["levels"], rtol=1e-12)
    assert aci.scored_from({}, served.Ensemble(again.weights, 10, again.calibrator), t_raw, conformal, t_hist,
                           t_truth, Origins(), 0.05, u) is None
