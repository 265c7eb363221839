"""Fine-tune the Kronos tokenizer: the torchrun entry point.

One process (CPU or one GPU)::

    python -m kronos_mlflow.train --epochs 1 --qlib-data-path ''            # demo market

Several processes on one machine (NCCL on GPUs, gloo on CPUs)::

    torchrun --standalone --nproc_per_node 2 -m kronos_mlflow.train --epochs 30

Through MLflow Projects (runs the same torchrun command, see ``MLproject``)::

    mlflow run . --env-manager local -P epochs=30 -P nproc_per_node=2

Every config key is a flag (``--tokenizer-learning-rate`` or ``--learning-rate``, dashes or
underscores; time ranges as ``START:END``), plus ``--config FILE.yaml``. ``--check`` validates
everything a run needs (config, data directory, pretrained checkpoint, tracking server) in one
process and exits: the MLproject runs it before starting torchrun, so bad input costs one
clear line and exit code 2 instead of a failed process group.

The training semantics are upstream Kronos's ``finetune/train_tokenizer.py``: AdamW, one-cycle
learning rate, gradient accumulation, clip at norm 2.0, loss
``(mse(z_pre, x) + mse(z, x) + bsq_loss) / 2``, validation MSE of the full reconstruction
averaged over every validation sample of every rank, best checkpoint saved by rank 0.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from . import config as cfg
from .errors import EXIT_USAGE, ConfigError, UserError

# Per-step metrics, upstream's Comet names (existing dashboards keep working).
STEP_METRICS = (
    "train_tokenizer_loss_batch",
    "train_vqvae_vq_loss_each_batch",
    "train_recon_loss_pre_each_batch",
    "train_recon_loss_each_batch",
    "tokenizer_learning_rate",
)
VAL_METRIC = "val_tokenizer_loss_epoch"
INITIAL_VAL_METRIC = "val_tokenizer_loss_initial"

# MLproject parameter names -> config keys; logged as params under the MLproject names.
MLPROJECT_PARAMS: dict[str, str] = {
    "epochs": "epochs",
    "learning_rate": "tokenizer_learning_rate",
    "weight_decay": "adam_weight_decay",
    "batch_size": "batch_size",
    "accumulation_steps": "accumulation_steps",
    "n_train_iter": "n_train_iter",
    "n_val_iter": "n_val_iter",
    "nproc_per_node": "nproc_per_node",
    "qlib_data_path": "qlib_data_path",
    "instrument": "instrument",
    "train_time_range": "train_time_range",
    "val_time_range": "val_time_range",
    "test_time_range": "test_time_range",
    "pretrained_tokenizer_path": "pretrained_tokenizer_path",
    "seed": "seed",
    "comet": "comet",
    "registered_model_name": "registered_model_name",
}


# --------------------------------------------------------------------------- helpers


def run_params(config: Mapping[str, Any]) -> dict[str, str]:
    """What a run records as params: the MLproject names, then the whole resolved config."""
    flat = cfg.flatten(config)
    params = {name: flat[key] for name, key in MLPROJECT_PARAMS.items()}
    params.update(flat)
    return params


def default_run_name(config: Mapping[str, Any]) -> str:
    return f"lr={config['tokenizer_learning_rate']:.0e} wd={config['adam_weight_decay']:g}"


def save_dir_of(config: Mapping[str, Any]) -> str:
    return os.path.join(os.path.expanduser(config["save_path"]), config["tokenizer_save_folder_name"])


def build_model(config: Mapping[str, Any]):
    """The pretrained checkpoint when a path is given, else fresh weights (base architecture)."""
    from .model import KronosTokenizer

    path = config["pretrained_tokenizer_path"]
    if path:
        return KronosTokenizer.from_pretrained(path)
    return KronosTokenizer(**cfg.model_kwargs(config))


def compute_loss(model, x, precision: str = "fp32"):
    """Upstream's objective. Returns (loss, parts) with parts as detached tensors.

    ``bsq_loss`` (commitment + entropy terms) is weighted like each reconstruction term; the
    sum is halved so the scale matches upstream's logged numbers. ``precision`` is a resolved
    one (:func:`kronos_mlflow.perf.resolve_precision`): ``bf16`` runs the forward under autocast;
    the losses are always computed in float32.
    """
    import torch.nn.functional as F

    from .perf import autocast

    with autocast(precision, x.device):
        (z_pre, z), bsq_loss, _, _ = model(x)
    recon_pre = F.mse_loss(z_pre.float(), x)
    recon_all = F.mse_loss(z.float(), x)
    loss = (recon_pre + recon_all + bsq_loss.float()) / 2
    return loss, {"bsq": bsq_loss.detach(), "recon_pre": recon_pre.detach(), "recon_all": recon_all.detach()}


def train_step(model, optimizer, batch_x, config, precision: str | None = None):
    """One optimizer step on ``batch_x`` (on the device), as upstream takes it.

    ``accumulation_steps`` sub-batches (under DDP gradients are all-reduced on the last one
    only), clip to ``grad_clip_norm``, AdamW step, gradients dropped. Returns ``(loss, parts)``:
    the mean loss over the sub-batches and the last sub-batch's parts, all detached 0-d tensors
    that are not read here, so a GPU is not synchronised (read them together, once).
    """
    import torch

    from .perf import resolve_precision

    if precision is None:
        precision = resolve_precision(config["precision"], batch_x.device)
    accum = config["accumulation_steps"]
    sub = batch_x.shape[0] // accum
    total = None
    for j in range(accum):
        x = batch_x[j * sub:(j + 1) * sub]
        # Under DDP, gradients are all-reduced only on the last sub-batch.
        sync = j == accum - 1 or not hasattr(model, "no_sync")
        ctx = model.no_sync() if not sync else _nullcontext()
        with ctx:
            loss, parts = compute_loss(model, x, precision)
            (loss / accum if accum > 1 else loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=config["grad_clip_norm"])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return (total / accum if accum > 1 else total), parts


def configure_process(config, device, local_world_size: int | None = None, run_steps: int | None = None) -> dict:
    """Per-process speed settings: intra-op threads (``num_threads``; 0 = CPUs / local
    processes), one inter-op thread, and TF32 matmuls for bf16 runs on CUDA. Returns the
    resolved settings (threads, precision, compile, AdamW kernel, fused layers)."""
    from . import perf

    threads = perf.configure_threads(config["num_threads"], local_world_size)
    perf.configure_malloc(config["malloc_reuse"])
    perf.configure_matmul(perf.resolve_precision(config["precision"], device), device)
    return {**perf.describe(config, device, run_steps), **threads}


def describe_speed_settings(config, device, run_steps: int | None = None) -> dict:
    """The resolved speed settings of ``config`` on ``device`` (for logs and the benchmark)."""
    from . import perf

    return perf.describe(config, device, run_steps)


def prepare_model(model, config, device, distributed: bool = False, run_steps: int | None = None):
    """The model as training calls it: the fused path on or off (``fused_layers``), wrapped in
    DDP when ``distributed``, then ``torch.compile``d when ``compile`` resolves to on (``auto``
    on CPU weighs ``run_steps``, the run's optimizer steps; None = a long run).
    :func:`unwrap_model` gives the plain module back (for validation and checkpoints)."""
    import torch

    from .perf import compile_model, resolve_compile, resolve_fused

    if hasattr(model, "set_fused"):
        model.set_fused(resolve_fused(config["fused_layers"], device))
    if distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        device = torch.device(device)
        ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
        # The buffers (rotary frequencies, code bases) are constants: no per-forward sync.
        if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
            ddp_kwargs["forward_sync_buffers"] = False
        else:
            ddp_kwargs["broadcast_buffers"] = False
        model = DDP(model, **ddp_kwargs)
    if resolve_compile(config["compile"], device, run_steps):
        model = compile_model(model, config["compile"])
    return model


def unwrap_model(model):
    """The plain module under ``torch.compile`` and DDP wrappers."""
    from torch.nn.parallel import DistributedDataParallel

    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif "_orig_mod" in getattr(model, "_modules", {}):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def _loader(ds, batch_size: int, indices=None, drop_last: bool = False, num_workers: int = 0, sampler=None):
    from torch.utils.data import DataLoader

    if sampler is None and indices is not None:
        sampler = indices
    return DataLoader(
        ds,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=False,
        drop_last=drop_last,
        num_workers=num_workers,
        collate_fn=getattr(ds, "collate_fn", None),
        pin_memory=False,
        persistent_workers=num_workers > 0,
    )


def train_loader_for(ds, config, rank: int, world_size: int, device=None):
    """Each rank takes its own share of the epoch (DistributedSampler, no padding repeats).

    ``ds[i]`` is the epoch's i-th window, so sampling indices in order is already a shuffle.
    On a CUDA ``device`` the windows are gathered and normalised on the GPU itself
    (:class:`~kronos_mlflow.perf.DeviceWindowLoader`: same batches, same order), so the loader
    never holds the GPU back; elsewhere it is the DataLoader.
    """
    from torch.utils.data.distributed import DistributedSampler

    if device is not None and str(device).startswith("cuda"):
        from .perf import DeviceWindowLoader

        return DeviceWindowLoader(ds, config["batch_size"], device, rank, world_size, drop_last=True)

    sampler = None
    if world_size > 1:
        sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=False, drop_last=True)
    return _loader(ds, config["batch_size"], sampler=sampler, drop_last=True, num_workers=config["num_workers"])


def val_loader_for(ds, config, rank: int, world_size: int):
    """Validation shards by striding, keeping every sample exactly once over all ranks."""
    return _loader(ds, config["batch_size"], indices=range(rank, len(ds), world_size),
                   num_workers=config["num_workers"])


def evaluate(model, loader, device, stats=None) -> tuple[float, int]:
    """Sum of per-batch MSE x batch size, and the sample count, on this rank.

    ``stats`` (a :class:`~kronos_mlflow.quality.ValidationStats`) also gathers codebook use and
    per-feature errors from the same forward passes: still one pass over the data.
    """
    import torch
    import torch.nn.functional as F

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


def _progress(iterable, total, desc, enabled):
    from tqdm.auto import tqdm

    enabled = enabled and os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true", "yes")
    return tqdm(iterable, total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


def _global_val_loss(model, loader, device, stats=None) -> float | None:
    """Validation MSE over every rank's samples; ``stats`` (if given) is summed over ranks too."""
    from .distributed import dist_sum

    total, count = evaluate(model, loader, device, stats)
    total, count = dist_sum([total, count])
    if stats is not None:
        stats.all_reduce()
    return total / count if count else None


# --------------------------------------------------------------------------- training


class TrainingPruned(Exception):
    """The sweep's pruner stopped this trial after an epoch; its metrics stay logged."""


def train_model(model, device, config, save_dir, logger, rank, world_size, epoch_callback=None,
                resume_state=None, run_ids=None):
    """Train ``model`` (DDP-wrapped or plain) and keep the best checkpoint.

    Returns ``(model, {"best_val_loss": float})``. ``logger`` is an experiment logger on rank 0
    and ``None`` elsewhere; every rank takes part in the collectives. ``epoch_callback(epoch,
    val_loss) -> bool`` runs on rank 0 after each validation (a sweep's pruner); True stops
    every rank with :class:`TrainingPruned`.
    """
    import torch

    from .data import QlibDataset
    from .distributed import barrier, dist_sum
    from .loggers import NullLogger
    from .quality import ValidationStats
    from .quality import describe as describe_quality

    logger = logger if logger is not None else NullLogger()
    is_main = rank == 0
    raw_model = unwrap_model(model)

    train_ds = QlibDataset("train", config)
    val_ds = QlibDataset("val", config)
    if len(train_ds) == 0:
        raise UserError(
            f"no training windows for instrument '{config['instrument']}' in {':'.join(config['train_time_range'])}; "
            "widen train_time_range or choose another instrument"
        )
    if len(val_ds) == 0 and is_main:
        warnings.warn(
            f"no validation windows in {':'.join(config['val_time_range'])}: training runs without validation "
            "and keeps the last epoch as best_model", stacklevel=2
        )
    train_loader = train_loader_for(train_ds, config, rank, world_size, device)
    val_loader = val_loader_for(val_ds, config, rank, world_size)
    steps_per_epoch = len(train_loader)
    if steps_per_epoch == 0:
        raise ConfigError(
            f"batch_size {config['batch_size']} x {world_size} process(es) is more than the "
            f"{len(train_ds)} training windows per epoch; lower batch_size or raise n_train_iter"
        )

    optimizer = build_optimizer(raw_model, config, log=is_main)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer=optimizer,
        max_lr=config["tokenizer_learning_rate"],
        steps_per_epoch=steps_per_epoch,
        epochs=config["epochs"],
        pct_start=0.03,
        div_factor=10,
    )
    has_val = len(val_ds) > 0
    from .perf import resolve_precision

    precision = resolve_precision(config["precision"], device)

    from . import checkpoint

    best_val_loss = math.inf
    best_epoch = -1
    best_stats = None  # codebook use and per-feature errors at the best epoch (for the plots)
    history: list[float] = []
    global_step = 0
    start_epoch = 0
    if resume_state is not None:
        # Every rank loads the same state: weights, AdamW moments, schedule position, its RNG.
        state = checkpoint.load_training_state(resume_state["directory"], model=raw_model, optimizer=optimizer,
                                               scheduler=scheduler, map_location=device, rank=rank)
        start_epoch, global_step = state["next_epoch"], state["global_step"]
        if state["best_val_loss"] is not None:
            best_val_loss = state["best_val_loss"]
        extra = state["extra"]
        best_epoch = int(extra.get("best_epoch", -1))
        history = list(extra.get("val_loss_history", []))
        initial = extra.get("val_loss_initial")
        if is_main:
            print(f"[kronos] resuming after epoch {start_epoch}/{config['epochs']} (step {global_step}, "
                  f"best val_loss {best_val_loss:.6f}) from {state['directory']}", flush=True)
    else:
        initial = _global_val_loss(raw_model, val_loader, device) if has_val else None
        if initial is not None:
            logger.log_metrics({INITIAL_VAL_METRIC: initial}, step=0)
            if is_main:
                print(f"[kronos] starting weights: val_loss={initial:.6f}", flush=True)
    digest = checkpoint.config_digest(config, world_size=world_size)

    def save_state(epoch: int) -> None:
        rng_states = checkpoint.gather_rng_states()  # a collective: every rank
        if is_main:
            logger.persist()  # metrics of the steps this state says are done: sent or on disk
            checkpoint.save_training_state(
                checkpoint.state_dir(save_dir), model=raw_model, optimizer=optimizer, scheduler=scheduler,
                epoch=epoch, global_step=global_step,
                best_val_loss=best_val_loss if math.isfinite(best_val_loss) else None,
                run_ids=run_ids or {}, config_digest=digest, config={**config, "world_size": world_size},
                extra={"best_epoch": best_epoch, "val_loss_history": history, "val_loss_initial": initial},
                rng_states=rng_states,
            )

    if resume_state is None:
        save_state(-1)  # a crash in the first epoch resumes into this run, not a new one
    model.train()
    for epoch in range(start_epoch, config["epochs"]):
        t0 = time.time()
        train_ds.set_epoch_seed(epoch)
        val_ds.set_epoch_seed(0)
        running = 0.0
        for batch_x, _ in _progress(train_loader, steps_per_epoch, f"epoch {epoch + 1}/{config['epochs']}", is_main):
            batch_x = batch_x.to(device, non_blocking=True)
            loss, parts = train_step(model, optimizer, batch_x, config, precision)
            scheduler.step()
            # One device read for the four numbers (one GPU sync per step, not four).
            avg, bsq, recon_pre, recon_all = torch.stack(
                [loss.float(), parts["bsq"].float(), parts["recon_pre"].float(), parts["recon_all"].float()]
            ).tolist()
            running += avg
            logger.log_metrics(
                {
                    "train_tokenizer_loss_batch": avg,
                    "train_vqvae_vq_loss_each_batch": bsq,
                    "train_recon_loss_pre_each_batch": recon_pre,
                    "train_recon_loss_each_batch": recon_all,
                    "tokenizer_learning_rate": optimizer.param_groups[0]["lr"],
                },
                step=global_step,
            )
            global_step += 1
            if is_main and global_step % config["log_interval"] == 0:
                print(f"[kronos] step {global_step}: loss={avg:.6f} lr={optimizer.param_groups[0]['lr']:.3e}", flush=True)

        stats = ValidationStats.for_model(raw_model, device) if has_val else None
        val_loss = _global_val_loss(raw_model, val_loader, device, stats) if has_val else None
        quality_metrics = stats.metrics() if stats is not None else {}
        improved = False
        if val_loss is not None:
            history.append(val_loss)
            logger.log_metrics({VAL_METRIC: val_loss, **quality_metrics}, step=epoch)
            if val_loss < best_val_loss:
                best_val_loss, best_epoch, improved, best_stats = val_loss, epoch, True, stats
        else:
            best_epoch, improved = epoch, True
        if is_main and improved:
            raw_model.save_pretrained(os.path.join(save_dir, "checkpoints", "best_model"))
        if is_main:
            shown = f"{val_loss:.6f}" if val_loss is not None else "n/a"
            print(
                f"[kronos] epoch {epoch + 1}/{config['epochs']}: train_loss={running / steps_per_epoch:.6f} "
                f"val_loss={shown} best={best_val_loss:.6f} ({time.time() - t0:.1f}s)"
                + (" *saved*" if improved else ""),
                flush=True,
            )
            if quality_metrics:
                print(f"[kronos]   {describe_quality(quality_metrics, stats.s1_bits, stats.s2_bits)}", flush=True)
        # The training state after this epoch (after best_model: a state never points at a best
        # checkpoint that is not on disk).
        save_state(epoch)
        stop = bool(epoch_callback(epoch, val_loss)) if (is_main and epoch_callback) else False
        # Every rank learns rank 0's decision (the sum is 0 unless rank 0 said stop).
        if dist_sum([1.0 if stop else 0.0])[0] > 0:
            if is_main:
                print(f"[kronos] pruned after epoch {epoch + 1}", flush=True)
            raise TrainingPruned(f"pruned after epoch {epoch + 1} with val_loss {val_loss}")
        barrier()

    result = {
        "best_val_loss": best_val_loss if math.isfinite(best_val_loss) else float("nan"),
        "best_epoch": best_epoch,
        "val_loss_history": history,
        "val_loss_initial": initial,
        "steps": global_step,
        "best_val_quality": best_stats.metrics() if best_stats is not None else None,
    }
    if math.isfinite(best_val_loss):
        logger.log_metrics({"best_val_loss": best_val_loss}, step=best_epoch)
    if has_val and best_stats is None and best_epoch >= 0:
        # Resumed after the best epoch: its validation statistics are recomputed from best_model
        # (every rank takes part: it is a collective).
        from .model import KronosTokenizer

        best_model = KronosTokenizer.from_pretrained(os.path.join(save_dir, "checkpoints", "best_model"),
                                                     map_location=device)
        best_stats = ValidationStats.for_model(best_model, device)
        _global_val_loss(best_model, val_loader, device, best_stats)
        result["best_val_quality"] = best_stats.metrics()
    if is_main:  # PNGs under plots/ of the run, drawn from the best checkpoint
        from .plots import log_validation_plots

        log_validation_plots(logger, config, save_dir, val_ds if has_val else None, best_stats, best_epoch)
    return model, result


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def build_optimizer(model, config, log: bool = False):
    """AdamW as upstream: every parameter decayed by default (``weight_decay_scope: all``).

    ``matrices`` decays only tensors with 2+ dimensions (weights of linear layers), leaving
    biases and norm gains alone. Each group's size is printed so a sweep tunes what it claims to.
    """
    import torch

    from .perf import adamw_kwargs, resolve_adamw

    params = [p for p in model.parameters() if p.requires_grad]
    impl = resolve_adamw(config["adamw_impl"], params[0].device if params else torch.device("cpu"))
    wd = config["adam_weight_decay"]
    if config["weight_decay_scope"] == "matrices":
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": wd}]
    if log:
        sizes = ", ".join(
            f"{sum(p.numel() for p in g['params']):,} params at weight_decay {g['weight_decay']:g}" for g in groups
        )
        print(f"[kronos] AdamW ({impl}) groups: {sizes}", flush=True)
    return torch.optim.AdamW(
        groups,
        lr=config["tokenizer_learning_rate"],
        betas=(config["adam_beta1"], config["adam_beta2"]),
        weight_decay=wd,
        **adamw_kwargs(impl),
    )


