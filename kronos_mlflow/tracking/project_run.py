"""The run ``mlflow run`` created, when the command fails before training opens it.

``mlflow run`` creates the run and passes its id in ``MLFLOW_RUN_ID``; when our command exits
non-zero MLflow marks it FAILED but says nothing about why. :func:`record_failure` puts the
one-line error on that run as ``failure_reason`` and ends it FAILED, so the UI and ``compare``
show the reason (e.g. ``unknown flag --epoch (did you mean --epochs?)``). :func:`end_failed` is
how every other place that ends a run FAILED (a pipeline's parent and steps, a sweep's trials
and parent) records why. :func:`exit_in_one_line` is every command's way out.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..errors import EXIT_USAGE, UserError, leave_the_line_to_rank_0
from ..runtime.disks import disk_error
from ..runtime.stopping import TrainingStopped, exit_code, report, stop_reason

from ..config.secrets import redact
from .protocol import FAILURE_REASON_MAX_CHARS, one_line
from .server import hide_uri_printing


def exit_in_one_line(name: str, work: Callable[[], int | None], *, speaks: bool = True, rank: str | None = None) -> int:
    """Every command's way out: ``work()``'s exit code; a refusal (UserError) one line
    ``NAME: error: ...`` on stderr, recorded on the launcher's run, exit 2; a stop signal one
    line, exit 128 + its number; Ctrl-C where nothing stops more gently, 130; a full disk or a
    folder that cannot be written (an OSError, or safetensors' error wrapping one) one line
    naming the path, exit 2 (:mod:`kronos_mlflow.runtime.disks`); a crash recorded, then raised
    (its traceback). ``speaks``: this process says it (one rank of a group; another
    rank names itself only for a refusal of its own)."""
    try:
        return int(work() or 0)
    except UserError as exc:
        line = f"{name}: error: {exc}"
        if speaks:
            print(line, file=sys.stderr)
            record_failure(line, exc)  # under `mlflow run` (or as a step): the run ends FAILED saying why
        elif not getattr(exc, "same_on_every_rank", False):  # this rank's own problem: say which rank
            print(f"[rank {rank}] {line}", file=sys.stderr)
        else:
            leave_the_line_to_rank_0()
        return EXIT_USAGE
    except TrainingStopped as exc:  # SIGTERM / Ctrl-C of a training: it ended KILLED
        if speaks:
            report(f"{name}: {stop_reason(exc.signum, None, after=exc.after)}")
        return exit_code(exc.signum)
    except KeyboardInterrupt:  # Ctrl-C of a command with no stop handling of its own
        if speaks:
            report(f"{name}: interrupted")
        return 130
    except Exception as exc:  # a crash: the traceback follows; the run it leaves says why it failed
        disk = disk_error(exc)
        if disk is not None:  # a full disk or an unwritable folder met mid-run: one line naming the path
            line = f"{name}: error: {disk}"
            if speaks:
                print(line, file=sys.stderr)
                record_failure(line, disk)
            return EXIT_USAGE
        if speaks:
            record_failure(f"{name}: {type(exc).__name__}: {exc}")
        raise


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
