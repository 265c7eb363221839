"""The Comet adapter: an offline archive or an online experiment, never a key in our hands.

``comet_ml`` patches ``mlflow`` when it is imported first unless ``COMET_DISABLE_AUTO_LOGGING=1``,
so this module sets that (and the variables that keep offline mode off the network) and
imports ``mlflow`` before ``comet_ml``. Comet reads ``COMET_API_KEY`` (or its config file) itself.
"""

from __future__ import annotations

import glob
import inspect
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ..errors import ConfigError, UserError
from ..config.secrets import redact, redact_uri, scrub_params, secret_values
from ..config.checks import directory
from ..config.keys import COMET
from ..config.sections import as_section
from .protocol import FAILURE_REASON_MAX_CHARS, MetricCleaner, Status, check_status, flatten_params, one_line

log = logging.getLogger("kronos_mlflow.tracking")

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
        self._cleaner = MetricCleaner("Comet")
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
            for k, v in flatten_params(scrub_params(params)).items()
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

    def persist(self) -> None:
        """Nothing to do: comet_ml sends (online) or writes (offline) in its own threads."""

    def finalize(self, status: Status, reason: str | None = None) -> None:
        """Record the status (and reason), then ``end()`` the experiment. Idempotent."""
        check_status(status)
        if self._finalized:
            return
        self._finalized = True
        if self._disabled:
            self.experiment.end()
            return
        others = {"status": status}
        if status in ("failed", "killed"):
            others["failure_reason"] = one_line(redact(reason or "unknown (no reason given)"), FAILURE_REASON_MAX_CHARS)
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


def comet_mode(comet: Any) -> Literal["online", "offline"] | None:
    """The Comet mode the config's ``comet`` section (or the whole config) asks for: ``auto`` is
    online when COMET_API_KEY is set, else off."""
    value = str(as_section(comet, COMET).comet or "auto").strip().lower()
    if value == "auto":
        return "online" if os.environ.get("COMET_API_KEY", "").strip() else None
    if value == "off":
        return None
    if value in ("online", "offline"):
        return value  # type: ignore[return-value]
    raise ConfigError(f"comet: '{value}' is not one of auto, online, offline, off")


def comet_key_configured() -> bool:
    """A Comet API key is there for comet_ml to read: ``COMET_API_KEY``, or ``api_key`` in the
    ``[comet]`` section of ``$COMET_CONFIG``, ``./.comet.config`` or ``~/.comet.config`` (the
    key itself is never read into this process's config)."""
    import configparser

    if os.environ.get("COMET_API_KEY", "").strip():
        return True
    for path in (os.environ.get("COMET_CONFIG", ""), ".comet.config", os.path.expanduser("~/.comet.config")):
        if not path or not os.path.isfile(path):
            continue
        parser = configparser.ConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        if parser.get("comet", "api_key", fallback="").strip():
            return True
    return False


def check_comet(comet: Any) -> None:
    """``comet: online`` insists on Comet: without an API key the run is refused before it
    starts (``auto`` is then off, ``offline`` needs no key). ``comet``: the config's ``comet``
    section (or the whole config)."""
    comet = as_section(comet, COMET)
    mode = comet_mode(comet)
    if mode == "online" and not comet_key_configured():
        raise UserError("comet: 'online' needs a Comet API key, and none is set (COMET_API_KEY, or api_key in "
                        "~/.comet.config); set one, or use comet offline (an archive to upload later), auto or off")
    if mode == "offline" and not comet.comet_offline_directory:
        folder = os.environ.get("COMET_OFFLINE_DIRECTORY", "").strip()
        if folder:
            directory("COMET_OFFLINE_DIRECTORY", folder, error=UserError)


def start_comet(
    settings: Any, mode: Literal["online", "offline"], run_name: str | None, mlflow_logger,
    experiment_key: str | None = None,
) -> CometLogger | None:
    """The Comet experiment of the config's ``comet`` section ``settings`` (or the whole config)."""
    settings = as_section(settings, COMET)
    tag = str(settings.comet_tag or "")
    try:
        comet = CometLogger(
            mode=mode,
            project_name=str(settings.comet_project_name or "") or None,
            workspace=str(settings.comet_workspace or "") or None,
            experiment_name=str(settings.comet_name or "") or run_name,
            offline_directory=str(settings.comet_offline_directory or "") or None,
            tags=[tag] if tag else [],
            experiment_key=experiment_key,
        )
    except Exception as exc:
        hint = ""
        if mode == "online" and isinstance(exc, ValueError):
            hint = " (set COMET_API_KEY, or use comet=offline or comet=off)"
        log.warning(
            "Comet (%s) could not start: %s%s; continuing with MLflow only",
            mode, one_line(redact(str(exc)), 300), hint,
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
                    one_line(redact(str(exc)), 300))
        try:
            comet.experiment.end()
        except Exception:
            pass
        return None
    mlflow_logger.set_tags({"comet_experiment_key": comet.experiment_key, "comet_mode": mode})
    return comet
