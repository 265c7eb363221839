"""MLflow "model from code" entry of the forecaster: MLflow runs this file to build the pyfunc
(no pickle); see :mod:`kronos_mlflow.serving.forecasting.pyfunc`."""

import mlflow

from kronos_mlflow.serving.forecasting.pyfunc import KronosForecasterPyfunc

mlflow.models.set_model(KronosForecasterPyfunc())
