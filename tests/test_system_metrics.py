"""System metrics (``kronos_mlflow.tracking.system_metrics``): MLflow's monitor on the run, stopped with it.

The slow test reads the ``system/...`` metrics of a real ``mlflow run .`` (the shared run of
tests/shared_runs.py: default sampling interval) back from the store.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kronos_mlflow.config.core import load_config
from kronos_mlflow.errors import ConfigError

CPU = "system/cpu_utilization_percentage"
MEMORY = "system/system_memory_usage_megabytes"


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor" and t.is_alive()]


def test_config_switch_and_interval_are_validated():
    assert load_config()["system_metrics"] == "on"
    assert load_config()["system_metrics_interval_s"] == 30.0
    assert load_config({"system_metrics": False})["system_metrics"] == "off"  # YAML's bare off
    with pytest.raises(ConfigError, match="system_metrics: 'maybe' is not one of on, off"):
        load_config({"system_metrics": "maybe"})
    with pytest.raises(ConfigError, match="system_metrics_interval_s: 0 must be greater than 0"):
        load_config({"system_metrics_interval_s": 0})


@pytest.fixture()
def sqlite_store(tmp_path, monkeypatch) -> str:
    """A fresh sqlite tracking URI, with no run, experiment or system-metrics setting inherited."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING"):
        monkeypatch.delenv(name, raising=False)
    return f"sqlite:///{tmp_path}/mlflow.db"


def test_monitor_samples_the_run_and_stops_when_it_fails(tmp_path, monkeypatch, sqlite_store):
    from mlflow import MlflowClient

    from kronos_mlflow.tracking import MLflowLogger
    from kronos_mlflow.tracking.system_metrics import start_system_metrics

    uri = sqlite_store
    logger = MLflowLogger(tracking_uri=uri, run_name="sm", spool_dir=tmp_path / "spool")
    assert start_system_metrics({"system_metrics": "off"}, logger.run_id, uri) is None
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")  # MLflow's own switch is honoured
    assert start_system_metrics({"system_metrics": "on"}, logger.run_id, uri) is None
    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING")

    monitor = start_system_metrics({"system_metrics": "on", "system_metrics_interval_s": 0.3}, logger.run_id, uri)
    assert monitor is not None and monitor.running
    assert monitor.sampling_interval == pytest.approx(0.1) and monitor.samples_per_point == 3
    logger.system_metrics = monitor
    client = MlflowClient(uri)
    deadline = time.monotonic() + 60
    while not client.get_metric_history(logger.run_id, CPU):  # a point every 0.3 s (plus MLflow's batching)
        assert time.monotonic() < deadline, "no system metric reached the run in 60 s"
        assert monitor.running, "the monitor stopped on its own"
        time.sleep(0.2)
    logger.finalize("failed", "boom")
    assert not monitor.running and not _monitor_threads()
    run = client.get_run(logger.run_id)
    assert run.info.status == "FAILED"
    history = client.get_metric_history(logger.run_id, CPU)
    assert [m.step for m in history] == list(range(len(history)))
    assert all(0.0 <= m.value <= 100.0 for m in history)
    assert run.data.metrics[MEMORY] > 0
    monitor.stop()  # idempotent


def test_a_run_shorter_than_one_interval_still_gets_a_point(tmp_path, monkeypatch, sqlite_store):
    from mlflow import MlflowClient

    from kronos_mlflow.tracking import MLflowLogger
    from kronos_mlflow.tracking.system_metrics import start_system_metrics

    uri = sqlite_store
    logger = MLflowLogger(tracking_uri=uri, spool_dir=tmp_path / "spool")
    logger.system_metrics = start_system_metrics({"system_metrics": "on"}, logger.run_id, uri)  # 30 s default
    time.sleep(0.5)
    started = time.monotonic()
    logger.finalize("killed", "stopped")
    assert time.monotonic() - started < 15  # the sampler is woken, not waited for
    client = MlflowClient(uri)
    assert client.get_run(logger.run_id).info.status == "KILLED"
    assert len(client.get_metric_history(logger.run_id, CPU)) == 1
    assert not _monitor_threads()


@pytest.mark.slow
def test_training_run_records_system_metrics(user_run):
    """The shared ``mlflow run .`` (system metrics on by default, 30 s interval) has MLflow's
    system metrics. ``--system-metrics off``: tests/test_first_hour.py's three-run test."""
    client = user_run.client()
    run = user_run.run()
    assert run.info.status == "FINISHED"
    assert run.data.params["system_metrics"] == "on"
    system = {k: v for k, v in run.data.metrics.items() if k.startswith("system/")}
    assert {CPU, MEMORY, "system/system_memory_usage_percentage"} <= set(system), sorted(system)
    history = client.get_metric_history(run.info.run_id, CPU)
    assert len(history) >= 1 and all(0.0 <= m.value <= 100.0 for m in history)
    assert 0 < system["system/system_memory_usage_percentage"] <= 100
    assert not any(k.startswith("system/gpu") for k in system) or Path("/dev/nvidia0").exists()
