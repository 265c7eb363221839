"""Run many short command-line cases in one pre-imported interpreter, one ``fork`` each.

A command such as ``kronos-mlflow train --check ...`` spends seconds importing torch, MLflow,
pandas and Qlib before it looks at its first flag. This script imports them once, then for
every case forks a child that is, to the code under test, the same process the user's command
starts: its own working directory and environment, stdout and stderr on files, ``sys.argv`` as
the console script sets it, the entry-point function the script calls (``kronos_mlflow.cli.main:main``
for ``kronos-mlflow``, ``kronos_mlflow.train:cli`` for ``python -m kronos_mlflow.train``,
``kronos_mlflow.cli.sweep:main`` for ``sweeps/sweep.py``), an uncaught exception printed by
``sys.excepthook`` with exit code 1 as the interpreter does, and the ``atexit`` handlers run at the
end. It runs in a clean interpreter (not inside pytest), so logging, warnings filters and signal
handlers are an ordinary process's.

    python tests/forkrunner.py REQUESTS.json [PARALLEL]
    python tests/forkrunner.py --serve        # one request a line on stdin, one reply a line on stdout

``REQUESTS.json`` holds a list of ``{"id", "entry": "module:function", "argv": [argv0, ...],
"cwd", "env": {...}, "stdout": path, "stderr": path, "timeout": seconds}``; one JSON line
``{"id", "rc", "seconds"}`` per case goes to stdout as each child ends (rc 124 when it ran past
its timeout and was killed). The parent never runs a case itself.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))


def _preimport() -> None:
    """What the commands under test import anyway, loaded once before any fork (no computation:
    no thread pool or store is started in the parent)."""
    sys.path.insert(0, ROOT)
    import mlflow  # noqa: F401 - before comet_ml, always
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import numpy  # noqa: F401
    import optuna  # noqa: F401
    import pandas  # noqa: F401
    import qlib  # noqa: F401
    import qlib.data  # noqa: F401
    import safetensors.torch  # noqa: F401
    import sqlalchemy  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - what a meta-device normal_ imports (every checkpoint load's shape check)
    import yaml  # noqa: F401

    for name in ("kronos_mlflow.cli.main", "kronos_mlflow.train", "kronos_mlflow.data.prepare",
                 "kronos_mlflow.data.csv_import", "kronos_mlflow.data.demo", "kronos_mlflow.cli.compare",
                 "kronos_mlflow.workflows.sweep.driver", "kronos_mlflow.tracking", "kronos_mlflow.tracking.spool",
                 "kronos_mlflow.tracking.spool_command",
                 "kronos_mlflow.model", "kronos_mlflow.launch", "kronos_mlflow.workflows.pipeline", "kronos_mlflow.training.preflight",
                 "kronos_mlflow.cli.evaluate", "kronos_mlflow.evaluation.scorecard",
                 "kronos_mlflow.evaluation.backtest", "kronos_mlflow.stages.predictor.sources"):
        importlib.import_module(name)
    importlib.import_module("kronos_mlflow.stages").build_registry()  # as each command builds it


_REGISTRIES: list[dict] = []  # the ``__warningregistry__`` of every module loaded before the forks


def _note_registries() -> None:
    """Find the warning registries once, in the parent (looking through thousands of modules
    in every child would cost each case about 30 ms), and freeze what the parent built so the
    children's garbage collector does not copy it page by page."""
    import gc

    _REGISTRIES[:] = [r for m in list(sys.modules.values())
                      if isinstance(r := getattr(m, "__warningregistry__", None), dict)]
    gc.freeze()


def _child(req: dict) -> None:
    """In the forked child: become the user's process for ``req`` and exit with its code."""
    import atexit
    import warnings

    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # A fresh process has shown no warning yet ("default" shows each one once per place). The
        # parent runs no case, so only the registries it held at the fork can be filled.
        for registry in _REGISTRIES:
            registry.clear()
        warnings._filters_mutated()  # noqa: SLF001 - invalidates the per-module caches too
        sys.argv = list(req["argv"])
        module_name, _, func_name = req["entry"].partition(":")
        if module_name not in sys.modules and TESTS not in sys.path:
            sys.path.insert(0, TESTS)
        func = getattr(importlib.import_module(module_name), func_name)
        try:
            result = func()
            code = 0 if result is None else int(result)
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:  # sys.exit("message"): printed to stderr, exit code 1
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            sys.excepthook(*sys.exc_info())
            code = 1
        try:
            atexit._run_exitfuncs()  # noqa: SLF001 - the interpreter runs them at exit too
        except BaseException:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """Exit code of child ``pid``, killed once past ``timeout`` seconds (then rc 124)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 124, True
        time.sleep(0.005)


def serve() -> int:
    """For a test session (tests/commands.py): each line of stdin is one request, run in a fresh
    fork as soon as it arrives; its ``{"id", "rc", "seconds"}`` line goes to stdout when it ends."""
    _preimport()
    _note_registries()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(req)  # never returns
        rc, timed_out = _wait(pid, float(req.get("timeout", 300)))
        print(json.dumps({"id": req["id"], "rc": rc, "timed_out": timed_out,
                          "seconds": round(time.monotonic() - started, 3)}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["--serve"]:
        return serve()
    requests = json.loads(open(argv[1], encoding="utf-8").read())
    parallel = int(argv[2]) if len(argv) > 2 else 2
    _preimport()
    _note_registries()
    running: dict[int, tuple[dict, float]] = {}
    pending = list(requests)

    def reap_one() -> None:
        """Wait for one child to end (killing any past its timeout) and report it."""
        while True:
            now = time.monotonic()
            for pid, (req, started) in list(running.items()):
                if not req.get("_timed_out") and now - started > float(req.get("timeout", 300)):
                    req["_timed_out"] = True
                    os.kill(pid, signal.SIGKILL)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid in running:
                req, started = running.pop(pid)
                rc = 124 if req.get("_timed_out") else os.waitstatus_to_exitcode(status)
                print(json.dumps({"id": req["id"], "rc": rc, "seconds": round(time.monotonic() - started, 3)}),
                      flush=True)
                return
            if pid == 0:
                time.sleep(0.01)

    while pending or running:
        while pending and len(running) < parallel:
            req = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(req)  # never returns
            running[pid] = (req, time.monotonic())
        reap_one()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))


def misbehave_for_test() -> int:
    """A case that breaks the promise on purpose (tests/test_hostile_input.py's self-check):
    prints, writes a file where it runs, then raises."""
    print("about to raise")
    with open("written-by-the-case.txt", "w") as fh:
        fh.write("a case must never write here\n")
    raise RuntimeError("deliberately raised")