# --------------------------------------------------------------------------- orchestration


def preflight(config: Mapping[str, Any], *, check_tracking: bool = True) -> None:
    """Check, in one process, what would otherwise fail inside every torchrun worker.

    Loads the pretrained checkpoint (if any), prepares the data splits (so workers find the
    cache ready, and a bad directory, instrument or range fails here), and probes the tracking
    server.
    """
    from .data import prepare_splits

    if config["pretrained_tokenizer_path"]:
        build_model(config)
    prepare_splits(config)
    if check_tracking:
        from .loggers import check_tracking_server

        check_tracking_server()


def main(config: Mapping[str, Any]) -> dict:
    """Set up the process group, logger and model, train, and record the result.

    Returns the result dict (``best_val_loss`` and friends) on every rank.
    """
    import torch

    from .data import data_digest, prepare_splits
    from .distributed import barrier, init_distributed, seed_everything, teardown
    from .loggers import NullLogger, build_logger

    config = cfg.validate(dict(config))
    if os.environ.get("LOCAL_WORLD_SIZE"):
        config["nproc_per_node"] = int(os.environ["LOCAL_WORLD_SIZE"])
    if not config["run_name"]:
        config["run_name"] = default_run_name(config)
    info = init_distributed(config["device"])
    seed_everything(config["seed"], info.rank)
    save_dir = save_dir_of(config)
    resume_state = _find_resume_state(save_dir, config, info)  # every rank gets rank 0's answer
    saved_ids = (resume_state or {}).get("run_ids") or {}
    logger = NullLogger()
    status, reason = "failed", None
    started = time.time()
    try:
        logger = build_logger(config, info.rank, run_id=saved_ids.get("mlflow_run_id"),
                              comet_experiment_key=saved_ids.get("comet_experiment_key"))
        if resume_state is not None:
            # Steps a killed attempt already sent are replayed identically: do not send them twice.
            logger.skip_logged_steps()
        logger.log_hyperparams(run_params(config))
        if info.is_main:
            os.makedirs(os.path.join(save_dir, "checkpoints"), exist_ok=True)
            # Prepare the data once; other ranks wait and then read the cache.
            prepare_splits(config)
        barrier()
        digest = data_digest(config)
        logger.set_tags({"data_digest": digest, "world_size": str(info.world_size), "device": info.device.type})
        if info.is_main:
            _log_dataset(logger, config, digest)

        from .perf import run_steps

        steps = run_steps(config, info.world_size)
        speed = configure_process(config, info.device, run_steps=steps)
        if info.is_main:
            print(f"[kronos] speed settings: {speed}", flush=True)
        model = build_model(config).to(info.device)
        from .tags import run_tags

        logger.set_tags(run_tags(config, model))  # instrument, model_size, git commit
        model = prepare_model(model, config, info.device, distributed=info.distributed, run_steps=steps)

        reporter = None
        if info.is_main:
            from .sweep import TrialReporter

            reporter = TrialReporter.from_env()
        mlflow_logger, comet_logger = getattr(logger, "mlflow", None), getattr(logger, "comet", None)
        run_ids = {"mlflow_run_id": getattr(mlflow_logger, "run_id", None),
                   "comet_experiment_key": getattr(comet_logger, "experiment_key", None)}
        model, result = train_model(model, info.device, config, save_dir, logger if info.is_main else None,
                                    info.rank, info.world_size, epoch_callback=reporter,
                                    resume_state=resume_state, run_ids=run_ids)
        if info.is_main:
            summary = {
                "start_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "elapsed_s": round(time.time() - started, 3),
                "save_directory": os.path.abspath(save_dir),
                "world_size": info.world_size,
                "final_result": result,
                "mlflow_run_id": getattr(getattr(logger, "mlflow", None), "run_id", None),
                "data_digest": digest,
                "config": run_params(config),
            }
            summary_path = os.path.join(save_dir, "summary.json")
            _write_json_atomic(summary_path, summary)
            logger.log_artifact(summary_path)
            best_dir = os.path.join(save_dir, "checkpoints", "best_model")
            if os.path.isdir(best_dir):
                from .mlflow_model import log_best_model

                log_best_model(logger, best_dir, config, step=max(result["best_epoch"], 0))
        barrier()
        status = "success"
        return result
    except TrainingPruned as exc:
        status, reason = "killed", f"pruned: {exc}"
        raise
    except BaseException as exc:  # record why, then let it propagate
        reason = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        try:
            logger.finalize(status, reason)
        finally:
            teardown()
            if info.device.type == "cuda":
                torch.cuda.empty_cache()


