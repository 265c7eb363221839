"""``python -m kronos_mlflow.train_predictor``: the predictor's training entry point, as torchrun and the MLproject run it.
Its ``__main__`` imports only :mod:`kronos_mlflow.cli.train_predictor`, where the command lives."""
