"""The tokenizer's part of a held-out comparison: what one window's loss is, and which metrics.

A window's loss is the MSE of the full reconstruction ``z`` against the normalised window,
over its time steps and features: the definition of ``val_tokenizer_loss_epoch``, so the mean
over windows is the validation loss computed on these windows. The metrics (unprefixed; a run
records them as ``test_<name>``) are that mean, the s1-only reconstruction's MSE, each
feature's MSE, the full codebook's usage and perplexity (:mod:`kronos_mlflow.evaluation.quality`, summed
over ranks before dividing), and the number of windows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ...runtime.distributed import all_reduce_sum_
from ...evaluation.windows import HeldOutWindows
from ...config.features import FEATURES
from ...tracking.keys import FEATURE_MSE_PREFIX, PERPLEXITY_FULL, RECON_PRE, USAGE_FULL
from ...model import KronosTokenizer
from ...evaluation.quality import ValidationStats
from ..base import HeldOutPiece

LOSS = "tokenizer_loss"
#: The metrics :func:`score` returns, in logging order.
METRIC_NAMES: tuple[str, ...] = (LOSS, "recon_loss_pre", *(f"mse_{f}" for f in FEATURES),
                                 "codebook_usage_full", "codebook_perplexity_full", "windows")


def window_losses(model, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """Per-window MSE of the full reconstruction (float64, shape (B,)) and the forward's outputs."""
    out = model(x)
    (_, z), _, _, _ = out
    diff = z.float() - x
    return (diff * diff).mean(dim=(1, 2)).double(), out


def score(model, windows: HeldOutWindows, device, *, batch_size: int, rank: int = 0, world_size: int = 1,
          progress: Callable | None = None, desc: str = "") -> tuple[np.ndarray, dict[str, float]]:
    """Every window's loss (float64, in selection order) and the metrics, over all ranks.

    A collective: every rank calls it; each scores its shard (:meth:`HeldOutWindows.shard`),
    then the losses and statistics are summed over ranks, so every rank returns the same.
    ``progress(iterable, total, desc)`` wraps the batches (a tqdm bar on rank 0).
    """
    was_training = model.training
    model.eval()
    positions = windows.shard(rank, world_size)
    losses = torch.zeros(len(windows), dtype=torch.float64)
    stats = ValidationStats.for_model(model, device)
    batches = windows.batches(positions, batch_size)
    if progress is not None:
        batches = progress(batches, math.ceil(len(positions) / batch_size), desc)
    with torch.no_grad():
        for pos, x, _ in batches:
            x = x.to(device, non_blocking=True)
            per_window, ((z_pre, z), _, _, codes) = window_losses(model, x)
            losses[torch.from_numpy(pos)] = per_window.cpu()
            stats.update(x, z_pre, z, codes)
    model.train(was_training)
    all_reduce_sum_(losses)  # each position is filled by exactly one rank
    stats.all_reduce()
    per_window = losses.numpy()
    quality = stats.metrics()
    if not len(windows):
        return per_window, {}
    metrics = {LOSS: float(per_window.mean()), "recon_loss_pre": quality[RECON_PRE]}
    metrics.update({f"mse_{f}": quality[f"{FEATURE_MSE_PREFIX}{f}"] for f in FEATURES})
    metrics.update({"codebook_usage_full": quality[USAGE_FULL], "codebook_perplexity_full": quality[PERPLEXITY_FULL],
                    "windows": float(len(windows))})
    return per_window, metrics


def load(path, device):
    """A tokenizer checkpoint directory or hub id, in eval mode."""
    return KronosTokenizer.from_pretrained(path, map_location=device).eval()


PIECE = HeldOutPiece("tokenizer", LOSS, METRIC_NAMES, score, load)
