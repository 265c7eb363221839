"""MLflow "model from code" entry: MLflow runs this file to build the pyfunc (no pickle)."""

import mlflow

from kronos_mlflow.mlflow_model import KronosTokenizerPyfunc

mlflow.models.set_model(KronosTokenizerPyfunc())
