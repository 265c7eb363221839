"""Sweep bad input: one clear line, exit 2, the existing study untouched."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
from tiny_runs import isolated_env

from kronos_mlflow.errors import ConfigError
from kronos_mlflow.workflows.sweep.space import load_search_space, suggest
from kronos_mlflow.training.trial import make_pruner

ROOT = Path(__file__).resolve().parents[1]


def _sweep(commands, *args, cwd, env_extra=None):
    """``python sweeps/sweep.py ARGS`` (through the session's fork server)."""
    env = isolated_env(cwd, extra=env_extra)
    return commands.run([sys.executable, str(ROOT / "sweeps" / "sweep.py"), *args], cwd=cwd, env=env, timeout=120)


def test_default_space_reads_and_suggests_in_range():
    space = load_search_space()
    assert space["learning_rate"] == {"low": 1e-5, "high": 1e-3, "log": True, "include_zero": False}
    assert space["weight_decay"]["include_zero"] and space["weight_decay"]["log"]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen_zero = False
    for _ in range(40):
        trial = study.ask()
        values = suggest(trial, space)
        assert 1e-5 <= values["learning_rate"] <= 1e-3
        assert values["weight_decay"] == 0.0 or 1e-4 <= values["weight_decay"] <= 0.3
        seen_zero |= values["weight_decay"] == 0.0
        study.tell(trial, 1.0)
    assert seen_zero


@pytest.mark.parametrize(
    "text, needle",
    [
        ("learning_rate: {low: 1.0e-3, high: 1.0e-5}\nweight_decay: {low: 0.1, high: 0.2}\n", "inverted"),
        ("learning_rate: {low: 1.0e-4, high: 1.0e-4}\nweight_decay: {low: 0.1, high: 0.2}\n", "empty"),
        ("learning_rate: {low: 0, high: 1.0e-3}\nweight_decay: {low: 0.1, high: 0.2}\n", "log scale"),
        ("learning_rate: {low: 1.0e-5, high: 1.0e-3}\n", "weight_decay"),
        ("learning_rate: {low: 1.0e-5, high: 1.0e-3}\nweight_decay: {low: 0.1, high: 0.2}\nbatch: {low: 1, high: 2}\n",
         "unknown parameter"),
    ],
)
def test_bad_search_space(tmp_path, text, needle):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_search_space(path)


def test_pruners():
    assert isinstance(make_pruner("median"), optuna.pruners.MedianPruner)
    assert isinstance(make_pruner("none"), optuna.pruners.NopPruner)
    assert isinstance(make_pruner("percentile:30"), optuna.pruners.PercentilePruner)
    assert isinstance(make_pruner("median:n_startup_trials=3,n_warmup_steps=0"), optuna.pruners.MedianPruner)
    with pytest.raises(ConfigError, match="pruner 'sometimes'"):
        make_pruner("sometimes")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--n-trials", "0"], "--n-trials"),
        (["--storage", "sqlite:////nonexistent-dir/x/optuna.db"], "'/nonexistent-dir/x/optuna.db' does not exist"),
        (["--storage", "nosuchdb://x"], "scheme 'nosuchdb', which no store serves"),
        (["--pruner", "sometimes"], "sometimes"),
        (["--learning-rate", "1e-3"], "search space"),
        (["--epochs", "zero"], "epochs"),
    ],
)
def test_bad_command_lines_exit_2_with_one_line(tmp_path, commands, args, needle):
    proc = _sweep(commands, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_existing_study_with_other_direction_is_refused_and_untouched(tmp_path, commands):
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))
    before = (tmp_path / "optuna.db").read_bytes()
    proc = _sweep(commands, "--storage", url, "--study-name", "s", cwd=tmp_path)
    assert proc.returncode == 2
    assert "direction maximize" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert (tmp_path / "optuna.db").read_bytes() == before
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 1
