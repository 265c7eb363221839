"""A tokenizer named the way users name one: a checkpoint directory, ``runs:/<id>/best_model``,
``models:/NAME@ALIAS`` (or ``models:/NAME/VERSION``, ``models:/m-<id>``), or a Hugging Face hub
id. Every failure is one :class:`~kronos_mlflow.errors.UserError` line naming the input."""

from __future__ import annotations

import os
from pathlib import Path

from ..config.core import flatten
from ..errors import UserError, short_reason
from ..config.secrets import redact_uri
from ..config.keys import PLACES_TO_WRITE

MLFLOW_SCHEMES = ("runs:/", "models:/")
ACCEPTED = ("a checkpoint directory (config.json + model.safetensors), runs:/<run id>/best_model, "
            "models:/NAME@ALIAS or a Hugging Face hub id")


def is_mlflow_uri(spec: str) -> bool:
    return str(spec).startswith(MLFLOW_SCHEMES)


def resolve_tokenizer(spec: str, device="cpu", *, tracking_uri: str | None = None, what: str = "MODEL"):
    """The ``KronosTokenizer`` that ``spec`` names, on ``device``, in eval mode."""
    spec = str(spec or "").strip()
    if not spec:
        raise UserError(f"{what} is empty; expected {ACCEPTED}")
    if is_mlflow_uri(spec):
        return _from_mlflow(spec, device, tracking_uri, what)
    from ..model import KronosTokenizer  # lazy: torch

    try:
        return KronosTokenizer.from_pretrained(spec, map_location=device).eval()
    except UserError as exc:  # which argument it was, then the checkpoint's own line
        raise UserError(f"{what}: {exc}") from None


def mlflow_store(spec: str, what: str, tracking_uri: str | None = None) -> str:
    """The tracking URI that holds the run or model ``spec`` names: an existing store (never a new
    empty database: :func:`~kronos_mlflow.tracking.server.resolve_tracking_uri`), with ``spec``'s run
    usable (:func:`check_logged_run`). A refusal is one line naming ``what`` and ``spec``."""
    from ..tracking.server import resolve_tracking_uri  # lazy: numpy, urllib/http

    try:
        uri = resolve_tracking_uri(tracking_uri, flag="--tracking-uri" if tracking_uri else None)
    except UserError as exc:
        raise UserError(f"{what} '{spec}' cannot be loaded: {exc}") from None
    check_logged_run(spec, what, uri)
    return uri


