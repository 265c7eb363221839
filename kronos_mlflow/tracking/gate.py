"""The one gate to the tracking store: every run a command writes (its own new run, the run
``MLFLOW_RUN_ID`` hands over, a parent it continues, a run it resumes) is obtained here, or refused
in one line (:class:`RunRefused`, exit code 2) before anything is written; the rules and the threat
they answer: docs/reliability.md#who-may-write-a-run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ..config import names
from . import run_names
from ..errors import UserError, short_reason
from .ownership import TAG as OWNER_TAG
from .ownership import Owner, OwnershipError, check_writable, new_token, owns, token_hash
from ..config.secrets import redact, redact_uri

#: The tag of a child run this project handed to a process of its own: ``sha256:`` of the token
#: that process finds in :data:`HANDOVER_ENV`.
HANDOVER_TAG = "kronos.handover"
HANDOVER_ENV = "KRONOS_MLFLOW_HANDOVER_TOKEN"
#: The tag ``mlflow run`` puts on the run it makes: the MLproject entry point.
ENTRY_POINT_TAG = "mlflow.project.entryPoint"
#: What this project writes on the run ``mlflow run`` made when the work went elsewhere (a
#: training resumed into its saved run, a walk-forward fold into its parent): such a run is still
#: the bare run of that launch (a torchrun restart of the same launch is handed it again).
LAUNCHER_MARKS = ("kronos.continued_in_run", "walkforward.ran_into")

#: The commands that write the run ``MLFLOW_RUN_ID`` hands over (else a new one), and the
#: MLproject entry points that run each.
DOORS: dict[str, tuple[str, ...]] = {
    "train": ("main", "predictor"),  # a stage is a config key: either entry point may train either
    "train-predictor": ("main", "predictor"),
    "evaluate": ("evaluate",),
    "pipeline": ("pipeline",),
    "walk-forward": ("walkforward",),
    "sweep": ("sweep",),
}
#: Commands that write only runs they create themselves (:func:`new_run`; MLFLOW_RUN_ID is not read).
OWN_RUNS = ("evaluate-tokenizer",)
#: Commands that write only a run their input file proves it owns (:func:`owned_run`).
OWNED_RUNS = ("upload-spool",)
#: Commands that write no run at all.
NO_RUN = ("demo-data", "import-csv", "prepare", "compare")


class RunRefused(OwnershipError):
    """A run a command would write may not be written by it."""


# --------------------------------------------------------------------------------------------
# the store, read only


def _store_name(client) -> str:
    return redact_uri(client.tracking_uri)


def reader(source: str):
    """A client of the tracking store (``MLFLOW_TRACKING_URI``), without making one: a sqlite
    store whose file does not exist is refused in one line naming ``source`` (what names a run
    in it), since it can hold no run."""
    import mlflow
    from mlflow import MlflowClient

    from ..config.checks import sqlite_path  # lazy: only a command that names a run opens the store
    from .server import hide_uri_printing  # lazy: urllib/http

    uri = mlflow.get_tracking_uri()
    hide_uri_printing(uri)
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise RunRefused(f"{source}: the tracking store {path} does not exist, so it holds no such run; nothing was "
                         "written: point MLFLOW_TRACKING_URI at the store that holds it")
    return MlflowClient(tracking_uri=uri)


def get_run(client, run_id: str, source: str):
    """``run_id``'s run (its id checked as a name first), or one line naming ``source``."""
    from mlflow.exceptions import MlflowException

    run_id = names.run_id(run_id, source)
    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            given = f"unset {source} or" if not source.startswith("-") else "give a run id this store holds, or"
            raise RunRefused(f"MLflow run {run_id} ({source}) does not exist at {_store_name(client)}; nothing was "
                             f"written: {given} point MLFLOW_TRACKING_URI at the store that holds it") from None
        raise RunRefused(redact(f"MLflow run {run_id} ({source}) cannot be read from {_store_name(client)} "
                                f"({short_reason(exc)}); check MLFLOW_TRACKING_URI")) from None


