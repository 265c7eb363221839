"""A finished sweep's study in the real Optuna Dashboard, seen in headless Chromium (slow: ~2 min).

``sweeps/sweep.py`` runs two tiny trials on the demo market (a search space without the
weight-decay-is-zero switch, so both trials draw learning_rate and weight_decay). The parent
MLflow run carries the command that opens the study (tag ``optuna.dashboard``, also in the run's
description); the test runs exactly that command on a free 127.0.0.1 port and checks, in
Debian's Chromium, that the study is listed and that both trials show their learning_rate and
weight_decay. The screenshots go to ``test-artifacts/`` (gitignored); their paths are printed.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from browser import local_browser, needs_chromium
from servers import serve_on_free_port, stop_process_group
import tiny_runs

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
TINY = {**{k: v for k, v in tiny_runs.TINY.items() if k != "epochs"}, "n_val_iter": 32}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    needs_chromium,
]


def _dashboard(command: str, tmp_path: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """The parent run's command, on a free local port."""
    argv = shlex.split(command)
    assert argv[0] == "optuna-dashboard"
    exe = Path(sys.executable).with_name("optuna-dashboard")
    return serve_on_free_port(lambda port: [str(exe), *argv[1:], "--host", "127.0.0.1", "--port", str(port)],
                              "/api/studies", tmp_path, "optuna-dashboard", env, timeout=90)


def _number_after(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\s+([-+0-9.eE]+)\s*$", text, re.MULTILINE)
    assert match, f"'{name}' is not shown in the trial's parameters:\n{text[:2000]}"
    return float(match.group(1))


def test_finished_sweep_opens_in_optuna_dashboard(tmp_path):
    from mlflow import MlflowClient

    config = {**TINY, "dataset_path": str(tmp_path / "cache")}
    (tmp_path / "tiny.yaml").write_text("".join(f"{k}: {v}\n" for k, v in config.items()))
    (tmp_path / "space.yaml").write_text("learning_rate: {low: 1.0e-5, high: 1.0e-3, log: true}\n"
                                         "weight_decay: {low: 1.0e-4, high: 0.3, log: true}\n")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).search_experiments()
    env = tiny_runs.isolated_env(tmp_path, uri)
    cmd = [sys.executable, str(ROOT / "sweeps" / "sweep.py"), "--config", str(tmp_path / "tiny.yaml"),
           "--search-space", str(tmp_path / "space.yaml"), "--storage", "sqlite:///optuna.db",  # relative, as typed
           "--study-name", "lr-wd", "--qlib-data-path", "", "--comet", "off", "--epochs", "1",
           "--output-dir", str(tmp_path / "out"), "--n-trials", "2", "--pruner", "none"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.load_study(study_name="lr-wd", storage=storage)
    trials = {t.number: t for t in study.trials}
    assert sorted(trials) == [0, 1] and all(set(t.params) == {"learning_rate", "weight_decay"} for t in trials.values())

    # the parent run says how to open the study (absolute path: works from any directory)
    (parent,) = [r for r in MlflowClient(uri).search_runs(["0"]) if r.data.tags.get("sweep.role") == "parent"]
    tags = parent.data.tags
    assert tags["optuna.study_name"] == "lr-wd" and tags["optuna.storage"] == storage
    assert tags["optuna.dashboard"] == f"optuna-dashboard {storage}"
    assert tags["optuna.dashboard"] in tags["mlflow.note.content"]

    ARTIFACTS.mkdir(exist_ok=True)
    server, base = _dashboard(tags["optuna.dashboard"], tmp_path, env)
    try:
        with local_browser(tmp_path / "chromium-profile", "the dashboard") as context:
            # 1. the study list
            page = context.new_page()
            page.goto(f"{base}/dashboard", wait_until="domcontentloaded", timeout=60_000)
            page.get_by_text("lr-wd").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(ARTIFACTS / "optuna_dashboard_studies.png"))
            print(f"screenshot: {ARTIFACTS / 'optuna_dashboard_studies.png'}", flush=True)

            # 2. the trials list: both trials, each with its learning_rate and weight_decay
            page = context.new_page()
            page.goto(f"{base}/dashboard/studies/{study._study_id}/trials", wait_until="domcontentloaded",
                      timeout=60_000)
            page.get_by_text("2 Trials").first.wait_for(timeout=60_000)
            for number, trial in trials.items():
                page.get_by_text(f"Trial {number}", exact=True).first.click()
                page.get_by_text(f"Trial {number} (trial_id=").first.wait_for(timeout=30_000)
                page.wait_for_timeout(800)
                text = page.inner_text("body")
                detail = text[text.index(f"Trial {number} (trial_id="):]
                assert _number_after(detail, "learning_rate") == pytest.approx(trial.params["learning_rate"])
                assert _number_after(detail, "weight_decay") == pytest.approx(trial.params["weight_decay"])
                assert trial.user_attrs["mlflow_run_id"] in detail  # the trial's MLflow run
                shot = ARTIFACTS / f"optuna_dashboard_trial_{number}.png"
                page.screenshot(path=str(shot))
                print(f"screenshot: {shot}", flush=True)
    finally:
        stop_process_group(server)
