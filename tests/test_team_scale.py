"""Team scale on real engines: an MLflow tracking server on PostgreSQL, two sweep workers on
one PostgreSQL-backed Optuna study, and a two-node torchrun rendezvous on one machine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from servers import MlflowServer, create_database, free_port
from tiny_runs import TINY_NO_EPOCHS, create_sqlite_store, isolated_env, run_dir, write_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def pg_mlflow_server(postgres, tmp_path):
    """The shared ``mlflow server``, on a fresh PostgreSQL database."""
    with MlflowServer(tmp_path / "server", backend=create_database(postgres)) as server:
        yield server.url


def _write_config(tmp_path, **extra) -> Path:
    # each test sets epochs itself
    return write_config(tmp_path / f"cfg-{uuid.uuid4().hex[:6]}.yaml",
                        **{**TINY_NO_EPOCHS, "dataset_path": str(tmp_path / "cache"), **extra})


def test_two_sweep_workers_on_postgres_and_a_tracking_server(postgres, pg_mlflow_server, tmp_path, commands):
    from mlflow import MlflowClient

    mlflow_server = pg_mlflow_server
    storage = create_database(postgres)
    env = isolated_env(tmp_path, mlflow_server)
    config = _write_config(tmp_path)
    cmd = [sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--config", str(config), "--storage", storage,
           "--study-name", "team", "--n-trials", "2", "--pruner", "none", "--qlib-data-path", "", "--comet", "off",
           "--epochs", "1", "--registered-model-name", "team-tokenizer", "--output-dir", str(tmp_path / "out"),
           "--promote", "always"]  # the champion follows the best trial whatever its verdict: one alias under a race
    # prepare the demo data once so both workers start training at once
    commands.run([sys.executable, "-m", "kronos_mlflow", "prepare", "--config", str(config),
                  "--qlib-data-path", ""], env=env, timeout=300).check_returncode()
    t0 = time.monotonic()
    workers = [subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(2)]
    errs = []
    for w in workers:
        _, err = w.communicate(timeout=900)
        assert w.returncode == 0, err[-3000:]
        errs.append(err)
    elapsed = time.monotonic() - t0  # printed, never asserted

    import optuna

    study = optuna.load_study(study_name="team", storage=storage)
    assert sorted(t.number for t in study.trials) == list(range(4))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials), errs[0][-2000:] + errs[1][-2000:]
    client = MlflowClient(mlflow_server)
    runs = client.search_runs(["0"])
    parents = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 2 and len(children) == 4
    assert len({c.info.run_id for c in children}) == 4
    assert sorted(int(c.data.tags["optuna.trial_number"]) for c in children) == list(range(4))
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {p.info.run_id for p in parents}
    assert {t.user_attrs["mlflow_run_id"] for t in study.trials} == {c.info.run_id for c in children}
    # one champion, on the best trial's model
    versions = client.search_model_versions("name='team-tokenizer'")
    champion = client.get_model_version_by_alias("team-tokenizer", "champion")
    assert champion.run_id == study.best_trial.user_attrs["mlflow_run_id"]
    assert client.get_registered_model("team-tokenizer").aliases == {"champion": champion.version}
    print(f"\n2 workers x 2 trials on PostgreSQL + tracking server: {elapsed:.1f} s, {len(versions)} version(s)")


def _launch(tmp_path, env, nnodes, nproc, save, port, node_rank=None):
    config = _write_config(tmp_path, save_path=str(tmp_path / save), epochs=1)
    rdzv = (["--standalone"] if nnodes == 1 else
            ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
             "--rdzv-id", f"job-{port}"])
    cmd = [sys.executable, "-m", "torch.distributed.run", *rdzv, "--nproc-per-node", str(nproc),
           "-m", "kronos_mlflow.train", "--config", str(config), "--qlib-data-path", "", "--comet", "off"]
    return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_node_rendezvous_matches_one_launcher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a new store's artifact root under the cwd
    env = isolated_env(tmp_path, create_sqlite_store(tmp_path))
    from mlflow import MlflowClient

    # a real `python -m kronos_mlflow prepare` process (the sweep test above forks it)
    subprocess.run([sys.executable, "-m", "kronos_mlflow", "prepare", "--config", str(_write_config(tmp_path)),
                    "--qlib-data-path", ""], env=env, check=True, capture_output=True, timeout=300)
    port = free_port()
    nodes = [_launch(tmp_path, env, 2, 1, "two_nodes", port) for _ in range(2)]
    for n in nodes:
        _, err = n.communicate(timeout=600)
        assert n.returncode == 0, err[-3000:]
    single = _launch(tmp_path, env, 1, 2, "one_node", None)
    _, err = single.communicate(timeout=600)
    assert single.returncode == 0, err[-3000:]

    def summary(save):
        path = run_dir(tmp_path / save) / "summary.json"
        return json.loads(path.read_text())

    two, one = summary("two_nodes"), summary("one_node")
    assert two["world_size"] == one["world_size"] == 2
    assert two["final_result"]["best_val_loss"] == pytest.approx(one["final_result"]["best_val_loss"], rel=1e-6)
    assert two["final_result"]["val_loss_initial"] == pytest.approx(one["final_result"]["val_loss_initial"], rel=1e-9)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(["0"])
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)  # one run per job, not per node
