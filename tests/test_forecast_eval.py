"""The forecast scorecard: origins follow the rule, the naive scores are recomputed from the raw
Qlib files on origins built here, a greedy forecast's MASE is recomputed through
``KronosPredictor``, and ``mlflow run . -e predictor`` / ``-e evaluate`` record every metric,
tag and artifact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tiny_runs import TINY, create_sqlite_store, isolated_env

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("mase_close", "crps_close", "direction_accuracy", "ic", "rank_ic", "icir")
#: How closely two runs' MASEs of the same origins, seed and checkpoints agree when one forecast
#: them in two torchrun workers (one thread each) and the other in one process (two threads):
#: the same tokens, decoded closes equal to float32 rounding (another thread count splits the
#: float32 matrix products otherwise).
MASE_REL = 1e-6


def skill_abs(skill: float, rel: float = MASE_REL) -> float:
    """How far apart two runs' ``skill = 1 - M / Z`` may be when each of the MASEs ``M`` and ``Z``
    agrees within ``rel``: ``M' / Z' = (M / Z)(1 + a) / (1 + b)`` with ``|a|, |b| <= rel``, so
    the skills differ by at most ``(1 - skill) 2 rel / (1 - rel)``. A relative tolerance on the
    skill itself would not follow: for two nearly equal MASEs (skill -0.0004) ``rel`` 1e-6 of
    the skill asks the MASEs to agree to 4e-10."""
    return abs(1.0 - skill) * 2.0 * rel / (1.0 - rel)


def _raw_origins(config) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Origins built from the provider's files alone (calendar, instrument spans, close bins):
    ``(symbol, lookback closes, future closes)`` of every calendar bar ``k % stride == 0`` whose
    first forecast bar comes after ``val_time_range``."""
    from kronos_mlflow.data.prepare import resolve_qlib_path

    root = resolve_qlib_path(config)
    calendar = np.array((root / "calendars" / "day.txt").read_text().split(), dtype="datetime64[D]")
    a, b = (np.datetime64(d, "D") for d in config["test_time_range"])
    test = np.flatnonzero((calendar >= a) & (calendar <= b))
    lookback, horizon = config["lookback_window"], config["predict_window"]
    stride = config["eval_stride"] or horizon
    val_end = np.datetime64(config["val_time_range"][1], "D")
    out = []
    for line in (root / "instruments" / f"{config['instrument']}.txt").read_text().splitlines():
        symbol, s0, s1 = line.split("\t")
        raw = np.fromfile(root / "features" / symbol.lower() / "close.day.bin", dtype="<f4")
        start, closes = int(raw[0]), raw[1:].astype(np.float64)
        span = test[(calendar[test] >= np.datetime64(s0)) & (calendar[test] <= np.datetime64(s1))]
        span = span[(span >= start) & (span < start + len(closes))]
        span = span[np.isfinite(closes[span - start])]  # a bar without a price is no bar
        if len(span) < lookback + horizon + 1:  # a test series holds at least one training window
            continue
        series = closes[span - start]
        for i in range(lookback - 1, len(span) - horizon):
            if (span[i] - test[0]) % stride == 0 and calendar[span[i + 1]] > val_end:
                out.append((symbol, calendar[span[i]], series[i - lookback + 1:i + 1], series[i + 1:i + 1 + horizon]))
    return out


def test_origins_follow_the_rule(tiny):
    from kronos_mlflow.evaluation.origins import forecast_origins

    for stride in (0, 3):
        config = tiny(eval_stride=stride, n_eval_windows=10**6)
        origins = forecast_origins(config)
        ours = {(s, str(d)[:10]) for s, d in zip(origins.instruments, origins.dates)}
        theirs = {(s, str(d)) for s, d, _, _ in _raw_origins(config)}
        assert ours == theirs and len(origins) == origins.candidates > 0
    limited = forecast_origins(tiny(n_eval_windows=100))
    assert 0 < len(limited) <= 100 and limited.candidates == len(forecast_origins(tiny(n_eval_windows=10**6)))
    # whole dates are kept: every symbol of a kept date
    full = forecast_origins(tiny(n_eval_windows=10**6))
    for date in np.unique(limited.dates):
        assert (limited.dates == date).sum() == (full.dates == date).sum()


