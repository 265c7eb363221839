"""System metrics of a training run: MLflow's own monitor (CPU, memory, disk, network and, with the
``gpu`` extra, each GPU), attached to the run by id on rank 0 only, as a daemon thread that never
keeps the process alive nor changes the run's status (docs/comparing-runs.md#system-metrics; the
metric names: docs/run-records.md#params-metrics-tags-and-artifacts).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ..config.keys import TRACKING
from ..config.sections import as_section

log = logging.getLogger(__name__)

#: Samples averaged into each logged point.
SAMPLES_PER_POINT = 3
#: Longest wait for the monitor's last send when the run ends.
STOP_TIMEOUT_S = 15.0


def enabled(tracking: Any) -> bool:
    """``system_metrics`` is on and MLflow's own switch is not explicitly false. ``tracking``: the
    config's ``tracking`` section (:func:`kronos_mlflow.config.sections.section`), or the whole config."""
    if str(as_section(tracking, TRACKING).system_metrics).strip().lower() != "on":
        return False
    env = os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").strip().lower()
    return env not in ("false", "0", "no", "off")


class SystemMetrics:
    """A started MLflow system-metrics monitor for one run; :meth:`stop` ends it (idempotent)."""

    def __init__(self, monitor: Any):
        self.monitor = monitor
        self._stopped = False

    @property
    def sampling_interval(self) -> float:
        return float(self.monitor.sampling_interval)

    @property
    def samples_per_point(self) -> int:
        return int(self.monitor.samples_before_logging)

    @property
    def running(self) -> bool:
        thread = getattr(self.monitor, "_process", None)
        return thread is not None and thread.is_alive()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop sampling and send what is left, waiting at most ``timeout_s``; never raises. Called by
        ``MLflowLogger.finalize`` before the run is marked FINISHED, FAILED or KILLED: an unreachable
        tracking server costs a few seconds of system metrics, never a stuck run. The samples taken
        since the last logged point become one last point, so a run shorter than one interval still
        has its figures."""
        if self._stopped:
            return
        self._stopped = True
        self.monitor._shutdown_event.set()  # wakes the sampler now, whatever its interval
        # MLflow's finish() joins the sampler and sends the last batch without a time limit:
        # run it aside, so that a tracking server that went away cannot hold up the run's end.
        done = threading.Event()

        def finish() -> None:
            try:
                thread = self.monitor._process
                if thread is not None:
                    thread.join()
                # Samples taken since the last logged point (all of them in a run shorter than
                # one interval): MLflow drops them at shutdown; they become one last point.
                if any(m._metrics for m in self.monitor.monitors):
                    self.monitor.publish_metrics(self.monitor.aggregate_metrics())
                self.monitor.finish()
            except Exception as exc:  # noqa: BLE001 - system metrics are best effort
                log.warning("MLflow system metrics: could not send the last values (%s)", exc)
            finally:
                done.set()

        threading.Thread(target=finish, name="SystemMetricsStop", daemon=True).start()
        if not done.wait(timeout_s):
            log.warning("MLflow system metrics: the monitor did not stop within %.0f s; its last values are dropped",
                        timeout_s)


def start_system_metrics(tracking: Any, run_id: str, tracking_uri: str,
                         *, resume: bool = False) -> SystemMetrics | None:
    """Start MLflow's monitor on ``run_id`` (a RUNNING run) when the config's ``tracking`` section
    (or the whole config) asks for it.

    ``resume``: the run already holds system metrics (a resumed run): continue their steps.
    Returns None when off, or when the monitor cannot start (psutil missing: one warning; the
    run goes on without system metrics).
    """
    settings = as_section(tracking, TRACKING)
    if not enabled(settings):
        return None
    interval = float(settings.system_metrics_interval_s)
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(
            run_id,
            sampling_interval=max(interval / SAMPLES_PER_POINT, 0.01),
            samples_before_logging=SAMPLES_PER_POINT,
            resume_logging=resume,
            tracking_uri=tracking_uri,
        )
    except ImportError as exc:
        log.warning("MLflow system metrics are off for this run: %s (pip install psutil)", exc)
        return None
    except Exception as exc:  # noqa: BLE001 - best effort: training goes on without them
        log.warning("MLflow system metrics are off for this run: %s", exc)
        return None
    monitor.start()
    if getattr(monitor, "_process", None) is None:
        return None
    return SystemMetrics(monitor)
