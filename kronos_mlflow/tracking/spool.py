"""The MLflow spool: what a run could not send while its tracking server was down, written by
:class:`~kronos_mlflow.tracking.mlflow.MLflowLogger` to ``{save_dir}/mlflow-spool/<run_id>.jsonl``,
and its upload (``kronos-mlflow upload-spool``, :func:`upload_spool`), checked against its run
before anything is sent. The checks and the file format: docs/reliability.md#tracking-outages.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..config import settings
from ..errors import UserError
from ..runtime.fsutil import JsonFileError, parse_json, read_bounded
from .ownership import TAG as OWNER_TAG
from .ownership import is_token, owns

FORMAT = "kronos-mlflow-spool"
VERSION = 1
SUFFIX = ".jsonl"
UPLOADED_SUFFIX = ".uploaded"
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
_MAX_LINE = 1 << 20  # a record is small; a megabyte-long line is not ours
_MAX_SPOOL_BYTES = 1 << 30  # millions of metric values; a bigger file is not a spool
# What MLflow accepts (mlflow.utils.validation): checked on every line before anything is sent,
# so that MLflow never refuses a record halfway through an upload.
_KEY_RE = re.compile(r"^[/\w.\- :]{1,250}$")
_MAX_PARAM_VALUE = 6000
_MAX_TAG_VALUE = 8000
_INT64_MAX = 2**63 - 1


def spoolable_tag(key: str) -> bool:
    """Tags a spool may carry: the run's own data, never MLflow's system tags (``mlflow.*``: the
    run's name, parent, note, source) nor its owner (:mod:`kronos_mlflow.tracking.ownership`)."""
    return not key.startswith("mlflow.") and key != OWNER_TAG


def _check_key(key: str, kind: str, bad) -> None:
    norm = posixpath.normpath(key)
    if not _KEY_RE.match(key) or norm != key or norm == "." or norm.startswith(("..", "/")):
        raise bad(f"{kind} key '{key[:80]}' is not a name MLflow accepts; expected at most 250 letters, digits, "
                  "'_', '-', '.', ' ', ':' or '/', not a path such as ../x")


class SpoolError(UserError):
    """A spool file cannot be read or uploaded."""


def default_spool_dir() -> Path:
    """``$KRONOS_MLFLOW_SPOOL_DIR``, else ``$KRONOS_MLFLOW_HOME/spool`` (``~/.cache/kronos_mlflow/spool``),
    as :mod:`kronos_mlflow.config.settings` declares them."""
    return settings.spool_dir()


def spool_path(directory: str | os.PathLike, run_id: str) -> Path:
    return Path(directory) / f"{run_id}{SUFFIX}"


def artifacts_dir(path: str | os.PathLike) -> Path:
    """Where copies of the artifacts a spool refers to are kept: ``<run_id>.artifacts/``."""
    path = Path(path)
    name = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    return path.with_name(f"{name}.artifacts")


# --------------------------------------------------------------------------------------------
# writing


def append_records(path: str | os.PathLike, header: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> int:
    """Append ``records`` to the spool at ``path`` (written with ``header`` first when new),
    flushed and fsynced. Returns the number of records written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    new = not path.exists() or path.stat().st_size == 0
    if new:
        lines.append(json.dumps({"type": "header", "format": FORMAT, "version": VERSION, **header},
                                sort_keys=True, allow_nan=False))
    n = 0
    for record in records:
        lines.append(json.dumps(dict(record), sort_keys=True, allow_nan=False))
        n += 1
    if not lines:
        return 0
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return n


# --------------------------------------------------------------------------------------------
# reading


def read_spool(path: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """``(header, records, ignored)``: records checked one by one; ``ignored`` is 1 when the
    last line was cut short (a crash while appending), else 0."""
    path = Path(path)
    try:
        text = read_bounded(path, _MAX_SPOOL_BYTES).decode("utf-8")
    except JsonFileError as exc:
        if exc.kind == "missing":
            raise SpoolError(f"spool file '{path}' does not exist") from None
        if exc.kind == "not-regular":
            raise SpoolError(f"spool file '{path}' is {'a directory' if exc.values.get('directory') else 'not a regular file'}"
                             ) from None
        if exc.kind == "too-large":
            raise SpoolError(f"spool file '{path}' is {exc.values['size']:,} bytes; a kronos-mlflow spool is far smaller "
                             f"(at most {_MAX_SPOOL_BYTES:,} bytes are read)") from None
        reason = exc.values.get("reason")
        raise SpoolError(f"spool file '{path}' cannot be read ({getattr(reason, 'strerror', None) or reason})") from None
    except UnicodeDecodeError as exc:
        raise SpoolError(f"spool file '{path}' is not UTF-8 text (bad byte at offset {exc.start}); "
                         "expected the JSON lines a kronos-mlflow run writes") from None
    lines = text.split("\n")
    complete_end = text.endswith("\n")
    if complete_end:
        lines = lines[:-1]
    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    ignored = 0
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)
        if not line.strip():
            continue
        try:
            if len(line) > _MAX_LINE:
                raise JsonFileError("too-large", "is too long")
            obj = parse_json(line)
        except JsonFileError:
            if last and not complete_end and header is not None:
                ignored = 1  # cut short by a crash while appending: everything before it is good
                continue
            raise SpoolError(f"spool file '{path}' line {number} is not a JSON object; "
                             "expected the JSON lines a kronos-mlflow run writes") from None
        if header is None:
            header = _check_header(obj, path)
            continue
        records.append(_check_record(obj, path, number))
    if header is None:
        raise SpoolError(f"spool file '{path}' is empty; expected a kronos-mlflow spool header line")
    return header, records, ignored


def _check_header(obj: Any, path: Path) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("type") != "header" or obj.get("format") != FORMAT:
        raise SpoolError(f"'{path}' is not a kronos-mlflow spool (line 1 is not its header)")
    if obj.get("version") != VERSION:
        raise SpoolError(f"spool file '{path}' has version {obj.get('version')!r}; this kronos-mlflow reads {VERSION}")
    run_id = obj.get("run_id")
    if not isinstance(run_id, str) or not run_id.strip() or len(run_id) > 256:
        raise SpoolError(f"spool file '{path}': the header has no run_id")
    if "owner_token" in obj and not is_token(obj["owner_token"]):
        raise SpoolError(f"spool file '{path}': the header's owner_token is not a run token (64 hex digits)")
    return obj


def _check_record(obj: Any, path: Path, number: int) -> dict[str, Any]:
    def bad(why: str) -> SpoolError:
        return SpoolError(f"spool file '{path}' line {number}: {why}")

    if not isinstance(obj, dict):
        raise bad("not a JSON object")
    kind = obj.get("type")
    if kind in ("param", "tag"):
        if not isinstance(obj.get("key"), str) or not isinstance(obj.get("value"), str):
            raise bad(f"a {kind} needs a string key and value")
        _check_key(obj["key"], kind, bad)
        if kind == "tag" and not spoolable_tag(obj["key"]):
            raise bad(f"tag '{obj['key'][:80]}' is not one a kronos-mlflow run spools: a spool never sets MLflow's own "
                      f"tags (mlflow.*: name, parent, note, status) or the run's owner ({OWNER_TAG})")
        limit = _MAX_PARAM_VALUE if kind == "param" else _MAX_TAG_VALUE
        if len(obj["value"]) > limit:
            raise bad(f"{kind} '{obj['key']}' has a value of {len(obj['value']):,} characters; expected at most "
                      f"{limit:,}")
    elif kind == "metric":
        value, step, ts = obj.get("value"), obj.get("step"), obj.get("timestamp")
        if not isinstance(obj.get("key"), str):
            raise bad("a metric needs a string key")
        _check_key(obj["key"], "metric", bad)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad(f"metric '{obj['key']}' has value {value!r}; expected a finite number")
        for name, v in (("step", step), ("timestamp", ts)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _INT64_MAX:
                raise bad(f"metric '{obj['key']}' has {name} {v!r}; expected an integer from 0 to {_INT64_MAX}")
    elif kind == "artifact":
        if not isinstance(obj.get("local_path"), str) or not (obj.get("artifact_path") is None
                                                              or isinstance(obj.get("artifact_path"), str)):
            raise bad("an artifact needs a local_path (and an optional artifact_path)")
        where = obj.get("artifact_path")
        if where is not None and (where.startswith("/") or ".." in where.split("/") or "\\" in where):
            raise bad(f"artifact_path '{where}' is not a folder inside the run's artifacts")
    elif kind == "terminate":
        if obj.get("status") not in TERMINAL_STATUSES:
            raise bad(f"status {obj.get('status')!r} is not one of {', '.join(TERMINAL_STATUSES)}")
        if not isinstance(obj.get("end_time"), int) or isinstance(obj.get("end_time"), bool):
            raise bad("terminate needs an integer end_time")
    elif kind == "header":
        raise bad("a second header (two spools concatenated?)")
    else:
        raise bad(f"unknown record type {kind!r}")
    return obj


# --------------------------------------------------------------------------------------------
# uploading


def _inside(path: Path, base: Path) -> bool:
    try:
        path.relative_to(base)
        return True
    except ValueError:
        return False


def _artifact_source(path: Path, rec: Mapping[str, Any], number: int) -> Path:
    """The local file (or folder) of an artifact record: a relative path inside the spool's own
    directory, which every file under it (symlinks resolved) stays inside too. A spool names
    only the copies its writer put next to it; anything else is refused, naming it."""
    base = path.parent.resolve()
    raw = str(rec["local_path"])
    local = Path(raw)
    refuse = (f"spool '{path}': artifact '{raw}' lies outside the spool's directory '{base}'; a spool uploads only "
              "the copies kept next to it (<run_id>.artifacts/): nothing was uploaded")
    if local.is_absolute() or ".." in local.parts or not raw.strip():
        raise SpoolError(refuse)
    target = (base / local).resolve()
    if not _inside(target, base) or target == base:
        raise SpoolError(refuse)
    if target.is_dir():
        for inner in target.rglob("*"):
            if not _inside(inner.resolve(), base):
                raise SpoolError(f"spool '{path}': artifact '{raw}' holds '{inner.relative_to(target)}', a link to "
                                 f"'{inner.resolve()}' outside the spool's directory: nothing was uploaded")
    return target


def _spool_run(path: Path, header: Mapping[str, Any], client):
    """The run a spool's header names, checked against the file's name and the header's experiment."""
    from mlflow.exceptions import MlflowException

    run_id = header["run_id"]
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else None
    if stem != run_id:
        raise SpoolError(f"spool file '{path}' is not named after the run in its header ({run_id}); a spool is "
                         f"<run_id>{SUFFIX}: rename it to {run_id}{SUFFIX} if that is the run it belongs to")
    experiment_id = header.get("experiment_id")
    if not isinstance(experiment_id, str) or not experiment_id.strip():
        raise SpoolError(f"spool file '{path}': the header names no experiment_id; expected the header a "
                         "kronos-mlflow run writes")
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise SpoolError(f"run {run_id} of spool '{path}' does not exist at this tracking server; "
                             "pass --tracking-uri of the server the run was logged to") from None
        raise
    if run.info.lifecycle_stage == "deleted":
        raise SpoolError(f"run {run_id} of spool '{path}' is deleted; restore it first (mlflow runs restore)")
    if run.info.experiment_id != experiment_id:
        raise SpoolError(f"spool '{path}' says run {run_id} is in experiment {experiment_id}, but that run is in "
                         f"experiment {run.info.experiment_id}; the spool was not written for this run: nothing "
                         "was uploaded")
    return run


def _artifacts_of(path: Path, records, client, run_id: str) -> list:
    """``(local file, artifact_path)`` of each artifact record, every one there (or already on the run)."""
    artifacts = []
    for number, rec in enumerate(records, start=2):
        if rec["type"] == "artifact":
            local = _artifact_source(path, rec, number)
            if not local.exists() and not _artifact_present(client, run_id, rec.get("artifact_path"), local.name):
                # checked now, so that an upload never stops halfway (its metrics sent, then refused)
                raise SpoolError(f"spool '{path}': artifact file '{local}' is missing and not on run {run_id}; restore "
                                 "it or delete that line: nothing was uploaded")
            artifacts.append((local, rec.get("artifact_path")))
    return artifacts


def _finished_unchanged(path: Path, run, client, params, tags, metrics, artifacts, status) -> list:
    """A FINISHED run takes nothing from a spool: one already uploaded (every value, tag and
    artifact there, its status FINISHED) is a no-op, anything else is refused. Returns the
    artifacts left to send (none)."""
    run_id = run.info.run_id
    changed = [f"{len(metrics)} metric values"] if metrics else []
    changed += [f"{len(params)} params"] if params else []
    if any(run.data.tags.get(key) != value for key, value in tags.items()):
        changed.append("tags")
    if any(not _artifact_present(client, run_id, where, local.name) for local, where in artifacts):
        changed.append("artifacts")
    if status not in (None, "FINISHED"):
        changed.append(f"status {status}")
    if changed:
        raise SpoolError(f"spool '{path}' names run {run_id}, which is FINISHED; a spool is uploaded only into a run that "
                         f"has not finished, and this one would add {', '.join(changed)}: nothing was uploaded")
    return []


def plan_upload(path: str | os.PathLike, client) -> dict[str, Any]:
    """Check a spool against its run and work out what uploading it would do; writes nothing.

    Refused (a :class:`SpoolError`, nothing sent): a file not named ``<run_id>.jsonl`` after its
    header's run, a header without the experiment id or naming another experiment than the
    run's, a run that does not exist or is deleted, an artifact outside the spool's directory, a
    run that is FINISHED (unless everything in the spool is already there: a second upload of
    the same spool changes nothing), a header whose ``owner_token`` the run does not carry (the run's tag
    ``kronos.owner`` is its hash: :mod:`kronos_mlflow.tracking.ownership`), a terminal status other than
    the one a run that already ended (KILLED, FAILED) has (a spool never changes how a run ended).
    Returns the plan :func:`apply_upload` carries out.
    """
    from mlflow.entities import Metric, Param, RunTag

    path = Path(path)
    header, records, ignored = read_spool(path)
    run_id = header["run_id"]
    run = _spool_run(path, header, client)
    artifacts = _artifacts_of(path, records, client, run_id)
    if not owns(run, header.get("owner_token")):
        why = "holds no run token" if "owner_token" not in header else "holds a token that run does not carry"
        raise SpoolError(f"spool '{path}' names run {run_id}, but its header {why} (tag {OWNER_TAG}); the spool was "
                         "not written by that run: nothing was uploaded")
    terminal = [rec for rec in records if rec["type"] == "terminate"]
    status = terminal[-1]["status"] if terminal else None
    ended = run.info.status in TERMINAL_STATUSES
    if status and ended and status != run.info.status:
        raise SpoolError(f"spool '{path}' would mark run {run_id} {status}, but it already ended {run.info.status}; a "
                         "spool never changes how a run ended: nothing was uploaded (delete the spool's "
                         "terminate line to upload the rest)")

    params = run.data.params
    new_params = []
    params_present = 0
    for rec in records:
        if rec["type"] != "param":
            continue
        if rec["key"] in params or any(p.key == rec["key"] for p in new_params):
            params_present += 1
            continue
        new_params.append(Param(rec["key"], rec["value"]))
    tags = {rec["key"]: rec["value"] for rec in records if rec["type"] == "tag"}

    metrics = [rec for rec in records if rec["type"] == "metric"]
    present: dict[str, set[int]] = {}
    for key in sorted({m["key"] for m in metrics}):
        present[key] = {int(m.step) for m in client.get_metric_history(run_id, key)}
    to_send = []
    seen: set[tuple[str, int]] = set()
    metrics_present = 0
    for rec in metrics:
        pair = (rec["key"], rec["step"])
        if rec["step"] in present.get(rec["key"], ()) or pair in seen:
            metrics_present += 1
            continue
        seen.add(pair)
        to_send.append(Metric(rec["key"], float(rec["value"]), rec["timestamp"], rec["step"]))
    if run.info.status == "FINISHED":
        artifacts, tags = _finished_unchanged(path, run, client, new_params, tags, to_send, artifacts, status), {}
    return {
        "path": path, "run_id": run_id, "experiment_id": run.info.experiment_id, "run_status": run.info.status,
        "params": new_params, "params_present": params_present, "tags": [RunTag(k, v) for k, v in tags.items()],
        "metrics": to_send, "metrics_present": metrics_present, "artifacts": artifacts,
        "status": status if status and not ended else None, "status_kept": status if status and ended else None,
        "end_time": terminal[-1]["end_time"] if terminal else None, "ignored_lines": ignored,
    }


def describe_plan(plan: Mapping[str, Any]) -> str:
    """What uploading will do, in one line."""
    if plan["status"]:
        status = f"end it {plan['status']}"
    elif plan["status_kept"]:
        status = f"keep its status {plan['status_kept']}"
    else:
        status = f"leave it {plan['run_status']}"
    names = ", ".join(str(a[0].name) for a in plan["artifacts"][:3]) + (", ..." if len(plan["artifacts"]) > 3 else "")
    artifacts = f"{len(plan['artifacts'])} artifacts" + (f" ({names})" if plan["artifacts"] else "")
    return (f"run {plan['run_id']} (experiment {plan['experiment_id']}, {plan['run_status']}): send "
            f"{len(plan['metrics'])} metric values ({plan['metrics_present']} already there), {len(plan['params'])} "
            f"params, {len(plan['tags'])} tags, {artifacts}; {status}")


def apply_upload(plan: Mapping[str, Any], client, *, finish: str = "rename") -> dict[str, Any]:
    """Carry out a :func:`plan_upload` plan; returns the counts :func:`upload_spool` documents."""
    run_id = plan["run_id"]
    params, tags, metrics = plan["params"], plan["tags"], plan["metrics"]
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start:start + 100])
    for start in range(0, len(tags), 100):
        client.log_batch(run_id, tags=tags[start:start + 100])
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start:start + 1000])
    counts: dict[str, Any] = {"run_id": run_id, "metrics": len(metrics), "metrics_present": plan["metrics_present"],
                              "params": len(params), "params_present": plan["params_present"], "tags": len(tags),
                              "artifacts": 0, "artifacts_present": 0, "status": plan["status"],
                              "status_kept": plan["status_kept"], "ignored_lines": plan["ignored_lines"]}
    for local, artifact_path in plan["artifacts"]:
        if local.is_dir():
            client.log_artifacts(run_id, str(local), artifact_path)
        elif local.is_file():
            client.log_artifact(run_id, str(local), artifact_path)
        elif _artifact_present(client, run_id, artifact_path, local.name):
            counts["artifacts_present"] += 1  # uploaded before, its copy since removed
            continue
        else:
            raise SpoolError(f"spool '{plan['path']}': artifact file '{local}' is missing; restore it or delete "
                             "that line")
        counts["artifacts"] += 1
    if plan["status"]:
        client.set_terminated(run_id, plan["status"], end_time=plan["end_time"])
    finish_spool(Path(plan["path"]), finish)
    return counts