def test_persistence_scores_match_the_raw_qlib_data(tiny):
    from kronos_mlflow.evaluation.scorecard import score_forecasters

    config = tiny(n_eval_windows=10**6)
    card = score_forecasters(config, {})
    mase, crps = [], []
    for _, _, past, future in _raw_origins(config):
        mase.append(np.abs(past[-1] - future).mean() / np.abs(np.diff(past)).mean())
        crps.append(np.abs(past[-1] - future).mean() / (past.std() + 1e-5))
    assert card.metrics["persistence_test_mase_close"] == pytest.approx(np.mean(mase), rel=1e-6)
    assert card.metrics["persistence_test_crps_close"] == pytest.approx(np.mean(crps), rel=1e-6)
    assert "persistence_test_direction_accuracy" not in card.metrics
    assert "test_mase_close" not in card.metrics and card.metrics["eval_origins"] == len(mase)


INTRADAY = {"freq": "30min", "train_time_range": "2024-01-02:2024-03-31", "val_time_range": "2024-03-01:2024-04-30",
            "test_time_range": "2024-05-01:2024-06-30", "dataset_begin_time": "2024-01-01",
            "dataset_end_time": "2024-06-30"}


def test_seasonal_naive_repeats_the_same_bar_of_the_latest_session(tiny):
    """Intraday: each future bar's forecast is the close of the latest observed bar at the same
    time of day, found here by timestamps."""
    from kronos_mlflow.evaluation.origins import CLOSE, forecast_origins
    from kronos_mlflow.evaluation.scorecard import score_forecasters
    from kronos_mlflow.evaluation.scores import origin_scores

    config = tiny(**INTRADAY)
    origins = forecast_origins(config)
    card = score_forecasters(config, {}, origins=origins)
    assert "seasonal_naive_test_mase_close" in card.metrics and "skill_vs_seasonal_naive" not in card.metrics
    paths = []
    for i in range(len(origins)):
        past_t, future_t = origins.times([i])
        past = origins.history([i])[0][:, CLOSE]
        tod = past_t[0] - past_t[0].astype("datetime64[D]")
        paths.append([past[np.flatnonzero(tod == t - t.astype("datetime64[D]"))[-1]] for t in future_t[0]])
    every = np.arange(len(origins))
    ours = origin_scores(np.array(paths)[:, None, :], origins.history(every)[..., CLOSE],
                         origins.future(every)[..., CLOSE])
    assert card.metrics["seasonal_naive_test_mase_close"] == pytest.approx(np.nanmean(ours["mase"]), rel=1e-9)


def _tiny_pair(seed: int = 0):
    import torch

    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.model import Kronos, KronosPredictor, KronosTokenizer
    from kronos_mlflow.config.model_spec import PREDICTOR_CONFIGS

    torch.manual_seed(seed)
    tokenizer = KronosTokenizer(**model_kwargs(TINY)).eval()
    model = Kronos(**{**PREDICTOR_CONFIGS["Kronos-mini"], "s1_bits": 4, "s2_bits": 4, "n_layers": 2, "d_model": 16,
                      "n_heads": 2, "ff_dim": 32}).eval()
    return KronosPredictor(model, tokenizer, device="cpu")


