"""Stage one: the VQ tokenizer, with upstream's ``train_tokenizer.py`` objective.

Loss ``(mse(z_pre, x) + mse(z, x) + bsq_loss) / 2``; validation MSE of the full
reconstruction averaged over every validation sample of every rank; codebook use and
per-feature errors from the same pass (:mod:`kronos_mlflow.evaluation.quality`); reconstruction and
token-usage plots of the best checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ...runtime.distributed import dist_sum
from ...tracking.keys import TOKENIZER_TRAIN_BSQ_LOSS, TOKENIZER_TRAIN_LOSS, TOKENIZER_TRAIN_RECON, TOKENIZER_TRAIN_RECON_PRE
from ...model import KronosTokenizer
from ...runtime.perf import autocast
from ...evaluation.plots import log_validation_plots
from ...evaluation.quality import ValidationStats, describe as describe_quality
from ..base import StepOutput, TrainingStage, Validation
from ..predictor.sources import build_predictor
from .heldout import PIECE


def compute_loss(model, x, precision: str = "fp32"):
    """Upstream's objective. Returns (loss, parts) with parts as detached tensors.

    ``bsq_loss`` (commitment + entropy terms) is weighted like each reconstruction term; the
    sum is halved so the scale matches upstream's logged numbers. ``precision`` is a resolved
    one (:func:`kronos_mlflow.runtime.perf.resolve_precision`): ``bf16`` runs the forward under autocast;
    the losses are always computed in float32.
    """
    with autocast(precision, x.device):
        (z_pre, z), bsq_loss, _, _ = model(x)
    recon_pre = F.mse_loss(z_pre.float(), x)
    recon_all = F.mse_loss(z.float(), x)
    loss = (recon_pre + recon_all + bsq_loss.float()) / 2
    return loss, {"bsq": bsq_loss.detach(), "recon_pre": recon_pre.detach(), "recon_all": recon_all.detach()}


def evaluate(model, loader, device, stats=None) -> tuple[float, int]:
    """Sum of per-batch MSE x batch size, and the sample count, on this rank.

    ``stats`` (a :class:`~kronos_mlflow.evaluation.quality.ValidationStats`) also gathers codebook use and
    per-feature errors from the same forward passes: still one pass over the data.
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in loader:
            x = batch[0].to(device, non_blocking=True)
            (z_pre, z), _, _, codes = model(x)
            total += F.mse_loss(z, x).item() * x.size(0)
            count += x.size(0)
            if stats is not None:
                stats.update(x, z_pre, z, codes)
    model.train(was_training)
    return total, count


def global_val_loss(model, loader, device, stats=None) -> float | None:
    """Validation MSE over every rank's samples (a collective); ``stats``, if given, is summed
    over ranks too. None when no rank has a validation sample."""
    total, count = evaluate(model, loader, device, stats)
    total, count = dist_sum([total, count])
    if stats is not None:
        stats.all_reduce()
    return total / count if count else None


class TokenizerStage(TrainingStage):
    name = "tokenizer"

    @property
    def heldout(self):
        return PIECE

    def loss(self, model, x, stamp, precision):
        return StepOutput(*compute_loss(model, x, precision))

    def step_metrics(self, loss, parts):
        return {TOKENIZER_TRAIN_LOSS: loss, TOKENIZER_TRAIN_BSQ_LOSS: parts["bsq"],
                TOKENIZER_TRAIN_RECON_PRE: parts["recon_pre"], TOKENIZER_TRAIN_RECON: parts["recon_all"]}

    def run_validation(self, model, loader, device, *, detailed=True):
        stats = ValidationStats.for_model(model, device) if detailed else None
        loss = global_val_loss(model, loader, device, stats)
        return Validation(loss, stats.metrics() if stats is not None else {}, stats)

    def describe(self, validation):
        if not validation.metrics:
            return ""
        stats = validation.stats
        return describe_quality(validation.metrics, stats.s1_bits, stats.s2_bits)

    def best_validation(self, best_dir, loader, device):
        return self.run_validation(KronosTokenizer.from_pretrained(best_dir, map_location=device), loader, device)

    def forecast_pair(self, raw_model, config, device):
        """The epoch's tokenizer with ``pretrained_predictor_path``'s predictor (loaded once)."""
        partner = getattr(self, "_partner", None)
        if partner is None:
            partner = self._partner = build_predictor(config, raw_model).to(device).eval()
        return raw_model, partner

    def log_plots(self, logger, config: Mapping[str, Any], root, val_ds, stats, best_epoch):
        log_validation_plots(logger, config, str(root), val_ds, stats, best_epoch)
