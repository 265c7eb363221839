"""Real runs made once per test session and inspected, read-only, by several tests.

Each is what a user types, run once in its own directory: ``user_run`` is one ``mlflow run .``
of the main entry point (two torchrun workers, Comet offline, a registered model, every
credential set in its environment); ``user_sweep`` is ``mlflow run . -e sweep`` typed twice on
one study; ``user_predictor_run`` is ``mlflow run . -e predictor`` on ``user_run``'s tokenizer,
in its store. The tests that read them change nothing in them but what they say they change (an
alias, a resumed study, a run of their own in another experiment), so the order tests run in does
not matter. ``tests/conftest.py`` wraps them in session fixtures.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiny_runs import TINY, TINY_NO_EPOCHS, create_sqlite_store, isolated_env, write_config

ROOT = Path(__file__).resolve().parents[1]

# Credentials in the environment of the shared run: none may show up anywhere it writes.
SECRETS = {
    "COMET_API_KEY": "cometkey-SHOULD-NOT-LEAK-1234",
    "MLFLOW_TRACKING_TOKEN": "mlflowtoken-SHOULD-NOT-LEAK-5678",
    "MLFLOW_TRACKING_PASSWORD": "mlflowpass-SHOULD-NOT-LEAK-9012",
}
REGISTERED_MODEL = "kronos-tok"


@dataclass
class UserRun:
    """One finished ``mlflow run`` and where everything it made lives."""

    root: Path  # cwd of the command; holds the store, outputs, cache, Comet archives
    uri: str  # the sqlite tracking store
    command: list[str]
    env: dict[str, str]
    stdout: str
    stderr: str
    config: Path  # the YAML file passed as config_file
    save_path: Path
    nproc: int
    run_id: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.uri)

    def run(self):
        return self.client().get_run(self.run_id)


def mlflow_run_main(root: Path, nproc: int = 2) -> UserRun:
    """``mlflow run . --env-manager local`` of the main entry point with the tiny config file,
    ``nproc`` workers, Comet offline and ``registered_model_name``; asserts it finished."""
    root.mkdir(parents=True, exist_ok=True)
    uri = create_sqlite_store(root)
    save_path = root / "outputs"
    config = write_config(root / "tiny.yaml", **TINY, save_path=str(save_path), dataset_path=str(root / "cache"))
    params = {"config_file": str(config), "n_train_iter": TINY["n_train_iter"], "n_val_iter": TINY["n_val_iter"],
              "epochs": TINY["epochs"], "batch_size": TINY["batch_size"], "nproc_per_node": nproc,
              "comet": "offline", "registered_model_name": REGISTERED_MODEL}
    cmd = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local"]
    for key, value in params.items():
        cmd += ["-P", f"{key}={value}"]
    env = isolated_env(root, uri, SECRETS)
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = UserRun(root=root, uri=uri, command=cmd, env=env, stdout=proc.stdout, stderr=proc.stderr, config=config,
                  save_path=save_path, nproc=nproc, params=params)
    runs = out.client().search_runs(["0"])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    out.run_id = runs[0].info.run_id
    return out


@dataclass
class UserSweep:
    """``mlflow run . -e sweep`` typed twice on one study (the second resumes it)."""

    root: Path
    uri: str
    storage: str
    env: dict[str, str]
    outputs: list[tuple[str, str]]  # (stdout, stderr) of each command
    n_trials: int  # per command
    study_name: str = "kronos-lr-wd"

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.uri)

    def study(self):
        import optuna

        return optuna.load_study(study_name=self.study_name, storage=self.storage)

    def parents(self):
        runs = self.client().search_runs(["0"], order_by=["attributes.start_time ASC"])
        return [r for r in runs if r.data.tags.get("sweep.role") == "parent"]

    def children(self, parent_id: str | None = None):
        runs = [r for r in self.client().search_runs(["0"]) if r.data.tags.get("mlflow.parentRunId")]
        return [r for r in runs if parent_id is None or r.data.tags["mlflow.parentRunId"] == parent_id]


SWEEP_TINY_PARAMS = ["-P", "batch_size=8", "-P", f"n_train_iter={TINY['n_train_iter']}", "-P", "n_val_iter=32",
                     "-P", "qlib_data_path=", "-P", "comet=off"]


def sweep_command(root: Path, *params: str, epochs: int = 2) -> list[str]:
    """``mlflow run . -e sweep`` with the tiny config file, this directory's study and store."""
    return [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "sweep",
            "-P", f"config_file={root / 'tiny.yaml'}", "-P", f"storage=sqlite:///{root}/optuna.db",
            "-P", f"epochs={epochs}", *SWEEP_TINY_PARAMS, *params]


