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

from ..ownership import TAG as OWNER_TAG
from ..secrets import redact
from .protocol import FAILURE_REASON_MAX_CHARS, one_line
from .server import hide_uri_printing


def record_failure(line: str) -> bool:
    """Tag the run of ``MLFLOW_RUN_ID`` (if set, still RUNNING and not yet claimed by a training:
    :mod:`kronos_mlflow.ownership`) with ``failure_reason`` = ``line`` and end it FAILED. Best
    effort: returns whether it was recorded; never raises."""
    run_id = os.environ.get("MLFLOW_RUN_ID", "").strip()
    if not run_id:
        return False
    try:
        from mlflow import MlflowClient

        client = MlflowClient()
        hide_uri_printing(client.tracking_uri)
        run = client.get_run(run_id)
        if run.info.status not in ("RUNNING", "SCHEDULED") or OWNER_TAG in run.data.tags:
            return False  # ended, or a training's own run (it records its own end): not ours to end
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
