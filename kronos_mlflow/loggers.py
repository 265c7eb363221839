"""Experiment loggers: one small protocol, an MLflow adapter, a Comet adapter, and two combinators.

The training loop talks to an :class:`ExperimentLogger` and never checks its rank:
:func:`build_logger` decides once, returning a :class:`NullLogger` on every rank but 0 and a
:class:`MultiLogger` (MLflow, then Comet when enabled) on rank 0::

    logger = build_logger(config, rank)
    logger.log_hyperparams(flatten(config))
    for step ...: logger.log_metrics({"train_tokenizer_loss_batch": loss}, step)
    logger.finalize("success")          # or finalize("failed", reason=str(exc))

MLflow is the source of truth (the sweep reads it): it failing to start or to log raises.
Comet is optional: it failing to start, or failing later, is warned about once and dropped.
Backend-only features go through the adapters (``logger.mlflow.client``,
``logger.comet.experiment``), never into the protocol.

Both SDKs are imported lazily, inside the adapters. ``comet_ml`` patches ``mlflow`` when it is
imported first unless ``COMET_DISABLE_AUTO_LOGGING=1``, so :class:`CometLogger` sets that (and
the variables that keep offline mode off the network) and imports ``mlflow`` before ``comet_ml``.
Credentials are never passed by this module: Comet reads ``COMET_API_KEY`` (or its config
file) itself, MLflow reads ``MLFLOW_TRACKING_*``; params, tags and failure reasons go through
:mod:`kronos_mlflow.secrets` first.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import inspect
import logging
import math
import numbers
import os
import posixpath
import re
import shlex
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from .config import TIME_RANGE_KEYS
from .errors import ConfigError, UserError, short_reason
from .secrets import install_secret_filter, redact, redact_uri, scrub_params, secret_values

log = logging.getLogger(__name__)

# "killed": stopped on purpose (a pruned sweep trial, Ctrl-C): MLflow status KILLED.
Status = Literal["success", "failed", "killed"]

# Limits of MLflow 3 (mlflow.utils.validation); read from MLflow when it is importable.
_MLFLOW_LIMITS = {
    "MAX_PARAM_VAL_LENGTH": 6000,
    "MAX_TAG_VAL_LENGTH": 8000,
    "MAX_PARAMS_TAGS_PER_BATCH": 100,
    "MAX_METRICS_PER_BATCH": 1000,
    "MAX_ENTITY_KEY_LENGTH": 250,
}
FAILURE_REASON_MAX_CHARS = 1000
COMET_ENV_DEFAULTS = {
    # Stop comet_ml from patching mlflow/torch/... on import (and from creating experiments
    # behind our back when mlflow.start_run is called).
    "COMET_DISABLE_AUTO_LOGGING": "1",
}
COMET_OFFLINE_ENV_DEFAULTS = {
    # Without these, even offline mode resolves hosts and probes cloud metadata endpoints.
    "COMET_ERROR_TRACKING_ENABLE": "false",
    "COMET_AUTO_LOG_ENV_DETAILS": "false",
}


@runtime_checkable
class ExperimentLogger(Protocol):
    """What the training loop may call. Every method returns None."""

    def log_hyperparams(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def finalize(self, status: Status, reason: str | None = None) -> None: ...


# --------------------------------------------------------------------------------------------
# helpers shared by the adapters


def _one_line(text: Any, limit: int) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: max(0, limit - 3)] + "..."


def _same_param(old: str, new: str) -> bool:
    """Equal, or equal once MLflow Projects' shell quoting (``''``) or number spelling
    (``2e-4`` / ``0.0002``) is undone: then the param is already there, nothing to say."""
    if old == new or old == shlex.quote(new):
        return True
    try:
        return float(old) == float(new)
    except ValueError:
        return False


def _check_status(status: str) -> None:
    if status not in ("success", "failed", "killed"):
        raise ValueError(f"finalize status must be 'success', 'failed' or 'killed', not {status!r}")


def _flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings become dotted keys; time ranges become START:END, other lists a,b,c."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten_params(value, prefix=f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = (":" if key in TIME_RANGE_KEYS else ",").join(map(str, value))
        else:
            out[name] = value
    return out


class _MetricCleaner:
    """Turns metric values into floats; drops the rest with one warning per key."""

    def __init__(self, owner: str):
        self.owner = owner
        self._warned: set[str] = set()

    def number(self, key: str, value: Any) -> float | None:
        raw = value
        if not isinstance(value, (int, float)) and hasattr(value, "item"):
            try:  # numpy scalars, 0-d arrays, one-element tensors (also moves them to the CPU)
                value = value.item()
            except Exception:
                pass
        if isinstance(value, numbers.Real):
            number = float(value)
            if math.isfinite(number):
                return number
            why = f"non-finite value {number}"
        else:
            why = f"non-numeric value of type {type(raw).__name__}"
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s: dropping metric '%s' (%s); further drops of this key are silent", self.owner, key, why)
        return None

    def clean(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in metrics.items():
            number = self.number(str(key), value)
            if number is not None:
                out[str(key)] = number
        return out


# --------------------------------------------------------------------------------------------
# trivial loggers


class NullLogger:
    """Every method is a no-op: what non-zero ranks (and tests) get."""

    essential = False
    mlflow: MLflowLogger | None = None
    comet: CometLogger | None = None

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        return None

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        return None

    def set_tags(self, tags: Mapping[str, str]) -> None:
        return None

    def finalize(self, status: Status, reason: str | None = None) -> None:
        return None

    def skip_logged_steps(self, keys: Iterable[str] | None = None, min_step: int = 0) -> int:
        return 0

    def persist(self) -> None:
        return None


class MultiLogger:
    """Fans each call out to ``loggers`` in list order.

    A logger whose ``essential`` attribute is false (Comet) that raises is warned about once and
    dropped; the others keep going. An essential logger (MLflow, and any logger without the
    attribute) that raises propagates the error. ``finalize`` reaches every logger even when an
    earlier one fails, then re-raises the first essential failure.
    """

    def __init__(self, loggers: Iterable[ExperimentLogger]):
        self.loggers: list[ExperimentLogger] = list(loggers)
        self._cleaner = _MetricCleaner("metrics")
        self._finalized = False
        # Steps MLflow already holds (a resumed run): not logged again to any backend.
        mlflow_logger = self.mlflow
        self._skip_steps: dict[str, set[int]] = mlflow_logger._skip_steps if mlflow_logger is not None else {}

    @property
    def mlflow(self) -> MLflowLogger | None:
        return next((lg for lg in self.loggers if isinstance(lg, MLflowLogger)), None)

    @property
    def comet(self) -> CometLogger | None:
        return next((lg for lg in self.loggers if isinstance(lg, CometLogger)), None)

    def _drop(self, logger: Any, method: str, exc: BaseException) -> None:
        name = type(logger).__name__
        log.warning(
            "%s failed in %s (%s: %s); it is dropped and the run continues with the other loggers",
            name, method, type(exc).__name__, _one_line(redact(str(exc)), 300),
        )
        self.loggers = [lg for lg in self.loggers if lg is not logger]

    def _fan_out(self, method: str, *args: Any, **kwargs: Any) -> None:
        for logger in list(self.loggers):
            try:
                getattr(logger, method)(*args, **kwargs)
            except Exception as exc:
                if getattr(logger, "essential", True):
                    raise
                self._drop(logger, method, exc)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self._fan_out("log_hyperparams", params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        # Cleaned once here, so a bad value is warned about once, not once per backend.
        clean = self._cleaner.clean(metrics)
        if self._skip_steps:
            step = int(step)
            clean = {k: v for k, v in clean.items() if step not in self._skip_steps.get(k, ())}
            if not clean:
                return
        self._fan_out("log_metrics", clean, step)

    def skip_logged_steps(self, keys: Iterable[str] | None = None, min_step: int = 0) -> int:
        """Resuming a run: the ``(key, step)`` pairs MLflow (the source of truth) already holds
        are not logged again, to any backend. Returns how many pairs were found."""
        mlflow_logger = self.mlflow
        if mlflow_logger is None:
            return 0
        found = mlflow_logger.skip_logged_steps(keys, min_step)
        self._skip_steps = mlflow_logger._skip_steps  # shared: one filter for every backend
        return found

    def persist(self) -> None:
        """MLflow's metrics so far: sent, or in its spool file (see :meth:`MLflowLogger.persist`)."""
        mlflow_logger = self.mlflow
        if mlflow_logger is not None:
            mlflow_logger.persist()

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        self._fan_out("log_artifact", local_path, artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._fan_out("set_tags", tags)

    def finalize(self, status: Status, reason: str | None = None) -> None:
        _check_status(status)
        if self._finalized:
            return
        self._finalized = True
        first_error: BaseException | None = None
        for logger in list(self.loggers):
            try:
                logger.finalize(status, reason)
            except Exception as exc:
                if getattr(logger, "essential", True):
                    first_error = first_error or exc
                else:
                    self._drop(logger, "finalize", exc)
        if first_error is not None:
            raise first_error


# --------------------------------------------------------------------------------------------
# MLflow


def _probe_tracking_server(uri: str, timeout: float) -> None:
    """Raise a one-line UserError when an http(s) tracking server does not answer.

    MLflow's own client retries for minutes before giving up; one GET of ``/health`` with a
    short timeout tells the user at once. Any HTTP answer (even 401/404) counts as reachable,
    except 502/504: a proxy in between could not reach the server.
    """
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme.lower() not in ("http", "https"):
        return
    netloc = parts.netloc.rpartition("@")[2]  # urllib cannot take user:pass@ in the URL
    url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):
            return
    except urllib.error.HTTPError as exc:
        if exc.code not in (502, 504):
            return  # the server answered; MLflow itself will report auth or path problems
        reason: Any = f"HTTP {exc.code} {exc.reason} (a proxy could not reach it)"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
    from_env = os.environ.get("MLFLOW_TRACKING_URI", "").strip() == uri.strip()
    hint = "start it or unset MLFLOW_TRACKING_URI" if from_env else "start it or use another tracking URI"
    raise UserError(
        redact(f"MLflow tracking server {redact_uri(uri)} is unreachable: {_one_line(reason, 200)}; {hint}")
    )


