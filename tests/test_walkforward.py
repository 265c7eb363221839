"""``mlflow run . -e walkforward`` end to end on the demo market with the tiny sizes: three
folds, each a pipeline under one parent; the fold table, what each fold forecasts, the pooled
verdict recomputed from the folds' own files, a second identical command that trains nothing,
``--aggregate`` equal to the command's own aggregate; and the fold table's refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tiny_runs import TINY, create_sqlite_store, isolated_env, write_config

from kronos_mlflow.config import load_config
from kronos_mlflow.errors import UserError
from kronos_mlflow.evaluation.scores import skill
from kronos_mlflow.walkforward import folds as fl

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("epochs", "batch_size", "n_train_iter", "n_val_iter")
SMALL = {"epochs": 1, "predictor_epochs": 1, "batch_size": 8, "n_train_iter": 64, "n_val_iter": 36, "comet": "off",
         "folds": 3, "fold_length": "2M"}


def _calendar(n: int = 400) -> np.ndarray:
    return np.array(pd.bdate_range("2020-01-01", periods=n), dtype="datetime64[s]")


def _config(**extra):
    return load_config({"lookback_window": 20, "predict_window": 5, "train_time_range": "2020-01-01:2020-12-31",
                        "val_time_range": "2020-06-01:2021-03-31", "test_time_range": "2021-01-01:2021-06-30", **extra})


def _settings(**extra) -> fl.Settings:
    values = {"folds": 3, "fold_length": "1M", "mode": "expanding", "train_length": "", "embargo": None,
              "val_length": "", "end": "", "retrain": "predictor", **extra}
    return fl.Settings.checked(**values)


def _index(calendar, day: str) -> int:
    return int(np.flatnonzero(calendar == np.datetime64(day, "s"))[0])


def assert_walk_forward(folds: list[fl.Fold], calendar: np.ndarray, lookback: int) -> None:
    """Consecutive disjoint test periods; each fold's validation ends `embargo` bars before its
    test starts; training ends the bar before validation; its config ranges give lookback only."""
    for before, fold in zip(folds, folds[1:], strict=False):
        assert _index(calendar, fold.test[0]) == _index(calendar, before.test[1]) + 1
    for fold in folds:
        t0, v0, v1 = (_index(calendar, d) for d in (fold.test[0], fold.val[0], fold.val[1]))
        assert t0 - v1 - 1 == fold.embargo
        assert _index(calendar, fold.train[1]) == v0 - 1
        assert _index(calendar, fold.ranges["test_time_range"][0]) == t0 - lookback
        assert fold.ranges["test_time_range"][1] == fold.test[1]
        assert fold.ranges["train_time_range"][1] == fold.train[1] < fold.val[0]


def test_the_fold_table_is_consecutive_with_the_embargo_in_both_modes():
    calendar, config = _calendar(), _config()
    expanding = fl.plan(config, _settings(), calendar)
    assert [f.fold for f in expanding] == [1, 2, 3] and expanding[-1].test[1] == "2021-06-30"
    assert_walk_forward(expanding, calendar, 20)
    assert {f.train[0] for f in expanding} == {"2020-01-01"} and expanding[0].embargo == 5  # predict_window
    rolling = fl.plan(config, _settings(mode="rolling", train_length="60", embargo="2", val_length="15"), calendar)
    assert_walk_forward(rolling, calendar, 20)
    assert {f.train_bars for f in rolling} == {60} and {f.val_bars for f in rolling} == {15}
    assert [f.test for f in rolling] == [f.test for f in expanding]  # the test periods do not depend on the mode
    # predictor (default): every fold's tokenizer is the first fold's, trained before any test bar
    assert all(fl.tokenizer_ranges(expanding, _settings(), f) == expanding[0].ranges for f in expanding)
    assert fl.tokenizer_ranges(expanding, _settings(retrain="both"), expanding[2]) == expanding[2].ranges
    assert fl.table(expanding).splitlines()[1].split()[:2] == ["1", f"{expanding[0].train[0]}..{expanding[0].train[1]}"]


@pytest.mark.parametrize(("settings", "needle"), [
    ({"folds": "0"}, "folds: 0 is out of range; expected an integer from 1 to 100"),
    ({"fold_length": "3Q"}, "fold_length: '3Q' is not a length; expected a number of bars (60) or a calendar span"),
    ({"mode": "sideways"}, "walkforward_mode: 'sideways' is not one of expanding, rolling"),
    ({"mode": "rolling"}, "walkforward_mode rolling keeps train_length bars of training per fold, and train_length is "
                          "empty"),
    ({"retrain": "tokenizer"}, "walkforward_retrain: 'tokenizer' is not one of predictor, both"),
    ({"embargo": "-3"}, "embargo: -3 is out of range"),
    ({"end": "2021-02-30"}, "walkforward_end: '2021-02-30' is not a date"),
])
def test_bad_settings_are_one_line_naming_the_value(settings, needle):
    with pytest.raises(UserError) as caught:
        _settings(**settings)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_folds_that_cannot_be_built_are_refused_naming_the_fold():
    calendar, config = _calendar(), _config()
    with pytest.raises(UserError, match=r"^fold 1: its training period .* has \d+ bars; expected at least 25"):
        fl.plan(config, _settings(folds=16), calendar)
    with pytest.raises(UserError, match=r"^fold \d+: its training period .* would start before the calendar's first bar"):
        fl.plan(config, _settings(mode="rolling", train_length="1Y", folds=6), calendar)


def _workdir(root: Path) -> tuple[Path, dict[str, str]]:
    root.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in TINY.items() if k not in SIZES}
    write_config(root / "tiny.yaml", **config, n_layers=2, save_path=str(root / "outputs"),
                 dataset_path=str(root / "cache"))
    return root, isolated_env(root, create_sqlite_store(root))


def _walk_forward(root: Path, env: dict, **params) -> subprocess.CompletedProcess:
    values = {**SMALL, "config_file": root / "tiny.yaml", **params}
    command = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "walkforward",
               *[a for k, v in values.items() for a in ("-P", f"{k}={v}")]]
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


@pytest.mark.slow
def test_mlflow_run_walkforward_judges_each_fold_and_pools_them(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    root, env = _workdir(tmp_path / "wf")
    first = _walk_forward(root, env)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(["0"], order_by=["attributes.start_time ASC"])
    (parent,) = [r for r in runs if r.data.tags.get("walkforward.role") == "parent"]
    pid = parent.info.run_id
    assert parent.info.status == "FINISHED"
    assert "fold  train" in first.stdout and f"[walk-forward] done: parent run {pid}" in first.stdout

    table = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=pid, artifact_path="walkforward/folds.json", dst_path=str(tmp_path / "a"),
        tracking_uri=env["MLFLOW_TRACKING_URI"])).read_text())
    folds = [fl.Fold(**{**f, **{k: tuple(f[k]) for k in ("train", "val", "test")}}) for f in table["folds"]]
    calendar_file = next((Path(env["KRONOS_MLFLOW_HOME"]) / "demo_market").glob("*/calendars/day.txt"))
    calendar = np.array(calendar_file.read_text().split(), dtype="datetime64[s]")
    assert len(folds) == 3 and folds[-1].test[1] == "2025-06-05"
    assert_walk_forward(folds, calendar, TINY["lookback_window"])

    # each fold: a pipeline parent under the walk-forward parent, its evaluation's scorecard; no
    # origin forecasts a bar before the fold's training, validation and embargo end
    pooled, verdicts = [], []
    for fold in folds:
        fold_run = client.get_run(parent.data.tags[f"walkforward.fold{fold.fold}_run_id"])
        assert fold_run.data.tags["mlflow.parentRunId"] == pid and fold_run.info.status == "FINISHED"
        evaluation = client.get_run(fold_run.data.tags["pipeline.evaluation_run_id"])
        assert evaluation.data.params["test_time_range"] == ":".join(fold.ranges["test_time_range"])
        origins = pd.read_parquet(mlflow.artifacts.download_artifacts(
            run_id=evaluation.info.run_id, artifact_path="evaluation/origins.parquet",
            dst_path=str(tmp_path / f"o{fold.fold}"), tracking_uri=env["MLFLOW_TRACKING_URI"]))
        first_forecast = np.searchsorted(calendar, origins["datetime"].to_numpy(dtype="datetime64[s]"), side="right")
        assert calendar[first_forecast].min() >= np.datetime64(fold.test[0], "s") > np.datetime64(fold.val[1], "s")
        pooled.append(origins)
        verdicts.append(evaluation.data.tags["verdict_vs_zeroshot"])
    every = pd.concat(pooled)
    value, low, high = skill(every["finetuned_mase"], every["zeroshot_mase"], every["datetime"].to_numpy())
    metrics = client.get_run(pid).data.metrics
    assert metrics["pooled_skill_vs_zeroshot"] == pytest.approx(value, rel=1e-9, abs=1e-12)
    assert metrics["folds_better_vs_zeroshot"] == sum(v == "better" for v in verdicts)
    history = client.get_metric_history(pid, "fold_skill_vs_zeroshot")
    assert sorted(m.step for m in history) == [1, 2, 3]
    artifacts = {a.path for a in client.list_artifacts(pid, "walkforward")}
    assert {"walkforward/summary.json", "walkforward/skill_by_fold.png", "walkforward/folds.json"} <= artifacts

    # the same command again trains nothing: every step of every fold is reused
    trained = {r.info.run_id for r in client.search_runs(["0"]) if r.data.tags.get("pipeline.step")}
    again = _walk_forward(root, env)
    assert {r.info.run_id for r in client.search_runs(["0"]) if r.data.tags.get("pipeline.step")} == trained
    assert again.stdout.count("reused run") == 3 * 3, again.stdout[-3000:]

    # --aggregate recomputes the same verdict from the parent's own folds
    proc = subprocess.run([sys.executable, "-m", "kronos_mlflow", "walk-forward", "--aggregate", pid], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert client.get_run(pid).data.metrics["pooled_skill_vs_zeroshot"] == metrics["pooled_skill_vs_zeroshot"]
    bad = subprocess.run([sys.executable, "-m", "kronos_mlflow", "walk-forward", "--aggregate",
                          fold_run.info.run_id], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "is not a walk-forward parent" in bad.stderr and "Traceback" not in bad.stderr
