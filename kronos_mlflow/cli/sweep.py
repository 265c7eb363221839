"""``python sweeps/sweep.py`` (the MLproject's ``sweep``): the stage registry built, then the sweep
(:mod:`kronos_mlflow.workflows.sweep.driver`) with the command lines of its trials' processes."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from ..stages import build_registry  # lazy: the stages and their plugins, before the driver and its config

    build_registry()
    from ..workflows.sweep.driver import main as sweep  # lazy: optuna, mlflow, after the registry
    from .commands import COMMANDS

    return sweep(argv, commands=COMMANDS)
