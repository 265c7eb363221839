"""Training: the loss, bad input, failure marking, and the whole job end to end through ``mlflow
run`` with two torchrun processes (slow; the shared run of tests/shared_runs.py). Validation over
two gloo ranks is checked in tests/test_quality.py."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from shared_runs import SECRETS
from tiny_runs import TINY, run_dir, tiny_config, write_config

from kronos_mlflow.config.stage_keys import MLPROJECT_PARAMS
from kronos_mlflow.tracking import keys
from kronos_mlflow.training import optim, run as train
from kronos_mlflow.config.core import load_config, run_params
from kronos_mlflow.runtime.distributed import resolve_device
from kronos_mlflow.errors import ConfigError
from kronos_mlflow.stages.tokenizer import training as tokenizer_training

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def workdir(isolated):
    """conftest's ``isolated`` tmp_path (cwd, MLflow, demo cache, Comet) plus tiny.yaml."""
    # `mlflow run` runs in the project directory: keep its outputs and caches in tmp_path.
    write_config(isolated / "tiny.yaml", **TINY, save_path=str(isolated / "outputs" / "models"),
                 dataset_path=str(isolated / "cache"))
    return isolated


def _tiny_config(workdir, **extra):
    return tiny_config(workdir, save_path=str(workdir / "outputs" / "models"), **extra)


# ----------------------------------------------------------------------------- the objective


def test_loss_formula_on_a_fixed_batch():
    from kronos_mlflow.model import KronosTokenizer

    torch.manual_seed(0)
    config = load_config(TINY)
    from kronos_mlflow.config.core import model_kwargs

    model = KronosTokenizer(**model_kwargs(config))
    x = torch.randn(4, 25, 6)
    loss, parts = tokenizer_training.compute_loss(model, x)
    (z_pre, z), bsq, _, _ = model(x)
    expected = (F.mse_loss(z_pre, x) + F.mse_loss(z, x) + bsq) / 2
    assert torch.allclose(loss, expected, rtol=1e-6, atol=0)
    assert torch.allclose(parts["recon_pre"], F.mse_loss(z_pre, x))
    assert torch.allclose(parts["recon_all"], F.mse_loss(z, x))
    assert torch.allclose(parts["bsq"], bsq)
    loss.backward()
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().sum() > 0


def test_optimizer_groups():
    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    model = KronosTokenizer(**model_kwargs(load_config(TINY)))
    opt = optim.build_optimizer(model, load_config(TINY))
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 0.1
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    opt = optim.build_optimizer(model, load_config({**TINY, "weight_decay_scope": "matrices"}))
    decayed, plain = opt.param_groups
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in plain["params"])
    assert plain["weight_decay"] == 0.0


def test_optimizer_and_schedule_take_their_sections():
    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.config.sections import sections
    from kronos_mlflow.model import KronosTokenizer

    config = load_config({**TINY, "weight_decay_scope": "matrices", "cycle_momentum": "off"})
    parts = sections(config)
    model = KronosTokenizer(**model_kwargs(config))
    whole = optim.build_optimizer(model, config)
    narrow = optim.build_optimizer(model, parts.optimizer, learning_rate=parts.tokenizer.tokenizer_learning_rate,
                                   performance=parts.performance)
    assert [{k: v for k, v in g.items() if k != "params"} for g in whole.param_groups] == \
        [{k: v for k, v in g.items() if k != "params"} for g in narrow.param_groups]
    one = optim.build_scheduler(whole, config, 10)
    two = optim.build_scheduler(narrow, parts.optimizer, 10, learning_rate=parts.tokenizer.tokenizer_learning_rate,
                                training=parts.training)
    assert (one.total_steps, one.cycle_momentum) == (two.total_steps, two.cycle_momentum)


def test_run_params_hold_mlproject_names_and_config():
    params = run_params(load_config({"learning_rate": 1e-3}))
    assert params["learning_rate"] == params["tokenizer_learning_rate"] == "0.001"
    assert params["train_time_range"] == "2011-01-01:2022-12-31"
    assert set(MLPROJECT_PARAMS) <= set(params)


# ----------------------------------------------------------------------------- bad input


