"""Fine-tune the Kronos tokenizer: the torchrun entry point.

One process (CPU or one GPU)::

    python -m kronos_mlflow.train --epochs 1 --qlib-data-path ''            # demo market

Several processes on one machine (NCCL on GPUs, gloo on CPUs)::

    torchrun --standalone --nproc_per_node 2 -m kronos_mlflow.train --epochs 30
    python -m kronos_mlflow.launch --standalone --nproc_per_node 2 -m kronos_mlflow.train --epochs 30

Under either, a refusal every rank reaches (a bad flag or config value) is printed once, by
rank 0, and the workers exit with code 2. ``kronos_mlflow.launch`` takes torchrun's arguments
unchanged and checks them and the training flags first: a refusal is then the one line, without
torchrun's own failure report (which plain ``torchrun`` prints after it).

Through MLflow Projects (runs the same torchrun command, see ``MLproject``)::

    mlflow run . --env-manager local -P epochs=30 -P nproc_per_node=2

Every config key is a flag (``--tokenizer-learning-rate`` or ``--learning-rate``, dashes or
underscores; time ranges as ``START:END``), plus ``--config FILE.yaml``. ``--check`` validates
everything a run needs (config, data directory, pretrained checkpoint, tracking server) in one
process and exits: the MLproject runs it before starting torchrun, so bad input costs one
clear line and exit code 2 instead of a failed process group.

This file only wires: config -> process group -> tracking (rank decided here, once) -> model
-> :func:`kronos_mlflow.training.loop.fit` -> summary and model logging -> finalize. The loop and its
semantics live in :mod:`kronos_mlflow.training.loop`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..config import core as cfg, published, checks
from ..tracking import run_names
from ..runtime import stopping
from ..config.argparsing import OneLineParser
from ..runtime.console import Console, install_warning_format, terminal_only_bars
from ..config.digest import config_digest
from ..errors import UserError, same_on_every_rank
from ..config.flags import add_config_arguments, config_from_args
from ..config.layout import RunLayout
from ..config.sections import section
from ..evaluation.next_steps import training_lines
from ..tracking.ownership import STATE_ADVICE, Claim, OwnershipError, read_owner, token_of
from .preflight import DataView, check_start, check_training
from ..runtime.runlock import WRITER_LOCK, Busy, hold, holder
from ..config.settings import check_environment
from ..stages import spec_of
from ..runtime.stopping import TrainingPruned, TrainingStopped
from .trial import EXIT_PRUNED, TrialReporter
from .tags import run_tags
from .resolved import decide_starts, launch_values, resolve

# torch, the data and the trackers load inside main(): `--help` and `--check` of bad flags stay fast.


def default_run_name(config: Mapping[str, Any]) -> str:
    """The run's name when the config gives none (:func:`kronos_mlflow.tracking.run_names.training`)."""
    return run_names.training(config)


class DirectoryWriter:
    """Rank 0's claim on the run directory: its writer lock (:mod:`kronos_mlflow.runtime.runlock`),
    taken before the training state is read, held until the process ends. A second process of
    the same config (the same directory) is refused in one line while the first lives."""

    def __init__(self, layout):
        self.layout, self.lock = layout, None

    def claim(self) -> None:
        self.lock = hold(self.layout.root / WRITER_LOCK, f"run directory {self.layout.root}",
                         advice="wait for it to end (the same command then resumes it, or starts a new run once it "
                                "finished), or use another save_path")

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def abandon(self) -> None:
        """A refusal right after the claim: nothing of it stays (a run directory it created goes)."""
        if self.lock is not None:
            self.lock.abandon()
            self.lock = None


def open_run(config: Mapping[str, Any], layout, info):
    """``(writer, resume_state, tracking)``: rank 0 claims the run directory (:class:`DirectoryWriter`)
    and finds its training state, every rank gets that answer (or the same refusal), then the
    run's tracking starts (:func:`start_tracking`). A refusal leaves nothing of the claim behind."""
    from .checkpoint import find_resumable_everywhere  # lazy: torch, safetensors, numpy

    writer = DirectoryWriter(layout)  # rank 0: the one process that writes this run directory
    try:
        resume_state = find_resumable_everywhere(layout.root, config, info, first=writer.claim)
    except UserError as exc:  # the same answer on every rank (rank 0's, broadcast)
        writer.abandon()
        raise same_on_every_rank(exc) from None
    try:
        tracking = start_tracking(config, info.rank, layout, resume_state)
    except UserError:
        writer.abandon()
        raise
    return writer, resume_state, tracking


