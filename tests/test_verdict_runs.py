"""The verdict through the user's commands: ``mlflow run .`` as the quick start types it, on a
Hugging Face cache written here that holds a small "published" tokenizer (``auto`` starts from it),
records every name (checked against an independent recomputation of both losses on independently
built test windows), ``kronos-mlflow evaluate-tokenizer`` reproduces it, an empty test split is
``unavailable`` in one line, and a sweep moves the champion only for a ``better`` trial (a tiny
learning rate's single step is not better).

The pieces (windows, bootstrap, rule, champion decisions) are in tests/test_evaluation.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hf_cache import write_published
from tiny_runs import TINY, TINY_NO_EPOCHS, create_sqlite_store, isolated_env, run_dir, train_command, write_config

from kronos_mlflow.config import published
from kronos_mlflow.evaluation.verdict import decide

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("d_model", "n_heads", "ff_dim", "n_enc_layers", "n_dec_layers", "s1_bits", "s2_bits")
FEATURES = ("open", "high", "low", "close", "vol", "amt")
NAMES = ("tokenizer_loss", "recon_loss_pre", *(f"mse_{f}" for f in FEATURES), "codebook_usage_full",
         "codebook_perplexity_full", "windows")
RUN_METRICS = {*(f"{p}test_{n}" for p in ("", "base_") for n in NAMES),
               "test_loss_change", "test_loss_change_ci_low", "test_loss_change_ci_high"}
LINE = re.compile(r"^\[kronos\] test, (\d+) windows: (\S+) vs (?:starting|fresh) weights (\S+): (\S+) "
                  r"\(95% CI (\S+) \.\. (\S+)\): (better|worse|inconclusive)(?:: [^\n]*)?$", re.M)
MODEL_NAME = "verdict-tok"
TOKENIZER_ID = published.PUBLISHED["pretrained_tokenizer_path"]


def write_pretrained(path: Path, seed: int = 11) -> Path:
    """A small "pretrained" tokenizer (the tiny architecture) as a checkpoint directory."""
    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    torch.manual_seed(seed)
    KronosTokenizer(**model_kwargs(load_config({k: TINY[k] for k in SIZES}))).save_pretrained(path)
    return path


def _mlflow(*args: str) -> list[str]:
    return [sys.executable, "-m", "mlflow", "run", str(ROOT), "--env-manager", "local", *args]


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    """One ``mlflow run .`` (one process) with the quick start's params and a registered model, its
    Hugging Face cache holding a "published" tokenizer (the tiny architecture) that ``auto`` finds.
    ``ckpt``: the cache's copy of those weights (a checkpoint directory)."""
    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    root = tmp_path_factory.mktemp("pretrained-run")
    uri = create_sqlite_store(root)
    torch.manual_seed(11)
    cache = root / "hf-cache"
    ckpt = write_published(cache, TOKENIZER_ID, KronosTokenizer(**model_kwargs(load_config({k: TINY[k] for k in SIZES}))))
    config = write_config(root / "tiny.yaml", **TINY, save_path=str(root / "outputs"), dataset_path=str(root / "cache"))
    params = {"config_file": config, "epochs": TINY["epochs"], "n_train_iter": TINY["n_train_iter"],
              "n_val_iter": TINY["n_val_iter"], "batch_size": TINY["batch_size"], "comet": "off",
              "registered_model_name": MODEL_NAME}
    cmd = _mlflow(*[a for k, v in params.items() for a in ("-P", f"{k}={v}")])
    env = isolated_env(root, uri, {"HF_HUB_CACHE": str(cache)})
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs(["0"])
    return SimpleNamespace(root=root, uri=uri, env=env, ckpt=ckpt, stdout=proc.stdout, stderr=proc.stderr,
                           client=client, run=run, run_dir=run_dir(root / "outputs"))


