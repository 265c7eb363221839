"""The best checkpoint as an MLflow Model on the run, and the data as the run's input.

MLflow's model logging has no client-only form (``mlflow.pyfunc.log_model`` logs to the active
run), so :func:`log_best_model` opens the logger's run in the fluent API for the duration of the
call and restores the process's tracking URI afterwards.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import mlflow_model
from ..mlflow_model import CHECKPOINT_ARTIFACT, MODEL_NAME, tokenize_windows

# mlflow, torch and the data layer are imported inside the functions (only rank 0 at the end needs them).


def _pip_requirements() -> list[str]:
    from importlib.metadata import version

    reqs = []
    for dist in ("mlflow", "torch", "safetensors", "numpy", "pandas", "huggingface_hub"):
        try:
            reqs.append(f"{dist}=={version(dist).split('+')[0]}")
        except Exception:  # noqa: BLE001 - absent optional package
            reqs.append(dist)
    return reqs


def example_windows(config: Mapping[str, Any], n: int = 2) -> np.ndarray:
    """Raw validation windows for the signature and input example (synthetic if none)."""
    from ..data import QlibDataset

    window = config["lookback_window"] + config["predict_window"] + 1
    for split in ("val", "train"):
        try:
            ds = QlibDataset(split, config)
        except Exception:  # noqa: BLE001 - fall back to the next split
            continue
        if len(ds) and hasattr(ds, "raw_windows"):
            return np.asarray(ds.raw_windows(list(range(min(n, len(ds))))), dtype=np.float32)
    rng = np.random.default_rng(0)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.01, size=(n, window)), axis=1))
    vol = rng.uniform(1e5, 1e6, size=(n, window))
    o, h, lo = close * 0.999, close * 1.01, close * 0.99
    amt = (o + h + lo + close) / 4 * vol
    return np.stack([o, h, lo, close, vol, amt], axis=-1).astype(np.float32)


@contextlib.contextmanager
def _tracking_uri(uri: str):
    """MLflow's fluent API on ``uri`` for a moment, then the process's previous setting back
    (``set_tracking_uri`` is process-wide and also writes ``MLFLOW_TRACKING_URI``)."""
    import mlflow

    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env


def log_best_model(mlflow_logger, checkpoint_dir: str, config: Mapping[str, Any], step: int = 0):
    """Log ``checkpoint_dir`` as the MLflow Model ``best_model`` on ``mlflow_logger``'s run
    (an :class:`~kronos_mlflow.tracking.mlflow.MLflowLogger`); register it when the config
    names a registered model. Returns the ``ModelInfo``. The model is reloaded and its
    prediction compared with the in-memory computation before anything is registered.
    """
    import mlflow
    from mlflow.models import infer_signature

    from ..model import KronosTokenizer

    x = example_windows(config)
    model = KronosTokenizer.from_pretrained(checkpoint_dir).eval()
    expected = tokenize_windows(model, x, config["lookback_window"], config["clip"])
    signature = infer_signature(x, expected)
    package_dir = os.path.dirname(os.path.abspath(mlflow_model.__file__))
    code_file = os.path.join(package_dir, "pyfunc_model.py")
    with _tracking_uri(mlflow_logger.tracking_uri), mlflow.start_run(run_id=mlflow_logger.run_id), \
            warnings.catch_warnings():
        # The signature is given explicitly; MLflow's advice to add type hints does not apply.
        warnings.filterwarnings("ignore", message=".*type hint.*")
        info = mlflow.pyfunc.log_model(
            name=MODEL_NAME,
            python_model=code_file,
            artifacts={CHECKPOINT_ARTIFACT: checkpoint_dir},
            code_paths=[package_dir],
            model_config={"lookback_window": int(config["lookback_window"]), "clip": float(config["clip"])},
            signature=signature,
            input_example=x,
            pip_requirements=_pip_requirements(),
            metadata={"freq": str(config.get("freq", "day")), "instrument": str(config["instrument"])},
            step=int(step),
        )
    with _tracking_uri(mlflow_logger.tracking_uri):
        loaded = mlflow.pyfunc.load_model(info.model_uri)
    got = loaded.predict(x)
    if not np.array_equal(got["tokens"], expected["tokens"]) or not np.allclose(
        got["reconstruction"], expected["reconstruction"], rtol=1e-5, atol=1e-5
    ):
        raise RuntimeError("the logged MLflow model does not reproduce the checkpoint's outputs")
    mlflow_logger.set_tags({"best_model_uri": info.model_uri})
    name = config.get("registered_model_name")
    if name:
        with _tracking_uri(mlflow_logger.tracking_uri):
            version = mlflow.register_model(info.model_uri, name)
        mlflow_logger.set_tags({"registered_model": f"{name}/{version.version}"})
        info.registered_version = version.version  # type: ignore[attr-defined]
    return info


def log_dataset_input(client, run_id: str, config: Mapping[str, Any], digest: str) -> None:
    """Record the Qlib data as the run's training input: path, instrument, ranges, digest."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    from ..config import format_time_range
    from ..data import resolve_qlib_path

    path = str(resolve_qlib_path(config))
    with warnings.catch_warnings():
        # Two registered sources both read local paths; either is right.
        warnings.filterwarnings("ignore", message=".*interpreted in multiple ways.*")
        source = resolve_dataset_source(path)
    name = f"qlib-{config['instrument']}" + ("-demo" if not config["qlib_data_path"] else "")
    if config.get("freq", "day") != "day":
        name += f"-{config['freq']}"
    dataset = MetaDataset(source=source, name=name, digest=digest[:32])
    tags = [
        InputTag(key="mlflow.data.context", value="training"),
        InputTag(key="instrument", value=str(config["instrument"])),
        InputTag(key="freq", value=str(config.get("freq", "day"))),
        InputTag(key="membership_gaps", value=str(config.get("membership_gaps", "split"))),
        InputTag(key="train_time_range", value=format_time_range(config["train_time_range"])),
        InputTag(key="val_time_range", value=format_time_range(config["val_time_range"])),
        InputTag(key="test_time_range", value=format_time_range(config["test_time_range"])),
    ]
    entry = DatasetInput(dataset=dataset._to_mlflow_entity(), tags=tags)
    # Runs that start together (sweep workers) race to create the same dataset row; the loser
    # gets a unique-constraint error, and once the row exists a retry links it.
    for attempt in range(3):
        try:
            client.log_inputs(run_id, datasets=[entry])
            return
        except Exception as exc:  # noqa: BLE001 - store-specific errors
            if attempt == 2:
                warnings.warn(f"the dataset could not be recorded as the run's input ({str(exc).splitlines()[0]}); "
                              "training continues", stacklevel=2)
                return
            time.sleep(0.5 * (attempt + 1))