def start_tracking(config: Mapping[str, Any], rank: int, layout, resume_state: Mapping[str, Any] | None):
    """The run's tracking (rank 0's loggers), with its ownership (:mod:`kronos_mlflow.tracking.ownership`):
    a resumed state's run only when that run carries the state's token, is in this command's
    experiment and is not FINISHED; else a new run (or the one ``MLFLOW_RUN_ID`` hands over, when
    no other training owns it), claimed with a token that ``owner.json`` and every state keep."""
    from ..tracking import build_tracking  # lazy: numpy, urllib/http

    saved = (resume_state or {}).get("run_ids") or {}
    command = "train"  # either stage: the gate's rules for train and train-predictor are one
    if rank != 0:
        claim = None
    elif resume_state is not None:
        named_by = f"the training state in {resume_state['directory']}"
        if not saved.get("mlflow_run_id"):
            raise OwnershipError(f"{named_by} names no MLflow run, so no run wrote it; nothing was written: "
                                 f"{STATE_ADVICE}")
        claim = Claim(token=token_of(saved), named_by=named_by, directory=layout.root, command=command)
    else:  # a new run, or MLFLOW_RUN_ID's (kept with its token when this directory's owner.json claimed it)
        claim = Claim(directory=layout.root, command=command)
    return build_tracking(config, rank, run_id=saved.get("mlflow_run_id"),
                          comet_experiment_key=saved.get("comet_experiment_key"), resume=resume_state is not None,
                          spool_dir=layout.spool, claim=claim,
                          mlflow_tags={"run_directory": str(layout.root.resolve())})


def train_model(model, device, config, save_dir, logger, rank, world_size, epoch_callback=None,
                resume_state=None, run_ids=None):
    """The seed's contract: train ``model`` and keep the best checkpoint under ``save_dir``.

    Returns ``(model, result)`` with ``result["best_val_loss"]``. ``logger`` is an experiment
    logger on rank 0 and may be ``None`` elsewhere; every rank takes part in the collectives.
    Such callers pass their ``rank`` in, so it decides here, once, who prints and writes files
    (see :func:`kronos_mlflow.training.loop.fit`). The command's :func:`main` trains through the
    same :func:`fit_stage`.
    """
    from ..data import provide_qlib_data  # lazy: numpy
    from ..tracking.protocol import NullLogger  # lazy: numpy, urllib/http

    import torch
    import torch.distributed as dist

    from ..runtime.distributed import DistInfo  # lazy: torch, numpy

    provide_qlib_data(config)  # the front door: the demo market made here (once, safe on every rank), not in the loop
    grouped = dist.is_available() and dist.is_initialized()  # the caller's process group, if any
    layout = RunLayout(Path(save_dir))
    info = DistInfo(rank, rank, world_size, torch.device(device), dist.get_backend() if grouped else None)
    stage = spec_of(config).training(config, layout, info)
    return fit_stage(model, stage, config, layout, info, logger if logger is not None else NullLogger(),
                     Console(rank == 0), should_stop=epoch_callback, resume_state=resume_state, run_ids=run_ids)


def fit_stage(model, stage, config: Mapping[str, Any], layout, info, logger, console: Console, *, should_stop=None,
              resume_state=None, run_ids=None, steps: int | None = None, files=None):
    """Every training's wiring once its stage piece and model are built: the fine-tune mode, the
    stage's epoch hooks, the loop. ``steps`` (the command's): the run's optimizer steps; it also
    records and prints what trains, and compiles or wraps the model for its speed settings.
    ``files``: the run's :class:`~kronos_mlflow.training.loop.RunFiles` (default: rank 0's, made
    here). Returns ``(model, result)``."""
    from ..model import finetune  # lazy: torch
    from ..evaluation.val_ic import epoch_hooks  # lazy: torch, mlflow, pandas
    from .loop import RunFiles, fit, prepare_model

    model = finetune.apply(model, config, spec_of(config))  # finetune_mode: the parts that train
    if steps is not None:
        logger.log_hyperparams({k: str(v) for k, v in finetune.counts(model).items()})
        console.print(finetune.describe(model, config))
        model = prepare_model(model, config, info.device, distributed=info.distributed, run_steps=steps)
    hooks = epoch_hooks(config, stage, info.device, rank=info.rank, world_size=info.world_size, console=console)
    files = files if files is not None else RunFiles(layout, enabled=info.is_main, config=config)
    result = fit(model, info.device, config, logger, files, console,
                 rank=info.rank, world_size=info.world_size, should_stop=should_stop, resume_state=resume_state,
                 run_ids=run_ids, stage=stage, hooks=hooks)
    return model, result


MAX_RESTARTS = 1000  # torchrun restarts of a failed worker group (MLproject's max_restarts)


