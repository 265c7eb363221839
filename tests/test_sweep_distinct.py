"""No trial of a study repeats another's (learning_rate, weight_decay): seeds derived per process,
repeats detected before training; the user's command (`mlflow run . -e sweep`) typed twice on one
study (the shared sweep of tests/shared_runs.py); the parent run's summary; bad input (seed,
pruner, search space). Workers at once: tests/test_hostile_launchers.py (three on a fresh sqlite
store) and tests/test_team_scale.py (PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from shared_runs import sweep_command, sweep_dir

from kronos_mlflow.errors import ConfigError
from kronos_mlflow.workflows.sweep.space import load_search_space, suggest
from kronos_mlflow.workflows.sweep.study import (
    derive_sampler_seed, open_storage, open_study, param_key, repeated_trial,
)
from kronos_mlflow.training.trial import DEFAULT_PRUNER, make_pruner

ROOT = Path(__file__).resolve().parents[1]
SPACE = load_search_space()

# --------------------------------------------------------------------------- seeds and the repeat check


def _draws(url, name, seed, n):
    study = open_study(open_storage(url, heartbeat=False), name, make_pruner("none"), seed)
    out = []
    for _ in range(n):
        trial = study.ask()
        values = suggest(trial, SPACE)
        out.append((values["learning_rate"], values["weight_decay"]))
        study.tell(trial, values["learning_rate"])
    return out


def test_seed_reproduces_a_fresh_study_and_a_resumed_one_draws_new_points(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    first = _draws(url, "a", 3, 3)
    assert _draws(url, "b", 3, 3) == first  # same seed, fresh study: the same sweep
    resumed = _draws(url, "a", 3, 3)  # same command again on the same study
    assert not set(resumed) & set(first)
    assert derive_sampler_seed(3, 0) == 3 and derive_sampler_seed(None, 5) is None
    assert derive_sampler_seed(3, 3) == derive_sampler_seed(3, 3) != derive_sampler_seed(3, 4)


def test_repeat_check_lets_exactly_one_of_two_identical_draws_train(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    storage = open_storage(url, heartbeat=False)
    a = open_study(storage, "s", make_pruner("none"), 0)
    b = optuna.load_study(study_name="s", storage=storage, sampler=optuna.samplers.TPESampler(seed=0))
    ta, tb = a.ask(), b.ask()
    va, vb = suggest(ta, SPACE), suggest(tb, SPACE)
    assert va == vb  # two workers with one seed draw the same point
    # both drew before either checked: the higher number yields, whoever checks first
    assert repeated_trial(b, tb) == ta.number
    assert repeated_trial(a, ta) is None
    b.tell(tb, state=optuna.trial.TrialState.FAIL)
    # a finished trial blocks any later draw of its point; a FAIL one blocks nothing
    a.tell(ta, 1.0)
    c = optuna.load_study(study_name="s", storage=storage, sampler=optuna.samplers.TPESampler(seed=0))
    tc = c.ask()
    assert suggest(tc, SPACE) == va
    assert repeated_trial(c, tc) == ta.number
    # a FAIL trial (crashed, or a skipped repeat) blocks nothing: its point may be retried
    d = optuna.create_study(study_name="d", storage=storage)
    d.add_trial(optuna.trial.create_trial(params=tb.params, distributions=tb.distributions,
                                          state=optuna.trial.TrialState.FAIL))
    d.sampler = optuna.samplers.TPESampler(seed=0)
    td = d.ask()
    assert suggest(td, SPACE) == va and repeated_trial(d, td) is None
    assert param_key({"learning_rate": 1e-4, "weight_decay_is_zero": True, "weight_decay": 0.1}) == ("0.0001", "0.0")


def test_default_pruner_halves_on_epochs():
    pruner = make_pruner(DEFAULT_PRUNER)
    assert isinstance(pruner, optuna.pruners.SuccessiveHalvingPruner)
    assert pruner._min_resource == 1 and pruner._reduction_factor == 3
    assert isinstance(make_pruner("hyperband"), optuna.pruners.HyperbandPruner)


# --------------------------------------------------------------------------- bad input


def _sweep(commands, *args, cwd):
    """``python sweeps/sweep.py ARGS`` (through the session's fork server)."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{cwd}/mlflow.db")
    return commands.run([sys.executable, str(ROOT / "sweeps" / "sweep.py"), *args], cwd=cwd, env=env, timeout=120)


DUPLICATE_PARAM = "learning_rate: {low: 1.0e-5, high: 1.0e-3}\nweight_decay: {low: 0.1, high: 0.2}\n" \
                  "learning_rate: {low: 1.0e-4, high: 1.0e-3}\n"
DUPLICATE_OPTION = "learning_rate: {low: 1.0e-5, high: 1.0e-3, low: 1.0e-4}\nweight_decay: {low: 0.1, high: 0.2}\n"
MISSING_PARAM = "weight_decay: {low: 0.1, high: 0.2}\n"


@pytest.mark.parametrize("text, needle", [(DUPLICATE_PARAM, "'learning_rate' twice (line 3)"),
                                          (DUPLICATE_OPTION, "'low' twice (line 1)"),
                                          (MISSING_PARAM, "'learning_rate' needs")])
def test_search_space_with_a_repeated_or_missing_parameter(tmp_path, commands, text, needle):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_search_space(path)
    proc = _sweep(commands, "--search-space", str(path), "--storage", f"sqlite:///{tmp_path}/o.db", cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "o.db").exists()


@pytest.mark.parametrize("args, needle", [
    (["--sampler-seed", "abc"], "--sampler-seed: 'abc' is not an integer"),
    (["--sampler-seed", "1.5"], "--sampler-seed"),
    (["--pruner", "halving"], "pruner 'halving' is not one of successive_halving"),
    (["--trial-epochs-budget", "-3"], "--trial-epochs-budget"),
])
def test_bad_seed_pruner_budget_one_line_exit_2(tmp_path, commands, args, needle):
    proc = _sweep(commands, *args, "--storage", f"sqlite:///{tmp_path}/o.db", cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "o.db").exists()


# --------------------------------------------------------------------------- the user's commands

@pytest.fixture()
def project_env(tmp_path, monkeypatch):
    """`mlflow run` runs in the project directory: config, store, study and outputs in tmp_path."""
    monkeypatch.chdir(tmp_path)
    return sweep_dir(tmp_path)


def _mlflow_run_sweep(tmp_path, *params, epochs=2):
    return sweep_command(tmp_path, *params, epochs=epochs)


def _pairs(study):
    live = [t for t in study.trials if t.state != optuna.trial.TrialState.FAIL]
    return [param_key(t.params) for t in live]


def _check_study_and_runs(tmp_path, env, n_parents, n_trials):
    study = optuna.load_study(study_name="kronos-lr-wd", storage=f"sqlite:///{tmp_path}/optuna.db")
    pairs = _pairs(study)
    assert len(pairs) == n_trials and len(set(pairs)) == n_trials, pairs
    # every trial that is not a skipped repeat trained; a skipped repeat has no MLflow run
    for t in study.trials:
        if t.state == optuna.trial.TrialState.FAIL:
            assert "duplicate_of" in t.user_attrs and "mlflow_run_id" not in t.user_attrs
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(["0"])
    parents = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == n_parents and len(children) == n_trials
    assert {r.info.run_id for r in children} == {t.user_attrs["mlflow_run_id"] for t in study.trials
                                                 if t.state != optuna.trial.TrialState.FAIL}
    for parent in parents:
        m = parent.data.metrics
        assert parent.info.status == "FINISHED"
        assert m["trials_complete"] + m["trials_pruned"] + m["trials_failed"] == n_trials // n_parents
        assert m["trials_failed"] == 0
        mine = [c for c in children if c.data.tags["mlflow.parentRunId"] == parent.info.run_id]
        assert m["trial_epochs"] == sum(len(client.get_metric_history(c.info.run_id, "val_tokenizer_loss_epoch"))
                                        for c in mine)
        assert parent.data.params["pruner"] == DEFAULT_PRUNER and parent.data.params["sampler_seed"] == "0"
    # the first trial to reach a rung always goes on, so one trial at least is complete
    assert any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    # The parent that summed the study up last (not always the last to end: two workers at once
    # finish their own last steps, plots and champion, at their own pace) saw every trial.
    def seen(run):
        return run.data.metrics["study_trials_complete"] + run.data.metrics["study_trials_pruned"]

    last = max(parents, key=seen)
    assert seen(last) == n_trials
    assert last.data.metrics["best_val_loss"] == pytest.approx(study.best_value)
    assert float(last.data.tags["best_learning_rate"]) == pytest.approx(study.best_params["learning_rate"])
    # at most one champion, and only a trial whose test verdict is better (promote better, the
    # default; the rule itself: tests/test_sweep.py and tests/test_verdict_runs.py)
    try:
        champion = client.get_model_version_by_alias("kronos-tok", "champion")
    except MlflowException:
        assert not [p for p in parents if "champion" in p.data.tags]
    else:
        assert client.get_run(champion.run_id).data.tags["verdict"] == "better"
        assert client.get_registered_model("kronos-tok").aliases == {"champion": champion.version}
    return study


@pytest.mark.slow
def test_mlflow_run_sweep_twice_on_one_study_never_repeats(user_sweep):
    """The shared sweep (tests/shared_runs.py): the same command twice, the second resumes."""
    _check_study_and_runs(user_sweep.root, user_sweep.env, n_parents=2, n_trials=2 * user_sweep.n_trials)
    assert (user_sweep.root / "outputs" / "sweeps" / "kronos-lr-wd").is_dir()


@pytest.mark.slow
def test_a_draw_that_repeats_a_finished_trial_is_not_run(project_env):
    tmp_path, env = project_env
    url = f"sqlite:///{tmp_path}/optuna.db"
    # What a worker with sampler_seed=5 draws first on a study that holds one trial (TPE's
    # start-up draws depend on the seed only) ...
    probe = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=derive_sampler_seed(5, 1)))
    drawn = probe.ask()
    suggest(drawn, SPACE)
    # ... is that trial, finished: the worker must not train it again, and draws anew.
    study = optuna.create_study(study_name="kronos-lr-wd", storage=url, direction="minimize")
    study.add_trial(optuna.trial.create_trial(params=drawn.params, distributions=drawn.distributions, value=0.5))
    cmd = _mlflow_run_sweep(tmp_path, "-P", "n_trials=1", "-P", "sampler_seed=5", epochs=1)
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trial 1 repeats trial 0" in proc.stdout
    study = optuna.load_study(study_name="kronos-lr-wd", storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert study.trials[1].user_attrs["duplicate_of"] == 0
    assert study.trials[1].params == study.trials[0].params
    assert param_key(study.trials[2].params) != param_key(study.trials[0].params)
    parent = next(r for r in MlflowClient(env["MLFLOW_TRACKING_URI"]).search_runs(["0"])
                  if r.data.tags.get("sweep.role") == "parent")
    assert parent.data.metrics["trials_repeat_skipped"] == 1
    assert parent.data.metrics["trials_complete"] == 1 and parent.data.metrics["trial_epochs"] == 1
    assert len(MlflowClient(env["MLFLOW_TRACKING_URI"]).search_runs(["0"])) == 2  # parent and one child
