"""Is the tracking server there? A short probe before a run starts, and the test that tells a
server outage (retry later) from a refused request (a real error)."""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..config.secrets import redact, redact_uri
from ..config.checks import sqlite_path, tracking_uri
from .protocol import one_line


# Limits of MLflow 3 (mlflow.utils.validation), used when MLflow does not say.
_DEFAULT_LIMITS = {
    "MAX_PARAM_VAL_LENGTH": 6000,
    "MAX_TAG_VAL_LENGTH": 8000,
    "MAX_PARAMS_TAGS_PER_BATCH": 100,
    "MAX_METRICS_PER_BATCH": 1000,
    "MAX_ENTITY_KEY_LENGTH": 250,
}


def mlflow_limits() -> dict[str, int]:
    """MLflow's size limits as they are now. Read at each use, never cached: importing
    ``qlib.workflow`` lowers ``MAX_PARAM_VAL_LENGTH`` to 1000 in the process."""
    from mlflow.utils import validation

    return {name: int(getattr(validation, name, default)) for name, default in _DEFAULT_LIMITS.items()}


def probe_tracking_server(uri: str, timeout: float) -> None:
    """Raise a one-line UserError when ``uri`` names no store (:func:`check_uri`) or an http(s)
    tracking server does not answer.

    MLflow's own client retries for minutes before giving up; one GET of ``/health`` with a
    short timeout tells the user at once. Any HTTP answer (even 401/404) counts as reachable,
    except 502/504: a proxy in between could not reach the server.
    """
    check_uri(uri)
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme.lower().split("+", 1)[0] in ("postgresql", "mysql", "mssql"):
        probe_database(uri, timeout)
        return
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
        redact(f"MLflow tracking server {redact_uri(uri)} is unreachable: {one_line(reason, 200)}; {hint}")
    )