def _check(commands, *args):
    """``python -m kronos_mlflow.train --check ARGS`` (through the session's fork server)."""
    return commands.run([sys.executable, "-m", "kronos_mlflow.train", "--check", *args], timeout=120)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--no-such-key", "1"], "--no-such-key"),
        (["--learning-rate", "fast"], "tokenizer_learning_rate"),
        (["--learning-rate", "-0.001"], "tokenizer_learning_rate"),
        (["--epochs", "0"], "epochs"),
        (["--batch-size", "-5"], "batch_size"),
        (["--weight-decay", "-0.1"], "adam_weight_decay"),
        (["--batch-size", "50", "--accumulation-steps", "3"], "accumulation_steps"),
        (["--train-time-range", "2020-01-01"], "train_time_range"),
        (["--config", "/nonexistent/config.yaml"], "config.yaml"),
    ],
)
def test_bad_flags_one_line_exit_2(commands, args, needle):
    proc = _check(commands, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_pretrained_path_and_data_dir(workdir, commands):
    proc = _check(commands, "--pretrained-tokenizer-path", str(workdir / "missing_ckpt"))
    assert proc.returncode == 2 and "missing_ckpt" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = _check(commands, "--qlib-data-path", str(workdir / "no_such_qlib_dir"))
    assert proc.returncode == 2 and "no_such_qlib_dir" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_unreachable_tracking_server_is_one_line(workdir, monkeypatch, commands):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    proc = _check(commands, "--config", str(workdir / "tiny.yaml"), "--qlib-data-path", "")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "127.0.0.1:9" in lines[0] and "unreachable" in lines[0]


def test_nproc_above_visible_gpus_is_refused(monkeypatch):
    # No GPU here: pretend CUDA shows one device to exercise the check.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="nproc_per_node 2 exceeds the 1 visible GPU"):
        resolve_device("cuda", local_rank=0, local_world_size=2)


def test_a_run_that_fails_after_creation_is_failed_with_reason(workdir):
    from mlflow import MlflowClient

    config = _tiny_config(workdir, train_time_range="2030-01-01:2030-12-31")
    with pytest.raises(Exception):
        train.main(config)
    runs = MlflowClient().search_runs(["0"])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FAILED"
    assert "2030-01-01" in run.data.tags["failure_reason"]


# ----------------------------------------------------------------------------- end to end


def _scan_for_secrets(paths, texts=()):
    found = []
    for base in paths:
        for path in Path(base).rglob("*"):
            if not path.is_file():
                continue
            blobs = [path.read_bytes()]
            if path.suffix == ".zip":
                with zipfile.ZipFile(path) as zf:
                    blobs += [zf.read(n) for n in zf.namelist()]
            for blob in blobs:
                for value in SECRETS.values():
                    if value.encode() in blob:
                        found.append((str(path), value))
    for text in texts:
        for value in SECRETS.values():
            if value in text:
                found.append(("<output>", value))
    return found


@pytest.mark.slow
def test_mlflow_run_end_to_end(user_run):
    """The shared ``mlflow run .`` (tests/shared_runs.py): two torchrun workers (gloo), Comet
    offline, every credential in its environment. One process through ``mlflow run`` to the end:
    tests/test_data_intraday.py; stopped by a signal: tests/test_first_hour.py."""
    workdir, nproc = user_run.root, user_run.nproc
    client = user_run.client()
    run = user_run.run()
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    params = run.data.params
    for name in ("learning_rate", "weight_decay", "epochs", "batch_size", "nproc_per_node",
                 "tokenizer_learning_rate", "adam_weight_decay", "train_time_range"):
        assert name in params
    assert params["learning_rate"] == "0.0002" and params["nproc_per_node"] == str(nproc)

    # one point per optimizer step, one per epoch
    steps_per_epoch = 64 // nproc // 8
    for name in keys.TOKENIZER_STEP_METRICS:
        history = client.get_metric_history(run_id, name)
        assert sorted(m.step for m in history) == list(range(2 * steps_per_epoch)), name
    val = client.get_metric_history(run_id, keys.TOKENIZER_VAL_METRIC)
    assert sorted(m.step for m in val) == [0, 1]
    best = client.get_metric_history(run_id, "best_val_loss")
    assert len(best) == 1 and best[0].value == pytest.approx(min(m.value for m in val))
    assert len(client.get_metric_history(run_id, keys.TOKENIZER_INITIAL_VAL_METRIC)) == 1
    assert run.inputs.dataset_inputs and run.inputs.dataset_inputs[0].dataset.name == "qlib-csi300-demo"

    # summary.json: on disk and as an artifact
    save_dir = run_dir(user_run.save_path)
    assert run.data.tags["run_directory"] == str(save_dir.resolve())
    summary = json.loads((save_dir / "summary.json").read_text())
    assert summary["final_result"]["best_val_loss"] == pytest.approx(best[0].value)
    assert summary["world_size"] == nproc
    assert "summary.json" in [a.path for a in client.list_artifacts(run_id)]

    # the checkpoint on disk loads with from_pretrained
    from kronos_mlflow.model import KronosTokenizer

    tok = KronosTokenizer.from_pretrained(save_dir / "checkpoints" / "best_model")
    assert tok.config["d_model"] == 16

    # the MLflow model loads in a new process and predicts
    model_uri = run.data.tags["best_model_uri"]
    code = (
        "import sys, json, numpy as np, mlflow\n"
        "m = mlflow.pyfunc.load_model(sys.argv[1])\n"
        "x = np.asarray(m.input_example, dtype=np.float32)\n"
        "out = m.predict(x)\n"
        "print(json.dumps({k: list(v.shape) for k, v in out.items()}))\n"
    )
    pred = subprocess.run([sys.executable, "-c", code, model_uri], cwd=workdir, env=user_run.env,
                          capture_output=True, text=True, timeout=300)
    assert pred.returncode == 0, pred.stderr[-2000:]
    shapes = json.loads(pred.stdout.strip().splitlines()[-1])
    assert shapes["reconstruction"][1:] == [26, 6] and len(shapes["tokens"]) == 2

    # Comet's offline archive holds the same metric names
    archives = list((workdir / "comet").glob("*.zip"))
    assert len(archives) == 1
    names = set()
    with zipfile.ZipFile(archives[0]) as zf:
        for line in zf.read("messages.json").decode().splitlines():
            msg = json.loads(line)
            if msg.get("type") == "metric_msg":
                names.add(msg["payload"]["metric"]["metricName"])
    assert set(keys.TOKENIZER_STEP_METRICS) | {keys.TOKENIZER_VAL_METRIC, "best_val_loss"} <= names

    # no secret anywhere: DB, artifacts, outputs, Comet archive, console
    assert _scan_for_secrets([workdir], [user_run.stdout, user_run.stderr]) == []
