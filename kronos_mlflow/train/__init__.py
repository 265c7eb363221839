"""``python -m kronos_mlflow.train``: the tokenizer's training entry point, as torchrun and the MLproject run it.
Imports only :mod:`kronos_mlflow.training.run`, whose seed contract (``main``, ``train_model``) stays importable here."""

from ..training.run import cli, main, train_model

__all__ = ["cli", "main", "train_model"]