def test_skills_verdicts_and_signals(tiny, isolated):
    from kronos_mlflow.evaluation.scorecard import score_forecasters, write_artifacts

    config = tiny(n_eval_windows=60, inference_sample_count=2)
    predictor = _tiny_pair()
    card = score_forecasters(config, {"finetuned": predictor, "zeroshot": predictor})
    for prefix in ("test_", "zeroshot_test_"):
        assert all(f"{prefix}{m}" in card.metrics for m in METRICS[:3])
    assert card.metrics["skill_vs_zeroshot"] == 0.0  # the same pair, the same seed: the same paths
    assert card.tags["verdict_vs_zeroshot"] == "inconclusive"
    low, high = card.metrics["skill_vs_persistence_ci_low"], card.metrics["skill_vs_persistence_ci_high"]
    assert low <= card.metrics["skill_vs_persistence"] <= high
    assert card.tags["verdict_vs_persistence"] in ("better", "worse", "inconclusive")
    signal = card.signals["finetuned"]
    assert list(signal.index.names) == ["datetime", "instrument"] and list(signal.columns) == ["score"]
    assert len(signal) == card.metrics["eval_origins"]
    names = {p.name for p in write_artifacts(card, isolated / "evaluation")}
    assert names == {"scorecard.json", "scorecard.png", "forecasts.png", "origins.parquet", "horizons.png",
                     "forecasts.parquet", "pit.png", "reliability.png", "calibrator.json", "ensemble.json",
                     "ensemble.png", "coverage.png"}


def _greedy_mase_recomputed(config, predictor) -> None:
    """One greedy path (top_k=1) per origin through ``KronosPredictor.predict``, scored here,
    against the scorecard's ``test_mase_close``."""
    import pandas as pd

    from kronos_mlflow.evaluation.origins import forecast_origins
    from kronos_mlflow.evaluation.scorecard import score_forecasters

    card = score_forecasters(config, {"finetuned": predictor})
    origins = forecast_origins(config)
    cols = ["open", "high", "low", "close", "volume", "amount"]
    mase = []
    for i in range(len(origins)):
        past_t, future_t = origins.times([i])
        past, future = origins.history([i])[0], origins.future([i])[0]
        out = predictor.predict(pd.DataFrame(past.astype(np.float32), columns=cols), pd.Series(past_t[0]),
                                pd.Series(future_t[0]), origins.horizon, T=1.0, top_k=1, sample_count=1, verbose=False)
        scale = np.abs(np.diff(past[:, 3])).mean()
        mase.append(np.abs(out["close"].to_numpy() - future[:, 3]).mean() / scale)
    assert card.metrics["test_mase_close"] == pytest.approx(np.mean(mase), rel=1e-4)


def test_greedy_mase_is_kronos_predictors(tiny):
    _greedy_mase_recomputed(tiny(n_eval_windows=12, inference_top_k=1, inference_sample_count=1), _tiny_pair(3))


