"""The logged forecaster serves its close's quantiles and probability of a rise, calibrated by
default: two tiny upstream-format checkpoints (tests/test_forecaster.py's) and a calibrator fit
by ``kronos_mlflow.evaluation.calibration.fit`` on synthetic origins, logged through
``log_predictor_model`` from a run directory whose ``evaluation/calibrator.json`` holds it, to a
real MLflow sqlite store, then loaded with ``mlflow.pyfunc.load_model``; a second model is
logged without a calibrator, as a model logged before calibration was served.

Checked: the default answer is the calibrator's quantiles and p_up of the paths' raw ones;
``calibrated: false`` answers numpy's quantiles of the returned paths' close; the model without
a calibrator answers raw and says so; a bad ``calibrated`` is one line; the signature and the
model's files (``calibrator/calibrator.json``, no pickle). A lookback too short for the volatility
the calibrator scales by, or closes not all positive, is answered raw with the reason; a model
whose calibrator is damaged loads, warns in one line naming the file and the field and answers
raw; ``kronos-mlflow evaluate --check`` refuses such a model in that line with exit code 2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_forecaster import _windows, _write_checkpoints
from tiny_runs import TRACKING_ENV, isolated_env, isolated_vars, tiny_config

from kronos_mlflow.evaluation import calibration
from kronos_mlflow.serving.forecasting import calibrator_file, quantiles

CLOSE = quantiles.CLOSE
OUTPUTS = ["calibration", "calibration_note", "forecaster", "mean", "p_up", "paths", "quantile_levels", "quantiles"]


def _synthetic_calibrator(horizon: int, n: int = 60, paths: int = 8) -> quantiles.Calibrator:
    """A calibrator fit on synthetic origins whose raw quantiles are too narrow (so it widens them)."""
    rng = np.random.default_rng(7)
    last = 20 * np.exp(rng.normal(0, 0.2, size=n))
    sigma = np.full(n, 0.02)
    steps = np.sqrt(np.arange(1, horizon + 1))
    z = np.array([-1.645, -1.282, -0.842, -0.674, -0.524, -0.253, 0.0, 0.253, 0.524, 0.674, 0.842, 1.282, 1.645])
    levels = last[:, None, None] * np.exp(0.5 * 0.02 * z[None, :, None] * steps[None, None, :])
    actual = last[:, None] * np.exp(np.cumsum(rng.normal(0, 0.03, size=(n, horizon)), axis=1))
    p_up = rng.integers(0, paths + 1, size=n) / paths
    return calibration.fit(levels, last, sigma, actual, p_up, ("2023-01-02T00:00:00", "2023-03-31T00:00:00"))


def _synthetic_ensemble(horizon: int, n: int = 60):
    """An ensemble fit on synthetic origins whose fine-tuned paths are too narrow."""
    from kronos_mlflow.evaluation import ensemble

    rng = np.random.default_rng(8)
    history = 20 * np.exp(np.cumsum(rng.normal(0, 0.02, size=(n, 30)), axis=1))
    last = history[:, -1]
    steps = np.sqrt(np.arange(1, horizon + 1))
    z = np.array([-1.645, -1.282, -0.842, -0.674, -0.524, -0.253, 0.0, 0.253, 0.524, 0.674, 0.842, 1.282, 1.645])
    levels = last[:, None, None] * np.exp(0.3 * 0.02 * z[None, :, None] * steps[None, None, :])
    actual = last[:, None] * np.exp(np.cumsum(rng.normal(0, 0.02, size=(n, horizon)), axis=1))
    raw = {"levels": levels, "mean": levels[:, 6], "p_up": rng.integers(0, 9, size=n) / 8}
    fitted, _ = ensemble.fit(raw, history, actual, 10, ("2023-01-02T00:00:00", "2023-03-31T00:00:00"))
    return fitted


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The forecaster logged with a calibrator (through log_predictor_model) and without one."""
    import mlflow

    from kronos_mlflow.config.layout import RunLayout
    from kronos_mlflow.tracking.mlflow import MLflowLogger
    from kronos_mlflow.serving.model_logging import log_forecaster, log_predictor_model

    tmp = tmp_path_factory.mktemp("served-calibration")
    with pytest.MonkeyPatch.context() as mp:
        for name in TRACKING_ENV:
            mp.delenv(name, raising=False)
        for name, value in isolated_vars(tmp).items():
            mp.setenv(name, value)
        mp.chdir(tmp)
        config = tiny_config(tmp)
        tokenizer, predictor = _write_checkpoints(tmp / "checkpoints")
        layout = RunLayout(tmp / "run")
        shutil.copytree(tokenizer, layout.tokenizer)
        shutil.copytree(predictor, layout.best_model)
        cal = _synthetic_calibrator(int(config["predict_window"]))
        (layout.root / "evaluation").mkdir(parents=True)
        (layout.root / "evaluation" / "calibrator.json").write_text(cal.dumps())
        try:
            with_cal = MLflowLogger(experiment_name="served", run_name="calibrated")
            log_predictor_model(with_cal, layout, config, {"best_epoch": 2}, {}, None)
            with_cal.finalize("success")
            without = MLflowLogger(experiment_name="served", run_name="raw")
            raw_info = log_forecaster(without, str(tokenizer), str(predictor), config, step=2)
            without.finalize("success")
            ensemble = _synthetic_ensemble(int(config["predict_window"]))
            (layout.root / "evaluation" / "ensemble.json").write_text(ensemble.dumps())
            with_ens = MLflowLogger(experiment_name="served", run_name="ensemble")
            log_predictor_model(with_ens, layout, config, {"best_epoch": 2}, {}, None)
            with_ens.finalize("success")
        finally:
            mlflow.set_tracking_uri(None)  # the logging sets the process-global URI: do not leak it
        uri = isolated_vars(tmp)["MLFLOW_TRACKING_URI"]
        cal_uri = mlflow.MlflowClient(uri).get_run(with_cal.run_id).data.tags["best_model_uri"]
        ens_uri = mlflow.MlflowClient(uri).get_run(with_ens.run_id).data.tags["best_model_uri"]
        yield {"tmp": tmp, "uri": uri, "cal": cal, "cal_uri": cal_uri, "raw_info": raw_info,
               "json": (layout.root / "evaluation" / "calibrator.json").read_text(),
               "model": mlflow.pyfunc.load_model(cal_uri), "raw_model": mlflow.pyfunc.load_model(raw_info.model_uri),
               "ensemble": ensemble, "ens_uri": ens_uri, "ens_model": mlflow.pyfunc.load_model(ens_uri)}


