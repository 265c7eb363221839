"""What the logged MLflow Model is: a pyfunc over the safetensors checkpoint (how it is logged:
:mod:`kronos_mlflow.tracking.model_logging`).

The model directory holds the checkpoint exactly as ``save_pretrained`` writes it
(``artifacts/best_model/{config.json, model.safetensors}``), so ``KronosTokenizer.from_pretrained``
and upstream Kronos load it directly. The pyfunc is defined "from code" (``pyfunc_model.py``)
and ships this package under ``code/``: nothing is pickled, and it loads wherever torch,
safetensors and mlflow are installed.

``predict`` takes float32 windows ``(B, T, 6)`` of raw open, high, low, close, volume, amount,
normalises each window as training does (lookback statistics, clip), and returns a dict:

- ``reconstruction``: ``(B, T, 6)`` float32, the full-code reconstruction in the input's units;
- ``tokens``: ``(B, T)`` int64 full codes; ``s1_tokens`` / ``s2_tokens``: the two halves.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from .features import FEATURES, normalize_windows

MODEL_NAME = "best_model"
CHECKPOINT_ARTIFACT = "best_model"


def _as_windows(model_input) -> np.ndarray:
    if hasattr(model_input, "to_numpy"):
        model_input = model_input.to_numpy()
    x = np.asarray(model_input, dtype=np.float32)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[-1] != len(FEATURES):
        raise ValueError(
            f"input of shape {tuple(x.shape)} is not windows of (B, T, 6): "
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


try:  # the class needs mlflow; the helpers above do not
    import mlflow.pyfunc

    class KronosTokenizerPyfunc(mlflow.pyfunc.PythonModel):
        """Loads the checkpoint directory from the model's artifacts; see the module doc."""

        def load_context(self, context):
            from .model import KronosTokenizer  # torch: loaded with the model, not on import

            model_config = dict(getattr(context, "model_config", None) or {})
            self.lookback = int(model_config.get("lookback_window", 90))
            self.clip = float(model_config.get("clip", 5.0))
            self.model = KronosTokenizer.from_pretrained(context.artifacts[CHECKPOINT_ARTIFACT]).eval()

        def predict(self, context, model_input, params=None):
            return tokenize_windows(self.model, model_input, self.lookback, self.clip)

except ImportError:  # pragma: no cover - mlflow is a dependency
    KronosTokenizerPyfunc = None  # type: ignore[assignment]


def load_checkpoint_dir(model_uri: str, dst: str | None = None) -> str:
    """Download a logged model's checkpoint directory; returns the local path to pass to
    ``KronosTokenizer.from_pretrained`` (or upstream Kronos)."""
    import mlflow

    dst = dst or tempfile.mkdtemp(prefix="kronos-ckpt-")
    local = mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=dst)
    return os.path.join(local, "artifacts", CHECKPOINT_ARTIFACT)
