"""The predictor run's forecaster: two tiny upstream-format checkpoints (a tokenizer and a
``Kronos`` predictor written with ``save_pretrained``) logged with ``log_forecaster`` to a real
MLflow sqlite store under a real run, then loaded with ``mlflow.pyfunc.load_model``.

Checked: the paths equal ``KronosPredictor.predict_paths`` after ``torch.manual_seed`` of the
same seed; one seed gives one set of paths and greedy ``top_k=1`` is deterministic; each bad input
is one line; the artifact directories load with ``from_pretrained``; the run, the Logged Model
and the registered version. One slow test serves the model with ``mlflow models serve``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from servers import post_json, serve_on_free_port, stop_process_group
from tiny_runs import TRACKING_ENV, isolated_vars, tiny_config

from kronos_mlflow.model import Kronos, KronosPredictor, KronosTokenizer

TOKENIZER = {"d_in": 6, "d_model": 16, "n_heads": 2, "ff_dim": 32, "n_enc_layers": 2, "n_dec_layers": 2,
             "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "s1_bits": 4, "s2_bits": 4,
             "beta": 0.05, "gamma0": 1.0, "gamma": 1.1, "zeta": 0.05, "group_size": 4}
PREDICTOR = {"s1_bits": 4, "s2_bits": 4, "n_layers": 2, "d_model": 32, "n_heads": 2, "ff_dim": 48,
             "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "token_dropout_p": 0.0,
             "learn_te": True}
REGISTERED = "kronos-forecaster"


def _write_checkpoints(root: Path) -> tuple[Path, Path]:
    torch.manual_seed(1)
    tokenizer = KronosTokenizer(**TOKENIZER)
    torch.manual_seed(0)
    predictor = Kronos(**PREDICTOR)
    with torch.no_grad():  # off the fresh initialisation, so that the logits are not flat
        for p in predictor.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    # named as a training run names them, not as the model's artifacts
    return Path(tokenizer.save_pretrained(root / "tokenizer-run")), Path(predictor.save_pretrained(root / "best_model"))


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """The forecaster logged once on a run of a sqlite store; (tmp, config, dirs, info, pyfunc, logger)."""
    import mlflow

    from kronos_mlflow.tracking.mlflow import MLflowLogger
    from kronos_mlflow.serving.model_logging import log_forecaster

    tmp = tmp_path_factory.mktemp("forecaster")
    with pytest.MonkeyPatch.context() as mp:
        for name in TRACKING_ENV:
            mp.delenv(name, raising=False)
        for name, value in isolated_vars(tmp).items():
            mp.setenv(name, value)
        mp.chdir(tmp)
        config = tiny_config(tmp, registered_model_name=REGISTERED)
        dirs = _write_checkpoints(tmp / "checkpoints")
        logger = MLflowLogger(experiment_name="forecaster", run_name="predictor")
        logger.log_metrics({"val_loss": 1.5}, step=3)
        try:
            info = log_forecaster(logger, str(dirs[0]), str(dirs[1]), config, step=3, metrics={"val_loss": 1.5})
        finally:
            # the logging sets MLflow's process-global tracking URI: do not leak it into later tests
            mlflow.set_tracking_uri(None)
        logger.finalize("success")
        model = mlflow.pyfunc.load_model(info.model_uri)
        yield {"tmp": tmp, "config": config, "dirs": dirs, "info": info, "model": model, "logger": logger,
               "uri": isolated_vars(tmp)["MLFLOW_TRACKING_URI"]}


def _windows(n: int = 2, lookback: int = 20, pred_len: int = 5, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    close = 20 * np.exp(np.cumsum(rng.normal(0, 0.02, size=(n, lookback)), axis=1))
    vol = rng.uniform(1e4, 1e5, size=(n, lookback))
    bars = np.stack([close * 0.99, close * 1.02, close * 0.97, close, vol, vol * close], axis=-1)
    days = pd.bdate_range("2023-03-01", periods=lookback + pred_len)
    stamps = ((days - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1)).to_numpy()
    return {"bars": bars.astype(np.float32), "timestamps": np.tile(stamps, (n, 1)).astype(np.int64)}


def _reference(dirs, x: dict[str, np.ndarray], pred_len: int, seed: int, **sampling) -> np.ndarray:
    """``KronosPredictor.predict_paths`` on the same windows, after ``torch.manual_seed(seed)``."""
    predictor = KronosPredictor(Kronos.from_pretrained(dirs[1]), KronosTokenizer.from_pretrained(dirs[0]),
                                device="cpu", max_context=512, clip=5)
    lookback = x["bars"].shape[1]
    times = [pd.Series(pd.to_datetime(t, unit="s")) for t in x["timestamps"]]
    frames = [pd.DataFrame(b, columns=["open", "high", "low", "close", "volume", "amount"]) for b in x["bars"]]
    torch.manual_seed(seed)
    paths = predictor.predict_paths(frames, [t[:lookback] for t in times], [t[lookback:].reset_index(drop=True)
                                    for t in times], pred_len, **sampling)
    return np.stack(paths)


def test_the_paths_are_predict_paths_for_the_same_seed(logged):
    x = _windows()
    got = logged["model"].predict(x, params={"seed": 11, "sample_count": 3, "T": 0.8, "top_p": 0.95})
    assert sorted(got) == ["calibration", "calibration_note", "forecaster", "mean", "p_up", "paths", "quantile_levels",
                           "quantiles"]
    assert got["paths"].shape == (2, 3, 5, 6) and got["paths"].dtype == np.float32
    expected = _reference(logged["dirs"], x, 5, 11, T=0.8, top_k=0, top_p=0.95, sample_count=3)
    np.testing.assert_array_equal(got["paths"], expected.astype(np.float32))
    np.testing.assert_allclose(got["mean"], expected.mean(axis=1), rtol=1e-5, atol=1e-4)
    # the default horizon is the config's predict_window; another pred_len needs timestamps of its length
    longer = _windows(pred_len=8)
    out = logged["model"].predict(longer, params={"pred_len": 8})
    assert out["paths"].shape == (2, 1, 8, 6) and out["mean"].shape == (2, 8, 6)
    np.testing.assert_array_equal(out["paths"], _reference(logged["dirs"], longer, 8, 0, T=1.0, top_k=0, top_p=0.9,
                                                           sample_count=1).astype(np.float32))


def test_one_seed_one_set_of_paths_and_greedy_is_deterministic(logged):
    model, x = logged["model"], _windows()
    first = model.predict(x, params={"seed": 5, "sample_count": 4})["paths"]
    np.testing.assert_array_equal(first, model.predict(x, params={"seed": 5, "sample_count": 4})["paths"])
    other = model.predict(x, params={"seed": 6, "sample_count": 4})["paths"]
    assert not np.array_equal(first, other)
    greedy = [model.predict(x, params={"seed": s, "top_k": 1, "sample_count": 2})["paths"] for s in (0, 1)]
    np.testing.assert_array_equal(greedy[0], greedy[1])
    np.testing.assert_array_equal(greedy[0][:, 0], greedy[0][:, 1])  # every greedy path is the same
    # the caller's generator is left as it was
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    model.predict(x, params={"seed": 9})
    assert torch.equal(torch.rand(1), before)


def _bad_inputs():
    x = _windows()
    nan = {**x, "bars": x["bars"].copy()}
    nan["bars"][1, 4, 2] = np.nan
    swapped, repeated = x["timestamps"].copy(), x["timestamps"].copy()
    swapped[1, [3, 4]] = swapped[1, [4, 3]]
    repeated[0, 22] = repeated[0, 21]
    wide = x["bars"].astype(np.float64)
    wide[1, :, 5] = np.linspace(-3e38, 3e38, 20)
    huge = x["bars"].astype(np.float64)
    huge[0, :, 4] = 1e39  # finite in float64, infinite in the float32 the model computes in
    long = _windows(lookback=20, pred_len=600)
    return [
        ({"bars": x["bars"][..., :5], "timestamps": x["timestamps"]}, {},
         "bars of shape (2, 20, 5) are not lookback windows (B, L, 6) with B >= 1 and L >= 2: open, high, low, "
         "close, volume, amount per bar"),
        ({"bars": x["bars"][0], "timestamps": x["timestamps"]}, {}, "bars of shape (20, 6) are not lookback windows"),
        (nan, {}, "bars hold 1 NaN or infinite values (the first: series 1, bar 4, low); forecasting needs finite "
                  "prices, volume and amount"),
        ({**x, "timestamps": x["timestamps"][:, :-1]}, {},
         "timestamps of shape (2, 24) do not fit bars (2, 20, 6) and pred_len 5; expected (2, 25): the 20 lookback "
         "bars' then the 5 forecast bars' times"),
        ({**x, "timestamps": x["timestamps"] + 0.5}, {}, "timestamps hold a value that is not a whole number of "
                                                           "seconds"),
        ({"bars": x["bars"]}, {}, "input is ['bars']; expected a dict"),
        (x["bars"], {}, "input is ndarray; expected a dict"),
        (x, {"pred_len": 0}, "pred_len is 0; expected a whole number of 1 or more"),
        (x, {"T": 0.0}, "T is 0.0; expected a temperature above 0"),
        (x, {"T": -1.0}, "T is -1.0; expected a temperature above 0"),
        (x, {"top_p": 1.5}, "top_p is 1.5; expected a probability in (0, 1]"),
        (x, {"top_p": 0.0}, "top_p is 0.0; expected a probability in (0, 1]"),
        (x, {"sample_count": 0}, "sample_count is 0; expected a whole number of 1 or more"),
        (x, {"seed": -1}, "seed is -1; expected a whole number from 0 to 2**63 - 1"),
        ({"bars": x["bars"][:, :1], "timestamps": x["timestamps"][:, :6]}, {},
         "bars of shape (2, 1, 6) are not lookback windows (B, L, 6) with B >= 1 and L >= 2"),
        ({**x, "timestamps": swapped}, {}, "timestamps of series 1 go back at positions 3 and 4"),
        ({**x, "timestamps": repeated}, {}, "timestamps of series 0 repeat at positions 21 and 22"),
        ({**x, "bars": wide}, {}, "bars of series 1: amount spans values too far apart for float32 statistics"),
        ({**x, "bars": huge}, {}, "bars hold 20 NaN or infinite values (the first: series 0, bar 0, volume)"),
        (long, {"pred_len": 600}, "pred_len 600 is beyond max_context 512"),
        (x, {"sample_count": 10**9}, "sample_count 1000000000 for 2 series (2000000000 paths of 20 + 5 bars) needs"),
        (x, {"T": 1e-40}, "T is 1e-40; expected a temperature above 0, from 0.0001 to 1e+06"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_inputs())))
def test_each_bad_input_is_one_line(logged, case):
    from mlflow.exceptions import MlflowException

    from kronos_mlflow.serving.forecasting import forecast, load_forecaster

    model_input, params, start = _bad_inputs()[case]
    with pytest.raises(MlflowException) as caught:
        logged["model"].predict(model_input, params=params)
    message = caught.value.message
    assert "\n" not in message and len(message) < 300, message
    assert message.startswith(start), message
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    # without MLflow: the same line, a ValueError
    predictor = load_forecaster(*map(str, logged["dirs"]), device="cpu")
    with pytest.raises(ValueError) as plain:
        forecast(predictor, model_input, **{"pred_len": 5, **params})
    # (the free memory a memory refusal names moves between the two calls)
    assert str(plain.value).split(", and ")[0] == message.split(", and ")[0]


def test_the_artifacts_load_upstream_style_and_the_run_records_the_model(logged):
    import mlflow
    from mlflow import MlflowClient

    from kronos_mlflow.model.io import CONFIG_NAME, WEIGHTS_NAME

    info, logger = logged["info"], logged["logger"]
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=info.model_uri, dst_path=str(logged["tmp"] / "dl"),
                                                     tracking_uri=logged["uri"]))
    for name, cls, source in (("tokenizer", KronosTokenizer, logged["dirs"][0]),
                              ("predictor", Kronos, logged["dirs"][1])):
        directory = local / "artifacts" / name
        assert sorted(p.name for p in directory.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME])
        assert json.loads((directory / CONFIG_NAME).read_text()) == json.loads((source / CONFIG_NAME).read_text())
        reloaded, original = cls.from_pretrained(directory), cls.from_pretrained(source)
        for (k, a), (_, b) in zip(reloaded.state_dict().items(), original.state_dict().items()):
            assert torch.equal(a, b), k
    assert not list(local.rglob("*.pkl")) and not list(local.rglob("*.pickle"))
    example = json.loads((local / "serving_input_example.json").read_text())
    assert sorted(example["inputs"]) == ["bars", "timestamps"]
    assert np.asarray(example["inputs"]["bars"]).shape == (2, 20, 6)
    assert np.asarray(example["inputs"]["timestamps"]).shape == (2, 25)
    assert example["params"] == {"sample_count": 2, "seed": 0}

    client = MlflowClient(logged["uri"])
    run = client.get_run(logger.run_id)
    assert run.data.tags["best_model_uri"] == info.model_uri
    assert run.data.tags["registered_model"] == f"{REGISTERED}/1"
    assert [(o.model_id, o.step) for o in run.outputs.model_outputs] == [(info.model_id, 3)]
    model = client.get_logged_model(info.model_id)
    assert model.name == "best_model" and model.source_run_id == logger.run_id
    assert {m.key: m.value for m in model.metrics} == {"val_loss": 1.5}
    params = {p.name: p.default for p in info.signature.params.params}
    assert params == {"pred_len": 5, "T": 1.0, "top_k": 0, "top_p": 0.9, "sample_count": 1, "seed": 0,
                      "calibrated": True, "forecaster": "calibrated"}
    version = client.get_model_version(REGISTERED, "1")
    assert version.run_id == logger.run_id


def test_the_tokenizer_model_is_logged_through_the_same_steps(tmp_path, monkeypatch):
    """log_best_model shares the logging with log_forecaster: its record is unchanged."""
    import mlflow
    from mlflow import MlflowClient
    from tiny_runs import isolate

    from kronos_mlflow.tracking.mlflow import MLflowLogger
    from kronos_mlflow.serving.model_logging import example_windows, log_best_model

    isolate(monkeypatch, tmp_path)
    config = tiny_config(tmp_path, registered_model_name="kronos-tokenizer")
    checkpoint = _write_checkpoints(tmp_path / "checkpoints")[0]
    logger = MLflowLogger(experiment_name="tokenizer", run_name="tokenizer")
    try:
        info = log_best_model(logger, str(checkpoint), config, step=1, metrics={"val_tokenizer_loss_epoch": 0.25})
    finally:
        mlflow.set_tracking_uri(None)  # as above
    logger.finalize("success")
    client = MlflowClient(isolated_vars(tmp_path)["MLFLOW_TRACKING_URI"])
    run = client.get_run(logger.run_id)
    assert run.data.tags["best_model_uri"] == info.model_uri
    assert run.data.tags["registered_model"] == "kronos-tokenizer/1"
    assert [(o.model_id, o.step) for o in run.outputs.model_outputs] == [(info.model_id, 1)]
    assert {m.key: m.value for m in client.get_logged_model(info.model_id).metrics} == {
        "val_tokenizer_loss_epoch": 0.25}
    x = example_windows(config)
    out = mlflow.pyfunc.load_model(info.model_uri).predict(x)
    assert sorted(out) == ["reconstruction", "s1_tokens", "s2_tokens", "tokens"]
    assert out["tokens"].shape == x.shape[:2]


@pytest.mark.slow
def test_a_forecaster_logged_before_the_packages_by_role_still_loads_after_the_package_is_imported(logged):
    """A model logged before the modules moved carries a code file that imports
    ``kronos_mlflow.forecasting.pyfunc``. In a process that already imported this package, MLflow
    puts the model's own code copy behind it, so the old name resolves through
    ``serving.legacy_names``: the model loads and forecasts as the new one does."""
    import shutil

    import mlflow

    from kronos_mlflow.serving.forecasting.pyfunc import KronosForecasterPyfunc

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=logged["info"].model_uri,
                                                     dst_path=str(logged["tmp"] / "old"), tracking_uri=logged["uri"]))
    code_file = local / "forecaster_model.py"
    new_import = "from kronos_mlflow.serving.forecasting.pyfunc import KronosForecasterPyfunc"
    assert new_import in code_file.read_text()
    code_file.write_text(code_file.read_text().replace(
        new_import, "from kronos_mlflow.forecasting.pyfunc import KronosForecasterPyfunc"))
    shutil.rmtree(local / "code" / "kronos_mlflow" / "serving")  # the carried copy has no new name either
    old = mlflow.pyfunc.load_model(str(local))
    assert isinstance(old.unwrap_python_model(), KronosForecasterPyfunc)
    x, params = _windows(n=2), {"seed": 5, "sample_count": 2}
    np.testing.assert_array_equal(old.predict(x, params=params)["paths"],
                                  logged["model"].predict(x, params=params)["paths"])


def test_the_old_module_names_hand_out_the_classes_that_moved():
    """The two names older models' code files import are the classes that live in ``serving/`` now."""
    import importlib

    from kronos_mlflow.serving.forecasting.pyfunc import KronosForecasterPyfunc
    from kronos_mlflow.serving.tokenizer_model import KronosTokenizerPyfunc

    assert importlib.import_module("kronos_mlflow.mlflow_model").KronosTokenizerPyfunc is KronosTokenizerPyfunc
    assert importlib.import_module("kronos_mlflow.forecasting.pyfunc").KronosForecasterPyfunc is KronosForecasterPyfunc
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("kronos_mlflow.pyfunc_model")  # only those two


