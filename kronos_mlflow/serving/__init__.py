"""The logged MLflow models and their pyfuncs: the tokenizer's, the forecaster's, and how a run logs them.
May import ``tracking``, ``data``, ``model``, ``config``, ``runtime`` (docs/code-map.md)."""