def _raw(out: dict, bars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's quantiles of the returned paths' close at QLEVELS ``(B, 13, H)``, and their p_up."""
    close = out["paths"][..., CLOSE].astype(np.float64)
    levels = np.moveaxis(np.quantile(close, quantiles.QLEVELS, axis=1), 0, 1)
    return levels, (close[:, :, -1] > bars[:, -1, CLOSE].astype(np.float64)[:, None]).mean(axis=1)


def test_the_default_answer_is_calibrated(served):
    x = _windows(n=3)
    out = served["model"].predict(x, params={"sample_count": 8, "seed": 2})
    assert sorted(out) == OUTPUTS
    assert out["quantiles"].shape == (3, 13, 5) and out["quantiles"].dtype == np.float64
    np.testing.assert_array_equal(out["quantile_levels"], quantiles.QLEVELS)
    assert out["p_up"].shape == (3,) and list(out["calibration"]) == ["calibrated"] * 3
    assert list(out["calibration_note"]) == [""] * 3
    raw, raw_up = _raw(out, x["bars"])
    close = x["bars"][..., CLOSE].astype(np.float64)
    expected = served["cal"].quantiles(raw, close[:, -1], quantiles.histvol_sigma(close))
    np.testing.assert_allclose(out["quantiles"], expected, rtol=1e-12)
    np.testing.assert_allclose(out["p_up"], served["cal"].p_up(raw_up), rtol=1e-12)
    # the calibrator widened the too-narrow raw intervals; the median is the paths' own
    assert (out["quantiles"][:, -1] - out["quantiles"][:, 0] > raw[:, -1] - raw[:, 0]).all()
    np.testing.assert_allclose(out["quantiles"][:, quantiles.MEDIAN], raw[:, quantiles.MEDIAN], rtol=1e-12)
    # asked explicitly, the same answer; one path states no probability
    again = served["model"].predict(x, params={"sample_count": 8, "seed": 2, "calibrated": True})
    np.testing.assert_array_equal(again["quantiles"], out["quantiles"])
    one = served["model"].predict(x, params={"seed": 2})
    assert np.isnan(one["p_up"]).all() and list(one["calibration"]) == ["calibrated"] * 3


def test_calibrated_false_answers_the_paths_own_quantiles(served):
    x = _windows(n=2)
    params = {"sample_count": 6, "seed": 4}
    default = served["model"].predict(x, params=params)
    out = served["model"].predict(x, params={**params, "calibrated": False})
    np.testing.assert_array_equal(out["paths"], default["paths"])  # the same paths and mean either way
    np.testing.assert_array_equal(out["mean"], default["mean"])
    raw, raw_up = _raw(out, x["bars"])
    np.testing.assert_allclose(out["quantiles"], raw, rtol=1e-12)
    np.testing.assert_allclose(out["p_up"], raw_up, rtol=1e-12)
    assert list(out["calibration"]) == ["raw", "raw"]
    assert list(out["calibration_note"]) == ["calibrated: false asked for the paths' own quantiles and p_up"] * 2
    assert not np.allclose(out["quantiles"], default["quantiles"])


def test_a_model_without_a_calibrator_serves_raw(served):
    x = _windows(n=2)
    model = served["raw_model"]
    for params in ({"sample_count": 5, "seed": 1}, {"sample_count": 5, "seed": 1, "calibrated": True}):
        out = model.predict(x, params=params)
        assert sorted(out) == OUTPUTS
        raw, raw_up = _raw(out, x["bars"])
        np.testing.assert_allclose(out["quantiles"], raw, rtol=1e-12)
        np.testing.assert_allclose(out["p_up"], raw_up, rtol=1e-12)
        assert list(out["calibration"]) == ["raw", "raw"]
        assert all(note.startswith("the model carries no calibrator") for note in out["calibration_note"])


def test_a_lookback_too_short_for_the_volatility_is_answered_raw_and_says_why(served):
    """2 bars give no volatility (histvol needs 3 closes): raw, the note naming the minimum; a
    series with a non-positive close is raw beside a calibrated one."""
    short = _windows(n=2, lookback=2)
    out = served["model"].predict(short, params={"sample_count": 6, "seed": 3})
    raw, raw_up = _raw(out, short["bars"])
    np.testing.assert_allclose(out["quantiles"], raw, rtol=1e-12)
    np.testing.assert_allclose(out["p_up"], raw_up, rtol=1e-12)
    assert list(out["calibration"]) == ["raw", "raw"]
    note = str(out["calibration_note"][0])
    assert "lookback of 2 bars" in note and "at least 3 bars" in note and "\n" not in note, note
    x = _windows(n=2, lookback=quantiles.MIN_CALIBRATED_LOOKBACK)
    x["bars"][1, 0, CLOSE] = 0.0  # a close of 0: no log return
    out = served["model"].predict(x, params={"sample_count": 6, "seed": 3})
    assert list(out["calibration"]) == ["calibrated", "raw"] and out["calibration_note"][0] == ""
    assert "not all positive" in out["calibration_note"][1]
    raw, raw_up = _raw(out, x["bars"])
    np.testing.assert_allclose(out["quantiles"][1], raw[1], rtol=1e-12)
    close = x["bars"][:1, :, CLOSE].astype(np.float64)
    np.testing.assert_allclose(out["quantiles"][:1], served["cal"].quantiles(raw[:1], close[:, -1],
                                                                             quantiles.histvol_sigma(close)), rtol=1e-12)


def _damaged_copy(served, name: str, edit) -> Path:
    """The calibrated model downloaded once per test module, its calibrator.json edited by ``edit``
    (the JSON value, or bytes to write as they are)."""
    import mlflow

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=served["cal_uri"],
                                                     dst_path=str(served["tmp"] / name), tracking_uri=served["uri"]))
    path = local / "artifacts" / "calibrator" / "calibrator.json"
    value = edit(json.loads(path.read_text()))
    path.write_bytes(value if isinstance(value, bytes) else json.dumps(value).encode())
    return local


def test_a_damaged_calibrator_loads_and_answers_raw_with_a_warning(served):
    import mlflow

    local = _damaged_copy(served, "base-rate-5", lambda d: {**d, "base_rate": 5})
    with pytest.warns(UserWarning) as caught:
        model = mlflow.pyfunc.load_model(str(local))
    (line,) = [str(w.message) for w in caught if "calibrator.json" in str(w.message)]
    assert line == ("the model's calibrator/calibrator.json: base_rate is '5'; expected a number from 0 to 1; the "
                    "model answers raw quantiles and p_up")
    x = _windows(n=2)
    out = model.predict(x, params={"sample_count": 5, "seed": 1})
    raw, raw_up = _raw(out, x["bars"])
    np.testing.assert_allclose(out["quantiles"], raw, rtol=1e-12)
    np.testing.assert_allclose(out["p_up"], raw_up, rtol=1e-12)
    assert (0 <= out["p_up"]).all() and (out["p_up"] <= 1).all()
    assert list(out["calibration"]) == ["raw", "raw"]
    assert list(out["calibration_note"]) == ["the model's calibrator/calibrator.json: base_rate is '5'; expected a "
                                             "number from 0 to 1: answered raw"] * 2


@pytest.mark.parametrize("edit, needle", [
    (lambda d: {**d, "time_range": ["not a date", "2023-03-31"]}, "time_range[0] is 'not a date'"),
    (lambda d: json.dumps(d).replace('"origins": 60', '"origins": 1e400').encode(), "origins is 'inf'"),
    (lambda d: b"{not json", "is not JSON (line 1 column 2"),
    (lambda d: {**d, "p_up": {"x": [0.9, 0.1], "y": [0.2, 0.3]}}, "p_up.x[1] is 0.1, below p_up.x[0] 0.9"),
    (lambda d: {**d, "score_quantiles": [[1.0] * 5] * 6 + [[1.0] * 5]}, "score_quantiles is a list of 7 rows"),
    (lambda d: {**d, "version": 2}, "version is '2'"),
])
def test_each_field_of_a_calibrator_is_checked_in_one_line(tmp_path, served, edit, needle):
    from kronos_mlflow.serving.forecasting.pyfunc import loaded_calibrator

    path = tmp_path / "calibrator.json"
    value = edit(json.loads(served["json"]))
    path.write_bytes(value if isinstance(value, bytes) else json.dumps(value).encode())
    with pytest.warns(UserWarning, match="calibrator.json"):
        calibrator, why = loaded_calibrator(str(path))
    assert calibrator is None and needle in why and "\n" not in why, why


def test_the_mlmodel_model_config_is_checked_at_load():
    from kronos_mlflow.errors import UserError
    from kronos_mlflow.serving.forecasting.pyfunc import model_settings

    assert model_settings({"pred_len": 5, "max_context": 512, "clip": 5.0}) == {
        "pred_len": 5, "max_context": 512, "clip": 5.0, "device": None}
    for config, needle in (({"pred_len": "x"}, "model_config.pred_len is 'x'"),
                           ({"max_context": 1e400}, "model_config.max_context is 'inf'"),
                           ({"clip": -1.0}, "model_config.clip"), ({"device": ["cpu"]}, "model_config.device")):
        with pytest.raises(UserError, match="the model's MLmodel file") as caught:
            model_settings(config)
        assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_evaluate_check_refuses_a_model_whose_calibrator_is_damaged(served, commands):
    """What a user types: ``kronos-mlflow evaluate --model <model dir> --check``; the calibrator
    is read before anything else of the model is used, and nothing is written."""
    local = _damaged_copy(served, "evaluate-check", lambda d: {**d, "base_rate": 5})
    env = isolated_env(served["tmp"] / "evaluate-check-env", served["uri"])
    before = sorted(p for p in served["tmp"].rglob("*") if p.is_file())
    proc = commands.run(["kronos-mlflow", "evaluate", "--model", str(local / "artifacts"), "--check"],
                        cwd=served["tmp"], env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (f"kronos-mlflow evaluate: error: --model '{local / 'artifacts'}': its "
                                   "calibrator/calibrator.json: base_rate is '5'; expected a number from 0 to 1")
    assert sorted(p for p in served["tmp"].rglob("*") if p.is_file()) == before


def test_a_bad_calibrated_is_one_line(served):
    from mlflow.exceptions import MlflowException

    from kronos_mlflow.errors import ConfigError
    from kronos_mlflow.serving.forecasting.pyfunc import PARAM_NAMES, sampling_params

    assert "calibrated" in PARAM_NAMES
    assert sampling_params(None, 5)["calibrated"] is True
    assert sampling_params({"calibrated": np.bool_(False)}, 5)["calibrated"] is False
    for value in ("yes", 1, None, [True]):
        with pytest.raises(ConfigError) as plain:
            sampling_params({"calibrated": value}, 5)
        assert str(plain.value) == (f"calibrated is {value!r}; expected true or false (false: the raw quantiles "
                                    "and p_up of the sample paths)")
    x = _windows()
    for value in ("yes", 1, None):  # MLflow's signature check refuses the first two, the model the third
        with pytest.raises(MlflowException) as caught:
            served["model"].predict(x, params={"calibrated": value})
        message = str(caught.value.message)
        assert "calibrated" in message and "\n" not in message.strip() and len(message) < 300, message


def test_the_signature_and_the_model_files(served):
    import mlflow

    from kronos_mlflow.model.io import CONFIG_NAME, WEIGHTS_NAME

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=served["cal_uri"],
                                                     dst_path=str(served["tmp"] / "dl"), tracking_uri=served["uri"]))
    assert sorted(p.name for p in (local / "artifacts").iterdir()) == ["calibrator", "predictor", "tokenizer"]
    assert sorted(p.name for p in (local / "artifacts" / "predictor").iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME])
    stored = (local / "artifacts" / "calibrator" / "calibrator.json").read_text()
    assert stored == served["json"]
    assert calibrator_file.from_json(json.loads(stored)).to_json() == served["cal"].to_json()
    assert not list(local.rglob("*.pkl")) and not list(local.rglob("*.pickle"))

    signature = mlflow.models.Model.load(str(local / "MLmodel")).signature
    assert [s.name for s in signature.outputs.inputs] == ["paths", "mean", "quantiles", "quantile_levels", "p_up",
                                                           "calibration", "calibration_note", "forecaster"]
    params = {p.name: (p.dtype.name, p.default) for p in signature.params.params}
    assert params["calibrated"] == ("boolean", True)
    assert params["forecaster"] == ("string", "calibrated")
    assert sorted(params) == sorted(["pred_len", "T", "top_k", "top_p", "sample_count", "seed", "calibrated",
                                     "forecaster"])
    # the model logged without a calibrator has the same signature and no calibrator artifact
    raw_local = Path(mlflow.artifacts.download_artifacts(artifact_uri=served["raw_info"].model_uri,
                                                         dst_path=str(served["tmp"] / "dl-raw"),
                                                         tracking_uri=served["uri"]))
    assert sorted(p.name for p in (raw_local / "artifacts").iterdir()) == ["predictor", "tokenizer"]


def test_a_bad_calibrator_is_refused_before_logging(tmp_path):
    from kronos_mlflow.errors import UserError
    from kronos_mlflow.serving.forecasting.pyfunc import read_calibrator
    from kronos_mlflow.serving.model_logging import log_forecaster

    bad = tmp_path / "calibrator.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(UserError, match=r"calibrator.json: the file lacks version"):
        read_calibrator(str(bad))
    bad.write_text("{not json")
    with pytest.raises(UserError, match=r"calibrator.json is not JSON \(line 1 column 2") as caught:
        log_forecaster(None, str(tmp_path), str(tmp_path), {}, calibrator_path=str(bad))  # nothing logged
    assert "\n" not in str(caught.value)


def test_the_ensemble_answers_by_default_where_the_model_carries_one(served):
    """A model logged with ``evaluation/ensemble.json`` answers as the ensemble by default (its
    weights mixing the paths' quantiles, histvol's and persistence's, then its calibrator), says
    so in ``forecaster``; ``forecaster: calibrated`` and ``raw`` answer as those; a model without
    one answers as before and refuses ``forecaster: ensemble`` in one line; a bad value is one line."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from kronos_mlflow.serving.forecasting import ensemble as served_ensemble

    x = _windows(n=3)
    params = {"sample_count": 8, "seed": 2}
    out = served["ens_model"].predict(x, params=params)
    assert sorted(out) == OUTPUTS and list(out["forecaster"]) == ["ensemble"] * 3
    raw, raw_up = _raw(out, x["bars"])
    close = x["bars"][..., CLOSE].astype(np.float64)
    close_paths = out["paths"][..., CLOSE].astype(np.float64)
    expected = served["ensemble"].apply(raw, close_paths.mean(axis=1), raw_up, close, quantiles.histvol_sigma(close))
    np.testing.assert_allclose(out["quantiles"], expected["levels"], rtol=1e-12)
    np.testing.assert_allclose(out["p_up"], expected["p_up"], rtol=1e-12)
    calibrated = served["ens_model"].predict(x, params={**params, "forecaster": "calibrated"})
    np.testing.assert_allclose(calibrated["quantiles"], served["model"].predict(x, params=params)["quantiles"],
                               rtol=1e-12)
    assert list(calibrated["forecaster"]) == ["calibrated"] * 3
    plain = served["ens_model"].predict(x, params={**params, "forecaster": "raw"})
    np.testing.assert_allclose(plain["quantiles"], raw, rtol=1e-12)
    assert list(plain["forecaster"]) == ["raw"] * 3
    # the model logged before the ensemble answers as it did; asked for an ensemble, one line
    old = served["model"].predict(x, params=params)
    assert list(old["forecaster"]) == ["calibrated"] * 3
    for model, value, needle in ((served["model"], "ensemble", "carries no ensemble"),
                                 (served["ens_model"], "best", "forecaster is 'best'")):
        with pytest.raises(MlflowException) as caught:
            model.predict(x, params={"forecaster": value})
        message = str(caught.value.message)
        assert needle in message and "\n" not in message.strip() and len(message) < 300, message
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=served["ens_uri"],
                                                     dst_path=str(served["tmp"] / "dl-ens"), tracking_uri=served["uri"]))
    assert sorted(p.name for p in (local / "artifacts").iterdir()) == ["calibrator", "ensemble", "predictor", "tokenizer"]
    assert served_ensemble.read(str(local / "artifacts" / "ensemble" / "ensemble.json")).weights == \
        served["ensemble"].weights
    signature = mlflow.models.Model.load(str(local / "MLmodel")).signature
    assert {p.name: p.default for p in signature.params.params}["forecaster"] == "ensemble"