def test_served_forecast_equals_the_in_process_one(logged):
    import os

    from tiny_runs import isolated_env

    tmp, x, run_id = logged["tmp"], _windows(n=3), logged["logger"].run_id
    env = isolated_env(tmp, logged["uri"])
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # uvicorn from the venv
    proc, base = serve_on_free_port(
        lambda port: [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"runs:/{run_id}/best_model",
                      "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
        "/ping", tmp, "mlflow models serve", env)
    try:
        params = {"seed": 4, "sample_count": 2, "T": 0.9}
        request = {"inputs": {k: v.tolist() for k, v in x.items()}, "params": params}
        status, body = post_json(f"{base}/invocations", request)
        assert status == 200, body
        expected = logged["model"].predict(x, params=params)
        got = body["predictions"]
        np.testing.assert_array_equal(np.asarray(got["paths"], dtype=np.float32), expected["paths"])
        np.testing.assert_allclose(np.asarray(got["mean"], dtype=np.float32), expected["mean"], rtol=1e-6)

        # the request of docs/serving.md: the model's own serving example
        import mlflow

        example = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=f"runs:/{logged['logger'].run_id}/best_model/serving_input_example.json",
            dst_path=str(tmp / "example"),
            tracking_uri=logged["uri"]))
        status, body = post_json(f"{base}/invocations", json.loads(example.read_text()))
        assert status == 200, body
        assert np.asarray(body["predictions"]["paths"]).shape == (2, 2, 5, 6)

        status, body = post_json(f"{base}/invocations", {"inputs": {k: v.tolist() for k, v in x.items()},
                                                     "params": {"top_p": 1.5}})
        assert status == 400, body
        assert body["error_code"] == "INVALID_PARAMETER_VALUE"
        last = body["message"].strip().splitlines()[-1]
        assert last == ("Error: top_p is 1.5; expected a probability in (0, 1] (1 turns nucleus sampling off)"), last
        short = {"bars": x["bars"].tolist(), "timestamps": x["timestamps"][:, :22].tolist()}
        status, body = post_json(f"{base}/invocations", {"inputs": short})
        assert status == 400, body
        last = body["message"].strip().splitlines()[-1]
        assert last.startswith("Error: timestamps of shape (3, 22) do not fit bars (3, 20, 6) and pred_len 5"), last
        assert len(last) < 300

        # the predictor's own refusals answer the same way: INVALID_PARAMETER_VALUE, a 400, one line
        swapped = x["timestamps"].copy()
        swapped[2, [0, 1]] = swapped[2, [1, 0]]
        longer = _windows(n=3, pred_len=600)
        for inputs, params, start in [
            ({**x, "timestamps": swapped}, {}, "timestamps of series 2 go back at positions 0 and 1"),
            (longer, {"pred_len": 600}, "pred_len 600 is beyond max_context 512"),
            (x, {"sample_count": 10**9}, "sample_count 1000000000 for 3 series (3000000000 paths of 20 + 5 bars) "
                                         "needs about"),
            (x, {"T": 1e-40}, "T is 1e-40; expected a temperature above 0"),
        ]:
            request = {"inputs": {k: v.tolist() for k, v in inputs.items()}, "params": params}
            status, body = post_json(f"{base}/invocations", request)
            assert status == 400 and body["error_code"] == "INVALID_PARAMETER_VALUE", (start, status, body)
            last = body["message"].strip().splitlines()[-1]
            assert last.startswith(f"Error: {start}") and len(last) < 400, last
        status, body = post_json(f"{base}/invocations", {"inputs": {k: v.tolist() for k, v in x.items()}})
        assert status == 200, body  # the server still answers
    finally:
        stop_process_group(proc)
