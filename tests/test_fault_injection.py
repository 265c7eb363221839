"""The fault-injection script's outage scenario as a test: a tracking server that goes away
mid-run loses no metric and logs none twice. Its SIGKILL scenario's pieces (the uninterrupted
run, the kill from outside, the wait for an epoch) run in tests/test_preemption.py, on plain
torchrun and on ``mlflow run``."""

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


def test_tracking_server_outage_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = _script().outage_scenario(tmp_path / "outage", tmp_path / "home")
    assert report["trainer_rc"] == 0, report.get("stderr_tail")
    assert report["finished"]
    assert report["metrics_lost"] == 0 and report["steps_logged_twice"] == 0
    assert report["metrics_delayed"] > 0  # the outage came while the run was logging
