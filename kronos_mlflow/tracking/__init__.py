"""Experiment tracking: the logger protocol, MLflow and Comet, the one gate to the store, run ownership, metric and tag names.
May import ``data``, ``model``, ``config``, ``runtime`` and ``errors`` (docs/code-map.md); the SDKs load inside the adapters.

:func:`build_tracking` decides once which rank logs: rank 0 gets a :class:`MultiLogger` of
MLflow (required) and Comet (optional), every other rank a :class:`NullLogger`, so the training
loop never asks its rank.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config.keys import COMET, TRACKING
from ..config.sections import section
from ..config.secrets import install_secret_filter
from .comet import CometLogger, check_comet, comet_mode, start_comet
from .mlflow import MLflowLogger
from .protocol import ExperimentLogger, MultiLogger, NullLogger, Status
from .server import check_tracking_server, is_connection_error
from .system_metrics import start_system_metrics

__all__ = [
    "CometLogger", "ExperimentLogger", "MLflowLogger", "MultiLogger", "NullLogger", "Status", "Tracking",
    "build_logger", "build_tracking", "check_tracking_server", "comet_mode", "is_connection_error",
]


@dataclass
class Tracking:
    """What :func:`build_tracking` gives a process: ``logger`` for the training loop (a
    :class:`NullLogger` off rank 0) and, on rank 0, the adapters for backend-only features."""

    logger: ExperimentLogger
    mlflow: MLflowLogger | None = None
    comet: CometLogger | None = None

    def run_ids(self) -> dict[str, str | None]:
        """The ids a training state keeps so that a resumed run continues the same run and experiment."""
        return {"mlflow_run_id": self.mlflow.run_id if self.mlflow else None,
                "comet_experiment_key": self.comet.experiment_key if self.comet else None,
                "owner_token": self.mlflow.owner_token if self.mlflow else None}


def build_tracking(
    config: Mapping[str, Any],
    rank: int,
    *,
    mlflow_tags: Mapping[str, str] | None = None,
    run_id: str | None = None,
    comet_experiment_key: str | None = None,
    resume: bool = False,
    spool_dir: str | os.PathLike | None = None,
    claim=None,
) -> Tracking:
    """The tracking of this process, decided once.

    Ranks other than 0 get ``Tracking(NullLogger())``. Rank 0 gets an :class:`MLflowLogger`
    (errors propagate: MLflow is required) and, when ``config["comet"]`` asks for it, a
    :class:`CometLogger`; ``comet="online"`` with no ``COMET_API_KEY`` nor Comet config file is
    refused (a :class:`~kronos_mlflow.errors.UserError`, before any run is made); Comet failing
    to start otherwise (its server unreachable) is warned about once and training continues
    with MLflow only. The two are cross-linked: the MLflow run id is logged to Comet
    (``mlflow_run_id``) and the Comet key tagged on the run (``comet_experiment_key``). Also
    installs :class:`~kronos_mlflow.config.secrets.SecretFilter` on the root logger's handlers, and starts
    MLflow's system-metrics monitor on the run (:mod:`~kronos_mlflow.tracking.system_metrics`;
    ``MLflowLogger.finalize`` stops it).

    ``rank`` may also be an object with a ``rank`` attribute (``DistInfo``).

    Resuming (:mod:`kronos_mlflow.training.checkpoint`): ``run_id`` reattaches to the saved MLflow run
    (``MLFLOW_RUN_ID``, when set, names the same run under ``mlflow run``),
    ``comet_experiment_key`` continues the saved Comet experiment (when the run's own
    ``comet_experiment_key`` tag names it), and ``resume=True`` reads the steps the run already
    holds so that the replayed steps go to no backend twice. ``claim``
    (:class:`kronos_mlflow.tracking.ownership.Claim`) is what proves the right to write the run. MLflow's
    spool (see :class:`MLflowLogger`) goes to ``spool_dir`` (the run directory's
    ``mlflow-spool`` as the training entry point passes it; else ``$KRONOS_MLFLOW_HOME/spool``).
    """
    rank = int(getattr(rank, "rank", rank))
    if rank != 0:
        return Tracking(NullLogger())
    install_secret_filter()
    comet_settings = section(config, COMET)  # Comet is handed its section only
    check_comet(comet_settings)  # comet online without a key: refused before the MLflow run is made
    mode = comet_mode(comet_settings)
    names = section(config, TRACKING)  # the MLflow names and the system metrics
    run_name = str(names.run_name or "") or None
    mlflow_logger = MLflowLogger(
        experiment_name=str(names.experiment_name or "") or None,
        run_name=run_name,
        tags=mlflow_tags,
        run_id=run_id,
        spool_dir=spool_dir,
        claim=claim,
    )
    if resume:
        mlflow_logger.skip_logged_steps()
        if comet_experiment_key and mlflow_logger.run_tags.get("comet_experiment_key") != comet_experiment_key:
            # the state's Comet experiment is continued only when the run itself names it
            print(f"[kronos] Comet: the saved experiment key is not run {mlflow_logger.run_id}'s; a new Comet "
                  "experiment is started", flush=True)
            comet_experiment_key = None
    mlflow_logger.system_metrics = start_system_metrics(names, mlflow_logger.run_id, mlflow_logger.tracking_uri,
                                                        resume=mlflow_logger.attached)
    loggers: list[ExperimentLogger] = [mlflow_logger]
    comet = start_comet(comet_settings, mode, run_name, mlflow_logger, comet_experiment_key) if mode else None
    if comet is not None:
        loggers.append(comet)
    return Tracking(MultiLogger(loggers, skip_steps=mlflow_logger.skipped_steps), mlflow_logger, comet)


def build_logger(config: Mapping[str, Any], rank: int, **kwargs: Any) -> ExperimentLogger:
    """``build_tracking(config, rank, **kwargs).logger``: the logger alone."""
    return build_tracking(config, rank, **kwargs).logger
