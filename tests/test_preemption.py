"""Preemption on the commands users type: a worker SIGKILLed from outside under ``mlflow run .``
and under plain ``torchrun --max-restarts`` (no extra environment) resumes to the uninterrupted
result in the same MLflow run; the whole ``mlflow run .`` killed and typed again continues the
same training state (one ``mlflow run .`` goes through both). Also: joining a group whose ranks
never all arrive fails in bounded time with one line instead of waiting forever."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 3
# Tiny architecture (tests/tiny_runs.py) with epochs of a few seconds, so a kill sent once an
# epoch is saved lands inside the next one.
TINY_YAML = {"d_model": 16, "n_heads": 2, "ff_dim": 32, "n_enc_layers": 2, "n_dec_layers": 2, "s1_bits": 4,
             "s2_bits": 4, "lookback_window": 20, "predict_window": 5, "log_interval": 100000}
SIZES = {"epochs": EPOCHS, "batch_size": 8, "n_train_iter": 1600, "n_val_iter": 36}
STEP_METRIC, VAL_METRIC = "train_tokenizer_loss_batch", "val_tokenizer_loss_epoch"


def _faults():
    spec = importlib.util.spec_from_file_location("fault_injection", ROOT / "benchmarks" / "fault_injection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """cwd, MLflow store, demo cache, Comet archives and outputs all inside tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KRONOS_MLFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "COMET_API_KEY",
                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        monkeypatch.delenv(name, raising=False)
    paths = {"save_path": str(tmp_path / "outputs"), "dataset_path": str(tmp_path / "cache")}
    (tmp_path / "tiny.yaml").write_text("".join(f"{k}: {v}\n" for k, v in {**TINY_YAML, **paths}.items()))
    from mlflow import MlflowClient

    MlflowClient().search_experiments()  # create the store once, before processes race
    return tmp_path


def _save_dir(workdir: Path) -> Path:
    return workdir / "outputs" / "finetune_tokenizer_demo"


def _torchrun_command(workdir: Path, restarts: int = 2) -> list[str]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SIZES.items()]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--max-restarts", str(restarts), "-m", "kronos_mlflow.train", "--config", str(workdir / "tiny.yaml"),
            "--qlib-data-path", "", "--comet", "off", *flags]


def _mlflow_run_command(workdir: Path, comet: str = "offline") -> list[str]:
    params = [f"{k}={v}" for k, v in SIZES.items()]
    params += ["nproc_per_node=2", f"config_file={workdir / 'tiny.yaml'}", f"comet={comet}"]
    return [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local",
            *[arg for p in params for arg in ("-P", p)]]