def upload_spool(path: str | os.PathLike, client, *, finish: str = "rename") -> dict[str, Any]:
    """Replay one spool onto its run through ``client`` (an ``MlflowClient``); idempotent.

    Everything is checked first (:func:`plan_upload`): a spool that would touch another run,
    read a file outside its directory or change how an ended run ended is refused before
    anything is sent. ``finish``: ``rename`` (to ``.uploaded``), ``delete``, or ``keep``.
    Returns counts: ``metrics`` sent, ``metrics_present`` skipped, ``params``,
    ``params_present``, ``tags``, ``artifacts``, ``status`` (set, or None), ``status_kept`` (the
    ended run's status, which the spool agreed with), ``run_id``, ``ignored_lines``.
    """
    return apply_upload(plan_upload(path, client), client, finish=finish)


def _artifact_present(client, run_id: str, artifact_path: str | None, name: str) -> bool:
    try:
        listed = client.list_artifacts(run_id, artifact_path) if artifact_path else client.list_artifacts(run_id)
    except Exception:  # noqa: BLE001 - cannot tell: treat as missing
        return False
    want = f"{artifact_path.strip('/')}/{name}" if artifact_path else name
    return any(a.path == want for a in listed)


def finish_spool(path: Path, finish: str) -> None:
    """After an upload: rename the spool (and its artifact copies) or delete them."""
    extra = artifacts_dir(path)
    if finish == "keep":
        return
    if finish == "delete":
        path.unlink(missing_ok=True)
        shutil.rmtree(extra, ignore_errors=True)
        return
    target = path.with_name(path.name + UPLOADED_SUFFIX)
    os.replace(path, target)
    if extra.exists():
        shutil.rmtree(extra.with_name(extra.name + UPLOADED_SUFFIX), ignore_errors=True)
        os.replace(extra, extra.with_name(extra.name + UPLOADED_SUFFIX))


def find_spools(path: str | os.PathLike) -> list[Path]:
    """``path`` itself when it is a file, else the ``*.jsonl`` spools directly inside it."""
    path = Path(os.path.expanduser(os.fspath(path)))
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(SUFFIX))
    if path.exists():
        raise SpoolError(f"'{path}' is neither a spool file nor a directory of them")
    raise SpoolError(f"spool path '{path}' does not exist; pass a <run_id>.jsonl file or the directory holding them")
