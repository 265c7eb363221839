"""Child MLflow runs that train or evaluate in a process of their own.

A sweep's trials and a pipeline's steps are each a nested child run: this process creates the
child (tag ``mlflow.parentRunId``), then starts the training (one process, or torchrun when
``nproc_per_node > 1``) or another command with ``MLFLOW_RUN_ID`` set to the child, so the child
holds exactly what a stand-alone run holds. The command lines come from the command layer
(:mod:`kronos_mlflow.cli.commands`), handed down to the workflows that start them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .command_runs import started


class Commands(Protocol):
    """What a child run's process is started with: the command layer's command lines
    (:class:`kronos_mlflow.cli.commands.CommandLines`), handed to the workflows as ``args.commands``."""

    def train(self, nproc: int, flags: Sequence[str], module: str = ...) -> list[str]: ...

    def evaluate(self, model: str, flags: Sequence[str]) -> list[str]: ...

    def keep_killed(self, run_id: str, pid: int) -> list[str]: ...


def as_flags(values: Mapping[str, Any]) -> list[str]:
    """``{"n_train_iter": 64}`` -> ``["--n-train-iter", "64"]``; None values are left out."""
    out: list[str] = []
    for key, value in values.items():
        if value is None:
            continue
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def child_env(run_id: str, experiment_id: str, tracking_uri: str,
              extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment pointed at the child run ``run_id``."""
    from .gate import HANDOVER_ENV, handover_env  # lazy: the tracking package imports numpy, urllib/http

    env = dict(os.environ)
    env.pop(HANDOVER_ENV, None)  # this process's own, if it was handed a run: never passed on
    env.update({**handover_env(run_id), "MLFLOW_EXPERIMENT_ID": experiment_id, "MLFLOW_TRACKING_URI": tracking_uri,
                **(extra or {})})
    env.pop("MLFLOW_EXPERIMENT_NAME", None)
    return env


def create_child(client, experiment_id: str, parent_run_id: str, run_name: str,
                 tags: Mapping[str, str] | None = None) -> str:
    """A new child run of ``parent_run_id``, handed to the process :func:`child_env` starts
    (:func:`kronos_mlflow.tracking.gate.child_run`); returns its id."""
    from .gate import child_run  # lazy: numpy, urllib/http

    return started(child_run(client, experiment_id, parent_run_id, run_name, tags))  # a stop ends it KILLED


def experiment_id_of(client, experiment_name: str | None) -> str:
    """The experiment to use: ``experiment_name`` (created when missing, race-safe), else ``MLFLOW_EXPERIMENT_ID``
    (``mlflow run`` sets it), else MLflow's default experiment."""
    if os.environ.get("MLFLOW_EXPERIMENT_ID") and not experiment_name:
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    if experiment_name:
        from .gate import experiment_named  # lazy: numpy, urllib/http

        return experiment_named(client, experiment_name)
    return "0"


def log_param_once(client, run_id: str, key: str, value: Any) -> None:
    """Params cannot change: one already there (``mlflow run`` logs its -P values, spelled its
    own way) stays; a different value goes to a tag of the same name instead."""
    from .protocol import same_param  # lazy: numpy, urllib/http

    existing = client.get_run(run_id).data.params.get(key)
    if existing is None:
        client.log_param(run_id, key, str(value))
    elif not same_param(existing, str(value)):
        client.set_tag(run_id, key, str(value))
