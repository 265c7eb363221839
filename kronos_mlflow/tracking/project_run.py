"""The run ``mlflow run`` created, when the command fails before training opens it.

``mlflow run`` creates the run and passes its id in ``MLFLOW_RUN_ID``; when our command exits
non-zero MLflow marks it FAILED but says nothing about why. :func:`record_failure` puts the
one-line error on that run as ``failure_reason`` and ends it FAILED, so the UI and ``compare``
show the reason (e.g. ``unknown flag --epoch (did you mean --epochs?)``).
"""

from __future__ import annotations

import os

from ..ownership import TAG as OWNER_TAG
from ..secrets import redact
from .protocol import FAILURE_REASON_MAX_CHARS, one_line


def record_failure(line: str) -> bool:
    """Tag the run of ``MLFLOW_RUN_ID`` (if set, still RUNNING and not yet claimed by a training:
    :mod:`kronos_mlflow.ownership`) with ``failure_reason`` = ``line`` and end it FAILED. Best
    effort: returns whether it was recorded; never raises."""
    run_id = os.environ.get("MLFLOW_RUN_ID", "").strip()
    if not run_id:
        return False
    try:
        from mlflow import MlflowClient

        from .server import hide_uri_printing

        client = MlflowClient()
        hide_uri_printing(client.tracking_uri)
        run = client.get_run(run_id)
        if run.info.status not in ("RUNNING", "SCHEDULED") or OWNER_TAG in run.data.tags:
            return False  # ended, or a training's own run (it records its own end): not ours to end
        client.set_tag(run_id, "failure_reason", one_line(redact(line), FAILURE_REASON_MAX_CHARS))
        client.set_terminated(run_id, "FAILED")
        return True
    except Exception:  # noqa: BLE001 - the error line on stderr is what matters
        return False
