"""The return head served and scored: tests/test_forecaster.py's two tiny upstream-format
checkpoints with a head written into the predictor's folder (``save_head``, as a tokens+return
run writes it), logged with ``log_forecaster`` to a real MLflow sqlite store and loaded with
``mlflow.pyfunc.load_model``.

Checked: the model answers the head's ``signal`` beside the paths' quantiles, the signal that
training's reading of the window (the whole window tokenized, the context at the origin) gives;
it is the same when the window's future bars, its forecast times or ``pred_len`` change; the
backbone files are upstream's and the head is its own file; a bad payload is still one line; a
damaged head is refused before anything is logged. ``kronos-mlflow evaluate`` on the logged model
scores the head as ``finetuned_head`` (IC, rank IC with its interval and Newey-West t, a
backtest strategy) beside the paths; without a head (tests/test_forecaster.py) nothing changes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_forecaster import PREDICTOR, _reference, _windows, _write_checkpoints
from tiny_runs import isolate, isolated_env, isolated_vars, tiny_config

from kronos_mlflow.config.features import normalize_windows, time_features
from kronos_mlflow.model import Kronos, KronosTokenizer
from kronos_mlflow.model.return_head import HEAD_FILE, ContextTap, ReturnHead, save_head

LOOKBACK, HORIZON = 20, 5


def _head() -> ReturnHead:
    torch.manual_seed(7)
    head = ReturnHead(PREDICTOR["d_model"])
    with torch.no_grad():  # a head whose signal varies across windows
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return head.eval()


@pytest.fixture(scope="module")
def headed(tmp_path_factory):
    """The forecaster with a return head logged once on a run of a sqlite store."""
    import mlflow

    from kronos_mlflow.serving.model_logging import log_forecaster
    from kronos_mlflow.tracking.mlflow import MLflowLogger

    tmp = tmp_path_factory.mktemp("served-head")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp)
        config = tiny_config(tmp)
        dirs = _write_checkpoints(tmp / "checkpoints")
        save_head(_head(), dirs[1], lookback=LOOKBACK, horizon=HORIZON)
        logger = MLflowLogger(experiment_name="served-head", run_name="predictor")
        try:
            info = log_forecaster(logger, str(dirs[0]), str(dirs[1]), config, step=1)
        finally:
            mlflow.set_tracking_uri(None)  # the logging sets the process-global URI: do not leak it
        logger.finalize("success")
        uri = isolated_vars(tmp)["MLFLOW_TRACKING_URI"]
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=info.model_uri, dst_path=str(tmp / "dl"),
                                                         tracking_uri=uri))
        yield {"tmp": tmp, "uri": uri, "dirs": dirs, "info": info, "local": local,
               "model": mlflow.pyfunc.load_model(info.model_uri)}


def _training_signal(dirs, bars: np.ndarray, timestamps: np.ndarray) -> np.ndarray:
    """The head's signal at the origin as training reads a window (lookback + future bars):
    z-scored with the lookback's statistics, the whole window tokenized, the context at bar L - 1."""
    tokenizer, model = KronosTokenizer.from_pretrained(dirs[0]).eval(), Kronos.from_pretrained(dirs[1]).eval()
    head = _head()
    x = torch.from_numpy(normalize_windows(bars.astype(np.float32), LOOKBACK, 5.0))
    stamp = torch.from_numpy(np.stack([time_features(np.asarray(t, dtype="datetime64[s]")) for t in timestamps]))
    with torch.no_grad(), ContextTap(model) as tap:
        s1, s2 = tokenizer.encode(x, half=True)
        model(s1[:, :-1], s2[:, :-1], stamp[:, :-1], use_teacher_forcing=True, s1_targets=s1[:, 1:])
        return head(tap.context, LOOKBACK - 1).double().numpy()