def named_run(client, value: Any, source: str):
    """The run a tag, a param or a file (``source``) names, read only: its id checked as a name
    (:func:`kronos_mlflow.config.names.run_id`), then read; a run the store lacks is one line naming
    ``source``. What the caller may do with it is the caller's rule."""
    from mlflow.exceptions import MlflowException

    run_id = names.run_id(value, source)
    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise RunRefused(f"{source} names MLflow run {run_id}, which is not in the tracking store "
                             f"{_store_name(client)}; expected a run of this store") from None
        raise RunRefused(redact(f"{source} names MLflow run {run_id}, which cannot be read from "
                                f"{_store_name(client)} ({short_reason(exc)})")) from None


def own_model_uri(client, run, source: str) -> str:
    """``run``'s ``best_model_uri`` tag (a claim) as a model ``run`` itself logged: ``runs:/<its
    id>/<plain names>``, or ``models:/m-<id>`` whose logged model's source run is ``run``; else
    one line naming ``source``. What moves a champion alias goes through here."""
    value, run_id = run.data.tags.get("best_model_uri"), run.info.run_id
    prefix = f"runs:/{run_id}/"
    if isinstance(value, str) and value.startswith(prefix):
        if all(names.PLAIN.fullmatch(part) for part in value[len(prefix):].split("/")):
            return value
    elif isinstance(value, str) and value.startswith("models:/"):
        model_id = value[len("models:/"):]
        if names.PLAIN.fullmatch(model_id):
            try:
                if client.get_logged_model(model_id).source_run_id == run_id:
                    return value
            except Exception:  # noqa: BLE001 - a model the store lacks: refused below
                pass
    raise RunRefused(f"{source} '{names.shown(value)}' is not a model run {run_id} logged; expected {prefix}<artifact "
                     "path> or the models:/ URI of a model that run logged")


def handed_run_id() -> str | None:
    """``MLFLOW_RUN_ID`` (None when unset), checked as a run id."""
    value = os.environ.get("MLFLOW_RUN_ID", "").strip()
    return names.run_id(value, "MLFLOW_RUN_ID") if value else None


# --------------------------------------------------------------------------------------------
# the run MLFLOW_RUN_ID hands over


def refusal(run, *, command: str | None, experiment_id: str | None, directory_owner: Owner | None = None,
            source: str = "MLFLOW_RUN_ID") -> str | None:
    """Why ``command`` may not write ``run``, handed over by ``source`` (None: it may). Pure: reads
    ``run`` and this process's environment only. ``command`` None: any command's entry point."""
    run_id, tags = run.info.run_id, run.data.tags
    unset = f"nothing was written: unset {source} to start a new run"
    if run.info.lifecycle_stage == "deleted":
        return f"MLflow run {run_id} ({source}) is deleted; nothing was written: restore it or unset {source}"
    if experiment_id is not None and run.info.experiment_id != str(experiment_id):
        return (f"MLflow run {run_id} ({source}) is in experiment {run.info.experiment_id}, but this command logs to "
                f"experiment {experiment_id}; {unset}, or name the run's experiment")
    if run.info.status == "FINISHED":
        return f"MLflow run {run_id} ({source}) is FINISHED, and a finished run is never written again; {unset}"
    if OWNER_TAG in tags:
        if directory_owner is not None and directory_owner.run_id == run_id and owns(run, directory_owner.token):
            return None  # this run directory's own claim: a restarted training
        where = f" ({directory_owner.directory})" if directory_owner is not None else ""
        return (f"MLflow run {run_id} ({source}) already belongs to another training (tag {OWNER_TAG}), whose files "
                f"are not in this run directory{where}; {unset}, or run the command that made it")
    if HANDOVER_TAG in tags:
        token = os.environ.get(HANDOVER_ENV, "")
        if token and tags[HANDOVER_TAG] == token_hash(token):
            return None
        return (f"MLflow run {run_id} ({source}) was handed to another process (tag {HANDOVER_TAG}) and this one "
                f"cannot prove it is that process; {unset}")
    if run.info.status != "RUNNING":
        return (f"MLflow run {run_id} ({source}) is {run.info.status}, not a run mlflow run has just made for this "
                f"command; {unset}")
    entries = DOORS.get(command, ()) if command is not None else None
    entry = tags.get(ENTRY_POINT_TAG)
    if entries is not None and entry is not None and entry not in entries:
        wanted = " or ".join(entries) if entries else "none"
        return (f"MLflow run {run_id} ({source}) was made for the MLproject entry point '{names.shown(entry)}', not "
                f"for {command} (entry point {wanted}); {unset}")
    foreign = sorted(k for k in tags if not k.startswith("mlflow.") and k not in LAUNCHER_MARKS)
    if foreign or run.data.metrics:
        held = f"tags {', '.join(names.shown(k, 40) for k in foreign[:3])}" if foreign else \
            f"{len(run.data.metrics)} metric(s)"
        return (f"MLflow run {run_id} ({source}) already holds {held}, so it is not a run mlflow run has just made "
                f"for this command; {unset}")
    return None


