"""What the MLflow logger does while its tracking server is unreachable: keep every value,
retry with exponential backoff, and spool what is still unsent at the end to a file that
``kronos-mlflow upload-spool`` sends later (see "Tracking outages" in
:class:`~kronos_mlflow.tracking.mlflow.MLflowLogger`)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import shutil
import sys
import time
import weakref
from typing import Any

from ..config import settings, checks
from ..runtime import stopping
from ..errors import UserError
from ..config.secrets import redact, redact_uri
from .protocol import one_line
from .server import is_connection_error, mlflow_limits
from .spool import append_records, artifacts_dir, default_spool_dir, read_spool, spool_path, spoolable_tag, upload_spool

log = logging.getLogger("kronos_mlflow.tracking")

QUEUES = ("params", "tags", "metrics", "artifacts")
LOCKED_RETRIES = 8  # about 10 s of waiting for a locked sqlite store
_HTTP_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


def _metric_record(metric: Any) -> dict[str, Any]:
    return {"type": "metric", "key": metric.key, "value": float(metric.value), "step": int(metric.step),
            "timestamp": int(metric.timestamp)}


def env_float(name: str, default: float) -> float:
    """A number of seconds from the environment (:mod:`kronos_mlflow.config.settings`), ``default`` when
    unset; a malformed value is refused (a ``ConfigError`` naming the variable), never replaced."""
    if name in settings.SECONDS:
        return settings.seconds(name)

    text = os.environ.get(name, "").strip()
    return checks.number(name, text, 0.0, what=f"environment variable {name}") if text else default


def is_store_locked(exc: BaseException) -> bool:
    """A sqlite tracking store busy with another process's write ("database is locked")."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if "database is locked" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


