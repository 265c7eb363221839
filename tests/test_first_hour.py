"""The first hour of a new user, through the commands they type: a mistyped flag is refused
(and the ``mlflow run`` run says why), runs never overwrite each other's files, SIGTERM and
Ctrl-C end the run KILLED with one line, and the "What a run records" table (docs/run-records.md)
is what a real run records."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import TINY, isolated_env, run_dir

ROOT = Path(__file__).resolve().parents[1]
MLFLOW = [sys.executable, "-m", "mlflow"]


def _tiny_yaml(tmp: Path, **extra) -> Path:
    values = {**TINY, "save_path": str(tmp / "outputs"), "dataset_path": str(tmp / "cache"), **extra}
    path = tmp / "tiny.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def _client(uri):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _only_run(client):
    runs = client.search_runs(["0"])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def _mlflow_run(tmp: Path, uri: str, *params: str, timeout: int = 900, **popen):
    cmd = [*MLFLOW, "run", str(ROOT), "--env-manager", "local"]
    for p in params:
        cmd += ["-P", p]
    return cmd, isolated_env(tmp, uri)


# ----------------------------------------------------------------------------- flags


@pytest.mark.parametrize("argv, flag, hint", [
    (["train", "--epoch", "3"], "--epoch", "--epochs"),
    (["train", "--learning-rat", "1e-3"], "--learning-rat", "--learning-rate"),
    (["train", "--batch", "8"], "--batch", "--batch-size"),
])
def test_kronos_mlflow_train_refuses_abbreviated_flags(tmp_path, commands, argv, flag, hint):
    env = isolated_env(tmp_path, f"sqlite:///{tmp_path}/m.db")
    proc = commands.run(["kronos-mlflow", *argv], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"unknown flag {flag} (did you mean {hint}?)" in lines[0]
    assert not (tmp_path / "outputs").exists()


def test_python_m_train_and_sweep_refuse_abbreviations(tmp_path, commands):
    env = isolated_env(tmp_path, f"sqlite:///{tmp_path}/m.db")
    proc = commands.run([sys.executable, "-m", "kronos_mlflow.train", "--seed", "1", "--epoch", "3"], cwd=tmp_path,
                        env=env, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "python -m kronos_mlflow.train: error: unknown flag --epoch (did you mean --epochs?); "
        "flags are never abbreviated"], proc.stderr
    proc = commands.run([sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--n-trial", "3"], cwd=tmp_path,
                        env=env, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "n_trial" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_mlflow_run_with_a_mistyped_param_fails_with_the_reason(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _client(uri).search_experiments()
    config = _tiny_yaml(tmp_path)
    cmd, env = _mlflow_run(tmp_path, uri, "epoch=3", f"config_file={config}", "n_train_iter=64", "n_val_iter=36")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    expected = ("python -m kronos_mlflow.train: error: unknown flag --epoch (did you mean --epochs?); "
                "flags are never abbreviated")
    assert expected in proc.stderr.splitlines(), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    run = _only_run(_client(uri))
    assert run.info.status == "FAILED"
    assert run.data.tags["failure_reason"] == expected
    assert not (tmp_path / "outputs").exists()  # no worker started


# ----------------------------------------------------------------------------- stopping


def _wait_for(predicate, deadline_s: float, what: str):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
# SIGTERM (a job scheduler) on two workers, SIGINT (Ctrl-C) on one: both signals, both launch shapes.
@pytest.mark.parametrize("sig, nproc", [(signal.SIGINT, 1), (signal.SIGTERM, 2)])
def test_mlflow_run_stopped_by_a_signal_ends_killed_with_one_line(tmp_path, sig, nproc):
    """``mlflow run .`` (its whole process group, as a terminal's Ctrl-C or a job scheduler
    signals it) stopped mid-training: the run ends KILLED with a stop_reason, the console gets
    one line and no traceback, and the training state is kept: the same command resumes."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = _client(uri)
    client.search_experiments()
    config = _tiny_yaml(tmp_path, epochs=200, compile="off")
    cmd, env = _mlflow_run(tmp_path, uri, f"config_file={config}", "n_train_iter=64", "n_val_iter=36",
                           "epochs=200", "comet=off", f"nproc_per_node={nproc}", "batch_size=8")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        def after_a_finished_epoch():
            # The epoch's metric is logged before its best model and training state are written:
            # wait for the state too, so that the signal lands after a finished epoch.
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            runs = client.search_runs(["0"])
            if not (runs and runs[0].info.status == "RUNNING" and "val_tokenizer_loss_epoch" in runs[0].data.metrics):
                return None
            try:
                state = json.loads((run_dir(tmp_path / "outputs") / "checkpoints" / "last" / "state.json").read_text())
            except (AssertionError, OSError, ValueError):  # no run directory or state yet
                return None
            return runs[0] if state.get("next_epoch", 0) >= 1 else None

        run = _wait_for(after_a_finished_epoch, 600, "the run to finish its first epoch")
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run_id = run.info.run_id

    def killed():  # `mlflow run` itself marks a Ctrl-C'd run FAILED as it exits; KILLED is put back after it
        r = client.get_run(run_id)
        return r if r.info.status == "KILLED" else None

    try:
        run = _wait_for(killed, 90, "the run to end KILLED")
    except AssertionError:
        run = client.get_run(run_id)
    assert run.info.status == "KILLED", (run.info.status, run.data.tags, err[-6000:])
    name = signal.Signals(sig).name
    assert run.data.tags["stop_reason"].startswith(f"stopped by {name}; the training state after the last "
                                                   "finished epoch is kept in ")
    assert "Traceback" not in err, err[-3000:]
    ours = [line for line in err.splitlines() if line.startswith("kronos-mlflow train:")]
    assert ours == [f"kronos-mlflow train: stopped by {name}; the training state after the last finished epoch "
                    "is kept: the same command resumes from it"], err[-3000:]
    state = json.loads((run_dir(tmp_path / "outputs") / "checkpoints" / "last" / "state.json").read_text())
    assert state["run_ids"]["mlflow_run_id"] == run_id
    assert state["next_epoch"] >= 1
    assert not [line for line in err.splitlines() if "[rank 1]" in line or "ChildFailedError" in line], err[-3000:]


