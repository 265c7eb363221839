"""Stage two: the Kronos predictor on a frozen tokenizer's tokens, with upstream's
``train_predictor.py`` objective.

Each window's bars are tokenized by the frozen tokenizer (``encode(x, half=True)`` under
no_grad, eval mode: it is not trained); the predictor reads ``tokens[:, :-1]`` with the stamps
``x_stamp[:, :-1]`` and is scored on ``tokens[:, 1:]``: loss ``(CE_s1 + CE_s2) / 2`` over all
positions, the s2 head conditioned on an s1 sampled from the s1 logits (upstream's forward).

Validation is upstream's (the mean of per-batch losses over every rank's batches) with one
fix: the s2 head's cross-attention stays causal, as in training (``predictor_validation:
causal``). Upstream's eval mode lets each position's s2 prediction read later positions, whose
context holds the targets, so its number is optimistic; ``predictor_validation: upstream``
computes it for exact replication. The same pass records each head's top-1 accuracy and
perplexity (``exp`` of its mean cross entropy over every position of every rank).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ...config.sections import as_section
from ...runtime.distributed import dist_sum, unwrap
from ...evaluation.forecast_run import evaluate_predictor_run, fit_run_calibrator
from ...serving.forecasting.pyfunc import CALIBRATOR_FILE
from ...tracking.keys import (
    PREDICTOR_TRAIN_LOSS, PREDICTOR_TRAIN_RETURN, PREDICTOR_TRAIN_S1, PREDICTOR_TRAIN_S2, PREDICTOR_VAL_RETURN,
)
from ...model import Kronos
from ...model.return_head import HEAD_FILE, attach, correlation_loss, head_of, load_head, return_target
from ...runtime.perf import autocast
from ..base import StepOutput, TrainingStage, Validation
from .heldout import piece


def head_losses(s1_logits, s2_logits, s1_targets, s2_targets):
    """``((CE_s1 + CE_s2) / 2, CE_s1, CE_s2)``, means over every position (upstream's
    ``DualHead.compute_loss`` without a padding mask)."""
    ce_s1 = F.cross_entropy(s1_logits.reshape(-1, s1_logits.shape[-1]), s1_targets.reshape(-1))
    ce_s2 = F.cross_entropy(s2_logits.reshape(-1, s2_logits.shape[-1]), s2_targets.reshape(-1))
    return (ce_s1 + ce_s2) / 2, ce_s1, ce_s2


def pooled_return_loss(sums) -> float:
    """``1 - corr`` of the return head's signal and the return over every validation window, from
    their pooled sums ``(n, sum p, sum t, sum p^2, sum t^2, sum p t)`` (1: no spread, no signal)."""
    n, sp, st, spp, stt, spt = sums
    if n < 2:
        return math.nan
    cov, vp, vt = spt - sp * st / n, spp - sp * sp / n, stt - st * st / n
    return 1.0 - cov / math.sqrt(vp * vt) if vp * vt > 0 else 1.0


class PredictorStage(TrainingStage):
    name = "predictor"

    def __init__(self, tokenizer, config: Mapping[str, Any]):
        self.tokenizer = tokenizer.eval()
        for p in self.tokenizer.parameters():
            p.requires_grad_(False)
        predictor = as_section(config, "predictor")
        self.causal_validation = predictor.predictor_validation == "causal"
        self.config = config  # what a best checkpoint's return head is attached by
        # predictor_objective tokens+return: the return head's loss weight (the head is the model's own)
        self.return_weight = float(predictor.return_loss_weight) if predictor.predictor_objective == \
            "tokens+return" else 0.0

    @property
    def heldout(self):
        return piece(self.tokenizer)

    def tokens(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.tokenizer.encode(x, half=True)

    def loss(self, model, x, stamp, precision):
        s1, s2 = self.tokens(x)
        with autocast(precision, x.device):
            s1_logits, s2_logits = model(s1[:, :-1], s2[:, :-1], stamp[:, :-1])
        loss, ce_s1, ce_s2 = head_losses(s1_logits.float(), s2_logits.float(), s1[:, 1:], s2[:, 1:])
        head = head_of(unwrap(model))
        if head is None:  # predictor_objective tokens: upstream's loss
            return StepOutput(loss, {"s1": ce_s1.detach(), "s2": ce_s2.detach()})
        returns = self.return_loss(head, x)
        return StepOutput(loss + self.return_weight * returns,
                          {"s1": ce_s1.detach(), "s2": ce_s2.detach(), "return": returns.detach()})

    @staticmethod
    def head_pair(head, x):
        """The head's signal at the origin of the forward its tap just saw, and the windows' return."""
        return head(head.tap.take(), head.lookback - 1), return_target(x, head.lookback, head.horizon)

    def return_loss(self, head, x):
        """``1 - corr(signal, return)`` over the sub-batch's windows (docs/objectives.md)."""
        return correlation_loss(*self.head_pair(head, x))

    def step_metrics(self, loss, parts):
        metrics = {PREDICTOR_TRAIN_LOSS: loss, PREDICTOR_TRAIN_S1: parts["s1"], PREDICTOR_TRAIN_S2: parts["s2"]}
        if "return" in parts:
            metrics[PREDICTOR_TRAIN_RETURN] = parts["return"]
        return metrics

    def run_validation(self, model, loader, device, *, detailed=True):
        model = unwrap(model)
        was_training, causal = model.training, model.dep_layer.cross_attn.causal
        model.eval()
        model.dep_layer.cross_attn.causal = True if self.causal_validation else None
        # per rank: summed batch losses, batches, and per-position sums for the metrics
        sums = torch.zeros(8, dtype=torch.float64)
        head = head_of(model)
        pooled = torch.zeros(6, dtype=torch.float64)  # n, sums of p, t, p^2, t^2, p t: the head's correlation
        try:
            with torch.no_grad():
                for batch_x, batch_stamp in loader:
                    x = batch_x.to(device, non_blocking=True)
                    s1, s2 = self.tokens(x)
                    s1_logits, s2_logits = model(s1[:, :-1], s2[:, :-1], batch_stamp.to(device)[:, :-1])
                    if head is not None:
                        p, t = (v.double().cpu() for v in self.head_pair(head, x))
                        pooled += torch.stack([torch.tensor(float(p.numel()), dtype=torch.float64), p.sum(), t.sum(),
                                               (p * p).sum(), (t * t).sum(), (p * t).sum()])
                    loss, ce_s1, ce_s2 = head_losses(s1_logits.float(), s2_logits.float(), s1[:, 1:], s2[:, 1:])
                    n = s1[:, 1:].numel()
                    sums += torch.tensor([
                        loss.item(), 1.0, ce_s1.item() * n, ce_s2.item() * n,
                        (s1_logits.argmax(-1) == s1[:, 1:]).sum().item(),
                        (s2_logits.argmax(-1) == s2[:, 1:]).sum().item(), float(n), 0.0], dtype=torch.float64)
        finally:
            model.dep_layer.cross_attn.causal = causal
            model.train(was_training)
        total, batches, ce1, ce2, right1, right2, positions, _ = dist_sum(sums.tolist())
        returns = pooled_return_loss(dist_sum(pooled.tolist())) if head is not None else None
        if not batches:
            return Validation(None, {}, None)
        metrics = {"val_s1_accuracy": right1 / positions, "val_s2_accuracy": right2 / positions,
                   "val_s1_perplexity": math.exp(min(ce1 / positions, 700.0)),
                   "val_s2_perplexity": math.exp(min(ce2 / positions, 700.0))} if detailed else {}
        if detailed and returns is not None:
            metrics[PREDICTOR_VAL_RETURN] = returns
        return Validation(total / batches, metrics, None)

    def describe(self, validation):
        m = validation.metrics
        if not m:
            return ""
        return (f"s1 accuracy {m['val_s1_accuracy']:.1%} (ppl {m['val_s1_perplexity']:.1f}), "
                f"s2 accuracy {m['val_s2_accuracy']:.1%} (ppl {m['val_s2_perplexity']:.1f})"
                + (f", return loss {m[PREDICTOR_VAL_RETURN]:.4f}" if PREDICTOR_VAL_RETURN in m else ""))

    def best_validation(self, best_dir, loader, device):
        model = Kronos.from_pretrained(best_dir, map_location=device)
        if (Path(best_dir) / HEAD_FILE).is_file():  # its return head, beside it
            model = attach(model, self.config, load_head(best_dir)[0])
        return self.run_validation(model, loader, device)

    def scorecard(self, config, layout, device, *, rank, world_size, logger, console, step, reused=None):
        """Fine-tuned vs zero-shot vs naive forecasts on the test origins (``evaluate: on``); with
        ``evaluate: off`` and ``calibration: on``, the calibrator alone (logged with the model). A
        calibrator an earlier attempt of the run left is removed first: the model carries only one
        fit on its own kept weights."""
        if rank == 0:
            (Path(layout.root) / "evaluation" / CALIBRATOR_FILE).unlink(missing_ok=True)
            (Path(layout.root) / "evaluation" / "ensemble.json").unlink(missing_ok=True)  # so is its ensemble
        evaluation = as_section(config, "evaluation")
        if evaluation.evaluate != "on":
            if evaluation.calibration in ("on", "auto"):
                fit_run_calibrator(config, layout, device, rank=rank, world_size=world_size, logger=logger,
                                   console=console, reused=reused)
            return None

        return evaluate_predictor_run(config, layout, device, rank=rank, world_size=world_size, logger=logger,
                                      console=console, step=step, reused=reused)

    def forecast_pair(self, raw_model, config, device):
        """The epoch's predictor with the frozen tokenizer."""
        return self.tokenizer, unwrap(raw_model)

    def save_start_files(self, layout) -> None:
        if not (layout.tokenizer / "model.safetensors").is_file():
            self.tokenizer.save_pretrained(layout.tokenizer)