@pytest.fixture(scope="module")
def evaluate_run(user_predictor_run):
    """``mlflow run . -e evaluate`` on the shared predictor run's logged forecaster (with its
    config file), in its store and environment, experiment ``evaluate``; the run."""
    env = {**user_predictor_run.env, "MLFLOW_EXPERIMENT_NAME": "evaluate"}
    # a signal every 40th day (the entry point's default is every day: about 10 times the
    # scorecard's forecasts), where the predictor run had 0
    params = {"config_file": user_predictor_run.config, "model": f"runs:/{user_predictor_run.run_id}/best_model",
              "backtest_signal_stride": 40}
    cmd = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "evaluate",
           *[a for k, v in params.items() for a in ("-P", f"{k}={v}")]]
    proc = subprocess.run(cmd, cwd=user_predictor_run.root, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = user_predictor_run.client()
    (run,) = client.search_runs([client.get_experiment_by_name("evaluate").experiment_id])
    return run


def _assert_scorecard(client, run, extra: tuple[str, ...] = ()):
    """The scorecard's metrics, tags and artifacts; ``extra``: the artifacts only this kind of run
    writes (an evaluation run the levels its aci ended at, ``aci_state.json``)."""
    metrics, tags = run.data.metrics, run.data.tags
    for prefix in ("test_", "zeroshot_test_"):
        for m in METRICS:
            assert f"{prefix}{m}" in metrics, f"{prefix}{m}"
    assert "persistence_test_mase_close" in metrics and "persistence_test_crps_close" in metrics
    for skill in ("skill_vs_zeroshot", "skill_vs_persistence"):
        assert {skill, f"{skill}_ci_low", f"{skill}_ci_high"} <= set(metrics)
    assert tags["verdict_vs_zeroshot"] in ("better", "worse", "inconclusive")
    assert tags["verdict_vs_persistence"] in ("better", "worse", "inconclusive")
    for base in ("zeroshot", "persistence"):
        for kind in ("wql_skill", "gm_skill"):
            assert {f"{kind}_vs_{base}", f"{kind}_vs_{base}_ci_low", f"{kind}_vs_{base}_ci_high"} <= set(metrics)
        assert f"win_rate_vs_{base}" in metrics and tags[f"verdict_wql_vs_{base}"] in ("better", "worse", "inconclusive")
    for prefix in ("test_", "zeroshot_test_", "persistence_test_"):
        assert {f"{prefix}wql_close", f"{prefix}coverage_80", f"{prefix}mase_close_h1", f"{prefix}mase_close_h5"} <= set(metrics)
    assert {"direction_baseline", "test_direction_accuracy_ci_low", "test_direction_accuracy_ci_high"} <= set(metrics)
    names = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert names == {f"evaluation/{n}" for n in ("scorecard.json", "scorecard.png", "forecasts.png", "horizons.png",
                                                 "origins.parquet", "forecasts.parquet", "backtest.png", "pit.png",
                                                 "reliability.png", "calibrator.json", "ensemble.json",
                                                 "ensemble.png", "coverage.png", *extra)}
    # the probabilistic diagnostics, the volatility baseline and the calibrated forecaster
    for prefix in ("test_", "zeroshot_test_", "histvol_test_", "calibrated_test_"):
        for m in ("coverage_50", "coverage_80", "coverage_90", "coverage_80_h1", "pit_ks", "brier_up",
                  "brier_skill_up"):
            assert f"{prefix}{m}" in metrics, f"{prefix}{m}"
    assert {"base_rate_up", "base_rate_test_brier_up", "calibration_origins", "wql_skill_calibrated_vs_raw",
            "wql_skill_calibrated_vs_raw_ci_low", "wql_skill_calibrated_vs_raw_ci_high", "skill_vs_histvol",
            "wql_skill_vs_histvol", "histvol_test_crps_close"} <= set(metrics)
    for tag in ("verdict_calibrated_vs_raw", "verdict_vs_histvol", "verdict_wql_vs_histvol"):
        assert tags[tag] in ("better", "worse", "inconclusive"), tag
    # the saved forecasts give the logged WQL back (docs/forecast-evaluation.md's recipe)
    import mlflow
    import pandas as pd

    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="evaluation/forecasts.parquet",
                                               tracking_uri=client.tracking_uri)
    rows = pd.read_parquet(path)
    rows = rows[rows["forecaster"] == "finetuned"]
    levels = [round(0.1 * i, 1) for i in range(1, 10)]
    wql = np.mean([2 * np.maximum(lv * (rows.actual - rows[f"q{lv:.1f}"]), (lv - 1) * (rows.actual - rows[f"q{lv:.1f}"])
                                  ).sum() / rows.actual.abs().sum() for lv in levels])
    assert metrics["test_wql_close"] == pytest.approx(wql, rel=1e-6)
    # Qlib's backtest of both pairs' signals against the demo market's benchmark
    for signal in ("fine_tuned", "zero_shot"):
        for m in ("excess_return_with_cost", "information_ratio", "max_drawdown"):
            assert f"backtest_{signal}_{m}" in metrics, (signal, m)
    assert "backtest_benchmark_return" in metrics


