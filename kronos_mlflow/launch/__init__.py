"""``python -m kronos_mlflow.launch``: torchrun with one-line errors, as the MLproject runs it.
Its ``__main__`` imports only :mod:`kronos_mlflow.cli.launch`, where the launcher lives."""
