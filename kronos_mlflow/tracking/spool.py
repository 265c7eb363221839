"""The MLflow spool: what a run could not send while its tracking server was down.

When the tracking server is still unreachable at the end of a run (after a bounded wait),
:class:`~kronos_mlflow.tracking.mlflow.MLflowLogger` writes everything it has not sent to one JSON-lines
file per run, ``{save_dir}/mlflow-spool/<run_id>.jsonl`` (or ``$KRONOS_MLFLOW_HOME/spool/``
when the logger has no save directory), and prints the command that uploads it::

    kronos-mlflow upload-spool outputs/models/finetune_tokenizer_demo/mlflow-spool
    kronos-mlflow upload-spool run.jsonl --tracking-uri http://mlflow.example:5000

Uploading is idempotent: metric ``(key, step)`` pairs already on the run are skipped, params
already there are kept, tags are set, artifacts are uploaded again (same content), and the run
gets its terminal status and end time. A spool that was uploaded is renamed
``<run_id>.jsonl.uploaded`` (``--delete`` removes it instead) so that running the command twice
changes nothing. Credentials are never written: params are scrubbed and tags redacted before
they reach the spool, the tracking URI is stored without its password, and uploading uses the
``MLFLOW_TRACKING_*`` environment as any MLflow client does.

File format: the first line is a header ``{"type": "header", "format": "kronos-mlflow-spool",
"version": 1, "run_id": ..., "experiment_id": ..., "tracking_uri": ...}``; then one record a
line: ``param`` (key, value), ``tag`` (key, value), ``metric`` (key, value, step, timestamp in
ms), ``artifact`` (local_path relative to the spool's directory, artifact_path) and at most one
``terminate`` (status FINISHED | FAILED | KILLED, end_time in ms). A last line cut short by a
crash is ignored; any other malformed line is a one-line error naming the file and line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import UserError

FORMAT = "kronos-mlflow-spool"
VERSION = 1
SUFFIX = ".jsonl"
UPLOADED_SUFFIX = ".uploaded"
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
_MAX_LINE = 1 << 20  # a record is small; a megabyte-long line is not ours


class SpoolError(UserError):
    """A spool file cannot be read or uploaded."""


def default_spool_dir() -> Path:
    """``$KRONOS_MLFLOW_SPOOL_DIR``, else ``$KRONOS_MLFLOW_HOME/spool`` (``~/.cache/kronos_mlflow/spool``)."""
    explicit = os.environ.get("KRONOS_MLFLOW_SPOOL_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("KRONOS_MLFLOW_HOME") or "~/.cache/kronos_mlflow"
    return Path(home).expanduser() / "spool"


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
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpoolError(f"spool file '{path}' does not exist") from None
    except IsADirectoryError:
        raise SpoolError(f"spool file '{path}' is a directory") from None
    except OSError as exc:
        raise SpoolError(f"spool file '{path}' cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
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
                raise ValueError("line too long")
            obj = json.loads(line)
        except (ValueError, RecursionError):
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
    elif kind == "metric":
        value, step, ts = obj.get("value"), obj.get("step"), obj.get("timestamp")
        if not isinstance(obj.get("key"), str):
            raise bad("a metric needs a string key")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad(f"metric '{obj['key']}' has value {value!r}; expected a finite number")
        for name, v in (("step", step), ("timestamp", ts)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise bad(f"metric '{obj['key']}' has {name} {v!r}; expected an integer >= 0")
    elif kind == "artifact":
        if not isinstance(obj.get("local_path"), str) or not (obj.get("artifact_path") is None
                                                              or isinstance(obj.get("artifact_path"), str)):
            raise bad("an artifact needs a local_path (and an optional artifact_path)")
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


def upload_spool(path: str | os.PathLike, client, *, finish: str = "rename") -> dict[str, Any]:
    """Replay one spool onto its run through ``client`` (an ``MlflowClient``); idempotent.

    ``finish``: ``rename`` (to ``.uploaded``), ``delete``, or ``keep``. Returns counts:
    ``metrics`` sent, ``metrics_present`` skipped, ``params``, ``params_present``, ``tags``,
    ``artifacts``, ``status`` (or None), ``run_id``, ``ignored_lines``.
    """
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException

    path = Path(path)
    header, records, ignored = read_spool(path)
    run_id = header["run_id"]
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise SpoolError(f"run {run_id} of spool '{path}' does not exist at this tracking server; "
                             "pass --tracking-uri of the server the run was logged to") from None
        raise
    if run.info.lifecycle_stage == "deleted":
        raise SpoolError(f"run {run_id} of spool '{path}' is deleted; restore it first (mlflow runs restore)")

    counts: dict[str, Any] = {"run_id": run_id, "metrics": 0, "metrics_present": 0, "params": 0,
                              "params_present": 0, "tags": 0, "artifacts": 0, "artifacts_present": 0, "status": None,
                              "ignored_lines": ignored}
    params = run.data.params
    new_params = []
    for rec in records:
        if rec["type"] != "param":
            continue
        if rec["key"] in params or any(p.key == rec["key"] for p in new_params):
            counts["params_present"] += 1
            continue
        new_params.append(Param(rec["key"], rec["value"]))
    tags = {rec["key"]: rec["value"] for rec in records if rec["type"] == "tag"}

    metrics = [rec for rec in records if rec["type"] == "metric"]
    present: dict[str, set[int]] = {}
    for key in sorted({m["key"] for m in metrics}):
        present[key] = {int(m.step) for m in client.get_metric_history(run_id, key)}
    to_send = []
    seen: set[tuple[str, int]] = set()
    for rec in metrics:
        pair = (rec["key"], rec["step"])
        if rec["step"] in present.get(rec["key"], ()) or pair in seen:
            counts["metrics_present"] += 1
            continue
        seen.add(pair)
        to_send.append(Metric(rec["key"], float(rec["value"]), rec["timestamp"], rec["step"]))

    for start in range(0, len(new_params), 100):
        client.log_batch(run_id, params=new_params[start:start + 100])
    counts["params"] = len(new_params)
    tag_items = [RunTag(k, v) for k, v in tags.items()]
    for start in range(0, len(tag_items), 100):
        client.log_batch(run_id, tags=tag_items[start:start + 100])
    counts["tags"] = len(tag_items)
    for start in range(0, len(to_send), 1000):
        client.log_batch(run_id, metrics=to_send[start:start + 1000])
    counts["metrics"] = len(to_send)

    base = path.parent
    for rec in records:
        if rec["type"] != "artifact":
            continue
        local = Path(rec["local_path"])
        local = local if local.is_absolute() else base / local
        if local.is_dir():
            client.log_artifacts(run_id, str(local), rec.get("artifact_path"))
        elif local.is_file():
            client.log_artifact(run_id, str(local), rec.get("artifact_path"))
        elif _artifact_present(client, run_id, rec.get("artifact_path"), local.name):
            counts["artifacts_present"] += 1  # uploaded before, its copy since removed
            continue
        else:
            raise SpoolError(f"spool '{path}': artifact file '{local}' is missing; restore it or delete that line")
        counts["artifacts"] += 1

    terminal = [rec for rec in records if rec["type"] == "terminate"]
    if terminal:
        last = terminal[-1]
        client.set_terminated(run_id, last["status"], end_time=last["end_time"])
        counts["status"] = last["status"]

    finish_spool(path, finish)
    return counts


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


# --------------------------------------------------------------------------------------------
# command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", default=None, metavar="PATH",
                        help="a spool file (<run_id>.jsonl) or a directory of them "
                             "(default: $KRONOS_MLFLOW_HOME/spool)")
    parser.add_argument("--tracking-uri", default=None, metavar="URI",
                        help="tracking server to upload to (default: MLFLOW_TRACKING_URI, else the URI the "
                             "spool recorded)")
    parser.add_argument("--delete", action="store_true", help="delete each spool once uploaded (default: rename "
                                                              "it to .uploaded)")


def _resolve_uri(cli_uri: str | None, header: Mapping[str, Any]) -> str:
    if cli_uri and cli_uri.strip():
        return cli_uri.strip()
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        return env
    recorded = str(header.get("tracking_uri") or "")
    if recorded and "***" not in recorded:
        return recorded
    import mlflow

    return mlflow.get_tracking_uri()


def run(args: argparse.Namespace) -> int:
    from mlflow import MlflowClient

    from .server import hide_uri_printing, probe_tracking_server
    from ..secrets import install_secret_filter, redact, redact_uri

    install_secret_filter()
    if args.path is None and not default_spool_dir().exists():
        print(f"kronos-mlflow upload-spool: no spool files in '{default_spool_dir()}'")
        return 0
    files = find_spools(args.path or default_spool_dir())
    if not files:
        print(f"kronos-mlflow upload-spool: no spool files in '{args.path or default_spool_dir()}'")
        return 0
    clients: dict[str, Any] = {}
    for path in files:
        header, _records, _ = read_spool(path)  # a bad file fails before anything is sent
        uri = _resolve_uri(args.tracking_uri, header)
        if uri not in clients:
            hide_uri_printing(uri)
            probe_tracking_server(uri, 10.0)
            clients[uri] = MlflowClient(tracking_uri=uri)
        try:
            counts = upload_spool(path, clients[uri], finish="delete" if args.delete else "rename")
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - the server went away, refused a value...: one line
            raise SpoolError(redact(f"uploading '{path}' to {redact_uri(uri)} failed ({type(exc).__name__}: "
                                    f"{' '.join(str(exc).split())[:300]}); nothing is lost: run the command again"))
        done = "deleted" if args.delete else f"renamed to {path.name}{UPLOADED_SUFFIX}"
        status = f", status {counts['status']}" if counts["status"] else ""
        print(f"kronos-mlflow upload-spool: run {counts['run_id']}: {counts['metrics']} metric values sent "
              f"({counts['metrics_present']} already there), {counts['params']} params, {counts['tags']} tags, "
              f"{counts['artifacts']} artifacts{status}; spool {done}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - `kronos-mlflow upload-spool` is the entry
    from ..cli import main as cli_main

    return cli_main(["upload-spool", *(sys.argv[1:] if argv is None else argv)])
