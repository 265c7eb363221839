"""The fault-injection script's scenarios as tests: workers SIGKILLed under torchrun
--max-restarts resume to the uninterrupted result; a tracking server that goes away mid-run
loses no metric and logs none twice."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("fault_injection", ROOT / "benchmarks" / "fault_injection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sigkilled_workers_resume_to_the_uninterrupted_result(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = _script().sigkill_scenario(tmp_path / "sigkill", tmp_path / "home")
    reference = report["reference"]
    assert len(reference["val_loss_history"]) == 3
    for row in report["rows"]:
        assert row["finished"], row
        assert row["mlflow_runs"] == 1 and row["epochs"] == 3
        assert row["best_rel_diff"] <= 1e-6
        assert row["val_history_equal"]
        assert row["steps_logged_twice"] == 0 and row["steps_missing"] == 0


def test_tracking_server_outage_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = _script().outage_scenario(tmp_path / "outage", tmp_path / "home")
    assert report["trainer_rc"] == 0, report.get("stderr_tail")
    assert report["finished"]
    assert report["metrics_lost"] == 0 and report["steps_logged_twice"] == 0
