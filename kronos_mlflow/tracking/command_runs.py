"""The MLflow runs a command started (a sweep's, a pipeline's, a walk-forward's parent and child runs),
and how a stop ends them all KILLED: :func:`started` records them, :func:`run_child` runs a child
process with the stop signals sent on to it, :func:`end_stopped` ends what is still RUNNING
(docs/configuration.md#stopping).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from ..runtime import stopping

_runs: list[str] = []  # this process's runs, in the order it started (or continued) them


def started(run_id: str) -> str:
    """Record ``run_id`` as a run this command started or continued; returns it."""
    if run_id and run_id not in _runs:
        _runs.append(run_id)
    return run_id


def install() -> None:
    """Handle SIGTERM and SIGINT in this command from now on (:func:`kronos_mlflow.runtime.stopping.install`)."""
    stopping.install()


def run_child(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``command`` with ``env`` to its end; its exit code. A stop signal that arrives
    meanwhile goes on to it, the wait goes on until it has exited (it ends its own run), and
    :class:`~kronos_mlflow.runtime.stopping.TrainingStopped` is raised then."""
    env = {**env, stopping.REPORTED_BY_PARENT: "1"}
    try:
        with stopping.deferred():  # never a child started and not told of a stop
            proc = subprocess.Popen(list(command), env=env)
    except stopping.TrainingStopped:
        pass  # it came while the child started: forwarding_to sends it on
    with stopping.forwarding_to(proc):
        proc.wait()
    if stopping.received() is not None:
        raise stopping.TrainingStopped(stopping.received())
    return proc.returncode


def signal_of(exc: BaseException) -> int:
    """The signal a stop stands for (Ctrl-C when it is a bare KeyboardInterrupt)."""
    return exc.signum if isinstance(exc, stopping.TrainingStopped) else int(signal.SIGINT)


def end_killed(client, signum: int, command: str) -> int:
    """End every run this command started that is still RUNNING (or SCHEDULED) KILLED, with
    a ``stop_reason``; returns how many of its runs are KILLED now (a finished step's stays
    FINISHED). Best effort per run: one that cannot be read or written is left as it is."""
    reason = (f"{command}: stopped by {signal.Signals(signum).name}; the same command again continues where it "
              "stopped")
    killed = 0
    for run_id in _runs:
        try:
            run = client.get_run(run_id)
            if run.info.status in ("RUNNING", "SCHEDULED"):
                if "stop_reason" not in run.data.tags:
                    client.set_tag(run_id, "stop_reason", reason)
                client.set_terminated(run_id, "KILLED")
            killed += client.get_run(run_id).info.status == "KILLED"
        except Exception:  # noqa: BLE001, S112 - the other runs are still ended
            continue
    return killed


def end_stopped(client, command: str, exc: BaseException, keep_killed: Callable[[str, int], Sequence[str]]) -> int:
    """After a stop: :func:`end_killed`, the command's one line on stderr, the exit code
    (``128 + signal``). ``keep_killed``: the command line of the helper that keeps a run handed
    over by ``mlflow run`` KILLED (:func:`kronos_mlflow.runtime.stopping.keep_killed_status`)."""
    signum = signal_of(exc)
    count = end_killed(client, signum, command)
    if os.environ.get("MLFLOW_RUN_ID", "").strip() in _runs:  # handed over by `mlflow run`: it stays KILLED
        stopping.keep_killed_status(stopping.mlflow_run_pid(), keep_killed)
    print(f"{command}: stopped by {signal.Signals(signum).name}; every run it left unfinished ended KILLED ({count}); "
          "the same command again continues where it stopped", file=sys.stderr, flush=True)
    return stopping.exit_code(signum)
