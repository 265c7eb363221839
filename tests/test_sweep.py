"""Sweeps end to end on the demo market with a tiny model: parent and child runs, resume,
pruning from inside torchrun, the champion alias, plots. Two workers on one study:
test_sweep_distinct (sqlite, through mlflow run) and test_team_scale (PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import tiny_runs
from mlflow import MlflowClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# the sweep sets epochs itself
TINY = {**tiny_runs.TINY_NO_EPOCHS, "n_val_iter": 32}


@pytest.fixture()
def sweep_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a new store's artifact root under the cwd
    tiny_runs.write_config(tmp_path / "tiny.yaml", **TINY, dataset_path=str(tmp_path / "cache"))
    # Create the MLflow store once, before several processes race to migrate it.
    env = tiny_runs.isolated_env(tmp_path, tiny_runs.create_sqlite_store(tmp_path))
    return tmp_path, env


def _sweep_cmd(tmp_path, *extra):
    return [sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--config", str(tmp_path / "tiny.yaml"),
            "--storage", f"sqlite:///{tmp_path}/optuna.db", "--study-name", "s", "--qlib-data-path", "",
            "--comet", "off", "--epochs", "2", "--output-dir", str(tmp_path / "out"), *extra]


def _run(cmd, env, cwd):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _children(client, parent_id):
    return client.search_runs(["0"], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")


def _parents(client):
    return [r for r in client.search_runs(["0"]) if r.data.tags.get("sweep.role") == "parent"]


def test_four_trials_then_resume(sweep_env):
    tmp_path, env = sweep_env
    proc = _run(_sweep_cmd(tmp_path, "--n-trials", "4", "--pruner", "none", "--sampler-seed", "1",
                           "--registered-model-name", "kronos-tok", "--promote", "always"), env, tmp_path)
    assert "best: trial" in proc.stdout

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (parent,) = _parents(client)
    children = _children(client, parent.info.run_id)
    assert len(children) == 4
    pairs = set()
    for run in children:
        p, t = run.data.params, run.data.tags
        lr, wd = float(p["learning_rate"]), float(p["weight_decay"])
        assert 1e-5 <= lr <= 1e-3 and (wd == 0.0 or 1e-4 <= wd <= 0.3)
        pairs.add((lr, wd))
        assert t["optuna.study_name"] == "s" and t["optuna.trial_state"] == "COMPLETE"
        assert run.info.status == "FINISHED" and "best_val_loss" in run.data.metrics
        assert len(client.get_metric_history(run.info.run_id, "val_tokenizer_loss_epoch")) == 2
    assert len(pairs) == 4
    assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == [0, 1, 2, 3]

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/optuna.db")
    best = study.best_trial
    best_run = best.user_attrs["mlflow_run_id"]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["best_run"] == best_run
    assert parent.data.metrics["best_val_loss"] == pytest.approx(best.value)
    assert float(parent.data.params["best_learning_rate"]) == pytest.approx(best.params["learning_rate"])
    assert parent.data.metrics["best_val_loss"] == pytest.approx(
        min(r.data.metrics["best_val_loss"] for r in children))

    # champion (--promote always): the best trial's model, whatever its test verdict
    champion = client.get_model_version_by_alias("kronos-tok", "champion")
    assert champion.run_id == best_run
    # plots and the summary table on the parent
    plots = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"optimization_history.png", "param_importances.png", "contour_lr_wd.png"} <= plots
    assert "trials.txt" in {a.path for a in client.list_artifacts(parent.info.run_id)}

    # rerunning the same command resumes the study and adds trials
    _run(_sweep_cmd(tmp_path, "--n-trials", "1", "--pruner", "none", "--registered-model-name", "kronos-tok",
                    "--promote", "always"),
         env, tmp_path)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    assert len(_parents(client)) == 2
    champion = client.get_model_version_by_alias("kronos-tok", "champion")
    assert champion.run_id == study.best_trial.user_attrs["mlflow_run_id"]


def test_pruned_trial_under_torchrun_is_marked_and_keeps_metrics(sweep_env):
    tmp_path, env = sweep_env
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=url, direction="minimize")
    # A finished trial far better at every epoch: any real trial is pruned after epoch 0.
    dist = {"learning_rate": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True)}
    study.add_trial(optuna.trial.create_trial(params={"learning_rate": 1e-4}, distributions=dist, value=0.0,
                                              intermediate_values={0: 0.0, 1: 0.0}))
    _run(_sweep_cmd(tmp_path, "--n-trials", "1", "--nproc-per-node", "2",
                    "--pruner", "median:n_startup_trials=1,n_warmup_steps=0"), env, tmp_path)
    study = optuna.load_study(study_name="s", storage=url)
    trial = study.trials[1]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert list(trial.intermediate_values) == [0]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run = client.get_run(trial.user_attrs["mlflow_run_id"])
    assert run.info.status == "KILLED"
    assert run.data.tags["optuna.trial_state"] == "PRUNED"
    assert "pruned" in run.data.tags["stop_reason"]
    history = client.get_metric_history(run.info.run_id, "val_tokenizer_loss_epoch")
    assert [m.step for m in history] == [0]
    assert history[0].value == pytest.approx(trial.intermediate_values[0])
    assert run.data.params["nproc_per_node"] == "2"
