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

This file only wires: config -> process group -> tracking (rank decided here, once) -> model
-> :func:`kronos_mlflow.trainer.fit` -> summary and model logging -> finalize. The loop and its
semantics live in :mod:`kronos_mlflow.trainer`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import config as cfg
from .errors import EXIT_USAGE, UserError
from .flags import add_config_arguments, config_from_args

# torch, the data and the trackers load inside main(): `--help` and `--check` of bad flags stay fast.


def default_run_name(config: Mapping[str, Any]) -> str:
    return f"lr={config['tokenizer_learning_rate']:.0e} wd={config['adam_weight_decay']:g}"


def build_model(config: Mapping[str, Any]):
    """The pretrained checkpoint when a path is given, else fresh weights (base architecture)."""
    from .model import KronosTokenizer

    path = config["pretrained_tokenizer_path"]
    return KronosTokenizer.from_pretrained(path) if path else KronosTokenizer(**cfg.model_kwargs(config))


def train_model(model, device, config, save_dir, logger, rank, world_size, epoch_callback=None,
                resume_state=None, run_ids=None):
    """The seed's contract: train ``model`` and keep the best checkpoint under ``save_dir``.

    Returns ``(model, result)`` with ``result["best_val_loss"]``. ``logger`` is an experiment
    logger on rank 0 and may be ``None`` elsewhere; every rank takes part in the collectives.
    Such callers pass their ``rank`` in, so it decides here, once, who prints and writes files
    (see :func:`kronos_mlflow.trainer.fit`).
    """
    from .console import Console
    from .layout import RunLayout
    from .tracking.protocol import NullLogger
    from .trainer import RunFiles, fit

    main = rank == 0
    files = RunFiles(RunLayout(Path(save_dir)), enabled=main)
    result = fit(model, device, config, logger if logger is not None else NullLogger(), files, Console(main),
                 rank=rank, world_size=world_size, should_stop=epoch_callback, resume_state=resume_state,
                 run_ids=run_ids)
    return model, result


def preflight(config: Mapping[str, Any], *, check_tracking: bool = True) -> None:
    """Check, in one process, what would otherwise fail inside every torchrun worker: the
    pretrained checkpoint loads, the data splits prepare (so workers find the cache ready), the
    tracking server answers."""
    from .data import prepare_splits
    from .tracking.server import check_tracking_server

    if config["pretrained_tokenizer_path"]:
        build_model(config)
    prepare_splits(config)
    if check_tracking:
        check_tracking_server()