def check_start_everywhere(config: Mapping[str, Any]) -> None:
    """:func:`~kronos_mlflow.training.preflight.check_start` on each rank; its refusal is the same on all of them."""
    try:
        check_start(config)
    except UserError as exc:
        raise same_on_every_rank(exc) from None


def prepare_data(config: Mapping[str, Any]) -> None:
    """The cached splits (prepared once). An empty test split is not warned about here: the
    run's verdict says so, in one line, at the end."""
    import warnings

    from ..data import prepare_splits  # lazy: numpy
    from ..data.prepare import DataWarning

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="no test windows", category=DataWarning)
        prepare_splits(config)


def prepare_everywhere(config: Mapping[str, Any], layout, info) -> None:
    """Rank 0 prepares the data splits once (and makes the run's checkpoint folder); the other
    ranks wait, then read the cache, or raise rank 0's refusal, which only rank 0 prints."""
    from ..runtime.distributed import barrier, broadcast_object  # lazy: torch, numpy

    answer, refusal = ("ok", None), None
    if info.is_main:
        try:
            layout.checkpoints.mkdir(parents=True, exist_ok=True)
            prepare_data(config)
        except UserError as exc:
            answer, refusal = ("error", str(exc)), exc
    if info.distributed:
        answer = broadcast_object(answer)
    if answer[0] == "error":
        raise same_on_every_rank(refusal or UserError(answer[1])) from None
    barrier()




def check_resume(config: Mapping[str, Any], world_size: int) -> dict[str, Any] | None:
    """The ``resume`` setting can be honoured: ``must`` finds a state saved with this config, and a
    saved state is not damaged (the same lookup the run makes at its start); no other process
    writes the run directory now. Returns the state found (None: the run starts fresh)."""
    from .checkpoint import find_resumable  # lazy: torch, safetensors, numpy

    root = RunLayout.of(config, world_size).root
    busy = holder(root / WRITER_LOCK)
    if busy is not None:
        raise Busy(f"run directory {root} is being written by another process ({busy}); wait for it to end, or use "
                   "another save_path")
    return find_resumable(root, config, world_size=world_size, mode=section(config, "job").resume)


def check_ownership(config: Mapping[str, Any], world_size: int, state: Mapping[str, Any] | None) -> None:
    """Read only: the runs the training would write may be written (:func:`start_tracking`'s
    rules, through :mod:`kronos_mlflow.tracking.gate`): a saved state's run carries its token, is
    in this command's experiment and is not FINISHED; a run ``MLFLOW_RUN_ID`` hands over passes
    the gate (with a saved state it only gets a tag saying where the training went: it must be
    a run ``mlflow run`` made for this launch)."""
    from mlflow import MlflowClient

    from ..tracking import gate  # lazy: numpy, urllib/http

    client = MlflowClient()
    named = str(section(config, "tracking").experiment_name or "") or None
    experiment = gate.command_experiment(client, named)
    command = "train"  # either stage: the gate's rules for train and train-predictor are one
    if state is not None:
        saved = state.get("run_ids") or {}
        run = gate.owned_run(client, saved.get("mlflow_run_id"), token_of(saved),
                             what=f"the training state in {state['directory']}", experiment_id=experiment,
                             advice=STATE_ADVICE)
        launcher = gate.handed_run_id()
        if launcher and launcher != run.info.run_id:
            handed = gate.get_run(client, launcher, "MLFLOW_RUN_ID")
            why = gate.refusal(handed, command=command, experiment_id=None)
            if why:
                raise gate.RunRefused(why)
        return
    root = RunLayout.of(config, world_size).root
    gate.handed_run(client, command=command,
                    experiment_id=gate.handed_experiment(client, named),
                    directory_owner=read_owner(root) if root.is_dir() else None)


def preflight(config: Mapping[str, Any], *, check_tracking: bool = True) -> None:
    """Check, in one process, everything a run would refuse at its start or its end, before any
    torchrun worker starts: paths, device, process count and speed settings, Comet's key, the
    checkpoints (load as the kind each key names, finite weights, the same bits), the forecast
    window against ``max_context``, the data splits (enough windows for one step per rank, the
    validation origins of ``objective: val_skill``, the scorecard's backtest range: see
    :func:`kronos_mlflow.training.preflight.check_training`), the saved training state (``resume``), and
    the tracking store (its URI, its server, the run and experiment the run would use, created
    once when it is a fresh sqlite file). The data cache is written once all of it passed, so
    workers find it ready; a refusal leaves none."""
    from ..tracking.mlflow import check_run_target  # lazy: numpy, urllib/http
    from ..tracking.server import check_tracking_server

    world = int(section(config, "job").nproc_per_node)
    check_start(config, world)
    with DataView() as data:
        check_training(config, world, data)
        state = check_resume(config, world)
        if check_tracking:
            check_tracking_server()
            check_run_target(section(config, "tracking"))
            check_ownership(config, world, state)