# ----------------------------------------------------------------------------- the docs' table vs a real run

RUN_RECORDS = ROOT / "docs" / "run-records.md"


def readme_table() -> dict[str, list[str]]:
    """The "What a run records" table of docs/run-records.md (linked from the README): kind -> the
    backticked names of its row."""
    text = RUN_RECORDS.read_text()
    rows: dict[str, list[str]] = {}
    for line in text[text.index("| kind | names |"):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        kind, names = [cell.strip() for cell in line.strip().strip("|").split("|", 1)]
        rows[kind] = re.findall(r"`([^`]+)`", names)
    return rows


def _row(rows, prefix):
    found = [k for k in rows if k.startswith(prefix)]
    assert len(found) == 1, (prefix, list(rows))
    return rows[found[0]]


def _artifacts(client, run_id, path=None):
    out = []
    for a in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, a.path) if a.is_dir else [a.path]
    return out


@pytest.mark.slow
def test_readme_table_matches_a_real_mlflow_run(user_run, monkeypatch):
    """The shared ``mlflow run .`` (tests/shared_runs.py: the tiny config file, two workers,
    a registered model) records exactly what the table says."""
    from kronos_mlflow.config import core as cfg
    from kronos_mlflow.config.stage_keys import MLPROJECT_PARAMS

    uri, client = user_run.uri, user_run.client()
    assert "type hints" not in user_run.stderr, user_run.stderr[-3000:]  # no MLflow warning of our making
    # no published tokenizer in the (empty) Hugging Face cache: fresh weights, said once (rank 0)
    said = [line for line in (user_run.stdout + user_run.stderr).splitlines() if "pretrained_tokenizer_path auto:" in line]
    assert len(said) == 1 and said[0].startswith("[kronos] pretrained_tokenizer_path auto: fresh weights: "
                                                 "NeoQuasar/Kronos-Tokenizer-base is not in the Hugging Face cache"), said
    run = user_run.run()
    rows = readme_table()
    metric_rows = [k for k in rows if k.startswith(("per optimizer step", "before training", "per epoch", "at the end"))]
    documented_metrics = {name for k in metric_rows for name in rows[k]}

    # params: the MLproject names, the whole resolved config and what the run trains, nothing else
    params = run.data.params
    assert set(params) == set(MLPROJECT_PARAMS) | set(cfg.DEFAULTS) | {"config_file", "max_restarts",
                                                                       "trainable_params", "trainable_fraction"}
    assert set(_row(rows, "params")) - {"''", "...", "mlflow run", "kronos-mlflow train"} <= set(params)
    assert params["qlib_data_path"] == "''"  # the demo market; `mlflow run` logs it shell-quoted

    # metrics: every recorded one is documented and every documented one is recorded
    metrics = {k for k in run.data.metrics if not k.startswith("system/")}
    assert metrics == documented_metrics
    assert any(k.startswith("system/") for k in run.data.metrics)
    for key in rows["per epoch (step = epoch)"]:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [0, 1]  # 0-based epochs
    summary_path = run_dir(user_run.save_path) / "summary.json"
    best_epoch = json.loads(summary_path.read_text())["final_result"]["best_epoch"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "best_val_loss")] == [best_epoch]

    # tags: the always-present ones are there; every tag of ours is documented
    always, sometimes = set(rows["tags"]), set(_row(rows, "tags, when"))
    ours = {k for k in run.data.tags if not k.startswith("mlflow.")} | (
        {"mlflow.source.git.commit"} & set(run.data.tags))
    assert always <= ours, always - ours
    assert ours <= always | sometimes, ours - always - sometimes
    assert run.data.tags["run_directory"] == str(summary_path.parent.resolve())
    assert run.data.tags["world_size"] == str(user_run.nproc) and run.data.tags["device"] == "cpu"

    # artifacts: exactly the documented files
    assert sorted(_artifacts(client, run.info.run_id)) == sorted(_row(rows, "artifacts"))

    # the logged model: its name and the best epoch's validation metrics, at the best epoch
    model_row = _row(rows, "logged model")
    models = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert [m.name for m in models] == [model_row[0]]
    model = models[0]
    assert model.source_run_id == run.info.run_id
    assert run.data.tags["best_model_uri"] == f"models:/{model.model_id}"
    assert sorted(m.key for m in model.metrics) == sorted(model_row[1:])
    assert {m.step for m in model.metrics} == {best_epoch}
    by_key = {m.key: m.value for m in model.metrics}
    val_history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val_tokenizer_loss_epoch")}
    assert by_key["val_tokenizer_loss_epoch"] == pytest.approx(val_history[best_epoch])
    assert by_key["best_val_loss"] == pytest.approx(min(val_history.values()))
    assert [o.step for o in run.outputs.model_outputs] == [best_epoch]

    # the model: any window length, a short error for a wrong shape, no warning, no temp dir left
    import tempfile
    import warnings

    import mlflow
    import numpy as np

    from kronos_mlflow.serving.tokenizer_model import checkpoint_dir, load_tokenizer

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/best_model")
    assert not [w for w in caught if "type hint" in str(w.message)], [str(w.message) for w in caught]
    for length in (26, 12, 40):
        out = pyfunc.predict(np.random.default_rng(0).uniform(10, 11, (2, length, 6)).astype(np.float32))
        assert out["tokens"].shape == (2, length) and out["reconstruction"].shape == (2, length, 6)
    with pytest.raises(mlflow.exceptions.MlflowException) as bad:
        pyfunc.predict(np.ones((3, 26, 5), dtype=np.float32))
    assert str(bad.value) == ("input of shape (3, 26, 5) is not windows of (B, T, 6) with T >= 2: open, high, low, "
                              "close, vol, amt per step")
    # a private temp dir: other xdist workers create and remove their own entries in the shared one
    private = user_run.root / "tempdir-check"
    private.mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    tok = load_tokenizer(f"runs:/{run.info.run_id}/best_model")
    with checkpoint_dir(f"runs:/{run.info.run_id}/best_model") as path:
        assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
        assert Path(path).resolve().is_relative_to(private.resolve())  # the check below watches the right place
    assert os.listdir(private) == []
    assert sum(p.numel() for p in tok.parameters()) == int(run.data.tags["model_size"])


