"""What the logged tokenizer MLflow Model is: a pyfunc "from code" (``pyfunc_model.py``) over the
safetensors checkpoint, nothing pickled (how it is logged: :mod:`kronos_mlflow.serving.model_logging`),
and :func:`load_tokenizer`, the one loader of a tokenizer; what ``predict`` takes and returns:
docs/serving.md#the-model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import UserError
from ..config.features import FEATURES, normalize_windows

MODEL_NAME = "best_model"
CHECKPOINT_ARTIFACT = "best_model"
MIN_WINDOW = 2  # steps per window: the normalisation needs a standard deviation


def _as_windows(model_input) -> np.ndarray:
    if hasattr(model_input, "to_numpy"):
        model_input = model_input.to_numpy()
    try:
        x = np.asarray(model_input, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError("input is not a numeric array of windows (B, T, 6)") from None
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[-1] != len(FEATURES) or x.shape[1] < MIN_WINDOW:
        raise ValueError(
            f"input of shape {tuple(x.shape)} is not windows of (B, T, 6) with T >= {MIN_WINDOW}: "
            f"{', '.join(FEATURES)} per step"
        )
    if not np.isfinite(x).all():
        raise ValueError("input holds NaN or inf; pass finite prices and volumes")
    return x


def tokenize_windows(model, x: np.ndarray, lookback: int, clip: float) -> dict[str, np.ndarray]:
    """Normalise raw windows, encode, decode; the pyfunc's computation, usable without MLflow."""
    import torch

    x = _as_windows(x)
    lookback = max(1, min(int(lookback), x.shape[1]))
    past = x[:, :lookback, :]
    mean = past.mean(axis=1, keepdims=True)
    std = past.std(axis=1, keepdims=True)
    xn = normalize_windows(x, lookback, clip)
    device = next(model.parameters()).device
    with torch.no_grad():
        t = torch.from_numpy(np.ascontiguousarray(xn)).to(device)
        s1, s2 = model.encode(t, half=True)
        full = model.encode(t)
        z = model.decode(full)
    recon = z.float().cpu().numpy() * (std + 1e-5) + mean
    return {
        "reconstruction": recon.astype(np.float32),
        "tokens": full.cpu().numpy().astype(np.int64),
        "s1_tokens": s1.cpu().numpy().astype(np.int64),
        "s2_tokens": s2.cpu().numpy().astype(np.int64),
    }


@contextlib.contextmanager
def bad_input_as_invalid_parameter() -> Iterator[None]:
    """A ``ValueError`` (or the project's ``TypeError`` of a bad argument) raised inside becomes
    MLflow's ``INVALID_PARAMETER_VALUE`` with the same one-line message: a 400 when served, one
    short line (never the whole array)."""
    try:
        yield
    except (ValueError, UserError) as exc:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        raise MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE) from None


try:  # the class needs mlflow; the helpers above do not
    import mlflow.pyfunc

    class KronosTokenizerPyfunc(mlflow.pyfunc.PythonModel):
        """Loads the checkpoint directory from the model's artifacts (``artifacts/best_model/``, as
        ``save_pretrained`` writes it); ``predict`` is :func:`tokenize_windows` (docs/serving.md#the-model)."""

        def load_context(self, context):
            from ..model import KronosTokenizer  # lazy: torch, loaded with the model, not on import

            model_config = dict(getattr(context, "model_config", None) or {})
            self.lookback = int(model_config.get("lookback_window", 90))
            self.clip = float(model_config.get("clip", 5.0))
            self.model = KronosTokenizer.from_pretrained(context.artifacts[CHECKPOINT_ARTIFACT]).eval()

        # Type hints MLflow reads: np.ndarray means "no schema from hints" (the logged signature
        # is the schema), and MLflow does not warn about missing hints.
        def predict(self, context, model_input: np.ndarray, params: dict[str, Any] | None = None
                    ) -> dict[str, np.ndarray]:
            with bad_input_as_invalid_parameter():
                return tokenize_windows(self.model, model_input, self.lookback, self.clip)

except ImportError:  # pragma: no cover - mlflow is a dependency
    KronosTokenizerPyfunc = None  # type: ignore[assignment]


def load_checkpoint_dir(model_uri: str, dst: str | os.PathLike, tracking_uri: str | None = None) -> str:
    """Download a logged model's checkpoint directory into ``dst`` (yours to keep or delete);
    returns the local path to pass to ``KronosTokenizer.from_pretrained`` (or upstream Kronos).
    :func:`checkpoint_dir` downloads into a temporary directory removed afterwards.
    ``tracking_uri`` (default: MLflow's) is also the registry's, for ``models:/`` URIs."""
    import mlflow

    local = mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=os.fspath(dst),
                                                tracking_uri=tracking_uri, registry_uri=tracking_uri)
    return os.path.join(local, "artifacts", CHECKPOINT_ARTIFACT)


@contextlib.contextmanager
def checkpoint_dir(model_uri: str, tracking_uri: str | None = None) -> Iterator[str]:
    """``with checkpoint_dir("runs:/<id>/best_model") as path:`` the checkpoint directory of a
    logged model, in a temporary directory that is removed when the block ends."""
    tmp = tempfile.mkdtemp(prefix="kronos-ckpt-")
    try:
        yield load_checkpoint_dir(model_uri, tmp, tracking_uri)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(model_uri: str, map_location: str = "cpu", tracking_uri: str | None = None):
    """The ``KronosTokenizer`` of a logged model, loaded into memory (no files left behind)."""
    from ..model import KronosTokenizer  # lazy: torch

    with checkpoint_dir(model_uri, tracking_uri) as path:
        return KronosTokenizer.from_pretrained(path, map_location=map_location)
