"""``python -m kronos_mlflow.launch``: torchrun, with the training's own errors kept to one line.

It takes torchrun's arguments unchanged (the MLproject runs it in place of ``torchrun``) and
parses the training flags before any worker starts: docs/configuration.md#flags. With
``--check-first`` (the MLproject's ``main``) it runs the training's whole ``--check`` on those
flags first, in this process, so a command names each flag once.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Sequence

from ..config import checks
from ..config.argparsing import OneLineParser
from ..errors import UserError
from ..runtime.stopping import TrainingStopped, alive, keep_killed_status, mlflow_run_pid
from ..tracking.project_run import exit_in_one_line, record_failure
from ..training import run as training
from ..training.run import MAX_RESTARTS, add_arguments
from .commands import COMMANDS, KEEP_KILLED, PREDICTOR_MODULE, TRAIN_MODULE

TRAIN_MODULES = {TRAIN_MODULE: None, PREDICTOR_MODULE: "predictor"}  # module -> its --stage
CHECK_NAMES = {TRAIN_MODULE: "kronos-mlflow train", PREDICTOR_MODULE: "kronos-mlflow train-predictor"}
QUIET_EXIT_CODES = {2, 128 + 2, 128 + 15}  # usage error, stopped by SIGINT / SIGTERM


CHECK_FIRST = "--check-first"  # the launcher's own option: the training's --check, here, before any worker


def split_check_first(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """(whether :data:`CHECK_FIRST` was given among the launcher's options, before ``-m``; the
    arguments without it: torchrun's, unchanged)."""
    argv = list(argv)
    end = argv.index("-m") if "-m" in argv else len(argv)
    return CHECK_FIRST in argv[:end], [a for a in argv[:end] if a != CHECK_FIRST] + argv[end:]


def check_training(argv: Sequence[str]) -> tuple[int, list[str]]:
    """The training's ``--check`` (config, data, checkpoints, tracking store: one line and exit
    code 2 on bad input) on the flags after ``-m kronos_mlflow.train`` (or ``.train_predictor``),
    parsed once, here, with the messages of ``python -m kronos_mlflow.train --check``. Returns its
    exit code and torchrun's arguments: those given, plus ``--nproc_per_node`` and
    ``--max-restarts`` from the checked training flags where the launcher was not given them (so
    the MLproject names each parameter once)."""
    argv = list(argv)
    module = next((m for m in TRAIN_MODULES if m in argv), None)
    if module is None:
        return 0, argv
    stage = TRAIN_MODULES[module]
    parser = OneLineParser(prog=f"python -m {module}")
    parser.on_error = record_failure
    training.add_arguments(parser, stage)
    args = parser.parse_args(argv[argv.index(module) + 1:])
    checked: dict = {}

    def work() -> int:
        try:
            checked["config"] = config = training.config_of(args)
            training.check(config)
        except KeyboardInterrupt:  # as the training command's own check: a stop, one line
            raise TrainingStopped(signal.SIGINT) from None
        return 0

    code = exit_in_one_line(CHECK_NAMES[module], work)
    if code:
        return code, argv
    start = argv.index("-m")
    extra = []
    if _launcher_value(argv, "--nproc-per-node", "--nproc_per_node") is None:
        extra += ["--nproc_per_node", str(checked["config"]["nproc_per_node"])]
    if _launcher_value(argv, "--max-restarts", "--max_restarts") is None and args._max_restarts is not None:
        extra += ["--max-restarts", str(args._max_restarts)]
    return 0, argv[:start] + extra + argv[start:]


def check_train_flags(argv: Sequence[str]) -> None:
    """Parse the flags after ``-m kronos_mlflow.train`` (or ``.train_predictor``) as the workers
    will (exit 2 on a bad one)."""
    argv = list(argv)
    module = next((m for m in TRAIN_MODULES if m in argv), None)
    if module is None:
        return

    parser = OneLineParser(prog=f"python -m {module}")
    parser.on_error = record_failure
    add_arguments(parser, TRAIN_MODULES[module])
    parser.parse_args(argv[argv.index(module) + 1:])


def _launcher_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of a launcher option (``--name V`` or ``--name=V``) before the training module."""
    end = argv.index("-m") if "-m" in argv else len(argv)
    for i, arg in enumerate(argv[:end]):
        for name in names:
            if arg == name and i + 1 < end:
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def check_launcher_flags(argv: Sequence[str]) -> None:
    """torchrun's own numbers, checked as the training checks its flags (one line, exit 2,
    recorded on the ``mlflow run`` run) instead of torchrun's usage text."""
    parser = OneLineParser(prog="python -m kronos_mlflow.launch")
    parser.on_error = record_failure
    restarts = _launcher_value(argv, "--max-restarts", "--max_restarts")
    nproc = _launcher_value(argv, "--nproc-per-node", "--nproc_per_node")
    try:
        if restarts is not None:
            checks.integer("--max-restarts", restarts, 0, MAX_RESTARTS)
        if nproc is not None and nproc not in ("auto", "cpu", "gpu", "xpu"):
            checks.integer("--nproc-per-node", nproc, 1, 256)
    except UserError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Check torchrun's numbers and the training flags (an unknown flag: one line, exit code 2,
    recorded on the ``mlflow run`` run as its ``failure_reason``), then run torchrun in this process.
    A stop (SIGTERM, Ctrl-C) is forwarded to every worker, as torchrun does; each ends its run KILLED,
    rank 0 prints one line, and the launcher exits ``128 + signal`` without torchrun's traceback. A
    worker that exits with a usage error (2) or after a stop signal has already printed its line;
    other failures keep torchrun's report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [KEEP_KILLED]:
        return keep_killed(argv[1], int(argv[2]))
    from ..stages import build_registry  # lazy: the stages and their plugins, not for keep_killed

    build_registry()  # before the training flags' config is checked
    check_first, argv = split_check_first(argv)
    if check_first:  # the MLproject's main: every flag named once, checked here, then handed to the workers
        code, argv = check_training(argv)
        if code:
            return code
    check_launcher_flags(argv)
    if not check_first:  # the check above parsed them
        check_train_flags(argv)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    # torchrun's warnings about shutting workers down on a signal: the workers say it themselves.
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("torch.distributed") and isinstance(logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)  # a failed worker: the report below (or its own line)
    launcher_of_launcher = mlflow_run_pid()
    try:
        torchrun(argv)
    except SignalException as exc:
        keep_killed_status(launcher_of_launcher, COMMANDS.keep_killed)
        return 128 + int(exc.sigval)
    except KeyboardInterrupt:
        keep_killed_status(launcher_of_launcher, COMMANDS.keep_killed)
        return 130
    except ChildFailedError as exc:
        _, failure = exc.get_first_failure()
        if failure.exitcode in QUIET_EXIT_CODES:
            if failure.exitcode != 2:
                keep_killed_status(launcher_of_launcher, COMMANDS.keep_killed)
            return int(failure.exitcode)
        raise
    return 0


def keep_killed(run_id: str, pid: int, wait_s: float = 60.0) -> int:
    """The helper: once ``mlflow run`` has exited (bounded wait), a run it marked FAILED that
    holds our ``stop_reason`` (and no ``failure_reason``) is KILLED again."""
    deadline = time.monotonic() + wait_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        from mlflow import MlflowClient

        client = MlflowClient()
        run = client.get_run(run_id)
        tags = run.data.tags
        if run.info.status == "FAILED" and "stop_reason" in tags and "failure_reason" not in tags:
            client.set_terminated(run_id, "KILLED", end_time=run.info.end_time)
    except Exception:  # noqa: BLE001 - best effort: the stop_reason tag is on the run either way
        return 1
    return 0

