"""Fine-tune the Kronos predictor (stage two) on a frozen tokenizer: the torchrun entry point.

The training command (:mod:`kronos_mlflow.training.run`) with ``--stage predictor``: the same
flags, checks, tracking, resume and stop handling; docs/predictor-training.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..training import run as train

STAGE = "predictor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``kronos-mlflow train-predictor``: the training flags, ``--stage`` defaulting to predictor."""
    train.add_arguments(parser, STAGE)


run = train.run


def cli(argv: Sequence[str] | None = None) -> int:
    """``python -m kronos_mlflow.train_predictor``: the stage registry built, then the training command."""
    from ..stages import build_registry  # lazy: kronos-mlflow train-predictor --help stays light

    build_registry()
    return train.cli(argv, prog="python -m kronos_mlflow.train_predictor", name="kronos-mlflow train-predictor",
                     stage=STAGE)