def _start(cmd: list[str], workdir: Path, log_name: str) -> tuple[subprocess.Popen, Path]:
    log = workdir / log_name
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def _finish(proc: subprocess.Popen, log: Path, timeout_s: float = 900) -> str:
    try:
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            _faults().kill_tree(proc.pid)
            proc.wait()
    return log.read_text(encoding="utf-8", errors="replace")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _val_history(client, run_id: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, VAL_METRIC), key=lambda m: m.step)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 2-process plain torchrun job of the same config, as the fault-injection
    script runs it (its own store and directory): its validation losses and step count."""
    base = tmp_path_factory.mktemp("reference")
    figures = _faults().train_torchrun(base / "uninterrupted", base / "home", epochs=EPOCHS)
    assert figures["rc"] == 0 and figures["status"] == ["FINISHED"], figures["stderr_tail"]
    steps = sorted(figures["steps"][STEP_METRIC])
    assert steps == list(range(figures["global_steps"]))
    from mlflow import MlflowClient

    (run,) = MlflowClient(f"sqlite:///{base / 'uninterrupted'}/mlflow.db").search_runs(["0"])
    return {"val": figures["val_loss_history"], "best": figures["best_val_loss"], "steps": len(steps),
            "test": {k: run.data.metrics[k] for k in ("test_tokenizer_loss", "base_test_tokenizer_loss")},
            "verdict": run.data.tags["verdict"]}


def _assert_resumed_like_reference(client, run_id: str, reference: dict) -> None:
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert _val_history(client, run_id) == pytest.approx(reference["val"], rel=1e-6)
    assert len(reference["val"]) == EPOCHS
    assert run.data.metrics["best_val_loss"] == pytest.approx(reference["best"], rel=1e-6)
    for key in (STEP_METRIC, "tokenizer_learning_rate"):
        assert _steps(client, run_id, key) == list(range(reference["steps"])), key  # none twice, none missing
    assert _steps(client, run_id, VAL_METRIC) == list(range(EPOCHS))
    assert len(client.get_metric_history(run_id, "best_val_loss")) == 1
    # the test verdict compares with the weights the run started from (checkpoints/start/), not
    # with those it resumed from: the same numbers as the uninterrupted run's, logged once
    for key, value in reference["test"].items():
        assert run.data.metrics[key] == pytest.approx(value, rel=1e-6), key
        assert len(client.get_metric_history(run_id, key)) == 1, key
    assert run.data.tags["verdict"] == reference["verdict"] and run.data.tags["verdict_base"] == "fresh"


@pytest.mark.slow
def test_plain_torchrun_with_restarts_resumes_after_a_worker_is_killed(workdir, reference):
    """The command of docs/reliability.md as a user types it, no extra environment: rank 1 SIGKILLed in the
    second epoch; torchrun restarts the group, which joins again and finishes the same run."""
    from mlflow import MlflowClient

    faults, client = _faults(), MlflowClient()
    proc, log = _start(_torchrun_command(workdir), workdir, "torchrun.log")
    try:
        faults.preempt(proc, _save_dir(workdir), rank=1, after_epoch=0)
        # The restarted group trains again inside the run it resumed (rank 0 had marked it FAILED).
        faults.wait_for_epoch(_save_dir(workdir), 1, proc)
        (run,) = client.search_runs(["0"])
        status_while_training = run.info.status
        restarted = {rank: count for rank, (_, count) in faults.training_workers(proc.pid).items()}
    finally:
        output = _finish(proc, log)
    assert proc.returncode == 0, output[-3000:]
    assert "[kronos] resuming at epoch 2/3" in output
    assert status_while_training == "RUNNING"
    assert restarted in ({0: 1, 1: 1}, {})  # the second attempt's workers (or already done)
    assert len(client.search_runs(["0"])) == 1
    _assert_resumed_like_reference(client, run.info.run_id, reference)


@pytest.mark.slow
def test_mlflow_run_survives_a_killed_worker_and_typed_again_after_the_machine_died_continues(workdir, reference):
    """``mlflow run . -P nproc_per_node=2`` (Comet offline): rank 0 (the one logging) SIGKILLed
    in the second epoch; the group restarts and the MLflow run continues. Then, once that epoch
    is saved, the whole process tree is SIGKILLed (the machine dies) and the same command is
    typed again: training continues from the saved state in the saved MLflow run, the run the
    second ``mlflow run`` made for itself is tagged with where the training went, and the
    training ends like the uninterrupted one, with one Comet experiment throughout."""
    from mlflow import MlflowClient

    faults, client = _faults(), MlflowClient()
    cmd = _mlflow_run_command(workdir)
    proc, log = _start(cmd, workdir, "first.log")
    try:
        faults.preempt(proc, _save_dir(workdir), rank=0, after_epoch=0)
        faults.wait_for_epoch(_save_dir(workdir), 1, proc)
        (first,) = client.search_runs(["0"])
        status_while_training = first.info.status
        tree = [proc.pid, *faults.descendants(proc.pid)]
    finally:
        faults.kill_tree(proc.pid)  # the machine dies: launcher, torchrun and workers at once
        proc.wait()
    output = log.read_text(encoding="utf-8", errors="replace")
    assert "[kronos] resuming at epoch 2/3" in output, output[-3000:]  # the restarted group
    assert status_while_training == "RUNNING"
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in tree)
    (first,) = client.search_runs(["0"])
    assert first.info.status == "RUNNING"  # nobody was left to end it

    proc, log = _start(cmd, workdir, "second.log")
    output = _finish(proc, log)
    assert proc.returncode == 0, output[-3000:]
    assert "[kronos] resuming at epoch" in output
    runs = {r.info.run_id: r for r in client.search_runs(["0"])}
    assert len(runs) == 2 and first.info.run_id in runs
    _assert_resumed_like_reference(client, first.info.run_id, reference)
    run = runs[first.info.run_id]
    assert run.data.params["max_restarts"] == "3"  # the MLproject default
    (launch,) = [r for rid, r in runs.items() if rid != first.info.run_id]
    assert launch.data.tags["kronos.continued_in_run"] == first.info.run_id
    assert launch.info.status == "FINISHED" and not launch.data.metrics
    key = run.data.tags["comet_experiment_key"]
    archives = sorted(p.name for p in (workdir / "comet").glob("*.zip"))
    assert archives and all(name.startswith(key) for name in archives), (key, archives)


@pytest.mark.slow  # a process group that waits for its set-up timeout
def test_group_set_up_fails_in_bounded_time_with_one_line(tmp_path):
    """A restarted rank whose peer never arrives (the store already holds an older attempt's
    keys) gets one line naming what to set, within the set-up timeout, not a hang."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    server.set("default_pg/0//cpu//0/rank_1", b"stale address of a dead attempt")
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port), TORCHELASTIC_RUN_ID="test",
               TORCHELASTIC_RESTART_COUNT="1", TORCHELASTIC_USE_AGENT_STORE="True")
    code = textwrap.dedent("""
        import sys
        from kronos_mlflow.runtime.distributed import init_distributed
        from kronos_mlflow.errors import UserError
        try:
            init_distributed("cpu", setup_timeout_s=3)
        except UserError as exc:
            print(exc, file=sys.stderr)
            sys.exit(2)
    """)
    # bounded: the subprocess's own timeout fails the test if set-up waits on
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "1 of 2 ranks arrived within 3 s (attempt 1)" in lines[0]
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in lines[0]
