"""The predictor's part of a held-out comparison: what one window's loss is, and which metrics.

A window's loss is ``(CE_s1 + CE_s2) / 2`` of its next-token predictions (inputs
``tokens[:, :-1]``, targets ``tokens[:, 1:]``, the frozen tokenizer's tokens), each cross
entropy a mean over the window's positions. Unlike training's loss it draws nothing at random:
the s2 head is conditioned on the true next s1 (teacher forcing) and its cross-attention is
causal, so a window's loss is a function of the weights and the window alone, and the paired
bootstrap compares like with like. The metrics (unprefixed; a run records them as
``test_<name>``) are that mean, each head's mean cross entropy and top-1 accuracy, and the
number of windows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ...runtime.distributed import all_reduce_sum_
from ...evaluation.windows import HeldOutWindows
from ...model import Kronos
from ..base import HeldOutPiece

LOSS = "predictor_loss"
#: The metrics :func:`score` returns, in logging order.
METRIC_NAMES: tuple[str, ...] = (LOSS, "s1_loss", "s2_loss", "s1_accuracy", "s2_accuracy", "windows")


def window_losses(model, tokenizer, x: torch.Tensor, stamp: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per window (float64, shape (B,)): the loss, each head's cross entropy and correct count."""
    with torch.no_grad():
        s1, s2 = tokenizer.encode(x, half=True)
        s1_logits, s2_logits = model(s1[:, :-1], s2[:, :-1], stamp[:, :-1], use_teacher_forcing=True,
                                     s1_targets=s1[:, 1:])
    out = {}
    for head, logits, target in (("s1", s1_logits, s1[:, 1:]), ("s2", s2_logits, s2[:, 1:])):
        ce = F.cross_entropy(logits.float().transpose(1, 2), target, reduction="none")  # (B, T)
        out[f"{head}_loss"] = ce.double().mean(dim=1)
        out[f"{head}_correct"] = (logits.argmax(dim=-1) == target).double().sum(dim=1)
    out[LOSS] = (out["s1_loss"] + out["s2_loss"]) / 2
    return out


def score(model, windows: HeldOutWindows, device, *, tokenizer, batch_size: int, rank: int = 0,
          world_size: int = 1, progress: Callable | None = None, desc: str = "") -> tuple[np.ndarray, dict[str, float]]:
    """Every window's loss (float64, in selection order) and the metrics, over all ranks (a
    collective, as :func:`kronos_mlflow.stages.tokenizer.heldout.score`)."""
    was_training = model.training
    causal = model.dep_layer.cross_attn.causal
    model.eval()
    model.dep_layer.cross_attn.causal = True
    positions = windows.shard(rank, world_size)
    columns = ("predictor_loss", "s1_loss", "s2_loss", "s1_correct", "s2_correct")
    table = torch.zeros(len(columns), len(windows), dtype=torch.float64)
    batches = windows.batches(positions, batch_size)
    if progress is not None:
        batches = progress(batches, math.ceil(len(positions) / batch_size), desc)
    try:
        for pos, x, stamp in batches:
            per = window_losses(model, tokenizer, x.to(device, non_blocking=True), stamp.to(device, non_blocking=True))
            index = torch.from_numpy(pos)
            for i, name in enumerate(columns):
                table[i, index] = per[name].cpu()
    finally:
        model.dep_layer.cross_attn.causal = causal
        model.train(was_training)
    all_reduce_sum_(table)  # each position is filled by exactly one rank
    per_window = table[0].numpy()
    if not len(windows):
        return per_window, {}
    steps = windows.window - 1
    metrics = {LOSS: float(per_window.mean()), "s1_loss": float(table[1].mean()), "s2_loss": float(table[2].mean()),
               "s1_accuracy": float(table[3].sum()) / (len(windows) * steps),
               "s2_accuracy": float(table[4].sum()) / (len(windows) * steps), "windows": float(len(windows))}
    return per_window, metrics


def load(path, device):
    """A predictor checkpoint directory or hub id, in eval mode."""
    return Kronos.from_pretrained(path, map_location=device).eval()


def piece(tokenizer) -> HeldOutPiece:
    """The predictor's part, scoring on the tokens of ``tokenizer`` (frozen, on the device)."""
    return HeldOutPiece("predictor", LOSS, METRIC_NAMES, functools.partial(score, tokenizer=tokenizer), load)