def probe_database(uri: str, timeout: float) -> None:
    """One-line UserError when a database tracking store (PostgreSQL, MySQL, SQL Server) cannot
    be connected to, or its driver is missing: one connection attempt with a short timeout
    (MLflow's own store retries for minutes, then raises a traceback)."""
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    from_env = os.environ.get("MLFLOW_TRACKING_URI", "").strip() == uri.strip()
    hint = "start it or unset MLFLOW_TRACKING_URI" if from_env else "start it or use another tracking URI"
    try:
        import sqlalchemy

        args = {"connect_timeout": max(1, int(timeout))} if scheme.startswith(("postgresql", "mysql")) else {}
        engine = sqlalchemy.create_engine(uri, connect_args=args, poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except ImportError as exc:  # no driver for the scheme
        raise UserError(redact(f"MLflow tracking store {redact_uri(uri)} needs a database driver that is not installed "
                               f"({one_line(exc, 120)}); install it (postgresql: psycopg[binary]; mysql: mysqlclient "
                               "or PyMySQL with mysql+pymysql://)")) from None
    except Exception as exc:  # noqa: BLE001 - refused, unknown host, bad credentials, timeout
        reason = getattr(exc, "orig", None) or exc
        raise UserError(redact(f"MLflow tracking store {redact_uri(uri)} cannot be reached: {one_line(reason, 200)}; "
                               f"{hint}")) from None


def hide_uri_printing(uri: str) -> None:
    """MLflow's client writes "View run NAME at: <tracking URI>/#/..." to stdout when it ends a
    run on a tracking server, password included when the URI holds one (``user:pw@host``).
    Turn that off for this process when the URI holds a password (MLflow reads
    ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` on every call)."""
    if redact_uri(str(uri)) != str(uri):
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


def check_tracking_server(uri: str | None = None, timeout: float = 5.0, *, create: bool = True) -> None:
    """One-line UserError when the tracking URI (``uri`` or MLflow's current one) names no store
    (an unknown scheme, a sqlite file in a missing folder), or its server is down; with
    ``create``, a fresh sqlite store is created once (:func:`ensure_sqlite_store`)."""
    if uri is None:
        import mlflow

        uri = mlflow.get_tracking_uri()
    registry = os.environ.get("MLFLOW_REGISTRY_URI", "").strip()
    if registry:
        check_uri(registry, "MLFLOW_REGISTRY_URI", kind="MLflow model registry URI")
    probe_tracking_server(str(uri), timeout)
    if create:
        ensure_sqlite_store(str(uri))


def check_uri(uri: str, source: str | None = None, kind: str = "MLflow tracking URI") -> str:
    """:func:`kronos_mlflow.config.checks.tracking_uri`, ``source`` defaulting to MLFLOW_TRACKING_URI
    when the URI came from there."""
    if source is None:
        from_env = os.environ.get("MLFLOW_TRACKING_URI", "").strip() == str(uri).strip()
        source = "MLFLOW_TRACKING_URI" if from_env else "tracking URI"
    return tracking_uri(str(uri), source, kind=kind)


def sqlite_store_ready(db) -> bool:
    """The database holds MLflow's schema and its default experiment (what a store's first open
    writes last). Any error (missing, locked while another process migrates it) means not yet."""
    import sqlite3

    if not db.is_file() or db.stat().st_size == 0:
        return False
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            version = con.execute("SELECT version_num FROM alembic_version").fetchone()
            experiment = con.execute("SELECT experiment_id FROM experiments LIMIT 1").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return bool(version) and experiment is not None


def ensure_sqlite_store(uri: str) -> None:
    """Create a sqlite tracking store once, under a file lock beside the database
    (``<db>.lock``): processes started together on a fresh store (sweep workers, torchrun
    ranks) would otherwise race in MLflow's schema migration ("duplicate column name", "expected
    to match one row"). A store that is ready is not touched."""
    db = sqlite_path(str(uri))
    if db is None or sqlite_store_ready(db):
        return
    from ..data.provider import file_lock  # lazy: numpy

    with file_lock(db.with_name(db.name + ".lock")):
        if sqlite_store_ready(db):
            return  # another process made it while we waited
        from mlflow import MlflowClient

        MlflowClient(tracking_uri=str(uri)).search_experiments(max_results=1)



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


def resolve_tracking_uri(uri: str | None, *, flag: str | None = "--tracking-uri") -> str:
    """The URI to read, checked: an http(s) server must answer, a sqlite file or directory exist
    (a sqlite file holding MLflow's store). ``flag``: the command's flag for it (None: it has none).

    Without the check, MLflow would retry an unreachable server for minutes, and would quietly
    create an empty database where none was meant to be.
    """
    import mlflow

    where = f"pass {flag} or set MLFLOW_TRACKING_URI" if flag else "set MLFLOW_TRACKING_URI"
    given = (uri or "").strip()
    uri = str(given or mlflow.get_tracking_uri())
    check_uri(uri, "--tracking-uri" if given else None)
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        check_tracking_server(uri, timeout=5.0)
    elif scheme.startswith("sqlite"):
        path = uri.split(":///", 1)[1] if ":///" in uri else ""
        path = path.split("?", 1)[0]
        if path and path != ":memory:" and not os.path.isfile(path):
            raise UserError(
                f"no MLflow database at {path} (tracking URI {redact_uri(uri)}); {where} to the database or server "
                "your runs were logged to"
            )
        if path and path != ":memory:" and not sqlite_store_ready(Path(path)):  # MLflow would add its tables
            raise UserError(
                f"{path} holds no MLflow store (tracking URI {redact_uri(uri)}); {where} to the database or server "
                "your runs were logged to"
            )
    elif scheme in ("", "file"):
        path = urllib.parse.urlsplit(uri).path if scheme == "file" else uri
        if not os.path.isdir(path):
            raise UserError(
                f"no MLflow run directory at {path}; {where} to where your runs were logged"
            )
    return uri
