"""The user's short commands, each in a process of its own, without paying the imports each time.

``kronos-mlflow ...`` (or ``python -m kronos_mlflow ...``), ``python -m kronos_mlflow.train ...`` and
``python sweeps/sweep.py ...`` spend seconds importing torch, MLflow, pandas and Qlib before they
read a flag. Tests that only check how such a command answers (its exit code, its one line on
stderr, what it left on disk) run it through one interpreter that imported those once
(``tests/forkrunner.py --serve``) and forks a child per command: to the code under test the child
is the process the user's command starts (its own cwd, environment, ``sys.argv`` as the script
sets it, stdout and stderr on files, the entry-point function the script calls, uncaught
exceptions printed as the interpreter prints them). tests/test_hostile_input.py checks that the
two ways agree on real processes (tests/test_compare.py for ``python -m kronos_mlflow``).
``tests/conftest.py`` has the session fixture ``commands``.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = str(ROOT / "kronos_mlflow" / "train" / "__main__.py")  # sys.argv[0] of `python -m kronos_mlflow.train`
PREDICTOR_SCRIPT = str(ROOT / "kronos_mlflow" / "train_predictor" / "__main__.py")
LAUNCH_SCRIPT = str(ROOT / "kronos_mlflow" / "launch" / "__main__.py")  # the MLproject main's launcher
CONSOLE_SCRIPT = str(Path(sys.executable).with_name("kronos-mlflow"))
PACKAGE_MAIN = str(ROOT / "kronos_mlflow" / "__main__.py")  # sys.argv[0] of `python -m kronos_mlflow`
SWEEP_SCRIPT = str(ROOT / "sweeps" / "sweep.py")


def entry_of(argv: list[str]) -> tuple[str, list[str]]:
    """The entry-point function a command runs and the ``sys.argv`` its script sees."""
    if argv[:3] == [sys.executable, "-m", "kronos_mlflow.train"]:
        return "kronos_mlflow.training.run:cli", [TRAIN_SCRIPT, *argv[3:]]
    if argv[:3] == [sys.executable, "-m", "kronos_mlflow.train_predictor"]:
        return "kronos_mlflow.cli.train_predictor:cli", [PREDICTOR_SCRIPT, *argv[3:]]
    if argv[:3] == [sys.executable, "-m", "kronos_mlflow.launch"]:
        return "kronos_mlflow.cli.launch:main", [LAUNCH_SCRIPT, *argv[3:]]
    if argv[:3] == [sys.executable, "-m", "kronos_mlflow"]:  # kronos_mlflow/__main__.py calls the console script's main
        return "kronos_mlflow.cli.main:main", [PACKAGE_MAIN, *argv[3:]]
    if argv[0] == "kronos-mlflow":
        return "kronos_mlflow.cli.main:main", [CONSOLE_SCRIPT, *argv[1:]]
    if argv[:2] == [sys.executable, SWEEP_SCRIPT]:
        return "kronos_mlflow.cli.sweep:main", argv[1:]
    if argv[0] == "<self-check>":
        return "forkrunner:misbehave_for_test", ["misbehave", *argv[1:]]
    raise AssertionError(f"no entry point for {argv[:3]}")


class Commands:
    """``run(argv, cwd=..., env=...)`` -> a ``subprocess.CompletedProcess`` (text stdout and
    stderr), as ``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)`` gives
    for the same command. ``env`` defaults to this process's environment at the call."""

    def __init__(self, scratch: Path):
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def _server(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_RUN", "MLFLOW_EXPERIMENT"))}
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            self._proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "forkrunner.py"), "--serve"],
                                          cwd=self.scratch, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True, bufsize=1)
        return self._proc

    def run(self, argv: list[str], *, cwd: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        entry, script_argv = entry_of([str(a) for a in argv])
        with self._lock:
            n = next(self._ids)
            out = Path(tempfile.mkdtemp(prefix=f"cmd{n}-", dir=self.scratch))
            request = {"id": n, "entry": entry, "argv": script_argv, "cwd": str(Path(cwd or os.getcwd()).resolve()),
                       "env": dict(os.environ if env is None else env), "stdout": str(out / "stdout"),
                       "stderr": str(out / "stderr"), "timeout": timeout}
            server = self._server()
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            line = server.stdout.readline()
        if not line:
            raise AssertionError(f"the fork server ended (code {server.wait()}) running {argv}")
        reply = json.loads(line)
        assert reply["id"] == n, (reply, n)
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(list(argv), timeout)
        return subprocess.CompletedProcess(list(argv), reply["rc"], (out / "stdout").read_text(errors="replace"),
                                           (out / "stderr").read_text(errors="replace"))

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