class OutageQueue:
    """Mixin of :class:`~kronos_mlflow.tracking.mlflow.MLflowLogger`: the queues, the backoff and
    the spool. The logger provides ``client``, ``run_id``, ``experiment_id``, ``tracking_uri``,
    ``_buffer`` (buffered ``Metric``s) and ``skipped_steps``."""

    def _init_outage(self, *, spool_dir, max_buffered_metrics: int, http_timeout_s: float | None,
                     finalize_wait_s: float | None, retry_backoff_s: tuple[float, float]) -> None:
        import urllib.parse

        self._http = urllib.parse.urlsplit(self.tracking_uri).scheme.lower() in ("http", "https")
        self.http_timeout_s = float(http_timeout_s if http_timeout_s is not None
                                    else env_float("KRONOS_MLFLOW_HTTP_TIMEOUT_S", 10.0))
        self.finalize_wait_s = float(finalize_wait_s if finalize_wait_s is not None
                                     else env_float("KRONOS_MLFLOW_FINALIZE_WAIT_S", 30.0))
        self.max_buffered_metrics = max(1, int(max_buffered_metrics))
        self._backoff_min, self._backoff_max = float(retry_backoff_s[0]), float(retry_backoff_s[1])
        self._backoff = self._backoff_min
        self._next_retry = 0.0
        self._outage_since: float | None = None
        self.outage_seconds = 0.0
        self.outages = 0
        self._pending_params: list[Any] = []
        self._pending_tags: list[Any] = []
        self._pending_artifacts: list[tuple[str, str | None, bool]] = []  # (path, artifact_path, is_copy)
        self._artifact_copies = 0
        self._counted = 0  # buffer[:_counted] are already counted in delayed_metrics
        self.delayed_metrics = 0  # values that missed their first send and went later or to the spool
        self.spooled_metrics = 0  # values written to the spool file and not uploaded (yet)
        self._spool_dir = os.fspath(spool_dir) if spool_dir else None
        self.spool_file: str | None = None

    @contextlib.contextmanager
    def _short_requests(self):
        """One try and a short timeout for this logger's requests (MLflow reads these variables
        on every request), restored afterwards: our own backoff replaces MLflow's retries."""
        if not self._http:
            yield
            return
        saved = {name: os.environ.get(name) for name in _HTTP_ENV}
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, math.ceil(self.http_timeout_s)))
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def _try(self, fn, *args: Any, **kwargs: Any) -> bool:
        """One request: True when done, False when the server is unreachable (the outage is
        recorded and a retry scheduled). Any other error raises."""
        for attempt in range(LOCKED_RETRIES + 1):
            try:
                # a stop signal waits for the request: a torn sqlite transaction would leave the
                # store locked for the run's own last writes ("database is locked")
                with self._short_requests(), stopping.deferred():
                    fn(*args, **kwargs)
                break
            except Exception as exc:
                if is_store_locked(exc) and attempt < LOCKED_RETRIES:
                    # A sqlite store that another process (``mlflow run`` ending its run, a
                    # sweep worker) is writing: wait for the lock instead of losing the call.
                    time.sleep(min(2.0, 0.1 * 2 ** attempt))
                    continue
                if not (self._http and is_connection_error(exc)):
                    raise
                self._record_failure(exc)
                return False
        self._record_success()
        return True

    def _record_failure(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
            self.outages += 1
            self._backoff = self._backoff_min
            log.warning(
                "MLflow tracking server %s is unreachable (%s); training continues, metrics are kept and retried",
                redact_uri(self.tracking_uri), one_line(redact(str(exc)), 200),
            )
        else:
            self._backoff = min(self._backoff * 2, self._backoff_max)
        self._next_retry = now + self._backoff
        self._count_delayed()

    def _record_success(self) -> None:
        if self._outage_since is None:
            return
        took = time.monotonic() - self._outage_since
        self.outage_seconds += took
        self._outage_since = None
        self._backoff = self._backoff_min
        log.warning("MLflow tracking server %s is reachable again after %.0f s; sending the delayed values",
                    redact_uri(self.tracking_uri), took)

    def _count_delayed(self) -> None:
        self.delayed_metrics += len(self._buffer) - self._counted
        self._counted = len(self._buffer)

    def _send_queued(self, kinds: tuple[str, ...]) -> None:
        """Normal operation: send ``kinds`` now. During an outage: everything queued, but only
        once the backoff has passed (so training is not slowed down by a dead server)."""
        if self._outage_since is not None:
            if time.monotonic() < self._next_retry:
                return
            kinds = QUEUES
        self._drain(kinds)

    def _drain(self, kinds: tuple[str, ...]) -> bool:
        """Send what is queued of ``kinds``, in order; False at the first unreachable-server failure."""
        for kind in kinds:
            if not getattr(self, f"_drain_{kind}")():
                return False
        return True

    def _drain_params(self) -> bool:
        return self._drain_list(self._pending_params, "params", mlflow_limits()["MAX_PARAMS_TAGS_PER_BATCH"])

    def _drain_tags(self) -> bool:
        return self._drain_list(self._pending_tags, "tags", mlflow_limits()["MAX_PARAMS_TAGS_PER_BATCH"])

    def _drain_list(self, items: list[Any], kind: str, size: int) -> bool:
        while items:
            chunk = items[:size]
            if not self._try(self.client.log_batch, self.run_id, **{kind: chunk}):
                return False
            del items[: len(chunk)]
        return True

    def _drain_metrics(self) -> bool:
        size = mlflow_limits()["MAX_METRICS_PER_BATCH"]
        while self._buffer:
            chunk = self._buffer[:size]
            if not self._try(self.client.log_batch, self.run_id, metrics=chunk):
                return False
            del self._buffer[: len(chunk)]
            self._counted = max(0, self._counted - len(chunk))
        if self.spool_file and self.spooled_metrics:
            return self._upload_spill()
        return True

    def _drain_artifacts(self) -> bool:
        while self._pending_artifacts:
            path, artifact_path, is_copy = self._pending_artifacts[0]
            if not os.path.exists(path):
                log.warning("MLflow: artifact %s vanished before it could be sent; skipped", path)
                self._pending_artifacts.pop(0)
                continue
            fn = self.client.log_artifacts if os.path.isdir(path) else self.client.log_artifact
            if not self._try(fn, self.run_id, path, artifact_path):
                return False
            self._pending_artifacts.pop(0)
            if is_copy:
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        return True

    def _spool_path(self) -> str:
        return str(spool_path(self._spool_dir or default_spool_dir(), self.run_id))

    def _spool_header(self) -> dict[str, Any]:
        header = {"run_id": self.run_id, "experiment_id": self.experiment_id,
                  "tracking_uri": redact_uri(self.tracking_uri),
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if getattr(self, "owner_token", None):  # the proof that this spool is the run's own (kronos_mlflow.tracking.ownership)
            header["owner_token"] = self.owner_token
        return header

    def _spill(self, why: str) -> None:
        """During an outage: move the buffered metrics to the spool file (sent when the server is back)."""

        path = self._spool_path()
        self._count_delayed()
        n = append_records(path, self._spool_header(), (_metric_record(m) for m in self._buffer))
        self.spooled_metrics += n
        self.spool_file = path
        self._buffer, self._counted = [], 0
        log.warning("MLflow: %d metric values kept during the outage were written to %s (%s); "
                    "they are sent when the server is back", n, path, why)

    def _adopt_spool(self) -> None:
        """A spool this run left behind (an attempt killed during an outage, then restarted):
        send it when the server answers, and do not log its steps again meanwhile."""

        path = self._spool_path()
        if not os.path.isfile(path):
            return
        try:
            header, records, _ = read_spool(path)
        except UserError as exc:
            log.warning("MLflow: %s; it is left alone (fix it, or upload it with kronos-mlflow upload-spool)", exc)
            return
        if header.get("run_id") != self.run_id:
            return
        if header.get("owner_token") != getattr(self, "owner_token", None):
            log.warning("MLflow: %s names run %s but was not written by it (no matching run token); it is left "
                        "alone", path, self.run_id)
            return
        metrics = [r for r in records if r["type"] == "metric"]
        for rec in metrics:
            self.skipped_steps.setdefault(rec["key"], set()).add(int(rec["step"]))
        self.spool_file, self.spooled_metrics = path, len(metrics)
        log.warning("MLflow: found %d metric values of run %s in %s (left by an earlier attempt); "
                    "they are sent with this run's next metrics", len(metrics), self.run_id, path)

    def persist(self) -> None:
        """Make every metric logged so far durable: sent now or, while the server is
        unreachable, written to the spool file. Call it before saving a training state, so that
        a kill right after the save loses no metric of the steps the state says are done."""
        self.flush()
        if self._buffer and self._outage_since is not None:
            self._spill("kept on disk before a checkpoint")

    def _upload_spill(self) -> bool:
        """The server is back: send what was spilled to the spool file, then delete it."""

        try:
            with self._short_requests():
                upload_spool(self.spool_file, self.client, finish="delete")
        except Exception as exc:
            if not (self._http and is_connection_error(exc)):
                raise
            self._record_failure(exc)
            return False
        self.spooled_metrics = 0
        self.spool_file = None
        return True

    def _copy_for_later(self, local_path: str) -> str:
        """A copy of an artifact that could not be sent (the original may be temporary)."""

        base = artifacts_dir(self._spool_path())
        slot = base / f"{self._artifact_copies:04d}"  # a fresh slot per copy, never reused
        self._artifact_copies += 1
        slot.mkdir(parents=True, exist_ok=True)
        target = slot / os.path.basename(os.path.normpath(local_path))
        if os.path.isdir(local_path):
            shutil.copytree(local_path, target, dirs_exist_ok=True)
        else:
            shutil.copy2(local_path, target)
        return str(target)

    def _write_spool(self, terminal: tuple[str, int] | None) -> str:
        """Everything not sent (and the terminal status) goes to the spool file."""

        path = self._spool_path()
        base = os.path.dirname(path)
        records: list[dict[str, Any]] = []
        records += [{"type": "param", "key": p.key, "value": p.value} for p in self._pending_params]
        unspooled = [t.key for t in self._pending_tags if not spoolable_tag(t.key)]
        if unspooled:  # MLflow's own tags and the owner: set while the server answers, or not at all
            log.warning("MLflow: tags %s could not be sent and are not spooled", ", ".join(unspooled[:5]))
        records += [{"type": "tag", "key": t.key, "value": t.value} for t in self._pending_tags
                    if spoolable_tag(t.key)]
        records += [_metric_record(m) for m in self._buffer]
        for local, artifact_path, _is_copy in self._pending_artifacts:
            local = os.path.abspath(local)
            rel = os.path.relpath(local, base) if local.startswith(os.path.abspath(base) + os.sep) else local
            records.append({"type": "artifact", "local_path": rel, "artifact_path": artifact_path})
        if terminal is not None:
            records.append({"type": "terminate", "status": terminal[0], "end_time": terminal[1]})
        self._count_delayed()
        append_records(path, self._spool_header(), records)
        self.spooled_metrics += len(self._buffer)
        self._pending_params, self._pending_tags, self._pending_artifacts = [], [], []
        self._buffer, self._counted = [], 0
        self.spool_file = path
        return path

    def _clear_queues(self) -> None:
        self._pending_params, self._pending_tags, self._pending_artifacts = [], [], []
        self._buffer, self._counted = [], 0

    @property
    def pending(self) -> int:
        """Values not sent yet: buffered metrics plus queued params, tags and artifacts."""
        return len(self._buffer) + len(self._pending_params) + len(self._pending_tags) + len(self._pending_artifacts)

    def report(self) -> str | None:
        """The one line that tells the user about delayed or spooled values (None when none were)."""
        uri = redact_uri(self.tracking_uri)
        if self.spool_file and os.path.exists(self.spool_file):
            return (
                f"[kronos] MLflow tracking server {uri} is unreachable: {self.delayed_metrics} metric values were "
                f"delayed and {self.spooled_metrics} are kept, with the run's unsent params, tags, artifacts and "
                f"status, in {self.spool_file}; upload them with: kronos-mlflow upload-spool "
                f"{shlex.quote(self.spool_file)}"
            )
        if self.delayed_metrics:
            return (
                f"[kronos] MLflow: {self.delayed_metrics} metric values were delayed by {self.outages} tracking-server "
                f"outage(s) ({self.outage_seconds:.0f} s) and sent once it was back; none lost"
            )
        return None


def flush_at_exit(ref: weakref.ref) -> None:
    logger = ref()
    if logger is None or logger._finalized or not logger.pending:
        return
    try:
        if not logger._drain(QUEUES):
            logger._write_spool(None)
            line = logger.report()
            if line:
                print(line, file=sys.stderr, flush=True)
    except Exception as exc:  # the interpreter is going away: report, do not raise
        log.warning("MLflow: could not flush %d values at exit: %s", logger.pending, redact(str(exc)))
