"""The project's own command lines, built where the commands live and handed down to what starts them.

A pipeline's steps and a sweep's trials start the training (``python -m kronos_mlflow.train``, or
:mod:`kronos_mlflow.launch` for several processes) and the scorecard (``python -m kronos_mlflow
evaluate``) as child processes, and a stopped command under ``mlflow run`` starts the launcher's
keep-killed helper. The layers below the commands (workflows, tracking, runtime) do not know these
names: the command layer hands them :data:`COMMANDS` (``args.commands`` for a subcommand's run,
a parameter elsewhere), and they call its methods.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

TRAIN_MODULE = "kronos_mlflow.train"
PREDICTOR_MODULE = "kronos_mlflow.train_predictor"
LAUNCH_MODULE = "kronos_mlflow.launch"
PACKAGE = "kronos_mlflow"  # python -m kronos_mlflow COMMAND: the console script's commands
#: ``python -m kronos_mlflow.launch --keep-killed-after RUN_ID PID``: the helper of
#: :func:`kronos_mlflow.runtime.stopping.keep_killed_status`.
KEEP_KILLED = "--keep-killed-after"
#: torchrun restarts of a child whose worker died: it resumes from its last epoch (as MLproject main does)
CHILD_MAX_RESTARTS = 3


@dataclass(frozen=True)
class CommandLines:
    """The argv of each command this project starts as a child process (``python``: this interpreter)."""

    python: str = sys.executable

    def train(self, nproc: int, flags: Sequence[str], module: str = TRAIN_MODULE) -> list[str]:
        """The training process of a child run: one process, or torchrun for ``nproc`` of them
        (through :mod:`kronos_mlflow.launch`: a stop sent on to it ends its workers' run in one
        line, without torchrun's traceback)."""
        if nproc > 1:
            return [self.python, "-m", LAUNCH_MODULE, "--standalone", f"--nproc_per_node={nproc}",
                    f"--max-restarts={CHILD_MAX_RESTARTS}", "-m", module, *flags]
        return [self.python, "-m", module, *flags]

    def evaluate(self, model: str, flags: Sequence[str]) -> list[str]:
        """``python -m kronos_mlflow evaluate --model MODEL FLAGS``: the scorecard of a logged forecaster."""
        return [self.python, "-m", PACKAGE, "evaluate", "--model", model, *flags]

    def keep_killed(self, run_id: str, pid: int) -> list[str]:
        """The launcher's helper that puts KILLED back on ``run_id`` once ``mlflow run`` (``pid``) has exited."""
        return [self.python, "-m", LAUNCH_MODULE, KEEP_KILLED, run_id, str(pid)]


COMMANDS = CommandLines()