@pytest.mark.slow
def test_mlflow_run_predictor_records_the_scorecard(user_predictor_run, user_run):
    """The shared ``mlflow run . -e predictor`` (tests/shared_runs.py, on the shared tokenizer
    run's best model) scores its forecaster."""
    run = user_predictor_run.run()
    _assert_scorecard(user_predictor_run.client(), run)
    # the zero-shot pair: the run's tokenizer (the tokenizer run's best model) + fresh predictor weights
    assert run.data.tags["zeroshot_pair"] == f"runs:/{user_run.run_id}/best_model + fresh"
    assert "[kronos] scorecard: " in user_predictor_run.stdout + user_predictor_run.stderr


@pytest.mark.slow
def test_mlflow_run_evaluate_scores_the_logged_forecaster(user_predictor_run, evaluate_run):
    client, predictor, evaluate = user_predictor_run.client(), user_predictor_run.run(), evaluate_run
    _assert_scorecard(client, evaluate, extra=("aci_state.json",))
    assert evaluate.data.tags["predictor_run_id"] == predictor.info.run_id
    # the zero-shot pair named by what a colleague can find again, not by a scratch directory
    assert evaluate.data.tags["zeroshot_pair"] == (f"runs:/{predictor.info.run_id}/best_model tokenizer + "
                                                   f"runs:/{predictor.info.run_id} starting weights")
    # the same origins, seed, batches and checkpoints (its zero-shot pair: the run's checkpoints/start):
    # the same numbers; the batches are one process's when batch_size divides the first rank's block
    assert -(-int(predictor.data.metrics["eval_origins"]) // 2) % int(predictor.data.params["batch_size"]) == 0
    for key in ("test_mase_close", "zeroshot_test_mase_close", "persistence_test_mase_close"):
        assert evaluate.data.metrics[key] == pytest.approx(predictor.data.metrics[key], rel=MASE_REL), key
    skill = predictor.data.metrics["skill_vs_zeroshot"]  # 1 - test_mase_close / zeroshot_test_mase_close
    assert evaluate.data.metrics["skill_vs_zeroshot"] == pytest.approx(skill, abs=skill_abs(skill))
    # the entry point's backtest_signal_stride 40 (the predictor run's was 0): a signal of its own
    # on every 40th day
    m = evaluate.data.metrics
    # the evaluation scores the calibrated forecaster the model serves: the calibrator the predictor
    # run fit and logged with it, not one fit again (paths of two ranks vs one process: equal to
    # float32 rounding)
    assert predictor.data.tags["calibration"] == "on" and evaluate.data.tags["calibration"] == "model"
    for key in ("calibrated_test_coverage_80", "calibrated_test_pit_ks", "wql_skill_calibrated_vs_raw",
                "calibration_origins"):
        assert m[key] == pytest.approx(predictor.data.metrics[key], rel=1e-6), key
    assert m["backtest_signal_origins"] > m["eval_origins"] == predictor.data.metrics["eval_origins"]
    assert m["backtest_signal_forecasts"] <= m["backtest_signal_origins"]
    assert "backtest_signal_origins" not in predictor.data.metrics
    assert m["backtest_fine_tuned_excess_return_with_cost"] != predictor.data.metrics[
        "backtest_fine_tuned_excess_return_with_cost"]


@pytest.mark.slow
def test_greedy_mase_on_the_logged_checkpoints(user_predictor_run, tiny, monkeypatch):
    import mlflow

    from kronos_mlflow.serving.forecasting.pyfunc import load_forecaster

    uri = user_predictor_run.uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # runs:/ of a logged model reads the store
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"runs:/{user_predictor_run.run_id}/best_model",
                                                     tracking_uri=uri, registry_uri=uri))
    predictor = load_forecaster(str(local / "artifacts" / "tokenizer"), str(local / "artifacts" / "predictor"),
                                device="cpu")
    _greedy_mase_recomputed(tiny(n_layers=2, n_eval_windows=12, inference_top_k=1, inference_sample_count=1),
                            predictor)


