"""Hostile input through the launchers that need real processes: plain ``torchrun``, the
``kronos_mlflow.launch`` drop-in, ``mlflow run .``, and several ``sweeps/sweep.py`` workers
started together on a fresh default sqlite store (tests/test_hostile_input.py has the one-process
commands)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import TINY_NO_EPOCHS, isolated_env

ROOT = Path(__file__).resolve().parents[1]
REFUSAL = ("python -m kronos_mlflow.train: error: unknown flag --epoch (did you mean --epochs?); "
           "flags are never abbreviated")
DATES = {"dataset_begin_time": "2020-01-01", "dataset_end_time": "2021-12-31",
         "train_time_range": "2020-01-01:2021-06-30", "val_time_range": "2021-05-01:2021-09-30",
         "test_time_range": "2021-09-01:2021-12-31"}


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _store(tmp: Path) -> str:
    from tiny_runs import create_sqlite_store

    return create_sqlite_store(tmp)


@pytest.mark.slow
def test_plain_torchrun_prints_a_refused_flag_once(tmp_path):
    """Every rank parses the same flags; rank 0 alone says what is wrong, and the workers exit 2
    (torchrun then adds its own failure report, which a worker cannot silence)."""
    uri = _store(tmp_path)
    before = _hashes(tmp_path)
    env = isolated_env(tmp_path, uri)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "kronos_mlflow.train", "--epoch", "3"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.splitlines().count(REFUSAL) == 1, proc.stderr[-3000:]
    assert "[rank 1]" not in proc.stderr
    assert "exitcode  : 2" in proc.stderr  # the workers' own code, in torchrun's report
    assert _hashes(tmp_path) == before


@pytest.mark.slow
def test_a_silent_rank_leaves_the_refusal_to_rank_0(tmp_path):
    """A rank other than 0 refusing a flag every rank refuses prints nothing and waits for
    torchrun's SIGTERM (which follows rank 0's exit), then exits 2; so it never gets torchrun to
    stop rank 0 before rank 0's line is out. Outside torchrun it exits 2 at once."""
    import signal

    env = isolated_env(tmp_path, _store(tmp_path))
    argv = [sys.executable, "-m", "kronos_mlflow.train", "--epoch", "3"]
    alone = subprocess.run(argv, cwd=tmp_path, env={**env, "RANK": "1"}, capture_output=True, text=True, timeout=120)
    assert (alone.returncode, alone.stderr) == (2, ""), alone.stderr[-2000:]
    ranked = subprocess.Popen(argv, cwd=tmp_path, env={**env, "RANK": "1", "TORCHELASTIC_RUN_ID": "t"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # parsed and refused in about 2 s; still waiting at 8
            ranked.wait(timeout=8)
        ranked.send_signal(signal.SIGTERM)
        out, err = ranked.communicate(timeout=30)
    finally:
        ranked.kill()
    assert ranked.returncode == 2 and (out, err) == ("", "")  # the refusal's code, said by rank 0


@pytest.mark.slow
def test_the_launch_drop_in_shows_only_the_line(tmp_path):
    """``python -m kronos_mlflow.launch`` takes torchrun's arguments unchanged: a refused flag or
    a bad launcher number is one line and exit code 2, without torchrun's report or usage."""
    uri = _store(tmp_path)
    before = _hashes(tmp_path)
    env = isolated_env(tmp_path, uri)
    launch = [sys.executable, "-m", "kronos_mlflow.launch", "--standalone", "--nproc_per_node", "2"]
    for extra, line in (
        (["-m", "kronos_mlflow.train", "--epoch", "3"], REFUSAL),
        (["--max-restarts", "abc", "-m", "kronos_mlflow.train", "--epochs", "1"],
         "python -m kronos_mlflow.launch: error: --max-restarts: 'abc' is not an integer; expected an integer "
         "from 0 to 1,000"),
    ):
        proc = subprocess.run(launch + extra, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines() == [line], proc.stderr[-3000:]
    assert _hashes(tmp_path) == before


@pytest.mark.slow
def test_a_data_refusal_under_torchrun_is_one_line_from_rank_0(tmp_path):
    """Training started straight under the launcher (no --check) on a Qlib directory whose calendar
    repeats a date: rank 0 finds it while preparing the data and tells the other rank, every rank
    exits 2, and the one line is printed once (no rank left waiting in a collective to fail with
    a traceback); the run it opened ends FAILED with that reason."""
    from mlflow import MlflowClient

    from kronos_mlflow.data import write_demo_market

    market = write_demo_market(tmp_path / "market", 8, 3, start="2020-01-01", end="2021-12-31")
    calendar = market / "calendars" / "day.txt"
    days = calendar.read_text().splitlines()
    calendar.write_text("\n".join(days[:5] + [days[4]] + days[5:]) + "\n")
    uri = _store(tmp_path)
    flags = []
    for key, value in {**TINY_NO_EPOCHS, **DATES, "epochs": 1, "comet": "off", "qlib_data_path": market,
                       "save_path": tmp_path / "outputs", "dataset_path": tmp_path / "cache"}.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.run([sys.executable, "-m", "kronos_mlflow.launch", "--standalone", "--nproc_per_node", "2",
                           "-m", "kronos_mlflow.train", *flags], cwd=tmp_path, env=isolated_env(tmp_path, uri),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "repeats line 5" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "[rank 1]" not in proc.stderr, proc.stderr[-3000:]
    (run,) = MlflowClient(uri).search_runs(["0"])
    assert run.info.status == "FAILED" and "repeats line 5" in run.data.tags["failure_reason"]
    assert run.data.tags["failure_reason"].startswith("DataError: ")


@pytest.mark.slow
def test_mlflow_run_refuses_max_restarts_in_the_check_step(tmp_path):
    """``mlflow run . -P max_restarts=abc``: the check step (one process, before torchrun) says so
    in one line and the run ends FAILED with that line as its failure_reason; torchrun's usage
    text never appears and no worker starts."""
    from mlflow import MlflowClient

    uri = _store(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in {**TINY_NO_EPOCHS, "comet": "off"}.items()))
    cmd = [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local",
           "-P", "max_restarts=abc", "-P", f"config_file={config}", "-P", "epochs=1"]
    files_before = {k: v for k, v in _hashes(tmp_path).items() if not k.startswith("mlflow.db")}
    proc = subprocess.run(cmd, cwd=tmp_path, env=isolated_env(tmp_path, uri), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode != 0
    expected = "kronos-mlflow train: error: max_restarts: 'abc' is not an integer; expected an integer from 0 to 1,000"
    assert proc.stderr.splitlines().count(expected) == 1, proc.stderr[-3000:]
    assert "usage:" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    runs = MlflowClient(uri).search_runs(["0"])
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert runs[0].data.tags["failure_reason"] == expected
    files_after = {k: v for k, v in _hashes(tmp_path).items() if not k.startswith("mlflow.db")}
    assert files_after == files_before  # no output, no cache, no worker: only mlflow run's own run changed


@pytest.mark.slow
def test_three_sweep_workers_start_together_on_a_fresh_default_store(tmp_path):
    """Three ``python sweeps/sweep.py`` started at once in an empty directory (MLflow's default
    sqlite store and Optuna's default study, both created by the workers): the store is created
    once under its lock, every worker finishes, the trials are distinct, and the alias
    ``champion`` names the study's best trial."""
    import optuna
    from mlflow import MlflowClient

    from kronos_mlflow.data import write_demo_market

    market = write_demo_market(tmp_path / "market", 8, 3, start="2020-01-01", end="2021-12-31")
    work = tmp_path / "work"
    work.mkdir()
    env = isolated_env(work)
    env.pop("MLFLOW_TRACKING_URI")  # MLflow's default: sqlite:///<cwd>/mlflow.db, created by the workers
    flags = []
    for key, value in {**TINY_NO_EPOCHS, **DATES, "epochs": 1, "comet": "off", "qlib_data_path": market}.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    # --promote always: the alias follows the study's best trial whatever its test verdict, so the
    # three workers race to set it
    cmd = [sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--n-trials", "1", "--registered-model-name",
           "kronos-tok", "--promote", "always", *flags]
    started = time.monotonic()
    procs = [subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=600) for p in procs]
    took = time.monotonic() - started
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
    assert (work / "mlflow.db.lock").exists()  # the store was created under the lock beside it
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    runs = client.search_runs(["0"])
    parents = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 3 and all(r.info.status == "FINISHED" for r in parents)
    assert len(trials) == 3 and all(r.info.status == "FINISHED" for r in trials)
    study = optuna.load_study(study_name="kronos-lr-wd", storage=f"sqlite:///{work / 'optuna.db'}")
    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3 and len({(t.params["learning_rate"], t.params.get("weight_decay")) for t in done}) == 3
    assert {r.info.run_id for r in trials} == {t.user_attrs["mlflow_run_id"] for t in done}
    for parent in parents:  # each worker ran its own trial and says so
        assert parent.data.metrics["trials_complete"] == 1 and parent.data.metrics["trials_failed"] == 0
    # one champion, made from the study's best trial, whichever worker registered last
    champion = client.get_model_version_by_alias("kronos-tok", "champion")
    assert champion.run_id == study.best_trial.user_attrs["mlflow_run_id"]
    print(f"three sweep workers on a fresh sqlite store: 3 of 3 finished, 3 distinct trials, {took:.0f} s",
          file=sys.__stdout__)
