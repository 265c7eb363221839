"""A stop ends every run a command started: SIGINT sent to the command's own process (not its
process group) while a trial runs in a child process. The command sends the stop on to the
child, waits for it, and ends its runs KILLED (child runs included), with one line on stderr,
no traceback, exit code 130; a stopped sweep's trial ends FAIL and is retried by the same
command typed again (kronos_mlflow/tracking/command_runs.py). The same stop of a pipeline in its
training step and of a walk-forward in its evaluation step: tests/test_pipeline.py and
tests/test_walkforward.py, in the stores of their own end-to-end commands."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny_runs
from tiny_runs import process_under

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MLFLOW_INFO = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d INFO mlflow\.")


def _start(command: list[str], root: Path, env: dict) -> subprocess.Popen:
    """The command in a session of its own (so the test's own cleanup reaches its children)."""
    with open(root / "stdout.log", "w") as out, open(root / "stderr.log", "w") as err:
        return subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _interrupt_once(proc: subprocess.Popen, root: Path, *words: bytes, timeout_s: float = 600) -> int:
    """SIGINT to the command's own pid once a child process whose argv holds ``words`` runs; how
    much stderr the command had written before it."""
    deadline = time.monotonic() + timeout_s
    while process_under(proc.pid, *words) is None:
        assert proc.poll() is None, f"the command exited (code {proc.returncode}) before its child {words} started"
        assert time.monotonic() < deadline, f"no child {words} within {timeout_s:.0f} s"
        time.sleep(0.05)
    before = (root / "stderr.log").stat().st_size
    os.kill(proc.pid, signal.SIGINT)
    return before


def _ended(proc: subprocess.Popen, root: Path, before: int) -> str:
    """Wait for the command (its process group killed past 300 s); what it wrote on stderr
    since the stop (``before``: the bytes written until then)."""
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return (root / "stderr.log").read_bytes()[before:].decode(errors="replace")


def _stopped(proc: subprocess.Popen, root: Path, command: str, before: int) -> None:
    """Exit code 130 and, on stderr, no traceback and one line since the stop (``before``: the
    bytes written until then; MLflow's own INFO log lines of a training still ending aside)."""
    err = _ended(proc, root, before)
    lines = [line for line in err.splitlines() if line.strip() and not MLFLOW_INFO.match(line)]
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"{command}: stopped by SIGINT; every run it left unfinished ended KILLED"), lines
    assert "Traceback" not in (root / "stderr.log").read_text()


def _runs(env: dict):
    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    return client, client.search_runs(["0"], order_by=["attributes.start_time ASC"])


def test_a_sweep_interrupted_in_a_trial_ends_its_runs_killed_and_the_same_command_retries_it(tmp_path, monkeypatch):
    import optuna

    monkeypatch.chdir(tmp_path)
    tiny_runs.write_config(tmp_path / "tiny.yaml", **tiny_runs.TINY_NO_EPOCHS, dataset_path=str(tmp_path / "cache"))
    env = tiny_runs.isolated_env(tmp_path, tiny_runs.create_sqlite_store(tmp_path))
    storage = f"sqlite:///{tmp_path}/optuna.db"
    command = [sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--config", str(tmp_path / "tiny.yaml"),
               "--storage", storage, "--study-name", "s", "--qlib-data-path", "", "--comet", "off", "--epochs", "1",
               "--n-trials", "1", "--output-dir", str(tmp_path / "out")]
    proc = _start(command, tmp_path, env)
    before = _interrupt_once(proc, tmp_path, b"kronos_mlflow.train")
    _stopped(proc, tmp_path, "sweep", before)
    _, runs = _runs(env)
    assert sorted(r.data.tags.get("sweep.role", "trial") for r in runs) == ["parent", "trial"]
    assert {r.info.status for r in runs} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in runs]
    trial_run = next(r for r in runs if "sweep.role" not in r.data.tags)
    assert trial_run.data.tags["optuna.trial_state"] == "FAIL"
    study = optuna.load_study(study_name="s", storage=storage)
    states = [t.state.name for t in study.get_trials()]
    assert states == ["FAIL", "WAITING"], states  # ended at once, and queued again as a dead worker's trial is

    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    study = optuna.load_study(study_name="s", storage=storage)
    first, retried = study.get_trials()
    assert retried.state.name == "COMPLETE" and retried.params == first.params
    _, runs = _runs(env)
    assert [r.data.tags.get("optuna.retry_of_trial") for r in runs if r.data.tags.get("optuna.trial_number") == "1"] \
        == ["0"]