def handed_run(client, *, command: str, experiment_id: str | None, directory_owner: Owner | None = None):
    """Read-only: the run ``MLFLOW_RUN_ID`` hands to ``command`` (None when unset), when
    ``command`` may write it; else one line (:class:`RunRefused`). Every command and its
    ``--check`` call this before any other work."""
    run_id = handed_run_id()
    if run_id is None:
        return None
    run = get_run(client, run_id, "MLFLOW_RUN_ID")
    why = refusal(run, command=command, experiment_id=experiment_id, directory_owner=directory_owner)
    if why:
        raise RunRefused(why)
    return run


def check_handed(command: str, experiment_name: str | None = None) -> None:
    """:func:`handed_run` for a command that has not opened the store: nothing is created (a
    sqlite store that does not exist holds no run to hand over)."""
    if handed_run_id() is None:
        return
    client = reader("MLFLOW_RUN_ID")
    handed_run(client, command=command, experiment_id=handed_experiment(client, experiment_name))


def handed_experiment(client, experiment_name: str | None) -> str:
    """The experiment a handed-over run must be in: ``MLFLOW_EXPERIMENT_ID`` when set (``mlflow
    run`` and this project's parents set it to the run's experiment, whatever a config file or the
    shell's ``MLFLOW_EXPERIMENT_NAME`` says), else :func:`command_experiment`."""
    return os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip() or command_experiment(client, experiment_name)


def command_experiment(client, experiment_name: str | None) -> str:
    """The experiment a command logs to, read only: ``experiment_name``, ``MLFLOW_EXPERIMENT_NAME``,
    ``MLFLOW_EXPERIMENT_ID``, else MLflow's default; a named one that does not exist yet is
    ``'<name>' (not created)`` (no run can be in it)."""
    name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME", "").strip()
    if name:
        experiment = client.get_experiment_by_name(name)
        return experiment.experiment_id if experiment is not None else f"'{name}' (not created)"
    if os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip():
        return os.environ["MLFLOW_EXPERIMENT_ID"].strip()
    from mlflow.tracking.default_experiment import DEFAULT_EXPERIMENT_ID

    return DEFAULT_EXPERIMENT_ID


