"""A finished sweep's study in the real Optuna Dashboard, seen in headless Chromium (slow: ~1 min).

The session's ``user_sweep`` (tests/shared_runs.py: ``mlflow run . -e sweep`` typed twice on one
study) holds the study. Its parent MLflow runs carry the command that opens the study (tag
``optuna.dashboard``, also in each run's description); the test runs exactly that command on a
free 127.0.0.1 port and checks, in Debian's Chromium, that the study is listed and that every
trial shows its learning_rate (and its weight_decay where it drew one: the default space may
draw weight_decay_is_zero instead) and its MLflow run. A relative storage made absolute:
tests/test_dashboard.py. The screenshots go to ``test-artifacts/`` (gitignored); their paths are
printed.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from browser import local_browser, needs_chromium
from servers import serve_on_free_port, stop_process_group

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"

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


def test_finished_sweep_opens_in_optuna_dashboard(user_sweep, tmp_path):
    study, storage, env = user_sweep.study(), user_sweep.storage, user_sweep.env
    name = user_sweep.study_name
    trials = {t.number: t for t in study.trials}
    assert sorted(trials) == list(range(2 * user_sweep.n_trials))
    for trial in trials.values():  # a learning rate, and a weight decay or the choice of zero
        assert "learning_rate" in trial.params and ("weight_decay" in trial.params
                                                    or trial.params.get("weight_decay_is_zero")), trial.params
    assert any("weight_decay" in t.params for t in trials.values())  # the dashboard shows a drawn weight decay

    # each parent run says how to open the study (absolute path: works from any directory)
    parents = user_sweep.parents()
    assert len(parents) == 2
    for parent in parents:
        tags = parent.data.tags
        assert tags["optuna.study_name"] == name and tags["optuna.storage"] == storage
        assert tags["optuna.dashboard"] == f"optuna-dashboard {storage}"
        assert tags["optuna.dashboard"] in tags["mlflow.note.content"]

    ARTIFACTS.mkdir(exist_ok=True)
    server, base = _dashboard(tags["optuna.dashboard"], tmp_path, env)
    try:
        with local_browser(tmp_path / "chromium-profile", "the dashboard") as context:
            # 1. the study list
            page = context.new_page()
            page.goto(f"{base}/dashboard", wait_until="domcontentloaded", timeout=60_000)
            page.get_by_text(name).first.wait_for(timeout=60_000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(ARTIFACTS / "optuna_dashboard_studies.png"))
            print(f"screenshot: {ARTIFACTS / 'optuna_dashboard_studies.png'}", flush=True)

            # 2. the trials list: every trial, each with its learning_rate and weight_decay
            page = context.new_page()
            page.goto(f"{base}/dashboard/studies/{study._study_id}/trials", wait_until="domcontentloaded",
                      timeout=60_000)
            page.get_by_text(f"{len(trials)} Trials").first.wait_for(timeout=60_000)
            for number, trial in trials.items():
                page.get_by_text(f"Trial {number}", exact=True).first.click()
                page.get_by_text(f"Trial {number} (trial_id=").first.wait_for(timeout=30_000)
                page.wait_for_timeout(800)
                text = page.inner_text("body")
                detail = text[text.index(f"Trial {number} (trial_id="):]
                assert _number_after(detail, "learning_rate") == pytest.approx(trial.params["learning_rate"])
                if "weight_decay" in trial.params:  # else it drew weight_decay_is_zero
                    assert _number_after(detail, "weight_decay") == pytest.approx(trial.params["weight_decay"])
                assert trial.user_attrs["mlflow_run_id"] in detail  # the trial's MLflow run
                shot = ARTIFACTS / f"optuna_dashboard_trial_{number}.png"
                page.screenshot(path=str(shot))
                print(f"screenshot: {shot}", flush=True)
    finally:
        stop_process_group(server)
