"""The interface a training stage gives the loop (:mod:`kronos_mlflow.training.loop`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .registry import get as registered

if TYPE_CHECKING:  # the stage specs import no torch: --help and the config checks stay fast
    import torch


class StepOutput(NamedTuple):
    """One sub-batch's loss (with its graph) and its parts (detached 0-d tensors, read once)."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor]


class Validation(NamedTuple):
    """A validation pass over every rank's windows."""

    loss: float | None  # None when no rank had a validation window
    metrics: dict[str, float]  # the stage's extra metrics (empty without validation)
    stats: Any  # what the stage's plots and console line read (None without validation)


@dataclass(frozen=True)
class HeldOutPiece:
    """What differs per stage in a held-out comparison (:mod:`kronos_mlflow.evaluation.heldout`):
    how a model is loaded, what one window's loss is, and which metrics a run records. The
    windows, the bootstrap and the verdict are the same for every stage."""

    name: str
    loss: str  # the metric (unprefixed) the change and verdict are computed on
    metric_names: tuple[str, ...]  # unprefixed, as ``score`` returns them
    score: Callable  # (model, windows, device, *, batch_size, rank, world_size, progress, desc) -> (losses, metrics)
    load: Callable  # (checkpoint directory or hub id, device) -> model in eval mode


class TrainingStage:
    """What the loop asks a stage. Subclasses set ``name`` and implement the methods; the metric
    names are the registered spec's (:class:`~kronos_mlflow.stages.registry.StageSpec`), declared once."""

    name: str = ""

    @property
    def train_loss(self) -> str:
        """The per-step loss's metric name."""
        return registered(self.name).train_loss

    @property
    def learning_rate(self) -> str:
        """The per-step learning rate's metric name."""
        return registered(self.name).learning_rate

    @property
    def val_metric(self) -> str:
        """The epoch's validation loss's metric name."""
        return registered(self.name).val_metric

    @property
    def initial_val_metric(self) -> str:
        """The starting weights' validation loss's metric name."""
        return registered(self.name).initial_val_metric

    #: the held-out comparison's piece (:class:`HeldOutPiece`)
    heldout: HeldOutPiece | None = None

    def loss(self, model, x: torch.Tensor, stamp: torch.Tensor, precision: str) -> StepOutput:
        raise NotImplementedError

    def step_metrics(self, loss: float, parts: Mapping[str, float]) -> dict[str, float]:
        """The per-step metrics (besides the learning rate) from the read loss and parts."""
        raise NotImplementedError

    def run_validation(self, model, loader, device, *, detailed: bool = True) -> Validation:
        """Validation over every rank's windows (a collective); ``detailed`` adds the metrics."""
        raise NotImplementedError

    def describe(self, validation: Validation) -> str:
        """A console line about the epoch's validation metrics ('' for none)."""
        return ""

    def best_validation(self, best_dir, loader, device) -> Validation:
        """The validation of the checkpoint in ``best_dir`` (a collective): a resumed run's
        best epoch happened before the restart."""
        raise NotImplementedError

    def log_plots(self, logger, config: Mapping[str, Any], root, val_ds, stats, best_epoch: int) -> None:
        """PNGs of the best checkpoint (rank 0 only); nothing by default."""

    def scorecard(self, config: Mapping[str, Any], layout, device, *, rank: int, world_size: int, logger, console,
                  step: int, reused: Mapping[str, Any] | None = None):
        """The end-of-run forecast evaluation after the test verdict (a collective); None: none.
        ``reused``: forecasts the epoch hooks drew with the kept weights (:meth:`EpochHook.forecasts`)."""
        return None

    def forecast_pair(self, raw_model, config: Mapping[str, Any], device):
        """``(tokenizer, predictor)`` that forecast with the epoch's weights ``raw_model``
        (``objective: val_skill``, :mod:`kronos_mlflow.evaluation.val_skill`)."""
        raise NotImplementedError

    def save_start_files(self, layout) -> None:
        """What the stage writes into the run directory when the run starts (rank 0 only)."""
