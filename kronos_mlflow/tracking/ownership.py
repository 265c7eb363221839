"""Which MLflow run owns a run directory, a training state or a spool: the run itself says so, through
a random 256-bit token whose SHA-256 it carries as the tag ``kronos.owner`` (the token stays in
files, never in the store). Resume, continue, reuse and upload check it (:func:`check_writable`,
:func:`evidence`); docs/reliability.md#who-may-write-a-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..runtime.fsutil import read_json, write_atomic

#: The run's tag: ``sha256:<hex>`` of the token its files hold.
TAG = "kronos.owner"
#: The run directory's record of its owner.
FILE = "owner.json"
FORMAT = "kronos-mlflow-owner"
VERSION = 1
_TOKEN_RE = re.compile(r"^[0-9a-f]{64}$")
_RUN_ID_RE = re.compile(r"^[0-9A-Za-z_\-]{1,256}$")


class OwnershipError(UserError):
    """A file or a run names a run that does not prove it owns it (or may not be written now)."""


def new_token() -> str:
    """A fresh random token (64 hex digits)."""
    return secrets.token_hex(32)


def token_hash(token: str) -> str:
    """The tag value for ``token``: ``sha256:`` and its hex digest."""
    return "sha256:" + hashlib.sha256(str(token).encode("ascii")).hexdigest()


def is_token(value: Any) -> bool:
    return isinstance(value, str) and bool(_TOKEN_RE.match(value))


def owns(run, token: str | None) -> bool:
    """True when ``run`` (an MLflow ``Run``) carries the tag of ``token``."""
    return is_token(token) and run.data.tags.get(TAG) == token_hash(token)


@dataclass(frozen=True)
class Owner:
    """``owner.json`` of a run directory: the run it belongs to (None while that run is being
    created) and the token."""

    token: str
    run_id: str | None
    experiment_id: str | None
    directory: Path


def owner_path(directory: str | os.PathLike) -> Path:
    return Path(directory) / FILE


def read_owner(directory: str | os.PathLike) -> Owner | None:
    """The directory's ``owner.json``, or None when it has none; a damaged one is one line."""
    path = owner_path(directory)
    advice = "delete it to let this directory's next run claim it"
    try:
        data = read_json(path, what="run owner file", max_bytes=64 << 10, advice=advice, error=OwnershipError)
    except FileNotFoundError:
        return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    experiment_id = data.get("experiment_id") if isinstance(data, dict) else None
    if (not isinstance(data, dict) or data.get("format") != FORMAT or not is_token(data.get("token"))
            or not (run_id is None or (isinstance(run_id, str) and _RUN_ID_RE.match(run_id)))
            or not (experiment_id is None or isinstance(experiment_id, str))):
        raise OwnershipError(f"run owner file '{path}' is not one kronos-mlflow writes; {advice}")
    return Owner(data["token"], run_id, experiment_id, Path(directory))


def write_owner(directory: str | os.PathLike, token: str, run_id: str | None, experiment_id: str | None) -> Path:
    """Write ``owner.json`` atomically (the directory is created when missing)."""
    path = owner_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "version": VERSION, "token": token, "run_id": run_id, "experiment_id": experiment_id}
    write_atomic(path, json.dumps(body, sort_keys=True) + "\n")
    return path


def token_of(record: Mapping[str, Any] | None) -> str | None:
    """The token a training state's ``run_ids`` or a spool's header carries (None: none or malformed)."""
    value = (record or {}).get("owner_token")
    return value if is_token(value) else None


@dataclass
class Claim:
    """What a command proves or claims about the run its logger opens.

    ``token``: the token a training state names the run with (a resume: the run must carry it),
    else the token to claim a new run with (None: draw one). ``named_by``: the file that names the
    run (a resume), for messages. ``directory``: the run directory whose ``owner.json`` records the
    claim (read before, written before the run is tagged, so that a restart finds it)."""

    token: str | None = None
    named_by: str | None = None
    directory: Path | None = None
    command: str = "train"  # the command that claims it (kronos_mlflow.tracking.gate.DOORS)

    @property
    def resume(self) -> bool:
        return self.named_by is not None


# --------------------------------------------------------------------------------------------
# the checks


STATE_ADVICE = "set resume to never (or delete that directory) to start a new run"


def check_writable(run, token: str | None, *, what: str, experiment_id: str | None, store: str,
                   allow_finished: bool = False, advice: str = STATE_ADVICE) -> None:
    """``run`` may be written by the holder of ``token`` (``what`` names the file that names it,
    for the message): not deleted, in ``experiment_id`` (None: not checked), owned, not FINISHED
    (unless ``allow_finished``). Raises :class:`OwnershipError` ending in ``advice``."""
    run_id = run.info.run_id
    if run.info.lifecycle_stage == "deleted":
        raise OwnershipError(f"{what} names MLflow run {run_id}, which is deleted; nothing was written: restore it "
                             f"(mlflow runs restore --run-id {run_id}), or {advice}")
    if experiment_id is not None and run.info.experiment_id != str(experiment_id):
        raise OwnershipError(f"{what} names MLflow run {run_id} of experiment {run.info.experiment_id}, but this command "
                             f"logs to experiment {experiment_id} of {store}; nothing was written: give the run's "
                             f"experiment (experiment_name), or {advice}")
    if not owns(run, token):
        why = "holds no run token" if token is None else "holds a token that run does not carry"
        raise OwnershipError(f"{what} names MLflow run {run_id}, but it {why} (tag {TAG}), so it was not written for "
                             f"that run; nothing was written: {advice}")
    if run.info.status == "FINISHED" and not allow_finished:
        raise OwnershipError(f"{what} names MLflow run {run_id}, which is FINISHED, and a finished run is never written "
                             f"again; nothing was written: {advice}")


def evidence(client, run, *, directory_tag: str = "run_directory") -> str | None:
    """Why ``run`` is not provably this project's own run on this machine (None: it is): it carries
    the owner tag, its run directory (tag ``run_directory``) is here, and that directory's
    ``owner.json`` names this run and holds the token whose hash the tag is."""
    run_id = run.info.run_id
    if TAG not in run.data.tags:
        return f"run {run_id} carries no {TAG} tag (it was not started by kronos-mlflow)"
    directory = run.data.tags.get(directory_tag, "")
    if not directory or not Path(directory).is_dir():
        return f"run {run_id}'s directory {directory or '(none)'} is not on this machine"
    try:
        owner = read_owner(directory)
    except OwnershipError as exc:
        return str(exc)
    if owner is None or owner.run_id != run_id or not owns(run, owner.token):
        return f"run {run_id}'s directory {directory} does not record that run as its owner"
    return None


def owned_state(run, state: Mapping[str, Any] | None) -> str | None:
    """Why the training state ``state`` (``read_training_state``'s dict) is not ``run``'s own
    (None: it is): it names the run and holds the token the run carries."""
    if state is None:
        return f"run {run.info.run_id}'s directory holds no training state"
    ids = state.get("run_ids") or {}
    if ids.get("mlflow_run_id") != run.info.run_id or not owns(run, token_of(ids)):
        return f"the training state in {state.get('directory')} is not run {run.info.run_id}'s"
    return None
