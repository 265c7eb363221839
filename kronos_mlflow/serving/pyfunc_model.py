"""MLflow "model from code" entry: MLflow runs this file to build the pyfunc (no pickle)."""

import mlflow

from kronos_mlflow.serving.tokenizer_model import KronosTokenizerPyfunc

mlflow.models.set_model(KronosTokenizerPyfunc())