# ----------------------------------------------------------------------------- runs keep their own files


def _tiny_train(tmp: Path, *flags: str) -> list[str]:
    args = ["kronos-mlflow", "train"]
    for key, value in {**TINY, "epochs": 1, "comet": "off", "save_path": str(tmp / "outputs"),
                       "dataset_path": str(tmp / "cache")}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args + list(flags)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_runs_never_overwrite_each_others_files(tmp_path, commands):
    """``kronos-mlflow train`` with no data path (the demo market, as ``mlflow run .``), twice
    with different configs and once more with the first config: three run directories, and a
    finished run's files are left byte for byte as they were."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = isolated_env(tmp_path, uri)
    folder = tmp_path / "outputs" / "finetune_tokenizer_demo"

    def train(*flags):
        proc = commands.run(_tiny_train(tmp_path, *flags), cwd=tmp_path, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    train("--seed", "1")
    first = sorted(folder.glob("cfg-*"))
    assert len(first) == 1
    before = _tree(first[0])
    assert "checkpoints/best_model/model.safetensors" in before and "summary.json" in before

    train("--seed", "2", "--system-metrics", "off")  # a name-only key: the directory follows the seed
    dirs = sorted(folder.glob("cfg-*"))
    assert len(dirs) == 2
    assert _tree(first[0]) == before

    train("--seed", "1")  # the same config again after it finished: a new directory, not an overwrite
    dirs = sorted(folder.glob("cfg-*"))
    assert len(dirs) == 3 and (folder / f"{first[0].name}-2" / "summary.json").is_file()
    assert _tree(first[0]) == before

    runs = _client(uri).search_runs(["0"])
    assert sorted(r.data.tags["run_directory"] for r in runs) == sorted(str(d.resolve()) for d in dirs)
    # --system-metrics off: that run has no system/ metric, the others (the default, on) do
    off = [r for r in runs if r.data.params["system_metrics"] == "off"]
    assert len(off) == 1 and not [k for k in off[0].data.metrics if k.startswith("system/")]
    assert all(any(k.startswith("system/") for k in r.data.metrics) for r in runs if r not in off)
    assert {r.data.params["qlib_data_path"] for r in runs} == {""}
    assert {r.inputs.dataset_inputs[0].dataset.name for r in runs} == {"qlib-csi300-demo"}


def test_every_front_door_defaults_to_the_demo_market(tmp_path, commands):
    """No data path: ``kronos-mlflow train --check`` checks the demo market (it would refuse a
    missing ``~/.qlib/qlib_data/cn_data`` otherwise), as the MLproject's empty default does."""
    from kronos_mlflow.config.core import DEFAULTS

    assert DEFAULTS["qlib_data_path"] == ""
    mlproject = (ROOT / "MLproject").read_text()
    assert 'qlib_data_path: {type: string, default: ""}' in mlproject
    env = isolated_env(tmp_path, f"sqlite:///{tmp_path}/mlflow.db", {"HOME": str(tmp_path / "nohome")})
    flags = [f for f in _tiny_train(tmp_path)[2:]]
    proc = commands.run(["kronos-mlflow", "train", "--check", *flags], cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "check passed" in proc.stdout

