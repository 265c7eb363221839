"""Real servers for tests: ``mlflow server`` on 127.0.0.1 and a throwaway PostgreSQL, plus
``wait_until`` (polling with a deadline, never a fixed sleep).

``tests/conftest.py`` wraps these in fixtures (``mlflow_server``, ``postgres``); tests that need
another scope or backend use the class and context manager directly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from tiny_runs import TRACKING_ENV

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process_group(proc: subprocess.Popen) -> None:
    """Stop a server started with ``start_new_session=True``: SIGTERM, then SIGKILL of its whole
    process group (uvicorn's and gunicorn's workers live there), then reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=5)


def serve_on_free_port(argv_for: Callable[[int], list[str]], ready_path: str, log_dir: Path, name: str,
                       env: Mapping[str, str] | None = None, timeout: float = 180) -> tuple[subprocess.Popen, str]:
    """Start a local HTTP server (``argv_for(port)`` on a free port, its own process group) and
    wait until ``GET ready_path`` answers 200; returns the process and its base URL. Another try on
    a new port when something took the port meanwhile; pytest.fail with the log's tail otherwise."""
    import pytest

    for attempt in range(3):
        port = free_port()
        log_path = Path(log_dir) / f"{name}-{attempt}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv_for(port), cwd=log_dir, env=None if env is None else dict(env), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}{ready_path}", timeout=2) as resp:
                    if resp.status == 200:
                        return proc, base
            except OSError:
                pass
            time.sleep(0.5)
        stop_process_group(proc)
        text = log_path.read_text(errors="replace")
        if "address already in use" not in text.lower():
            pytest.fail(f"{name} did not answer {ready_path}:\n{text[-3000:]}")
    pytest.fail(f"{name} found no free port in three tries")


def post_json(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    """POST ``body`` as JSON; (status, the JSON answer), error statuses included."""
    import json
    import urllib.error

    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_until(check: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy (returned); AssertionError naming ``what``
    once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def returns_within(seconds: float, fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` in a thread; its result (or its exception), or AssertionError when
    it has not returned by the deadline. For "does not hang / does not retry for minutes"
    checks: a deadline far above the expected time, never a timing."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"{getattr(fn, '__qualname__', fn)} did not return within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class MlflowServer:
    """``mlflow server`` (one worker, proxied artifacts under ``root``) on a free 127.0.0.1 port.

    The backend is a sqlite file under ``root`` unless ``backend`` names another store. ``stop()``
    then ``start()`` keep the port and the store (an outage and a restart). Also a context manager.
    """

    def __init__(self, root: Path, backend: str | None = None, env: Mapping[str, str] | None = None):
        self.root = Path(root)
        self.backend = backend or f"sqlite:///{self.root / 'mlflow.db'}"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.log_path = self.root / "server-0.log"
        self._env = env

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _launch(self) -> None:
        env = dict(self._env if self._env is not None else os.environ)
        for name in TRACKING_ENV:
            env.pop(name, None)
        # no job runner: its Huey consumer processes (one Python each) serve MLflow's GenAI jobs, which
        # these servers never run
        env.update({"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        self.log_path = self.root / f"server-{self.starts}.log"
        self.starts += 1
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend,
                 "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
                 "--port", str(self.port), "--workers", "1"],
                cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _healthy(self) -> bool:
        # Only our own server counts: another process may have taken the port since free_port().
        if f"Uvicorn running on {self.url}" not in self.log_path.read_text(errors="replace"):
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def start(self, timeout: float = 120.0) -> float:
        """Start and wait for /health; seconds it took. On the first start a server that exits at
        once (the port was taken meanwhile) is tried again on another port, three times at most."""
        first = self.starts == 0
        self.root.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        for attempt in range(3 if first else 1):
            if attempt:
                self.port = free_port()
            self._launch()
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None:
                if self._healthy():
                    return time.monotonic() - began
                if time.monotonic() > deadline:
                    tail = self.log_path.read_text(errors="replace")[-3000:]
                    self.stop()
                    raise AssertionError(f"mlflow server not healthy in {timeout:g} s:\n{tail}")
                time.sleep(0.2)
            self.stop()
        raise AssertionError(f"mlflow server exited at start (rc {self.proc.returncode}):\n"
                             f"{self.log_path.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        """SIGTERM the server's process group (server, uvicorn, job runner), SIGKILL what is left,
        reap it, and wait for the port to close."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:  # children still in the group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)
        wait_until(lambda: port_closed(self.port), 10, f"port {self.port} to close")

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def postgres_available() -> bool:
    return bool(os.environ.get("KRONOS_TEST_POSTGRES_URL")) or bool(
        list(Path("/usr/lib/postgresql").glob("*/bin/initdb")))


@contextmanager
def postgres_server(base: Path) -> Iterator[str]:
    """A PostgreSQL server URL: ``KRONOS_TEST_POSTGRES_URL`` (what .ci/run started), else a
    throwaway cluster under ``base`` from scripts/pg_throwaway.sh, stopped on exit."""
    url = os.environ.get("KRONOS_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    script = ROOT / "scripts" / "pg_throwaway.sh"
    out = subprocess.run([str(script), "start", str(base / "cluster"), str(free_port())], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    try:
        yield out.stdout.strip()
    finally:
        subprocess.run([str(script), "stop", str(base / "cluster")], timeout=60)


def create_database(server_url: str) -> str:
    """A new, empty database on that server; its URL."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + f"/{name}"
