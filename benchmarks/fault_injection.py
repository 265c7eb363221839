"""Fault injection, end to end on CPU: preempted workers and a tracking server that goes away.

    python benchmarks/fault_injection.py            # both scenarios, a table, --json for one line

1. SIGKILL: a tiny model trains 3 epochs under plain ``torchrun --standalone --nproc_per_node 2
   --max-restarts 2`` (no extra environment); once the training state holds an epoch, one worker
   is killed with SIGKILL from outside (rank 0 after epoch 1, then rank 1 after epoch 2, in a
   second run). torchrun restarts the group, training resumes from the last checkpoint into the
   same MLflow run. Compared with an uninterrupted run of the same seed: epochs, every
   validation loss, best_val_loss, metric steps logged twice, metric steps missing.
2. Outage: a tiny training logs to a real ``mlflow server`` on 127.0.0.1 (sqlite) that is
   stopped (SIGTERM) once the first epoch is saved and started again on the same port and
   database once the next epoch is saved without it. Counted: metric values delayed, lost, and
   logged twice.

The kill comes from outside the trainer: :func:`preempt` waits for ``checkpoints/last/state.json``
to reach an epoch, finds the worker of a rank among the launcher's descendants (``/proc``: a
``kronos_mlflow.train`` process with torchrun's ``RANK`` in its environment) and sends SIGKILL.
The tests in ``tests/test_preemption.py`` use the same helpers on ``mlflow run``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

STEP_METRICS = ("train_tokenizer_loss_batch", "train_vqvae_vq_loss_each_batch", "train_recon_loss_pre_each_batch",
                "train_recon_loss_each_batch", "tokenizer_learning_rate")
TINY = ["--d-model", "16", "--n-heads", "2", "--ff-dim", "32", "--n-enc-layers", "2", "--n-dec-layers", "2",
        "--s1-bits", "4", "--s2-bits", "4", "--lookback-window", "20", "--predict-window", "5", "--batch-size", "8",
        "--n-val-iter", "36", "--log-interval", "100000", "--qlib-data-path", "", "--comet", "off"]
N_TRAIN = 1600  # samples per epoch: epochs of a few seconds, so a kill after one lands inside the next


def _env(workdir: Path, tracking_uri: str, home: Path) -> dict:
    env = dict(os.environ, MLFLOW_TRACKING_URI=tracking_uri, KRONOS_MLFLOW_HOME=str(home), TQDM_DISABLE="1",
               MLFLOW_DISABLE_TELEMETRY="true")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        env.pop(name, None)
    return env


def _run_metrics(tracking_uri: str) -> dict:
    """The one run in the store: status, and per step metric the steps logged."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    runs = client.search_runs(["0"])
    out = {"runs": len(runs), "status": [r.info.status for r in runs], "steps": {}}
    if runs:
        run = runs[0]
        for key in (*STEP_METRICS, "val_tokenizer_loss_epoch"):
            out["steps"][key] = [m.step for m in client.get_metric_history(run.info.run_id, key)]
    return out


# --------------------------------------------------------------------------- killing from outside


