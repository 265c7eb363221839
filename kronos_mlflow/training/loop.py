"""The training loop of both stages (upstream Kronos's ``finetune/train_*.py`` semantics), with no rank
branches: what only rank 0 does (print, write files, log) is decided once by the caller, through the
:class:`~kronos_mlflow.runtime.console.Console`, :class:`RunFiles` and logger it passes in (silent,
no-op and :class:`~kronos_mlflow.tracking.protocol.NullLogger` elsewhere); what differs per stage is
a piece from :mod:`kronos_mlflow.stages` (docs/code-map.md#where-each-concern-lives).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint
from ..model import finetune, return_head
from ..runtime import stopping
from ..runtime.stopping import TrainingPruned
from ..config.core import stage_keys
from ..config.sections import as_section
from ..runtime.console import Console
from ..data import QlibDataset
from ..data.loaders import train_loader_for, val_loader_for
from ..runtime.distributed import barrier, dist_sum, unwrap
from ..errors import CheckpointError, ConfigError, UserError
from ..evaluation.heldout import evaluate_run
from ..tracking.keys import BEST_METRIC
from ..config.layout import RunLayout
from .optim import build_optimizer, build_scheduler
from ..runtime.perf import compile_model, resolve_compile, resolve_fused, resolve_precision
from ..stages import TrainingStage
from ..stages.base import Validation
from ..tracking.protocol import ExperimentLogger


# --------------------------------------------------------------------------- one step


def train_step(model, optimizer, batch_x, config, precision: str | None = None, *, stage: TrainingStage,
               batch_stamp=None):
    """One optimizer step on ``batch_x`` (and its calendar stamps, on the device), as upstream takes it.

    ``accumulation_steps`` sub-batches (under DDP gradients are all-reduced on the last one
    only), the stage's loss, clip to the stage's norm
    (``grad_clip_norm``, ``predictor_grad_clip_norm``), AdamW step, gradients dropped. Returns
    ``(loss, parts)``: the mean loss over the sub-batches and the last sub-batch's parts, all
    detached 0-d tensors that are not read here, so a GPU is not synchronised (read them
    together, once).
    """
    if precision is None:
        precision = resolve_precision(as_section(config, "performance").precision, batch_x.device)
    accum = as_section(config, "training").accumulation_steps
    sub = batch_x.shape[0] // accum
    total = None
    for j in range(accum):
        x = batch_x[j * sub:(j + 1) * sub]
        stamp = batch_stamp[j * sub:(j + 1) * sub] if batch_stamp is not None else None
        # Under DDP, gradients are all-reduced only on the last sub-batch.
        sync = j == accum - 1 or not hasattr(model, "no_sync")
        with model.no_sync() if not sync else contextlib.nullcontext():
            loss, parts = stage.loss(model, x, stamp, precision)
            (loss / accum if accum > 1 else loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=config[stage_keys(config).grad_clip])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return (total / accum if accum > 1 else total), parts


def train_epoch(model, optimizer, scheduler, loader, device, config, precision: str, logger: ExperimentLogger,
                console: Console, global_step: int, desc: str, stage: TrainingStage) -> tuple[float, int]:
    """One pass over ``loader``: per batch a step, a schedule step and the step's metrics.
    Returns the summed training loss and the global step after the epoch."""
    running = 0.0
    # rank 0: a line every log_interval steps or progress_seconds (a bar on a terminal)
    ticker = console.progress(loader, len(loader), desc, every=as_section(config, "training").log_interval,
                              unit="steps")
    for batch_x, batch_stamp in ticker:
        batch_x = batch_x.to(device, non_blocking=True)
        batch_stamp = batch_stamp.to(device, non_blocking=True)
        loss, parts = train_step(model, optimizer, batch_x, config, precision, stage=stage, batch_stamp=batch_stamp)
        scheduler.step()
        # One device read for the loss and its parts (one GPU sync per step, not one per number).
        avg, *values = torch.stack([loss.float(), *(v.float() for v in parts.values())]).tolist()
        running += avg
        lr = optimizer.param_groups[0]["lr"]
        metrics = stage.step_metrics(avg, dict(zip(parts, values, strict=True)))
        logger.log_metrics({**metrics, stage.learning_rate: lr}, step=global_step)
        global_step += 1
        ticker.note(f"loss={avg:.6f} lr={lr:.3e} global_step={global_step}")
    return running, global_step


# --------------------------------------------------------------------------- the model as trained


def prepare_model(model, performance, device, distributed: bool = False, run_steps: int | None = None):
    """The model as training calls it: the fused path on or off (``fused_layers``), wrapped in
    DDP when ``distributed``, then ``torch.compile``d when ``compile`` resolves to on (``auto``
    on CPU weighs ``run_steps``, the run's optimizer steps; None = a long run). ``performance``:
    the config's performance section (or the whole config).
    :func:`~kronos_mlflow.runtime.distributed.unwrap` gives the plain module back (for validation and checkpoints)."""
    performance = as_section(performance, "performance")
    if hasattr(model, "set_fused"):
        model.set_fused(resolve_fused(performance.fused_layers, device))
    if distributed:
        device = torch.device(device)
        ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
        # The buffers (rotary frequencies, code bases) are constants: no per-forward sync.
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
            ddp_kwargs["forward_sync_buffers"] = False
        else:
            ddp_kwargs["broadcast_buffers"] = False
        model = DistributedDataParallel(model, **ddp_kwargs)
    if resolve_compile(performance.compile, device, run_steps):
        model = compile_model(model, performance.compile)
    return model


# --------------------------------------------------------------------------- what rank 0 writes


class RunFiles:
    """The files of a run that training writes: the best checkpoint, the training state after
    each epoch, the validation plots. Built with ``enabled=False`` on every rank but 0, where
    each method does nothing (collectives stay in the loop, on every rank)."""

    def __init__(self, layout: RunLayout, enabled: bool = True, config: Mapping[str, Any] | None = None):
        self.layout = layout
        self.enabled = bool(enabled)
        self.config = config  # the run's (a LoRA run's adapter settings)
        self.phase: str | None = None  # the last phase after the training that completed (every rank)
        self.phase_state: dict[str, Any] | None = None  # the training state the phases follow

    def record_phase(self, phase: str, result: Mapping[str, Any] | None = None) -> None:
        """``phase`` (after the last epoch) completed with the run's ``result`` so far:
        :mod:`kronos_mlflow.training.checkpoint.phase`, which the same command continues from."""
        self.phase = phase
        if self.enabled and self.phase_state is not None:
            with stopping.deferred():  # a stop waits until the record is whole
                checkpoint.phase.write(self.layout.checkpoints, phase, state=self.phase_state, result=result)

    def clear_phase(self) -> None:
        """A fresh start: no phase of an earlier run in this directory stays."""
        if self.enabled:
            checkpoint.phase.clear(self.layout.checkpoints)

    def save_best(self, raw_model) -> None:
        """The best epoch's weights in the hub layout, adapters merged (:func:`finetune.merged`);
        a LoRA run's adapters alone beside them, in peft's format; a tokens+return run's return head
        beside them as ``return_head.safetensors``."""
        if self.enabled:
            with stopping.deferred():  # a stop signal waits until the checkpoint is whole
                finetune.merged(raw_model).save_pretrained(self.layout.best_model)
                if (head := return_head.head_of(raw_model)) is not None:  # beside the backbone, its own file
                    return_head.save_head(head, self.layout.best_model, lookback=head.lookback, horizon=head.horizon)
                if self.config is not None:
                    finetune.save_adapter(raw_model, self.config, self.layout.best_adapter)

    def save_start(self, raw_model) -> None:
        """The weights the run starts from, kept for the end-of-run test verdict (a resumed run
        still compares with them)."""
        if self.enabled:
            with stopping.deferred():
                finetune.merged(raw_model).save_pretrained(self.layout.start_model)

    def save_state(self, **state: Any) -> None:
        if self.enabled:
            with stopping.deferred():
                checkpoint.save_training_state(self.layout.training_state, **state)

    def log_plots(self, stage: TrainingStage, logger: ExperimentLogger, config, val_ds, stats,
                  best_epoch: int) -> None:
        if self.enabled:  # PNGs under plots/ of the run, drawn from the best checkpoint
            stage.log_plots(logger, config, self.layout.root, val_ds, stats, best_epoch)

    def save_stage_files(self, stage: TrainingStage) -> None:
        """What the stage keeps in the run directory from its start (a predictor's tokenizer)."""
        if self.enabled:
            with stopping.deferred():
                stage.save_start_files(self.layout)


# --------------------------------------------------------------------------- the pieces of a run


@dataclass
class RunData:
    """The training and validation splits, and this rank's loaders over them."""

    train_ds: QlibDataset
    val_ds: QlibDataset
    train_loader: Any
    val_loader: Any

    @property
    def has_val(self) -> bool:
        return len(self.val_ds) > 0


def load_data(config: Mapping[str, Any], rank: int, world_size: int, device, console: Console) -> RunData:
    """The splits and this rank's share of their batches. No training window, or fewer than one
    batch per process, is a one-line error; no validation window is a warning."""
    data = as_section(config, "data")
    train_ds = QlibDataset("train", config)
    val_ds = QlibDataset("val", config)
    if len(train_ds) == 0:
        raise UserError(
            f"no training windows for instrument '{data.instrument}' in {':'.join(data.train_time_range)}; "
            "widen train_time_range or choose another instrument"
        )
    if len(val_ds) == 0:
        console.warn(f"no validation windows in {':'.join(data.val_time_range)}: training runs without "
                     "validation and keeps the last epoch as best_model")
    train_loader = train_loader_for(train_ds, config, rank, world_size, device)
    val_loader = val_loader_for(val_ds, config, rank, world_size)
    if len(train_loader) == 0:
        raise ConfigError(
            f"batch_size {as_section(config, 'training').batch_size} x {world_size} process(es) is more than the "
            f"{len(train_ds)} training windows per epoch; lower batch_size or raise n_train_iter"
        )
    return RunData(train_ds, val_ds, train_loader, val_loader)


class EpochHook(Protocol):
    """Work :func:`fit` runs after each epoch's validation without knowing what it is
    (``objective: val_skill``'s scorer, :class:`kronos_mlflow.evaluation.val_skill.ValSkill`, is
    one). Every rank calls each method; ``after_epoch`` may be a collective."""

    def describe(self) -> str:
        """The line printed before the first epoch."""

    def restore(self, extra: Mapping[str, Any]) -> None:
        """Take back what :meth:`state` kept, from a resumed training state's ``extra`` (``{}`` when fresh)."""

    def after_epoch(self, raw_model, epoch: int, logger: ExperimentLogger, console: Console) -> None:
        """The epoch's work on its weights, logged at ``step=epoch``."""

    def objective(self, epoch: int, value: float | None) -> float | None:
        """What a sweep's pruner reads after ``epoch``, given what it would read without this hook."""

    def state(self) -> dict[str, Any]:
        """What a training state keeps for :meth:`restore` (JSON)."""

    def finish(self, best_epoch: int, logger: ExperimentLogger) -> dict[str, Any]:
        """What the run's result records of the kept checkpoint's epoch (logged too)."""

    def forecasts(self) -> dict[str, Any]:
        """Forecasts it drew with the kept checkpoint's weights, for the end of the run to reuse
        instead of drawing them again: ``{origins digest: close paths (n, S, H)}`` (``{}``: none)."""


@dataclass
class Progress:
    """Where the loop stands between epochs: what a training state saves and a resume restores."""

    start_epoch: int = 0
    global_step: int = 0
    best_val_loss: float = math.inf
    best_epoch: int = -1
    history: list[float] = field(default_factory=list)  # validation loss of each epoch
    initial: float | None = None  # validation loss of the starting weights
    best: Validation | None = None  # the best epoch's validation: its metrics and what the plots read
    extra: dict[str, Any] = field(default_factory=dict)  # a resumed state's extra: what the epoch hooks kept
    frozen_digest: str = ""  # a LoRA or freeze run's frozen weights (finetune.frozen_digest)


def resume_or_start(raw_model, optimizer, scheduler, data: RunData, device, logger: ExperimentLogger,
                    console: Console, *, rank: int, resume_state: Mapping[str, Any] | None,
                    last_epoch: int, stage: TrainingStage, config: Mapping[str, Any]) -> Progress:
    """The progress of the killed run that ``resume_state`` names, loaded into the model,
    optimizer and scheduler; without one, a fresh start after validating the starting weights."""
    if resume_state is None:
        initial = (stage.run_validation(raw_model, val_batches(data, console, "starting weights: validation"), device,
                                  detailed=False).loss if data.has_val else None)
        if initial is not None:
            logger.log_metrics({stage.initial_val_metric: initial}, step=0)
            console.print(f"starting weights: val_loss={initial:.6f}")
        return Progress(initial=initial)
    # Every rank loads the same state: weights, AdamW moments, schedule position, its RNG.
    partial = finetune.partial(config)
    state = checkpoint.load_training_state(resume_state["directory"], model=raw_model, optimizer=optimizer,
                                           scheduler=scheduler, map_location=device, rank=rank, trained_only=partial)
    if partial and state["extra"].get("frozen_digest") != finetune.frozen_digest(raw_model):
        # the state holds the trained tensors only: they resume onto the base they were trained on
        raise CheckpointError(
            f"training state '{state['directory']}': the frozen weights the run starts from are not the ones it was "
            "trained on (its starting checkpoint changed since); resume with the checkpoint that made it, or delete "
            "that directory to start over")
    extra = state["extra"]
    progress = Progress(
        start_epoch=state["next_epoch"], global_step=state["global_step"],
        best_val_loss=state["best_val_loss"] if state["best_val_loss"] is not None else math.inf,
        best_epoch=int(extra.get("best_epoch", -1)), history=list(extra.get("val_loss_history", [])),
        initial=extra.get("val_loss_initial"),
        extra=dict(extra),
    )
    if progress.start_epoch > last_epoch:  # stopped after its training: what follows it continues
        reached = (resume_state.get("phase") or {}).get("phase", checkpoint.phase.TRAINED)
        console.print(f"training is complete ({last_epoch + 1} epochs, {progress.global_step} steps, best val_loss "
                      f"{progress.best_val_loss:.6f}); continuing its run after the phase it reached ({reached}) "
                      f"with its best checkpoint, without training again ({state['directory']})")
        return progress
    console.print(f"resuming at epoch {progress.start_epoch + 1}/{last_epoch + 1} (step {progress.global_step}, "
                  f"best val_loss {progress.best_val_loss:.6f}) from {state['directory']}")
    return progress


def save_progress(files: RunFiles, logger: ExperimentLogger, raw_model, optimizer, scheduler, progress: Progress,
                  epoch: int, *, config: Mapping[str, Any], world_size: int,
                  run_ids: Mapping[str, Any] | None, hooks: Sequence[EpochHook] = ()) -> None:
    """The training state after ``epoch`` (-1: before the first), written where ``files`` writes.
    Every rank calls it: the RNG states are gathered from all of them. A stop signal that arrives
    meanwhile waits until the state is whole (the metrics it counts as done included), so a stop
    at any point of the save keeps this epoch."""
    with stopping.deferred():
        rng_states = checkpoint.gather_rng_states()  # a collective: every rank
        logger.persist()  # metrics of the steps this state says are done: sent or on disk
        best = progress.best_val_loss
        files.save_state(
            model=raw_model, optimizer=optimizer, scheduler=scheduler, epoch=epoch, global_step=progress.global_step,
            best_val_loss=best if math.isfinite(best) else None,
            run_ids=run_ids or {}, config_digest=checkpoint.config_digest(config, world_size=world_size),
            config={**config, "world_size": world_size},
            extra={"best_epoch": progress.best_epoch, "val_loss_history": progress.history,
                   "val_loss_initial": progress.initial, **{k: v for hook in hooks for k, v in hook.state().items()},
                   **({"frozen_digest": progress.frozen_digest} if finetune.partial(config) else {}),
                   # the last epoch's state: the training is done (what follows is in phase.json)
                   **({"phase": checkpoint.phase.TRAINED}
                      if epoch == as_section(config, "training").epochs - 1 else {})},
            rng_states=rng_states, trained_only=finetune.partial(config),
        )


class EpochValidation(NamedTuple):
    """What :func:`validate_epoch` found."""

    validation: Validation  # loss over every rank's samples (None without a validation split), metrics
    improved: bool  # this epoch is the best so far: its checkpoint was saved

    @property
    def loss(self) -> float | None:
        return self.validation.loss


def val_batches(data: RunData, console: Console | None, desc: str):
    """The validation loader, its batches done shown on rank 0 when it takes long
    (:meth:`Console.progress`: a line each ``progress_seconds``, a bar on a terminal)."""
    loader = data.val_loader
    return console.progress(loader, len(loader), desc) if console is not None else loader


def validate_epoch(raw_model, data: RunData, device, epoch: int, progress: Progress, logger: ExperimentLogger,
                   files: RunFiles, stage: TrainingStage, console: Console | None = None,
                   desc: str = "validation") -> EpochValidation:
    """The epoch's validation (a collective) and its metrics; the best checkpoint when it improved.
    Without a validation split every epoch is the best, so the last one is kept."""
    val = (stage.run_validation(raw_model, val_batches(data, console, desc), device) if data.has_val
           else Validation(None, {}, None))
    improved = False
    if val.loss is not None:
        progress.history.append(val.loss)
        logger.log_metrics({stage.val_metric: val.loss, **val.metrics}, step=epoch)
        if val.loss < progress.best_val_loss:
            progress.best_val_loss, progress.best_epoch, improved, progress.best = val.loss, epoch, True, val
    else:
        progress.best_epoch, improved = epoch, True
    if improved:
        files.save_best(raw_model)
    return EpochValidation(val, improved)


def finish_run(progress: Progress, data: RunData, device, config: Mapping[str, Any], logger: ExperimentLogger,
               files: RunFiles, stage: TrainingStage, hooks: Sequence[EpochHook] = ()) -> dict[str, Any]:
    """The run's result, ``best_val_loss`` logged, and the best epoch's validation plots."""
    best_val_loss, best = progress.best_val_loss, progress.best
    result = {
        "best_val_loss": best_val_loss if math.isfinite(best_val_loss) else float("nan"),
        "best_epoch": progress.best_epoch,
        "val_loss_history": progress.history,
        "val_loss_initial": progress.initial,
        "steps": progress.global_step,
        "best_val_quality": best.metrics if best is not None else None,
    }
    if math.isfinite(best_val_loss):
        logger.log_metrics({BEST_METRIC: best_val_loss}, step=progress.best_epoch)
    for hook in hooks:  # what each hook records of the kept checkpoint
        result.update(hook.finish(progress.best_epoch, logger))
    if data.has_val and best is None and progress.best_epoch >= 0:
        # Resumed after the best epoch: its statistics are recomputed from best_model.
        best = stage.best_validation(files.layout.best_model, data.val_loader, device)
        result["best_val_quality"] = best.metrics
    files.log_plots(stage, logger, config, data.val_ds if data.has_val else None, best.stats if best else None,
                    progress.best_epoch)
    return result


def judge_on_test(progress: Progress, device, config: Mapping[str, Any], logger: ExperimentLogger, files: RunFiles,
                  console: Console, *, rank: int, world_size: int, stage: TrainingStage) -> dict[str, Any]:
    """The best checkpoint against the starting weights on the test windows (a collective:
    every rank), logged at the best epoch; its record for the result (docs/verdict.md)."""
    layout = files.layout
    heldout = evaluate_run(config, layout.best_model, layout.start_model, device, rank=rank, world_size=world_size,
                           logger=logger, console=console, step=max(progress.best_epoch, 0), stage=stage.heldout)
    return heldout.as_json()


def phase_state(config: Mapping[str, Any], world_size: int, progress: Progress,
                run_ids: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ties the phases after the last epoch to the training state saved after it."""
    return checkpoint.phase.state_key({"run_ids": run_ids or {}, "global_step": progress.global_step,
                                       "config_digest": checkpoint.config_digest(config, world_size=world_size)})


def after_training(progress: Progress, data: RunData, device, config: Mapping[str, Any], logger: ExperimentLogger,
                   files: RunFiles, console: Console, *, rank: int, world_size: int, stage: TrainingStage,
                   hooks: Sequence[EpochHook], run_ids: Mapping[str, Any] | None,
                   record: Mapping[str, Any] | None) -> dict[str, Any]:
    """What follows the last epoch, phase by phase: :func:`finish_run` (``summarized``),
    :func:`judge_on_test` (``verdict``), the stage's scorecard or calibrator (``scorecard`` /
    ``calibration``). Each phase that completes is recorded with the result so far
    (:mod:`~kronos_mlflow.training.checkpoint.phase`); ``record``, a stopped run's, says which are
    done: they are not done again, their numbers come from it."""
    files.phase_state = phase_state(config, world_size, progress, run_ids)
    files.phase = record["phase"] if record else checkpoint.phase.TRAINED
    done = functools.partial(checkpoint.phase.done, record)
    result: dict[str, Any] = dict(record["result"]) if record else {}
    if not done("summarized"):
        result = finish_run(progress, data, device, config, logger, files, stage, hooks)
        files.record_phase("summarized", result)
    if not done("verdict"):
        result["test"] = judge_on_test(progress, device, config, logger, files, console, rank=rank,
                                       world_size=world_size, stage=stage)
        files.record_phase("verdict", result)
    if not done("scorecard"):
        reused: dict[str, Any] = {}
        for hook in hooks:
            reused.update(hook.forecasts())
        card = stage.scorecard(config, files.layout, device, rank=rank, world_size=world_size, logger=logger,
                               console=console, step=max(progress.best_epoch, 0), reused=reused)
        if card is not None:
            result["scorecard"] = card.as_json()
        evaluation = as_section(config, "evaluation")
        alone = card is None and evaluation.evaluate == "off" and evaluation.calibration in ("on", "auto")
        files.record_phase("calibration" if alone else "scorecard", result)
    return result


# --------------------------------------------------------------------------- the loop


def fit(model, device, config: Mapping[str, Any], logger: ExperimentLogger, files: RunFiles, console: Console, *,
        rank: int = 0, world_size: int = 1, should_stop: Callable[[int, float | None], bool] | None = None,
        resume_state: Mapping[str, Any] | None = None, run_ids: Mapping[str, Any] | None = None,
        stage: TrainingStage, hooks: Sequence[EpochHook] = ()) -> dict[str, Any]:
    """Train ``model`` (DDP-wrapped or plain) for ``config["epochs"]`` and keep the best checkpoint:
    upstream's AdamW, one-cycle learning rate, gradient accumulation and gradient clipping. It reads
    as the loop itself; what it does once is in named pieces: :func:`load_data`,
    :func:`resume_or_start` (a killed run's state, or the starting weights' validation),
    :func:`validate_epoch` (validation, its metrics, the best checkpoint), :func:`save_progress` (the
    training state), then :func:`after_training`: :func:`finish_run` (the result and the plots),
    :func:`judge_on_test` (the best checkpoint against the starting weights on the test windows: the
    verdict) and the stage's scorecard, each phase recorded so that a run stopped after its
    training continues there (``resume_state`` saved after the last epoch: no epoch runs again).

    ``stage`` (:mod:`kronos_mlflow.stages`: its spec's ``training``) supplies the loss, the
    validation and its metrics, the plots and the held-out comparison. ``hooks`` run after each
    epoch's validation (:class:`EpochHook`; ``objective: val_skill``'s scorer is one).

    Every rank calls it with its own share (``rank``/``world_size`` pick the batches).
    ``should_stop(epoch, value)`` (a sweep's pruner, rank 0's) runs after each validation with the
    epoch's validation loss, or what a hook makes the objective (``val_skill``: the epoch's skill); if
    it says stop, every rank raises :class:`TrainingPruned`. ``resume_state`` (from
    :func:`kronos_mlflow.training.checkpoint.find_resumable`) continues a killed run; ``run_ids`` go into
    each training state so that the resumed run continues the same MLflow run and Comet
    experiment. Returns ``best_val_loss``, ``best_epoch``, ``val_loss_history``,
    ``val_loss_initial``, ``steps``, ``best_val_quality``, ``test`` (the test verdict's record) and,
    for a stage with one, ``scorecard`` (the forecast evaluation's record).
    """
    raw_model = unwrap(model)
    data = load_data(config, rank, world_size, device, console)
    steps_per_epoch = len(data.train_loader)
    optimizer = build_optimizer(raw_model, config, log=console.print)
    scheduler = build_scheduler(optimizer, config, steps_per_epoch)
    precision = resolve_precision(as_section(config, "performance").precision, device)
    # Metrics, summary.json and plots count epochs from 0 (the metric step); the console from 1.
    epochs = as_section(config, "training").epochs
    last_epoch = epochs - 1

    progress = resume_or_start(raw_model, optimizer, scheduler, data, device, logger, console, rank=rank,
                               resume_state=resume_state, last_epoch=last_epoch, stage=stage, config=config)
    if finetune.partial(config):
        progress.frozen_digest = finetune.frozen_digest(raw_model)
    for hook in hooks:
        hook.restore(progress.extra)
        console.print(hook.describe())
    save_state = functools.partial(save_progress, files, logger, raw_model, optimizer, scheduler, progress,
                                   config=config, world_size=world_size, run_ids=run_ids, hooks=hooks)
    if resume_state is None:
        files.clear_phase()  # an earlier run's phases in this directory are not this run's
        files.save_start(raw_model)  # the test verdict's base, also for a resumed run
        files.save_stage_files(stage)
        save_state(-1)  # a crash in the first epoch resumes into this run, not a new one
    model.train()
    for epoch in range(progress.start_epoch, epochs):
        t0 = time.time()
        data.train_ds.set_epoch_seed(epoch)
        data.val_ds.set_epoch_seed(0)
        running, progress.global_step = train_epoch(model, optimizer, scheduler, data.train_loader, device, config,
                                                    precision, logger, console, progress.global_step,
                                                    f"epoch {epoch + 1}/{last_epoch + 1}", stage)
        val = validate_epoch(raw_model, data, device, epoch, progress, logger, files, stage, console,
                             f"epoch {epoch + 1}/{last_epoch + 1}: validation")
        shown = f"{val.loss:.6f}" if val.loss is not None else "n/a"
        console.print(f"epoch {epoch + 1}/{last_epoch + 1}: train_loss={running / steps_per_epoch:.6f} "
                      f"val_loss={shown} best={progress.best_val_loss:.6f} ({time.time() - t0:.1f}s)"
                      + (" *saved*" if val.improved else ""))
        if stage.describe(val.validation):
            console.print(f"  {stage.describe(val.validation)}")
        for hook in hooks:
            hook.after_epoch(raw_model, epoch, logger, console)
        # The training state after this epoch (after best_model: a state never points at a best
        # checkpoint that is not on disk).
        save_state(epoch)
        value = val.loss
        for hook in hooks:
            value = hook.objective(epoch, value)
        stop = bool(should_stop(epoch, value)) if should_stop is not None else False
        # Every rank learns rank 0's decision (the sum is 0 unless rank 0 said stop).
        if dist_sum([1.0 if stop else 0.0])[0] > 0:
            console.print(f"pruned after epoch {epoch + 1}/{last_epoch + 1}")
            if epoch == last_epoch:  # its state says trained: a pruned trial is not continued
                files.phase_state = phase_state(config, world_size, progress, run_ids)
                files.record_phase("pruned")
            raise TrainingPruned(f"pruned after epoch {epoch + 1}/{last_epoch + 1} with val_loss {val.loss}")
        barrier()
    return after_training(progress, data, device, config, logger, files, console, rank=rank, world_size=world_size,
                          stage=stage, hooks=hooks, run_ids=run_ids,
                          record=(resume_state or {}).get("phase") if progress.start_epoch > last_epoch else None)