def _full_windows(n: int = 4, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Windows of LOOKBACK + HORIZON bars and their times (seconds)."""
    x = _windows(n=n, lookback=LOOKBACK + HORIZON, pred_len=1, seed=seed)
    return x["bars"], x["timestamps"][:, :LOOKBACK + HORIZON]


def test_a_model_with_a_head_answers_its_signal_beside_the_quantiles(headed):
    x = _windows(n=3)
    out = headed["model"].predict(x, params={"sample_count": 2, "seed": 1})
    assert out["signal"].shape == (3,) and out["signal"].dtype == np.float64 and np.isfinite(out["signal"]).all()
    assert len(set(out["signal"].round(9))) == 3  # one number per series
    assert out["quantiles"].shape == (3, 13, 5) and list(out["calibration"]) == ["raw"] * 3
    np.testing.assert_array_equal(out["paths"], _reference(headed["dirs"], x, 5, 1, T=1.0, top_k=0, top_p=0.9,
                                                           sample_count=2).astype(np.float32))  # as without a head
    outputs = [s.name for s in headed["info"].signature.outputs.inputs]
    assert outputs[-1] == "signal" and "paths" in outputs
    again = headed["model"].predict(x, params={"forecaster": "raw", "sample_count": 1, "seed": 9})
    np.testing.assert_array_equal(again["signal"], out["signal"])  # no draw enters it


def test_the_served_signal_at_an_origin_is_unchanged_when_the_future_bars_change(headed):
    bars, stamps = _full_windows()
    changed = bars.copy()
    changed[:, LOOKBACK:] *= np.linspace(0.5, 1.8, len(bars))[:, None, None]  # another future
    trained = _training_signal(headed["dirs"], bars, stamps)
    np.testing.assert_allclose(_training_signal(headed["dirs"], changed, stamps), trained, rtol=0, atol=1e-12)
    served = headed["model"].predict({"bars": bars[:, :LOOKBACK], "timestamps": stamps},
                                     params={"pred_len": HORIZON})["signal"]
    np.testing.assert_allclose(served, trained, rtol=1e-5, atol=1e-6)  # what training read, from the lookback alone
    later = stamps[:, :LOOKBACK + 2].copy()
    later[:, LOOKBACK:] += 7 * 86400  # other forecast times, another pred_len
    other = headed["model"].predict({"bars": bars[:, :LOOKBACK], "timestamps": later}, params={"pred_len": 2})
    np.testing.assert_array_equal(other["signal"], served)


def test_the_head_is_its_own_file_beside_upstreams_backbone(headed):
    from kronos_mlflow.model.io import CONFIG_NAME, WEIGHTS_NAME

    predictor = headed["local"] / "artifacts" / "predictor"
    assert sorted(p.name for p in predictor.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME, HEAD_FILE])
    for name in (CONFIG_NAME, WEIGHTS_NAME, HEAD_FILE):
        assert (predictor / name).read_bytes() == (headed["dirs"][1] / name).read_bytes()
    assert (predictor / HEAD_FILE).stat().st_size < 20_000
    reloaded, original = Kronos.from_pretrained(predictor), Kronos.from_pretrained(headed["dirs"][1])
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), original.state_dict().values()))
    assert not list(headed["local"].rglob("*.pkl"))


def test_a_bad_payload_is_still_one_line(headed):
    from mlflow.exceptions import MlflowException

    x = _windows(n=2)
    x["bars"][1, 4, 3] = np.nan
    with pytest.raises(MlflowException) as caught:
        headed["model"].predict(x)
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    assert "series 1, bar 4, close" in caught.value.message and "\n" not in caught.value.message


def test_a_damaged_head_is_refused_before_logging(tmp_path, headed):
    from kronos_mlflow.errors import CheckpointError
    from kronos_mlflow.serving.model_logging import log_forecaster

    bad = tmp_path / "best_model"
    shutil.copytree(headed["dirs"][1], bad)
    (bad / HEAD_FILE).write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a return head") as caught:
        log_forecaster(None, str(headed["dirs"][0]), str(bad), tiny_config(tmp_path))
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_evaluate_scores_the_head_as_its_own_forecaster(headed, commands):
    """What a user types: ``kronos-mlflow evaluate --model <the logged model's directory>``."""
    from mlflow import MlflowClient

    env = isolated_env(headed["tmp"] / "evaluate-env", headed["uri"])
    proc = commands.run(["kronos-mlflow", "evaluate", "--model", str(headed["local"] / "artifacts"),
                         "--lookback-window", "20", "--predict-window", "5",
                         "--n-eval-windows", "160", "--calibration", "off", "--backtest-signal-stride", "0",
                         "--backtest-n-random", "0", "--experiment-name", "head-eval",
                         "--save-path", str(headed["tmp"] / "evaluate-out"), "--dataset-path",
                         str(headed["tmp"] / "cache")], cwd=headed["tmp"], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "finetuned_head: rank IC" in proc.stdout + proc.stderr
    run_id = (proc.stdout + proc.stderr).split("logged: MLflow run ")[1].split()[0]
    metrics = MlflowClient(headed["uri"]).get_run(run_id).data.metrics
    for name in ("ic", "rank_ic", "rank_ic_ci_low", "rank_ic_ci_high", "rank_ic_nw_t", "ic_ci_low", "ic_ci_high"):
        assert f"finetuned_head_test_{name}" in metrics, name
    assert metrics["finetuned_head_test_rank_ic_ci_low"] <= metrics["finetuned_head_test_rank_ic"] \
        <= metrics["finetuned_head_test_rank_ic_ci_high"]
    assert "test_rank_ic" in metrics  # the paths' mean, beside it
    assert "backtest_fine_tuned_head_excess_return_with_cost" in metrics
    assert "backtest_fine_tuned_excess_return_with_cost" in metrics
    root = Path(MlflowClient(headed["uri"]).get_run(run_id).data.tags["run_directory"])
    import pandas as pd

    table = pd.read_parquet(root / "evaluation" / "origins.parquet")
    assert "finetuned_head_signal" in table and np.isfinite(table["finetuned_head_signal"]).all()
    assert json.loads((root / "evaluation" / "scorecard.json").read_text())["seconds"]["finetuned_head"] >= 0


def test_evaluate_check_refuses_a_model_whose_head_is_damaged(headed, commands):
    """``kronos-mlflow evaluate --model <model dir> --check`` reads the head before any work: a
    damaged one is one line naming it, exit code 2."""
    local = headed["tmp"] / "damaged-head"
    shutil.copytree(headed["local"], local)
    (local / "artifacts" / "predictor" / HEAD_FILE).write_bytes(b"\x00" * 64)
    env = isolated_env(headed["tmp"] / "damaged-env", headed["uri"])
    proc = commands.run(["kronos-mlflow", "evaluate", "--model", str(local / "artifacts"), "--check"],
                        cwd=headed["tmp"], env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"kronos-mlflow evaluate: error: --model '{local / 'artifacts'}': ") and \
        f"{HEAD_FILE}: not a return head" in line


@pytest.mark.slow
def test_the_backtest_reads_the_head_on_every_signal_origin(tiny):
    """With daily backtest signals (``backtest_signal_stride``), the head's signal is read on every
    signal origin; where a signal origin is a scorecard origin it is the scorecard's number."""
    import pandas as pd

    from kronos_mlflow.evaluation import head_scores as hs
    from kronos_mlflow.evaluation.origins import forecast_origins, signal_origins
    from kronos_mlflow.evaluation.scorecard import _backtest_signals
    from kronos_mlflow.model import KronosPredictor

    config = tiny(n_eval_windows=100, backtest_signal_stride=5)
    dirs = _write_checkpoints(Path(config["save_path"]) / "checkpoints")
    predictor = KronosPredictor(Kronos.from_pretrained(dirs[1]), KronosTokenizer.from_pretrained(dirs[0]), device="cpu")
    origins, head = forecast_origins(config), _head()
    on_card = hs.signals(predictor, head, origins, config)
    signals, described, _, _ = _backtest_signals(config, {"finetuned": predictor}, origins, {}, rank=0, world_size=1,
                                                 console=None, head=(head, {}), head_signal=on_card)
    daily = signal_origins(config)
    assert described and len(signals[hs.HEAD]) == len(daily) > len(origins)
    both = signals[hs.HEAD].join(pd.DataFrame({"card": on_card}, index=origins.index()), how="inner")
    assert len(both) and np.allclose(both["score"], both["card"], rtol=1e-6, atol=1e-9)
