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
import glob
import logging
import math
import numbers
import os
import posixpath
import re
import shlex
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from .config import TIME_RANGE_KEYS
from .errors import ConfigError, UserError
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
        self._fan_out("log_metrics", self._cleaner.clean(metrics), step)

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
    ):
        import mlflow
        from mlflow import MlflowClient
        from mlflow.utils import validation

        for name in _MLFLOW_LIMITS:
            _MLFLOW_LIMITS[name] = int(getattr(validation, name, _MLFLOW_LIMITS[name]))

        self.tracking_uri: str = tracking_uri or mlflow.get_tracking_uri()
        _probe_tracking_server(self.tracking_uri, probe_timeout_s)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.flush_every_s = float(flush_every_s)
        self.flush_max_metrics = max(1, int(flush_max_metrics))
        self._cleaner = _MetricCleaner("MLflow")
        self._keys: dict[str, str] = {}
        self._buffer: list[Any] = []
        self._last_flush = time.monotonic()
        self._finalized = False

        run_id = run_id or os.environ.get("MLFLOW_RUN_ID", "").strip() or None
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
        if user_tags:
            self.set_tags(user_tags)
        atexit.register(_flush_at_exit, weakref.ref(self))

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
        for kind, items, size in (
            ("params", list(params), _MLFLOW_LIMITS["MAX_PARAMS_TAGS_PER_BATCH"]),
            ("tags", list(tags), _MLFLOW_LIMITS["MAX_PARAMS_TAGS_PER_BATCH"]),
            ("metrics", list(metrics), _MLFLOW_LIMITS["MAX_METRICS_PER_BATCH"]),
        ):
            for start in range(0, len(items), size):
                self.client.log_batch(self.run_id, **{kind: items[start : start + size]})

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
        self._log_batch(params=new)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        step = int(step)
        for key, value in metrics.items():
            number = self._cleaner.number(str(key), value)
            if number is not None:
                self._buffer.append(Metric(self._clean_key(str(key)), number, timestamp, step))
        if (
            len(self._buffer) >= self.flush_max_metrics
            or time.monotonic() - self._last_flush >= self.flush_every_s
        ):
            self.flush()

    def flush(self) -> None:
        """Send buffered metrics now."""
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        pending, self._buffer = self._buffer, []
        self._log_batch(metrics=pending)

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        local_path = os.fspath(local_path)
        if os.path.isdir(local_path):
            self.client.log_artifacts(self.run_id, local_path, artifact_path)
        elif os.path.isfile(local_path):
            self.client.log_artifact(self.run_id, local_path, artifact_path)
        else:
            raise FileNotFoundError(f"cannot log artifact '{local_path}': no such file or directory")

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self._log_batch(tags=[RunTag(k, v) for k, v in self._tag_values(tags).items()])

    def log_input(self, dataset: Any, context: str | None = None, tags: Mapping[str, str] | None = None) -> None:
        """Record an ``mlflow.data`` dataset (e.g. ``mlflow.data.from_pandas(df, name=...)``) as a run input."""
        from mlflow.entities import DatasetInput, InputTag

        input_tags = [InputTag(key=k, value=str(v)) for k, v in (tags or {}).items()]
        if context:
            input_tags.append(InputTag(key="mlflow.data.context", value=context))
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(dataset=dataset._to_mlflow_entity(), tags=input_tags)])

    def finalize(self, status: Status, reason: str | None = None) -> None:
        """Flush, then mark the run FINISHED (``"success"``) or FAILED with a ``failure_reason`` tag.

        Idempotent. If the flush fails the run is marked FAILED and the error re-raised.
        """
        _check_status(status)
        if self._finalized:
            return
        self._finalized = True
        error: BaseException | None = None
        try:
            self.flush()
        except Exception as exc:
            error = exc
            status = "failed"
            reason = reason or f"could not send the last metrics to MLflow: {exc}"
        if status in ("failed", "killed"):
            tag = "failure_reason" if status == "failed" else "stop_reason"
            text = _one_line(redact(reason or "unknown (no reason given)"), FAILURE_REASON_MAX_CHARS)
            try:
                self.client.set_tag(self.run_id, tag, text)
            except Exception as exc:
                error = error or exc
        self.client.set_terminated(self.run_id, {"success": "FINISHED", "failed": "FAILED", "killed": "KILLED"}[status])
        if error is not None:
            raise error


def _flush_at_exit(ref: weakref.ref) -> None:
    logger = ref()
    if logger is None or logger._finalized or not logger._buffer:
        return
    try:
        logger.flush()
    except Exception as exc:  # the interpreter is going away: report, do not raise
        log.warning("MLflow: could not flush %d metrics at exit: %s", len(logger._buffer), redact(str(exc)))


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
            self.experiment = comet_ml.OfflineExperiment(offline_directory=directory, **common)
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
    """
    rank = int(getattr(rank, "rank", rank))
    if rank != 0:
        return NullLogger()
    install_secret_filter()
    mode = comet_mode(config)
    run_name = str(config.get("run_name") or "") or None
    mlflow_logger = MLflowLogger(
        experiment_name=str(config.get("experiment_name") or "") or None,
        run_name=run_name,
        tags=mlflow_tags,
    )
    loggers: list[ExperimentLogger] = [mlflow_logger]
    if mode is not None:
        comet = _start_comet(config, mode, run_name, mlflow_logger)
        if comet is not None:
            loggers.append(comet)
    return MultiLogger(loggers)


def _start_comet(
    config: Mapping[str, Any], mode: Literal["online", "offline"], run_name: str | None, mlflow_logger: MLflowLogger
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
