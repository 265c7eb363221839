"""The MLflow adapter: one run through an explicit ``MlflowClient`` (no fluent global state)."""

from __future__ import annotations

import atexit
import logging
import os
import posixpath
import re
import sys
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import UserError, short_reason
from .ownership import (
    STATE_ADVICE, TAG, Claim, OwnershipError, check_writable, new_token, read_owner, token_hash, write_owner,
)
from ..config.secrets import redact, redact_uri, scrub_params, secret_values
from ..config.checks import mlflow_experiment_name
from ..config.sections import as_section
from .outage import QUEUES, OutageQueue, flush_at_exit
from .protocol import (FAILURE_REASON_MAX_CHARS, MetricCleaner, Status, check_status, flatten_params, one_line,
                       same_param)
from .gate import (RunRefused, command_experiment as gate_experiment, experiment_named, handed_experiment,
                   new_run, refusal)
from .server import ensure_sqlite_store, hide_uri_printing, mlflow_limits, probe_tracking_server

log = logging.getLogger("kronos_mlflow.tracking")
# mlflow is imported inside the methods: `kronos-mlflow --help` and the no-MLflow paths stay fast.

class MLflowLogger(OutageQueue):
    """Logs to one MLflow run through an explicit ``MlflowClient`` (no fluent global state).

    The run: ``run_id`` or env ``MLFLOW_RUN_ID`` when set (the run ``mlflow run`` or a sweep
    created; reopened as RUNNING if needed, never ended before :meth:`finalize`), otherwise a new
    run in ``experiment_name`` / env ``MLFLOW_EXPERIMENT_NAME`` / env ``MLFLOW_EXPERIMENT_ID`` /
    MLflow's default experiment, in that order (a named experiment is created when missing).

    Params are strings truncated to MLflow's limit and sent 100 per batch; a param already on the
    run with another value is skipped with a warning (MLflow refuses to change one). Metrics are
    buffered and sent with ``log_batch`` every ``flush_every_s`` seconds or ``flush_max_metrics``
    values, and always on :meth:`flush` / :meth:`finalize` (and at interpreter exit).

    Tracking outages (http/https servers). Every request of this logger gets one try and a
    ``http_timeout_s`` timeout (env ``KRONOS_MLFLOW_HTTP_TIMEOUT_S``, default 10 s) instead of
    MLflow's minutes of retries, so a server that goes away never blocks training for long.
    When a send fails with a connection error (refused, timeout, HTTP 5xx), nothing is dropped:
    metrics stay buffered (at most ``max_buffered_metrics`` in memory; more go to the spool
    file), params, tags and artifacts (copied into the spool directory) are queued, and the send
    is retried on later calls with exponential backoff (``retry_backoff_s``: 1 s doubling to
    60 s). Sending the same metric again is harmless (MLflow drops exact duplicates). At
    :meth:`finalize` the logger waits up to ``finalize_wait_s`` (env
    ``KRONOS_MLFLOW_FINALIZE_WAIT_S``, default 30 s) for the server; if it is still down,
    everything unsent (metrics with steps and timestamps, params, tags, artifacts, the terminal
    status) goes to ``spool_dir/<run_id>.jsonl`` (default ``$KRONOS_MLFLOW_HOME/spool``) and one
    line on stderr says how many values were delayed and spooled and gives the ``kronos-mlflow
    upload-spool`` command. Any other error (a refused value, HTTP 4xx) raises as before.
    Counters: ``delayed_metrics``, ``spooled_metrics``, ``outages``, ``outage_seconds``,
    ``spool_file``; :meth:`report` is the end-of-run line.

    Resuming a run (same ``run_id``): :meth:`skip_logged_steps` reads the ``(key, step)`` pairs
    already on the run, and later values at those steps are not sent again.

    Attributes: ``client``, ``run_id``, ``experiment_id``, ``tracking_uri`` (may hold a
    password: print ``redact_uri(tracking_uri)``).
    """

    essential = True
    system_metrics = None  # a started kronos_mlflow.tracking.system_metrics.SystemMetrics, stopped by finalize

    def __init__(
        self,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: Mapping[str, str] | None = None,
        *,
        run_id: str | None = None,
        flush_every_s: float = 5.0,
        flush_max_metrics: int = 1000,
        probe_timeout_s: float = 5.0,
        spool_dir: str | os.PathLike | None = None,
        max_buffered_metrics: int = 100_000,
        http_timeout_s: float | None = None,
        finalize_wait_s: float | None = None,
        retry_backoff_s: tuple[float, float] = (1.0, 60.0),
        claim: Claim | None = None,
    ):
        import mlflow
        from mlflow import MlflowClient

        self.tracking_uri: str = tracking_uri or mlflow.get_tracking_uri()
        hide_uri_printing(self.tracking_uri)
        probe_tracking_server(self.tracking_uri, probe_timeout_s)
        ensure_sqlite_store(self.tracking_uri)  # created once, even when several processes start together
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.flush_every_s = float(flush_every_s)
        self.flush_max_metrics = max(1, int(flush_max_metrics))
        self._cleaner = MetricCleaner("MLflow")
        self._keys: dict[str, str] = {}
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._finalized = False
        # (key, step) pairs already on the run: not sent again (a resumed run replays them).
        # MultiLogger filters with the same dict, so no backend gets them twice.
        self.skipped_steps: dict[str, set[int]] = {}
        self._init_outage(spool_dir=spool_dir, max_buffered_metrics=max_buffered_metrics,
                          http_timeout_s=http_timeout_s, finalize_wait_s=finalize_wait_s,
                          retry_backoff_s=retry_backoff_s)

        launcher_run_id = os.environ.get("MLFLOW_RUN_ID", "").strip() or None
        user_tags = {str(k): v for k, v in (tags or {}).items()}
        self.owner_token: str | None = None  # this run's token (kronos_mlflow.tracking.ownership), when known
        if claim is not None and claim.resume:  # a file names the run: it must prove it is that run's
            if launcher_run_id and launcher_run_id != run_id:  # checked before anything is written
                self._check_launcher_run(launcher_run_id)
            run = self._attach(run_id, run_name, claim=claim, experiment_name=experiment_name)
            self.attached = True
        elif run_id:  # opened by its id from Python
            run = self._attach(run_id, run_name, claim=claim)
            self.attached = True
        elif launcher_run_id:  # handed over: through the store gate
            run = self._attach(launcher_run_id, run_name, claim=claim or Claim(), experiment_name=experiment_name,
                               handed=True)
            self.attached = True
        else:
            run = self._create(experiment_name, run_name, user_tags, claim)
            user_tags = {}  # already on the new run
            self.attached = False
        self.run_id: str = run.info.run_id
        self.experiment_id: str = run.info.experiment_id
        self.run_name: str = run.info.run_name
        self.run_tags: dict[str, str] = dict(run.data.tags)  # as the run was opened
        self._params: dict[str, str] = dict(run.data.params)
        self._adopt_spool()
        if user_tags:
            self.set_tags(user_tags)
        if launcher_run_id and launcher_run_id != self.run_id:
            self._point_launcher_run(launcher_run_id)
        atexit.register(flush_at_exit, weakref.ref(self))

    def _check_launcher_run(self, launcher_run_id: str) -> None:
        """The run ``mlflow run`` (or a sweep) made for this launch may be tagged as continued
        elsewhere only when it is such a bare run: never another training's."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(launcher_run_id)
        except MlflowException:
            return  # named nowhere else: _point_launcher_run reports it and goes on
        why = refusal(run, command="train", experiment_id=None)
        if why:
            raise RunRefused(why)

    def _point_launcher_run(self, launcher_run_id: str) -> None:
        """A resumed training continues its saved run; the run ``mlflow run`` (or a sweep) made for
        this launch gets a tag and a note naming it, so it is not mistaken for a lost training."""
        note = (f"Training continued in run {self.run_id} (resumed from the saved training state); "
                "this run holds only the launch's parameters.")
        try:
            self.client.set_tag(launcher_run_id, "kronos.continued_in_run", self.run_id)
            self.client.set_tag(launcher_run_id, "mlflow.note.content", note)
        except Exception as exc:  # the launcher's run is a courtesy; training goes on without it
            print(f"[kronos] MLflow: could not tag run {launcher_run_id} ({short_reason(exc)})", flush=True)
            return
        print(f"[kronos] MLflow: resuming into saved run {self.run_id}; run {launcher_run_id} of this launch is "
              "tagged kronos.continued_in_run", flush=True)

    # ---- run resolution -------------------------------------------------------------------

    def _attach(self, run_id: str, run_name: str | None, *, claim: Claim | None = None,
                experiment_name: str | None = None, handed: bool = False):
        """Open an existing run: the one a training state names (``claim.resume``: it must carry
        the state's token, be in this command's experiment and not be FINISHED), or the one
        ``MLFLOW_RUN_ID`` hands over (``handed``: the store gate's rules,
        :func:`kronos_mlflow.tracking.refusal`). Every check comes before any write."""
        from mlflow.exceptions import MlflowException

        source = claim.named_by if claim is not None and claim.resume else "MLFLOW_RUN_ID"
        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                if claim is not None and claim.resume:
                    raise OwnershipError(f"{source} names MLflow run {run_id}, which is not in the tracking store "
                                         f"{redact_uri(self.tracking_uri)}; nothing was written: point "
                                         f"MLFLOW_TRACKING_URI at the store that holds it, or {STATE_ADVICE}") from None
                raise UserError(
                    f"MLflow run {run_id} (MLFLOW_RUN_ID) does not exist at {redact_uri(self.tracking_uri)}; "
                    "unset MLFLOW_RUN_ID or point MLFLOW_TRACKING_URI at the server that holds it"
                ) from None
            raise
        if run.info.lifecycle_stage == "deleted" and not (claim is not None and claim.resume):
            raise UserError(f"MLflow run {run_id} (MLFLOW_RUN_ID) is deleted; restore it or unset MLFLOW_RUN_ID")
        token = None
        if claim is not None and claim.resume:
            check_writable(run, claim.token, what=source, store=redact_uri(self.tracking_uri),
                           experiment_id=command_experiment(self.client, experiment_name))
            token = claim.token
        elif handed:
            claim = claim or Claim()
            owner = read_owner(claim.directory) if claim.directory is not None else None
            why = refusal(run, command=claim.command, directory_owner=owner,
                               experiment_id=handed_experiment(self.client, experiment_name))
            if why:
                raise RunRefused(why)
            token = owner.token if owner is not None and owner.run_id == run_id and TAG in run.data.tags else None
            token = token or claim.token or new_token()
            if claim.directory is not None:  # before the tag: a restart finds the claim it made
                write_owner(claim.directory, token, run_id, run.info.experiment_id)
        elif TAG not in run.data.tags and run.info.status != "FINISHED":
            token = new_token()  # a run opened by its id from Python: claimed, so its spools upload
        self.owner_token = token
        changes: dict[str, Any] = {}
        if run.info.status != "RUNNING":  # as mlflow.start_run(run_id=...) does when resuming
            changes["status"] = "RUNNING"
        if run_name and run_name != run.info.run_name:
            changes["name"] = run_name
        # A resumed run is no longer stopped or failed: the last attempt's reason goes (a new one is
        # written if this attempt ends the same way), so a FINISHED run never shows a stop_reason.
        stale = [k for k in ("stop_reason", "failure_reason") if k in run.data.tags] if changes.get("status") else []
        for key in stale:
            self.client.delete_tag(run_id, key)
        claimed = token is not None and TAG not in run.data.tags
        if claimed:
            self.client.set_tag(run_id, TAG, token_hash(token))
        if changes:
            self.client.update_run(run_id, **changes)
        if changes or stale or claimed:
            run = self.client.get_run(run_id)
        return run

    def _experiment_by_name(self, name: str) -> str:
        return experiment_named(self.client, name)

    def _experiment_by_id(self, experiment_id: str, source: str) -> str:
        from mlflow.exceptions import MlflowException

        try:
            experiment = self.client.get_experiment(experiment_id)
        except MlflowException as exc:
            if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise UserError(
                    f"MLflow experiment id '{experiment_id}' ({source}) does not exist at "
                    f"{redact_uri(self.tracking_uri)}; set an existing id or use MLFLOW_EXPERIMENT_NAME"
                ) from None
            raise
        if experiment.lifecycle_stage == "deleted":
            raise UserError(f"MLflow experiment id '{experiment_id}' ({source}) is deleted; restore it or choose another")
        return experiment.experiment_id

    def _create(self, experiment_name: str | None, run_name: str | None, tags: Mapping[str, Any],
                claim: Claim | None = None):
        if experiment_name:
            experiment_id = self._experiment_by_name(experiment_name)
        elif os.environ.get("MLFLOW_EXPERIMENT_NAME", "").strip():
            experiment_id = self._experiment_by_name(os.environ["MLFLOW_EXPERIMENT_NAME"].strip())
        elif os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip():
            experiment_id = self._experiment_by_id(os.environ["MLFLOW_EXPERIMENT_ID"].strip(), "MLFLOW_EXPERIMENT_ID")
        else:
            from mlflow.tracking.default_experiment import DEFAULT_EXPERIMENT_ID

            experiment_id = DEFAULT_EXPERIMENT_ID
        run_tags = self._tag_values(tags)
        try:  # mlflow.user, mlflow.source.name/type, git commit: what mlflow.start_run adds
            from mlflow.tracking.context.registry import resolve_tags

            run_tags = resolve_tags(run_tags)
        except Exception as exc:  # context providers are best effort
            log.debug("could not resolve MLflow context tags: %s", exc)

        self.owner_token = (claim.token if claim is not None else None) or new_token()
        if claim is not None and claim.directory is not None:  # the claim first: a restart finds its token
            write_owner(claim.directory, self.owner_token, None, experiment_id)
        run_tags[TAG] = token_hash(self.owner_token)  # the run is created owned: no moment without it
        run = new_run(self.client, experiment_id, run_name=run_name, tags=run_tags)
        if claim is not None and claim.directory is not None:
            write_owner(claim.directory, self.owner_token, run.info.run_id, experiment_id)
        return run

    # ---- key and value hygiene ------------------------------------------------------------

    def _clean_key(self, key: str) -> str:
        """A key MLflow accepts: only [/\\w.\\- :], no path tricks, at most 250 chars."""
        cleaned = self._keys.get(key)
        if cleaned is not None:
            return cleaned
        cleaned = re.sub(r"[^/\w.\- :]", "_", str(key))
        norm = posixpath.normpath(cleaned) if cleaned else ""
        if not cleaned or norm != cleaned or norm in (".", "..") or norm.startswith(("/", "..")):
            cleaned = cleaned.replace("/", "_")
            if cleaned.strip(".") == "":
                cleaned = "_" + cleaned
        cleaned = cleaned[: mlflow_limits()["MAX_ENTITY_KEY_LENGTH"]]
        if cleaned != key:
            log.warning("MLflow: key '%s' is logged as '%s' (MLflow refuses some characters)", key, cleaned)
        self._keys[key] = cleaned
        return cleaned

    def _tag_values(self, tags: Mapping[str, Any]) -> dict[str, str]:
        limit = mlflow_limits()["MAX_TAG_VAL_LENGTH"]
        secrets = secret_values()
        return {self._clean_key(str(k)): redact(str(v), secrets)[:limit] for k, v in tags.items()}

    def skip_logged_steps(self, keys: Iterable[str] | None = None, min_step: int = 0) -> int:
        """Read the ``(key, step)`` pairs (``step >= min_step``) already on the run, for ``keys``
        (default: every metric of the run); later values at those steps are not sent again.
        Returns how many pairs were found. For a resumed run: the steps a killed attempt had
        already sent are replayed identically and need not be sent twice."""
        with self._short_requests():
            if keys is None:
                keys = list(self.client.get_run(self.run_id).data.metrics)
            found = 0
            for key in keys:
                name = self._clean_key(str(key))
                steps = {int(m.step) for m in self.client.get_metric_history(self.run_id, name) if m.step >= min_step}
                if steps:
                    self.skipped_steps.setdefault(name, set()).update(steps)
                    found += len(steps)
        return found

    # ---- the protocol ---------------------------------------------------------------------

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        limit = mlflow_limits()["MAX_PARAM_VAL_LENGTH"]
        new: list[Any] = []
        truncated: list[str] = []
        for key, value in flatten_params(scrub_params(params)).items():
            name = self._clean_key(str(key))
            text = str(value)
            if len(text) > limit:
                text = text[:limit]
                truncated.append(name)
            old = self._params.get(name)
            if old is None:
                self._params[name] = text
                new.append(Param(name, text))
            elif not same_param(old, text):
                log.warning(
                    "MLflow: param '%s' is already %r on run %s; the new value %r is not logged "
                    "(MLflow params cannot change; start a new run to change it)",
                    name, one_line(old, 200), self.run_id, one_line(text, 200),
                )
        if truncated:
            log.warning("MLflow: params truncated to %d characters: %s", limit, ", ".join(truncated))
        self._pending_params.extend(new)
        self._send_queued(("params",))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        step = int(step)
        for key, value in metrics.items():
            number = self._cleaner.number(str(key), value)
            if number is None:
                continue
            name = self._clean_key(str(key))
            if step in self.skipped_steps.get(name, ()):
                continue  # already on the run (a resumed run replays the steps a killed attempt sent)
            self._buffer.append(Metric(name, number, timestamp, step))
        if self._outage_since is not None:
            self._count_delayed()
            if len(self._buffer) > self.max_buffered_metrics:
                self._spill(f"more than {self.max_buffered_metrics} in memory")
        if (
            len(self._buffer) >= self.flush_max_metrics
            or time.monotonic() - self._last_flush >= self.flush_every_s
        ):
            self.flush()

    def flush(self) -> None:
        """Send buffered metrics now (during an outage: once the backoff has passed)."""
        self._last_flush = time.monotonic()
        if not self._buffer and self._outage_since is None:
            return
        self._send_queued(("metrics",))

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        local_path = os.fspath(local_path)
        if os.path.isdir(local_path):
            fn = self.client.log_artifacts
        elif os.path.isfile(local_path):
            fn = self.client.log_artifact
        else:
            raise FileNotFoundError(f"cannot log artifact '{local_path}': no such file or directory")
        if self._outage_since is None and self._try(fn, self.run_id, local_path, artifact_path):
            return
        self._pending_artifacts.append((self._copy_for_later(local_path), artifact_path, True))
        self._send_queued(())

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self._pending_tags.extend(RunTag(k, v) for k, v in self._tag_values(tags).items())
        self._send_queued(("tags",))

    def log_input(self, dataset: Any, context: str | None = None, tags: Mapping[str, str] | None = None) -> None:
        """Record an ``mlflow.data`` dataset (e.g. ``mlflow.data.from_pandas(df, name=...)``) as a run input."""
        from mlflow.entities import DatasetInput, InputTag

        input_tags = [InputTag(key=k, value=str(v)) for k, v in (tags or {}).items()]
        if context:
            input_tags.append(InputTag(key="mlflow.data.context", value=context))
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset=dataset._to_mlflow_entity(), tags=input_tags)])

    def finalize(self, status: Status, reason: str | None = None) -> None:
        """Send everything, then mark the run FINISHED (``"success"``), FAILED (with a
        ``failure_reason`` tag) or KILLED (``stop_reason``). Idempotent.

        A server that is down is waited for, with backoff, up to ``finalize_wait_s``; then what
        is left goes to the spool file and one line on stderr gives the upload command (the run
        stays RUNNING on the server until it is uploaded). If sending fails for another reason,
        the run is marked FAILED and the error re-raised.
        """
        from mlflow.entities import RunTag

        check_status(status)
        if self._finalized:
            return
        self._finalized = True
        if self.system_metrics is not None:  # its last values go in before the run ends
            self.system_metrics.stop()
        end_time = int(time.time() * 1000)
        error: BaseException | None = None
        try:
            self._drain(QUEUES)
        except Exception as exc:  # not an outage: a value MLflow refuses, a bug
            error = exc
            status = "failed"
            reason = reason or f"could not send the last metrics to MLflow: {exc}"
            self._clear_queues()
        if status in ("failed", "killed"):
            tag = "failure_reason" if status == "failed" else "stop_reason"
            text = one_line(redact(reason or "unknown (no reason given)"), FAILURE_REASON_MAX_CHARS)
            self._pending_tags.extend(RunTag(k, v) for k, v in self._tag_values({tag: text}).items())
        terminal = {"success": "FINISHED", "failed": "FAILED", "killed": "KILLED"}[status]
        deadline = time.monotonic() + (self.finalize_wait_s if self._http else 0.0)
        done = False
        while True:
            try:
                done = self._drain(QUEUES) and self._try(
                    self.client.set_terminated, self.run_id, terminal, end_time=end_time
                )
            except Exception as exc:
                error = error or exc
                self._clear_queues()
                try:  # at least end the run
                    with self._short_requests():
                        self.client.set_terminated(self.run_id, "FAILED", end_time=end_time)
                except Exception:
                    pass
                done = True
            if done:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(max(0.05, min(self._next_retry - time.monotonic(), remaining)))
        if not done:
            self._write_spool((terminal, end_time))
        line = self.report()
        if line:
            print(line, file=sys.stderr, flush=True)
        if error is not None:
            raise error




def command_experiment(client, experiment_name: str | None) -> str:
    """The experiment a command logs to, read only (:func:`kronos_mlflow.tracking.gate.command_experiment`)."""
    return gate_experiment(client, experiment_name)


def check_run_target(tracking: Any, tracking_uri: str | None = None) -> None:
    """Read-only: the run and experiment a training with ``tracking`` (the config's tracking
    section, or the whole config) would log to can be used, as :class:`MLflowLogger` checks them
    at the run's start (``MLFLOW_RUN_ID`` exists and is not deleted; the experiment named by
    ``experiment_name`` / ``MLFLOW_EXPERIMENT_NAME`` is not deleted; ``MLFLOW_EXPERIMENT_ID``
    exists). Nothing is created."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    named = as_section(tracking, "tracking").experiment_name

    uri = tracking_uri or mlflow.get_tracking_uri()
    hide_uri_printing(uri)
    run_id = os.environ.get("MLFLOW_RUN_ID", "").strip()
    try:
        client = MlflowClient(tracking_uri=uri)
        if run_id:
            try:
                run = client.get_run(run_id)
            except MlflowException as exc:
                if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise UserError(f"MLflow run {run_id} (MLFLOW_RUN_ID) does not exist at {redact_uri(uri)}; "
                                    "unset MLFLOW_RUN_ID or point MLFLOW_TRACKING_URI at the server that holds it") \
                        from None
                raise
            if run.info.lifecycle_stage == "deleted":
                raise UserError(f"MLflow run {run_id} (MLFLOW_RUN_ID) is deleted; restore it or unset MLFLOW_RUN_ID")
            return
        name = str(named or "") or os.environ.get("MLFLOW_EXPERIMENT_NAME", "").strip()
        if name:
            source = "experiment_name" if named else "MLFLOW_EXPERIMENT_NAME"
            mlflow_experiment_name(source, name, error=UserError)
            experiment = client.get_experiment_by_name(name)
            if experiment is not None and experiment.lifecycle_stage == "deleted":
                raise UserError(f"MLflow experiment '{name}' is deleted; restore it (mlflow experiments restore "
                                f"--experiment-id {experiment.experiment_id}) or choose another experiment_name")
            return
        experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip()
        if experiment_id:
            try:
                experiment = client.get_experiment(experiment_id)
            except MlflowException as exc:
                if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise UserError(f"MLflow experiment id '{experiment_id}' (MLFLOW_EXPERIMENT_ID) does not exist at "
                                    f"{redact_uri(uri)}; set an existing id or use MLFLOW_EXPERIMENT_NAME") from None
                raise
            if experiment.lifecycle_stage == "deleted":
                raise UserError(f"MLflow experiment id '{experiment_id}' (MLFLOW_EXPERIMENT_ID) is deleted; restore it "
                                "or choose another")
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - the store answered something unexpected: one line
        raise UserError(redact(f"MLflow tracking store {redact_uri(uri)} cannot be read ({short_reason(exc)}); "
                               "check MLFLOW_TRACKING_URI")) from None
