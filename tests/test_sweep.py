"""Sweeps end to end on the demo market with a tiny model: parent and child runs, resume,
pruning from inside torchrun, the champion alias, plots (the first on the shared sweep of
tests/shared_runs.py). Two workers on one study: test_sweep_distinct (sqlite, through mlflow
run) and test_team_scale (PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import tiny_runs
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from shared_runs import REGISTERED_MODEL

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


def test_a_sweep_and_its_resume_record_trials_parents_champion_and_plots(user_sweep):
    """The shared ``mlflow run . -e sweep`` typed twice (tests/shared_runs.py: two trials each,
    the default pruner, a registered model): each parent's children, their params and tags, the
    parent's summary of the study's best, the champion, the plots; the second command resumed the
    study. Which draws never repeat: tests/test_sweep_distinct.py."""
    client, n = user_sweep.client(), user_sweep.n_trials
    assert all("best: trial" in out for out, _ in user_sweep.outputs)
    study = user_sweep.study()
    assert [t.number for t in study.trials] == list(range(2 * n))  # resumed: numbers go on
    by_number = {t.number: t for t in study.trials}
    first, second = parents = user_sweep.parents()
    # each command ends saying where its parent is, its best trial, and what to type next
    for (out, _), parent in zip(user_sweep.outputs, sorted(parents, key=lambda r: r.info.start_time), strict=True):
        pid = parent.info.run_id
        assert f"[sweep] done: sweep parent run {pid}: best trial #" in out, out[-2000:]
        assert f"[sweep] its trials: kronos-mlflow compare --parent {pid}" in out
        assert f"[sweep] look at it: mlflow ui --backend-store-uri {user_sweep.uri}" in out
    pairs = set()
    for k, parent in enumerate(parents):
        children = user_sweep.children(parent.info.run_id)
        assert sorted(int(r.data.tags["optuna.trial_number"]) for r in children) == list(range(k * n, (k + 1) * n))
        for run in children:
            p, t = run.data.params, run.data.tags
            lr, wd = float(p["learning_rate"]), float(p["weight_decay"])
            assert 1e-5 <= lr <= 1e-3 and (wd == 0.0 or 1e-4 <= wd <= 0.3)
            pairs.add((lr, wd))
            trial = by_number[int(t["optuna.trial_number"])]
            assert t["optuna.study_name"] == user_sweep.study_name and t["optuna.trial_state"] == trial.state.name
            assert trial.user_attrs["mlflow_run_id"] == run.info.run_id
            epochs = len(client.get_metric_history(run.info.run_id, "val_tokenizer_loss_epoch"))
            if trial.state == optuna.trial.TrialState.COMPLETE:
                assert run.info.status == "FINISHED" and "best_val_loss" in run.data.metrics and epochs == 2
            else:  # pruned by successive halving: KILLED, with the epochs it trained
                assert trial.state == optuna.trial.TrialState.PRUNED and run.info.status == "KILLED" and epochs >= 1
        # plots and the trials table on each parent
        plots = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "plots")}
        assert {"optimization_history.png", "param_importances.png", "contour_lr_wd.png"} <= plots
        assert "trials.txt" in {a.path for a in client.list_artifacts(parent.info.run_id)}
        assert parent.info.status == "FINISHED"
    assert len(pairs) == 2 * n

    # the first parent: the best of the study as it was then (its param keeps the first value)
    done_then = [t for t in study.trials[:n] if t.state == optuna.trial.TrialState.COMPLETE]
    best_then = min(done_then, key=lambda t: t.value)
    assert first.data.tags["best_run"] == best_then.user_attrs["mlflow_run_id"]
    assert float(first.data.params["best_learning_rate"]) == pytest.approx(best_then.params["learning_rate"])
    # the second: the study's best after the resume
    best = study.best_trial
    assert second.data.tags["best_run"] == best.user_attrs["mlflow_run_id"]
    assert second.data.metrics["best_val_loss"] == pytest.approx(best.value)
    # each parent shows its best trial's test verdict, and the champion moved only on better
    for parent in parents:
        _check_champion_rule(client, parent)
    try:
        champion = client.get_model_version_by_alias(REGISTERED_MODEL, "champion")
    except MlflowException:  # no best trial was ever better
        assert all("champion" not in p.data.tags for p in parents)
    else:
        assert client.get_run(champion.run_id).data.tags["verdict"] == "better"
        moved = [p.data.tags["champion"] for p in parents if "champion" in p.data.tags]
        assert moved and moved[-1] == f"{REGISTERED_MODEL}/{champion.version}"  # the last move stands


def _check_champion_rule(client, parent) -> None:
    """The parent's best_trial_* numbers and verdict are its best trial's; the alias moved
    (tag champion) only for a better verdict, and otherwise champion_unchanged says why."""
    best = client.get_run(parent.data.tags["best_run"])
    verdict = best.data.tags["verdict"]
    assert parent.data.tags["best_trial_verdict"] == verdict
    assert parent.data.metrics["best_trial_test_tokenizer_loss"] == pytest.approx(
        best.data.metrics["test_tokenizer_loss"])
    trial = best.data.tags["optuna.trial_number"]
    if verdict != "better":
        assert "champion" not in parent.data.tags
        assert parent.data.tags["champion_unchanged"].startswith(
            f"best trial {trial}'s test verdict is {verdict}, not better")
    elif "champion" in parent.data.tags:
        version = parent.data.tags["champion"].split("/")[-1]
        assert client.get_model_version(REGISTERED_MODEL, version).run_id == best.info.run_id
    else:  # better, but not better than the champion on the same windows
        assert "does not beat the champion's" in parent.data.tags["champion_unchanged"]


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
