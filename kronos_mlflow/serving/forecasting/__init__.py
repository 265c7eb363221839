"""The predictor run's MLflow model, a forecaster: the tokenizer and the best predictor
checkpoint in one pyfunc that turns raw lookback windows and their timestamps into sample paths.

- ``pyfunc``: the computation (:func:`load_forecaster`, :func:`forecast`, usable without MLflow)
  and the pyfunc class that ``forecaster_model.py`` builds "from code";
- how it is logged on a run: :func:`kronos_mlflow.serving.model_logging.log_forecaster`.

What it takes and returns, and serving it: docs/serving.md ("The predictor's forecaster").
"""

from .pyfunc import (
    COLUMNS,
    PARAM_NAMES,
    PREDICTOR_ARTIFACT,
    SAMPLING_DEFAULTS,
    TOKENIZER_ARTIFACT,
    forecast,
    forecast_inputs,
    load_forecaster,
    sampling_params,
)

__all__ = ["COLUMNS", "PARAM_NAMES", "PREDICTOR_ARTIFACT", "SAMPLING_DEFAULTS", "TOKENIZER_ARTIFACT", "forecast",
           "forecast_inputs", "load_forecaster", "sampling_params"]