def _proc_children() -> dict[int, list[int]]:
    """Parent pid -> child pids, read from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def _read_nul_separated(path: str) -> list[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


TRAIN_MODULES = {"kronos_mlflow.train", "kronos_mlflow.train_predictor"}


def training_workers(root_pid: int) -> dict[int, tuple[int, int]]:
    """Rank -> (pid, restart count) of the torchrun workers below ``root_pid``: descendants that
    run ``kronos_mlflow.train`` (or ``.train_predictor``) with ``RANK`` and ``TORCHELASTIC_RESTART_COUNT`` in their
    environment (the ``--check`` process of ``mlflow run`` has neither)."""
    children, found, todo = _proc_children(), {}, [root_pid]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            if not TRAIN_MODULES & set(_read_nul_separated(f"/proc/{child}/cmdline")):
                continue
            env = dict(item.split("=", 1) for item in _read_nul_separated(f"/proc/{child}/environ") if "=" in item)
            if "RANK" in env and "TORCHELASTIC_RESTART_COUNT" in env:
                found[int(env["RANK"])] = (child, int(env["TORCHELASTIC_RESTART_COUNT"]))
    return found


def descendants(root_pid: int) -> list[int]:
    """Every process below ``root_pid`` (children first found first)."""
    children, found, todo = _proc_children(), [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(root_pid: int) -> None:
    """SIGKILL ``root_pid`` and everything below it at once, as a machine that dies would. (A
    process-group kill is not enough: torchrun starts each worker in a session of its own.)"""
    for pid in [root_pid, *descendants(root_pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def state_epoch(save_dir: Path) -> int | None:
    """The epoch of the training state under ``save_dir`` (-1: before the first), None: no state."""
    try:
        states = sorted(Path(save_dir).glob("cfg-*/checkpoints/last/state.json"))  # the run's directory
        return int(json.loads(states[0].read_text())["epoch"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def wait_for_epoch(save_dir: Path, epoch: int, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    """Return once the training state holds ``epoch`` (or later); fail if ``proc`` ends first."""
    deadline = time.monotonic() + timeout_s
    while (saved := state_epoch(save_dir)) is None or saved < epoch:
        if proc.poll() is not None:
            raise RuntimeError(f"the launcher exited (code {proc.returncode}) before epoch {epoch} was saved")
        if time.monotonic() > deadline:
            raise RuntimeError(f"epoch {epoch} was not saved within {timeout_s:.0f} s")
        time.sleep(0.05)


def preempt(proc: subprocess.Popen, save_dir: Path, rank: int, after_epoch: int, timeout_s: float = 900) -> int:
    """SIGKILL the worker of ``rank`` (first attempt) once epoch ``after_epoch`` is saved; its pid."""
    wait_for_epoch(save_dir, after_epoch, proc, timeout_s)
    workers = training_workers(proc.pid)
    if rank not in workers or workers[rank][1] != 0:
        raise RuntimeError(f"no first-attempt worker of rank {rank} under pid {proc.pid}: {workers}")
    os.kill(workers[rank][0], signal.SIGKILL)
    return workers[rank][0]


def train_torchrun(workdir: Path, home: Path, kill_rank: int | None = None, kill_after_epoch: int = 0,
                   epochs: int = 3) -> dict:
    """One 2-process plain torchrun job in ``workdir`` (own MLflow store); returns its figures."""
    from mlflow import MlflowClient

    workdir.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{workdir}/mlflow.db"
    env = _env(workdir, uri, home)
    MlflowClient(uri).search_experiments()  # create the store once, before two ranks race
    save_dir = workdir / "out" / "finetune_tokenizer_demo"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--max-restarts", "2", "-m", "kronos_mlflow.train", *TINY, "--n-train-iter", str(N_TRAIN),
           "--epochs", str(epochs), "--dataset-path", str(home / "cache"), "--save-path", str(workdir / "out")]
    with open(workdir / "torchrun.log", "w+", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            if kill_rank is not None:
                preempt(proc, save_dir, kill_rank, kill_after_epoch)
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
        log.seek(0)
        output = log.read()
    found = sorted(save_dir.glob("cfg-*/summary.json"))  # one directory per config (see layout.py)
    summary_path = found[0] if found else save_dir / "missing-summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    result = summary.get("final_result", {})
    return {"rc": proc.returncode, "resumed": "[kronos] resuming at epoch" in output,
            "best_val_loss": result.get("best_val_loss"), "val_loss_history": result.get("val_loss_history"),
            "global_steps": result.get("steps"), **_run_metrics(uri), "stderr_tail": output[-1500:]}


def _duplicates_and_missing(figures: dict, expected_steps: int, epochs: int) -> tuple[int, int]:
    dup = missing = 0
    for key, steps in figures["steps"].items():
        want = set(range(epochs if key == "val_tokenizer_loss_epoch" else expected_steps))
        dup += len(steps) - len(set(steps))
        missing += len(want - set(steps))
    return dup, missing


def sigkill_scenario(base: Path, home: Path) -> dict:
    epochs = 3
    reference = train_torchrun(base / "uninterrupted", home, epochs=epochs)
    if reference["rc"] != 0:
        raise SystemExit(f"uninterrupted run failed:\n{reference['stderr_tail']}")
    steps = reference["global_steps"]
    rows = []
    for name, rank, after in (("kill rank 0 after epoch 1", 0, 0), ("kill rank 1 after epoch 2", 1, 1)):
        figures = train_torchrun(base / name.replace(" ", "_"), home, kill_rank=rank, kill_after_epoch=after,
                                 epochs=epochs)
        dup, missing = _duplicates_and_missing(figures, steps, epochs)
        ok = (figures["rc"] == 0 and figures["resumed"] and figures["runs"] == 1 and figures["status"] == ["FINISHED"]
              and figures["val_loss_history"] is not None and len(figures["val_loss_history"]) == epochs)
        rel = (abs(figures["best_val_loss"] - reference["best_val_loss"]) / reference["best_val_loss"]
               if ok else None)
        rows.append({"scenario": name, "finished": ok, "mlflow_runs": figures["runs"], "epochs":
                     len(figures["val_loss_history"] or []), "best_val_loss": figures["best_val_loss"],
                     "reference_best_val_loss": reference["best_val_loss"], "best_rel_diff": rel,
                     "val_history_equal": figures["val_loss_history"] == reference["val_loss_history"],
                     "steps_logged_twice": dup, "steps_missing": missing})
    return {"reference": {k: reference[k] for k in ("best_val_loss", "val_loss_history", "global_steps")},
            "rows": rows}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(db: Path, artifacts: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
                             "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"], stdout=open(log, "a"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"mlflow server did not start: {log.read_text()[-1500:]}")


def _stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def outage_scenario(base: Path, home: Path) -> dict:
    """Training against a real server that goes away once the first epoch is saved (its metrics
    sent: a training state is written only after its steps' metrics are sent or on disk) and
    comes back once the next epoch is saved without it; the last epoch and the run's end may
    wait for it. Nothing waits on a clock."""
    base.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    db, artifacts, log = base / "server.db", base / "artifacts", base / "server.log"
    server = _start_server(db, artifacts, port, log)
    env = _env(base, uri, home)
    epochs, n_train = 3, N_TRAIN  # epochs of a second or more: the stop lands before the run ends
    save_dir = base / "out" / "finetune_tokenizer_demo"
    cmd = [sys.executable, "-m", "kronos_mlflow.train", *TINY, "--n-train-iter", str(n_train),
           "--epochs", str(epochs), "--dataset-path", str(home / "cache"), "--save-path", str(base / "out")]
    with open(base / "trainer.log", "w+", encoding="utf-8") as out:
        trainer = subprocess.Popen(cmd, env=env, cwd=base, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for_epoch(save_dir, 0, trainer)  # the first epoch's metrics are on the server
            t_down = time.monotonic()
            _stop_server(server)
            wait_for_epoch(save_dir, 1, trainer)  # an epoch trained and saved with no server
            down_s = time.monotonic() - t_down
            server = _start_server(db, artifacts, port, log)
            trainer.wait(timeout=900)
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait()
        out.seek(0)
        output = out.read()
    figures = _run_metrics(uri)
    _stop_server(server)
    steps = (n_train // 8) * epochs
    dup, missing = _duplicates_and_missing(figures, steps, epochs)
    delayed = 0
    for line in output.splitlines():
        if "delayed" in line:
            digits = [int(w) for w in line.replace(",", " ").split() if w.isdigit()]
            delayed = digits[0] if digits else delayed
    return {"scenario": f"server down {down_s:.0f} s mid-run", "trainer_rc": trainer.returncode,
            "finished": figures["status"] == ["FINISHED"], "metrics_delayed": delayed, "metrics_lost": missing,
            "steps_logged_twice": dup, **({} if trainer.returncode == 0 else {"stderr_tail": output[-2000:]})}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--skip-outage", action="store_true")
    p.add_argument("--skip-sigkill", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="fault-injection-") as tmp:
        base, home = Path(tmp), Path(tmp) / "home"
        report: dict = {}
        if not args.skip_sigkill:
            report["sigkill"] = sigkill_scenario(base / "sigkill", home)
            for row in report["sigkill"]["rows"]:
                print(f"{row['scenario']:<26} finished={row['finished']} runs={row['mlflow_runs']} "
                      f"epochs={row['epochs']} best={row['best_val_loss']} ref={row['reference_best_val_loss']} "
                      f"rel_diff={row['best_rel_diff']} history_equal={row['val_history_equal']} "
                      f"twice={row['steps_logged_twice']} missing={row['steps_missing']}")
        if not args.skip_outage:
            report["outage"] = outage_scenario(base / "outage", home)
            o = report["outage"]
            print(f"{o['scenario']:<26} finished={o['finished']} delayed={o['metrics_delayed']} "
                  f"lost={o['metrics_lost']} twice={o['steps_logged_twice']}")
    if args.json:
        print(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
