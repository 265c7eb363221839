"""A fold sweep end to end, as small as it gets (two tiny fold trainings, about a minute here):
one trial on three folds of 20 bars against a study whose default settings' trial scored 0 on
every fold, so the paired Wilcoxon test (p < 0.3) prunes it after the latest and the earliest
fold. Its record: the trial's run KILLED with the folds it ran, its fold runs FINISHED children
tagged PRUNED, the parent's fold counts, folds.txt and its verdict against the default settings.
The flags and the statistics without training: tests/test_sweep_folds.py."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import tiny_runs
from mlflow import MlflowClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = {**tiny_runs.TINY_NO_EPOCHS, "n_train_iter": 32, "n_val_iter": 16, "evaluate": "off"}
FOLDS = ["--folds", "3", "--fold-length", "20"]


def _seeded_study(tmp_path, storage: str) -> None:
    """The study as a fold sweep of this plan leaves it after its default settings' trial (values 0)."""
    from kronos_mlflow.config import core as cfg
    from kronos_mlflow.workflows.sweep import folds as sf

    config = cfg.load_config({}, path=str(tmp_path / "tiny.yaml"))
    args = argparse.Namespace(folds="3", p_threshold="0.3", pruner="", **{f"wf_{k}": d for k, (d, _) in
                                                                          sf.SETTINGS.items()})
    args.wf_fold_length = "20"
    sf.check_args(args)
    plan = sf.plan_of(args, config, lambda *_: None)
    study = optuna.create_study(study_name="s", storage=storage, direction="minimize")
    sf.check_study_plan(study, plan, args.fold_settings)
    dist = {"learning_rate": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True),
            "weight_decay": optuna.distributions.FloatDistribution(1e-4, 0.3, log=True)}
    study.add_trial(optuna.trial.create_trial(
        params={"learning_rate": 2e-4, "weight_decay": 0.1}, distributions=dist, value=0.0,
        intermediate_values={1: 0.0, 2: 0.0, 3: 0.0}, user_attrs={"default_settings": True, "folds_run": 3}))


def test_a_trial_worse_on_its_first_folds_is_pruned_and_pays_for_two(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_runs.write_config(tmp_path / "tiny.yaml", **TINY, dataset_path=str(tmp_path / "cache"))
    env = tiny_runs.isolated_env(tmp_path, tiny_runs.create_sqlite_store(tmp_path))
    storage = f"sqlite:///{tmp_path}/optuna.db"
    monkeypatch.setenv("KRONOS_MLFLOW_HOME", env["KRONOS_MLFLOW_HOME"])
    _seeded_study(tmp_path, storage)
    cmd = [sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--config", str(tmp_path / "tiny.yaml"),
           "--storage", storage, "--study-name", "s", "--comet", "off", "--epochs", "1", "--n-trials", "1",
           "--output-dir", str(tmp_path / "out"), "--p-threshold", "0.3", "--sampler-seed", "1", *FOLDS]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "in the order 3, 1, 2" in proc.stdout
    study = optuna.load_study(study_name="s", storage=storage)
    trial = study.trials[1]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert sorted(trial.intermediate_values) == [1, 3] and trial.user_attrs["folds_run"] == 2
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run = client.get_run(trial.user_attrs["mlflow_run_id"])
    assert run.info.status == "KILLED" and run.data.tags["optuna.trial_state"] == "PRUNED"
    assert run.data.tags["stop_reason"].startswith("pruned after 2 of 3 folds (fold 3 ")
    history = sorted(client.get_metric_history(run.info.run_id, "fold_score"), key=lambda m: m.timestamp)
    assert [m.step for m in history] == [3, 1]  # the latest fold first, then the earliest
    folds = {int(r.data.tags["sweep.fold"]): r for r in client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")}
    assert sorted(folds) == [1, 3]
    for k, fold in folds.items():
        assert fold.info.status == "FINISHED" and fold.data.tags["optuna.trial_state"] == "PRUNED"
        assert fold.data.metrics["best_val_loss"] == pytest.approx(trial.intermediate_values[k])
        assert run.data.tags[f"sweep.fold{k}_run_id"] == fold.info.run_id
    assert folds[3].data.params["test_time_range"].endswith("2025-06-05")  # the latest fold ends the market
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.params["folds"] == "3" and parent.data.params["fold_order"] == "3 1 2"
    assert parent.data.metrics["trial_folds"] == 2 and parent.data.metrics["trials_pruned"] == 1
    assert parent.data.tags["best_vs_default_verdict"] == "inconclusive"
    assert "folds.txt" in {a.path for a in client.list_artifacts(parent.info.run_id)}