def check_logged_run(spec: str, what: str, tracking_uri: str) -> None:
    """A ``runs:/<id>/...`` URI names a run of the store that exists, is not deleted and has
    ended (a RUNNING run's model is not final, or not there yet). Other URIs: nothing to check."""
    if not str(spec).startswith("runs:/"):
        return
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from ..tracking.server import hide_uri_printing  # lazy: numpy, urllib/http

    run_id = spec[len("runs:/"):].split("/", 1)[0]
    hide_uri_printing(tracking_uri)
    try:
        run = MlflowClient(tracking_uri=tracking_uri).get_run(run_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise UserError(f"{what} '{spec}': run {run_id} does not exist at {redact_uri(tracking_uri)}; "
                            "expected the id of a run logged there") from None
        raise UserError(f"{what} '{spec}' cannot be loaded from the MLflow store ({short_reason(exc, 160)})") from None
    if run.info.lifecycle_stage == "deleted":
        raise UserError(f"{what} '{spec}': run {run_id} is deleted; restore it (mlflow runs restore --run-id "
                        f"{run_id}) or name another run")
    if run.info.status in ("RUNNING", "SCHEDULED"):
        raise UserError(f"{what} '{spec}': run {run_id} is {run.info.status}, its model not final; wait until it "
                        "ends, or name a run that has ended")


def _from_mlflow(spec: str, device, tracking_uri: str | None, what: str):
    from mlflow.exceptions import MlflowException

    from ..serving.tokenizer_model import load_tokenizer as load_logged  # lazy: torch, mlflow, numpy

    uri = mlflow_store(spec, what, tracking_uri)  # an existing store: never a new empty database
    try:
        return load_logged(spec, map_location=str(device), tracking_uri=uri).eval()
    except UserError as exc:  # the downloaded checkpoint itself is bad
        raise UserError(f"{what} '{spec}': {exc}") from None
    except (MlflowException, OSError, ValueError) as exc:
        raise UserError(f"{what} '{spec}' cannot be loaded from the MLflow store ({short_reason(exc, 160)}); "
                        f"expected {ACCEPTED}") from None


def source_run(spec: str, tracking_uri: str | None = None) -> str | None:
    """The run that made the model a ``runs:/`` or ``models:/`` URI names (None: not known)."""
    if spec.startswith("runs:/"):
        return spec[len("runs:/"):].split("/", 1)[0] or None
    if not spec.startswith("models:/"):
        return None
    try:
        from mlflow import MlflowClient
        from mlflow.store.artifact.utils.models import get_model_name_and_version

        client = MlflowClient(tracking_uri=tracking_uri)
        name, version = get_model_name_and_version(client, spec)
        return client.get_model_version(name, version).run_id or None
    except Exception:  # noqa: BLE001 - a models:/m-<id> or an old store: the URI tag is still there
        return None


def recorded_settings(spec: str, keys, what: str, tracking_uri: str | None = None) -> tuple[dict[str, str], str]:
    """What the run that made ``spec`` (a ``runs:/`` or ``models:/`` URI) recorded for ``keys``,
    as the params it logged, and that run's id: a scoring command's defaults for the data and
    the window sizes, so that it scores the run on what it was trained and judged on. A place to
    write (:data:`~kronos_mlflow.config.keys.PLACES_TO_WRITE`: ``dataset_path``, ``save_path``, ...)
    is never among them, whatever ``keys`` asks: those are the command's own. Nothing is
    downloaded; the store and the run are checked first (:func:`mlflow_store`). ``({}, '')``
    for a directory or hub id, or a model whose run is not known."""
    spec = str(spec or "").strip()
    if not is_mlflow_uri(spec):
        return {}, ""
    uri = mlflow_store(spec, what, tracking_uri)
    run_id = source_run(spec, uri)
    if not run_id:
        return {}, ""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        params = MlflowClient(tracking_uri=uri).get_run(run_id).data.params
    except MlflowException:
        return {}, ""
    # an empty MLproject parameter is recorded as its shell quoting
    return {k: ("" if params[k].strip() in ("''", '""') else params[k]) for k in keys
            if k in params and k not in PLACES_TO_WRITE}, run_id


def kept_settings(recorded: dict[str, str], config, defaults) -> str:
    """``n_test_iter=4, lookback_window=30``: the recorded values the config kept (neither a flag
    nor the config file set them otherwise) that differ from the defaults."""
    final, default = flatten(config), flatten(defaults)
    return ", ".join(f"{k}={v if v else chr(39) * 2}" for k, v in recorded.items()
                     if final.get(k) == v and default.get(k) != v)


MODEL_ACCEPTED = ("runs:/<run id>/best_model, models:/NAME@ALIAS, a directory holding tokenizer/ and predictor/, "
                  "or a predictor run's directory")


def pair_dirs(root: Path) -> tuple[Path, Path] | None:
    for tok, pred in ((root / "tokenizer", root / "predictor"),
                      (root / "checkpoints" / "tokenizer", root / "checkpoints" / "best_model"),
                      (root / "artifacts" / "tokenizer", root / "artifacts" / "predictor")):
        if (tok / "model.safetensors").is_file() and (pred / "model.safetensors").is_file():
            return tok, pred
    return None


def resolve_model(spec: str, scratch: Path, tracking_uri: str | None = None) -> tuple[Path, Path, str]:
    """``(tokenizer dir, predictor dir, predictor run id or '')`` of ``--model``."""
    spec = str(spec or "").strip()
    if not spec:
        raise UserError(f"--model is empty; expected {MODEL_ACCEPTED}")
    if spec.startswith(("runs:/", "models:/")):
        import mlflow
        from mlflow.exceptions import MlflowException

        uri = mlflow_store(spec, "--model", tracking_uri)  # an existing store, the run there and ended: nothing created
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=spec, dst_path=str(scratch),
                                                             tracking_uri=uri))
        except (MlflowException, OSError, ValueError) as exc:
            raise UserError(f"--model '{spec}' cannot be loaded from the MLflow store ({short_reason(exc, 160)}); "
                            f"expected {MODEL_ACCEPTED}") from None
        dirs = pair_dirs(local)
        run_id = source_run(spec) or ""
    else:
        dirs, run_id = pair_dirs(Path(spec).expanduser()), ""
    if dirs is None:
        raise UserError(f"--model '{spec}' holds no tokenizer and predictor checkpoints; expected {MODEL_ACCEPTED}")
    return dirs[0], dirs[1], run_id


def model_calibrator(predictor_dir: Path, what: str = "--model"):
    """The calibrator a logged forecaster carries beside its checkpoints (``calibrator/calibrator.json``
    next to ``predictor/``), read and checked by the one reader of handed-over files
    (:func:`kronos_mlflow.serving.forecasting.calibrator_file.read`), or None (a model logged without one,
    or checkpoint directories); a damaged one is one line naming ``what``, the file and the field."""
    from ..serving.forecasting.pyfunc import CALIBRATOR_ARTIFACT, CALIBRATOR_FILE  # lazy: mlflow
    from ..serving.forecasting import calibrator_file  # lazy: mlflow

    path = Path(predictor_dir).parent / CALIBRATOR_ARTIFACT / CALIBRATOR_FILE
    if not os.path.lexists(path):
        return None
    return calibrator_file.read(path, f"{what}: its {CALIBRATOR_ARTIFACT}/{CALIBRATOR_FILE}")