def resolve_everywhere(asked: Mapping[str, Any], info):
    """The run's :class:`~kronos_mlflow.training.resolved.Resolved` record: rank 0's ``auto`` is
    every rank's, and a check that waited on it refuses alike on every rank (rank 0 says so)."""
    from ..runtime.distributed import broadcast_object  # lazy: torch, numpy

    try:
        return resolve(asked, share=broadcast_object, is_main=info.is_main, world_size=info.world_size,
                       device=info.device.type)
    except UserError as exc:
        raise same_on_every_rank(exc) from None


def main(config: Mapping[str, Any]) -> dict:
    """Set up the process group, tracking and model, train, and record the result.

    Returns the result dict (``best_val_loss`` and friends) on every rank.
    """
    import torch

    from ..data import data_digest  # lazy: numpy
    from ..runtime import perf  # lazy: torch
    from ..runtime.distributed import barrier, broadcast_object, init_distributed, seed_everything, teardown  # lazy: torch
    from ..evaluation.verdict import run_metrics_of
    from ..tracking import Tracking  # lazy: numpy, urllib/http
    from ..serving.model_logging import log_dataset_input, record_result
    from ..tracking.protocol import NullLogger
    from .loop import RunFiles

    stopping.install()  # SIGTERM / Ctrl-C: the run ends KILLED with a stop_reason (see stopping.py)
    asked = MappingProxyType(cfg.validate(dict(config)))  # the user's config, as validated: never written
    config = launch_values(asked).run_config(asked)  # what the run reads: run_name and nproc_per_node resolved
    check_start_everywhere(config)  # before the process group: every rank refuses alike, rank 0 says so
    info = init_distributed(section(config, "job").device)
    tracking, status, reason, started = Tracking(NullLogger()), "failed", None, time.time()
    layout_root, writer, files = None, None, None
    try:
        resolved = resolve_everywhere(asked, info)
        seed_everything(section(config, "job").seed, info.rank)
        # Rank 0 picks the run directory (per config digest: see layout.py); every rank uses it.
        root = str(RunLayout.of(config, info.world_size).root) if info.is_main else None
        layout_root = (layout := RunLayout(Path(broadcast_object(root)))).root
        console = Console(info.is_main)
        writer, resume_state, tracking = open_run(config, layout, info)
        logger = tracking.logger
        logger.log_hyperparams(cfg.run_params(config))
        prepare_everywhere(config, layout, info)
        digest = data_digest(config)
        logger.set_tags({"data_digest": digest, "world_size": str(info.world_size), "device": info.device.type,
                         "config_digest": config_digest(config, world_size=info.world_size)})
        if tracking.mlflow is not None:
            log_dataset_input(tracking.mlflow.client, tracking.mlflow.run_id, config, digest)

        steps = perf.run_steps(config, info.world_size)
        speed = perf.configure_process(config, info.device, run_steps=steps)
        console.print(f"speed settings: {speed}")
        spec = spec_of(config)
        stage = spec.training(config, layout, info)  # every rank (a predictor's frozen tokenizer)
        model = spec.build_model(config, stage).to(info.device)
        logger.set_tags(run_tags(config, model))  # instrument, model_size, git commit (a predictor's tokenizer)
        announce_starts(config, logger, console)  # what auto chose, and why
        if info.is_main:
            logger.log_artifact(resolved.write(layout.root))  # the record: resolved.json
        files = RunFiles(layout, enabled=info.is_main, config=config)
        _, result = fit_stage(model, stage, config, layout, info, logger, console, steps=steps,
                              should_stop=TrialReporter.from_env() if info.is_main else None,
                              resume_state=resume_state, run_ids=tracking.run_ids(), files=files)
        if tracking.mlflow is not None and files.phase != "logged":  # a continued run may have logged it
            record_result(tracking, layout, config, result, world_size=info.world_size, digest=digest,
                          started=started, log_model=spec.log_model, heldout_metrics=run_metrics_of(result.get("test")))
        files.record_phase("logged", result)
        if tracking.mlflow is not None:
            console.lines(training_lines(  # what next: the run, its number, its files, how to look at it
                result, run_id=tracking.mlflow.run_id, experiment_id=tracking.mlflow.experiment_id,
                tracking_uri=tracking.mlflow.client.tracking_uri, run_directory=layout.root.resolve()))
        barrier()
        files.record_phase("finished", result)  # the same command again starts a new run
        status = "success"
        return result
    except TrainingPruned as exc:
        status, reason = "killed", f"pruned: {exc}"
        raise
    except BaseException as exc:  # record why, then let it propagate
        reason = f"{type(exc).__name__}: {exc}"
        if stopping.received() is not None:  # a stop signal (here, or a peer's: its collective failed)
            after = files.phase if files is not None else None  # stopped after its training: what it finished
            status, reason = "killed", stopping.stop_reason(stopping.received(), layout_root, after=after)
            stop = stopping.standing_for(exc)
            if stop is not None:  # a collective broken by a peer that stopped first: this rank stops too
                stop.after = after
                raise stop from None
            if isinstance(exc, TrainingStopped):
                exc.after = after  # the command's line says it too
        raise
    finally:
        try:
            tracking.logger.finalize(status, reason)
        finally:
            if writer is not None:
                writer.release()
            teardown()
            if info.device.type == "cuda":
                torch.cuda.empty_cache()