def independent_test_losses(cache: Path, model, n_windows: int) -> np.ndarray:
    """Each scored window's full-reconstruction MSE, rebuilt from the prepared test split's raw
    rows: every window of every series in order, the evenly spaced subset, lookback z-score, clip."""
    (split,) = sorted(cache.glob("kronos-*"))
    raw = np.load(split / "test_x.npy").astype(np.float64)
    offsets = np.load(split / "test_offsets.npy")
    window, lookback = TINY["lookback_window"] + TINY["predict_window"] + 1, TINY["lookback_window"]
    starts = [s for a, b in zip(offsets[:-1], offsets[1:]) for s in range(a, b - window + 1)]
    picked = [starts[(i * len(starts)) // n_windows] for i in range(n_windows)] if len(starts) > n_windows else starts
    x = np.stack([raw[s:s + window] for s in picked])
    mean, std = x[:, :lookback].mean(axis=1, keepdims=True), x[:, :lookback].std(axis=1, keepdims=True)
    x = torch.from_numpy(np.clip((x - mean) / (std + 1e-5), -5.0, 5.0).astype(np.float32))
    with torch.no_grad():
        (_, z), _, _, _ = model(x)
    return ((z.double() - x.double()) ** 2).mean(dim=(1, 2)).numpy()


def test_a_run_from_a_published_checkpoint_judges_its_best_checkpoint_on_the_test_windows(pretrained_run, monkeypatch):
    from kronos_mlflow.serving.tokenizer_model import load_tokenizer
    from kronos_mlflow.model import KronosTokenizer

    r, client = pretrained_run, pretrained_run.client
    run_id, metrics, tags = r.run.info.run_id, r.run.data.metrics, r.run.data.tags
    summary = json.loads((r.run_dir / "summary.json").read_text())
    best_epoch, recorded = summary["final_result"]["best_epoch"], summary["final_result"]["test"]
    # every name, at the best epoch; the tags; the same in summary.json
    assert RUN_METRICS <= set(metrics), RUN_METRICS - set(metrics)
    for key in RUN_METRICS:
        assert [m.step for m in client.get_metric_history(run_id, key)] == [best_epoch], key
    assert metrics["test_windows"] == metrics["base_test_windows"] == TINY["n_val_iter"]  # n_test_iter 0: n_val_iter
    assert tags["verdict_base"] == TOKENIZER_ID  # the start auto chose
    assert tags["verdict"] == decide(metrics["test_loss_change_ci_low"], metrics["test_loss_change_ci_high"], 0.005)
    assert recorded["verdict"] == tags["verdict"] and recorded["windows_digest"] == tags["test_windows_digest"]
    low, high = metrics["test_loss_change_ci_low"], metrics["test_loss_change_ci_high"]
    assert low <= metrics["test_loss_change"] <= high
    # the one console line says the same
    (line,) = LINE.findall(r.stdout)
    assert int(line[0]) == 36 and float(line[1]) == pytest.approx(metrics["test_tokenizer_loss"], abs=1e-4)
    assert float(line[2]) == pytest.approx(metrics["base_test_tokenizer_loss"], abs=1e-4) and line[6] == tags["verdict"]
    # the starting weights kept with the run are the published checkpoint's
    start = KronosTokenizer.from_pretrained(r.run_dir / "checkpoints" / "start")
    pretrained = KronosTokenizer.from_pretrained(r.ckpt)
    assert all(torch.equal(a, b) for a, b in zip(start.state_dict().values(), pretrained.state_dict().values()))

    # both losses again, from the logged model and the starting checkpoint, on windows built here
    monkeypatch.setenv("MLFLOW_TRACKING_URI", r.uri)
    tuned = load_tokenizer(f"runs:/{run_id}/best_model").eval()
    test = independent_test_losses(r.root / "cache", tuned, 36)
    base = independent_test_losses(r.root / "cache", pretrained.eval(), 36)
    assert metrics["test_tokenizer_loss"] == pytest.approx(test.mean(), rel=1e-5)
    assert metrics["base_test_tokenizer_loss"] == pytest.approx(base.mean(), rel=1e-5)
    assert metrics["test_loss_change"] == pytest.approx((test.mean() - base.mean()) / base.mean(), rel=1e-4, abs=1e-7)
    assert not np.allclose(test, base)  # two different models were scored

    # on the logged model too, linked to the test windows (an input of the run)
    (model,) = client.search_logged_models(experiment_ids=["0"])
    linked = {m.key: m for m in model.metrics if m.key in RUN_METRICS}
    assert set(linked) == RUN_METRICS
    assert {(m.dataset_name, m.dataset_digest, m.step) for m in linked.values()} == {
        ("qlib-csi300-demo-test", tags["test_windows_digest"][:32], best_epoch)}
    assert linked["test_tokenizer_loss"].value == pytest.approx(metrics["test_tokenizer_loss"])
    inputs = {d.dataset.name: {t.key: t.value for t in d.tags} for d in client.get_run(run_id).inputs.dataset_inputs}
    assert inputs["qlib-csi300-demo-test"]["mlflow.data.context"] == "test"
    assert inputs["qlib-csi300-demo"]["mlflow.data.context"] == "training"


def test_the_quick_start_fine_tunes_the_published_tokenizer_from_the_cache(pretrained_run):
    """The shared run (``mlflow run . --env-manager local`` with the quick start's params, a
    Hugging Face cache holding a "published" tokenizer): the run starts from it (checkpoints/start
    equals the cache's weights), says so in one line and records the choice."""
    from safetensors.torch import load_file

    r = pretrained_run
    (line,) = [x for x in (r.stdout + r.stderr).splitlines() if "pretrained_tokenizer_path auto:" in x]
    assert line.startswith(f"[kronos] pretrained_tokenizer_path auto: published {TOKENIZER_ID}, in the Hugging Face "
                           "cache (revision "), line
    assert r.run.data.params["pretrained_tokenizer_path"] == "auto"  # what was asked; the tag says what it chose
    assert r.run.data.tags["pretrained_tokenizer_path_source"].startswith(f"{TOKENIZER_ID} (auto: published ")
    assert r.run.data.tags["verdict_base"] == TOKENIZER_ID
    start = load_file(r.run_dir / "checkpoints" / "start" / "model.safetensors")
    cached = load_file(r.ckpt / "model.safetensors")
    assert start.keys() == cached.keys() and all(torch.equal(start[k], cached[k]) for k in cached)


def test_a_fresh_two_worker_run_is_judged_against_its_initial_weights(user_run, monkeypatch):
    """The shared ``mlflow run .`` (tests/shared_runs.py: fresh weights, two torchrun workers):
    its starting weights are kept, the verdict's base is ``fresh``, and both losses, scored in
    shares by the two ranks, equal one process's recomputation on independently built windows."""
    from kronos_mlflow.serving.tokenizer_model import load_tokenizer
    from kronos_mlflow.model import KronosTokenizer

    run = user_run.run()
    metrics, tags = run.data.metrics, run.data.tags
    assert tags["verdict_base"] == "fresh" and tags["world_size"] == "2"
    assert tags["verdict"] == decide(metrics["test_loss_change_ci_low"], metrics["test_loss_change_ci_high"], 0.005)
    assert RUN_METRICS <= set(metrics) and metrics["test_windows"] == TINY["n_val_iter"]
    start = KronosTokenizer.from_pretrained(run_dir(user_run.save_path) / "checkpoints" / "start")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", user_run.uri)
    tuned = load_tokenizer(f"runs:/{run.info.run_id}/best_model").eval()
    n = TINY["n_val_iter"]
    assert metrics["test_tokenizer_loss"] == pytest.approx(
        independent_test_losses(user_run.root / "cache", tuned, n).mean(), rel=1e-5)
    assert metrics["base_test_tokenizer_loss"] == pytest.approx(
        independent_test_losses(user_run.root / "cache", start.eval(), n).mean(), rel=1e-5)
    (line,) = LINE.findall(user_run.stdout)  # rank 0 alone prints it
    assert line[6] == tags["verdict"]


def test_evaluate_tokenizer_reproduces_the_runs_verdict_and_logs_it(pretrained_run, commands):
    """The stand-alone command on the registered model and the starting checkpoint, on the same
    data flags: the same windows, the same numbers, the same verdict; ``--log`` records them."""
    r = pretrained_run
    cmd = ["kronos-mlflow", "evaluate-tokenizer", f"models:/{MODEL_NAME}/1", "--base", str(r.ckpt),
           "--lookback-window", str(TINY["lookback_window"]), "--predict-window", str(TINY["predict_window"]),
           "--n-val-iter", str(TINY["n_val_iter"]), "--dataset-path", str(r.root / "cache"), "--log"]
    proc = commands.run(cmd, cwd=r.root, env=r.env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_line = LINE.search(r.stdout).group(0)
    assert run_line.replace("[kronos] ", "").replace("starting weights", "base") in proc.stdout.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines() if line.startswith(("tokenizer_loss",
                                                                                                   "mse_"))}
    assert float(rows["tokenizer_loss"][0]) == pytest.approx(r.run.data.metrics["test_tokenizer_loss"], rel=1e-5)
    logged_id = re.search(r"logged: MLflow run (\w+)", proc.stdout).group(1)
    logged = r.client.get_run(logged_id)
    for key in RUN_METRICS:
        assert logged.data.metrics[key] == pytest.approx(r.run.data.metrics[key], rel=1e-6, abs=1e-9), key
    assert logged.data.tags["verdict"] == r.run.data.tags["verdict"]
    assert logged.data.tags["test_windows_digest"] == r.run.data.tags["test_windows_digest"]
    assert logged.data.params["model"] == f"models:/{MODEL_NAME}/1" and logged.data.params["split"] == "test"


def test_evaluate_tokenizer_scores_a_run_at_its_own_sizes_and_checks_the_base_first(pretrained_run, commands):
    """``evaluate-tokenizer runs:/<id>/best_model --base CKPT`` with no data or size flag: the
    run's own windows (the same digest, loss and verdict), a line naming the recorded sizes; an
    unusable ``--base`` is refused before MODEL is downloaded (MODEL here names no artifact)."""
    r = pretrained_run
    cmd = ["kronos-mlflow", "evaluate-tokenizer", f"runs:/{r.run.info.run_id}/best_model", "--base", str(r.ckpt)]
    proc = commands.run(cmd, cwd=r.root, env=r.env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert f"[kronos] MODEL's run {r.run.info.run_id} recorded " in out
    recorded = next(line for line in out.splitlines() if "MODEL's run" in line)
    assert f"lookback_window={TINY['lookback_window']}" in recorded and f"n_val_iter={TINY['n_val_iter']}" in recorded
    assert f"(windows digest {r.run.data.tags['test_windows_digest'][:12]})" in proc.stdout
    run_line = LINE.search(r.stdout).group(0)
    assert run_line.replace("[kronos] ", "").replace("starting weights", "base") in proc.stdout.splitlines()
    # a flag still wins over what the run recorded
    smaller = commands.run([*cmd, "--n-test-iter", "3"], cwd=r.root, env=r.env, timeout=300)
    assert smaller.returncode == 0 and "data:  3 of " in smaller.stdout, smaller.stdout + smaller.stderr
    bad = commands.run(["kronos-mlflow", "evaluate-tokenizer", f"runs:/{r.run.info.run_id}/no_such_model",
                        "--base", str(r.root / "no-such-base")], cwd=r.root, env=r.env, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("kronos-mlflow evaluate-tokenizer: error: --base: ") and "no-such-base" in line, line


def test_an_empty_test_split_gives_unavailable_and_one_line(tmp_path):
    uri = create_sqlite_store(tmp_path)
    cmd = train_command(tmp_path, epochs=1, test_time_range="2026-01-01:2026-06-30")
    proc = subprocess.run(cmd, cwd=tmp_path, env=isolated_env(tmp_path, uri), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "test" in line and "window" in line]
    assert said == ["[kronos] test: verdict unavailable: no test windows for instrument 'csi300' in test_time_range "
                    "2026-01-01:2026-06-30; widen test_time_range to judge the fine-tune"], said
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs(["0"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["verdict"] == "unavailable" and run.data.tags["verdict_base"] == "fresh"
    assert not [k for k in run.data.metrics if "test_" in k] and "test_windows_digest" not in run.data.tags
    (model,) = client.search_logged_models(experiment_ids=["0"])
    assert not [m.key for m in model.metrics if "test_" in m.key]
    summary = json.loads((run_dir(tmp_path / "outputs") / "summary.json").read_text())
    assert summary["final_result"]["test"]["verdict"] == "unavailable"


def _space(path: Path, low: float, high: float) -> Path:
    path.write_text(f"learning_rate: {{low: {low}, high: {high}, log: true}}\n"
                    "weight_decay: {low: 1.0e-4, high: 2.0e-4, log: true}\n")
    return path


@contextmanager
def _stop_handlers_kept():
    """The sweep installs its SIGTERM / SIGINT handlers in this process: put pytest's back."""
    from kronos_mlflow.runtime import stopping

    saved = {sig: signal.getsignal(sig) for sig in stopping.STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_sweep_moves_the_champion_only_on_better(isolated, commands, monkeypatch, capsys):
    """From the pretrained checkpoint: a trial of one step at a tiny learning rate cannot improve
    the weights, is not called better, and the champion does not move (the parent says why);
    a trial that learns is better, and the champion moves to it. The sweep's driver
    (``run_sweep``, what ``mlflow run . -e sweep`` runs) in this process; each trial the training
    command it starts, through the session's fork server."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from kronos_mlflow.cli.commands import COMMANDS
    from kronos_mlflow.runtime import stopping
    from kronos_mlflow.workflows.sweep import driver

    tmp_path = isolated
    ckpt = write_pretrained(tmp_path / "pretrained")
    config = write_config(tmp_path / "tiny.yaml", **TINY_NO_EPOCHS, pretrained_tokenizer_path=str(ckpt),
                          save_path=str(tmp_path / "outputs" / "models"), dataset_path=str(tmp_path / "cache"))
    client = MlflowClient(create_sqlite_store(tmp_path))
    # a trial's `python -m kronos_mlflow.train ...`, as run_child starts it (told a stop is the parent's to report)
    monkeypatch.setattr(driver, "run_child", lambda cmd, env: commands.run(
        cmd, cwd=os.getcwd(), env={**env, stopping.REPORTED_BY_PARENT: "1"}, timeout=600).returncode)

    def sweep(space: Path, epochs: int, n_train_iter: int):
        argv = ["--config", str(config), "--storage", f"sqlite:///{tmp_path}/optuna.db", "--n-trials", "1",
                "--pruner", "none", "--search-space", str(space), "--epochs", str(epochs),
                "--n-train-iter", str(n_train_iter), "--batch-size", str(TINY["batch_size"]),
                "--n-val-iter", str(TINY["n_val_iter"]), "--comet", "off", "--registered-model-name", MODEL_NAME]
        capsys.readouterr()
        with _stop_handlers_kept():
            assert driver.run_sweep(argv, commands=COMMANDS) == 0
        out = capsys.readouterr().out
        parents = [p for p in client.search_runs(["0"], order_by=["attributes.start_time DESC"])
                   if p.data.tags.get("sweep.role") == "parent"]
        trial = client.get_run(parents[0].data.tags["best_run"])
        return out, parents[0], trial

    # one optimizer step (8 windows, batch 8) at a learning rate of about 1e-12: the weights stay
    out, parent, trial = sweep(_space(tmp_path / "tiny_lr.yaml", 1e-12, 2e-12), epochs=1, n_train_iter=8)
    assert trial.data.tags["verdict"] == "inconclusive" and trial.data.tags["verdict_base"] == str(ckpt)
    assert trial.data.metrics["test_loss_change"] == pytest.approx(0.0, abs=1e-6)
    assert parent.data.tags["best_trial_verdict"] == "inconclusive"
    assert parent.data.metrics["best_trial_test_tokenizer_loss"] == trial.data.metrics["test_tokenizer_loss"]
    assert parent.data.tags["champion_unchanged"] == (
        "best trial 0's test verdict is inconclusive, not better; --promote always moves the champion regardless")
    assert "champion" not in parent.data.tags
    assert "[sweep] champion unchanged: best trial 0's test verdict is inconclusive" in out
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias(MODEL_NAME, "champion")

    # the same study, a trial that learns: better, the study's best, and the champion
    _, parent, trial = sweep(_space(tmp_path / "learns.yaml", 8e-4, 1.2e-3), epochs=2, n_train_iter=TINY["n_train_iter"])
    assert trial.data.tags["optuna.trial_number"] == "1" and trial.data.tags["verdict"] == "better"
    assert parent.data.tags["best_trial_verdict"] == "better" and "champion_unchanged" not in parent.data.tags
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    assert champion.run_id == trial.info.run_id
    assert parent.data.tags["champion"] == f"{MODEL_NAME}/{champion.version}"