def sweep_dir(root: Path) -> tuple[Path, dict[str, str]]:
    """A directory for sweeps through ``mlflow run``: tiny.yaml (outputs inside it) and a
    created sqlite store; the environment for the commands."""
    root.mkdir(parents=True, exist_ok=True)
    write_config(root / "tiny.yaml", **TINY_NO_EPOCHS, save_path=str(root / "outputs" / "models"),
                 dataset_path=str(root / "cache"))
    env = isolated_env(root, create_sqlite_store(root))  # one process creates the store
    return root, env


def mlflow_run_sweep_twice(root: Path, n_trials: int = 2) -> UserSweep:
    """The same ``mlflow run . -e sweep -P n_trials=N -P registered_model_name=...`` twice."""
    root, env = sweep_dir(root)
    cmd = sweep_command(root, "-P", f"n_trials={n_trials}", "-P", f"registered_model_name={REGISTERED_MODEL}")
    outputs = []
    for _ in range(2):  # the second resumes the study
        proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append((proc.stdout, proc.stderr))
    return UserSweep(root=root, uri=env["MLFLOW_TRACKING_URI"], storage=f"sqlite:///{root}/optuna.db", env=env,
                     outputs=outputs, n_trials=n_trials)


# The shared predictor run's config file: the tiny model with 2 predictor layers and a scorecard
# of 153 origins (3 whole dates of the demo market's 51 symbols). Its batch_size, 11, divides the
# first rank's block of them (77 of 153): every sampling batch (seeded by its first origin) is
# the one a single process draws, so ``-e evaluate`` of the logged model gives the same numbers.
# n_val_skill_windows: the calibrator's origins (at least calibration_min_origins, 30).
PREDICTOR_YAML = {**TINY, "n_layers": 2, "log_interval": 100000, "batch_size": 11, "n_eval_windows": 200,
                  "n_val_skill_windows": 60}


@dataclass
class UserPredictorRun:
    """One finished ``mlflow run . -e predictor`` on the shared tokenizer run's best model."""

    root: Path  # cwd of the command; outputs under root/outputs
    uri: str  # user_run's store; the run is in experiment ``predictor``
    env: dict[str, str]
    stdout: str
    stderr: str
    config: Path
    params: dict[str, Any]
    tokenizer_run_id: str
    run_id: str = ""

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.uri)

    def run(self):
        return self.client().get_run(self.run_id)


def mlflow_run_predictor(user_run: UserRun) -> UserPredictorRun:
    """``mlflow run . -e predictor`` with two workers, ``tokenizer=runs:/<user_run>/best_model``,
    the scorecard and the calibrator on (the defaults), in user_run's store and environment,
    experiment ``predictor``; asserts it finished."""
    root = user_run.root / "predictor"
    root.mkdir(exist_ok=True)
    env = {**user_run.env, "MLFLOW_EXPERIMENT_NAME": "predictor"}
    config = write_config(root / "tiny.yaml", **PREDICTOR_YAML, save_path=str(root / "outputs"),
                          dataset_path=str(user_run.root / "cache"))
    params = {"config_file": str(config), "epochs": 2, "batch_size": PREDICTOR_YAML["batch_size"],
              "n_train_iter": TINY["n_train_iter"], "n_val_iter": TINY["n_val_iter"], "nproc_per_node": 2,
              "comet": "off", "tokenizer": f"runs:/{user_run.run_id}/best_model", "learning_rate": 1e-3,
              "backtest_signal_stride": 0}  # the entry point's default, 1, is a daily backtest
    cmd = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", "-e", "predictor",
           *[a for k, v in params.items() for a in ("-P", f"{k}={v}")]]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = UserPredictorRun(root=root, uri=user_run.uri, env=env, stdout=proc.stdout, stderr=proc.stderr,
                           config=config, params=params, tokenizer_run_id=user_run.run_id)
    client = out.client()
    (run,) = client.search_runs([client.get_experiment_by_name("predictor").experiment_id])
    out.run_id = run.info.run_id
    return out