def experiment_named(client, name: str) -> str:
    """The id of the experiment ``name``, created when missing: the project's one get-or-create.
    Race-safe: when several processes create it at once (sweep workers on a new experiment), the
    store lets one insert it and refuses the others (``RESOURCE_ALREADY_EXISTS``, or a unique-
    constraint error from a database that reports it at commit); a refused create reads the
    experiment back and uses it. A deleted one is refused (:class:`UserError`): runs cannot be
    made in it."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return str(client.create_experiment(name))
        except MlflowException:  # another process made it first: use theirs
            experiment = client.get_experiment_by_name(name)
            if experiment is None:  # not a race: the store's own refusal
                raise
    if experiment.lifecycle_stage == "deleted":
        raise UserError(f"MLflow experiment '{name}' is deleted; restore it (mlflow experiments restore "
                        f"--experiment-id {experiment.experiment_id}) or choose another experiment_name")
    return str(experiment.experiment_id)


# --------------------------------------------------------------------------------------------
# runs a command writes


def new_run(client, experiment_id: str, *, run_name: str | None, tags: Mapping[str, Any] | None = None):
    """A new run of this command (the only ``create_run`` of the project); returns it."""
    return client.create_run(experiment_id, run_name=run_name or None,
                             tags={str(k): str(v) for k, v in (tags or {}).items()})


def command_run(client, experiment_id: str, *, command: str, run_name: str,
                tags: Mapping[str, Any] | None = None) -> str:
    """The run ``command`` writes as its own (a pipeline's, a walk-forward's or a sweep's parent,
    an evaluation): the one ``MLFLOW_RUN_ID`` hands over, checked (:func:`handed_run`), else a new
    one. Returns its id; ``tags`` are set on it, and ``run_name`` replaces a handed run's name
    when MLflow made that name up (``mlflow run`` without ``--run-name``)."""
    run = handed_run(client, command=command,
                     experiment_id=os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip() or experiment_id)
    if run is None:
        return new_run(client, experiment_id, run_name=run_name, tags=tags).info.run_id
    if run_name and run_names.generated(run.info.run_name):
        client.update_run(run.info.run_id, name=run_name)
    for key, value in (tags or {}).items():
        client.set_tag(run.info.run_id, key, str(value))
    return run.info.run_id


#: token of each child this process created (run id -> token): handed to the child's process only.
_HANDED: dict[str, str] = {}


def child_run(client, experiment_id: str, parent_run_id: str, run_name: str,
              tags: Mapping[str, Any] | None = None) -> str:
    """A new child run of ``parent_run_id`` that a process of this project's will write: it carries
    :data:`HANDOVER_TAG`, and :func:`handover_env` gives that process the token. Returns its id."""
    token = new_token()
    all_tags = {"mlflow.parentRunId": parent_run_id, "mlflow.runName": run_name, **(tags or {}),
                HANDOVER_TAG: token_hash(token)}
    run_id = new_run(client, experiment_id, run_name=run_name, tags=all_tags).info.run_id
    _HANDED[run_id] = token
    return run_id


def handover_env(run_id: str) -> dict[str, str]:
    """The environment entries that hand ``run_id`` (a :func:`child_run`) to a process."""
    token = _HANDED.get(run_id)
    return {"MLFLOW_RUN_ID": run_id, **({HANDOVER_ENV: token} if token else {})}


def continued_parent(client, run_id: str, *, flag: str, experiment_id: str | None,
                     rule: Callable[[Any], str | None]):
    """A parent run the user names on the command line (``flag``) for this command to continue:
    in this store and ``experiment_id`` (None: any), not deleted, and of this command's kind and
    plan (``rule(run)`` says why not, None when it is). Returns the run; one line otherwise."""
    run = get_run(client, run_id, flag)
    if run.info.lifecycle_stage == "deleted":
        raise RunRefused(f"{flag} {run.info.run_id}: the run is deleted; nothing was written: restore it (mlflow runs "
                         f"restore --run-id {run.info.run_id}) or give another")
    if experiment_id is not None and run.info.experiment_id != str(experiment_id):
        raise RunRefused(f"{flag} {run.info.run_id}: the run is in experiment {run.info.experiment_id}, but this "
                         f"command logs to experiment {experiment_id}; nothing was written: name the run's experiment")
    why = rule(run)
    if why:
        raise RunRefused(f"{flag} {run.info.run_id}: {why}")
    return run


def owned_run(client, run_id: str, token: str | None, *, what: str, experiment_id: str | None,
              allow_finished: bool = False, advice: str | None = None):
    """A run a file names (a training state, a spool) that the file's ``token`` proves it may
    write (:func:`kronos_mlflow.tracking.ownership.check_writable`); one line otherwise."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(names.run_id(run_id, what)) if run_id else None
    except (MlflowException, UserError):
        run = None
    if run is None:
        raise RunRefused(f"{what} names MLflow run {names.shown(run_id or '(none)')}, which is not in the tracking "
                         f"store {_store_name(client)}; nothing was written: point MLFLOW_TRACKING_URI at the store "
                         "that holds it" + (f", or {advice}" if advice else ""))
    kwargs = {"advice": advice} if advice else {}
    check_writable(run, token, what=what, experiment_id=experiment_id, store=_store_name(client),
                   allow_finished=allow_finished, **kwargs)
    return run
