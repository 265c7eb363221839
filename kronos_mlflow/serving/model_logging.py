"""The best checkpoint as an MLflow Model on the run, and the data as the run's input: the tokenizer
stage's model (:func:`log_best_model`, a tokenizing pyfunc) and the predictor stage's forecaster
(:func:`log_forecaster`), each an MLflow 3 Logged Model linked to the run at the best epoch with that
epoch's metrics (docs/run-records.md#params-metrics-tags-and-artifacts, docs/serving.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config.core import format_time_range, run_params
from ..config.sections import as_section
from ..data import resolve_qlib_path
from .forecasting import PREDICTOR_ARTIFACT, SAMPLING_DEFAULTS, TOKENIZER_ARTIFACT, forecast, load_forecaster
from .forecasting.pyfunc import CALIBRATOR_ARTIFACT, CALIBRATOR_FILE, SERVING_DEFAULTS, read_calibrator
from .forecasting import ensemble as served_ensemble, head as served_head
from .forecasting.quantiles import MIN_CALIBRATED_LOOKBACK, QLEVELS
from ..runtime.fsutil import write_atomic
from ..tracking.keys import BEST_METRIC, PREDICTOR_VAL_METRIC, TOKENIZER_VAL_METRIC
from .tokenizer_model import CHECKPOINT_ARTIFACT, MODEL_NAME, tokenize_windows

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
    return _example_windows(config, n, with_times=False)[0]


def _example_windows(config: Mapping[str, Any], n: int, with_times: bool = True
                     ) -> tuple[np.ndarray, list[list[str]] | None]:
    """``n`` raw windows of the validation split (else the training split), float32
    ``(n, lookback + predict + 1, 6)``, and (``with_times``) their bars' timestamps (ISO text);
    synthetic windows and None where the config's data has no windows."""
    from ..data import QlibDataset  # lazy: torch

    data = as_section(config, "data")
    window = data.lookback_window + data.predict_window + 1
    for split in ("val", "train"):
        try:
            ds = QlibDataset(split, config)
        except Exception:  # noqa: BLE001 - fall back to the next split
            continue
        if len(ds) and hasattr(ds, "raw_windows"):
            picked = list(range(min(n, len(ds))))
            times = [ds.window_times(i) for i in picked] if with_times else None
            return np.asarray(ds.raw_windows(picked), dtype=np.float32), times
    rng = np.random.default_rng(0)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.01, size=(n, window)), axis=1))
    vol = rng.uniform(1e5, 1e6, size=(n, window))
    o, h, lo = close * 0.999, close * 1.01, close * 0.99
    amt = (o + h + lo + close) / 4 * vol
    return np.stack([o, h, lo, close, vol, amt], axis=-1).astype(np.float32), None