def _find_resume_state(save_dir, config, info):
    """Rank 0 looks for a training state (recovering ``last.old``); every rank gets its answer,
    or the same one-line error (a rank that raised alone would leave the others waiting)."""
    from . import checkpoint
    from .distributed import broadcast_object

    answer = None
    if info.is_main:
        try:
            found = checkpoint.find_resumable(save_dir, config, world_size=info.world_size, mode=config["resume"])
            answer = ("ok", None if found is None else {k: found[k] for k in ("directory", "run_ids", "epoch")})
        except UserError as exc:
            answer = ("error", str(exc))
    if info.distributed:
        answer = broadcast_object(answer)
    kind, value = answer
    if kind == "error":
        raise UserError(value)
    return value


def _log_dataset(logger, config, digest) -> None:
    mlflow_logger = getattr(logger, "mlflow", None)
    if mlflow_logger is None:
        return
    from .mlflow_model import log_dataset_input

    log_dataset_input(mlflow_logger.client, mlflow_logger.run_id, config, digest)


def _write_json_atomic(path: str, payload: Mapping[str, Any]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every config key and alias as ``--key-name`` / ``--key_name``; values parsed by load_config."""
    parser.add_argument("--config", dest="_config_file", metavar="FILE.yaml", help="YAML file of config keys")
    parser.add_argument("--check", dest="_check", action="store_true",
                        help="validate config, data, checkpoint and tracking server, then exit")
    for key in list(cfg.DEFAULTS) + list(cfg.ALIASES):
        target = cfg.ALIASES.get(key, key)
        flags = sorted({f"--{key.replace('_', '-')}", f"--{key}"})
        default = cfg.DEFAULTS[target]
        shown = ":".join(default) if target in cfg.TIME_RANGE_KEYS else default
        help_text = f"alias of --{target.replace('_', '-')}" if key in cfg.ALIASES else f"{cfg.HELP[key]} (default: {shown!s})"
        parser.add_argument(*flags, dest=f"cfg__{key}", default=argparse.SUPPRESS, metavar="VALUE", help=help_text)


def config_from_args(args: argparse.Namespace) -> dict:
    overrides = {name[5:]: value for name, value in vars(args).items() if name.startswith("cfg__")}
    return cfg.load_config(overrides, path=getattr(args, "_config_file", None))


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if getattr(args, "_check", False):
        preflight(config)
        print("[kronos] check passed: config, data directory, checkpoint and tracking server are usable")
        return 0
    main(config)
    return 0


def cli(argv: Sequence[str] | None = None) -> int:
    from .cli import OneLineParser

    parser = OneLineParser(prog="python -m kronos_mlflow.train", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except TrainingPruned:
        from .sweep import EXIT_PRUNED

        # Under torchrun a non-zero exit becomes a noisy ChildFailedError report; the run's
        # KILLED status and stop_reason already tell the sweep, so workers exit cleanly there.
        return 0 if os.environ.get("TORCHELASTIC_RUN_ID") else EXIT_PRUNED
    except UserError as exc:
        rank = os.environ.get("RANK")
        prefix = f"[rank {rank}] " if rank not in (None, "0") else ""
        print(f"{prefix}kronos-mlflow train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(cli())
