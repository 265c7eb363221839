"""The return head's ``signal`` of lookback windows: what the forecaster serves beside the paths'
quantiles and what the scorecard scores as the forecaster ``finetuned_head``
(docs/serving.md#the-return-heads-signal, docs/objectives.md#scoring-the-head).

The signal of a series is the head (:class:`kronos_mlflow.model.return_head.ReturnHead`) on the
predictor's context at its last lookback bar: the bars z-scored with the lookback's own mean and
standard deviation and clipped (as ``KronosPredictor`` normalises them), tokenized, their time
features, the last ``max_context`` tokens run through the predictor with a
:class:`~kronos_mlflow.model.return_head.ContextTap` on its final norm. Nothing after the origin
enters: the signal is the predicted normalised return to the head's horizon (its file's
``horizon``), whatever ``pred_len`` or the forecast bars' times are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...config.features import normalize_windows, time_features
from ...model.return_head import HEAD_FILE

#: the origins the head reads per forward
BATCH = 256


def has_head(predictor_dir: str | os.PathLike) -> bool:
    """Whether a predictor checkpoint directory holds a return head (``return_head.safetensors``)."""
    return (Path(predictor_dir) / HEAD_FILE).is_file()


def load(predictor_dir: str | os.PathLike, device=None) -> tuple[Any, dict[str, int]]:
    """``(head, {"lookback", "horizon"})`` of ``predictor_dir`` (the head on ``device``, eval
    mode), or ``(None, {})`` when it holds none; a damaged file is one
    :class:`~kronos_mlflow.errors.CheckpointError` line naming it."""
    if not has_head(predictor_dir):
        return None, {}
    from ...model.return_head import load_head  # lazy: safetensors

    head, window = load_head(predictor_dir)
    return (head.to(device) if device is not None else head), window


def signal(predictor, head, bars: np.ndarray, timestamps: np.ndarray, batch: int = BATCH) -> np.ndarray:
    """``(B,)`` float64: the head's signal of each lookback window, ``predictor`` a
    ``KronosPredictor`` (its tokenizer, model, device, clip and max_context), ``bars`` ``(B, L, 6)``
    raw bars, ``timestamps`` ``(B, >= L)`` seconds since the epoch (UTC), the first ``L`` the
    lookback bars' (the others are not read)."""
    import pandas as pd
    import torch

    from ...model.return_head import ContextTap  # lazy: torch

    bars = np.asarray(bars, dtype=np.float32)
    lookback = bars.shape[1]
    x = normalize_windows(bars, lookback, float(predictor.clip))
    stamps = np.asarray(timestamps)[:, :lookback].astype(np.int64)
    features = time_features(pd.to_datetime(stamps.reshape(-1), unit="s")).reshape(*stamps.shape, 5)
    keep = min(lookback, int(predictor.max_context))  # the forecast's window: the last max_context tokens
    out = np.empty(len(bars), dtype=np.float64)
    model, tokenizer, device = predictor.model, predictor.tokenizer, predictor.device
    modes = [(m, m.training) for module in (model, tokenizer, head) for m in module.modules()]
    for module in (model, tokenizer, head):
        module.eval()
    try:
        with torch.inference_mode(), ContextTap(model) as tap:
            for start in range(0, len(bars), batch):
                part = slice(start, start + batch)
                s1, s2 = tokenizer.encode(torch.from_numpy(x[part]).to(device), half=True)
                stamp = torch.from_numpy(features[part, -keep:]).to(device)
                model.decode_s1(s1[:, -keep:], s2[:, -keep:], stamp)
                out[part] = head(tap.context, keep - 1).double().cpu().numpy()
    finally:
        for m, training in modes:
            m.training = training
    return out
