"""Fine-tune the Kronos predictor (stage two) on a frozen tokenizer: the torchrun entry point.

One process (CPU or one GPU), on the demo market, from a tokenizer run::

    python -m kronos_mlflow.train_predictor --tokenizer runs:/<run id>/best_model --epochs 3

Several processes (NCCL on GPUs, gloo on CPUs), from the published pair::

    torchrun --standalone --nproc_per_node 2 -m kronos_mlflow.train_predictor \\
        --tokenizer NeoQuasar/Kronos-Tokenizer-base --pretrained-predictor-path NeoQuasar/Kronos-small

Through MLflow Projects: ``mlflow run . -e predictor -P tokenizer=runs:/<run id>/best_model``.

The same flags, checks, tracking, resume and stop handling as ``kronos_mlflow.train`` (every
config key is a flag), with ``--stage predictor``: ``--learning-rate`` is
``predictor_learning_rate`` (upstream's 4e-5 by default), ``--tokenizer`` the frozen tokenizer
(``finetuned_tokenizer_path``), runs go under ``predictor_save_folder_name``
(``finetune_predictor_demo``). See docs/predictor-training.md.
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
    return train.cli(argv, prog="python -m kronos_mlflow.train_predictor", name="kronos-mlflow train-predictor",
                     stage=STAGE)

