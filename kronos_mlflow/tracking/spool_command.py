"""``kronos-mlflow upload-spool``: every spool checked against its run
(:func:`kronos_mlflow.tracking.spool.plan_upload`) before anything is sent, then uploaded."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from ..config.secrets import install_secret_filter, redact, redact_uri
from ..config.checks import sqlite_path
from .server import check_uri, hide_uri_printing, probe_tracking_server
from .spool import (UPLOADED_SUFFIX, SpoolError, apply_upload, default_spool_dir, describe_plan, find_spools,
                    plan_upload, read_spool)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", default=None, metavar="PATH",
                        help="a spool file (<run_id>.jsonl) or a directory of them "
                             "(default: $KRONOS_MLFLOW_HOME/spool)")
    parser.add_argument("--tracking-uri", default=None, metavar="URI",
                        help="tracking server to upload to (default: MLFLOW_TRACKING_URI, else the URI the "
                             "spool recorded)")
    parser.add_argument("--delete", action="store_true", help="delete each spool once uploaded (default: rename "
                                                              "it to .uploaded)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check each spool against its run and say in one line what uploading would do; "
                             "change nothing")


def resolve_uri(cli_uri: str | None, header: Mapping[str, Any]) -> str:
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

    install_secret_filter()
    if args.path is None and not default_spool_dir().exists():
        print(f"kronos-mlflow upload-spool: no spool files in '{default_spool_dir()}'")
        return 0
    files = find_spools(args.path or default_spool_dir())
    if not files:
        print(f"kronos-mlflow upload-spool: no spool files in '{args.path or default_spool_dir()}'")
        return 0
    clients: dict[str, Any] = {}
    plans = []
    for path in files:  # every spool checked against its run before anything is sent
        header, _records, _ = read_spool(path)
        uri = resolve_uri(args.tracking_uri, header)
        if uri not in clients:
            hide_uri_printing(uri)
            check_uri(uri, "--tracking-uri" if (args.tracking_uri or "").strip() else None)
            probe_tracking_server(uri, 10.0)
            db = sqlite_path(uri)
            if db is not None and not db.is_file():
                raise SpoolError(f"no MLflow database at {db} (tracking URI {redact_uri(uri)}); pass --tracking-uri "
                                 "of the store the run was logged to")
            clients[uri] = MlflowClient(tracking_uri=uri)
        try:
            plans.append((path, uri, plan_upload(path, clients[uri])))
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - the server went away, refused a request...: one line
            raise SpoolError(redact(f"reading run {header['run_id']} of '{path}' from {redact_uri(uri)} failed "
                                    f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"))
    for path, uri, plan in plans:
        prefix = "would" if args.dry_run else "will"
        print(f"kronos-mlflow upload-spool: {path.name}: {prefix} {describe_plan(plan)}", flush=True)
        if args.dry_run:
            continue
        try:
            counts = apply_upload(plan, clients[uri], finish="delete" if args.delete else "rename")
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - the server went away, refused a value...: one line
            raise SpoolError(redact(f"uploading '{path}' to {redact_uri(uri)} failed ({type(exc).__name__}: "
                                    f"{' '.join(str(exc).split())[:300]}); nothing is lost: run the command again"))
        done = "deleted" if args.delete else f"renamed to {path.name}{UPLOADED_SUFFIX}"
        status = f", status {counts['status']}" if counts["status"] else ""
        if counts["status_kept"]:
            status = f", status {counts['status_kept']} kept"
        print(f"kronos-mlflow upload-spool: run {counts['run_id']}: {counts['metrics']} metric values sent "
              f"({counts['metrics_present']} already there), {counts['params']} params, {counts['tags']} tags, "
              f"{counts['artifacts']} artifacts{status}; spool {done}", flush=True)
    return 0
