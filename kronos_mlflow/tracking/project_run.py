"""The run ``mlflow run`` created, when the command fails before training opens it.

``mlflow run`` creates the run and passes its id in ``MLFLOW_RUN_ID``; when our command exits
non-zero MLflow marks it FAILED but says nothing about why. :func:`record_failure` puts the
one-line error on that run as ``failure_reason`` and ends it FAILED, so the UI and ``compare``
show the reason (e.g. ``unknown flag --epoch (did you mean --epochs?)``). :func:`end_failed` is
how every other place that ends a run FAILED (a pipeline's parent and steps, a sweep's trials
and parent) records why.
"""

from __future__ import annotations

import os

from ..config.secrets import redact
from .protocol import FAILURE_REASON_MAX_CHARS, one_line
from .server import hide_uri_printing


def record_failure(line: str, exc: BaseException | None = None) -> bool:
    """Tag the run of ``MLFLOW_RUN_ID`` with ``failure_reason`` = ``line`` and end it FAILED, when
    it is still RUNNING and the store gate lets this command write it (a bare run ``mlflow run``
    made, or one handed over by this project: :func:`kronos_mlflow.tracking.gate.refusal`; never a
    training's own run, which records its own end, nor a run the gate refused: ``exc``). Best
    effort: returns whether it was recorded; never raises."""
    from .gate import RunRefused, refusal  # lazy: keeps this module's import light (the launcher imports it)

    run_id = os.environ.get("MLFLOW_RUN_ID", "").strip()
    if not run_id or isinstance(exc, RunRefused):
        return False
    try:
        from mlflow import MlflowClient

        client = MlflowClient()
        hide_uri_printing(client.tracking_uri)
        run = client.get_run(run_id)
        if run.info.status not in ("RUNNING", "SCHEDULED") or refusal(run, command=None, experiment_id=None):
            return False  # ended, a training's own run, or not this command's to write
        end_failed(client, run_id, line)
        return True
    except Exception:  # noqa: BLE001 - the error line on stderr is what matters
        return False


def end_failed(client, run_id: str, reason: str) -> None:
    """End ``run_id`` FAILED with ``reason`` (one line, secrets redacted) as its
    ``failure_reason``. Every place that ends a run of this project FAILED goes through here (or
    through the logger's ``finalize``), so none ends without saying why."""
    client.set_tag(run_id, "failure_reason", one_line(redact(reason), FAILURE_REASON_MAX_CHARS))
    client.set_terminated(run_id, "FAILED")


def end_run(client, run_id: str, status: str, reason: str) -> None:
    """End ``run_id`` ``status``; FAILED through :func:`end_failed`, with ``reason``."""
    if status == "FAILED":
        end_failed(client, run_id, reason)
    else:
        client.set_terminated(run_id, status)