@pytest.mark.slow
def test_two_ranks_gather_the_same_greedy_scorecard_as_one_process(tmp_path, commands):
    """torchrun with two workers splits the origins across ranks; ``kronos-mlflow evaluate`` of
    the same run directory in one process gives the same greedy numbers."""
    import json

    env = isolated_env(tmp_path, create_sqlite_store(tmp_path))
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {
        **TINY, "epochs": 1, "n_layers": 2, "n_eval_windows": 60, "inference_top_k": 1, "inference_sample_count": 1,
        "n_val_skill_windows": 40, "comet": "off", "system_metrics": "off", "dataset_path": tmp_path / "cache"}.items()]
    train = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
             "kronos_mlflow.train_predictor", *flags, f"--save-path={tmp_path / 'outputs'}"]
    proc = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs" / "finetune_predictor_demo").iterdir()
    evaluate = ["kronos-mlflow", "evaluate", "--model", str(run_dir), "--zeroshot-predictor",
                str(run_dir / "checkpoints" / "start"), *[f for f in flags if not f.startswith("--epochs")]]
    proc = commands.run(evaluate, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((run_dir / "evaluation" / "scorecard.json").read_text())["metrics"]
    from mlflow import MlflowClient

    one = next(r for r in MlflowClient(env["MLFLOW_TRACKING_URI"]).search_runs(["0"])
               if r.data.tags.get("mlflow.runName", "").startswith("evaluate")).data.metrics
    for key in ("test_mase_close", "test_crps_close", "zeroshot_test_mase_close", "test_ic"):
        # float32 forecasts in batches of another composition (each rank's share vs all origins):
        # the same tokens, values equal to float32 rounding; a missed or repeated origin moves these
        # by far more than 1e-6
        assert one[key] == pytest.approx(two[key], rel=MASE_REL), key
    assert one["skill_vs_zeroshot"] == pytest.approx(two["skill_vs_zeroshot"], abs=skill_abs(two["skill_vs_zeroshot"]))


@pytest.mark.parametrize("metrics", [
    {"skill_vs_zeroshot": 0.0, "skill_vs_zeroshot_ci_low": 0.0, "skill_vs_zeroshot_ci_high": 0.0},
    {"skill_vs_zeroshot": 0.4, "skill_vs_zeroshot_ci_low": 0.399, "skill_vs_zeroshot_ci_high": 0.401,
     "skill_vs_persistence": -0.02, "skill_vs_persistence_ci_low": -0.03, "skill_vs_persistence_ci_high": -0.01},
    {"skill_vs_persistence": -3.2, "skill_vs_persistence_ci_low": -5.0, "skill_vs_persistence_ci_high": 0.001,
     "wql_skill_vs_persistence": 0.9, "wql_skill_vs_persistence_ci_low": 0.8, "wql_skill_vs_persistence_ci_high": 0.95,
     "gm_skill_vs_persistence": 0.001},
])
def test_the_scorecard_picture_draws_every_label_inside_its_axes(metrics):
    from types import SimpleNamespace

    from kronos_mlflow.evaluation.figures import scorecard_figure

    fig = scorecard_figure(SimpleNamespace(metrics=metrics, description="tiny"))
    fig.draw_without_rendering()
    (ax,) = fig.axes
    box = ax.get_window_extent()
    texts = [t for t in ax.texts if t.get_text()]
    assert len(texts) == sum(not k.endswith(("_ci_low", "_ci_high")) for k in metrics)
    for text in texts:
        extent = text.get_window_extent()
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, (text.get_text(), extent, box)
        assert box.y0 <= extent.y0 and extent.y1 <= box.y1, (text.get_text(), extent, box)
    # every label and tick inside the figure too
    for artist in [*texts, *ax.get_yticklabels(), ax.xaxis.label, ax.title]:
        extent = artist.get_window_extent()
        assert 0 <= extent.x0 and extent.x1 <= fig.bbox.x1 + 0.5, artist.get_text()