def hide_uri_printing(uri: str) -> None:
    """MLflow's client writes "View run NAME at: <tracking URI>/#/..." to stdout when it ends a
    run on a tracking server, password included when the URI holds one (``user:pw@host``).
    Turn that off for this process when the URI holds a password (MLflow reads
    ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` on every call)."""
    if redact_uri(str(uri)) != str(uri):
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


def check_tracking_server(uri: str | None = None, timeout: float = 5.0) -> None:
    """One-line UserError when the tracking server (``uri`` or MLflow's current one) is down."""
    if uri is None:
        import mlflow

        uri = mlflow.get_tracking_uri()
    _probe_tracking_server(str(uri), timeout)


class MLflowLogger:
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
    ):
        import mlflow
        from mlflow import MlflowClient
        from mlflow.utils import validation

        for name in _MLFLOW_LIMITS:
            _MLFLOW_LIMITS[name] = int(getattr(validation, name, _MLFLOW_LIMITS[name]))

        self.tracking_uri: str = tracking_uri or mlflow.get_tracking_uri()
        hide_uri_printing(self.tracking_uri)
        _probe_tracking_server(self.tracking_uri, probe_timeout_s)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.flush_every_s = float(flush_every_s)
        self.flush_max_metrics = max(1, int(flush_max_metrics))
        self._cleaner = _MetricCleaner("MLflow")
        self._keys: dict[str, str] = {}
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._finalized = False
        # ---- outage handling (see "Tracking outages" in the class docstring)
        self._http = urllib.parse.urlsplit(self.tracking_uri).scheme.lower() in ("http", "https")
        self.http_timeout_s = float(http_timeout_s if http_timeout_s is not None
                                    else _env_float("KRONOS_MLFLOW_HTTP_TIMEOUT_S", 10.0))
        self.finalize_wait_s = float(finalize_wait_s if finalize_wait_s is not None
                                     else _env_float("KRONOS_MLFLOW_FINALIZE_WAIT_S", 30.0))
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
        self._skip_steps: dict[str, set[int]] = {}

        launcher_run_id = os.environ.get("MLFLOW_RUN_ID", "").strip() or None
        run_id = run_id or launcher_run_id
        user_tags = {str(k): v for k, v in (tags or {}).items()}
        if run_id:
            run = self._attach(run_id, run_name)
            self.attached = True
        else:
            run = self._create(experiment_name, run_name, user_tags)
            user_tags = {}  # already on the new run
            self.attached = False
        self.run_id: str = run.info.run_id
        self.experiment_id: str = run.info.experiment_id
        self.run_name: str = run.info.run_name
        self._params: dict[str, str] = dict(run.data.params)
        self._adopt_spool()
        if user_tags:
            self.set_tags(user_tags)
        if launcher_run_id and launcher_run_id != self.run_id:
            self._point_launcher_run(launcher_run_id)
        atexit.register(_flush_at_exit, weakref.ref(self))

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

    def _attach(self, run_id: str, run_name: str | None):
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            if getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                raise UserError(
                    f"MLflow run {run_id} (MLFLOW_RUN_ID) does not exist at {redact_uri(self.tracking_uri)}; "
                    "unset MLFLOW_RUN_ID or point MLFLOW_TRACKING_URI at the server that holds it"
                ) from None
            raise
        if run.info.lifecycle_stage == "deleted":
            raise UserError(f"MLflow run {run_id} (MLFLOW_RUN_ID) is deleted; restore it or unset MLFLOW_RUN_ID")
        changes: dict[str, Any] = {}
        if run.info.status != "RUNNING":  # as mlflow.start_run(run_id=...) does when resuming
            changes["status"] = "RUNNING"
        if run_name and run_name != run.info.run_name:
            changes["name"] = run_name
        if changes:
            self.client.update_run(run_id, **changes)
            run = self.client.get_run(run_id)
        return run

    def _experiment_by_name(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self.client.create_experiment(name)
            except MlflowException as exc:  # another process created it meanwhile
                if getattr(exc, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            raise UserError(
                f"MLflow experiment '{name}' is deleted; restore it (mlflow experiments restore "
                f"--experiment-id {experiment.experiment_id}) or choose another experiment_name"
            )
        return experiment.experiment_id

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

    def _create(self, experiment_name: str | None, run_name: str | None, tags: Mapping[str, Any]):
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
        return self.client.create_run(experiment_id, run_name=run_name or None, tags=run_tags)

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
        cleaned = cleaned[: _MLFLOW_LIMITS["MAX_ENTITY_KEY_LENGTH"]]
        if cleaned != key:
            log.warning("MLflow: key '%s' is logged as '%s' (MLflow refuses some characters)", key, cleaned)
        self._keys[key] = cleaned
        return cleaned

    def _tag_values(self, tags: Mapping[str, Any]) -> dict[str, str]:
        limit = _MLFLOW_LIMITS["MAX_TAG_VAL_LENGTH"]
        secrets = secret_values()
        return {self._clean_key(str(k)): redact(str(v), secrets)[:limit] for k, v in tags.items()}

    def _log_batch(self, params=(), tags=(), metrics=()) -> None:
        """Send now, in MLflow-sized chunks, without outage handling."""
        for kind, items, size in (
            ("params", list(params), _MLFLOW_LIMITS["MAX_PARAMS_TAGS_PER_BATCH"]),
            ("tags", list(tags), _MLFLOW_LIMITS["MAX_PARAMS_TAGS_PER_BATCH"]),
            ("metrics", list(metrics), _MLFLOW_LIMITS["MAX_METRICS_PER_BATCH"]),
        ):
            for start in range(0, len(items), size):
                self.client.log_batch(self.run_id, **{kind: items[start : start + size]})

    # ---- outage handling ------------------------------------------------------------------

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
        try:
            with self._short_requests():
                fn(*args, **kwargs)
        except Exception as exc:
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
                redact_uri(self.tracking_uri), _one_line(redact(str(exc)), 200),
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
            kinds = _QUEUES
        self._drain(kinds)

    def _drain(self, kinds: tuple[str, ...]) -> bool:
        """Send what is queued of ``kinds``, in order; False at the first unreachable-server failure."""
        for kind in kinds:
            if not getattr(self, f"_drain_{kind}")():
                return False
        return True

    def _drain_params(self) -> bool:
        return self._drain_list(self._pending_params, "params", _MLFLOW_LIMITS["MAX_PARAMS_TAGS_PER_BATCH"])

    def _drain_tags(self) -> bool:
        return self._drain_list(self._pending_tags, "tags", _MLFLOW_LIMITS["MAX_PARAMS_TAGS_PER_BATCH"])

    def _drain_list(self, items: list[Any], kind: str, size: int) -> bool:
        while items:
            chunk = items[:size]
            if not self._try(self.client.log_batch, self.run_id, **{kind: chunk}):
                return False
            del items[: len(chunk)]
        return True

    def _drain_metrics(self) -> bool:
        size = _MLFLOW_LIMITS["MAX_METRICS_PER_BATCH"]
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
        from .spool import default_spool_dir, spool_path

        return str(spool_path(self._spool_dir or default_spool_dir(), self.run_id))

    def _spool_header(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "experiment_id": self.experiment_id,
                "tracking_uri": redact_uri(self.tracking_uri),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def _spill(self, why: str) -> None:
        """During an outage: move the buffered metrics to the spool file (sent when the server is back)."""
        from .spool import append_records

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
        from .spool import read_spool

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
        metrics = [r for r in records if r["type"] == "metric"]
        for rec in metrics:
            self._skip_steps.setdefault(rec["key"], set()).add(int(rec["step"]))
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
        from .spool import upload_spool

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
        from .spool import artifacts_dir

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
        from .spool import append_records

        path = self._spool_path()
        base = os.path.dirname(path)
        records: list[dict[str, Any]] = []
        records += [{"type": "param", "key": p.key, "value": p.value} for p in self._pending_params]
        records += [{"type": "tag", "key": t.key, "value": t.value} for t in self._pending_tags]
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
                    self._skip_steps.setdefault(name, set()).update(steps)
                    found += len(steps)
        return found

    # ---- the protocol ---------------------------------------------------------------------

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        limit = _MLFLOW_LIMITS["MAX_PARAM_VAL_LENGTH"]
        new: list[Any] = []
        truncated: list[str] = []
        for key, value in _flatten_params(scrub_params(params)).items():
            name = self._clean_key(str(key))
            text = str(value)
            if len(text) > limit:
                text = text[:limit]
                truncated.append(name)
            old = self._params.get(name)
            if old is None:
                self._params[name] = text
                new.append(Param(name, text))
            elif not _same_param(old, text):
                log.warning(
                    "MLflow: param '%s' is already %r on run %s; the new value %r is not logged "
                    "(MLflow params cannot change; start a new run to change it)",
                    name, _one_line(old, 200), self.run_id, _one_line(text, 200),
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
            if step in self._skip_steps.get(name, ()):
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

        _check_status(status)
        if self._finalized:
            return
        self._finalized = True
        end_time = int(time.time() * 1000)
        error: BaseException | None = None
        try:
            self._drain(_QUEUES)
        except Exception as exc:  # not an outage: a value MLflow refuses, a bug
            error = exc
            status = "failed"
            reason = reason or f"could not send the last metrics to MLflow: {exc}"
            self._clear_queues()
        if status in ("failed", "killed"):
            tag = "failure_reason" if status == "failed" else "stop_reason"
            text = _one_line(redact(reason or "unknown (no reason given)"), FAILURE_REASON_MAX_CHARS)
            self._pending_tags.extend(RunTag(k, v) for k, v in self._tag_values({tag: text}).items())
        terminal = {"success": "FINISHED", "failed": "FAILED", "killed": "KILLED"}[status]
        deadline = time.monotonic() + (self.finalize_wait_s if self._http else 0.0)
        done = False
        while True:
            try:
                done = self._drain(_QUEUES) and self._try(
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


_QUEUES = ("params", "tags", "metrics", "artifacts")
_HTTP_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


def _metric_record(metric: Any) -> dict[str, Any]:
    return {"type": "metric", "key": metric.key, "value": float(metric.value), "step": int(metric.step),
            "timestamp": int(metric.timestamp)}


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, "").strip() or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %s", name, os.environ.get(name), default)
        return default
    return value if math.isfinite(value) and value >= 0 else default


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means "the tracking server could not be reached or failed" (refused,
    reset, timed out, DNS, HTTP 5xx / too many retries), not "the server refused the request".

    MLflow wraps transport errors in ``MlflowException("API request to ... failed with
    exception ...")``; the chain (``__cause__`` / ``__context__``) is searched for the cause.
    """
    import requests

    try:
        import urllib3.exceptions as u3
        transport: tuple[type[BaseException], ...] = (u3.HTTPError,)
    except ImportError:  # pragma: no cover
        transport = ()
    from mlflow.exceptions import MlflowException, RestException

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 10:
        seen.add(id(current))
        if isinstance(current, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                                requests.exceptions.RetryError, requests.exceptions.ChunkedEncodingError,
                                ConnectionError, TimeoutError) + transport):
            return True
        if isinstance(current, RestException):
            try:
                return int(current.get_http_status_code()) >= 500
            except Exception:
                return False
        if isinstance(current, MlflowException):
            text = str(current)
            if text.startswith("API request to") and (
                "failed with exception" in text or "failed with timeout" in text
            ):
                return True
            match = re.search(r"failed with error code (\d{3})", text)
            if match and int(match.group(1)) >= 500:
                return True
        current = current.__cause__ or current.__context__
    return False


def _flush_at_exit(ref: weakref.ref) -> None:
    logger = ref()
    if logger is None or logger._finalized or not logger.pending:
        return
    try:
        if not logger._drain(_QUEUES):
            logger._write_spool(None)
            line = logger.report()
            if line:
                print(line, file=sys.stderr, flush=True)
    except Exception as exc:  # the interpreter is going away: report, do not raise
        log.warning("MLflow: could not flush %d values at exit: %s", logger.pending, redact(str(exc)))


# --------------------------------------------------------------------------------------------
# Comet


def _prepare_comet_env() -> None:
    """Environment comet_ml reads at import time; must run before ``import comet_ml``."""
    for name, value in COMET_ENV_DEFAULTS.items():
        os.environ[name] = value
    for name, value in COMET_OFFLINE_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


def _import_comet_ml():
    _prepare_comet_env()
    import mlflow  # noqa: F401  - imported before comet_ml so that comet_ml cannot patch it

    import comet_ml

    return comet_ml


class CometLogger:
    """Logs to one Comet experiment: ``OfflineExperiment`` (a zip on disk) or online ``Experiment``.

    The API key is never passed here: online mode reads ``COMET_API_KEY`` or Comet's config file
    (no key: comet_ml raises ``ValueError``). Automatic logging (code, git, env details, stdout,
    framework patching) is off. An online experiment that cannot reach Comet (comet_ml then
    blocks ~30 s and returns a dead experiment) is warned about once and this logger becomes a
    no-op. Non-essential: :class:`MultiLogger` drops it when it raises.

    ``experiment_key`` continues an existing experiment (a resumed run): ``ExistingExperiment``
    online, ``ExistingOfflineExperiment`` offline.

    Attributes: ``experiment`` (the comet_ml object), ``experiment_key``, ``mode``,
    ``offline_archive`` (the zip's path once finalized, offline mode; else None).
    """

    essential = False

    def __init__(
        self,
        mode: Literal["online", "offline"] = "offline",
        project_name: str | None = None,
        workspace: str | None = None,
        experiment_name: str | None = None,
        offline_directory: str | None = None,
        tags: Iterable[str] = (),
        experiment_key: str | None = None,
    ):
        if mode not in ("online", "offline"):
            raise ValueError(f"Comet mode must be 'online' or 'offline', not {mode!r}")
        comet_ml = _import_comet_ml()
        self.mode = mode
        self.offline_archive: str | None = None
        self._cleaner = _MetricCleaner("Comet")
        self._finalized = False
        self._disabled = False
        common: dict[str, Any] = dict(
            project_name=project_name or None,
            workspace=workspace or None,
            log_code=False,
            log_graph=False,
            auto_param_logging=False,
            auto_metric_logging=False,
            parse_args=False,
            auto_output_logging=False,
            log_env_details=False,
            log_env_gpu=False,
            log_env_host=False,
            log_env_cpu=False,
            log_env_network=False,
            log_env_disk=False,
            log_git_metadata=False,
            log_git_patch=False,
            auto_log_co2=False,
            display_summary_level=0,
        )
        if mode == "offline":
            directory = (
                offline_directory
                or os.environ.get("COMET_OFFLINE_DIRECTORY", "").strip()
                or os.path.join(os.getcwd(), ".cometml-runs")
            )
            directory = os.path.abspath(os.path.expanduser(directory))
            os.makedirs(directory, exist_ok=True)
            if experiment_key:  # a resumed run continues its experiment (merged when uploaded)
                cls = comet_ml.ExistingOfflineExperiment
                accepted = inspect.signature(cls.__init__).parameters  # it takes fewer options
                self.experiment = cls(offline_directory=directory, previous_experiment=experiment_key,
                                      **{k: v for k, v in common.items() if k in accepted})
            else:
                self.experiment = comet_ml.OfflineExperiment(offline_directory=directory, **common)
        elif experiment_key:
            self.experiment = comet_ml.ExistingExperiment(previous_experiment=experiment_key, **common)
        else:
            self.experiment = comet_ml.Experiment(**common)
            if not getattr(self.experiment, "alive", True):
                self._disabled = True
                log.warning(
                    "Comet: could not reach the Comet server; Comet logging is off for this run "
                    "(use comet=offline to keep a local archive)"
                )
        self.experiment_key: str = self.experiment.get_key()
        if self._disabled:
            return
        if experiment_name:
            self.experiment.set_name(experiment_name)
        tag_list = [str(t) for t in tags if str(t)]
        if tag_list:
            self.experiment.add_tags(tag_list)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        if self._disabled:
            return
        flat = {
            k: v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
            for k, v in _flatten_params(scrub_params(params)).items()
        }
        self.experiment.log_parameters(flat)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if self._disabled:
            return
        clean = self._cleaner.clean(metrics)
        if clean:
            self.experiment.log_metrics(clean, step=int(step))

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        if self._disabled:
            return
        local_path = os.fspath(local_path)
        prefix = (artifact_path or "").strip("/")
        if os.path.isdir(local_path):
            for root, _dirs, files in os.walk(local_path):
                for name in sorted(files):
                    path = os.path.join(root, name)
                    rel = os.path.relpath(path, local_path).replace(os.sep, "/")
                    self.experiment.log_asset(path, file_name=f"{prefix}/{rel}" if prefix else rel)
        elif os.path.isfile(local_path):
            name = os.path.basename(local_path)
            self.experiment.log_asset(local_path, file_name=f"{prefix}/{name}" if prefix else name)
        else:
            raise FileNotFoundError(f"cannot log artifact '{local_path}': no such file or directory")

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Key-value tags become Comet "others" (Comet's own tags are plain labels: ``tags=``)."""
        if self._disabled:
            return
        secrets = secret_values()
        self.experiment.log_others({str(k): redact(str(v), secrets) for k, v in tags.items()})

    def finalize(self, status: Status, reason: str | None = None) -> None:
        """Record the status (and reason), then ``end()`` the experiment. Idempotent."""
        _check_status(status)
        if self._finalized:
            return
        self._finalized = True
        if self._disabled:
            self.experiment.end()
            return
        others = {"status": status}
        if status in ("failed", "killed"):
            others["failure_reason"] = _one_line(redact(reason or "unknown (no reason given)"), FAILURE_REASON_MAX_CHARS)
        try:
            self.experiment.log_others(others)
        finally:
            self.experiment.end()
        if self.mode == "offline":
            self.offline_archive = self._find_archive()

    def _find_archive(self) -> str | None:
        directory = getattr(self.experiment, "offline_directory", None)
        if not directory:
            return None
        try:
            path = os.path.join(directory, self.experiment._get_offline_archive_file_name())
            if os.path.isfile(path):
                return path
        except Exception:
            pass
        matches = sorted(glob.glob(os.path.join(glob.escape(directory), f"{self.experiment_key}*.zip")))
        return matches[-1] if matches else None


# --------------------------------------------------------------------------------------------
# wiring


def comet_mode(config: Mapping[str, Any]) -> Literal["online", "offline"] | None:
    """The Comet mode a config asks for: ``auto`` is online when COMET_API_KEY is set, else off."""
    value = str(config.get("comet", "auto") or "auto").strip().lower()
    if value == "auto":
        return "online" if os.environ.get("COMET_API_KEY", "").strip() else None
    if value == "off":
        return None
    if value in ("online", "offline"):
        return value  # type: ignore[return-value]
    raise ConfigError(f"comet: '{value}' is not one of auto, online, offline, off")


def build_logger(
    config: Mapping[str, Any],
    rank: int,
    *,
    mlflow_tags: Mapping[str, str] | None = None,
    run_id: str | None = None,
    comet_experiment_key: str | None = None,
    spool_dir: str | os.PathLike | None = None,
) -> ExperimentLogger:
    """The logger for this process, decided once.

    Ranks other than 0 get a :class:`NullLogger`. Rank 0 gets a :class:`MultiLogger` holding an
    :class:`MLflowLogger` (errors propagate: MLflow is required) and, when ``config["comet"]``
    asks for it, a :class:`CometLogger`. Comet failing to start, e.g. ``comet="online"`` with no
    ``COMET_API_KEY`` nor Comet config file (comet_ml raises ValueError), is warned about once
    and training continues with MLflow only. The two are cross-linked: the MLflow run id is
    logged to Comet (``mlflow_run_id``) and the Comet key tagged on the run
    (``comet_experiment_key``). Also installs :class:`~kronos_mlflow.secrets.SecretFilter` on
    the root logger's handlers.

    ``rank`` may also be an object with a ``rank`` attribute (``DistInfo``).

    Resuming (:mod:`kronos_mlflow.checkpoint`): ``run_id`` reattaches to the saved MLflow run
    (``MLFLOW_RUN_ID``, when set, names the same run under ``mlflow run``) and
    ``comet_experiment_key`` continues the saved Comet experiment. MLflow's spool (see
    :class:`MLflowLogger`) goes to ``spool_dir``, by default ``{save_dir}/mlflow-spool``.
    """
    rank = int(getattr(rank, "rank", rank))
    if rank != 0:
        return NullLogger()
    install_secret_filter()
    mode = comet_mode(config)
    run_name = str(config.get("run_name") or "") or None
    if spool_dir is None and config.get("save_path") and config.get("tokenizer_save_folder_name"):
        spool_dir = os.path.join(os.path.expanduser(str(config["save_path"])),
                                 str(config["tokenizer_save_folder_name"]), "mlflow-spool")
    mlflow_logger = MLflowLogger(
        experiment_name=str(config.get("experiment_name") or "") or None,
        run_name=run_name,
        tags=mlflow_tags,
        run_id=run_id,
        spool_dir=spool_dir,
    )
    loggers: list[ExperimentLogger] = [mlflow_logger]
    if mode is not None:
        comet = _start_comet(config, mode, run_name, mlflow_logger, comet_experiment_key)
        if comet is not None:
            loggers.append(comet)
    return MultiLogger(loggers)


def _start_comet(
    config: Mapping[str, Any], mode: Literal["online", "offline"], run_name: str | None, mlflow_logger: MLflowLogger,
    experiment_key: str | None = None,
) -> CometLogger | None:
    tag = str(config.get("comet_tag") or "")
    try:
        comet = CometLogger(
            mode=mode,
            project_name=str(config.get("comet_project_name") or "") or None,
            workspace=str(config.get("comet_workspace") or "") or None,
            experiment_name=str(config.get("comet_name") or "") or run_name,
            offline_directory=str(config.get("comet_offline_directory") or "") or None,
            tags=[tag] if tag else [],
            experiment_key=experiment_key,
        )
    except Exception as exc:
        hint = ""
        if mode == "online" and isinstance(exc, ValueError):
            hint = " (set COMET_API_KEY, or use comet=offline or comet=off)"
        log.warning(
            "Comet (%s) could not start: %s%s; continuing with MLflow only",
            mode, _one_line(redact(str(exc)), 300), hint,
        )
        return None
    try:
        comet.set_tags(
            {
                "mlflow_run_id": mlflow_logger.run_id,
                "mlflow_experiment_id": mlflow_logger.experiment_id,
                "mlflow_tracking_uri": redact_uri(mlflow_logger.tracking_uri),
            }
        )
    except Exception as exc:
        log.warning("Comet failed to record the MLflow run id (%s); continuing with MLflow only",
                    _one_line(redact(str(exc)), 300))
        try:
            comet.experiment.end()
        except Exception:
            pass
        return None
    mlflow_logger.set_tags({"comet_experiment_key": comet.experiment_key, "comet_mode": mode})
    return comet
