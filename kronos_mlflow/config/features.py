"""Feature definitions shared by data preparation, training and the MLflow model.

The tokenizer sees six K-line features per step, ``open, high, low, close, vol, amt``, where
``vol`` is Qlib's ``$volume`` and ``amt`` is upstream's definition
``mean(open, high, low, close) * vol``. Each window is z-scored with the mean and standard
deviation of its lookback part only (``std + 1e-5``) and clipped to ``+-clip``, exactly as
upstream's ``QlibDataset`` does, so the same function serves training and inference.
"""

from __future__ import annotations

import numpy as np

FEATURES = ("open", "high", "low", "close", "vol", "amt")
TIME_FEATURES = ("minute", "hour", "weekday", "day", "month")
NORM_EPS = 1e-5


def amount_from_ohlcv(open_, high, low, close, volume):
    """Upstream's turnover proxy: the mean of the four prices times the volume."""
    return (open_ + high + low + close) / 4.0 * volume


def normalize_windows(x, lookback: int, clip: float, eps: float = NORM_EPS):
    """Z-score windows along the time axis (-2) with lookback-only statistics, then clip.

    Works on numpy arrays and torch tensors of shape ``(..., T, F)``. The standard deviation is
    the population one (numpy's default, ``ddof=0``), as upstream computes it with numpy.
    A lookback with zero variance gives zeros, never NaN or inf.
    """
    lookback = max(1, min(int(lookback), x.shape[-2]))
    past = x[..., :lookback, :]
    if isinstance(x, np.ndarray):
        mean = past.mean(axis=-2, keepdims=True)
        std = past.std(axis=-2, keepdims=True)
        return np.clip((x - mean) / (std + eps), -clip, clip).astype(x.dtype, copy=False)
    import torch

    mean = past.mean(dim=-2, keepdim=True)
    std = past.std(dim=-2, keepdim=True, unbiased=False)
    return torch.clamp((x - mean) / (std + eps), -clip, clip)


def time_features(dates) -> np.ndarray:
    """``minute, hour, weekday, day, month`` of each timestamp, float32 of shape (N, 5).

    ``dates`` is anything ``pandas.DatetimeIndex`` accepts.
    """
    import pandas as pd

    idx = pd.DatetimeIndex(dates)
    return np.stack(
        [idx.minute, idx.hour, idx.weekday, idx.day, idx.month], axis=1
    ).astype(np.float32)
