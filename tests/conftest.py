"""Shared test set-up: keep every library off the network and every write inside tmp dirs."""

from __future__ import annotations

import os

# Set before any test module imports mlflow or comet_ml.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
os.environ.setdefault("COMET_ERROR_TRACKING_ENABLE", "false")
os.environ.setdefault("COMET_AUTO_LOG_ENV_DETAILS", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