def example_forecast_input(config: Mapping[str, Any], n: int = 2) -> dict[str, np.ndarray]:
    """The forecaster's input example: ``bars`` ``(n, lookback_window, 6)`` of real windows of
    the config's data and ``timestamps`` ``(n, lookback_window + predict_window)``, their bars'
    times in seconds since the epoch (UTC); a business-day calendar from 2024-01-02 for
    synthetic windows."""
    import pandas as pd

    bars, times = _example_windows(config, n)
    data = as_section(config, "data")
    lookback, total = int(data.lookback_window), int(data.lookback_window) + int(data.predict_window)
    if times is None:
        times = [pd.bdate_range("2024-01-02", periods=total)] * len(bars)
    epoch, second = pd.Timestamp("1970-01-01"), pd.Timedelta(seconds=1)
    stamps = np.stack([(pd.DatetimeIndex(pd.to_datetime(list(t)[:total])) - epoch) // second for t in times])
    return {"bars": bars[:, :lookback], "timestamps": stamps.astype(np.int64)}


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


def model_signature(x: np.ndarray, expected: Mapping[str, np.ndarray]):
    """The pyfunc's signature: windows of any batch and length in, ``(-1, -1, -1)`` (the
    feature axis is checked by ``predict`` itself, in one short line), and the outputs with
    free batch and time axes."""
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types.schema import Schema, TensorSpec

    inferred = infer_signature(x, dict(expected))

    def free(spec):
        return TensorSpec(spec.type, (-1, -1, *spec.shape[2:]), spec.name)

    inputs = [TensorSpec(s.type, (-1,) * len(s.shape), s.name) for s in inferred.inputs.inputs]
    return ModelSignature(inputs=Schema(inputs),
                          outputs=Schema([free(s) for s in inferred.outputs.inputs]))


@dataclass(frozen=True)
class _ModelFiles:
    """What ``mlflow.pyfunc.log_model`` writes for one of the package's pyfuncs: the "from code"
    file (a module of this package, shipped with it in ``code/``), its artifact directories,
    ``model_config``, signature, input example and metadata."""

    code_file: str
    artifacts: Mapping[str, str]
    model_config: Mapping[str, Any]
    signature: Any
    input_example: Any
    metadata: Mapping[str, str]


def _metadata(data: Any) -> dict[str, str]:
    """The model's metadata: the data section's ``freq`` and ``instrument`` (or the whole config's)."""
    data = as_section(data, "data")
    return {"freq": str(data.freq), "instrument": str(data.instrument)}


def _publish_model(mlflow_logger, files: _ModelFiles, tracking: Any, step: int,
                   metrics: Mapping[str, float] | None, heldout_metrics: Mapping[str, float] | None,
                   heldout_dataset: tuple[str, str] | None, reproduces: Callable[[Any], bool]):
    """Log ``files`` as the Logged Model ``best_model`` of the run (an MLflow 3 Logged Model created
    for the run, ``source_run_id``, and written by ``mlflow.pyfunc.log_model`` outside any active
    run, which would attach to the model every run metric that happens to share its step: per-step
    training losses and per-epoch metrics share step numbers), an output of the run at ``step`` with
    ``metrics`` and ``heldout_metrics`` (linked to ``heldout_dataset``) on the model; reload it
    and require ``reproduces(loaded_pyfunc)``; then tag the run ``best_model_uri`` and, when the
    ``tracking`` section (or the whole config) names a registered model, register it (tag
    ``registered_model``). Returns the ``ModelInfo``."""
    import mlflow

    info = _log_logged_model(mlflow_logger, files, int(step))
    linked = _model_metrics(mlflow_logger, metrics or {}, int(step), info.model_id)
    linked += _model_metrics(mlflow_logger, heldout_metrics or {}, int(step), info.model_id, heldout_dataset)
    if linked:
        mlflow_logger.client.log_batch(mlflow_logger.run_id, metrics=linked)
    with _tracking_uri(mlflow_logger.tracking_uri):
        loaded = mlflow.pyfunc.load_model(info.model_uri)
    if not reproduces(loaded):
        raise RuntimeError("the logged MLflow model does not reproduce the checkpoint's outputs")
    mlflow_logger.set_tags({"best_model_uri": info.model_uri})
    name = as_section(tracking, "tracking").registered_model_name
    if name:
        with _tracking_uri(mlflow_logger.tracking_uri):
            version = mlflow.register_model(info.model_uri, name)
        mlflow_logger.set_tags({"registered_model": f"{name}/{version.version}"})
        info.registered_version = version.version  # type: ignore[attr-defined]
    return info


def _log_logged_model(mlflow_logger, files: _ModelFiles, step: int):
    """The Logged Model of the run, written and linked as the run's output at ``step``."""
    import mlflow
    from mlflow.entities import LoggedModelOutput

    serving_dir = os.path.dirname(os.path.abspath(__file__))
    package_dir = os.path.dirname(serving_dir)
    with _tracking_uri(mlflow_logger.tracking_uri):
        logged = mlflow.initialize_logged_model(name=MODEL_NAME, source_run_id=mlflow_logger.run_id,
                                                experiment_id=mlflow_logger.experiment_id)
        info = mlflow.pyfunc.log_model(
            name=MODEL_NAME,
            python_model=os.path.join(serving_dir, files.code_file),
            artifacts=dict(files.artifacts),
            code_paths=[package_dir],
            model_config=dict(files.model_config),
            signature=files.signature,
            input_example=files.input_example,
            pip_requirements=_pip_requirements(),
            metadata=dict(files.metadata),
            model_id=logged.model_id,
        )
    mlflow_logger.client.log_outputs(mlflow_logger.run_id, [LoggedModelOutput(logged.model_id, step=step)])
    return info


def log_best_model(mlflow_logger, checkpoint_dir: str, config: Mapping[str, Any], step: int = 0,
                   metrics: Mapping[str, float] | None = None, heldout_metrics: Mapping[str, float] | None = None,
                   heldout_dataset: tuple[str, str] | None = None):
    """Log ``checkpoint_dir`` as the MLflow Model ``best_model`` of ``mlflow_logger``'s run
    (an :class:`~kronos_mlflow.tracking.mlflow.MLflowLogger`), an output of the run at ``step``
    (the best epoch) carrying ``metrics`` (the best epoch's validation metrics) and
    ``heldout_metrics`` (the test verdict's), the latter linked to ``heldout_dataset`` (name,
    digest); register it when the config names a registered model. Returns the ``ModelInfo``.
    The model is reloaded and its prediction compared with the in-memory computation before
    anything is registered.
    """
    from ..model import KronosTokenizer  # lazy: torch

    data = as_section(config, "data")
    x = example_windows(config)
    model = KronosTokenizer.from_pretrained(checkpoint_dir).eval()
    expected = tokenize_windows(model, x, data.lookback_window, data.clip)
    files = _ModelFiles(
        "pyfunc_model.py", {CHECKPOINT_ARTIFACT: checkpoint_dir},
        {"lookback_window": int(data.lookback_window), "clip": float(data.clip)},
        model_signature(x, expected), x, _metadata(data))

    def reproduces(loaded) -> bool:
        got = loaded.predict(x)
        return np.array_equal(got["tokens"], expected["tokens"]) and np.allclose(
            got["reconstruction"], expected["reconstruction"], rtol=1e-5, atol=1e-5)

    return _publish_model(mlflow_logger, files, as_section(config, "tracking"), step, metrics, heldout_metrics,
                          heldout_dataset, reproduces)


def forecaster_signature(pred_len: int, forecaster: str = "calibrated", head: bool = False):
    """The forecaster's signature: its outputs (``paths``, ``mean``, and the close's
    ``quantiles``, ``quantile_levels``, ``p_up``, ``calibration``, ``calibration_note``; with a
    return ``head``, its ``signal``) and the parameters with their
    defaults (``pred_len``: the config's predict_window; the sampling ones; ``calibrated``). The
    inputs are left open: ``predict`` checks the dict of ``bars`` and ``timestamps`` itself and
    refuses bad input in one short line (MLflow's own schema check would print the whole array)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec, Schema, TensorSpec

    float32, float64 = np.dtype("float32"), np.dtype("float64")
    outputs = Schema([TensorSpec(float32, (-1, -1, -1, 6), "paths"), TensorSpec(float32, (-1, -1, 6), "mean"),
                      TensorSpec(float64, (-1, len(QLEVELS), -1), "quantiles"),
                      TensorSpec(float64, (len(QLEVELS),), "quantile_levels"), TensorSpec(float64, (-1,), "p_up"),
                      TensorSpec(np.dtype(str), (-1,), "calibration"),
                      TensorSpec(np.dtype(str), (-1,), "calibration_note"),
                      TensorSpec(np.dtype(str), (-1,), "forecaster")]
                     + ([TensorSpec(float64, (-1,), "signal")] if head else []))
    params = [ParamSpec("pred_len", "long", int(pred_len))]
    params += [ParamSpec(k, "double" if isinstance(v, float) else "long", v) for k, v in SAMPLING_DEFAULTS.items()]
    params += [ParamSpec(k, "boolean", v) for k, v in SERVING_DEFAULTS.items() if isinstance(v, bool)]
    params += [ParamSpec("forecaster", "string", forecaster)]  # ensemble | calibrated | raw
    return ModelSignature(inputs=None, outputs=outputs, params=ParamSchema(params))


# The settings of the reload check and of the input example: two paths per series, seed 0.
FORECAST_CHECK = {"sample_count": 2, "seed": 0}


def log_forecaster(mlflow_logger, tokenizer_dir: str, predictor_dir: str, config: Mapping[str, Any], step: int = 0,
                   metrics: Mapping[str, float] | None = None, heldout_metrics: Mapping[str, float] | None = None,
                   heldout_dataset: tuple[str, str] | None = None, calibrator_path: str | None = None,
                   ensemble_path: str | None = None):
    """Log the predictor run's forecaster as the MLflow Model ``best_model`` of
    ``mlflow_logger``'s run: ``tokenizer_dir`` (the tokenizer the predictor was trained on) and
    ``predictor_dir`` (the best predictor checkpoint), each a ``config.json`` +
    ``model.safetensors`` directory, become the artifacts ``tokenizer/`` and ``predictor/``;
    ``calibrator_path`` (the run's ``evaluation/calibrator.json``), when given, is checked and
    becomes ``calibrator/calibrator.json``, which the model applies to its quantiles and p_up.
    Linked, given metrics, checked and registered as :func:`log_best_model` does; the check
    forecasts real windows of the config's data in memory and with the reloaded model, for one
    seed, and requires the same paths (and, with a calibrator, a calibrated answer). A return head
    in ``predictor_dir`` (``return_head.safetensors``, beside the upstream-format backbone) is
    checked and stays there, ``predictor/return_head.safetensors``: the model then answers its
    ``signal`` too, and the check requires the same signal. Returns the ``ModelInfo``."""
    served_head.load(predictor_dir)  # a damaged head is refused before anything is logged
    if calibrator_path is not None:
        read_calibrator(os.fspath(calibrator_path))  # a bad file is refused before anything is logged
    if ensemble_path is not None:  # the ensemble (evaluation/ensemble.json): served by default
        served_ensemble.read(os.fspath(ensemble_path))
    with tempfile.TemporaryDirectory(prefix="kronos-forecaster-") as staging:
        artifacts = _forecaster_artifacts(tokenizer_dir, predictor_dir, staging)
        if calibrator_path is not None:
            directory = os.path.join(staging, CALIBRATOR_ARTIFACT)
            os.makedirs(directory)
            shutil.copyfile(os.fspath(calibrator_path), os.path.join(directory, CALIBRATOR_FILE))
            artifacts[CALIBRATOR_ARTIFACT] = directory
        if ensemble_path is not None:
            directory = os.path.join(staging, served_ensemble.ARTIFACT)
            os.makedirs(directory)
            shutil.copyfile(os.fspath(ensemble_path), os.path.join(directory, served_ensemble.FILE))
            artifacts[served_ensemble.ARTIFACT] = directory
        return _log_forecaster(mlflow_logger, artifacts, config, int(step), metrics, heldout_metrics, heldout_dataset)


def _forecaster_artifacts(tokenizer_dir: str, predictor_dir: str, staging: str) -> dict[str, str]:
    """The two checkpoint directories under ``staging`` as ``tokenizer/`` and ``predictor/``
    (MLflow names an artifact directory after its source): hard links where the file system
    allows, copies otherwise."""
    def link_or_copy(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    out = {}
    for name, source in ((TOKENIZER_ARTIFACT, tokenizer_dir), (PREDICTOR_ARTIFACT, predictor_dir)):
        out[name] = shutil.copytree(os.fspath(source), os.path.join(staging, name), copy_function=link_or_copy)
    return out


def _log_forecaster(mlflow_logger, artifacts: Mapping[str, str], config: Mapping[str, Any], step: int,
                    metrics, heldout_metrics, heldout_dataset):
    data = as_section(config, "data")
    pred_len = int(data.predict_window)
    model_config = {"pred_len": pred_len, "max_context": int(data.max_context), "clip": float(data.clip)}
    predictor = load_forecaster(artifacts[TOKENIZER_ARTIFACT], artifacts[PREDICTOR_ARTIFACT],
                                max_context=model_config["max_context"], clip=model_config["clip"])
    example = example_forecast_input(config)
    expected = forecast(predictor, example, pred_len, **FORECAST_CHECK)
    head, _ = served_head.load(artifacts[PREDICTOR_ARTIFACT], predictor.device)
    if head is not None:
        expected["signal"] = served_head.signal(predictor, head, example["bars"], example["timestamps"])
    files = _ModelFiles(
        "forecaster_model.py", artifacts, model_config, forecaster_signature(
            pred_len, "ensemble" if served_ensemble.ARTIFACT in artifacts else "calibrated", head is not None),
        (example, dict(FORECAST_CHECK)), _metadata(data))

    # calibrated where the model carries a calibrator and the example's lookback gives its volatility
    state = ("calibrated" if CALIBRATOR_ARTIFACT in artifacts
             and int(data.lookback_window) >= MIN_CALIBRATED_LOOKBACK else "raw")

    def reproduces(loaded) -> bool:
        got = loaded.predict(example, params=dict(FORECAST_CHECK))
        who = "ensemble" if served_ensemble.ARTIFACT in artifacts and state == "calibrated" else state
        if ("signal" in got) != ("signal" in expected):
            return False
        return all(np.allclose(got[k], expected[k], rtol=1e-5, atol=1e-5) for k in ("paths", "mean", "signal")
                   if k in expected) and bool(
            np.all(np.asarray(got["calibration"]) == state)) and bool(np.all(np.asarray(got["forecaster"]) == who))

    return _publish_model(mlflow_logger, files, as_section(config, "tracking"), step, metrics, heldout_metrics,
                          heldout_dataset, reproduces)


def _model_metrics(mlflow_logger, metrics: Mapping[str, float], step: int, model_id: str,
                   dataset: tuple[str, str] | None = None) -> list:
    """``metrics`` at ``step`` as metrics of the model (linked to ``dataset``, a (name, digest)
    the run has as an input, when given). A value the run already holds at that step is linked
    with its own timestamp (MLflow then stores it once, not twice in the run's history, as its
    own log_model linking does); others get the current time."""
    from mlflow.entities import Metric

    name, digest = dataset if dataset else (None, None)

    mlflow_logger.flush()  # the epoch's values are on the server before they are looked up
    now = int(time.time() * 1000)
    out = []
    for key, value in metrics.items():
        if value is None or not np.isfinite(value):
            continue
        stamp, number = now, float(value)
        try:
            same = [m for m in mlflow_logger.client.get_metric_history(mlflow_logger.run_id, key) if m.step == step]
        except Exception:  # noqa: BLE001 - a server outage: link the value with the current time
            same = []
        if same:
            stamp, number = same[-1].timestamp, same[-1].value
        out.append(Metric(key, number, stamp, step, model_id=model_id, dataset_name=name, dataset_digest=digest))
    return out


def log_dataset_input(client, run_id: str, data: Any, digest: str) -> None:
    """Record the Qlib data as the run's training input: path, instrument, ranges, digest, from the
    ``data`` section (or the whole config)."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    data = as_section(data, "data")
    dataset = MetaDataset(source=_source(data), name=dataset_name(data), digest=digest[:32])
    tags = [
        InputTag(key="mlflow.data.context", value="training"),
        InputTag(key="instrument", value=str(data.instrument)),
        InputTag(key="freq", value=str(data.freq)),
        InputTag(key="membership_gaps", value=str(data.membership_gaps)),
        InputTag(key="train_time_range", value=format_time_range(data.train_time_range)),
        InputTag(key="val_time_range", value=format_time_range(data.val_time_range)),
        InputTag(key="test_time_range", value=format_time_range(data.test_time_range)),
    ]
    _log_input(client, run_id, DatasetInput(dataset=dataset._to_mlflow_entity(), tags=tags))


def dataset_name(data: Any) -> str:
    """The data's name as a run input: ``qlib-<instrument>[-demo][-<freq>]``, from the ``data``
    section (or the whole config)."""
    data = as_section(data, "data")
    name = f"qlib-{data.instrument}" + ("-demo" if not data.qlib_data_path else "")
    if data.freq != "day":
        name += f"-{data.freq}"
    return name


def _source(data: Any):
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    path = str(resolve_qlib_path(data))
    with warnings.catch_warnings():
        # Two registered sources both read local paths; either is right.
        warnings.filterwarnings("ignore", message=".*interpreted in multiple ways.*")
        return resolve_dataset_source(path)


def log_heldout_dataset(client, run_id: str, data: Any, heldout: Mapping[str, Any]) -> tuple[str, str]:
    """The windows the test verdict scored, as an input of the run (context ``test``): name
    ``<data name>-test``, digest that of the windows; ``data``: the data section (or the whole
    config). Returns (name, digest) for linking the model's test metrics to it."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    data = as_section(data, "data")
    split = str(heldout.get("split") or "test")
    name, digest = f"{dataset_name(data)}-{split}", str(heldout["windows_digest"])[:32]
    dataset = MetaDataset(source=_source(data), name=name, digest=digest)
    tags = [InputTag(key="mlflow.data.context", value=split),
            InputTag(key=f"{split}_time_range", value=format_time_range(getattr(data, f"{split}_time_range"))),
            InputTag(key="windows", value=str(heldout.get("windows", 0)))]
    _log_input(client, run_id, DatasetInput(dataset=dataset._to_mlflow_entity(), tags=tags))
    return name, digest


def _log_input(client, run_id: str, entry) -> None:
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


def record_result(tracking, layout, config: Mapping[str, Any], result: Mapping[str, Any], *, world_size: int,
                  digest: str, started: float, log_model, heldout_metrics: Mapping[str, float]) -> None:
    """Rank 0, after training: ``summary.json`` (an artifact of every backend) and the best checkpoint
    as the MLflow Model ``best_model`` (a plain artifact on Comet), logged by the stage's
    ``log_model`` (:meth:`kronos_mlflow.stages.StageSpec.log_model`) with ``heldout_metrics``, the
    test verdict's run metrics (:meth:`kronos_mlflow.evaluation.verdict.HeldOut.run_metrics`)."""
    summary = {
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "elapsed_s": round(time.time() - started, 3),
        "save_directory": str(layout.root.resolve()),
        "world_size": world_size,
        "final_result": result,
        "mlflow_run_id": tracking.mlflow.run_id,
        "data_digest": digest,
        "config": run_params(config),
    }
    write_atomic(layout.summary, json.dumps(summary, indent=2, sort_keys=True, default=str))
    tracking.logger.log_artifact(str(layout.summary))
    if layout.best_model.is_dir():
        if tracking.comet is not None:
            tracking.comet.log_artifact(str(layout.best_model), "best_model")
        heldout, dataset = heldout_record(tracking.mlflow, config, result.get("test"), heldout_metrics)
        log_model(tracking.mlflow, layout, config, result, heldout, dataset)
    if layout.best_adapter.is_dir() and as_section(config, "finetune").finetune_mode == "lora":
        # the best epoch's adapters alone (peft's format), beside the merged best_model
        tracking.logger.log_artifact(str(layout.best_adapter), "adapter")


def log_predictor_model(mlflow_logger, layout, config: Mapping[str, Any], result: Mapping[str, Any], heldout,
                        dataset) -> None:
    """A predictor run's ``best_model``: the forecaster holding its tokenizer and best checkpoint,
    and the calibrator the scorecard wrote (``evaluation/calibrator.json``) where there is one."""
    calibrator = Path(layout.root) / "evaluation" / CALIBRATOR_FILE
    ensemble = Path(layout.root) / "evaluation" / served_ensemble.FILE
    log_forecaster(mlflow_logger, str(layout.tokenizer), str(layout.best_model), config,
               step=max(result["best_epoch"], 0), metrics=best_epoch_metrics(result, PREDICTOR_VAL_METRIC),
               heldout_metrics=heldout,
               heldout_dataset=dataset, calibrator_path=str(calibrator) if calibrator.is_file() else None,
               ensemble_path=str(ensemble) if ensemble.is_file() else None)


def heldout_record(mlflow_logger, data: Any, heldout: Mapping[str, Any] | None,
                   metrics: Mapping[str, float]):
    """The test verdict's ``metrics`` for the logged model, and the dataset (name, digest) they
    are linked to, recorded as the run's test input (``data``: the data section, or the whole
    config); ``({}, None)`` without a verdict."""
    if not heldout or heldout.get("verdict") == "unavailable" or not heldout.get("windows_digest"):
        return {}, None
    dataset = log_heldout_dataset(mlflow_logger.client, mlflow_logger.run_id, as_section(data, "data"), heldout)
    return dict(metrics), dataset


def best_epoch_metrics(result: Mapping[str, Any], val_metric: str = TOKENIZER_VAL_METRIC) -> dict[str, float]:
    """The best epoch's validation metrics, as the logged model carries them."""
    best = result.get("best_val_loss")
    metrics = dict(result.get("best_val_quality") or {})
    if best is not None and best == best:  # not NaN: there was a validation
        metrics.update({val_metric: best, BEST_METRIC: best})
    return metrics