def main(config: Mapping[str, Any]) -> dict:
    """Set up the process group, tracking and model, train, and record the result.

    Returns the result dict (``best_val_loss`` and friends) on every rank.
    """
    import torch

    from . import perf
    from .console import Console
    from .data import data_digest, prepare_splits
    from .distributed import barrier, broadcast_object, init_distributed, seed_everything, teardown
    from .checkpoint import find_resumable_everywhere
    from .layout import RunLayout
    from .sweep.trial import TrialReporter
    from .tags import run_tags
    from .tracking import Tracking, build_tracking
    from .tracking.model_logging import log_dataset_input, record_result
    from .tracking.protocol import NullLogger
    from .trainer import RunFiles, TrainingPruned, fit, prepare_model

    from . import stopping

    stopping.install()  # SIGTERM / Ctrl-C: the run ends KILLED with a stop_reason (see stopping.py)
    config = cfg.validate(dict(config))
    if os.environ.get("LOCAL_WORLD_SIZE"):
        config["nproc_per_node"] = int(os.environ["LOCAL_WORLD_SIZE"])
    if not config["run_name"]:
        config["run_name"] = default_run_name(config)
    info = init_distributed(config["device"])
    tracking, status, reason, started = Tracking(NullLogger()), "failed", None, time.time()
    layout_root = None
    try:
        seed_everything(config["seed"], info.rank)
        # Rank 0 picks the run directory (per config digest: see layout.py); every rank uses it.
        root = str(RunLayout.of(config, info.world_size).root) if info.is_main else None
        layout = RunLayout(Path(broadcast_object(root)))
        layout_root = layout.root
        console = Console(info.is_main)
        resume_state = find_resumable_everywhere(layout.root, config, info)
        saved_ids = (resume_state or {}).get("run_ids") or {}
        tracking = build_tracking(config, info.rank, run_id=saved_ids.get("mlflow_run_id"),
                                  comet_experiment_key=saved_ids.get("comet_experiment_key"),
                                  resume=resume_state is not None, spool_dir=layout.spool)
        logger = tracking.logger
        logger.log_hyperparams(cfg.run_params(config))
        if info.is_main:  # prepare the data once; other ranks wait and then read the cache
            layout.checkpoints.mkdir(parents=True, exist_ok=True)
            prepare_splits(config)
        barrier()
        digest = data_digest(config)
        logger.set_tags({"data_digest": digest, "world_size": str(info.world_size), "device": info.device.type,
                         "run_directory": str(layout.root.resolve())})
        if tracking.mlflow is not None:
            log_dataset_input(tracking.mlflow.client, tracking.mlflow.run_id, config, digest)

        steps = perf.run_steps(config, info.world_size)
        speed = perf.configure_process(config, info.device, run_steps=steps)
        console.print(f"speed settings: {speed}")
        model = build_model(config).to(info.device)
        logger.set_tags(run_tags(config, model))  # instrument, model_size, git commit
        model = prepare_model(model, config, info.device, distributed=info.distributed, run_steps=steps)
        result = fit(model, info.device, config, logger, RunFiles(layout, enabled=info.is_main), console,
                     rank=info.rank, world_size=info.world_size,
                     should_stop=TrialReporter.from_env() if info.is_main else None,
                     resume_state=resume_state, run_ids=tracking.run_ids())
        if tracking.mlflow is not None:
            record_result(tracking, layout, config, result, world_size=info.world_size, digest=digest,
                          started=started)
        barrier()
        status = "success"
        return result
    except TrainingPruned as exc:
        status, reason = "killed", f"pruned: {exc}"
        raise
    except BaseException as exc:  # record why, then let it propagate
        reason = f"{type(exc).__name__}: {exc}"
        if stopping.received() is not None:  # a stop signal (here, or a peer's: its collective failed)
            status, reason = "killed", stopping.stop_reason(stopping.received(), layout_root)
        raise
    finally:
        try:
            tracking.logger.finalize(status, reason)
        finally:
            teardown()
            if info.device.type == "cuda":
                torch.cuda.empty_cache()


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The training flags (every config key) and ``--check``."""
    add_config_arguments(parser)
    parser.add_argument("--check", dest="_check", action="store_true",
                        help="validate config, data, checkpoint and tracking server, then exit")


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if getattr(args, "_check", False):
        preflight(config)
        print("[kronos] check passed: config, data directory, checkpoint and tracking server are usable")
        return 0
    main(config)
    return 0


def cli(argv: Sequence[str] | None = None) -> int:
    import signal

    from . import stopping
    from .cli import OneLineParser
    from .stopping import TrainingStopped
    from .sweep.trial import EXIT_PRUNED
    from .trainer import TrainingPruned

    from .tracking.project_run import record_failure

    parser = OneLineParser(prog="python -m kronos_mlflow.train", description=__doc__.split("\n\n")[0])
    parser.on_error = record_failure  # under `mlflow run`: the run ends FAILED with this line as its reason
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (TrainingStopped, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, TrainingStopped) else signal.SIGINT
        if os.environ.get("RANK") in (None, "0"):
            print(f"kronos-mlflow train: {stopping.stop_reason(signum, None)}", file=sys.stderr, flush=True)
        return stopping.exit_code(signum)
    except TrainingPruned:
        # Under torchrun a non-zero exit becomes a noisy ChildFailedError report; the run's
        # KILLED status and stop_reason already tell the sweep, so workers exit cleanly there.
        return 0 if os.environ.get("TORCHELASTIC_RUN_ID") else EXIT_PRUNED
    except UserError as exc:
        rank = os.environ.get("RANK")
        prefix = f"[rank {rank}] " if rank not in (None, "0") else ""
        print(f"{prefix}kronos-mlflow train: error: {exc}", file=sys.stderr)
        if getattr(args, "_check", False):
            record_failure(f"kronos-mlflow train: error: {exc}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(cli())