def announce_starts(config: Mapping[str, Any], logger, console: Console) -> None:
    """What each starting checkpoint the run reads resolved to (``auto``: published or fresh,
    and why): a ``<key>_source`` tag and a console line per key."""
    keys = published.read_by(config)
    logger.set_tags(published.tags(config, keys))
    console.lines(published.lines(config, keys))


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser, stage: str | None = None) -> None:
    """The training flags (every config key) and ``--check``; ``stage`` is the default of
    ``--stage`` (``kronos_mlflow.train_predictor``: predictor)."""
    add_config_arguments(parser)
    if stage is not None:
        parser.set_defaults(cfg__stage=stage)
    parser.add_argument("--check", dest="_check", action="store_true",
                        help="validate config, data, checkpoint and tracking server, then exit")
    parser.add_argument("--max-restarts", "--max_restarts", dest="_max_restarts", default=None, metavar="N",
                        help="torchrun restarts of a failed worker group (MLproject's max_restarts): checked "
                             f"here, 0 to {MAX_RESTARTS}; the launcher applies it")


def config_of(args: argparse.Namespace) -> dict:
    """What a training command reads before any work, from its parsed flags: the
    ``KRONOS_MLFLOW_*`` settings, ``--max-restarts`` and the config (defaults, ``--config``, flags),
    validated. A refusal is a UserError every rank of a group reaches alike."""
    try:
        check_environment()
        if getattr(args, "_max_restarts", None) is not None:
            checks.integer("max_restarts", args._max_restarts, 0, MAX_RESTARTS)
        return config_from_args(args)
    except UserError as exc:  # flags, config files and the environment: every rank reads the same
        raise same_on_every_rank(exc) from None


def check(config: Mapping[str, Any]) -> None:
    """``--check``: ``auto``'s checkpoints decided (the cache, then the hub: the workers then find
    them in the cache), then :func:`preflight`; says so when everything passed."""
    decide_starts(config)
    preflight(config)
    print("[kronos] check passed: config, data directory, checkpoint and tracking server are usable")


def run(args: argparse.Namespace) -> int:
    config = config_of(args)
    if getattr(args, "_check", False):
        check(config)
        return 0
    main(config)
    return 0


def cli(argv: Sequence[str] | None = None, *, prog: str = "python -m kronos_mlflow.train",
        name: str = "kronos-mlflow train", stage: str | None = None) -> int:
    """The command line of a training process; ``stage`` is the default of ``--stage``."""
    import signal

    from ..tracking.project_run import exit_in_one_line, record_failure  # lazy: numpy, urllib/http

    install_warning_format()
    terminal_only_bars()
    rank = os.environ.get("RANK")
    main_rank = rank in (None, "0")
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.on_error = record_failure  # under `mlflow run`: the run ends FAILED with this line as its reason
    parser.silent = not main_rank  # torchrun: every rank parses the same flags; rank 0 says what is wrong
    add_arguments(parser, stage)
    args = parser.parse_args(argv)

    def work() -> int:
        try:
            return run(args)
        except KeyboardInterrupt:  # before the stop handler is installed: a stop all the same
            raise TrainingStopped(signal.SIGINT) from None
        except TrainingPruned:
            # Under torchrun a non-zero exit becomes a noisy ChildFailedError report; the run's
            # KILLED status and stop_reason already tell the sweep, so workers exit cleanly there.
            return 0 if os.environ.get("TORCHELASTIC_RUN_ID") else EXIT_PRUNED

    return exit_in_one_line(name, work, speaks=main_rank, rank=rank)

