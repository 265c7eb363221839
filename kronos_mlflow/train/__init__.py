"""``python -m kronos_mlflow.train``: the tokenizer's training entry point, as torchrun and the MLproject run it.
Imports :mod:`kronos_mlflow.training.run`, whose seed contract (``main``, ``train_model``) stays importable here,
and builds the stage registry when imported, as every command does before it loads a config."""

from ..stages import build_registry
from ..training.run import cli, main, train_model

build_registry()

__all__ = ["cli", "main", "train_model"]
